#!/usr/bin/env bash
# The pip wheels, as scripts/test checks them: `scripts/package wheel` builds
# them (the release profile, the two binaries static), a fresh venv installs
# them from that directory, with msgpack from a cached wheelhouse and no
# index (nothing else may come in, nor a `runlock` of PyPI's), and
# tests/package/test_wheel.py, run by the venv's python from outside the
# checkout, starts the venv's runlockd and locks runs through the venv's
# runlock and Python client. Prints the wheels' sizes and the build's time.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}
wheelhouse=$cache/wheel-wheelhouse # msgpack, the client's one dependency

started=$SECONDS
mapfile -t wheels < <("$repo/scripts/package" wheel)
echo "built in $((SECONDS - started)) s:"
ls -l "${wheels[@]}"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
python3 -m venv "$scratch/venv"
pip=("$scratch/venv/bin/pip" --disable-pip-version-check)
[ -n "$(ls -A "$wheelhouse" 2>/dev/null)" ] || "${pip[@]}" download -q -d "$wheelhouse" msgpack
"${pip[@]}" install -q --no-index --find-links "$wheelhouse" --find-links "$(dirname "${wheels[0]}")" runlock
# The venv's python alone, from /: no PYTHONPATH, no checkout on sys.path.
(cd / && env -u PYTHONPATH "$scratch/venv/bin/python" -B "$repo/tests/package/test_wheel.py" -v)
