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
    task: tokio::task::JoinHandle<()>,
}

impl Publisher {
    /// Binds the hub's endpoint and starts publishing on the current runtime.
    pub async fn start(hub: Arc<EventHub>) -> Result<Self, PublishError> {
        let asked = hub.config().endpoint.clone();
        let bind_error = |reason: String| PublishError::Bind { endpoint: asked.clone(), reason };
        if !asked.starts_with("tcp://") {
            return Err(bind_error("only tcp:// endpoints are served".into()));
        }
        let mut socket = zeromq::PubSocket::new();
        let monitor = socket.monitor();
        let bound = socket.bind(&asked).await.map_err(|e| bind_error(e.to_string()))?;
        let endpoint = bound.to_string();
        tracing::info!(%endpoint, "kv events published");
        hub.set_bound(endpoint.clone());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(run(hub, socket, monitor, stopped));
        Ok(Self { endpoint, stop, task })
    }

    /// The endpoint bound (`tcp://IP:PORT`, the port chosen when 0 was asked for).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends what is queued, then closes the socket.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "kv event publisher ended abnormally");
        }
    }
}

async fn run(
    hub: Arc<EventHub>,
    mut socket: zeromq::PubSocket,
    mut monitor: impl futures_util::Stream<Item = SocketEvent> + Unpin,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        drain(&hub, &mut socket).await;
        tokio::select! {
            () = hub.ready() => {}
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
    drain(&hub, &mut socket).await;
}

/// Sends every queued event, a message of at most [`super::MAX_BATCH_EVENTS`] at a time.
async fn drain(hub: &EventHub, socket: &mut zeromq::PubSocket) {
    while let Some((seq, batch)) = hub.take_batch() {
        let (payload, unparsed) = wire::encode_payload(&batch, &hub.config().backend_id, unix_ms());
        let frames = vec![Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), Bytes::from(payload)];
        let sent = match ZmqMessage::try_from(frames) {
            Ok(message) => socket.send(message).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = sent {
            tracing::warn!(error = %e, events = batch.len(), "kv events: a message could not be sent");
        }
        hub.count_published(batch.len(), unparsed);
    }
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
