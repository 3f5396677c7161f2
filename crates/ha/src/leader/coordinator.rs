//! Who may lead: the [`LeaderCoordinator`] seam a master candidate campaigns through (reference §7), its
//! in-process implementation [`LocalCoordinator`] (one process's candidates; with one candidate, the
//! single-node coordinator of the embedded mode), and the etcd one (`super::etcd`, feature `etcd`).
//!
//! A won campaign is a [`LeaderSession`]: the [`MasterView`] the leader published and a [`LeaseGuard`] that
//! says, synchronously and on every request, whether the leader may still act. The guard expires on the
//! leader's own clock *before* the lease can expire in the store (renewals extend it by less than the TTL),
//! so a leader that stalls (a `SIGSTOP`, a long pause) has stopped serving by the time another can be
//! elected; a lease the store reports gone, or a view that moved to someone else, ends it at once.

use super::view::MasterView;
use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A boxed future of a coordinator call.
pub type CoordFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, CoordError>> + Send + 'a>>;

/// Why a coordinator call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoordError {
    /// The store is unreachable or timed out (retry later).
    #[error("leader coordinator unavailable: {0}")]
    Unavailable(String),
    /// The stored view cannot be read (a malformed value).
    #[error("leader coordinator: {0}")]
    Malformed(String),
}

/// What a campaign found.
#[derive(Debug)]
pub enum Campaign {
    /// This candidate leads, under the session.
    Won(LeaderSession),
    /// Another leads (its view, if it could be read).
    Lost(Option<MasterView>),
}

/// How candidates agree on one leader per cluster.
pub trait LeaderCoordinator: Send + Sync + 'static {
    /// The current view (`None`: no master leads).
    fn read_view(&self) -> CoordFuture<'_, Option<MasterView>>;

    /// Publishes `leader` (and `admin`) as the view if no master leads; the session holds it under a lease.
    fn campaign<'a>(&'a self, leader: &'a str, admin: Option<&'a str>) -> CoordFuture<'a, Campaign>;

    /// Waits until the view differs from version `known` (0: none) or `timeout` passes; returns the view then.
    fn wait_view_change(&self, known: u64, timeout: Duration) -> CoordFuture<'_, Option<MasterView>>;

    /// Where the coordinator keeps the view (for logs and `/health`).
    fn describe(&self) -> String;
}

/// Whether a leader may still act: a deadline on the local clock, extended by each renewal, or ended at once.
/// Cheap to clone and to check (two atomic loads and a clock read).
#[derive(Clone)]
pub struct LeaseGuard {
    inner: Arc<GuardInner>,
}

struct GuardInner {
    /// The clock origin `until_ns` counts from.
    base: Instant,
    /// Nanoseconds after `base` until which the lease is surely held.
    until_ns: AtomicU64,
    lost: AtomicBool,
    changed: Notify,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard").field("holds", &self.holds()).field("left", &self.left()).finish()
    }
}

impl LeaseGuard {
    /// A guard that holds until `until` unless extended or ended.
    pub fn until(until: Instant) -> Self {
        let base = Instant::now();
        let guard = Self {
            inner: Arc::new(GuardInner {
                base,
                until_ns: AtomicU64::new(0),
                lost: AtomicBool::new(false),
                changed: Notify::new(),
            }),
        };
        guard.extend_to(until);
        guard
    }

    /// A guard with no deadline (a coordinator without leases: it ends only when ended).
    pub fn unbounded() -> Self {
        Self::until(Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600))
    }

    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.inner.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether the lease is held now.
    pub fn holds(&self) -> bool {
        !self.inner.lost.load(Ordering::Acquire)
            && self.ns(Instant::now()) < self.inner.until_ns.load(Ordering::Acquire)
    }

    /// Time left before the guard expires unless renewed (zero once it does not hold).
    pub fn left(&self) -> Duration {
        if self.inner.lost.load(Ordering::Acquire) {
            return Duration::ZERO;
        }
        let until = self.inner.until_ns.load(Ordering::Acquire);
        Duration::from_nanos(until.saturating_sub(self.ns(Instant::now())))
    }

    /// Extends the deadline to `until` (never shortens it; does nothing once ended).
    pub fn extend_to(&self, until: Instant) {
        self.inner.until_ns.fetch_max(self.ns(until), Ordering::AcqRel);
    }

    /// Ends the lease now (lost, released, or the view moved).
    pub fn end(&self) {
        if !self.inner.lost.swap(true, Ordering::AcqRel) {
            self.inner.changed.notify_waiters();
        }
    }

    /// Resolves once the guard no longer holds (ended, or expired without renewal).
    pub async fn lost(&self) {
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.holds() {
                self.end();
                return;
            }
            let until = self.inner.base + Duration::from_nanos(self.inner.until_ns.load(Ordering::Acquire));
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = changed => {}
            }
        }
    }
}

/// What a session does when released: give the lease up in the store (so the view goes at once).
pub type Release = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A won campaign: the published view and the lease it is held under. Dropping the session stops renewing
/// (the lease then ends at its TTL); [`LeaderSession::release`] gives it up at once.
pub struct LeaderSession {
    view: MasterView,
    guard: LeaseGuard,
    release: Option<Release>,
    /// The renewal task, stopped when the session goes.
    renewer: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for LeaderSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderSession").field("view", &self.view).field("guard", &self.guard).finish()
    }
}

impl LeaderSession {
    /// A session on `view` guarded by `guard`, renewed by `renewer`, given up by `release`.
    pub fn new(
        view: MasterView,
        guard: LeaseGuard,
        renewer: Option<tokio::task::JoinHandle<()>>,
        release: Option<Release>,
    ) -> Self {
        Self { view, guard, release, renewer }
    }

    /// The view this leader published (its version is the producer view it claims).
    pub fn view(&self) -> &MasterView {
        &self.view
    }

    /// The lease guard (clone it to check on every request).
    pub fn guard(&self) -> &LeaseGuard {
        &self.guard
    }

    /// Gives the lease up: the guard ends at once, then the store forgets the view.
    pub async fn release(mut self) {
        self.guard.end();
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
        if let Some(release) = self.release.take() {
            release().await;
        }
    }
}

impl Drop for LeaderSession {
    fn drop(&mut self) {
        self.guard.end();
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
    }
}

/// Candidates of one process agreeing on a leader: the single-node coordinator of the embedded mode (one
/// candidate always wins) and the in-memory seam for tests of several candidates. No lease: a session holds
/// until released or [`LocalCoordinator::depose`]d. View versions count up from the one given.
#[derive(Clone)]
pub struct LocalCoordinator {
    shared: Arc<LocalShared>,
}

struct LocalShared {
    state: Mutex<LocalState>,
    changed: Notify,
}

struct LocalState {
    current: Option<(MasterView, LeaseGuard)>,
    last_version: u64,
}

impl std::fmt::Debug for LocalCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCoordinator").field("view", &self.view()).finish()
    }
}

impl LocalCoordinator {
    /// A coordinator whose first leader gets view version `after + 1` (pass the oplog's producer view, so a
    /// leader's claim is above every earlier one).
    pub fn new(after: u64) -> Self {
        let state = Mutex::new(LocalState { current: None, last_version: after });
        Self { shared: Arc::new(LocalShared { state, changed: Notify::new() }) }
    }

    /// The current view.
    pub fn view(&self) -> Option<MasterView> {
        let mut s = self.shared.state.lock();
        if s.current.as_ref().is_some_and(|(_, g)| !g.holds()) {
            s.current = None;
        }
        s.current.as_ref().map(|(v, _)| v.clone())
    }

    /// Ends the current leader's lease (as an expired lease would), so another may win.
    pub fn depose(&self) {
        if let Some((_, guard)) = self.shared.state.lock().current.take() {
            guard.end();
        }
        self.shared.changed.notify_waiters();
    }

    fn release_version(&self, version: u64) {
        let mut s = self.shared.state.lock();
        if s.current.as_ref().is_some_and(|(v, _)| v.version == version) {
            s.current = None;
        }
        drop(s);
        self.shared.changed.notify_waiters();
    }
}

impl LeaderCoordinator for LocalCoordinator {
    fn read_view(&self) -> CoordFuture<'_, Option<MasterView>> {
        Box::pin(async move { Ok(self.view()) })
    }

    fn campaign<'a>(&'a self, leader: &'a str, admin: Option<&'a str>) -> CoordFuture<'a, Campaign> {
        Box::pin(async move {
            let mut s = self.shared.state.lock();
            if s.current.as_ref().is_some_and(|(_, g)| !g.holds()) {
                s.current = None;
            }
            if let Some((v, _)) = &s.current {
                return Ok(Campaign::Lost(Some(v.clone())));
            }
            s.last_version += 1;
            let view =
                MasterView { leader: leader.to_owned(), admin: admin.map(str::to_owned), version: s.last_version };
            let guard = LeaseGuard::unbounded();
            s.current = Some((view.clone(), guard.clone()));
            drop(s);
            self.shared.changed.notify_waiters();
            let this = self.clone();
            let version = view.version;
            let release: Release = Box::new(move || {
                Box::pin(async move {
                    this.release_version(version);
                })
            });
            Ok(Campaign::Won(LeaderSession::new(view, guard, None, Some(release))))
        })
    }

    fn wait_view_change(&self, known: u64, timeout: Duration) -> CoordFuture<'_, Option<MasterView>> {
        Box::pin(async move {
            let deadline = Instant::now() + timeout;
            loop {
                let changed = self.shared.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                let view = self.view();
                if view.as_ref().map_or(0, |v| v.version) != known {
                    return Ok(view);
                }
                if tokio::time::timeout_at(deadline, changed).await.is_err() {
                    return Ok(view);
                }
            }
        })
    }

    fn describe(&self) -> String {
        "in-process".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_guard_expires_unless_renewed_and_ends_at_once_when_told() {
        let g = LeaseGuard::until(Instant::now() + Duration::from_secs(2));
        assert!(g.holds());
        tokio::time::advance(Duration::from_millis(1500)).await;
        g.extend_to(Instant::now() + Duration::from_secs(2));
        g.extend_to(Instant::now());
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert!(g.holds(), "renewed: 500 ms left, an earlier deadline does not shorten it");
        let lost = tokio::spawn({
            let g = g.clone();
            async move { g.lost().await }
        });
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(!g.holds());
        lost.await.unwrap();
        let g = LeaseGuard::unbounded();
        g.end();
        assert!(!g.holds());
        assert_eq!(g.left(), Duration::ZERO);
        g.extend_to(Instant::now() + Duration::from_secs(10));
        assert!(!g.holds(), "an ended lease stays ended");
    }

    #[tokio::test]
    async fn local_candidates_get_one_leader_at_a_time_and_versions_rise() {
        let c = LocalCoordinator::new(7);
        let Campaign::Won(a) = c.campaign("a:1", None).await.unwrap() else { panic!("first candidate lost") };
        assert_eq!(a.view().version, 8);
        match c.campaign("b:1", None).await.unwrap() {
            Campaign::Lost(Some(v)) => assert_eq!(v.leader, "a:1"),
            other => panic!("{other:?}"),
        }
        let guard = a.guard().clone();
        c.depose();
        assert!(!guard.holds(), "deposed: the old leader's guard ends");
        assert_eq!(c.wait_view_change(8, Duration::from_secs(1)).await.unwrap(), None);
        let Campaign::Won(b) = c.campaign("b:1", Some("b:2")).await.unwrap() else { panic!("b lost") };
        assert_eq!(b.view().version, 9);
        // The deposed session's release does not remove the new leader.
        a.release().await;
        assert_eq!(c.view().map(|v| v.leader), Some("b:1".to_owned()));
        b.release().await;
        assert_eq!(c.view(), None);
    }
}
