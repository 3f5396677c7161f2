//! Standbys without shared snapshot storage (issue 34 §4): each candidate keeps its snapshots in its own local
//! directory. A standby started after the leader compacted its log finds nothing of its own that reaches the log,
//! fetches the leader's newest snapshot over the master's RPC port (proving the admin credential of the cluster
//! secret), checks it against the size and crc32c the leader announced, keeps it, follows the log from it and
//! takes over with the right objects when the leader dies. A non-admin credential is refused the snapshot; a
//! corrupt or truncated one is refused by the standby. Real etcd (log and leader election), real candidates.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_ha::leader::{EtcdCoordinator, EtcdCoordinatorConfig};
use crescent_ha::oplog::{FollowerConfig, OpLogBatchStorage, StorageConfig};
use crescent_ha::testing::EtcdServer;
use crescent_master::ha::{HaState, HaStatus, OpLogOptions, SnapshotOptions};
use crescent_master::server::snapshot_fetch::{FetchError, fetch_snapshot};
use crescent_master::server::{CandidateOptions, CandidateServer, MasterServer};
use crescent_master::service::{MasterConfig, MasterService};
use crescent_master::snapshot::store::LocalDirStore;
use crescent_net::auth::Keyring;
use crescent_proto::{ClientId, ErrorCode, Principal, ReplicateConfig, TenantId};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{durable, until, without_pins};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);
const CLUSTER: &str = "fetch";
const SECRET: &str = "standby-fetch-test-secret-0123456789";

fn keyring() -> Arc<Keyring> {
    Arc::new(Keyring::parse(SECRET).unwrap())
}

/// A candidate of [`CLUSTER`] in `etcd` with its own snapshot directory `dir` (lease TTL 2 s).
async fn candidate(etcd: &EtcdServer, dir: &Path) -> CandidateServer {
    let endpoints = vec![etcd.endpoint()];
    let mut coord = EtcdCoordinatorConfig::new(endpoints.clone(), CLUSTER);
    coord.ttl = Duration::from_secs(2);
    let coordinator = Arc::new(EtcdCoordinator::connect(coord).await.unwrap());
    let mut options = CandidateOptions::new(coordinator);
    options.follow = FollowerConfig { poll_interval: Duration::from_millis(10), ..FollowerConfig::default() };
    options.retry = Duration::from_millis(100);
    let store = Arc::new(LocalDirStore::new(dir).unwrap());
    let snapshots = SnapshotOptions { interval: Duration::from_millis(50), retain: 1, ..SnapshotOptions::new(store) };
    MasterServer::builder(MasterConfig::default())
        .background(false)
        .keyring(Some(keyring()))
        .oplog(Some(OpLogOptions::etcd(endpoints, CLUSTER).await.unwrap()))
        .snapshots(Some(snapshots))
        .start_candidate(options)
        .await
        .unwrap()
}

fn put(svc: &MasterService, writer: ClientId, key: &str) {
    svc.put_start(writer, "", key, 4096, &ReplicateConfig::with_replicas(1)).unwrap();
    svc.put_end(writer, "", key, Some(4096)).unwrap();
}

/// A leader of [`CLUSTER`] with a segment and objects, whose log was compacted below its snapshot; returns it
/// and the next key number.
async fn compacted_leader(etcd: &EtcdServer, dir: &Path) -> (CandidateServer, usize) {
    let a = candidate(etcd, dir).await;
    until(&a, "a leads", HaStatus::is_leader).await;
    let svc = a.service().unwrap();
    let mut s = crescent_testkit::segment_on("seg", 256 * MIB, "host");
    s.endpoint = "127.0.0.1:9300".into();
    svc.mount_segment_as(ClientId::random(), s, Some(&"node:n".parse().unwrap())).unwrap();
    let storage =
        OpLogBatchStorage::new(Arc::new(etcd.connect().await.unwrap()), CLUSTER, StorageConfig::default()).unwrap();
    let writer = ClientId::random();
    let mut i = 0;
    let compacted = crescent_testkit::eventually(WAIT, || {
        for _ in 0..20 {
            put(&svc, writer, &format!("k{i}"));
            i += 1;
        }
        let storage = storage.clone();
        async move { storage.first_stored_batch().await.unwrap().is_some_and(|b| b > 1) }
    })
    .await;
    assert!(compacted, "the leader never compacted its log");
    // Settled: the newest snapshot holds the whole log, so no other is published while nothing is written.
    let seq = durable(&svc).await;
    let latest = dir.join("latest");
    let settled = crescent_testkit::eventually(WAIT, || {
        let id = std::fs::read_to_string(&latest).unwrap_or_default();
        async move { id.trim().split_once('-').is_some_and(|(_, s)| s.parse::<u64>().ok() == Some(seq)) }
    })
    .await;
    assert!(settled, "no snapshot of seq {seq}");
    (a, i)
}

/// The payload file of the snapshot `latest` names (retention may still be deleting the one before it).
fn snapshot_file(dir: &Path) -> PathBuf {
    let id = std::fs::read_to_string(dir.join("latest")).unwrap();
    let file = dir.join("snapshots").join(id.trim()).join("data.csnp");
    assert!(file.is_file(), "{} is missing", file.display());
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_without_shared_storage_fetches_the_leaders_snapshot_follows_and_takes_over() {
    let etcd = EtcdServer::start().expect("etcd (install etcd-server or set CRESCENT_ETCD_BIN)");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, mut next) = compacted_leader(&etcd, dir_a.path()).await;
    let svc_a = a.service().unwrap();
    let leader = a.advertised().to_string();

    // Only the admin credential gets a snapshot; without the secret the hello itself fails.
    let tenant = keyring().credential(Principal::Tenant(TenantId::new("t").unwrap()));
    match fetch_snapshot(&leader, Some(&tenant), None).await {
        Err(FetchError::Refused { code: ErrorCode::PermissionDenied, .. }) => {}
        other => panic!("a tenant's credential fetched a snapshot: {:?}", other.map(|(m, _)| m)),
    }
    let node = keyring().credential("node:n".parse().unwrap());
    assert!(matches!(
        fetch_snapshot(&leader, Some(&node), None).await,
        Err(FetchError::Refused { code: ErrorCode::PermissionDenied, .. })
    ));
    assert!(fetch_snapshot(&leader, None, None).await.is_err(), "no credential: no hello");
    let (manifest, bytes) = fetch_snapshot(&leader, Some(&keyring().credential(Principal::Admin)), None).await.unwrap();
    assert_eq!((bytes.len() as u64, crc32c::crc32c(&bytes)), (manifest.data_size, manifest.data_crc32c));

    // B's own directory is empty and the log's first batches are gone: it bootstraps from A's snapshot.
    let b = candidate(&etcd, dir_b.path()).await;
    let seq = durable(&svc_a).await;
    until(&b, "b follows from the leader's snapshot", |s| s.state == HaState::Following && s.applied_seq >= seq).await;
    assert!(dir_b.path().join("latest").is_file(), "the fetched snapshot is kept in b's own directory");
    // ... and follows the log from there.
    let writer = ClientId::random();
    for _ in 0..50 {
        put(&svc_a, writer, &format!("k{next}"));
        next += 1;
    }
    let seq = durable(&svc_a).await;
    until(&b, "b follows the log", |s| s.applied_seq >= seq).await;
    let want = without_pins(svc_a.metadata_view());
    assert_eq!(want.objects.len(), next, "every put is in the leader's state");

    // The leader dies (no step-down: its lease expires): b takes over with the same objects.
    drop(svc_a);
    drop(a);
    until(&b, "b leads", HaStatus::is_leader).await;
    assert_eq!(without_pins(b.service().unwrap().metadata_view()), want);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_truncated_snapshot_from_the_leader_is_refused() {
    let etcd = EtcdServer::start().expect("etcd (install etcd-server or set CRESCENT_ETCD_BIN)");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, _) = compacted_leader(&etcd, dir_a.path()).await;
    let file = snapshot_file(dir_a.path());
    let good = std::fs::read(&file).unwrap();

    // One flipped byte: the bytes no longer match the crc32c the leader announces.
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    std::fs::write(&file, &bad).unwrap();
    let b = candidate(&etcd, dir_b.path()).await;
    let st = until(&b, "b refuses the corrupt snapshot", |s| {
        s.state == HaState::Failed && s.last_error.as_deref().is_some_and(|e| e.contains("payload checksum mismatch"))
    })
    .await;
    assert!(st.last_error.unwrap().contains("leader's snapshot"));
    assert!(!dir_b.path().join("latest").exists(), "nothing refused is kept");

    // Cut short: fewer bytes than the leader announces.
    std::fs::write(&file, &good[..good.len() / 3]).unwrap();
    until(&b, "b refuses the truncated snapshot", |s| {
        s.state == HaState::Failed && s.last_error.as_deref().is_some_and(|e| e.contains("bytes, manifest says"))
    })
    .await;
    assert_ne!(b.status().state, HaState::Following);

    // Whole again: b bootstraps from it.
    std::fs::write(&file, &good).unwrap();
    let seq = durable(&a.service().unwrap()).await;
    until(&b, "b follows once the snapshot is whole", |s| s.state == HaState::Following && s.applied_seq >= seq).await;
    b.shutdown().await;
    a.shutdown().await;
}
