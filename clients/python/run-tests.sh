#!/usr/bin/env bash
# Runs the Python client's tests (vectors, and against a real runlockd built
# with cargo) in a venv cached under ${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}/py-client.
# Exits non-zero on any failure, for scripts/test and CI.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}/py-client"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/pytest" ]; then
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q msgpack pytest
fi
# Editable, so the tests always see this checkout; cheap when already installed.
"$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$here" 2>/dev/null \
    || "$venv/bin/pip" install -q -e "$here"

exec "$venv/bin/pytest" -q "$here/tests" "$@"
