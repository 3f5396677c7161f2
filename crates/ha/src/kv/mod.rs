//! The `HaKvBackend` seam: the few KV calls HA needs (get, put, paged range, compare-and-put txn, range delete,
//! and compaction of a backend's history) and nothing
//! about oplogs, leadership or Crescent metadata. Implementations: etcd ([`EtcdKv`]), an embedded durable store
//! ([`EmbeddedKv`], redb), an in-memory map ([`MemoryKv`]) and a fault-injecting wrapper ([`FaultyKv`]).

#[cfg(feature = "embedded")]
mod embedded;
#[cfg(feature = "etcd")]
mod etcd;
mod fault;
mod memory;

#[cfg(feature = "embedded")]
pub use embedded::{EMBEDDED_FILE, EmbeddedKv};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdKv, EtcdKvConfig, MAX_RESPONSE_BYTES};
pub use fault::{Fault, FaultyKv, KvOp};
pub use memory::MemoryKv;

use std::future::Future;
use std::pin::Pin;

/// A boxed future as the backend's methods return them (boxed so the trait is usable as `dyn HaKvBackend`).
pub type KvFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, KvError>> + Send + 'a>>;

/// etcd 3.4's default `--max-txn-ops`.
pub const ETCD_MAX_TXN_OPS: usize = 128;
/// etcd 3.4's default `--max-request-bytes` (1.5 MiB).
pub const ETCD_MAX_REQUEST_BYTES: usize = 1_572_864;

/// Why a backend call failed. A failed txn compare is not an error: it is [`TxnOutcome::CompareFailed`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// The request may or may not have been applied (timeout, connection lost after sending): re-read to learn.
    #[error("ambiguous outcome: {0}")]
    Ambiguous(String),
    /// The backend could not be reached and the request was certainly not applied; retrying is safe.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The backend refused the request as malformed or over its limits; retrying the same request cannot help.
    #[error("request rejected: {0}")]
    Rejected(String),
    /// The backend is out of space or overloaded (etcd's `RESOURCE_EXHAUSTED`: "database space exceeded" under
    /// its NOSPACE alarm, or "too many requests"). It passes once an operator frees space or the load drops, so
    /// the same request may be retried after a back-off. A write's outcome is unknown, as with
    /// [`KvError::Ambiguous`]: etcd applies the write that crosses its quota and still answers "database space
    /// exceeded".
    #[error("backend out of space or overloaded: {0}")]
    Exhausted(String),
    /// The backend offers no transactions.
    #[error("transactions are not supported by this backend")]
    Unsupported,
    /// A local storage failure (I/O, corruption of the embedded store).
    #[error("storage error: {0}")]
    Storage(String),
}

impl KvError {
    /// True when the call's effect is unknown and must be resolved by re-reading (ambiguous or exhausted).
    pub fn is_ambiguous(&self) -> bool {
        matches!(self, KvError::Ambiguous(_) | KvError::Exhausted(_))
    }

    /// True when the same request may succeed later (ambiguous, unavailable or exhausted).
    pub fn is_retryable(&self) -> bool {
        matches!(self, KvError::Ambiguous(_) | KvError::Unavailable(_) | KvError::Exhausted(_))
    }
}

/// One key and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPair {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
}

/// One page of a range read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangePage {
    /// Pairs in ascending key order, at most the limit asked for.
    pub kvs: Vec<KvPair>,
    /// True when keys in the range remain after the last one returned.
    pub more: bool,
}

/// A condition a txn checks before it applies its puts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvCompare {
    /// The key exists and its value is exactly these bytes.
    ValueEquals(Vec<u8>, Vec<u8>),
    /// The key does not exist.
    KeyAbsent(Vec<u8>),
}

impl KvCompare {
    /// The key the condition is about.
    pub fn key(&self) -> &[u8] {
        match self {
            KvCompare::ValueEquals(k, _) | KvCompare::KeyAbsent(k) => k,
        }
    }
}

/// A compare-then-put transaction: all compares hold, then all puts apply atomically; otherwise nothing changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvTxn {
    /// Conditions, all of which must hold.
    pub compares: Vec<KvCompare>,
    /// Puts applied together when the conditions hold.
    pub puts: Vec<KvPair>,
}

impl KvTxn {
    /// Operations the txn counts against a backend's per-txn limit (etcd counts compares and puts alike).
    pub fn op_count(&self) -> usize {
        self.compares.len() + self.puts.len()
    }

    /// Bytes of keys and values, a lower bound of the request's size on the wire.
    pub fn payload_bytes(&self) -> usize {
        let compares: usize = self
            .compares
            .iter()
            .map(|c| match c {
                KvCompare::ValueEquals(k, v) => k.len() + v.len(),
                KvCompare::KeyAbsent(k) => k.len(),
            })
            .sum();
        let puts: usize = self.puts.iter().map(|p| p.key.len() + p.value.len()).sum();
        compares + puts
    }
}

/// What a txn did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Every compare held and every put was applied.
    Succeeded,
    /// A compare failed; nothing was written.
    CompareFailed,
}

/// Request limits a backend enforces (callers size batches under them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLimits {
    /// Most compares plus puts in one txn.
    pub max_txn_ops: usize,
    /// Most bytes in one request.
    pub max_request_bytes: usize,
}

impl KvLimits {
    /// etcd 3.4's defaults.
    pub const ETCD_DEFAULT: KvLimits =
        KvLimits { max_txn_ops: ETCD_MAX_TXN_OPS, max_request_bytes: ETCD_MAX_REQUEST_BYTES };

    /// Checks a txn against these limits, as the local backends do so they behave like etcd.
    pub fn check_txn(&self, txn: &KvTxn) -> Result<(), KvError> {
        if txn.op_count() > self.max_txn_ops {
            return Err(KvError::Rejected(format!(
                "txn has {} operations, more than {}",
                txn.op_count(),
                self.max_txn_ops
            )));
        }
        if txn.payload_bytes() > self.max_request_bytes {
            return Err(KvError::Rejected(format!(
                "txn carries {} bytes, more than {}",
                txn.payload_bytes(),
                self.max_request_bytes
            )));
        }
        Ok(())
    }

    /// Checks a single put against these limits.
    pub fn check_put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        if key.len() + value.len() > self.max_request_bytes {
            return Err(KvError::Rejected(format!(
                "put carries {} bytes, more than {}",
                key.len() + value.len(),
                self.max_request_bytes
            )));
        }
        Ok(())
    }
}

/// The generic HA KV seam. Keys and values are bytes; ranges are half-open `[begin, end)` in byte order.
pub trait HaKvBackend: Send + Sync + 'static {
    /// The value at `key`, or `None` when it does not exist.
    fn get<'a>(&'a self, key: &'a [u8]) -> KvFuture<'a, Option<Vec<u8>>>;

    /// Writes `value` at `key` unconditionally.
    fn put<'a>(&'a self, key: &'a [u8], value: &'a [u8]) -> KvFuture<'a, ()>;

    /// Up to `limit` pairs (0 = no limit) of `[begin, end)` in ascending key order; an empty `end` means "to the end".
    fn range<'a>(&'a self, begin: &'a [u8], end: &'a [u8], limit: usize) -> KvFuture<'a, RangePage>;

    /// Runs a compare-then-put transaction atomically.
    fn txn<'a>(&'a self, txn: &'a KvTxn) -> KvFuture<'a, TxnOutcome>;

    /// True when [`HaKvBackend::txn`] is available (the oplog refuses a backend without it).
    fn supports_txn(&self) -> bool;

    /// The request limits this backend enforces.
    fn limits(&self) -> KvLimits;

    /// Deletes every key in `[begin, end)` (an empty `end` means "to the end") in one request; returns how many
    /// were deleted. Oplog compaction is its one user: a half-applied delete would leave the oldest batches
    /// present, which a retry finishes.
    fn delete_range<'a>(&'a self, begin: &'a [u8], end: &'a [u8]) -> KvFuture<'a, u64>;

    /// The backend's current revision: how far its history of changes reaches (0: a backend that keeps no
    /// history, the default).
    fn revision<'a>(&'a self) -> KvFuture<'a, u64> {
        Box::pin(async { Ok(0) })
    }

    /// Discards the history of changes up to `revision` (etcd's compaction), keeping every key's current value.
    /// etcd keeps every overwritten or deleted value until it is compacted, so a log that rewrites its prefix key
    /// and deletes old batches still grows there without it. A revision already compacted is not an error; a
    /// backend that keeps no history has nothing to do (the default).
    fn compact<'a>(&'a self, revision: u64) -> KvFuture<'a, ()> {
        let _ = revision;
        Box::pin(async { Ok(()) })
    }
}

/// The smallest key greater than every key starting with `prefix` (empty = no upper bound), for range ends.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    end
}

/// Whether `key` falls in `[begin, end)` (an empty `end` is unbounded).
pub(crate) fn in_range(key: &[u8], begin: &[u8], end: &[u8]) -> bool {
    key >= begin && (end.is_empty() || key < end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte_below_ff() {
        assert_eq!(prefix_end(b"/oplog/c/batches/"), b"/oplog/c/batches0".to_vec());
        assert_eq!(prefix_end(b"a\xff\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), Vec::<u8>::new());
    }

    #[test]
    fn limits_reject_oversized_txns() {
        let l = KvLimits { max_txn_ops: 2, max_request_bytes: 10 };
        let put = |k: &[u8], v: &[u8]| KvPair { key: k.to_vec(), value: v.to_vec() };
        assert!(l.check_txn(&KvTxn { compares: vec![], puts: vec![put(b"a", b"b")] }).is_ok());
        let three = KvTxn { compares: vec![KvCompare::KeyAbsent(b"x".to_vec())], puts: vec![put(b"a", b""); 2] };
        assert!(matches!(l.check_txn(&three), Err(KvError::Rejected(_))));
        assert!(matches!(
            l.check_txn(&KvTxn { compares: vec![], puts: vec![put(b"a", &[0; 10])] }),
            Err(KvError::Rejected(_))
        ));
    }
}
