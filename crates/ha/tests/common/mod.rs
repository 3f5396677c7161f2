//! Fixtures shared by the integration tests: the same test body runs against a real etcd, against redb and
//! against the in-memory backend.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use crescent_ha::kv::{EmbeddedKv, FaultyKv, HaKvBackend, MemoryKv};
use crescent_ha::oplog::{ApplyError, OpLogApplier, OpLogBatchRecord, OpLogBatchStorage, OpLogEntry, StorageConfig};
use crescent_ha::testing::EtcdServer;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// What keeps a backend alive: an etcd process or a temp directory.
pub enum Guard {
    /// A running etcd (killed on drop).
    Etcd(EtcdServer),
    /// The embedded store's directory (removed on drop).
    Dir(tempfile::TempDir),
    /// Nothing to keep (the in-memory backend).
    None,
}

/// A backend under test, wrapped for fault injection.
pub struct Fixture {
    /// The backend with faults (none scheduled until a test asks).
    pub kv: Arc<FaultyKv<Arc<dyn HaKvBackend>>>,
    /// Keeps the backend alive.
    pub guard: Guard,
}

impl Fixture {
    /// The backend as the storage takes it.
    pub fn dyn_kv(&self) -> Arc<dyn HaKvBackend> {
        self.kv.clone()
    }

    /// The oplog of cluster `c` on this backend.
    pub fn storage(&self, config: StorageConfig) -> OpLogBatchStorage {
        OpLogBatchStorage::new(self.dyn_kv(), "c", config).unwrap()
    }

    /// The oplog of another cluster on the same backend.
    pub fn storage_of(&self, cluster: &str) -> OpLogBatchStorage {
        OpLogBatchStorage::new(self.dyn_kv(), cluster, StorageConfig::default()).unwrap()
    }

    /// The oplog of `cluster` on the backend without the fault wrapper (a reader that faults aimed at a writer
    /// must not hit).
    pub fn clean_storage_of(&self, cluster: &str) -> OpLogBatchStorage {
        OpLogBatchStorage::new(self.kv.inner().clone(), cluster, StorageConfig::default()).unwrap()
    }
}

/// A fresh etcd server (a missing binary fails the test).
pub async fn etcd() -> Fixture {
    let server = tokio::task::spawn_blocking(EtcdServer::start).await.unwrap().expect("etcd must start for this test");
    let kv: Arc<dyn HaKvBackend> = Arc::new(server.connect().await.expect("connect to etcd"));
    Fixture { kv: Arc::new(FaultyKv::new(kv)), guard: Guard::Etcd(server) }
}

/// A fresh embedded store in a temp directory.
pub async fn redb() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let kv: Arc<dyn HaKvBackend> = Arc::new(EmbeddedKv::open(dir.path()).unwrap());
    Fixture { kv: Arc::new(FaultyKv::new(kv)), guard: Guard::Dir(dir) }
}

/// A fresh in-memory store.
pub async fn memory() -> Fixture {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    Fixture { kv: Arc::new(FaultyKv::new(kv)), guard: Guard::None }
}

/// Runs each named `async fn(Fixture)` once against etcd, once against redb and once in memory.
#[macro_export]
macro_rules! on_all_backends {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::memory().await).await
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::etcd().await).await
                }
            )*
        }
        mod redb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::redb().await).await
                }
            )*
        }
    };
}

/// Entry number `i` (its payload names it, so batches with different entries differ in bytes).
pub fn entry(i: u64) -> OpLogEntry {
    OpLogEntry { op: 1, tenant: "t".into(), key: format!("k{i}"), payload: i.to_le_bytes().to_vec() }
}

/// Batch `id` of `n` entries numbered from `first`.
pub fn batch(id: u64, first: u64, n: u64) -> OpLogBatchRecord {
    OpLogBatchRecord::new(id, first, (first..first + n).map(entry).collect()).unwrap()
}

/// An applier that records what it applied (shared, so a test reads it while a follower owns a clone) and can
/// be told to refuse one sequence number.
#[derive(Clone, Default)]
pub struct Recorder {
    /// `(seq, entry)` in the order applied.
    pub log: Arc<Mutex<Vec<(u64, OpLogEntry)>>>,
    /// Refuse this sequence number.
    pub fail_at: Option<u64>,
}

impl Recorder {
    /// A copy of what was applied.
    pub fn applied(&self) -> Vec<(u64, OpLogEntry)> {
        self.log.lock().clone()
    }

    /// The sequence numbers applied.
    pub fn seqs(&self) -> Vec<u64> {
        self.log.lock().iter().map(|(s, _)| *s).collect()
    }
}

impl OpLogApplier for Recorder {
    fn apply(&mut self, seq: u64, entry: &OpLogEntry) -> Result<(), ApplyError> {
        if self.fail_at == Some(seq) {
            return Err(ApplyError { seq, op: entry.op, reason: "refused by the test".into() });
        }
        self.log.lock().push((seq, entry.clone()));
        Ok(())
    }
}

/// Waits (polling a condition every 10 ms, up to `limit`) until `cond` holds; panics with `what` otherwise.
pub async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
