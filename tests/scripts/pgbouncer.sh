#!/usr/bin/env bash
# Starts PgBouncer (Debian's package) in transaction pooling mode in front of
# the cluster postgres.sh started: the way operators put a fleet of agents on
# one server (issue 28). Every database name is passed through to the server,
# as the same user, with trust authentication.
#
# Sourced by stores.sh, after pg_start:   pgbouncer_start; ...; pgbouncer_stop
#
# pgbouncer_start exports:
#   RUNLOCK_TEST_PGBOUNCER_URI   postgresql://postgres@127.0.0.1:PORT/postgres, through PgBouncer
#   RUNLOCK_TEST_PGBOUNCER_POOL  server connections per database and user (pool_size)
#
# Installs the pgbouncer package with apt when missing. Its files live in a new
# ${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}/pgbouncer-XXXXXX, deleted by pgbouncer_stop.

RUNLOCK_EMU_DIR=${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}
# Server connections per database: a fleet of agents shares these few.
PGBOUNCER_POOL=20

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

pgbouncer_install() {
    command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] && return 0
    echo "installing pgbouncer with apt" >&2
    apt-get update -qq && apt-get install -y -qq pgbouncer >/dev/null
}

pgbouncer_start() {
    [ -n "${RUNLOCK_TEST_PG_URI:-}" ] || { echo "pgbouncer: start postgres first" >&2; return 1; }
    pgbouncer_install || { echo "pgbouncer: install failed" >&2; return 1; }
    local server_port port
    server_port=${RUNLOCK_TEST_PG_URI##*:}
    server_port=${server_port%%/*}
    mkdir -p "$RUNLOCK_EMU_DIR"
    PGBOUNCER_DIR=$(mktemp -d "$RUNLOCK_EMU_DIR/pgbouncer-XXXXXX") || return 1
    port=$(free_port 56432) || return 1
    echo '"postgres" ""' >"$PGBOUNCER_DIR/users.txt"
    cat >"$PGBOUNCER_DIR/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$server_port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $PGBOUNCER_DIR/users.txt
pool_mode = transaction
default_pool_size = $PGBOUNCER_POOL
max_client_conn = 2000
logfile = $PGBOUNCER_DIR/log
pidfile = $PGBOUNCER_DIR/pid
INI
    # PgBouncer refuses to run as root; each client is a file descriptor.
    local as=()
    if [ "$(id -u)" = 0 ]; then
        chown -R postgres: "$PGBOUNCER_DIR"
        as=(runuser -u postgres --)
    fi
    (ulimit -n 4096 2>/dev/null; "${as[@]}" /usr/sbin/pgbouncer -d -q "$PGBOUNCER_DIR/pgbouncer.ini") ||
        { cat "$PGBOUNCER_DIR/log" >&2; return 1; }
    local deadline=$((SECONDS + 15))
    until [ -s "$PGBOUNCER_DIR/pid" ] && psql -XAtqw -h 127.0.0.1 -p "$port" -U postgres \
        -d postgres -c 'SELECT 1' >/dev/null 2>&1; do
        if [ $SECONDS -ge $deadline ]; then
            echo "pgbouncer: not ready after 15 s; its log:" >&2
            cat "$PGBOUNCER_DIR/log" >&2
            return 1
        fi
        sleep 0.1
    done
    export RUNLOCK_TEST_PGBOUNCER_URI="postgresql://postgres@127.0.0.1:$port/postgres"
    export RUNLOCK_TEST_PGBOUNCER_POOL=$PGBOUNCER_POOL
    echo "pgbouncer $(/usr/sbin/pgbouncer --version | head -1 | awk '{print $2}'): $RUNLOCK_TEST_PGBOUNCER_URI (transaction pooling, $PGBOUNCER_POOL server connections per database)" >&2
}

pgbouncer_stop() {
    [ -n "${PGBOUNCER_DIR:-}" ] || return 0
    [ -s "$PGBOUNCER_DIR/pid" ] && stop_pid "$(cat "$PGBOUNCER_DIR/pid")"
    rm -rf "$PGBOUNCER_DIR"
    unset PGBOUNCER_DIR RUNLOCK_TEST_PGBOUNCER_URI RUNLOCK_TEST_PGBOUNCER_POOL
}
