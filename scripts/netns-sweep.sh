#!/usr/bin/env bash
# Throughput against client count for both systems (issue 39): scripts/netns-cluster.sh with Python clients
# (CLIENT=python, so Crescent and the original run the same client code) for each count, Crescent and the original
# alternating, then a plot of aggregate MiB/s per phase against clients (docs/img/netns-throughput.png; matplotlib
# is installed into target/bench-venv-plot when missing). Root, like the script it runs.
#
#   scripts/netns-sweep.sh [SECONDS_PER_PHASE] [NODES] [SEGMENT] [CLIENT_COUNTS]
#   defaults:               5                   16      256MiB    8,16,32,64
set -euo pipefail
secs=${1:-5}
nodes=${2:-16}
segment=${3:-256MiB}
counts=${4:-8,16,32,64}
cd "$(dirname "$0")/.."
out=target/netns-sweep
mkdir -p "$out" docs/img
for c in ${counts//,/ }; do
    for system in crescent original; do
        echo "== $system, $c clients" >&2
        SYSTEM=$system CLIENT=python CLIENT_NS=$((c < 8 ? c : 8)) scripts/netns-cluster.sh "$secs" "$nodes" "$c" "$segment" \
            >"$out/$system-$c.txt" 2>"$out/$system-$c.err"
    done
done
plot=target/bench-venv-plot
[ -x "$plot/bin/python" ] || python3 -m venv "$plot"
"$plot/bin/python" -c "import matplotlib" 2>/dev/null || "$plot/bin/pip" install -q matplotlib
"$plot/bin/python" - "$out" "$counts" docs/img/netns-throughput.png <<'PY'
import re, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out, counts, png = sys.argv[1], [int(c) for c in sys.argv[2].split(",")], sys.argv[3]
rows = {}  # (system, values, phase) -> [(clients, MiB/s)]
for system in ("crescent", "original"):
    for c in counts:
        for line in open(f"{out}/{system}-{c}.txt"):
            m = re.match(r"\| (64 KiB|1 MiB) \| (write|read) \| \d+ \| (\d+) \|", line)
            if m:
                rows.setdefault((system, m[1], m[2]), []).append((c, int(m[3])))
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
for ax, values in zip(axes, ("64 KiB", "1 MiB")):
    for (system, v, phase), pts in sorted(rows.items()):
        if v != values:
            continue
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o", linestyle="-" if system == "crescent" else "--", label=f"{system} {phase}")
    ax.set_title(f"{values} values, 16 nodes in network namespaces")
    ax.set_xlabel("client processes (Python, put_from / get_into)")
    ax.set_ylabel("MiB/s, all clients")
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(png, dpi=110)
print(f"wrote {png}")
for k, pts in sorted(rows.items()):
    print(*k, pts)
PY
