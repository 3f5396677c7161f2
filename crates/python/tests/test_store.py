"""The store API against a real master: every method and return convention of the original's surface."""

import ctypes
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

import crescent.store
import mooncake.store
from conftest import Master, MiB, master_count, new_store
from crescent import _crescent
from mooncake.store import MooncakeDistributedStore, ReplicaStatus, ReplicateConfig, SoftPinAction

INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
NOT_SET_UP = -1
LEASE_HELD = -706


def buf(n: int):
    """A ctypes buffer and its address."""
    b = ctypes.create_string_buffer(n)
    return b, ctypes.addressof(b)


# ---- module shape, ReplicateConfig, enums ----


def test_both_module_names_provide_the_same_objects():
    for name in ("MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ObjectDataType", "ReplicaStatus"):
        assert getattr(mooncake.store, name) is getattr(crescent.store, name)
    assert hasattr(ReplicateConfig, "group_ids")  # SGLang probes this


def test_replicate_config_defaults_attributes_and_str():
    c = ReplicateConfig()
    assert (c.replica_num, c.nof_replica_num, c.dfs_replica_num) == (1, 0, 0)
    assert c.soft_pin_action == SoftPinAction.PRESERVE and c.soft_pin_ttl_ms is None
    assert c.with_hard_pin is False and c.prefer_alloc_in_same_node is False
    assert c.preferred_segments == [] and c.preferred_segment == "" and c.preferred_nof_segments == []
    assert c.data_type == mooncake.store.ObjectDataType.UNKNOWN and c.group_ids is None
    c.replica_num = 2
    c.soft_pin_action = SoftPinAction.ENABLE
    c.soft_pin_ttl_ms = 1000
    c.preferred_segment = "h:1"
    c.group_ids = ["g"]
    assert (c.replica_num, c.soft_pin_ttl_ms, c.preferred_segment, c.group_ids) == (2, 1000, "h:1", ["g"])
    c.soft_pin_ttl_ms = None
    assert c.soft_pin_ttl_ms is None
    assert str(c).startswith("ReplicateConfig: { replica_num: 2,")
    assert ReplicateConfig(replica_num=3, group_ids=["a"]).replica_num == 3


@pytest.mark.parametrize("bad", [-1, 2**64, "5", 1.5])
def test_a_bad_soft_pin_ttl_is_a_type_error(bad):
    c = ReplicateConfig()
    with pytest.raises(TypeError):
        c.soft_pin_ttl_ms = bad
    with pytest.raises(TypeError):
        ReplicateConfig(soft_pin_ttl_ms=bad)


def test_enums_and_module_level_data_types():
    assert [int(SoftPinAction.PRESERVE), int(SoftPinAction.ENABLE), int(SoftPinAction.DISABLE)] == [0, 1, 2]
    assert mooncake.store.KVCACHE == mooncake.store.ObjectDataType.KVCACHE
    assert int(mooncake.store.ReplicaStatus.COMPLETE) == 3


@pytest.mark.parametrize(
    "text,size",
    [("1024", 1024), ("16MB", 16 * MiB), ("16 mb", 16 * MiB), ("1.5K", 1536), ("2G", 2 << 30), ("1tb", 1 << 40),
     ("7b", 7), ("infinite", 2**64 - 1), ("50%", None), ("", None), ("MB", None), ("1 XB", None), ("-1", None)],
)
def test_setup_dict_sizes_parse_as_the_original(text, size):
    assert _crescent._parse_size(text) == size


# ---- setup and lifecycle ----


def test_setup_positional_hostname_close_and_setup_again(master):
    s = MooncakeDistributedStore()
    assert s.close() == 0, "close of a store never set up"
    assert s.get_hostname() == ""
    assert s.health_check() == 1
    rc = s.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", master, None,
                 enable_ssd_offload=False, tenant_id="default", enable_client_http_server=False)
    assert rc == 0
    host, port = s.get_hostname().rsplit(":", 1)
    assert host == "localhost" and 12300 <= int(port) <= 14300
    assert s.health_check() == 0
    assert s.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", master) != 0, "set up twice"
    assert s.close() == 0
    assert s.health_check() == 1 and s.get_hostname() == ""
    assert s.put("x", b"1") == NOT_SET_UP and s.get("x") == b"" and s.is_exist("x") == NOT_SET_UP
    assert s.batch_is_exist(["a", "b"]) == [NOT_SET_UP, NOT_SET_UP]
    assert s.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", master) == 0, "set up again"
    assert s.put("again", b"v") == 0 and s.get("again") == b"v"
    s.remove_all(force=True)
    assert s.close() == 0


def test_setup_type_errors(master):
    s = MooncakeDistributedStore()
    with pytest.raises(TypeError):
        s.setup("localhost", "P2PHANDSHAKE", 16 * MiB)  # the first 7 are required
    with pytest.raises(TypeError):
        s.setup("localhost", "P2PHANDSHAKE", "16MB", 16 * MiB, "tcp", "", master)
    with pytest.raises(TypeError):
        s.setup("localhost", "P2PHANDSHAKE", -1, 16 * MiB, "tcp", "", master)
    with pytest.raises(TypeError):
        s.setup("localhost", "P2PHANDSHAKE", 0, 0, "tcp", "", master, None, no_such_option=1)
    assert s.get_hostname() == ""


def test_setup_dict_form(master):
    s = MooncakeDistributedStore()
    cfg = {"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "16MB",
           "local_buffer_size": "1.5 mb", "protocol": "tcp", "master_server_addr": master}
    assert s.setup(cfg) == 0
    assert s.put("d", bytes(MiB)) == 0, "1 MiB fits the 1.5 MiB staging buffer"
    assert s.put("e", bytes(2 * MiB)) == INVALID_PARAMS, "2 MiB does not"
    s.remove_all(force=True)
    s.close()
    assert s.setup(dict(cfg, global_segment_size="50%")) == INVALID_PARAMS
    missing = dict(cfg)
    del missing["metadata_server"]
    assert s.setup(missing) == INVALID_PARAMS
    assert s.get_hostname() == ""


def test_setup_against_no_master_fails_with_a_code():
    s = MooncakeDistributedStore()
    dead = "127.0.0.1:1"
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", dead) < 0
    assert s.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", dead) < 0
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "ipx", "", dead) == INVALID_PARAMS


def test_rdma_falls_back_to_tcp(master):
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "rdma", "mlx5_0", master) == 0
    assert s.put("r", b"v") == 0 and s.get("r") == b"v"
    s.remove_all(force=True)
    s.close()


def test_a_segment_is_backed_in_the_background_as_far_as_the_host_spares_and_released_at_close():
    """setup does not wait for its segment's memory; a thread of the store backs it ahead of the writes (cold
    writes into pages faulted one by one ran at half the speed), as far as the host can spare memory, and close
    gives it all back."""
    def kib(field):
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field))

    segment = 512 << 20
    spare = kib("MemAvailable:") - kib("MemTotal:") // 8
    want = min(segment >> 10, spare - (128 << 10))
    assert want > 0, f"the host has no memory to spare for this test: {spare} KiB"
    m = Master()
    try:
        store = new_store(m.addr, segment=segment)
        base = segment_base(m.admin, store.get_hostname())
        deadline = time.monotonic() + 60
        while resident_kib(base, segment) < want and time.monotonic() < deadline:
            time.sleep(0.05)
        assert resident_kib(base, segment) >= want, f"backed {resident_kib(base, segment)} KiB of {segment >> 10}"
        store.close()
        # The backing thread lets go after the step in hand.
        deadline = time.monotonic() + 10
        while resident_kib(base, segment) > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert resident_kib(base, segment) == 0, "close gives the segment's memory back"
    finally:
        m.stop()


def resident_kib(base, size):
    """KiB of this process's [base, base + size) backed by memory now (the present bits of /proc/self/pagemap)."""
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(base // page * 8)
        entries = f.read(size // page * 8)
    return sum(1 for (e,) in struct.iter_unpack("<Q", entries) if e >> 63) * page // 1024


def segment_base(admin, name):
    """The base address of the segment named `name`, from the master's /get_segments_detail."""
    import json
    import urllib.request

    detail = json.loads(urllib.request.urlopen(f"http://{admin}/get_segments_detail", timeout=10).read())
    return next(int(s["base_address"], 16) for s in detail["segments"] if s["segment_name"] == name)


def test_crescent_store_prefault_off_backs_the_segment_only_as_it_is_written(monkeypatch):
    """CRESCENT_STORE_PREFAULT=off: the segment is backed as it is first written (as the original's), while a
    store set up with the default beside it gets its own backed."""
    m = Master()
    lazy_size, spare_size = 320 << 20, 448 << 20
    stores = []
    try:
        monkeypatch.setenv("CRESCENT_STORE_PREFAULT", "off")
        stores.append(new_store(m.addr, segment=lazy_size))
        monkeypatch.delenv("CRESCENT_STORE_PREFAULT")
        stores.append(new_store(m.addr, segment=spare_size))
        lazy, spare = (segment_base(m.admin, s.get_hostname()) for s in stores)
        deadline = time.monotonic() + 60
        while resident_kib(spare, spare_size) < spare_size >> 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert resident_kib(spare, spare_size) == spare_size >> 10, "the default backs all of its segment"
        assert resident_kib(lazy, lazy_size) == 0, "nothing backed with prefault off"
    finally:
        for s in stores:
            s.close()
        m.stop()


# ---- copying calls ----


def test_put_and_get_convention(store, key):
    assert store.put(key, b"hello") == 0
    assert store.get(key) == b"hello"
    assert store.put(key, b"other") == 0, "an existing key is success"
    assert store.get(key) == b"hello", "and keeps its value"
    assert store.get(key + "-missing") == b""
    assert store.put(key + "-ba", bytearray(b"ba")) == 0 and store.get(key + "-ba") == b"ba"
    assert store.put(key + "-mv", memoryview(b"xmvx")[1:3]) == 0 and store.get(key + "-mv") == b"mv"
    assert store.put(key=key + "-kw", value=b"kw", config=ReplicateConfig()) == 0
    with pytest.raises(TypeError):
        store.put(key + "-int", 5)
    with pytest.raises(TypeError):
        store.get(key=key)  # positional-only, as the original
    assert store.put("", b"x") == INVALID_PARAMS, "an empty key"


def test_zero_local_buffer_cannot_put_and_leaves_nothing(master, store, key):
    thin = new_store(master, segment=0, local=0)
    assert thin.put(key, b"value") != 0
    assert thin.is_exist(key) == 0
    assert thin.put_batch([key], [b"value"]) != 0
    thin.close()


def test_put_parts(store, key):
    assert store.put_parts(key, b"ab", bytearray(b"cd"), memoryview(b"ef")) == 0
    assert store.get(key) == b"abcdef"
    with pytest.raises(RuntimeError):
        store.put_parts(key + "-bad", b"ab", 5)


def test_put_batch_and_get_batch(store, key):
    keys = [f"{key}-{i}" for i in range(5)]
    values = [bytes([i]) * (i * 1000 + 1) for i in range(5)]
    assert store.put_batch(keys, values) == 0
    assert store.get_batch(keys) == values
    assert store.get_batch([keys[0], key + "-missing"]) == [values[0], b""]
    assert store.put_batch(keys, values[:2]) == INVALID_PARAMS
    assert store.put_batch([], []) == 0
    assert store.get_batch([]) == []
    assert store.put_batch([key + "-ok", ""], [b"a", b"b"]) == INVALID_PARAMS, "the first error"


def test_get_buffer_has_the_buffer_protocol(store, key):
    assert store.put(key, b"buffer-value") == 0
    h = store.get_buffer(key)
    assert h is not None
    assert bytes(h) == b"buffer-value" and memoryview(h).tobytes() == b"buffer-value"
    assert len(h) == h.size() == 12
    assert ctypes.string_at(h.ptr(), h.size()) == b"buffer-value"
    assert store.get_buffer(key + "-missing") is None
    got = store.batch_get_buffer([key, key + "-missing"])
    assert bytes(got[0]) == b"buffer-value" and got[1] is None
    assert store.batch_get_buffer([]) == []


def test_copying_gets_of_every_size_return_whole_bytes(store, key):
    # Small values are staged then copied; from 64 KiB on they are read straight into the new `bytes`.
    sizes = [1, 64 * 1024 - 1, 64 * 1024, 3 * MiB + 7]
    keys = [f"{key}-{n}" for n in sizes]
    values = [os.urandom(n) for n in sizes]
    assert store.put_batch(keys, values) == 0
    for k, v in zip(keys, values):
        got = store.get(k)
        assert type(got) is bytes and got == v, len(v)
        assert bytes(store.get_buffer(k)) == v
    assert store.get_batch(keys + [key + "-missing"]) == values + [b""]
    # The large `bytes` are ordinary objects: hashable, immutable, and equal values hash alike.
    big = store.get(keys[-1])
    assert hash(big) == hash(bytes(values[-1]))


def test_copying_get_is_bounded_by_the_local_buffer(master, store, key):
    small = new_store(master, segment=0, local=1024)
    assert store.put(key, bytes(4096)) == 0
    assert small.get(key) == b"", "larger than the staging buffer"
    assert small.get_buffer(key) is None
    small.close()


# ---- metadata ----


def test_exist_size_and_remove(store, key):
    assert store.put(key, b"12345") == 0
    assert store.is_exist(key) == 1
    assert store.is_exist(key + "-missing") == 0
    assert store.batch_is_exist([key, key + "-missing"]) == [1, 0]
    assert store.batch_is_exist([]) == []
    assert store.get_size(key) == 5
    assert store.get_size(key + "-missing") == OBJECT_NOT_FOUND
    assert store.remove(key, force=True) == 0, "is_exist leased it: force"
    assert store.remove(key) == OBJECT_NOT_FOUND
    assert store.is_exist(key) == 0
    assert store.put(key + "-unread", b"v") == 0
    assert store.remove(key + "-unread") == 0


def test_replica_descriptors_say_where_each_replica_is(master, key):
    a, b = new_store(master), new_store(master)
    try:
        assert a.put(key, b"x" * 5000, ReplicateConfig(replica_num=2)) == 0
        replicas = a.get_replica_desc(key)
        assert len(replicas) == 2, "one replica in each store's segment"
        endpoints = set()
        for r in replicas:
            assert r.status == ReplicaStatus.COMPLETE
            assert r.is_memory_replica() and not r.is_disk_replica() and not r.is_local_disk_replica()
            d = r.get_memory_descriptor().buffer_descriptor
            assert d.size == 5000 and d.buffer_address >= 0
            assert repr(d) == f"<Descriptor size=5000 buffer_address={d.buffer_address} transport_endpoint={d.transport_endpoint}>"
            endpoints.add(d.transport_endpoint)
            with pytest.raises(RuntimeError):
                r.get_disk_descriptor()
        assert len(endpoints) == 2
        assert a.get_replica_desc(key + "-missing") == []
        found = a.batch_get_replica_desc([key, key + "-missing"])
        assert list(found) == [key], "only the keys found"
        assert [r.get_memory_descriptor().buffer_descriptor.size for r in found[key]] == [5000, 5000]
        assert a.batch_get_replica_desc([]) == {}
    finally:
        a.remove_all(force=True)
        a.close()
        b.close()
    assert a.get_replica_desc(key) == [], "a closed store returns nothing"


def test_batch_remove_by_regex_and_remove_all(store, key):
    keys = [f"{key}-{i}" for i in range(6)]
    assert store.put_batch(keys, [b"v"] * 6) == 0
    assert store.batch_remove(keys[:2] + [key + "-missing"]) == [0, 0, OBJECT_NOT_FOUND]
    assert store.batch_remove([]) == []
    assert store.remove_by_regex(f"^{key}-[23]$") == 2
    assert store.batch_is_exist(keys) == [0, 0, 0, 0, 1, 1]
    assert store.remove_by_regex("(unclosed") < 0
    assert store.remove_all(force=True) == 2
    assert store.remove_all() == 0


def test_batch_replica_clear_takes_only_the_callers_unleased_objects(master, key):
    a, b = new_store(master), new_store(master)
    try:
        two = ReplicateConfig(replica_num=2)
        assert a.put(key + "-mine", b"v", two) == 0 and a.put(key + "-read", b"v") == 0
        assert b.put(key + "-theirs", b"v") == 0
        # An existence check leases the object to its deadline (a put leases nothing, as in the original).
        assert a.is_exist(key + "-read") == 1
        asked = [key + "-mine", key + "-read", key + "-theirs", key + "-missing", ""]
        assert a.batch_replica_clear(asked, segment_name="nowhere:1") == [], "no replica on that segment"
        assert a.batch_replica_clear(asked, segment_name=a.get_hostname()) == [key + "-mine"]
        assert b.get(key + "-mine") == b"v", "its replica in b's segment still serves it"
        assert a.batch_replica_clear(asked[1:]) == [], "leased, another's, absent and invalid skipped"
        time.sleep(0.6)  # the master's 500 ms read lease runs out
        assert a.batch_replica_clear(asked) == [key + "-mine", key + "-read"], "in input order"
        assert a.is_exist(key + "-mine") == 0 and a.is_exist(key + "-read") == 0
        assert b.batch_replica_clear([key + "-theirs"]) == [key + "-theirs"]
        assert a.batch_replica_clear([]) == []
    finally:
        a.close()
        b.close()


def test_a_store_given_a_port_in_use_keeps_its_name_and_listens_on_a_free_one(master, key):
    # As the original's (its transfer engine listens on a free port whatever the name says): both stores are
    # named alike, so an object's replicas (on distinct names) land in one of them.
    a = new_store(master)
    b = MooncakeDistributedStore()
    try:
        assert b.setup(a.get_hostname(), "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", master) == 0
        assert b.get_hostname() == a.get_hostname()
        assert b.put(key, b"v", ReplicateConfig(replica_num=2)) == 0
        assert a.get(key) == b"v" and b.get(key) == b"v"
        assert len(b.get_replica_desc(key)) == 1, "one name, one replica"
    finally:
        a.close()
        b.close()


def test_upsert_family(store, key):
    assert store.upsert(key, b"one") == 0
    assert store.upsert(key, b"two") == 0
    assert store.get(key) == b"two", "upsert replaces"
    assert store.upsert_parts(key, b"th", b"ree") == 0 and store.get(key) == b"three"
    assert store.upsert_batch([key, key + "-b"], [b"4", b"5"]) == 0
    assert store.get_batch([key, key + "-b"]) == [b"4", b"5"]
    pinned = ReplicateConfig(soft_pin_ttl_ms=1000)
    assert store.upsert(key, b"x", pinned) == INVALID_PARAMS, "a soft-pin TTL with PRESERVE"
    pinned.soft_pin_action = SoftPinAction.DISABLE
    assert store.upsert(key, b"x", pinned) == INVALID_PARAMS
    pinned.soft_pin_action = SoftPinAction.ENABLE
    assert store.upsert(key, b"x", pinned) == 0


# ---- zero-copy calls ----


def test_put_from_and_get_into(store, key):
    src, src_ptr = buf(4096)
    dst, dst_ptr = buf(4096)
    src.raw = bytes(range(256)) * 16
    # Unregistered memory is the caller's to name, as with the original over TCP (LMCache without a pinned
    # buffer relies on it): it is read and written; a null address is refused.
    loose, loose_ptr = buf(4096)
    assert store.put_from(key + "-loose", src_ptr, 4096) == 0, "unregistered memory"
    assert store.get_into(key + "-loose", loose_ptr, 4096) == 4096 and loose.raw == src.raw
    assert store.put_from(key + "-null", 0, 16) == INVALID_PARAMS
    assert store.register_buffer(src_ptr, 4096) == 0
    assert store.register_buffer(dst_ptr, 4096) == 0
    assert store.register_buffer(src_ptr + 8, 16) == INVALID_PARAMS, "overlaps a registered buffer"
    assert store.put_from(key=key, buffer_ptr=src_ptr, size=4096) == 0
    assert store.get_into(key, dst_ptr, 4096) == 4096
    assert dst.raw == src.raw
    assert store.get_into(key, dst_ptr, 100) == INVALID_PARAMS, "smaller than the object (the original's code)"
    assert store.get_into(key, dst_ptr + 1, 4096) == INVALID_PARAMS, "runs past the registered buffer"
    assert store.get_into(key + "-missing", dst_ptr, 4096) == OBJECT_NOT_FOUND
    assert store.put_from(key + "-part", src_ptr + 100, 50) == 0
    assert store.get_into(key + "-part", dst_ptr, 4096) == 50 and dst.raw[:50] == src.raw[100:150]
    assert store.upsert_from(key, src_ptr, 10) == 0 and store.get_size(key) == 10
    assert store.unregister_buffer(dst_ptr) == 0
    assert store.unregister_buffer(dst_ptr) == INVALID_PARAMS
    assert store.get_into(key, dst_ptr, 4096) == 10, "unregistered again: the caller's memory still"
    assert store.get_into(key, 0, 4096) == INVALID_PARAMS, "null"
    assert store.unregister_buffer(src_ptr) == 0


def test_batch_put_from_and_batch_get_into(store, key):
    n, size = 8, 8192
    src, src_ptr = buf(n * size)
    dst, dst_ptr = buf(n * size)
    src.raw = bytes((i * 7) % 251 for i in range(n * size))
    assert store.register_buffer(src_ptr, n * size) == 0
    assert store.register_buffer(dst_ptr, n * size) == 0
    keys = [f"{key}-{i}" for i in range(n)]
    ptrs = [src_ptr + i * size for i in range(n)]
    assert store.batch_put_from(keys, ptrs, [size] * n) == [0] * n
    assert store.batch_is_exist(keys) == [1] * n
    got = store.batch_get_into(keys, [dst_ptr + i * size for i in range(n)], [size] * n)
    assert got == [size] * n and dst.raw == src.raw
    # Mismatched lengths: one negative per key; empty lists: [].
    assert all(r < 0 for r in store.batch_put_from(keys, ptrs[:2], [size] * n)) and len(keys) == n
    assert len(store.batch_get_into(keys, ptrs, [size])) == n
    assert all(r < 0 for r in store.batch_get_into(keys, ptrs, [size]))
    assert store.batch_put_from([], [], []) == [] and store.batch_get_into([], [], []) == []
    # Per key: a miss, a range straddling a registered buffer's end and a too-small buffer fail alone; unregistered
    # memory clear of every registration is the caller's (as the original over TCP).
    stray, stray_ptr = buf(size)
    got = store.batch_get_into([keys[0], key + "-missing", keys[1], keys[2], keys[1]],
                               [dst_ptr, dst_ptr + size, dst_ptr + n * size - 8, dst_ptr + 2 * size, stray_ptr],
                               [size, size, size, 10, size])
    assert got == [size, OBJECT_NOT_FOUND, INVALID_PARAMS, INVALID_PARAMS, size]
    assert store.batch_put_from([key + "-x", key + "-y"], [dst_ptr + n * size - 8, src_ptr], [size, size]) == [
        INVALID_PARAMS, 0]
    assert store.is_exist(key + "-x") == 0


@pytest.fixture
def leasing_master():
    """A master of this test's own, with a 10 s lease (a read that follows a lookup well inside it)."""
    m = Master("--lease-ttl-ms", "10000")
    yield m
    m.stop()


def test_a_prefix_lookup_counts_and_leases_the_run_and_the_read_after_it_needs_no_lookup(leasing_master, key):
    """``batch_is_exist_prefix`` (Crescent's): SGLang's ``batch_exists`` count in one request, the run leased in
    the same step; the ``batch_get_into`` of that run that follows reads with the lookup's replica lists."""
    master = leasing_master
    store = new_store(master.addr)
    n, size = 6, 4096
    src, src_ptr = buf(n * size)
    dst, dst_ptr = buf(n * size)
    src.raw = bytes((i * 13) % 251 for i in range(n * size))
    assert store.register_buffer(src_ptr, n * size) == 0
    assert store.register_buffer(dst_ptr, n * size) == 0
    keys = [f"{key}-{i}" for i in range(n)]
    written = [0, 1, 2, 4, 5]  # block 3 is missing: the prefix is 3 long
    assert store.batch_put_from([keys[i] for i in written], [src_ptr + i * size for i in written], [size] * 5) == [0] * 5
    prefix_lookups = master_count(master.admin, "requests_total", "batch_prefix_lease")
    lookups = master_count(master.admin, "requests_total", "batch_get_replica_list")
    assert store.batch_is_exist_prefix(keys) == 3
    assert master_count(master.admin, "requests_total", "batch_prefix_lease") == prefix_lookups + 1, "one request"
    assert store.remove(keys[1]) == LEASE_HELD, "the run is leased"
    assert store.remove(keys[4]) == 0, "a key past the gap is not"
    got = store.batch_get_into(keys[:3], [dst_ptr + i * size for i in range(3)], [size] * 3)
    assert got == [size] * 3 and dst.raw[:3 * size] == src.raw[:3 * size]
    assert master_count(master.admin, "requests_total", "batch_get_replica_list") == lookups, "no lookup of its own"
    # Nothing cached, a missing first key, an empty or invalid first key: 0 (and nothing leased).
    assert store.batch_is_exist_prefix([key + "-none", keys[0]]) == 0
    assert store.batch_is_exist_prefix([]) == 0
    assert store.batch_is_exist_prefix(["", keys[0]]) == 0
    assert store.batch_is_exist_prefix(keys[:3]) == 3
    store.close()


def test_multi_buffer_calls_concatenate_and_scatter(store, key):
    a, a_ptr = buf(300)
    b, b_ptr = buf(700)
    out, out_ptr = buf(1000)
    out1, out1_ptr = buf(300)
    a.raw, b.raw = b"a" * 300, bytes(range(200)) * 3 + b"z" * 100
    for p, n in ((a_ptr, 300), (b_ptr, 700), (out_ptr, 1000), (out1_ptr, 300)):
        assert store.register_buffer(p, n) == 0
    assert store.batch_put_from_multi_buffers([key, key + "-1"], [[a_ptr, b_ptr], [a_ptr]], [[300, 700], [300]]) == [0, 0]
    assert store.get_size(key) == 1000
    # Split differently on the way back: 600 + 400 bytes.
    got = store.batch_get_into_multi_buffers([key, key + "-1"], [[out_ptr, out_ptr + 600], [out1_ptr]],
                                             [[600, 400], [300]])
    assert got == [1000, 300]
    assert out.raw == a.raw + b.raw and out1.raw == a.raw
    assert store.batch_get_into_multi_buffers([key], [[out_ptr]], [[10]], prefer_alloc_in_same_node=True)[0] < 0
    assert store.batch_put_from_multi_buffers([key], [[a_ptr], [b_ptr]], [[1]]) == [INVALID_PARAMS]
    assert store.batch_put_from_multi_buffers([], [], []) == []


# ---- threads, hosting, replicas ----


def test_threads_put_and_get_at_once(store, key):
    errors = []

    def work(t):
        for i in range(25):
            k, v = f"{key}-{t}-{i}", bytes([t, i]) * (32 * 1024)
            if store.put(k, v) != 0 or store.get(k) != v:
                errors.append(k)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert store.batch_is_exist([f"{key}-{t}-{i}" for t in range(8) for i in range(25)]) == [1] * 200


def test_a_contributing_store_serves_other_clients_and_close_drops_its_objects(master, key):
    host = new_store(master)
    thin = new_store(master, segment=0)
    # The only segment is the host's: the thin client writes into it and reads it back over TCP.
    assert thin.put(key, b"served") == 0 and thin.get(key) == b"served"
    assert host.get(key) == b"served"
    assert host.close() == 0
    assert thin.is_exist(key) == 0, "held only in the closed store's segment"
    assert thin.put(key, b"again") != 0, "no segment left"
    thin.close()


def test_two_stores_replica_num_2_survive_the_writer_closing(master, key):
    a, b = new_store(master), new_store(master)
    two = ReplicateConfig(replica_num=2)
    assert a.put(key, b"replicated" * 1000, two) == 0
    local = ReplicateConfig()
    local.preferred_segment = a.get_hostname()
    assert a.put(key + "-local", b"only-a", local) == 0
    assert a.close() == 0
    assert b.get(key) == b"replicated" * 1000, "the other replica survives"
    assert b.is_exist(key + "-local") == 0, "placed in the writer's segment by preferred_segment = get_hostname()"
    b.remove_all(force=True)
    b.close()


def test_get_into_ranges_copies_parts_of_objects(store, key):
    assert store.put(key + "-a", bytes(range(100))) == 0
    assert store.put(key + "-b", b"B" * 50) == 0
    out, out_ptr = buf(200)
    assert store.register_buffer(out_ptr, 200) == 0
    got = store.get_into_ranges(
        [out_ptr],
        [[key + "-a", key + "-b", key + "-missing"]],
        [[[0, 10], [20], [30]]],
        [[[5, 90], [45], [0]]],
        [[[4, 20], [10], [1]]],
    )
    # As the original (0.3.13.post1 answers exactly these lists): 90 + 20 runs past the 100-byte object and 45 + 10 past the 50-byte one: each such range
    # fails whole (no short copy), the others in the same call are served.
    assert got == [[[4, INVALID_PARAMS], [INVALID_PARAMS], [OBJECT_NOT_FOUND]]]
    assert out.raw[:4] == bytes(range(5, 9)) and out.raw[10:30] == bytes(20)
    got = store.get_into_ranges([out_ptr], [[key + "-a", key + "-b"]], [[[10, 99], [20]]], [[[90, 99], [45]]],
                                [[[10, 1], [5]]])
    assert got == [[[10, 1], [5]]], "a range ending exactly at the object's end is whole"
    assert out.raw[10:20] == bytes(range(90, 100)) and out.raw[20:25] == b"B" * 5 and out.raw[99] == 99
    # Past the registered 200 bytes: refused whole too.
    assert store.get_into_ranges([out_ptr], [[key + "-a"]], [[[196]]], [[[0]]], [[[8]]]) == [[[INVALID_PARAMS]]]
    assert out.raw[196:200] == bytes(4)
    assert store.get_into_ranges([out_ptr], [[key + "-a"]], [[[190]]], [[[0]]], [[[20]]]) == [[[INVALID_PARAMS]]]
    assert store.get_into_ranges([out_ptr], [[key + "-a"]], [[[0]]], [[[100]]], [[[1]]]) == [[[INVALID_PARAMS]]]
    assert store.get_into_ranges([out_ptr, out_ptr], [[key + "-a"]], [[[0]]], [[[0]]], [[[1]]]) == [[[INVALID_PARAMS]]]
    assert store.get_into_ranges([], [], [], [], []) == []


def test_group_ids_one_per_key_group_a_batch(master, store, key):
    from conftest import crescent_bin

    n, size = 4, 64
    src, src_ptr = buf(n * size)
    assert store.register_buffer(src_ptr, n * size) == 0
    keys = [f"{key}-{i}" for i in range(n)]
    ptrs = [src_ptr + i * size for i in range(n)]
    g1, g2 = f"{key}-g1", f"{key}-g2"
    cfg = ReplicateConfig(group_ids=[g1, g1, g2, g2])
    assert store.batch_put_from(keys, ptrs, [size] * n, cfg) == [0] * n
    assert store.batch_put_from(keys, ptrs, [size] * n, ReplicateConfig(group_ids=[g1, g2])) == [INVALID_PARAMS] * n
    assert store.put(key + "-single", b"v", ReplicateConfig(group_ids=[g1, g2])) == INVALID_PARAMS
    # Removing group g1 (the CLI's `rm --group`) takes exactly its two members.
    subprocess.run([crescent_bin(), "rm", "--group", g1, "--master", master], check=True, capture_output=True)
    assert store.batch_is_exist(keys) == [0, 0, 1, 1]


def test_a_call_waiting_on_the_network_releases_the_gil():
    # A "master" that accepts connections and never answers: setup waits out its 5 s request timeout.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    addr = f"127.0.0.1:{silent.getsockname()[1]}"
    result = {}
    started = threading.Event()

    def call():
        started.set()
        result["rc"] = MooncakeDistributedStore().setup("localhost", "P2PHANDSHAKE", 0, MiB, "tcp", "", addr)
        result["end"] = time.monotonic()

    # No forced GIL hand-over for 60 s: this thread runs again during the call only if the call released it.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60)
    try:
        t = threading.Thread(target=call)
        t.start()
        started.wait()
        ran_at = time.monotonic()
        t.join()
    finally:
        sys.setswitchinterval(interval)
        silent.close()
    assert result["rc"] < 0, "no answer from the master"
    assert ran_at < result["end"] - 1.0, "the main thread ran while the call waited"


def test_no_room_is_minus_200_the_code_vllm_backs_off_on():
    """vLLM's MooncakeStoreConnector backs off on -200 (NO_AVAILABLE_HANDLE): the original returns it when the
    master finds no room for a put, after eviction could not make any: an object larger than every segment, or a
    memory held entirely by hard-pinned objects."""
    from conftest import Master
    from mooncake.store import ReplicateConfig

    m = Master()
    s = new_store(m.addr, segment=16 * MiB)  # the original's smallest segment
    try:
        assert s.put("too-large", bytes(17 * MiB)) == -200
        pinned = ReplicateConfig()
        pinned.with_hard_pin = True
        # The original (0.3.13.post1) answers [0] * 16 + [-200] * 4 here.
        codes = [s.put(f"pinned-{i}", bytes(MiB), pinned) for i in range(20)]
        assert codes[:15] == [0] * 15 and codes[-1] == -200, codes
        assert s.put("unpinned", bytes(MiB)) == -200, "nothing evictable is left"
        assert s.is_exist("pinned-0") == 1, "pinned objects are never evicted for room"
    finally:
        s.close()
        m.stop()
