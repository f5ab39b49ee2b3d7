#!/bin/bash
# Inside the rxe VM (tests/rogue/run.sh starts it with tests/vm/rxe-vm.sh):
# the production path of rogue with rocev2's adapter, on rxe0 (verbs):
#   - rogue's doctest rogue-cpp-rocev2 (its 3 cases that need rxe0 run here),
#   - rogue's test_rocev2.py, the rocev2-marked tests (2 need rxe0),
#   - one pyrogue RoCEv2Server stream on rxe0 (tests/rogue/vm_verbs.py).
# Each step's JUnit XML goes to stdout between "=== junit NAME ===" and
# "=== end ===" lines (the guest's files do not outlive it); logs to stderr.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PY=${ROGUE_PYTHON:-/usr/bin/python3}
out=$(mktemp -d)
emit() {
    echo "=== junit $1 ==="
    if [ -s "$out/$1" ]; then cat "$out/$1"; echo; else "$PY" "$here/junit.py" --fail "$1: $2"; fi
    echo "=== end ==="
}
# rogue's doctest returns early (passing) without rxe0: it must be there.
if [ -e /sys/class/infiniband/rxe0 ]; then
    "$PY" "$here/junit.py" --pass "rxe VM: rxe0 present (rogue's hardware cases run)" > "$out/vm-rxe0.xml"
else
    "$PY" "$here/junit.py" --fail "rxe VM: rxe0 present (rogue's hardware cases run)" > "$out/vm-rxe0.xml"
fi
emit vm-rxe0.xml "no rxe0 check"
echo "== rogue's doctest rogue-cpp-rocev2 on rxe0" >&2
(cd "$ROGUE_BUILD_DIR" && tests/cpp/rogue-cpp-rocev2 --reporters=junit --out="$out/vm-doctest.xml" >&2)
emit vm-doctest.xml "rogue-cpp-rocev2 wrote no results"
echo "== rogue's tests/protocols/test_rocev2.py -m rocev2 on rxe0" >&2
(cd "$ROGUE_SRC_COPY" && "$PY" -m pytest -q -rs -p no:cacheprovider -m rocev2 tests/protocols/test_rocev2.py \
    --junitxml="$out/vm-rogue-pytest.xml" >&2)
emit vm-rogue-pytest.xml "rogue's pytest wrote no results"
echo "== pyrogue RoCEv2Server stream on rxe0 (tests/rogue/vm_verbs.py)" >&2
"$PY" -m pytest -q -rs -p no:cacheprovider "$here/vm_verbs.py" --junitxml="$out/vm-verbs.xml" >&2
emit vm-verbs.xml "vm_verbs.py wrote no results"
