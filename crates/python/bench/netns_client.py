#!/usr/bin/env python3
"""One client process of ``scripts/netns-cluster.sh``'s Python mode: the same code against whichever
``mooncake.store`` is installed (Crescent's or the original wheel), so the namespace cluster measures both systems
through what an engine calls.

    python netns_client.py --master 10.201.0.1:50051 --host 10.201.2.1 --size 65536 --keys 100 \\
        --seconds 5 --run small-1 --phases write,read --json out.json

The process joins as a client only (``global_segment_size=0``: the storage nodes hold the memory) from its own
address ``--host``, registers one buffer, and runs each phase for ``--seconds``: ``write`` puts its keys
(``RUN-0`` … ``RUN-{keys-1}``, each once: the original moves no byte for a key it already holds) with
``put_from``, ``read`` reads those it wrote with ``get_into``,
one call at a time. Each phase appends one JSON line in ``crescent bench --json``'s terms: requests, req_per_s,
mib_per_s, p50_us, p99_us, errors (failed calls are counted apart, never as throughput); a write row also names its
run and how many keys it wrote. ``--probe SECONDS`` and ``--check ROWS`` serve the script's node-kill phase: a put
every 0.1 s with its outcome, and a read-back of what the rows say was written.
"""

import argparse
import json
import sys
import time

import numpy as np
from mooncake.store import MooncakeDistributedStore


def percentile(sorted_us, p):
    return sorted_us[min(len(sorted_us) - 1, int((len(sorted_us) - 1) * p))] if sorted_us else 0


def run_phase(name, seconds, op, keys, size, once=False):
    """Calls op(i) for `seconds` over keys 0..keys-1, cycling (or, with `once`, until each was called once)."""
    lat, errors, i = [], 0, 0
    stop = time.perf_counter() + seconds
    start = time.perf_counter()
    while not (once and i >= keys):
        t = time.perf_counter()
        if t >= stop:
            break
        ok = op(i % keys)
        done = time.perf_counter()
        if ok:
            lat.append(int((done - t) * 1e6))
        else:
            errors += 1
        i += 1
    took = time.perf_counter() - start
    lat.sort()
    return {
        "phase": name,
        "requests": len(lat),
        "req_per_s": len(lat) / took,
        "mib_per_s": len(lat) * size / took / (1 << 20),
        "p50_us": percentile(lat, 0.50),
        "p99_us": percentile(lat, 0.99),
        "errors": errors,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--master", required=True)
    ap.add_argument("--host", required=True, help="this process's own address (the nodes connect back to it)")
    ap.add_argument("--size", type=int, required=True, help="value bytes")
    ap.add_argument("--keys", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--run", required=True, help="key prefix")
    ap.add_argument("--phases", default="write,read")
    ap.add_argument("--json", required=True, help="file to append one line per phase to")
    ap.add_argument("--keys-from", metavar="ROWS",
                    help="read phases: the keys the write row in this file says were written, not --keys")
    ap.add_argument("--probe", type=float, metavar="SECONDS",
                    help="instead of phases: a put every 0.1 s for SECONDS, one JSON line per put (t, ok, ms)")
    ap.add_argument("--check", metavar="ROWS",
                    help="instead of phases: get_into every key another run's JSON rows say it wrote "
                         "(ROWS: files, comma-separated); appends one line: checked, missing")
    a = ap.parse_args()

    store = MooncakeDistributedStore()
    rc = store.setup(a.host, "P2PHANDSHAKE", 0, a.size + (16 << 20), "tcp", "", a.master)
    if rc != 0:
        sys.exit(f"setup failed: {rc}")
    buf = np.full(a.size, 7, dtype=np.uint8)
    ptr = buf.ctypes.data
    if store.register_buffer(ptr, a.size) != 0:
        sys.exit("register_buffer failed")
    if a.probe is not None:
        probe(store, a, ptr)
    elif a.check is not None:
        check(store, a, ptr)
    else:
        phases(store, a, ptr)
    store.unregister_buffer(ptr)
    store.close()


def probe(store, a, ptr):
    """Write availability over time: one put of a fresh key every 0.1 s (a failed one is retried by the next)."""
    with open(a.json, "a") as out:
        stop, i = time.time() + a.probe, 0
        while time.time() < stop:
            t = time.time()
            ok = store.put_from(f"{a.run}-{i}", ptr, a.size) == 0
            out.write(json.dumps({"t": t, "ok": ok, "ms": (time.time() - t) * 1e3}) + "\n")
            out.flush()
            i += 1
            time.sleep(max(0.0, t + 0.1 - time.time()))


def check(store, a, ptr):
    """Reads back what other clients wrote (their rows' `written` and `run`): how many are missing now."""
    checked = missing = 0
    for path in a.check.split(","):
        for line in open(path):
            row = json.loads(line)
            if row.get("phase") != "write":
                continue
            for i in range(row["written"]):
                checked += 1
                if store.get_into(f"{row['run']}-{i}", ptr, a.size) != a.size:
                    missing += 1
    with open(a.json, "a") as out:
        out.write(json.dumps({"checked": checked, "missing": missing}) + "\n")


def phases(store, a, ptr):
    written = [0]
    if a.keys_from:
        written[0] = max(json.loads(l).get("written", 0) for l in open(a.keys_from))

    def put(i):
        ok = store.put_from(f"{a.run}-{i}", ptr, a.size) == 0
        if ok:
            written[0] = max(written[0], i + 1)
        return ok

    def get(i):
        return store.get_into(f"{a.run}-{i}", ptr, a.size) == a.size

    with open(a.json, "a") as out:
        for phase in a.phases.split(","):
            if phase == "write":
                # Each key once: the original answers a put of a key it holds with success and moves no byte
                # (its PutStart refuses an existing key), so rewriting keys would measure nothing.
                row = run_phase("write", a.seconds, put, a.keys, a.size, once=True)
                row.update(run=a.run, written=written[0])
            elif phase == "read":
                row = run_phase("read", a.seconds, get, max(1, written[0] or a.keys), a.size)
            else:
                sys.exit(f"unknown phase {phase!r}")
            out.write(json.dumps(row) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
