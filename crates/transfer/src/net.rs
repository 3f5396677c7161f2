//! Data-plane socket helpers shared by the server and the client: socket buffer sizing, payloads received
//! straight into their destination, and sendfile.
//!
//! The data plane does not use `FrameCodec`: a codec must buffer the whole frame, and payloads here must go
//! straight between the socket and segment (or caller) memory. So frames are read in steps (`crescent_net::
//! frame`: prefix, header, then the payload here, into its destination) and written as one vectored write of
//! `prefix + header` (`crescent_proto::wire::Head`) and the payload slice.

use crescent_net::conn::{Conn, Stream};
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::OnceLock;
use tokio::io::Interest;
use tokio::io::{AsyncBufRead, AsyncReadExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};

/// Socket send and receive buffer requested on every data connection: enough for a 1 MiB stripe to be in
/// flight without the sender waiting on the receiver's window on a LAN.
pub(crate) const SOCKET_BUFFER: u32 = 4 << 20;

/// Requests [`SOCKET_BUFFER`]-sized send and receive buffers on `socket` (before connect or listen, so the
/// window scale of the handshake fits them) where that helps. Linux caps an explicit SO_SNDBUF/SO_RCVBUF at
/// `net.core.{w,r}mem_max` *and* turns off buffer autotuning for the socket, so on a host whose cap is below
/// the target an explicit request would leave a smaller buffer than autotuning reaches (`tcp_{w,r}mem` max):
/// there the kernel is left in charge.
pub(crate) fn size_buffers(socket: &TcpSocket) -> io::Result<()> {
    static ALLOWED: OnceLock<(bool, bool)> = OnceLock::new();
    let (send, recv) = *ALLOWED.get_or_init(|| {
        let allows = |path: &str| {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .is_none_or(|max| max >= u64::from(SOCKET_BUFFER))
        };
        (allows("/proc/sys/net/core/wmem_max"), allows("/proc/sys/net/core/rmem_max"))
    });
    if send {
        socket.set_send_buffer_size(SOCKET_BUFFER)?;
    }
    if recv {
        socket.set_recv_buffer_size(SOCKET_BUFFER)?;
    }
    Ok(())
}

/// Capacity of a connection's read buffer. Frame prefixes and headers are read through it (one syscall for
/// several small frames); a payload read larger than this bypasses it and lands in the destination directly,
/// so at most this many payload bytes (those that arrived together with their header) are copied twice.
pub(crate) const READ_BUFFER: usize = 32 << 10;

/// Reads exactly `buf.len()` payload bytes: those `reader` already buffered, then straight from the socket into
/// `buf`. When the socket runs dry mid-payload, `poll` may busy-poll it (see `crescent_net::poll`; true once
/// readable) before the task parks, so a payload arriving in pieces does not cost a wake-up per piece. Each
/// piece is handed to `landed` as soon as it is in `buf` (in order), e.g. to checksum it while it is in cache.
/// Over TLS the pieces are copied out of rustls as its records are opened, without polling.
pub(crate) async fn read_payload(
    reader: &mut BufReader<Conn>,
    buf: &mut [u8],
    poll: impl Fn(&TcpStream) -> bool,
    mut landed: impl FnMut(&[u8]),
) -> io::Result<()> {
    let buffered = reader.buffer();
    let mut done = buffered.len().min(buf.len());
    buf[..done].copy_from_slice(&buffered[..done]);
    landed(&buf[..done]);
    std::pin::Pin::new(&mut *reader).consume(done);
    let Some(sock) = reader.get_ref().plain() else {
        // TLS: each piece copied out of rustls as its records are opened.
        while done < buf.len() {
            match reader.read(&mut buf[done..]).await? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => {
                    landed(&buf[done..done + n]);
                    done += n;
                }
            }
        }
        return Ok(());
    };
    let recv = |buf: &mut [u8]| -> io::Result<usize> {
        // A direct non-blocking recv: tokio's cached readiness is bypassed, so polled input is read at once.
        match rustix::net::recv(sock, buf, rustix::net::RecvFlags::DONTWAIT) {
            Ok((0, _)) => Err(io::ErrorKind::UnexpectedEof.into()),
            Ok((n, _)) => Ok(n),
            Err(e) => Err(e.into()),
        }
    };
    while done < buf.len() {
        match recv(&mut buf[done..]) {
            Ok(n) => {
                landed(&buf[done..done + n]);
                done += n;
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
            Err(_) => {}
        }
        if poll(sock) {
            continue;
        }
        // Park. The read goes through tokio once more so that a stale "readable" it cached is cleared first.
        match sock.try_io(Interest::READABLE, || recv(&mut buf[done..])) {
            Ok(n) => {
                landed(&buf[done..done + n]);
                done += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => sock.readable().await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sends `len` bytes of the file `fd` from `offset` on the non-blocking socket `sock` with sendfile(2), waiting
/// for the socket to drain whenever it is full.
pub(crate) async fn send_file(sock: &TcpStream, fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<()> {
    let mut at = offset;
    let end = offset + len as u64;
    while at < end {
        let want = usize::try_from(end - at).unwrap_or(usize::MAX);
        match sock.try_io(Interest::WRITABLE, || Ok(rustix::fs::sendfile(sock, fd, Some(&mut at), want)?)) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => sock.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Per-connection socket options: no Nagle (a 4 KiB reply must not wait for a delayed ACK).
pub(crate) fn tune(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn buffers_get_the_full_size_or_stay_with_the_kernel() {
        let s = TcpSocket::new_v4().unwrap();
        let (send, recv) = (s.send_buffer_size().unwrap(), s.recv_buffer_size().unwrap());
        size_buffers(&s).unwrap();
        // Linux reports twice the requested size (bookkeeping overhead included).
        let after_send = s.send_buffer_size().unwrap();
        let after_recv = s.recv_buffer_size().unwrap();
        assert!(after_send >= SOCKET_BUFFER || after_send == send, "{send} -> {after_send}");
        assert!(after_recv >= SOCKET_BUFFER || after_recv == recv, "{recv} -> {after_recv}");
    }
}
