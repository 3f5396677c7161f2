//! The master with an oplog (issue 14 §3): removal-type mutations hide at once and free only once durable,
//! a refused reservation changes nothing, a re-created key is never touched by the old removal, and a master
//! opened on an existing log replays it (segments disconnected until their owner remounts them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_ha::kv::{HaKvBackend, MemoryKv};
use crescent_ha::oplog::{OpLogBatchStorage, OrderedOpLogWriter, StorageConfig, WriterConfig};
use crescent_master::clock::{ManualClock, Timestamp};
use crescent_master::ha::{OPLOG_REFUSED, OpLog, OpLogOptions};
use crescent_master::service::{MasterConfig, MasterService};
use crescent_proto::{ClientId, ErrorCode, ReplicateConfig, SegmentKind, SegmentSpec, SegmentStatus};
use crescent_testkit::eventually;
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(20);

fn spec(i: usize) -> SegmentSpec {
    let mut s = crescent_testkit::segment_on(&format!("seg{i}"), 64 * MIB, &format!("host{i}"));
    s.endpoint = format!("127.0.0.1:{}", 9100 + i);
    s
}

struct Master {
    svc: Arc<MasterService>,
    clock: Arc<ManualClock>,
    segments: Vec<(ClientId, SegmentSpec)>,
    writer: ClientId,
}

fn master(config: MasterConfig) -> Master {
    let clock = ManualClock::new(Timestamp(1_000_000));
    let svc = Arc::new(MasterService::new(config, clock.clone()).unwrap());
    Master { svc, clock, segments: Vec::new(), writer: ClientId::random() }
}

impl Master {
    fn mount(&mut self, n: usize) {
        for i in 0..n {
            let (c, s) = (ClientId::random(), spec(i));
            self.svc.mount_segment(c, s.clone()).unwrap();
            self.segments.push((c, s));
        }
    }

    fn put(&self, tenant: &str, key: &str, size: u64, replicas: u32) -> Result<(), ErrorCode> {
        self.svc.put_start(self.writer, tenant, key, size, &ReplicateConfig::with_replicas(replicas))?;
        self.svc.put_end(self.writer, tenant, key, Some(size ^ 0x5a5a))
    }

    fn used(&self) -> u64 {
        self.svc.pool().usage(SegmentKind::Memory).used
    }

    fn charged(&self, tenant: &str) -> u64 {
        self.svc.tenant_quota(tenant).map_or(0, |q| q.charged_bytes)
    }
}

/// A writer over `kv` that is attached but not started: nothing becomes durable until the test starts it.
async fn held_writer(kv: Arc<dyn HaKvBackend>, config: WriterConfig) -> Arc<OpLog> {
    let storage = OpLogBatchStorage::new(kv, "test", StorageConfig::default()).unwrap();
    let prefix = storage.init_durable_prefix().await.unwrap();
    storage.claim_producer_view(1).await.unwrap();
    Arc::new(OpLog::new(OrderedOpLogWriter::new(storage, 1, prefix, config)))
}

/// A writer config that retries a failing backend every few milliseconds (tests of outages).
fn quick_retries() -> WriterConfig {
    WriterConfig {
        retry_initial: Duration::from_millis(5),
        retry_max: Duration::from_millis(20),
        ..WriterConfig::default()
    }
}

fn multi_tenant() -> MasterConfig {
    MasterConfig { enable_multi_tenants: true, ..MasterConfig::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_hides_at_once_and_frees_space_and_quota_only_once_durable() {
    let mut m = master(multi_tenant());
    m.mount(2);
    m.svc.upsert_tenant_quota("a", 100 * MIB).unwrap();
    let log = held_writer(Arc::new(MemoryKv::new()), WriterConfig::default()).await;
    m.svc.attach_oplog(log.clone());
    m.put("a", "k", MIB, 2).unwrap();
    let (used, charged) = (m.used(), m.charged("a"));
    assert_eq!(charged, 2 * MIB);
    m.svc.remove("a", "k", false).unwrap();
    assert_eq!(m.svc.get_replica_list("a", "k").unwrap_err(), ErrorCode::ObjectNotFound, "hidden at once");
    assert_eq!(m.svc.exist_key("a", "k"), Ok(false));
    assert_eq!(m.svc.remove("a", "k", false), Err(ErrorCode::ObjectNotFound), "already removed");
    assert_eq!((m.used(), m.charged("a")), (used, charged), "space and quota stay held until durable");
    assert_eq!(log.status().durable.last_seq, 0);
    log.start();
    assert!(eventually(WAIT, || async { m.used() == 0 && m.charged("a") == 0 }).await, "freed once durable");
    assert_eq!(log.status().durable.last_seq, 2, "PUT_END and REMOVE");
    log.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reservation_changes_nothing() {
    let mut m = master(multi_tenant());
    m.mount(2);
    m.svc.upsert_tenant_quota("a", 100 * MIB).unwrap();
    let log = held_writer(Arc::new(MemoryKv::new()), WriterConfig::default()).await;
    m.svc.attach_oplog(log.clone());
    m.put("a", "k", MIB, 1).unwrap();
    log.start();
    assert!(eventually(WAIT, || async { log.status().durable.last_seq == 1 }).await);
    log.stop().await;
    assert!(!log.status().accepting);
    let (used, charged) = (m.used(), m.charged("a"));
    assert_eq!(m.svc.remove("a", "k", true), Err(OPLOG_REFUSED));
    assert_eq!(m.svc.batch_remove("a", &["k"], true), vec![Err(OPLOG_REFUSED)]);
    assert_eq!(
        m.svc.remove_all(Some("a"), true),
        Err(OPLOG_REFUSED),
        "a refusal is an error, not \"already removing\""
    );
    assert_eq!(m.svc.remove_by_regex("a", "k", true), Err(OPLOG_REFUSED));
    let got = m.svc.get_replica_list("a", "k").unwrap();
    assert_eq!((got.replicas.len(), got.checksum), (1, Some(MIB ^ 0x5a5a)), "still readable, as it was");
    assert_eq!((m.used(), m.charged("a")), (used, charged));
    // A write's End and a mount are mutations too.
    m.svc.put_start(m.writer, "a", "k2", MIB, &ReplicateConfig::with_replicas(1)).unwrap();
    assert_eq!(m.svc.put_end(m.writer, "a", "k2", None), Err(OPLOG_REFUSED));
    assert_eq!(m.svc.get_replica_list("a", "k2").unwrap_err(), ErrorCode::ReplicaIsNotReady);
    assert_eq!(m.svc.mount_segment(ClientId::random(), spec(5)), Err(OPLOG_REFUSED));
    assert_eq!(m.svc.pool().len(), 2);
    assert_eq!(m.svc.upsert_tenant_quota("b", MIB), Err(OPLOG_REFUSED));
    assert!(m.svc.tenant_quota("b").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_removed_and_written_again_is_never_touched_by_the_old_removal() {
    let mut m = master(multi_tenant());
    m.mount(1);
    m.svc.upsert_tenant_quota("a", 100 * MIB).unwrap();
    let log = held_writer(Arc::new(MemoryKv::new()), WriterConfig::default()).await;
    m.svc.attach_oplog(log.clone());
    m.put("a", "k", MIB, 1).unwrap();
    let old = m.svc.get_replica_list("a", "k").unwrap().replicas;
    m.svc.remove("a", "k", true).unwrap();
    // The key is free at once: a new object, in new space (the old space is still held).
    m.put("a", "k", 2 * MIB, 1).unwrap();
    let new = m.svc.get_replica_list("a", "k").unwrap();
    assert_ne!(new.replicas[0].location, old[0].location);
    assert_eq!((m.used(), m.charged("a")), (3 * MIB, 3 * MIB));
    log.start();
    assert!(eventually(WAIT, || async { m.used() == 2 * MIB }).await, "the old object's space freed");
    assert_eq!(m.charged("a"), 2 * MIB);
    let after = m.svc.get_replica_list("a", "k").unwrap();
    assert_eq!((after.size, after.checksum, &after.replicas), (2 * MIB, new.checksum, &new.replicas));
    assert_eq!(m.svc.audit().quota_mismatches, Vec::new());
    log.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_opened_on_an_existing_log_replays_it_and_its_nodes_reconnect() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let options = OpLogOptions { kv: kv.clone(), cluster: "c1".into(), writer: WriterConfig::default() };
    let mut a = master(multi_tenant());
    let (log, report) = crescent_master::ha::open(&options, &a.svc).await.unwrap();
    assert_eq!((report.view, report.objects, report.segments), (1, 0, 0));
    a.mount(3);
    a.svc.upsert_tenant_quota("t", 512 * MIB).unwrap();
    for i in 0..200 {
        a.put("t", &format!("k{i}"), 4096 + i, 1 + (i % 2) as u32).unwrap();
    }
    for i in (0..200).step_by(3) {
        a.svc.remove("t", &format!("k{i}"), true).unwrap();
    }
    // An unfinished write is not in the log.
    a.svc.put_start(a.writer, "t", "unfinished", 4096, &ReplicateConfig::with_replicas(1)).unwrap();
    // A whole segment goes (its objects' replicas there with it).
    let (_, gone) = a.segments.pop().unwrap();
    a.svc.unmount_segment(gone.id).unwrap();
    let before: Vec<_> = (0..200).map(|i| a.svc.stat("t", &format!("k{i}")).ok()).collect();
    log.stop().await;

    let b = master(multi_tenant());
    let (log_b, report) = crescent_master::ha::open(&options, &b.svc).await.unwrap();
    assert_eq!(report.view, 2, "the restarted master writes under the next view");
    assert_eq!(report.segments, 2);
    assert_eq!(report.objects, before.iter().filter(|s| s.is_some()).count());
    assert_eq!(b.svc.tenant_quota("t").map(|q| q.requested_quota_bytes), Some(512 * MIB));
    for (_, s) in &a.segments {
        assert_eq!(b.svc.segment_status(s.id), Ok(SegmentStatus::Disconnected));
    }
    assert_eq!(b.svc.segment_status(gone.id), Err(ErrorCode::SegmentNotFound));
    assert_eq!(b.svc.get_replica_list("t", "k1").unwrap_err(), ErrorCode::UnavailableInCurrentStatus);
    assert_eq!(b.svc.get_replica_list("t", "unfinished").unwrap_err(), ErrorCode::ObjectNotFound);
    // The same node instances come back: every surviving object reads as it was.
    for (c, s) in &a.segments {
        b.svc.remount_segments(*c, std::slice::from_ref(s)).unwrap();
    }
    for (i, was) in before.iter().enumerate() {
        let key = format!("k{i}");
        match was {
            None => assert_eq!(b.svc.get_replica_list("t", &key).unwrap_err(), ErrorCode::ObjectNotFound, "{key}"),
            Some(was) => {
                let now = b.svc.stat("t", &key).unwrap();
                assert_eq!((now.size, now.checksum, &now.replicas), (was.size, was.checksum, &was.replicas), "{key}");
            }
        }
    }
    let audit = b.svc.audit();
    assert_eq!((audit.overlapping_replicas, audit.quota_mismatches.len()), (0, 0));
    // New writes land beside the restored ones, never over them.
    let mut b = b;
    b.writer = ClientId::random();
    for i in 0..100 {
        b.put("t", &format!("n{i}"), 8192, 2).unwrap();
    }
    assert_eq!(b.svc.audit().overlapping_replicas, 0);
    log_b.stop().await;
    drop(a.clock);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_segments_of_a_new_node_instance_are_dropped() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let options = OpLogOptions { kv, cluster: "c2".into(), writer: WriterConfig::default() };
    let mut a = master(MasterConfig::default());
    let (log, _) = crescent_master::ha::open(&options, &a.svc).await.unwrap();
    a.mount(1);
    a.put("", "k", 4096, 1).unwrap();
    log.stop().await;
    let b = master(MasterConfig::default());
    let (log_b, report) = crescent_master::ha::open(&options, &b.svc).await.unwrap();
    assert_eq!((report.objects, report.segments), (1, 1));
    // Another instance (a new client id) mounts at the same endpoint: the old memory is gone.
    let mut fresh = spec(0);
    fresh.id = crescent_proto::SegmentId::random();
    b.svc.mount_segment(ClientId::random(), fresh).unwrap();
    assert_eq!(b.svc.get_replica_list("", "k").unwrap_err(), ErrorCode::ObjectNotFound);
    // The old instance's segment takes no placement at once and leaves the catalog once its UNMOUNT is durable.
    let old = a.segments[0].1.id;
    assert!(matches!(b.svc.segment_status(old), Ok(SegmentStatus::Unmounting) | Err(ErrorCode::SegmentNotFound)));
    assert!(eventually(WAIT, || async { b.svc.segment_status(old) == Err(ErrorCode::SegmentNotFound) }).await);
    log_b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_and_upserts_replay_as_they_happened() {
    use crescent_master::eviction::{EvictionScope, EvictionTarget};
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let options = OpLogOptions { kv, cluster: "c3".into(), writer: WriterConfig::default() };
    let mut a = master(MasterConfig::default());
    let (log, _) = crescent_master::ha::open(&options, &a.svc).await.unwrap();
    a.mount(1);
    for i in 0..10 {
        a.put("", &format!("e{i}"), 4096, 1).unwrap();
    }
    let report = a.svc.evict(EvictionScope::All, EvictionTarget::Fraction { target: 1.0, lower: 1.0 });
    assert_eq!(report.objects, 10);
    let cfg = ReplicateConfig::with_replicas(1);
    a.put("", "grown", 4096, 1).unwrap();
    a.svc.upsert_start(a.writer, "", "grown", 8192, &cfg).unwrap();
    a.svc.upsert_end(a.writer, "", "grown", Some(1)).unwrap();
    a.put("", "rewritten", 4096, 1).unwrap();
    a.svc.upsert_start(a.writer, "", "rewritten", 4096, &cfg).unwrap();
    a.svc.upsert_end(a.writer, "", "rewritten", Some(2)).unwrap();
    a.put("", "mid-rewrite", 4096, 1).unwrap();
    a.svc.upsert_start(a.writer, "", "mid-rewrite", 4096, &cfg).unwrap();
    log.stop().await;

    let b = master(MasterConfig::default());
    let (log_b, report) = crescent_master::ha::open(&options, &b.svc).await.unwrap();
    assert_eq!(report.objects, 2, "evicted objects and one being rewritten are not restored");
    let (c, s) = &a.segments[0];
    b.svc.remount_segments(*c, std::slice::from_ref(s)).unwrap();
    for i in 0..10 {
        assert_eq!(b.svc.get_replica_list("", &format!("e{i}")).unwrap_err(), ErrorCode::ObjectNotFound);
    }
    let grown = b.svc.get_replica_list("", "grown").unwrap();
    assert_eq!((grown.size, grown.checksum), (8192, Some(1)));
    let rewritten = b.svc.get_replica_list("", "rewritten").unwrap();
    assert_eq!((rewritten.size, rewritten.checksum), (4096, Some(2)));
    assert_eq!(b.svc.get_replica_list("", "mid-rewrite").unwrap_err(), ErrorCode::ObjectNotFound);
    log_b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_backend_fails_mutations_fail_fast_reads_go_on_and_it_recovers() {
    use crescent_ha::kv::{Fault, FaultyKv, KvError, KvOp};
    let faulty = Arc::new(FaultyKv::new(MemoryKv::new()));
    let kv: Arc<dyn HaKvBackend> = faulty.clone();
    let config = quick_retries();
    let mut m = master(MasterConfig::default());
    m.mount(1);
    let log = held_writer(kv, config).await;
    m.svc.attach_oplog(log.clone());
    log.start();
    m.put("", "k", 4096, 1).unwrap();
    assert!(eventually(WAIT, || async { log.status().durable.last_seq == 1 }).await);
    faulty.inject_every(KvOp::Txn, Fault::Fail(KvError::Unavailable("etcd down".into())));
    // The next committed entry cannot be written: the writer closes admission and retries it.
    m.svc.remove("", "k", true).unwrap();
    assert!(eventually(WAIT, || async { !log.status().accepting }).await, "admission closes on failure");
    assert_eq!(m.put("", "k2", 4096, 1), Err(OPLOG_REFUSED));
    assert_eq!(m.svc.get_replica_list("", "k").unwrap_err(), ErrorCode::ObjectNotFound, "the removal stays visible");
    assert_eq!(m.used(), 4096 + 4096, "nothing freed while the removal is not durable (k2's write is pending)");
    assert!(log.status().failed_attempts > 0);
    faulty.clear();
    assert!(eventually(WAIT, || async { log.status().accepting && log.status().durable.last_seq == 2 }).await);
    m.svc.put_end(m.writer, "", "k2", None).unwrap();
    assert!(eventually(WAIT, || async { m.used() == 4096 }).await, "k freed once durable; k2 kept");
    log.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_removal_hides_every_member_at_once_and_replays() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let mut a = master(MasterConfig::default());
    let log = held_writer(kv.clone(), WriterConfig::default()).await;
    a.svc.attach_oplog(log.clone());
    a.mount(1);
    let grouped = ReplicateConfig { group_id: Some("g".into()), ..ReplicateConfig::with_replicas(1) };
    for i in 0..5 {
        a.svc.put_start(a.writer, "", &format!("m{i}"), 4096, &grouped).unwrap();
        a.svc.put_end(a.writer, "", &format!("m{i}"), None).unwrap();
    }
    a.put("", "alone", 4096, 1).unwrap();
    assert_eq!(a.svc.remove_group("", "g", true), Ok(5));
    assert_eq!(a.svc.get_replica_list("", "m0").unwrap_err(), ErrorCode::ObjectNotFound, "hidden at once");
    assert_eq!(a.svc.group_members("", "g").unwrap_err(), ErrorCode::ObjectNotFound);
    assert_eq!(a.used(), 6 * 4096, "members' space held until durable");
    log.start();
    assert!(eventually(WAIT, || async { a.used() == 4096 }).await, "freed once durable");
    log.stop().await;
    // Reopen: the group's members are gone, the lone object is back.
    let options = OpLogOptions { kv, cluster: "test".into(), writer: WriterConfig::default() };
    let b = master(MasterConfig::default());
    let (log_b, report) = crescent_master::ha::open(&options, &b.svc).await.unwrap();
    assert_eq!(report.objects, 1);
    log_b.stop().await;
}

/// Issue 14's acceptance: etcd stopped for several seconds under load and restarted. While it is down, mutations
/// fail fast (`PERSISTENT_FAIL`) and the stuck batch is retried; afterwards everything committed becomes durable,
/// and a standby that followed the log throughout (the generic standby reader driving the master's applier, on its
/// own etcd connection) ends with exactly the primary's metadata: restored into a fresh service, every object
/// reads as it does on the primary and nothing else exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_following_through_an_etcd_outage_ends_with_the_primarys_metadata() {
    use crescent_ha::oplog::OpLogStandbyReader;
    use crescent_ha::testing::EtcdServer;
    use crescent_master::ha::ReplayState;
    let mut etcd = EtcdServer::start().expect("etcd (apt install etcd-server)");
    let kv: Arc<dyn HaKvBackend> = Arc::new(etcd.connect().await.unwrap());
    let options = OpLogOptions { kv, cluster: "outage".into(), writer: WriterConfig::default() };
    let mut a = master(multi_tenant());
    let (log, _) = crescent_master::ha::open(&options, &a.svc).await.unwrap();
    a.mount(3);
    a.svc.upsert_tenant_quota("t", 512 * MIB).unwrap();
    let standby_kv: Arc<dyn HaKvBackend> = Arc::new(etcd.connect().await.unwrap());
    let storage = OpLogBatchStorage::new(standby_kv, "outage", StorageConfig::default()).unwrap();
    let mut reader = OpLogStandbyReader::new(storage);
    let mut standby = ReplayState::default();
    let mut keys = Vec::new();
    for i in 0..150 {
        a.put("t", &format!("k{i}"), 4096 + i, 1 + (i % 2) as u32).unwrap();
        keys.push(format!("k{i}"));
    }
    reader.poll_once(&mut standby, 1024).await.unwrap();

    etcd.stop();
    // Mutations go on until the writer's failing batch closes admission; then they fail fast.
    let mut refused = None;
    for i in 150..100_000 {
        let key = format!("k{i}");
        match a.put("t", &key, 4096, 1) {
            Ok(()) => keys.push(key),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
        if i % 64 == 0 {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(refused, Some(OPLOG_REFUSED), "mutations fail fast while the backend is down");
    // Several seconds down (the scenario's length, not a wait for a condition): every mutation meanwhile is
    // refused at once, and the stuck batch keeps being retried.
    let down = std::time::Instant::now();
    while down.elapsed() < Duration::from_secs(3) {
        let tried = std::time::Instant::now();
        assert_eq!(a.put("t", "while-down", 4096, 1), Err(OPLOG_REFUSED));
        assert!(tried.elapsed() < Duration::from_millis(100), "refused fast: {:?}", tried.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stuck = log.status();
    assert!(!stuck.accepting && stuck.failed_attempts > 1, "{stuck:?}");
    etcd.restart().unwrap();
    let durable = eventually(Duration::from_secs(30), || async {
        let s = log.status();
        s.accepting && s.durable.last_seq + 1 == s.next_seq
    })
    .await;
    assert!(durable, "everything committed became durable after the restart: {:?}", log.status());
    for (i, key) in keys.iter().enumerate().step_by(4) {
        a.svc.remove("t", key, true).unwrap_or_else(|e| panic!("remove {key} ({i}): {e:?}"));
    }
    for i in 0..50 {
        a.put("t", &format!("after{i}"), 8192, 2).unwrap();
        keys.push(format!("after{i}"));
    }
    let target = eventually(Duration::from_secs(30), || async {
        let s = log.status();
        s.durable.last_seq + 1 == s.next_seq
    })
    .await;
    assert!(target);
    let last = log.status().durable.last_seq;
    while reader.applied_seq() < last {
        reader.poll_once(&mut standby, 1024).await.unwrap();
    }
    assert_eq!(reader.applied_seq(), last, "the standby applied exactly the durable log");
    let primary: Vec<_> = keys.iter().map(|k| a.svc.stat("t", k).ok()).collect();
    log.stop().await;

    // The standby's state, materialised into a fresh service whose nodes come back, is the primary's.
    let b = master(multi_tenant());
    b.svc.restore_replayed(&standby).unwrap();
    for (c, s) in &a.segments {
        b.svc.remount_segments(*c, std::slice::from_ref(s)).unwrap();
    }
    assert_eq!(b.svc.key_count(None), primary.iter().filter(|s| s.is_some()).count());
    for (key, was) in keys.iter().zip(&primary) {
        match was {
            None => assert_eq!(b.svc.get_replica_list("t", key).unwrap_err(), ErrorCode::ObjectNotFound, "{key}"),
            Some(was) => {
                let now = b.svc.stat("t", key).unwrap();
                assert_eq!((now.size, now.checksum, &now.replicas), (was.size, was.checksum, &was.replicas), "{key}");
            }
        }
    }
    assert_eq!(b.svc.tenant_quota("t").map(|q| q.requested_quota_bytes), Some(512 * MIB));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_hides_at_once_and_frees_space_and_quota_only_once_durable() {
    use crescent_master::eviction::{EvictionScope, EvictionTarget};
    let mut m = master(multi_tenant());
    m.mount(1);
    m.svc.upsert_tenant_quota("a", 100 * MIB).unwrap();
    let log = held_writer(Arc::new(MemoryKv::new()), WriterConfig::default()).await;
    m.svc.attach_oplog(log.clone());
    for i in 0..4 {
        m.put("a", &format!("k{i}"), MIB, 1).unwrap();
    }
    let (used, charged) = (m.used(), m.charged("a"));
    assert_eq!(charged, 4 * MIB);
    let report = m.svc.evict(EvictionScope::All, EvictionTarget::Fraction { target: 1.0, lower: 1.0 });
    assert_eq!(report.objects, 4);
    for i in 0..4 {
        assert_eq!(m.svc.get_replica_list("a", &format!("k{i}")).unwrap_err(), ErrorCode::ObjectNotFound);
    }
    assert_eq!((m.used(), m.charged("a")), (used, charged), "space and quota stay held until durable");
    log.start();
    assert!(eventually(WAIT, || async { m.used() == 0 && m.charged("a") == 0 }).await, "freed once durable");
    assert_eq!(log.status().durable.last_seq, 8, "4 PUT_ENDs and 4 REMOVEs");
    log.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_evicts_for_room_waits_until_the_eviction_is_durable() {
    let mut m = master(MasterConfig::default());
    m.mount(1);
    let log = held_writer(Arc::new(MemoryKv::new()), WriterConfig::default()).await;
    m.svc.attach_oplog(log.clone());
    // 60 of the one segment's 64 MiB taken: an 8 MiB write must evict for its room.
    for i in 0..15 {
        m.put("", &format!("fill{i}"), 4 * MIB, 1).unwrap();
    }
    assert_eq!(m.used(), 60 * MIB);
    let before = m.svc.metrics().evicted_objects.load(std::sync::atomic::Ordering::Relaxed);
    let used = m.used();
    // The next write must evict for its room; it is off the runtime here, so it waits on a condition variable.
    let (svc, writer) = (m.svc.clone(), m.writer);
    let put = tokio::task::spawn_blocking(move || {
        svc.put_start(writer, "", "late", 8 * MIB, &ReplicateConfig::with_replicas(1))?;
        svc.put_end(writer, "", "late", None)
    });
    let evicted = || m.svc.metrics().evicted_objects.load(std::sync::atomic::Ordering::Relaxed) > before;
    assert!(eventually(WAIT, || async { evicted() }).await, "the write evicted for its room");
    assert!(!put.is_finished(), "the write waits for the eviction to be durable");
    assert_eq!(m.used(), used, "the evicted space is not reused before its REMOVE is durable");
    log.start();
    assert_eq!(put.await.unwrap(), Ok(()), "placed once the eviction is durable");
    assert!(m.svc.get_replica_list("", "late").is_ok());
    log.stop().await;
}

/// Names the log cannot hold are refused before anything changes, with `INVALID_PARAMS` naming the limit: a tenant
/// over 256 bytes or a group over 4096 was once applied on the primary and then refused by the log, the refusal
/// swallowed (a removal then stayed Removing forever while "removed" was answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_too_long_for_the_log_are_refused_up_front_naming_the_limit() {
    use crescent_master::server::dispatch;
    use crescent_proto::{MAX_GROUP_LEN, MAX_TENANT_LEN, MasterRequest, wire::WireKey};
    let mut m = master(multi_tenant());
    m.mount(1);
    let log = held_writer(Arc::new(MemoryKv::new()), WriterConfig::default()).await;
    m.svc.attach_oplog(log.clone());
    log.start();
    let tenant = "t".repeat(MAX_TENANT_LEN + 1);
    let group = "g".repeat(MAX_GROUP_LEN + 1);
    let committed = log.last_committed();
    assert_eq!(m.svc.upsert_tenant_quota(&tenant, MIB), Err(ErrorCode::InvalidParams));
    assert!(m.svc.tenant_quota(&tenant).is_none());
    assert_eq!(
        m.svc.put_start(m.writer, &tenant, "k", MIB, &ReplicateConfig::with_replicas(1)).unwrap_err(),
        ErrorCode::InvalidParams
    );
    m.svc.upsert_tenant_quota("a", 100 * MIB).unwrap();
    let grouped = ReplicateConfig { group_id: Some(group.clone()), ..ReplicateConfig::with_replicas(1) };
    assert_eq!(m.svc.put_start(m.writer, "a", "k", MIB, &grouped).unwrap_err(), ErrorCode::InvalidParams);
    assert_eq!(m.svc.remove_group("a", &group, true), Err(ErrorCode::InvalidParams));
    assert_eq!(m.used(), 0, "nothing placed");
    assert_eq!(log.last_committed(), committed + 1, "only the valid quota was logged");
    // The words of the error name the limit.
    let why = |req: MasterRequest| dispatch(&m.svc, &req).unwrap_err();
    let e = why(MasterRequest::SetTenantQuota { tenant: tenant.clone(), bytes: MIB });
    assert_eq!(e.code, ErrorCode::InvalidParams);
    assert!(e.message.contains(&format!("the limit is {MAX_TENANT_LEN}")), "{}", e.message);
    let e = why(MasterRequest::PutStart {
        client: m.writer,
        tenant: tenant.clone(),
        key: WireKey::Key("k".into()),
        size: MIB,
        config: ReplicateConfig::with_replicas(1),
    });
    assert!(e.message.contains(&format!("the limit is {MAX_TENANT_LEN}")), "{}", e.message);
    let e = why(MasterRequest::RemoveGroup { tenant: "a".into(), group: group.clone(), force: true });
    assert!(
        e.message.contains(&format!("group name is {} bytes, the limit is {MAX_GROUP_LEN}", group.len())),
        "{}",
        e.message
    );
    log.stop().await;
}

/// `Slot::commit` answers an entry its writer will not take (here an invalid one; a writer stopped for good between
/// reserve and commit answers the same) with `PERSISTENT_FAIL`, which every caller returns as its request's error,
/// and counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_refused_after_its_reservation_fails_the_request_and_is_counted() {
    let mut m = master(MasterConfig::default());
    m.mount(1);
    let log = held_writer(Arc::new(MemoryKv::new()), WriterConfig::default()).await;
    m.svc.attach_oplog(log.clone());
    let slot = log.reserve().unwrap();
    // An invalid entry is what the writer refuses at commit; a stopped-for-good writer refuses the same way.
    let bad = crescent_master::ha::MasterEntry::Remove { tenant: "x".repeat(300), key: "k".into() };
    assert_eq!(slot.commit(bad, None), Err(OPLOG_REFUSED));
    assert_eq!(log.commit_failures(), 1);
    log.stop().await;
}

/// A dead client's segment whose unmount the log refuses (the backend is failing) is cut off at once — no new
/// object is placed on memory no one serves — and unmounted once the log takes it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_clients_segment_the_log_cannot_unmount_leaves_placement_and_is_unmounted_later() {
    use crescent_ha::kv::{Fault, FaultyKv, KvError, KvOp};
    let faulty = Arc::new(FaultyKv::new(MemoryKv::new()));
    let kv: Arc<dyn HaKvBackend> = faulty.clone();
    let config = quick_retries();
    let mut m = master(MasterConfig { disconnect_grace_ms: 0, ..MasterConfig::default() });
    m.mount(1);
    let log = held_writer(kv, config).await;
    m.svc.attach_oplog(log.clone());
    log.start();
    m.put("", "k", 4096, 1).unwrap();
    assert!(eventually(WAIT, || async { log.status().durable.last_seq == 1 }).await);
    faulty.inject_every(KvOp::Txn, Fault::Fail(KvError::Unavailable("etcd down".into())));
    m.svc.remove("", "k", true).unwrap();
    assert!(eventually(WAIT, || async { !log.status().accepting }).await, "admission closes on failure");
    let (owner, seg) = m.segments[0].clone();
    m.clock.advance(Duration::from_millis(m.svc.config().client_ttl_ms + 1));
    assert_eq!(m.svc.step_liveness(), vec![owner]);
    assert_eq!(m.svc.segment_status(seg.id), Ok(SegmentStatus::Disconnected), "not left allocatable");
    assert!(!m.svc.pool().is_allocatable(seg.id));
    faulty.clear();
    assert!(eventually(WAIT, || async { log.status().accepting }).await);
    assert_eq!(m.svc.step_graceful_unmounts(), 1);
    let gone = || async { m.svc.segment_status(seg.id) == Err(ErrorCode::SegmentNotFound) };
    assert!(eventually(WAIT, gone).await, "unmounted once the log takes it (erased once its UNMOUNT is durable)");
    log.stop().await;
}

/// While the backend fails (etcd full or down), a write that needs the room of an eviction waiting for
/// durability fails at once instead of holding its worker for the wait: that room comes back only once the
/// writer's stuck batch is written, seconds or an operator away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_backend_fails_a_write_needing_evicted_room_does_not_wait_for_it() {
    use crescent_ha::kv::{Fault, FaultyKv, KvError, KvOp};
    use crescent_master::service::EVICTION_DURABLE_WAIT;
    let faulty = Arc::new(FaultyKv::new(MemoryKv::new()));
    let config = quick_retries();
    let mut m = master(MasterConfig::default());
    m.mount(1);
    let log = held_writer(faulty.clone(), config).await;
    m.svc.attach_oplog(log.clone());
    log.start();
    for i in 0..15 {
        m.put("", &format!("fill{i}"), 4 * MIB, 1).unwrap();
    }
    assert!(eventually(WAIT, || async { log.status().durable.last_seq == 15 }).await);
    faulty.inject_every(KvOp::Txn, Fault::Fail(KvError::Exhausted("database space exceeded".into())));
    let put = |key: &'static str| {
        let (svc, writer) = (m.svc.clone(), m.writer);
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let r = svc.put_start(writer, "", key, 8 * MIB, &ReplicateConfig::with_replicas(1));
            (r, started.elapsed())
        })
    };
    // The first write evicts for its room; its REMOVEs cannot be written.
    let (first, _) = put("late").await.unwrap();
    assert!(first.is_err(), "{first:?}");
    assert!(!log.status().accepting && log.status().terminal.is_none());
    let (second, took) = put("later").await.unwrap();
    assert_eq!(second.unwrap_err(), OPLOG_REFUSED, "the log is what stands in the way, not a full cluster");
    assert!(took < EVICTION_DURABLE_WAIT / 2, "waited {took:?} for room that cannot come");
    faulty.clear();
    assert!(eventually(WAIT, || async { log.status().accepting && m.used() < 60 * MIB }).await, "freed once durable");
    assert!(put("again").await.unwrap().0.is_ok());
    log.stop().await;
}
