//! `StandbyFollower` (reference §6.3): polling on an interval, back-off while retryable, a retry window that
//! progress resets and past which the follower fails, fatal errors ending the loop, and the stop signal — on a
//! paused tokio clock with the in-memory backend. Then the outage test on a real etcd: the server is stopped for
//! several seconds mid-load and restarted on the same data directory.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{Recorder, entry, eventually};
use crescent_ha::kv::{Fault, FaultyKv, HaKvBackend, KvError, KvOp, MemoryKv};
use crescent_ha::oplog::{
    DurablePrefix, FollowerConfig, FollowerState, FollowerStatus, OpLogBatchStorage, OpLogEntry, OpLogStandbyReader,
    OrderedOpLogWriter, StandbyError, StandbyFollower, StorageConfig, WriterConfig, WriterError,
};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};

const VIEW: u64 = 1;

fn config() -> FollowerConfig {
    FollowerConfig {
        poll_interval: Duration::from_secs(1),
        max_batches_per_poll: 1024,
        retry_max: Duration::from_secs(5),
        retry_window: Duration::from_secs(30),
    }
}

struct Rig {
    kv: Arc<FaultyKv<Arc<dyn HaKvBackend>>>,
    storage: OpLogBatchStorage,
    prefix: DurablePrefix,
}

impl Rig {
    async fn new() -> Self {
        let inner: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
        let kv = Arc::new(FaultyKv::new(inner));
        let storage = OpLogBatchStorage::new(kv.clone(), "c", StorageConfig::default()).unwrap();
        let prefix = storage.init_durable_prefix().await.unwrap();
        storage.claim_producer_view(VIEW).await.unwrap();
        Self { kv, storage, prefix }
    }

    /// Appends a batch of `n` entries through the storage protocol (the writer's own tests cover the writer).
    async fn append(&mut self, n: u64) {
        let b = common::batch(self.prefix.batch_id + 1, self.prefix.last_seq + 1, n);
        // Around the fault wrapper: faults scheduled for the follower must not hit the test's own writes.
        let clean = OpLogBatchStorage::new(self.kv.inner().clone(), "c", StorageConfig::default()).unwrap();
        self.prefix = clean.write_batch(&b, self.prefix, VIEW).await.unwrap();
    }
}

async fn wait_status(rx: &mut watch::Receiver<FollowerStatus>, what: &str, f: impl FnMut(&FollowerStatus) -> bool) {
    tokio::time::timeout(Duration::from_secs(600), rx.wait_for(f)).await.unwrap_or_else(|_| panic!("{what}")).unwrap();
}

#[tokio::test(start_paused = true)]
async fn follows_applies_and_stops_on_request() {
    let mut rig = Rig::new().await;
    rig.append(2).await;
    let rec = Recorder::default();
    let follower = StandbyFollower::new(OpLogStandbyReader::new(rig.storage.clone()), rec.clone(), config());
    let mut status = follower.subscribe();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(follower.run(async move {
        let _ = stop_rx.await;
    }));
    wait_status(&mut status, "first batch applied", |s| s.reader.applied_seq == 2).await;
    let polls = status.borrow().polls;
    rig.append(3).await;
    wait_status(&mut status, "second batch applied", |s| s.reader.applied_seq == 5).await;
    assert_eq!(status.borrow().polls, polls + 1, "the next poll, one interval later, picked it up");
    stop_tx.send(()).unwrap();
    let exit = task.await.unwrap();
    assert_eq!(exit.result, Ok(()));
    assert_eq!(status.borrow().state, FollowerState::Stopped);
    assert_eq!(rec.seqs(), (1..=5).collect::<Vec<_>>());
    assert_eq!(exit.reader.applied_seq(), 5);
}

/// A backlog larger than a poll's page is read poll after poll without waiting an interval between pages.
#[tokio::test(start_paused = true)]
async fn a_backlog_is_read_without_waiting_between_pages() {
    let mut rig = Rig::new().await;
    for _ in 0..5 {
        rig.append(1).await;
    }
    let rec = Recorder::default();
    let config = FollowerConfig { max_batches_per_poll: 2, ..config() };
    let follower = StandbyFollower::new(OpLogStandbyReader::new(rig.storage.clone()), rec.clone(), config);
    let mut status = follower.subscribe();
    let start = tokio::time::Instant::now();
    let task = tokio::spawn(follower.run(std::future::pending()));
    wait_status(&mut status, "caught up", |s| s.reader.applied_seq == 5).await;
    assert_eq!(start.elapsed(), Duration::ZERO, "three pages, no interval between them");
    assert_eq!(status.borrow().polls, 3);
    task.abort();
}

/// Property 16 (loop half): retryable errors back off poll_interval × 2ⁿ capped at retry_max; past the window
/// the follower fails. With a 1 s interval, a 5 s cap and a 30 s window the polls fail at 0, 1, 3, 7, 12, 17,
/// 22, 27 and 32 s; the ninth exceeds the window.
#[tokio::test(start_paused = true)]
async fn the_retry_window_expires_into_a_fatal_error() {
    let rig = Rig::new().await;
    rig.kv.inject_every(KvOp::Get, Fault::Fail(KvError::Unavailable("etcd down".into())));
    let follower = StandbyFollower::new(OpLogStandbyReader::new(rig.storage.clone()), Recorder::default(), config());
    let status = follower.subscribe();
    let gets = rig.kv.calls(KvOp::Get);
    let start = tokio::time::Instant::now();
    let exit = follower.run(std::future::pending()).await;
    let Err(StandbyError::RetryWindowExpired { waited, window, last }) = exit.result else {
        panic!("{:?}", exit.result)
    };
    assert_eq!((waited, window), (Duration::from_secs(32), Duration::from_secs(30)));
    assert!(last.is_retryable());
    assert_eq!(start.elapsed(), Duration::from_secs(32));
    assert_eq!(status.borrow().polls, 9);
    assert!(matches!(status.borrow().state, FollowerState::Failed(StandbyError::RetryWindowExpired { .. })));
    assert_eq!(rig.kv.calls(KvOp::Get) - gets, 9, "one prefix read per poll");
}

/// Progress resets the window: 20 s of failures, progress, 20 s more of failures (40 s in all, more than the
/// 30 s window) and the follower is still following.
#[tokio::test(start_paused = true)]
async fn progress_resets_the_retry_window() {
    let mut rig = Rig::new().await;
    let rec = Recorder::default();
    let follower = StandbyFollower::new(OpLogStandbyReader::new(rig.storage.clone()), rec.clone(), config());
    let mut status = follower.subscribe();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(follower.run(async move {
        let _ = stop_rx.await;
    }));
    for round in 1..=2u64 {
        rig.kv.inject_every(KvOp::Get, Fault::Fail(KvError::Unavailable("etcd down".into())));
        wait_status(
            &mut status,
            "failing for 20 s",
            |s| matches!(&s.state, FollowerState::Retrying { elapsed, .. } if *elapsed >= Duration::from_secs(20)),
        )
        .await;
        rig.kv.clear();
        rig.append(1).await;
        wait_status(&mut status, "progress", |s| s.reader.applied_seq == round && s.state == FollowerState::Following)
            .await;
    }
    stop_tx.send(()).unwrap();
    assert_eq!(task.await.unwrap().result, Ok(()));
    assert_eq!(rec.seqs(), vec![1, 2]);
}

/// A fatal poll ends the loop at once (no retries) and the reader handed back refuses to poll.
#[tokio::test(start_paused = true)]
async fn a_fatal_poll_ends_the_loop() {
    let mut rig = Rig::new().await;
    rig.append(1).await;
    rig.kv.inner().put(&rig.storage.keys().durable_prefix(), b"garbage").await.unwrap();
    let follower = StandbyFollower::new(OpLogStandbyReader::new(rig.storage.clone()), Recorder::default(), config());
    let status = follower.subscribe();
    let start = tokio::time::Instant::now();
    let mut exit = follower.run(std::future::pending()).await;
    assert!(matches!(exit.result, Err(StandbyError::Corrupt(_))), "{:?}", exit.result);
    assert_eq!(start.elapsed(), Duration::ZERO, "no back-off on a fatal error");
    assert_eq!(status.borrow().polls, 1);
    let mut rec = Recorder::default();
    assert!(matches!(exit.reader.poll_once(&mut rec, 1).await, Err(StandbyError::Halted(_))));
}

/// etcd is stopped for several seconds mid-load and restarted on the same data directory and ports. While it is
/// down, admission closes with a clear error; the stuck batch is retried, not skipped; afterwards every
/// committed entry becomes durable exactly once, in order, and a standby follower (its own connection) applying
/// into a recording applier ends with exactly the committed sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_outage_mid_load() {
    let mut server = tokio::task::spawn_blocking(crescent_ha::testing::EtcdServer::start)
        .await
        .unwrap()
        .expect("etcd must start for this test (install etcd-server or set CRESCENT_ETCD_BIN)");
    let writer_kv: Arc<dyn HaKvBackend> = Arc::new(server.connect().await.unwrap());
    let reader_kv: Arc<dyn HaKvBackend> = Arc::new(server.connect().await.unwrap());
    let storage = OpLogBatchStorage::new(writer_kv, "c", StorageConfig::default()).unwrap();
    let prefix = storage.init_durable_prefix().await.unwrap();
    storage.claim_producer_view(VIEW).await.unwrap();
    let writer = Arc::new(OrderedOpLogWriter::new(
        storage,
        VIEW,
        prefix,
        WriterConfig { retry_max: Duration::from_millis(200), ..WriterConfig::default() },
    ));
    writer.start();

    let rec = Recorder::default();
    let follower = StandbyFollower::new(
        OpLogStandbyReader::new(OpLogBatchStorage::new(reader_kv, "c", StorageConfig::default()).unwrap()),
        rec.clone(),
        FollowerConfig {
            poll_interval: Duration::from_millis(50),
            retry_max: Duration::from_millis(500),
            retry_window: Duration::from_secs(120),
            ..FollowerConfig::default()
        },
    );
    let mut follower_status = follower.subscribe();
    let (stop_follower, stop_rx) = oneshot::channel::<()>();
    let follower_task = tokio::spawn(follower.run(async move {
        let _ = stop_rx.await;
    }));

    // Producers: commit entries as fast as admission allows, remembering what each sequence number carries and
    // every admission error (the load continues through the outage).
    let committed: Arc<Mutex<BTreeMap<u64, OpLogEntry>>> = Arc::default();
    let durable: Arc<Mutex<Vec<u64>>> = Arc::default();
    let refusals: Arc<Mutex<Vec<WriterError>>> = Arc::default();
    let (stop_load, load_stopped) = watch::channel(false);
    let mut producers = Vec::new();
    for t in 0..4u64 {
        let (w, committed, durable, refusals, stop) =
            (writer.clone(), committed.clone(), durable.clone(), refusals.clone(), load_stopped.clone());
        producers.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !*stop.borrow() {
                match w.reserve() {
                    Ok(r) => {
                        let e = entry(t * 1_000_000 + i);
                        i += 1;
                        // Hold the map lock across commit so the map sees sequence numbers in commit order.
                        let mut map = committed.lock();
                        let d = durable.clone();
                        let seq = w
                            .commit(r, e.clone(), Some(Box::new(move |s| d.lock().push(s))))
                            .expect("a reserved slot commits");
                        map.insert(seq, e);
                    }
                    Err(err) => refusals.lock().push(err),
                }
                // Pacing of the workload, not synchronisation.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    let load = |n: usize| {
        let durable = durable.clone();
        move || durable.lock().len() >= n
    };
    eventually("load before the outage", Duration::from_secs(30), load(200)).await;

    tokio::task::block_in_place(|| server.stop());
    eventually("admission closes while etcd is down", Duration::from_secs(30), || !writer.is_accepting()).await;
    assert!(matches!(writer.reserve(), Err(WriterError::Unavailable)));
    assert!(WriterError::Unavailable.to_string().contains("not accepting"), "a clear error");
    let st = writer.status();
    assert!(st.last_error.is_some() && st.in_flight, "the stuck batch is in flight and retried: {st:?}");
    // The outage itself: etcd stays down for several seconds while the load continues.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during = writer.status();
    assert!(during.failed_attempts > st.failed_attempts, "retried while down: {during:?}");
    assert_eq!(during.durable, st.durable, "nothing became durable while etcd was down");
    assert!(refusals.lock().iter().all(|e| matches!(e, WriterError::Unavailable | WriterError::QueueFull(_))));
    assert!(refusals.lock().iter().any(|e| matches!(e, WriterError::Unavailable)), "producers were refused");

    tokio::task::block_in_place(|| server.restart()).expect("etcd restarts on the same data directory");
    eventually("admission reopens after etcd is back", Duration::from_secs(60), || writer.is_accepting()).await;
    let after = durable.lock().len();
    eventually("load after the outage", Duration::from_secs(60), load(after + 200)).await;
    stop_load.send(true).unwrap();
    for p in producers {
        p.await.unwrap();
    }
    writer.stop().await;

    let committed = committed.lock().clone();
    let durable = durable.lock().clone();
    let n = committed.len() as u64;
    assert_eq!(durable, (1..=n).collect::<Vec<_>>(), "every committed entry durable once, in order");
    assert_eq!(writer.status().durable.last_seq, n);
    wait_status(&mut follower_status, "the standby catches up", |s| s.reader.applied_seq == n).await;
    stop_follower.send(()).unwrap();
    let exit = follower_task.await.unwrap();
    assert_eq!(exit.result, Ok(()), "the standby survived the outage");
    let expected: Vec<(u64, OpLogEntry)> = committed.into_iter().collect();
    assert_eq!(rec.applied(), expected, "the standby applied exactly the committed sequence");
}
