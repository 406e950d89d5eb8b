#!/usr/bin/env bash
# Helpers the emulator scripts beside this file share. Sourced, never run.

# cached_venv DIR EXE REQUIREMENT...: a Python venv in DIR with the
# requirements installed, reused when its stamp names these same requirements
# and DIR/bin/EXE exists. Each emulator keeps a venv of its own, so that two
# scripts never reinstall each other's.
cached_venv() {
    local venv=$1 exe=$2
    shift 2
    local stamp
    stamp="$venv/.runlock-$(printf '%s_' "$@" | tr -c 'A-Za-z0-9.=_-' '_')"
    if [ -f "$stamp" ] && [ -x "$venv/bin/$exe" ]; then
        return 0
    fi
    echo "installing $* into $venv" >&2
    mkdir -p "$(dirname "$venv")"
    rm -rf "$venv"
    python3 -m venv "$venv" || return 1
    "$venv/bin/pip" install -q --disable-pip-version-check "$@" || return 1
    touch "$stamp"
}

# free_port DEFAULT: prints DEFAULT if nothing listens on 127.0.0.1:DEFAULT,
# else a port the kernel picks.
free_port() {
    python3 - "$1" <<'PY'
import socket, sys
def free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return s.getsockname()[1]
    except OSError:
        return None
    finally:
        s.close()
print(free(int(sys.argv[1])) or free(0))
PY
}

# await_server NAME PID LOG SECONDS COMMAND...: waits until COMMAND succeeds.
# Fails, printing LOG, if PID exits first or SECONDS pass.
await_server() {
    local name=$1 pid=$2 log=$3 deadline=$((SECONDS + $4))
    shift 4
    until "$@" >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$name: exited at start; its log ($log):" >&2
            cat "$log" >&2
            return 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            echo "$name: not ready after $4 s; its log ($log):" >&2
            cat "$log" >&2
            stop_pid "$pid"
            return 1
        fi
        sleep 0.1
    done
}

# stop_pid PID: continues it (a test may have paused it with SIGSTOP), asks it
# to stop, and kills it after 5 s.
# serve_alone NAME PID_VAR VAR...: what an emulator script does when run on
# its own rather than sourced: NAME_start, each VAR as VAR=value (quoted
# for the shell), then it serves until Ctrl-C, and NAME_stop.
serve_alone() {
    local name=$1 pid_var=$2 var
    shift 2
    set -euo pipefail
    "${name}_start"
    trap "${name}_stop" EXIT
    trap 'exit 0' INT TERM
    for var in "$@"; do
        printf '%s=%q\n' "$var" "${!var}"
    done
    echo "(Ctrl-C stops it)"
    wait "${!pid_var}"
}

stop_pid() {
    local pid=$1
    [ -n "$pid" ] || return 0
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 5))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# stop_server VAR: stop_pid on the pid that VAR holds; VAR is then emptied.
stop_server() {
    stop_pid "${!1:-}"
    printf -v "$1" '%s' ''
}

# test_ca DIR: a throwaway CA (ca.crt, ca.key) and what it signs, made with
# openssl: a server certificate for 127.0.0.1 and localhost (server.crt,
# server.key) and a client certificate (client.crt, client.key). P-256 keys,
# written 0600 as PostgreSQL requires of its own.
test_ca() {
    local dir=$1 out
    # Installed if missing, as each script here installs what it runs.
    bash "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/need.sh" openssl openssl ||
        { echo "test_ca: openssl is not installed, and apt-get could not install it" >&2; return 1; }
    # openssl talks on stderr even when all is well: shown only on failure.
    out=$(
        exec 2>&1
        umask 077
        openssl req -x509 -new -noenc -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
            -keyout "$dir/ca.key" -out "$dir/ca.crt" -days 3650 -subj /CN=runlock-test-ca \
            -addext basicConstraints=critical,CA:TRUE \
            -addext keyUsage=critical,keyCertSign,cRLSign || exit 1
        for who in server client; do
            openssl req -new -noenc -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
                -keyout "$dir/$who.key" -subj "/CN=runlock-test-$who" |
                openssl x509 -req -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -days 3650 \
                    -set_serial "0x$(openssl rand -hex 16)" -out "$dir/$who.crt" \
                    -extfile <(printf '%s\n' basicConstraints=critical,CA:FALSE \
                        subjectKeyIdentifier=hash authorityKeyIdentifier=keyid \
                        keyUsage=critical,digitalSignature \
                        "extendedKeyUsage=${who}Auth" \
                        "$([ "$who" = server ] && echo subjectAltName=DNS:localhost,IP:127.0.0.1)") \
                    || exit 1
        done
        chmod 0644 "$dir"/*.crt
    ) || { echo "$out" >&2; return 1; }
}
