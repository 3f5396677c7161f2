//! The connection to the master: a few persistent multiplexed connections, request ids, timeouts, and
//! reconnection (a restarted master is simply dialled again).
//!
//! Each connection has a writer (the caller sends its frame under a short mutex) and a reader task that
//! routes replies to waiting callers by request id, so many requests are in flight on one socket.

use crate::error::ClientError;
use bytes::Bytes;
use crescent_proto::wire::{ErrorFrame, Frame, FrameCodec, Hello, HelloReply, Limits, PeerRole, WireError};
use crescent_proto::{ClientId, ErrorCode, MasterReply, MasterRequest, MasterResponse};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_util::codec::Framed;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Frame, WireError>>>>>;

struct Conn {
    sink: tokio::sync::Mutex<SplitSink<Framed<TcpStream, FrameCodec>, Frame>>,
    pending: Pending,
    alive: Arc<AtomicBool>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// A handle on the master for one client process.
pub struct MasterConnection {
    addr: String,
    client: ClientId,
    role: PeerRole,
    timeout: Duration,
    slots: Vec<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    next_slot: AtomicUsize,
    next_id: AtomicU64,
}

impl std::fmt::Debug for MasterConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterConnection").field("addr", &self.addr).finish_non_exhaustive()
    }
}

async fn dial(addr: &str, role: PeerRole, client: ClientId, timeout: Duration) -> Result<Arc<Conn>, ClientError> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| ClientError::Timeout)?
        .map_err(WireError::Io)?;
    stream.set_nodelay(true).map_err(WireError::Io)?;
    let mut framed = Framed::new(stream, FrameCodec::new(Limits::CONTROL));
    framed.send(Frame::encode(0, &Hello::new(role, Some(client)), Bytes::new())?).await?;
    let reply = tokio::time::timeout(timeout, framed.next()).await.map_err(|_| ClientError::Timeout)?;
    let frame = reply.ok_or(WireError::Closed)??;
    match frame.decode::<HelloReply>()?.body {
        Ok(_ack) => {}
        Err(ErrorFrame { code, message }) => {
            tracing::warn!(%addr, %message, "master refused the connection");
            return Err(ClientError::Code(code));
        }
    }
    let (sink, mut stream) = framed.split();
    let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
    let alive = Arc::new(AtomicBool::new(true));
    let (p, a) = (pending.clone(), alive.clone());
    let reader = tokio::spawn(async move {
        let err = loop {
            match stream.next().await {
                Some(Ok(frame)) => {
                    let id = frame.request_id().unwrap_or(0);
                    if id == 0 {
                        // Connection-level error frame: the server closes the connection.
                        break WireError::Malformed("master reported a protocol error");
                    }
                    if let Some(tx) = p.lock().remove(&id) {
                        let _ = tx.send(Ok(frame));
                    }
                }
                Some(Err(e)) => break e,
                None => break WireError::Closed,
            }
        };
        a.store(false, Ordering::Release);
        let waiters: Vec<_> = p.lock().drain().collect();
        for (_, tx) in waiters {
            let _ = tx.send(Err(WireError::Malformed(leak_message(&err))));
        }
    });
    Ok(Arc::new(Conn { sink: tokio::sync::Mutex::new(sink), pending, alive, reader }))
}

/// A static description of why a connection died (the waiters get a `WireError`, which needs `'static`).
fn leak_message(e: &WireError) -> &'static str {
    match e {
        WireError::Closed => "master connection closed",
        WireError::Io(_) => "master connection i/o error",
        _ => "master connection protocol error",
    }
}

impl MasterConnection {
    /// A connection to `addr` for `client` with `connections` sockets (dialled lazily).
    pub fn new(addr: &str, client: ClientId, role: PeerRole, connections: usize, timeout: Duration) -> Self {
        Self {
            addr: addr.to_owned(),
            client,
            role,
            timeout,
            slots: (0..connections.max(1)).map(|_| tokio::sync::Mutex::new(None)).collect(),
            next_slot: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        }
    }

    /// The master address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    async fn conn(&self) -> Result<Arc<Conn>, ClientError> {
        let i = self.next_slot.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut slot = self.slots[i].lock().await;
        if let Some(c) = slot.as_ref().filter(|c| c.alive.load(Ordering::Acquire)) {
            return Ok(c.clone());
        }
        let c = dial(&self.addr, self.role, self.client, self.timeout).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Sends one request and waits for its reply.
    pub async fn call(&self, req: &MasterRequest) -> Result<MasterResponse, ClientError> {
        let conn = self.conn().await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = Frame::encode(id, req, Bytes::new())?;
        let (tx, rx) = oneshot::channel();
        conn.pending.lock().insert(id, tx);
        let sent = conn.sink.lock().await.send(frame).await;
        if let Err(e) = sent {
            conn.pending.lock().remove(&id);
            conn.alive.store(false, Ordering::Release);
            return Err(e.into());
        }
        let frame = match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok(r)) => r?,
            Ok(Err(_)) => return Err(WireError::Closed.into()),
            Err(_) => {
                conn.pending.lock().remove(&id);
                return Err(ClientError::Timeout);
            }
        };
        let reply: MasterReply = frame.decode::<MasterReply>()?.body;
        reply.map_err(ClientError::Code)
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
