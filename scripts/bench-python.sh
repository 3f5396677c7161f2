#!/usr/bin/env bash
# Crescent's Python package against the original's, in one run (issue 16 §3): the same workload
# (`crates/python/bench/bench_store.py`) against each installed `mooncake.store`, each with its own master, ROUNDS
# times in turn; then `crescent bench` (Rust) against a Crescent master and a Python memory-holding process, the
# same topology, for the 4 MiB rows. Then the same rows through `setup_dummy`: the measuring store attached to a
# store process on its host (the original's `mooncake_client`; Crescent's `crescent node --memfd`). Then the cold
# rows: a fresh 4 GiB holder, 300 puts of 1 MiB and of 4 MiB with no write-over first, and their reads. Prints the
# medians of the rounds and the ratios. Release builds.
#   scripts/bench-python.sh [SECONDS_PER_ROW] [ROUNDS] [THREADS] [SIZES]
# THREADS and SIZES are comma-separated (defaults 1,8 and 4KiB,1MiB,4MiB). Two virtual environments under
# target/: Crescent's release wheel, and the original wheel `mooncake-transfer-engine-non-cuda` from PyPI (it
# needs the system's libibverbs1, installed with apt when missing).
set -euo pipefail
secs=${1:-2}
rounds=${2:-3}
threads=${3:-1,8}
sizes=${4:-4KiB,1MiB,4MiB}
cd "$(dirname "$0")/.."
root=$PWD
cargo build --release -q -p crescent-cli
bin=$root/target/release/crescent
bench=$root/crates/python/bench/bench_store.py

venv() {
    [ -x "$1/bin/python" ] || python3 -m venv "$1"
}
cr=$root/target/bench-venv-crescent
mc=$root/target/bench-venv-original
venv "$cr"
[ -x "$cr/bin/maturin" ] || "$cr/bin/pip" install -q "maturin>=1.9.4,<2"
(cd crates/python && VIRTUAL_ENV="$cr" "$cr/bin/maturin" develop --release --locked -q)
venv "$mc"
"$mc/bin/python" -c "import mooncake.store" 2>/dev/null || "$mc/bin/pip" install -q mooncake-transfer-engine-non-cuda
if ! ldconfig -p | grep -q libibverbs.so.1; then
    apt-get install -y -q libibverbs1 >/dev/null
fi

work=$(mktemp -d /tmp/crescent-bench-python.XXXXXX)
pids=()
cleanup() {
    stop_masters
    rm -rf "$work"
}
trap cleanup EXIT
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# Waits until `port` on loopback accepts connections.
await_port() {
    for _ in $(seq 1 100); do
        if python3 -c "import socket, sys; socket.create_connection(('127.0.0.1', $1), 0.2)" 2>/dev/null; then
            return
        fi
        sleep 0.1
    done
    echo "nothing listens on port $1" >&2
    exit 1
}
# Starts a master of `which` (crescent or original) in the background; prints its address.
master() {
    local port
    port=$(free_port)
    if [ "$1" = crescent ]; then
        "$bin" master --listen "127.0.0.1:$port" --admin 127.0.0.1:0 >"$work/master.log" 2>&1 &
    else
        "$mc/bin/mooncake_master" --rpc_port "$port" --metrics_port "$(free_port)" \
            --enable_http_metadata_server=false >"$work/master.log" 2>&1 &
    fi
    # Called as `$(master …)`, a subshell: the pid goes through a file.
    echo $! >>"$work/pids"
    await_port "$port"
    echo "127.0.0.1:$port"
}
# Starts the process a `setup_dummy` store attaches to, of `which`, on master `$2`, listening on loopback port `$3`.
real_client() {
    if [ "$1" = crescent ]; then
        "$bin" node --master "$2" --listen "127.0.0.1:$3" --segment-size 2GiB --memfd >"$work/real.log" 2>&1 &
    else
        "$mc/bin/mooncake_client" --master_server_address="$2" --host=127.0.0.1 --port="$3" \
            --global_segment_size=2147483648 --protocol=tcp --metadata_server=P2PHANDSHAKE >"$work/real.log" 2>&1 &
    fi
    echo $! >>"$work/pids"
    await_port "$3"
}
stop_masters() {
    [ -e "$work/pids" ] && while read -r p; do pids+=("$p"); done <"$work/pids"
    rm -f "$work/pids"
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    pids=()
}

for r in $(seq 1 "$rounds"); do
    # Each round starts with the other store, so neither always runs on a machine the other just warmed.
    order="crescent original"
    [ $((r % 2)) = 0 ] && order="original crescent"
    for which in $order; do
        py=$cr/bin/python
        [ "$which" = original ] && py=$mc/bin/python
        addr=$(master "$which")
        echo "round $r: $which" >&2
        "$py" "$bench" --master "$addr" --seconds "$secs" --threads "$threads" --sizes "$sizes" --json \
            | tail -1 >"$work/$which-$r.json"
        stop_masters
        echo "round $r: $which, setup_dummy" >&2
        addr=$(master "$which")
        port=$(free_port)
        real_client "$which" "$addr" "$port"
        "$py" "$bench" --master "$addr" --dummy "127.0.0.1:$port" --seconds "$secs" --threads "$threads" \
            --sizes "$sizes" --json | tail -1 >"$work/$which-dummy-$r.json"
        stop_masters
        echo "round $r: $which, cold" >&2
        addr=$(master "$which")
        "$py" "$bench" --master "$addr" --segment $((4 << 30)) --cold-count 300 --json | tail -1 >"$work/$which-cold-$r.json"
        stop_masters
    done
    if [[ ",$sizes," == *",4MiB,"* ]]; then
        # Rust: `crescent bench` against a Python process holding the memory, as in bench_store.py.
        addr=$(master crescent)
        mkfifo "$work/hold-$r"
        "$cr/bin/python" "$bench" --hold --master "$addr" --segment $((2 << 30)) <"$work/hold-$r" >"$work/hold-$r.out" &
        pids+=($!)
        exec 3>"$work/hold-$r"
        until grep -q ready "$work/hold-$r.out" 2>/dev/null; do sleep 0.1; done
        # Written over once first, as bench_store.py does, so the timed writes find the pages backed.
        "$bin" bench --master "$addr" --phases write --value-size 4MiB --batch 32 --count 16 >/dev/null
        for b in 1 32; do
            "$bin" bench --master "$addr" --value-size 4MiB --batch "$b" --duration "$secs" \
                --json "$work/rust-$r-$b.json" >/dev/null
        done
        exec 3>&-
        stop_masters
    fi
done

python3 - "$work" "$rounds" <<'EOF'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
med = lambda rs, f: statistics.median(x[f] for x in rs)


def table(kind, title):
    """One table of medians and ratios, from the `{which}{kind}-{round}.json` files."""
    rows = {}
    for which in ("crescent", "original"):
        for r in range(1, rounds + 1):
            for row in json.load(open(f"{work}/{which}{kind}-{r}.json")):
                key = (row["threads"], row["size"], row["op"])
                rows.setdefault(key, {}).setdefault(which, []).append(row)
    print(f"\n{title}")
    print(f"{'threads':>7} {'size':>5} {'op':>15} | {'crescent GB/s':>13} {'original GB/s':>13} | ratio | failed c/o")
    for key in sorted(rows, key=lambda k: (k[0], ["4KiB", "1MiB", "4MiB"].index(k[1]))):
        c, o = rows[key].get("crescent", []), rows[key].get("original", [])
        if not c or not o:
            continue
        cg, og = med(c, "gb_per_s"), med(o, "gb_per_s")
        co, oo = med(c, "ops_per_s"), med(o, "ops_per_s")
        ratio = co / oo if oo else float("inf")
        fails = f"{sum(x['failed'] for x in c)}/{sum(x['failed'] for x in o)}"
        print(f"{key[0]:>7} {key[1]:>5} {key[2]:>15} | {cg:>13.3f} {og:>13.3f} | {ratio:5.2f} | {fails}")
    return rows


rows = table("", "A client process and a memory-holding store process (setup)")
table("-dummy", "setup_dummy: attached to the store process on its host (crescent node --memfd / mooncake_client)")
table("-cold", "Cold: a fresh 4 GiB holder, 300 values each, no write-over first")
rust = {}
for r in range(1, rounds + 1):
    for b in (1, 32):
        try:
            lines = [json.loads(l) for l in open(f"{work}/rust-{r}-{b}.json")]
        except FileNotFoundError:
            continue
        for l in lines:
            rust.setdefault((b, l["phase"]), []).append(l["mib_per_s"] * (1 << 20) / 1e9)
if rust:
    print("\n4 MiB, 1 thread: Python zero-copy calls vs `crescent bench` (Rust), medians")
    pairs = [((1, "write"), "put_from"), ((1, "read"), "get_into"), ((32, "write"), "batch_put_from"),
             ((32, "read"), "batch_get_into")]
    for (b, phase), op in pairs:
        if (b, phase) not in rust or (1, "4MiB", op) not in rows:
            continue
        rg = statistics.median(rust[(b, phase)])
        pg = med(rows[(1, "4MiB", op)]["crescent"], "gb_per_s")
        print(f"  {op:>15}: Python {pg:.3f} GB/s, Rust batch {b} {phase} {rg:.3f} GB/s, Python/Rust {pg / rg:.2f}")
EOF
