"""LMCache's Mooncake store connector, replayed call by call against a real master and store.

Upstream: LMCache/LMCache, lmcache/v1/storage_backend/connector/mooncakestore_connector.py at commit
01aed921caf3d2597bbf1b6570d61a7b1a70e3a9 (RemoteMetadata's 28-byte "iiiiiii" header from lmcache/v1/protocol.py,
commit 0851d06cee2ec3a8907d23240f8849d58ade969d). `MooncakestoreConnector` below keeps the connector's method
names and makes the same `MooncakeDistributedStore` calls in the same order with the same arguments: 7 positional
setup arguments whose return the connector does not check, `ReplicateConfig()` with replica_num 1 and, with
prefer_local_alloc, preferred_segment = get_hostname(); register_buffer(ptr, numel) of the whole pinned CPU
buffer; put_from(key, ptr, size, replica_config) (optimized mode) or put_parts(key, metadata, kv_bytes) (legacy
mode, save_chunk_meta); batch_get_into(keys, ptrs, sizes) or batch_get_buffer(keys); is_exist; on close
unregister_buffer(ptr) then close(). LMCache awaits these through asyncio.to_thread; here they run inline.
The pinned buffer is a numpy array; memory objects are slices of it, as LMCache's allocator hands out.

Run against the original with ENGINE_REPLAY_TARGET=original (see engine_target.py).
"""

import struct

import numpy as np

# engine_master and engine_trace are fixtures (engine_trace autouse).
from engine_target import (  # noqa: F401
    MiB, engine_master, engine_trace, original_gap, pattern,
)

METADATA_BYTES_LEN = 28
MEMORY_FORMAT_KV_2LTD = 1  # an arbitrary lmcache MemoryFormat value for the header
DTYPE_UINT8 = 6  # protocol.py DTYPE_TO_INT[torch.uint8]


class PinnedAllocator:
    """LMCache's pin_allocator: one pinned buffer (`buffer`), bump-allocated into memory objects (slices)."""

    def __init__(self, size: int):
        self.buffer = np.zeros(size, dtype=np.uint8)
        self._next = 0

    def allocate(self, nbytes: int) -> np.ndarray:
        obj = self.buffer[self._next:self._next + nbytes]
        assert obj.nbytes == nbytes, "pinned buffer exhausted"
        self._next += nbytes
        return obj


def cache_key(chunk: int) -> str:
    """In the shape of CacheEngineKey.to_string(): fmt@model@world_size@worker_id@chunk_hash@dtype."""
    return f"vllm@Qwen-7B@1@0@{chunk:016x}@bfloat16"


class MooncakestoreConnector:
    """The connector: __init__, _register_cpu_buffer, exists/exists_sync, put (put_from or put_parts),
    batched_get (_batch_get_into or _batch_get_buffer), close (_unregister_cpu_buffer, store.close)."""

    def __init__(self, master_addr, allocator: PinnedAllocator, *, save_chunk_meta: bool,
                 prefer_local_alloc=False, global_segment_size=64 * MiB, local_buffer_size=16 * MiB,
                 has_pin_allocator=True):
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig

        self.store = MooncakeDistributedStore()
        # The connector does not look at setup's return.
        self.setup_ret = self.store.setup(
            "localhost", "P2PHANDSHAKE", global_segment_size, local_buffer_size, "tcp", "", master_addr
        )
        self.allocator = allocator
        self.save_chunk_meta = save_chunk_meta
        self.registered_buffer_ptr = None
        self.replica_config = ReplicateConfig()
        self.replica_config.replica_num = 1
        if prefer_local_alloc:
            self.replica_config.preferred_segment = self.store.get_hostname()
        self.has_pin_allocator = has_pin_allocator
        self.register_result = self._register_cpu_buffer()

    def _register_cpu_buffer(self):
        if not self.has_pin_allocator:  # allocator without pin_allocator.buffer: nothing registered
            self.registered_buffer_ptr = None
            return None
        buffer = self.allocator.buffer
        self.registered_buffer_ptr = buffer.ctypes.data
        result = self.store.register_buffer(buffer.ctypes.data, buffer.size)  # numel() of a uint8 buffer
        if result != 0:
            self.registered_buffer_ptr = None
        return result

    def _unregister_cpu_buffer(self):
        result = None
        if self.registered_buffer_ptr is not None:
            result = self.store.unregister_buffer(self.registered_buffer_ptr)
            self.registered_buffer_ptr = None
        return result

    def exists_sync(self, key: str):
        return self.store.is_exist(key)

    # ---- put ----

    def put(self, key: str, memory_obj: np.ndarray, shape=None):
        if self.save_chunk_meta:
            return self._put_with_metadata(key, memory_obj, shape)
        return self._put_without_metadata(key, memory_obj)

    def _put_without_metadata(self, key, memory_obj):
        # The connector ignores put_from's return (it only catches exceptions and timeouts).
        return self.store.put_from(key, memory_obj.ctypes.data, memory_obj.nbytes, self.replica_config)

    def _put_with_metadata(self, key, memory_obj, shape):
        kv_bytes = memory_obj.data  # MemoryObj.byte_array: a memoryview of the object's bytes
        shape = shape or (memory_obj.nbytes, 0, 0, 0)
        metadata_bytes = struct.pack("iiiiiii", len(kv_bytes), MEMORY_FORMAT_KV_2LTD, DTYPE_UINT8, *shape)
        assert len(metadata_bytes) == METADATA_BYTES_LEN
        return self.store.put_parts(key, metadata_bytes, kv_bytes)

    # ---- get ----

    def batched_get(self, keys, chunk_bytes: int):
        if not keys:
            return []
        if self.save_chunk_meta:
            return self._batch_get_buffer(keys)
        return self._batch_get_into(keys, chunk_bytes)

    def _batch_get_into(self, keys, chunk_bytes):
        """Allocates a full chunk per key; a read shorter than the chunk is a partial (last) chunk, trimmed to the
        bytes read (reshape_partial_chunk); n_read <= 0 is a miss."""
        memory_objs = [self.allocator.allocate(chunk_bytes) for _ in keys]
        self.last_bytes_read = self.store.batch_get_into(
            list(keys), [m.ctypes.data for m in memory_objs], [m.nbytes for m in memory_objs]
        )
        results = [None] * len(keys)
        for i, n_read in enumerate(self.last_bytes_read):
            if n_read <= 0:
                continue
            results[i] = memory_objs[i][:n_read]
        return results

    def _batch_get_buffer(self, keys):
        buffers = self.store.batch_get_buffer(list(keys))
        results = []
        for buffer in buffers:
            if buffer is None:
                results.append(None)
                continue
            results.append(self._process_buffer_with_metadata(buffer))
        return results

    def _process_buffer_with_metadata(self, buffer):
        retrieved_view = memoryview(buffer)
        metadata_bytes = retrieved_view[:METADATA_BYTES_LEN]
        if metadata_bytes is None or len(metadata_bytes) != METADATA_BYTES_LEN:
            return None
        length, _fmt, dtype, *shape = struct.unpack_from("iiiiiii", metadata_bytes)
        assert len(retrieved_view) == length + METADATA_BYTES_LEN
        assert dtype == DTYPE_UINT8
        memory_obj = self.allocator.allocate(length)
        # torch.frombuffer(buffer, dtype, offset=METADATA_BYTES_LEN, count=...) then copy_ into the object.
        memory_obj[:] = np.frombuffer(buffer, dtype=np.uint8, offset=METADATA_BYTES_LEN, count=length)
        return memory_obj, tuple(shape)

    def close(self):
        unregistered = self._unregister_cpu_buffer()
        closed = self.store.close()
        return unregistered, closed


CHUNK = 256 * 1024


def test_lmcache_optimized_mode_put_from_and_batch_get_into(engine_master):
    """mooncakestore_connector.py, save_chunk_meta False: __init__ (setup, ReplicateConfig replica_num 1,
    _register_cpu_buffer), put -> _put_without_metadata (put_from with the replica config) for two full chunks and
    a partial last chunk, exists_sync (is_exist), batched_get -> _batch_get_into (batch_get_into; bytes read per
    key, a partial chunk trimmed to its length, a miss as None), close (unregister_buffer, close)."""
    writer_mem, reader_mem = PinnedAllocator(8 * CHUNK), PinnedAllocator(8 * CHUNK)
    writer = MooncakestoreConnector(engine_master.addr, writer_mem, save_chunk_meta=False)
    reader = MooncakestoreConnector(engine_master.addr, reader_mem, save_chunk_meta=False)
    try:
        assert writer.setup_ret == 0 and reader.setup_ret == 0
        assert writer.register_result == 0 and reader.register_result == 0
        objs = [writer_mem.allocate(CHUNK), writer_mem.allocate(CHUNK), writer_mem.allocate(CHUNK // 3)]
        for i, o in enumerate(objs):
            o[:] = pattern(o.nbytes, 10 + i)
        keys = [cache_key(0xA0 + i) for i in range(3)]
        assert [writer.put(k, o) for k, o in zip(keys, objs)] == [0, 0, 0]
        assert [reader.exists_sync(k) for k in keys] == [1, 1, 1]
        assert reader.exists_sync(cache_key(0xFF)) == 0

        got = reader.batched_get(keys + [cache_key(0xFF)], CHUNK)
        assert reader.last_bytes_read[:3] == [CHUNK, CHUNK, CHUNK // 3]
        assert reader.last_bytes_read[3] < 0, "a miss is a negative code"
        assert got[3] is None
        for o, g in zip(objs, got[:3]):
            assert g is not None and g.nbytes == o.nbytes and np.array_equal(g, o)

        # A key put twice keeps the first value (put_from is not an upsert); LMCache relies on the key naming
        # the content, so the second put's code only has to be non-negative.
        assert writer.put(keys[0], objs[1]) >= 0
        (again,) = reader.batched_get(keys[:1], CHUNK)
        assert np.array_equal(again, objs[0])
    finally:
        assert reader.close() == (0, 0)
        writer.store.remove_all(force=True)
        assert writer.close() == (0, 0)


def test_lmcache_legacy_mode_put_parts_and_batch_get_buffer(engine_master):
    """mooncakestore_connector.py, save_chunk_meta True: put -> _put_with_metadata (put_parts(key, 28-byte
    RemoteMetadata, kv bytes)), batched_get -> _batch_get_buffer (batch_get_buffer; None for a miss, otherwise a
    buffer whose memoryview holds header + data, read with frombuffer at offset 28), close."""
    writer_mem, reader_mem = PinnedAllocator(4 * CHUNK), PinnedAllocator(4 * CHUNK)
    writer = MooncakestoreConnector(engine_master.addr, writer_mem, save_chunk_meta=True)
    reader = MooncakestoreConnector(engine_master.addr, reader_mem, save_chunk_meta=True)
    try:
        assert writer.register_result == 0 and reader.register_result == 0
        objs = [writer_mem.allocate(CHUNK), writer_mem.allocate(1000)]
        objs[0][:] = pattern(CHUNK, 20)
        objs[1][:] = pattern(1000, 21)
        shapes = [(2, 32, 16, 256), (1000, 0, 0, 0)]
        keys = [cache_key(0xB0), cache_key(0xB1)]
        assert [writer.put(k, o, s) for k, o, s in zip(keys, objs, shapes)] == [0, 0]
        assert [reader.exists_sync(k) for k in keys] == [1, 1]

        got = reader.batched_get([keys[0], cache_key(0xBF), keys[1]], CHUNK)
        assert got[1] is None, "batch_get_buffer gives None for a miss"
        for (mem, shape), o, s in zip([got[0], got[2]], objs, shapes):
            assert shape == s
            assert np.array_equal(mem, o)
        # The buffers themselves: header then data, byte for byte.
        raw = reader.store.batch_get_buffer(keys)
        head = struct.pack("iiiiiii", CHUNK, MEMORY_FORMAT_KV_2LTD, DTYPE_UINT8, *shapes[0])
        assert bytes(memoryview(raw[0])) == head + objs[0].tobytes()
    finally:
        assert reader.close() == (0, 0)
        writer.store.remove_all(force=True)
        assert writer.close() == (0, 0)


def test_lmcache_prefer_local_alloc_puts_into_its_own_segment(engine_master):
    """mooncakestore_connector.py __init__ with prefer_local_alloc: replica_config.preferred_segment =
    store.get_hostname(); every put_from then lands in the connector's own segment although another segment is
    mounted, and another client reads it back."""
    from mooncake.store import MooncakeDistributedStore

    mem = PinnedAllocator(10 * CHUNK)
    conn = MooncakestoreConnector(engine_master.addr, mem, save_chunk_meta=False, prefer_local_alloc=True)
    other = None
    try:
        assert conn.replica_config.preferred_segment == conn.store.get_hostname() != ""
        # The connector's own replica endpoint, learnt while its segment is the only one.
        assert conn.store.put("lmcache-probe", b"p" * 100) == 0
        (probe,) = conn.store.get_replica_desc("lmcache-probe")
        own_endpoint = probe.get_memory_descriptor().buffer_descriptor.transport_endpoint
        other = MooncakeDistributedStore()
        assert other.setup("localhost", "P2PHANDSHAKE", 64 * MiB, 16 * MiB, "tcp", "", engine_master.addr) == 0

        objs = [mem.allocate(CHUNK) for _ in range(8)]
        keys = [cache_key(0xC0 + i) for i in range(8)]
        for i, (k, o) in enumerate(zip(keys, objs)):
            o[:] = pattern(CHUNK, 30 + i)
            assert conn.put(k, o) == 0
        endpoints = {r.get_memory_descriptor().buffer_descriptor.transport_endpoint
                     for k in keys for r in conn.store.get_replica_desc(k)}
        assert endpoints == {own_endpoint}
        assert [len(conn.store.get_replica_desc(k)) for k in keys] == [1] * 8, "replica_num 1"
        for k, o in zip(keys, objs):
            assert other.get(k) == o.tobytes()
    finally:
        conn.store.remove_all(force=True)
        assert conn.close() == (0, 0)
        if other is not None:
            other.close()


def test_lmcache_without_a_pinned_buffer_puts_and_gets_unregistered_memory(engine_master):
    """mooncakestore_connector.py _register_cpu_buffer: when the local CPU backend's allocator has no
    pin_allocator.buffer, nothing is registered, yet put -> put_from and batched_get -> batch_get_into are still
    called on that memory (put_from's code is ignored). The original (TCP) moves the bytes anyway."""
    writer_mem, reader_mem = PinnedAllocator(2 * CHUNK), PinnedAllocator(2 * CHUNK)
    writer = MooncakestoreConnector(engine_master.addr, writer_mem, save_chunk_meta=False, has_pin_allocator=False)
    reader = MooncakestoreConnector(engine_master.addr, reader_mem, save_chunk_meta=False, has_pin_allocator=False)
    try:
        assert writer.register_result is None and writer.registered_buffer_ptr is None
        obj = writer_mem.allocate(CHUNK)
        obj[:] = pattern(CHUNK, 40)
        put_code = writer.put(cache_key(0xD0), obj)
        got = reader.batched_get([cache_key(0xD0)], CHUNK)
        assert (put_code, reader.last_bytes_read) == (0, [CHUNK])
        assert got[0] is not None and np.array_equal(got[0], obj)
    finally:
        writer.store.remove_all(force=True)
        assert reader.close() == (None, 0)
        assert writer.close() == (None, 0)


_UNREACHABLE_SCRIPT = r"""
import json, socket, sys
sys.path.insert(0, sys.argv[1])
from test_engine_lmcache import MooncakestoreConnector, PinnedAllocator, CHUNK, cache_key
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()  # nobody listens there
mem = PinnedAllocator(4 * CHUNK)
conn = MooncakestoreConnector(f"127.0.0.1:{port}", mem, save_chunk_meta=False)
out = {"setup": conn.setup_ret, "register": conn.register_result}
print(json.dumps(out), flush=True)
obj = mem.allocate(CHUNK)
out["exists"] = conn.exists_sync(cache_key(1))
out["put"] = conn.put(cache_key(1), obj)
print(json.dumps(out), flush=True)
got = conn.batched_get([cache_key(1)], CHUNK)
out["get"] = [g is None for g in got]
out["bytes_read"] = list(conn.last_bytes_read)
print(json.dumps(out), flush=True)
out["close"] = list(conn.close())
print(json.dumps(out), flush=True)
"""


@original_gap("batch_get_into on a store whose setup failed segfaults")
def test_lmcache_unchecked_setup_failure_leaves_every_call_failing_cleanly():
    """mooncakestore_connector.py __init__ does not check setup's return: with no master at the address, the
    connector goes on to _register_cpu_buffer, and later exists/put/batched_get/close run on a store that never
    set up. Each must fail with a code (put_from's is ignored, a batched_get miss is None) and the process must
    live. Run in a child process: the original (0.3.13.post1) segfaults in batch_get_into there."""
    import json
    import pathlib
    import subprocess
    import sys

    here = str(pathlib.Path(__file__).resolve().parent)
    proc = subprocess.run([sys.executable, "-c", _UNREACHABLE_SCRIPT, here], capture_output=True, text=True,
                          timeout=120)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    last = json.loads(lines[-1]) if lines else {}
    assert proc.returncode == 0, f"the process died (rc {proc.returncode}) after {last}"
    assert last["setup"] != 0
    assert last["exists"] < 0 and last["put"] < 0
    assert last["get"] == [True] and last["bytes_read"][0] < 0
    # register_buffer needs no master in Crescent (0; unregister then 0); the original refuses it (-600), so
    # the connector never unregisters (None). Close answers 0 either way.
    assert (last["register"], last["close"]) in ((0, [0, 0]), (-600, [None, 0])), last
