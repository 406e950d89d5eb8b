#!/usr/bin/env bash
# What a release ships besides the .deb, as scripts/test checks it:
# `scripts/package image` builds the pip wheels (the release profile, the two
# binaries static), the tarball of their binaries with SHA256SUMS, and the
# container image. Then:
# - a fresh venv installs the wheels from their directory, with msgpack from a
#   cached wheelhouse and no index (nothing else may come in, nor a `runlock`
#   of PyPI's), and tests/shipped/package/test_wheel.py, run by the venv's python
#   from outside the checkout, starts the venv's runlockd and locks runs
#   through the venv's runlock and Python client;
# - the checksums hold, and the tarball's binaries are the wheels';
# - the image, run by buildah (no container engine), answers with its
#   runlockd and runlock by name, as the Kubernetes recipe calls them.
# Prints the products' sizes and the build's time.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
cache=${RUNLOCK_EMU_DIR:-/tmp/runlock-emu}
wheelhouse=$cache/wheel-wheelhouse # msgpack, the client's one dependency
# A target directory of its own: scripts/test runs this beside the tests,
# whose target directory is locked whenever a test builds the binaries.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target}/wheel
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)

started=$SECONDS
products=$("$repo/scripts/package" image)
echo "built in $((SECONDS - started)) s:"
wheels=("$CARGO_TARGET_DIR"/wheels/*.whl)
# shellcheck disable=SC2086 # one path a line
ls -l "${wheels[@]}" $products

scratch=$(mktemp -d)
container=
buildah=(buildah --storage-driver vfs)
cleanup() {
    if [ -n "$container" ]; then
        "${buildah[@]}" rm "$container" >/dev/null || true
        "${buildah[@]}" rmi "localhost/runlock:$version" >/dev/null || true
    fi
    rm -rf "$scratch"
}
trap cleanup EXIT

echo "-- the wheels, in a fresh venv"
python3 -m venv "$scratch/venv"
pip=("$scratch/venv/bin/pip" --disable-pip-version-check)
[ -n "$(ls -A "$wheelhouse" 2>/dev/null)" ] || "${pip[@]}" download -q -d "$wheelhouse" msgpack
"${pip[@]}" install -q --no-index --find-links "$wheelhouse" --find-links "$CARGO_TARGET_DIR/wheels" runlock
# The venv's python alone, from /: no PYTHONPATH, no checkout on sys.path.
(cd / && env -u PYTHONPATH "$scratch/venv/bin/python" -B "$repo/tests/shipped/package/test_wheel.py" -v)

echo "-- the tarball and its checksums"
dist=$CARGO_TARGET_DIR/dist
(cd "$dist" && sha256sum --quiet -c SHA256SUMS)
tarball=$(grep -o '[^ ]*\.tar\.gz$' "$dist/SHA256SUMS")
tar -xzf "$dist/$tarball" -C "$scratch"
for bin in runlockd runlock; do
    cmp "$scratch/${tarball%.tar.gz}/$bin" "$scratch/venv/bin/$bin"
done

echo "-- the image"
archive=$(grep -- '-image\.tar$' <<<"$products")
container=$("${buildah[@]}" from --quiet "oci-archive:$archive")
for bin in runlockd runlock; do
    # By name, as the recipe's `command:` and probe call them: the image's PATH.
    answer=$("${buildah[@]}" run --isolation chroot "$container" -- "$bin" --version)
    [ "$answer" = "$bin $version" ] || { echo "the image's $bin --version said: $answer" >&2; exit 1; }
done
echo "the image runs runlockd and runlock $version"
