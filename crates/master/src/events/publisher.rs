//! The ZMQ side of the event stream. Subscribers connect to a listener of the publisher's own; each is served
//! by a PUB socket of its own (the `zeromq` crate, which speaks ZMTP to it) bound on loopback, through a relay
//! that forwards the socket's bytes to the subscriber's connection and the subscriber's (its subscriptions) back.
//!
//! Why the relay: the crate's PUB socket queues up to 100 000 messages per peer and drops past that without
//! saying so, so a subscriber that stops reading would hold gigabytes of the master's memory, uncounted. The
//! relay holds at most [`super::EventsConfig::subscriber_buffer`] bytes for its subscriber and says when it is
//! full; the publisher then skips that subscriber's messages (counted as its drops: it sees a gap in the message
//! sequence) until half has drained, while every other subscriber gets every message. Nothing here ever waits on
//! a subscriber, and the master's put path only ever touches the [`EventHub`].

use super::{EventHub, SubscriberState, wire};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use zeromq::{Socket, SocketEvent, SocketSend, ZmqMessage};

/// Why the stream could not start.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The endpoint is not a `tcp://HOST:PORT` this host can bind.
    #[error("kv events: cannot bind {endpoint}: {reason}")]
    Bind {
        /// What was asked for.
        endpoint: String,
        /// Why it failed.
        reason: String,
    },
}

/// A running publisher: stop it with [`Publisher::stop`] (it sends what is queued first).
#[derive(Debug)]
pub struct Publisher {
    endpoint: String,
    stop: tokio::sync::watch::Sender<bool>,
    /// Says when the thread has sent what was queued and closed the socket.
    done: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Publisher {
    /// Binds the hub's endpoint and starts publishing on a thread of its own (with its own runtime, where the
    /// socket's tasks run too): the stream gets its share of the CPU from the OS, not from whatever turns the
    /// request tasks leave it, and never takes a request worker's.
    pub async fn start(hub: Arc<EventHub>) -> Result<Self, PublishError> {
        let asked = hub.config().endpoint.clone();
        let bind_error = |reason: String| PublishError::Bind { endpoint: asked.clone(), reason };
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let thread_hub = Arc::clone(&hub);
        let thread_asked = asked.clone();
        std::thread::Builder::new()
            .name("kv-events".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = bound_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                rt.block_on(async move {
                    let listener = match bind(&thread_asked).await {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = bound_tx.send(Err(e));
                            return;
                        }
                    };
                    match listener.local_addr() {
                        Ok(addr) => {
                            let _ = bound_tx.send(Ok(format!("tcp://{addr}")));
                        }
                        Err(e) => {
                            let _ = bound_tx.send(Err(e.to_string()));
                            return;
                        }
                    }
                    run(thread_hub, listener, stopped).await;
                });
                let _ = done_tx.send(());
            })
            .map_err(|e| bind_error(format!("cannot start its thread: {e}")))?;
        let endpoint = match bound_rx.await {
            Ok(Ok(endpoint)) => endpoint,
            Ok(Err(reason)) => return Err(bind_error(reason)),
            Err(_) => return Err(bind_error("its thread ended".into())),
        };
        tracing::info!(%endpoint, "kv events published");
        hub.set_bound(endpoint.clone());
        Ok(Self { endpoint, stop, done: Some(done_rx) })
    }

    /// The endpoint bound (`tcp://IP:PORT`, the port chosen when 0 was asked for).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends what is queued, then closes the socket.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(done) = self.done.take()
            && done.await.is_err()
        {
            tracing::warn!("kv event publisher ended abnormally");
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        // Dropped without `stop` (a failed start elsewhere, a test): the thread still ends.
        let _ = self.stop.send(true);
    }
}

/// How long the publisher lets events gather after the first one: the most an event waits for its message.
const LINGER: Duration = Duration::from_millis(1);

/// Events the publisher lets gather before it sends: several full messages, which the sockets write to the
/// kernel in one call each (a loopback send costs about as much as encoding a whole message, twice per
/// subscriber with its relay).
const GATHER_EVENTS: usize = 8 * super::MAX_BATCH_EVENTS;

/// Messages offered between two turns of the sockets' writers and relays: they write these together, and a
/// relay's "behind" is at most this many messages stale.
const MESSAGES_PER_TURN: usize = 8;

/// How long a new subscriber has to complete the ZMTP handshake before its connection is closed.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Bytes a relay reads from its socket at a time (a turn's messages, about 200 KB, in one read).
const RELAY_CHUNK: usize = 256 << 10;

/// Binds the listener subscribers connect to: `tcp://HOST:PORT`, `*` for every interface.
async fn bind(endpoint: &str) -> Result<TcpListener, String> {
    let Some(addr) = endpoint.strip_prefix("tcp://") else {
        return Err("only tcp:// endpoints are served".into());
    };
    let addr = match addr.strip_prefix("*:") {
        Some(port) => format!("0.0.0.0:{port}"),
        None => addr.to_owned(),
    };
    TcpListener::bind(&addr).await.map_err(|e| e.to_string())
}

/// A subscriber being served: the PUB socket whose one peer is its relay, and what the relay shares.
struct Subscriber {
    socket: zeromq::PubSocket,
    state: Arc<SubscriberState>,
}

async fn run(hub: Arc<EventHub>, listener: TcpListener, mut stopped: tokio::sync::watch::Receiver<bool>) {
    let mut buffers = Buffers::default();
    let mut subscribers: Vec<Subscriber> = Vec::new();
    // New subscribers, once their handshake is done (each is set up on a task of its own, so a peer slow to
    // handshake holds up nothing).
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel::<Subscriber>();
    loop {
        drain(&hub, &mut subscribers, &mut buffers).await;
        tokio::select! {
            () = hub.ready() => {
                // Woken by the first event after the queue emptied: let events gather before sending. Sends cost
                // the master more than encoding does: under load, full messages written several to a call cost
                // it a fraction of what a call per message of a few events would. This thread is the stream's
                // own (its runtime runs only the sockets), so it may sleep.
                if hub.queued() < GATHER_EVENTS {
                    std::thread::sleep(LINGER);
                }
            }
            changed = stopped.changed() => {
                if changed.is_err() || *stopped.borrow() {
                    break;
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if subscribers.len() + pending(&ready_tx) >= super::MAX_SUBSCRIBERS {
                        tracing::warn!(%peer, limit = super::MAX_SUBSCRIBERS, "kv events: too many subscribers; connection closed");
                    } else {
                        let hub = Arc::clone(&hub);
                        let ready = ready_tx.clone();
                        tokio::spawn(async move {
                            if let Err(e) = subscribe(stream, peer, hub, ready).await {
                                tracing::warn!(%peer, error = %e, "kv events: subscriber not served");
                            }
                        });
                    }
                }
                Err(e) => {
                    // Out of descriptors, most likely: try again shortly rather than spin.
                    tracing::warn!(error = %e, "kv events: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(sub) = ready_rx.recv() => subscribers.push(sub),
        }
    }
    drain(&hub, &mut subscribers, &mut buffers).await;
    // The relays end with this thread's runtime: none is served any more.
    for sub in &subscribers {
        hub.subscriber_left(&sub.state);
    }
}

/// Subscribers being set up now (each setup task holds a sender).
fn pending(ready: &tokio::sync::mpsc::UnboundedSender<Subscriber>) -> usize {
    ready.strong_count().saturating_sub(1)
}

/// Serves the subscriber connected on `external`: a PUB socket of its own on loopback, its relay, and once the
/// handshake through the relay is done the socket's listener closed (it has its one peer) and the subscriber
/// handed to the publisher.
async fn subscribe(
    external: TcpStream,
    peer: SocketAddr,
    hub: Arc<EventHub>,
    ready: tokio::sync::mpsc::UnboundedSender<Subscriber>,
) -> Result<(), String> {
    let mut socket = zeromq::PubSocket::new();
    let mut monitor = socket.monitor();
    let bound = socket.bind("tcp://127.0.0.1:0").await.map_err(|e| e.to_string())?;
    let addr: SocketAddr = bound
        .to_string()
        .strip_prefix("tcp://")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("unexpected loopback endpoint {bound}"))?;
    let internal = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    // Messages are whole batches: send each at once.
    let _ = internal.set_nodelay(true);
    let _ = external.set_nodelay(true);
    let state = Arc::new(SubscriberState::new(peer));
    let limit = hub.config().subscriber_buffer.max(1);
    let relaying = tokio::spawn(relay(external, internal, Arc::clone(&state), limit, Arc::clone(&hub)));
    let accepted = async {
        while let Some(event) = monitor.next().await {
            match event {
                SocketEvent::Accepted(..) => return true,
                // Not a ZMTP peer (a port scan, a browser, a bad greeting).
                SocketEvent::AcceptFailed(_) => return false,
                _ => {}
            }
        }
        false
    };
    if !matches!(tokio::time::timeout(HANDSHAKE, accepted).await, Ok(true)) {
        // Ending the relay closes both connections: the peer's, and the socket's half-made one (the crate waits
        // on a greeting for as long as its connection stays open).
        relaying.abort();
        return Err("no ZMTP handshake".into());
    }
    let _ = socket.unbind(bound).await;
    hub.subscriber_joined(&state);
    tracing::info!(%peer, "kv events: subscriber connected");
    let _ = ready.send(Subscriber { socket, state });
    Ok(())
}

/// Forwards the PUB socket's bytes (`internal`) to the subscriber (`external`) and the subscriber's back,
/// holding at most `limit` bytes for the subscriber (then it reads no more from the socket; the publisher has
/// stopped sending it messages by then). Ends, and takes the subscriber off the hub's list, when either side
/// closes.
async fn relay(
    external: TcpStream,
    internal: TcpStream,
    state: Arc<SubscriberState>,
    limit: usize,
    hub: Arc<EventHub>,
) {
    let (mut ext_read, mut ext_write) = external.into_split();
    let (mut int_read, mut int_write) = internal.into_split();
    let mut chunk = BytesMut::new();
    let mut waiting: VecDeque<Bytes> = VecDeque::new();
    let mut held = 0usize;
    let mut up = [0u8; 4096];
    loop {
        // Never more than the limit held: a read takes at most the room left.
        let room = limit.saturating_sub(held).min(RELAY_CHUNK);
        if room > 0 && chunk.capacity() - chunk.len() < room {
            chunk.reserve(RELAY_CHUNK);
        }
        let front = waiting.front().cloned();
        let step = {
            let mut into = (&mut chunk).limit(room);
            tokio::select! {
                read = int_read.read_buf(&mut into), if room > 0 => Step::Read(read),
                written = write_some(&mut ext_write, front) => Step::Wrote(written),
                // The subscriber's side: its subscriptions (and the handshake), a few bytes.
                read = ext_read.read(&mut up) => Step::Up(read),
            }
        };
        match step {
            Step::Read(Ok(n)) if n > 0 => {
                held += n;
                waiting.push_back(chunk.split().freeze());
            }
            Step::Wrote(Ok(n)) if n > 0 => {
                held -= n;
                if let Some(f) = waiting.front_mut() {
                    f.advance(n);
                    if f.is_empty() {
                        waiting.pop_front();
                    }
                }
            }
            Step::Up(Ok(n)) if n > 0 => {
                if int_write.write_all(&up[..n]).await.is_err() {
                    break;
                }
            }
            // Either side closed or failed.
            _ => break,
        }
        state.set_buffered(held, limit);
    }
    hub.subscriber_left(&state);
    tracing::info!(peer = %state.peer(), "kv events: subscriber gone");
}

/// What one turn of a relay did: read from the socket, wrote to the subscriber, or read from the subscriber.
enum Step {
    Read(std::io::Result<usize>),
    Wrote(std::io::Result<usize>),
    Up(std::io::Result<usize>),
}

/// Writes some of `bytes` to `out` (waits forever when there is nothing to write, so the caller's select waits
/// on its other branches).
async fn write_some(out: &mut tokio::net::tcp::OwnedWriteHalf, bytes: Option<Bytes>) -> std::io::Result<usize> {
    match bytes {
        Some(b) => out.write(&b).await,
        None => std::future::pending().await,
    }
}

/// Sends every queued event, a message of at most [`super::MAX_BATCH_EVENTS`] at a time, to every subscriber
/// not behind (one behind has it counted as dropped; with no subscriber to take it the message is counted as
/// published and not encoded). `buffers` are the publisher's, kept from message to
/// message: the batch's vector, and the payload's bytes, whose allocation the next message takes back once the
/// sockets have let go of this one.
async fn drain(hub: &EventHub, subscribers: &mut Vec<Subscriber>, buffers: &mut Buffers) {
    subscribers.retain(|s| !s.state.is_ended());
    let mut offered = 0usize;
    while let Some(seq) = hub.take_batch(&mut buffers.batch) {
        let events = buffers.batch.len();
        // Encoded when the first subscriber that takes it comes: with none (no subscriber yet, or all behind) the
        // message is counted, not encoded. Each subscriber is judged once, at its turn.
        let mut message: Option<ZmqMessage> = None;
        let mut unparsed = None;
        for sub in subscribers.iter_mut() {
            if sub.state.is_ended() {
                continue;
            }
            if sub.state.is_behind() {
                hub.count_subscriber_dropped(&sub.state, events);
                continue;
            }
            if message.is_none() {
                // Room for a full message without growing (an event encodes to about 400 bytes).
                buffers.payload.reserve(64 + events * 512);
                let backend = &hub.config().backend_id;
                unparsed = Some(wire::encode_payload_into(&mut buffers.payload, &buffers.batch, backend, unix_ms()));
                let payload = buffers.payload.split().freeze();
                let frames = vec![Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
                match ZmqMessage::try_from(frames) {
                    Ok(m) => message = Some(m),
                    Err(e) => {
                        tracing::warn!(error = %e, events, "kv events: a message could not be built");
                        break;
                    }
                }
            }
            if let Some(m) = &message {
                // The crate's PUB send only queues the message (it never waits on the peer).
                match sub.socket.send(m.clone()).await {
                    Ok(()) => sub.state.count_sent(events),
                    Err(e) => tracing::warn!(error = %e, events, "kv events: a message could not be sent"),
                }
            }
        }
        let unparsed =
            unparsed.unwrap_or_else(|| buffers.batch.iter().filter(|e| wire::parse_seq_hash(&e.key).is_none()).count());
        hub.count_published(events, unparsed);
        // The events are encoded: their strings are freed here, on the publisher's thread.
        buffers.batch.clear();
        offered += 1;
        if offered.is_multiple_of(MESSAGES_PER_TURN) && !subscribers.is_empty() {
            // Let the sockets' writers and the relays (tasks of this thread) move these messages on, so a relay's
            // "behind" is current within a few messages, and a backlog drained here never piles up in the
            // sockets' queues.
            tokio::task::yield_now().await;
        }
    }
}

/// What [`drain`] reuses from message to message.
#[derive(Default)]
struct Buffers {
    batch: Vec<super::KvEvent>,
    payload: bytes::BytesMut,
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
