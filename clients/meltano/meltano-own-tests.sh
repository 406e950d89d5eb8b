#!/usr/bin/env bash
# Meltano's own state tests, plainly and through the add-on, compared
# (meltano_own_tests/compare.py): the test paths of Meltano's sdist for the
# version the add-on supports (tests/scripts/meltano.sh's MELTANO_VERSION),
# run once as they are and once with `runlock+` in front of every state
# backend URI, against a real runlockd ($RUNLOCKD, else this workspace's
# debug build). Exits non-zero on any difference but the two tests that
# look for Meltano's own lock file, which runlock replaces by design.
#
# Meltano with the extras and test tools those tests import goes into a
# cached venv of its own, ${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}/meltano-own-tests
# (a cold install takes about a minute), with the sdist beside it; this
# checkout's client and add-on are installed into it every time, for their
# entry points, and imported from the checkout (PYTHONPATH), as
# run-tests.sh does.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../../tests/scripts/meltano.sh
source "$repo/tests/scripts/meltano.sh"   # MELTANO_VERSION, RUNLOCK_EMU_DIR, cached_venv

home=$RUNLOCK_EMU_DIR/meltano-own-tests
venv=$home/venv
sdist=$home/meltano-$MELTANO_VERSION

# Meltano's test tools, from its `testing` dependency group (pyproject.toml),
# as far as these tests use them.
cached_venv "$venv" pytest "meltano[s3,gcs,azure]==$MELTANO_VERSION" msgpack \
    "pytest>=9" "pytest-asyncio>=1.4.0" "pytest-xdist~=3.6" "pytest-docker~=3.1" \
    "pytest-structlog~=1.1" "pytest-timeout>=2.4.0" "requests-mock>=1.12.1,<2" \
    "time-machine>=3" "moto>=5.1.0,!=5.2.0" "faker>=37.4.2" "colorama>=0.4.4,<0.5"

if [ ! -f "$sdist/pyproject.toml" ]; then
    echo "fetching Meltano $MELTANO_VERSION's sdist into $home" >&2
    download=$(mktemp -d)
    "$venv/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary :all: \
        "meltano==$MELTANO_VERSION" -d "$download"
    tar -xzf "$download/meltano-$MELTANO_VERSION.tar.gz" -C "$download"
    rm -rf "$sdist"
    mv "$download/meltano-$MELTANO_VERSION" "$sdist"
    rm -rf "$download"
fi

# Not editable, built from a copy (the Cargo.toml setup.py reads beside it),
# as tests/scripts/meltano.sh installs them.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/clients"
cp "$repo/Cargo.toml" "$scratch/"
cp -r "$repo/clients/python" "$repo/clients/meltano" "$scratch/clients/"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall \
    "$scratch/clients/python" "$scratch/clients/meltano" >"$scratch/log" 2>&1 ||
    { cat "$scratch/log" >&2; exit 1; }

export PYTHONPATH="$here/src:$repo/clients/python/src${PYTHONPATH:+:$PYTHONPATH}"
"$venv/bin/python" "$here/meltano_own_tests/compare.py" "$sdist"
