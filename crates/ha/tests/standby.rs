//! `OpLogStandbyReader` (RFC §14, reference §6.2): apply in order up to the durable prefix, no range read when
//! the prefix has not moved, paging, snapshot-baseline tolerance, and fail-closed on every anomaly; transient
//! backend errors are retryable. Every test runs on etcd, redb and memory.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{Fixture, Recorder, batch, entry};
use crescent_ha::kv::{Fault, KvError, KvOp};
use crescent_ha::oplog::codec::{encode_legacy_entry, encode_legacy_latest};
use crescent_ha::oplog::standby::DEFAULT_MAX_BATCHES_PER_POLL;
use crescent_ha::oplog::{DurablePrefix, OpLogBatchStorage, OpLogKeys, OpLogStandbyReader, StandbyError, StorageError};
use std::sync::Arc;
use tokio::sync::Semaphore;

const VIEW: u64 = 1;

fn p(batch_id: u64, last_seq: u64) -> DurablePrefix {
    DurablePrefix { batch_id, last_seq }
}

/// Initialises `s` and writes batches of the given sizes through the storage protocol; returns the prefix.
async fn seed(s: &OpLogBatchStorage, sizes: &[u64]) -> DurablePrefix {
    let mut prefix = s.init_durable_prefix().await.unwrap();
    s.claim_producer_view(VIEW).await.unwrap();
    for &n in sizes {
        let b = batch(prefix.batch_id + 1, prefix.last_seq + 1, n);
        prefix = s.write_batch(&b, prefix, VIEW).await.unwrap();
    }
    prefix
}

fn entries(seqs: std::ops::RangeInclusive<u64>) -> Vec<(u64, crescent_ha::oplog::OpLogEntry)> {
    seqs.map(|s| (s, entry(s))).collect()
}

async fn raw_put(f: &Fixture, key: Vec<u8>, value: Vec<u8>) {
    f.kv.inner().put(&key, &value).await.unwrap();
}

/// Property 14: batches [1..1], [2..3] under {2,3} apply in one poll; an unchanged prefix causes no range read.
async fn applies_up_to_the_prefix_and_rereads_nothing(f: Fixture) {
    let s = f.storage_of("c");
    let mut rec = Recorder::default();
    let mut reader = OpLogStandbyReader::new(f.storage_of("c"));
    let empty = reader.poll_once(&mut rec, 1024).await.unwrap();
    assert_eq!((empty.prefix, empty.applied), (None, 0), "no prefix yet: nothing to do");
    assert_eq!(seed(&s, &[1, 2]).await, p(2, 3));
    let r = reader.poll_once(&mut rec, 1024).await.unwrap();
    assert_eq!((r.prefix, r.applied, r.caught_up), (Some(p(2, 3)), 3, true));
    let st = reader.status();
    assert_eq!((st.applied_seq, st.applied_batch, st.lag, st.seen_prefix), (3, 2, 0, Some(p(2, 3))));
    assert_eq!(rec.applied(), entries(1..=3));
    let ranges = f.kv.calls(KvOp::Range);
    let r = reader.poll_once(&mut rec, 1024).await.unwrap();
    assert_eq!((r.applied, r.caught_up), (0, true));
    assert_eq!(f.kv.calls(KvOp::Range), ranges, "an unchanged prefix causes no range read");
    s.write_batch(&batch(3, 4, 2), p(2, 3), VIEW).await.unwrap();
    assert_eq!(reader.poll_once(&mut rec, 1024).await.unwrap().applied, 2);
    assert_eq!(rec.applied(), entries(1..=5));
}

/// A full page is applied and the rest continues on the next poll; the lag shows what is left.
async fn pages_continue_on_the_next_poll(f: Fixture) {
    let s = f.storage_of("c");
    seed(&s, &[1, 1, 2, 1, 1]).await;
    let mut rec = Recorder::default();
    let mut reader = OpLogStandbyReader::new(f.storage_of("c"));
    let r = reader.poll_once(&mut rec, 2).await.unwrap();
    assert_eq!((r.applied, r.caught_up), (2, false));
    assert_eq!((reader.status().applied_batch, reader.status().lag), (2, 4));
    let r = reader.poll_once(&mut rec, 2).await.unwrap();
    assert_eq!((r.applied, r.caught_up), (3, false));
    let r = reader.poll_once(&mut rec, 2).await.unwrap();
    assert_eq!((r.applied, r.caught_up), (1, true));
    assert_eq!(rec.applied(), entries(1..=6));
}

/// Property 16 (reader half): transport errors on the prefix, terminal-batch and range reads are retryable and
/// leave the reader usable; nothing is applied twice after them.
async fn transient_errors_are_retryable(f: Fixture) {
    let s = f.storage_of("c");
    seed(&s, &[2, 2]).await;
    let mut rec = Recorder::default();
    let mut reader = OpLogStandbyReader::new(f.storage_of("c"));
    let down = || Fault::Fail(KvError::Unavailable("etcd down".into()));
    f.kv.inject_next(KvOp::Get, down());
    let e = reader.poll_once(&mut rec, 1024).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    f.kv.inject_next(KvOp::Range, Fault::Fail(KvError::Ambiguous("timeout".into())));
    assert!(reader.poll_once(&mut rec, 1024).await.unwrap_err().is_retryable());
    // The terminal-batch read is the second get of a poll.
    f.kv.inject_nth_call(f.kv.total_calls() + 2, down());
    assert!(reader.poll_once(&mut rec, 1024).await.unwrap_err().is_retryable());
    assert_eq!(reader.status().failed, None);
    assert_eq!(rec.applied(), vec![]);
    assert_eq!(reader.poll_once(&mut rec, 1024).await.unwrap().applied, 4);
    assert_eq!(rec.applied(), entries(1..=4));
}

/// Property 17: a reader from a snapshot baseline accepts a first batch after compacted history and skips
/// entries its baseline holds; a strict reader refuses the same log; a baseline ahead of the log is fatal.
async fn a_baseline_tolerates_compacted_history(f: Fixture) {
    // Baseline at seq 2; batch 1 holds seqs 3-4.
    let s = f.storage_of("x");
    s.claim_producer_view(VIEW).await.unwrap();
    raw_put(&f, s.keys().durable_prefix(), p(0, 2).encode()).await;
    raw_put(&f, s.keys().legacy_latest(), encode_legacy_latest(2)).await;
    s.write_batch(&batch(1, 3, 2), p(0, 2), VIEW).await.unwrap();
    let mut rec = Recorder::default();
    let mut reader = OpLogStandbyReader::from(f.storage_of("x"), 2, 0);
    assert_eq!(reader.poll_once(&mut rec, 1024).await.unwrap().applied, 2);
    assert_eq!(rec.applied(), entries(3..=4));

    // Prefix {42,44} where only batch 42 (seqs 43-44) exists: batches 1..41 were compacted away.
    let s = f.storage_of("y");
    s.claim_producer_view(VIEW).await.unwrap();
    raw_put(&f, s.keys().durable_prefix(), p(41, 42).encode()).await;
    s.write_batch(&batch(42, 43, 2), p(41, 42), VIEW).await.unwrap();
    let mut rec = Recorder::default();
    let mut reader = OpLogStandbyReader::from(f.storage_of("y"), 42, 0);
    assert_eq!(reader.poll_once(&mut rec, 1024).await.unwrap().applied, 2);
    assert_eq!(rec.applied(), entries(43..=44));
    assert_eq!(reader.status().applied_batch, 42);
    // Overlap with the baseline: seq 43 is held already and skipped.
    let mut rec = Recorder::default();
    let mut reader = OpLogStandbyReader::from(f.storage_of("y"), 43, 0);
    assert_eq!(reader.poll_once(&mut rec, 1024).await.unwrap().applied, 1);
    assert_eq!(rec.applied(), entries(44..=44));
    // A strict reader (no baseline) must see batch 1 first.
    let mut rec = Recorder::default();
    let mut strict = OpLogStandbyReader::new(f.storage_of("y"));
    let e = strict.poll_once(&mut rec, 1024).await.unwrap_err();
    assert!(!e.is_retryable());
    assert!(rec.applied().is_empty(), "nothing applied: {e}");
    // A baseline ahead of the log.
    let mut ahead = OpLogStandbyReader::from(f.storage_of("y"), 50, 0);
    assert!(matches!(ahead.poll_once(&mut rec, 1024).await, Err(StandbyError::AheadOfLog { .. })));
    // A hole after the baseline: batch 42 starts at 43, baseline at 40.
    let mut hole = OpLogStandbyReader::from(f.storage_of("y"), 40, 0);
    assert_eq!(hole.poll_once(&mut rec, 1024).await.unwrap_err(), StandbyError::SeqGap { expected: 41, found: 43 });
    assert!(rec.applied().is_empty());
}

/// Runs one fail-closed case: the poll after `setup` must fail with a fatal error matching `check`, apply
/// exactly `applied` entries in all, and every later poll must be refused.
async fn expect_fatal(
    reader: &mut OpLogStandbyReader,
    rec: &mut Recorder,
    applied: u64,
    check: impl Fn(&StandbyError) -> bool,
) {
    let e = reader.poll_once(rec, 1024).await.unwrap_err();
    assert!(!e.is_retryable(), "fatal expected: {e}");
    assert!(check(&e), "unexpected error: {e:?}");
    assert_eq!(rec.seqs(), (1..=applied).collect::<Vec<_>>(), "applied nothing beyond the bad point ({e})");
    assert_eq!(reader.status().failed, Some(e.clone()));
    assert!(matches!(reader.poll_once(rec, 1024).await, Err(StandbyError::Halted(_))), "refuses further polls");
    assert_eq!(rec.seqs().len() as u64, applied);
}

/// Property 15: every anomaly is fatal and nothing past it is applied.
async fn anomalies_fail_closed(f: Fixture) {
    let keys = |c: &str| OpLogKeys::new(c).unwrap();

    // Prefix regressions: lower batch id, same id with another seq, higher id with the same seq.
    for (c, bad) in [("r1", p(1, 1)), ("r2", p(2, 4)), ("r3", p(3, 3))] {
        let s = f.storage_of(c);
        seed(&s, &[1, 2]).await;
        let (mut rec, mut reader) = (Recorder::default(), OpLogStandbyReader::new(f.storage_of(c)));
        reader.poll_once(&mut rec, 1024).await.unwrap();
        raw_put(&f, keys(c).durable_prefix(), bad.encode()).await;
        expect_fatal(&mut reader, &mut rec, 3, |e| matches!(e, StandbyError::PrefixRegressed { .. })).await;
    }

    // The prefix disappears after it was seen.
    let s = f.storage_of("v");
    seed(&s, &[1]).await;
    let (mut rec, mut reader) = (Recorder::default(), OpLogStandbyReader::new(f.storage_of("v")));
    reader.poll_once(&mut rec, 1024).await.unwrap();
    f.kv.inject_next(KvOp::Get, Fault::Absent);
    expect_fatal(&mut reader, &mut rec, 1, |e| *e == StandbyError::PrefixVanished { seen: p(1, 1) }).await;

    // The prefix points into a batch (batch 1 holds 1..3, the prefix says 2).
    let s = f.storage_of("into");
    seed(&s, &[3]).await;
    raw_put(&f, keys("into").durable_prefix(), p(1, 2).encode()).await;
    let (mut rec, mut reader) = (Recorder::default(), OpLogStandbyReader::new(f.storage_of("into")));
    expect_fatal(&mut reader, &mut rec, 0, |e| {
        *e == StandbyError::TerminalMismatch { prefix: p(1, 2), batch_last_seq: 3 }
    })
    .await;

    // The prefix names a batch that does not exist.
    raw_put(&f, keys("missing").durable_prefix(), p(1, 1).encode()).await;
    let (mut rec, mut reader) = (Recorder::default(), OpLogStandbyReader::new(f.storage_of("missing")));
    expect_fatal(&mut reader, &mut rec, 0, |e| *e == StandbyError::TerminalBatchMissing { prefix: p(1, 1) }).await;

    // A batch id gap: 1 then 3.
    let s = f.storage_of("bgap");
    seed(&s, &[1]).await;
    raw_put(&f, keys("bgap").batch(3), batch(3, 2, 1).encode().unwrap()).await;
    raw_put(&f, keys("bgap").durable_prefix(), p(3, 2).encode()).await;
    let (mut rec, mut reader) = (Recorder::default(), OpLogStandbyReader::new(f.storage_of("bgap")));
    expect_fatal(&mut reader, &mut rec, 1, |e| *e == StandbyError::BatchGap { expected: 2, found: 3 }).await;

    // A sequence gap between batches: batch 2 starts at 3 after batch 1 ended at 1.
    let s = f.storage_of("sgap");
    seed(&s, &[1]).await;
    raw_put(&f, keys("sgap").batch(2), batch(2, 3, 1).encode().unwrap()).await;
    raw_put(&f, keys("sgap").durable_prefix(), p(2, 3).encode()).await;
    let (mut rec, mut reader) = (Recorder::default(), OpLogStandbyReader::new(f.storage_of("sgap")));
    expect_fatal(&mut reader, &mut rec, 1, |e| *e == StandbyError::SeqGap { expected: 2, found: 3 }).await;

    // Overlapping batches: batch 2 starts at 2 after batch 1 ended at 2.
    let s = f.storage_of("overlap");
    seed(&s, &[2]).await;
    raw_put(&f, keys("overlap").batch(2), batch(2, 2, 2).encode().unwrap()).await;
    raw_put(&f, keys("overlap").durable_prefix(), p(2, 3).encode()).await;
    let (mut rec, mut reader) = (Recorder::default(), OpLogStandbyReader::new(f.storage_of("overlap")));
    expect_fatal(&mut reader, &mut rec, 2, |e| *e == StandbyError::SeqGap { expected: 3, found: 2 }).await;

    // A checksum mismatch in a batch below the terminal one.
    let s = f.storage_of("crc");
    seed(&s, &[1, 1]).await;
    let mut bad = batch(1, 1, 1).encode().unwrap();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    raw_put(&f, keys("crc").batch(1), bad).await;
    let (mut rec, mut reader) = (Recorder::default(), OpLogStandbyReader::new(f.storage_of("crc")));
    expect_fatal(&mut reader, &mut rec, 0, |e| matches!(e, StandbyError::Corrupt(StorageError::Corrupt { .. }))).await;

    // A corrupt durable prefix.
    raw_put(&f, keys("badprefix").durable_prefix(), b"garbage".to_vec()).await;
    let (mut rec, mut reader) = (Recorder::default(), OpLogStandbyReader::new(f.storage_of("badprefix")));
    expect_fatal(&mut reader, &mut rec, 0, |e| matches!(e, StandbyError::Corrupt(_))).await;

    // Batch 0 with a non-zero seq that is no cutover (no legacy /latest).
    raw_put(&f, keys("zero").durable_prefix(), p(0, 42).encode()).await;
    let (mut rec, mut reader) = (Recorder::default(), OpLogStandbyReader::new(f.storage_of("zero")));
    expect_fatal(&mut reader, &mut rec, 0, |e| *e == StandbyError::NotACutover { prefix: p(0, 42), latest: None })
        .await;

    // A gap at the end of a legacy log: /latest says 5, entries stop at 3.
    for seq in 1..=3 {
        raw_put(&f, keys("lgap").legacy_entry(seq), encode_legacy_entry(seq, &entry(seq)).unwrap()).await;
    }
    raw_put(&f, keys("lgap").legacy_latest(), encode_legacy_latest(5)).await;
    let (mut rec, mut reader) = (Recorder::default(), OpLogStandbyReader::new(f.storage_of("lgap")));
    expect_fatal(&mut reader, &mut rec, 3, |e| *e == StandbyError::Incomplete { missing: 4, boundary: 5 }).await;

    // A legacy value stored under the wrong key.
    raw_put(&f, keys("lmis").legacy_entry(1), encode_legacy_entry(2, &entry(2)).unwrap()).await;
    raw_put(&f, keys("lmis").legacy_latest(), encode_legacy_latest(1)).await;
    let (mut rec, mut reader) = (Recorder::default(), OpLogStandbyReader::new(f.storage_of("lmis")));
    expect_fatal(&mut reader, &mut rec, 0, |e| matches!(e, StandbyError::Corrupt(_))).await;

    // The applier refuses an entry: the reader stops there.
    let s = f.storage_of("apply");
    seed(&s, &[1, 2]).await;
    let mut rec = Recorder { fail_at: Some(2), ..Recorder::default() };
    let mut reader = OpLogStandbyReader::new(f.storage_of("apply"));
    expect_fatal(&mut reader, &mut rec, 1, |e| matches!(e, StandbyError::Apply(a) if a.seq == 2)).await;
    assert_eq!(reader.status().applied_seq, 1);
}

/// The reference's `standby_prefix_read_before_batch` failpoint: the reader is held between its prefix read and
/// its batch reads while the primary writes two more batches; it applies exactly up to the prefix it read (the
/// newer batches are in its range read but beyond that prefix), and the next poll takes the rest.
async fn never_applies_past_the_prefix_it_read(f: Fixture) {
    let s = f.clean_storage_of("c");
    let prefix = seed(&s, &[2]).await;
    let (entered, release) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    // The terminal-batch read is the second get of the poll.
    f.kv.inject_nth_call(f.kv.total_calls() + 2, Fault::Block { entered: entered.clone(), release: release.clone() });
    let mut rec = Recorder::default();
    let mut reader = OpLogStandbyReader::new(f.storage_of("c"));
    let primary = async {
        entered.acquire().await.unwrap().forget();
        let p2 = s.write_batch(&batch(2, 3, 2), prefix, VIEW).await.unwrap();
        s.write_batch(&batch(3, 5, 1), p2, VIEW).await.unwrap();
        release.add_permits(1);
    };
    let (r, ()) = tokio::join!(reader.poll_once(&mut rec, 1024), primary);
    let r = r.unwrap();
    assert_eq!((r.prefix, r.applied, r.caught_up), (Some(p(1, 2)), 2, true));
    assert_eq!(rec.applied(), entries(1..=2), "nothing beyond the prefix read");
    assert_eq!(reader.poll_once(&mut rec, 1024).await.unwrap().applied, 3);
    assert_eq!(rec.applied(), entries(1..=5));
}

/// Property 18 (the reader's part): catching up past one poll's page (1025 batches with the default 1024) takes
/// a second poll and reaches the prefix exactly.
async fn catches_up_past_a_full_page(f: Fixture) {
    let s = f.clean_storage_of("c");
    s.init_durable_prefix().await.unwrap();
    s.claim_producer_view(VIEW).await.unwrap();
    let mut prefix = DurablePrefix::ZERO;
    for id in 1..=1025 {
        prefix = s.write_batch(&batch(id, id, 1), prefix, VIEW).await.unwrap();
    }
    let mut rec = Recorder::default();
    let mut reader = OpLogStandbyReader::new(f.storage_of("c"));
    let r = reader.poll_once(&mut rec, DEFAULT_MAX_BATCHES_PER_POLL).await.unwrap();
    assert_eq!((r.applied, r.caught_up), (1024, false));
    let r = reader.poll_once(&mut rec, DEFAULT_MAX_BATCHES_PER_POLL).await.unwrap();
    assert_eq!((r.applied, r.caught_up), (1, true));
    assert_eq!(rec.seqs(), (1..=1025).collect::<Vec<_>>());
}

crate::on_all_backends!(
    applies_up_to_the_prefix_and_rereads_nothing,
    pages_continue_on_the_next_poll,
    transient_errors_are_retryable,
    a_baseline_tolerates_compacted_history,
    anomalies_fail_closed,
    never_applies_past_the_prefix_it_read,
    catches_up_past_a_full_page,
);
