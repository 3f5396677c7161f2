#!/usr/bin/env python3
"""The disk-tier workload of scripts/bench-ssd.sh, run through the original (Mooncake's wheel,
mooncake-transfer-engine-non-cuda, over TCP): a master (`mooncake_master`) and one Python client that mounts MEM of
memory (its `global_segment_size`) and writes a working set of KEYS values, then GETS Zipf-distributed gets from
CONC threads; `--mode mem-only` without offload, `--mode ssd` with its SSD offload (`--enable_offload
--offload_on_evict` on the master, `enable_ssd_offload` and a path on the client). Appends one JSON line to --out.
One mode per process: a second store set up in the same process finds the first one's segment still registered.

A put the original refuses for want of memory (NO_AVAILABLE_HANDLE, -200: it does not retry a put once eviction
or offload has made room) is retried here every 50 ms for up to 60 s, and the retries are reported, so both
stores hold the same working set when the gets start.
"""
import argparse, bisect, json, os, random, subprocess, sys, threading, time

p = argparse.ArgumentParser()
p.add_argument("--venv", required=True)
p.add_argument("--mem-mib", type=int, default=256)
p.add_argument("--value-mib", type=int, default=1)
p.add_argument("--keys", type=int, default=768)
p.add_argument("--gets", type=int, default=3000)
p.add_argument("--zipf", type=float, default=0.99)
p.add_argument("--conc", type=int, default=4)
p.add_argument("--ssd-dir", required=True)
p.add_argument("--out", required=True)
p.add_argument("--port", type=int, default=50171)
p.add_argument("--mode", choices=["mem-only", "ssd"], required=True)
a = p.parse_args()
a.ssd_dir = os.path.abspath(a.ssd_dir)  # the original refuses a relative storage path

from mooncake.store import MooncakeDistributedStore  # noqa: E402


class Zipf:
    """Rank r with weight 1/(r+1)^s by inverse CDF, ranks mapped to keys by a seeded shuffle."""

    def __init__(self, n, s, seed):
        w = [1.0 / (r + 1) ** s for r in range(n)]
        total, acc, self.cdf = sum(w), 0.0, []
        for x in w:
            acc += x
            self.cdf.append(acc / total)
        self.keys = list(range(n))
        random.Random(seed).shuffle(self.keys)

    def sample(self, rng):
        return self.keys[min(bisect.bisect_right(self.cdf, rng.random()), len(self.cdf) - 1)]


def run(name, offload):
    master_args = [os.path.join(a.venv, "bin", "mooncake_master"), f"--rpc_port={a.port}",
                   f"--metrics_port={a.port + 1}", f"--http_metadata_server_port={a.port + 2}"]
    if offload:
        master_args += ["--enable_offload=true", "--offload_on_evict=true"]
    log = open(os.path.join(os.path.dirname(a.out), f"mooncake-master-{name}.log"), "w")
    master = subprocess.Popen(master_args, stdout=log, stderr=subprocess.STDOUT)
    try:
        time.sleep(2)
        if offload:
            # Buckets of 16 MiB / 16 keys (the default 256 MiB bucket would hold a whole memory tier back),
            # a heartbeat a second (default 10 s).
            os.environ.update({
                "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": a.ssd_dir,
                "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES": str(16 << 20),
                "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT": "16",
                "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": "1",
            })
        s = MooncakeDistributedStore()
        mem = a.mem_mib << 20
        rc = s.setup("127.0.0.1", "P2PHANDSHAKE", mem, 64 << 20, "tcp", "", f"127.0.0.1:{a.port}", None,
                     offload, a.ssd_dir if offload else "")
        if rc != 0:
            raise SystemExit(f"setup returned {rc}")
        size = a.value_mib << 20
        base = bytearray(random.Random(7).randbytes(size))
        retries, failed = 0, 0
        t = time.time()
        for k in range(a.keys):
            base[:8] = k.to_bytes(8, "little")
            deadline = time.time() + 60
            while True:
                rc = s.put(f"bench-ssd-{k}", bytes(base))
                if rc == 0:
                    break
                if rc != -200 or time.time() > deadline:
                    failed += 1
                    break
                retries += 1
                time.sleep(0.05)
        write_s = time.time() - t
        if offload:
            time.sleep(3)  # let the last heartbeats offload what eviction deferred
        z = Zipf(a.keys, a.zipf, 0x5EED21BF)
        hits, wrong, lock = [0], [0], threading.Lock()
        per = [a.gets // a.conc + (1 if i < a.gets % a.conc else 0) for i in range(a.conc)]

        def worker(i):
            rng, h, bad = random.Random(i + 1), 0, 0
            for _ in range(per[i]):
                k = z.sample(rng)
                v = s.get(f"bench-ssd-{k}")
                if len(v) == size:
                    if int.from_bytes(v[:8], "little") == k:
                        h += 1
                    else:
                        bad += 1
            with lock:
                hits[0] += h
                wrong[0] += bad

        t = time.time()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.conc)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        read_s = time.time() - t
        on_disk = sum(os.path.getsize(os.path.join(a.ssd_dir, f)) for f in os.listdir(a.ssd_dir)
                      if f.endswith(".bucket")) if offload else 0
        r = {"run": name, "keys": a.keys, "value_size": size, "gets": a.gets, "hits": hits[0], "wrong": wrong[0],
             "gets_per_s": a.gets / read_s, "hit_mib_per_s": hits[0] * a.value_mib / read_s,
             "write_mib_per_s": (a.keys - failed) * a.value_mib / write_s, "put_retries": retries,
             "puts_failed": failed, "disk_bucket_bytes": on_disk,
             "notes": f"{retries} put retries on -200, {failed} puts failed, {wrong[0]} wrong values, "
                      f"{on_disk >> 20} MiB in buckets"}
        print(json.dumps(r), flush=True)
        with open(a.out, "a") as f:
            f.write(json.dumps(r) + "\n")
        s.close()
    finally:
        master.terminate()
        master.wait()


if a.mode == "ssd":
    for f in os.listdir(a.ssd_dir):
        os.remove(os.path.join(a.ssd_dir, f))
run(a.mode, a.mode == "ssd")
