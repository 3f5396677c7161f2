//! A durable single-process backend on redb, for single-master mode and for tests: one redb file under a
//! directory, each txn one redb write transaction (compares read inside it, so check-and-put is atomic).

use super::{HaKvBackend, KvCompare, KvError, KvFuture, KvLimits, KvPair, KvTxn, RangePage, TxnOutcome};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("ha_kv");
/// The store's file name inside its directory.
pub const EMBEDDED_FILE: &str = "ha-kv.redb";

/// A durable [`HaKvBackend`] in a directory (redb). Enforces etcd's limits by default so that what works here
/// works against etcd too.
#[derive(Clone)]
pub struct EmbeddedKv {
    db: Arc<Database>,
    path: PathBuf,
    limits: KvLimits,
}

impl std::fmt::Debug for EmbeddedKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedKv").field("path", &self.path).field("limits", &self.limits).finish()
    }
}

fn storage(e: impl std::fmt::Display) -> KvError {
    KvError::Storage(e.to_string())
}

impl EmbeddedKv {
    /// Opens (creating if needed) the store in `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, KvError> {
        Self::open_with_limits(dir, KvLimits::ETCD_DEFAULT)
    }

    /// Opens the store in `dir`, enforcing `limits`.
    pub fn open_with_limits(dir: impl AsRef<Path>, limits: KvLimits) -> Result<Self, KvError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| storage(format!("{}: {e}", dir.display())))?;
        let path = dir.join(EMBEDDED_FILE);
        let db = Database::create(&path).map_err(|e| storage(format!("{}: {e}", path.display())))?;
        // Create the table up front so read transactions never meet a missing table.
        let w = db.begin_write().map_err(storage)?;
        w.open_table(TABLE).map_err(storage)?;
        w.commit().map_err(storage)?;
        Ok(Self { db: Arc::new(db), path, limits })
    }

    /// The redb file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs blocking redb work off the async threads.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, KvError> + Send + 'static,
    ) -> Result<T, KvError> {
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || f(&db)).await.map_err(storage)?
    }
}

fn get_now(db: &Database, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
    let r = db.begin_read().map_err(storage)?;
    let t = r.open_table(TABLE).map_err(storage)?;
    Ok(t.get(key).map_err(storage)?.map(|v| v.value().to_vec()))
}

fn range_now(db: &Database, begin: &[u8], end: &[u8], limit: usize) -> Result<RangePage, KvError> {
    let r = db.begin_read().map_err(storage)?;
    let t = r.open_table(TABLE).map_err(storage)?;
    let upper = if end.is_empty() { Bound::Unbounded } else { Bound::Excluded(end) };
    if !end.is_empty() && begin >= end {
        return Ok(RangePage::default());
    }
    let mut page = RangePage::default();
    for item in t.range::<&[u8]>((Bound::Included(begin), upper)).map_err(storage)? {
        let (k, v) = item.map_err(storage)?;
        if limit != 0 && page.kvs.len() == limit {
            page.more = true;
            break;
        }
        page.kvs.push(KvPair { key: k.value().to_vec(), value: v.value().to_vec() });
    }
    Ok(page)
}

fn delete_range_now(db: &Database, begin: &[u8], end: &[u8]) -> Result<u64, KvError> {
    if !end.is_empty() && begin >= end {
        return Ok(0);
    }
    let upper = if end.is_empty() { Bound::Unbounded } else { Bound::Excluded(end) };
    let w = db.begin_write().map_err(storage)?;
    let deleted = {
        let mut t = w.open_table(TABLE).map_err(storage)?;
        let mut n = 0u64;
        // `extract_from_if` would hold the table's iterator across the removals; collecting the keys first keeps
        // it to one plain loop inside the same write transaction (all or nothing at commit).
        let keys: Vec<Vec<u8>> = t
            .range::<&[u8]>((Bound::Included(begin), upper))
            .map_err(storage)?
            .map(|item| item.map(|(k, _)| k.value().to_vec()).map_err(storage))
            .collect::<Result<_, _>>()?;
        for k in &keys {
            if t.remove(k.as_slice()).map_err(storage)?.is_some() {
                n += 1;
            }
        }
        n
    };
    w.commit().map_err(storage)?;
    Ok(deleted)
}

fn txn_now(db: &Database, txn: &KvTxn) -> Result<TxnOutcome, KvError> {
    let w = db.begin_write().map_err(storage)?;
    {
        let mut t = w.open_table(TABLE).map_err(storage)?;
        for c in &txn.compares {
            let current = t.get(c.key()).map_err(storage)?;
            let holds = match (c, &current) {
                (KvCompare::ValueEquals(_, want), Some(v)) => v.value() == want.as_slice(),
                (KvCompare::ValueEquals(..), None) => false,
                (KvCompare::KeyAbsent(_), found) => found.is_none(),
            };
            if !holds {
                // Dropping the uncommitted write transaction discards it.
                return Ok(TxnOutcome::CompareFailed);
            }
        }
        for p in &txn.puts {
            t.insert(p.key.as_slice(), p.value.as_slice()).map_err(storage)?;
        }
    }
    w.commit().map_err(storage)?;
    Ok(TxnOutcome::Succeeded)
}

impl HaKvBackend for EmbeddedKv {
    fn get<'a>(&'a self, key: &'a [u8]) -> KvFuture<'a, Option<Vec<u8>>> {
        let key = key.to_vec();
        Box::pin(self.blocking(move |db| get_now(db, &key)))
    }

    fn put<'a>(&'a self, key: &'a [u8], value: &'a [u8]) -> KvFuture<'a, ()> {
        let txn = KvTxn { compares: Vec::new(), puts: vec![KvPair { key: key.to_vec(), value: value.to_vec() }] };
        Box::pin(async move {
            self.limits.check_put(key, value)?;
            self.blocking(move |db| txn_now(db, &txn).map(|_| ())).await
        })
    }

    fn range<'a>(&'a self, begin: &'a [u8], end: &'a [u8], limit: usize) -> KvFuture<'a, RangePage> {
        let (begin, end) = (begin.to_vec(), end.to_vec());
        Box::pin(self.blocking(move |db| range_now(db, &begin, &end, limit)))
    }

    fn txn<'a>(&'a self, txn: &'a KvTxn) -> KvFuture<'a, TxnOutcome> {
        Box::pin(async move {
            self.limits.check_txn(txn)?;
            let txn = txn.clone();
            self.blocking(move |db| txn_now(db, &txn)).await
        })
    }

    fn supports_txn(&self) -> bool {
        true
    }

    fn limits(&self) -> KvLimits {
        self.limits
    }

    fn delete_range<'a>(&'a self, begin: &'a [u8], end: &'a [u8]) -> KvFuture<'a, u64> {
        let (begin, end) = (begin.to_vec(), end.to_vec());
        Box::pin(self.blocking(move |db| delete_range_now(db, &begin, &end)))
    }
}
