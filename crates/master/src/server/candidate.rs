//! A master candidate (issue 15 §2): the RPC and admin servers are up from the start; the role loop decides
//! what they answer with.
//!
//! The loop: bootstrap a standby (`ha::role::bootstrap`: newest snapshot, reader after it) and follow the log
//! into a `ReplayState`, while campaigning whenever no master leads. Once the lease is won: stop following,
//! promote (`ha::role::promote`: claim the producer view, catch up to the durable prefix within the deadline),
//! build a fresh `MasterService` from the state, start its writer, snapshotter, background loop and NoF
//! heartbeat (one *term*), and serve under the lease. The term ends when the lease ends (expired, etcd says it
//! is gone, the view moved) or the writer stops for good (fenced); serving stops at once, the term is torn
//! down, and the loop bootstraps a standby again from the log — the term's state is never reused, so nothing
//! the deposed term did without making it durable survives.

use super::admin::{AdminServer, SnapshotSlot};
use super::hosts::Hosts;
use super::nof_heartbeat::{NofHeartbeat, NofProber, TransferProber};
use super::rpc::{RpcLimits, RpcMetrics, RpcServer, RpcServerHandle};
use super::target::{Elected, Target};
use crate::clock::Clock;
use crate::ha::role::{self, HaState, HaStatus};
use crate::ha::{OpLog, OpLogOptions, ReplayState, SnapshotOptions, SnapshotterHandle, master_storage, start_writing};
use crate::service::{BackgroundLoop, MasterConfig, MasterService};
use crescent_ha::leader::{Campaign, CoordError, LeaderCoordinator, LeaderSession};
use crescent_ha::oplog::{
    DurablePrefix, FollowerConfig, FollowerState, OpLogBatchStorage, OpLogStandbyReader, StandbyFollower,
};
use crescent_net::auth::Keyring;
use crescent_net::tls::Tls;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How a candidate campaigns and follows.
#[derive(Clone)]
pub struct CandidateOptions {
    /// Where leadership is decided.
    pub coordinator: Arc<dyn LeaderCoordinator>,
    /// The host others reach this master at (default: the listen IP; a wildcard's primary address).
    pub advertise: Option<String>,
    /// Deadline of promotion's final catch-up.
    pub catch_up_deadline: Duration,
    /// The standby's log follower.
    pub follow: FollowerConfig,
    /// Pause after a failed campaign or bootstrap, and the longest wait for a view change between campaigns.
    pub retry: Duration,
}

impl CandidateOptions {
    /// Defaults around `coordinator`: 30 s catch-up, a hot standby polling the log every 100 ms, 1 s retries.
    pub fn new(coordinator: Arc<dyn LeaderCoordinator>) -> Self {
        let follow = FollowerConfig { poll_interval: Duration::from_millis(100), ..FollowerConfig::default() };
        Self {
            coordinator,
            advertise: None,
            catch_up_deadline: role::DEFAULT_CATCH_UP_DEADLINE,
            follow,
            retry: Duration::from_secs(1),
        }
    }
}

impl std::fmt::Debug for CandidateOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandidateOptions")
            .field("coordinator", &self.coordinator.describe())
            .field("advertise", &self.advertise)
            .field("catch_up_deadline", &self.catch_up_deadline)
            .finish_non_exhaustive()
    }
}

/// What every term of a candidate is built from.
pub(super) struct TermConfig {
    pub config: MasterConfig,
    pub clock: Arc<dyn Clock>,
    pub oplog: OpLogOptions,
    pub snapshots: Option<SnapshotOptions>,
    pub background: bool,
    pub nof_prober: Option<Arc<dyn NofProber>>,
    pub keyring: Option<Arc<Keyring>>,
    /// The hosts' keys and the client claims (with a keyring), shared by every term.
    pub hosts: Option<Arc<Hosts>>,
    pub tls: Tls,
    /// The KV event stream every term reports to (one for the candidate's life: its ids are the log's).
    pub events: Option<Arc<crate::events::EventHub>>,
}

/// One term as leader: what runs while this candidate leads, torn down when it stops.
struct Term {
    svc: Arc<MasterService>,
    log: Arc<OpLog>,
    snapshotter: Option<SnapshotterHandle>,
    background: Option<BackgroundLoop>,
    nof_heartbeat: Option<NofHeartbeat>,
}

impl Term {
    /// Stops the term's tasks (the snapshotter first, the writer last: everything committed is written
    /// unless the writer was fenced).
    async fn end(self) {
        let Term { svc, log, snapshotter, background, nof_heartbeat } = self;
        if let Some(s) = snapshotter {
            s.stop().await;
        }
        drop(nof_heartbeat);
        if let Some(bg) = background {
            let _ = tokio::task::spawn_blocking(move || drop(bg)).await;
        }
        log.stop().await;
        // The last handle frees every object (seconds at millions of them): off the runtime's workers.
        let _ = tokio::task::spawn_blocking(move || drop(svc)).await;
    }
}

/// Runs CPU-bound work without holding up the tasks queued on this thread (the leader lease's keep-alive among
/// them): as `block_in_place` on a multi-threaded runtime, which hands them to another worker; inline on any other.
fn cpu_bound<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// A running candidate. Dropping it stops everything at once; [`CandidateServer::shutdown`] steps down,
/// drains the writer and gives the lease up first.
pub struct CandidateServer {
    elected: Arc<Elected>,
    rpc: RpcServerHandle,
    admin: Option<AdminServer>,
    advertised: SocketAddr,
    admin_advertised: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    task: RoleTask,
    /// The KV event publisher, stopped last.
    events: Option<crate::events::publisher::Publisher>,
}

/// The role loop's task, aborted when the server is dropped without a shutdown.
struct RoleTask(Option<tokio::task::JoinHandle<()>>);

impl Drop for RoleTask {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.abort();
        }
    }
}

impl std::fmt::Debug for CandidateServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandidateServer")
            .field("rpc", &self.advertised)
            .field("status", &self.elected.status())
            .finish_non_exhaustive()
    }
}

impl CandidateServer {
    /// Binds the servers and starts the role loop on the current runtime.
    pub(super) async fn start(
        term: TermConfig,
        options: CandidateOptions,
        rpc_addr: SocketAddr,
        admin_addr: Option<SocketAddr>,
        poll_window: Duration,
        limits: RpcLimits,
    ) -> Result<Self, super::StartError> {
        let storage = master_storage(&term.oplog)?;
        let elected = Elected::new(HaStatus::new(options.coordinator.describe()));
        let target = Target::Elected(elected.clone());
        let metrics = Arc::new(RpcMetrics::default());
        let bind = |what, addr| move |source| super::StartError::Bind { what, addr, source };
        let rpc = RpcServer::bind(rpc_addr, target.clone(), metrics.clone()).await.map_err(bind("rpc", rpc_addr))?;
        let bound = rpc.local_addr().map_err(bind("rpc", rpc_addr))?;
        let advertise = options.advertise.as_deref();
        let advertised = crescent_net::advertise::advertised(bound, advertise).map_err(bind("rpc", rpc_addr))?;
        let snapshots = SnapshotSlot::default();
        let admin = match admin_addr {
            Some(addr) => Some(
                AdminServer::start(
                    addr,
                    target,
                    metrics,
                    snapshots.clone(),
                    term.keyring.clone(),
                    term.tls.server.clone(),
                )
                .await
                .map_err(bind("admin", addr))?,
            ),
            None => None,
        };
        let admin_advertised = match &admin {
            Some(a) => Some(
                crescent_net::advertise::advertised(a.local_addr(), advertise)
                    .map_err(bind("admin", a.local_addr()))?,
            ),
            None => None,
        };
        let rpc = rpc
            .with_poll_window(poll_window)
            .with_limits(limits)
            .with_hosts(term.hosts.clone())
            .with_tls(term.tls.server.clone())
            .with_snapshots(term.snapshots.as_ref().map(|o| o.store.clone()))
            .spawn()
            .map_err(bind("rpc", rpc_addr))?;
        let (stop, stopped) = watch::channel(false);
        let role = RoleLoop {
            term,
            options,
            storage,
            elected: elected.clone(),
            snapshots,
            leader: advertised.to_string(),
            admin: admin_advertised.map(|a| a.to_string()),
        };
        let task = RoleTask(Some(tokio::spawn(role.run(stopped))));
        Ok(Self { elected, rpc, admin, advertised, admin_advertised, stop, task, events: None })
    }

    /// Where the RPC server listens.
    pub fn rpc_addr(&self) -> SocketAddr {
        self.rpc.local_addr()
    }

    /// The RPC address this candidate publishes when it leads.
    pub fn advertised(&self) -> SocketAddr {
        self.advertised
    }

    /// Where the admin HTTP listens, if it runs.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(AdminServer::local_addr)
    }

    /// The admin address this candidate publishes when it leads.
    pub fn admin_advertised(&self) -> Option<SocketAddr> {
        self.admin_advertised
    }

    /// The HA status now.
    pub fn status(&self) -> HaStatus {
        self.elected.status()
    }

    /// Changes of the HA status (tests and the CLI await conditions on it).
    pub fn subscribe(&self) -> watch::Receiver<HaStatus> {
        self.elected.subscribe()
    }

    /// What a request gets from this candidate while it does not lead.
    pub fn refusal(&self) -> crescent_proto::wire::ErrorFrame {
        self.elected.refusal()
    }

    /// The service of the current term, while this candidate leads.
    pub fn service(&self) -> Option<Arc<MasterService>> {
        Target::Elected(self.elected.clone()).route().ok().map(|s| Arc::clone(&s))
    }

    /// Steps down (a leader drains its writer and gives the lease up, so a standby takes over at once), then
    /// stops the servers, letting every connection finish the request in hand.
    pub async fn shutdown(self) {
        let CandidateServer { rpc, admin, stop, mut task, events, .. } = self;
        let _ = stop.send(true);
        if let Some(t) = task.0.take() {
            let _ = t.await;
        }
        rpc.shutdown().await;
        if let Some(admin) = admin {
            admin.shutdown().await;
        }
        if let Some(p) = events {
            p.stop().await;
        }
    }

    /// The endpoint its KV event stream is published on (the port chosen when 0 was asked for), if any.
    pub fn events_endpoint(&self) -> Option<&str> {
        self.events.as_ref().map(|p| p.endpoint())
    }

    /// Keeps the KV event publisher for the candidate's life (stopped at shutdown).
    pub(super) fn with_publisher(mut self, publisher: Option<crate::events::publisher::Publisher>) -> Self {
        self.events = publisher;
        self
    }
}

/// The role loop's state.
struct RoleLoop {
    term: TermConfig,
    options: CandidateOptions,
    storage: OpLogBatchStorage,
    elected: Arc<Elected>,
    /// Where the admin server shows the current term's snapshotter.
    snapshots: SnapshotSlot,
    /// The addresses this candidate publishes.
    leader: String,
    admin: Option<String>,
}

/// How a standby period ended.
enum Standby {
    /// Won the lease; the follower's reader and state to promote.
    Won(Box<(LeaderSession, OpLogStandbyReader, ReplayState)>),
    /// The follower failed closed: bootstrap again.
    Failed,
    /// Asked to stop.
    Stop,
}

impl RoleLoop {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                break;
            }
            let (session, reader, state) = match self.standby(&mut stop).await {
                Standby::Won(won) => *won,
                Standby::Failed => {
                    if sleep_or_stop(self.options.retry, &mut stop).await {
                        break;
                    }
                    continue;
                }
                Standby::Stop => break,
            };
            let view = session.view().version;
            let (term, prefix) = match self.promote(&session, reader, state).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(error = %e, view, "promotion failed: staying a standby");
                    self.set(|s| {
                        s.failed_promotions += 1;
                        s.last_error = Some(e);
                    });
                    session.release().await;
                    if sleep_or_stop(self.options.retry, &mut stop).await {
                        break;
                    }
                    continue;
                }
            };
            self.snapshots.set(term.snapshotter.as_ref().map(SnapshotterHandle::subscribe));
            self.elected.lead(term.svc.clone(), session.guard().clone());
            self.set(|s| {
                s.state = HaState::Leading;
                s.promotions += 1;
                s.view_version = view;
                s.leader = Some(self.leader.clone());
                s.leader_admin = self.admin.clone();
                s.applied_seq = prefix.last_seq;
                s.durable_seq = prefix.last_seq;
                s.lag = 0;
                s.last_error = None;
            });
            tracing::info!(view, seq = prefix.last_seq, leader = %self.leader, "promoted: serving as the leader");
            let stopping = self.serve(&term, &session, &mut stop).await;
            // Serving stops before anything is torn down: no request sees a half-stopped term.
            self.elected.step_down();
            self.snapshots.set(None);
            if !stopping {
                tracing::warn!(view, "stepped down: no longer the leader");
            }
            self.set(|s| {
                s.state = if stopping { HaState::Stopped } else { HaState::Bootstrapping };
                s.step_downs += 1;
                s.leader = None;
                s.leader_admin = None;
            });
            term.end().await;
            session.release().await;
            if stopping {
                break;
            }
            // A deposed leader gives the standbys a head start: one that has followed the log (and wakes within
            // a retry interval of the view emptying) takes over, rather than the master that just lost its lease
            // winning it back at once.
            if sleep_or_stop(self.options.retry * 2, &mut stop).await {
                break;
            }
        }
        self.set(|s| s.state = HaState::Stopped);
    }

    fn set(&self, f: impl FnOnce(&mut HaStatus)) {
        self.elected.update(f);
    }

    /// Promotes the standby's `state` under `session` and starts a term on it.
    async fn promote(
        &self,
        session: &LeaderSession,
        mut reader: OpLogStandbyReader,
        mut state: ReplayState,
    ) -> Result<(Term, DurablePrefix), String> {
        self.set(|s| s.state = HaState::Promoting);
        let view = session.view().version;
        let deadline = self.options.catch_up_deadline;
        let prefix = role::promote(&self.storage, view, &mut reader, &mut state, deadline, session.guard())
            .await
            .map_err(|e| e.to_string())?;
        // Restoring millions of objects takes seconds of CPU: off the runtime's workers, or the lease's
        // keep-alive starves behind it and the lease ends before the new leader serves its first request.
        let term = cpu_bound(|| self.start_term(state, prefix, view))?;
        Ok((term, prefix))
    }

    /// A standby period: bootstrap, follow the log, campaign whenever no master leads.
    async fn standby(&self, stop: &mut watch::Receiver<bool>) -> Standby {
        self.set(|s| s.state = HaState::Bootstrapping);
        let snapshots = self.term.snapshots.as_ref().map(|o| &*o.store);
        let (leader, retain) = (self.leader_snapshots(), self.term.snapshots.as_ref().map_or(1, |o| o.retain));
        let (reader, state) = match role::bootstrap(&self.storage, snapshots, Some(&leader), retain).await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "standby bootstrap failed; retrying");
                self.set(|s| {
                    s.state = HaState::Failed;
                    s.last_error = Some(e.to_string());
                });
                return Standby::Failed;
            }
        };
        let follower = StandbyFollower::new(reader, state, self.options.follow);
        let mut status = follower.subscribe();
        let (halt, halted) = tokio::sync::oneshot::channel::<()>();
        let follow = tokio::spawn(follower.run(async move {
            let _ = halted.await;
        }));
        self.set(|s| s.state = HaState::Following);
        let outcome = {
            let campaign = self.campaign();
            tokio::pin!(campaign);
            loop {
                tokio::select! {
                    session = &mut campaign => break Some(session),
                    changed = status.changed() => {
                        // The follower's task ended (it failed closed): bootstrap again.
                        if changed.is_err() {
                            break None;
                        }
                        {
                            let st = status.borrow_and_update().clone();
                            self.set(|s| {
                                s.applied_seq = st.reader.applied_seq;
                                s.durable_seq = st.reader.seen_prefix.map_or(0, |p| p.last_seq);
                                s.lag = st.reader.lag;
                                s.state = match &st.state {
                                    FollowerState::Retrying { .. } => HaState::Retrying,
                                    FollowerState::Failed(_) => HaState::Failed,
                                    _ => HaState::Following,
                                };
                                if let FollowerState::Retrying { last, .. } | FollowerState::Failed(last) = &st.state {
                                    s.last_error = Some(last.to_string());
                                }
                            });
                            if matches!(st.state, FollowerState::Failed(_)) {
                                break None;
                            }
                        }
                    }
                    _ = stop.changed() => break None,
                }
            }
        };
        let _ = halt.send(());
        let exit = follow.await;
        let stopping = *stop.borrow();
        let exit = match (outcome, exit) {
            (Some(session), Ok(exit)) if !stopping && exit.result.is_ok() => {
                return Standby::Won(Box::new((session, exit.reader, exit.applier)));
            }
            (outcome, exit) => {
                if let Some(session) = outcome {
                    // A won lease this candidate will not use: given up now, so another candidate (or this one,
                    // bootstrapped again) can win at once rather than once it expires — or never, for a
                    // coordinator without leases.
                    tracing::warn!(view = session.view().version, "giving up a won lease: not promoting");
                    session.release().await;
                }
                exit
            }
        };
        if stopping {
            return Standby::Stop;
        }
        match exit {
            Err(e) => {
                tracing::error!(error = %e, "standby follower task failed");
                Standby::Failed
            }
            Ok(exit) => match exit.result {
                Err(e) => {
                    tracing::error!(error = %e, "standby reader failed closed: bootstrapping again");
                    self.set(|s| {
                        s.state = HaState::Failed;
                        s.last_error = Some(e.to_string());
                    });
                    Standby::Failed
                }
                Ok(()) => Standby::Stop,
            },
        }
    }

    /// The leader, as a source of the snapshot a standby bootstraps from when its own do not reach the log.
    fn leader_snapshots(&self) -> super::snapshot_fetch::LeaderSnapshots {
        super::snapshot_fetch::LeaderSnapshots {
            coordinator: self.options.coordinator.clone(),
            credential: self.term.keyring.as_ref().map(|k| k.credential(crescent_proto::Principal::Admin)),
            tls: self.term.tls.client.clone(),
            own: self.leader.clone(),
        }
    }

    /// Campaigns until this candidate wins: while another leads, waits for the view to change. Cancel-safe: a
    /// campaign attempt dropped mid-way (the standby period ended) runs on, and a lease it wins is given up.
    async fn campaign(&self) -> LeaderSession {
        let coordinator = &self.options.coordinator;
        loop {
            let known = match coordinator.read_view().await {
                Ok(None) => match self.attempt().await {
                    Ok(Campaign::Won(session)) => return session,
                    Ok(Campaign::Lost(view)) => view,
                    Err(e) => {
                        self.campaign_failed(e.to_string()).await;
                        continue;
                    }
                },
                Ok(Some(view)) => Some(view),
                Err(e) => {
                    self.campaign_failed(e.to_string()).await;
                    continue;
                }
            };
            self.set(|s| {
                s.view_version = known.as_ref().map_or(0, |v| v.version);
                s.leader = known.as_ref().map(|v| v.leader.clone());
                s.leader_admin = known.as_ref().and_then(|v| v.admin.clone());
            });
            let version = known.as_ref().map_or(0, |v| v.version);
            if let Err(e) = coordinator.wait_view_change(version, self.options.retry).await {
                self.campaign_failed(e.to_string()).await;
            }
        }
    }

    /// One campaign attempt, on a task of its own: dropping this future (the standby period ended) leaves the
    /// attempt to finish, and a session it wins is released rather than dropped, so its lease does not outlive
    /// the attempt.
    async fn attempt(&self) -> Result<Campaign, CoordError> {
        let coordinator = Arc::clone(&self.options.coordinator);
        let (leader, admin) = (self.leader.clone(), self.admin.clone());
        Attempt(Some(tokio::spawn(async move { coordinator.campaign(&leader, admin.as_deref()).await }))).join().await
    }

    async fn campaign_failed(&self, error: String) {
        tracing::warn!(%error, "leader campaign failed; retrying");
        self.set(|s| s.last_error = Some(error));
        tokio::time::sleep(self.options.retry).await;
    }

    /// A fresh service restored from `state` (the log up to `prefix`), producing under `view`.
    fn start_term(&self, state: ReplayState, prefix: DurablePrefix, view: u64) -> Result<Term, String> {
        let t = &self.term;
        let svc = Arc::new(MasterService::new(t.config.clone(), t.clock.clone()).map_err(|c| c.to_string())?);
        let (log, (objects, segments), snapshotter) =
            start_writing(&self.storage, &t.oplog, t.snapshots.as_ref(), &svc, state, prefix, view)
                .map_err(|e| e.to_string())?;
        tracing::info!(objects, segments, view, "restored the promoted state");
        if let Some(hub) = &t.events {
            svc.attach_events(Arc::clone(hub)).map_err(|c| c.to_string())?;
        }
        let background = if t.background { Some(svc.spawn_background().map_err(|e| e.to_string())?) } else { None };
        let nof_heartbeat = t.background.then(|| {
            let timeout = Duration::from_millis(svc.config().nof_probe_timeout_ms);
            let prober = t.nof_prober.clone().unwrap_or_else(|| {
                let auth = t.hosts.clone().map(|h| (h, svc.clone()));
                Arc::new(TransferProber::new(timeout, auth, t.tls.client.clone()))
            });
            NofHeartbeat::spawn(svc.clone(), prober)
        });
        Ok(Term { svc, log, snapshotter, background, nof_heartbeat })
    }

    /// Serves until the lease ends, the writer stops for good, or a stop is asked (true).
    async fn serve(&self, term: &Term, session: &LeaderSession, stop: &mut watch::Receiver<bool>) -> bool {
        let mut check = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                () = session.guard().lost() => return false,
                _ = stop.changed() => return true,
                _ = check.tick() => {
                    let st = term.log.status();
                    self.set(|s| {
                        s.applied_seq = st.durable.last_seq;
                        s.durable_seq = st.durable.last_seq;
                    });
                    if let Some(t) = st.terminal {
                        tracing::error!(error = %t, "the oplog writer stopped for good: stepping down");
                        self.set(|s| s.last_error = Some(t.to_string()));
                        return false;
                    }
                }
            }
        }
    }
}

/// A campaign attempt in flight: if dropped before it is joined, a session it wins is released.
struct Attempt(Option<tokio::task::JoinHandle<Result<Campaign, CoordError>>>);

impl Attempt {
    /// The attempt's outcome; dropped before it arrives, the attempt is left to [`Drop`].
    async fn join(mut self) -> Result<Campaign, CoordError> {
        let joined = match self.0.as_mut() {
            Some(task) => task.await,
            None => return Err(CoordError::Unavailable("campaign attempt already joined".into())),
        };
        self.0 = None;
        joined.unwrap_or_else(|e| Err(CoordError::Unavailable(format!("campaign attempt failed: {e}"))))
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        let Some(task) = self.0.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            task.abort();
            return;
        };
        runtime.spawn(async move {
            if let Ok(Ok(Campaign::Won(session))) = task.await {
                tracing::warn!(view = session.view().version, "giving up a lease won by an abandoned campaign");
                session.release().await;
            }
        });
    }
}

/// Sleeps `d`; true if a stop was asked meanwhile.
async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => *stop.borrow(),
        _ = stop.changed() => true,
    }
}
