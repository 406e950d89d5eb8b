#!/usr/bin/env bash
# Installs moto (an S3 emulator, see EMULATORS.md here) into a
# cached venv and starts it on a free local port, for the S3 tests.
#
# Sourced by scripts/test and scripts/chaos:
#                            source tests/scripts/moto.sh; moto_start; ...; moto_stop
# Run by itself:             bash tests/scripts/moto.sh   (starts it, prints the
#                            endpoint, and stops it on Ctrl-C)
#
# moto_start exports:
#   RUNLOCK_TEST_S3_ENDPOINT  http://127.0.0.1:PORT (path-style, any key/secret, us-east-1)
#   RUNLOCK_TEST_MOTO_PID     the moto server's pid (for tests that pause it)
#   RUNLOCK_TEST_PYTHON       the venv's python, which has boto3
#
# The venv lives in ${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}/venv and is reused when
# it already has this moto version.

MOTO_VERSION=5.2.5
RUNLOCK_EMU_DIR=${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

moto_install() {
    cached_venv "$RUNLOCK_EMU_DIR/venv" moto_server \
        "moto[s3]==$MOTO_VERSION" flask flask-cors boto3
}

moto_start() {
    moto_install || { echo "moto: install failed" >&2; return 1; }
    # moto_serial.py: moto applying the writes to one object one at a time, as
    # a real store applies a conditional write atomically (see the file).
    local venv=$RUNLOCK_EMU_DIR/venv port log
    local server=("$venv/bin/python" "$(dirname "${BASH_SOURCE[0]}")/moto_serial.py")
    port=$(free_port 5000) || return 1
    log=$RUNLOCK_EMU_DIR/moto-$port.log
    # The server on its own line, so that $! is its pid (EMULATORS.md here).
    "${server[@]}" -H 127.0.0.1 -p "$port" >"$log" 2>&1 &
    MOTO_PID=$!
    await_server moto "$MOTO_PID" "$log" 30 curl -sf "http://127.0.0.1:$port/moto-api/" || return 1
    export RUNLOCK_TEST_S3_ENDPOINT=http://127.0.0.1:$port
    export RUNLOCK_TEST_MOTO_PID=$MOTO_PID
    export RUNLOCK_TEST_PYTHON=$venv/bin/python
    echo "moto $MOTO_VERSION: S3 endpoint $RUNLOCK_TEST_S3_ENDPOINT (pid $MOTO_PID)" >&2
}

moto_stop() { stop_server MOTO_PID; }

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    serve_alone moto MOTO_PID \
        RUNLOCK_TEST_S3_ENDPOINT RUNLOCK_TEST_MOTO_PID RUNLOCK_TEST_PYTHON
fi
