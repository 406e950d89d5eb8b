#!/usr/bin/env bash
# The Python client's checks, for scripts/test and CI; exits non-zero on any
# failure. In a venv cached under ${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}/py-client
# (pyproject.toml's `dev` extra, from PyPI): `mypy --strict` on the package;
# `python -m build` (an sdist, then a wheel from that sdist); the wheel
# installed into a fresh venv, which tests/test_wheel.py drives against a real
# runlockd; then every other test, against the checkout installed editable.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}"
venv="$cache/py-client"
wheelhouse="$cache/py-client-wheelhouse" # the wheel's dependencies, for fresh venvs
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/mypy" ] || [ ! -x "$venv/bin/pyproject-build" ]; then
    mkdir -p "$cache"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
fi
# Editable, so the tests see this checkout; cheap once the `dev` tools are there.
"$venv/bin/pip" install -q --no-build-isolation -e "$here[dev]" 2>/dev/null \
    || "$venv/bin/pip" install -q -e "$here[dev]"

echo "-- mypy --strict"
(cd "$here" && "$venv/bin/mypy" --strict src/runlock)

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
echo "-- python -m build"
# Without isolation: the build requirements are in the cached venv already, so
# no download per run.
"$venv/bin/python" -m build -q --no-isolation --outdir "$scratch/dist" "$here" >/dev/null
rm -rf "$here/build" # setuptools' staging, not a product
wheel=("$scratch"/dist/runlock-*.whl)
sdist=("$scratch"/dist/runlock-*.tar.gz)

echo "-- the wheel, in a fresh venv"
[ -n "$(ls -A "$wheelhouse" 2>/dev/null)" ] || "$venv/bin/pip" download -q -d "$wheelhouse" msgpack
"$python" -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install -q --no-index --find-links "$wheelhouse" "${wheel[0]}"

echo "-- the installed wheel, as a typed dependency of strict code"
# Without its py.typed, mypy would call runlock untyped here.
cat >"$scratch/uses_runlock.py" <<'PY'
import runlock


def token(key: str) -> int:
    with runlock.lock(key, wait=1.5) as lease:
        return lease.token
PY
(cd "$scratch" && "$venv/bin/mypy" --strict --no-incremental \
    --python-executable "$scratch/venv/bin/python" uses_runlock.py)

export RUNLOCK_WHEEL="${wheel[0]}" RUNLOCK_SDIST="${sdist[0]}" RUNLOCK_WHEEL_PYTHON="$scratch/venv/bin/python"
"$venv/bin/pytest" -q "$here/tests" "$@"
