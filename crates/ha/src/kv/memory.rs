//! An in-memory backend for unit tests: a sorted map behind one lock, with etcd's request limits.

use super::{HaKvBackend, KvCompare, KvFuture, KvLimits, KvPair, KvTxn, RangePage, TxnOutcome, in_range};
use parking_lot::Mutex;
use std::collections::BTreeMap;

/// A volatile [`HaKvBackend`] (everything is lost on drop); same txn semantics as the durable ones.
#[derive(Debug)]
pub struct MemoryKv {
    map: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
    limits: KvLimits,
}

impl Default for MemoryKv {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryKv {
    /// An empty store with etcd's default limits.
    pub fn new() -> Self {
        Self::with_limits(KvLimits::ETCD_DEFAULT)
    }

    /// An empty store enforcing `limits`.
    pub fn with_limits(limits: KvLimits) -> Self {
        Self { map: Mutex::new(BTreeMap::new()), limits }
    }

    fn range_now(&self, begin: &[u8], end: &[u8], limit: usize) -> RangePage {
        let map = self.map.lock();
        let mut kvs = Vec::new();
        let mut more = false;
        for (k, v) in map.range(begin.to_vec()..) {
            if !in_range(k, begin, end) {
                break;
            }
            if limit != 0 && kvs.len() == limit {
                more = true;
                break;
            }
            kvs.push(KvPair { key: k.clone(), value: v.clone() });
        }
        RangePage { kvs, more }
    }

    fn txn_now(&self, txn: &KvTxn) -> TxnOutcome {
        let mut map = self.map.lock();
        let holds = txn.compares.iter().all(|c| match c {
            KvCompare::ValueEquals(k, v) => map.get(k) == Some(v),
            KvCompare::KeyAbsent(k) => !map.contains_key(k),
        });
        if !holds {
            return TxnOutcome::CompareFailed;
        }
        for p in &txn.puts {
            map.insert(p.key.clone(), p.value.clone());
        }
        TxnOutcome::Succeeded
    }
}

impl HaKvBackend for MemoryKv {
    fn get<'a>(&'a self, key: &'a [u8]) -> KvFuture<'a, Option<Vec<u8>>> {
        Box::pin(async move { Ok(self.map.lock().get(key).cloned()) })
    }

    fn put<'a>(&'a self, key: &'a [u8], value: &'a [u8]) -> KvFuture<'a, ()> {
        Box::pin(async move {
            self.limits.check_put(key, value)?;
            self.map.lock().insert(key.to_vec(), value.to_vec());
            Ok(())
        })
    }

    fn range<'a>(&'a self, begin: &'a [u8], end: &'a [u8], limit: usize) -> KvFuture<'a, RangePage> {
        Box::pin(async move { Ok(self.range_now(begin, end, limit)) })
    }

    fn txn<'a>(&'a self, txn: &'a KvTxn) -> KvFuture<'a, TxnOutcome> {
        Box::pin(async move {
            self.limits.check_txn(txn)?;
            Ok(self.txn_now(txn))
        })
    }

    fn supports_txn(&self) -> bool {
        true
    }

    fn limits(&self) -> KvLimits {
        self.limits
    }

    fn delete_range<'a>(&'a self, begin: &'a [u8], end: &'a [u8]) -> KvFuture<'a, u64> {
        Box::pin(async move {
            let mut map = self.map.lock();
            let doomed: Vec<Vec<u8>> =
                map.range(begin.to_vec()..).map(|(k, _)| k).take_while(|k| in_range(k, begin, end)).cloned().collect();
            for k in &doomed {
                map.remove(k);
            }
            Ok(doomed.len() as u64)
        })
    }
}
