#!/usr/bin/env bash
# Installs the real Meltano and target-jsonl, each into a cached venv of its
# own (their pinned dependencies conflict in one), for tests/meltano/e2e.rs.
#
# Sourced by scripts/test:   source tests/scripts/meltano.sh; meltano_install
# Run by itself:             bash tests/scripts/meltano.sh   (installs, prints the exports)
#
# meltano_install exports:
#   RUNLOCK_TEST_MELTANO       the venv's `meltano`
#   RUNLOCK_TEST_TARGET_JSONL  the other venv's `target-jsonl` (a loader the
#                              test project names by `executable:`, so that no
#                              `meltano install` runs per test)
#
# Into Meltano's venv it also installs this checkout's Python client and the
# Meltano add-on (clients/python, clients/meltano), and the third-party state
# backend the add-on's tests wrap (clients/meltano/tests/fixtures/
# dummy_state_backend, scheme `dummy`), every time (a few seconds;
# the venv must hold this checkout's code, not an earlier one's), Meltano's
# `s3`, `gcs` and `azure` extras (the client libraries of its cloud state
# stores), its `postgres` extra (psycopg, for a system database on
# PostgreSQL), and pytest (with pytest-xdist) and mypy for the add-on's
# checks (clients/meltano/run-tests.sh).
#
# The venvs live in ${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}/meltano and
# .../target-jsonl and are reused when a stamp file says they have these
# versions. A cold install takes about 45 s (the two run in parallel).

MELTANO_VERSION=4.4.1
TARGET_JSONL_VERSION=0.1.4
RUNLOCK_EMU_DIR=${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

meltano_install() {
    local m=$RUNLOCK_EMU_DIR/meltano t=$RUNLOCK_EMU_DIR/target-jsonl
    cached_venv "$m" meltano "meltano==$MELTANO_VERSION" &
    local mpid=$!
    cached_venv "$t" target-jsonl "target-jsonl==$TARGET_JSONL_VERSION" &
    local tpid=$!
    local ok=0
    wait "$mpid" || { echo "meltano: install failed" >&2; ok=1; }
    wait "$tpid" || { echo "target-jsonl: install failed" >&2; ok=1; }
    [ $ok -eq 0 ] || return 1
    meltano_addon_install "$m" || { echo "meltano: the add-on's install failed" >&2; return 1; }
    export RUNLOCK_TEST_MELTANO=$m/bin/meltano
    export RUNLOCK_TEST_TARGET_JSONL=$t/bin/target-jsonl
    echo "meltano $MELTANO_VERSION: $RUNLOCK_TEST_MELTANO" >&2
}

# meltano_addon_install VENV: clients/python, clients/meltano and the add-on's
# test state backend into VENV.
meltano_addon_install() {
    local venv=$1 repo scratch rc=0
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    "$venv/bin/pip" install -q --disable-pip-version-check "meltano[s3,gcs,azure,postgres]==$MELTANO_VERSION" msgpack pytest pytest-xdist mypy || return 1
    # Not editable: several checkouts may share this venv. Built from a copy
    # (with the Cargo.toml whose version setup.py reads, two levels up), so
    # that setuptools leaves no build/ or *.egg-info in the checkout.
    scratch=$(mktemp -d)
    mkdir -p "$scratch/clients"
    # setuptools' warnings are printed only when the install fails.
    cp "$repo/Cargo.toml" "$scratch/" &&
        cp -r "$repo/clients/python" "$repo/clients/meltano" "$scratch/clients/" &&
        "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall \
            "$scratch/clients/python" "$scratch/clients/meltano" \
            "$scratch/clients/meltano/tests/fixtures/dummy_state_backend" >"$scratch/log" 2>&1 ||
        { cat "$scratch/log" >&2; rc=1; }
    rm -rf "$scratch"
    return $rc
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    meltano_install
    echo "RUNLOCK_TEST_MELTANO=$RUNLOCK_TEST_MELTANO"
    echo "RUNLOCK_TEST_TARGET_JSONL=$RUNLOCK_TEST_TARGET_JSONL"
fi
