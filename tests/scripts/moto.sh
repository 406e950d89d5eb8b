#!/usr/bin/env bash
# Installs moto (an S3 emulator, see ../shared/EMULATORS.md section 1) into a
# cached venv and starts it on a free local port, for the S3 tests.
#
# Sourced by scripts/test:   source tests/scripts/moto.sh; moto_start; ...; moto_stop
# Run by itself:             bash tests/scripts/moto.sh   (starts it, prints the
#                            endpoint, and stops it on Ctrl-C)
#
# moto_start exports:
#   RUNLOCK_TEST_S3_ENDPOINT  http://127.0.0.1:PORT (path-style, any key/secret, us-east-1)
#   RUNLOCK_TEST_MOTO_PID     the moto_server pid (for tests that pause it)
#   RUNLOCK_TEST_PYTHON       the venv's python, which has boto3
#
# The venv lives in ${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}/venv and is reused when
# it already has this moto version.

MOTO_VERSION=5.2.5
RUNLOCK_EMU_DIR=${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}

# shellcheck source=venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"

moto_install() {
    cached_venv "$RUNLOCK_EMU_DIR/venv" moto_server \
        "moto[s3]==$MOTO_VERSION" flask flask-cors boto3
}

# Prints a free TCP port on 127.0.0.1: 5000 unless it is taken.
moto_free_port() {
    python3 - <<'PY'
import socket
def free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return s.getsockname()[1]
    except OSError:
        return None
    finally:
        s.close()
print(free(5000) or free(0))
PY
}

moto_start() {
    moto_install || { echo "moto: install failed" >&2; return 1; }
    local venv=$RUNLOCK_EMU_DIR/venv port log
    port=$(moto_free_port) || return 1
    log=$RUNLOCK_EMU_DIR/moto-$port.log
    # The server on its own line, so that $! is its pid (EMULATORS.md, pitfalls).
    "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$log" 2>&1 &
    MOTO_PID=$!
    local deadline=$((SECONDS + 30))
    until curl -sf "http://127.0.0.1:$port/moto-api/" >/dev/null 2>&1; do
        if ! kill -0 "$MOTO_PID" 2>/dev/null; then
            echo "moto: moto_server exited at start; its log ($log):" >&2
            cat "$log" >&2
            return 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            echo "moto: not answering on port $port after 30 s; its log ($log):" >&2
            cat "$log" >&2
            moto_stop
            return 1
        fi
        sleep 0.1
    done
    export RUNLOCK_TEST_S3_ENDPOINT=http://127.0.0.1:$port
    export RUNLOCK_TEST_MOTO_PID=$MOTO_PID
    export RUNLOCK_TEST_PYTHON=$venv/bin/python
    echo "moto $MOTO_VERSION: S3 endpoint $RUNLOCK_TEST_S3_ENDPOINT (pid $MOTO_PID)" >&2
}

moto_stop() {
    [ -n "${MOTO_PID:-}" ] || return 0
    # A test may leave it paused (SIGSTOP): continue it so that it can exit.
    kill -CONT "$MOTO_PID" 2>/dev/null || true
    kill -TERM "$MOTO_PID" 2>/dev/null || true
    local deadline=$((SECONDS + 5))
    while kill -0 "$MOTO_PID" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
        sleep 0.1
    done
    kill -KILL "$MOTO_PID" 2>/dev/null || true
    wait "$MOTO_PID" 2>/dev/null || true
    MOTO_PID=
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    moto_start
    trap moto_stop EXIT
    trap 'exit 0' INT TERM
    echo "RUNLOCK_TEST_S3_ENDPOINT=$RUNLOCK_TEST_S3_ENDPOINT"
    echo "RUNLOCK_TEST_MOTO_PID=$RUNLOCK_TEST_MOTO_PID"
    echo "RUNLOCK_TEST_PYTHON=$RUNLOCK_TEST_PYTHON"
    echo "(Ctrl-C stops it)"
    wait "$MOTO_PID"
fi
