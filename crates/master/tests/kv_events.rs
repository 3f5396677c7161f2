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

/// A TCP proxy in front of a subscriber that stops passing the master's bytes on when told to: the subscriber
/// behind it stalls as one that stopped reading does, as far as the master can tell.
struct StallingProxy {
    endpoint: String,
    stalled: tokio::sync::watch::Sender<bool>,
}

impl StallingProxy {
    async fn start(upstream: &str) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let upstream = upstream.strip_prefix("tcp://").unwrap().to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
        let (stalled, stall) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let (client, _) = listener.accept().await.unwrap();
            let master = tokio::net::TcpStream::connect(upstream).await.unwrap();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut master_read, mut master_write) = master.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut client_read, &mut master_write).await });
            let mut stall = stall;
            let mut buf = vec![0u8; 64 << 10];
            loop {
                // While stalled nothing is read from the master: its bytes back up to it.
                let _ = stall.wait_for(|s| !*s).await;
                match master_read.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if client_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
        Self { endpoint, stalled }
    }

    fn stall(&self, on: bool) {
        self.stalled.send_replace(on);
    }
}

/// Events of `n` stored objects with keys of about 200 bytes (each about 600 bytes on the wire).
fn bulky_events(from: usize, n: usize) -> Vec<crescent_master::events::KvEvent> {
    use crescent_master::events::{EventKind, KvEvent, Replicas};
    (from..from + n)
        .map(|i| KvEvent {
            kind: EventKind::Stored,
            id: 0,
            tenant: "default".into(),
            key: format!("{i:0>200}").into(),
            group: None,
            medium: "cpu",
            size: 1,
            replicas: Replicas::new(),
            cause: None,
        })
        .collect()
}

/// Receives messages on `sub` in the background: the sequences seen and the events counted.
fn receive(mut sub: zeromq::SubSocket) -> Arc<parking_lot::Mutex<(Vec<u64>, usize)>> {
    let seen = Arc::new(parking_lot::Mutex::new((Vec::new(), 0)));
    let out = seen.clone();
    tokio::spawn(async move {
        while let Ok(m) = sub.recv().await {
            let frames = m.into_vec();
            let seq = u64::from_be_bytes(frames[1].as_ref().try_into().unwrap());
            let root = rmpv::decode::read_value(&mut frames[2].as_ref()).unwrap();
            let n = root.as_array().unwrap()[1].as_array().unwrap().len();
            let mut s = out.lock();
            s.0.push(seq);
            s.1 += n;
        }
    });
    seen
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_loses_only_its_own_messages_counted_and_costs_no_more_than_its_buffer() {
    const LIMIT: usize = 256 << 10;
    let hub = Arc::new(EventHub::new(EventsConfig {
        queue_capacity: 0,
        subscriber_buffer: LIMIT,
        ..EventsConfig::new("tcp://127.0.0.1:0")
    }));
    let publisher = Publisher::start(hub.clone()).await.unwrap();
    let proxy = StallingProxy::start(publisher.endpoint()).await;
    let mut subs = Vec::new();
    for endpoint in [publisher.endpoint(), proxy.endpoint.as_str()] {
        let mut sub = zeromq::SubSocket::new();
        sub.connect(endpoint).await.unwrap();
        sub.subscribe("").await.unwrap();
        subs.push(receive(sub));
    }
    let (fast, slow) = (subs[0].clone(), subs[1].clone());
    // Both are served once an event reaches each (a PUB sends nothing to a subscription it has not seen yet).
    let mut next = 0;
    assert!(
        eventually(WAIT, || {
            hub.publish_now(bulky_events(next, 1));
            next += 1;
            let ready = fast.lock().1 > 0 && slow.lock().1 > 0;
            async move { ready }
        })
        .await
    );
    assert_eq!(hub.stats().subscribers, 2);
    // Both have taken every message sent so far.
    assert!(
        eventually(WAIT, || async {
            let last = hub.stats().published_batches;
            hub.stats().queued == 0 && fast.lock().0.last() == Some(&last) && slow.lock().0.last() == Some(&last)
        })
        .await
    );
    let last_before = fast.lock().0.last().copied().unwrap();
    let fast_events_before = fast.lock().1;
    let slow_before = hub.subscriber_stats()[1];
    let published_before = hub.stats().published_events;

    // The slow one stops taking bytes; about 120 MB of events follow, in steps the fast one keeps up with.
    proxy.stall(true);
    let rss_before = rss_bytes();
    let mut sent = fast_events_before;
    for _ in 0..40 {
        hub.publish_now(bulky_events(next, 5_000));
        next += 5_000;
        sent += 5_000;
        assert!(eventually(WAIT, || async { fast.lock().1 == sent }).await, "the fast subscriber keeps up");
    }
    let grown = rss_bytes().saturating_sub(rss_before);
    let s = hub.stats();
    let slow_stat = hub.subscriber_stats()[1];
    assert!(slow_stat.dropped_events > 100_000, "most of the stalled one's events were skipped: {slow_stat:?}");
    assert_eq!((slow_before.dropped_events, s.subscriber_dropped_events), (0, slow_stat.dropped_events));
    assert_eq!(hub.subscriber_stats()[0].dropped_events, 0, "the fast one lost nothing");
    assert_eq!(
        slow_stat.sent_events + slow_stat.dropped_events - slow_before.sent_events,
        s.published_events - published_before,
        "every event sent to it or counted as its drop"
    );
    assert!(slow_stat.buffered_bytes as usize <= LIMIT, "the relay held no more than its limit");
    assert!(grown < 60 << 20, "the stalled subscriber cost {grown} bytes of memory for ~120 MB published");
    let seqs = fast.lock().0.clone();
    let after: Vec<u64> = seqs.into_iter().filter(|&q| q > last_before).collect();
    assert!(after.windows(2).all(|w| w[1] == w[0] + 1), "the fast one's sequence has no gap");
    assert_eq!(s.dropped_events, 0, "the master's queue dropped nothing");

    // Once it reads again it catches up with what waited for it, then gets new messages after a gap.
    proxy.stall(false);
    let final_seq = loop {
        hub.publish_now(bulky_events(next, 64));
        next += 64;
        let last = hub.stats().published_batches;
        if eventually(Duration::from_millis(500), || async { slow.lock().0.last() == Some(&last) }).await {
            break last;
        }
        assert!(next < 10_000_000, "the slow subscriber never caught up");
    };
    let got = slow.lock().0.clone();
    assert_eq!(got.last(), Some(&final_seq));
    assert!(got.windows(2).any(|w| w[1] > w[0] + 1), "it sees the messages it missed as a gap");
    assert!(got.windows(2).all(|w| w[1] > w[0]), "in order");
    publisher.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_does_not_speak_zmtp_is_closed_and_subscribers_go_on() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hub = Arc::new(EventHub::new(EventsConfig::new("tcp://127.0.0.1:0")));
    let publisher = Publisher::start(hub.clone()).await.unwrap();
    let mut bad = tokio::net::TcpStream::connect(publisher.endpoint().strip_prefix("tcp://").unwrap()).await.unwrap();
    // More than a ZMTP greeting's 64 bytes, none of them one.
    bad.write_all(b"GET /kv_events/status HTTP/1.1\r\nHost: master.example\r\nUser-Agent: curl/8.0\r\n\r\n")
        .await
        .unwrap();
    // The master closes it: reading ends (after the greeting bytes the socket may have sent).
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(WAIT, bad.read_to_end(&mut sink)).await;
    assert!(closed.is_ok(), "the connection was not closed");
    assert_eq!(hub.stats().subscribers, 0);

    let mut sub = zeromq::SubSocket::new();
    sub.connect(publisher.endpoint()).await.unwrap();
    sub.subscribe("").await.unwrap();
    let got = receive(sub);
    assert!(
        eventually(WAIT, || {
            hub.publish_now(bulky_events(0, 1));
            let n = got.lock().1;
            async move { n > 0 }
        })
        .await,
        "a subscriber after it is served"
    );
    assert_eq!(hub.stats().subscribers, 1);
    publisher.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_subscriber_messages_are_counted_as_published() {
    let hub = Arc::new(EventHub::new(EventsConfig::new("tcp://127.0.0.1:0")));
    let publisher = Publisher::start(hub.clone()).await.unwrap();
    let mut events = bulky_events(7, 1);
    events.extend(bulky_events(0, 2).into_iter().map(|mut e| {
        e.key = format!("not-a-hash-{}", e.key).into();
        e
    }));
    hub.publish_now(events);
    // A batch taken is counted once handled: await the count, not the queue.
    assert!(eventually(WAIT, || async { hub.stats().published_events == 3 }).await);
    let s = hub.stats();
    assert_eq!((s.published_batches, s.queued, s.skipped_unparsed_keys), (1, 0, 2));
    assert_eq!((s.subscribers, s.subscriber_dropped_events), (0, 0));
    publisher.stop().await;
}
