//! What a failover keeps beyond objects and memory segments (issue 34 §4): local SSD registrations and CXL
//! segments (bindings in the shared CXL window, with their objects). Real etcd (log and leader election), two
//! real candidates; the standby takes over either by following the log or from the leader's snapshot (its own
//! snapshot directory empty, the leader's log compacted), and a restored registration whose client never comes
//! back is expired like any other, its removal logged.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_ha::leader::{EtcdCoordinator, EtcdCoordinatorConfig};
use crescent_ha::oplog::{FollowerConfig, OpLogBatchStorage, StorageConfig};
use crescent_ha::testing::EtcdServer;
use crescent_master::clock::{ManualClock, Timestamp};
use crescent_master::ha::{HaState, HaStatus, OpLogOptions, ReplayState, SnapshotOptions, replay_log};
use crescent_master::server::{CandidateOptions, CandidateServer, MasterServer};
use crescent_master::service::{MasterConfig, MasterService};
use crescent_master::snapshot::store::LocalDirStore;
use crescent_proto::{ClientId, LocalSsdInfo, ReplicaLocation, ReplicateConfig, SegmentKind, SegmentSpec};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{durable, until, without_pins};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);
const CLUSTER: &str = "state";

fn config() -> MasterConfig {
    MasterConfig {
        cxl_window: Some(256 * MIB),
        client_ttl_ms: 500,
        disconnect_grace_ms: 1000,
        ..MasterConfig::default()
    }
}

async fn candidate(etcd: &EtcdServer, clock: Arc<ManualClock>, snapshots: Option<&Path>) -> CandidateServer {
    candidate_with(config(), etcd, clock, snapshots).await
}

async fn candidate_with(
    config: MasterConfig,
    etcd: &EtcdServer,
    clock: Arc<ManualClock>,
    snapshots: Option<&Path>,
) -> CandidateServer {
    let endpoints = vec![etcd.endpoint()];
    let mut coord = EtcdCoordinatorConfig::new(endpoints.clone(), CLUSTER);
    coord.ttl = Duration::from_secs(2);
    let mut options = CandidateOptions::new(Arc::new(EtcdCoordinator::connect(coord).await.unwrap()));
    options.follow = FollowerConfig { poll_interval: Duration::from_millis(10), ..FollowerConfig::default() };
    options.retry = Duration::from_millis(100);
    let snapshots = snapshots.map(|dir| {
        let store = Arc::new(LocalDirStore::new(dir).unwrap());
        SnapshotOptions { interval: Duration::from_millis(50), retain: 1, ..SnapshotOptions::new(store) }
    });
    MasterServer::builder(config)
        .background(false)
        .clock(clock)
        .oplog(Some(OpLogOptions::etcd(endpoints, CLUSTER).await.unwrap()))
        .snapshots(snapshots)
        .start_candidate(options)
        .await
        .unwrap()
}

fn ssd(svc: &MasterService) -> Vec<LocalSsdInfo> {
    svc.local_ssd_status(None).unwrap()
}

/// Calls `write` (one more object on the leader) until the leader's snapshots let it compact its log past batch
/// `beyond` (so the newest snapshot includes what that batch holds).
async fn until_compacted(etcd: &EtcdServer, beyond: u64, mut write: impl FnMut()) {
    let storage =
        OpLogBatchStorage::new(Arc::new(etcd.connect().await.unwrap()), CLUSTER, StorageConfig::default()).unwrap();
    let compacted = crescent_testkit::eventually(WAIT, || {
        write();
        let storage = storage.clone();
        async move { storage.first_stored_batch().await.unwrap().is_some_and(|b| b > beyond) }
    })
    .await;
    assert!(compacted, "a never compacted its log past batch {beyond}");
}

/// The last batch of the log now durable.
async fn durable_batch(etcd: &EtcdServer) -> u64 {
    let storage =
        OpLogBatchStorage::new(Arc::new(etcd.connect().await.unwrap()), CLUSTER, StorageConfig::default()).unwrap();
    storage.read_durable_prefix().await.unwrap().map_or(0, |p| p.batch_id)
}

/// B follows the log to `seq` (bootstrapped from A's snapshot when `snapshots` are on), then A dies and B
/// leads: B and its service.
async fn take_over(
    b: CandidateServer,
    a: CandidateServer,
    seq: u64,
    snapshots: Option<&Path>,
) -> (CandidateServer, Arc<MasterService>) {
    until(&b, "b follows", |s| s.state == HaState::Following && s.applied_seq >= seq).await;
    if let Some(dir) = snapshots {
        assert!(dir.join("latest").is_file(), "b bootstrapped from a's snapshot");
    }
    drop(a);
    until(&b, "b leads", HaStatus::is_leader).await;
    let svc = b.service().unwrap();
    (b, svc)
}

/// A leads with local SSD registrations, a CXL segment and objects on it; B takes over after A dies (by the
/// log, or from A's snapshot over a compacted log); then B expires the registration whose client never returns.
async fn registrations_and_cxl_survive(via_snapshot: bool) {
    let etcd = EtcdServer::start().expect("etcd (install etcd-server or set CRESCENT_ETCD_BIN)");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let snap = |d: &tempfile::TempDir| via_snapshot.then(|| d.path().to_path_buf());
    let a = candidate(&etcd, ManualClock::new(Timestamp(1)), snap(&dir_a).as_deref()).await;
    until(&a, "a leads", HaStatus::is_leader).await;
    let svc_a = a.service().unwrap();

    let (c1, c2, c3) = (ClientId::random(), ClientId::random(), ClientId::random());
    svc_a.register_local_ssd(c1, true).unwrap();
    svc_a.report_local_ssd(c1, 1 << 30).unwrap();
    svc_a.register_local_ssd(c2, false).unwrap();
    svc_a.report_local_ssd(c2, 5 << 20).unwrap();
    svc_a.set_local_ssd_offloading(c2, true).unwrap();
    svc_a.register_local_ssd(c3, true).unwrap();
    svc_a.unregister_local_ssd(c3).unwrap();

    let node = ClientId::random();
    let mut cxl: SegmentSpec = crescent_testkit::segment_on("cxl", 64 * MIB, "host");
    cxl.kind = SegmentKind::Cxl;
    cxl.endpoint = "127.0.0.1:9400".into();
    svc_a.mount_segment(node, cxl.clone()).unwrap();
    let writer = ClientId::random();
    let mut n = 0;
    let put = |svc: &MasterService, n: &mut u64| {
        svc.put_start(writer, "", &format!("k{n}"), 4096 + *n, &ReplicateConfig::with_replicas(1)).unwrap();
        svc.put_end(writer, "", &format!("k{n}"), None).unwrap();
        *n += 1;
    };
    for _ in 0..10 {
        put(&svc_a, &mut n);
    }
    if via_snapshot {
        until_compacted(&etcd, 1, || put(&svc_a, &mut n)).await;
    }
    let seq = durable(&svc_a).await;
    let registrations = ssd(&svc_a);
    assert_eq!(registrations.len(), 2, "c1 and c2 registered, c3 gone: {registrations:?}");
    let want = without_pins(svc_a.metadata_view());
    assert_eq!(want.objects.len(), n as usize);
    assert!(want.objects.iter().all(|o| o.replicas().all(|r| r.segment_id() == cxl.id)), "all on CXL");

    let clock_b = ManualClock::new(Timestamp(1));
    let b = candidate(&etcd, clock_b.clone(), snap(&dir_b).as_deref()).await;
    drop(svc_a);
    let (b, svc_b) = take_over(b, a, seq, snap(&dir_b).as_deref()).await;
    assert_eq!(ssd(&svc_b), registrations, "the registrations survive, flags and capacities included");
    assert_eq!(without_pins(svc_b.metadata_view()), want, "the CXL segment and its objects survive");

    // The CXL segment's owner comes back: its objects are read from their window offsets again.
    svc_b.remount_segments(node, std::slice::from_ref(&cxl)).unwrap();
    for k in 0..n {
        let got = svc_b.get_replica_list("", &format!("k{k}")).unwrap();
        let ReplicaLocation::Memory { segment_id, offset, length, .. } = &got.replicas[0].location else {
            panic!("k{k}: {:?}", got.replicas[0].location)
        };
        let logged = &want.objects.get("default", &format!("k{k}")).unwrap().replicas[0];
        assert_eq!((*segment_id, *offset, *length), (cxl.id, logged.offset, logged.length));
    }
    // New writes land in the restored window without overlapping the restored objects.
    put(&svc_b, &mut n);
    let fresh = &svc_b.get_replica_list("", &format!("k{}", n - 1)).unwrap().replicas[0].location;
    let ReplicaLocation::Memory { offset: fresh_at, .. } = fresh else { panic!("{fresh:?}") };
    assert!(want.objects.iter().map(|o| o.record()).all(|o| o.replicas[0].offset + o.replicas[0].length <= *fresh_at
        || *fresh_at + 4096 + n - 1 <= o.replicas[0].offset));

    // c1 pings the new leader in time; c2 never does: it is expired after the grace, its removal logged.
    clock_b.advance(Duration::from_millis(800));
    svc_b.ping(c1);
    clock_b.advance(Duration::from_millis(300));
    let expired = svc_b.step_liveness();
    assert!(expired.contains(&c2) && !expired.contains(&c1), "{expired:?}");
    let left: Vec<ClientId> = ssd(&svc_b).iter().map(|i| i.client).collect();
    assert_eq!(left, vec![c1]);
    durable(&svc_b).await;
    if !via_snapshot {
        let storage =
            OpLogBatchStorage::new(Arc::new(etcd.connect().await.unwrap()), CLUSTER, StorageConfig::default()).unwrap();
        let mut replayed = ReplayState::default();
        replay_log(&storage, storage.read_durable_prefix().await.unwrap().unwrap(), &mut replayed).await.unwrap();
        assert_eq!(replayed.local_ssd.keys().copied().collect::<Vec<_>>(), vec![c1], "the expiry is in the log");
    }
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_ssd_registrations_and_cxl_segments_survive_a_failover_through_the_log() {
    registrations_and_cxl_survive(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_ssd_registrations_and_cxl_segments_survive_a_failover_through_a_snapshot() {
    registrations_and_cxl_survive(true).await;
}

/// A leads a drain of node `a` (two moves done and logged, two handed out when it dies); B takes the job over
/// after A dies (by the log, or from A's snapshot over a compacted log): the job answers, `a` comes back out of
/// placement when its node remounts, and B finishes the drain with every object off `a`.
async fn a_drain_survives(via_snapshot: bool) {
    use crescent_proto::{JobStatus, ReplicaTaskResult, SegmentStatus};
    let etcd = EtcdServer::start().expect("etcd (install etcd-server or set CRESCENT_ETCD_BIN)");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let snap = |d: &tempfile::TempDir| via_snapshot.then(|| d.path().to_path_buf());
    // Memory segments (with a CXL window every write would go there).
    let config = || MasterConfig { cxl_window: None, ..config() };
    let a = candidate_with(config(), &etcd, ManualClock::new(Timestamp(1)), snap(&dir_a).as_deref()).await;
    until(&a, "a leads", HaStatus::is_leader).await;
    let svc_a = a.service().unwrap();
    let nodes: Vec<(ClientId, SegmentSpec)> =
        ["a", "b"].iter().map(|n| (ClientId::random(), common::spec_on(n, 64 * MIB, &format!("host-{n}")))).collect();
    for (c, s) in &nodes {
        svc_a.mount_segment(*c, s.clone()).unwrap();
    }
    let (node_a, seg_a) = (nodes[0].0, nodes[0].1.id);
    let writer = ClientId::random();
    let on_a = ReplicateConfig { preferred_segments: vec!["a".into()], ..ReplicateConfig::default() };
    let crc = |key: &str| crc32c::crc32c(key.as_bytes());
    let mut offsets = std::collections::HashMap::new();
    for i in 0..10 {
        let key = format!("k{i}");
        let d = svc_a.put_start(writer, "", &key, 10_000, &on_a).unwrap();
        let ReplicaLocation::Memory { offset, .. } = d[0].location else { panic!("{:?}", d[0].location) };
        svc_a.put_end(writer, "", &key, Some(u64::from(crc(&key)))).unwrap();
        offsets.insert(offset, key);
    }
    let done = |tasks: &[crescent_proto::ReplicaTask]| -> Vec<ReplicaTaskResult> {
        tasks.iter().map(|t| ReplicaTaskResult { id: t.id, outcome: Ok(crc(&offsets[&t.src_offset])) }).collect()
    };
    let job = svc_a.create_drain(&["a".into()], &[], 2).unwrap();
    svc_a.step_replica_tasks();
    let first = svc_a.replica_tasks(node_a, &[]);
    let in_flight = svc_a.replica_tasks(node_a, &done(&first));
    assert_eq!(in_flight.len(), 2);
    svc_a.step_replica_tasks();
    if via_snapshot {
        // Compacted past the drain's entries: b can only have the job from a's snapshot.
        durable(&svc_a).await;
        let drain_batch = durable_batch(&etcd).await;
        let mut n = 0;
        until_compacted(&etcd, drain_batch, || {
            n += 1;
            let key = format!("filler{n}");
            svc_a.put_start(writer, "", &key, 4096, &ReplicateConfig::with_replicas(1)).unwrap();
            svc_a.put_end(writer, "", &key, None).unwrap();
        })
        .await;
    }
    let seq = durable(&svc_a).await;
    let want = svc_a.metadata_view().drains;
    assert_eq!(want[&job].succeeded, 2, "{:?}", want[&job]);

    let b = candidate_with(config(), &etcd, ManualClock::new(Timestamp(1)), snap(&dir_b).as_deref()).await;
    drop(svc_a);
    let (b, svc_b) = take_over(b, a, seq, snap(&dir_b).as_deref()).await;
    assert_eq!(svc_b.metadata_view().drains, want, "the job is as a logged it");
    let info = svc_b.query_drain(job).unwrap();
    assert_eq!((info.status, info.succeeded), (JobStatus::Running, 2), "{info:?}");
    for (c, s) in &nodes {
        svc_b.remount_segments(*c, std::slice::from_ref(s)).unwrap();
    }
    assert_eq!(svc_b.segment_status(seg_a), Ok(SegmentStatus::Draining), "out of placement at once");
    assert!(svc_b.replica_tasks(node_a, &done(&in_flight)).is_empty(), "a's moves are not b's");
    let mut report = Vec::new();
    let mut end = None;
    for _ in 0..1000 {
        svc_b.step_replica_tasks();
        let info = svc_b.query_drain(job).unwrap();
        if info.status.is_final() {
            end = Some(info);
            break;
        }
        let tasks = svc_b.replica_tasks(node_a, &std::mem::take(&mut report));
        report = done(&tasks);
    }
    let end = end.expect("the drain never ended on b");
    assert_eq!((end.status, end.succeeded), (JobStatus::Succeeded, 10), "{end:?}");
    assert_eq!(svc_b.segment_status(seg_a), Ok(SegmentStatus::Drained));
    for key in offsets.values() {
        let got = svc_b.get_replica_list("", key).unwrap();
        assert!(
            got.replicas
                .iter()
                .all(|d| !matches!(d.location, ReplicaLocation::Memory { segment_id, .. } if segment_id == seg_a)),
            "{key} still on a"
        );
    }
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_drain_is_taken_over_by_the_new_leader_through_the_log() {
    a_drain_survives(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_drain_is_taken_over_by_the_new_leader_through_a_snapshot() {
    a_drain_survives(true).await;
}
