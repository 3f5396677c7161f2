#!/usr/bin/env bash
# A cluster of network namespaces on this host (root): one master, NODES storage nodes and CLIENT_NS client
# namespaces running CLIENTS `crescent bench` processes in all, each namespace joined to a bridge by a veth pair,
# with `tc netem` adding DELAY to every namespace's egress when the kernel has netem (it says so when it has not).
# Nothing is routed outside: the bridge has no address and no uplink, so nothing leaves the namespaces made here.
# Everything stops and is removed when the script ends, however it ends.
#
#   scripts/netns-cluster.sh [SECONDS_PER_PHASE] [NODES] [CLIENTS] [SEGMENT] [DELAY]
#   defaults:                 5                   16      64        256MiB    0.2ms
#
# Measured, in one run (release build), for 64 KiB and 1 MiB values:
#   - aggregate write and read throughput of all clients (each `crescent bench --concurrency 1` on its own key set,
#     together about half the pool), p50 (the median of the clients' p50s) and p99 (the largest client p99);
#   - the master's CPU per client request (its process's CPU time over the phase / requests of all clients);
#   - placement balance: the spread of fill across nodes ((max − min) / mean of used bytes) after the 64 KiB
#     writes (half the pool), with NODES − LATE nodes, and again after LATE more nodes join and the clients write
#     a quarter of the whole pool more (PLACEMENT=free-ratio-first to run the master with that policy).
# SYSTEM=original runs the original instead, in the same namespaces: its `mooncake_master` and, for nodes, its
# `mooncake_client` daemon (from the wheel `mooncake-transfer-engine-non-cuda`, installed into
# target/bench-venv-original as scripts/bench-python.sh does). Its clients are Python processes
# (crates/python/bench/netns_client.py, put_from/get_into one at a time); CLIENT=python gives Crescent the same
# Python clients (its release wheel in target/bench-venv-crescent), so the two runs compare like for like.
# KILL=1 adds a node kill under load (Python clients, either system): after the 1 MiB phase every client reads
# its 1 MiB keys back for KILL_SECS (default 20) while a probe client puts a 64 KiB value every 0.1 s; 3 s in, the
# first node is killed (SIGKILL). Reported: the probe's failed puts and the time from the kill to its last failure
# (time to full write availability), the readers' errors, and how many of the 1 MiB objects read back afterwards
# (objects lost: with one replica, those the dead node held).
# HA=1 runs three masters on an etcd in a namespace of its own (both systems: Crescent's `--etcd`, the original's
# `--enable_ha`), clients and nodes following the leader through etcd; with KILL=1 the leader is killed 5 s after
# the node, and the probe's failures after it give the time to full write availability through a failover.
set -euo pipefail
secs=${1:-5}
nodes=${2:-16}
clients=${3:-64}
segment=${4:-256MiB}
delay=${5:-0.2ms}
late=${LATE:-4}
client_ns=${CLIENT_NS:-8}
[ "$(id -u)" -eq 0 ] || { echo "scripts/netns-cluster.sh: needs root (network namespaces, veth, tc)" >&2; exit 1; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "needs iproute2 (ip, tc)" >&2; exit 1; }
system=${SYSTEM:-crescent}
client=${CLIENT:-rust}
[ "$system" = original ] && client=python
[ "${KILL:-0}" = 1 ] && client=python
cd "$(dirname "$0")/.."
cargo build --release -q -p crescent-cli
bin=$PWD/target/release/crescent
mc=${MC_VENV:-$PWD/target/bench-venv-original}
py=$PWD/target/bench-venv-crescent/bin/python
if [ "$system" = original ]; then
    [ -x "$mc/bin/python" ] || python3 -m venv "$mc"
    "$mc/bin/python" -c "import mooncake.store, numpy" 2>/dev/null || "$mc/bin/pip" install -q mooncake-transfer-engine-non-cuda numpy
    ldconfig -p | grep -q libibverbs.so.1 || apt-get install -y -q libibverbs1 librdmacm1 >/dev/null
    py=$mc/bin/python
elif [ "$client" = python ]; then
    cr=$PWD/target/bench-venv-crescent
    [ -x "$cr/bin/python" ] || python3 -m venv "$cr"
    [ -x "$cr/bin/maturin" ] || "$cr/bin/pip" install -q "maturin>=1.9.4,<2" numpy
    (cd crates/python && VIRTUAL_ENV="$cr" "$cr/bin/maturin" develop --release --locked -q)
fi
pyclient=$PWD/crates/python/bench/netns_client.py
work=$(mktemp -d /tmp/crescent-netns.XXXXXX)
tag=cr$$
bridge=${tag}br
namespaces=()
pids=()

cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    # Up to 3 s for them to stop on their own, then SIGKILL; `wait` keeps bash from reporting each one.
    for _ in $(seq 30); do
        alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    ip link del "$bridge" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

ip link add "$bridge" type bridge
ip link set "$bridge" up
netem=yes
# A namespace NAME with address IP on the bridge (host side of its veth in the bridge, no address on the host).
make_ns() {
    local ns=$1 addr=$2 i=${#namespaces[@]}
    ip netns add "$ns"
    namespaces+=("$ns")
    ip link add "${tag}v$i" type veth peer name "${tag}p$i"
    ip link set "${tag}p$i" netns "$ns"
    ip link set "${tag}v$i" master "$bridge" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$addr/16" dev "${tag}p$i"
    ip -n "$ns" link set "${tag}p$i" up
    if [ "$netem" = yes ] && ! ip netns exec "$ns" tc qdisc add dev "${tag}p$i" root netem delay "$delay" 2>/dev/null; then
        netem=no
        echo "NOTE: this kernel has no netem qdisc (tc qdisc ... netem: unknown): no delay is added" >&2
    fi
}

masters=1
[ "${HA:-0}" = 1 ] && masters=3
for m in $(seq 1 "$masters"); do make_ns "${tag}m$m" "10.201.0.$m"; done
[ "${HA:-0}" = 1 ] && make_ns "${tag}e" 10.201.0.10
for i in $(seq 1 "$nodes"); do make_ns "${tag}n$i" "10.201.1.$i"; done
for g in $(seq 1 "$client_ns"); do make_ns "${tag}c$g" "10.201.2.$g"; done

# `run NS NAME ARGS…`: a crescent process in namespace NS, in the background, its output in $work/NAME.*.
run() {
    local ns=$1 name=$2
    shift 2
    ip netns exec "$ns" "$bin" "$@" >"$work/$name.out" 2>"$work/$name.err" &
    pids+=($!)
    echo $! >"$work/$name.pid"
}
in_client() { ip netns exec "${tag}c1" "$bin" "$@"; }

seg_bytes=$(python3 -c "import re,sys; s=sys.argv[1]; m=re.fullmatch(r'(\d+)([KMG]i?B)?', s); u={'KiB':1<<10,'MiB':1<<20,'GiB':1<<30,None:1}; print(int(m.group(1))*u[m.group(2)])" "$segment")
# `exe NS NAME PROGRAM ARGS…`: like `run`, any program.
exe() {
    local ns=$1 name=$2
    shift 2
    ip netns exec "$ns" "$@" >"$work/$name.out" 2>"$work/$name.err" &
    pids+=($!)
    echo $! >"$work/$name.pid"
}
# Masters: one, or with HA=1 three candidates on an etcd of their own (its own namespace), which elect a leader;
# clients and nodes then follow the leader through etcd (`etcd://…`, the address form both systems take).
if [ "${HA:-0}" = 1 ]; then
    exe "${tag}e" etcd etcd --name netns --data-dir "$work/etcd" --listen-client-urls http://10.201.0.10:2379 \
        --advertise-client-urls http://10.201.0.10:2379 --listen-peer-urls http://10.201.0.10:2380 \
        --initial-advertise-peer-urls http://10.201.0.10:2380 --initial-cluster netns=http://10.201.0.10:2380
    timeout 30 sh -c "until ip netns exec ${tag}e curl -sf http://10.201.0.10:2379/health >/dev/null; do sleep 0.2; done"
fi
for m in $(seq 1 "$masters"); do
    ha_args=()
    if [ "$system" = original ]; then
        [ "${HA:-0}" = 1 ] && ha_args=(--enable_ha=true --etcd_endpoints=10.201.0.10:2379)
        exe "${tag}m$m" "master$m" "$mc/bin/mooncake_master" --rpc_address "10.201.0.$m" --rpc_port 50051 \
            --metrics_port 9003 --enable_http_metadata_server=false "${ha_args[@]}"
    else
        [ "${HA:-0}" = 1 ] && ha_args=(--etcd 10.201.0.10:2379 --cluster-id netns --data-dir "$work/m$m")
        run "${tag}m$m" "master$m" master --listen "10.201.0.$m:50051" --admin "10.201.0.$m:9003" --insecure \
            --placement "${PLACEMENT:-random}" "${ha_args[@]}"
    fi
done
if [ "${HA:-0}" = 1 ]; then
    master_url=etcd://10.201.0.10:2379
    [ "$system" = crescent ] && master_url=$master_url/netns
else
    master_url=10.201.0.1:50051
fi
# The leading master's number (1 without HA): Crescent's /health says its role; the original's standbys do not
# serve RPC until elected, so its leader is the one whose RPC port takes a connection.
leader() {
    local m
    for m in $(seq 1 "$masters"); do
        if [ "$masters" = 1 ] \
            || { [ "$system" = crescent ] && ip netns exec "${tag}c1" curl -s "http://10.201.0.$m:9003/health" | grep -q '"role":"leader"'; } \
            || { [ "$system" = original ] && ip netns exec "${tag}c1" timeout 1 bash -c "</dev/tcp/10.201.0.$m/50051" 2>/dev/null; }; then
            echo "$m"
            return 0
        fi
    done
    echo 0
}
start_node() {
    if [ "$system" = original ]; then
        exe "${tag}n$1" "node$1" "$mc/bin/mooncake_client" --master_server_address="$master_url" \
            --host="10.201.1.$1" --port=7000 --global_segment_size="$seg_bytes" --protocol=tcp \
            --metadata_server=P2PHANDSHAKE
    else
        run "${tag}n$1" "node$1" node --master "$master_url" --listen "10.201.1.$1:7000" --segment-size "$segment" \
            --prefault false --insecure
    fi
}
# Until the master lists N memory segments (the original's /get_all_segments, which Crescent serves too).
wait_nodes() {
    local n=$1 deadline=$((SECONDS + 60)) have=0 m
    while [ "$SECONDS" -lt "$deadline" ]; do
        for m in $(seq 1 "$masters"); do
            have=$(ip netns exec "${tag}c1" curl -s -m 2 "http://10.201.0.$m:9003/get_all_segments" | grep -c . || true)
            [ "$have" -ge "$n" ] && return 0
        done
        sleep 0.2
    done
    echo "only $have of $n nodes registered within 60 s" >&2
    exit 1
}
first=$((nodes - late))
for i in $(seq 1 "$first"); do start_node "$i"; done
wait_nodes "$first"

master_pid=$(cat "$work/master$(leader).pid")
ticks() { awk '{print $14 + $15}' "/proc/$master_pid/stat" 2>/dev/null || echo 0; }

# `phase NAME SIZE PHASES COUNT_NODES DIVISOR [RUN]`: CLIENTS bench processes at once; each writes/reads its own
# keys (named after RUN, default NAME), together 1/DIVISOR of the pool of COUNT_NODES nodes (below the eviction
# watermark: nothing is evicted).
phase() {
    local name=$1 size=$2 phases=$3 live=$4 divisor=$5 run_name=${6:-$1} size_b
    size_b=$(python3 -c "import sys; s=sys.argv[1]; print(int(s[:-3])*(1<<10 if s.endswith('KiB') else 1<<20))" "$size")
    local keys=$((seg_bytes * live / divisor / clients / size_b))
    [ "$keys" -ge 1 ] || keys=1
    local t0 c g bench_pids=()
    t0=$(ticks)
    for c in $(seq 1 "$clients"); do
        g=$(((c - 1) % client_ns + 1))
        if [ "$client" = python ]; then
            ip netns exec "${tag}c$g" "$py" "$pyclient" --master "$master_url" --host "10.201.2.$g" \
                --size "$size_b" --keys "$keys" --run "$run_name-$c" --seconds "$secs" --phases "$phases" \
                ${6:+--keys-from "$work/$run_name-$c.json"} --json "$work/$name-$c.json" \
                >/dev/null 2>"$work/$name-$c.err" &
        else
            ip netns exec "${tag}c$g" "$bin" bench --master "$master_url" --phases "$phases" --value-size "$size" \
                --keys "$keys" --run "$run_name-$c" --keep --duration "$secs" --json "$work/$name-$c.json" \
                >/dev/null 2>"$work/$name-$c.err" &
        fi
        bench_pids+=($!)
    done
    for p in "${bench_pids[@]}"; do wait "$p" || { echo "a client failed: $(tail -3 "$work"/$name-*.err | tail -3)" >&2; exit 1; }; done
    echo "$(($(ticks) - t0))" >"$work/$name.ticks"
}
spread() { # the fill spread across nodes from the master's /get_segments_detail (the original's path)
    in_client_curl=$(ip netns exec "${tag}c1" curl -s "http://10.201.0.$(leader):9003/get_segments_detail")
    python3 -c '
import json, sys
used = [s["allocator_used_bytes"] for s in json.loads(sys.argv[1])["segments"]]
mean = sum(used) / len(used)
print(f"{len(used)} nodes, fill min {min(used) / 2**20:.0f} MiB, max {max(used) / 2**20:.0f} MiB, spread {(max(used) - min(used)) / mean if mean else 0:.3f}")
' "$in_client_curl"
}

echo "# scripts/netns-cluster.sh $secs $nodes $clients $segment $delay (system $system, clients $client, late $late, client namespaces $client_ns, placement ${PLACEMENT:-random}, netem $netem) at $(git rev-parse --short HEAD), $(nproc) CPUs"
phase small 64KiB write,read "$first" 2
echo "balance after 64 KiB writes: $(spread)"
for i in $(seq $((first + 1)) "$nodes"); do start_node "$i"; done
wait_nodes "$nodes"
phase late 64KiB write "$nodes" 4
echo "balance after $late nodes joined and a quarter of the pool more was written: $(spread)"
if [ "$system" = original ]; then
    ip netns exec "${tag}c1" "$py" -c 'import sys; from mooncake.store import MooncakeDistributedStore as S; s = S(); assert s.setup(sys.argv[2], "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", sys.argv[1]) == 0; print(s.remove_all(), file=sys.stderr); s.close()' \
        "$master_url" 10.201.2.1 2>>"$work/rm.err"
else
    in_client rm --master "$master_url" --all --force >/dev/null
fi
phase large 1MiB write,read "$nodes" 2

if [ "${KILL:-0}" = 1 ]; then
    kill_secs=${KILL_SECS:-20}
    (secs=$kill_secs phase kill 1MiB read "$nodes" 2 large) &
    load=$!
    ip netns exec "${tag}c1" "$py" "$pyclient" --master "$master_url" --host 10.201.2.1 --size 65536 \
        --keys 1 --run probe --probe "$kill_secs" --json "$work/probe.json" 2>"$work/probe.err" &
    probe=$!
    sleep 3
    node_killed=$(date +%s.%N)
    node1=$(cat "$work/node1.pid")
    { kill -9 "$node1" && wait "$node1"; } 2>/dev/null || true
    leader_killed=0
    if [ "${HA:-0}" = 1 ]; then
        sleep 5
        m=$(leader)
        for x in $(seq 1 "$masters"); do
            ip netns exec "${tag}c1" timeout 1 bash -c "</dev/tcp/10.201.0.$x/50051" 2>/dev/null \
                && echo "master $x takes RPC connections" >&2
        done
        leader_killed=$(date +%s.%N)
        lpid=$(cat "$work/master$m.pid")
        { kill -9 "$lpid" && wait "$lpid"; } 2>/dev/null || true
        echo "killed the leader, master $m" >&2
    fi
    wait "$load" "$probe"
    ip netns exec "${tag}c1" "$py" "$pyclient" --master "$master_url" --host 10.201.2.1 --size $((1 << 20)) \
        --keys 1 --run check --check "$(ls "$work"/large-*.json | paste -sd,)" --json "$work/check.json" \
        2>"$work/check.err"
    python3 - "$work" "$node_killed" "$leader_killed" "$clients" <<'EOF2'
import json, sys
work, node_killed, leader_killed, clients = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
probes = [json.loads(l) for l in open(f"{work}/probe.json")]
def window(name, start, end):
    ps = [p for p in probes if start <= p["t"] < end]
    failed = [p for p in ps if not p["ok"]]
    slow = max((p["ms"] for p in ps), default=0)
    if ps and not ps[-1]["ok"]:
        until = ps[-1]["t"] + ps[-1]["ms"] / 1e3 - start
        back = f"writes NOT available again by the window's end ({until:.2f} s after it)"
    else:
        back = f"writes fully available {(failed[-1]['t'] + failed[-1]['ms'] / 1e3 - start) if failed else 0.0:.2f} s after it"
    return f"after the {name} kill: {len(ps)} probe puts, {len(failed)} failed, {back} (slowest put {slow:.0f} ms)"
print("node kill under load:", window("node", node_killed, leader_killed or float("inf")))
if leader_killed:
    print("leader kill under load:", window("leader", leader_killed, float("inf")))
reads = [json.loads(l) for c in range(1, clients + 1) for l in open(f"{work}/kill-{c}.json")]
check = json.loads(open(f"{work}/check.json").read().splitlines()[-1])
print(f"readers: {sum(r['requests'] for r in reads)} reads, {sum(r['errors'] for r in reads)} errors; 1 MiB objects "
      f"read back afterwards: {check['checked'] - check['missing']} of {check['checked']} ({check['missing']} lost)")
EOF2
fi

CRESCENT_CLK_TCK=$(getconf CLK_TCK) python3 - "$work" "$clients" <<'EOF'
import json, os, statistics, sys
work, clients = sys.argv[1], int(sys.argv[2])
hz = float(os.environ["CRESCENT_CLK_TCK"])
print("| values | phase | clients | MiB/s (all) | req/s (all) | p50 (median of clients) | p99 (worst client) | errors | master CPU per master request (the run) |")
print("|---|---|---|---|---|---|---|---|---|")
for name, size in [("small", "64 KiB"), ("late", "64 KiB, after the late join"), ("large", "1 MiB")]:
    rows = {}
    for c in range(1, clients + 1):
        for line in open(f"{work}/{name}-{c}.json"):
            p = json.loads(line)
            rows.setdefault(p["phase"], []).append(p)
    cpu = int(open(f"{work}/{name}.ticks").read()) / hz
    requests = sum(p["requests"] * p.get("master_requests_per_request", 1) for ps in rows.values() for p in ps)
    for phase, ps in rows.items():
        print(f"| {size} | {phase} | {len(ps)} | {sum(p['mib_per_s'] for p in ps):.0f} | {sum(p['req_per_s'] for p in ps):.0f} "
              f"| {statistics.median(p['p50_us'] for p in ps)} µs | {max(p['p99_us'] for p in ps)} µs "
              f"| {sum(p['errors'] for p in ps)} | {cpu * 1e6 / max(1, requests):.1f} µs |")
EOF
