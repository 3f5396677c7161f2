//! Fixtures shared by the integration tests: the same test body runs against a real etcd and against redb.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use crescent_ha::kv::{EmbeddedKv, FaultyKv, HaKvBackend};
use crescent_ha::oplog::{OpLogBatchRecord, OpLogBatchStorage, OpLogEntry, StorageConfig};
use crescent_ha::testing::EtcdServer;
use std::sync::Arc;

/// What keeps a backend alive: an etcd process or a temp directory.
pub enum Guard {
    /// A running etcd (killed on drop).
    Etcd(EtcdServer),
    /// The embedded store's directory (removed on drop).
    Dir(tempfile::TempDir),
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

/// Runs each named `async fn(Fixture)` once against etcd and once against redb.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
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
