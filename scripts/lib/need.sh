#!/usr/bin/env bash
# need COMMAND APT-ARGUMENT...: installs with apt-get, unless COMMAND is on
# PATH (or, given as a path, exists), what provides it, so that each script
# in scripts/ runs on a fresh machine by itself. Sourced by the shell
# scripts; `bash scripts/lib/need.sh COMMAND APT-ARGUMENT...` does the same
# for scripts in other languages.
need() {
    local command=$1
    shift
    if [[ $command == /* ]]; then [ -e "$command" ] && return 0; else command -v "$command" >/dev/null && return 0; fi
    echo "installing $* with apt-get (for $command)" >&2
    # Scripts that run side by side (a build beside the stores' installs)
    # may both install: the second waits for the first's dpkg lock.
    local wait_for_lock=(-o DPkg::Lock::Timeout=600)
    # Once per script: on a fresh machine the index is missing, later it is fresh enough.
    if [ -z "${need_updated:-}" ]; then
        apt-get "${wait_for_lock[@]}" update -qq || return 1
        need_updated=1
    fi
    apt-get "${wait_for_lock[@]}" install -y -qq "$@" >/dev/null
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    need "$@"
fi
