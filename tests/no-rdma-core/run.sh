#!/bin/bash
# The "no rdma-core" test (issue #26): on a host where libibverbs cannot be
# loaded (enter.sh's mount namespace), everything but the verbs backend works
# and the verbs backend says what to install. Needs root.
#
#   tests/no-rdma-core/run.sh BUILD_DIR
#
# BUILD_DIR is ./run test's: install/ (the CMake package: library + CLI),
# tests/c/ (the C consumers, optional), venv/ (the Python package, optional:
# without it the source package runs against install/'s library). In the
# namespace:
#   1. readelf: the library and the CLI have no DT_NEEDED on libibverbs/librdmacm
#   2. `rocev2 info` succeeds and says libibverbs is not installed
#   3. `rocev2 demo` passes (emulator -> soft backend, every byte verified)
#   4. the C soft end-to-end test passes (when built)
#   5. the Python package streams over soft (examples/python/stream.py), and
#      opening a verbs device from Python raises UNSUPPORTED saying what to install
#   6. `rocev2 recv --device rxe0` fails with the message saying what to install
#   7. the manylinux wheel (BUILD_DIR/wheelhouse, from tests/python/wheel.sh,
#      when there): installed into a fresh venv, it imports its own library
#      and streams over soft (wheel.sh --check-only)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)

if [ "${1:-}" != --inside ]; then
    [ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
    BUILD=$(cd "$1" && pwd)
    exec tests/no-rdma-core/enter.sh "$ROOT/tests/no-rdma-core/run.sh" --inside "$BUILD"
fi
BUILD=$2
CLI=$BUILD/install/bin/rocev2
LIB=$BUILD/install/lib/librocev2.so.2
for f in "$CLI" "$LIB"; do
    [ -e "$f" ] || { echo "$f not found: build and install the CMake package into $BUILD/install first (./run test does)" >&2; exit 1; }
done
fail=0
step() { printf '\n-- no-rdma-core: %s\n' "$*" >&2; }
bad() { echo "FAILED: $*" >&2; fail=1; }

step "readelf -d: no DT_NEEDED on libibverbs or librdmacm"
for f in "$CLI" "$LIB"; do
    if readelf -d "$f" | grep -E 'NEEDED.*(libibverbs|librdmacm)'; then bad "$f links rdma-core"; fi
done

step "rocev2 info"
if out=$("$CLI" info 2>&1); then
    echo "$out"
    grep -q "apt-get install libibverbs1 ibverbs-providers" <<<"$out" || bad "info does not say libibverbs is missing"
else
    echo "$out"; bad "rocev2 info failed"
fi

step "rocev2 demo (emulator -> soft backend)"
"$CLI" demo --frames 20000 || bad "rocev2 demo"

if [ -x "$BUILD/tests/c/test_soft_e2e_c" ]; then
    step "C: test_soft_e2e_c"
    "$BUILD/tests/c/test_soft_e2e_c" "$CLI" || bad "test_soft_e2e_c"
else
    step "C: $BUILD/tests/c/test_soft_e2e_c not built, skipped"
fi

step "Python: examples/python/stream.py over soft; a verbs device raises UNSUPPORTED"
if [ -x "$BUILD/venv/bin/python" ]; then
    echo "(the package installed in $BUILD/venv)" >&2
    py=("$BUILD/venv/bin/python")
else
    echo "(no $BUILD/venv: the source package against $LIB)" >&2
    py=(env ROCEV2_LIBRARY="$LIB" PYTHONPATH="$ROOT/python" python3)
fi
ROCEV2_CLI=$CLI "${py[@]}" examples/python/stream.py 20000 4096 || bad "Python stream"
"${py[@]}" - <<'EOF' || bad "Python: opening rxe0"
import rocev2
try:
    rocev2.Server(rocev2.ServerCfg(ip="192.0.2.1", deviceName="rxe0", gidIndex=0))
except rocev2.Rocev2Error as e:
    assert e.status_name == "UNSUPPORTED", (e.status_name, str(e))
    assert "apt-get install libibverbs1 ibverbs-providers" in str(e), str(e)
    print(f"rxe0 from Python: {e.status_name}: {e}")
else:
    raise SystemExit("opening rxe0 succeeded without libibverbs")
EOF

step "rocev2 recv --device rxe0: says what to install"
set +e
out=$("$CLI" recv --device rxe0 --fpga-ip 192.0.2.1 --fpga-qpn 0x100 --frames 1 2>&1)
rc=$?
set -e
echo "$out"
[ $rc -ne 0 ] || bad "recv --device rxe0 succeeded"
for want in "libibverbs.so.1" "apt-get install libibverbs1 ibverbs-providers" "conda install -c conda-forge rdma-core"; do
    grep -qF "$want" <<<"$out" || bad "recv's message lacks: $want"
done

wheels=("$BUILD"/wheelhouse/rocev2-*.whl)
if [ -e "${wheels[0]}" ]; then
    step "Python wheel $(basename "${wheels[0]}"): a fresh venv, import, version, stream over soft"
    ROCEV2_CLI=$CLI tests/python/wheel.sh "$BUILD" --check-only || bad "the wheel in a fresh venv"
else
    step "Python wheel: none in $BUILD/wheelhouse (tests/python/wheel.sh $BUILD builds one), skipped"
fi

if [ $fail = 0 ]; then echo "no-rdma-core: all passed" >&2; fi
exit $fail
