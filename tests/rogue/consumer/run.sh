#!/usr/bin/env bash
# tests/rogue/consumer/run.sh ROGUE_STAGE_DIR ROCEV2_PREFIX PYTHON: builds
# stream_graph.cpp through rogue's installed RogueConfig.cmake (CMakeLists.txt
# here) and runs it against the rocev2 CLI; prints one JUnit test suite (one
# case per step) on stdout, the build and run output on stderr.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
R=$1 PREFIX=$2 PY=$3
junit() { "$PY" "$here/../junit.py" "$@"; }
b=$R/consumer
if ! { cmake -S "$here" -B "$b" -DRogue_DIR="$R/install/lib" -DPython3_EXECUTABLE="$PY" >&2 \
        && cmake --build "$b" >&2; }; then
    junit --fail "consumer: build stream_graph.cpp with find_package(Rogue)"
    exit 0
fi
if out=$("$b/stream_graph" "$PREFIX/bin/rocev2" 2>&1); then
    echo "$out" >&2
    junit --pass "consumer: stream_graph (find_package(Rogue))"
else
    echo "$out" >&2
    junit --fail "consumer: stream_graph (find_package(Rogue))" "$(echo "$out" | tail -3)"
fi
