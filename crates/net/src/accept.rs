//! The accept loop every server runs, and the handle that stops it.
//!
//! Each connection is served by a task of its own, kept in a `JoinSet` owned by the loop: stopping the loop
//! stops accepting, tells every connection to finish ([`Shutdown`]), waits a bounded time for them, and aborts
//! the rest, so no connection task outlives its server. Accepted sockets join the process's idle set (see
//! [`crate::poll`]).
//!
//! No peer can take the server's descriptors or its loop:
//!
//! * The loop serves at most `max_connections` at once, lowered to fit the process's open-file limit
//!   ([`fitting_cap`]). At the cap a newcomer makes room by closing an idle connection (connections say when
//!   they wait: [`Shutdown::idle`]): one that never said hello, else one that never sent a request, else the
//!   one that has waited longest for its next request. When every connection is in the middle of a request,
//!   the newcomer is refused at once with a `HelloReply` error (`UNAVAILABLE_IN_CURRENT_STATUS`) rather than
//!   left unanswered in the backlog.
//! * An accept error (typically `EMFILE`) backs off exponentially from 1 ms to 100 ms instead of spinning,
//!   and every recurring warning is said at most once a second, with the count of those not said.

use crescent_proto::ErrorCode;
use crescent_proto::wire::{ErrorFrame, Frame, HelloReply, frame_prefix};
use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long a stopping server waits for its connections to finish before aborting them.
const DRAIN: Duration = Duration::from_secs(1);

/// The first pause after a failed accept; each further failure in a row doubles it, up to [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(1);

/// The longest pause after failed accepts: short enough that a server whose descriptors were exhausted serves
/// again well within a second of them being freed.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_millis(100);

/// The default cap on a server's connections (before [`fitting_cap`] lowers it to the open-file limit).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Descriptors left free beside a server's connections under an open-file limit of `limit`: listeners, log
/// files, epoll instances, a node's segment memfds and master connection, and a newcomer accepted at the cap
/// to make room or to be refused.
fn fd_headroom(limit: u64) -> u64 {
    (limit / 8).clamp(32, 1024)
}

/// `configured`, lowered so that many connections fit under the process's open-file limit (`RLIMIT_NOFILE`)
/// with room to spare. Past that limit `accept` fails with `EMFILE` and newcomers wait unanswered in the
/// backlog; under it, the loop can always accept a newcomer to make room for it or refuse it.
pub fn fitting_cap(configured: usize) -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    cap_under(configured, limit)
}

fn cap_under(configured: usize, limit: Option<u64>) -> usize {
    let Some(limit) = limit else { return configured.max(1) };
    let fits = usize::try_from(limit.saturating_sub(fd_headroom(limit))).unwrap_or(usize::MAX);
    configured.min(fits).max(1)
}

/// Milliseconds since the first call in this process, plus one (so never [`BUSY`]); below 2^56.
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let ms = u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX);
    ms.min((1 << RANK_SHIFT) - 2) + 1
}

/// A connection's [`Activity`] mark while it works on a request.
const BUSY: u64 = 0;

/// Where an idle connection's rank sits in its mark (below it: when it began to wait, in [`now_ms`]).
const RANK_SHIFT: u32 = 56;

/// What a connection is doing, for the accept loop choosing one to close at the cap: [`BUSY`], or when it
/// began to wait ([`now_ms`]) under its rank, so the lowest mark is the first to go: connections that never
/// said hello (rank 0), then those that said hello but never sent a request (1), then those that did (2),
/// each the longest-waiting first. A client's working connections, idle between its requests, are the last
/// to go; a flood of connections that only connect or say hello makes room from among its own.
#[derive(Debug, Default)]
struct Activity {
    mark: AtomicU64,
    /// Times the connection became busy (its hello, then requests), capped at 2: its rank when idle.
    rank: AtomicU64,
}

/// Tells a connection its server is stopping, or that the server closes it to make room for a newcomer: it
/// should finish the request in hand and return. The connection in turn says when it waits for its next
/// request ([`Shutdown::idle`]), which makes it a candidate for closing at the cap. The default one never
/// fires (a connection served outside an accept loop, e.g. in a test).
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    /// Wakes an idle wait ([`Shutdown::stopping`]); cancelled for the whole server, or for this connection
    /// alone when it is closed to make room.
    token: CancellationToken,
    /// Read between requests: one atomic load (the token's own check takes a mutex, on every request).
    flag: Arc<AtomicBool>,
    /// This connection's idle mark, read by the accept loop when it must make room.
    activity: Arc<Activity>,
}

impl Shutdown {
    /// Whether the server is stopping.
    pub fn is_stopping(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Completes once the server is stopping, or once it closes this connection to make room (for `select!`
    /// beside an idle wait). Make it once per connection and poll the same one at every wait: it registers with the
    /// server once, where a fresh wait would register (and unregister) at every request.
    pub fn stopping(self) -> Stopping {
        Stopping(Box::pin(self.token.cancelled_owned()))
    }

    /// The connection now waits for its next request (or its hello): at the connection cap, the server may
    /// close it to make room (those that never sent a request first, then the longest-waiting). Call
    /// [`Shutdown::busy`] once its hello or a request arrives.
    pub fn idle(&self) {
        let rank = self.activity.rank.load(Ordering::Relaxed);
        self.activity.mark.store(rank << RANK_SHIFT | now_ms(), Ordering::Relaxed);
    }

    /// The connection works on its hello or a request: it is not closed to make room (see [`Shutdown::idle`]).
    pub fn busy(&self) {
        self.activity.mark.store(BUSY, Ordering::Relaxed);
        if self.activity.rank.load(Ordering::Relaxed) < 2 {
            self.activity.rank.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Tells every connection holding this signal (or a child of it) to stop.
    fn stop(&self) {
        self.flag.store(true, Ordering::Release);
        self.token.cancel();
    }

    /// A signal for one new connection, idle from now (it owes its hello): it fires with this one, and its
    /// idle wait registers with a node of its own rather than one shared by every connection of the server.
    fn child(&self) -> Shutdown {
        let child = Shutdown { token: self.token.child_token(), flag: self.flag.clone(), activity: Arc::default() };
        child.idle();
        child
    }
}

/// See [`Shutdown::stopping`].
#[derive(Debug)]
pub struct Stopping(std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>);

impl Future for Stopping {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

/// What an accept loop has counted.
#[derive(Debug, Default)]
struct Counters {
    /// Connections served now.
    open: AtomicU64,
    accepted: AtomicU64,
    shed: AtomicU64,
    refused: AtomicU64,
    accept_errors: AtomicU64,
}

/// A snapshot of an accept loop's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptStats {
    /// The cap in force: the configured one, lowered to fit the open-file limit ([`fitting_cap`]).
    pub max_connections: usize,
    /// Connections served now.
    pub open: u64,
    /// Connections accepted and served, ever (refused ones not included).
    pub accepted: u64,
    /// Idle connections closed to make room for a newcomer at the cap.
    pub shed: u64,
    /// Newcomers refused at the cap because every connection was busy.
    pub refused: u64,
    /// Failed accepts (e.g. `EMFILE`).
    pub accept_errors: u64,
}

/// Reads an accept loop's counts; cheap to clone, and valid after the server stopped (for a metrics page that
/// outlives no server but is built before them).
#[derive(Debug, Clone)]
pub struct AcceptCounters {
    max_connections: usize,
    counters: Arc<Counters>,
}

impl AcceptCounters {
    /// The counts now.
    pub fn stats(&self) -> AcceptStats {
        let c = &self.counters;
        AcceptStats {
            max_connections: self.max_connections,
            open: c.open.load(Ordering::Relaxed),
            accepted: c.accepted.load(Ordering::Relaxed),
            shed: c.shed.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            accept_errors: c.accept_errors.load(Ordering::Relaxed),
        }
    }
}

/// What an accept loop listens on: a TCP listener, or a Unix one for peers on the same host.
pub trait Listener: Send + 'static {
    /// An accepted connection.
    type Stream: AsFd + Send + 'static;
    /// Who is at the other end (for the logs).
    type Peer: Debug + Send + 'static;
    /// Accepts the next connection.
    fn accept(&self) -> impl Future<Output = std::io::Result<(Self::Stream, Self::Peer)>> + Send;
    /// The connection's socket as a plain descriptor (a refusal is written on it without a task).
    fn into_fd(stream: Self::Stream) -> std::io::Result<OwnedFd>;
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    type Peer = SocketAddr;

    fn accept(&self) -> impl Future<Output = std::io::Result<(TcpStream, SocketAddr)>> + Send {
        TcpListener::accept(self)
    }

    fn into_fd(stream: TcpStream) -> std::io::Result<OwnedFd> {
        Ok(stream.into_std()?.into())
    }
}

impl Listener for UnixListener {
    type Stream = UnixStream;
    type Peer = tokio::net::unix::SocketAddr;

    fn accept(&self) -> impl Future<Output = std::io::Result<(UnixStream, Self::Peer)>> + Send {
        UnixListener::accept(self)
    }

    fn into_fd(stream: UnixStream) -> std::io::Result<OwnedFd> {
        Ok(stream.into_std()?.into())
    }
}

/// A running server: where it listens (a TCP address; for a Unix listener, its name), and the way to stop it.
/// Dropping it stops the server too (without waiting).
#[derive(Debug)]
pub struct ServerHandle<A = SocketAddr> {
    addr: A,
    stop: Shutdown,
    counters: AcceptCounters,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl<A: Clone> ServerHandle<A> {
    /// Where the server listens.
    pub fn local_addr(&self) -> A {
        self.addr.clone()
    }

    /// The accept loop's counts.
    pub fn stats(&self) -> AcceptStats {
        self.counters.stats()
    }

    /// A reader of the accept loop's counts to keep elsewhere (a metrics page).
    pub fn counters(&self) -> AcceptCounters {
        self.counters.clone()
    }

    /// Stops accepting, ends every connection (see the module doc) and waits until all are gone.
    pub async fn shutdown(mut self) {
        self.stop.stop();
        if let Some(task) = self.task.take()
            && let Err(e) = task.await
        {
            tracing::warn!(error = %e, "accept loop failed");
        }
    }
}

impl<A> Drop for ServerHandle<A> {
    fn drop(&mut self) {
        self.stop.stop();
    }
}

/// Accepts on `listener` (on the current tokio runtime) until the returned handle stops it, serving each
/// connection with `serve(stream, peer, shutdown)` in a task of its own, at most `max_connections` at once
/// (lowered to fit the open-file limit; see the module doc). `name` labels the server's logs.
pub fn spawn<F, Fut>(
    name: &'static str,
    listener: TcpListener,
    max_connections: usize,
    serve: F,
) -> std::io::Result<ServerHandle>
where
    F: Fn(TcpStream, SocketAddr, Shutdown) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let addr = listener.local_addr()?;
    Ok(spawn_on(name, listener, addr, max_connections, serve))
}

/// [`spawn`] on any [`Listener`] (a Unix one: `addr` is then its name, for the handle and the logs).
pub fn spawn_on<L, A, F, Fut>(
    name: &'static str,
    listener: L,
    addr: A,
    max_connections: usize,
    serve: F,
) -> ServerHandle<A>
where
    L: Listener,
    A: Debug + Clone + Send + 'static,
    F: Fn(L::Stream, L::Peer, Shutdown) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let stop = Shutdown::default();
    let max = fitting_cap(max_connections);
    if max < max_connections {
        tracing::warn!(
            server = name,
            "the open-file limit allows {max} connections of the {max_connections} configured (raise `ulimit -n` to serve more)"
        );
    }
    let counters = Arc::new(Counters::default());
    let task = tokio::spawn(accept_loop(name, listener, addr.clone(), max, stop.clone(), counters.clone(), serve));
    ServerHandle { addr, stop, counters: AcceptCounters { max_connections: max, counters }, task: Some(task) }
}

/// The accept loop's view of one connection.
struct Slot {
    activity: Arc<Activity>,
    /// The connection's own signal, cancelled to close it.
    token: CancellationToken,
    /// Told to close to make room (it ends at its next wait).
    shed: bool,
}

/// Lets a recurring warning through at most once a second.
#[derive(Debug, Default)]
struct Throttle {
    last: Option<Instant>,
    unsaid: u64,
}

impl Throttle {
    /// `Some(occurrences not said since the last one said)` when this one is to be said.
    fn admit(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.unsaid += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.unsaid))
    }
}

async fn accept_loop<L, A, F, Fut>(
    name: &'static str,
    listener: L,
    addr: A,
    max: usize,
    stop: Shutdown,
    counters: Arc<Counters>,
    serve: F,
) where
    L: Listener,
    A: Debug,
    F: Fn(L::Stream, L::Peer, Shutdown) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tracing::info!(server = name, ?addr, max_connections = max, "listening");
    let mut conns = JoinSet::new();
    let mut slots: HashMap<tokio::task::Id, Slot> = HashMap::new();
    let mut backoff = ACCEPT_BACKOFF_MIN;
    let (mut accept_warning, mut shed_warning, mut refusal_warning) =
        (Throttle::default(), Throttle::default(), Throttle::default());
    loop {
        tokio::select! {
            _ = stop.token.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    backoff = ACCEPT_BACKOFF_MIN;
                    if slots.len() >= max && live(&slots) >= max {
                        let Some(slot) = longest_idle(&mut slots) else {
                            refuse_busy::<L>(stream, max);
                            counters.refused.fetch_add(1, Ordering::Relaxed);
                            if let Some(unsaid) = refusal_warning.admit() {
                                tracing::warn!(server = name, ?peer, unsaid, "refused a connection: all {max} connections are busy");
                            }
                            continue;
                        };
                        slot.shed = true;
                        slot.token.cancel();
                        counters.shed.fetch_add(1, Ordering::Relaxed);
                        if let Some(unsaid) = shed_warning.admit() {
                            tracing::warn!(server = name, unsaid, "at the cap of {max} connections: closing the longest-idle one to make room");
                        }
                    }
                    crate::poll::watch_when_idle(&stream);
                    let shutdown = stop.child();
                    let slot = Slot { activity: shutdown.activity.clone(), token: shutdown.token.clone(), shed: false };
                    let id = conns.spawn(serve(stream, peer, shutdown)).id();
                    slots.insert(id, slot);
                    counters.accepted.fetch_add(1, Ordering::Relaxed);
                    counters.open.store(slots.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    counters.accept_errors.fetch_add(1, Ordering::Relaxed);
                    if let Some(unsaid) = accept_warning.admit() {
                        tracing::warn!(server = name, error = %e, unsaid, retry_in = ?backoff, "accept failed");
                    }
                    tokio::select! {
                        _ = stop.token.cancelled() => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                }
            },
            Some(done) = conns.join_next_with_id(), if !conns.is_empty() => {
                let id = match &done {
                    Ok((id, ())) => *id,
                    Err(e) => e.id(),
                };
                slots.remove(&id);
                counters.open.store(slots.len() as u64, Ordering::Relaxed);
                log_failure(name, done.map(|_| ()));
            }
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(DRAIN, async {
        while let Some(done) = conns.join_next().await {
            log_failure(name, done);
        }
    })
    .await;
    if drained.is_err() {
        tracing::debug!(server = name, left = conns.len(), "aborting connections that did not finish");
        conns.shutdown().await;
    }
    counters.open.store(0, Ordering::Relaxed);
    tracing::info!(server = name, ?addr, "stopped");
}

/// Connections that count against the cap: all but those told to close that are on their way out (still
/// idle). One told to close just as its next request arrives may serve that request first (its wait prefers
/// input to the signal), and counts until it is done.
fn live(slots: &HashMap<tokio::task::Id, Slot>) -> usize {
    slots.values().filter(|slot| !slot.shed || slot.activity.mark.load(Ordering::Relaxed) == BUSY).count()
}

/// The idle connection to close first (see [`Activity`]), among those not already told to close.
fn longest_idle(slots: &mut HashMap<tokio::task::Id, Slot>) -> Option<&mut Slot> {
    slots
        .values_mut()
        .filter(|slot| !slot.shed)
        .map(|slot| (slot.activity.mark.load(Ordering::Relaxed), slot))
        .filter(|(since, _)| *since != BUSY)
        .min_by_key(|(since, _)| *since)
        .map(|(_, slot)| slot)
}

/// Refuses a newcomer when every connection is busy: a `HelloReply` error under request id 0 and a close,
/// without waiting on the peer (a task per refusal would hold the descriptors the cap is there to spare).
fn refuse_busy<L: Listener>(stream: L::Stream, max: usize) {
    // Still non-blocking: written and read through as a plain descriptor.
    let Ok(stream) = L::into_fd(stream).map(std::fs::File::from) else { return };
    let reply: HelloReply = Err(ErrorFrame {
        code: ErrorCode::UnavailableInCurrentStatus,
        message: format!(
            "the server is at its cap of {max} connection{}, all busy: try again later",
            if max == 1 { "" } else { "s" }
        ),
    });
    if let Ok(frame) = Frame::encode(0, &reply, bytes::Bytes::new())
        && let Ok(prefix) = frame_prefix(frame.header.len(), 0)
    {
        let mut out = prefix.to_vec();
        out.extend_from_slice(&frame.header);
        // A fresh socket's send buffer takes a few dozen bytes at once; the socket is non-blocking.
        let _ = (&stream).write(&out);
    }
    // What the peer sent already (its hello) is read first: closing with unread input answers with a reset,
    // which can discard the refusal before the peer reads it.
    let mut sink = [0u8; 4096];
    while matches!((&stream).read(&mut sink), Ok(n) if n > 0) {}
}

fn log_failure(name: &str, done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done
        && !e.is_cancelled()
    {
        tracing::error!(server = name, error = %e, "connection task failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn connections_are_served_and_ended_with_their_server() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let finished = Arc::new(AtomicUsize::new(0));
        let f = finished.clone();
        let handle = spawn("test", listener, DEFAULT_MAX_CONNECTIONS, move |mut stream, _, shutdown| {
            let finished = f.clone();
            async move {
                // Echo one byte, then idle until the server stops.
                let mut b = [0u8; 1];
                stream.read_exact(&mut b).await.unwrap();
                stream.write_all(&b).await.unwrap();
                assert!(!shutdown.is_stopping());
                shutdown.clone().stopping().await;
                assert!(shutdown.is_stopping());
                finished.fetch_add(1, Ordering::SeqCst);
            }
        })
        .unwrap();
        let mut clients = Vec::new();
        for i in 0..3u8 {
            let mut c = TcpStream::connect(handle.local_addr()).await.unwrap();
            c.write_all(&[i]).await.unwrap();
            let mut b = [0u8; 1];
            c.read_exact(&mut b).await.unwrap();
            assert_eq!(b[0], i);
            clients.push(c);
        }
        let addr = handle.local_addr();
        handle.shutdown().await;
        assert_eq!(finished.load(Ordering::SeqCst), 3, "every connection was told and finished");
        assert!(TcpStream::connect(addr).await.is_err(), "no longer accepting");
        for mut c in clients {
            let mut b = [0u8; 1];
            assert_eq!(c.read(&mut b).await.unwrap(), 0, "the server side closed");
        }
    }

    #[tokio::test]
    async fn a_connection_that_ignores_the_stop_is_aborted() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (started, mut serving) = tokio::sync::mpsc::unbounded_channel();
        let handle = spawn("test", listener, DEFAULT_MAX_CONNECTIONS, move |stream, _, _| {
            let started = started.clone();
            async move {
                started.send(()).unwrap();
                let _stream = stream;
                std::future::pending::<()>().await
            }
        })
        .unwrap();
        let mut c = TcpStream::connect(handle.local_addr()).await.unwrap();
        serving.recv().await.unwrap();
        handle.shutdown().await;
        let mut b = [0u8; 1];
        assert!(matches!(c.read(&mut b).await, Ok(0) | Err(_)), "aborted: its socket closed");
    }
    /// A server whose connections, once their first byte came, wait (idle) until told to stop, or stay busy
    /// for good when that byte is `b'b'`; each says which it is once it has settled.
    fn idle_or_busy_server(max: usize) -> ServerHandle {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let listener = TcpListener::from_std(listener).unwrap();
        spawn("test", listener, max, move |mut stream, _, shutdown| async move {
            let mut b = [0u8; 1];
            // Idle until the first byte: closed to make room like a server's connection owing its hello.
            tokio::select! {
                first = stream.read_exact(&mut b) => if first.is_err() { return },
                () = shutdown.clone().stopping() => return,
            }
            shutdown.busy();
            if b[0] == b'b' {
                let _ = stream.write_all(b"B").await;
                std::future::pending::<()>().await
            }
            let _ = stream.write_all(b"I").await;
            shutdown.idle();
            shutdown.stopping().await;
        })
        .unwrap()
    }

    async fn settled(addr: SocketAddr, kind: u8) -> TcpStream {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&[kind]).await.unwrap();
        let mut b = [0u8; 1];
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(b[0], kind.to_ascii_uppercase());
        c
    }

    #[tokio::test]
    async fn at_the_cap_the_longest_idle_connection_makes_room() {
        let handle = idle_or_busy_server(2);
        let addr = handle.local_addr();
        let mut oldest = settled(addr, b'i').await;
        let mut busy = settled(addr, b'b').await;
        // The newcomer is served; the idle connection, not the busy one, is closed for it.
        let _newest = settled(addr, b'i').await;
        let mut b = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(10), oldest.read(&mut b)).await.unwrap();
        assert_eq!(closed.unwrap(), 0, "the longest-idle connection was closed");
        let still = tokio::time::timeout(Duration::from_millis(100), busy.read(&mut b)).await;
        assert!(still.is_err(), "the busy connection stays: {still:?}");
        assert_eq!(handle.stats().shed, 1);
    }

    #[tokio::test]
    async fn at_the_cap_with_every_connection_busy_a_newcomer_is_refused_with_a_reason() {
        let handle = idle_or_busy_server(1);
        let _busy = settled(handle.local_addr(), b'b').await;
        let mut refused = TcpStream::connect(handle.local_addr()).await.unwrap();
        refused.write_all(b"i").await.unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), refused.read_to_end(&mut got)).await.unwrap().unwrap();
        let shape = crescent_proto::wire::FrameShape::split(
            crescent_proto::wire::FrameShape::check_len(u32::from_be_bytes(got[..4].try_into().unwrap()), 1 << 16)
                .unwrap(),
            u32::from_be_bytes(got[4..8].try_into().unwrap()),
        )
        .unwrap();
        let env: crescent_proto::wire::Envelope<HelloReply> =
            postcard::from_bytes(&got[8..8 + shape.header_len]).unwrap();
        let refusal = env.body.unwrap_err();
        assert_eq!((env.id, refusal.code), (0, ErrorCode::UnavailableInCurrentStatus));
        assert!(refusal.message.contains("cap of 1 connection"), "{}", refusal.message);
        assert_eq!(handle.stats().refused, 1);
    }

    #[tokio::test]
    async fn connections_that_never_spoke_make_room_first() {
        let handle = idle_or_busy_server(2);
        let addr = handle.local_addr();
        // A connection that spoke (the server marked it busy, then idle), idle for the longest.
        let mut working = settled(addr, b'i').await;
        // Then one that says nothing.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let _newcomer = settled(addr, b'i').await;
        let mut b = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut b)).await.unwrap();
        assert_eq!(closed.unwrap(), 0, "the silent connection made room");
        let still = tokio::time::timeout(Duration::from_millis(100), working.read(&mut b)).await;
        assert!(still.is_err(), "the working connection stays: {still:?}");
    }

    #[test]
    fn the_cap_fits_under_the_open_file_limit() {
        assert_eq!(cap_under(4096, None), 4096);
        assert_eq!(cap_under(4096, Some(1024)), 1024 - 128);
        assert_eq!(cap_under(4096, Some(1 << 20)), 4096);
        assert_eq!(cap_under(100, Some(64)), 32);
        assert_eq!(cap_under(100, Some(10)), 1, "always at least one");
        assert_eq!(cap_under(0, None), 1);
    }

    #[test]
    fn a_recurring_warning_is_said_once_a_second_with_a_count() {
        let mut t = Throttle::default();
        assert_eq!(t.admit(), Some(0));
        assert_eq!((t.admit(), t.admit()), (None, None));
        t.last = t.last.map(|l| l - Duration::from_secs(2));
        assert_eq!(t.admit(), Some(2));
    }
}
