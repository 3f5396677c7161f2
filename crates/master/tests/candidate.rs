//! Master candidates (issue 15 §2) on one in-memory log and the in-process coordinator: one leads, the other
//! follows the log as a hot standby; when the leader is deposed the standby takes over with exactly the durable
//! metadata, the old leader stops serving at once, and its writer — fenced by the new producer view — can make
//! nothing durable any more. The etcd coordinator and real processes are in `crates/cli/tests/failover.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_ha::kv::{HaKvBackend, MemoryKv};
use crescent_ha::leader::LocalCoordinator;
use crescent_ha::oplog::{
    FollowerConfig, OpLogBatchStorage, OrderedOpLogWriter, StorageConfig, StorageError, WriterConfig, WriterError,
};
use crescent_master::ha::{HaState, HaStatus, MasterEntry, OpLogOptions, SnapshotOptions, master_writer_config};
use crescent_master::server::{CandidateOptions, CandidateServer, MasterServer, NOT_LEADER};
use crescent_master::service::{MasterConfig, MasterService};
use crescent_master::snapshot::store::LocalDirStore;
use crescent_proto::{ClientId, ErrorCode, Principal, ReplicateConfig};
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{durable, until, without_pins};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(20);
const CLUSTER: &str = "cand";

fn options(coordinator: &LocalCoordinator) -> CandidateOptions {
    let mut o = CandidateOptions::new(Arc::new(coordinator.clone()));
    o.follow = FollowerConfig { poll_interval: Duration::from_millis(10), ..FollowerConfig::default() };
    o.retry = Duration::from_millis(50);
    o
}

async fn candidate(kv: &Arc<dyn HaKvBackend>, coordinator: &LocalCoordinator) -> CandidateServer {
    candidate_with(kv, coordinator, None).await
}

async fn candidate_with(
    kv: &Arc<dyn HaKvBackend>,
    coordinator: &LocalCoordinator,
    snapshots: Option<SnapshotOptions>,
) -> CandidateServer {
    let oplog = OpLogOptions { kv: kv.clone(), cluster: CLUSTER.into(), writer: master_writer_config() };
    MasterServer::builder(MasterConfig::default())
        .background(false)
        .oplog(Some(oplog))
        .snapshots(snapshots)
        .admin_addr(Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))))
        .start_candidate(options(coordinator))
        .await
        .unwrap()
}

fn put(svc: &MasterService, writer: ClientId, key: &str, size: u64) {
    svc.put_start(writer, "", key, size, &ReplicateConfig::with_replicas(1)).unwrap();
    svc.put_end(writer, "", key, Some(size)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_with_the_durable_state_and_the_deposed_leader_is_fenced() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let coord = LocalCoordinator::new(0);
    let a = candidate(&kv, &coord).await;
    let view_a = until(&a, "a leads", HaStatus::is_leader).await.view_version;
    let b = candidate(&kv, &coord).await;
    let st = until(&b, "b follows", |s| s.state == HaState::Following && s.leader.is_some()).await;
    assert_eq!(st.leader, Some(a.advertised().to_string()), "the standby names the leader");
    assert!(b.service().is_none(), "a standby serves nothing");

    // The leader's writes; the standby applies them as they become durable.
    let svc_a = a.service().unwrap();
    let node = ClientId::random();
    // The connection that mounts them proved `node:a` (an authenticating master's RPC server passes it).
    let node_a: Principal = "node:a".parse().unwrap();
    let mut specs = Vec::new();
    for i in 0..3 {
        let mut s = crescent_testkit::segment_on(&format!("seg{i}"), 64 * MIB, &format!("host{i}"));
        s.endpoint = format!("127.0.0.1:{}", 9200 + i);
        svc_a.mount_segment_as(node, s.clone(), Some(&node_a)).unwrap();
        specs.push(s);
    }
    let writer = ClientId::random();
    for i in 0..60 {
        put(&svc_a, writer, &format!("k{i}"), 4096 + i);
    }
    for i in (0..60).step_by(4) {
        svc_a.remove("", &format!("k{i}"), true).unwrap();
    }
    let seq = durable(&svc_a).await;
    until(&b, "b applied the leader's log", |s| s.applied_seq == seq && s.lag == 0).await;
    let leader_view = without_pins(svc_a.metadata_view());

    // Depose a: it stops serving at once; b promotes with exactly the durable metadata.
    coord.depose();
    // (Following again once its term is torn down.)
    until(&a, "a steps down", |s| s.step_downs == 1 && s.state == HaState::Following).await;
    let st = until(&b, "b leads", HaStatus::is_leader).await;
    assert!(st.view_version > 1, "a newer view: {st:?}");
    let svc_b = b.service().unwrap();
    assert_eq!(without_pins(svc_b.metadata_view()), leader_view, "the new leader holds the durable metadata");
    // ... including who mounted the node's segments, before the node reconnects: their host for grants and
    // tickets, and the one principal that may act in the node's client id.
    assert_eq!(svc_b.mounter(node), Some(node_a.clone()));
    let thief: Principal = "tenant:x".parse().unwrap();
    assert_eq!(svc_b.remount_segments_as(node, &specs, Some(&thief)), Err(ErrorCode::PermissionDenied));
    assert!(svc_b.stat("", "k1").is_ok() && svc_b.stat("", "k0").is_err(), "removals stay removed");

    // The deposed leader serves nothing, and its term's writer is stopped: its mutations are refused.
    assert!(a.service().is_none());
    svc_a.put_start(writer, "", "zombie", 4096, &ReplicateConfig::with_replicas(1)).unwrap();
    assert!(svc_a.put_end(writer, "", "zombie", None).is_err(), "a stopped term logs nothing");
    // A zombie that missed its lease loss and kept writing under its old view is fenced by b's producer view.
    let storage = OpLogBatchStorage::new(kv.clone(), CLUSTER, StorageConfig::default()).unwrap();
    assert_eq!(storage.read_producer_view().await.unwrap(), Some(st.view_version));
    let before = storage.read_durable_prefix().await.unwrap().unwrap();
    let zombie = OrderedOpLogWriter::new(storage.clone(), view_a, before, WriterConfig::default());
    zombie.start();
    let slot = zombie.reserve().unwrap();
    let seq = zombie.commit(slot, MasterEntry::Remove { tenant: String::new(), key: "k1".into() }.encode(), None);
    let r = zombie.wait_durable(seq.unwrap(), WAIT).await;
    assert!(matches!(r, Err(WriterError::Terminal(StorageError::Fenced { .. }))), "{r:?}");
    assert_eq!(storage.read_durable_prefix().await.unwrap(), Some(before), "nothing written past b's prefix");
    assert!(svc_b.stat("", "k1").is_ok());
    zombie.stop().await;
    drop(svc_a);

    // The node remounts on the new leader, which writes on; the old one, now a standby, follows it.
    svc_b.remount_segments_as(node, &specs, Some(&node_a)).unwrap();
    put(&svc_b, writer, "after", 1234);
    let seq = durable(&svc_b).await;
    until(&a, "a follows b", |s| s.applied_seq == seq && s.leader == Some(b.advertised().to_string())).await;
    drop(svc_b);
    b.shutdown().await;
    let st = until(&a, "a leads again after b released", HaStatus::is_leader).await;
    assert!(st.view_version > 2);
    assert!(a.service().unwrap().stat("", "after").is_ok());
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_refuses_requests_naming_the_leader() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let coord = LocalCoordinator::new(0);
    let a = candidate(&kv, &coord).await;
    until(&a, "a leads", HaStatus::is_leader).await;
    let b = candidate(&kv, &coord).await;
    until(&b, "b follows", |s| s.leader.is_some()).await;
    let refusal = b.refusal();
    assert_eq!(refusal.code, NOT_LEADER);
    assert!(crescent_ha::leader::watch::is_not_leader(&refusal.message), "{}", refusal.message);
    assert!(refusal.message.contains(&a.advertised().to_string()), "names the leader: {}", refusal.message);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_bootstraps_from_the_newest_snapshot_over_a_compacted_log() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let coord = LocalCoordinator::new(0);
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LocalDirStore::new(dir.path().join("snapshots")).unwrap());
    let snaps = SnapshotOptions { interval: Duration::from_millis(50), retain: 1, ..SnapshotOptions::new(store) };
    let a = candidate_with(&kv, &coord, Some(snaps.clone())).await;
    until(&a, "a leads", HaStatus::is_leader).await;
    let svc_a = a.service().unwrap();
    let node = ClientId::random();
    let mut s = crescent_testkit::segment_on("seg", 64 * MIB, "host");
    s.endpoint = "127.0.0.1:9300".into();
    let mounter: Principal = "node:n".parse().unwrap();
    svc_a.mount_segment_as(node, s, Some(&mounter)).unwrap();
    let writer = ClientId::random();
    let storage = OpLogBatchStorage::new(kv.clone(), CLUSTER, StorageConfig::default()).unwrap();
    // Rounds of writes until a snapshot let the log's first batches be compacted away.
    let mut i = 0;
    let compacted = crescent_testkit::eventually(WAIT, || {
        for _ in 0..20 {
            put(&svc_a, writer, &format!("k{i}"), 4096);
            i += 1;
        }
        let storage = storage.clone();
        async move { storage.first_stored_batch().await.unwrap().is_some_and(|b| b > 1) }
    })
    .await;
    assert!(compacted, "the log was never compacted");
    let seq = durable(&svc_a).await;
    let admin = a.admin_addr().unwrap().to_string();
    let h = crescent_testkit::process::health(&admin).unwrap();
    assert!(h["snapshots"]["written"].as_u64().unwrap() >= 1, "/health shows the snapshots: {h}");
    assert!(h["snapshots"]["last"]["last_seq"].as_u64().unwrap() > 0, "{h}");

    // The log alone can no longer rebuild the state: the standby starts from the snapshot.
    let b = candidate_with(&kv, &coord, Some(snaps)).await;
    until(&b, "b follows from the snapshot", |s| s.state == HaState::Following && s.applied_seq >= seq).await;
    let want = without_pins(svc_a.metadata_view());
    coord.depose();
    until(&b, "b leads", HaStatus::is_leader).await;
    assert_eq!(without_pins(b.service().unwrap().metadata_view()), want);
    assert_eq!(b.service().unwrap().mounter(node), Some(mounter), "the snapshot names the segment's mounter");
    a.shutdown().await;
    b.shutdown().await;
}
