#!/usr/bin/env bash
# The disk tier's benchmark, in one run, on release binaries (`crescent up`: master and storage node in one
# process, and the `crescent bench` client):
#   mem-only  memory MEM and no disk tier: a working set of 3×MEM (KEYS values of VALUE) written once, then GETS
#             Zipf(ZIPF) gets over it (fixed seed and shuffle: the same keys are hot in every run);
#   ssd       the same with a disk tier of 4×MEM (`--ssd-dir`, on the filesystem of this checkout's target/),
#             promotion off (`[server] disk_promotion = false`): the tier itself;
#   disk-read gets of keys whose only replica is on the disk (checked with `crescent stat --json`), uniform over
#             them, DISK_CONC at a time: the disk tier's read MiB/s, against the device's sequential O_DIRECT
#             read (`dd iflag=direct`) of a file on the same filesystem, measured right before and after;
#   promotion on a fresh tier with promotion on (the default): the working set loaded, the keys memory still holds
#             removed, the disk-only keys read twice under Zipf: gets/s of each pass, objects promoted.
# Hit rate = gets that returned the value / all gets; gets/s counts every get, MiB/s the bytes of hits.
# With MOONCAKE_VENV=DIR (a venv with mooncake-transfer-engine-non-cuda) the original's SSD offload runs the same
# workload too (scripts/bench-ssd-mooncake.py). Results: target/bench-ssd/*.jsonl and a summary on stdout.
# CRESCENT_BIN=path measures that binary instead of building this tree.
set -euo pipefail
cd "$(dirname "$0")/.."
MEM=${MEM:-256MiB}
MEM_MIB=${MEM%MiB}
VALUE=${VALUE:-1MiB}
VALUE_MIB=${VALUE%MiB}
KEYS=${KEYS:-$((3 * MEM_MIB / VALUE_MIB))}
GETS=${GETS:-3000}
ZIPF=${ZIPF:-0.99}
CONC=${CONC:-4}
DISK_CONC=${DISK_CONC:-8}
DISK_GETS=${DISK_GETS:-1500}
[ -n "${CRESCENT_BIN:-}" ] || cargo build --release -q -p crescent-cli --bins
B=${CRESCENT_BIN:-target/release/crescent}
OUT=target/bench-ssd
mkdir -p "$OUT"
SSD_DIR=$OUT/ssd
PIDS=()
trap 'kill ${PIDS[@]+"${PIDS[@]}"} 2>/dev/null || true' EXIT
ready() { # file: waits for a server's JSON line
    for _ in $(seq 1 600); do [ -s "$1" ] && return 0; sleep 0.1; done
    echo "no readiness line in $1" >&2
    return 1
}
field() { python3 -c "import json,sys;print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$@"; }
start() { # extra `up` args
    rm -f "$OUT/up.json"
    $B up --listen 127.0.0.1:0 --admin 127.0.0.1:0 --segment-size "$MEM" "$@" > "$OUT/up.json" 2> "$OUT/up.log" &
    PIDS=($!)
    ready "$OUT/up.json"
    M=$(field "$OUT/up.json" master)
    ADMIN=$(field "$OUT/up.json" admin)
}
stop() {
    kill "${PIDS[@]}" 2>/dev/null || true
    wait "${PIDS[@]}" 2>/dev/null || true
    PIDS=()
}
metric() { # name: the sum of a /metrics series
    curl -s "http://$ADMIN/metrics" | awk -v n="$1" '$1 ~ "_"n"(_total)?($|\\{)" {s+=$2} END {print s+0}'
}
bench() { # out-file args...
    local out=$1
    shift
    $B --master "$M" bench --value-size "$VALUE" --keys "$KEYS" --run ssd --json "$out" "$@" > /dev/null
}
load() { # the working set, once (writes cycle over KEYS keys: each written exactly once)
    bench "$OUT/$1-write.jsonl" --phases write --count "$KEYS" --concurrency "$CONC" --keep --retry-full
}
settle() { # waits until no copy to disk is in flight
    for _ in $(seq 1 300); do
        local started done failed
        started=$(metric disk_offloads_started)
        done=$(metric disk_offloads_done)
        failed=$(metric disk_offloads_failed)
        [ "$started" = "$((done + failed))" ] && return 0
        sleep 0.2
    done
    echo "offloads still in flight after 60 s" >&2
}
zipf() { # name
    bench "$OUT/$1-read.jsonl" --phases read --count "$GETS" --concurrency "$CONC" --zipf "$ZIPF" --verify --keep
}
dd_read() { # MiB/s of an O_DIRECT sequential read of the dd file (1 GiB, 1 MiB requests, one at a time)
    dd if="$OUT/dd.bin" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1 |
        python3 -c "import sys,re;l=sys.stdin.read();m=re.search(r'(\d+) bytes.*, ([\d.]+) s',l);print(round(int(m.group(1))/float(m.group(2))/2**20,1))"
}
dd_parallel() { # MiB/s of DISK_CONC such reads at once, each of its own slice of the file (the disk read's depth)
    local slice=$((1024 / DISK_CONC)) t0 t1
    t0=$(date +%s.%N)
    for i in $(seq 0 $((DISK_CONC - 1))); do
        dd if="$OUT/dd.bin" of=/dev/null bs=1M iflag=direct skip=$((i * slice)) count=$slice status=none &
    done
    wait
    t1=$(date +%s.%N)
    python3 -c "print(round($slice * $DISK_CONC / ($t1 - $t0), 1))"
}
settled_reads() { # the node's disk read counter once its reports stop changing (they come periodically)
    local last=-1 now
    for _ in $(seq 1 20); do
        now=$(metric disk_segment_read_bytes)
        [ "$now" = "$last" ] && break
        last=$now
        sleep 1
    done
    echo "$now"
}
echo "# $(date -u +%FT%TZ) $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg); fs of $OUT: $(df -h --output=source,fstype "$OUT" | tail -1)"
echo "# memory $MEM, working set $KEYS × $VALUE, $GETS gets Zipf($ZIPF) at concurrency $CONC"

# (a) memory only
start
load mem-only
zipf mem-only
stop

# (b) with a disk tier of 4×MEM on the same filesystem as the dd file, promotion off: the tier itself (a read of a
# disk-only object leaves it there, so the disk read below finds the oldest keys still on the disk only)
rm -rf "$SSD_DIR"
mkdir -p "$SSD_DIR"
printf '[server]\ndisk_promotion = false\n' > "$OUT/no-promotion.toml"
start --ssd-dir "$SSD_DIR" --ssd-size "$((4 * MEM_MIB))MiB" --config "$OUT/no-promotion.toml"
load ssd
settle
offloaded=$(metric disk_offloads_done)
zipf ssd
settle

# (c) the disk tier's read throughput against the device's
disk_only() { # how many keys from bench-ssd-0 on are on the disk only
    local n=0 k tiers
    for k in $(seq 0 $((KEYS - 1))); do
        tiers=$($B --master "$M" stat "bench-ssd-$k" --json 2>/dev/null |
            python3 -c "import json,sys;print(','.join(sorted(r.get('tier','?') for r in json.load(sys.stdin)['replicas'])))" ||
            echo gone)
        [ "$tiers" = disk ] || break
        n=$((k + 1))
    done
    echo "$n"
}
disk_keys=$(disk_only)
read_keys=$disk_keys
echo "# keys 0..$disk_keys are on the disk only"
if [ ! -s "$OUT/dd.bin" ]; then
    dd if=/dev/urandom of="$OUT/dd.bin" bs=1M count=1024 oflag=direct status=none
fi
dd_before=$(dd_read)
ddp_before=$(dd_parallel)
reads_before=$(settled_reads)
rm -f "$OUT/disk-read.jsonl"
if [ "$disk_keys" -gt 0 ]; then
    $B --master "$M" bench --value-size "$VALUE" --keys "$disk_keys" --run ssd --json "$OUT/disk-read.jsonl" \
        --phases read --count "$DISK_GETS" --concurrency "$DISK_CONC" --keep > /dev/null
fi
reads_after=$(settled_reads)
dd_after=$(dd_read)
ddp_after=$(dd_parallel)
first_tiers=$($B --master "$M" stat bench-ssd-0 --json | python3 -c "import json,sys;print([r['tier'] for r in json.load(sys.stdin)['replicas']])")
stop

# (e) promotion (on, the default), on a fresh tier: the working set loaded, memory made free (the keys memory
# still holds are removed), then the disk-only keys read twice under the same Zipf draw: the first pass finds them
# on disk and promotes what it reads, the second finds the hot ones in memory.
rm -rf "$SSD_DIR"
mkdir -p "$SSD_DIR"
start --ssd-dir "$SSD_DIR" --ssd-size "$((4 * MEM_MIB))MiB"
load promo
settle
disk_keys=$(disk_only)
promoted_before=$(metric disk_promotions_done)
if [ "$disk_keys" -gt 0 ]; then
    for k in $(seq "$disk_keys" $((KEYS - 1))); do $B --master "$M" rm "bench-ssd-$k" > /dev/null 2>&1 || true; done
    for pass in 1 2; do
        $B --master "$M" bench --value-size "$VALUE" --keys "$disk_keys" --run ssd --json "$OUT/promo-$pass.jsonl" \
            --phases read --count "$GETS" --concurrency "$CONC" --zipf "$ZIPF" --verify --keep > /dev/null
        settle
    done
fi
promoted=$(( $(metric disk_promotions_done) - promoted_before ))
stop

# (d) the original, when its wheel is at hand
if [ -n "${MOONCAKE_VENV:-}" ]; then
    MC_SSD=$OUT/mc-ssd
    rm -rf "$MC_SSD"
    mkdir -p "$MC_SSD"
    : > "$OUT/mooncake.jsonl"
    for mode in mem-only ssd; do
        "$MOONCAKE_VENV/bin/python" scripts/bench-ssd-mooncake.py --venv "$MOONCAKE_VENV" --mem-mib "$MEM_MIB" \
            --value-mib "$VALUE_MIB" --keys "$KEYS" --gets "$GETS" --zipf "$ZIPF" --conc "$CONC" --ssd-dir "$MC_SSD" \
            --mode $mode --out "$OUT/mooncake.jsonl" > "$OUT/mooncake-$mode.log" 2>&1 ||
            echo "# the original's $mode run failed: see $OUT/mooncake-$mode.log"
    done
fi

python3 - "$OUT" "$offloaded" "$read_keys" "$dd_before" "$dd_after" "$reads_before" "$reads_after" "$first_tiers" \
    "$ddp_before" "$ddp_after" "$DISK_CONC" "$promoted" <<'EOF'
import json, os, sys
out, offloaded, disk_keys, dd_before, dd_after, rb, ra, first, ddp_before, ddp_after, depth, promoted = sys.argv[1:]
def one(name):
    p = os.path.join(out, name)
    return json.loads(open(p).readline()) if os.path.exists(p) and os.path.getsize(p) else None
print("| run | load MiB/s | puts failed / retried (full) | gets | hit rate | gets/s | hit MiB/s | p50 µs | p99 µs | misses |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for name in ["mem-only", "ssd"]:
    w, r = one(f"{name}-write.jsonl"), one(f"{name}-read.jsonl")
    gets = r["keys"] + r["errors"]
    label = "ssd (no promotion)" if name == "ssd" else name
    print(f"| crescent {label} | {w['mib_per_s']:.0f} | {w['errors']} / {w['retries']} | {gets} | {r['keys'] / gets:.1%} | {r['req_per_s']:.0f} | "
          f"{r['mib_per_s']:.0f} | {r['p50_us']} | {r['p99_us']} | {r['errors_by_code'] or '-'} |")
mc = os.path.join(out, "mooncake.jsonl")
if os.path.exists(mc):
    for line in open(mc):
        r = json.loads(line)
        print(f"| original {r['run']} | {r['write_mib_per_s']:.0f} | {r['puts_failed']} / {r['put_retries']} | {r['gets']} | {r['hits'] / r['gets']:.1%} | "
              f"{r['gets_per_s']:.0f} | {r['hit_mib_per_s']:.0f} | - | - | {r['notes']} |")
print(f"\nobjects offloaded to the disk while loading: {offloaded}")
d = one("disk-read.jsonl")
if d is None:
    print("disk read: no key was on the disk only")
else:
    dd = (float(dd_before) + float(dd_after)) / 2
    ddp = (float(ddp_before) + float(ddp_after)) / 2
    print(f"disk read: {d['keys']} gets of {disk_keys} disk-only keys at concurrency {d['concurrency']}: "
          f"{d['mib_per_s']:.0f} MiB/s, p50 {d['p50_us']} µs, p99 {d['p99_us']} µs ({d['errors']} errors; "
          f"the node counted {(float(ra) - float(rb)) / 2**20:.0f} MiB read from its disk meanwhile); "
          f"key 0 afterwards: {first}")
    print(f"device: dd bs=1M iflag=direct sequential {dd_before} / {dd_after} MiB/s (before/after): the disk tier "
          f"reads at {d['mib_per_s'] / dd:.0%} of it; {depth} such dd at once {ddp_before} / {ddp_after} MiB/s: "
          f"{d['mib_per_s'] / ddp:.0%} of that")
p1, p2 = one("promo-1.jsonl"), one("promo-2.jsonl")
if p1 and p2:
    print(f"promotion (memory freed, disk-only keys read twice, Zipf): pass 1 {p1['req_per_s']:.0f} gets/s "
          f"(p50 {p1['p50_us']} µs, {p1['errors']} errors), pass 2 {p2['req_per_s']:.0f} gets/s (p50 {p2['p50_us']} µs, "
          f"{p2['errors']} errors); {promoted} objects promoted to memory")
EOF
