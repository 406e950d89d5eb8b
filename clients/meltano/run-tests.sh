#!/usr/bin/env bash
# The Meltano add-on's checks, for scripts/test; exits non-zero on any
# failure. In Meltano's venv, where tests/scripts/meltano.sh installs Meltano,
# the client and this add-on, pytest and mypy: `mypy --strict` on the
# package, then its tests (tests/test_units.py and tests/test_fence.py
# against a real runlockd, tests/test_e2e.py and tests/test_state_commands.py
# with the real Meltano), on file://, and on the emulators scripts/test
# starts (tests/scripts/stores.sh; stores_start): s3:// on moto
# (RUNLOCK_TEST_S3_ENDPOINT), gs:// on fake-gcs-server
# (RUNLOCK_TEST_GCS_ENDPOINT), azure:// on Azurite
# (RUNLOCK_TEST_AZURE_CONNECTION_STRING), PostgreSQL (RUNLOCK_TEST_PG_URI).
# runlockd is this workspace's debug build (cargo builds it, honouring
# CARGO_TARGET_DIR), or $RUNLOCKD.
#
# The tests, and the Meltano processes they start, import this checkout's
# sources (PYTHONPATH), so an edit is tested without reinstalling; the
# installed packages give Meltano the entry points (pyproject.toml).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
if [ -z "${RUNLOCK_TEST_MELTANO:-}" ]; then
    # shellcheck source=../../tests/scripts/meltano.sh
    source "$repo/tests/scripts/meltano.sh"
    meltano_install
fi
venv="$(dirname "$(dirname "$RUNLOCK_TEST_MELTANO")")"
export PYTHONPATH="$here/src:$repo/clients/python/src${PYTHONPATH:+:$PYTHONPATH}"

echo "-- mypy --strict"
(cd "$here" && "$venv/bin/mypy" --strict src/runlock_meltano)

# Four workers (pytest-xdist): what is left of the tests' time is mostly
# waiting (on a forced run's take-over, on Meltano runs' ends), now that
# test_state_commands.py's hundreds of `meltano state` commands fork from a
# process that imported Meltano once (tests/meltano_forks.py). On two cores,
# four workers took the suite from 123 s to 99 s (BENCHMARKS.md, "CI phases").
"$venv/bin/pytest" -q -p no:cacheprovider -n 4 --dist worksteal "$here/tests" "$@"
