//! The transfer server: serves one-sided READ/WRITE of `(segment, offset, length)` ranges of the segments this
//! process hosts.
//!
//! One tokio task per connection (connections are spread over the runtime's worker threads, unlike the
//! original's single I/O thread). A connection starts with a hello, then carries requests that are answered in
//! order; a client may pipeline. Every range is validated against the hosted segment before any byte moves. A
//! WRITE's payload is read from the socket straight into segment memory and acknowledged only once it is all
//! there (so a writer's PutEnd never precedes its bytes); a READ's reply is one vectored write of
//! `prefix + header` and the segment slice itself, but for a short tail copied out and sent after the range's
//! lease ends, so that a lease never outlives its reply (a reader's next write to the range finds it free).
//!
//! A refused request gets a `TransferResponse::Error` and the connection stays usable: `SEGMENT_NOT_FOUND`
//! for a segment not hosted here, `INVALID_PARAMS` for a range outside the segment (or overflowing, or a READ
//! longer than [`MAX_TRANSFER`], or a READ carrying a payload), `OBJECT_REPLICA_BUSY` for a range a conflicting
//! access holds (see `memory.rs`). A refused WRITE's payload is read and discarded rather than the connection
//! closed: it is bounded by the frame limit, and skipping keeps a pooled connection alive for the next request.
//! A frame that breaks the protocol (oversized length, header longer than the frame, undecodable header,
//! request id 0) gets an `ErrorFrame` under request id 0 and closes that connection only; a frame stalled
//! half-way for longer than the I/O timeout closes it too. The connections are capped
//! ([`TransferServer::with_max_connections`]): idle ones (pooled lanes, peers that never said hello) cannot
//! keep a newcomer out, the longest-idle is closed to make room.
//!
//! With [`TransferServer::with_local_lanes`] the server also accepts peers on its host over a Unix socket
//! (`local`): the same hello and requests, on an accept loop of its own with the same cap, and `Locate`: the
//! range checked and held as for a transfer, and its address answered for the client to copy itself (`vm`),
//! until the client's `Release`, which is answered once they are released (at most [`MAX_PINS`] ranges at once
//! per connection).
//!
//! A disk segment (`SegmentRegistry::register_disk`) is served for reads only: a READ's bytes are read from the
//! disk by its own I/O threads (awaited, under the same grant check, `MAX_TRANSFER` and I/O timeout as a memory
//! read) and sent as the reply; a local lane's `Locate` of a disk range reads it into a buffer the connection
//! keeps until `Release` and answers that buffer's address (at most [`MAX_STAGED`] bytes so kept per
//! connection; a `Locate` past that, or past [`MAX_PINS`] ranges, is answered `NO_AVAILABLE_HANDLE`: the client
//! carries that range over the lane instead). A disk that fails answers `FILE_READ_FAIL` (the connection stays; counted in
//! [`ServerStats::disk_errors`]). A WRITE or write-`Locate` of a disk segment is refused with `INVALID_PARAMS`:
//! only the node itself writes its disk.

use crate::MAX_TRANSFER;
use crate::disk::{DiskBytes, DiskSegment};
use crate::local;
use crate::memory::{SegmentMemory, SegmentPin};
use crate::net::{self, READ_BUFFER};
use crate::registry::SegmentRegistry;
use crescent_net::auth::{AuthFailures, Plane};
use crescent_net::conn::{Conn, Stream};
use crescent_net::frame::{self as frames, ShapeError};
use crescent_net::grant::{self, Bearer, GrantOp, HeldGrants};
use crescent_net::hello::Verifier;
use crescent_net::hello::{self, HandshakeError};
use crescent_net::host::NodeKeys;
use crescent_net::poll::{self, Adaptive, PollGate};
use crescent_net::tls::{self, TlsServer};
use crescent_net::{ServerHandle, Shutdown, Stopping};
use crescent_proto::transfer::{Attachment, GrantUse, SharedSegment, TransferRequest, TransferResponse};
use crescent_proto::wire::{Envelope, ErrorFrame, Head, Limits, WireError};
use crescent_proto::{ErrorCode, SegmentId};
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UnixStream};
use tokio::time::timeout;

/// Default deadline for finishing a frame once its first byte arrived (and for the hello).
pub const DEFAULT_SERVER_IO_TIMEOUT: Duration = Duration::from_secs(30);

/// READ replies at least this large from memfd-backed segments go out with sendfile(2).
const SENDFILE_MIN: usize = 64 << 10;

/// The last bytes of a READ reply, sent only once the read's range lease is released (see `Connection::read`);
/// a read no longer than this is copied out whole and queued like a header-only reply.
const REPLY_TAIL: usize = 4 << 10;

/// Most ranges one local lane may hold located at once (a pipelined run's worth, see `client::batch`).
pub(crate) const MAX_PINS: usize = 256;

/// Most bytes of disk segments one local lane may hold read for its peer's copies (`Locate`) at once.
pub(crate) const MAX_STAGED: u64 = 2 * MAX_TRANSFER;

/// Replies are batched while more pipelined requests are already buffered, up to this many bytes.
const MAX_PENDING_REPLIES: usize = 64 << 10;

/// Counters kept by a running server.
#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    local_accepted: AtomicU64,
    located: AtomicU64,
    open: AtomicUsize,
    malformed: AtomicU64,
    auth_failures: AuthFailures,
    grants_checked: AtomicU64,
    grant_refusals: AtomicU64,
    disk_errors: AtomicU64,
}

/// A snapshot of a server's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted since start.
    pub accepted: u64,
    /// Of those, local lanes (peers on this host, over the Unix socket).
    pub local_accepted: u64,
    /// Ranges located for a local copy (`Locate`), ever.
    pub located: u64,
    /// Connections open now.
    pub open: usize,
    /// Connections closed for breaking the protocol.
    pub malformed: u64,
    /// The connection cap in force (the configured one, lowered to fit the open-file limit).
    pub max_connections: usize,
    /// Idle connections closed to make room for a newcomer at the cap.
    pub shed: u64,
    /// Newcomers refused at the cap because every connection was busy.
    pub refused: u64,
    /// Peers refused for not proving a ticket for this host (see [`TransferServer::with_keys`]).
    pub auth_failures: u64,
    /// Grants whose tags this node checked: one per grant a request carried (a batch's later requests name it).
    pub grants_checked: u64,
    /// Transfers refused for want of a valid grant covering them (missing, forged, expired, out of range, or
    /// another bearer's).
    pub grant_refusals: u64,
    /// Reads of a disk segment the disk failed (answered `FILE_READ_FAIL`, the connection kept).
    pub disk_errors: u64,
}

/// A bound, not yet running, transfer server.
#[derive(Debug)]
pub struct TransferServer {
    listener: TcpListener,
    local_addr: SocketAddr,
    segments: SegmentRegistry,
    io_timeout: Duration,
    /// How long an idle connection polls for its next request before parking (see `crescent_net::poll`).
    poll_window: Duration,
    /// Most connections served at once (see `crescent_net::accept`).
    max_connections: usize,
    /// This host's keys: every peer must prove a ticket for it in its hello; `None`: anyone may talk.
    keys: Option<Arc<NodeKeys>>,
    /// TLS every connection goes through before its hello; `None`: plain TCP.
    tls: Option<Arc<TlsServer>>,
    /// The endpoint this server is advertised at, to serve local lanes under its name (see `crate::local`).
    local_lanes: Option<String>,
    /// What a process attaching to this node over a local lane is told (see [`TransferServer::with_attach`]).
    attach: Option<Arc<Attachment>>,
}

impl TransferServer {
    /// Binds `addr` (port 0 picks a free port) to serve `segments`; must be called inside a tokio runtime.
    pub fn bind(addr: SocketAddr, segments: SegmentRegistry) -> io::Result<TransferServer> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other("TransferServer::bind must be called inside a tokio runtime"));
        }
        let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        // Set on the listener so accepted sockets inherit them from the first byte.
        net::size_buffers(&socket)?;
        socket.set_nodelay(true)?;
        socket.bind(addr)?;
        let listener = socket.listen(1024)?;
        let local_addr = listener.local_addr()?;
        Ok(TransferServer {
            listener,
            local_addr,
            segments,
            io_timeout: DEFAULT_SERVER_IO_TIMEOUT,
            poll_window: Duration::ZERO,
            max_connections: crescent_net::accept::DEFAULT_MAX_CONNECTIONS,
            keys: None,
            tls: None,
            local_lanes: None,
            attach: None,
        })
    }

    /// Also serves peers on this host over a Unix socket named after `endpoint`, the address the server is
    /// advertised at (clients dialling it try that name first: `TransferClient`). Not with TLS (see
    /// `crate::local`); if the name is taken, the server goes on over TCP alone, with a warning.
    pub fn with_local_lanes(mut self, endpoint: Option<String>) -> Self {
        self.local_lanes = endpoint;
        self
    }

    /// Lets processes on this host attach to the node over its local lanes (`TransferRequest::Attach`): they
    /// are told `attachment` (master, name, host; its `segments` are ignored) and given its memfd-backed
    /// segments to map. `None` (the default): an attach is refused with `INVALID_PARAMS`.
    pub fn with_attach(mut self, attachment: Option<Attachment>) -> Self {
        self.attach = attachment.map(Arc::new);
        self
    }

    /// Requires every peer to prove, in its hello, a data-plane ticket the master issued it for the host
    /// holding `keys`, and every transfer a grant sealed for this host (what a peer may touch is the master's to
    /// say); `None` (the default) admits anyone.
    pub fn with_keys(mut self, keys: Option<Arc<NodeKeys>>) -> Self {
        self.keys = keys;
        self
    }

    /// Takes every connection through a TLS handshake (within the I/O timeout) before its hello; `None` (the
    /// default) serves plain TCP. Over TLS payloads are copied through rustls (no sendfile, no receiving straight
    /// into segment memory).
    pub fn with_tls(mut self, tls: Option<Arc<TlsServer>>) -> Self {
        self.tls = tls;
        self
    }

    /// Sets the deadline for finishing a frame once started (and for the hello); idle connections never time out.
    pub fn with_io_timeout(mut self, io_timeout: Duration) -> Self {
        self.io_timeout = io_timeout;
        self
    }

    /// Sets the most connections served at once (lowered to fit the open-file limit). At the cap, the
    /// connection that has waited longest for its next request (or its hello) is closed to make room for a
    /// newcomer (a client's idle pooled lane notices and dials again); when all are busy, the newcomer is
    /// refused with `UNAVAILABLE_IN_CURRENT_STATUS`.
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max;
        self
    }

    /// Sets how long an idle connection polls for its next request before parking; zero (the default) never
    /// polls. Measured on the 2-vCPU VM, a storage node that polls is *slower* (1–4 MiB reads ~20 % lower, small
    /// requests no faster): its requests arrive on several lanes at once and a polling worker sits on one of
    /// them. The master, whose next request follows within a round trip on the same connection, polls.
    pub fn with_poll_window(mut self, window: Duration) -> Self {
        self.poll_window = window;
        self
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Starts accepting on the current tokio runtime.
    pub fn spawn(self) -> io::Result<TransferServerHandle> {
        let TransferServer {
            listener,
            segments,
            io_timeout,
            poll_window,
            max_connections,
            keys,
            tls,
            local_lanes,
            attach,
            ..
        } = self;
        let counters = Arc::new(Counters::default());
        let serving = Serving { segments, io_timeout, poll_window, counters: counters.clone(), keys, attach };
        let local = match local_lanes.filter(|_| tls.is_none()).map(|endpoint| (local::bind(&endpoint), endpoint)) {
            Some((Ok(unix), endpoint)) => {
                let s = serving.clone();
                Some(crescent_net::accept::spawn_on(
                    "transfer-local",
                    unix,
                    endpoint,
                    max_connections,
                    move |stream, _, shutdown| {
                        s.counters.local_accepted.fetch_add(1, Ordering::Relaxed);
                        serve_local(stream, s.clone(), shutdown)
                    },
                ))
            }
            Some((Err(e), endpoint)) => {
                tracing::warn!(%endpoint, error = %e, "no local lanes: peers on this host use TCP");
                None
            }
            None => None,
        };
        let inner =
            crescent_net::accept::spawn("transfer", listener, max_connections, move |stream, peer, shutdown| {
                serve_connection(stream, peer, serving.clone(), shutdown, tls.clone())
            })?;
        Ok(TransferServerHandle { inner, local, counters })
    }
}

/// A running transfer server; dropping it (or [`TransferServerHandle::shutdown`]) stops accepting and closes
/// every connection.
#[derive(Debug)]
pub struct TransferServerHandle {
    inner: ServerHandle,
    /// The local lanes' accept loop, named by the advertised endpoint (see [`TransferServer::with_local_lanes`]).
    local: Option<ServerHandle<String>>,
    counters: Arc<Counters>,
}

impl TransferServerHandle {
    /// Where the server listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    /// The server's counters.
    pub fn stats(&self) -> ServerStats {
        let accept = self.inner.stats();
        let local = self.local.as_ref().map(|l| l.stats());
        ServerStats {
            accepted: self.counters.accepted.load(Ordering::Relaxed),
            local_accepted: self.counters.local_accepted.load(Ordering::Relaxed),
            located: self.counters.located.load(Ordering::Relaxed),
            open: self.counters.open.load(Ordering::Relaxed),
            malformed: self.counters.malformed.load(Ordering::Relaxed),
            max_connections: accept.max_connections,
            shed: accept.shed + local.map_or(0, |l| l.shed),
            refused: accept.refused + local.map_or(0, |l| l.refused),
            auth_failures: self.counters.auth_failures.total(),
            grants_checked: self.counters.grants_checked.load(Ordering::Relaxed),
            grant_refusals: self.counters.grant_refusals.load(Ordering::Relaxed),
            disk_errors: self.counters.disk_errors.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting, closes every connection and waits until all are gone.
    pub async fn shutdown(self) {
        if let Some(local) = self.local {
            local.shutdown().await;
        }
        self.inner.shutdown().await;
    }

    /// Whether peers on this host reach the server over local lanes.
    pub fn serves_local_lanes(&self) -> bool {
        self.local.is_some()
    }
}

/// Keeps the open-connection gauge right however the connection task ends (including abort).
struct OpenGuard(Arc<Counters>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What every connection of a server is served with.
#[derive(Debug, Clone)]
struct Serving {
    segments: SegmentRegistry,
    io_timeout: Duration,
    poll_window: Duration,
    counters: Arc<Counters>,
    /// The cluster secret(s) a peer's hello must prove a credential of.
    keys: Option<Arc<NodeKeys>>,
    /// What an attaching process is told (see [`TransferServer::with_attach`]).
    attach: Option<Arc<Attachment>>,
}

/// Serves a TCP connection: socket setup and, with `tls`, the handshake, then [`serve`].
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    serving: Serving,
    shutdown: Shutdown,
    tls: Option<Arc<TlsServer>>,
) {
    let Serving { counters, io_timeout, .. } = &serving;
    counters.accepted.fetch_add(1, Ordering::Relaxed);
    counters.open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenGuard(counters.clone());
    if let Err(e) = net::tune(&stream) {
        tracing::debug!(%peer, error = %e, "socket setup failed");
        return;
    }
    // Until its hello (TLS handshake included) the connection counts as idle: at the cap it may be closed.
    let conn = tokio::select! {
        biased;
        conn = tls::accept_counted(tls.as_deref(), stream, *io_timeout, &counters.auth_failures, "transfer", peer) => conn,
        () = shutdown.clone().stopping() => return,
    };
    match conn {
        Ok(conn) => serve(conn, Some(peer), serving, shutdown).await,
        Err(e) => tracing::debug!(%peer, "transfer connection closed: {e}"),
    }
}

/// Serves a local lane (a peer on this host, over the Unix socket).
async fn serve_local(stream: UnixStream, serving: Serving, shutdown: Shutdown) {
    serving.counters.accepted.fetch_add(1, Ordering::Relaxed);
    serving.counters.open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenGuard(serving.counters.clone());
    if let Err(e) = local::size_buffers(&stream) {
        tracing::debug!(error = %e, "local lane setup failed");
        return;
    }
    serve(Conn::Local(stream), None, serving, shutdown).await;
}

/// Serves a connection from its hello on; `peer` is `None` for a local lane.
async fn serve(conn: Conn, peer: Option<SocketAddr>, serving: Serving, shutdown: Shutdown) {
    let Serving { segments, io_timeout, poll_window, counters, keys, attach } = serving;
    let idle = Idle { gate: &poll::PROCESS_GATE, poll_window, adaptive: Adaptive::default() };
    let mut connection = Connection::new(conn, peer, segments, io_timeout, idle, shutdown, counters, keys);
    connection.attach = attach;
    match connection.run().await {
        Ok(()) => tracing::debug!(?peer, "transfer connection closed by peer"),
        Err(Close::Protocol(e)) => tracing::debug!(?peer, error = %e, "transfer connection closed: protocol violation"),
        Err(Close::Io(e)) => tracing::debug!(?peer, error = %e, "transfer connection closed: i/o error"),
        Err(Close::Timeout) => tracing::debug!(?peer, "transfer connection closed: timed out mid-frame"),
    }
}

/// Why a connection ended.
#[derive(Debug)]
enum Close {
    Io(io::Error),
    /// The peer broke the protocol; an error frame was sent.
    Protocol(WireError),
    Timeout,
}

impl From<io::Error> for Close {
    fn from(e: io::Error) -> Self {
        Close::Io(e)
    }
}

/// What the connection does after a request.
enum Step {
    Continue,
    Refuse(WireError),
}

struct Connection {
    io: BufReader<Conn>,
    /// Reused header buffer (at most `MAX_HEADER` bytes).
    header: Vec<u8>,
    /// Encoded replies not yet written (batched while pipelined requests are buffered).
    out: Vec<u8>,
    segments: SegmentRegistry,
    io_timeout: Duration,
    idle: Idle,
    max_frame: usize,
    /// Whether the server is stopping (checked between requests, so a client that keeps pipelining is let go
    /// after its request in hand rather than cut off mid-reply).
    shutdown: Shutdown,
    /// The same, as a future an idle wait selects on (made once per connection).
    stopping: Stopping,
    counters: Arc<Counters>,
    /// Who is at the other end (for the log of a failed authentication); `None` on a local lane.
    peer: Option<SocketAddr>,
    /// What the hello must prove (see [`TransferServer::with_keys`]); with it every transfer needs a grant.
    keys: Option<Arc<NodeKeys>>,
    /// Who the hello proved the peer is: the bearer its grants must name (set with keys only).
    bearer: Option<Bearer>,
    /// The grants requests carried in, for the requests after them that name their slots.
    grants: HeldGrants,
    /// Whether this is a local lane (a peer on this host), the only kind that may `Locate`.
    local: bool,
    /// The ranges `Locate`d and not yet released: held, and kept mapped, while the peer copies.
    pins: Vec<SegmentPin>,
    /// The disk ranges `Locate`d and not yet released: read into buffers kept while the peer copies.
    staged: Vec<DiskBytes>,
    /// Bytes in `staged` (at most [`MAX_STAGED`]).
    staged_bytes: u64,
    /// What an attaching process is told; `None`: attaching is refused.
    attach: Option<Arc<Attachment>>,
    /// The segments an `Attach` named, kept (and so their descriptors open under the numbers it gave) until
    /// the peer's `Release`.
    attached: Vec<Arc<SegmentMemory>>,
}

/// How a connection waits for its next request: it polls (one connection of the server at a time) before
/// parking, since a client's next stripe or object usually follows within a round trip.
struct Idle {
    gate: &'static PollGate,
    poll_window: Duration,
    /// Backs this connection's polling off when its requests do not come within the window.
    adaptive: Adaptive,
}

impl Connection {
    #[allow(clippy::too_many_arguments)]
    fn new(
        stream: Conn,
        peer: Option<SocketAddr>,
        segments: SegmentRegistry,
        io_timeout: Duration,
        idle: Idle,
        shutdown: Shutdown,
        counters: Arc<Counters>,
        keys: Option<Arc<NodeKeys>>,
    ) -> Self {
        let local = matches!(stream, Conn::Local(_));
        Connection {
            io: BufReader::with_capacity(READ_BUFFER, stream),
            header: Vec::new(),
            out: Vec::new(),
            segments,
            io_timeout,
            idle,
            max_frame: Limits::DATA.max_frame as usize,
            stopping: shutdown.clone().stopping(),
            shutdown,
            counters,
            peer,
            keys,
            bearer: None,
            grants: HeldGrants::default(),
            local,
            pins: Vec::new(),
            staged: Vec::new(),
            staged_bytes: 0,
            attach: None,
            attached: Vec::new(),
        }
    }

    async fn run(&mut self) -> Result<(), Close> {
        // Until its hello the connection counts as idle: at the connection cap it may be closed to make room.
        let hello = tokio::select! {
            biased;
            hello = hello::answer(&mut self.io, Plane::Data, Limits::DATA, self.io_timeout, self.keys.as_deref().map(Verifier::Host)) => hello,
            () = &mut self.stopping => return Ok(()),
        };
        self.shutdown.busy();
        match hello {
            Ok(Some(admitted)) => {
                self.bearer = admitted.principal.map(|p| Bearer::new(p, admitted.hello.client_id));
            }
            Ok(None) => return Ok(()),
            Err(HandshakeError::Unauthenticated(why)) => {
                self.counters.auth_failures.record("transfer", self.peer, &why);
                return Ok(());
            }
            Err(HandshakeError::Protocol(e)) => {
                // Counted before the peer can see the refusal.
                self.counters.malformed.fetch_add(1, Ordering::Relaxed);
                hello::refuse(&mut self.io, &e).await;
                return Err(Close::Protocol(e));
            }
            Err(HandshakeError::Timeout) => return Err(Close::Timeout),
            Err(e) => return Err(Close::Io(io::Error::other(e))),
        }
        loop {
            let stopping = self.shutdown.is_stopping();
            if !self.out.is_empty()
                && (stopping || self.out.len() >= MAX_PENDING_REPLIES || !self.next_frame_buffered())
            {
                // About to wait for the peer (or to go): everything answered so far must be on the wire first.
                timeout(self.io_timeout, self.flush()).await.map_err(|_| Close::Timeout)??;
            }
            if stopping {
                return Ok(());
            }
            // Idle connections (pooled lanes) wait here without a deadline; once a frame starts, all of it
            // (and its reply) must happen within the I/O timeout.
            // A connection that waits says so: at the connection cap the longest-waiting one is closed to
            // make room.
            let waits = self.io.buffer().is_empty();
            if waits {
                self.idle.adaptive.poll(self.idle.gate, &self.io.socket(), self.idle.poll_window);
                self.shutdown.idle();
            }
            let started = tokio::select! {
                biased;
                started = frames::frame_starts(&mut self.io) => started?,
                () = &mut self.stopping => false,
            };
            if waits {
                self.shutdown.busy();
            }
            if !started {
                return Ok(());
            }
            match timeout(self.io_timeout, self.request()).await {
                Err(_) => return Err(Close::Timeout),
                Ok(Err(e)) => return Err(e),
                Ok(Ok(Step::Continue)) => {}
                Ok(Ok(Step::Refuse(e))) => {
                    self.refuse(&ErrorFrame { code: e.code(), message: e.to_string() }).await;
                    return Err(Close::Protocol(e));
                }
            }
        }
    }

    /// Whether a whole frame is already buffered (so no flush is needed before handling it).
    fn next_frame_buffered(&self) -> bool {
        let b = self.io.buffer();
        b.len() >= 4 && b.len() - 4 >= u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
    }

    async fn read_header(&mut self, len: usize) -> io::Result<()> {
        self.header.resize(len, 0);
        self.io.read_exact(&mut self.header).await?;
        Ok(())
    }

    async fn request(&mut self) -> Result<Step, Close> {
        // The announced length is checked before anything is read or allocated for the frame.
        let shape = match frames::read_shape(&mut self.io, self.max_frame).await {
            Ok(shape) => shape,
            Err(ShapeError::Wire(e)) => return Ok(Step::Refuse(e)),
            Err(ShapeError::Io(e)) => return Err(Close::Io(e)),
        };
        if shape.header_len > crescent_proto::wire::MAX_DATA_HEADER {
            return Ok(Step::Refuse(WireError::Malformed("data-plane header too long")));
        }
        self.read_header(shape.header_len).await?;
        let Envelope { id, body } = match postcard::from_bytes::<Envelope<TransferRequest>>(&self.header) {
            Ok(env) => env,
            Err(e) => return Ok(Step::Refuse(WireError::Decode(e.to_string()))),
        };
        if id == 0 {
            return Ok(Step::Refuse(WireError::Malformed("request id 0 is reserved for the hello")));
        }
        match body {
            TransferRequest::Write { segment, offset, grant } => {
                let len = shape.payload_len;
                match self.check_grant(GrantOp::Write, &segment, grant, offset, len as u64) {
                    Ok(()) => self.write(id, segment, offset, len).await?,
                    Err(code) => self.refuse_write(id, len, code).await?,
                }
            }
            TransferRequest::Read { segment, offset, length, grant } if shape.payload_len == 0 => {
                match self.check_grant(GrantOp::Read, &segment, grant, offset, length) {
                    Ok(()) => self.read(id, segment, offset, length).await?,
                    Err(code) => self.queue(id, &TransferResponse::Error(code))?,
                }
            }
            TransferRequest::Locate { segment, offset, length, write, grant }
                if shape.payload_len == 0 && self.local =>
            {
                let op = if write { GrantOp::Write } else { GrantOp::Read };
                let located = match self.check_grant(op, &segment, grant, offset, length) {
                    Ok(()) => self.locate(segment, offset, length, write).await,
                    Err(code) => Err(code),
                };
                match located {
                    Ok(addr) => self.queue(id, &TransferResponse::Located(addr))?,
                    Err(code) => self.queue(id, &TransferResponse::Error(code))?,
                }
            }
            TransferRequest::Attach if shape.payload_len == 0 && self.local => {
                let reply = match self.attachment() {
                    Some(attachment) => TransferResponse::Attached(attachment),
                    None => TransferResponse::Error(ErrorCode::InvalidParams),
                };
                self.queue(id, &reply)?;
            }
            TransferRequest::Release if shape.payload_len == 0 => {
                self.attached.clear();
                self.pins.clear();
                self.staged.clear();
                self.staged_bytes = 0;
                self.queue(id, &TransferResponse::Released)?;
            }
            TransferRequest::Read { .. }
            | TransferRequest::Locate { .. }
            | TransferRequest::Release
            | TransferRequest::Attach => {
                frames::skip(&mut self.io, shape.payload_len).await?;
                self.queue(id, &TransferResponse::Error(ErrorCode::InvalidParams))?;
            }
        }
        Ok(Step::Continue)
    }

    /// The answer to an `Attach`: the node's attachment with its memfd-backed segments, held until `Release`.
    fn attachment(&mut self) -> Option<Attachment> {
        use std::os::fd::AsRawFd;
        let mut attachment = Attachment::clone(self.attach.as_ref()?);
        for (segment, memory) in self.segments.memories() {
            let Some(fd) = memory.fd() else { continue };
            let Ok(meta) = rustix::fs::fstat(fd) else { continue };
            attachment.segments.push(SharedSegment {
                segment,
                fd: fd.as_raw_fd(),
                inode: meta.st_ino,
                length: memory.len(),
            });
            self.attached.push(memory);
        }
        Some(attachment)
    }

    /// With keys, whether the peer holds a grant for this transfer (one HMAC per grant it carries, none per
    /// request naming a grant held; no round trip).
    fn check_grant(
        &mut self,
        op: GrantOp,
        segment: &SegmentId,
        grant: Option<GrantUse>,
        offset: u64,
        length: u64,
    ) -> Result<(), ErrorCode> {
        let Some(keys) = &self.keys else { return Ok(()) };
        // An authenticating server admits only proven peers, so a bearer is always known here.
        let Some(bearer) = &self.bearer else { return Err(ErrorCode::PermissionDenied) };
        if matches!(grant, Some(GrantUse::Carried { .. })) {
            self.counters.grants_checked.fetch_add(1, Ordering::Relaxed);
        }
        let now = grant::unix_ms();
        self.grants.check(keys, op, segment, bearer, grant, offset, length, now).map_err(|why| {
            self.counters.grant_refusals.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(peer = ?self.peer, ?op, %segment, offset, length, %why, "transfer refused");
            why.code()
        })
    }

    /// The memory segment `segment`; for a disk segment, `INVALID_PARAMS` (what a transfer asks of memory
    /// only, a disk segment cannot do), else `SEGMENT_NOT_FOUND`.
    fn segment(&self, segment: &SegmentId) -> Result<Arc<SegmentMemory>, ErrorCode> {
        match self.segments.get(segment) {
            Some(mem) => Ok(mem),
            None if self.segments.disk(segment).is_some() => Err(ErrorCode::InvalidParams),
            None => Err(ErrorCode::SegmentNotFound),
        }
    }

    /// Holds a range for the peer's own copy and answers its address: a memory range pinned in place, a disk
    /// range (for reading only) read into a buffer kept until `Release`.
    async fn locate(&mut self, segment: SegmentId, offset: u64, length: u64, write: bool) -> Result<u64, ErrorCode> {
        if length > MAX_TRANSFER {
            return Err(ErrorCode::InvalidParams);
        }
        // Holding all it may for this peer until its Release: NO_AVAILABLE_HANDLE tells the client to carry the
        // range over the lane instead (a READ or WRITE), not that the range is bad.
        if self.pins.len() + self.staged.len() >= MAX_PINS {
            return Err(ErrorCode::NoAvailableHandle);
        }
        let addr = match self.segments.disk(&segment) {
            Some(disk) => {
                if write {
                    return Err(ErrorCode::InvalidParams);
                }
                if self.staged_bytes + length > MAX_STAGED {
                    return Err(ErrorCode::NoAvailableHandle);
                }
                let bytes = self.read_disk(&disk, offset, length).await?;
                let addr = bytes.as_ptr() as u64;
                self.staged_bytes += length;
                self.staged.push(bytes);
                addr
            }
            None => {
                let pin = self.segment(&segment)?.pin(offset, length, write).map_err(|e| e.code())?;
                let addr = pin.addr();
                self.pins.push(pin);
                addr
            }
        };
        self.counters.located.fetch_add(1, Ordering::Relaxed);
        Ok(addr)
    }

    /// `length` bytes of `disk` at `offset`, from its I/O threads; a failing disk is counted and logged.
    async fn read_disk(&self, disk: &DiskSegment, offset: u64, length: u64) -> Result<DiskBytes, ErrorCode> {
        let len = usize::try_from(length).map_err(|_| ErrorCode::InvalidParams)?;
        disk.read(offset, len).await.map_err(|e| {
            if e.is_device() {
                self.counters.disk_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(peer = ?self.peer, offset, length, error = %e, "disk read failed");
            }
            e.code()
        })
    }

    async fn write(&mut self, id: u64, segment: SegmentId, offset: u64, len: usize) -> Result<(), Close> {
        let mem = match self.segment(&segment) {
            Ok(mem) => mem,
            Err(code) => return self.refuse_write(id, len, code).await,
        };
        let mut dst = match mem.lease_mut(offset, len as u64) {
            Ok(dst) => dst,
            Err(e) => return self.refuse_write(id, len, e.code()).await,
        };
        // Straight from the socket into the segment.
        let Idle { gate, poll_window, .. } = &self.idle;
        net::read_payload(&mut self.io, &mut dst, |sock| gate.poll(sock, *poll_window), |_| {}).await?;
        drop(dst);
        self.queue(id, &TransferResponse::Written)
    }

    async fn refuse_write(&mut self, id: u64, len: usize, code: ErrorCode) -> Result<(), Close> {
        tracing::debug!(id, len, %code, "write refused");
        frames::skip(&mut self.io, len).await?;
        self.queue(id, &TransferResponse::Error(code))
    }

    async fn read(&mut self, id: u64, segment: SegmentId, offset: u64, length: u64) -> Result<(), Close> {
        let mem = match self.segments.get(&segment) {
            Some(mem) => mem,
            None => return self.read_from_disk(id, segment, offset, length).await,
        };
        if length > MAX_TRANSFER {
            return self.queue(id, &TransferResponse::Error(ErrorCode::InvalidParams));
        }
        let src = match mem.lease(offset, length) {
            Ok(src) => src,
            Err(e) => {
                tracing::debug!(id, offset, length, error = %e, "read refused");
                return self.queue(id, &TransferResponse::Error(e.code()));
            }
        };
        let head = Head::encode(id, &TransferResponse::Data, src.len()).map_err(|e| Close::Io(io::Error::other(e)))?;
        self.out.extend_from_slice(head.as_bytes());
        // The lease ends before the reply's last bytes reach the socket, so it can never outlive the reply: a
        // reader that has its last byte may at once send a write to the same range (a put into a range that
        // eviction just freed, or the same client rewriting it), and that write must find the range free. So
        // the body goes out from segment memory under the lease, the tail is copied out, the lease released,
        // and the copy queued (flushed before the connection next waits, or with the next pipelined reply).
        // Holding a conflicting request until the lease ends instead would let a stalled reader delay writers
        // on other connections, and keep the refusal from meaning what it says (a real conflict).
        let (body, tail) = src.split_at(src.len() - src.len().min(REPLY_TAIL));
        if let Some(fd) = mem.fd().filter(|_| body.len() >= SENDFILE_MIN && self.io.plain().is_some()) {
            // memfd-backed: the socket takes references to the segment's pages instead of a copy of them
            // (over loopback the reader's receive is then the only copy). They are still referenced after the
            // lease ends, but a reader that has the tail has received them; only a write that breaks the
            // master's protocol could change them in flight, and the reader's checksum would tell.
            self.io.get_mut().write_all(&self.out).await?;
            self.out.clear();
            match self.io.plain() {
                Some(sock) => net::send_file(sock, fd, offset, body.len()).await?,
                // Not reached (checked above), but never a reply without its body.
                None => self.io.get_mut().write_all(body).await?,
            }
        } else if !body.is_empty() {
            // Pending replies, this reply's prefix and header, and the body straight from segment memory.
            frames::write_all_vectored(self.io.get_mut(), &mut [IoSlice::new(&self.out), IoSlice::new(body)]).await?;
            self.out.clear();
        }
        self.out.extend_from_slice(tail);
        drop(src);
        Ok(())
    }

    /// A READ of a disk segment: the bytes are read by the disk's threads, then sent (a copy: no lease to end).
    async fn read_from_disk(&mut self, id: u64, segment: SegmentId, offset: u64, length: u64) -> Result<(), Close> {
        let Some(disk) = self.segments.disk(&segment) else {
            return self.queue(id, &TransferResponse::Error(ErrorCode::SegmentNotFound));
        };
        if length > MAX_TRANSFER {
            return self.queue(id, &TransferResponse::Error(ErrorCode::InvalidParams));
        }
        let bytes = match self.read_disk(&disk, offset, length).await {
            Ok(bytes) => bytes,
            Err(code) => return self.queue(id, &TransferResponse::Error(code)),
        };
        let head =
            Head::encode(id, &TransferResponse::Data, bytes.len()).map_err(|e| Close::Io(io::Error::other(e)))?;
        self.out.extend_from_slice(head.as_bytes());
        if bytes.len() <= REPLY_TAIL {
            self.out.extend_from_slice(&bytes);
        } else {
            frames::write_all_vectored(self.io.get_mut(), &mut [IoSlice::new(&self.out), IoSlice::new(&bytes)]).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Queues a header-only reply; written when the connection would otherwise wait or the batch is large.
    fn queue<T: serde::Serialize>(&mut self, id: u64, body: &T) -> Result<(), Close> {
        let head = Head::encode(id, body, 0).map_err(|e| Close::Io(io::Error::other(e)))?;
        self.out.extend_from_slice(head.as_bytes());
        Ok(())
    }

    /// Writes the queued replies (and, over TLS, whatever records rustls still holds).
    async fn flush(&mut self) -> io::Result<()> {
        let r = self.io.get_mut().write_all(&self.out).await;
        self.out.clear();
        r?;
        self.io.get_mut().flush().await
    }

    /// Ends a connection that broke the protocol: the replies owed so far, then `body` as an error frame under
    /// request id 0, then a graceful close ([`frames::refuse`]).
    async fn refuse(&mut self, body: &ErrorFrame) {
        // Counted before the peer can see the refusal.
        self.counters.malformed.fetch_add(1, Ordering::Relaxed);
        let pending = std::mem::take(&mut self.out);
        frames::refuse(&mut self.io, &pending, body).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A connection serving `segments` on one end of a loopback socket pair; the other end is returned.
    async fn connection(segments: SegmentRegistry) -> (Connection, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (stream, from) = listener.accept().await.unwrap();
        let idle = Idle { gate: &poll::PROCESS_GATE, poll_window: Duration::ZERO, adaptive: Adaptive::default() };
        let conn = Connection::new(
            Conn::Plain(stream),
            Some(from),
            segments,
            DEFAULT_SERVER_IO_TIMEOUT,
            idle,
            Shutdown::default(),
            Arc::default(),
            None,
        );
        (conn, peer)
    }

    /// The moment a reader can have its whole reply, the read's range lease is gone: when `read` has handed
    /// the socket all it will before the connection next flushes, the lease is released and the reply's last
    /// bytes are still queued here, not on the wire. (Before, the lease was released after the last byte was
    /// sent, and a write the reader sent right away could be refused as busy.)
    #[tokio::test(flavor = "current_thread")]
    async fn a_reads_lease_ends_before_its_last_bytes_are_sent() {
        let memories =
            [SegmentMemory::anonymous(4 << 20).unwrap(), SegmentMemory::memfd("lease-test", 4 << 20).unwrap()];
        for mem in memories {
            let mem = Arc::new(mem);
            let data: Vec<u8> = (0..mem.len()).map(|i| (i * 7 + i / 4099) as u8).collect();
            mem.write_at(0, &data).unwrap();
            let segments = SegmentRegistry::new();
            let segment = SegmentId::random();
            segments.register(segment, mem.clone());
            let memfd = mem.fd().is_some();
            // Copied whole, exactly one tail, one byte of body, below and above the sendfile threshold, large.
            for len in [1, REPLY_TAIL, REPLY_TAIL + 1, SENDFILE_MIN, SENDFILE_MIN + REPLY_TAIL + 1, 3 << 20] {
                let (mut conn, mut peer) = connection(segments.clone()).await;
                let offset = 13u64;
                let head = Head::encode(9, &TransferResponse::Data, len).unwrap();
                let total = head.as_bytes().len() + len;
                let tail = len.min(REPLY_TAIL);
                // A reply with no body is queued whole, header and all.
                let queued = if tail == len { total } else { tail };
                let mut got = vec![0u8; total];
                let (served, received) = tokio::join!(
                    conn.read(9, segment, offset, len as u64),
                    peer.read_exact(&mut got[..total - queued])
                );
                served.unwrap();
                received.unwrap();
                let case = format!("memfd {memfd}, {len} B");
                mem.lease_mut(offset, len as u64).unwrap_or_else(|e| panic!("{case}: lease still held: {e:?}"));
                assert_eq!(conn.out.len(), queued, "{case}: the tail waits for the flush");
                let mut more = [0u8; 1];
                let on_wire = rustix::net::recv(&peer, &mut more, rustix::net::RecvFlags::DONTWAIT);
                assert!(matches!(on_wire, Err(rustix::io::Errno::AGAIN)), "{case}: sent before the lease ended");
                conn.flush().await.unwrap();
                peer.read_exact(&mut got[total - queued..]).await.unwrap();
                assert_eq!(&got[..head.as_bytes().len()], head.as_bytes(), "{case}: header");
                let offset = offset as usize;
                assert!(got[head.as_bytes().len()..] == data[offset..offset + len], "{case}: bytes");
            }
        }
    }
}
