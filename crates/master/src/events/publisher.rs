//! The ZMQ side of the event stream: a PUB socket (the `zeromq` crate) bound where the configuration says, fed
//! from the [`EventHub`] by one task. PUB never waits on a subscriber: one that cannot keep up loses messages
//! inside the socket, and sees it as a gap in the message sequence.

use super::{EventHub, wire};
use bytes::Bytes;
use futures_util::StreamExt;
use std::sync::Arc;
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
        if !asked.starts_with("tcp://") {
            return Err(bind_error("only tcp:// endpoints are served".into()));
        }
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
                    let mut socket = zeromq::PubSocket::new();
                    let monitor = socket.monitor();
                    match socket.bind(&thread_asked).await {
                        Ok(bound) => {
                            let _ = bound_tx.send(Ok(bound.to_string()));
                        }
                        Err(e) => {
                            let _ = bound_tx.send(Err(e.to_string()));
                            return;
                        }
                    }
                    run(thread_hub, socket, monitor, stopped).await;
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

/// How long the publisher lets a batch gather after its first event: the most an event waits for its message.
const LINGER: std::time::Duration = std::time::Duration::from_micros(200);

async fn run(
    hub: Arc<EventHub>,
    mut socket: zeromq::PubSocket,
    mut monitor: impl futures_util::Stream<Item = SocketEvent> + Unpin,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut buffers = Buffers::default();
    loop {
        drain(&hub, &mut socket, &mut buffers).await;
        tokio::select! {
            () = hub.ready() => {
                // Woken by the first event after the queue emptied: let a batch gather before sending. A message
                // costs the socket and the kernel about as much as its events' encoding; under load messages of
                // a few events each would cost the master several times what full ones do. This thread is the
                // stream's own (its runtime runs only the socket), so it may sleep.
                if hub.queued() < super::MAX_BATCH_EVENTS {
                    std::thread::sleep(LINGER);
                }
            }
            changed = stopped.changed() => {
                if changed.is_err() || *stopped.borrow() {
                    break;
                }
            }
            event = monitor.next() => match event {
                Some(SocketEvent::Accepted(..)) => hub.subscriber_joined(),
                Some(SocketEvent::Disconnected(..)) => hub.subscriber_left(),
                Some(_) => {}
                // The socket's monitor is gone with the socket; nothing else reports subscribers.
                None => {}
            },
        }
    }
    drain(&hub, &mut socket, &mut buffers).await;
}

/// Sends every queued event, a message of at most [`super::MAX_BATCH_EVENTS`] at a time. `buffers` are the
/// publisher's, kept from message to message: the batch's vector, and the payload's bytes, whose allocation the
/// next message takes back once the socket has let go of this one.
async fn drain(hub: &EventHub, socket: &mut zeromq::PubSocket, buffers: &mut Buffers) {
    while let Some(seq) = hub.take_batch(&mut buffers.batch) {
        // Room for a full message without growing (an event encodes to about 400 bytes).
        buffers.payload.reserve(64 + buffers.batch.len() * 512);
        let unparsed =
            wire::encode_payload_into(&mut buffers.payload, &buffers.batch, &hub.config().backend_id, unix_ms());
        let payload = buffers.payload.split().freeze();
        let frames = vec![Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
        let sent = match ZmqMessage::try_from(frames) {
            Ok(message) => socket.send(message).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = sent {
            tracing::warn!(error = %e, events = buffers.batch.len(), "kv events: a message could not be sent");
        }
        hub.count_published(buffers.batch.len(), unparsed);
        // The events are encoded: their strings are freed here, on the publisher's thread.
        buffers.batch.clear();
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
