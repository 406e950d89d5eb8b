#!/usr/bin/env bash
# Installs ministack (a second S3 emulator, written apart from moto; see
# EMULATORS.md here) into a cached venv and starts its S3 alone on a free
# local port, so that the S3 tests and the chaos harness run on two
# independent S3 implementations.
#
# Sourced by scripts/test and scripts/chaos:
#                            source tests/scripts/ministack.sh; ministack_start; ...; ministack_stop
# Run by itself:             bash tests/scripts/ministack.sh   (starts it, prints the
#                            endpoint, and stops it on Ctrl-C)
#
# ministack_start exports:
#   RUNLOCK_TEST_MINISTACK_ENDPOINT  http://127.0.0.1:PORT (path-style, any key/secret, us-east-1)
#   RUNLOCK_TEST_MINISTACK_PID       the server's pid
#   RUNLOCK_TEST_MINISTACK_PYTHON    the venv's python, which has boto3
#
# The venv lives in ${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}/ministack-venv and is
# reused when it already has this version.

MINISTACK_VERSION=1.5.33
RUNLOCK_EMU_DIR=${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ministack_install() {
    cached_venv "$RUNLOCK_EMU_DIR/ministack-venv" ministack \
        "ministack==$MINISTACK_VERSION" boto3
}

ministack_start() {
    ministack_install || { echo "ministack: install failed" >&2; return 1; }
    local venv=$RUNLOCK_EMU_DIR/ministack-venv port log
    port=$(free_port 4566) || return 1
    log=$RUNLOCK_EMU_DIR/ministack-$port.log
    # S3 only (it emulates forty services; the others would only slow its
    # start), bound to loopback, in memory, without an access line per request.
    # The server on its own line, so that $! is its pid (EMULATORS.md here).
    GATEWAY_PORT=$port BIND_HOST=127.0.0.1 SERVICES=s3 LOG_LEVEL=WARNING \
        "$venv/bin/ministack" >"$log" 2>&1 &
    MINISTACK_PID=$!
    await_server ministack "$MINISTACK_PID" "$log" 30 \
        curl -sf "http://127.0.0.1:$port/_ministack/health" || return 1
    export RUNLOCK_TEST_MINISTACK_ENDPOINT=http://127.0.0.1:$port
    export RUNLOCK_TEST_MINISTACK_PID=$MINISTACK_PID
    export RUNLOCK_TEST_MINISTACK_PYTHON=$venv/bin/python
    echo "ministack $MINISTACK_VERSION: S3 endpoint $RUNLOCK_TEST_MINISTACK_ENDPOINT (pid $MINISTACK_PID)" >&2
}

ministack_stop() { stop_server MINISTACK_PID; }

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    serve_alone ministack MINISTACK_PID \
        RUNLOCK_TEST_MINISTACK_ENDPOINT RUNLOCK_TEST_MINISTACK_PID RUNLOCK_TEST_MINISTACK_PYTHON
fi
