//! Restore time (issue 15 §3): a master restored from a snapshot of N objects (default 1 M) plus M oplog
//! entries after it (default 100 k: 80 % PUT_ENDs of new objects, 20 % REMOVEs of snapshotted ones), as a
//! restarted master does it — newest snapshot loaded and verified from a local directory, the log after it
//! replayed, the state restored into a fresh `MasterService` (`restore_replayed`). The log is in the in-memory
//! KV backend, so the figure is the master's own work, not etcd's.
//!
//! `cargo bench -p crescent-master --bench snapshot_restore [-- --objects N --entries M --runs R]`. Prints each
//! run's phases and the min / median total.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

/// The allocator the `crescent` binary runs the master with: memory and time are measured as a user meets them.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use crescent_ha::kv::{HaKvBackend, MemoryKv};
use crescent_ha::oplog::{DurablePrefix, OpLogBatchRecord, OpLogBatchStorage, OpLogEntry, StorageConfig};
use crescent_master::clock::SystemClock;
use crescent_master::ha::{MasterEntry, ObjectRecord, ReplayState, ReplicaRecord, SegmentRecord, restore_state};
use crescent_master::service::{MasterConfig, MasterService};
use crescent_master::snapshot::catalog::Catalog;
use crescent_master::snapshot::store::{LocalDirStore, SnapshotStore};
use crescent_master::snapshot::{self, MasterSnapshotView, SnapshotMetadata};
use crescent_proto::ClientId;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SEGMENTS: u64 = 64;
const SIZE: u64 = 4096;
const GIB: u64 = 1 << 30;
/// Entries per batch record (the storage default caps a batch at 1024).
const PER_BATCH: usize = 1000;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The process's resident set, bytes (`/proc/self/statm`, pages of 4 KiB).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
}

fn segment(i: u64) -> SegmentRecord {
    let spec = crescent_testkit::segment_on(&format!("node{i}"), 16 * GIB, &format!("host{i}"));
    SegmentRecord::new(ClientId::random(), &spec, None)
}

fn object(i: u64, segments: &[SegmentRecord]) -> (String, ObjectRecord) {
    let seg = &segments[(i % SEGMENTS) as usize];
    let replica = ReplicaRecord { id: i + 1, segment: seg.id, offset: (i / SEGMENTS) * SIZE, length: SIZE, tier: 0 };
    let o = ObjectRecord {
        size: SIZE,
        replicas: vec![replica],
        checksum: Some(i),
        group: None,
        hard_pinned: false,
        soft_pin_ms: 0,
        data_type: 1,
        no_offload: false,
        writer: None,
    };
    (format!("k{i:019}"), o)
}

/// Writes the snapshot (batch 1 holds seqs 1..=objects) and the log after it; returns the durable prefix.
async fn setup(store: &dyn SnapshotStore, kv: Arc<dyn HaKvBackend>, objects: u64, entries: u64) -> DurablePrefix {
    let segments: Vec<SegmentRecord> = (0..SEGMENTS).map(segment).collect();
    let before = rss();
    let mut state = ReplayState { last_seq: objects, ..ReplayState::default() };
    state.objects.reserve(objects as usize);
    for s in &segments {
        state.segments.insert(s.spec().unwrap().id, s.clone());
    }
    for i in 0..objects {
        let (k, o) = object(i, &segments);
        state.objects.insert("default", &k, o);
    }
    // What a standby, or a leader's snapshotter, holds for these objects.
    let held = rss().saturating_sub(before);
    println!(
        "folded state: {objects} objects, RSS +{} MiB, {:.1} B per object",
        held >> 20,
        held as f64 / objects as f64
    );
    let t = Instant::now();
    let view = MasterSnapshotView {
        metadata: Some(SnapshotMetadata { state, batch_id: 1, producer_view: 1 }),
        ..Default::default()
    };
    let bytes = snapshot::encode(&view);
    let encoded = t.elapsed();
    let size = bytes.len();
    Catalog::new(store).publish(bytes.into(), 1, objects, 1, 2).await.unwrap();
    println!("snapshot: {objects} objects, {size} bytes, encoded in {encoded:?}, published in {:?}", t.elapsed());

    // The log: batch 1 stands for what the snapshot holds (its terminal record), then the entries after it.
    let storage = OpLogBatchStorage::new(kv.clone(), "bench", StorageConfig::default()).unwrap();
    let keys = storage.keys().clone();
    let last = MasterEntry::Remove { tenant: "default".into(), key: "placeholder".into() }.encode();
    let b1 = OpLogBatchRecord::new(1, objects, vec![last]).unwrap();
    kv.put(&keys.batch(1), &b1.encode().unwrap()).await.unwrap();
    let mut prefix = DurablePrefix { batch_id: 1, last_seq: objects };
    kv.put(&keys.durable_prefix(), &prefix.encode()).await.unwrap();
    storage.claim_producer_view(1).await.unwrap();
    let mut pending: Vec<OpLogEntry> = Vec::with_capacity(PER_BATCH);
    for n in 0..entries {
        let e = if n % 5 == 4 {
            MasterEntry::Remove { tenant: "default".into(), key: object(n * 7 % objects, &segments).0 }
        } else {
            let (key, object) = object(objects + n, &segments);
            MasterEntry::PutEnd { tenant: "default".into(), key, object }
        };
        pending.push(e.encode());
        if pending.len() == PER_BATCH || n + 1 == entries {
            let b =
                OpLogBatchRecord::new(prefix.batch_id + 1, prefix.last_seq + 1, std::mem::take(&mut pending)).unwrap();
            prefix = storage.write_batch(&b, prefix, 1).await.unwrap();
        }
    }
    println!("log: {entries} entries after the snapshot, prefix {prefix:?}");
    prefix
}

fn main() {
    // The restore logs its phases (`replayed state restored`): shown with the figures.
    tracing_subscriber::fmt().with_env_filter("crescent_master=info").with_target(false).init();
    let objects = arg("--objects", 1_000_000);
    let entries = arg("--entries", 100_000);
    let runs = arg("--runs", 3).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::new(dir.path()).unwrap();
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let prefix = rt.block_on(setup(&store, kv.clone(), objects, entries));
    let storage = OpLogBatchStorage::new(kv, "bench", StorageConfig::default()).unwrap();
    let mut totals: Vec<Duration> = Vec::new();
    for run in 0..runs {
        let svc = MasterService::new(MasterConfig::default(), Arc::new(SystemClock::new())).unwrap();
        let t = Instant::now();
        let (state, baseline) = rt.block_on(restore_state(Some(&store), &storage, prefix)).unwrap();
        let loaded = t.elapsed();
        let (restored, segments) = svc.restore_replayed(&state).unwrap();
        let total = t.elapsed();
        assert_eq!(baseline.position.last_seq, objects);
        assert_eq!(state.last_seq, prefix.last_seq);
        println!(
            "run {run}: snapshot load + replay {loaded:?}, restore_replayed {:?}, total {total:?} ({restored} objects, {segments} segments), RSS {} MiB",
            total - loaded,
            rss() >> 20
        );
        totals.push(total);
        // Dropping a million objects is not part of a restore.
        drop((state, svc));
    }
    totals.sort();
    println!(
        "restore of {objects} objects + {entries} entries: min {:?}, median {:?} over {runs} runs",
        totals[0],
        totals[totals.len() / 2]
    );
}
