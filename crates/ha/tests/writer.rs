//! `OrderedOpLogWriter`: admission, sequence assignment, work-conserving sealing with one batch in flight,
//! fail-closed retry, fencing, and durable callbacks in sequence order. Most run on the in-memory backend
//! (deterministic, with faults); one runs end to end on etcd and redb.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{Fixture, entry};
use crescent_ha::kv::{Fault, FaultyKv, HaKvBackend, KvError, KvOp, MemoryKv};
use crescent_ha::oplog::{
    DurableCallback, DurablePrefix, OpLogBatchRecord, OpLogBatchStorage, OrderedOpLogWriter, StorageConfig,
    StorageError, WriterConfig, WriterError,
};
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc};

const VIEW: u64 = 1;

struct Rig {
    kv: Arc<FaultyKv<Arc<dyn HaKvBackend>>>,
    storage: OpLogBatchStorage,
    writer: OrderedOpLogWriter,
    durable_rx: mpsc::UnboundedReceiver<u64>,
    durable_tx: mpsc::UnboundedSender<u64>,
}

impl Rig {
    /// Holds the next txn: `entered` gets a permit when it is reached, it proceeds once `release` gets one.
    fn block_next_txn(&self) -> (Arc<Semaphore>, Arc<Semaphore>) {
        let (entered, release) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
        self.kv.inject_next(KvOp::Txn, Fault::Block { entered: entered.clone(), release: release.clone() });
        (entered, release)
    }

    fn callback(&self) -> Option<DurableCallback> {
        let tx = self.durable_tx.clone();
        Some(Box::new(move |seq| {
            let _ = tx.send(seq);
        }))
    }

    /// Reserve + commit entry `i` with a callback that reports its sequence number.
    fn put(&self, i: u64) -> u64 {
        let r = self.writer.reserve().unwrap();
        self.writer.commit(r, entry(i), self.callback()).unwrap()
    }

    /// The next `n` durable callbacks, in the order they ran.
    async fn durable(&mut self, n: usize) -> Vec<u64> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.durable_rx.recv().await.unwrap());
        }
        out
    }

    async fn batches(&self) -> Vec<OpLogBatchRecord> {
        self.storage.read_batches_after(0, 0).await.unwrap()
    }
}

async fn rig_on(kv: Arc<dyn HaKvBackend>, config: WriterConfig) -> Rig {
    let kv = Arc::new(FaultyKv::new(kv));
    let storage = OpLogBatchStorage::new(kv.clone(), "c", StorageConfig::default()).unwrap();
    let prefix = storage.init_durable_prefix().await.unwrap();
    storage.claim_producer_view(VIEW).await.unwrap();
    let writer = OrderedOpLogWriter::new(storage.clone(), VIEW, prefix, config);
    let (durable_tx, durable_rx) = mpsc::unbounded_channel();
    Rig { kv, storage, writer, durable_rx, durable_tx }
}

async fn rig(config: WriterConfig) -> Rig {
    rig_on(Arc::new(MemoryKv::new()), config).await
}

fn sizes(batches: &[OpLogBatchRecord]) -> Vec<(u64, u64, u64)> {
    batches.iter().map(|b| (b.batch_id, b.first_seq, b.last_seq)).collect()
}

#[tokio::test]
async fn abort_leaves_no_gap_and_commits_are_contiguous() {
    let mut r = rig(WriterConfig::default()).await;
    let a = r.writer.reserve().unwrap();
    r.writer.abort(a);
    drop(r.writer.reserve().unwrap());
    let (x, y, z) = (r.writer.reserve().unwrap(), r.writer.reserve().unwrap(), r.writer.reserve().unwrap());
    assert_eq!(r.writer.status().waiting, 3);
    let seqs = [
        r.writer.commit(x, entry(1), r.callback()).unwrap(),
        r.writer.commit(y, entry(2), r.callback()).unwrap(),
        r.writer.commit(z, entry(3), r.callback()).unwrap(),
    ];
    assert_eq!(seqs, [1, 2, 3], "Reserve assigns no sequence; Commit assigns them in order");
    r.writer.start();
    assert_eq!(r.durable(3).await, vec![1, 2, 3]);
    // Committed before start: the writer seals them when it starts; the log holds exactly the committed entries.
    let batches = r.batches().await;
    let all: Vec<_> = batches.iter().flat_map(|b| b.entries.clone()).collect();
    assert_eq!(all, vec![entry(1), entry(2), entry(3)]);
    assert_eq!(batches.last().unwrap().last_seq, 3);
    assert_eq!(r.writer.status().durable.last_seq, 3);
    r.writer.stop().await;
}

#[tokio::test]
async fn an_idle_writer_writes_one_entry_at_once() {
    let mut r = rig(WriterConfig::default()).await;
    r.writer.start();
    assert_eq!(r.put(1), 1);
    assert_eq!(r.durable(1).await, vec![1]);
    assert_eq!(sizes(&r.batches().await), vec![(1, 1, 1)], "a single entry is not held back to fill a batch");
    r.writer.stop().await;
}

#[tokio::test]
async fn commits_during_an_in_flight_batch_form_the_next_batch() {
    let mut r = rig(WriterConfig::default()).await;
    let (entered, release) = r.block_next_txn();
    r.writer.start();
    r.put(1);
    entered.acquire().await.unwrap().forget();
    // Batch 1 is in flight; these wait, and a slow (uncommitted) reservation does not hold them back.
    let slow = r.writer.reserve().unwrap();
    r.put(2);
    r.put(3);
    assert!(r.durable_rx.try_recv().is_err(), "nothing is durable before the txn completes");
    assert_eq!(r.writer.status().durable, DurablePrefix::ZERO);
    release.add_permits(1);
    assert_eq!(r.durable(3).await, vec![1, 2, 3]);
    assert_eq!(sizes(&r.batches().await), vec![(1, 1, 1), (2, 2, 3)]);
    assert_eq!(r.writer.commit(slow, entry(4), r.callback()).unwrap(), 4);
    assert_eq!(r.durable(1).await, vec![4]);
    r.writer.stop().await;
}

#[tokio::test]
async fn admission_is_bounded_and_sealing_frees_slots() {
    let mut r = rig(WriterConfig { max_waiting_entries: 2, ..WriterConfig::default() }).await;
    let (a, b) = (r.writer.reserve().unwrap(), r.writer.reserve().unwrap());
    assert_eq!(r.writer.reserve().unwrap_err(), WriterError::QueueFull(2));
    drop(b);
    let c = r.writer.reserve().unwrap();
    // While a batch is in flight, a full set of new slots is available again.
    let (entered, release) = r.block_next_txn();
    r.writer.start();
    r.writer.commit(a, entry(1), r.callback()).unwrap();
    r.writer.commit(c, entry(2), r.callback()).unwrap();
    entered.acquire().await.unwrap().forget();
    let in_flight = r.writer.status();
    assert!(in_flight.in_flight);
    let (d, e) = (r.writer.reserve().unwrap(), r.writer.reserve().unwrap());
    assert!(matches!(r.writer.reserve(), Err(WriterError::QueueFull(_))));
    release.add_permits(1);
    assert_eq!(r.durable(2).await, vec![1, 2]);
    r.writer.abort(d);
    r.writer.commit(e, entry(3), r.callback()).unwrap();
    assert_eq!(r.durable(1).await, vec![3]);
    r.writer.stop().await;
}

#[tokio::test]
async fn backend_failure_closes_admission_and_the_same_batch_is_retried() {
    let mut r = rig(WriterConfig::default()).await;
    for _ in 0..3 {
        r.kv.inject_next(KvOp::Txn, Fault::Fail(KvError::Unavailable("etcd down".into())));
    }
    let (entered, release) = r.block_next_txn();
    let held = r.writer.reserve().unwrap();
    r.writer.start();
    r.put(1);
    // The fourth attempt is held: three failed before it.
    entered.acquire().await.unwrap().forget();
    let st = r.writer.status();
    assert!(!st.accepting && st.failed_attempts == 3 && st.last_error.is_some(), "{st:?}");
    assert_eq!(r.writer.reserve().unwrap_err(), WriterError::Unavailable, "new admission fails fast");
    // A reservation taken before the failure may still commit; it waits behind the stuck batch.
    assert_eq!(r.writer.commit(held, entry(2), r.callback()).unwrap(), 2);
    assert!(r.durable_rx.try_recv().is_err(), "no callback before durability");
    release.add_permits(1);
    assert_eq!(r.durable(2).await, vec![1, 2]);
    assert_eq!(sizes(&r.batches().await), vec![(1, 1, 1), (2, 2, 2)], "the stuck batch was not skipped or merged");
    assert!(r.writer.is_accepting(), "success reopens admission");
    assert_eq!(r.writer.status().last_error, None);
    r.put(3);
    assert_eq!(r.durable(1).await, vec![3]);
    r.writer.stop().await;
}

#[tokio::test]
async fn an_ambiguous_but_applied_write_is_durable_once() {
    let mut r = rig(WriterConfig::default()).await;
    r.kv.inject_next(KvOp::Txn, Fault::ApplyThenAmbiguous);
    r.writer.start();
    r.put(1);
    r.put(2);
    assert_eq!(r.durable(2).await, vec![1, 2]);
    let batches = r.batches().await;
    assert_eq!(batches.iter().map(|b| b.entries.len()).sum::<usize>(), 2, "no entry written twice");
    assert_eq!(r.storage.read_durable_prefix().await.unwrap(), Some(r.writer.status().durable));
    r.writer.stop().await;
}

#[tokio::test]
async fn a_fenced_writer_stops_for_good_without_callbacks() {
    let mut r = rig(WriterConfig::default()).await;
    r.writer.start();
    r.put(1);
    assert_eq!(r.durable(1).await, vec![1]);
    // A new leader claims a newer view.
    r.storage.claim_producer_view(VIEW + 1).await.unwrap();
    let held = r.writer.reserve().unwrap();
    r.put(2);
    r.writer.stop().await;
    let st = r.writer.status();
    assert_eq!(st.terminal, Some(StorageError::Fenced { held: VIEW, found: Some(VIEW + 1) }));
    assert!(matches!(r.writer.reserve(), Err(WriterError::Terminal(StorageError::Fenced { .. }))));
    assert!(matches!(r.writer.commit(held, entry(3), None), Err(WriterError::Terminal(_))));
    drop(r.durable_tx);
    assert_eq!(r.durable_rx.recv().await, None, "the fenced entry's callback never ran");
    assert_eq!(r.storage.read_durable_prefix().await.unwrap(), Some(DurablePrefix { batch_id: 1, last_seq: 1 }));
}

#[tokio::test]
async fn the_writer_continues_an_existing_prefix() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    {
        let s = OpLogBatchStorage::new(kv.clone(), "c", StorageConfig::default()).unwrap();
        s.init_durable_prefix().await.unwrap();
        s.claim_producer_view(VIEW).await.unwrap();
        let mut p = DurablePrefix::ZERO;
        for id in 1..=7 {
            p = s.write_batch(&common::batch(id, p.last_seq + 1, 6), p, VIEW).await.unwrap();
        }
        assert_eq!(p, DurablePrefix { batch_id: 7, last_seq: 42 });
    }
    let mut r = rig_on(kv, WriterConfig::default()).await;
    r.writer.start();
    assert_eq!(r.put(43), 43);
    assert_eq!(r.durable(1).await, vec![43]);
    assert_eq!(r.writer.status().durable, DurablePrefix { batch_id: 8, last_seq: 43 });
    r.writer.stop().await;
}

#[tokio::test]
async fn invalid_entries_and_foreign_reservations_consume_nothing() {
    let mut r = rig(WriterConfig::default()).await;
    let other = rig(WriterConfig::default()).await;
    let bad = crescent_ha::oplog::OpLogEntry { op: 0, ..entry(1) };
    assert!(matches!(r.writer.commit(r.writer.reserve().unwrap(), bad, None), Err(WriterError::InvalidEntry(_))));
    let foreign = other.writer.reserve().unwrap();
    assert_eq!(r.writer.commit(foreign, entry(1), None).unwrap_err(), WriterError::ForeignReservation);
    assert_eq!(other.writer.status().waiting, 0, "the foreign slot went back to its writer");
    assert_eq!(r.writer.status().waiting, 0);
    r.writer.start();
    assert_eq!(r.put(1), 1, "no sequence was consumed");
    assert_eq!(r.durable(1).await, vec![1]);
    r.writer.stop().await;
}

#[tokio::test]
async fn stop_writes_what_was_committed_and_runs_its_callbacks() {
    let mut r = rig(WriterConfig::default()).await;
    r.writer.start();
    for i in 1..=50 {
        r.put(i);
    }
    r.writer.stop().await;
    assert_eq!(r.durable(50).await, (1..=50).collect::<Vec<_>>());
    assert_eq!(r.writer.reserve().unwrap_err(), WriterError::Unavailable);
    let batches = r.batches().await;
    assert_eq!(batches.last().unwrap().last_seq, 50);
    assert!(batches.len() < 50, "entries committed while a batch was in flight were grouped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_callback_does_not_hold_back_the_next_write() {
    let mut r = rig(WriterConfig::default()).await;
    let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
    let (entered, release) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    // The writer's second txn: the first is batch 1's.
    r.kv.inject_nth_call(r.kv.total_calls() + 2, Fault::Block { entered: entered.clone(), release: release.clone() });
    r.writer.start();
    let tx = r.durable_tx.clone();
    let slow: DurableCallback = Box::new(move |seq| {
        let _ = tx.send(seq);
        // Blocks the callback task until the test lets it go.
        let _ = gate_rx.recv();
    });
    r.writer.commit(r.writer.reserve().unwrap(), entry(1), Some(slow)).unwrap();
    assert_eq!(r.durable(1).await, vec![1]);
    r.put(2);
    // Batch 2's txn starts while callback 1 is still running.
    entered.acquire().await.unwrap().forget();
    release.add_permits(1);
    gate_tx.send(()).unwrap();
    assert_eq!(r.durable(1).await, vec![2]);
    r.writer.stop().await;
}

#[tokio::test]
async fn metrics_report_durability_stuck_batches_queues_and_refusals() {
    let mut r = rig(WriterConfig { max_waiting_entries: 3, ..WriterConfig::default() }).await;
    let m = r.writer.metrics();
    assert!(m.accepting && !m.terminal);
    assert_eq!((m.durable_writes, m.retries, m.committed_not_durable, m.in_flight_age), (0, 0, 0, None));
    for _ in 0..2 {
        r.kv.inject_next(KvOp::Txn, Fault::Fail(KvError::Unavailable("etcd down".into())));
    }
    let (entered, release) = r.block_next_txn();
    let held = r.writer.reserve().unwrap();
    r.writer.start();
    r.put(1);
    entered.acquire().await.unwrap().forget();
    // Batch {1} is stuck (two failures, third attempt held); entry 2 waits behind it.
    r.writer.commit(held, entry(2), r.callback()).unwrap();
    assert_eq!(r.writer.reserve().unwrap_err(), WriterError::Unavailable);
    let m = r.writer.metrics();
    assert!(!m.accepting);
    assert_eq!(m.retries, 2);
    assert!(m.stuck_for.is_some() && m.in_flight_age.is_some(), "{m:?}");
    assert!(m.in_flight_age >= m.stuck_for, "the batch was in flight before it first failed");
    assert_eq!(m.committed_not_durable, 2, "one in flight, one waiting");
    assert_eq!(m.admission_failures.unavailable, 1);
    release.add_permits(1);
    assert_eq!(r.durable(2).await, vec![1, 2]);
    let m = r.writer.metrics();
    assert!(m.accepting);
    assert_eq!((m.stuck_for, m.committed_not_durable), (None, 0));
    assert_eq!((m.durable, m.durable_writes, m.durable_entries), (DurablePrefix { batch_id: 2, last_seq: 2 }, 2, 2));
    assert_eq!((m.batch_entries.total, m.batch_entries.counts[0]), (2, 2), "two one-entry batches");
    assert_eq!(m.batch_bytes.total, 2);
    assert_eq!(m.commit_to_durable.count, 2);
    assert!(m.commit_to_durable.max >= m.commit_to_durable.p50);
    common::eventually("callbacks finished", std::time::Duration::from_secs(10), || {
        r.writer.metrics().callback_queue == 0
    })
    .await;
    assert_eq!(r.writer.metrics().callback_latency.count, 2);
    // Admission refusals by cause: queue full.
    let slots: Vec<_> = (0..3).map(|_| r.writer.reserve().unwrap()).collect();
    assert!(matches!(r.writer.reserve(), Err(WriterError::QueueFull(3))));
    assert_eq!(r.writer.metrics().admission_failures.queue_full, 1);
    drop(slots);
    let bad = crescent_ha::oplog::OpLogEntry { op: 0, ..entry(9) };
    assert!(r.writer.commit(r.writer.reserve().unwrap(), bad, None).is_err());
    assert_eq!(r.writer.metrics().admission_failures.invalid_entry, 1);
    r.writer.stop().await;
}

/// The legacy per-entry mode behaves like the batch mode towards callers (admission closes while the backend
/// fails, a reservation taken before may still commit, the stuck entry is retried, callbacks run in order only
/// once durable) while writing one txn per entry: one key per entry plus `/latest`, no batch, no prefix.
#[tokio::test]
async fn legacy_mode_same_behaviour_one_txn_per_entry() {
    let kv = Arc::new(FaultyKv::new(Arc::new(MemoryKv::new()) as Arc<dyn HaKvBackend>));
    let storage = OpLogBatchStorage::new(kv.clone(), "c", StorageConfig::default()).unwrap();
    storage.claim_producer_view(VIEW).await.unwrap();
    let start = storage.init_legacy().await.unwrap();
    let config = WriterConfig { mode: crescent_ha::oplog::WriterMode::LegacyPerEntry, ..WriterConfig::default() };
    let writer = OrderedOpLogWriter::new(storage.clone(), VIEW, start, config);
    let (durable_tx, durable_rx) = mpsc::unbounded_channel();
    let mut r = Rig { kv, storage, writer, durable_rx, durable_tx };
    r.kv.inject_next(KvOp::Txn, Fault::Fail(KvError::Unavailable("etcd down".into())));
    let (entered, release) = r.block_next_txn();
    let held = r.writer.reserve().unwrap();
    let txns = r.kv.calls(KvOp::Txn);
    r.writer.start();
    r.put(1);
    entered.acquire().await.unwrap().forget();
    assert!(!r.writer.is_accepting(), "admission closed after the failure");
    assert_eq!(r.writer.reserve().unwrap_err(), WriterError::Unavailable);
    assert_eq!(r.writer.commit(held, entry(2), r.callback()).unwrap(), 2);
    assert!(r.durable_rx.try_recv().is_err(), "no callback before durability");
    release.add_permits(1);
    assert_eq!(r.durable(2).await, vec![1, 2]);
    assert!(r.writer.is_accepting());
    for i in 3..=5 {
        r.put(i);
    }
    assert_eq!(r.durable(3).await, vec![3, 4, 5]);
    r.writer.stop().await;
    assert_eq!(r.kv.calls(KvOp::Txn) - txns, 6, "one txn per entry, plus the failed attempt");
    assert_eq!(r.storage.read_legacy_latest().await.unwrap(), Some(5));
    let stored = r.storage.read_legacy_entries(0, u64::MAX, 0).await.unwrap();
    assert_eq!(stored, (1..=5).map(|i| (i, entry(i))).collect::<Vec<_>>());
    assert!(r.batches().await.is_empty());
    assert_eq!(r.storage.read_durable_prefix().await.unwrap(), None);
    assert_eq!(r.writer.status().durable, DurablePrefix { batch_id: 0, last_seq: 5 });
}

/// End to end on a real backend: many concurrent producers, callbacks in order, the stored log contiguous.
async fn concurrent_producers_end_to_end(f: Fixture) {
    let mut r = rig_on(f.dyn_kv(), WriterConfig::default()).await;
    r.writer.start();
    let writer = Arc::new(r.writer);
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let (w, tx) = (writer.clone(), r.durable_tx.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..25u64 {
                let res = w.reserve().unwrap();
                let tx = tx.clone();
                w.commit(
                    res,
                    entry(t * 100 + i),
                    Some(Box::new(move |s| {
                        let _ = tx.send(s);
                    })),
                )
                .unwrap();
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut got = Vec::new();
    for _ in 0..200 {
        got.push(r.durable_rx.recv().await.unwrap());
    }
    assert_eq!(got, (1..=200).collect::<Vec<_>>(), "callbacks run in sequence order");
    writer.stop().await;
    let batches = r.storage.read_batches_after(0, 0).await.unwrap();
    let mut next = 1;
    for (i, b) in batches.iter().enumerate() {
        assert_eq!((b.batch_id, b.first_seq), (i as u64 + 1, next));
        next = b.last_seq + 1;
    }
    assert_eq!(next, 201);
    let _ = &f;
}

crate::on_all_backends!(concurrent_producers_end_to_end);

#[tokio::test]
async fn stop_waits_for_an_admitted_slot_and_writes_its_entry() {
    let mut r = rig(WriterConfig::default()).await;
    r.writer.start();
    let slot = r.writer.reserve().unwrap();
    let late = r.writer.reserve().unwrap();
    let commit_after_stop_began = async {
        tokio::task::yield_now().await;
        assert_eq!(r.writer.reserve().unwrap_err(), WriterError::Unavailable, "admission is closed");
        // The mutation holding this slot was under way when the stop came: its entry is still taken.
        let seq = r.writer.commit(slot, entry(1), r.callback()).unwrap();
        drop(late);
        seq
    };
    let ((), seq) = tokio::join!(r.writer.stop(), commit_after_stop_began);
    assert_eq!(seq, 1);
    assert_eq!(r.durable(1).await, vec![1], "durable before stop returned");
    assert_eq!(r.batches().await.last().unwrap().last_seq, 1, "the aborted slot left no gap");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_callback_does_not_silence_the_later_ones() {
    let mut r = rig(WriterConfig::default()).await;
    r.writer.start();
    r.put(1);
    let bad: DurableCallback = Box::new(|seq| panic!("callback {seq} fails"));
    r.writer.commit(r.writer.reserve().unwrap(), entry(2), Some(bad)).unwrap();
    r.put(3);
    let limit = std::time::Duration::from_secs(10);
    let ran = tokio::time::timeout(limit, r.durable(2)).await.expect("the callbacks after the panic never ran");
    assert_eq!(ran, vec![1, 3]);
    r.put(4);
    assert_eq!(tokio::time::timeout(limit, r.durable(1)).await.expect("later batches' callbacks run"), vec![4]);
    assert_eq!(r.writer.metrics().callback_panics, 1);
    r.writer.stop().await;
}

/// A callback task that falls behind holds the writer back once [`CALLBACK_QUEUE_BATCHES`] durable batches
/// wait for it (back-pressure on admission), instead of queueing without bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_callback_task_bounds_its_queue() {
    use crescent_ha::oplog::CALLBACK_QUEUE_BATCHES;
    let mut r = rig(WriterConfig::default()).await;
    r.writer.start();
    let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
    let tx = r.durable_tx.clone();
    let stall: DurableCallback = Box::new(move |seq| {
        let _ = tx.send(seq);
        let _ = gate_rx.recv();
    });
    r.writer.commit(r.writer.reserve().unwrap(), entry(1), Some(stall)).unwrap();
    assert_eq!(r.durable(1).await, vec![1]);
    // One-entry batches: batch 1's callback runs (stalled), CALLBACK_QUEUE_BATCHES wait in the queue, and the
    // writer holds the next durable one while it waits for room.
    let full = CALLBACK_QUEUE_BATCHES as u64 + 2;
    for i in 2..=full {
        let seq = r.put(i);
        common::eventually("durable", std::time::Duration::from_secs(10), || r.writer.status().durable.last_seq >= seq)
            .await;
    }
    assert_eq!(r.writer.metrics().callback_queue, full as usize);
    let held = r.put(full + 1);
    // Nothing to await for something that must not happen: give the writer time it would need to write it.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(r.writer.status().durable.last_seq, full, "the writer waits for room in the callback queue");
    assert_eq!(r.writer.metrics().callback_queue, full as usize);
    gate_tx.send(()).unwrap();
    assert_eq!(r.durable(held as usize - 1).await, (2..=held).collect::<Vec<_>>());
    r.writer.stop().await;
}
