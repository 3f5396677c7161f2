#!/usr/bin/env bash
# What authentication, data-plane grants and TLS cost, in one run: one `crescent up` cluster per mode and
# `crescent bench` put and get of 4 KiB, 1 MiB and 4 MiB values against each in turn, ROUNDS times; the table
# shows the median of the rounds and each mode's ratio to `off`. Release build.
#   scripts/bench-auth.sh [SECONDS_PER_PHASE] [ROUNDS] [CONCURRENCY] [SIZES] [MODES]
# SIZES is a comma-separated list (default 4KiB,1MiB,4MiB). The table gives each mode's median and its ratio to
# `off` ("/off"), and the median of the per-round ratios ("paired": each round runs every mode back to back).
# MODES (default off,on,tls): `off` no secret, no TLS; `on` a cluster secret (every connection authenticated,
# every transfer under a master-sealed grant); `tls` the secret and TLS with client certificates on every
# connection (`crescent certs`); `tcp` (below) `off` without the same-host shortcut, which TLS forgoes. Each round starts with the next mode in turn, so none always follows another.
# Every round runs on fresh clusters (one segment of CRESCENT_BENCH_SEGMENT, default 1GiB, fully backed first).
set -euo pipefail
secs=${1:-5}
# Each cluster's one segment (fully backed before its run: smaller starts faster).
segment=${CRESCENT_BENCH_SEGMENT:-1GiB}
# Keys per request (`crescent bench --batch`).
batch=${CRESCENT_BENCH_BATCH:-1}
segment_kib=$(($(numfmt --from=iec "${segment%iB}") >> 10))
rounds=${2:-3}
conc=${3:-1}
IFS=, read -r -a sizes <<<"${4:-4KiB,1MiB,4MiB}"
IFS=, read -r -a modes <<<"${5:-off,on,tls}"
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
"$bin" certs "$work/pki" >/dev/null
# What each mode's servers are given, and its clients' environment.
declare -A flags envs master args
flags[off]=""
envs[off]=""
flags[on]="--secret-file $work/secret"
envs[on]="CRESCENT_SECRET_FILE=$work/secret"
flags[tls]="${flags[on]} --tls-cert $work/pki/cert.pem --tls-key $work/pki/key.pem --tls-ca $work/pki/ca.pem \
    --tls-client-ca $work/pki/ca.pem"
envs[tls]="${envs[on]} CRESCENT_TLS_CA=$work/pki/ca.pem CRESCENT_TLS_CERT=$work/pki/cert.pem \
    CRESCENT_TLS_KEY=$work/pki/key.pem"
# `tcp`: `off` with the node's and client's same-host shortcut (Unix-socket lanes, local copies) turned off, as
# TLS turns it off: `tls` against `tcp` is what the encryption costs, `tcp` against `off` what the shortcut saves.
printf '[node]\nlocal_lanes = false\n[client]\nlocal_lanes = false\n' >"$work/tcp.toml"
flags[tcp]="--config $work/tcp.toml"
envs[tcp]=""
args[tcp]="--config $work/tcp.toml"
# Starts one `up` per mode and waits until each has backed its whole segment (the node prefaults it in the
# background, with huge pages where the kernel allows): a lazily backed segment charges first touches — page
# faults clearing fresh pages, 70 % of a TLS node's profile in 1 MiB writes — to whichever run comes first.
start_clusters() {
    for m in "${modes[@]}"; do
        # shellcheck disable=SC2086 # the flags are words
        master[$m]=$(start "$m" up --listen 127.0.0.1:0 --admin 127.0.0.1:0 --segment-size "$segment" ${flags[$m]})
    done
    for m in "${modes[@]}"; do
        for _ in $(seq 1 600); do
            rss=$(awk '/^VmRSS/ {print $2}' "/proc/$(cat "$work/$m.pid")/status")
            [ "$rss" -ge "$segment_kib" ] && break
            sleep 0.1
        done
    done
}

stop_clusters() {
    for m in "${modes[@]}"; do
        kill "$(cat "$work/$m.pid")" 2>/dev/null || true
        rm -f "$work/$m.pid" "$work/$m.out"
    done
    wait 2>/dev/null || true
}

# The server's CPU time (utime + stime of the `up` process, in clock ticks) per key written or read, over both
# phases: what authentication costs the master and node, unlike throughput robust to other load on the machine.
ticks() { awk '{print $14 + $15}' "/proc/$(cat "$work/$1.pid")/stat"; }
echo "crescent bench write,read, ${secs}s per phase, concurrency $conc, batch $batch, median of $rounds rotating rounds," \
    "$(nproc) CPUs, $(git rev-parse --short HEAD)"
n=${#modes[@]}
for size in "${sizes[@]}"; do
    for r in $(seq 1 "$rounds"); do
        # Fresh clusters every round, each run once: a process's own luck (where its threads and memory landed;
        # one cluster's 1 MiB writes ran 10 % behind another's of the same mode for a whole run) is then a
        # round's noise rather than a bias the median keeps, and no run inherits another's state (after 4 KiB
        # rounds the next size's first runs were slower in every mode for a minute or more).
        start_clusters
        for i in $(seq 0 $((n - 1))); do
            m=${modes[$(((i + r) % n))]}
            t0=$(ticks "$m")
            # shellcheck disable=SC2086 # the variables are words
            env ${envs[$m]} "$bin" bench ${args[$m]:-} --master "${master[$m]}" --phases write,read --value-size "$size" \
                --concurrency "$conc" --batch "$batch" --duration "$secs" --json "$work/$m-$size-$r.json" >/dev/null
            t1=$(ticks "$m")
            echo "$((t1 - t0))" >"$work/$m-$size-$r.ticks"
        done
        stop_clusters
    done
done
CRESCENT_BENCH_SECS=$secs CRESCENT_CLK_TCK=$(getconf CLK_TCK) CRESCENT_MODES=$(IFS=,; echo "${modes[*]}") \
    python3 - "$work" "$rounds" "${sizes[@]}" <<'EOF'
import json, os, statistics, sys
secs, hz = float(os.environ["CRESCENT_BENCH_SECS"]), float(os.environ["CRESCENT_CLK_TCK"])
modes = os.environ["CRESCENT_MODES"].split(",")
work, rounds, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
base = modes[0]
rounds_seen = {}
print(f"{'value':>6} {'phase':>6} {'mode':>5} {'MiB/s':>9} {'/' + base:>7} {'paired':>7} {'p50':>8} {'cpu/key':>9} "
      f"{'errors':>6}")
for size in sizes:
    for phase in ["write", "read"]:
        got, per_round = {}, {}
        for m in modes:
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
        rounds_seen[(size, phase)] = per_round
        for m in modes:
            ratio = got[m][0] / got[base][0]
            # Each round's ratio to the base measured in the same round, then their median: drift of the machine
            # over the run (other load, the page cache, thermal) cancels within a round.
            paired = statistics.median(a / b for a, b in zip(per_round[m], per_round[base]) if b > 0)
            print(f"{size:>6} {phase:>6} {m:>5} {got[m][0]:>9.1f} {ratio:>7.3f} {paired:>7.3f} {got[m][1]:>7.0f}µ "
                  f"{got[m][3]:>7.1f}µs {got[m][2]:>6}")
print("MiB/s per round (" + " | ".join(modes) + "):")
for (size, phase), r in rounds_seen.items():
    print(f"  {size} {phase}: " + " | ".join(str(r[m]) for m in modes))
EOF
