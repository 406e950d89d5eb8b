#!/usr/bin/env bash
# cached_venv DIR EXE REQUIREMENT...: a Python venv in DIR with the
# requirements installed, reused when its stamp names these same requirements
# and DIR/bin/EXE exists. Sourced by the emulator scripts beside it.

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
