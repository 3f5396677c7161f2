#!/usr/bin/env bash
# Prefix lookups as engines make them, in one run: `crescent bench --phases prefix-exist` (batch-exists, counted
# as SGLang's batch_exists counts it, then the read of the run found and the write of the rest) against
# `--phases prefix` (the leased prefix lookup, then the same read and write), each on a fresh `crescent up` per
# round (so neither inherits the other's leases), ROUNDS rounds in alternating order. A prompt is BATCH blocks
# of VALUE_SIZE, the first half shared by the four prompts of its family; PROMPTS prompts drawn Zipf(ZIPF); the
# segment (SEGMENT) holds fewer blocks than the prompts have, so eviction runs all along. The table gives each
# phase's median requests/s and blocks/s, master requests per request, blocks the lookup found and the read
# missed, and other errors. Release build.
#   scripts/bench-prefix.sh [SECONDS] [ROUNDS] [CONCURRENCY] [BATCH] [VALUE_SIZE] [PROMPTS] [ZIPF] [SEGMENT]
set -euo pipefail
secs=${1:-10}
rounds=${2:-3}
conc=${3:-4}
batch=${4:-16}
size=${5:-64KiB}
prompts=${6:-2000}
zipf=${7:-0.9}
segment=${8:-256MiB}
cd "$(dirname "$0")/.."
cargo build --release -q -p crescent-cli
bin=target/release/crescent
work=$(mktemp -d /tmp/crescent-bench-prefix.XXXXXX)
cleanup() {
    [ -e "$work/up.pid" ] && kill "$(cat "$work/up.pid")" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

phases=(prefix-exist prefix)
echo "crescent bench prefix phases, ${secs}s, concurrency $conc, $batch blocks of $size per prompt, $prompts" \
    "prompts Zipf($zipf), segment $segment, median of $rounds rounds, $(nproc) CPUs, $(git rev-parse --short HEAD)"
for r in $(seq 1 "$rounds"); do
    for i in 0 1; do
        p=${phases[$(((i + r) % 2))]}
        "$bin" up --listen 127.0.0.1:0 --admin 127.0.0.1:0 --segment-size "$segment" >"$work/up.out" 2>/dev/null &
        echo $! >"$work/up.pid"
        for _ in $(seq 1 600); do
            [ -s "$work/up.out" ] && break
            sleep 0.1
        done
        master=$(python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["master"])' <"$work/up.out")
        "$bin" bench --master "$master" --phases "$p" --keys "$prompts" --zipf "$zipf" --value-size "$size" \
            --batch "$batch" --concurrency "$conc" --duration "$secs" --json "$work/$p-$r.json" >/dev/null 2>&1
        kill "$(cat "$work/up.pid")"
        wait "$(cat "$work/up.pid")" 2>/dev/null || true
        rm -f "$work/up.pid" "$work/up.out"
    done
done
python3 - "$work" "$rounds" <<'EOF'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
print(f"{'phase':>13} {'req/s':>8} {'blocks/s':>9} {'master req/req':>15} {'misses':>7} {'other errors':>13}")
for phase in ["prefix-exist", "prefix"]:
    runs = [json.loads(open(f"{work}/{phase}-{r}.json").readline()) for r in range(1, rounds + 1)]
    med = lambda k: statistics.median(p[k] for p in runs)
    misses = [p["errors_by_code"].get("MISS_AFTER_LOOKUP", 0) for p in runs]
    other = [p["errors"] - m for p, m in zip(runs, misses)]
    print(f"{phase:>13} {med('req_per_s'):>8.0f} {med('keys_per_s'):>9.0f} {med('master_requests_per_request'):>15.2f} "
          f"{sum(misses):>7} {sum(other):>13}")
    codes = {}
    for p in runs:
        for c, n in p["errors_by_code"].items():
            codes[c] = codes.get(c, 0) + n
    if codes:
        print(f"{'':>13} errors over the rounds: {codes}")
EOF
