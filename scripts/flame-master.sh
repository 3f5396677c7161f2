#!/usr/bin/env bash
# Where the master's time goes under many clients, as flame graphs: `crescent up` (metadata only: a 16 GiB segment
# never prefaulted), one `crescent bench` process with CONCURRENCY requests in flight, and `perf record --call-graph dwarf` on the
# `up` process for the whole of each phase. Writes docs/img/master-put-b<BATCH>.svg and master-get-b<BATCH>.svg
# (inferno's flame graphs; `cargo install inferno` when missing) and prints each phase's keys/s. Release build;
# needs perf (Debian's linux-perf) and curl.
#   scripts/flame-master.sh [BATCH] [SECONDS] [CONCURRENCY]
set -euo pipefail
batch=${1:-128}
secs=${2:-4}
conc=${3:-256}
cd "$(dirname "$0")/.."
command -v perf >/dev/null || { echo "perf is missing (apt-get install linux-perf)" >&2; exit 1; }
command -v inferno-flamegraph >/dev/null || cargo install -q inferno
cargo build --release -q -p crescent-cli
bin=target/release/crescent
work=$(mktemp -d /tmp/crescent-flame.XXXXXX)
up_pid=""
cleanup() {
    [ -n "$up_pid" ] && kill "$up_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# Requests of `op` the master has answered so far (its /metrics).
served() {
    curl -s "http://$admin/metrics" | awk -v op="$1" '$1 == "crescent_master_requests_total{op=\""op"\"}" {print $2}'
}

for phase in master-put master-get; do
    "$bin" up --listen 127.0.0.1:0 --admin 127.0.0.1:0 --segment-size 16GiB --prefault false >"$work/up.json" 2>"$work/up.err" &
    up_pid=$!
    for _ in $(seq 1 600); do [ -s "$work/up.json" ] && break; sleep 0.1; done
    master=$(python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["master"])' <"$work/up.json")
    admin=$(python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["admin"])' <"$work/up.json")
    op=batch_put_start
    [ "$phase" = master-get ] && op=batch_get_replica_list
    [ "$batch" = 1 ] && op=${op#batch_}
    # `--keep`: the bench's clean-up (a removal of every key) is not the phase. A master-get run first writes its
    # key set (untimed); the recording starts once the phase's own requests flow, and ends before the phase does.
    "$bin" bench --master "$master" --phases "$phase" --batch "$batch" --concurrency "$conc" --duration "$((secs + 2))s" \
        --value-size 4KiB --keep --json "$work/$phase.json" >/dev/null 2>"$work/bench.err" &
    bench_pid=$!
    until [ "$(served "$op")" -gt 0 ] 2>/dev/null; do sleep 0.05; done
    # DWARF unwinding: the release build keeps no frame pointers.
    perf record -F 199 --call-graph dwarf,16384 -p "$up_pid" -o "$work/$phase.data" -- sleep "$secs" 2>/dev/null
    wait "$bench_pid"
    python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); print(sys.argv[2], "keys/s", round(r["keys_per_s"]))' \
        "$work/$phase.json" "$phase"
    perf script -i "$work/$phase.data" 2>/dev/null | inferno-collapse-perf | inferno-flamegraph \
        --title "crescent master: $phase, batch $batch, $conc requests in flight" >"docs/img/$phase-b$batch.svg"
    echo "docs/img/$phase-b$batch.svg"
    kill "$up_pid" 2>/dev/null || true
    wait "$up_pid" 2>/dev/null || true
    up_pid=""
done
