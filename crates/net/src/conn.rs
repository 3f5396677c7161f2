//! [`Conn`]: the byte stream of one connection, plain TCP, TLS over it, or a Unix socket to a peer on the same
//! host, as every server and client holds it.
//!
//! The zero-copy paths of the data plane work on the socket itself: payloads received straight into segment
//! memory, `sendfile` of memfd pages. They need the bytes on the wire to be the frames' bytes, so they are taken
//! only on a plain connection ([`Stream::plain`]); over TLS every byte passes through rustls instead (sealed into,
//! or opened from, its record buffers). Busy-polling works on both ([`Stream::socket`]): after a poll saw input,
//! a plain read and a TLS read ([`TlsSocket`]) both `recv` directly, without waiting for tokio's reactor to
//! report the socket. A same-host connection ([`Conn::Local`], a storage node's local lanes) carries the same
//! frames over a Unix socket, its payloads copied through the socket. The protocol above is the same.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpStream, UnixStream, unix};
use tokio_rustls::TlsStream;

/// A TLS session over a TCP socket (boxed: its state is ~1 KiB, a plain connection should not carry that).
pub type Tls = Box<TlsStream<TlsSocket>>;

/// Ciphertext read from a TLS connection's socket at once (see [`TlsSocket`]).
pub const TLS_READ_BUFFER: usize = 64 << 10;

/// The socket under a TLS session. Reads are buffered: rustls asks for at most 4 KiB of records per read, which
/// would be a syscall per 4 KiB; here one `recv` takes up to [`TLS_READ_BUFFER`] and rustls's reads are copies.
/// And the `recv` is tried directly first, bypassing tokio's cached readiness, as the plain fast paths do: after
/// a busy-poll saw input, a read of the session (even with a no-op waker, [`Conn::try_read`]) finds it at once
/// instead of waiting for the reactor's next turn. Writes go straight to the socket.
#[derive(Debug)]
pub struct TlsSocket {
    sock: TcpStream,
    buf: Box<[u8]>,
    /// `buf[start..end]` is read and not yet handed on.
    start: usize,
    end: usize,
}

impl TlsSocket {
    /// `sock`, read through a buffer.
    pub fn new(sock: TcpStream) -> Self {
        TlsSocket { sock, buf: vec![0u8; TLS_READ_BUFFER].into_boxed_slice(), start: 0, end: 0 }
    }

    /// The socket.
    pub fn tcp(&self) -> &TcpStream {
        &self.sock
    }

    /// Refills the empty buffer: `Ready(Ok(0))` at the end of the stream.
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let recv = |sock: &TcpStream, buf: &mut [u8]| -> io::Result<usize> {
            Ok(rustix::net::recv(sock, buf, rustix::net::RecvFlags::DONTWAIT)?.0)
        };
        loop {
            // Directly first: tokio may not have seen input a poll already found.
            match recv(&self.sock, &mut self.buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Poll::Ready(Err(e)),
                Err(_) => {}
            }
            // Then through tokio, so that a stale "readable" it cached is cleared before the task parks.
            match self.sock.try_io(Interest::READABLE, || recv(&self.sock, &mut self.buf)) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Poll::Ready(Err(e)),
                Err(_) => {}
            }
            match self.sock.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl AsyncRead for TlsSocket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.start == this.end {
            match this.fill(cx) {
                Poll::Ready(Ok(n)) => (this.start, this.end) = (0, n),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = out.remaining().min(this.end - this.start);
        out.put_slice(&this.buf[this.start..this.start + n]);
        this.start += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TlsSocket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().sock).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().sock).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.sock.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().sock).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().sock).poll_shutdown(cx)
    }
}

/// One connection's byte stream.
#[derive(Debug)]
pub enum Conn {
    /// Frames straight on the socket.
    Plain(TcpStream),
    /// Frames inside TLS records.
    Tls(Tls),
    /// Frames straight on a Unix socket: a peer on the same host (no network between, so no TLS; the hello
    /// authenticates as on TCP).
    Local(UnixStream),
}

/// A stream over a socket, plain or TLS.
pub trait Stream: AsyncRead + Unpin {
    /// The socket, when the stream is the socket's own bytes (no TLS): zero-copy paths are taken only then.
    fn plain(&self) -> Option<&TcpStream>;

    /// The socket's descriptor, to busy-poll for input (plain or TLS: a TLS read after a poll saw input reads
    /// it at once, see [`TlsSocket`]); never read or written through.
    fn socket(&self) -> BorrowedFd<'_>;
}

impl Stream for Conn {
    fn plain(&self) -> Option<&TcpStream> {
        match self {
            Conn::Plain(s) => Some(s),
            Conn::Tls(_) | Conn::Local(_) => None,
        }
    }

    fn socket(&self) -> BorrowedFd<'_> {
        match self {
            Conn::Plain(s) => s.as_fd(),
            Conn::Tls(t) => t.get_ref().0.tcp().as_fd(),
            Conn::Local(s) => s.as_fd(),
        }
    }
}

impl<S: Stream> Stream for tokio::io::BufReader<S> {
    fn plain(&self) -> Option<&TcpStream> {
        self.get_ref().plain()
    }

    fn socket(&self) -> BorrowedFd<'_> {
        self.get_ref().socket()
    }
}

/// Reads what `r` has now into `buf`, without waiting: `WouldBlock` when nothing is, `Ok(0)` at the end of the
/// stream (a poll with a no-op waker; over TLS "now" means a whole record, or plaintext rustls already holds).
pub fn read_now<R: AsyncRead + Unpin, B: bytes::BufMut>(r: &mut R, buf: &mut B) -> io::Result<usize> {
    now(|cx| tokio_util::io::poll_read_buf(Pin::new(r), cx, buf))
}

impl Conn {
    /// Waits until the socket under the stream is readable (over TLS: ciphertext arrived, which may not yet
    /// make a whole record).
    pub async fn readable(&self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.readable().await,
            Conn::Tls(t) => t.get_ref().0.tcp().readable().await,
            Conn::Local(s) => s.readable().await,
        }
    }

    /// Whether the stream is TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, Conn::Tls(_))
    }

    /// Reads what is available now into `buf`, without waiting: `WouldBlock` when nothing is, `Ok(0)` at the
    /// end of the stream. Over TLS "available" means a whole record (or plaintext rustls already holds).
    pub fn try_read_buf<B: bytes::BufMut>(&mut self, buf: &mut B) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.try_read_buf(buf),
            Conn::Local(s) => s.try_read_buf(buf),
            Conn::Tls(_) => read_now(self, buf),
        }
    }

    /// Like [`Conn::try_read_buf`] into a slice.
    pub fn try_read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.try_read(dst),
            Conn::Local(s) => s.try_read(dst),
            Conn::Tls(t) => now(|cx| {
                let mut rb = ReadBuf::new(dst);
                tls_read(t, cx, &mut rb).map_ok(|()| rb.filled().len())
            }),
        }
    }

    /// Splits the stream into halves that separate tasks may own (over TLS the halves share the session
    /// behind a lock held only for the length of one read or write, and the write half keeps a duplicate of
    /// the socket's descriptor to tell a peer's close by).
    pub fn into_split(self) -> io::Result<(ReadHalf, WriteHalf)> {
        Ok(match self {
            Conn::Plain(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Plain(r), WriteHalf::Plain(w))
            }
            Conn::Local(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Local(r), WriteHalf::Local(w))
            }
            Conn::Tls(t) => {
                let fd = t.get_ref().0.tcp().as_fd().try_clone_to_owned()?;
                let read_fd = fd.try_clone()?;
                let (r, w) = tokio::io::split(t);
                (ReadHalf::Tls(r, read_fd), WriteHalf::Tls(w, fd))
            }
        })
    }
}

/// A read of a TLS session, with the peer's close without a `close_notify` taken as the end of the stream: every
/// frame says its own length, so a truncated frame is caught above, and peers (ours included) drop connections.
fn tls_read<R: AsyncRead + Unpin>(r: &mut R, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
    match Pin::new(r).poll_read(cx, buf) {
        Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Poll::Ready(Ok(())),
        other => other,
    }
}

/// Polls once with a waker that does nothing: the readiness of "now", `Pending` becoming `WouldBlock`.
fn now<T>(poll: impl FnOnce(&mut Context<'_>) -> Poll<io::Result<T>>) -> io::Result<T> {
    let mut cx = Context::from_waker(Waker::noop());
    match poll(&mut cx) {
        Poll::Ready(r) => r,
        Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Local(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(t) => tls_read(t, cx, buf),
        }
    }
}

impl Conn {
    /// The writer under either kind of stream.
    fn writer(&mut self) -> Pin<&mut (dyn AsyncWrite + Unpin)> {
        match self {
            Conn::Plain(s) => Pin::new(s),
            Conn::Tls(t) => Pin::new(t),
            Conn::Local(s) => Pin::new(s),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.get_mut().writer().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().writer().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(t) => t.is_write_vectored(),
            Conn::Local(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().writer().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().writer().poll_shutdown(cx)
    }
}

/// The read half of a split [`Conn`].
#[derive(Debug)]
pub enum ReadHalf {
    /// The socket's own read half.
    Plain(OwnedReadHalf),
    /// Reads of the shared TLS session, and the socket's descriptor (a duplicate) to poll.
    Tls(tokio::io::ReadHalf<Tls>, OwnedFd),
    /// A Unix socket's own read half.
    Local(unix::OwnedReadHalf),
}

impl Stream for ReadHalf {
    fn plain(&self) -> Option<&TcpStream> {
        match self {
            ReadHalf::Plain(r) => Some(r.as_ref()),
            ReadHalf::Tls(..) | ReadHalf::Local(_) => None,
        }
    }

    fn socket(&self) -> BorrowedFd<'_> {
        match self {
            ReadHalf::Plain(r) => r.as_ref().as_fd(),
            ReadHalf::Tls(_, fd) => fd.as_fd(),
            ReadHalf::Local(r) => r.as_ref().as_fd(),
        }
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Tls(r, _) => tls_read(r, cx, buf),
            ReadHalf::Local(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

/// The write half of a split [`Conn`].
#[derive(Debug)]
pub enum WriteHalf {
    /// The socket's own write half.
    Plain(OwnedWriteHalf),
    /// Writes of the shared TLS session, and the socket's descriptor (a duplicate) for readiness checks.
    Tls(tokio::io::WriteHalf<Tls>, OwnedFd),
    /// A Unix socket's own write half.
    Local(unix::OwnedWriteHalf),
}

impl AsFd for WriteHalf {
    /// The socket (for readiness checks such as `poll::peer_closed`; never read or written through this).
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            WriteHalf::Plain(w) => w.as_ref().as_fd(),
            WriteHalf::Tls(_, fd) => fd.as_fd(),
            WriteHalf::Local(w) => w.as_ref().as_fd(),
        }
    }
}

impl WriteHalf {
    /// The writer under either kind of half.
    fn writer(&mut self) -> Pin<&mut (dyn AsyncWrite + Unpin)> {
        match self {
            WriteHalf::Plain(w) => Pin::new(w),
            WriteHalf::Tls(w, _) => Pin::new(w),
            WriteHalf::Local(w) => Pin::new(w),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.get_mut().writer().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().writer().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WriteHalf::Plain(w) => w.is_write_vectored(),
            WriteHalf::Tls(w, _) => w.is_write_vectored(),
            WriteHalf::Local(w) => w.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().writer().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().writer().poll_shutdown(cx)
    }
}
