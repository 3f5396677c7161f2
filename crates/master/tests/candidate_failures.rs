//! A candidate that wins the lease but cannot use it gives the lease up and stays a standby that serves nothing
//! (issue 34 §3): a campaign abandoned because the standby's reader failed meanwhile is released, not dropped;
//! and each way a promotion fails — a stale view, the catch-up deadline passed, the reader halted on a corrupt
//! batch, the lease lost during catch-up — leaves a standby that refuses every request, its lease released.
//!
//! The coordinator is the in-process one behind a gate the test opens: a won campaign waits there, so the test
//! changes the log between the standby's last poll (it polls once an hour here) and the promotion's catch-up.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_ha::kv::{HaKvBackend, MemoryKv};
use crescent_ha::leader::coordinator::{CoordFuture, Release};
use crescent_ha::leader::{Campaign, LeaderCoordinator, LeaderSession, LocalCoordinator, MasterView};
use crescent_ha::oplog::{DurablePrefix, FollowerConfig, OpLogBatchRecord, OpLogBatchStorage, StorageConfig};
use crescent_master::ha::{HaState, MasterEntry, OpLogOptions, master_writer_config};
use crescent_master::server::{CandidateOptions, CandidateServer, MasterServer, NOT_LEADER};
use crescent_master::service::MasterConfig;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

mod common;
use common::until;

const WAIT: Duration = Duration::from_secs(20);
const CLUSTER: &str = "fail";

/// The in-process coordinator, with a gate a won campaign waits at and a count of the sessions released.
#[derive(Clone)]
struct Gated {
    inner: LocalCoordinator,
    /// A permit each time a campaign has won (and waits at the gate).
    won: Arc<Semaphore>,
    /// A permit lets one won campaign return.
    gate: Arc<Semaphore>,
    /// The view versions of the sessions won, and of those given up through `release` (not merely dropped).
    won_views: Arc<Mutex<Vec<u64>>>,
    released: Arc<Mutex<Vec<u64>>>,
    /// Depose (end the lease of) the next session as it passes the gate.
    depose_next: Arc<AtomicBool>,
}

impl Gated {
    fn new(after: u64) -> Self {
        Self {
            inner: LocalCoordinator::new(after),
            won: Arc::new(Semaphore::new(0)),
            gate: Arc::new(Semaphore::new(0)),
            won_views: Arc::default(),
            released: Arc::default(),
            depose_next: Arc::new(AtomicBool::new(false)),
        }
    }

    async fn await_win(&self) {
        tokio::time::timeout(WAIT, self.won.acquire()).await.expect("no campaign won").unwrap().forget();
    }

    fn released(&self) -> Vec<u64> {
        self.released.lock().unwrap().clone()
    }
}

impl LeaderCoordinator for Gated {
    fn read_view(&self) -> CoordFuture<'_, Option<MasterView>> {
        self.inner.read_view()
    }

    fn campaign<'a>(&'a self, leader: &'a str, admin: Option<&'a str>) -> CoordFuture<'a, Campaign> {
        Box::pin(async move {
            let session = match self.inner.campaign(leader, admin).await? {
                Campaign::Won(session) => session,
                lost => return Ok(lost),
            };
            self.won_views.lock().unwrap().push(session.view().version);
            self.won.add_permits(1);
            // Dropped while waiting here, the session is dropped with it (never released).
            self.gate.acquire().await.unwrap().forget();
            if self.depose_next.swap(false, Ordering::SeqCst) {
                self.inner.depose();
            }
            let (view, guard) = (session.view().clone(), session.guard().clone());
            let released = self.released.clone();
            let release: Release = Box::new(move || {
                Box::pin(async move {
                    released.lock().unwrap().push(session.view().version);
                    session.release().await;
                })
            });
            Ok(Campaign::Won(LeaderSession::new(view, guard, None, Some(release))))
        })
    }

    fn wait_view_change(&self, known: u64, timeout: Duration) -> CoordFuture<'_, Option<MasterView>> {
        self.inner.wait_view_change(known, timeout)
    }

    fn describe(&self) -> String {
        "gated in-process".into()
    }
}

fn storage(kv: &Arc<dyn HaKvBackend>) -> OpLogBatchStorage {
    OpLogBatchStorage::new(kv.clone(), CLUSTER, StorageConfig::default()).unwrap()
}

/// Writes `batches` one-entry batches after the durable prefix under producer view `view`.
async fn append(kv: &Arc<dyn HaKvBackend>, view: u64, batches: u64) -> DurablePrefix {
    let s = storage(kv);
    let mut prefix = s.init_durable_prefix().await.unwrap();
    s.claim_producer_view(view).await.unwrap();
    for _ in 0..batches {
        let seq = prefix.last_seq + 1;
        let entry = MasterEntry::Remove { tenant: String::new(), key: format!("gone{seq}") }.encode();
        let batch = OpLogBatchRecord::new(prefix.batch_id + 1, seq, vec![entry]).unwrap();
        prefix = s.write_batch(&batch, prefix, view).await.unwrap();
    }
    prefix
}

/// Makes the log's next batch unreadable: garbage at its key, the durable prefix moved over it.
async fn corrupt_next(kv: &Arc<dyn HaKvBackend>) {
    let s = storage(kv);
    let prefix = s.read_durable_prefix().await.unwrap().unwrap();
    let next = DurablePrefix { batch_id: prefix.batch_id + 1, last_seq: prefix.last_seq + 1 };
    kv.put(&s.keys().batch(next.batch_id), b"not a batch record").await.unwrap();
    kv.put(&s.keys().durable_prefix(), &next.encode()).await.unwrap();
}

/// A poll interval so long the standby polls only at the start of each standby period.
const ONCE: Duration = Duration::from_secs(3600);

async fn candidate(
    kv: &Arc<dyn HaKvBackend>,
    coordinator: &Gated,
    catch_up: Duration,
    poll: Duration,
) -> CandidateServer {
    let mut o = CandidateOptions::new(Arc::new(coordinator.clone()));
    o.follow = FollowerConfig { poll_interval: poll, ..FollowerConfig::default() };
    o.retry = Duration::from_millis(50);
    o.catch_up_deadline = catch_up;
    let oplog = OpLogOptions { kv: kv.clone(), cluster: CLUSTER.into(), writer: master_writer_config() };
    MasterServer::builder(MasterConfig::default())
        .background(false)
        .oplog(Some(oplog))
        .start_candidate(o)
        .await
        .unwrap()
}

/// A standby that serves nothing: never promoted, no service, requests refused as not-leader.
fn assert_standby(c: &CandidateServer) {
    let st = c.status();
    assert!(!st.is_leader() && st.promotions == 0, "{st:?}");
    assert!(c.service().is_none(), "a standby serves nothing");
    assert_eq!(c.refusal().code, NOT_LEADER);
}

/// Waits until the `n`th won session was released.
async fn released(g: &Gated, n: usize) {
    let ok = crescent_testkit::eventually(WAIT, || async {
        let won = g.won_views.lock().unwrap().get(n - 1).copied();
        won.is_some_and(|v| g.released().contains(&v))
    })
    .await;
    assert!(ok, "won session {n} not released: won {:?}, released {:?}", g.won_views.lock().unwrap(), g.released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_won_campaign_abandoned_when_the_reader_fails_is_released() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let held = append(&kv, 1, 3).await;
    let g = Gated::new(1);
    let c = candidate(&kv, &g, Duration::from_secs(30), Duration::from_millis(10)).await;
    until(&c, "follows", |s| s.applied_seq == held.last_seq).await;
    g.await_win().await;
    // The log breaks while the won campaign has not answered yet: the reader fails closed and the standby period
    // ends, abandoning the campaign. The lease it won must be given up, not left behind.
    corrupt_next(&kv).await;
    until(&c, "the reader failed", |s| s.state == HaState::Failed).await;
    g.gate.add_permits(1);
    released(&g, 1).await;
    assert_eq!(c.status().failed_promotions, 0, "given up without a promotion");
    assert_standby(&c);
    c.shutdown().await;
}

/// Promotion claims producer view = the view version first: a log already claimed by a newer producer fences
/// it. The candidate stays a standby and gives each lease up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_view_fails_promotion() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    append(&kv, 1_000, 2).await;
    let g = Gated::new(0);
    g.gate.add_permits(2);
    let c = candidate(&kv, &g, Duration::from_secs(30), ONCE).await;
    let st = until(&c, "two failed promotions", |s| s.failed_promotions >= 2).await;
    assert!(st.last_error.as_deref().is_some_and(|e| e.contains("fenced")), "{st:?}");
    released(&g, 2).await;
    assert_standby(&c);
    assert_eq!(storage(&kv).read_producer_view().await.unwrap(), Some(1_000), "the newer producer keeps the log");
    c.shutdown().await;
}

/// The log moved after the standby's last poll, and the catch-up deadline passes before it is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_past_its_deadline_fails_promotion() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let held = append(&kv, 1, 2).await;
    let g = Gated::new(1);
    let c = candidate(&kv, &g, Duration::ZERO, ONCE).await;
    until(&c, "follows", |s| s.applied_seq == held.last_seq).await;
    g.await_win().await;
    append(&kv, 1, 3).await;
    g.gate.add_permits(1);
    let st = until(&c, "a failed promotion", |s| s.failed_promotions == 1).await;
    assert!(st.last_error.as_deref().is_some_and(|e| e.contains("incomplete oplog catch-up")), "{st:?}");
    released(&g, 1).await;
    assert_standby(&c);
    c.shutdown().await;
}

/// The batch the catch-up must apply is corrupt: the reader halts, the promotion fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_halted_on_a_corrupt_batch_fails_promotion() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let held = append(&kv, 1, 2).await;
    let g = Gated::new(1);
    let c = candidate(&kv, &g, Duration::from_secs(30), ONCE).await;
    until(&c, "follows", |s| s.applied_seq == held.last_seq).await;
    g.await_win().await;
    corrupt_next(&kv).await;
    g.gate.add_permits(1);
    let st = until(&c, "a failed promotion", |s| s.failed_promotions == 1).await;
    assert!(st.last_error.as_deref().is_some_and(|e| e.contains("corrupt")), "{st:?}");
    released(&g, 1).await;
    assert_standby(&c);
    c.shutdown().await;
}

/// The lease ends (deposed) while the promotion catches up on what the log gained after the standby's last poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_during_catch_up_fails_promotion() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let held = append(&kv, 1, 2).await;
    let g = Gated::new(1);
    let c = candidate(&kv, &g, Duration::from_secs(30), ONCE).await;
    until(&c, "follows", |s| s.applied_seq == held.last_seq).await;
    g.await_win().await;
    append(&kv, 1, 3).await;
    g.depose_next.store(true, Ordering::SeqCst);
    g.gate.add_permits(1);
    let st = until(&c, "a failed promotion", |s| s.failed_promotions == 1).await;
    assert!(st.last_error.as_deref().is_some_and(|e| e.contains("lease ended")), "{st:?}");
    released(&g, 1).await;
    assert_standby(&c);
    c.shutdown().await;
}
