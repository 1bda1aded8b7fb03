#!/bin/sh
# Regenerate requirements.lock and pip.lock (every package, exact version, sha256 hashes) from
# requirements.in, overrides.txt and pip.in. Resolution is frozen at EXCLUDE_NEWER, the day after
# sglang 0.5.9 reached PyPI, so a re-lock months later resolves the same ecosystem the seeds ran.
#
#   src/gpunode/images/sglang/lock.sh            # writes the locks beside this script
#   CA_BUNDLE=/path/ca.pem src/gpunode/images/sglang/lock.sh   # behind a TLS-intercepting proxy
#
# uv runs from its own throwaway venv (uv is no dependency of gpunode); host pip and uv config
# files are ignored so the result depends on the inputs alone.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
UV_VERSION=0.13.9
EXCLUDE_NEWER=2026-02-24T00:00:00Z
# One lock per interpreter and libc the image's bases have (bases.yml): Debian bookworm (CPython
# 3.11, glibc 2.36) and Ubuntu 24.04 (CPython 3.12, glibc 2.39), x86_64.
INDEX=https://pypi.org/simple
TOOLS=${XDG_CACHE_HOME:-$HOME/.cache}/gpunode/uv-$UV_VERSION

if [ -n "${CA_BUNDLE:-}" ]; then
    export SSL_CERT_FILE="$CA_BUNDLE" PIP_CERT="$CA_BUNDLE"
fi
export PIP_CONFIG_FILE=/dev/null
if [ ! -x "$TOOLS/bin/uv" ]; then
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/pip" install --quiet --disable-pip-version-check --index-url "$INDEX" "uv==$UV_VERSION"
fi

compile() {  # compile PYTHON PLATFORM IN OUT [extra uv args]
    python=$1 platform=$2 in=$3 out=$4
    shift 4
    "$TOOLS/bin/uv" pip compile --no-config --quiet --generate-hashes \
        --python-version "$python" --python-platform "$platform" \
        --index-url "$INDEX" --exclude-newer "$EXCLUDE_NEWER" \
        --custom-compile-command "images/sglang/lock.sh" \
        ${SSL_CERT_FILE:+--system-certs} "$@" -o "$HERE/$out" "$HERE/$in"
}
cd "$HERE"
compile 3.11 x86_64-manylinux_2_36 requirements.in requirements.lock --override overrides.txt
compile 3.12 x86_64-manylinux_2_39 requirements.in requirements-py312.lock --override overrides.txt
compile 3.11 x86_64-manylinux_2_36 pip.in pip.lock
# The lab's stand-in toolchain (bases.yml, toolchain pypi-cuda-13.0): installed into its own venv
# by the debootstrap base's Python.
compile 3.11 x86_64-manylinux_2_36 toolchain-cuda13.0.in toolchain-cuda13.0.lock
for lock in requirements.lock requirements-py312.lock pip.lock toolchain-cuda13.0.lock; do
    echo "locked: $(grep -c '^[a-z]' "$HERE/$lock") packages in $lock"
done
