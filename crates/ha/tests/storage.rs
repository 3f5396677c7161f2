//! `OpLogBatchStorage` against a real etcd and against redb: init, atomic advance, fencing, unknown outcomes,
//! paging and caps.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{Fixture, batch, entry};
use crescent_ha::kv::{Fault, HaKvBackend, KvError, KvOp, MemoryKv};
use crescent_ha::oplog::codec::CodecError;
use crescent_ha::oplog::{DurablePrefix, OpLogBatchRecord, OpLogEntry, StorageConfig, StorageError};
use std::sync::Arc;

const VIEW: u64 = 1;

fn p(batch_id: u64, last_seq: u64) -> DurablePrefix {
    DurablePrefix { batch_id, last_seq }
}

async fn init_is_idempotent(f: Fixture) {
    let s = f.storage(StorageConfig::default());
    assert_eq!(s.read_durable_prefix().await.unwrap(), None);
    assert_eq!(s.init_durable_prefix().await.unwrap(), DurablePrefix::ZERO);
    assert_eq!(s.init_durable_prefix().await.unwrap(), DurablePrefix::ZERO);
    let again = f.storage(StorageConfig::default());
    assert_eq!(again.init_durable_prefix().await.unwrap(), DurablePrefix::ZERO);
    let raw = f.kv.get(&s.keys().durable_prefix()).await.unwrap().unwrap();
    assert_eq!(raw, DurablePrefix::ZERO.encode());
    // After batches, init returns the advanced prefix unchanged.
    s.claim_producer_view(VIEW).await.unwrap();
    s.write_batch(&batch(1, 1, 2), DurablePrefix::ZERO, VIEW).await.unwrap();
    assert_eq!(again.init_durable_prefix().await.unwrap(), p(1, 2));
}

async fn init_lost_race_adopts_the_stored_prefix(f: Fixture) {
    let s = f.storage(StorageConfig::default());
    // Another initialiser creates the prefix (a cutover-style {0, 42}) between our read and our txn.
    f.kv.inject_next(KvOp::Txn, Fault::PutFirst(s.keys().durable_prefix(), p(0, 42).encode()));
    assert_eq!(s.init_durable_prefix().await.unwrap(), p(0, 42));
    assert_eq!(s.read_durable_prefix().await.unwrap(), Some(p(0, 42)));
}

async fn init_resolves_a_committed_ambiguous_create(f: Fixture) {
    let s = f.storage(StorageConfig::default());
    f.kv.inject_next(KvOp::Txn, Fault::ApplyThenAmbiguous);
    assert_eq!(s.init_durable_prefix().await.unwrap(), DurablePrefix::ZERO);
    // Ambiguous and not applied: the error surfaces (the caller retries), nothing is invented.
    let s2 = f.storage_of("c2");
    f.kv.inject_next(KvOp::Txn, Fault::Fail(KvError::Ambiguous("timeout".into())));
    assert!(matches!(s2.init_durable_prefix().await, Err(StorageError::Kv(KvError::Ambiguous(_)))));
    assert_eq!(s2.init_durable_prefix().await.unwrap(), DurablePrefix::ZERO);
}

async fn init_fails_closed_on_inconsistent_state(f: Fixture) {
    let s = f.storage(StorageConfig::default());
    // Batches without a prefix.
    f.kv.put(&s.keys().batch(1), &batch(1, 1, 1).encode().unwrap()).await.unwrap();
    assert!(matches!(s.init_durable_prefix().await, Err(StorageError::Inconsistent(_))));
    // A prefix whose terminal batch is missing, or ends elsewhere, or has batches beyond it.
    f.kv.put(&s.keys().durable_prefix(), &p(2, 5).encode()).await.unwrap();
    assert!(matches!(s.init_durable_prefix().await, Err(StorageError::Inconsistent(_))));
    f.kv.put(&s.keys().batch(2), &batch(2, 2, 3).encode().unwrap()).await.unwrap();
    assert!(matches!(s.init_durable_prefix().await, Err(StorageError::Inconsistent(_))));
    f.kv.put(&s.keys().batch(2), &batch(2, 2, 4).encode().unwrap()).await.unwrap();
    assert_eq!(s.init_durable_prefix().await.unwrap(), p(2, 5));
    f.kv.put(&s.keys().batch(3), &batch(3, 6, 1).encode().unwrap()).await.unwrap();
    assert!(matches!(s.init_durable_prefix().await, Err(StorageError::Inconsistent(_))));
    // A corrupt prefix value.
    f.kv.put(&s.keys().durable_prefix(), b"garbage").await.unwrap();
    assert!(matches!(s.init_durable_prefix().await, Err(StorageError::Corrupt { .. })));
}

async fn write_advances_batch_and_prefix_together(f: Fixture) {
    let s = f.storage(StorageConfig::default());
    s.init_durable_prefix().await.unwrap();
    s.claim_producer_view(VIEW).await.unwrap();
    let b1 = batch(1, 1, 3);
    assert_eq!(s.write_batch(&b1, DurablePrefix::ZERO, VIEW).await.unwrap(), p(1, 3));
    assert_eq!(s.read_batch(1).await.unwrap(), Some(b1));
    let b2 = batch(2, 4, 2);
    assert_eq!(s.write_batch(&b2, p(1, 3), VIEW).await.unwrap(), p(2, 5));
    assert_eq!(s.read_durable_prefix().await.unwrap(), Some(p(2, 5)));
    // A writer on a stale prefix changes nothing: not the batch key, not the prefix.
    let other = OpLogBatchRecord::new(2, 4, vec![entry(99), entry(98)]).unwrap();
    let err = s.write_batch(&other, p(1, 3), VIEW).await.unwrap_err();
    assert_eq!(err, StorageError::Conflict { expected: p(1, 3), found: Some(p(2, 5)) });
    assert_eq!(s.read_batch(2).await.unwrap(), Some(b2));
    let b3 = OpLogBatchRecord::new(3, 6, vec![entry(6)]).unwrap();
    assert!(matches!(s.write_batch(&b3, p(1, 3), VIEW).await, Err(StorageError::InvalidBatch(_))));
    assert_eq!(s.read_batch(3).await.unwrap(), None);
    // The prefix never rolls back: re-writing an old batch from an older prefix is refused.
    assert!(s.write_batch(&batch(1, 1, 3), DurablePrefix::ZERO, VIEW).await.is_err());
    assert_eq!(s.read_durable_prefix().await.unwrap(), Some(p(2, 5)));
}

async fn discontinuous_batches_are_refused_before_any_write(f: Fixture) {
    let s = f.storage(StorageConfig::default());
    s.init_durable_prefix().await.unwrap();
    s.claim_producer_view(VIEW).await.unwrap();
    let txns = f.kv.calls(KvOp::Txn);
    for (b, expected, view) in [
        (batch(2, 1, 1), DurablePrefix::ZERO, VIEW),   // skips batch 1
        (batch(1, 2, 1), DurablePrefix::ZERO, VIEW),   // skips seq 1
        (batch(1, 1, 1), DurablePrefix::ZERO, 0),      // no view
        (batch(1, 1, 1), p(u64::MAX, u64::MAX), VIEW), // overflow
    ] {
        assert!(matches!(s.write_batch(&b, expected, view).await, Err(StorageError::InvalidBatch(_))));
    }
    assert_eq!(f.kv.calls(KvOp::Txn), txns, "no txn was sent");
    assert_eq!(s.read_batch(1).await.unwrap(), None);
}

async fn a_newer_producer_view_fences_the_old_writer(f: Fixture) {
    let s = f.storage(StorageConfig::default());
    s.init_durable_prefix().await.unwrap();
    // Without a claimed view nobody writes.
    assert_eq!(
        s.write_batch(&batch(1, 1, 1), DurablePrefix::ZERO, 7).await.unwrap_err(),
        StorageError::Fenced { held: 7, found: None }
    );
    s.claim_producer_view(7).await.unwrap();
    s.claim_producer_view(7).await.unwrap();
    s.write_batch(&batch(1, 1, 2), DurablePrefix::ZERO, 7).await.unwrap();
    // A new leader claims view 8; the old one is fenced and writes nothing.
    s.claim_producer_view(8).await.unwrap();
    assert_eq!(s.claim_producer_view(7).await.unwrap_err(), StorageError::StaleView { requested: 7, current: 8 });
    let b2 = batch(2, 3, 1);
    assert_eq!(s.write_batch(&b2, p(1, 2), 7).await.unwrap_err(), StorageError::Fenced { held: 7, found: Some(8) });
    assert_eq!(s.read_batch(2).await.unwrap(), None);
    assert_eq!(s.read_durable_prefix().await.unwrap(), Some(p(1, 2)));
    // Even when the new leader has durably written exactly the old writer's batch, the old writer is not told
    // "success": a fenced write is never reported durable.
    s.write_batch(&b2, p(1, 2), 8).await.unwrap();
    assert_eq!(s.write_batch(&b2, p(1, 2), 7).await.unwrap_err(), StorageError::Fenced { held: 7, found: Some(8) });
    f.kv.inject_next(KvOp::Txn, Fault::ApplyThenAmbiguous);
    s.claim_producer_view(9).await.unwrap();
    assert_eq!(s.read_producer_view().await.unwrap(), Some(9), "an ambiguous claim resolves by re-reading");
}

async fn unknown_outcomes_resolve_by_rereading(f: Fixture) {
    let s = f.storage(StorageConfig::default());
    s.init_durable_prefix().await.unwrap();
    s.claim_producer_view(VIEW).await.unwrap();
    // Applied, then reported ambiguous: resolved to success because the stored batch is byte-identical.
    f.kv.inject_next(KvOp::Txn, Fault::ApplyThenAmbiguous);
    let b1 = batch(1, 1, 3);
    assert_eq!(s.write_batch(&b1, DurablePrefix::ZERO, VIEW).await.unwrap(), p(1, 3));
    assert_eq!(s.read_batch(1).await.unwrap(), Some(b1));
    // Not applied and ambiguous: the ambiguity is reported (prefix unchanged), and retrying the same batch works.
    let b2 = batch(2, 4, 2);
    f.kv.inject_next(KvOp::Txn, Fault::Fail(KvError::Ambiguous("deadline".into())));
    assert!(matches!(s.write_batch(&b2, p(1, 3), VIEW).await, Err(StorageError::Kv(KvError::Ambiguous(_)))));
    assert_eq!(s.read_durable_prefix().await.unwrap(), Some(p(1, 3)));
    assert_eq!(s.write_batch(&b2, p(1, 3), VIEW).await.unwrap(), p(2, 5));
    // A retry of a batch that already landed (the first answer was lost) is success, not a conflict.
    assert_eq!(s.write_batch(&b2, p(1, 3), VIEW).await.unwrap(), p(2, 5));
    // A *different* batch that lands on the same prefix is not "ours": conflict.
    let other = OpLogBatchRecord::new(2, 4, vec![entry(90), entry(91)]).unwrap();
    f.kv.inject_next(KvOp::Txn, Fault::Fail(KvError::Ambiguous("deadline".into())));
    assert_eq!(
        s.write_batch(&other, p(1, 3), VIEW).await.unwrap_err(),
        StorageError::Conflict { expected: p(1, 3), found: Some(p(2, 5)) }
    );
    // A read failing during resolution keeps the outcome unknown.
    f.kv.inject_next(KvOp::Txn, Fault::Fail(KvError::Ambiguous("deadline".into())));
    f.kv.inject_next(KvOp::Get, Fault::Fail(KvError::Unavailable("down".into())));
    let b3 = batch(3, 6, 1);
    assert!(matches!(s.write_batch(&b3, p(2, 5), VIEW).await, Err(StorageError::Kv(KvError::Ambiguous(_)))));
}

async fn batches_page_in_order_skipping_other_keys(f: Fixture) {
    let s = f.storage(StorageConfig::default());
    s.init_durable_prefix().await.unwrap();
    s.claim_producer_view(VIEW).await.unwrap();
    let mut prefix = DurablePrefix::ZERO;
    for id in 1..=40 {
        prefix = s.write_batch(&batch(id, prefix.last_seq + 1, 1 + id % 3), prefix, VIEW).await.unwrap();
    }
    let mut sidecar = s.keys().batch(5);
    sidecar.extend_from_slice(b".meta");
    f.kv.put(&sidecar, b"x").await.unwrap();
    let mut other = s.keys().batches_prefix();
    other.extend_from_slice(b"sidecar");
    f.kv.put(&other, b"x").await.unwrap();
    let ids = |v: Vec<OpLogBatchRecord>| v.into_iter().map(|b| b.batch_id).collect::<Vec<_>>();
    let all = s.read_batches_after(0, 0).await.unwrap();
    let mut seq = 1;
    for b in &all {
        assert_eq!(b.first_seq, seq, "batches are contiguous");
        seq = b.last_seq + 1;
    }
    assert_eq!(ids(all), (1..=40).collect::<Vec<_>>());
    assert_eq!(ids(s.read_batches_after(4, 3).await.unwrap()), vec![5, 6, 7]);
    assert_eq!(ids(s.read_batches_after(10, 20).await.unwrap()), (11..=30).collect::<Vec<_>>());
    assert_eq!(ids(s.read_batches_after(38, 0).await.unwrap()), vec![39, 40]);
    assert!(s.read_batches_after(40, 0).await.unwrap().is_empty());
    assert!(s.read_batches_after(u64::MAX, 0).await.unwrap().is_empty());
    // Another cluster's batches are invisible.
    let c2 = f.storage_of("c2");
    assert!(c2.read_batches_after(0, 0).await.unwrap().is_empty());
}

async fn batches_are_capped_in_entries_and_bytes(f: Fixture) {
    let s = f.storage(StorageConfig { max_batch_entries: 4 });
    s.init_durable_prefix().await.unwrap();
    s.claim_producer_view(VIEW).await.unwrap();
    assert!(matches!(
        s.write_batch(&batch(1, 1, 5), DurablePrefix::ZERO, VIEW).await,
        Err(StorageError::BatchTooLarge { entries: 5, max_entries: 4, .. })
    ));
    // A batch of exactly the byte cap is accepted by the backend (etcd included); one byte more is refused here.
    let max = s.batch_limits().max_bytes;
    let big = |extra: usize| {
        let a = OpLogEntry { op: 2, tenant: "t".into(), key: "a".into(), payload: vec![1; 1 << 20] };
        let mut b = OpLogEntry { op: 2, tenant: "t".into(), key: "b".into(), payload: Vec::new() };
        // Size the second payload so the record is exactly `max + extra` bytes (length varints shift the sum).
        let target = max + extra;
        let mut len = target - (1 << 20);
        for _ in 0..8 {
            b.payload = vec![2; len];
            let n = OpLogBatchRecord::new(1, 1, vec![a.clone(), b.clone()]).unwrap().encode().unwrap().len();
            if n == target {
                break;
            }
            len = len + target - n;
        }
        OpLogBatchRecord::new(1, 1, vec![a, b]).unwrap()
    };
    let exact = big(0);
    assert_eq!(exact.encode().unwrap().len(), max);
    assert!(matches!(s.write_batch(&big(1), DurablePrefix::ZERO, VIEW).await, Err(StorageError::BatchTooLarge { .. })));
    assert_eq!(s.write_batch(&exact, DurablePrefix::ZERO, VIEW).await.unwrap(), p(1, 2));
    assert_eq!(s.read_batch(1).await.unwrap(), Some(exact));
    assert!(s.batch_limits().fits(4, max - 100) && !s.batch_limits().fits(5, 10) && !s.batch_limits().fits(1, max));
}

async fn corrupt_or_misplaced_batches_fail_closed(f: Fixture) {
    let s = f.storage(StorageConfig::default());
    f.kv.put(&s.keys().batch(1), b"not a batch").await.unwrap();
    assert!(matches!(s.read_batch(1).await, Err(StorageError::Corrupt { .. })));
    assert!(matches!(s.read_batches_after(0, 0).await, Err(StorageError::Corrupt { .. })));
    let mut flipped = batch(2, 1, 2).encode().unwrap();
    flipped[3] ^= 1;
    f.kv.put(&s.keys().batch(2), &flipped).await.unwrap();
    assert!(matches!(s.read_batch(2).await, Err(StorageError::Corrupt { error: CodecError::Checksum { .. }, .. })));
    // Batch 3's record stored under key 4.
    f.kv.put(&s.keys().batch(4), &batch(3, 1, 1).encode().unwrap()).await.unwrap();
    assert!(matches!(s.read_batch(4).await, Err(StorageError::Corrupt { .. })));
    f.kv.put(&s.keys().producer_view(), b"07").await.unwrap();
    assert!(matches!(s.read_producer_view().await, Err(StorageError::Corrupt { .. })));
}

/// Compaction deletes the batches a snapshot holds but never the durable prefix's own; the log still opens, a
/// reader from the snapshot's position carries on, and a reader from nothing fails closed instead of skipping.
async fn compaction_keeps_the_terminal_batch_and_readers_from_nothing_fail_closed(f: Fixture) {
    let s = f.storage(StorageConfig::default());
    s.init_durable_prefix().await.unwrap();
    s.claim_producer_view(VIEW).await.unwrap();
    let mut prefix = DurablePrefix::ZERO;
    for id in 1..=5 {
        let b = batch(id, prefix.last_seq + 1, 2);
        s.write_batch(&b, prefix, VIEW).await.unwrap();
        prefix = p(id, b.last_seq);
    }
    assert_eq!(s.compact_through(0).await.unwrap(), 0);
    assert_eq!(s.compact_through(3).await.unwrap(), 3);
    assert_eq!(s.first_stored_batch().await.unwrap(), Some(4));
    assert_eq!(s.compact_through(3).await.unwrap(), 0, "idempotent");
    assert_eq!(s.compact_through(99).await.unwrap(), 1, "only up to the batch before the prefix's");
    assert_eq!(s.first_stored_batch().await.unwrap(), Some(5));
    assert_eq!(s.init_durable_prefix().await.unwrap(), prefix, "the compacted log still passes startup checks");
    // A snapshot holding batches 1..=4 (seqs 1..=8): its reader applies batch 5 only.
    let mut rec = common::Recorder::default();
    let mut from_snapshot = crescent_ha::oplog::OpLogStandbyReader::from(s.clone(), 8, 4);
    from_snapshot.poll_once(&mut rec, 16).await.unwrap();
    assert_eq!(from_snapshot.applied_seq(), 10);
    // From nothing: batch 1 is gone, which is fatal, not a silent start at batch 5.
    let mut rec = common::Recorder::default();
    let mut from_nothing = crescent_ha::oplog::OpLogStandbyReader::new(s.clone());
    assert!(from_nothing.poll_once(&mut rec, 16).await.is_err());
    assert_eq!(from_nothing.applied_seq(), 0);
    // The next batch still follows the prefix.
    s.write_batch(&batch(6, 11, 1), prefix, VIEW).await.unwrap();
}

crate::on_all_backends!(
    compaction_keeps_the_terminal_batch_and_readers_from_nothing_fail_closed,
    init_is_idempotent,
    init_lost_race_adopts_the_stored_prefix,
    init_resolves_a_committed_ambiguous_create,
    init_fails_closed_on_inconsistent_state,
    write_advances_batch_and_prefix_together,
    discontinuous_batches_are_refused_before_any_write,
    a_newer_producer_view_fences_the_old_writer,
    unknown_outcomes_resolve_by_rereading,
    batches_page_in_order_skipping_other_keys,
    batches_are_capped_in_entries_and_bytes,
    corrupt_or_misplaced_batches_fail_closed,
);

/// A backend without transactions cannot host the oplog.
#[test]
fn a_backend_without_txn_is_refused() {
    struct NoTxn(MemoryKv);
    impl HaKvBackend for NoTxn {
        fn get<'a>(&'a self, key: &'a [u8]) -> crescent_ha::kv::KvFuture<'a, Option<Vec<u8>>> {
            self.0.get(key)
        }
        fn put<'a>(&'a self, key: &'a [u8], value: &'a [u8]) -> crescent_ha::kv::KvFuture<'a, ()> {
            self.0.put(key, value)
        }
        fn range<'a>(
            &'a self,
            b: &'a [u8],
            e: &'a [u8],
            l: usize,
        ) -> crescent_ha::kv::KvFuture<'a, crescent_ha::kv::RangePage> {
            self.0.range(b, e, l)
        }
        fn txn<'a>(
            &'a self,
            _: &'a crescent_ha::kv::KvTxn,
        ) -> crescent_ha::kv::KvFuture<'a, crescent_ha::kv::TxnOutcome> {
            Box::pin(async { Err(KvError::Unsupported) })
        }
        fn supports_txn(&self) -> bool {
            false
        }
        fn limits(&self) -> crescent_ha::kv::KvLimits {
            self.0.limits()
        }
        fn delete_range<'a>(&'a self, b: &'a [u8], e: &'a [u8]) -> crescent_ha::kv::KvFuture<'a, u64> {
            self.0.delete_range(b, e)
        }
    }
    let kv: Arc<dyn HaKvBackend> = Arc::new(NoTxn(MemoryKv::new()));
    assert!(matches!(
        crescent_ha::oplog::OpLogBatchStorage::new(kv, "c", StorageConfig::default()),
        Err(StorageError::Unsupported)
    ));
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    assert!(matches!(
        crescent_ha::oplog::OpLogBatchStorage::new(kv, "bad/id", StorageConfig::default()),
        Err(StorageError::ClusterId(_))
    ));
}
