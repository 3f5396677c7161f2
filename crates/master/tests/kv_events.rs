//! The KV event stream (issue 37): a subscriber reads stored/removed events in the original's wire format, one
//! message sequence without gaps, each event with its cause; with an oplog an event is published only once its
//! change is durable, under the change's log sequence.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_ha::kv::MemoryKv;
use crescent_ha::oplog::{OpLogBatchStorage, OrderedOpLogWriter, StorageConfig, WriterConfig};
use crescent_master::events::publisher::Publisher;
use crescent_master::events::{EventHub, EventsConfig};
use crescent_master::ha::OpLog;
use crescent_proto::ReplicateConfig;
use crescent_testkit::eventually;
use rmpv::Value;
use std::sync::Arc;
use std::time::Duration;
use zeromq::{Socket, SocketRecv};

const WAIT: Duration = Duration::from_secs(20);

/// One received message: its sequence and its events (each a field map).
struct Message {
    seq: u64,
    events: Vec<Value>,
}

fn field<'a>(e: &'a Value, name: &str) -> &'a Value {
    e.as_map()
        .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(name)))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no field {name} in {e}"))
}

fn text<'a>(e: &'a Value, name: &str) -> &'a str {
    field(e, name).as_str().unwrap_or_else(|| panic!("{name} is not a string in {e}"))
}

/// Reads the next message, checking the original's framing: an empty topic, a u64 big-endian sequence, a
/// `[timestamp, events, dp_rank]` payload.
async fn next(sub: &mut zeromq::SubSocket) -> Message {
    let m = tokio::time::timeout(WAIT, sub.recv()).await.expect("a message in time").unwrap();
    let frames = m.into_vec();
    assert_eq!(frames.len(), 3, "topic, sequence, payload");
    assert!(frames[0].is_empty(), "the original's empty topic");
    let seq = u64::from_be_bytes(frames[1].as_ref().try_into().expect("an 8-byte sequence"));
    let root = rmpv::decode::read_value(&mut frames[2].as_ref()).unwrap();
    let root = root.as_array().unwrap();
    assert_eq!(root.len(), 3, "[timestamp_ms, events, dp_rank]");
    assert!(root[0].as_u64().unwrap() > 1_600_000_000_000, "a Unix timestamp in ms");
    assert_eq!(root[2].as_u64(), Some(0));
    Message { seq, events: root[1].as_array().unwrap().clone() }
}

/// A subscriber that has seen the stream: it subscribes, then writes `warm-N` keys until one reaches it (a PUB
/// sends nothing to a subscription it has not seen yet).
async fn subscriber(h: &Harness, endpoint: &str) -> (zeromq::SubSocket, u64) {
    let mut sub = zeromq::SubSocket::new();
    sub.connect(endpoint).await.unwrap();
    sub.subscribe("").await.unwrap();
    for i in 0.. {
        h.put(&format!("warm-{i}"), 10);
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(200), sub.recv()).await {
            let frames = m.into_vec();
            return (sub, u64::from_be_bytes(frames[1].as_ref().try_into().unwrap()));
        }
        assert!(i < 100, "no event reached the subscriber");
    }
    unreachable!()
}

/// Reads messages until `n` events have come (after the warm-up's), checking the sequence has no gap.
async fn events(sub: &mut zeromq::SubSocket, last: &mut u64, n: usize) -> Vec<Value> {
    let mut out = Vec::new();
    while out.len() < n {
        let m = next(sub).await;
        if m.events.iter().all(|e| text(e, "object_key").starts_with("warm-")) {
            *last = m.seq;
            continue;
        }
        assert_eq!(m.seq, *last + 1, "no message lost");
        *last = m.seq;
        out.extend(m.events.into_iter().filter(|e| !text(e, "object_key").starts_with("warm-")));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_reads_stored_and_removed_events_in_the_originals_format() {
    let h = Harness::default3();
    let hub =
        Arc::new(EventHub::new(EventsConfig { backend_id: "pool-a".into(), ..EventsConfig::new("tcp://127.0.0.1:0") }));
    h.svc.attach_events(hub.clone()).unwrap();
    let publisher = Publisher::start(hub.clone()).await.unwrap();
    assert!(publisher.endpoint().starts_with("tcp://127.0.0.1:") && !publisher.endpoint().ends_with(":0"));
    let (mut sub, mut last) = subscriber(&h, publisher.endpoint()).await;

    h.put_in("", "12345", 100, &ReplicateConfig::with_replicas(2)).unwrap();
    h.put("prompt-a", 7);
    h.svc.remove("", "12345", false).unwrap();
    let got = events(&mut sub, &mut last, 3).await;
    let (stored, other, removed) = (&got[0], &got[1], &got[2]);
    assert_eq!((text(stored, "event_type"), text(stored, "type")), ("stored", "BlockStored"));
    assert_eq!((text(stored, "object_key"), text(stored, "tenant_id")), ("12345", "default"));
    assert_eq!((text(stored, "backend_id"), text(stored, "medium")), ("pool-a", "cpu"));
    assert_eq!(field(stored, "seq_hashes").as_array().unwrap(), &[Value::from(12345u64)]);
    assert_eq!(field(stored, "block_hashes").as_array().unwrap(), &[Value::from(12345u64)]);
    assert_eq!(field(stored, "base_block_idx").as_u64(), Some(0));
    assert!(field(stored, "parent_hash").is_nil() && field(stored, "model_name").is_nil());
    assert_eq!(field(stored, "size").as_u64(), Some(100));
    let replicas = field(stored, "replicas").as_array().unwrap();
    assert_eq!(replicas.len(), 2, "both replicas, where they are");
    assert!(replicas.iter().all(|r| text(r, "tier") == "memory" && text(r, "segment").starts_with("seg")));
    assert!(field(other, "seq_hashes").as_array().unwrap().is_empty(), "not a block hash: the key alone");
    assert_eq!((text(removed, "event_type"), text(removed, "cause")), ("removed", "removed"));
    assert!(field(removed, "base_block_idx").is_nil());
    let ids: Vec<u64> = got.iter().map(|e| field(e, "event_id").as_u64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids grow: {ids:?}");

    // A node lost: what was only there is removed (expired); what had another replica is stored where it is left.
    h.put_in("", "0x2a", 10, &ReplicateConfig::with_replicas(3)).unwrap();
    let (_, seg0) = h.segments[0];
    // Two objects placed on seg0 only (its preferred segment), one elsewhere.
    let on_seg0 = ReplicateConfig { preferred_segments: vec!["seg0".into()], ..ReplicateConfig::with_replicas(1) };
    let only = ["one-0".to_owned(), "one-1".to_owned()];
    for k in &only {
        h.put_in("", k, 10, &on_seg0).unwrap();
        assert_eq!(h.svc.get_replica_list("", k).unwrap().replicas[0].location.segment_id(), Some(seg0));
    }
    let elsewhere = ReplicateConfig { preferred_segments: vec!["seg1".into()], ..ReplicateConfig::with_replicas(1) };
    h.put_in("", "two", 10, &elsewhere).unwrap();
    let before = events(&mut sub, &mut last, 4).await;
    assert_eq!(field(&before[0], "seq_hashes").as_array().unwrap(), &[Value::from(42u64)]);
    h.svc.unmount_segment(seg0).unwrap();
    let lost = events(&mut sub, &mut last, only.len() + 1).await;
    assert!(lost.iter().all(|e| text(e, "object_key") != "two"), "an object not on the lost node is not reported");
    for k in &only {
        let e = lost.iter().find(|e| text(e, "object_key") == k).unwrap();
        assert_eq!((text(e, "event_type"), text(e, "cause")), ("removed", "expired"));
    }
    let kept = lost.iter().find(|e| text(e, "object_key") == "0x2a").unwrap();
    assert_eq!(field(kept, "replicas").as_array().unwrap().len(), 2, "stored where its replicas are left");

    let s = hub.stats();
    assert_eq!((s.dropped_events, s.subscribers, s.queued), (0, 1, 0));
    assert!(s.published_events >= 10 && s.skipped_unparsed_keys >= 5);
    publisher.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_oplog_an_event_waits_for_its_change_to_be_durable_and_carries_its_sequence() {
    let h = Harness::default3();
    let kv: Arc<dyn crescent_ha::kv::HaKvBackend> = Arc::new(MemoryKv::new());
    let storage = OpLogBatchStorage::new(kv, "events", StorageConfig::default()).unwrap();
    let prefix = storage.init_durable_prefix().await.unwrap();
    storage.claim_producer_view(1).await.unwrap();
    // Not started: what is committed is not durable yet.
    let log = Arc::new(OpLog::new(OrderedOpLogWriter::new(storage, 1, prefix, WriterConfig::default())));
    h.svc.attach_oplog(log.clone());
    let hub = Arc::new(EventHub::new(EventsConfig::new("tcp://127.0.0.1:0")));
    h.svc.attach_events(hub.clone()).unwrap();
    h.put("k", 10);
    h.svc.remove("", "k", true).unwrap();
    assert_eq!(hub.stats().queued, 0, "nothing is reported before it is durable");
    let last = log.last_committed();
    log.start();
    assert!(eventually(WAIT, || async { hub.stats().queued == 2 }).await);
    assert_eq!(hub.stats().last_event_id, last, "the removal's event carries its log sequence");
    log.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_the_new_leaders_event_ids_continue_from_the_log() {
    use crescent_ha::kv::HaKvBackend;
    use crescent_ha::leader::LocalCoordinator;
    use crescent_ha::oplog::FollowerConfig;
    use crescent_master::ha::{HaState, HaStatus, OpLogOptions, master_writer_config};
    use crescent_master::server::{CandidateOptions, CandidateServer, MasterServer};
    use crescent_master::service::MasterConfig;
    use crescent_proto::ClientId;

    async fn candidate(kv: &Arc<dyn HaKvBackend>, coordinator: &LocalCoordinator) -> CandidateServer {
        let mut o = CandidateOptions::new(Arc::new(coordinator.clone()));
        o.follow = FollowerConfig { poll_interval: Duration::from_millis(10), ..FollowerConfig::default() };
        o.retry = Duration::from_millis(50);
        let oplog = OpLogOptions { kv: kv.clone(), cluster: "events".into(), writer: master_writer_config() };
        MasterServer::builder(MasterConfig::default())
            .background(false)
            .oplog(Some(oplog))
            .events(Some(EventsConfig::new("tcp://127.0.0.1:0")))
            .start_candidate(o)
            .await
            .unwrap()
    }
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let coord = LocalCoordinator::new(0);
    let a = candidate(&kv, &coord).await;
    until(&a, "a leads", HaStatus::is_leader).await;
    let b = candidate(&kv, &coord).await;
    until(&b, "b follows", |s| s.state == HaState::Following && s.leader.is_some()).await;
    assert!(a.events_endpoint().is_some() && a.events_endpoint() != b.events_endpoint(), "a stream each");

    let svc_a = a.service().unwrap();
    let node = ClientId::random();
    let specs: Vec<_> = (0..2)
        .map(|i| {
            let mut s = crescent_testkit::segment_on(&format!("seg{i}"), 64 * MIB, &format!("host{i}"));
            s.endpoint = format!("127.0.0.1:{}", 9300 + i);
            svc_a.mount_segment(node, s.clone()).unwrap();
            s
        })
        .collect();
    let writer = ClientId::random();
    let put = |svc: &crescent_master::service::MasterService, k: &str| {
        svc.put_start(writer, "", k, 100, &ReplicateConfig::with_replicas(1)).unwrap();
        svc.put_end(writer, "", k, Some(1)).unwrap();
    };
    for i in 0..5 {
        put(&svc_a, &format!("k{i}"));
    }
    let seq_a = durable(&svc_a).await;
    let hub_a = Arc::clone(svc_a.events().unwrap());
    assert!(eventually(WAIT, || async { hub_a.stats().last_event_id == seq_a }).await);
    // A batch the publisher took is counted once sent: awaited, not read at one instant.
    let five = || async { hub_a.stats().published_events == 5 };
    assert!(eventually(WAIT, five).await, "{:?}", hub_a.stats());

    coord.depose();
    until(&a, "a steps down", |s| s.step_downs == 1 && s.state == HaState::Following).await;
    until(&b, "b leads", HaStatus::is_leader).await;
    // The deposed term logs nothing more, so it reports nothing more.
    svc_a.put_start(writer, "", "zombie", 100, &ReplicateConfig::with_replicas(1)).unwrap();
    assert!(svc_a.put_end(writer, "", "zombie", None).is_err());
    drop(svc_a);
    let svc_b = b.service().unwrap();
    svc_b.remount_segments(node, &specs).unwrap();
    put(&svc_b, "after");
    let seq_b = durable(&svc_b).await;
    let hub_b = Arc::clone(svc_b.events().unwrap());
    assert!(eventually(WAIT, || async { hub_b.stats().last_event_id == seq_b }).await);
    assert!(eventually(WAIT, || async { hub_b.stats().published_events == 1 }).await, "{:?}", hub_b.stats());
    let (sa, sb) = (hub_a.stats(), hub_b.stats());
    assert_eq!(sa.last_event_id, seq_a, "nothing reported past the old term's durable log");
    assert_eq!((sa.published_events, sa.queued), (5, 0), "the old term reports nothing more");
    assert_eq!(sb.published_events + sb.queued, 1, "the new leader reports its own term only");
    assert!(seq_b > seq_a, "its id continues the log: {seq_b} after {seq_a}");
    drop(svc_b);
    b.shutdown().await;
    a.shutdown().await;
}
