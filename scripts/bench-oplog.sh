#!/usr/bin/env bash
# Master mutation throughput with the oplog off, on the embedded backend (--data-dir) and on a real etcd, in one
# run: three masters (each with one storage node for placement; the etcd one is an HA candidate, so its replies
# wait until the log holds what they depend on), `crescent bench --phases master-put` against each
# in turn, single-key and batch 128, then the ratios to "off". Release build. Needs etcd (apt install etcd-server).
#   scripts/bench-oplog.sh [SECONDS_PER_PHASE] [CONCURRENCY]
set -euo pipefail
secs=${1:-10}
conc=${2:-8}
cd "$(dirname "$0")/.."
cargo build --release -q -p crescent-cli
bin=target/release/crescent
etcd_bin=${CRESCENT_ETCD_BIN:-/usr/bin/etcd}
[ -x "$etcd_bin" ] || { echo "etcd not found at $etcd_bin (apt install etcd-server)" >&2; exit 1; }
work=$(mktemp -d /tmp/crescent-bench-oplog.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    # Servers started by `start` (in a command substitution's subshell) leave their pid in a file.
    for f in "$work"/*.pid; do [ -e "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Starts `crescent ARGS…` in the background and prints the readiness JSON line's FIELD.
start() {
    local field=$1 name=$2
    shift 2
    "$bin" "$@" >"$work/$name.out" 2>"$work/$name.err" &
    echo $! >"$work/$name.pid"
    for _ in $(seq 1 600); do
        if [ -s "$work/$name.out" ]; then
            python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())[sys.argv[2]])" "$work/$name.out" "$field"
            return
        fi
        sleep 0.1
    done
    echo "$name did not start: $(tail -5 "$work/$name.err")" >&2
    exit 1
}

cport=$(free_port)
pport=$(free_port)
"$etcd_bin" --name bench --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$cport" \
    --advertise-client-urls "http://127.0.0.1:$cport" --listen-peer-urls "http://127.0.0.1:$pport" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pport" --initial-cluster "bench=http://127.0.0.1:$pport" \
    >"$work/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$cport/health" >/dev/null && break; sleep 0.1; done

declare -A master
master[off]=$(start master m-off master --listen 127.0.0.1:0 --admin 127.0.0.1:0)
master[embedded]=$(start master m-embedded master --listen 127.0.0.1:0 --admin 127.0.0.1:0 --data-dir "$work/data")
master[etcd]=$(start master m-etcd master --listen 127.0.0.1:0 --admin 127.0.0.1:0 --etcd "127.0.0.1:$cport" --cluster-id bench)
for m in off embedded etcd; do
    start node "n-$m" node --master "${master[$m]}" --listen 127.0.0.1:0 --segment-size 4GiB --prefault false >/dev/null
done

echo "master-put, ${secs}s per phase, concurrency $conc, $(nproc) CPUs, $(git rev-parse --short HEAD)"
# The master's CPU time per key (utime + stime from /proc, in clock ticks): what the oplog costs the master,
# unlike keys/s robust to other load on the machine.
ticks() { awk '{print $14 + $15}' "/proc/$(cat "$work/m-$1.pid")/stat"; }
hz=$(getconf CLK_TCK)
printf '%-10s %-7s %14s %10s %10s %10s %14s\n' oplog batch "keys/s" p50 p99 "vs off" "master µs/key"
declare -A base
for batch in 1 128; do
    for m in off embedded etcd; do
        json="$work/$m-$batch.json"
        t0=$(ticks "$m")
        "$bin" bench --master "${master[$m]}" --phases master-put --batch "$batch" --concurrency "$conc" \
            --duration "$secs" --value-size 4KiB --json "$json" >/dev/null
        t1=$(ticks "$m")
        read -r rate p50 p99 errors < <(python3 -c '
import json, sys
p = json.loads(open(sys.argv[1]).readline())
print("%.0f %sus %sus %s" % (p["keys_per_s"], p["p50_us"], p["p99_us"], p["errors"]))' "$json")
        [ "$errors" = 0 ] || echo "warning: $errors errors against the $m master" >&2
        [ "$m" = off ] && base[$batch]=$rate
        ratio=$(python3 -c "print(f'{$rate / ${base[$batch]}:.2f}')")
        cpu=$(python3 -c "print(f'{($t1 - $t0) * 1e6 / $hz / ($rate * $secs):.2f}')")
        printf '%-10s %-7s %14s %10s %10s %10s %14s\n' "$m" "$batch" "$rate" "$p50" "$p99" "$ratio" "$cpu"
    done
done
