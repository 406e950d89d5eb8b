#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster (tests/scripts/EMULATORS.md) for
# the postgresql:// backend's tests and for the tests that read a Meltano
# system database on PostgreSQL (tests/meltano/legacy.rs).
#
# Sourced by scripts/test:   source tests/scripts/postgres.sh; pg_start; ...; pg_stop
# Run by itself:             bash tests/scripts/postgres.sh   (starts it, prints the
#                            URI, and stops it on Ctrl-C)
#
# pg_start exports:
#   RUNLOCK_TEST_PG_URI       postgresql://postgres@127.0.0.1:PORT/postgres (superuser, trust auth)
#   RUNLOCK_TEST_PG_PW_URI    the same server as role runlock_pw, which must log in with
#                             scram-sha-256 (no password in the URI)
#   RUNLOCK_TEST_PG_PASSWORD  runlock_pw's password (random per start)
#                             (role runlock_limited logs in without one and may create nothing)
#   RUNLOCK_TEST_PG_CA        the CA that signed the server's TLS certificate (for
#                             127.0.0.1 and localhost); the server offers TLS
#   RUNLOCK_TEST_PG_BIN       the server's bin directory (postgres, initdb), for tests
#                             that start a cluster of their own
#
# Installs the postgresql package with apt when no server binary is found. The
# cluster lives in a new ${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}/pg-XXXXXX and is deleted
# by pg_stop.

RUNLOCK_EMU_DIR=${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

pg_bindir() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
    [ -n "$dir" ] && [ -x "$dir/initdb" ] && echo "$dir"
}

pg_install() {
    pg_bindir >/dev/null && command -v psql >/dev/null && return 0
    echo "installing postgresql with apt" >&2
    apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
}

pg_start() {
    pg_install || { echo "postgres: install failed" >&2; return 1; }
    local bin port
    bin=$(pg_bindir) || { echo "postgres: no server binaries" >&2; return 1; }
    # A directory of its own, never one named after a port: another test run
    # on this machine may be starting a cluster of its own right now.
    mkdir -p "$RUNLOCK_EMU_DIR"
    PG_DIR=$(mktemp -d "$RUNLOCK_EMU_DIR/pg-XXXXXX") || return 1
    # initdb refuses to run as root: the cluster belongs to the postgres user.
    local as=()
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$PG_DIR"
        as=(runuser -u postgres --)
    fi
    "${as[@]}" "$bin/initdb" -D "$PG_DIR/data" -U postgres --auth=trust -E UTF8 --no-sync \
        >"$PG_DIR/initdb.log" 2>&1 || { cat "$PG_DIR/initdb.log" >&2; return 1; }
    # runlock_pw must give its password (scram-sha-256); everyone else is trusted.
    cat >"$PG_DIR/data/pg_hba.conf" <<'HBA'
local all all                     trust
host  all runlock_pw 127.0.0.1/32 scram-sha-256
host  all runlock_pw ::1/128      scram-sha-256
host  all all        127.0.0.1/32 trust
host  all all        ::1/128      trust
HBA
    test_ca "$PG_DIR/data" || { echo "postgres: making the TLS certificates failed" >&2; return 1; }
    if [ "$(id -u)" = 0 ]; then chown -R postgres: "$PG_DIR"; fi
    # The port is picked last, just before the server binds it, so two starts
    # at once cannot both get it.
    port=$(free_port 55432) || return 1
    "${as[@]}" "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w -t 30 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $PG_DIR -c fsync=off -c ssl=on \
            -c ssl_cert_file=server.crt -c ssl_key_file=server.key \
            -c client_connection_check_interval=1s" start >/dev/null ||
        { cat "$PG_DIR/log" >&2; return 1; }
    local password
    password=rl-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
    "$bin/psql" -q -h "$PG_DIR" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 \
        -c "CREATE ROLE runlock_pw LOGIN PASSWORD '$password'" \
        -c "CREATE ROLE runlock_limited LOGIN" >/dev/null ||
        { echo "postgres: creating roles runlock_pw and runlock_limited failed" >&2; return 1; }
    export RUNLOCK_TEST_PG_URI="postgresql://postgres@127.0.0.1:$port/postgres"
    export RUNLOCK_TEST_PG_PW_URI="postgresql://runlock_pw@127.0.0.1:$port/postgres"
    export RUNLOCK_TEST_PG_PASSWORD=$password
    export RUNLOCK_TEST_PG_CA=$PG_DIR/data/ca.crt
    export RUNLOCK_TEST_PG_BIN=$bin
    echo "postgres: $RUNLOCK_TEST_PG_URI (TLS offered; role runlock_pw needs a password)" >&2
}

pg_stop() {
    [ -n "${PG_DIR:-}" ] || return 0
    if [ -f "$PG_DIR/data/postmaster.pid" ]; then
        local pid
        pid=$(head -1 "$PG_DIR/data/postmaster.pid")
        kill -INT "$pid" 2>/dev/null
        local deadline=$((SECONDS + 15))
        while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    fi
    rm -rf "$PG_DIR"
    unset PG_DIR RUNLOCK_TEST_PG_URI RUNLOCK_TEST_PG_PW_URI RUNLOCK_TEST_PG_PASSWORD \
        RUNLOCK_TEST_PG_CA RUNLOCK_TEST_PG_BIN
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    pg_start
    trap pg_stop EXIT
    echo "RUNLOCK_TEST_PG_URI=$RUNLOCK_TEST_PG_URI"
    echo "RUNLOCK_TEST_PG_PW_URI=$RUNLOCK_TEST_PG_PW_URI"
    echo "RUNLOCK_TEST_PG_PASSWORD=$RUNLOCK_TEST_PG_PASSWORD"
    echo "RUNLOCK_TEST_PG_CA=$RUNLOCK_TEST_PG_CA"
    echo "RUNLOCK_TEST_PG_BIN=$RUNLOCK_TEST_PG_BIN"
    echo "Ctrl-C stops it" >&2
    while :; do sleep 3600; done
fi
