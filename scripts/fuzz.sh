#!/usr/bin/env bash
# Runs every cargo-fuzz target under fuzz/ for SECONDS each (default 60), one at a time on one core, and prints
# the executions per target; exits non-zero if any target crashed, hung or ran out of memory (the input is left
# in fuzz/artifacts/TARGET/). Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz --locked`);
# the normal build stays on stable, and CI does not run this. Each target's corpus (fuzz/corpus/TARGET, not
# committed) is seeded by the target itself with valid encodings of this build before it starts.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
# Environment:
#   FUZZ_RUNS=N         also stop a target after N executions (whichever of SECONDS and N comes first).
#   FUZZ_SANITIZER=S    cargo-fuzz sanitizer (default none). The decoders under fuzz are safe Rust (the workspace's
#                       few `unsafe` blocks sit on socket and mmap paths no target reaches), so AddressSanitizer
#                       finds nothing there that a panic would not, while costing 25x in executions per second
#                       (frame: ~650/s with address, ~16 000/s without); debug assertions stay on either way.
set -euo pipefail
secs=${1:-60}
shift || true
cd "$(dirname "$0")/.."
san=${FUZZ_SANITIZER:-none}
runs=()
if [ -n "${FUZZ_RUNS:-}" ]; then runs=(-runs="$FUZZ_RUNS"); fi
cargo +nightly fuzz build -O -s "$san"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
mkdir -p fuzz/logs
failed=0
summary=""
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t"
    log="fuzz/logs/$t.log"
    echo "== $t: ${secs}s ${FUZZ_RUNS:+or $FUZZ_RUNS runs }sanitizer $san (log: $log)"
    # One process, one core: no -jobs/-fork, so libFuzzer fuzzes in-process.
    if CRESCENT_FUZZ_SEEDS="fuzz/corpus/$t" cargo +nightly fuzz run -O -s "$san" "$t" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" "${runs[@]}" -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
        status=ok
    else
        status=FAILED
        failed=1
        grep -E "^(==[0-9]+==ERROR|SUMMARY|thread .* panicked|Test unit written to)" "$log" | head -5 || true
    fi
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo "?")
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo "?")
    corpus=$(find "fuzz/corpus/$t" -type f | wc -l)
    summary+=$(printf '%-16s %-7s %12s execs %8s exec/s %6s corpus\n' "$t" "$status" "$execs" "$rate" "$corpus")$'\n'
done
echo
printf '%s' "$summary"
exit $failed
