//! The connection to the master: a few persistent multiplexed connections, request ids, timeouts, and
//! reconnection (a restarted master is simply dialled again). Every request is bounded: one request timeout
//! per configured master address (dialling included), the next address tried when one does not answer.
//!
//! With an `etcd://HOST:PORT[,…]/CLUSTER` address (or the original's `etcd://h1:p;h2:p`, the cluster from
//! `CRESCENT_CLUSTER_ID`) the master is the cluster's leader, resolved through its master view in etcd
//! (`crescent_ha::leader::watch::ViewFollower`, started by the first request) and followed as it changes. A
//! request then has one request timeout in all, across leaders:
//!
//! - no leader in the view: wait for one, then `UNAVAILABLE_IN_CURRENT_STATUS` ([`ClientError::NoLeader`]);
//! - refused as not the leader (a standby or a deposed master; it did nothing): re-read the view and send it
//!   again to the leader, whatever the request;
//! - the connection broke, or a newer view appeared while waiting: requests safe to repeat ([`retry_safe`]:
//!   reads, and writes that set a state) are sent again to the newest leader; the others, which may have
//!   reached the old leader, wait for its answer (a deposed master refuses, see above) and fail with
//!   `RPC_FAIL` ([`ClientError::OutcomeUnknown`]) rather than act twice when its connection breaks or the
//!   request times out. A request that never left (the dial failed) is always sent again.
//!
//! Each connection has a writer (the caller sends its frame under a short mutex) and a reader task that
//! routes replies to waiting callers by request id, so many requests are in flight on one socket.

use crate::error::ClientError;
use bytes::Bytes;
use crescent_ha::leader::watch::{FollowerConfig, ViewFollower, is_not_leader};
use crescent_ha::leader::{MasterAddress, MasterView};
use crescent_net::auth::{Credential, CredentialSource, Plane};
use crescent_net::conn::{ReadHalf, Stream, WriteHalf};
use crescent_net::hello::{self, HandshakeError};
use crescent_net::poll::InFlight;
use crescent_net::reader::FrameReader;
use crescent_net::tls::TlsClient;
use crescent_proto::wire::{ErrorFrame, Frame, FrameCodec, Limits, MAX_BATCH, PeerRole, WireError};
use crescent_proto::{ClientId, ErrorCode, MasterOp, MasterReply, MasterRequest, MasterResponse};
use futures_util::SinkExt;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::codec::FramedWrite;

type Pending = Mutex<HashMap<u64, oneshot::Sender<Result<Frame, WireError>>>>;
/// The read half of a connection and the frames buffered from it.
struct Reader {
    sock: ReadHalf,
    frames: FrameReader,
}

/// One socket to the master. There is no reader task: a caller that is waiting for its reply takes the read
/// half itself and hands any other caller's reply over through `pending` (leader/follower). A lone caller
/// therefore reads its own reply with no task switch in between — on small VMs every wake-up of another
/// thread costs several microseconds.
struct Conn {
    /// How long a lone waiter polls before parking.
    poll_window: Duration,
    sink: tokio::sync::Mutex<FramedWrite<WriteHalf, FrameCodec>>,
    stream: tokio::sync::Mutex<Reader>,
    pending: Pending,
    alive: AtomicBool,
    /// A deferred request sits in `sink`'s buffer and a task will flush it unless a request does first.
    flush_scheduled: AtomicBool,
    /// The master address this connection is to.
    addr: Arc<str>,
    /// When a request last used it (ms since the process's first connection), for [`Conn::reusable`].
    used: AtomicU64,
}

/// How long a connection may sit unused before its next request first checks that the master has not closed
/// it meanwhile (one `poll(2)`): a master sheds idle connections at its cap and loses them all on a restart,
/// and a request written to such a socket would be lost with it. Busier connections skip the check.
const REUSE_CHECK_AFTER: Duration = Duration::from_millis(20);

/// Milliseconds since the process's first call, for [`Conn::used`].
fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    u64::try_from(EPOCH.get_or_init(std::time::Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// How long a deferred request may wait for a request to ride with before it is sent on its own.
const DEFER_FLUSH: Duration = Duration::from_millis(2);

impl Conn {
    /// Whether the connection can carry the next request: alive, and, after a quiet spell with nothing in
    /// flight, not closed by the master meanwhile. Marks it dead when it is not.
    fn reusable(&self) -> bool {
        if !self.alive.load(Ordering::Acquire) {
            return false;
        }
        let now = now_ms();
        let quiet = now.saturating_sub(self.used.swap(now, Ordering::Relaxed)) >= REUSE_CHECK_AFTER.as_millis() as u64;
        // A sender holding the write half, or a waiter, means the connection is in use: not quiet.
        if quiet
            && self.pending.lock().is_empty()
            && let Ok(sink) = self.sink.try_lock()
            && crescent_net::poll::peer_closed(sink.get_ref())
        {
            tracing::debug!("the master closed an idle connection: dialling afresh");
            self.alive.store(false, Ordering::Release);
            return false;
        }
        true
    }

    /// Writes out whatever deferred requests `sink` holds.
    async fn flush(&self) -> Result<(), WireError> {
        self.flush_scheduled.store(false, Ordering::Release);
        self.sink.lock().await.flush().await
    }

    /// Marks the connection dead and fails every waiter with `err()`.
    fn fail_all(&self, err: impl Fn() -> WireError) {
        self.alive.store(false, Ordering::Release);
        let waiters: Vec<_> = self.pending.lock().drain().collect();
        for (_, tx) in waiters {
            let _ = tx.send(Err(err()));
        }
    }

    /// Waits for the reply to `id`, reading the socket itself whenever no one else is. Spins before parking
    /// only while `inflight` counts this request alone (a polling wait holds its thread and would stall
    /// every other exchange driven by it).
    async fn wait(
        &self,
        id: u64,
        mut rx: oneshot::Receiver<Result<Frame, WireError>>,
        inflight: &InFlight,
    ) -> Result<Frame, WireError> {
        tokio::select! {
            biased;
            r = &mut rx => r.unwrap_or(Err(WireError::Closed)),
            mut reader = self.stream.lock() => {
                // Our reply may have arrived while we waited for the read half.
                if let Ok(r) = rx.try_recv() {
                    return r;
                }
                let Reader { sock, frames } = &mut *reader;
                // Lead until our own reply comes, handing the others' on: passing the read half back
                // after every frame would wake another task per reply.
                loop {
                    let mut next = frames.buffered().transpose();
                    // The client's only exchange polls (bounded by `poll_window`) for its reply and reads what the poll
                    // saw at once (see `crescent_net::poll`).
                    if next.is_none()
                        && inflight.count() == 1
                        && crescent_net::poll::until_readable(&sock.socket(), self.poll_window)
                    {
                        next = match frames.read_now(sock) {
                            Ok(_) => frames.buffered().transpose(),
                            Err(e) => Some(Err(e)),
                        };
                    }
                    let next = match next {
                        Some(n) => Some(n),
                        None => frames.next(sock).await,
                    };
                    match next {
                        Some(Ok(frame)) => {
                            let rid = frame.request_id().unwrap_or(0);
                            if rid == id {
                                self.pending.lock().remove(&id);
                                return Ok(frame);
                            }
                            if rid == 0 {
                                // A connection-level error frame: the master closes this connection.
                                self.fail_all(|| WireError::Malformed("master reported a protocol error"));
                                return Err(WireError::Malformed("master reported a protocol error"));
                            }
                            if let Some(tx) = self.pending.lock().remove(&rid) {
                                let _ = tx.send(Ok(frame));
                            }
                        }
                        Some(Err(e)) => {
                            // The others' requests are lost with the connection (worth another master).
                            self.fail_all(|| WireError::Closed);
                            return Err(e);
                        }
                        None => {
                            self.fail_all(|| WireError::Closed);
                            return Err(WireError::Closed);
                        }
                    }
                }
            }
        }
    }
}

/// A handle on the master for one client process.
pub struct MasterConnection {
    /// The configured address as given.
    addr: String,
    /// Where requests go.
    target: Target,
    /// The direct address that answered last (tried first).
    preferred: AtomicUsize,
    client: ClientId,
    role: PeerRole,
    /// What each connection's hello proves, for a master that authenticates its peers.
    credential: Option<CredentialSource>,
    /// TLS every connection goes through before its hello, for a master serving TLS.
    tls: Option<Arc<TlsClient>>,
    /// How long one attempt at one address may take, dialling included.
    timeout: Duration,
    poll_window: Duration,
    /// Exchanges in flight (this connection set's requests, and the transfers of a client sharing it):
    /// polling is for a lone exchange only.
    inflight: Arc<InFlight>,
    slots: Vec<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    next_slot: AtomicUsize,
    next_id: AtomicU64,
}

impl std::fmt::Debug for MasterConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterConnection").field("addr", &self.addr).finish_non_exhaustive()
    }
}

/// Where a connection's requests go.
enum Target {
    /// Masters tried in turn, the one that answered last first.
    Direct(Vec<String>),
    /// The leader of `cluster`, from its master view in etcd (the follower starts with the first request,
    /// inside the caller's runtime).
    Leader {
        /// etcd endpoints.
        endpoints: Vec<String>,
        /// The cluster id.
        cluster: String,
        /// The view follower, once started.
        follower: tokio::sync::OnceCell<ViewFollower>,
    },
    /// An address that does not parse: every request fails with this message (`INVALID_PARAMS`).
    Invalid(String),
}

/// Why one attempt at one master address failed. `sent`: the request was written (in part or whole), so
/// the master may have acted on it.
enum Failed {
    /// The master did not answer within the attempt's deadline (dialling, sending or waiting).
    TimedOut { sent: bool },
    /// The connection could not be made or broke: worth trying the next address.
    Lost { err: ClientError, sent: bool },
    /// A newer master view appeared while the attempt was under way (leader mode, requests safe to repeat).
    Superseded,
    /// An answer of sorts (a refused handshake, a request that cannot be encoded): another address would
    /// say the same, so the call fails with it.
    Final(ClientError),
}

impl Failed {
    /// A socket error or a closed connection (after the request was written) is worth another master; a
    /// protocol error (a frame too large to send, an error frame from the master) is an answer.
    fn of(e: WireError) -> Failed {
        match e {
            WireError::Io(_) | WireError::Closed => Failed::Lost { err: e.into(), sent: true },
            e => Failed::Final(e.into()),
        }
    }
}

/// Whether `op` may be sent again after it may have reached a master: repeating it has the effect of sending
/// it once and gets the same answer. Such requests follow a failover by themselves; the others fail with
/// [`ClientError::OutcomeUnknown`] when their master stops answering or loses the lead after they were sent.
/// Every operation is listed (no wildcard), so a new one needs a decision.
pub fn retry_safe(op: MasterOp) -> bool {
    use MasterOp as O;
    match op {
        // Reads (a repeated lookup only grants its lease again).
        O::Ping
        | O::ClusterInfo
        | O::SegmentStatus
        | O::GetReplicaList
        | O::BatchGetReplicaList
        | O::BatchPrefixLease
        | O::Stat
        | O::ExistKey
        | O::BatchExistKey
        | O::ListKeys
        | O::ListKeysPage
        | O::ListTenants
        | O::LocalSsdStatus
        | O::DataTicket
        | O::FetchSnapshot
        | O::QueryTask
        | O::QueryDrain => true,
        // Writes that set a state: a repeat finds it set and answers OK (mounting a segment the same client
        // mounted is `AlreadyMounted` = OK; unmounting an unknown one is OK; a graceful unmount already under
        // way is OK and keeps its deadline).
        O::MountSegment
        | O::RemountSegments
        | O::UnmountSegment
        | O::GracefulUnmount
        | O::ReportUnreachable
        | O::SetTenantQuota
        | O::UnregisterLocalSsd
        | O::ReportLocalSsd
        | O::SetLocalSsdOffloading => true,
        // A node's disk-task poll: an outcome applies once (a repeat finds its task gone and is ignored), and
        // the copies a lost reply handed out expire at their deadline.
        O::DiskTasks | O::ReplicaTasks => true,
        // A drain of the same segments answers the job already running; cancelling twice is cancelled.
        O::CreateDrain | O::CancelDrain => true,
        // A repeat answers otherwise (exists already, not found, wrong status) or acts twice (a lease
        // released twice may end another reader's).
        O::PutStart
        | O::PutEnd
        | O::PutRevoke
        | O::UpsertStart
        | O::BatchPutStart
        | O::BatchPutEnd
        | O::BatchPutRevoke
        | O::Remove
        | O::BatchRemove
        | O::BatchReplicaClear
        | O::RemoveAll
        | O::RemoveByRegex
        | O::RemoveGroup
        | O::RemoveTenant
        | O::RegisterLocalSsd
        | O::ReleaseLeases
        // A repeat queues a second task.
        | O::CreateCopyTask
        | O::CreateMoveTask => false,
    }
}

/// The first wait before asking the same leader again after a failure (doubling up to [`RETRY_MAX`]), unless
/// a newer view comes first.
const RETRY_FIRST: Duration = Duration::from_millis(20);
/// The longest such wait.
const RETRY_MAX: Duration = Duration::from_millis(500);

/// A refusal that says the master does not lead (a standby or a deposed leader): it did nothing.
pub(crate) fn refused_as_not_leader(e: &ErrorFrame) -> bool {
    e.code == ErrorCode::UnavailableInCurrentStatus && is_not_leader(&e.message)
}

/// `INVALID_PARAMS` with `message`.
fn invalid(message: String) -> ClientError {
    ClientError::Refused(ErrorFrame { code: ErrorCode::InvalidParams, message })
}

/// A connection to `addr`.
async fn dial(
    addr: &str,
    role: PeerRole,
    client: ClientId,
    credential: Option<&Credential>,
    tls: Option<&TlsClient>,
    poll_window: Duration,
) -> Result<Arc<Conn>, ClientError> {
    // The caller bounds the whole dial (connect, TLS and hello) by its attempt's deadline.
    let unreachable = |reason: String| ClientError::Unreachable { addr: addr.to_owned(), reason, timed_out: false };
    let stream = TcpStream::connect(addr).await.map_err(|e| unreachable(crate::error::io_reason(&e)))?;
    stream.set_nodelay(true).map_err(WireError::Io)?;
    let mut stream = crescent_net::tls::connect(tls, stream, addr).await.map_err(|e| {
        let reason = format!("TLS: {e}");
        tracing::warn!(%addr, "{reason}");
        unreachable(reason)
    })?;
    match hello::open(&mut stream, Plane::Control, role, Some(client), credential).await {
        Err(HandshakeError::Timeout) => return Err(ClientError::Timeout),
        Ok(_) => {}
        Err(HandshakeError::Refused(refusal)) => {
            tracing::warn!(%addr, message = %refusal.message, "master refused the connection");
            return Err(ClientError::Refused(refusal));
        }
        Err(HandshakeError::Protocol(e)) => return Err(e.into()),
        Err(HandshakeError::Io(e)) => return Err(WireError::Io(e).into()),
        // Only a server reports this; kept total.
        Err(HandshakeError::Unauthenticated(why)) => {
            let message = why.to_string();
            return Err(ClientError::Refused(ErrorFrame { code: ErrorCode::AuthenticationFailed, message }));
        }
    }
    let (rd, wr) = stream.into_split().map_err(WireError::Io)?;
    let sink = FramedWrite::new(wr, FrameCodec::new(Limits::CONTROL));
    let reader = Reader { sock: rd, frames: FrameReader::new(Limits::CONTROL) };
    Ok(Arc::new(Conn {
        poll_window,
        sink: tokio::sync::Mutex::new(sink),
        stream: tokio::sync::Mutex::new(reader),
        pending: Mutex::new(HashMap::new()),
        alive: AtomicBool::new(true),
        flush_scheduled: AtomicBool::new(false),
        addr: Arc::from(addr),
        used: AtomicU64::new(now_ms()),
    }))
}

/// The items of a batch request (`None` for a request that carries no batch).
fn batch_items(req: &MasterRequest) -> Option<usize> {
    Some(match req {
        MasterRequest::RemountSegments { specs, .. } => specs.0.len(),
        MasterRequest::BatchPutStart { items, group_ids, .. } => {
            items.0.len().max(group_ids.as_ref().map_or(0, |g| g.0.len()))
        }
        MasterRequest::BatchPutEnd { items, .. } => items.0.len(),
        MasterRequest::BatchPutRevoke { keys, .. } => keys.0.len(),
        MasterRequest::ReleaseLeases { keys, .. }
        | MasterRequest::BatchGetReplicaList { keys, .. }
        | MasterRequest::BatchPrefixLease { keys, .. }
        | MasterRequest::BatchExistKey { keys, .. }
        | MasterRequest::BatchRemove { keys, .. }
        | MasterRequest::BatchReplicaClear { keys, .. } => keys.0.len(),
        MasterRequest::ReportUnreachable { segments, .. } => segments.0.len(),
        _ => return None,
    })
}

/// Refuses a batch the master would refuse as a protocol error (after reading all of it), saying why.
pub(crate) fn check_batch(items: usize) -> Result<(), ClientError> {
    if items > MAX_BATCH {
        return Err(ClientError::BatchTooLarge { items, limit: MAX_BATCH });
    }
    Ok(())
}

impl MasterConnection {
    /// A connection to `addr` (one address, or several separated by commas: each request tries them in turn,
    /// the one that answered last first) for `client` with `connections` sockets (dialled lazily). `timeout`
    /// bounds each attempt at one address, dialling included: a request fails after at most one `timeout`
    /// per address.
    ///
    /// An `etcd://` address follows the cluster's leader instead (see the module's notes); one that does not
    /// parse makes every request fail with `INVALID_PARAMS` saying why.
    pub fn new(addr: &str, client: ClientId, role: PeerRole, connections: usize, timeout: Duration) -> Self {
        let target = if addr.trim_start().starts_with("etcd://") {
            match MasterAddress::parse(addr) {
                Ok(a) => Self::target_of(a),
                Err(e) => Target::Invalid(e.to_string()),
            }
        } else {
            Target::Direct(addr.split(',').map(str::trim).filter(|a| !a.is_empty()).map(str::to_owned).collect())
        };
        Self::with_target(addr.to_owned(), target, client, role, connections, timeout)
    }

    /// Like [`MasterConnection::new`] with a parsed address.
    pub fn with_address(
        addr: MasterAddress,
        client: ClientId,
        role: PeerRole,
        connections: usize,
        timeout: Duration,
    ) -> Self {
        let shown = match &addr {
            MasterAddress::Direct(hosts) => hosts.join(","),
            MasterAddress::Etcd { endpoints, cluster } => format!("etcd://{}/{cluster}", endpoints.join(",")),
        };
        Self::with_target(shown, Self::target_of(addr), client, role, connections, timeout)
    }

    fn target_of(addr: MasterAddress) -> Target {
        match addr {
            MasterAddress::Direct(hosts) => Target::Direct(hosts),
            MasterAddress::Etcd { endpoints, cluster } => {
                Target::Leader { endpoints, cluster, follower: tokio::sync::OnceCell::new() }
            }
        }
    }

    fn with_target(
        addr: String,
        target: Target,
        client: ClientId,
        role: PeerRole,
        connections: usize,
        timeout: Duration,
    ) -> Self {
        Self {
            addr,
            target,
            preferred: AtomicUsize::new(0),
            client,
            role,
            credential: None,
            tls: None,
            timeout,
            poll_window: Duration::ZERO,
            inflight: Arc::default(),
            slots: (0..connections.max(1)).map(|_| tokio::sync::Mutex::new(None)).collect(),
            next_slot: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        }
    }

    /// Takes every connection through a TLS handshake verified by `tls` (a master serving TLS refuses plain
    /// peers); `None` (the default): plain TCP.
    pub fn with_tls(mut self, tls: Option<Arc<TlsClient>>) -> Self {
        self.tls = tls;
        self
    }

    /// Proves `credential` in every connection's hello (a master with a keyring refuses peers without one).
    pub fn with_credential(mut self, credential: Option<CredentialSource>) -> Self {
        self.credential = credential;
        self
    }

    /// Poll up to `window` for a reply before parking (0 = never poll; see `Conn::wait`).
    pub fn with_poll_window(mut self, window: Duration) -> Self {
        self.poll_window = window;
        self
    }

    /// Counts requests in `inflight`, shared with the caller's other exchanges (its transfers), so a reply
    /// is spun for only when nothing else of the caller is under way.
    pub fn with_in_flight(mut self, inflight: Arc<InFlight>) -> Self {
        self.inflight = inflight;
        self
    }

    /// Requests sent so far (every call and deferred send, whatever its outcome): what a benchmark counts as
    /// round trips to the master.
    pub fn requests_sent(&self) -> u64 {
        self.next_id.load(Ordering::Relaxed).saturating_sub(1)
    }

    /// The master address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The leader this connection follows now (`etcd://` addresses only; `None` before the first request, or
    /// while no master leads).
    pub fn leader(&self) -> Option<MasterView> {
        match &self.target {
            Target::Leader { follower, .. } => follower.get().and_then(|f| f.state().view),
            _ => None,
        }
    }

    /// The view follower of an `etcd://` address, started on first use (in the caller's runtime).
    async fn follower(&self) -> Result<Option<&ViewFollower>, ClientError> {
        let Target::Leader { endpoints, cluster, follower } = &self.target else { return Ok(None) };
        let f = follower
            .get_or_try_init(|| async {
                let mut cfg = FollowerConfig::new(endpoints.clone(), cluster.clone());
                cfg.request_timeout = cfg.request_timeout.min(self.timeout);
                ViewFollower::start(cfg).map_err(|e| invalid(format!("following the leader of {cluster}: {e}")))
            })
            .await?;
        Ok(Some(f))
    }

    /// The connection slot for `req`. Single-key requests share the first connection: concurrent ones
    /// pipeline, so one write carries several requests and one read several replies (4 concurrent lookups on
    /// a 2-vCPU host: 122k/s on one connection, 62k/s on four). Batches, each a longer job for the master, are
    /// spread over all connections so the master's workers serve them in parallel (batch-128 lookups: 961k
    /// keys/s on four connections, 789k on one).
    fn slot(&self, req: &MasterRequest) -> usize {
        if req.op().is_batch() { self.next_slot.fetch_add(1, Ordering::Relaxed) % self.slots.len() } else { 0 }
    }

    /// Slot `slot`'s connection to `addr`, dialled if it has none (or one to another address, or a dead one).
    async fn conn_to(&self, slot: usize, addr: &str) -> Result<Arc<Conn>, ClientError> {
        let mut slot = self.slots[slot].lock().await;
        if let Some(c) = slot.as_ref().filter(|c| &*c.addr == addr && c.reusable()) {
            return Ok(c.clone());
        }
        let credential = self.credential.as_ref().map(CredentialSource::current);
        let conn =
            dial(addr, self.role, self.client, credential.as_ref(), self.tls.as_deref(), self.poll_window).await?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// One attempt at `addr` until `deadline`: dial if needed, send, wait for the reply. Given up (after
    /// forgetting the request) as soon as `abandon` completes.
    async fn attempt(
        &self,
        req: &MasterRequest,
        slot: usize,
        addr: &str,
        deadline: Instant,
        abandon: impl std::future::Future<Output = ()>,
    ) -> Result<Frame, Failed> {
        tokio::pin!(abandon);
        let dialled = tokio::select! {
            biased;
            r = tokio::time::timeout_at(deadline, self.conn_to(slot, addr)) => r,
            () = &mut abandon => return Err(Failed::Superseded),
        };
        let conn = match dialled {
            Err(_) | Ok(Err(ClientError::Timeout)) => return Err(Failed::TimedOut { sent: false }),
            Ok(Err(e @ ClientError::Refused(_))) => return Err(Failed::Final(e)),
            Ok(Err(err)) => return Err(Failed::Lost { err, sent: false }),
            Ok(Ok(c)) => c,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = Frame::encode(id, req, Bytes::new()).map_err(|e| Failed::Final(e.into()))?;
        let (tx, rx) = oneshot::channel();
        conn.pending.lock().insert(id, tx);
        // The write also carries any deferred requests queued before this one. A write cut short by the
        // deadline may leave part of a frame behind: the connection is not used again.
        let sent = tokio::time::timeout_at(deadline, async { conn.sink.lock().await.send(frame).await }).await;
        let sent = match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Failed::of(e)),
            Err(_) => Err(Failed::TimedOut { sent: true }),
        };
        if let Err(f) = sent {
            conn.pending.lock().remove(&id);
            conn.alive.store(false, Ordering::Release);
            return Err(f);
        }
        let counted = self.inflight.enter();
        let waited = tokio::select! {
            biased;
            r = tokio::time::timeout_at(deadline, conn.wait(id, rx, &self.inflight)) => Some(r),
            () = &mut abandon => None,
        };
        drop(counted);
        match waited {
            None => {
                conn.pending.lock().remove(&id);
                // A wait cut short may leave a frame half read: the connection is not used again.
                conn.alive.store(false, Ordering::Release);
                Err(Failed::Superseded)
            }
            Some(Ok(Ok(frame))) => Ok(frame),
            Some(Ok(Err(e))) => Err(Failed::of(e)),
            Some(Err(_)) => {
                conn.pending.lock().remove(&id);
                // A master that let a request time out is suspect: the next request dials afresh (this
                // connection's other waiters keep waiting for their own replies).
                conn.alive.store(false, Ordering::Release);
                Err(Failed::TimedOut { sent: true })
            }
        }
    }

    /// Sends one request and waits for its reply. Each configured address is tried at most once, starting
    /// with the one that answered last, each within the request timeout; a timeout or a broken connection
    /// moves on to the next. When none answers, the error names every address tried and why.
    /// With an `etcd://` address, the request goes to the cluster's leader instead (see the module's notes).
    pub async fn call(&self, req: &MasterRequest) -> Result<MasterResponse, ClientError> {
        if let Some(n) = batch_items(req) {
            check_batch(n)?;
        }
        match &self.target {
            Target::Direct(addrs) => self.call_direct(addrs, req).await,
            Target::Invalid(why) => Err(invalid(why.clone())),
            Target::Leader { .. } => match self.follower().await? {
                Some(f) => self.call_leader(f, req).await,
                None => Err(ClientError::Code(ErrorCode::InternalError)),
            },
        }
    }

    /// [`MasterConnection::call`] over a list of addresses.
    async fn call_direct(&self, addrs: &[String], req: &MasterRequest) -> Result<MasterResponse, ClientError> {
        let n = addrs.len();
        if n == 0 {
            return Err(ClientError::Refused(ErrorFrame {
                code: ErrorCode::InvalidParams,
                message: "no master address given".to_owned(),
            }));
        }
        let slot = self.slot(req);
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut failures = Vec::new();
        // A standby's refusal: with no leader among the addresses, the clearest answer (retry later).
        let mut not_leader = None;
        for k in 0..n {
            let i = (first + k) % n;
            let deadline = Instant::now() + self.timeout;
            match self.attempt(req, slot, &addrs[i], deadline, std::future::pending()).await {
                Ok(frame) => {
                    let reply: MasterReply = frame.decode::<MasterReply>()?.body;
                    match reply {
                        // A standby of a list of candidates: the leader is another address (it did nothing).
                        Err(e) if n > 1 && refused_as_not_leader(&e) => {
                            tracing::debug!(addr = %addrs[i], refusal = %e.message, "not the leader: trying the next");
                            failures.push((i, e.message.clone(), false));
                            not_leader = Some(e);
                        }
                        reply => {
                            self.preferred.store(i, Ordering::Relaxed);
                            return reply.map_err(ClientError::Refused);
                        }
                    }
                }
                Err(Failed::Final(ClientError::Refused(e))) if n > 1 && refused_as_not_leader(&e) => {
                    failures.push((i, e.message.clone(), false));
                    not_leader = Some(e);
                }
                Err(Failed::Final(e)) => return Err(e),
                Err(Failed::TimedOut { .. } | Failed::Superseded) => {
                    tracing::debug!(addr = %addrs[i], timeout = ?self.timeout, "master did not answer in time");
                    failures.push((i, format!("no answer within {}", fmt_duration(self.timeout)), true));
                }
                Err(Failed::Lost { err, .. }) => {
                    tracing::debug!(addr = %addrs[i], error = %err, "master unreachable");
                    failures.push((i, lost_reason(err), false));
                }
            }
        }
        match not_leader {
            Some(e) => Err(ClientError::Refused(e)),
            None => Err(unreachable(addrs, failures)),
        }
    }

    /// [`MasterConnection::call`] to the leader `follower` names, within one request timeout in all.
    async fn call_leader(&self, follower: &ViewFollower, req: &MasterRequest) -> Result<MasterResponse, ClientError> {
        let deadline = Instant::now() + self.timeout;
        let slot = self.slot(req);
        let op = req.op();
        // After a failure at view version `v`: wait up to `backoff` for a newer leader, else ask the same again.
        let mut failed_at: Option<u64> = None;
        let mut backoff = RETRY_FIRST;
        let mut last: Option<ClientError> = None;
        loop {
            let view = match failed_at {
                None => follower.leader_newer_than(0, deadline).await,
                Some(v) => {
                    let until = (Instant::now() + backoff).min(deadline);
                    backoff = (backoff * 2).min(RETRY_MAX);
                    match follower.leader_newer_than(v, until).await {
                        Some(newer) => Some(newer),
                        None => follower.leader_newer_than(0, deadline).await,
                    }
                }
            };
            let Some(view) = view else {
                return Err(last.unwrap_or_else(|| self.no_leader(follower)));
            };
            // A newer leader appearing while this attempt waits ends it, if the request is safe to repeat. One
            // that is not waits on for the old leader's word: a deposed master's refusal (it did nothing) lets
            // it go to the new leader, while giving up would leave its outcome unknown. A dead old leader breaks
            // the connection at once; a stopped one costs the request timeout.
            let superseded = async {
                if !retry_safe(op) || follower.leader_newer_than(view.version, deadline).await.is_none() {
                    std::future::pending::<()>().await;
                }
            };
            let failure = match self.attempt(req, slot, &view.leader, deadline, superseded).await {
                Ok(frame) => match frame.decode::<MasterReply>()?.body {
                    Err(e) if refused_as_not_leader(&e) => ClientError::Refused(e),
                    reply => return reply.map_err(ClientError::Refused),
                },
                Err(Failed::Final(ClientError::Refused(e))) if refused_as_not_leader(&e) => ClientError::Refused(e),
                Err(Failed::Final(e)) => return Err(e),
                Err(Failed::TimedOut { sent }) => {
                    let reason = format!("did not answer within {}", fmt_duration(self.timeout));
                    if sent && !retry_safe(op) {
                        return Err(ClientError::OutcomeUnknown { op: op.name(), master: view.leader, reason });
                    }
                    return Err(ClientError::Unreachable { addr: view.leader, reason, timed_out: true });
                }
                // Only requests safe to repeat are abandoned for a newer leader.
                Err(Failed::Superseded) => continue,
                Err(Failed::Lost { err, sent }) => {
                    let reason = lost_reason(err);
                    if sent && !retry_safe(op) {
                        let reason = format!("broke the connection ({reason})");
                        return Err(ClientError::OutcomeUnknown { op: op.name(), master: view.leader, reason });
                    }
                    ClientError::Unreachable { addr: view.leader.clone(), reason, timed_out: false }
                }
            };
            tracing::debug!(leader = %view.leader, version = view.version, error = %failure, "leader failed: re-resolving");
            // The watch may lag, or its etcd connection be dead without knowing: read the view now.
            follower.refresh();
            if Instant::now() >= deadline {
                return Err(failure);
            }
            last = Some(failure);
            failed_at = Some(view.version);
        }
    }

    /// The error of a call that found no leader within its timeout.
    fn no_leader(&self, follower: &ViewFollower) -> ClientError {
        let state = follower.state();
        let waited = fmt_duration(self.timeout);
        let reason = match (state.error, state.synced) {
            (Some(e), _) => format!("none known after {waited}; etcd: {e}"),
            (None, false) => format!("etcd not read within {waited}"),
            (None, true) => format!("no master leads (the master view is empty) after {waited}"),
        };
        ClientError::NoLeader {
            cluster: follower.cluster().to_owned(),
            endpoints: follower.endpoints().join(","),
            reason,
        }
    }

    /// Queues one request whose reply nobody waits for (whoever reads the connection next discards it): it
    /// leaves in the same write as the next request on that connection, or on its own within a couple of
    /// milliseconds if none comes. For notifications such as lease releases, which then cost neither a round
    /// trip nor a syscall of their own.
    pub async fn send_deferred(&self, req: &MasterRequest) -> Result<(), ClientError> {
        if let Some(n) = batch_items(req) {
            check_batch(n)?;
        }
        let addr = match &self.target {
            Target::Direct(addrs) if !addrs.is_empty() => {
                addrs[self.preferred.load(Ordering::Relaxed) % addrs.len()].clone()
            }
            Target::Direct(_) => return Err(ClientError::Code(ErrorCode::InvalidParams)),
            Target::Invalid(why) => return Err(invalid(why.clone())),
            Target::Leader { .. } => {
                let f = self.follower().await?.ok_or(ClientError::Code(ErrorCode::InternalError))?;
                // Best effort: a notification goes to the leader known now, or nowhere.
                match f.state().view {
                    Some(v) => v.leader,
                    None => return Err(self.no_leader(f)),
                }
            }
        };
        let conn = tokio::time::timeout(self.timeout, self.conn_to(self.slot(req), &addr))
            .await
            .map_err(|_| ClientError::Code(ErrorCode::RpcTimeout))??;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = Frame::encode(id, req, Bytes::new())?;
        if let Err(e) = conn.sink.lock().await.feed(frame).await {
            conn.alive.store(false, Ordering::Release);
            return Err(e.into());
        }
        if !conn.flush_scheduled.swap(true, Ordering::AcqRel) {
            tokio::spawn(async move {
                tokio::time::sleep(DEFER_FLUSH).await;
                if conn.flush_scheduled.load(Ordering::Acquire)
                    && let Err(e) = conn.flush().await
                {
                    tracing::debug!(error = %e, "deferred master request not sent");
                }
            });
        }
        Ok(())
    }

    /// Sends every deferred request now (before a process exits, say).
    pub async fn flush(&self) -> Result<(), ClientError> {
        for slot in &self.slots {
            let conn = slot.lock().await.clone();
            if let Some(c) = conn.filter(|c| c.alive.load(Ordering::Acquire)) {
                c.flush().await?;
            }
        }
        Ok(())
    }

    /// Like [`MasterConnection::call`], mapping an unexpected reply shape to `INTERNAL_ERROR`.
    pub async fn call_expect<T>(
        &self,
        req: &MasterRequest,
        pick: impl FnOnce(MasterResponse) -> Option<T>,
    ) -> Result<T, ClientError> {
        let r = self.call(req).await?;
        pick(r).ok_or(ClientError::Code(ErrorCode::InternalError))
    }
}

/// Why a connection could not be made or broke, in a few words.
fn lost_reason(e: ClientError) -> String {
    match e {
        ClientError::Unreachable { reason, .. } => reason,
        e => e.to_string(),
    }
}

/// The error of a call no master answered: every address tried, and why.
fn unreachable(addrs: &[String], failures: Vec<(usize, String, bool)>) -> ClientError {
    let timed_out = failures.iter().any(|(_, _, t)| *t);
    let addr = failures.iter().map(|(i, _, _)| addrs[*i].as_str()).collect::<Vec<_>>().join(", ");
    let reason = match failures.as_slice() {
        [(_, reason, _)] => reason.clone(),
        all => all.iter().map(|(i, r, _)| format!("{}: {r}", addrs[*i])).collect::<Vec<_>>().join("; "),
    };
    ClientError::Unreachable { addr, reason, timed_out }
}

/// A duration as a person reads it: `500 ms`, `5 s`, `1.5 s`.
fn fmt_duration(d: Duration) -> String {
    match d.as_millis() {
        ms if ms % 1000 == 0 && ms > 0 => format!("{} s", ms / 1000),
        ms if ms % 100 == 0 && ms > 1000 => format!("{:.1} s", d.as_secs_f64()),
        ms => format!("{ms} ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(fmt_duration(Duration::from_millis(500)), "500 ms");
        assert_eq!(fmt_duration(Duration::from_secs(5)), "5 s");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(fmt_duration(Duration::from_millis(1234)), "1234 ms");
    }

    #[test]
    fn only_reads_and_state_setting_writes_are_repeated_after_a_failover() {
        let safe: Vec<&str> = MasterOp::ALL.iter().filter(|o| retry_safe(**o)).map(|o| o.name()).collect();
        for op in ["get_replica_list", "batch_exist_key", "list_keys_page", "ping", "remount_segments"] {
            assert!(safe.contains(&op), "{op}");
        }
        for op in ["put_start", "put_end", "batch_put_start", "remove", "batch_remove", "remove_all", "release_leases"]
        {
            assert!(!safe.contains(&op), "{op} must not be repeated");
        }
    }

    #[test]
    fn a_batch_over_the_protocol_limit_is_refused_naming_it() {
        assert!(check_batch(MAX_BATCH).is_ok());
        let e = check_batch(MAX_BATCH + 1).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidParams);
        assert_eq!(e.to_string(), "a batch of 65537 items exceeds the protocol's limit of 65536 per request");
    }
}
