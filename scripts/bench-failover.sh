#!/usr/bin/env bash
# Leader failover with many objects: an etcd (free loopback ports), a leader and one standby (`--etcd
# --data-dir`), one storage node; `crescent bench --phases master-put` loads OBJECTS objects of 1 KiB (metadata
# only), the standby is waited for until it has applied the whole log, the leader is SIGKILLed, and a probe
# `crescent put` is tried every 50 ms until one succeeds. Prints the load rate, the time from the kill to the
# first successful put, both masters' RSS before the kill, and the standby's promotion lines (lease won, state
# restored, serving). Release build.
# Needs etcd (apt install etcd-server) and memory for two masters (~2 GB each at 10 M objects).
#   scripts/bench-failover.sh [OBJECTS]
set -euo pipefail
objects=${1:-10000000}
cd "$(dirname "$0")/.."
cargo build --release -q -p crescent-cli
bin=$PWD/target/release/crescent
etcd_bin=${CRESCENT_ETCD_BIN:-/usr/bin/etcd}
[ -x "$etcd_bin" ] || { echo "etcd not found at $etcd_bin (apt install etcd-server)" >&2; exit 1; }
work=$(mktemp -d /tmp/crescent-bench-failover.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
cd "$work"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
client=$(free_port) peer=$(free_port)
rpc1=$(free_port) admin1=$(free_port) rpc2=$(free_port) admin2=$(free_port)
"$etcd_bin" --name fo --data-dir etcd --listen-client-urls "http://127.0.0.1:$client" \
    --advertise-client-urls "http://127.0.0.1:$client" --listen-peer-urls "http://127.0.0.1:$peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "fo=http://127.0.0.1:$peer" \
    --quota-backend-bytes 8589934592 --auto-compaction-mode periodic --auto-compaction-retention 1m \
    > etcd.log 2>&1 &
pids+=($!)
timeout 30 sh -c "until curl -sf http://127.0.0.1:$client/health >/dev/null; do sleep 0.2; done"

health() { curl -s "127.0.0.1:$1/health"; }
"$bin" master --etcd "127.0.0.1:$client" --cluster-id fo --listen "127.0.0.1:$rpc1" --admin "127.0.0.1:$admin1" \
    --data-dir m1 > m1.log 2>&1 &
leader=$!
pids+=($leader)
timeout 30 sh -c "until curl -s 127.0.0.1:$admin1/health | grep -q '\"role\":\"leader\"'; do sleep 0.2; done"
"$bin" master --etcd "127.0.0.1:$client" --cluster-id fo --listen "127.0.0.1:$rpc2" --admin "127.0.0.1:$admin2" \
    --data-dir m2 > m2.log 2>&1 &
standby=$!
pids+=($standby)
export CRESCENT_MASTER="etcd://127.0.0.1:$client/fo"
# 1 KiB values: 16 GiB (not prefaulted: the bench writes no bytes) holds 10 M of them.
"$bin" node --segment-size 16GiB --prefault false > node.log 2>&1 &
pids+=($!)
"$bin" wait --nodes 1 --timeout 60s > /dev/null

"$bin" bench --phases master-put --batch 128 --concurrency 64 --count $(( (objects + 127) / 128 )) \
    --value-size 1KiB --keep 2>&1 | grep -E "^(phase|master)"
# The standby has applied everything once it has reached the leader's log and the log has stopped growing.
applied_seq() { health "$1" | grep -oE '"applied_seq":[0-9]+' | head -1 | cut -d: -f2; }
last=-1
for _ in $(seq 1 300); do
    durable=$(applied_seq "$admin1") applied=$(applied_seq "$admin2")
    [ "${applied:-0}" -ge "${durable:-1}" ] && [ "$durable" = "$last" ] && break
    last=$durable
    sleep 1
done
echo "leader's log at $durable, standby applied $applied"
rss_mib() { echo $(($(ps -o rss= -p "$1") / 1024)); }
echo "RSS: leader $(rss_mib "$leader") MiB, standby $(rss_mib "$standby") MiB"

t0=$(date +%s.%N)
kill -9 "$leader"
wait "$leader" 2>/dev/null || true
n=0
until echo probe | timeout 10 "$bin" put "probe-$n" - --request-timeout 2s > /dev/null 2>&1; do
    n=$((n + 1))
    sleep 0.05
done
t1=$(date +%s.%N)
echo "first successful put $(echo "$t1 - $t0" | bc) s after the kill ($((n + 1)) attempts)"
grep -E "won the master view|replayed state restored|promoted:|stepped down|promotion failed" m2.log | cut -c1-200
