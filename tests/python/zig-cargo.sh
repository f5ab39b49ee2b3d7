#!/usr/bin/env bash
# tests/python/zig-cargo.sh: CARGO for setuptools-rust when tests/python/wheel.sh
# builds the manylinux wheel. setuptools-rust runs `$CARGO metadata ...` and
# `$CARGO rustc --lib ... --target TRIPLE ...` (TRIPLE from CARGO_BUILD_TARGET,
# the host's: rustc must know it, so no glibc suffix there). This passes
# `rustc` to cargo-zigbuild with TRIPLE.$ROCEV2_WHEEL_GLIBC (e.g.
# x86_64-unknown-linux-gnu.2.28): zig links librocev2 against that glibc's
# symbol versions (its own stubs, not the host's libc), so the library runs on
# glibc >= that version whatever this host has. Every other command goes to
# cargo unchanged. Needs cargo-zigbuild and zig (PyPI: cargo-zigbuild, ziglang)
# on PATH, as tests/python/dist-tools.sh installs them.
set -euo pipefail
: "${ROCEV2_WHEEL_GLIBC:?set ROCEV2_WHEEL_GLIBC to the glibc version to link against, e.g. 2.28}"
# cargo-zigbuild runs $CARGO when set: that would be this script again.
unset CARGO
if [ "${1:-}" != rustc ]; then
    exec cargo "$@"
fi
shift
args=()
while [ $# -gt 0 ]; do
    case $1 in
        --) args+=("$@"); break ;;  # rustc's own arguments: as given
        --target) args+=(--target "$2.$ROCEV2_WHEEL_GLIBC"); shift 2 ;;
        --target=*) args+=("$1.$ROCEV2_WHEEL_GLIBC"); shift ;;
        *) args+=("$1"); shift ;;
    esac
done
exec cargo-zigbuild rustc "${args[@]}"
