"""SSD offload through `setup`: a store hosting memory gets a disk tier that keeps what memory eviction takes."""

import ctypes
import os
import time

import pytest

from conftest import Master, MiB
from mooncake.store import MooncakeDistributedStore

INVALID_PARAMS = -600
KiB = 1 << 10
DATA_FILE = "crescent-ssd.data"


@pytest.fixture
def lone_master():
    """A master of its own: the test's store is its only segment, so every eviction is this store's."""
    m = Master("--lease-ttl-ms", "500")
    yield m.addr
    m.stop()


def value(i: int, size: int) -> bytes:
    return bytes((i * 31 + j) % 251 for j in range(256)) * (size // 256)


def wait_until(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_evictions_are_kept_on_the_stores_disk_and_read_back(lone_master, tmp_path, monkeypatch):
    monkeypatch.delenv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", raising=False)
    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", 4 * MiB, 16 * MiB, "tcp", "", lone_master,
                 enable_ssd_offload=True, ssd_offload_path=str(tmp_path))
    assert rc == 0
    try:
        data = tmp_path / DATA_FILE
        assert data.is_file(), "the disk tier's file is in ssd_offload_path"
        assert data.stat().st_size == 16 * MiB, "default size: 4 x global_segment_size"
        size = 256 * KiB
        n = 16 * MiB // size  # four times the store's memory
        for i in range(n):
            assert s.put(f"k{i}", value(i, size)) == 0, i

        def on_disk(key: str) -> bool:
            replicas = s.get_replica_desc(key)
            return len(replicas) == 1 and replicas[0].is_local_disk_replica()

        assert wait_until(lambda: on_disk("k0")), "the first value was evicted to the disk tier"
        assert not s.get_replica_desc("k0")[0].is_disk_replica(), "the original's DISK is a shared filesystem"
        d = s.get_replica_desc("k0")[0].get_disk_descriptor()
        assert d.object_size == size
        for i in range(n):
            assert s.get(f"k{i}") == value(i, size), i
        assert sum(on_disk(f"k{i}") for i in range(n)) >= n // 2, "most values live on disk"
    finally:
        s.remove_all(force=True)
        s.close()


def test_the_dict_form_takes_the_offload_keys_and_a_size(lone_master, tmp_path):
    s = MooncakeDistributedStore()
    rc = s.setup({
        "local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "4MB",
        "local_buffer_size": "16MB", "protocol": "tcp", "master_server_addr": lone_master,
        "enable_ssd_offload": True, "ssd_offload_path": str(tmp_path), "ssd_offload_size": 8 * MiB + 100,
    })
    assert rc == 0
    try:
        assert (tmp_path / DATA_FILE).stat().st_size == 8 * MiB, "ssd_offload_size, rounded down to 4 KiB"
    finally:
        s.close()


def test_offload_size_from_the_environment(lone_master, tmp_path, monkeypatch):
    monkeypatch.setenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", str(tmp_path))
    monkeypatch.setenv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", str(12 * MiB))
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", 4 * MiB, 16 * MiB, "tcp", "", lone_master,
                   enable_ssd_offload=True) == 0
    try:
        assert (tmp_path / DATA_FILE).stat().st_size == 12 * MiB
    finally:
        s.close()


def test_offload_enabled_without_a_directory_fails_setup(lone_master, monkeypatch):
    monkeypatch.delenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", raising=False)
    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", 4 * MiB, 16 * MiB, "tcp", "", lone_master, enable_ssd_offload=True)
    assert rc == INVALID_PARAMS
    assert s.health_check() == 1, "not set up"


def test_a_path_without_the_flag_makes_no_disk_tier(lone_master, tmp_path):
    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", 4 * MiB, 16 * MiB, "tcp", "", lone_master,
                 ssd_offload_path=str(tmp_path))
    assert rc == 0
    try:
        assert not os.listdir(tmp_path), "the original needs enable_ssd_offload=True"
    finally:
        s.close()


def test_offload_without_hosted_memory_makes_no_disk_tier(lone_master, tmp_path):
    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", lone_master,
                 enable_ssd_offload=True, ssd_offload_path=str(tmp_path))
    assert rc == 0, "a warning, not a failure: the store hosts no memory to offload from"
    try:
        assert not os.listdir(tmp_path)
    finally:
        s.close()


def test_reads_served_from_disk_are_counted_and_memory_reads_are_not(lone_master, tmp_path, monkeypatch):
    monkeypatch.delenv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", raising=False)
    s = MooncakeDistributedStore()
    assert s.get_offload_rpc_read_count() == 0, "before setup"
    rc = s.setup("localhost", "P2PHANDSHAKE", 4 * MiB, 16 * MiB, "tcp", "", lone_master,
                 enable_ssd_offload=True, ssd_offload_path=str(tmp_path))
    assert rc == 0
    try:
        size = 256 * KiB
        n = 16 * MiB // size
        for i in range(n):
            assert s.put(f"k{i}", value(i, size)) == 0, i

        def kinds(key: str) -> "list[str]":
            return ["memory" if r.is_memory_replica() else "disk" if r.is_local_disk_replica() else "?"
                    for r in s.get_replica_desc(key)]

        assert wait_until(lambda: kinds("k0") == ["disk"]), "the first value was evicted to the disk tier"
        memory_key = next(f"k{i}" for i in reversed(range(n)) if kinds(f"k{i}") == ["memory"])
        before = s.get_offload_rpc_read_count()
        assert s.get(memory_key) == value(int(memory_key[1:]), size)
        assert s.get_offload_rpc_read_count() == before, "a memory read is not a disk read"
        disk_keys = [f"k{i}" for i in range(n) if kinds(f"k{i}") == ["disk"]][:2]
        assert len(disk_keys) == 2
        assert s.get(disk_keys[0]) == value(int(disk_keys[0][1:]), size)
        assert s.get_offload_rpc_read_count() == before + 1, "get of a disk-only object"
        buf = (ctypes.c_ubyte * size)()
        assert s.register_buffer(ctypes.addressof(buf), size) == 0
        assert s.batch_get_into([disk_keys[1]], [ctypes.addressof(buf)], [size]) == [size]
        assert bytes(buf) == value(int(disk_keys[1][1:]), size)
        assert s.get_offload_rpc_read_count() == before + 2, "a batched read of a disk-only object"
        assert s.unregister_buffer(ctypes.addressof(buf)) == 0
    finally:
        s.remove_all(force=True)
        s.close()


def test_unmount_local_disk_segment_drops_the_disk_tier(lone_master, tmp_path, monkeypatch):
    monkeypatch.delenv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", raising=False)
    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", 4 * MiB, 16 * MiB, "tcp", "", lone_master,
                 enable_ssd_offload=True, ssd_offload_path=str(tmp_path))
    assert rc == 0
    try:
        size = 256 * KiB
        n = 32
        for i in range(n):
            assert s.put(f"d{i}", value(i, size)) == 0, i
        on_disk = lambda key: [r.is_local_disk_replica() for r in s.get_replica_desc(key)] == [True]
        assert wait_until(lambda: on_disk("d0")), "the first value was evicted to the disk tier"
        started = time.monotonic()
        assert s.unmount_local_disk_segment(grace_period_seconds=1) == 0
        assert time.monotonic() - started >= 1, "the call waits out the grace period"
        assert s.get("d0") == b"", "an object kept only on the disk tier is gone with it"
        assert s.unmount_local_disk_segment() == 0, "no disk tier left: a no-op"
        # Memory goes on working without it: new values fit once old ones are evicted (and not offloaded).
        for i in range(n):
            assert s.put(f"e{i}", value(i, size)) == 0, i
        assert all(not r.is_local_disk_replica() for i in range(n) for r in s.get_replica_desc(f"e{i}"))
    finally:
        s.remove_all(force=True)
        s.close()
