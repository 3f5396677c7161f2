#!/usr/bin/env bash
# What the KV event stream costs the master, in one run: two `crescent up` clusters, one publishing events
# (`--kv-events`, with a `crescent events tail --stats` subscriber receiving every message) and one not, and `crescent bench
# --phases master-put` (PutStart + PutEnd, no bytes moved: the master's own work, where an event per write
# weighs most) against each in turn, ROUNDS times on fresh clusters; the table shows each mode's median keys/s, its
# ratio to `off`, and the master's CPU per key, then the publisher thread's own CPU per event. Release build.
#   scripts/bench-events.sh [SECONDS] [ROUNDS] [CONCURRENCY] [BATCH] [VALUE_SIZE]
# Values of VALUE_SIZE (default 1KiB) on a 1 GiB segment: a run fills it and evicts, so removed events flow
# too.
set -euo pipefail
secs=${1:-5}
rounds=${2:-5}
conc=${3:-4}
batch=${4:-64}
size=${5:-1KiB}
cd "$(dirname "$0")/.."
cargo build --release -q -p crescent-cli
bin=target/release/crescent
work=$(mktemp -d /tmp/crescent-bench-events.XXXXXX)
cleanup() {
    for f in "$work"/*.pid; do [ -e "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Starts `crescent ARGS…` in the background as NAME; prints the readiness line's `master` field.
start() {
    local name=$1
    shift
    "$bin" "$@" >"$work/$name.out" 2>"$work/$name.err" &
    echo $! >"$work/$name.pid"
    for _ in $(seq 1 600); do
        if [ -s "$work/$name.out" ]; then
            python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["master"])' <"$work/$name.out"
            return
        fi
        sleep 0.1
    done
    echo "$name did not start: $(tail -5 "$work/$name.err")" >&2
    exit 1
}

stop() {
    for f in "$work"/*.pid; do
        [ -e "$f" ] || continue
        kill "$(cat "$f")" 2>/dev/null || true
        rm -f "$f"
    done
    sleep 0.5
}

ticks() { awk '{print $14 + $15}' "/proc/$(cat "$work/$1.pid")/stat"; }

modes=(off on)
echo "crescent bench master-put, ${secs}s, concurrency $conc, batch $batch, values $size, median of $rounds rounds (alternating" \
    "order), $(nproc) CPUs, $(git rev-parse --short HEAD)"
for r in $(seq 1 "$rounds"); do
    port=$(free_port)
    declare -A master
    master[off]=$(start off up --listen 127.0.0.1:0 --admin 127.0.0.1:0 --segment-size 1GiB)
    master[on]=$(start on up --listen 127.0.0.1:0 --admin 127.0.0.1:0 --segment-size 1GiB \
        --kv-events "tcp://127.0.0.1:$port")
    # The leanest subscriber (counts, decodes nothing): what a consumer on another host costs this one is its
    # share of the socket's sends only.
    # At the lowest CPU priority: a consumer on another host takes none of this one's CPU. With
    # CRESCENT_EVENTS_SUBSCRIBER=0 none connects (the master builds, queues and encodes every event; the socket
    # sends nothing): what the master's side costs alone.
    if [ "${CRESCENT_EVENTS_SUBSCRIBER:-1}" != 0 ]; then
        nice -n 19 "$bin" events tail --stats --endpoint "tcp://127.0.0.1:$port" >"$work/tail-$r.out" 2>/dev/null &
        echo $! >"$work/tail.pid"
    else
        : >"$work/tail-$r.out"
    fi
    for i in 0 1; do
        m=${modes[$(((i + r) % 2))]}
        t0=$(ticks "$m")
        "$bin" bench --master "${master[$m]}" --phases master-put --concurrency "$conc" --batch "$batch" --value-size "$size" \
            --duration "$secs" --json "$work/$m-$r.json" >/dev/null
        echo "$(($(ticks "$m") - t0))" >"$work/$m-$r.ticks"
    done
    admin=$(python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["admin"])' <"$work/on.out")
    status=$(curl -s "http://$admin/kv_events/status")
    # The publisher thread's own CPU (steadier than the throughput ratio on a shared machine): its ticks over the
    # events it published, all in this round's `on` run (the cluster is fresh).
    pid=$(cat "$work/on.pid")
    for t in /proc/"$pid"/task/*; do
        [ "$(cat "$t/comm")" = kv-events ] && awk '{print $14 + $15}' "$t/stat" >"$work/publisher-$r.ticks"
    done
    echo "$status" >"$work/status-$r.json"
    stop
    echo "$(tail -1 "$work/tail-$r.out"); master: $status" >"$work/events-$r"
done
CRESCENT_CLK_TCK=$(getconf CLK_TCK) CRESCENT_SECS=$secs python3 - "$work" "$rounds" <<'EOF'
import json, os, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
hz, secs = float(os.environ["CRESCENT_CLK_TCK"]), float(os.environ["CRESCENT_SECS"])
rate, cpu, ratios = {}, {}, []
for m in ["off", "on"]:
    rate[m], cpu[m] = [], []
    for r in range(1, rounds + 1):
        p = [json.loads(line) for line in open(f"{work}/{m}-{r}.json")][0]
        rate[m].append(p["keys_per_s"])
        cpu[m].append(int(open(f"{work}/{m}-{r}.ticks").read()) / hz * 1e6 / max(1.0, p["keys_per_s"] * secs))
for r in range(rounds):
    ratios.append(rate["on"][r] / rate["off"][r])
events = [open(f"{work}/events-{r}").read().strip() for r in range(1, rounds + 1)]
print(f"{'mode':>4} {'keys/s':>10} {'/off':>6} {'paired':>7} {'cpu µs/key':>11}")
for m in ["off", "on"]:
    med = statistics.median(rate[m])
    paired = statistics.median(ratios) if m == "on" else 1.0
    print(f"{m:>4} {med:>10.0f} {med / statistics.median(rate['off']):>6.3f} {paired:>7.3f} {statistics.median(cpu[m]):>11.2f}")
pub = []
for r in range(1, rounds + 1):
    published = json.load(open(f"{work}/status-{r}.json"))["published_events"]
    ticks = int(open(f"{work}/publisher-{r}.ticks").read())
    pub.append(ticks / hz * 1e9 / max(1, published))
print(f"publisher thread: {statistics.median(pub):.0f} ns per event (median; rounds: {', '.join(f'{p:.0f}' for p in pub)})")
print("per round, what the subscriber counted, and the master's /kv_events/status:")
for e in events:
    print("  " + e)
EOF
