//! [`MasterServer`]: the one way to run a master — its service, background loop, NoF heartbeat, RPC server and
//! admin HTTP — used alike by `crescent master`, `crescent up`, tests and benchmarks.

use super::admin::{AdminServer, SnapshotSlot};
use super::candidate::{CandidateOptions, CandidateServer, TermConfig};
use super::hosts::Hosts;
use super::nof_heartbeat::{NofHeartbeat, NofProber, TransferProber};
use super::rpc::{RpcLimits, RpcMetrics, RpcServer, RpcServerHandle};
use super::target::Target;
use crate::clock::{Clock, SystemClock};
use crate::events::publisher::Publisher;
use crate::events::{EventHub, EventsConfig};
use crate::ha::{OpLog, OpLogOptions, SnapshotOptions, SnapshotterHandle};
use crate::service::{BackgroundLoop, MasterConfig, MasterService};
use crescent_net::auth::Keyring;
use crescent_net::tls::Tls;
use crescent_proto::ErrorCode;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Why a master did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error("invalid master configuration: {0}")]
    Config(ErrorCode),
    /// An address could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// The background loop's thread could not start.
    #[error("cannot start the background loop: {0}")]
    Background(io::Error),
    /// The oplog could not be replayed or opened for writing.
    #[error("oplog: {0}")]
    OpLog(#[from] crate::ha::OpenError),
    /// A candidate was asked for without an oplog to follow and write.
    #[error("a master candidate needs an oplog")]
    NoOpLog,
    /// The KV event stream could not start.
    #[error(transparent)]
    Events(#[from] crate::events::publisher::PublishError),
}

/// How to run a master; [`MasterServerBuilder::start`] runs it on the current tokio runtime.
pub struct MasterServerBuilder {
    config: MasterConfig,
    clock: Arc<dyn Clock>,
    rpc: SocketAddr,
    admin: Option<SocketAddr>,
    poll_window: Duration,
    limits: RpcLimits,
    background: bool,
    nof_prober: Option<Arc<dyn NofProber>>,
    oplog: Option<OpLogOptions>,
    snapshots: Option<SnapshotOptions>,
    keyring: Option<Arc<Keyring>>,
    tls: Tls,
    events: Option<EventsConfig>,
}

impl MasterServerBuilder {
    /// Publishes the KV event stream as `events` says (default: none).
    pub fn events(mut self, events: Option<EventsConfig>) -> Self {
        self.events = events;
        self
    }

    /// TLS (default: none, plain TCP). Its server side is what the RPC and admin ports serve (every connection
    /// through the handshake before its hello or request); its client side is what the NoF heartbeat's probes
    /// dial nodes with.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = tls;
        self
    }

    /// The cluster secret(s) (default `None`: no authentication). With a keyring every RPC peer proves a
    /// credential derived from it and is held to its principal's scope (`server::authz`), the admin HTTP's
    /// mutating routes need the admin credential, and the NoF heartbeat proves the admin credential to nodes.
    pub fn keyring(mut self, keyring: Option<Arc<Keyring>>) -> Self {
        self.keyring = keyring;
        self
    }

    /// Where and how often to snapshot (default `None`). Needs an oplog: a restart then restores the newest
    /// usable snapshot plus the log after it, and a snapshotter follows the log.
    pub fn snapshots(mut self, options: Option<SnapshotOptions>) -> Self {
        self.snapshots = options;
        self
    }

    /// Where the master's oplog lives (default `None`: no oplog, nothing logged or replayed). With one, the
    /// master replays it before it serves and logs every mutation to it.
    pub fn oplog(mut self, options: Option<OpLogOptions>) -> Self {
        self.oplog = options;
        self
    }

    /// The time source every lease and timeout reads (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Where the RPC server listens (default `127.0.0.1:0`: a free loopback port).
    pub fn rpc_addr(mut self, addr: SocketAddr) -> Self {
        self.rpc = addr;
        self
    }

    /// Where the admin HTTP listens; `None` (the default) runs none.
    pub fn admin_addr(mut self, addr: Option<SocketAddr>) -> Self {
        self.admin = addr;
        self
    }

    /// How long an idle RPC connection polls for its next request before parking (default
    /// `crescent_net::poll::DEFAULT_POLL_WINDOW`; zero never polls: right when clients share the master's runtime).
    pub fn poll_window(mut self, window: Duration) -> Self {
        self.poll_window = window;
        self
    }

    /// What the RPC server allows its connections: how many at once, how long a started frame may take, how
    /// many bytes of large frames all may hold (default [`RpcLimits::default`]).
    pub fn limits(mut self, limits: RpcLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Whether the background loop (eviction, liveness, graceful unmounts, delayed releases) runs on its own
    /// thread, and the NoF heartbeat task on the runtime (default true; a test on a manual clock steps the
    /// service itself).
    pub fn background(mut self, run: bool) -> Self {
        self.background = run;
        self
    }

    /// How the NoF heartbeat probes a target (default [`TransferProber`]: a 1-byte data-plane read).
    pub fn nof_prober(mut self, prober: Arc<dyn NofProber>) -> Self {
        self.nof_prober = Some(prober);
        self
    }

    /// A master that authenticates seals data-plane grants, so it holds freed space for their life; and it
    /// checks a client's unreachable report with its own probe before taking the segment out of placement.
    fn authenticating_config(&mut self) {
        if self.keyring.is_some() {
            super::grants::hold_for_grants(&mut self.config);
            self.config.verify_unreachable_reports = true;
        }
    }

    /// Starts a candidate (issue 15 §2) on the current tokio runtime: its servers at once, a hot standby
    /// following the oplog (needs [`MasterServerBuilder::oplog`]), and a leader — a fresh service restored
    /// from the log — whenever it wins the lease through `ha`'s coordinator.
    pub async fn start_candidate(mut self, ha: CandidateOptions) -> Result<CandidateServer, StartError> {
        let Some(oplog) = self.oplog.take() else { return Err(StartError::NoOpLog) };
        self.authenticating_config();
        // The configuration is checked now, not at the first promotion.
        MasterService::new(self.config.clone(), self.clock.clone()).map_err(StartError::Config)?;
        // One stream for the candidate's life: each term it leads reports to it.
        let (events, publisher) = match self.events.take() {
            Some(config) => {
                let (hub, publisher) = start_events(config).await?;
                (Some(hub), Some(publisher))
            }
            None => (None, None),
        };
        let term = TermConfig {
            config: self.config,
            clock: self.clock,
            oplog,
            snapshots: self.snapshots,
            background: self.background,
            nof_prober: self.nof_prober,
            hosts: self.keyring.clone().map(Hosts::new),
            keyring: self.keyring,
            tls: self.tls,
            events,
        };
        let server = CandidateServer::start(term, ha, self.rpc, self.admin, self.poll_window, self.limits).await?;
        Ok(server.with_publisher(publisher))
    }

    /// Starts the service and its servers on the current tokio runtime.
    pub async fn start(mut self) -> Result<MasterServer, StartError> {
        self.authenticating_config();
        let svc = Arc::new(MasterService::new(self.config, self.clock).map_err(StartError::Config)?);
        // Replayed before any listener exists: nothing is served from a half-rebuilt state.
        let (oplog, snapshotter) = match &self.oplog {
            Some(options) => {
                let (log, _, snapshotter) =
                    crate::ha::open_with_snapshots(options, self.snapshots.as_ref(), &svc).await?;
                (Some(log), snapshotter)
            }
            None => (None, None),
        };
        // Attached before anything is served: every change from the first request on is reported.
        let events = match self.events.take() {
            Some(config) => {
                let (hub, publisher) = start_events(config).await?;
                svc.attach_events(hub).map_err(StartError::Config)?;
                Some(publisher)
            }
            None => None,
        };
        let metrics = Arc::new(RpcMetrics::default());
        let bind = |what, addr| move |source| StartError::Bind { what, addr, source };
        let target = Target::Fixed(svc.clone());
        let rpc = RpcServer::bind(self.rpc, target.clone(), metrics.clone()).await.map_err(bind("rpc", self.rpc))?;
        let hosts = self.keyring.clone().map(Hosts::new);
        let admin = match self.admin {
            Some(addr) => {
                let slot = SnapshotSlot::default();
                slot.set(snapshotter.as_ref().map(SnapshotterHandle::subscribe));
                let (keyring, tls) = (self.keyring.clone(), self.tls.server.clone());
                Some(AdminServer::start(addr, target, metrics, slot, keyring, tls).await.map_err(bind("admin", addr))?)
            }
            None => None,
        };
        // Started once every listener is bound, so a failed start has no thread to join.
        let background =
            if self.background { Some(svc.spawn_background().map_err(StartError::Background)?) } else { None };
        let rpc = rpc
            .with_poll_window(self.poll_window)
            .with_limits(self.limits)
            .with_hosts(hosts.clone())
            .with_tls(self.tls.server.clone())
            .with_snapshots(self.snapshots.as_ref().map(|o| o.store.clone()))
            .spawn()
            .map_err(bind("rpc", self.rpc))?;
        let nof_heartbeat = self.background.then(|| {
            let timeout = Duration::from_millis(svc.config().nof_probe_timeout_ms);
            let prober = self.nof_prober.unwrap_or_else(|| {
                let auth = hosts.clone().map(|h| (h, svc.clone()));
                Arc::new(TransferProber::new(timeout, auth, self.tls.client.clone()))
            });
            NofHeartbeat::spawn(svc.clone(), prober)
        });
        Ok(MasterServer { svc, nof_heartbeat, rpc, admin, _background: background, oplog, snapshotter, events })
    }
}

/// A running master. Dropping it stops everything at once; [`MasterServer::shutdown`] lets connections
/// finish the request in hand first.
pub struct MasterServer {
    svc: Arc<MasterService>,
    /// Aborted when dropped, first: no segment is unmounted for a failed probe while the master stops.
    nof_heartbeat: Option<NofHeartbeat>,
    rpc: RpcServerHandle,
    admin: Option<AdminServer>,
    /// Stops (and joins) the background thread when dropped, after the servers.
    _background: Option<BackgroundLoop>,
    /// The oplog writer, drained at shutdown.
    oplog: Option<Arc<OpLog>>,
    /// The snapshotter, stopped first at shutdown.
    snapshotter: Option<SnapshotterHandle>,
    /// The KV event publisher, stopped last (it sends what the final changes reported).
    events: Option<Publisher>,
}

impl std::fmt::Debug for MasterServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterServer").field("rpc", &self.rpc_addr()).field("admin", &self.admin_addr()).finish()
    }
}

impl MasterServer {
    /// A builder for a master with `config`.
    pub fn builder(config: MasterConfig) -> MasterServerBuilder {
        MasterServerBuilder {
            config,
            clock: Arc::new(SystemClock::new()),
            rpc: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: None,
            poll_window: crescent_net::poll::DEFAULT_POLL_WINDOW,
            limits: RpcLimits::default(),
            background: true,
            nof_prober: None,
            oplog: None,
            snapshots: None,
            keyring: None,
            tls: Tls::default(),
            events: None,
        }
    }

    /// Where the RPC server listens.
    pub fn rpc_addr(&self) -> SocketAddr {
        self.rpc.local_addr()
    }

    /// The RPC accept loop's counts (the connection cap in force, connections closed to make room, refused).
    pub fn rpc_stats(&self) -> crescent_net::AcceptStats {
        self.rpc.stats()
    }

    /// Where the admin HTTP listens, if it runs.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(AdminServer::local_addr)
    }

    /// The snapshotter's status, when snapshots are configured.
    pub fn snapshot_status(&self) -> Option<tokio::sync::watch::Receiver<crate::ha::SnapshotterStatus>> {
        self.snapshotter.as_ref().map(SnapshotterHandle::subscribe)
    }

    /// The service behind the servers (for in-process inspection).
    pub fn service(&self) -> &Arc<MasterService> {
        &self.svc
    }

    /// The endpoint its KV event stream is published on (the port chosen when 0 was asked for), if any.
    pub fn events_endpoint(&self) -> Option<&str> {
        self.events.as_ref().map(|p| p.endpoint())
    }

    /// Stops the NoF heartbeat, stops accepting, lets every connection finish the request in hand, stops the
    /// admin HTTP and the background loop.
    pub async fn shutdown(self) {
        let MasterServer { nof_heartbeat, rpc, admin, _background, oplog, snapshotter, events, .. } = self;
        if let Some(s) = snapshotter {
            s.stop().await;
        }
        drop(nof_heartbeat);
        rpc.shutdown().await;
        if let Some(admin) = admin {
            admin.shutdown().await;
        }
        // The background thread is stopped and joined off the runtime's worker.
        if let Some(bg) = _background {
            let _ = tokio::task::spawn_blocking(move || drop(bg)).await;
        }
        // Last: everything committed so far is written (unless the backend is failing).
        if let Some(log) = oplog {
            log.stop().await;
        }
        if let Some(p) = events {
            p.stop().await;
        }
    }
}

/// A hub for `config` and its publisher, bound and running.
async fn start_events(config: EventsConfig) -> Result<(Arc<EventHub>, Publisher), StartError> {
    let hub = Arc::new(EventHub::new(config));
    let publisher = Publisher::start(hub.clone()).await?;
    Ok((hub, publisher))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_stalled_admin_request_cannot_hold_up_shutdown() {
        let admin = SocketAddr::from(([127, 0, 0, 1], 0));
        let master = MasterServer::builder(MasterConfig::default()).admin_addr(Some(admin)).start().await.unwrap();
        let admin = master.admin_addr().unwrap();
        // A scraper that sends half a request head and stalls.
        let mut stalled = tokio::net::TcpStream::connect(admin).await.unwrap();
        stalled.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n").await.unwrap();
        // A bound on the condition (shutdown returns), far above the one-second drain it takes.
        let done = tokio::time::timeout(Duration::from_secs(30), master.shutdown()).await;
        assert!(done.is_ok(), "shutdown waited on the stalled request");
        drop(stalled);
    }
}
