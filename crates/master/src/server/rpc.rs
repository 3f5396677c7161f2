//! The RPC server: one task per connection; hello, then requests answered in order under their request ids
//! (clients pipeline; a client wanting parallelism opens several connections). A malformed frame (or a
//! request under the hello's id 0) gets an error frame and closes that connection only.
//!
//! No peer can pin the master's memory or tasks ([`RpcLimits`]): the hello is read under the 64 KiB hello
//! limit within the frame deadline; after it, a connection buffers a small allowance of its own and a larger
//! frame only within a budget all connections share (`crescent_net::inbound`), released with the frame; a
//! frame once started, and the replies owed, must be done within the deadline or the connection is closed;
//! the connections are capped (`crescent_net::accept`).

use super::authz::{self, Caller};
use super::claims::ClaimGuard;
use super::hosts::Hosts;
use super::target::Target;
use crate::ha::OpLog;
use crate::service::listing::LIST_REPLY_BYTES;
use crate::service::{MasterService, WriteRef};
use crate::snapshot::store::SnapshotStore;
use bytes::{Bytes, BytesMut};
use crescent_ha::leader::LeaseGuard;
use crescent_net::auth::AuthFailure;
use crescent_net::auth::Plane;
use crescent_net::conn::{Conn, Stream};
use crescent_net::grant::Bearer;
use crescent_net::hello::{self, HandshakeError, Verifier};
use crescent_net::inbound::{FrameBudget, Inbound, Ready};
use crescent_net::poll::{self, Adaptive, PollGate};
use crescent_net::tls::{self, HandshakeFailure, TlsServer};
use crescent_net::{ServerHandle, Shutdown};
use crescent_proto::rpc::GrantedBatch;
use crescent_proto::wire::{Envelope, ErrorFrame, Frame, FrameCodec, Limits, WireError};
use crescent_proto::{ErrorCode, MasterOp, MasterReply, MasterRequest, MasterResponse, Principal, SegmentId, batch};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_util::codec::Encoder;

/// Per-operation request and failure counters, plus protocol errors.
#[derive(Debug)]
pub struct RpcMetrics {
    requests: Vec<AtomicU64>,
    failures: Vec<AtomicU64>,
    /// Frames refused as malformed (each closes its connection).
    pub malformed_frames: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Failed authentications (hellos refused `AUTHENTICATION_FAILED`), logged at a rate.
    pub auth_failures: crescent_net::auth::AuthFailures,
    /// Requests refused `PERMISSION_DENIED` (an authenticated principal asked beyond its scope).
    pub denied: AtomicU64,
    /// The accept loops of the process's servers (`rpc`, `admin`), by name, for `/metrics`. A leaf lock.
    servers: parking_lot::Mutex<Vec<(&'static str, crescent_net::AcceptCounters)>>,
}

impl Default for RpcMetrics {
    fn default() -> Self {
        Self {
            requests: MasterOp::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            failures: MasterOp::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            malformed_frames: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            auth_failures: Default::default(),
            denied: AtomicU64::new(0),
            servers: parking_lot::Mutex::default(),
        }
    }
}

impl RpcMetrics {
    /// Lists a server's accept loop on `/metrics` under `name` (a server restarted under the same name replaces
    /// its entry).
    pub fn attach_server(&self, name: &'static str, counters: crescent_net::AcceptCounters) {
        let mut servers = self.servers.lock();
        servers.retain(|(n, _)| *n != name);
        servers.push((name, counters));
    }

    /// Each attached server's accept-loop counts, by name.
    pub fn servers(&self) -> Vec<(&'static str, crescent_net::AcceptStats)> {
        self.servers.lock().iter().map(|(name, c)| (*name, c.stats())).collect()
    }

    /// `(operation, requests, failures)` for every operation.
    pub fn snapshot(&self) -> Vec<(&'static str, u64, u64)> {
        MasterOp::ALL
            .iter()
            .map(|op| {
                let i = op.index();
                (op.name(), self.requests[i].load(Ordering::Relaxed), self.failures[i].load(Ordering::Relaxed))
            })
            .collect()
    }

    pub(crate) fn record(&self, op: MasterOp, failed: bool) {
        self.requests[op.index()].fetch_add(1, Ordering::Relaxed);
        if failed {
            self.failures[op.index()].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs a batch service call on the well-formed items only (an oversized key answers `INVALID_KEY` in its own
/// slot) and puts each answer back in its input slot.
fn on_valid_keys<'a, I, T>(
    items: impl Iterator<Item = (&'a crescent_proto::wire::WireKey, I)>,
    call: impl FnOnce(Vec<(&'a str, I)>) -> Vec<Result<T, ErrorCode>>,
) -> Vec<Result<T, ErrorCode>> {
    let (slots, valid) = batch::split(items.map(|(k, item)| k.as_str().map(|k| (k, item))));
    let answers = if valid.is_empty() { Vec::new() } else { call(valid) };
    slots.fill(answers, || ErrorCode::InternalError)
}

fn only_keys(valid: Vec<(&str, ())>) -> Vec<&str> {
    valid.into_iter().map(|(k, ())| k).collect()
}

fn batch_failed<T>(v: &[Result<T, ErrorCode>]) -> bool {
    !v.is_empty() && v.iter().all(Result::is_err)
}

/// Runs one request against the service. Per-key problems (an oversized key) fail only their own slot; a
/// failed request's reply says why in words.
pub fn dispatch(svc: &MasterService, req: &MasterRequest) -> MasterReply {
    dispatch_by(svc, req, None)
}

/// [`dispatch`] for a caller that proved `by` (mounts record it: `MasterService::mount_segment_as`).
pub fn dispatch_by(svc: &MasterService, req: &MasterRequest, by: Option<&Principal>) -> MasterReply {
    answer(svc, req, by).map_err(|code| ErrorFrame { code, message: super::explain::explain(svc, req, code) })
}

fn answer(svc: &MasterService, req: &MasterRequest, by: Option<&Principal>) -> Result<MasterResponse, ErrorCode> {
    use MasterRequest as R;
    use MasterResponse as A;
    match req {
        R::Ping { client } => Ok(A::Pong { status: svc.ping(*client), view_version: 0 }),
        R::DiskTasks { client, done, faults, counters, .. } => {
            svc.disk_tasks(*client, done, faults, counters).map(A::DiskTasks)
        }
        R::ReplicaTasks { client, done, .. } => Ok(A::ReplicaTasks(svc.replica_tasks(*client, done))),
        R::CreateCopyTask { tenant, key, targets } => {
            svc.create_copy_task(tenant, key.as_str()?, targets).map(A::TaskId)
        }
        R::CreateMoveTask { tenant, key, source, target } => {
            svc.create_move_task(tenant, key.as_str()?, source, target).map(A::TaskId)
        }
        R::QueryTask { id } => svc.query_task(*id).map(A::Task),
        R::CreateDrain { segments, targets, max_concurrency } => {
            svc.create_drain(segments, targets, *max_concurrency).map(A::TaskId)
        }
        R::QueryDrain { id } => svc.query_drain(*id).map(A::Drain),
        R::CancelDrain { id } => svc.cancel_drain(*id).map(A::Drain),
        R::ClusterInfo => Ok(A::ClusterInfo(svc.cluster_info())),
        // Answered at the network edge (`serve`), which holds the keys and the snapshot store; the service has none.
        R::DataTicket { .. } | R::FetchSnapshot { .. } => Err(ErrorCode::InvalidParams),
        R::MountSegment { client, spec } => svc.mount_segment_as(*client, spec.clone(), by).map(|()| A::Done),
        R::RemountSegments { client, specs } => svc.remount_segments_as(*client, &specs.0, by).map(|()| A::Done),
        R::UnmountSegment { client, segment } => svc.unmount_own_segment(*client, *segment).map(|()| A::Done),
        R::GracefulUnmount { client, segment, grace_ms } => {
            svc.graceful_unmount_segment(*segment, *client, Duration::from_millis(*grace_ms)).map(|()| A::Done)
        }
        R::SegmentStatus { segment } => svc.segment_status(*segment).map(A::Status),
        R::PutStart { client, tenant, key, size, config } => {
            svc.put_start(*client, tenant, key.as_str()?, *size, config).map(A::Replicas)
        }
        R::UpsertStart { client, tenant, key, size, config } => {
            svc.upsert_start(*client, tenant, key.as_str()?, *size, config).map(A::Replicas)
        }
        R::PutEnd { client, tenant, key, checksum, write } => {
            svc.put_end(WriteRef::new(*client, *write), tenant, key.as_str()?, *checksum).map(|()| A::Done)
        }
        R::PutRevoke { client, tenant, key, write } => {
            svc.put_revoke(WriteRef::new(*client, *write), tenant, key.as_str()?).map(|()| A::Done)
        }
        R::BatchPutStart { client, tenant, items, config, group_ids, upsert } => {
            if group_ids.as_ref().is_some_and(|g| g.0.len() != items.0.len()) {
                return Ok(A::BatchReplicas(GrantedBatch::new(vec![Err(ErrorCode::InvalidParams); items.0.len()])));
            }
            let grouped = group_ids.is_some();
            // Each item carries its group id (when the batch has them: as many as items, checked above).
            let mut groups = group_ids.as_ref().map(|g| g.0.iter().cloned());
            let items = items.0.iter().map(|(k, size)| (k, (*size, groups.as_mut().and_then(Iterator::next))));
            Ok(A::BatchReplicas(GrantedBatch::new(on_valid_keys(items, |valid| {
                let sub: Vec<(&str, u64)> = valid.iter().map(|(k, (size, _))| (*k, *size)).collect();
                let groups: Option<Vec<String>> =
                    grouped.then(|| valid.into_iter().filter_map(|(_, (_, g))| g).collect());
                if *upsert {
                    svc.batch_upsert_start(*client, tenant, &sub, config, groups.as_deref())
                } else {
                    svc.batch_put_start(*client, tenant, &sub, config, groups.as_deref())
                }
            }))))
        }
        R::BatchPutEnd { client, tenant, items } => Ok(A::BatchDone(
            items
                .0
                .iter()
                .map(|(k, c, w)| k.as_str().and_then(|k| svc.put_end(WriteRef::new(*client, *w), tenant, k, *c)))
                .collect(),
        )),
        R::BatchPutRevoke { client, tenant, keys } => Ok(A::BatchDone(
            keys.0
                .iter()
                .map(|(k, w)| k.as_str().and_then(|k| svc.put_revoke(WriteRef::new(*client, *w), tenant, k)))
                .collect(),
        )),
        R::GetReplicaList { tenant, key } => svc.get_replica_list(tenant, key.as_str()?).map(A::ReplicaList),
        R::Stat { tenant, key } => svc.stat(tenant, key.as_str()?).map(A::Stat),
        R::ReleaseLeases { tenant, keys } => {
            let keys: Vec<&str> = keys.0.iter().filter_map(|k| k.as_str().ok()).collect();
            svc.release_leases(tenant, &keys).map(|()| A::Done)
        }
        R::BatchGetReplicaList { tenant, keys } => {
            Ok(A::BatchReplicaList(GrantedBatch::new(on_valid_keys(keys.0.iter().map(|k| (k, ())), |valid| {
                svc.batch_get_replica_list(tenant, &only_keys(valid))
            }))))
        }
        R::BatchPrefixLease { tenant, keys } => {
            // A malformed key ends the run, as an absent one does.
            let keys: Vec<&str> = keys.0.iter().map_while(|k| k.as_str().ok()).collect();
            let run = svc.batch_prefix_lease(tenant, &keys)?;
            Ok(A::BatchReplicaList(GrantedBatch::new(run.into_iter().map(Ok).collect())))
        }
        R::ExistKey { tenant, key } => svc.exist_key(tenant, key.as_str()?).map(A::Exists),
        R::BatchExistKey { tenant, keys } => {
            Ok(A::BatchExists(on_valid_keys(keys.0.iter().map(|k| (k, ())), |valid| {
                svc.batch_exist_key(tenant, &only_keys(valid))
            })))
        }
        R::Remove { tenant, key, force } => svc.remove(tenant, key.as_str()?, *force).map(|()| A::Done),
        R::BatchRemove { tenant, keys, force } => {
            Ok(A::BatchDone(keys.0.iter().map(|k| k.as_str().and_then(|k| svc.remove(tenant, k, *force))).collect()))
        }
        R::BatchReplicaClear { client, tenant, keys, segment } => {
            // A malformed key is skipped, as the original skips an empty one.
            let keys: Vec<&str> = keys.0.iter().filter_map(|k| k.as_str().ok()).collect();
            svc.batch_replica_clear(*client, tenant, &keys, segment).map(A::Keys)
        }
        R::RemoveAll { tenant, force } => svc.remove_all_report(tenant.as_deref(), *force).map(A::RemovedAll),
        R::RemoveByRegex { tenant, pattern, force } => svc.remove_by_regex(tenant, pattern, *force).map(A::Count),
        R::ListKeys { tenant, prefix, limit } => svc.list_keys(tenant, prefix, *limit as usize).map(A::Keys),
        R::ReportUnreachable { client, segments } => {
            svc.report_unreachable(*client, &segments.0);
            Ok(A::Done)
        }
        // Admin requests (`authz` lets only the admin credential through on a master that authenticates).
        R::ListTenants => svc.list_tenants().map(A::Tenants),
        R::SetTenantQuota { tenant, bytes } => svc.upsert_tenant_quota(tenant, *bytes).map(|()| A::Done),
        R::RemoveTenant { tenant } => svc.delete_tenant_quota(tenant).map(|()| A::Done),
        R::RegisterLocalSsd { client, enable_offloading } => {
            svc.register_local_ssd(*client, *enable_offloading).map(|()| A::Done)
        }
        R::UnregisterLocalSsd { client } => svc.unregister_local_ssd(*client).map(|()| A::Done),
        R::ReportLocalSsd { client, capacity } => svc.report_local_ssd(*client, *capacity).map(|()| A::Done),
        R::SetLocalSsdOffloading { client, enabled } => {
            svc.set_local_ssd_offloading(*client, *enabled).map(|()| A::Done)
        }
        R::LocalSsdStatus { client } => svc.local_ssd_status(*client).map(A::LocalSsd),
        R::RemoveGroup { tenant, group, force } => svc.remove_group(tenant, group, *force).map(A::Count),
        R::ListKeysPage { tenant, prefix, after, limit } => {
            svc.list_keys_page(tenant, prefix, after.as_deref(), *limit as usize, LIST_REPLY_BYTES).map(A::KeyPage)
        }
    }
}

fn failed(reply: &MasterReply) -> bool {
    match reply {
        Err(_) => true,
        Ok(MasterResponse::BatchReplicas(v)) => batch_failed(&v.items),
        Ok(MasterResponse::BatchDone(v)) => batch_failed(v),
        Ok(MasterResponse::BatchReplicaList(v)) => batch_failed(&v.items),
        Ok(MasterResponse::BatchExists(v)) => batch_failed(v),
        Ok(_) => false,
    }
}

/// Requests that may run long (bulk scans and removals, large batch writes, writes that may evict): they run
/// off the async workers' fast path. Writes run inline while memory is not under pressure: handing the worker
/// to another thread costs a thread wake-up, measured at about a third of a small put's latency.
fn may_block(svc: &MasterService, req: &MasterRequest) -> bool {
    /// Batch writes up to this many keys run inline (a few tens of microseconds of work).
    const LARGE_BATCH: usize = 256;
    match req {
        MasterRequest::PutStart { .. } | MasterRequest::UpsertStart { .. } => svc.under_memory_pressure(),
        MasterRequest::BatchPutStart { items, .. } => items.0.len() > LARGE_BATCH || svc.under_memory_pressure(),
        MasterRequest::RemoveAll { .. }
        | MasterRequest::RemoveByRegex { .. }
        | MasterRequest::UnmountSegment { .. }
        // A tenant teardown may wait (briefly) for the writes it drains.
        | MasterRequest::RemoveTenant { .. } => true,
        _ => false,
    }
}

/// What the RPC server allows its connections, and all of them together (see `docs/protocol.md`, "Limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcLimits {
    /// Most connections served at once (lowered to fit the open-file limit); at the cap the longest-idle
    /// connection is closed to make room, or, when all are busy, the newcomer is refused.
    pub max_connections: usize,
    /// How long a peer may take over its hello, over the rest of a frame it started, and to take a reply;
    /// past it the connection is closed.
    pub frame_timeout: Duration,
    /// Bytes of frames larger than the per-connection allowance (`crescent_net::inbound::ALLOWANCE`) that all
    /// connections may hold at once; a larger frame waits for its share.
    pub frame_budget: usize,
}

impl RpcLimits {
    /// The default [`RpcLimits::frame_timeout`].
    pub const DEFAULT_FRAME_TIMEOUT: Duration = hello::HELLO_TIMEOUT;
    /// The default [`RpcLimits::frame_budget`]: two frames of the largest size.
    pub const DEFAULT_FRAME_BUDGET: usize = 2 * Limits::CONTROL.max_frame as usize;
}

impl Default for RpcLimits {
    fn default() -> Self {
        Self {
            max_connections: crescent_net::accept::DEFAULT_MAX_CONNECTIONS,
            frame_timeout: Self::DEFAULT_FRAME_TIMEOUT,
            frame_budget: Self::DEFAULT_FRAME_BUDGET,
        }
    }
}

/// A bound, not yet running, RPC server.
pub struct RpcServer {
    listener: TcpListener,
    target: Target,
    metrics: Arc<RpcMetrics>,
    /// How long an idle connection polls for its next request before parking (see `crescent_net::poll`).
    poll_window: Duration,
    limits: RpcLimits,
    /// The cluster secret(s) every peer must prove a credential of, and the hosts' keys (see
    /// [`RpcServer::with_hosts`]).
    hosts: Option<Arc<Hosts>>,
    /// TLS every connection goes through before its hello (see [`RpcServer::with_tls`]).
    tls: Option<Arc<TlsServer>>,
    /// The snapshots a standby may fetch (see [`RpcServer::with_snapshots`]).
    snapshots: Option<Arc<dyn SnapshotStore>>,
}

/// A running RPC server; dropping it stops accepting and closes every connection.
#[derive(Debug)]
pub struct RpcServerHandle(ServerHandle);

impl RpcServerHandle {
    /// Where the server listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.0.local_addr()
    }

    /// The accept loop's counts (the connection cap in force, connections closed to make room, refused).
    pub fn stats(&self) -> crescent_net::AcceptStats {
        self.0.stats()
    }

    /// Stops accepting, lets every connection finish the request in hand, and waits until all are gone.
    pub async fn shutdown(self) {
        self.0.shutdown().await;
    }
}

impl RpcServer {
    /// Binds `addr` (port 0 picks a free port).
    pub async fn bind(addr: SocketAddr, target: Target, metrics: Arc<RpcMetrics>) -> std::io::Result<Self> {
        let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        Ok(Self {
            // A backlog as deep as the data plane's (mio's default is 128): a burst of connections waits there
            // while the accept loop makes room for them, rather than having its SYNs dropped and retried a
            // second later.
            listener: socket.listen(1024)?,
            target,
            metrics,
            poll_window: poll::DEFAULT_POLL_WINDOW,
            limits: RpcLimits::default(),
            hosts: None,
            tls: None,
            snapshots: None,
        })
    }

    /// Serves `FetchSnapshot` (admin only) from `store`'s newest published snapshot, so a standby without shared
    /// storage can bootstrap (`server::snapshot_fetch`); `None` (the default): refused, no snapshots here.
    pub fn with_snapshots(mut self, store: Option<Arc<dyn SnapshotStore>>) -> Self {
        self.snapshots = store;
        self
    }

    /// Takes every connection through a TLS handshake (within the frame deadline) before its hello; `None`
    /// (the default): plain TCP.
    pub fn with_tls(mut self, tls: Option<Arc<TlsServer>>) -> Self {
        self.tls = tls;
        self
    }

    /// Requires every peer to prove a credential of the keyring of `hosts` in its hello, limits each to its
    /// principal's scope (`server::authz`), and seals grants and issues tickets with the hosts' keys.
    pub fn with_hosts(mut self, hosts: Option<Arc<Hosts>>) -> Self {
        self.hosts = hosts;
        self
    }

    /// Sets how long an idle connection polls for its next request before parking; zero never polls.
    pub fn with_poll_window(mut self, window: Duration) -> Self {
        self.poll_window = window;
        self
    }

    /// Sets what the server allows its connections.
    pub fn with_limits(mut self, limits: RpcLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Starts accepting on the current tokio runtime.
    pub fn spawn(self) -> std::io::Result<RpcServerHandle> {
        let RpcServer { listener, target, metrics, poll_window, limits, hosts, tls, snapshots } = self;
        let shared = Arc::new(Shared {
            target,
            metrics: metrics.clone(),
            gate: &poll::PROCESS_GATE,
            poll_window,
            frame_timeout: limits.frame_timeout,
            budget: FrameBudget::new(limits.frame_budget.max(Limits::CONTROL.max_frame as usize)),
            trim: Arc::default(),
            hosts,
            tls,
            snapshots,
        });
        let handle = crescent_net::accept::spawn(
            "master rpc",
            listener,
            limits.max_connections,
            move |stream, peer, shutdown| {
                shared.metrics.connections.fetch_add(1, Ordering::Relaxed);
                let shared = shared.clone();
                async move {
                    if let Err(e) = serve(stream, peer, &shared, shutdown).await {
                        tracing::debug!(%peer, error = %e, "connection closed");
                    }
                }
            },
        )?;
        metrics.attach_server("rpc", handle.counters());
        Ok(RpcServerHandle(handle))
    }
}

/// What every connection of a server shares.
struct Shared {
    target: Target,
    metrics: Arc<RpcMetrics>,
    gate: &'static PollGate,
    poll_window: Duration,
    frame_timeout: Duration,
    budget: FrameBudget,
    trim: Arc<Trim>,
    /// The cluster secret(s) peers must prove a credential of, the client claims and the hosts' keys; `None`:
    /// no authentication.
    hosts: Option<Arc<Hosts>>,
    /// TLS the connections go through first; `None`: plain TCP.
    tls: Option<Arc<TlsServer>>,
    /// The snapshots a standby may fetch; `None`: none here.
    snapshots: Option<Arc<dyn SnapshotStore>>,
}

/// Claims the hello's client id for the caller's principal; a caller naming an id another principal holds is
/// marked `disputed` (and the attempt counted and logged at a rate, like a failed authentication).
fn claim(shared: &Shared, caller: Option<Caller>, peer: SocketAddr) -> (Option<Caller>, Option<ClaimGuard>) {
    let Some(mut caller) = caller else { return (None, None) };
    let Some(client) = caller.client else { return (Some(caller), None) };
    let Some(hosts) = &shared.hosts else { return (Some(caller), None) };
    // A client the current term's service still tracks keeps its claim after its connections close; one whose
    // segments the service knows another principal mounted (from the log, after a failover) is that one's.
    let svc = shared.target.route().ok();
    let alive = |id| svc.as_ref().is_some_and(|svc| svc.tracks_client(id));
    let mounter = svc.as_ref().and_then(|svc| svc.mounter(client));
    match hosts.claims().claim(client, &caller.principal, caller.secret, mounter, alive) {
        Ok(guard) => (Some(caller), guard),
        Err(d) => {
            let why = AuthFailure::ClientIdHeld { principal: caller.principal.clone(), client, holder: d.holder };
            shared.metrics.auth_failures.record("master rpc", Some(peer), &why);
            caller.disputed = true;
            (Some(caller), None)
        }
    }
}

/// Replies queued while pipelined requests are buffered are written once they reach this many bytes.
const MAX_PENDING_REPLIES: usize = 64 << 10;

/// A reply buffer that grew past this for a large reply is released after it is written, with a [`Trim`].
const RELEASE_ABOVE: usize = 1 << 20;

/// Gives the memory of released reply buffers back to the OS within a quarter second. glibc keeps a freed
/// buffer of a few MiB in its arenas (after the first one, which it maps and unmaps, it raises its mapping
/// threshold), so a master that once wrote many large replies at once would stay at that peak; trimming after
/// every large reply would cost a trim per reply under a stream of them. (Large request frames need none:
/// they are read into memory mapped for them alone.)
#[derive(Debug, Default)]
struct Trim {
    scheduled: AtomicBool,
}

impl Trim {
    /// How long after the first large buffer freed the trim runs (later ones freed meanwhile join it).
    const DELAY: Duration = Duration::from_millis(250);

    fn schedule(self: &Arc<Self>) {
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Self::DELAY).await;
            this.scheduled.store(false, Ordering::Release);
            // malloc_trim walks the whole heap: off the async workers.
            let _ = tokio::task::spawn_blocking(crate::memory::release_free_memory).await;
        });
    }
}

/// Ends a connection that broke the protocol: counts it, then the replies already queued, an error frame
/// under request id 0, and a graceful close.
async fn refuse(stream: &mut Conn, pending: &[u8], metrics: &RpcMetrics, e: WireError) -> WireError {
    metrics.malformed_frames.fetch_add(1, Ordering::Relaxed);
    crescent_net::frame::refuse(stream, pending, &ErrorFrame { code: e.code(), message: e.to_string() }).await;
    e
}

/// A peer that did not finish in time.
fn timed_out(what: &str, limit: Duration) -> WireError {
    WireError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{what} not done within {limit:?}")))
}

/// What the queued replies of a candidate's connection wait for before they are written: the oplog sequence
/// they depend on (everything committed when they were answered) becoming durable.
/// What the queued replies depend on before they may go out: the log position they acknowledge (made durable
/// first), and the lease of the candidate term that made them (still held when they are written: a reply of a
/// term whose lease lapsed meanwhile — the process stalled between answering and writing — would hand out space,
/// leases or locations its successor may already have given to others).
#[derive(Default)]
struct Owed {
    durable: Option<(Arc<OpLog>, u64)>,
    term: Option<LeaseGuard>,
}

/// Requests whose acknowledgement a candidate holds until the log holds them: removals of every kind and
/// tenant or segment teardown, whose loss in a failover would bring back what the caller was told is gone, and a
/// drain started or cancelled (a new leader takes over what the caller was told runs, or stopped). Puts
/// are acknowledged at once, as the original does (a put acknowledged in the last milliseconds before a leader
/// dies may be missing after the failover: a cache miss, never stale data); reads never wait.
fn holds_until_durable(req: &MasterRequest) -> bool {
    use MasterRequest as R;
    matches!(
        req,
        R::Remove { .. }
            | R::BatchRemove { .. }
            | R::BatchReplicaClear { .. }
            | R::RemoveAll { .. }
            | R::RemoveByRegex { .. }
            | R::RemoveGroup { .. }
            | R::RemoveTenant { .. }
            | R::SetTenantQuota { .. }
            | R::UnmountSegment { .. }
            | R::GracefulUnmount { .. }
            | R::CreateDrain { .. }
            | R::CancelDrain { .. }
    )
}

/// Notes that the reply just queued depends on everything `svc`'s oplog has committed (its
/// removal-type requests and writes that removed an object, see [`holds_until_durable`]).
fn owe(owed: &mut Owed, svc: &MasterService, hold: bool) {
    if !hold {
        return;
    }
    if let Some(log) = svc.oplog() {
        let seq = log.last_committed();
        match &mut owed.durable {
            Some((l, s)) if Arc::ptr_eq(l, log) => *s = (*s).max(seq),
            d => *d = Some((log.clone(), seq)),
        }
    }
}

/// Waits until what the queued replies depend on is durable; if it cannot become durable, or the term that
/// made them no longer holds its lease, the replies are dropped unsent.
async fn settle(out: &mut BytesMut, owed: &mut Owed, shared: &Shared) -> Result<(), WireError> {
    let Owed { durable, term } = std::mem::take(owed);
    if let Some((log, seq)) = durable
        && let Err(e) = log.wait_durable(seq, shared.frame_timeout).await
    {
        out.clear();
        return Err(WireError::Io(std::io::Error::other(format!("replies not sent: seq {seq} not durable ({e})"))));
    }
    if term.is_some_and(|g| !g.holds()) {
        out.clear();
        return Err(WireError::Io(std::io::Error::other("replies not sent: the term that made them lost its lease")));
    }
    Ok(())
}

/// [`refuse`] once the queued replies are settled (a candidate's unconfirmed replies are dropped, not sent).
async fn refuse_settled(
    stream: &mut Conn,
    out: &mut BytesMut,
    owed: &mut Owed,
    shared: &Shared,
    e: WireError,
) -> WireError {
    let _ = settle(out, owed, shared).await;
    refuse(stream, out, &shared.metrics, e).await
}

/// Writes the queued replies (within the deadline: a peer that does not take its replies is closed), and
/// releases a buffer that grew for a large reply. A candidate's replies first wait until what they depend on
/// is durable; if it cannot become durable (the writer was fenced or stopped), the connection is closed
/// without them: an acknowledged mutation a failover could lose would be a lie, an unanswered one is honest.
async fn flush(stream: &mut Conn, out: &mut BytesMut, owed: &mut Owed, shared: &Shared) -> Result<(), WireError> {
    if out.is_empty() {
        return Ok(());
    }
    settle(out, owed, shared).await?;
    // Flushed too: over TLS the last record may wait in rustls until then.
    let write = async {
        stream.write_all(out).await?;
        stream.flush().await
    };
    tokio::time::timeout(shared.frame_timeout, write)
        .await
        .map_err(|_| timed_out("replies taken", shared.frame_timeout))??;
    out.clear();
    if out.capacity() > RELEASE_ABOVE {
        *out = BytesMut::new();
        shared.trim.schedule();
    }
    Ok(())
}

async fn serve(stream: TcpStream, peer: SocketAddr, shared: &Shared, shutdown: Shutdown) -> Result<(), WireError> {
    let Shared { target, metrics, gate, poll_window, frame_timeout, budget, hosts, tls, .. } = shared;
    stream.set_nodelay(true)?;
    let mut stopping = shutdown.clone().stopping();
    // Until its hello (TLS handshake included) the connection counts as idle: at the connection cap it may be
    // closed to make room.
    let conn = tokio::select! {
        biased;
        conn = tls::accept_counted(tls.as_deref(), stream, *frame_timeout, &metrics.auth_failures, "master rpc", peer) => conn,
        () = &mut stopping => return Ok(()),
    };
    let mut stream = match conn {
        Ok(conn) => conn,
        Err(HandshakeFailure::Refused(_)) => return Ok(()),
        Err(HandshakeFailure::Timeout(limit)) => return Err(timed_out("TLS handshake", limit)),
    };
    let hello = tokio::select! {
        biased;
        hello = hello::answer(&mut stream, Plane::Control, Limits::CONTROL, *frame_timeout, hosts.as_ref().map(|h| Verifier::Secret(h.ring()))) => hello,
        () = &mut stopping => return Ok(()),
    };
    let caller = match hello {
        Ok(Some(admitted)) => {
            let (client, secret) = (admitted.hello.client_id, admitted.secret);
            admitted.principal.map(|principal| Caller { principal, client, secret, disputed: false })
        }
        Ok(None) => return Ok(()),
        Err(HandshakeError::Unauthenticated(why)) => {
            metrics.auth_failures.record("master rpc", Some(peer), &why);
            return Ok(());
        }
        Err(HandshakeError::Protocol(e)) => {
            metrics.malformed_frames.fetch_add(1, Ordering::Relaxed);
            hello::refuse(&mut stream, &e).await;
            return Err(e);
        }
        Err(HandshakeError::Io(e)) => return Err(WireError::Io(e)),
        Err(HandshakeError::Timeout) => return Err(timed_out("hello", *frame_timeout)),
        Err(e) => return Err(WireError::Io(std::io::Error::other(e))),
    };
    // Held for the connection's life: the client id is this principal's while it is connected.
    let (caller, _claim) = claim(shared, caller, peer);
    shutdown.busy();
    // The bearer the data-plane grants in this connection's replies name.
    let bearer = caller.as_ref().map(|c| Bearer::new(c.principal.clone(), c.client));
    let mut inbound = Inbound::new(Limits::CONTROL);
    let mut out = BytesMut::new();
    let mut codec = FrameCodec::new(Limits::CONTROL);
    let mut adaptive = Adaptive::default();
    let mut owed = Owed::default();
    loop {
        if shutdown.is_stopping() {
            return flush(&mut stream, &mut out, &mut owed, shared).await;
        }
        // A buffered request is served at once, its reply queued behind the previous ones: a client that
        // pipelines gets a burst of replies in one write. Otherwise flush, then poll briefly (the client's
        // next request usually follows within a round trip) before parking this task. (Reading what the poll
        // saw straight from the socket, as the client does, measured slower here: 49k vs 59k lookups/s.)
        let request = match inbound.ready(&mut stream) {
            Ok(Ready::Frame(request)) => request,
            Ok(Ready::Empty) => {
                flush(&mut stream, &mut out, &mut owed, shared).await?;
                adaptive.poll(gate, &stream.socket(), *poll_window);
                shutdown.idle();
                let woke = tokio::select! {
                    biased;
                    // Over TLS too: `ready` found nothing, so rustls holds no plaintext and the socket was dry.
                    woke = stream.readable() => woke,
                    () = &mut stopping => return Ok(()),
                };
                shutdown.busy();
                woke?;
                continue;
            }
            Ok(Ready::Closed) => return flush(&mut stream, &mut out, &mut owed, shared).await,
            // A frame has started: all of it must come within the deadline (the replies owed go out first,
            // the peer may wait for them before sending the rest).
            Ok(Ready::Partial) => {
                flush(&mut stream, &mut out, &mut owed, shared).await?;
                match tokio::time::timeout(*frame_timeout, inbound.rest(&mut stream, budget)).await {
                    Ok(Ok(request)) => request,
                    Ok(Err(WireError::Io(e))) => return Err(WireError::Io(e)),
                    Ok(Err(e)) => return Err(refuse_settled(&mut stream, &mut out, &mut owed, shared, e).await),
                    Err(_) => return Err(timed_out("frame", *frame_timeout)),
                }
            }
            Err(WireError::Io(e)) => return Err(WireError::Io(e)),
            Err(e) => return Err(refuse_settled(&mut stream, &mut out, &mut owed, shared, e).await),
        };
        let Envelope { id, body } = match request.frame.decode::<MasterRequest>() {
            Ok(env) => env,
            Err(e) => return Err(refuse_settled(&mut stream, &mut out, &mut owed, shared, e).await),
        };
        if id == 0 {
            let e = WireError::Malformed("request id 0 is reserved for the hello");
            return Err(refuse_settled(&mut stream, &mut out, &mut owed, shared, e).await);
        }
        // A connection that has sent requests is among the last closed to make room at the cap (even when its
        // first came pipelined behind its hello, without a wait).
        shutdown.busy();
        // The frame (its memory and share of the budget) goes once decoded: the request owns its data.
        drop(request);
        let op = body.op();
        // block_in_place exists only on the multi-threaded runtime; a current-thread runtime just runs inline.
        let multi_thread =
            tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread;
        let mut hold = holds_until_durable(&body);
        let routed = target.route();
        // The first term whose replies are queued since the last write (a term's lease checked again then).
        if owed.term.is_none() {
            owed.term = routed.as_ref().ok().and_then(|s| s.lease().cloned());
        }
        let allowed = match (&caller, &routed) {
            (Some(c), Ok(svc)) => authz::authorize(c, &body, svc.config().enable_multi_tenants),
            _ => Ok(()),
        };
        if allowed.is_err() {
            metrics.denied.fetch_add(1, Ordering::Relaxed);
        }
        // Bytes that travel in the reply frame's payload, never through serde (a snapshot's pieces).
        let mut payload = Bytes::new();
        let reply = match routed.and_then(|svc| allowed.map(|()| svc)) {
            Err(refusal) => Err(refusal),
            Ok(svc) => {
                let mut reply = if let MasterRequest::DataTicket { segment } = &body {
                    ticket(hosts.as_deref(), &svc, caller.as_ref(), *segment)
                } else if let MasterRequest::FetchSnapshot { id, offset } = &body {
                    let store = shared.snapshots.as_deref();
                    let (reply, bytes) = super::snapshot_fetch::serve_chunk(store, id.as_deref(), *offset).await;
                    payload = bytes;
                    reply
                } else if let MasterRequest::DiskTasks { client, wait_ms, .. } = &body {
                    // A node's disk-task poll: with nothing to hand out it waits (bounded) for a task, on its own
                    // connection, so the wait delays nothing else.
                    let waiter = svc.disk_tier().waiter(*client);
                    let reply = dispatch_by(&svc, &body, caller.as_ref().map(|c| &c.principal));
                    match reply {
                        Ok(MasterResponse::DiskTasks(tasks)) if tasks.is_empty() && *wait_ms > 0 => {
                            let wait = u64::from((*wait_ms).min(crescent_proto::DISK_TASK_WAIT_MAX_MS));
                            let _ = tokio::time::timeout(Duration::from_millis(wait), waiter.notified()).await;
                            Ok(MasterResponse::DiskTasks(svc.disk_tier().take(*client)))
                        }
                        other => other,
                    }
                } else if let MasterRequest::ReplicaTasks { client, wait_ms, .. } = &body {
                    // A node's task poll, as the disk-task poll above: waits (bounded) for a task when none is.
                    let waiter = svc.tasks().waiter(*client);
                    let reply = dispatch_by(&svc, &body, caller.as_ref().map(|c| &c.principal));
                    match reply {
                        Ok(MasterResponse::ReplicaTasks(tasks)) if tasks.is_empty() && *wait_ms > 0 => {
                            let wait = u64::from((*wait_ms).min(crescent_proto::REPLICA_TASK_WAIT_MAX_MS));
                            let _ = tokio::time::timeout(Duration::from_millis(wait), waiter.notified()).await;
                            Ok(MasterResponse::ReplicaTasks(svc.take_replica_tasks(*client)))
                        }
                        other => other,
                    }
                } else if is_listing(&body) {
                    // A listing visits the whole index and may wait its turn: on the listing thread, so it holds
                    // no worker on any runtime (inside `crescent up` the master's only thread is the node's too).
                    let svc = Arc::clone(&svc);
                    super::lister::run(move || dispatch(&svc, &body)).await.unwrap_or_else(|code| {
                        let message = if code == ErrorCode::UnavailableInCurrentStatus {
                            super::lister::busy_message()
                        } else {
                            "the key listing failed".into()
                        };
                        Err(ErrorFrame { code, message })
                    })
                } else {
                    let by = caller.as_ref().map(|c| &c.principal);
                    // Whatever this thread logged before is not this request's.
                    crate::ha::take_hid_objects();
                    let reply = match multi_thread && may_block(&svc, &body) {
                        true => tokio::task::block_in_place(|| dispatch_by(&svc, &body, by)),
                        false => dispatch_by(&svc, &body, by),
                    };
                    // A write that removed an object on its way (an upsert onto a readable one, a put preempting
                    // a stale write) hands out or frees that object's space: answered once the removal is durable.
                    hold |= crate::ha::take_hid_objects();
                    reply
                };
                // A refusal acknowledges nothing: it goes out at once, even while the log is stuck. Except a
                // removal's "not found": the object may be hidden by another caller's removal whose REMOVE is not
                // durable yet, and this answer too says the key is gone (a failover before that REMOVE is durable
                // would bring the object back after it), so it waits like that removal's own reply.
                let acknowledges = reply.is_ok() || reply.as_ref().is_err_and(|e| e.code == ErrorCode::ObjectNotFound);
                owe(&mut owed, &svc, hold && acknowledges);
                if let (Some(hosts), Some(bearer)) = (hosts, &bearer) {
                    super::grants::seal(&svc, hosts, bearer, &mut reply);
                }
                reply
            }
        };
        let (frame, failed) = reply_frame(id, op, &reply, payload)?;
        metrics.record(op, failed);
        codec.encode(frame, &mut out)?;
        if out.len() >= MAX_PENDING_REPLIES {
            flush(&mut stream, &mut out, &mut owed, shared).await?;
        }
    }
}

/// A data-plane ticket to `segment`'s host for the caller (sealed for its own credential and client id).
fn ticket(hosts: Option<&Hosts>, svc: &MasterService, caller: Option<&Caller>, segment: SegmentId) -> MasterReply {
    let refuse = |message: &str| ErrorFrame { code: ErrorCode::InvalidParams, message: message.to_owned() };
    let (Some(hosts), Some(caller)) = (hosts, caller) else {
        return Err(refuse("this master does not authenticate: its storage nodes need no ticket"));
    };
    let Some(client) = caller.client.filter(|_| !caller.disputed) else {
        let message = "a ticket names the caller's client id: this connection holds none of its own";
        return Err(ErrorFrame { code: ErrorCode::PermissionDenied, message: message.into() });
    };
    hosts.ticket(svc, segment, &caller.principal, caller.secret, client).map(MasterResponse::Ticket)
}

/// Requests that list keys (run on the listing thread, see `serve`).
fn is_listing(req: &MasterRequest) -> bool {
    matches!(req, MasterRequest::ListKeys { .. } | MasterRequest::ListKeysPage { .. })
}

/// The frame of a reply (with `payload` after the header when the reply succeeded) and whether it counts as a
/// failure. A reply too large for a control frame could never be sent (the connection would close with it): it
/// is answered `BUFFER_OVERFLOW` instead, counted a failure, and the connection lives on.
fn reply_frame(id: u64, op: MasterOp, reply: &MasterReply, payload: Bytes) -> Result<(Frame, bool), WireError> {
    let max = Limits::CONTROL.max_frame as usize;
    let header = postcard::to_stdvec(&Envelope { id, body: reply }).map_err(|e| WireError::Decode(e.to_string()))?;
    let payload = if reply.is_ok() { payload } else { Bytes::new() };
    // The frame's length field counts the header's length field, the header and the payload.
    let len = 4 + header.len() + payload.len();
    if len <= max {
        return Ok((Frame { header: Bytes::from(header), payload }, failed(reply)));
    }
    tracing::warn!(op = op.name(), bytes = len, "a reply larger than a frame was answered BUFFER_OVERFLOW");
    let refusal: MasterReply = Err(ErrorFrame {
        code: ErrorCode::BufferOverflow,
        message: format!("the {} reply is {len} bytes, more than the {max} a frame may carry", op.name()),
    });
    Ok((Frame::encode(id, &refusal, Bytes::new())?, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_larger_than_a_frame_is_refused_and_counted_a_failure() {
        let big: MasterReply = Ok(MasterResponse::Keys(vec!["k".repeat(4096); 4500]));
        let (frame, failed) = reply_frame(7, MasterOp::ListKeys, &big, Bytes::new()).unwrap();
        assert!(failed, "an unsendable reply is no success");
        let back = frame.decode::<MasterReply>().unwrap();
        assert_eq!(back.id, 7);
        let refusal = back.body.unwrap_err();
        assert_eq!(refusal.code, ErrorCode::BufferOverflow);
        assert!(refusal.message.starts_with("the list_keys reply is 18"), "{}", refusal.message);
        assert!(frame.wire_len() < 1024);
        let small: MasterReply = Ok(MasterResponse::Keys(vec!["k".into()]));
        let (frame, failed) = reply_frame(8, MasterOp::ListKeys, &small, Bytes::new()).unwrap();
        assert!(!failed);
        assert_eq!(frame.decode::<MasterReply>().unwrap().body, small);
    }
}
