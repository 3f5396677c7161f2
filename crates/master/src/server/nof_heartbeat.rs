//! The NoF heartbeat task: every [`NOF_HEARTBEAT_TICK`] it asks the service which NoF targets are due for a
//! probe ([`MasterService::due_nof_probes`]), runs those probes concurrently, each bounded by
//! `nof_probe_timeout_ms`, and reports each outcome ([`MasterService::record_nof_probe`], which unmounts a
//! segment whose target keeps failing). It probes the same way the segments clients reported unreachable, when
//! the master checks such reports ([`MasterService::take_unreachable_reports`],
//! [`MasterService::confirm_unreachable`]). The schedule and the counting live in the service; only the I/O is
//! here.

use super::hosts::Hosts;
use crate::service::{MasterService, NofProbe};
use crescent_net::auth::Credential;
use crescent_net::grant::{self, Bearer, GrantOp};
use crescent_net::host::TICKET_TTL;
use crescent_net::tls::TlsClient;
use crescent_proto::transfer::GrantRange;
use crescent_proto::{ClientId, ErrorCode, Principal, SegmentId};
use crescent_transfer::{Place, RangeGrant, SegmentRegistry, Tickets, TransferClient, TransferConfig, TransferError};
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::MissedTickBehavior;

/// How often the heartbeat task looks for due probes (the probes themselves are `nof_heartbeat_interval_ms`
/// apart per segment).
pub const NOF_HEARTBEAT_TICK: Duration = Duration::from_millis(100);

/// Checks whether a NoF target serves a segment; the seam between the heartbeat task and the network.
pub trait NofProber: Send + Sync + 'static {
    /// Resolves to whether the target at `endpoint` answered a read of `segment`. The caller bounds it with
    /// the probe timeout (a probe still pending then counts as failed).
    fn probe(&self, endpoint: &str, segment: SegmentId) -> BoxFuture<'static, bool>;
}

/// The real probe: a data-plane read of 1 byte at offset 0 of the segment; data back means alive, any error
/// (refused, reset, timed out, `SEGMENT_NOT_FOUND`, ...) means not.
#[derive(Debug, Clone)]
pub struct TransferProber {
    client: TransferClient,
    /// With a keyring: the probe's own tickets and read grants, minted here (for the `node` bearer its hello
    /// proves, the least there is: no rights at the master).
    auth: Option<Arc<Minted>>,
    /// The probe's client id (what its hello names and its grants are sealed for).
    id: ClientId,
}

/// Tickets and grants the master mints for its own probes from the hosts' keys (no round trip, no sealing).
#[derive(Debug)]
struct Minted {
    hosts: Arc<Hosts>,
    svc: Arc<MasterService>,
    id: ClientId,
}

impl Tickets for Minted {
    fn ticket<'a>(&'a self, _: &'a str, segment: SegmentId) -> BoxFuture<'a, Result<Credential, TransferError>> {
        let keys = self.hosts.of_segment(&self.svc, segment);
        Box::pin(async move {
            let (_, keys) = keys.ok_or(TransferError::Refused(ErrorCode::SegmentNotFound))?;
            let expires = grant::unix_ms().saturating_add(TICKET_TTL.as_millis() as u64);
            Ok(keys.ticket(&Principal::Node(None), self.id, expires))
        })
    }

    fn forget(&self, _: &str) {}
}

impl TransferProber {
    /// A prober whose connects and exchanges give up after `timeout`, one connection per target; with the
    /// hosts' keys it proves tickets it mints from them to nodes that authenticate, and with `tls` it dials
    /// nodes that serve TLS.
    pub fn new(timeout: Duration, auth: Option<(Arc<Hosts>, Arc<MasterService>)>, tls: Option<Arc<TlsClient>>) -> Self {
        let id = ClientId::random();
        let auth = auth.map(|(hosts, svc)| Arc::new(Minted { hosts, svc, id }));
        let config = TransferConfig {
            tickets: auth.clone().map(|a| a as Arc<dyn Tickets>),
            client_id: Some(id),
            lanes_per_peer: 1,
            connect_timeout: timeout,
            io_timeout: timeout,
            // A probe is rare and tiny: it must not hold a worker busy-polling for its reply.
            poll_window: Duration::ZERO,
            tls,
            ..TransferConfig::default()
        };
        Self { client: TransferClient::new(config, SegmentRegistry::default()), auth, id }
    }
}

impl NofProber for TransferProber {
    fn probe(&self, endpoint: &str, segment: SegmentId) -> BoxFuture<'static, bool> {
        let (client, endpoint) = (self.client.clone(), endpoint.to_owned());
        let grant = self.auth.as_ref().and_then(|a| {
            let (_, keys) = a.hosts.of_segment(&a.svc, segment)?;
            let bearer = Bearer::new(Principal::Node(None), Some(self.id));
            let ttl = self.client.config().io_timeout * 2;
            let range = GrantRange { offset: 0, length: 1 };
            Some(RangeGrant::own(keys.seal_grant_for(
                GrantOp::Read,
                &segment,
                &bearer,
                vec![range],
                ttl,
                a.svc.epoch_ms(),
            )))
        });
        Box::pin(async move {
            match client.read(&endpoint, Place::new(segment, grant), 0, 1).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::debug!(%segment, %endpoint, error = %e, "NoF probe failed");
                    false
                }
            }
        })
    }
}

/// Why a segment is probed.
#[derive(Debug, Clone, Copy)]
enum Probe {
    /// A NoF target's heartbeat.
    Heartbeat,
    /// A client reported its node unreachable.
    Report,
}

/// The running heartbeat task; dropping it aborts the task and the probes in flight.
#[derive(Debug)]
pub(super) struct NofHeartbeat {
    task: JoinHandle<()>,
}

impl NofHeartbeat {
    /// Starts the task on the current tokio runtime.
    pub(super) fn spawn(svc: Arc<MasterService>, prober: Arc<dyn NofProber>) -> Self {
        let timeout = Duration::from_millis(svc.config().nof_probe_timeout_ms);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(NOF_HEARTBEAT_TICK);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            // Probes run as tasks of their own so a slow target never delays the next tick's probes; the set
            // aborts them when this task ends.
            let mut probes: JoinSet<(Probe, SegmentId, bool)> = JoinSet::new();
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let due = svc.due_nof_probes().into_iter().map(|p| (Probe::Heartbeat, p));
                        let reported = svc.take_unreachable_reports().into_iter().map(|p| (Probe::Report, p));
                        for (kind, NofProbe { segment, endpoint }) in due.chain(reported) {
                            let probe = prober.probe(&endpoint, segment);
                            probes.spawn(async move {
                                (kind, segment, tokio::time::timeout(timeout, probe).await.unwrap_or(false))
                            });
                        }
                    }
                    Some(done) = probes.join_next(), if !probes.is_empty() => match done {
                        Ok((Probe::Report, segment, answered)) => {
                            svc.confirm_unreachable(segment, answered);
                        }
                        Ok((Probe::Heartbeat, segment, true)) => {
                            svc.record_nof_probe(segment, true);
                        }
                        Ok((Probe::Heartbeat, segment, false)) => {
                            // A failure may unmount the segment (a sweep over every object): off the async workers.
                            let svc = svc.clone();
                            if let Err(e) = tokio::task::spawn_blocking(move || svc.record_nof_probe(segment, false)).await {
                                tracing::warn!(%segment, error = %e, "recording a failed NoF probe failed");
                            }
                        }
                        // The probe's task panicked: its segment's report is lost, and the service re-probes it later.
                        Err(e) => tracing::warn!(error = %e, "a NoF probe task failed"),
                    },
                }
            }
        });
        Self { task }
    }
}

impl Drop for NofHeartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}
