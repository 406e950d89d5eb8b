#!/usr/bin/env bash
# Starts three throwaway etcd servers (tests/scripts/EMULATORS.md) for
# the etcd:// tests: a plain one, one with authentication enabled (a root user
# only; the tests add the users and roles they need with etcdctl), and one
# served over TLS that requires a client certificate (a throwaway CA's).
#
# Sourced by scripts/test:   source tests/scripts/etcd.sh; etcd_start; ...; etcd_stop
# Run by itself:             bash tests/scripts/etcd.sh   (starts them, prints the
#                            variables, and stops them on Ctrl-C)
#
# etcd_start exports:
#   RUNLOCK_TEST_ETCD_ENDPOINT        http://127.0.0.1:PORT (no authentication)
#   RUNLOCK_TEST_ETCD_AUTH_ENDPOINT   http://127.0.0.1:PORT (authentication enabled)
#   RUNLOCK_TEST_ETCD_ROOT_PASSWORD   the auth server's root password
#   RUNLOCK_TEST_ETCD_TLS_ENDPOINT    https://127.0.0.1:PORT (TLS, client certificates required)
#   RUNLOCK_TEST_ETCD_TLS_DIR         its ca.crt, and client.crt and client.key the CA signed
#   RUNLOCK_TEST_ETCD_BIN             the etcd binary (tests start their own to pause it)
#   RUNLOCK_TEST_ETCDCTL              the etcdctl binary (tests read records with it)
#
# Installs Debian's etcd-server and etcd-client with apt when etcd is missing.
# Each server's data lives in a new ${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}/etcd-XXXXXX and
# is deleted by etcd_stop.

RUNLOCK_EMU_DIR=${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}
ETCD_ROOT_PASSWORD=runlock-test-root

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

etcd_install() {
    command -v etcd >/dev/null && command -v etcdctl >/dev/null && return 0
    echo "installing etcd-server and etcd-client with apt" >&2
    apt-get update -qq && apt-get install -y -qq etcd-server etcd-client >/dev/null
}

# etcd_launch VAR DEFAULT_PORT [tls]: starts one server; sets VAR to its client
# URL and appends its pid and directory to ETCD_PIDS and ETCD_DIRS. With
# `tls`, clients connect over TLS with a certificate of the CA in the
# server's directory (ETCD_TLS_DIR).
etcd_launch() {
    local var=$1 port peer dir url pid scheme=http tls_args=() curl_tls=()
    # A directory of its own (another test run may be starting an etcd now),
    # and the ports picked just before the server binds them.
    mkdir -p "$RUNLOCK_EMU_DIR"
    dir=$(mktemp -d "$RUNLOCK_EMU_DIR/etcd-XXXXXX") || return 1
    if [ "${3:-}" = tls ]; then
        test_ca "$dir" || { echo "etcd: making the TLS certificates failed" >&2; return 1; }
        scheme=https
        tls_args=(--cert-file "$dir/server.crt" --key-file "$dir/server.key"
            --client-cert-auth --trusted-ca-file "$dir/ca.crt")
        curl_tls=(--cacert "$dir/ca.crt" --cert "$dir/client.crt" --key "$dir/client.key")
        ETCD_TLS_DIR=$dir
    fi
    port=$(free_port "$2") || return 1
    peer=$(free_port $(($2 + 10))) || return 1
    url=$scheme://127.0.0.1:$port
    # The server on its own line, so that $! is its pid (EMULATORS.md here).
    etcd --name "runlock-$port" --data-dir "$dir/data" --log-level warn \
        --listen-client-urls "$url" --advertise-client-urls "$url" "${tls_args[@]}" \
        --listen-peer-urls "http://127.0.0.1:$peer" \
        --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "runlock-$port=http://127.0.0.1:$peer" >"$dir/log" 2>&1 &
    pid=$!
    ETCD_PIDS="${ETCD_PIDS:-} $pid"
    ETCD_DIRS="${ETCD_DIRS:-} $dir"
    await_server etcd "$pid" "$dir/log" 30 curl -sf "${curl_tls[@]}" "$url/health" || return 1
    printf -v "$var" '%s' "$url"
}

etcd_start() {
    etcd_install || { echo "etcd: install failed" >&2; return 1; }
    local plain auth tls
    etcd_launch plain 23790 || return 1
    etcd_launch auth 23791 || return 1
    etcd_launch tls 23792 tls || return 1
    local ctl=(etcdctl --endpoints "$auth" --command-timeout 5s) out
    # etcdctl logs a retry while it gives root its role: shown only on failure.
    out=$("${ctl[@]}" user add "root:$ETCD_ROOT_PASSWORD" 2>&1 && "${ctl[@]}" auth enable 2>&1) ||
        { echo "etcd: enabling authentication failed: $out" >&2; return 1; }
    export RUNLOCK_TEST_ETCD_ENDPOINT=$plain
    export RUNLOCK_TEST_ETCD_AUTH_ENDPOINT=$auth
    export RUNLOCK_TEST_ETCD_ROOT_PASSWORD=$ETCD_ROOT_PASSWORD
    export RUNLOCK_TEST_ETCD_TLS_ENDPOINT=$tls
    export RUNLOCK_TEST_ETCD_TLS_DIR=$ETCD_TLS_DIR
    RUNLOCK_TEST_ETCD_BIN=$(command -v etcd)
    RUNLOCK_TEST_ETCDCTL=$(command -v etcdctl)
    export RUNLOCK_TEST_ETCD_BIN RUNLOCK_TEST_ETCDCTL
    echo "etcd $(etcd --version | head -1 | awk '{print $3}'): $plain, with authentication $auth, with TLS $tls" >&2
}

etcd_stop() {
    local pid dir
    for pid in ${ETCD_PIDS:-}; do stop_pid "$pid"; done
    for dir in ${ETCD_DIRS:-}; do rm -rf "$dir"; done
    ETCD_PIDS=
    ETCD_DIRS=
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    etcd_start
    trap etcd_stop EXIT
    trap 'exit 0' INT TERM
    for var in RUNLOCK_TEST_ETCD_ENDPOINT RUNLOCK_TEST_ETCD_AUTH_ENDPOINT \
        RUNLOCK_TEST_ETCD_ROOT_PASSWORD RUNLOCK_TEST_ETCD_BIN RUNLOCK_TEST_ETCDCTL; do
        echo "$var=${!var}"
    done
    echo "(Ctrl-C stops them)"
    while :; do sleep 3600; done
fi
