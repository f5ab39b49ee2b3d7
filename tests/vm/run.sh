#!/bin/bash
# Runs the real-RDMA tests in one boot of the rxe VM (tests/vm/rxe-vm.sh):
# the Rust tests of tests/rxe.rs (--ignored), the C verbs test and the Python
# verbs test. Exit 0 only when all ran and passed; when the VM cannot start,
# exit 1 with the reason unless ROCEV2_VM_OPTIONAL=1 (then 0, "SKIPPED").
#   tests/vm/run.sh [BUILD_DIR]   (BUILD_DIR holds the ctest build and install/)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-$PWD/build}
bin=$(cargo test -q --test rxe --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "rxe" and m.get("executable"):
        print(m["executable"])')
[ -x "$bin" ] || { echo "rxe test binary not built" >&2; exit 1; }
export ROCEV2_RXE_TEST_BIN=$bin
export ROCEV2_BUILD_DIR=$BUILD
t0=$(date +%s)
set +e
tests/vm/rxe-vm.sh bash tests/vm/guest-tests.sh
rc=$?
set -e
echo "rxe VM tests: exit $rc, wall time $(( $(date +%s) - t0 )) s"
if [ $rc = 126 ]; then
    if [ "${ROCEV2_VM_OPTIONAL:-0}" = 1 ]; then echo "SKIPPED: the rxe VM cannot run here"; exit 0; fi
    echo "the rxe VM tests could not run (see above); set ROCEV2_VM_OPTIONAL=1 to skip them" >&2
    exit 1
fi
exit $rc
