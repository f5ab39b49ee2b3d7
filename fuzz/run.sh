#!/bin/bash
# Bounded fuzzing of every target (cargo-fuzz / libFuzzer with AddressSanitizer).
# Only a stable toolchain exists here: cargo-fuzz's nightly flags (-Zsanitizer)
# are accepted by stable rustc with RUSTC_BOOTSTRAP=1, which this script sets
# for the fuzz build only. Crashes land in fuzz/artifacts/<target>/; turn each
# into a regression test before fixing it. Each target starts from its seed
# corpus (seeds/<target>/, committed: a long campaign's corpus, minimised
# with `cargo fuzz cmin`).
#   fuzz/run.sh [SECONDS_PER_TARGET]   (default: $ROCEV2_FUZZ_SECONDS or 60)
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-${ROCEV2_FUZZ_SECONDS:-60}}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked -j"${CARGO_BUILD_JOBS:-2}"
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O
mkdir -p corpus
for t in wire_parse responder c_api ipv4_udp landing; do
    mkdir -p "corpus/$t" "seeds/$t"
    # New inputs go to corpus/ (ignored by git); seeds/ is the committed,
    # minimised corpus of the last long campaign, read at the start.
    out=$(cargo fuzz run -O "$t" "corpus/$t" "seeds/$t" -- -max_total_time="$secs" -print_final_stats=1 2>&1) || {
        echo "$out" | tail -40
        echo "fuzz target $t FAILED (artifact in fuzz/artifacts/$t)" >&2
        exit 1
    }
    runs=$(echo "$out" | sed -n 's/^stat::number_of_executed_units: *//p')
    echo "fuzz $t: $runs executions in $secs s, no crash"
done
