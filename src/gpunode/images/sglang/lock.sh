#!/bin/sh
# Regenerate the locks (every package, exact version, sha256 hashes): each stack's
# (stacks/<name>/requirements.in, and its overrides.txt if it has one), pip.lock from pip.in and the
# lab's toolchain lock. A stack's resolution is frozen at its stack.yml exclude_newer, so a re-lock
# months later resolves the same ecosystem; pip's and the lab toolchain's at EXCLUDE_NEWER, the day
# after sglang 0.5.9 reached PyPI.
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
ROUTER_EXCLUDE_NEWER=2026-12-01T00:00:00Z
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

compile() {  # compile PYTHON PLATFORM IN OUT [extra uv args]; IN and OUT relative to the current folder
    python=$1 platform=$2 in=$3 out=$4
    shift 4
    "$TOOLS/bin/uv" pip compile --no-config --quiet --generate-hashes \
        --python-version "$python" --python-platform "$platform" \
        --index-url "$INDEX" \
        --custom-compile-command "images/sglang/lock.sh" \
        ${SSL_CERT_FILE:+--system-certs} "$@" -o "$out" "$in"
}
cd "$HERE"
for stack in stacks/*/; do
    (
        cd "$stack"
        date=$(sed -n 's/^exclude_newer: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' stack.yml)
        set -- --exclude-newer "$date"
        if [ -f overrides.txt ]; then set -- "$@" --override overrides.txt; fi
        compile 3.11 x86_64-manylinux_2_36 requirements.in requirements.lock "$@"
        compile 3.12 x86_64-manylinux_2_39 requirements.in requirements-py312.lock "$@"
    )
done
compile 3.11 x86_64-manylinux_2_36 pip.in pip.lock --exclude-newer "$EXCLUDE_NEWER"
# The lab's stand-in toolchain (bases.yml, toolchain pypi-cuda-13.0): installed into its own venv
# by the debootstrap base's Python.
compile 3.11 x86_64-manylinux_2_36 toolchain-cuda13.0.in toolchain-cuda13.0.lock --exclude-newer "$EXCLUDE_NEWER"
# The router image (images/router): sglang-router and what it needs, on the bases' CPython 3.11,
# frozen at ROUTER_EXCLUDE_NEWER (sglang-router 0.3.2 is the newest on PyPI then).
(cd ../router && compile 3.11 x86_64-manylinux_2_36 requirements.in requirements.lock --exclude-newer "$ROUTER_EXCLUDE_NEWER")
for lock in stacks/*/requirements*.lock pip.lock toolchain-cuda13.0.lock ../router/requirements.lock; do
    echo "locked: $(grep -c '^[a-z]' "$HERE/$lock") packages in $lock"
done
