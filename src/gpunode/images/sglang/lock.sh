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
# The image's interpreter and libc: Debian bookworm, CPython 3.11, glibc 2.36, x86_64.
PYTHON_VERSION=3.11
PLATFORM=x86_64-manylinux_2_36
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

compile() {  # compile IN OUT [extra uv args]
    in=$1 out=$2
    shift 2
    "$TOOLS/bin/uv" pip compile --no-config --quiet --generate-hashes \
        --python-version "$PYTHON_VERSION" --python-platform "$PLATFORM" \
        --index-url "$INDEX" --exclude-newer "$EXCLUDE_NEWER" \
        --custom-compile-command "images/sglang/lock.sh" \
        ${SSL_CERT_FILE:+--system-certs} "$@" -o "$HERE/$out" "$HERE/$in"
}
cd "$HERE"
compile requirements.in requirements.lock --override overrides.txt
compile pip.in pip.lock
echo "locked: $(grep -c '^[a-z]' "$HERE/requirements.lock") packages in requirements.lock, pip.lock"
