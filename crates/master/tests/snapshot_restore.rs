//! Snapshots (issue 15 §3): the catalog's publish / retain / fallback contract on a local directory and on a
//! real S3-compatible server (moto, started here on loopback), and restore = snapshot + the oplog after it giving
//! exactly the metadata the live master has, with the log compacted below the retained snapshots.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use bytes::Bytes;
use crescent_ha::kv::{HaKvBackend, MemoryKv};
use crescent_ha::oplog::{DurablePrefix, OpLogBatchStorage, StorageConfig, WriterConfig};
use crescent_master::clock::{ManualClock, Timestamp};
use crescent_master::ha::{
    OpLogOptions, OpenError, ReplayObject, ReplayState, SnapshotOptions, Snapshotter, load_baseline, restore_state,
};
use crescent_master::service::{MasterConfig, MasterService};
use crescent_master::snapshot::catalog::{Catalog, Manifest, snapshot_id};
use crescent_master::snapshot::store::{LocalDirStore, S3Options, S3Store, SnapshotStore, StoreError};
use crescent_master::snapshot::{self, MasterSnapshotView, SnapshotMetadata};
use crescent_proto::{ClientId, ReplicateConfig, SegmentSpec, SoftPinAction};
use crescent_testkit::eventually;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(20);

/// A moto S3 server on a free loopback port, killed on drop. The binary comes from `CRESCENT_MOTO_SERVER`
/// (scripts/test.sh installs moto into its virtual environment and exports it); without it the test fails.
struct Moto {
    child: std::process::Child,
    endpoint: String,
}

impl Moto {
    fn start() -> Self {
        let bin = std::env::var("CRESCENT_MOTO_SERVER").expect(
            "CRESCENT_MOTO_SERVER is not set: the S3 snapshot tests need moto's server \
             (scripts/test.sh installs it: pip install 'moto[server]' into its venv and exports the path)",
        );
        assert!(std::path::Path::new(&bin).exists(), "CRESCENT_MOTO_SERVER={bin} does not exist");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {bin}: {e}"));
        let moto = Moto { child, endpoint: format!("http://127.0.0.1:{port}") };
        // Ready once it answers HTTP (a Python server takes a second or two to import).
        let deadline = Instant::now() + Duration::from_secs(30);
        while http(port, "GET", "/").is_none() {
            assert!(Instant::now() < deadline, "moto_server did not answer on port {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        moto
    }

    fn port(&self) -> u16 {
        self.endpoint.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// Creates a bucket (moto accepts unsigned requests).
    fn bucket(&self, name: &str) {
        let status = http(self.port(), "PUT", &format!("/{name}")).expect("moto answers");
        assert!(status.starts_with("HTTP/1.1 200"), "creating bucket {name}: {status}");
    }

    fn store(&self, bucket: &str, prefix: &str) -> Arc<dyn SnapshotStore> {
        self.bucket(bucket);
        let o = S3Options {
            url: format!("s3://{bucket}/{prefix}"),
            endpoint: Some(self.endpoint.clone()),
            access_key_id: Some("test".into()),
            secret_access_key: Some("test".into()),
            region: Some("us-east-1".into()),
        };
        Arc::new(S3Store::new(&o).unwrap())
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status line of a bodiless request, `None` if nothing answered.
fn http(port: u16, method: &str, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines().next().map(str::to_owned)
}

fn local_store() -> (tempfile::TempDir, Arc<dyn SnapshotStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LocalDirStore::new(dir.path().join("snapshots")).unwrap());
    (dir, store)
}

/// A small state at `seq` / `batch` whose one object's size is `seq` (so states differ).
fn state_at(batch: u64, seq: u64) -> (Bytes, SnapshotMetadata) {
    let mut state = ReplayState { last_seq: seq, ..ReplayState::default() };
    let object = crescent_master::ha::ObjectRecord {
        size: seq,
        replicas: vec![crescent_master::ha::ReplicaRecord { id: 1, segment: [7; 16], offset: 0, length: seq, tier: 0 }],
        checksum: Some(seq),
        group: None,
        hard_pinned: false,
        soft_pin_ms: 0,
        data_type: 0,
        no_offload: false,
        writer: None,
    };
    state.objects.insert("default", &format!("k{seq}"), object);
    let meta = SnapshotMetadata { state, batch_id: batch, producer_view: 1 };
    let view = MasterSnapshotView { metadata: Some(meta.clone()), ..MasterSnapshotView::default() };
    (Bytes::from(snapshot::encode(&view)), meta)
}

/// The catalog's contract, the same on every store.
async fn catalog_contract(store: Arc<dyn SnapshotStore>) {
    let catalog = Catalog::new(&*store);
    assert!(catalog.load_newest(0).await.unwrap().is_none(), "an empty store has no snapshot");
    assert_eq!(catalog.latest().await.unwrap(), None);
    let mut metas = Vec::new();
    for (b, s) in [(1, 10), (2, 20), (3, 30)] {
        let (bytes, meta) = state_at(b, s);
        let p = catalog.publish(bytes, b, s, 1, 2).await.unwrap();
        assert!(p.written);
        assert_eq!((p.manifest.batch_id, p.manifest.last_seq), (b, s));
        metas.push(meta);
    }
    let (id1, id2, id3) = (snapshot_id(1, 10), snapshot_id(2, 20), snapshot_id(3, 30));
    // The newest one read in pieces (how a leader sends it to a standby) is the whole payload, checked whole.
    let newest = catalog.newest_manifest().await.unwrap().unwrap();
    assert_eq!(newest.id, id3);
    let mut pieces = Vec::new();
    for offset in (0..newest.data_size + 10).step_by(7) {
        pieces.extend_from_slice(&catalog.read_chunk(&newest, offset, 7).await.unwrap().unwrap());
    }
    assert_eq!(pieces.len() as u64, newest.data_size, "nothing past the end");
    let verify = |bytes: Vec<u8>| crescent_master::snapshot::catalog::verify_payload(&newest, Bytes::from(bytes), 30);
    assert_eq!(verify(pieces.clone()).await.unwrap().metadata.unwrap().state.last_seq, 30);
    pieces.pop();
    assert!(verify(pieces).await.is_err());
    assert_eq!(catalog.manifest(&snapshot_id(9, 90)).await.unwrap(), None);
    assert_eq!(catalog.list().await.unwrap(), vec![id2.clone(), id3.clone()], "retention keeps the newest 2");
    assert_eq!(catalog.latest().await.unwrap().as_deref(), Some(id3.as_str()));
    assert!(store.get(&format!("snapshots/{id1}/data.csnp")).await.unwrap().is_none(), "the oldest is gone");
    let newest = catalog.load_newest(0).await.unwrap().unwrap();
    assert_eq!(newest.manifest.id, id3);
    assert_eq!(newest.view.metadata.as_ref(), Some(&metas[2]), "loaded exactly what was published");
    assert!(newest.skipped.is_empty());
    // The same position again writes nothing.
    let (bytes, _) = state_at(3, 30);
    assert!(!catalog.publish(bytes, 3, 30, 1, 2).await.unwrap().written);

    // A corrupt newest snapshot (one flipped byte, same size): the previous one is restored, whole.
    let key3 = format!("snapshots/{id3}/data.csnp");
    let mut bad = store.get(&key3).await.unwrap().unwrap().to_vec();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    store.put(&key3, Bytes::from(bad)).await.unwrap();
    let fallback = catalog.load_newest(0).await.unwrap().unwrap();
    assert_eq!(fallback.manifest.id, id2);
    assert_eq!(fallback.view.metadata.as_ref(), Some(&metas[1]));
    assert_eq!(fallback.skipped.len(), 1);
    assert!(fallback.skipped[0].1.contains("checksum"), "{:?}", fallback.skipped);
    // A truncated payload is refused by its size.
    let (good, _) = state_at(3, 30);
    store.put(&key3, good.slice(..good.len() - 5)).await.unwrap();
    let fallback = catalog.load_newest(0).await.unwrap().unwrap();
    assert_eq!(fallback.manifest.id, id2);
    assert!(fallback.skipped[0].1.contains("bytes"), "{:?}", fallback.skipped);

    // A whole snapshot newer than `latest` (a publish that never pointed `latest` at it) is never loaded.
    let (bytes4, _) = state_at(4, 40);
    let id4 = snapshot_id(4, 40);
    let manifest4 = Manifest {
        format: 1,
        id: id4.clone(),
        batch_id: 4,
        last_seq: 40,
        producer_view: 1,
        data_key: format!("snapshots/{id4}/data.csnp"),
        data_size: bytes4.len() as u64,
        data_crc32c: crc32c::crc32c(&bytes4),
        created_ms: 0,
    };
    store.put(&manifest4.data_key, bytes4).await.unwrap();
    store.put(&format!("snapshots/{id4}/manifest.json"), serde_json::to_vec(&manifest4).unwrap().into()).await.unwrap();
    assert_eq!(catalog.load_newest(0).await.unwrap().unwrap().manifest.id, id2, "unpublished leftovers are ignored");

    // No usable snapshot at all: none, never a partial one.
    store.delete(&format!("snapshots/{id2}/data.csnp")).await.unwrap();
    let none = catalog.load_newest(0).await.unwrap();
    assert!(none.is_none(), "{none:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_publishes_retains_and_falls_back_on_a_local_directory() {
    let (_dir, store) = local_store();
    catalog_contract(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_publishes_retains_and_falls_back_on_s3() {
    let moto = tokio::task::spawn_blocking(Moto::start).await.unwrap();
    let store = moto.store("crescent-snapshots", "cluster-a");
    catalog_contract(store).await;
}

#[tokio::test]
async fn store_keys_cannot_leave_the_store() {
    let (_dir, store) = local_store();
    for bad in ["", "../x", "a/../../b", "a//b", "/abs", "a/./b", "sp ace", "latest/"] {
        assert!(matches!(store.put(bad, Bytes::from_static(b"x")).await, Err(StoreError::InvalidKey(_))), "{bad:?}");
        assert!(matches!(store.get(bad).await, Err(StoreError::InvalidKey(_))), "{bad:?}");
    }
}

fn spec(i: usize) -> SegmentSpec {
    let mut s = crescent_testkit::segment_on(&format!("seg{i}"), 64 * MIB, &format!("host{i}"));
    s.endpoint = format!("127.0.0.1:{}", 9100 + i);
    s
}

struct Leader {
    svc: Arc<MasterService>,
    log: Arc<crescent_master::ha::OpLog>,
    writer: ClientId,
    segments: Vec<(ClientId, SegmentSpec)>,
}

impl Leader {
    fn put(&self, tenant: &str, key: &str, size: u64, replicas: u32, group: Option<&str>) {
        let mut cfg = ReplicateConfig::with_replicas(replicas);
        cfg.group_id = group.map(str::to_owned);
        self.svc.put_start(self.writer, tenant, key, size, &cfg).unwrap();
        self.svc.put_end(self.writer, tenant, key, Some(size ^ 0x5a5a)).unwrap();
    }

    async fn durable(&self) -> DurablePrefix {
        let log = self.log.clone();
        let done = eventually(WAIT, || async {
            let s = log.status();
            s.durable.last_seq + 1 == s.next_seq
        })
        .await;
        assert!(done, "everything committed became durable: {:?}", self.log.status());
        self.log.status().durable
    }
}

fn multi_tenant() -> MasterConfig {
    MasterConfig { enable_multi_tenants: true, ..MasterConfig::default() }
}

/// Segments and objects of two states (what restore must reproduce exactly).
fn assert_same_metadata(got: &ReplayState, want: &ReplayState, what: &str) {
    assert_eq!(got.segments, want.segments, "{what}: segments");
    // Only the differing objects in the message (the whole maps are hundreds of lines).
    let key = |o: &ReplayObject<'_>| (o.tenant().to_owned(), o.key().to_owned());
    let mut differ: Vec<_> = got
        .objects
        .iter()
        .filter(|o| want.objects.get(o.tenant(), o.key()) != Some(o.record()))
        .map(|o| (key(&o), Some(o.record()), want.objects.get(o.tenant(), o.key())))
        .chain(
            want.objects
                .iter()
                .filter(|o| !got.objects.contains(o.tenant(), o.key()))
                .map(|o| (key(&o), None, Some(o.record()))),
        )
        .collect();
    differ.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(differ.is_empty(), "{what}: objects differ (key, got, want): {differ:?}");
    assert_eq!(got.objects.len(), want.objects.len(), "{what}: object count");
}

/// Snapshot + the oplog after it restores exactly the live master's metadata, with the log compacted below the
/// retained snapshots (so the log alone can no longer restore), on the given store; and a corrupt newest
/// snapshot falls back to the previous one with the same result.
async fn restore_matches_the_leader(store: Arc<dyn SnapshotStore>) {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let options = OpLogOptions { kv: kv.clone(), cluster: "snap".into(), writer: WriterConfig::default() };
    let clock = ManualClock::new(Timestamp(1_000_000));
    let svc = Arc::new(MasterService::new(multi_tenant(), clock.clone()).unwrap());
    let (log, _) = crescent_master::ha::open(&options, &svc).await.unwrap();
    let mut a = Leader { svc, log, writer: ClientId::random(), segments: Vec::new() };
    let storage = OpLogBatchStorage::new(kv.clone(), "snap", StorageConfig::default()).unwrap();
    let snap_options = SnapshotOptions { retain: 2, ..SnapshotOptions::new(store.clone()) };
    let mut snapshotter =
        Snapshotter::new(storage.clone(), snap_options, ReplayState::default(), DurablePrefix::default());

    for i in 0..3 {
        let (c, s) = (ClientId::random(), spec(i));
        a.svc.mount_segment(c, s.clone()).unwrap();
        a.segments.push((c, s));
    }
    a.svc.upsert_tenant_quota("t1", 512 * MIB).unwrap();
    a.svc.upsert_tenant_quota("t2", 256 * MIB).unwrap();
    for i in 0..40 {
        a.put(if i % 2 == 0 { "t1" } else { "t2" }, &format!("k{i}"), 4096 + i, 1 + (i % 2) as u32, None);
    }
    for i in 0..6 {
        a.put("t1", &format!("g{i}"), 8192, 1, Some("group-a"));
    }
    a.durable().await;
    let first = snapshotter.snapshot_now().await.unwrap().expect("a first snapshot");
    assert!(first.written && first.manifest.last_seq > 0);
    assert_eq!(snapshotter.snapshot_now().await.unwrap(), None, "nothing new, nothing written");

    // Second epoch: removals, a group removal, overwrites, a quota change, an unmount.
    for i in (0..40).step_by(3) {
        a.svc.remove(if i % 2 == 0 { "t1" } else { "t2" }, &format!("k{i}"), true).unwrap();
    }
    a.svc.remove_group("t1", "group-a", true).unwrap();
    a.svc.upsert_tenant_quota("t2", 128 * MIB).unwrap();
    let (_, gone) = a.segments.remove(2);
    a.svc.unmount_segment(gone.id).unwrap();
    for i in 40..60 {
        a.put("t2", &format!("k{i}"), 2048, 1, None);
    }
    a.durable().await;
    let second = snapshotter.snapshot_now().await.unwrap().unwrap();
    // Third epoch, then a tail the last snapshot does not hold.
    for i in 60..80 {
        a.put("t1", &format!("k{i}"), 1024, 2, None);
    }
    // A soft-pinned object, a write still in flight and a reader's lease: restore keeps none of them.
    let mut pin = ReplicateConfig::with_replicas(1);
    pin.soft_pin_action = SoftPinAction::Enable;
    pin.soft_pin_ttl_ms = Some(600_000);
    a.svc.put_start(a.writer, "t1", "pinned", 4096, &pin).unwrap();
    a.svc.put_end(a.writer, "t1", "pinned", None).unwrap();
    assert!(a.svc.stat("t1", "pinned").unwrap().soft_pin_remaining_ms > 0);
    a.svc.put_start(a.writer, "t1", "inflight", 4096, &ReplicateConfig::with_replicas(1)).unwrap();
    a.svc.get_replica_list("t1", "k61").unwrap();
    assert!(a.svc.stat("t1", "k61").unwrap().lease_remaining_ms > 0);
    a.durable().await;
    let third = snapshotter.snapshot_now().await.unwrap().unwrap();
    assert!(first.manifest.batch_id < second.manifest.batch_id && second.manifest.batch_id < third.manifest.batch_id);
    assert_eq!(third.deleted, vec![first.manifest.id.clone()], "retention of 2");
    for i in 80..90 {
        a.put("t2", &format!("k{i}"), 1024, 1, None);
    }
    a.svc.remove("t1", "k60", true).unwrap();
    let prefix = a.durable().await;
    assert!(prefix.last_seq > third.manifest.last_seq, "a tail after the newest snapshot");

    // Compaction deleted every batch the oldest retained snapshot holds; the log alone cannot restore now.
    let first_stored = storage.first_stored_batch().await.unwrap().unwrap();
    assert_eq!(first_stored, second.manifest.batch_id + 1, "batches up to the oldest retained snapshot are gone");
    let err = restore_state(None, &storage, prefix).await.unwrap_err();
    assert!(matches!(err, OpenError::MissingBaseline { first_batch, .. } if first_batch == first_stored), "{err}");

    // Snapshot + log = the leader's metadata, exactly (soft pins aside: restore drops them).
    let mut live = a.svc.metadata_view();
    assert!(live.objects.view("t1", "pinned").unwrap().soft_pin_ms() > 0, "the leader holds the pin");
    assert!(!live.objects.contains("t1", "inflight"), "in flight: not readable");
    live.objects.clear_soft_pins();
    let (state, baseline) = restore_state(Some(&*store), &storage, prefix).await.unwrap();
    assert_eq!(baseline.snapshot.as_ref().map(|m| m.id.as_str()), Some(third.manifest.id.as_str()));
    assert_eq!(state.last_seq, prefix.last_seq);
    assert_same_metadata(&state, &live, "snapshot + log vs the live leader");
    let want_policies: BTreeMap<String, u64> = [("t1".into(), 512 * MIB), ("t2".into(), 128 * MIB)].into();
    assert_eq!(state.policies, Some(want_policies));
    // The snapshotter's own follower agrees too (it folds the log as it is, soft pins included).
    snapshotter.catch_up().await.unwrap();
    let mut followed = snapshotter.state().clone();
    assert!(followed.objects.view("t1", "pinned").unwrap().soft_pin_ms() > 0);
    followed.objects.clear_soft_pins();
    assert_same_metadata(&followed, &live, "the snapshotter's follower");

    // A master restored from it, its nodes back, serves the same metadata.
    let b = MasterService::new(multi_tenant(), ManualClock::new(Timestamp(5_000_000))).unwrap();
    b.restore_replayed(&state).unwrap();
    for (c, s) in &a.segments {
        b.remount_segments(*c, std::slice::from_ref(s)).unwrap();
    }
    assert_same_metadata(&b.metadata_view(), &live, "the restored master");
    assert_eq!(b.stat("t1", "pinned").unwrap().soft_pin_remaining_ms, 0, "soft pins are dropped");
    assert_eq!(b.stat("t1", "k61").unwrap().lease_remaining_ms, 0, "leases are dropped");
    assert!(b.stat("t1", "inflight").is_err(), "in-flight writes are dropped");
    assert_eq!(b.tenant_quota("t2").map(|q| q.requested_quota_bytes), Some(128 * MIB));

    // The newest snapshot corrupt: the previous one + a longer log gives the same state.
    let key = format!("snapshots/{}/data.csnp", third.manifest.id);
    let mut bad = store.get(&key).await.unwrap().unwrap().to_vec();
    let n = bad.len();
    bad[n - 1] ^= 1;
    store.put(&key, Bytes::from(bad)).await.unwrap();
    let (state2, baseline2) = restore_state(Some(&*store), &storage, prefix).await.unwrap();
    assert_eq!(baseline2.snapshot.as_ref().map(|m| m.id.as_str()), Some(second.manifest.id.as_str()));
    assert_eq!(baseline2.skipped.len(), 1);
    assert_eq!(state2, state, "the fallback restores the very same state");
    let base = load_baseline(Some(&*store), &storage).await.unwrap();
    assert_eq!(base.position, DurablePrefix { batch_id: second.manifest.batch_id, last_seq: second.manifest.last_seq });
    a.log.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_plus_log_restores_exactly_the_leaders_metadata_local_dir() {
    let (_dir, store) = local_store();
    restore_matches_the_leader(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_plus_log_restores_exactly_the_leaders_metadata_s3() {
    let moto = tokio::task::spawn_blocking(Moto::start).await.unwrap();
    let store = moto.store("crescent-restore", "c1");
    restore_matches_the_leader(store).await;
}

/// A restarted master (open with snapshots) restores from snapshot + log, and its snapshotter carries on from
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_master_opens_from_its_newest_snapshot() {
    let (_dir, store) = local_store();
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let options = OpLogOptions { kv: kv.clone(), cluster: "restart".into(), writer: WriterConfig::default() };
    let snaps =
        SnapshotOptions { interval: Duration::from_millis(50), retain: 2, ..SnapshotOptions::new(store.clone()) };
    let svc = Arc::new(MasterService::new(multi_tenant(), ManualClock::new(Timestamp(1_000_000))).unwrap());
    let (log, report, snapshotter) =
        crescent_master::ha::open_with_snapshots(&options, Some(&snaps), &svc).await.unwrap();
    assert_eq!(report.snapshot, DurablePrefix::default(), "nothing to restore from yet");
    let snapshotter = snapshotter.unwrap();
    let a = Leader { svc, log, writer: ClientId::random(), segments: vec![(ClientId::random(), spec(0))] };
    a.svc.mount_segment(a.segments[0].0, a.segments[0].1.clone()).unwrap();
    a.svc.upsert_tenant_quota("t", 64 * MIB).unwrap();
    for i in 0..30 {
        a.put("t", &format!("k{i}"), 4096, 1, None);
    }
    let prefix = a.durable().await;
    let mut status = snapshotter.subscribe();
    let published =
        tokio::time::timeout(WAIT, status.wait_for(|s| s.last.as_ref().is_some_and(|m| m.last_seq == prefix.last_seq)))
            .await
            .expect("the periodic snapshotter published the durable prefix")
            .unwrap()
            .clone();
    assert!(published.written >= 1);
    snapshotter.stop().await;
    a.svc.remove("t", "k0", true).unwrap();
    let prefix = a.durable().await;
    let live = a.svc.metadata_view();
    a.log.stop().await;

    let b = Arc::new(MasterService::new(multi_tenant(), ManualClock::new(Timestamp(9_000_000))).unwrap());
    let (log_b, report, snap_b) = crescent_master::ha::open_with_snapshots(&options, Some(&snaps), &b).await.unwrap();
    assert_eq!(report.prefix, prefix);
    assert_eq!(report.snapshot.last_seq, published.last.as_ref().unwrap().last_seq, "started from the snapshot");
    assert_eq!(report.objects, 29);
    b.remount_segments(a.segments[0].0, std::slice::from_ref(&a.segments[0].1)).unwrap();
    assert_same_metadata(&b.metadata_view(), &live, "the reopened master");
    snap_b.unwrap().stop().await;
    log_b.stop().await;
}
