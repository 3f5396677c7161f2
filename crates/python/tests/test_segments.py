"""Segments mounted at run time: `mount_segment` (a file's range), `allocate_and_mount_segment`, their unmounts,
and `unmount_local_disk_segment`, with the original's return conventions (checked against its wheel 0.3.13)."""

import os
import uuid

import pytest

from conftest import MiB, new_store
from mooncake.store import MooncakeDistributedStore, ReplicateConfig

SEGMENT = 16 * MiB


@pytest.fixture
def shm_file():
    """A 64 MiB file in /dev/shm (a shared-memory object, what the original's docs mount), removed afterwards."""
    path = f"/dev/shm/crescent-test-{uuid.uuid4().hex[:12]}"
    with open(path, "wb") as f:
        f.truncate(64 * MiB)
    yield path
    os.unlink(path)


@pytest.fixture
def client_only(master):
    """A store that contributes no segment of its own (`global_segment_size=0`)."""
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 64 * MiB, "tcp", "", master) == 0
    yield s
    s.remove_all(force=True)
    s.close()


def on(store) -> ReplicateConfig:
    """A config placing the one replica on `store`'s segments (named `get_hostname()`)."""
    c = ReplicateConfig()
    c.preferred_segment = store.get_hostname()
    return c


def segments_of(store, key) -> set:
    """The ids of the segments `key`'s replicas are in."""
    return {r.get_memory_descriptor().buffer_descriptor.segment_id for r in store.get_replica_desc(key)}


def test_a_mounted_file_holds_objects_until_it_is_unmounted(master, client_only, shm_file, key):
    reader = new_store(master)
    try:
        r = client_only.mount_segment(shm_file, SEGMENT, offset=SEGMENT)
        assert r["ret"] == 0 and len(r["segment_ids"]) == 1, r
        [sid] = r["segment_ids"]
        values = {f"{key}-{i}": os.urandom(1000 + i) for i in range(8)}
        for k, v in values.items():
            assert client_only.put(k, v, on(client_only)) == 0
            assert segments_of(reader, k) == {sid}, "placed on the mounted segment"
        for k, v in values.items():
            assert reader.get(k) == v, "read from another store, over the network"
            assert client_only.get(k) == v
        # The bytes are in the file, at the mapped range.
        with open(shm_file, "rb") as f:
            f.seek(SEGMENT)
            mapped = f.read(SEGMENT)
        assert all(v in mapped for v in values.values())
        assert client_only.unmount_segment([sid]) == 0
        for k in values:
            assert reader.get(k) == b"", "objects held only on the unmounted segment are gone"
            assert reader.is_exist(k) == 0
        assert client_only.unmount_segment([sid]) == -1, "unmounted already"
    finally:
        reader.close()


def test_allocate_and_mount_on_a_client_only_store(master, client_only, key):
    reader = new_store(master)
    try:
        r = client_only.allocate_and_mount_segment(SEGMENT + 1)
        assert r["ret"] == 0 and r["allocated_size"] == 2 * SEGMENT, "rounded up to the 16 MiB slab"
        [sid] = r["segment_ids"]
        assert client_only.put(key, b"a" * 5000, on(client_only)) == 0
        assert segments_of(reader, key) == {sid}
        assert reader.get(key) == b"a" * 5000
        assert client_only.unmount_segment([sid]) == -1, "not a mount_segment segment"
        assert client_only.unmount_and_free_segment([sid]) == 0
        assert reader.get(key) == b""
        assert client_only.unmount_and_free_segment([sid]) == -1
        # A second one after the first is gone: the same node serves it.
        again = client_only.allocate_and_mount_segment(SEGMENT)
        assert again["ret"] == 0 and again["allocated_size"] == SEGMENT
        assert client_only.put(key, b"b" * 10, on(client_only)) == 0
        assert reader.get(key) == b"b" * 10
    finally:
        reader.close()


def test_a_store_with_a_segment_mounts_more(store, shm_file, key):
    before = store.mount_segment(shm_file, SEGMENT)
    allocated = store.allocate_and_mount_segment(SEGMENT)
    assert before["ret"] == 0 and allocated["ret"] == 0
    # Its own segment and the two added share its name: a write fills one of them.
    assert store.put(key, b"z" * 100, on(store)) == 0
    assert store.get(key) == b"z" * 100
    assert store.unmount_segment(list(before["segment_ids"])) == 0
    assert store.unmount_and_free_segment(list(allocated["segment_ids"])) == 0


def test_bad_arguments_answer_the_originals_codes(client_only, shm_file):
    assert client_only.mount_segment(shm_file, 0) == {"ret": 0, "segment_ids": []}, "nothing to mount"
    assert client_only.mount_segment("/nonexistent/crescent", SEGMENT)["ret"] == -1
    assert client_only.mount_segment(shm_file, SEGMENT, offset=100)["ret"] == -1, "offset not page-aligned"
    assert client_only.mount_segment(shm_file, 64 * MiB, offset=4096)["ret"] == -1, "passes the file's end"
    assert client_only.mount_segment(shm_file, 64 * MiB + 1)["ret"] == -1
    assert client_only.allocate_and_mount_segment(0) == {"ret": -1, "segment_ids": [], "allocated_size": 0}
    assert client_only.allocate_and_mount_segment(1 << 64 - 1)["ret"] == -1, "rounding up overflows"
    unknown = str(uuid.uuid4())
    assert client_only.unmount_segment([unknown]) == -1
    assert client_only.unmount_segment(["garbage"]) == -1
    assert client_only.unmount_and_free_segment(["1-2"]) == -1, "the original's id form, unknown"
    assert client_only.unmount_segment([]) == 0
    # An odd size is mounted as it is (the original too).
    odd = client_only.mount_segment(shm_file, SEGMENT + 5, offset=SEGMENT)
    assert odd["ret"] == 0
    # One bad id fails the call, the good one is still unmounted.
    assert client_only.unmount_segment([unknown] + list(odd["segment_ids"])) == -1
    assert client_only.unmount_segment(list(odd["segment_ids"])) == -1, "gone already"


def test_calls_before_setup_fail():
    s = MooncakeDistributedStore()
    assert s.mount_segment("/dev/null", SEGMENT) == {"ret": -1, "segment_ids": []}
    assert s.allocate_and_mount_segment(SEGMENT)["ret"] == -1
    assert s.unmount_segment(["x"]) == -1
    assert s.unmount_and_free_segment(["x"]) == -1
    assert s.unmount_local_disk_segment() == -1


def test_close_unmounts_the_added_segments(master, shm_file, key):
    hoster = MooncakeDistributedStore()
    assert hoster.setup("localhost", "P2PHANDSHAKE", 0, 64 * MiB, "tcp", "", master) == 0
    reader = new_store(master)
    try:
        assert hoster.allocate_and_mount_segment(SEGMENT)["ret"] == 0
        assert hoster.put(key, b"q" * 10, on(hoster)) == 0
        hoster.close()
        assert reader.get(key) == b"", "closing unmounted the added segment"
    finally:
        reader.close()


def test_a_graceful_unmount_keeps_objects_readable_for_the_grace(master, client_only, key):
    reader = new_store(master)
    try:
        r = client_only.allocate_and_mount_segment(SEGMENT)
        [sid] = r["segment_ids"]
        assert client_only.put(key, b"g" * 100, on(client_only)) == 0
        assert client_only.unmount_and_free_segment([sid], grace_period_seconds=30) == 0
        assert reader.get(key) == b"g" * 100, "readable during the grace period"
        # No new objects there: the preferred segment is out of placement, the write lands elsewhere.
        assert client_only.put(key + "-new", b"n", on(client_only)) == 0
        assert sid not in segments_of(reader, key + "-new")
        assert client_only.unmount_and_free_segment([sid]) == -1, "unmounting already"
    finally:
        reader.close()


def test_unmount_local_disk_segment_without_a_disk_tier_is_a_no_op(store, client_only):
    assert store.unmount_local_disk_segment() == 0
    assert client_only.unmount_local_disk_segment() == 0


def test_a_client_only_store_named_on_a_port_in_use_mounts_on_another(master, key):
    """A store set up without a segment, named `127.0.0.1:PORT` with PORT taken by another listener: its first
    run-time mount starts its segments' server there, is told the port is in use, and listens on a free port
    instead (keeping its name, as setup does for a store with a segment)."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        name = f"127.0.0.1:{held.getsockname()[1]}"
        s = MooncakeDistributedStore()
        assert s.setup(name, "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", master) == 0
        reader = new_store(master, segment=0)
        try:
            r = s.allocate_and_mount_segment(SEGMENT)
            assert r["ret"] == 0, r
            [sid] = r["segment_ids"]
            assert s.get_hostname() == name
            assert s.put(key, b"moved" * 1000, on(s)) == 0
            assert segments_of(reader, key) == {sid}
            assert reader.get(key) == b"moved" * 1000, "served from the port it moved to"
            assert s.unmount_and_free_segment([sid]) == 0
        finally:
            reader.close()
            s.close()
