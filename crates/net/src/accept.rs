//! The accept loop every server runs, and the handle that stops it.
//!
//! Each connection is served by a task of its own, kept in a `JoinSet` owned by the loop: stopping the loop
//! stops accepting, tells every connection to finish ([`Shutdown`]), waits a bounded time for them, and aborts
//! the rest, so no connection task outlives its server. An accept error (typically `EMFILE`) backs off briefly
//! instead of spinning on the error. Accepted sockets join the process's idle set (see [`crate::poll`]).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long a stopping server waits for its connections to finish before aborting them.
const DRAIN: Duration = Duration::from_secs(1);

/// How long the loop pauses after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// Tells a connection its server is stopping: it should finish the request in hand and return. The default
/// one never fires (a connection served outside an accept loop, e.g. in a test).
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    /// Wakes an idle wait ([`Shutdown::stopping`]).
    token: CancellationToken,
    /// Read between requests: one atomic load (the token's own check takes a mutex, on every request).
    flag: Arc<AtomicBool>,
}

impl Shutdown {
    /// Whether the server is stopping.
    pub fn is_stopping(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Completes once the server is stopping (for `select!` beside an idle wait). Make it once per connection
    /// and poll the same one at every wait: it registers with the server once, where a fresh wait would
    /// register (and unregister) at every request.
    pub fn stopping(self) -> Stopping {
        Stopping(Box::pin(self.token.cancelled_owned()))
    }

    /// Tells every connection holding this signal (or a child of it) to stop.
    fn stop(&self) {
        self.flag.store(true, Ordering::Release);
        self.token.cancel();
    }

    /// A signal for one connection: it fires with this one, and its idle wait registers with a node of its
    /// own rather than one shared by every connection of the server.
    fn child(&self) -> Shutdown {
        Shutdown { token: self.token.child_token(), flag: self.flag.clone() }
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

/// A running server: its address, and the way to stop it. Dropping it stops the server too (without waiting).
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    stop: Shutdown,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ServerHandle {
    /// Where the server listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
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

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop.stop();
    }
}

/// Accepts on `listener` (on the current tokio runtime) until the returned handle stops it, serving each
/// connection with `serve(stream, peer, shutdown)` in a task of its own. `name` labels the server's logs.
pub fn spawn<F, Fut>(name: &'static str, listener: TcpListener, serve: F) -> std::io::Result<ServerHandle>
where
    F: Fn(TcpStream, SocketAddr, Shutdown) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let addr = listener.local_addr()?;
    let stop = Shutdown::default();
    let task = tokio::spawn(accept_loop(name, listener, stop.clone(), serve));
    Ok(ServerHandle { addr, stop, task: Some(task) })
}

async fn accept_loop<F, Fut>(name: &'static str, listener: TcpListener, stop: Shutdown, serve: F)
where
    F: Fn(TcpStream, SocketAddr, Shutdown) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let addr = listener.local_addr().ok();
    tracing::info!(server = name, ?addr, "listening");
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.token.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    crate::poll::watch_when_idle(&stream);
                    conns.spawn(serve(stream, peer, stop.child()));
                }
                Err(e) => {
                    tracing::warn!(server = name, error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(done) = conns.join_next(), if !conns.is_empty() => log_failure(name, done),
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
    tracing::info!(server = name, ?addr, "stopped");
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
        let handle = spawn("test", listener, move |mut stream, _, shutdown| {
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
        let handle = spawn("test", listener, move |stream, _, _| {
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
}
