//! The connection to the master: a few persistent multiplexed connections, request ids, timeouts, and
//! reconnection (a restarted master is simply dialled again).
//!
//! Each connection has a writer (the caller sends its frame under a short mutex) and a reader task that
//! routes replies to waiting callers by request id, so many requests are in flight on one socket.

use crate::error::ClientError;
use bytes::Bytes;
use crescent_net::hello::{self, HandshakeError};
use crescent_net::poll::InFlight;
use crescent_net::reader::FrameReader;
use crescent_proto::wire::{Frame, FrameCodec, Limits, PeerRole, WireError};
use crescent_proto::{ClientId, ErrorCode, MasterReply, MasterRequest, MasterResponse};
use futures_util::SinkExt;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::oneshot;
use tokio_util::codec::FramedWrite;

type Pending = Mutex<HashMap<u64, oneshot::Sender<Result<Frame, WireError>>>>;
/// The read half of a connection and the frames buffered from it.
struct Reader {
    sock: OwnedReadHalf,
    frames: FrameReader,
}

/// One socket to the master. There is no reader task: a caller that is waiting for its reply takes the read
/// half itself and hands any other caller's reply over through `pending` (leader/follower). A lone caller
/// therefore reads its own reply with no task switch in between — on small VMs every wake-up of another
/// thread costs several microseconds.
struct Conn {
    /// How long a lone waiter polls before parking.
    poll_window: Duration,
    sink: tokio::sync::Mutex<FramedWrite<OwnedWriteHalf, FrameCodec>>,
    stream: tokio::sync::Mutex<Reader>,
    pending: Pending,
    alive: AtomicBool,
    /// A deferred request sits in `sink`'s buffer and a task will flush it unless a request does first.
    flush_scheduled: AtomicBool,
}

/// How long a deferred request may wait for a request to ride with before it is sent on its own.
const DEFER_FLUSH: Duration = Duration::from_millis(2);

impl Conn {
    /// Writes out whatever deferred requests `sink` holds.
    async fn flush(&self) -> Result<(), WireError> {
        self.flush_scheduled.store(false, Ordering::Release);
        self.sink.lock().await.flush().await
    }

    /// Marks the connection dead and fails every waiter.
    fn fail_all(&self, why: &'static str) {
        self.alive.store(false, Ordering::Release);
        let waiters: Vec<_> = self.pending.lock().drain().collect();
        for (_, tx) in waiters {
            let _ = tx.send(Err(WireError::Malformed(why)));
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
                let sock = sock.as_ref();
                // Lead until our own reply comes, handing the others' on: passing the read half back
                // after every frame would wake another task per reply.
                loop {
                    let mut next = frames.buffered().transpose();
                    // The client's only exchange polls (bounded by `poll_window`) for its reply and reads what the poll
                    // saw at once (see `crescent_net::poll`).
                    if next.is_none()
                        && inflight.count() == 1
                        && crescent_net::poll::until_readable(sock, self.poll_window)
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
                                self.fail_all("master reported a protocol error");
                                return Err(WireError::Malformed("master reported a protocol error"));
                            }
                            if let Some(tx) = self.pending.lock().remove(&rid) {
                                let _ = tx.send(Ok(frame));
                            }
                        }
                        Some(Err(e)) => {
                            self.fail_all("master connection error");
                            return Err(e);
                        }
                        None => {
                            self.fail_all("master connection closed");
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
    /// The configured address list as given (`host:port[,host:port…]`).
    addr: String,
    /// Candidate masters; the one that answered last is tried first.
    addrs: Vec<String>,
    preferred: AtomicUsize,
    client: ClientId,
    role: PeerRole,
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

async fn dial(
    addr: &str,
    role: PeerRole,
    client: ClientId,
    timeout: Duration,
    poll_window: Duration,
) -> Result<Arc<Conn>, ClientError> {
    let unreachable = |reason: String| ClientError::Unreachable { addr: addr.to_owned(), reason };
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| unreachable(format!("no answer within {} ms", timeout.as_millis())))?
        .map_err(|e| unreachable(crate::error::io_reason(&e)))?;
    let mut stream = stream;
    stream.set_nodelay(true).map_err(WireError::Io)?;
    match tokio::time::timeout(timeout, hello::open(&mut stream, role, Some(client))).await {
        Err(_) | Ok(Err(HandshakeError::Timeout)) => return Err(ClientError::Timeout),
        Ok(Ok(_)) => {}
        Ok(Err(HandshakeError::Refused(refusal))) => {
            tracing::warn!(%addr, message = %refusal.message, "master refused the connection");
            return Err(ClientError::Refused(refusal));
        }
        Ok(Err(HandshakeError::Protocol(e))) => return Err(e.into()),
        Ok(Err(HandshakeError::Io(e))) => return Err(WireError::Io(e).into()),
    }
    let (rd, wr) = stream.into_split();
    let sink = FramedWrite::new(wr, FrameCodec::new(Limits::CONTROL));
    let reader = Reader { sock: rd, frames: FrameReader::new(Limits::CONTROL) };
    Ok(Arc::new(Conn {
        poll_window,
        sink: tokio::sync::Mutex::new(sink),
        stream: tokio::sync::Mutex::new(reader),
        pending: Mutex::new(HashMap::new()),
        alive: AtomicBool::new(true),
        flush_scheduled: AtomicBool::new(false),
    }))
}

impl MasterConnection {
    /// A connection to `addr` (one address, or several separated by commas: they are tried in turn) for
    /// `client` with `connections` sockets (dialled lazily).
    pub fn new(addr: &str, client: ClientId, role: PeerRole, connections: usize, timeout: Duration) -> Self {
        let addrs: Vec<String> = addr.split(',').map(str::trim).filter(|a| !a.is_empty()).map(str::to_owned).collect();
        Self {
            addr: addr.to_owned(),
            addrs,
            preferred: AtomicUsize::new(0),
            client,
            role,
            timeout,
            poll_window: Duration::ZERO,
            inflight: Arc::default(),
            slots: (0..connections.max(1)).map(|_| tokio::sync::Mutex::new(None)).collect(),
            next_slot: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        }
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

    /// The master address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The connection for `req`. Single-key requests share the first connection: concurrent ones pipeline,
    /// so one write carries several requests and one read several replies (4 concurrent lookups on a 2-vCPU
    /// host: 122k/s on one connection, 62k/s on four). Batches, each a longer job for the master, are spread
    /// over all connections so the master's workers serve them in parallel (batch-128 lookups: 961k keys/s
    /// on four connections, 789k on one).
    async fn conn(&self, req: &MasterRequest) -> Result<Arc<Conn>, ClientError> {
        let i = if req.op().is_batch() { self.next_slot.fetch_add(1, Ordering::Relaxed) % self.slots.len() } else { 0 };
        let mut slot = self.slots[i].lock().await;
        if let Some(c) = slot.as_ref().filter(|c| c.alive.load(Ordering::Acquire)) {
            return Ok(c.clone());
        }
        let n = self.addrs.len();
        if n == 0 {
            return Err(ClientError::Code(ErrorCode::InvalidParams));
        }
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut last = ClientError::Code(ErrorCode::RpcFail);
        for k in 0..n {
            let i = (first + k) % n;
            match dial(&self.addrs[i], self.role, self.client, self.timeout, self.poll_window).await {
                Ok(c) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    *slot = Some(c.clone());
                    return Ok(c);
                }
                Err(e) => {
                    tracing::debug!(addr = %self.addrs[i], error = %e, "master unreachable");
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// Sends one request and waits for its reply.
    pub async fn call(&self, req: &MasterRequest) -> Result<MasterResponse, ClientError> {
        let conn = self.conn(req).await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = Frame::encode(id, req, Bytes::new())?;
        let (tx, rx) = oneshot::channel();
        conn.pending.lock().insert(id, tx);
        // The write also carries any deferred requests queued before this one.
        let sent = conn.sink.lock().await.send(frame).await;
        if let Err(e) = sent {
            conn.pending.lock().remove(&id);
            conn.alive.store(false, Ordering::Release);
            return Err(e.into());
        }
        let counted = self.inflight.enter();
        let waited = tokio::time::timeout(self.timeout, conn.wait(id, rx, &self.inflight)).await;
        drop(counted);
        let frame = match waited {
            Ok(r) => r?,
            Err(_) => {
                conn.pending.lock().remove(&id);
                return Err(ClientError::Timeout);
            }
        };
        let reply: MasterReply = frame.decode::<MasterReply>()?.body;
        reply.map_err(ClientError::Refused)
    }

    /// Queues one request whose reply nobody waits for (whoever reads the connection next discards it): it
    /// leaves in the same write as the next request on that connection, or on its own within a couple of
    /// milliseconds if none comes. For notifications such as lease releases, which then cost neither a round
    /// trip nor a syscall of their own.
    pub async fn send_deferred(&self, req: &MasterRequest) -> Result<(), ClientError> {
        let conn = self.conn(req).await?;
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
