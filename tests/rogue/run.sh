#!/usr/bin/env bash
# The rogue stage (`./run rogue [ROGUE_DIR]`, docs/rogue.md): builds SLAC's
# rogue from ROGUE_DIR with rocev2's adapter (examples/rogue) in place of its
# RoCEv2 Server.cpp, and tests it:
#   1. rogue's own RoCEv2 tests, unchanged: ctest rogue-cpp-rocev2, pytest
#      tests/protocols/test_rocev2.py;
#   2. the project's end-to-end tests (tests/rogue/test_*.py): pyrogue's
#      RoCEv2Server and the health Device in a pyrogue Root, fed by
#      `rocev2 fpga-sim` over the soft backend;
#   3. a C++ program linking rogue's Server through rogue's installed
#      RogueConfig.cmake (tests/rogue/consumer);
#   4. in the rxe VM (tests/vm/rxe-vm.sh): rogue's RDMA tests and one pyrogue
#      stream on rxe0, the verbs backend.
# Ends with `rogue: N passed, M failed[, K skipped]`; exits 1 when M > 0.
#
#   tests/rogue/run.sh ROGUE_DIR BUILD_DIR   (./run rogue calls it; BUILD_DIR
#   holds install/, the rocev2 CMake package, and rogue/, this stage's files)
# ROGUE_DIR is read only: its tree is copied to BUILD_DIR/rogue/src; the
# commands of docs/rogue.md (its "stage" blocks, run as written) put the
# one-file CMake switch into the copy, build rocev2's package into
# BUILD_DIR/install and rogue in BUILD_DIR/rogue/build (reused by the next
# run: only what changed is rebuilt), install rogue in BUILD_DIR/rogue/install
# and run the page's Root with the health device. Knobs: ROGUE_PYTHON
# (/usr/bin/python3, Debian's: its packages come from apt), ROGUE_VM=0 skips
# part 4 (counted as skipped).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
SRC=$(cd "$1" && pwd)
BUILD=$2
PY=${ROGUE_PYTHON:-/usr/bin/python3}
R=$BUILD/rogue
PREFIX=$BUILD/install
JOBS=${CARGO_BUILD_JOBS:-2}
mkdir -p "$R/results"
rm -f "$R"/results/*.xml "$R"/results/*.txt

log() { printf '\n==> rogue: %s\n' "$*" >&2; }
die() { echo "rogue: $*" >&2; echo "rogue: 0 passed, 1 failed"; exit 1; }
t_start=$(date +%s)

# ---------------------------------------------------------------- deps --
# Debian's packages for Debian's python3: numpy's headers and its runtime
# are then the same numpy (1.24), as rogue's build needs (a pip numpy 2.x
# beside Debian's 1.x headers is what broke `import rogue` in a venv).
APT="git cmake g++ make libboost-python-dev libboost-dev libzmq3-dev libbz2-dev python3-dev python3-numpy python3-pip python3-zmq
python3-yaml python3-parse python3-click python3-serial python3-jsonpickle python3-pytest"
missing=()
for p in $APT; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing rogue's build and test dependencies: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    inst=(apt-get install -y -q --no-install-recommends --no-remove)
    "${inst[@]}" "${missing[@]}" >&2 || { apt-get update -q >&2 && "${inst[@]}" "${missing[@]}" >&2; } \
        || die "apt-get install ${missing[*]} failed"
fi
# What the interpreter lacks (another ROGUE_PYTHON than Debian's), from PyPI:
# numpy pinned below 2 as Debian's; SQLAlchemy 2 for pyrogue.interfaces
# (Debian 12 has 1.4; docs/rogue.md installs it too, as written).
pips=()
for m in "numpy:numpy<2" "zmq:pyzmq" "yaml:pyyaml" "parse:parse" "click:click" "sqlalchemy; sqlalchemy.Connection:sqlalchemy>=2" \
         "serial:pyserial" "jsonpickle:jsonpickle" "pytest:pytest"; do
    "$PY" -c "import ${m%%:*}" 2>/dev/null || pips+=("${m#*:}")
done
if [ ${#pips[@]} -gt 0 ]; then
    log "installing from PyPI for $PY: ${pips[*]}"
    "$PY" -m pip install -q "${pips[@]}" 2>/dev/null \
        || "$PY" -m pip install -q --break-system-packages "${pips[@]}" || die "pip install ${pips[*]} failed"
fi

# ------------------------------------------------------ rogue's source --
# A copy of ROGUE_DIR (kept while ROGUE_DIR is unchanged, so the build dir is
# reused); docs/rogue.md's step 4 puts the one-file switch into it.
if [ ! -f "$R/src/.copied-from" ] || [ "$(cat "$R/src/.copied-from")" != "$SRC" ] \
    || [ -n "$(find "$SRC" -newer "$R/src/.copied-from" -print -quit)" ]; then
    log "copying $SRC to $R/src (rogue's tree stays as it is)"
    rm -rf "$R/src" "$R/build" "$R/install"
    cp -a "$SRC" "$R/src" || die "cannot copy $SRC"
    chmod -R u+w "$R/src"  # a read-only ROGUE_DIR (CI's shared/) gives a read-only copy
    echo "$SRC" > "$R/src/.copied-from"
fi
# --------------------------------------------- docs/rogue.md, as written --
# Its stage blocks (dependencies, rocev2's package, the one-file switch,
# rogue's configure, build and install, the Root with the health device),
# with its step-0 variables set to this stage's paths.
"$PY" tests/rogue/doc_blocks.py docs/rogue.md > "$R/doc-steps.sh" || die "docs/rogue.md: no stage blocks"
mkdir -p "$R/doc"
log "docs/rogue.md's commands as written (rogue's build: about 8.5 min the first time at -j2)"
t0=$(date +%s)
(cd "$R/doc" && ROCEV2_SRC="$ROOT" ROCEV2_BUILD="$BUILD" ROGUE_SRC="$R/src" PREFIX="$PREFIX" \
    ROGUE_BUILD="$R/build" ROGUE_PREFIX="$R/install" PY="$PY" bash -euo pipefail "$R/doc-steps.sh") \
    > "$R/doc.log" 2>&1
rc=$?
echo "docs/rogue.md's commands: exit $rc, $(( $(date +%s) - t0 )) s (log: $R/doc.log)" >&2
grep -E "^-- Found (python|numpy|boost)" "$R/doc.log" >&2
sed -n '/^emulator:/,$p' "$R/doc.log" >&2
if [ $rc != 0 ]; then
    tail -40 "$R/doc.log" >&2
    "$PY" tests/rogue/junit.py --fail "docs/rogue.md: the stage blocks as written" "exit $rc" > "$R/results/doc.xml"
    [ -f "$R/install/lib/RogueConfig.cmake" ] || die "docs/rogue.md's commands failed before rogue was installed"
else
    "$PY" tests/rogue/junit.py --pass "docs/rogue.md: the stage blocks as written" > "$R/results/doc.xml"
fi

export LD_LIBRARY_PATH="$PREFIX/lib:$R/install/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$R/install/python"
export ROCEV2_CLI="$PREFIX/bin/rocev2"
export ROCEV2_LIBRARY="$PREFIX/lib/librocev2.so.2"            # the one rogue links (for tests' pattern check)
export ROCEV2_ROGUE_PYTHON="$PREFIX/share/rocev2/rogue/python"  # rocev2_pyrogue.py
export ROGUE_HEALTH_VARS_OUT="$R/results/health-vars.txt"
"$PY" -c "import rogue, pyrogue, rogue.protocols.rocev2" >&2 || die "import rogue fails with $PY"

# --------------------------------------------------------------- tests --
log "rogue's RoCEv2 doctest, as rogue ships it (ctest -R rocev2)"
ctest --test-dir "$R/build" -R rocev2 --output-on-failure --output-junit "$R/results/ctest.xml" >&2

log "rogue's tests/protocols/test_rocev2.py, as rogue ships it (pytest)"
(cd "$R/src" && "$PY" -m pytest -q -rs -p no:cacheprovider tests/protocols/test_rocev2.py \
    --junitxml="$R/results/rogue-pytest.xml") >&2

log "the project's rogue end-to-end and health tests (tests/rogue)"
"$PY" -m pytest -q -rs -p no:cacheprovider tests/rogue --junitxml="$R/results/e2e.xml" >&2

log "a C++ program linking rogue::protocols::rocev2::Server through rogue's installed RogueConfig.cmake"
tests/rogue/consumer/run.sh "$R" "$PREFIX" "$PY" > "$R/results/consumer.xml"

if [ "${ROGUE_VM:-1}" != 0 ]; then
    log "production path in the rxe VM: rogue's RDMA tests and a pyrogue stream on rxe0 (verbs backend)"
    t0=$(date +%s)
    ROGUE_SRC_COPY="$R/src" ROGUE_BUILD_DIR="$R/build" ROGUE_PYTHON="$PY" \
        tests/vm/rxe-vm.sh bash tests/rogue/vm-guest.sh > "$R/vm-stdout.txt"
    rc=$?
    echo "rxe VM: exit $rc, $(( $(date +%s) - t0 )) s" >&2
    # The guest's JUnit files, each between "=== junit NAME ===" and "=== end ===".
    awk -v dir="$R/results" '/^=== junit .* ===$/ {f = dir "/" $3; next} /^=== end ===$/ {f = ""; next}
        f != "" {print > f}' "$R/vm-stdout.txt"
    grep -v '^===' "$R/vm-stdout.txt" | grep -v '^<' >&2 || true
    if [ $rc != 0 ] && ! ls "$R"/results/vm-*.xml >/dev/null 2>&1; then
        "$PY" tests/rogue/junit.py --fail "rxe VM: exit $rc (126: the VM cannot run here)" > "$R/results/vm-boot.xml"
    fi
else
    "$PY" tests/rogue/junit.py --skip "rxe VM: not run (ROGUE_VM=0)" > "$R/results/novm.xml"
fi

echo "rogue stage: $(( $(date +%s) - t_start )) s" >&2
[ -s "$R/results/health-vars.txt" ] \
    && echo "rogue health variables: $(awk '!seen[$0]++' "$R/results/health-vars.txt" | tr '\n' ' ' | sed 's/ $//')"
# Each step's file must be there: a step that wrote none counts as failed.
exec "$PY" tests/rogue/junit.py --tally "$R"/results/{ctest,rogue-pytest,e2e,consumer}.xml \
    "$R"/results/doc.xml $(ls "$R"/results/vm-*.xml "$R"/results/novm.xml 2>/dev/null)
