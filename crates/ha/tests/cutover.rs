//! The legacy per-entry layout (the writer's `LegacyPerEntry` mode), the cutover to batch records (RFC §6), a
//! standby reading both in one sequence, and a failpoint at every step of both write protocols with the reader
//! ending with exactly what the writer reported durable. Every test runs on etcd, redb and memory.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{Fixture, Recorder, entry, eventually};
use crescent_ha::kv::{Fault, KvError, KvOp};
use crescent_ha::oplog::codec::{encode_legacy_entry, encode_legacy_latest, encode_producer_view};
use crescent_ha::oplog::{
    DurablePrefix, OpLogBatchStorage, OpLogEntry, OpLogStandbyReader, OrderedOpLogWriter, StorageError, WriterConfig,
    WriterError, WriterMode,
};
use std::time::Duration;
use tokio::sync::mpsc;

const VIEW: u64 = 1;
const WAIT: Duration = Duration::from_secs(30);

fn legacy() -> WriterConfig {
    WriterConfig { mode: WriterMode::LegacyPerEntry, ..WriterConfig::default() }
}

/// A started writer plus a channel its durable callbacks report `(seq, entry)` on.
struct Producer {
    writer: OrderedOpLogWriter,
    tx: mpsc::UnboundedSender<(u64, OpLogEntry)>,
    rx: mpsc::UnboundedReceiver<(u64, OpLogEntry)>,
}

impl Producer {
    fn new(storage: OpLogBatchStorage, initial: DurablePrefix, config: WriterConfig) -> Self {
        let writer = OrderedOpLogWriter::new(storage, VIEW, initial, config);
        writer.start();
        let (tx, rx) = mpsc::unbounded_channel();
        Self { writer, tx, rx }
    }

    /// Commits entry `i`; returns its sequence number.
    fn put(&self, i: u64) -> u64 {
        self.commit(self.writer.reserve().unwrap(), i).unwrap()
    }

    /// Commits entry `i` under an existing reservation (allowed while admission is closed for retries).
    fn commit(&self, r: crescent_ha::oplog::Reservation, i: u64) -> Result<u64, WriterError> {
        let e = entry(i);
        let tx = self.tx.clone();
        let cb = e.clone();
        self.writer.commit(
            r,
            e,
            Some(Box::new(move |seq| {
                let _ = tx.send((seq, cb));
            })),
        )
    }

    async fn durable(&mut self, n: usize) -> Vec<(u64, OpLogEntry)> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(tokio::time::timeout(WAIT, self.rx.recv()).await.expect("durable callback").unwrap());
        }
        out
    }

    /// Stops the writer and returns every callback that ran but was not collected yet.
    async fn finish(self) -> Vec<(u64, OpLogEntry)> {
        let Producer { writer, tx, mut rx } = self;
        writer.stop().await;
        // Dropping the writer drops the callbacks that never ran (a fenced writer's), and their senders with them.
        drop(writer);
        drop(tx);
        let mut out = Vec::new();
        while let Some(x) = rx.recv().await {
            out.push(x);
        }
        out
    }
}

async fn poll_until_caught_up(reader: &mut OpLogStandbyReader, rec: &mut Recorder, max: usize) -> usize {
    for polls in 1..=1000 {
        if reader.poll_once(rec, max).await.unwrap().caught_up {
            return polls;
        }
    }
    panic!("the reader never caught up");
}

/// The legacy mode writes one key per entry plus `/latest`, with the same admission and callback behaviour; the
/// batch writer then cuts over at `{0, latest}` and continues at `latest + 1` in batch 1 without touching
/// `/latest`; a reader following throughout, a fresh reader, and a fresh reader with a tiny page all apply
/// legacy then batch entries in one sequence with no gap and no duplicate; a per-entry writer is refused after.
async fn cutover_from_a_legacy_log(f: Fixture) {
    let s = f.storage_of("c");
    s.claim_producer_view(VIEW).await.unwrap();
    let start = s.init_legacy().await.unwrap();
    assert_eq!(start, DurablePrefix::ZERO);
    let mut follower_rec = Recorder::default();
    let mut follower = OpLogStandbyReader::new(f.storage_of("c"));
    let mut durable = Vec::new();

    let mut old = Producer::new(s.clone(), start, legacy());
    for i in 1..=10 {
        assert_eq!(old.put(i), i);
    }
    durable.extend(old.durable(10).await);
    let r = follower.poll_once(&mut follower_rec, 1024).await.unwrap();
    assert_eq!((r.prefix, r.legacy_latest), (None, Some(10)), "no prefix: the legacy path up to /latest");
    assert_eq!(follower_rec.seqs(), (1..=10).collect::<Vec<_>>());
    for i in 11..=20 {
        old.put(i);
    }
    durable.extend(old.durable(10).await);
    assert_eq!(old.writer.status().durable, DurablePrefix { batch_id: 0, last_seq: 20 });
    durable.extend(old.finish().await);
    assert_eq!(s.read_legacy_latest().await.unwrap(), Some(20));
    assert_eq!(
        s.read_legacy_entries(0, u64::MAX, 0).await.unwrap(),
        (1..=20).map(|i| (i, entry(i))).collect::<Vec<_>>()
    );
    assert!(s.read_batches_after(0, 0).await.unwrap().is_empty(), "the legacy mode writes no batch");
    assert_eq!(s.read_durable_prefix().await.unwrap(), None, "nor a durable prefix");

    // The cutover.
    let cut = s.init_durable_prefix().await.unwrap();
    assert_eq!(cut, DurablePrefix { batch_id: 0, last_seq: 20 });
    assert_eq!(s.init_durable_prefix().await.unwrap(), cut, "idempotent");
    assert!(matches!(s.init_legacy().await, Err(StorageError::CutOver(p)) if p == cut));
    let r = follower.poll_once(&mut follower_rec, 1024).await.unwrap();
    assert_eq!((r.prefix, r.caught_up), (Some(cut), true), "the cutover boundary adds nothing new");

    // A per-entry writer that started before the cutover is refused on its next write, with no callback.
    let mut stale = Producer::new(s.clone(), DurablePrefix { batch_id: 0, last_seq: 20 }, legacy());
    stale.put(999);
    eventually("the stale per-entry writer turns terminal", WAIT, || stale.writer.status().terminal.is_some()).await;
    assert!(matches!(stale.writer.status().terminal, Some(StorageError::CutOver(_))));
    assert!(stale.rx.try_recv().is_err());
    assert!(stale.finish().await.is_empty());

    let mut new = Producer::new(s.clone(), cut, WriterConfig::default());
    assert_eq!(new.put(21), 21, "sequence continues at latest + 1");
    durable.extend(new.durable(1).await);
    for i in 22..=35 {
        new.put(i);
    }
    durable.extend(new.durable(14).await);
    durable.extend(new.finish().await);
    let batches = s.read_batches_after(0, 0).await.unwrap();
    assert_eq!((batches[0].batch_id, batches[0].first_seq), (1, 21), "the first batch is id 1 at latest + 1");
    assert_eq!(s.read_legacy_latest().await.unwrap(), Some(20), "batch mode never writes /latest");

    let expected: Vec<_> = (1..=35).map(|i| (i, entry(i))).collect();
    assert_eq!(durable, expected, "callbacks: every entry once, in order");
    poll_until_caught_up(&mut follower, &mut follower_rec, 1024).await;
    assert_eq!(follower_rec.applied(), expected, "the follower applied legacy then batch entries");
    assert_eq!(follower.status().lag, 0);

    let mut rec = Recorder::default();
    let mut fresh = OpLogStandbyReader::new(f.storage_of("c"));
    assert_eq!(poll_until_caught_up(&mut fresh, &mut rec, 1024).await, 1);
    assert_eq!(rec.applied(), expected, "a fresh reader crosses the cutover in one poll");

    let mut rec = Recorder::default();
    let mut paged = OpLogStandbyReader::new(f.storage_of("c"));
    assert!(poll_until_caught_up(&mut paged, &mut rec, 3).await > 5);
    assert_eq!(rec.applied(), expected, "a paged reader crosses the cutover without a gap or duplicate");
}

/// Racing initialisers agree; a per-entry writer still moving `/latest` makes the cutover re-read; an
/// applied-but-ambiguous cutover resolves to the stored prefix.
async fn cutover_races(f: Fixture) {
    let seed_legacy = |cluster: &'static str, n: u64| {
        let kv = f.kv.inner().clone();
        async move {
            let keys = crescent_ha::oplog::OpLogKeys::new(cluster).unwrap();
            for seq in 1..=n {
                kv.put(&keys.legacy_entry(seq), &encode_legacy_entry(seq, &entry(seq)).unwrap()).await.unwrap();
            }
            kv.put(&keys.legacy_latest(), &encode_legacy_latest(n)).await.unwrap();
        }
    };
    seed_legacy("race", 5).await;
    let (a, b) = (f.storage_of("race"), f.storage_of("race"));
    let (ra, rb) = tokio::join!(a.init_durable_prefix(), b.init_durable_prefix());
    assert_eq!(
        (ra.unwrap(), rb.unwrap()),
        (DurablePrefix { batch_id: 0, last_seq: 5 }, DurablePrefix { batch_id: 0, last_seq: 5 })
    );

    // A per-entry writer lands entry 6 and /latest = 6 just before the cutover txn: the cutover re-reads.
    seed_legacy("moving", 5).await;
    let s = f.storage_of("moving");
    let keys = s.keys().clone();
    f.kv.inner().put(&keys.legacy_entry(6), &encode_legacy_entry(6, &entry(6)).unwrap()).await.unwrap();
    f.kv.inject_next(KvOp::Txn, Fault::PutFirst(keys.legacy_latest(), encode_legacy_latest(6)));
    assert_eq!(s.init_durable_prefix().await.unwrap(), DurablePrefix { batch_id: 0, last_seq: 6 });
    let mut rec = Recorder::default();
    let mut reader = OpLogStandbyReader::new(f.storage_of("moving"));
    assert!(reader.poll_once(&mut rec, 1024).await.unwrap().caught_up);
    assert_eq!(rec.seqs(), (1..=6).collect::<Vec<_>>(), "the entry that raced the cutover is inside it");

    seed_legacy("ambiguous", 3).await;
    let s = f.storage_of("ambiguous");
    f.kv.inject_next(KvOp::Txn, Fault::ApplyThenAmbiguous);
    assert_eq!(s.init_durable_prefix().await.unwrap(), DurablePrefix { batch_id: 0, last_seq: 3 });
}

/// One failpoint scenario: faults scheduled on the writer's backend before entries 2 and 3 are committed.
struct Scenario {
    name: &'static str,
    faults: fn(&Fixture, &OpLogBatchStorage) -> Vec<(KvOp, Fault)>,
    /// A newer producer takes over: the writer turns terminal and entries 2 and 3 never become durable.
    fenced: bool,
}

fn down() -> Fault {
    Fault::Fail(KvError::Unavailable("injected: down".into()))
}

/// Lets one call of a kind through untouched (a placeholder so the next fault hits a later call).
fn pass() -> Fault {
    Fault::Delay(Duration::ZERO)
}

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario { name: "txn fails", faults: |_, _| vec![(KvOp::Txn, down())], fenced: false },
        Scenario { name: "txn fails three times", faults: |_, _| vec![(KvOp::Txn, down()); 3], fenced: false },
        Scenario {
            name: "txn delayed",
            faults: |_, _| vec![(KvOp::Txn, Fault::Delay(Duration::from_millis(30)))],
            fenced: false,
        },
        Scenario {
            name: "not applied, reported ambiguous",
            faults: |_, _| vec![(KvOp::Txn, Fault::Fail(KvError::Ambiguous("timeout before send".into())))],
            fenced: false,
        },
        Scenario {
            name: "txn applied, reported ambiguous",
            faults: |_, _| vec![(KvOp::Txn, Fault::ApplyThenAmbiguous)],
            fenced: false,
        },
        Scenario {
            name: "ambiguous, then the first re-read fails",
            faults: |_, _| vec![(KvOp::Txn, Fault::ApplyThenAmbiguous), (KvOp::Get, down())],
            fenced: false,
        },
        Scenario {
            name: "ambiguous, then the second re-read fails",
            faults: |_, _| vec![(KvOp::Txn, Fault::ApplyThenAmbiguous), (KvOp::Get, pass()), (KvOp::Get, down())],
            fenced: false,
        },
        Scenario {
            name: "ambiguous, then the third re-read fails",
            faults: |_, _| {
                vec![
                    (KvOp::Txn, Fault::ApplyThenAmbiguous),
                    (KvOp::Get, pass()),
                    (KvOp::Get, pass()),
                    (KvOp::Get, down()),
                ]
            },
            fenced: false,
        },
        Scenario {
            name: "racing writer: a newer producer claims the view",
            faults: |_, s| vec![(KvOp::Txn, Fault::PutFirst(s.keys().producer_view(), encode_producer_view(VIEW + 1)))],
            fenced: true,
        },
    ]
}

/// For both writer modes and every scenario: the writer reports entries durable through its callbacks; a
/// reader (on the backend without faults) ends with exactly those entries, in order, at the stored boundary.
async fn failpoints_leave_the_reader_with_exactly_the_durable_log(f: Fixture) {
    for mode in [WriterMode::Batch, WriterMode::LegacyPerEntry] {
        for (i, sc) in scenarios().into_iter().enumerate() {
            let cluster = format!("{}{i}", if mode == WriterMode::Batch { "b" } else { "l" });
            let what = format!("{mode:?} / {}", sc.name);
            let s = f.storage_of(&cluster);
            s.claim_producer_view(VIEW).await.unwrap();
            let initial = if mode == WriterMode::Batch {
                s.init_durable_prefix().await.unwrap()
            } else {
                s.init_legacy().await.unwrap()
            };
            let mut p = Producer::new(s.clone(), initial, WriterConfig { mode, ..WriterConfig::default() });
            p.put(1);
            let mut durable = p.durable(1).await;
            for (op, fault) in (sc.faults)(&f, &s) {
                f.kv.inject_next(op, fault);
            }
            // Both slots first: once the faulted write starts, admission may close (that is the point).
            let (r2, r3) = (p.writer.reserve().unwrap(), p.writer.reserve().unwrap());
            p.commit(r2, 2).unwrap();
            let third = p.commit(r3, 3);
            if sc.fenced {
                // The writer may already be fenced when the third entry commits.
                assert!(matches!(third, Ok(3) | Err(WriterError::Terminal(StorageError::Fenced { .. }))), "{third:?}");
                eventually(&what, WAIT, || p.writer.status().terminal.is_some()).await;
                assert!(
                    matches!(p.writer.status().terminal, Some(StorageError::Fenced { .. })),
                    "{what}: {:?}",
                    p.writer.status()
                );
            } else {
                assert_eq!(third, Ok(3));
                durable.extend(p.durable(2).await);
                p.put(4);
                durable.extend(p.durable(1).await);
            }
            let status = p.writer.status();
            durable.extend(p.finish().await);
            f.kv.clear();
            let n = if sc.fenced { 1 } else { 4 };
            assert_eq!(durable, (1..=n).map(|i| (i, entry(i))).collect::<Vec<_>>(), "{what}: callbacks");
            assert_eq!(status.durable.last_seq, n, "{what}");

            let mut rec = Recorder::default();
            let mut reader = OpLogStandbyReader::new(f.clean_storage_of(&cluster));
            let r = reader.poll_once(&mut rec, 1024).await.unwrap();
            assert!(r.caught_up, "{what}");
            assert_eq!(rec.applied(), durable, "{what}: the reader holds exactly what was reported durable");
            let boundary = match r.prefix {
                Some(prefix) => prefix.last_seq,
                None => r.legacy_latest.unwrap(),
            };
            assert_eq!(boundary, n, "{what}: the stored boundary");
        }
    }
}

crate::on_all_backends!(
    cutover_from_a_legacy_log,
    cutover_races,
    failpoints_leave_the_reader_with_exactly_the_durable_log
);

#[test]
fn scenarios_are_distinct() {
    let names: std::collections::BTreeSet<_> = scenarios().iter().map(|s| s.name).collect();
    assert_eq!(names.len(), scenarios().len());
}
