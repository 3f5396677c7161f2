"""The calls inference engines make beyond the basic surface (SGLang HiCache's layer-first path, vLLM's and
LMCache's tensor calls, the async store), each against a real master.

A test taking the `store` fixture runs twice: on Crescent and on the original wheel (its `[original]` item runs
in the original's interpreter, see conftest.py; skipped where that interpreter is absent), with the same
assertions: they are the original's answers. Tests taking `crescent_store` are Crescent's alone (where the
original answers differently, each says how and why).
"""

import asyncio
import importlib.util
import pathlib
import struct
import sys
import time
import types
import uuid

import numpy as np
import pytest

from conftest import ENGINE_IMPL, FAKE_TORCH, Master, MiB, OriginalMaster, emptied_store

INVALID_PARAMS = -600
NO_AVAILABLE_HANDLE = -200
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
LEASE_EXPIRED = -707
LEASE_MS = 1000
HEADER = 304


def _fake_torch():
    """The stand-in torch module (fake_torch/torch): `torch` itself in the original's interpreter, else loaded
    under another name so that `torch` stays unimportable here."""
    if ENGINE_IMPL == "original":
        import torch

        return torch
    spec = importlib.util.spec_from_file_location("_fake_torch", FAKE_TORCH / "torch" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


torch = _fake_torch()


@pytest.fixture(scope="module")
def cluster():
    """A master for this module (its lease long enough for a session's reads, short enough to outlive)."""
    if ENGINE_IMPL == "original":
        m = OriginalMaster(LEASE_MS)
    else:
        m = Master("--lease-ttl-ms", str(LEASE_MS))
    yield m.addr
    m.stop()


def _setup(addr: str):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", 64 * MiB, 64 * MiB, "tcp", "", addr)
    assert rc == 0, f"setup returned {rc}"
    return s


@pytest.fixture(scope="module", params=["crescent", "original"])
def impl(request):
    if request.param == "crescent" and ENGINE_IMPL == "original":
        pytest.skip("Crescent's items run in Crescent's interpreter")
    return request.param


@pytest.fixture(scope="module")
def store(impl, request):
    """A store of `impl` hosting a 64 MiB segment; `None` for `[original]` items outside the original's
    interpreter (conftest.py runs those there)."""
    if impl == "original" and ENGINE_IMPL != "original":
        yield None
        return
    s = _setup(request.getfixturevalue("cluster"))
    yield s
    s.close()


@pytest.fixture
def crescent_store(master):
    """Crescent's own store (conftest's, which this module's `store` shadows)."""
    yield from emptied_store(master)


@pytest.fixture
def key():
    return f"e-{uuid.uuid4().hex[:12]}"


class Registered:
    """A 1 MiB registered buffer: `ptr` its address, `a` the bytes (a NumPy array)."""

    def __init__(self, store):
        self.store = store
        self.a = np.zeros(1 * MiB, dtype=np.uint8)
        self.ptr = self.a.ctypes.data
        assert store.register_buffer(self.ptr, self.a.nbytes) == 0

    def write(self, offset: int, data: bytes) -> None:
        self.a[offset:offset + len(data)] = np.frombuffer(data, dtype=np.uint8)

    def read(self, offset: int, n: int) -> bytes:
        return self.a[offset:offset + n].tobytes()


@pytest.fixture
def buf(store):
    if store is None:
        yield None
        return
    b = Registered(store)
    yield b
    store.unregister_buffer(b.ptr)


def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


def arr(x):
    """A read tensor as a NumPy array (a torch-like tensor through its `numpy()`)."""
    return x if isinstance(x, np.ndarray) else x.numpy()


def tensor_header(code, global_shape, local_shape, nbytes, axes=()):
    """The original's 304-byte TensorMetadata, built here field by field from its C++ definition."""
    kind = 1 if axes else 0
    h = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, HEADER, code, len(global_shape), kind, 0, HEADER, nbytes)
    h += struct.pack("<8q", *(list(global_shape) + [-1] * (8 - len(global_shape))))
    h += struct.pack("<8q", *(list(local_shape) + [-1] * (8 - len(local_shape))))
    h += struct.pack("<II", len(axes), 0)
    for i in range(4):
        h += struct.pack("<iiiiiiq", *axes[i]) if i < len(axes) else bytes(32)
    assert len(h) == HEADER
    return h


# ---- SGLang's layer-first path: sessions and ranges ----


def test_get_ranges_read_parts_of_objects_inside_a_get_session(store, buf, key):
    value = pattern(1024, 1)
    assert store.put(key, value) == 0
    # Without a session, nothing is read.
    assert store.batch_get_into_multi_buffer_ranges([key], [[buf.ptr]], [[10]], [[5]]) == [INVALID_PARAMS]
    assert store.batch_get_session_start([key, key + "-missing", ""]) == [0, OBJECT_NOT_FOUND, OBJECT_NOT_FOUND]
    got = store.batch_get_into_multi_buffer_ranges([key], [[buf.ptr, buf.ptr + 100]], [[10, 20]], [[5, 1000]])
    assert got == [30]
    assert buf.read(0, 10) == value[5:15] and buf.read(100, 20) == value[1000:1020]
    # A range past the object's end, mismatched lists: INVALID_PARAMS for the key.
    assert store.batch_get_into_multi_buffer_ranges([key], [[buf.ptr, buf.ptr]], [[10, 30]], [[5, 1000]]) == [
        INVALID_PARAMS
    ]
    assert store.batch_get_into_multi_buffer_ranges([key], [[buf.ptr, buf.ptr]], [[10]], [[5, 1000]]) == [
        INVALID_PARAMS
    ]
    assert store.batch_get_into_multi_buffer_ranges([key], [[buf.ptr]], [[10]], []) == [INVALID_PARAMS]
    # No ranges, empty ranges, a range ending at the object's end.
    assert store.batch_get_into_multi_buffer_ranges([key], [[]], [[]], [[]]) == [0]
    assert store.batch_get_into_multi_buffer_ranges([key], [[buf.ptr]], [[0]], [[1024]]) == [0]
    assert store.batch_get_into_multi_buffer_ranges([key], [[buf.ptr]], [[24]], [[1000]]) == [24]
    assert store.batch_get_session_end([key, key + "-never-started"]) == 0
    assert store.batch_get_into_multi_buffer_ranges([key], [[buf.ptr]], [[10]], [[5]]) == [INVALID_PARAMS]
    assert store.batch_get_session_start([]) == []
    assert store.batch_get_session_end([]) == 0


def test_a_get_session_outlived_by_its_lease_is_lease_expired_then_gone(store, buf, key):
    assert store.put(key, pattern(100)) == 0
    assert store.batch_get_session_start([key]) == [0]
    # Outliving the lease is what is tested: the wait is the point, not a synchronisation.
    time.sleep(LEASE_MS / 1000 + 0.3)
    assert store.batch_get_into_multi_buffer_ranges([key], [[buf.ptr]], [[10]], [[0]]) == [LEASE_EXPIRED]
    assert store.batch_get_into_multi_buffer_ranges([key], [[buf.ptr]], [[10]], [[0]]) == [INVALID_PARAMS]
    assert store.batch_get_session_end([key]) == 0


def test_a_put_session_reserves_takes_ranges_and_ends_readable(store, buf, key):
    assert store.put(key + "-held", b"x" * 50) == 0
    started = store.batch_put_session_start([key, key + "-held", key + "-empty"], [100, 50, 0])
    assert started == [0, OBJECT_ALREADY_EXISTS, INVALID_PARAMS]
    assert store.batch_put_session_start([key], [100]) == [INVALID_PARAMS], "a key with a session already"
    assert store.batch_put_session_start([key + "-a", key + "-b"], [100]) == [INVALID_PARAMS] * 2
    buf.write(0, bytes(range(100)))
    assert store.batch_put_from_multi_buffer_ranges([key], [[buf.ptr, buf.ptr + 60]], [[60, 40]], [[0, 60]]) == [100]
    # Past the reserved size, without a session: INVALID_PARAMS.
    assert store.batch_put_from_multi_buffer_ranges([key], [[buf.ptr]], [[60]], [[50]]) == [INVALID_PARAMS]
    assert store.batch_put_from_multi_buffer_ranges([key + "-z"], [[buf.ptr]], [[6]], [[0]]) == [INVALID_PARAMS]
    assert store.batch_put_from_multi_buffer_ranges([key], [[buf.ptr]], [[6]], []) == [INVALID_PARAMS]
    assert store.is_exist(key) == 0, "a reserved object is not readable before its end"
    assert store.batch_put_session_end([key, key + "-z"]) == [0, INVALID_PARAMS]
    assert store.get(key) == bytes(range(100))
    assert store.batch_put_session_end([key]) == [INVALID_PARAMS]
    assert store.batch_put_from_multi_buffer_ranges([key], [[buf.ptr]], [[6]], [[0]]) == [INVALID_PARAMS]


def test_a_revoked_put_session_leaves_the_key_free(store, buf, key):
    assert store.batch_put_session_start([key], [64]) == [0]
    assert store.batch_put_from_multi_buffer_ranges([key], [[buf.ptr]], [[64]], [[0]]) == [64]
    assert store.batch_put_session_revoke([key, key + "-none"]) == [0, INVALID_PARAMS]
    assert store.is_exist(key) == 0
    assert store.batch_put_from_multi_buffer_ranges([key], [[buf.ptr]], [[6]], [[0]]) == [INVALID_PARAMS]
    assert store.batch_put_session_start([key], [64]) == [0], "the key can be reserved again"
    buf.write(0, pattern(64, 3))
    assert store.batch_put_from_multi_buffer_ranges([key], [[buf.ptr]], [[64]], [[0]]) == [64]
    assert store.batch_put_session_end([key]) == [0]
    assert store.get(key) == pattern(64, 3)


def test_a_put_sessions_group_ids_are_one_per_key(store, key):
    from mooncake.store import ReplicateConfig

    one = ReplicateConfig()
    one.group_ids = ["g"]
    assert store.batch_put_session_start([key + "a", key + "b"], [10, 10], one) == [INVALID_PARAMS] * 2
    assert store.batch_put_session_start([key + "c"], [10], one) == [0]
    per_key = ReplicateConfig()
    per_key.group_ids = ["g1", "g2"]
    assert store.batch_put_session_start([key + "a", key + "b"], [10, 10], per_key) == [0, 0]
    assert store.batch_put_session_revoke([key + "a", key + "b", key + "c"]) == [0, 0, 0]


def test_a_put_session_with_no_room_is_minus_200(store, key):
    assert store.batch_put_session_start([key], [1 << 40]) == [NO_AVAILABLE_HANDLE]
    assert store.batch_put_session_end([key]) == [INVALID_PARAMS]


def test_ranges_outside_registered_memory_are_refused(crescent_store, key):
    """Crescent refuses a range outside every registered buffer with INVALID_PARAMS before any byte moves (its
    convention for every pointer call); the original (over TCP) fails the transfer with TRANSFER_FAIL (-800)."""
    s = crescent_store
    assert s.put(key, pattern(100)) == 0
    outside = np.zeros(64, dtype=np.uint8)
    assert s.batch_get_session_start([key]) == [0]
    assert s.batch_get_into_multi_buffer_ranges([key], [[outside.ctypes.data]], [[10]], [[0]]) == [INVALID_PARAMS]
    assert s.batch_put_session_start([key + "-w"], [10]) == [0]
    assert s.batch_put_from_multi_buffer_ranges([key + "-w"], [[outside.ctypes.data]], [[10]], [[0]]) == [
        INVALID_PARAMS
    ]
    assert s.batch_put_session_revoke([key + "-w"]) == [0]
    assert s.batch_get_session_end([key]) == 0


def test_a_get_session_end_lets_its_lease_go(crescent_store, key):
    """Crescent's leases end when their reader lets them go: a session's end (and a session replaced by a new
    start of its key) releases its lease, so the object can be removed at once. (The original's leases only run
    out: its end drops the cached lookup, and a removal is -706 until the lease's deadline.)"""
    s = crescent_store
    assert s.put(key, pattern(100)) == 0
    assert s.batch_get_session_start([key, key]) == [0, 0]
    assert s.batch_get_session_start([key]) == [0]
    assert s.batch_get_session_end([key]) == 0
    assert s.remove(key) == 0


def test_session_calls_on_a_store_not_set_up_return_minus_1():
    """Crescent's convention for a store not set up (-1, per key for lists); the original (0.3.13.post1) answers
    `[]` (an empty list) for the list-returning session calls, -1 for batch_get_session_end and -600 for
    put_from_with_metadata."""
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.batch_get_session_start(["a"]) == [-1]
    assert s.batch_get_session_end(["a"]) == -1
    assert s.batch_put_session_start(["a"], [10]) == [-1]
    assert s.batch_put_session_end(["a"]) == [-1]
    assert s.batch_put_session_revoke(["a"]) == [-1]
    assert s.batch_get_into_multi_buffer_ranges(["a"], [[1]], [[1]], [[0]]) == [-1]
    assert s.batch_put_from_multi_buffer_ranges(["a"], [[1]], [[1]], [[0]]) == [-1]
    assert s.put_from_with_metadata("a", 1, 1, 1, 1) == -1


# ---- put_from_with_metadata ----


def test_put_from_with_metadata_stores_the_metadata_then_the_data(store, buf, key):
    from mooncake.store import ReplicateConfig

    buf.write(0, bytes(range(100)))
    buf.write(1000, b"\xff" * 10)
    assert store.put_from_with_metadata(key, buf.ptr, buf.ptr + 1000, 100, 10) == 0
    assert store.get(key) == b"\xff" * 10 + bytes(range(100))
    assert store.put_from_with_metadata(key, buf.ptr, buf.ptr + 1000, 50, 10) == 0, "an existing key: kept, 0"
    assert store.get_size(key) == 110
    assert store.put_from_with_metadata(key + "-0", buf.ptr, buf.ptr + 1000, 0, 10) == 0
    assert store.is_exist(key + "-0") == 0, "size 0 stores nothing"
    assert store.put_from_with_metadata(key + "-m", buf.ptr, buf.ptr + 1000, 50, 0) == 0
    assert store.get(key + "-m") == bytes(range(50))
    near = ReplicateConfig()
    near.prefer_alloc_in_same_node = True
    assert store.put_from_with_metadata(key + "-n", buf.ptr, buf.ptr + 1000, 50, 10, near) == -1


def test_put_from_with_metadata_errors_are_negative(crescent_store, key):
    """The original answers a failed put here with the code's sign flipped (+600 for an empty key: it negates
    an already negative code); Crescent answers negative codes, as every other call, since an engine testing
    `rc < 0` would take the original's answer for a success. Memory outside every registered buffer is
    INVALID_PARAMS (Crescent's convention)."""
    s = crescent_store
    b = Registered(s)
    assert s.put_from_with_metadata("", b.ptr, b.ptr + 1000, 50, 10) == INVALID_PARAMS
    outside = np.zeros(64, dtype=np.uint8)
    assert s.put_from_with_metadata(key, b.ptr, outside.ctypes.data, 50, 64) == INVALID_PARAMS


# ---- tensors ----


def test_put_tensor_writes_the_originals_layout_byte_for_byte(store, key):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert store.put_tensor(key, torch.Tensor(a)) == 0
    raw = store.get(key)
    assert raw == tensor_header(0, (2, 3, 4), (2, 3, 4), a.nbytes) + a.tobytes()
    got = store.get_tensor(key)
    assert got.shape == (2, 3, 4) and np.array_equal(arr(got), a)
    assert store.put_tensor(key, torch.Tensor(a)) == 0, "an existing key: kept, 0"


def test_a_tensor_object_written_by_hand_reads_back(store, key):
    """The reverse direction: bytes laid out as the original lays them out are a tensor to get_tensor."""
    a = np.arange(6, dtype=np.int64).reshape(3, 2)
    assert store.put(key, tensor_header(8, (3, 2), (3, 2), a.nbytes) + a.tobytes()) == 0
    got = store.get_tensor(key)
    assert str(got.dtype) in ("int64", "torch.int64") and np.array_equal(arr(got), a)
    assert store.put(key + "-bad", b"\0" * 400) == 0
    assert store.get_tensor(key + "-bad") is None, "not a tensor object"


def test_get_tensor_of_a_missing_key_and_put_of_a_non_tensor(store, key):
    assert store.get_tensor(key + "-missing") is None
    assert store.put_tensor(key, "abc") == INVALID_PARAMS
    assert store.put_tensor(key, None) == INVALID_PARAMS


def test_dtypes_numpy_lacks_keep_their_code(store, key):
    bf = torch.Tensor(np.arange(6, dtype=np.uint16).reshape(2, 3)).view(torch.bfloat16)
    assert store.put_tensor(key, bf) == 0
    raw = store.get(key)
    assert struct.unpack_from("<i", raw, 8)[0] == 12, "BFLOAT16's code"
    got = store.get_tensor(key)
    assert np.array_equal(arr(got).view(np.uint16), np.arange(6, dtype=np.uint16).reshape(2, 3))


def test_a_zero_size_tensor_is_its_header_alone(store, key):
    assert store.put_tensor(key, torch.Tensor(np.zeros((0, 3), dtype=np.float32))) == 0
    assert store.get(key) == tensor_header(0, (0, 3), (0, 3), 0)


def test_tensor_puts_are_not_bounded_by_the_local_buffer_but_get_tensor_is(impl, key):
    """The original sends a tensor from its own memory (a put larger than local_buffer_size succeeds) but
    get_tensor reads through the local buffer (None past it); get_tensor_into reads into registered memory."""
    if impl == "original" and ENGINE_IMPL != "original":
        return  # conftest.py runs this item in the original's interpreter
    from mooncake.store import MooncakeDistributedStore

    # A master of its own: the module's holds the other tests' objects and stores, and the original answered
    # -200 (no room) for this put there.
    m = OriginalMaster(LEASE_MS) if ENGINE_IMPL == "original" else Master()
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", 128 * MiB, 16 * MiB, "tcp", "", m.addr) == 0
    try:
        a = np.arange(32 * MiB, dtype=np.uint8)
        assert s.put_tensor(key, torch.Tensor(a)) == 0
        assert s.put(key + "-b", a.tobytes()) == INVALID_PARAMS, "a copying put is bounded by the local buffer"
        assert s.get_tensor(key) is None
        dst = np.zeros(33 * MiB, dtype=np.uint8)
        assert s.register_buffer(dst.ctypes.data, dst.nbytes) == 0
        got = s.get_tensor_into(key, dst.ctypes.data, dst.nbytes)
        assert np.array_equal(arr(got), a)
    finally:
        s.close()
        m.stop()


def test_batch_tensor_calls_answer_per_key(store, key):
    t = torch.Tensor(np.ones((4, 4), dtype=np.float16))
    assert store.batch_put_tensor([key + "1", key + "2"], [t, None]) == [0, INVALID_PARAMS]
    assert store.batch_put_tensor([], []) == []
    assert store.batch_put_tensor([key + "3"], []) == [INVALID_PARAMS]
    got = store.batch_get_tensor([key + "1", key + "2"])
    assert np.array_equal(arr(got[0]), np.ones((4, 4), dtype=np.float16)) and got[1] is None
    assert store.batch_upsert_tensor([key + "1"], [torch.Tensor(np.zeros(2, dtype=np.int32))]) == [0]
    assert arr(store.get_tensor(key + "1")).shape == (2,)


def test_upsert_and_pub_tensor(store, key):
    from mooncake.store import ReplicateConfig

    a = torch.Tensor(np.arange(4, dtype=np.int32))
    assert store.put_tensor(key, a) == 0
    assert store.upsert_tensor(key, torch.Tensor(np.zeros(3, dtype=np.int64))) == 0
    assert arr(store.get_tensor(key)).shape == (3,)
    two_segments = ReplicateConfig()
    two_segments.preferred_segments = ["a", "b"]  # not one per replica (replica_num 1)
    assert store.pub_tensor(key + "-p", a, two_segments) == INVALID_PARAMS
    assert store.batch_pub_tensor([key + "-p"], [a], two_segments) == [INVALID_PARAMS]
    assert store.pub_tensor(key + "-p", a) == 0
    assert store.upsert_pub_tensor(key + "-p", torch.Tensor(np.zeros(5, dtype=np.int32))) == 0
    assert arr(store.get_tensor(key + "-p")).shape == (5,)


def test_tensor_parallel_shards_are_stored_per_rank(store, key):
    from mooncake.store import ReplicateConfig

    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert store.put_tensor_with_tp(key, torch.Tensor(a), tp_rank=1, tp_size=2, split_dim=2) == 0
    for rank in range(2):
        part = np.ascontiguousarray(a[:, :, 2 * rank:2 * rank + 2])
        axis = (1, 0, rank, 2, 2, 0, 2)  # TP, axis 0, rank, count, split_dim, reserved, local split extent
        expected = tensor_header(0, (2, 3, 4), (2, 3, 2), part.nbytes, [axis]) + part.tobytes()
        assert store.get(f"{key}_tp_{rank}") == expected
        assert np.array_equal(arr(store.get_tensor_with_tp(key, tp_rank=rank, tp_size=2)), part)
    assert store.get_tensor_with_tp(key, 0, 1) is None, "tp_size 1 reads the key itself"
    assert store.batch_get_tensor_with_tp([key], tp_rank=1, tp_size=2)[0].shape == (2, 3, 2)
    # Uneven splits and dimensions out of range.
    t = torch.Tensor(a)
    assert store.put_tensor_with_tp(key + "-3", t, tp_size=3, split_dim=2) == INVALID_PARAMS
    assert store.is_exist(key + "-3_tp_0") == 0
    assert store.put_tensor_with_tp(key + "-d", t, tp_size=2, split_dim=5) == INVALID_PARAMS
    assert store.put_tensor_with_tp(key + "-n", t, tp_size=2, split_dim=-1) == INVALID_PARAMS
    assert store.put_tensor_with_tp(key + "-1", t, tp_size=1) == 0
    assert store.get(key + "-1") == tensor_header(0, (2, 3, 4), (2, 3, 4), a.nbytes) + a.tobytes()
    assert store.batch_put_tensor_with_tp([key + "-b", key + "-c"], [t, None], tp_size=2, split_dim=0) == [
        0,
        INVALID_PARAMS,
    ]
    assert arr(store.get_tensor(key + "-b_tp_1")).shape == (1, 3, 4)
    assert store.pub_tensor_with_tp(key + "-p", t, ReplicateConfig(), 0, 2, 1) == INVALID_PARAMS, "3 rows do not split in 2"
    assert store.batch_pub_tensor_with_tp([key + "-q"], [t], ReplicateConfig(), 0, 2, 0) == [0]


def test_zero_copy_tensor_calls(store, buf, key):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    obj = tensor_header(0, (2, 3, 4), (2, 3, 4), a.nbytes) + a.tobytes()
    buf.write(0, obj)
    assert store.put_tensor_from(key, buf.ptr, len(obj)) == 0
    assert store.put_tensor_from(key + "-s", buf.ptr, 100) == INVALID_PARAMS, "smaller than a header"
    assert store.put_tensor_from(key + "-t", buf.ptr, len(obj) - 4) == INVALID_PARAMS, "truncated"
    assert store.put_tensor_from(key + "-0", 0, 400) == INVALID_PARAMS
    into = buf.ptr + 4096
    got = store.get_tensor_into(key, into, 8192)
    assert np.array_equal(arr(got), a)
    assert arr(got).ctypes.data == into + HEADER, "a view of the buffer, past the header"
    assert store.get_tensor_into(key, into, 100) is None, "a buffer smaller than the object"
    assert store.get_tensor_into(key + "-missing", into, 8192) is None
    assert store.get_tensor_into(key, 0, 8192) is None
    got = store.batch_get_tensor_into([key, key + "-missing"], [into, into + 16384], [8192, 8192])
    assert np.array_equal(arr(got[0]), a) and got[1] is None
    assert store.batch_get_tensor_into([key], [into], []) == [INVALID_PARAMS]
    assert store.batch_get_tensor_into([key], [0], [10]) == [INVALID_PARAMS]
    assert store.batch_put_tensor_from([key + "-g1", key + "-g2"], [buf.ptr, buf.ptr], [len(obj), 10]) == [
        INVALID_PARAMS
    ] * 2, "one bad object fails the batch"
    assert store.batch_put_tensor_from([], [], []) == []
    assert store.batch_put_tensor_from([key + "-g1"], [buf.ptr], [len(obj)]) == [0]
    assert store.upsert_tensor_from(key, buf.ptr, len(obj)) == 0
    assert store.batch_upsert_tensor_from([key], [buf.ptr], [len(obj)]) == [0]


# ---- tensor parallelism: the original's ParallelAxis / TensorParallelism / ReadTarget, built ----


def ax(kind, rank, size, split_dim=None, expert=None, stage=None):
    """A `ParallelAxis` (`expert_id` / `stage_id` / `split_dim` set only when given)."""
    from mooncake.store import ParallelAxis

    a = ParallelAxis()
    a.kind, a.rank, a.size = kind, rank, size
    if split_dim is not None:
        a.split_dim = split_dim
    if expert is not None:
        a.expert_id = expert
    if stage is not None:
        a.stage_id = stage
    return a


def par(*axes):
    """A `TensorParallelism` of `axes`."""
    from mooncake.store import TensorParallelism

    p = TensorParallelism()
    p.axes = list(axes)
    return p


def tp(rank, size, split_dim=1, kind="tp"):
    """A parallelism of one axis (TP by default)."""
    return par(ax(kind, rank, size, split_dim))


def shard(*axes):
    """A "shard" `ReadTarget` of `axes`."""
    from mooncake.store import ReadTarget

    t = ReadTarget()
    t.mode = "shard"
    t.parallelism = par(*axes)
    return t


def shard_target(rank, size, split_dim=1, kind="tp"):
    """A "shard" target of one axis (TP by default)."""
    return shard(ax(kind, rank, size, split_dim))


def test_with_parallelism_calls_without_a_shard_request_store_the_full_tensor(store, buf, key):
    from mooncake.store import ReadTarget, ReplicateConfig, TensorParallelism

    t = torch.Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert store.put_tensor_with_parallelism(key, t) == 0
    assert np.array_equal(arr(store.get_tensor(key)), arr(t)), "the full tensor under the key itself"
    assert np.array_equal(arr(store.get_tensor_with_parallelism(key)), arr(t))
    stored = ReadTarget()
    assert stored.mode == "as_stored"
    assert np.array_equal(arr(store.get_tensor_with_parallelism(key, stored)), arr(t))
    assert store.upsert_tensor_with_parallelism(key, torch.Tensor(arr(t) + 1)) == 0
    assert np.array_equal(arr(store.get_tensor(key)), arr(t) + 1)
    keys = [key + "-a", key + "-b"]
    assert store.batch_put_tensor_with_parallelism(keys, [t, torch.Tensor(arr(t) * 2)], config=ReplicateConfig()) == [0, 0]
    got = store.batch_get_tensor_with_parallelism(keys)
    assert np.array_equal(arr(got[0]), arr(t)) and np.array_equal(arr(got[1]), arr(t) * 2)
    got = store.batch_get_tensor_with_parallelism(keys, [None, stored])
    assert np.array_equal(arr(got[1]), arr(t) * 2)
    assert store.batch_get_tensor_with_parallelism(keys, [None]) == [None, None], "one target per key"
    assert store.batch_upsert_tensor_with_parallelism(keys, [t, t]) == [0, 0]
    assert store.batch_put_tensor_with_parallelism(keys, [t]) == [INVALID_PARAMS] * 2, "mismatched lists"
    # From registered memory: the tensor object (header, then bytes), checked.
    a = np.arange(8, dtype=np.int32).reshape(2, 4)
    obj = tensor_header(6, (2, 4), (2, 4), a.nbytes) + a.tobytes()
    buf.write(0, obj)
    assert store.put_tensor_with_parallelism_from(key + "-f", buf.ptr, len(obj)) == 0
    assert np.array_equal(arr(store.get_tensor(key + "-f")), a)
    assert store.upsert_tensor_with_parallelism_from(key + "-f", buf.ptr, len(obj), config=ReplicateConfig()) == 0
    assert store.put_tensor_with_parallelism_from(key + "-t", buf.ptr, len(obj) - 4, config=ReplicateConfig()) == INVALID_PARAMS
    assert store.batch_put_tensor_with_parallelism_from([key + "-g"], [buf.ptr], [len(obj)]) == [0]
    assert store.batch_upsert_tensor_with_parallelism_from([key + "-g"], [buf.ptr], [len(obj)]) == [0]
    into = buf.ptr + 4096
    assert np.array_equal(arr(store.get_tensor_with_parallelism_into(key + "-g", into, 4096)), a)
    got = store.batch_get_tensor_with_parallelism_into([key + "-g"], [into], [4096])
    assert np.array_equal(arr(got[0]), a)
    # A writer partition with a parallelism is refused before anything is written.
    assert store.put_tensor_with_parallelism(key + "-x", t, TensorParallelism(), writer_partition=object()) == INVALID_PARAMS
    assert store.get_tensor(key + "-x") is None


def test_a_single_tp_axis_stores_the_callers_shard_and_its_manifest(store, buf, key):

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    part = a[:, 2:]
    shard = torch.Tensor(np.ascontiguousarray(part))
    assert store.put_tensor_with_parallelism(key, shard, tp(1, 2)) == 0
    # Rank 1's object: the caller's tensor as a SHARD of the (3, 4) tensor, then the manifest of the split.
    raw = bytes(store.get_buffer(key + "_tp_1"))
    axis = (1, 0, 1, 2, 1, 0, 2)  # TP, axis 0, rank 1 of 2, split_dim 1, local extent 2
    assert raw == tensor_header(0, (3, 4), (3, 2), part.nbytes, [axis]) + part.tobytes()
    manifest = bytes(store.get_buffer(key + "__parallelism_manifest"))
    assert manifest == struct.pack("<IHHiiiii4x8q", 0x574D414E, 1, 96, 0, 2, 1, 2, 0, 3, 4, *[-1] * 6)
    assert store.get_tensor(key) is None, "nothing under the key itself"
    assert np.array_equal(arr(store.get_tensor_with_parallelism(key, shard_target(1, 2))), part)
    assert store.get_tensor_with_parallelism(key, shard_target(0, 2)) is None, "rank 0 was not written"
    # Another split with the other shards missing: the rank's object as stored (the original's fallback).
    assert np.array_equal(arr(store.get_tensor_with_parallelism(key, shard_target(1, 2, 0))), part)
    into = buf.ptr + 4096
    got = store.get_tensor_with_parallelism_into(key, into, 4096, shard_target(1, 2))
    assert np.array_equal(arr(got), part)
    assert store.upsert_tensor_with_parallelism(key, torch.Tensor(np.ascontiguousarray(part) + 1), tp(1, 2)) == 0
    assert np.array_equal(arr(store.get_tensor_with_parallelism(key, shard_target(1, 2))), part + 1)
    # Batches go key by key, each with its own parallelism (None: the full tensor under the key).
    rows = torch.Tensor(np.ascontiguousarray(a[:1]))
    keys = [key + "-r", key + "-f"]
    assert store.batch_put_tensor_with_parallelism(keys, [rows, torch.Tensor(a)], [tp(0, 3, 0), None]) == [0, 0]
    assert np.array_equal(arr(store.get_tensor_with_parallelism(keys[0], shard_target(0, 3, 0))), a[:1])
    assert np.array_equal(arr(store.get_tensor(keys[1])), a)
    assert store.batch_put_tensor_with_parallelism(keys, [rows, rows], [tp(0, 3, 0)]) == [INVALID_PARAMS] * 2
    # What the original refuses: a rank out of range, no split_dim, a kind it does not know.
    assert store.put_tensor_with_parallelism(key + "-x", shard, tp(2, 2)) == INVALID_PARAMS
    assert store.put_tensor_with_parallelism(key + "-x", shard, tp(0, 2, None)) == INVALID_PARAMS
    assert store.put_tensor_with_parallelism(key + "-x", shard, tp(0, 2, 1, "zz")) == INVALID_PARAMS
    assert store.get_tensor(key + "-x_tp_0") is None


def test_a_writer_partition_stores_the_ranks_slice_of_the_full_tensor(store, buf, key):
    """The original's `writer_partition` route (0.3.13): the caller's full tensor, rank's even slice stored as a
    SHARD of one TP axis under `{key}__writer_{r}of{n}_sd{d}`, the manifest under `{key}__writer_manifest`; a
    "shard" target of the same TP axis reads it back (after `{key}_tp_{r}`, which wins when both exist)."""
    if store is None:
        return
    W = types.SimpleNamespace
    whole = np.arange(24, dtype=np.float32).reshape(4, 6)
    assert store.put_tensor_with_parallelism(key, torch.Tensor(whole), writer_partition=W(rank=1, size=2, split_dim=1)) == 0
    part = whole[:, 3:]
    axis = (1, 0, 1, 2, 1, 0, 3)  # TP, axis 0, rank 1 of 2, split_dim 1, local extent 3
    assert bytes(store.get_buffer(key + "__writer_1of2_sd1")) == tensor_header(0, (4, 6), (4, 3), part.nbytes, [axis]) + part.tobytes()
    manifest = struct.pack("<IHHiiiii4x8q", 0x574D414E, 1, 96, 0, 2, 1, 2, 0, 4, 6, *[-1] * 6)
    assert bytes(store.get_buffer(key + "__writer_manifest")) == manifest
    for other in ("", "__parallelism_manifest", "_tp_1"):
        assert store.get_buffer(key + other) is None, f"nothing under {key + other}"
    assert np.array_equal(arr(store.get_tensor_with_parallelism(key, shard_target(1, 2))), part)
    for target in (shard_target(0, 2), shard_target(1, 2, 0), shard_target(0, 3), shard_target(1, 1)):
        assert store.get_tensor_with_parallelism(key, target) is None
    got = store.get_tensor_with_parallelism_into(key, buf.ptr + 4096, 4096, shard_target(1, 2))
    assert np.array_equal(arr(got), part)
    assert store.upsert_tensor_with_parallelism(key, torch.Tensor(whole + 1), writer_partition=W(rank=1, size=2, split_dim=1)) == 0
    assert np.array_equal(arr(store.get_tensor_with_parallelism(key, shard_target(1, 2))), part + 1)
    # A TP-parallelism shard of the same rank is read first.
    rank1 = np.ascontiguousarray(whole[:, 3:] * 10)
    assert store.put_tensor_with_parallelism(key, torch.Tensor(rank1), tp(1, 2)) == 0
    assert np.array_equal(arr(store.get_tensor_with_parallelism(key, shard_target(1, 2))), rank1)
    # What the original refuses: an uneven split, no attributes, a rank out of range, a split past the shape,
    # a writer partition together with a parallelism.
    for bad in (W(rank=0, size=4, split_dim=1), (0, 2, 1), W(rank=-1, size=2, split_dim=1), W(rank=1, size=2, split_dim=5)):
        assert store.put_tensor_with_parallelism(key + "-x", torch.Tensor(whole), writer_partition=bad) == INVALID_PARAMS
    assert store.put_tensor_with_parallelism(key + "-x", torch.Tensor(whole), tp(0, 2), writer_partition=W(rank=0, size=2, split_dim=1)) == INVALID_PARAMS
    assert store.get_buffer(key + "-x__writer_manifest") is None
    # Batches: one partition per key (None: the full tensor under the key), never with `parallelisms`.
    keys = [key + "-d", key + "-e", key + "-g"]
    parts = [W(rank=0, size=2, split_dim=0), W(rank=1, size=3, split_dim=1), None]
    assert store.batch_put_tensor_with_parallelism(keys, [torch.Tensor(whole)] * 3, writer_partitions=parts) == [0, 0, 0]
    assert np.array_equal(arr(store.get_tensor_with_parallelism(keys[0], shard_target(0, 2, 0))), whole[:2])
    assert np.array_equal(arr(store.get_tensor_with_parallelism(keys[1], shard_target(1, 3, 1))), whole[:, 2:4])
    assert np.array_equal(arr(store.get_tensor(keys[2])), whole)
    assert store.get_buffer(keys[2] + "__writer_manifest") is None
    assert store.batch_put_tensor_with_parallelism(keys[:2], [torch.Tensor(whole)] * 2, writer_partitions=parts[:1]) == [INVALID_PARAMS] * 2
    assert store.batch_put_tensor_with_parallelism(keys[:1], [torch.Tensor(whole)], [None], writer_partitions=parts[:1]) == [INVALID_PARAMS]
    assert store.batch_upsert_tensor_with_parallelism(keys[:1], [torch.Tensor(whole + 5)], writer_partitions=parts[:1]) == [0]
    assert np.array_equal(arr(store.get_tensor_with_parallelism(keys[0], shard_target(0, 2, 0))), whole[:2] + 5)
    # The `_from` forms take the full tensor object from registered memory.
    assert store.put_tensor(key + "-full", torch.Tensor(whole)) == 0
    obj = bytes(store.get_buffer(key + "-full"))
    buf.write(0, obj)
    assert store.put_tensor_with_parallelism_from(key + "-j", buf.ptr, len(obj), writer_partition=W(rank=1, size=2, split_dim=1)) == 0
    assert store.batch_put_tensor_with_parallelism_from([key + "-k"], [buf.ptr], [len(obj)], writer_partitions=[W(rank=0, size=2, split_dim=1)]) == [0]
    assert np.array_equal(arr(store.get_tensor_with_parallelism(key + "-j", shard_target(1, 2))), part)
    assert np.array_equal(arr(store.get_tensor_with_parallelism(key + "-k", shard_target(0, 2))), whole[:, :3])
    assert store.get_buffer(key + "-j") is None
    assert store.put_tensor_with_parallelism_from(key + "-l", buf.ptr, len(obj) - 4, writer_partition=W(rank=1, size=2, split_dim=1)) == INVALID_PARAMS


def test_a_shard_read_with_another_tp_size_re_shards_from_the_whole(store, buf, key):
    """The original (0.3.13) answers a "shard" read of another TP size from every stored shard joined: rank r of
    n is the r-th of n equal slices along the stored split; the same size, another split or a size that does not
    divide it reads the rank's stored shard; "full" and non-TP targets answer None."""

    whole = np.arange(24, dtype=np.float32).reshape(4, 6)
    for r in range(2):
        part = torch.Tensor(np.ascontiguousarray(whole[:, r * 3:(r + 1) * 3]))
        assert store.put_tensor_with_parallelism(key, part, tp(r, 2)) == 0
    cases = {(3, 0, 1): whole[:, 0:2], (3, 2, 1): whole[:, 4:6], (6, 5, 1): whole[:, 5:6], (1, 0, 1): whole,
             (2, 1, 1): whole[:, 3:6], (2, 1, 0): whole[:, 3:6], (4, 0, 1): whole[:, 0:3], (3, 0, 0): whole[:, 0:3]}
    for (size, rank, dim), want in cases.items():
        got = store.get_tensor_with_parallelism(key, shard_target(rank, size, dim))
        assert got is not None and np.array_equal(arr(got), want), (size, rank, dim)
    assert store.get_tensor_with_parallelism(key, shard_target(0, 2, 1, "dp")) is None
    from mooncake.store import ReadTarget

    full = ReadTarget()
    full.mode = "full"
    assert store.get_tensor_with_parallelism(key, full) is None
    into = buf.ptr + 4096
    assert np.array_equal(arr(store.get_tensor_with_parallelism_into(key, into, 4096, shard_target(1, 3))), whole[:, 2:4])
    got = store.batch_get_tensor_with_parallelism([key, key], [shard_target(1, 3), shard_target(0, 2)])
    assert np.array_equal(arr(got[0]), whole[:, 2:4]) and np.array_equal(arr(got[1]), whole[:, 0:3])


def test_dp_ep_pp_and_several_axes_store_their_shard_under_the_planned_key(store, key):
    """The original (0.3.13): one DP, EP or PP axis stores the caller's tensor whole as a SHARD object (global
    shape = local shape, the axis with its expert or stage id) under `{key}__dp_{r}of{n}`,
    `{key}__ep_{r}of{n}_eid{e}`, `{key}__pp_{r}of{n}_sid{s}`, no manifest; a "shard" target of the same axis
    reads it; several axes, a split_dim on such an axis or a missing id are −600."""

    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = torch.Tensor(a)
    cases = [(ax("dp", 1, 2), f"{key}__dp_1of2", (0, 0, 1, 2, -1, 0, 0)),
             (ax("ep", 0, 2, expert=3), f"{key}__ep_0of2_eid3", (2, 0, 0, 2, -1, 3, 0)),
             (ax("pp", 0, 2, stage=1), f"{key}__pp_0of2_sid1", (3, 0, 0, 2, -1, 1, 0))]
    for axis, stored_key, fields in cases:
        assert store.put_tensor_with_parallelism(key, t, par(axis)) == 0
        raw = bytes(store.get_buffer(stored_key))
        head = tensor_header(0, (4, 6), (4, 6), a.nbytes, [fields])
        assert raw[:304] == head[:304] and raw[304:] == a.tobytes(), stored_key
        assert np.array_equal(arr(store.get_tensor_with_parallelism(key, shard(axis))), a)
    assert store.get_buffer(key + "__parallelism_manifest") is None
    assert store.get_tensor_with_parallelism(key) is None, "nothing under the key itself"
    assert store.get_tensor_with_parallelism(key, shard(ax("dp", 0, 2))) is None, "rank 0 was not written"
    assert store.get_tensor_with_parallelism(key, shard(ax("ep", 0, 2, expert=4))) is None
    # Several axes: the caller's tensor is the whole one; a TP axis among them cuts this rank's slice; one key
    # part per axis in kind order (dp, tp, ep, pp), the header's axes in the caller's order, a manifest with TP.
    assert store.put_tensor_with_parallelism(key + "-m", t, par(ax("tp", 1, 3, 1), ax("ep", 0, 2, expert=1))) == 0
    raw = bytes(store.get_buffer(f"{key}-m__tp_1of3_sd1__ep_0of2_eid1"))
    part = np.ascontiguousarray(a[:, 2:4])
    head = tensor_header(0, (4, 6), (4, 2), part.nbytes, [(1, 0, 1, 3, 1, 0, 2), (2, 1, 0, 2, -1, 1, 0)])
    assert raw == head + part.tobytes()
    assert bytes(store.get_buffer(key + "-m__parallelism_manifest")) == struct.pack(
        "<IHHiiiii4x8q", 0x574D414E, 1, 96, 0, 2, 1, 3, 0, 4, 6, *[-1] * 6)
    got = store.get_tensor_with_parallelism(key + "-m", shard(ax("ep", 0, 2, expert=1), ax("tp", 1, 3, 1)))
    assert np.array_equal(arr(got), part), "the same axes in another order"
    assert store.get_tensor_with_parallelism(key + "-m", shard(ax("tp", 1, 3, 1))) is None
    assert store.put_tensor_with_parallelism(key + "-n", t, par(ax("pp", 0, 2, stage=1), ax("dp", 0, 2))) == 0
    assert np.array_equal(arr(store.get_tensor_with_parallelism(key + "-n", shard(ax("dp", 0, 2), ax("pp", 0, 2, stage=1)))), a)
    assert store.get_buffer(key + "-n__parallelism_manifest") is None
    for refused in [par(ax("tp", 0, 2, 1), ax("tp", 0, 2, 0)), par(ax("dp", 0, 2), ax("dp", 1, 2)),
                    par(ax("ep", 0, 2)), par(ax("pp", 0, 2)), par(ax("dp", 0, 2, 1)), par(ax("tp", 0, 4, 1), ax("dp", 0, 2))]:
        axes = [(a.kind, a.rank, a.size, a.split_dim) for a in refused.axes]
        assert store.put_tensor_with_parallelism(key + "-x", t, refused) == INVALID_PARAMS, axes


def test_zero_copy_tensor_parallel_calls(store, buf, key):
    a = np.arange(16, dtype=np.int16).reshape(4, 4)
    obj = tensor_header(4, (4, 4), (4, 4), a.nbytes) + a.tobytes()
    buf.write(0, obj)
    assert store.put_tensor_with_tp_from(key, buf.ptr, len(obj), tp_rank=0, tp_size=2, split_dim=1) == 0
    got = store.get_tensor_with_tp_into(key, buf.ptr + 4096, 4096, tp_rank=1, tp_size=2)
    assert np.array_equal(arr(got), a[:, 2:])
    got = store.batch_get_tensor_with_tp_into([key], [buf.ptr + 8192], [4096], tp_rank=0, tp_size=2)
    assert np.array_equal(arr(got[0]), a[:, :2])
    assert store.batch_put_tensor_with_tp_from([key + "-b"], [buf.ptr], [len(obj)], 0, 2, 0) == [0]
    assert np.array_equal(arr(store.get_tensor(key + "-b_tp_1")), a[2:])
    assert store.put_tensor_with_tp_from(key + "-s", buf.ptr, 100, 0, 2, 0) == INVALID_PARAMS


def test_numpy_arrays_are_tensors_and_reads_are_numpy_without_torch(crescent_store, key, monkeypatch):
    """Crescent takes NumPy arrays as tensors too (the original takes torch tensors only: -600 for an array) and,
    without torch, reads tensors back as NumPy arrays."""
    monkeypatch.setitem(sys.modules, "torch", None)  # torch is not importable
    s = crescent_store
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    assert s.put_tensor(key, a) == 0
    assert s.get(key) == tensor_header(1, (3, 4), (3, 4), a.nbytes) + a.tobytes()
    got = s.get_tensor(key)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64 and np.array_equal(got, a)
    got[0, 0] = -1.0  # a copy of its own, writable
    assert s.put_tensor(key + "-t", a.T) == 0, "non-contiguous: stored C-contiguous"
    assert np.array_equal(s.get_tensor(key + "-t"), a.T)
    assert s.put_tensor(key + "-o", np.array(["x"], dtype=object)) == INVALID_PARAMS
    assert s.put_tensor(key + "-9", np.zeros((1,) * 9, dtype=np.uint8)) == INVALID_PARAMS, "over 8 dimensions"


class OnDevice:
    """A tensor in device memory: its data_ptr() is no host address (reading it would crash); cpu() copies it."""

    class device:
        type = "cuda"

    def __init__(self, host):
        self.host, self.dtype, self.shape = host, host.dtype, host.shape

    def data_ptr(self):
        return 0xDEAD0000

    def numel(self):
        return self.host.numel()

    def element_size(self):
        return self.host.element_size()

    def cpu(self):
        return self.host


def test_a_device_tensor_is_copied_to_the_host_first(crescent_store, key):
    a = np.arange(8, dtype=np.int32)
    assert crescent_store.put_tensor(key, OnDevice(torch.Tensor(a))) == 0
    assert np.array_equal(arr(crescent_store.get_tensor(key)), a)


def test_reads_are_torch_tensors_when_torch_is_importable(crescent_store, key, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", torch)
    s = crescent_store
    assert s.put_tensor(key, torch.Tensor(np.arange(4, dtype=np.uint16)).view(torch.bfloat16)) == 0
    got = s.get_tensor(key)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16


# ---- the async store ----


def test_the_async_store_awaits_every_call(impl, cluster, key):
    if impl == "original" and ENGINE_IMPL != "original":
        return  # conftest.py runs this item in the original's interpreter
    from mooncake.async_store import MooncakeDistributedStoreAsync

    s = MooncakeDistributedStoreAsync()

    async def scenario():
        assert await s.async_setup("localhost", "P2PHANDSHAKE", 64 * MiB, 64 * MiB, "tcp", "", cluster) == 0
        assert await s.async_put(key, b"hello") == 0
        assert await s.async_get(key) == b"hello"
        assert await s.async_is_exist(key) == 1
        assert await s.async_batch_is_exist([key, key + "-missing"]) == [1, 0]
        assert await s.async_remove(key, force=True) == 0  # the reads leased it
        with pytest.raises(AttributeError):
            s.async_no_such_call  # noqa: B018 (the lookup is what is tested)
        with pytest.raises(AttributeError):
            s.no_such_call  # noqa: B018

    try:
        asyncio.run(scenario())
    finally:
        s.close()


def test_an_async_call_leaves_the_event_loop_running():
    """While one call blocks its thread, the loop runs other coroutines (the blocking call is a stand-in method
    that sleeps: the sleep is the blocking work, not a synchronisation)."""
    from mooncake.async_store import MooncakeDistributedStoreAsync

    s = MooncakeDistributedStoreAsync()
    s.blocking = lambda: time.sleep(0.3) or "done"
    ticks = []

    async def ticker():
        for _ in range(5):
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    async def scenario():
        result, _ = await asyncio.gather(s.async_blocking(), ticker())
        return result

    assert asyncio.run(scenario()) == "done"
    assert len(ticks) == 5


def test_the_async_store_is_where_the_original_has_it():
    import mooncake.async_store
    import mooncake.store

    assert issubclass(mooncake.async_store.MooncakeDistributedStoreAsync, mooncake.store.MooncakeDistributedStore)
    if ENGINE_IMPL != "original":
        assert mooncake.store.MooncakeDistributedStoreAsync is mooncake.async_store.MooncakeDistributedStoreAsync


def _wait_task(s, task_id, timeout=30.0):
    """Polls `query_task` until the task ends (the original's nodes poll their tasks once a second)."""
    from mooncake.store import TaskStatus

    deadline = time.monotonic() + timeout
    while True:
        r, rc = s.query_task(task_id)
        assert rc == 0, rc
        if r.status in (TaskStatus.SUCCESS, TaskStatus.FAILED):
            return r
        assert time.monotonic() < deadline, f"task {task_id} still {r.status}"
        time.sleep(0.02)  # polling the task's status: the only way either system tells it


def test_copy_and_move_tasks_place_replicas_where_asked(impl, request):
    """`create_copy_task` / `create_move_task` / `query_task` (mooncake-store.md's API reference): a copy adds a
    replica on the named segment, a move takes the one on the source to the target, both end SUCCESS with the
    original's message, and the object stays readable from a store that held neither; submission errors and an
    unknown task answer the original's codes."""
    if impl == "original" and ENGINE_IMPL != "original":
        return
    from conftest import free_port
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig, TaskStatus, TaskType

    addr = request.getfixturevalue("cluster")
    stores, names = [], []
    for _ in range(3):
        s = MooncakeDistributedStore()
        name = f"127.0.0.1:{free_port()}"
        assert s.setup(name, "P2PHANDSHAKE", 64 * MiB, 16 * MiB, "tcp", "", addr) == 0
        stores.append(s)
        names.append(name)
    a, b, c = stores
    key = f"task-{uuid.uuid4().hex[:8]}"
    data = bytes(np.random.default_rng(7).integers(0, 256, 300_000, dtype=np.uint8))
    cfg = ReplicateConfig()
    cfg.preferred_segment = names[0]
    try:
        assert a.put(key, data, cfg) == 0
        assert len(a.get_replica_desc(key)) == 1

        tid, rc = a.create_copy_task(key, [names[1]])
        assert rc == 0 and tid != (0, 0) and isinstance(tid, tuple) and len(tid) == 2
        r, rc = a.query_task(tid)
        assert rc == 0 and r.id == tid and r.type == TaskType.REPLICA_COPY
        r = _wait_task(a, tid)
        assert (r.status, r.message) == (TaskStatus.SUCCESS, "Task completed successfully")
        assert r.last_updated_at_ms_epoch >= r.created_at_ms_epoch > 0
        assert len(a.get_replica_desc(key)) == 2

        tid, rc = a.create_move_task(key, names[1], names[2])
        assert rc == 0
        r = _wait_task(a, tid)
        assert (r.type, r.status) == (TaskType.REPLICA_MOVE, TaskStatus.SUCCESS), r.message
        assert len(a.get_replica_desc(key)) == 2
        # The copy on b went to c: with a's and c's replicas, b's store can go and the object is still whole.
        b.close()
        assert c.get(key) == data

        assert a.create_copy_task(key, [])[1] == INVALID_PARAMS
        assert a.create_copy_task("no-such-key", [names[2]])[1] == OBJECT_NOT_FOUND
        assert a.create_copy_task(key, ["127.0.0.1:1"])[1] == INVALID_PARAMS
        assert a.create_move_task(key, names[2], names[2])[1] == INVALID_PARAMS
        assert a.create_move_task(key, names[1], names[2])[1] == INVALID_PARAMS, "no replica on the source"
        assert a.create_move_task("no-such-key", names[0], names[2])[1] == OBJECT_NOT_FOUND
        assert a.query_task((1, 2)) == (None, -1400)
    finally:
        for s in (a, c):
            s.close()
