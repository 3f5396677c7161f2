#!/usr/bin/env bash
# What authentication and data-plane grants cost, in one run: two `crescent up` clusters, one without a secret
# and one with (every connection authenticated, every transfer under a master-sealed grant), and `crescent
# bench` put and get of 4 KiB, 1 MiB and 4 MiB values against each in turn, alternating off/on ROUNDS times;
# the table shows the median of the rounds and the on/off ratio. Release build.
#   scripts/bench-auth.sh [SECONDS_PER_PHASE] [ROUNDS] [CONCURRENCY] [SIZES]
# SIZES is a comma-separated list (default 4KiB,1MiB,4MiB). Each round runs the two in the other order than the
# round before, so neither always follows the other.
set -euo pipefail
secs=${1:-5}
rounds=${2:-3}
conc=${3:-1}
IFS=, read -r -a sizes <<<"${4:-4KiB,1MiB,4MiB}"
cd "$(dirname "$0")/.."
cargo build --release -q -p crescent-cli
bin=target/release/crescent
work=$(mktemp -d /tmp/crescent-bench-auth.XXXXXX)
cleanup() {
    for f in "$work"/*.pid; do [ -e "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# Starts `crescent ARGS…` in the background and prints the readiness JSON line's `master` field.
start() {
    local name=$1
    shift
    "$bin" "$@" >"$work/$name.out" 2>"$work/$name.err" &
    echo $! >"$work/$name.pid"
    for _ in $(seq 1 600); do
        if [ -s "$work/$name.out" ]; then
            jq -r .master <"$work/$name.out"
            return
        fi
        sleep 0.1
    done
    echo "$name did not start: $(tail -5 "$work/$name.err")" >&2
    exit 1
}

(umask 077 && "$bin" secret >"$work/secret")
declare -A master
master[off]=$(start off up --listen 127.0.0.1:0 --admin 127.0.0.1:0 --segment-size 4GiB --prefault false)
master[on]=$(start on up --listen 127.0.0.1:0 --admin 127.0.0.1:0 --segment-size 4GiB --prefault false \
    --secret-file "$work/secret")

# The server's CPU time (utime + stime of the `up` process, in clock ticks) per key written or read, over both
# phases: what authentication costs the master and node, unlike throughput robust to other load on the machine.
ticks() { awk '{print $14 + $15}' "/proc/$(cat "$work/$1.pid")/stat"; }
echo "crescent bench write,read, ${secs}s per phase, concurrency $conc, median of $rounds alternating rounds," \
    "$(nproc) CPUs, $(git rev-parse --short HEAD)"
for size in "${sizes[@]}"; do
    for r in $(seq 1 "$rounds"); do
        order=(off on)
        [ $((r % 2)) = 0 ] && order=(on off)
        for m in "${order[@]}"; do
            env=()
            [ "$m" = on ] && env=(CRESCENT_SECRET_FILE="$work/secret")
            t0=$(ticks "$m")
            env "${env[@]}" "$bin" bench --master "${master[$m]}" --phases write,read --value-size "$size" \
                --concurrency "$conc" --duration "$secs" --json "$work/$m-$size-$r.json" >/dev/null
            t1=$(ticks "$m")
            echo "$((t1 - t0))" >"$work/$m-$size-$r.ticks"
            # On the secured cluster, space freed within a write-grant window of its allocation stays held until
            # the window ends (12 s by default, `segment_pool::WriteHold`): the keys this run removed at its end
            # must be free again before the next run sizes its key set to what the cluster holds.
            [ "$m" = off ] || sleep 13
        done
    done
done
CRESCENT_BENCH_SECS=$secs CRESCENT_CLK_TCK=$(getconf CLK_TCK) python3 - "$work" "$rounds" "${sizes[@]}" <<'EOF'
import json, os, statistics, sys
secs, hz = float(os.environ["CRESCENT_BENCH_SECS"]), float(os.environ["CRESCENT_CLK_TCK"])
work, rounds, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rounds_seen = {}
print(f"{'value':>6} {'phase':>6} {'off MiB/s':>10} {'on MiB/s':>10} {'on/off':>7} {'off p50':>8} {'on p50':>8} "
      f"{'off cpu/key':>11} {'on cpu/key':>10} {'errors':>6}")
for size in sizes:
    for phase in ["write", "read"]:
        got, per_round = {}, {}
        for m in ["off", "on"]:
            runs, cpu = [], []
            for r in range(1, rounds + 1):
                both = [json.loads(line) for line in open(f"{work}/{m}-{size}-{r}.json")]
                runs += [p for p in both if p["phase"] == phase]
                # Server CPU over the whole run (both phases and the clean-up) per key moved.
                ticks = int(open(f"{work}/{m}-{size}-{r}.ticks").read())
                cpu.append(ticks / hz * 1e6 / max(1.0, sum(p["keys_per_s"] * secs for p in both)))
            per_round[m] = [round(p["mib_per_s"], 1) for p in runs]
            got[m] = (statistics.median(p["mib_per_s"] for p in runs), statistics.median(p["p50_us"] for p in runs),
                      sum(p["errors"] for p in runs), statistics.median(cpu))
        ratio = got["on"][0] / got["off"][0]
        rounds_seen[(size, phase)] = per_round
        print(f"{size:>6} {phase:>6} {got['off'][0]:>10.1f} {got['on'][0]:>10.1f} {ratio:>7.3f} "
              f"{got['off'][1]:>7.0f}µ {got['on'][1]:>7.0f}µ {got['off'][3]:>9.1f}µs {got['on'][3]:>8.1f}µs "
              f"{got['off'][2] + got['on'][2]:>6}")
print("MiB/s per round (off | on):")
for (size, phase), r in rounds_seen.items():
    print(f"  {size} {phase}: {r['off']} | {r['on']}")
EOF
