#!/usr/bin/env bash
# Installs Azurite (an Azure Blob emulator, see EMULATORS.md here)
# with npm and starts its blob service on a free local port, for the azure://
# tests; and a venv with Azure's own Python SDK, which the tests read records with.
#
# Sourced by scripts/test:   source tests/scripts/azurite.sh; azurite_start; ...; azurite_stop
# Run by itself:             bash tests/scripts/azurite.sh   (starts it, prints the
#                            variables, and stops it on Ctrl-C)
#
# azurite_start exports:
#   RUNLOCK_TEST_AZURE_ENDPOINT           http://127.0.0.1:PORT/devstoreaccount1
#   RUNLOCK_TEST_AZURE_CONNECTION_STRING  for the well-known devstoreaccount1 (Shared Key)
#   RUNLOCK_TEST_AZURE_PYTHON             a python with azure-storage-blob
#   RUNLOCK_TEST_AZURITE                  the azurite-blob executable (tests start their own)
#   RUNLOCK_TEST_AZURITE_PID              its pid
#
# Azurite lives in ${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}/azurite and the venv in
# .../azure-venv; both are reused when they already have these versions. Node
# and npm come from apt when missing.

AZURITE_VERSION=3.35.0
AZURE_BLOB_PY_VERSION=12.31.1
RUNLOCK_EMU_DIR=${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}
# Azurite's well-known development account and key (documented, not a secret).
AZURITE_ACCOUNT=devstoreaccount1
AZURITE_KEY='Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=='

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

azurite_install() {
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        echo "installing nodejs and npm with apt" >&2
        apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null || return 1
    fi
    local dir=$RUNLOCK_EMU_DIR/azurite
    local stamp=$dir/.runlock-azurite-$AZURITE_VERSION
    if [ ! -f "$stamp" ] || [ ! -x "$dir/node_modules/.bin/azurite-blob" ]; then
        echo "installing azurite@$AZURITE_VERSION into $dir" >&2
        rm -rf "$dir"
        mkdir -p "$dir"
        npm install --prefix "$dir" --no-audit --no-fund --silent "azurite@$AZURITE_VERSION" ||
            return 1
        touch "$stamp"
    fi
    cached_venv "$RUNLOCK_EMU_DIR/azure-venv" python "azure-storage-blob==$AZURE_BLOB_PY_VERSION"
}

azurite_start() {
    azurite_install || { echo "azurite: install failed" >&2; return 1; }
    local bin=$RUNLOCK_EMU_DIR/azurite/node_modules/.bin/azurite-blob port log
    port=$(free_port 10000) || return 1
    # A directory of its own: another test run may be starting an Azurite now.
    mkdir -p "$RUNLOCK_EMU_DIR"
    AZURITE_DATA=$(mktemp -d "$RUNLOCK_EMU_DIR/azurite-data-XXXXXX") || return 1
    log=$AZURITE_DATA.log
    # The server on its own line, so that $! is its pid (EMULATORS.md here).
    "$bin" --blobHost 127.0.0.1 --blobPort "$port" --location "$AZURITE_DATA" \
        --skipApiVersionCheck --loose --disableTelemetry >"$log" 2>&1 &
    AZURITE_PID=$!
    # Any HTTP answer (400 for /) means it is up.
    await_server azurite "$AZURITE_PID" "$log" 30 \
        curl -s -o /dev/null "http://127.0.0.1:$port/" || return 1
    export RUNLOCK_TEST_AZURE_ENDPOINT=http://127.0.0.1:$port/$AZURITE_ACCOUNT
    export RUNLOCK_TEST_AZURE_CONNECTION_STRING="DefaultEndpointsProtocol=http;AccountName=$AZURITE_ACCOUNT;AccountKey=$AZURITE_KEY;BlobEndpoint=$RUNLOCK_TEST_AZURE_ENDPOINT;"
    export RUNLOCK_TEST_AZURE_PYTHON=$RUNLOCK_EMU_DIR/azure-venv/bin/python
    export RUNLOCK_TEST_AZURITE=$bin
    export RUNLOCK_TEST_AZURITE_PID=$AZURITE_PID
    echo "azurite $AZURITE_VERSION: blob endpoint $RUNLOCK_TEST_AZURE_ENDPOINT (pid $AZURITE_PID)" >&2
}

azurite_stop() {
    stop_server AZURITE_PID
    [ -n "${AZURITE_DATA:-}" ] && rm -rf "$AZURITE_DATA"
    AZURITE_DATA=
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    serve_alone azurite AZURITE_PID \
        RUNLOCK_TEST_AZURE_ENDPOINT RUNLOCK_TEST_AZURE_CONNECTION_STRING RUNLOCK_TEST_AZURE_PYTHON RUNLOCK_TEST_AZURITE RUNLOCK_TEST_AZURITE_PID
fi
