#!/usr/bin/env bash
# Runs the `crescent bench` matrix of the network issue on loopback (release build) against two topologies and
# prints a markdown table for each:
#   up        `crescent up` (master + storage node in one process) and the bench client: two processes, the
#             topology the original system's figures were taken in (../shared/ARCHITECTURE.md §6);
#   separate  `crescent master` and `crescent node` as separate processes, and the bench client;
#   master    the master alone, as the original's master_bench measures it: PutStart + PutEnd without bytes
#             (`master-put`) and GetReplicaList over 10 000 keys per client (`master-get`), 1 and 4 clients,
#             single keys and batches of 128. Its node hosts 1 TiB of unprefaulted segments so nothing is evicted.
# TOPOLOGIES="up" (or any subset) runs those. Results: target/bench-cluster-<topology><TAG>.jsonl
# CRESCENT_BIN=path measures that binary instead of building this tree (e.g. to compare two builds in one
# sitting, alternating them); TAG names its result files.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${CRESCENT_BIN:-}" ] || cargo build --release -q -p crescent-cli
# Raw loopback TCP, measured right before each topology starts (this VM's speed drifts by tens of per cent
# over minutes, so the store's fraction of the link is taken against the link of the same few minutes).
cargo bench -q -p crescent-transfer --bench loopback --no-run 2>/dev/null
raw() { # topology
    cargo bench -q -p crescent-transfer --bench loopback -- --secs 1 --sizes-kib "" 2>/dev/null | grep '^raw' \
        | tee "target/bench-raw-$1.txt"
}
B=${CRESCENT_BIN:-target/release/crescent}
PIDS=()
trap 'kill ${PIDS[@]+"${PIDS[@]}"} 2>/dev/null || true' EXIT
ready() { # file: waits for a server's JSON line
    for _ in $(seq 1 600); do [ -s "$1" ] && return 0; sleep 0.1; done
    echo "no readiness line in $1" >&2
    return 1
}
start() { # topology -> sets M
    rm -f target/bench-master.json target/bench-node.json
    if [ "$1" = master ]; then
        $B master --listen 127.0.0.1:0 --admin 127.0.0.1:0 > target/bench-master.json 2> target/bench-master.log &
        PIDS=($!)
        ready target/bench-master.json
        M=$(python3 -c "import json;print(json.load(open('target/bench-master.json'))['master'])")
        $B node --master "$M" --segment-size 16GiB --segments 64 --prefault false --listen 127.0.0.1:0 \
            > target/bench-node.json 2> target/bench-node.log &
        PIDS+=($!)
        ready target/bench-node.json
    elif [ "$1" = up ]; then
        $B up --listen 127.0.0.1:0 --admin 127.0.0.1:0 --segment-size "${SEGMENT:-12GiB}" \
            > target/bench-master.json 2> target/bench-master.log &
        PIDS=($!)
        ready target/bench-master.json
        M=$(python3 -c "import json;print(json.load(open('target/bench-master.json'))['master'])")
    else
        $B master --listen 127.0.0.1:0 --admin 127.0.0.1:0 > target/bench-master.json 2> target/bench-master.log &
        PIDS=($!)
        ready target/bench-master.json
        M=$(python3 -c "import json;print(json.load(open('target/bench-master.json'))['master'])")
        $B node --master "$M" --segment-size "${SEGMENT:-12GiB}" --listen 127.0.0.1:0 \
            > target/bench-node.json 2> target/bench-node.log &
        PIDS+=($!)
        ready target/bench-node.json
    fi
}
stop() {
    kill "${PIDS[@]}" 2>/dev/null || true
    wait "${PIDS[@]}" 2>/dev/null || true
    PIDS=()
}
run() { # out size batch conc count
    $B --master "$M" bench --phases write,read --value-size "$2" --batch "$3" --concurrency "$4" --count "$5" \
        --json target/bench-one.jsonl > /dev/null
    cat target/bench-one.jsonl >> "$1"
    $B --master "$M" rm --all --force > /dev/null
}
for topology in ${TOPOLOGIES:-up separate master}; do
    OUT=target/bench-cluster-$topology${TAG:-}.jsonl
    : > "$OUT"
    if [ "$topology" = master ]; then
        # A fresh master per case, as master_bench runs: keys a case made do not slow the next one's lookups.
        for c in 1 4; do
            for b in 1 128; do
                for phase in master-put master-get; do
                    start master
                    $B --master "$M" bench --phases $phase --value-size 4KiB --batch $b --concurrency $c \
                        --duration 3 --json target/bench-one.jsonl > /dev/null
                    cat target/bench-one.jsonl >> "$OUT"
                    stop
                done
            done
        done
    else
        raw "$topology"
        start "$topology"
        # Warm-up, not reported: one pass over the segment. On VMs the first write to freshly mapped guest memory
        # is several times slower than later ones (host-side faults), which would bill the first case for it.
        $B --master "$M" bench --phases write --value-size 4MiB --concurrency 8 --count "${WARMUP_COUNT:-1800}" > /dev/null 2>&1
        $B --master "$M" rm --all --force > /dev/null
        for c in 1 8; do
            run "$OUT" 4KiB 1 $c 20000;  run "$OUT" 4KiB 32 $c 2000
            run "$OUT" 1MiB 1 $c 1500;   run "$OUT" 1MiB 32 $c 80
            run "$OUT" 4MiB 1 $c 400;    run "$OUT" 4MiB 32 $c 24
        done
        stop
    fi
    echo
    echo "### topology: $topology"
    touch "target/bench-raw-$topology.txt"
    python3 - "$OUT" "target/bench-raw-$topology.txt" <<'PY'
import json, re, sys
print("| phase | value | batch | conc | req/s | keys/s | MiB/s | p50 µs | p99 µs | errors |")
print("|---|---|---|---|---|---|---|---|---|---|")
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"| {r['phase']} | {r['value_size']} | {r['batch']} | {r['concurrency']} | {r['req_per_s']:.0f} | "
          f"{r['keys_per_s']:.0f} | {r['mib_per_s']:.1f} | {r['p50_us']} | {r['p99_us']} | {r['errors']} |")
raw = [float(m.group(1)) for line in open(sys.argv[2])
       if "streams=1" in line for m in [re.search(r"([0-9.]+) MiB/s", line)] if m]
# The best single-stream figure measured just before (default or tuned sockets): never flattering.
raw = [max(raw)] if raw else []
if raw:
    for line in open(sys.argv[1]):
        r = json.loads(line)
        if r["value_size"] == 4 << 20 and r["batch"] == 1 and r["concurrency"] == 1:
            print(f"4 MiB {r['phase']} c=1: {r['mib_per_s']:.0f} MiB/s = {100 * r['mib_per_s'] / raw[0]:.0f} % of raw "
                  f"single-stream loopback TCP (best, measured just before: {raw[0]:.0f} MiB/s)")
PY
done
