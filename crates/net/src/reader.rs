//! [`FrameReader`]: frames read from a socket that is busy-polled before its task parks.
//!
//! tokio caches a socket's readiness and clears it when a read comes up short; after that, a read through
//! tokio returns `Pending` until the reactor's next turn reports the socket again, even when a busy-poll (see
//! [`crate::poll`]) has just seen input arrive. That turn costs a task switch and an `epoll_wait` per message,
//! a large share of a ~20 µs metadata round trip. A `FrameReader` keeps its own buffer and, after a poll hit,
//! reads straight from the socket.
//!
//! The crate's only `unsafe` is here: marking the bytes `recv` wrote into the buffer's spare capacity as
//! initialised (as tokio's own reads do), so no read zero-fills memory first.
#![allow(unsafe_code)]

use crate::conn::Stream;
use bytes::BytesMut;
use crescent_proto::wire::{Frame, FrameCodec, Limits, WireError};
use std::io;
use std::os::fd::AsFd;
use tokio::io::AsyncReadExt;
use tokio::io::Interest;
use tokio_util::codec::Decoder;

/// Bytes reserved in the buffer before each read (a control-plane frame is usually far smaller).
const READ_CHUNK: usize = 16 << 10;

/// A frame decoder with its own read buffer; the socket is passed to each call, so the write half stays free.
#[derive(Debug)]
pub struct FrameReader {
    codec: FrameCodec,
    buf: BytesMut,
    /// The peer closed its side: no more bytes will come.
    eof: bool,
}

impl FrameReader {
    /// A reader enforcing `limits` on every frame.
    pub fn new(limits: Limits) -> Self {
        Self { codec: FrameCodec::new(limits), buf: BytesMut::with_capacity(READ_CHUNK), eof: false }
    }

    /// The next frame already buffered, if any (no I/O).
    pub fn buffered(&mut self) -> Result<Option<Frame>, WireError> {
        self.codec.decode(&mut self.buf)
    }

    /// Reads what `rd` holds right now without waiting (on a plain socket a direct non-blocking `recv`,
    /// bypassing tokio's cached readiness; over TLS a read of the session that does the same underneath);
    /// returns the bytes read (0 when nothing was there, or at end of stream).
    pub fn read_now<S: Stream>(&mut self, rd: &mut S) -> Result<usize, WireError> {
        if self.eof {
            return Ok(0);
        }
        self.buf.reserve(READ_CHUNK);
        loop {
            let read = match rd.plain() {
                Some(sock) => read_into(sock, &mut self.buf),
                None => crate::conn::read_now(rd, &mut self.buf),
            };
            match read {
                Ok(n) => {
                    self.eof = n == 0;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) => return Err(WireError::Io(e)),
            }
        }
    }

    /// The next frame: from the buffer, else read from `rd` (parking until it is readable). `None` at a
    /// clean end of stream; a stream that ends mid-frame is an error. Cancel-safe: bytes read stay buffered.
    pub async fn next<S: Stream>(&mut self, rd: &mut S) -> Option<Result<Frame, WireError>> {
        loop {
            match self.buffered() {
                Ok(Some(frame)) => return Some(Ok(frame)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
            if self.eof {
                return (!self.buf.is_empty()).then(|| Err(WireError::Malformed("connection closed mid-frame")));
            }
            self.buf.reserve(READ_CHUNK);
            let Some(sock) = rd.plain() else {
                // TLS: records are opened by rustls, read through tokio.
                match rd.read_buf(&mut self.buf).await {
                    Ok(0) => self.eof = true,
                    Ok(_) => {}
                    Err(e) => return Some(Err(WireError::Io(e))),
                }
                continue;
            };
            // Through tokio this time, so that a stale cached readiness is cleared before the task parks.
            match sock.try_io(Interest::READABLE, || read_into(sock, &mut self.buf)) {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Err(e) = sock.readable().await {
                        return Some(Err(WireError::Io(e)));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Some(Err(WireError::Io(e))),
            }
        }
    }
}

/// One non-blocking `recv` into `buf`'s spare capacity; `WouldBlock` when the socket is empty.
fn read_into<S: AsFd>(sock: &S, buf: &mut BytesMut) -> io::Result<usize> {
    let len = buf.len();
    let ((got, _), _) = rustix::net::recv(sock, buf.spare_capacity_mut(), rustix::net::RecvFlags::DONTWAIT)?;
    let n = got.len();
    // SAFETY: recv initialised the first `n` bytes of the spare capacity, which starts at `len`.
    unsafe { buf.set_len(len + n) };
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tokio::io::AsyncWriteExt;

    fn wire(frames: &[Frame]) -> Vec<u8> {
        let mut out = BytesMut::new();
        let mut codec = FrameCodec::new(Limits::CONTROL);
        for f in frames {
            tokio_util::codec::Encoder::encode(&mut codec, f.clone(), &mut out).unwrap();
        }
        out.to_vec()
    }

    use crate::conn::Conn;

    /// (writer, reader) over loopback, TLS when `tls`.
    async fn pair(tls: bool) -> (Conn, Conn) {
        crate::tls::testing::pair(tls).await
    }

    #[tokio::test]
    async fn frames_split_across_reads_and_several_per_read_all_arrive_in_order() {
        for tls in [false, true] {
            frames_arrive_in_order_over(tls).await;
        }
    }

    async fn frames_arrive_in_order_over(tls: bool) {
        let (mut tx, mut rx) = pair(tls).await;
        let frames: Vec<Frame> =
            (1..=3u64).map(|i| Frame::encode(i, &i, Bytes::from(vec![i as u8; 5])).unwrap()).collect();
        let bytes = wire(&frames);
        let mut r = FrameReader::new(Limits::CONTROL);
        // Half of the first frame, then the rest with two more frames behind it.
        tx.write_all(&bytes[..7]).await.unwrap();
        tx.flush().await.unwrap();
        let rest = bytes[7..].to_vec();
        let writer = tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.write_all(&rest).await.unwrap();
            tx.flush().await.unwrap();
            tx
        });
        for f in &frames {
            assert_eq!(r.next(&mut rx).await.unwrap().unwrap(), *f);
        }
        drop(writer.await.unwrap());
        assert!(r.next(&mut rx).await.is_none(), "a clean close ends the stream");
    }

    #[tokio::test]
    async fn read_now_takes_waiting_bytes_without_the_reactor_and_nothing_when_empty() {
        for tls in [false, true] {
            read_now_over(tls).await;
        }
    }

    async fn read_now_over(tls: bool) {
        let (mut tx, mut rx) = pair(tls).await;
        let mut r = FrameReader::new(Limits::CONTROL);
        assert_eq!(r.read_now(&mut rx).unwrap(), 0, "an empty socket gives nothing");
        let f = Frame::encode(9, &"hi", Bytes::new()).unwrap();
        tx.write_all(&wire(std::slice::from_ref(&f))).await.unwrap();
        tx.flush().await.unwrap();
        // No await from here on: what the poll saw is read without the reactor (a TLS record may come in
        // pieces, so poll again until it is whole).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let got = loop {
            assert!(std::time::Instant::now() < deadline, "tls {tls}: the frame never came");
            if crate::poll::until_readable(&rx.socket(), std::time::Duration::from_secs(1)) {
                r.read_now(&mut rx).unwrap();
                if let Some(got) = r.buffered().unwrap() {
                    break got;
                }
            }
        };
        assert_eq!(got, f);
        assert_eq!(r.buffered().unwrap(), None);
    }

    #[tokio::test]
    async fn a_stream_closed_mid_frame_or_an_oversized_frame_is_an_error() {
        for tls in [false, true] {
            closed_mid_frame_or_oversized_over(tls).await;
        }
    }

    async fn closed_mid_frame_or_oversized_over(tls: bool) {
        let (mut tx, mut rx) = pair(tls).await;
        let bytes = wire(&[Frame::encode(1, &1u8, Bytes::new()).unwrap()]);
        tx.write_all(&bytes[..bytes.len() - 1]).await.unwrap();
        tx.flush().await.unwrap();
        drop(tx);
        let mut r = FrameReader::new(Limits::CONTROL);
        assert!(matches!(r.next(&mut rx).await, Some(Err(WireError::Malformed(_)))));

        let (mut tx, mut rx) = pair(tls).await;
        tx.write_all(&(Limits::CONTROL.max_frame + 1).to_be_bytes()).await.unwrap();
        tx.flush().await.unwrap();
        let mut r = FrameReader::new(Limits::CONTROL);
        assert!(matches!(r.next(&mut rx).await, Some(Err(WireError::FrameTooLarge { .. }))));
    }
}
