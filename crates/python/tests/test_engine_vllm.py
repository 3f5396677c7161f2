"""vLLM's MooncakeStoreConnector, replayed call by call against a real master and store.

Upstream: vllm-project/vllm, vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py at commit
003df2961dd8830c317a61f9745ccd557da9fa06 (keys and block addressing from data.py in the same folder, commit
015cb3c65007c381dda30790b241df685e892773). `VllmMooncakeStoreWorker` below keeps the engine's method names
(`__init__`, `register_kv_caches`, the sending thread's `_handle_request`, the receiving thread's `_handle_request`,
`lookup`, the lookup server's reset, `close`) and makes the same `MooncakeDistributedStore` calls in the same order
with the same arguments (7 positional setup arguments, `batch_is_exist` dedup before
`batch_put_from_multi_buffers(keys, addrs, sizes, replicate_config)`, `batch_get_into_multi_buffers` on load,
`batch_get_replica_desc` for tier logging, `remove_all(force=True)` on reset). The GPU KV cache is a numpy array
in FlashAttention's K/V-first layout (2, num_blocks, block_bytes); no torch.

Run against the original with ENGINE_REPLAY_TARGET=original (see engine_target.py).
"""

import hashlib

import numpy as np
import pytest

# engine_master and engine_trace are fixtures (engine_trace autouse).
from engine_target import (  # noqa: F401
    MiB, engine_master, engine_trace, pattern,
)

MOONCAKE_NO_AVAILABLE_HANDLE = -200  # worker.py: the code the sending thread backs off on


def block_hashes(seed: str, n: int) -> list:
    """Chained block hashes as vLLM makes them (each folds in the previous one); 32-byte digests."""
    out, prev = [], b""
    for i in range(n):
        prev = hashlib.sha256(prev + f"{seed}:{i}".encode()).digest()
        out.append(prev)
    return out


class VllmMooncakeStoreWorker:
    """MooncakeStoreWorker (one KV cache group, tp=pp=pcp=dcp=1) with its sending and receiving threads' store
    calls run inline, in the order the threads make them."""

    def __init__(self, master_addr, *, global_segment_size, local_buffer_size=16 * MiB, preferred_segment=None,
                 model_name="Llama-3-8B", local_hostname="127.0.0.1"):
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig

        self.store = MooncakeDistributedStore()
        # worker.py: setup(local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol,
        # device_name, master_server_address), all positional; anything but 0 raises.
        ret = self.store.setup(
            local_hostname, "P2PHANDSHAKE", global_segment_size, local_buffer_size, "tcp", "", master_addr
        )
        self.setup_ret = ret
        if ret != 0:
            raise RuntimeError("Initialize MooncakeDistributedStore failed.")
        self.store_replicate_config = ReplicateConfig()
        if preferred_segment is not None:
            self.store_replicate_config.preferred_segment = preferred_segment
        # data.py PoolKey.build_prefix for tp_rank 0, pcp 0, dcp 0, pp 0, group 0, no cache_prefix.
        self._key_prefix = f"{model_name}@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0"
        # KVCacheStoreSendingThread's back-off state.
        self._store_pressure_active = False
        self._skip_store_requests: set = set()
        self.register_rets: list = []

    # ---- data.py ChunkedTokenDatabase ----

    def key_for(self, chunk_hash: bytes) -> str:
        return f"{self._key_prefix}@{chunk_hash.hex()}"

    def prepare_values(self, block_ids):
        addrs = [[base + b * blen for base, blen in zip(self.kv_caches_base_addr, self.block_len)] for b in block_ids]
        sizes = [list(self.block_len) for _ in block_ids]
        return addrs, sizes

    # ---- MooncakeStoreWorker.register_kv_caches ----

    def register_kv_caches(self, kv_cache: np.ndarray) -> None:
        base_addr = kv_cache.ctypes.data
        region_len = kv_cache.nbytes
        ret = self.store.register_buffer(base_addr, region_len)
        self.register_rets.append(ret)  # the engine logs a non-zero code and goes on
        num_blocks = kv_cache.shape[1]
        # K/V-first layout: the outer dim's byte stride exceeds a page, so two segments.
        seg_stride = kv_cache.strides[0]
        self.kv_caches_base_addr = [base_addr + i * seg_stride for i in range(kv_cache.shape[0])]
        self.block_len = [seg_stride // num_blocks] * kv_cache.shape[0]

    # ---- KVCacheStoreSendingThread ----

    def _should_skip_request(self, req_id):
        return self._store_pressure_active and req_id in self._skip_store_requests

    def _mark_request_skipped_for_pressure(self, req_id):
        already = req_id in self._skip_store_requests
        self._store_pressure_active = True
        self._skip_store_requests.add(req_id)
        return already

    def _clear_store_pressure(self):
        if not self._store_pressure_active and not self._skip_store_requests:
            return False
        self._store_pressure_active = False
        self._skip_store_requests.clear()
        return True

    def sending_handle_request(self, req_id, hashes, block_ids):
        """KVCacheStoreSendingThread._handle_request: "skipped", "all-exist", or the put's per-key results."""
        if self._should_skip_request(req_id):
            return "skipped"
        keys = [self.key_for(h) for h in hashes]
        exists_states = self.store.batch_is_exist(keys)
        missing = [i for i, e in enumerate(exists_states) if e != 1]
        if not missing:
            return "all-exist"
        keys = [keys[i] for i in missing]
        addrs, sizes = self.prepare_values([block_ids[i] for i in missing])
        res = self.store.batch_put_from_multi_buffers(keys, addrs, sizes, self.store_replicate_config)
        failed = [i for i, v in enumerate(res) if v < 0]
        if failed:
            if MOONCAKE_NO_AVAILABLE_HANDLE in {res[i] for i in failed}:
                self._mark_request_skipped_for_pressure(req_id)
        else:
            self._clear_store_pressure()
        return list(res)

    # ---- KVCacheStoreRecvingThread ----

    def _get_replica_tiers_by_key(self, keys):
        tiers = {k: "unknown" for k in keys}
        descs = self.store.batch_get_replica_desc(keys)
        for k in keys:
            replicas = descs.get(k) if hasattr(descs, "get") else None
            if replicas:
                r = replicas[0]
                if r.is_memory_replica():
                    tiers[k] = "memory"
                elif r.is_disk_replica() or r.is_local_disk_replica():
                    tiers[k] = "disk"
        return tiers

    def recving_handle_request(self, hashes, block_ids, tier_log=True):
        """KVCacheStoreRecvingThread._handle_request (VLLM_MOONCAKE_STORE_TIER_LOG on): (results, tiers,
        block ids marked as load errors)."""
        keys = [self.key_for(h) for h in hashes]
        addrs, sizes = self.prepare_values(block_ids)
        tiers = self._get_replica_tiers_by_key(keys) if tier_log else None
        res = self.store.batch_get_into_multi_buffers(keys, addrs, sizes)
        errors = [b for b, v in zip(block_ids, res) if v < 0]
        return list(res), tiers, errors

    # ---- MooncakeStoreWorker.lookup (block_size == hash_block_size, one namespace) ----

    def lookup(self, num_tokens, hashes, block_size):
        token_len = num_tokens // block_size * block_size
        if not hashes or token_len <= 0:
            return 0
        n = min(len(hashes), -(-token_len // block_size))
        candidate_keys = [self.key_for(h) for h in hashes[:n]]
        res = self.store.batch_is_exist(candidate_keys)
        hit_blocks = 0
        for r in res:
            if r != 1:
                break
            hit_blocks += 1
        hit_length = hit_blocks * block_size
        if hit_length >= num_tokens:  # the last token is recomputed for sampling
            hit_length = (num_tokens - 1) // block_size * block_size
        return hit_length

    # ---- LookupKeyServer RESET_MSG, MooncakeStoreWorker.close ----

    def reset(self):
        return self.store.remove_all(force=True)

    def close(self):
        store, self.store = self.store, None
        return store.close()


BLOCK_SIZE = 16  # tokens per block
NUM_BLOCKS = 8
BLOCK_BYTES = 64 * 1024  # per K (and per V) block


def kv_cache(seed=None):
    """(2, NUM_BLOCKS, BLOCK_BYTES) uint8: K plane then V plane; random when seeded, zeros otherwise."""
    if seed is None:
        return np.zeros((2, NUM_BLOCKS, BLOCK_BYTES), dtype=np.uint8)
    return pattern(2 * NUM_BLOCKS * BLOCK_BYTES, seed).reshape(2, NUM_BLOCKS, BLOCK_BYTES)


def test_vllm_worker_store_lookup_load_reset_close(engine_master):
    """worker.py: MooncakeStoreWorker.__init__ (7-argument setup, return checked), register_kv_caches
    (register_buffer of the whole cache), KVCacheStoreSendingThread._handle_request (batch_is_exist dedup, then
    batch_put_from_multi_buffers with the ReplicateConfig), MooncakeStoreWorker.lookup (batch_is_exist),
    KVCacheStoreRecvingThread._handle_request (batch_get_replica_desc tier log, batch_get_into_multi_buffers),
    LookupKeyServer RESET_MSG (remove_all(force=True)) and close(): a producer stores a 4-block prompt, a consumer
    on the same master finds and loads it into other blocks, byte for byte."""
    producer = VllmMooncakeStoreWorker(engine_master.addr, global_segment_size=64 * MiB)
    consumer = VllmMooncakeStoreWorker(engine_master.addr, global_segment_size=64 * MiB)
    try:
        assert producer.setup_ret == 0 and consumer.setup_ret == 0
        src, dst = kv_cache(seed=1), kv_cache()
        producer.register_kv_caches(src)
        consumer.register_kv_caches(dst)
        assert producer.register_rets == [0] and consumer.register_rets == [0]

        hashes = block_hashes("prompt-a", 4)
        assert consumer.lookup(4 * BLOCK_SIZE + 5, hashes, BLOCK_SIZE) == 0, "nothing stored yet"
        res = producer.sending_handle_request("req-a", hashes, block_ids=[1, 2, 3, 4])
        assert res == [0, 0, 0, 0]
        # The same request saved again: every key exists, so no put.
        assert producer.sending_handle_request("req-a", hashes, block_ids=[1, 2, 3, 4]) == "all-exist"
        # A partly stored prompt: only the missing suffix is put.
        longer = hashes + block_hashes("prompt-a-tail", 1)
        assert producer.store.batch_is_exist([producer.key_for(h) for h in longer]) == [1, 1, 1, 1, 0]
        assert producer.sending_handle_request("req-a", longer, block_ids=[1, 2, 3, 4, 5]) == [0]

        # Scheduler-side lookup: 5 full blocks of 80 tokens, all present, the last one recomputed.
        assert consumer.lookup(5 * BLOCK_SIZE, longer, BLOCK_SIZE) == 4 * BLOCK_SIZE
        assert consumer.lookup(5 * BLOCK_SIZE + 3, longer, BLOCK_SIZE) == 5 * BLOCK_SIZE

        res, tiers, errors = consumer.recving_handle_request(longer, block_ids=[7, 6, 5, 4, 3])
        assert res == [2 * BLOCK_BYTES] * 5, "bytes read per key: K block + V block"
        assert errors == []
        assert set(tiers.values()) == {"memory"}
        for src_block, dst_block in zip([1, 2, 3, 4, 5], [7, 6, 5, 4, 3]):
            assert np.array_equal(dst[:, dst_block], src[:, src_block]), (src_block, dst_block)
        assert not dst[:, [0, 1, 2]].any(), "blocks not loaded stay untouched"

        # A load of a key nobody stored marks that block as a load error.
        res, _tiers, errors = consumer.recving_handle_request(block_hashes("never-stored", 1), block_ids=[0])
        assert len(res) == 1 and res[0] < 0
        assert errors == [0]

        # RESET_MSG: the engine only catches exceptions; afterwards nothing is found.
        removed = producer.reset()
        assert removed >= 5
        assert consumer.lookup(5 * BLOCK_SIZE + 3, longer, BLOCK_SIZE) == 0
    finally:
        for w in (consumer, producer):
            if w.store is not None:
                w.close()


def test_vllm_no_available_handle_backs_off_until_a_batch_succeeds(engine_master):
    """worker.py KVCacheStoreSendingThread._handle_request: a put batch with -200 (NO_AVAILABLE_HANDLE) among its
    failures marks the request skipped while the pressure lasts (its next batches make no store call); the next
    successful batch of any request clears the pressure and the skipped request stores again. The pressure is
    another client's hard-pinned objects filling every segment (nothing is evictable)."""
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    worker = VllmMooncakeStoreWorker(engine_master.addr, global_segment_size=16 * MiB)
    filler = MooncakeDistributedStore()
    assert filler.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", engine_master.addr) == 0
    pinned_keys = []
    try:
        src = kv_cache(seed=2)
        worker.register_kv_caches(src)
        assert worker.register_rets == [0]
        pinned = ReplicateConfig()
        pinned.with_hard_pin = True
        for i in range(80):
            rc = filler.put(f"vllm-pressure-{i}", bytes(MiB), pinned)
            if rc != 0:
                assert rc == MOONCAKE_NO_AVAILABLE_HANDLE, rc
                break
            pinned_keys.append(f"vllm-pressure-{i}")
        else:
            pytest.fail("80 MiB of hard-pinned objects fit in 32 MiB of segments")

        ha, hb = block_hashes("pressure-a", 2), block_hashes("pressure-b", 2)
        res = worker.sending_handle_request("req-a", ha, block_ids=[0, 1])
        assert isinstance(res, list) and MOONCAKE_NO_AVAILABLE_HANDLE in res, res
        assert worker._store_pressure_active and "req-a" in worker._skip_store_requests
        assert worker.sending_handle_request("req-a", ha, block_ids=[0, 1]) == "skipped"

        # The pressure goes away (the other client removes its objects); another request's batch succeeds.
        assert [filler.remove(k) for k in pinned_keys] == [0] * len(pinned_keys)
        pinned_keys.clear()
        assert worker.sending_handle_request("req-b", hb, block_ids=[2, 3]) == [0, 0]
        assert not worker._store_pressure_active and not worker._skip_store_requests
        # req-a stores again; the keys that had made it before (if any) are deduplicated.
        res = worker.sending_handle_request("req-a", ha, block_ids=[0, 1])
        assert res == "all-exist" or (isinstance(res, list) and all(v == 0 for v in res)), res

        dst = kv_cache()
        reader = VllmMooncakeStoreWorker(engine_master.addr, global_segment_size=16 * MiB)
        try:
            reader.register_kv_caches(dst)
            res, _tiers, errors = reader.recving_handle_request(ha + hb, block_ids=[4, 5, 6, 7])
            # The original's eviction, armed by the failed allocations, may still evict a just-stored unpinned
            # key once the pressure is gone (seen: one of req-b's keys gone, -704): the engine marks that block as
            # a load error and recomputes it. Every key read is exact; every miss is reported.
            OBJECT_NOT_FOUND = -704
            assert all(v in (2 * BLOCK_BYTES, OBJECT_NOT_FOUND) for v in res), res
            assert errors == [d for d, v in zip([4, 5, 6, 7], res) if v < 0]
            assert res.count(OBJECT_NOT_FOUND) <= 1, res
            for s, d, v in zip([0, 1, 2, 3], [4, 5, 6, 7], res):
                if v > 0:
                    assert np.array_equal(dst[:, d], src[:, s])
        finally:
            reader.close()
    finally:
        for k in pinned_keys:
            filler.remove(k)
        worker.reset()
        worker.close()
        filler.close()


def test_vllm_standalone_store_with_preferred_segment(engine_master):
    """worker.py MooncakeStoreConfig mode "standalone-store": the rank mounts no memory (global_segment_size 0)
    and sets ReplicateConfig.preferred_segment to the owner's segment (rdma_utils.get_configured_preferred_segment,
    configured here as the owner's get_hostname(), as LMCache's prefer_local_alloc does). With a second segment
    mounted elsewhere, all eight puts still land on the owner, and a load reads them back."""
    from mooncake.store import MooncakeDistributedStore

    owner = MooncakeDistributedStore()  # the external `mooncake_client` that owns the pool
    assert owner.setup("127.0.0.1", "P2PHANDSHAKE", 64 * MiB, 16 * MiB, "tcp", "", engine_master.addr) == 0
    owner_segment = owner.get_hostname()
    worker = VllmMooncakeStoreWorker(engine_master.addr, global_segment_size=0, preferred_segment=owner_segment)
    other = None
    try:
        # The owner's replica endpoint, learnt while its segment is the only one.
        assert worker.store.put("vllm-probe", b"p" * 100) == 0
        (probe,) = worker.store.batch_get_replica_desc(["vllm-probe"])["vllm-probe"]
        owner_endpoint = probe.get_memory_descriptor().buffer_descriptor.transport_endpoint
        other = MooncakeDistributedStore()
        assert other.setup("127.0.0.1", "P2PHANDSHAKE", 64 * MiB, 16 * MiB, "tcp", "", engine_master.addr) == 0

        assert worker.store_replicate_config.preferred_segment == owner_segment
        src, dst = kv_cache(seed=3), kv_cache()
        worker.register_kv_caches(src)
        hashes = block_hashes("standalone", NUM_BLOCKS)
        assert worker.sending_handle_request("req-s", hashes, block_ids=list(range(NUM_BLOCKS))) == [0] * NUM_BLOCKS
        descs = worker.store.batch_get_replica_desc([worker.key_for(h) for h in hashes])
        endpoints = {r.get_memory_descriptor().buffer_descriptor.transport_endpoint
                     for replicas in descs.values() for r in replicas}
        assert len(descs) == NUM_BLOCKS
        assert endpoints == {owner_endpoint}, (endpoints, owner_endpoint, owner_segment)
        worker.register_kv_caches(dst)  # a second region of the same worker
        assert worker.register_rets == [0, 0]
        res, tiers, errors = worker.recving_handle_request(hashes, block_ids=list(reversed(range(NUM_BLOCKS))))
        assert res == [2 * BLOCK_BYTES] * NUM_BLOCKS and errors == [] and set(tiers.values()) == {"memory"}
        for s, d in zip(range(NUM_BLOCKS), reversed(range(NUM_BLOCKS))):
            assert np.array_equal(dst[:, d], src[:, s])
    finally:
        worker.reset()
        worker.close()
        if other is not None:
            other.close()
        owner.close()


def test_vllm_load_into_blocks_of_another_size_is_a_load_error(engine_master):
    """worker.py KVCacheStoreRecvingThread._handle_request: a key whose object does not match the consumer's
    block layout (here the consumer's blocks are larger or smaller than the producer's - e.g. another KV dtype
    under the same key namespace) must come back negative from batch_get_into_multi_buffers, so that the block is
    reported as a load error and recomputed, not half-filled. The original answers -800 for larger buffers and
    -600 for smaller ones."""
    producer = VllmMooncakeStoreWorker(engine_master.addr, global_segment_size=64 * MiB)
    consumer = VllmMooncakeStoreWorker(engine_master.addr, global_segment_size=64 * MiB)
    try:
        src = kv_cache(seed=4)
        producer.register_kv_caches(src)
        hashes = block_hashes("layout", 2)
        assert producer.sending_handle_request("req-l", hashes, block_ids=[0, 1]) == [0, 0]
        for factor in (2, 0.5):
            dst = np.zeros((2, NUM_BLOCKS, int(BLOCK_BYTES * factor)), dtype=np.uint8)
            consumer.register_kv_caches(dst)
            res, _tiers, errors = consumer.recving_handle_request(hashes, block_ids=[2, 3], tier_log=False)
            assert all(v < 0 for v in res), (factor, res)
            assert errors == [2, 3]
            consumer.store.unregister_buffer(dst.ctypes.data)
    finally:
        producer.reset()
        consumer.close()
        producer.close()
