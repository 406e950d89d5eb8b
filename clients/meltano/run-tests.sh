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
# (RUNLOCK_TEST_AZURE_CONNECTION_STRING), PostgreSQL (RUNLOCK_TEST_PG_URI);
# and beside them, meltano-own-tests.sh: Meltano's own state tests, run
# plainly and through the add-on, compared (a venv of their own).
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

# Meltano's own state tests, plainly and through the add-on
# (meltano-own-tests.sh), beside the add-on's: each is mostly waiting. In a
# session of its own, so that an early exit here ends its pytest runs too.
own_log=$(mktemp)
setsid "$here/meltano-own-tests.sh" >"$own_log" 2>&1 &
own=$!
trap '[ -z "$own" ] || kill -- -"$own" 2>/dev/null || true; rm -f "$own_log"' EXIT

# Four workers (pytest-xdist): what is left of the tests' time is mostly
# waiting (on a forced run's take-over, on Meltano runs' ends), now that
# test_state_commands.py's hundreds of `meltano state` commands fork from a
# process that imported Meltano once (tests/meltano_forks.py). On two cores,
# four workers took the suite from 123 s to 99 s (BENCHMARKS.md, "CI phases").
tests_failed=0
"$venv/bin/pytest" -q -p no:cacheprovider -n 4 --dist worksteal "$here/tests" "$@" || tests_failed=1

echo "-- Meltano's own state tests, plainly and through the add-on"
own_failed=0
wait "$own" || own_failed=1
own=""
cat "$own_log"
[ "$tests_failed" = 0 ] || { echo "the add-on's tests failed" >&2; exit 1; }
[ "$own_failed" = 0 ] || { echo "Meltano's own state tests differ through the add-on" >&2; exit 1; }
