"""The master's KV event stream read by a consumer written for the original (pyzmq and msgpack, as its users
read it): the frames and fields the original's own publisher test checks
(mooncake-store/tests/kv_event_publisher_test.cpp, PublishesSglangObjectKeyOverZmq) and its
`/kv_events/status` (mooncake-store/src/master_admin_service.cpp), against `crescent master --kv-events`."""

import json
import time
import urllib.parse
import urllib.request
import uuid

import msgpack
import pytest
import zmq

from conftest import Master, new_store

SGLANG_KEY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855_0_k"
SGLANG_GROUP = "sglang-hicache:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def status(master) -> dict:
    with urllib.request.urlopen(f"http://{master.admin}/kv_events/status", timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture
def events_master():
    m = Master("--kv-events", "tcp://127.0.0.1:0", "--kv-events-backend-id", "mooncake-test")
    yield m
    m.stop()


def receive(sub) -> tuple:
    """One message: (sequence, [timestamp, events, dp_rank]), checked as the original's test checks it."""
    frames = sub.recv_multipart()
    assert len(frames) == 3
    assert frames[0] == b""
    assert len(frames[1]) == 8
    root = msgpack.unpackb(frames[2], raw=False)
    assert isinstance(root, list) and len(root) == 3
    assert isinstance(root[1], list)
    return int.from_bytes(frames[1], "big"), root


def test_a_consumer_of_the_originals_stream_reads_crescents(events_master):
    st = status(events_master)
    assert st["enabled"] is True and st["endpoint"].startswith("tcp://127.0.0.1:")
    for k in ("published_batches", "published_events", "dropped_events", "skipped_unparsed_keys"):
        assert st[k] == 0, "the original's counters, from zero"
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVTIMEO, 10_000)
    sub.connect(st["endpoint"])
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    store = new_store(events_master.addr)
    try:
        # A PUB sends nothing to a subscription it has not seen yet: write until the first event arrives.
        sub.setsockopt(zmq.RCVTIMEO, 200)
        for i in range(100):
            assert store.put(f"warm-{uuid.uuid4().hex}", b"w") == 0
            try:
                last, _ = receive(sub)
                break
            except zmq.Again:
                continue
        else:
            pytest.fail("no event reached the subscriber")
        sub.setsockopt(zmq.RCVTIMEO, 10_000)
        # Drain the warm-up's other messages (their puts may have been published after the first).
        while True:
            sub.setsockopt(zmq.RCVTIMEO, 300)
            try:
                last, _ = receive(sub)
            except zmq.Again:
                break
        sub.setsockopt(zmq.RCVTIMEO, 10_000)

        from mooncake.store import ReplicateConfig

        cfg = ReplicateConfig()
        cfg.group_ids = [SGLANG_GROUP]
        assert store.put(SGLANG_KEY, b"x" * 64, cfg) == 0
        seq, root = receive(sub)
        assert seq == last + 1
        (event,) = root[1]
        assert event["object_key"] == SGLANG_KEY
        assert event["group_id"] == SGLANG_GROUP
        assert event["seq_hashes"] == [], "not a block hash"
        assert (event["event_type"], event["type"]) == ("stored", "BlockStored")
        assert (event["backend_id"], event["tenant_id"], event["medium"]) == ("mooncake-test", "default", "cpu")
        assert event["base_block_idx"] == 0 and event["parent_hash"] is None and event["token_ids"] is None
        assert all(event[k] is None for k in ("model_name", "block_size", "additional_salt", "lora_name", "dp_rank"))
        assert event["size"] == 64 and len(event["replicas"]) == 1

        assert store.put("12345", b"y") == 0
        assert store.remove("12345") == 0
        got = []
        while len(got) < 2:
            seq2, root = receive(sub)
            assert seq2 == seq + 1, "no message lost"
            seq = seq2
            got += root[1]
        stored, removed = got
        assert stored["seq_hashes"] == [12345] and stored["block_hashes"] == [12345]
        assert (removed["event_type"], removed["type"], removed["cause"]) == ("removed", "BlockRemoved", "removed")
        assert removed["base_block_idx"] is None
        assert stored["event_id"] < removed["event_id"]
        st = status(events_master)
        assert st["published_events"] >= 4 and st["dropped_events"] == 0 and st["skipped_unparsed_keys"] >= 2
    finally:
        store.close()
        sub.close(linger=0)
        ctx.term()


def test_without_the_flag_the_status_says_disabled():
    m = Master()
    try:
        assert status(m) == {**status(m), "enabled": False, "published_events": 0}
    finally:
        m.stop()


def test_a_consumer_that_missed_events_resyncs_from_a_snapshot_and_the_events_after_it(events_master):
    """`/kv_events/snapshot` (Crescent's): pages of what is stored as of an event id; the stream's events after
    that id, applied over the pages, give exactly what the master holds."""
    store = new_store(events_master.addr)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        for i in range(10):
            assert store.put(f"early-{i}", b"e" * (i + 1)) == 0  # published before anyone subscribed
        sub.connect(status(events_master)["endpoint"])
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVTIMEO, 200)
        for _ in range(100):
            assert store.put(f"warm-{uuid.uuid4().hex}", b"w") == 0
            try:
                receive(sub)
                break
            except zmq.Again:
                continue
        else:
            pytest.fail("no event reached the subscriber")
        # The snapshot, three objects a page, while the store keeps changing.
        state, cursor, as_of = {}, None, None
        while True:
            url = f"http://{events_master.admin}/kv_events/snapshot?limit=3"
            if cursor is not None:
                url += f"&cursor={urllib.parse.quote(cursor)}"
            with urllib.request.urlopen(url, timeout=10) as r:
                page = json.loads(r.read())
            as_of = page["event_id"] if as_of is None else as_of
            assert len(page["objects"]) <= 3
            for o in page["objects"]:
                assert o["tenant_id"] == "default" and o["replicas"] and o["medium"] == "cpu"
                state[o["object_key"]] = o["size"]
            assert store.put(f"late-{uuid.uuid4().hex}", b"l") == 0
            assert store.remove(f"early-{len(state) % 10}", force=True) in (0, -704)
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert as_of > 0 and {f"early-{i}" for i in range(10)} & set(state)
        # The events after the snapshot's id, up to the last one the master queued.
        last = status(events_master)["last_event_id"]
        sub.setsockopt(zmq.RCVTIMEO, 10_000)
        seen = 0
        while seen < last:
            _, root = receive(sub)
            for e in root[1]:
                seen = max(seen, e["event_id"])
                if e["event_id"] <= as_of:
                    continue
                if e["event_type"] == "stored":
                    state[e["object_key"]] = e["size"]
                else:
                    state.pop(e["object_key"], None)
        listed = requests_keys(events_master)
        assert sorted(state) == listed
    finally:
        store.close()
        sub.close(linger=0)
        ctx.term()


def requests_keys(master) -> list:
    """Every key the master lists (`/keys`, page by page)."""
    keys, cursor = [], None
    while True:
        url = f"http://{master.admin}/keys?limit=1000" + (f"&cursor={urllib.parse.quote(cursor)}" if cursor else "")
        with urllib.request.urlopen(url, timeout=10) as r:
            page = json.loads(r.read())
        keys += page["keys"]
        cursor = page["next_cursor"]
        if cursor is None:
            return keys
