"""`setup_dummy`: a store attached to the storage node on its host (a `crescent node` process), and the host memory
calls engines allocate their buffers with. SGLang's standalone mode (`mooncake_store.py`, `standalone_storage`)
calls `setup_dummy(required_bytes, local_buffer_size, client_server_address)` and allocates its host pool with
`MooncakeHostMemAllocator().alloc`."""

import ctypes

import pytest

from conftest import Master, MiB, Node, free_port, new_store
from mooncake.store import MooncakeDistributedStore, MooncakeHostMemAllocator


def attached(endpoint: str) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    assert s.setup_dummy(256 * MiB, 16 * MiB, endpoint) == 0
    return s


@pytest.fixture(scope="module")
def master():
    """A master of this module's own: a node killed here leaves its segment mounted for a while, which the
    session's other tests must not place objects on."""
    m = Master("--lease-ttl-ms", "500")
    yield m.addr
    m.stop()


@pytest.fixture
def node(master):
    n = Node(master)
    yield n
    n.stop()


def test_attached_puts_land_in_the_nodes_memory_and_others_read_them(master, node, key):
    s = attached(node.endpoint)
    try:
        value = bytes(range(256)) * 4096  # 1 MiB
        assert s.put(key, value) == 0
        assert s.get(key) == value
        (replica,) = s.get_replica_desc(key)
        assert replica.get_memory_descriptor().buffer_descriptor.transport_endpoint == node.endpoint
        # A store of its own (another client, over the data plane) reads the bytes from the node.
        other = new_store(master, segment=0)
        try:
            assert other.get(key) == value
            other_value = b"x" * (3 * MiB)
            assert other.put(key + "-other", other_value) == 0
            assert s.get(key + "-other") == other_value
        finally:
            other.close()
        assert s.get_hostname() == ""
        assert s.remove(key, force=True) == 0
        assert s.remove(key + "-other", force=True) == 0
    finally:
        assert s.close() == 0


def test_zero_copy_calls_on_pool_memory(node, key):
    s = attached(node.endpoint)
    try:
        size = 4 * MiB
        ptr = s.alloc_from_mem_pool(2 * size)
        assert ptr != 0
        assert s.register_buffer(ptr, 2 * size) == 0
        ctypes.memset(ptr, 0x3C, size)
        assert s.put_from(key, ptr, size) == 0
        assert s.get_into(key, ptr + size, size) == size
        assert ctypes.string_at(ptr + size, size) == b"\x3c" * size
        assert s.batch_put_from([key + "-a", key + "-b"], [ptr, ptr + MiB], [MiB, MiB]) == [0, 0]
        assert s.batch_get_into([key + "-a", key + "-b"], [ptr + size, ptr + size + MiB], [MiB, MiB]) == [MiB, MiB]
        assert s.unregister_buffer(ptr) == 0
        assert MooncakeHostMemAllocator().free(ptr) == 0
        s.remove_all(force=True)
    finally:
        s.close()


def test_an_attached_store_mounts_segments_at_run_time(node):
    """An attached store has no hostname (`get_hostname()` is ""): the node serving what it mounts is named after
    its own address."""
    s = attached(node.endpoint)
    try:
        r = s.allocate_and_mount_segment(16 * MiB)
        assert r["ret"] == 0, r
        (sid,) = r["segment_ids"]
        assert s.get_hostname() == ""
        assert s.unmount_and_free_segment([sid]) == 0
    finally:
        assert s.close() == 0


def test_a_node_without_memfd_is_reached_over_its_lane(master, key):
    n = Node(master, memfd=False)
    try:
        s = attached(n.endpoint)
        value = b"lane" * (256 * 1024)
        assert s.put(key, value) == 0
        assert s.get(key) == value
        s.remove_all(force=True)
        s.close()
    finally:
        n.stop()


def test_bad_addresses_and_a_second_setup_are_refused(node):
    s = MooncakeDistributedStore()
    assert s.setup_dummy(MiB, MiB, "no-port") < 0
    assert s.setup_dummy(MiB, MiB, f"127.0.0.1:{free_port()}") < 0, "nothing listens there"
    assert s.setup_dummy(MiB, MiB, node.endpoint) == 0
    assert s.setup_dummy(MiB, MiB, node.endpoint) < 0, "set up already"
    assert s.close() == 0


def test_writes_after_the_node_died_fail_and_the_store_survives(master, key):
    n = Node(master)
    s = attached(n.endpoint)
    try:
        assert s.put(key, b"before" * 1000) == 0
        n.kill()
        # The master still counts the node's segment until its pings stop counting; the mapping refuses writes.
        assert s.put(key + "-after", b"after" * 1000) != 0
        assert s.health_check() == 0
    finally:
        assert s.close() == 0


def test_host_memory_allocator():
    a = MooncakeHostMemAllocator()
    ptr = a.alloc(3 * MiB)
    ctypes.memset(ptr, 7, 3 * MiB)
    assert ctypes.string_at(ptr + 3 * MiB - 1, 1) == b"\x07"
    assert a.free(ptr) == 0
    assert a.free(ptr) == -1, "freed twice"
    with pytest.raises(RuntimeError):
        a.alloc(0)
    assert MooncakeDistributedStore().alloc_from_mem_pool(0) == 0
