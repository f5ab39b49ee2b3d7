#!/bin/bash
# Inside the rxe VM: every real-RDMA test, in one boot.
set -uo pipefail
fail=0
echo "== Rust (tests/rxe.rs)"
"$ROCEV2_RXE_TEST_BIN" --ignored --test-threads=1 --nocapture 2>&1 || fail=1
echo "== valgrind (memcheck, definite leaks = errors): device tests and stop/teardown on a live QP"
# valgrind.supp: one glibc leak under libibverbs' own dlopen of its providers.
valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite \
    --show-leak-kinds=definite --suppressions="$(dirname "$0")/valgrind.supp" \
    "$ROCEV2_RXE_TEST_BIN" --ignored --test-threads=1 \
    rogue_equivalent_device_tests stop_and_teardown 2>&1 || { echo "valgrind reported errors"; fail=1; }
if [ -x "$ROCEV2_BUILD_DIR/tests/c/test_rxe_c" ]; then
    echo "== C (tests/c/test_rxe.c)"
    "$ROCEV2_BUILD_DIR/tests/c/test_rxe_c" "$ROCEV2_BUILD_DIR/install/bin/rocev2" || fail=1
else
    echo "== C: $ROCEV2_BUILD_DIR/tests/c/test_rxe_c not built (./run test builds it)"; fail=1
fi
echo "== Python (tests/python/test_rxe.py)"
ROCEV2_LIBRARY="$ROCEV2_BUILD_DIR/install/lib/librocev2.so.2" ROCEV2_CLI="$ROCEV2_BUILD_DIR/install/bin/rocev2" \
    python3 -m pytest -q -s -p no:cacheprovider tests/python/test_rxe.py || fail=1
exit $fail
