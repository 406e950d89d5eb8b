#!/usr/bin/env bash
# The Go client's checks, for scripts/test and CI; exits non-zero on any
# failure. Go and vmihailenco/msgpack/v5 are Debian's packages (through
# scripts/lib/need.sh), and the Go module proxy is out of reach, so the
# build is offline in GOPATH mode: a scratch GOPATH holds this directory as
# `runlock`, beside Debian's /usr/share/gocode. Then gofmt, go vet, and
# go test (with the race detector) against a real runlockd: $RUNLOCKD, else
# the workspace's debug build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../../scripts/lib/need.sh"
need go golang-go
need /usr/share/gocode/src/github.com/vmihailenco/msgpack/v5/go.mod golang-github-vmihailenco-msgpack.v5-dev

if [ -z "${RUNLOCKD:-}" ]; then
    (cd "$here/../.." && cargo build -q -p runlock-agent --bin runlockd)
    target="$(cd "$here/../.." && cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
    export RUNLOCKD="$target/debug/runlockd"
fi

gopath="$(mktemp -d)"
trap 'rm -rf "$gopath"' EXIT
mkdir -p "$gopath/src"
ln -s "$here" "$gopath/src/runlock"
export GO111MODULE=off GOFLAGS= GOPATH="$gopath:/usr/share/gocode"
cd "$gopath/src/runlock"

echo "-- gofmt, go vet"
unformatted="$(gofmt -l .)"
[ -z "$unformatted" ] || { echo "not gofmt'ed: $unformatted"; exit 1; }
go vet ./...
echo "-- go test"
go test -race -count=1 -timeout 5m ./...
