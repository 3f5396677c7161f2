#!/usr/bin/env python3
"""One workload against whichever ``mooncake.store`` is installed (Crescent's or the original wheel), so the same
script measures both: run it once in each virtual environment, each against its own master.

    python bench_store.py --master 127.0.0.1:50051 [--seconds 2] [--segment 2GiB]

The memory is held by a separate process (this script with ``--hold``, started by it), so every byte crosses
the data plane; the measuring process contributes nothing (``global_segment_size=0``). Rows: put/get and
put_from/get_into of 4 KiB, 1 MiB and 4 MiB values one at a time, batch_put_from/batch_get_into of 32 keys, at 1
and 8 threads. Prints one line per row (successful ops/s and GB/s; failed calls are counted apart, never as
throughput) and, with ``--json``, the rows as JSON. Before the rows the holder's memory is written over once
(``--cold`` skips it), so both stores are measured warm: neither pays for the kernel backing fresh pages.

``--dummy HOST:PORT``: the measuring store attaches (``setup_dummy``) to a store process already running on this
host there (the original's ``mooncake_client``; Crescent's ``crescent node --memfd``) instead of a holder this
script starts; its buffers come from ``alloc_from_mem_pool`` (the original's attached store needs shared memory).

``--cold-count N``: instead of the rows, what a user meets first: on a fresh holder, with no write-over, ``put``
then ``put_from`` of N values of 1 MiB, then of 4 MiB, each row timed alone (``cold_put``, ``cold_put_from``),
then ``get``/``get_into`` of what they wrote (``cold_get``, ``cold_get_into``).
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import threading
import time

from mooncake.store import MooncakeDistributedStore

KiB, MiB = 1 << 10, 1 << 20
SIZES = [("4KiB", 4 * KiB), ("1MiB", MiB), ("4MiB", 4 * MiB)]
BATCH = 32


def setup(store, master, segment, local):
    rc = store.setup("localhost", "P2PHANDSHAKE", segment, local, "tcp", "", master)
    if rc != 0:
        sys.exit(f"setup failed: {rc}")


def hold(master, segment):
    """The memory-holding process: contributes `segment` bytes until its stdin closes."""
    store = MooncakeDistributedStore()
    setup(store, master, segment, 16 * MiB)
    print("ready", flush=True)
    sys.stdin.read()
    store.close()


def warm(store, segment, buffers):
    """Writes the holding process's memory over once (then removes it all), so no row pays for first-touching
    pages the kernel backs lazily: every row measures a warm cache, whichever store is installed."""
    size = 4 * MiB
    buf = buffers.new(size * BATCH)
    ptrs = [buf + j * size for j in range(BATCH)]
    for g in range(int(segment * 0.8) // (size * BATCH)):
        store.batch_put_from([f"warm-{os.getpid()}-{g}-{j}" for j in range(BATCH)], ptrs, [size] * BATCH)
    store.remove_all(force=True)
    buffers.drop(buf)


class Buffers:
    """Registered buffers of the measuring store: ctypes memory, or with ``--dummy`` memory from its pool."""

    def __init__(self, store, dummy):
        self.store, self.dummy, self.keep = store, dummy, []

    def new(self, size):
        """A registered buffer of `size` bytes; its address."""
        if self.dummy:
            addr = self.store.alloc_from_mem_pool(size)
            assert addr, "alloc_from_mem_pool failed"
        else:
            buf = ctypes.create_string_buffer(size)
            self.keep.append(buf)
            addr = ctypes.addressof(buf)
        assert self.store.register_buffer(addr, size) == 0
        return addr

    def drop(self, addr):
        self.store.unregister_buffer(addr)


def cold_rows(store, buffers, count):
    """put and put_from of `count` values of 1 MiB, then of 4 MiB, into memory nothing has touched yet, then the
    reads of them: one row each, one thread."""
    rows = []
    for name, size in [("1MiB", MiB), ("4MiB", 4 * MiB)]:
        value = os.urandom(size)
        addr = buffers.new(size)
        ctypes.memmove(addr, value, size)
        tag = f"cold-{os.getpid()}-{name}"
        ops = (
            ("cold_put", lambda i: store.put(f"{tag}-p-{i}", value) == 0),
            ("cold_put_from", lambda i: store.put_from(f"{tag}-z-{i}", addr, size) == 0),
            ("cold_get", lambda i: len(store.get(f"{tag}-p-{i}")) == size),
            ("cold_get_into", lambda i: store.get_into(f"{tag}-z-{i}", addr, size) == size),
        )
        for op_name, op in ops:
            start = time.perf_counter()
            failed = sum(0 if op(i) else 1 for i in range(count))
            took = time.perf_counter() - start
            ok = count - failed
            row = {"op": op_name, "size": name, "threads": 1, "ops_per_s": ok / took, "gb_per_s": ok * size / took / 1e9,
                   "failed": failed}
            rows.append(row)
            print(f"{op_name:>15} {name:>5} x1: {row['ops_per_s']:>10.0f} ops/s {row['gb_per_s']:6.2f} GB/s"
                  + (f"  ({failed} failed)" if failed else ""), flush=True)
        buffers.drop(addr)
    return rows


def timed(threads, seconds, op):
    """Runs op(thread, i) (True: it succeeded) on `threads` threads for `seconds`; returns the operations done per
    thread, how many failed, and the time taken."""
    counts, failed = [0] * threads, [0] * threads
    stop = time.perf_counter() + seconds

    def run(t):
        i = 0
        while time.perf_counter() < stop:
            if not op(t, i):
                failed[t] += 1
            i += 1
        counts[t] = i

    ths = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    start = time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return counts, sum(failed), time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--segment", type=int, default=2 << 30, help="bytes the holding process contributes")
    ap.add_argument("--threads", default="1,8")
    ap.add_argument("--sizes", default=",".join(n for n, _ in SIZES), help="value sizes to run, of " +
                    ", ".join(n for n, _ in SIZES))
    ap.add_argument("--cold", action="store_true", help="skip writing the holder's memory over once before the rows")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dummy", metavar="HOST:PORT", help="attach to the store process on this host at HOST:PORT")
    ap.add_argument("--cold-count", type=int, default=0, help="run the cold rows with this many values each")
    ap.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.hold:
        return hold(a.master, a.segment)
    holder = None
    store = MooncakeDistributedStore()
    if a.dummy:
        rc = store.setup_dummy(a.segment, 64 * MiB, a.dummy)
        if rc != 0:
            sys.exit(f"setup_dummy failed: {rc}")
    else:
        holder = subprocess.Popen([sys.executable, __file__, "--hold", "--master", a.master, "--segment",
                                   str(a.segment)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if holder.stdout.readline().strip() != "ready":
            sys.exit("the holding process did not start")
        setup(store, a.master, 0, 64 * MiB)
    buffers = Buffers(store, bool(a.dummy))
    if not a.cold and not a.cold_count:
        warm(store, a.segment, buffers)
    threads_list = [] if a.cold_count else [int(t) for t in a.threads.split(",")]
    rows = cold_rows(store, buffers, a.cold_count) if a.cold_count else []
    try:
        for threads in threads_list:
            for name, size in [(n, s) for n, s in SIZES if n in a.sizes.split(",")]:
                # Keys per thread: the values fit a quarter of the segment, cycled over.
                per_thread = max(1, min(256, a.segment // 4 // size // threads))
                value = os.urandom(size)
                bufs = [buffers.new(size * BATCH) for _ in range(threads)]
                for b in bufs:
                    ctypes.memmove(b, value, size)
                tag = f"{os.getpid()}-{threads}-{name}"

                # Puts write fresh keys (a put of an existing key moves no bytes); gets read the last
                # `per_thread` keys of the put before them (the newest, never the evicted).
                written = {}

                def k(t, i, kind):
                    return f"{tag}-{kind}-{t}-{i}"

                def recent(t, i, kind):
                    n = written[kind][t]
                    return k(t, max(0, n - per_thread) + i % max(1, min(n, per_thread)), kind)

                def put(t, i):
                    return store.put(k(t, i, "p"), value) == 0

                def get(t, i):
                    return len(store.get(recent(t, i, "p"))) == size

                def put_from(t, i):
                    return store.put_from(k(t, i, "z"), bufs[t], size) == 0

                def get_into(t, i):
                    return store.get_into(recent(t, i, "z"), bufs[t], size) == size

                def ptrs(t):
                    return [bufs[t] + j * size for j in range(BATCH)]

                def batch_put(t, i):
                    keys = [k(t, i * BATCH + j, "b") for j in range(BATCH)]
                    return all(r == 0 for r in store.batch_put_from(keys, ptrs(t), [size] * BATCH))

                def batch_get(t, i):
                    n = written["b"][t]
                    groups = max(1, min(n, max(1, per_thread // BATCH)))
                    g = max(0, n - groups) + i % groups
                    keys = [k(t, g * BATCH + j, "b") for j in range(BATCH)]
                    return all(r == size for r in store.batch_get_into(keys, ptrs(t), [size] * BATCH))

                for op_name, op, items in (("put", put, 1), ("get", get, 1), ("put_from", put_from, 1),
                                           ("get_into", get_into, 1), ("batch_put_from", batch_put, BATCH),
                                           ("batch_get_into", batch_get, BATCH)):
                    counts, failed, took = timed(threads, a.seconds, op)
                    ops = sum(counts) - failed
                    written[{"put": "p", "put_from": "z", "batch_put_from": "b"}.get(op_name, "-")] = counts
                    row = {"op": op_name, "size": name, "threads": threads, "ops_per_s": ops * items / took,
                           "gb_per_s": ops * items * size / took / 1e9, "failed": failed}
                    rows.append(row)
                    print(f"{op_name:>15} {name:>5} x{threads}: {row['ops_per_s']:>10.0f} ops/s "
                          f"{row['gb_per_s']:6.2f} GB/s" + (f"  ({failed} failed)" if failed else ""), flush=True)
                store.remove_all(force=True)
                for b in bufs:
                    buffers.drop(b)
    finally:
        store.close()
        if holder is not None:
            holder.stdin.close()
            holder.wait(timeout=60)
    if a.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
