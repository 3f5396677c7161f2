//! Frames read in steps and written in vectored pieces, for connections whose payloads must go straight
//! between the socket and their destination (segment or caller memory) instead of through a codec's buffer.
//!
//! A frame is read as its prefix ([`read_shape`]: the announced length is checked against the limit before
//! anything else is read or reserved), its header, then its payload wherever the caller wants it. The layout
//! and its checks are `crescent_proto::wire`'s ([`FrameShape`]).

use crescent_proto::wire::{Frame, FrameShape, WireError, frame_prefix};
use serde::Serialize;
use std::io::{self, IoSlice};
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Why a frame's shape could not be read.
#[derive(Debug)]
pub enum ShapeError {
    /// The socket failed or closed.
    Io(io::Error),
    /// The announced shape breaks the protocol.
    Wire(WireError),
}

/// Waits until a frame starts (without a deadline: pooled connections idle here); `false` on a clean end of
/// stream between frames.
pub async fn frame_starts<R: AsyncBufRead + Unpin>(reader: &mut R) -> io::Result<bool> {
    Ok(!reader.fill_buf().await?.is_empty())
}

/// Reads a frame's prefix field by field: the announced length is checked against `max_frame` as soon as its 4
/// bytes are in (before anything is allocated, and without waiting for bytes a too-short frame lacks), then the
/// header length must fit the frame.
pub async fn read_shape<R: AsyncRead + Unpin>(reader: &mut R, max_frame: usize) -> Result<FrameShape, ShapeError> {
    let mut field = [0u8; 4];
    reader.read_exact(&mut field).await.map_err(ShapeError::Io)?;
    let body = FrameShape::check_len(u32::from_be_bytes(field), max_frame).map_err(ShapeError::Wire)?;
    reader.read_exact(&mut field).await.map_err(ShapeError::Io)?;
    FrameShape::split(body, u32::from_be_bytes(field)).map_err(ShapeError::Wire)
}

/// Discards `n` bytes through the read buffer (no allocation).
pub async fn skip<R: AsyncBufRead + Unpin>(reader: &mut R, mut n: usize) -> io::Result<()> {
    while n > 0 {
        let available = reader.fill_buf().await?.len();
        if available == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let k = available.min(n);
        reader.consume(k);
        n -= k;
    }
    Ok(())
}

/// Writes every byte of `bufs` with as few (vectored) syscalls as the socket allows.
pub async fn write_all_vectored<W: AsyncWrite + Unpin>(writer: &mut W, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let n = writer.write_vectored(bufs).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// After the last frame, how long and how much a closing end keeps reading so the frame is delivered (closing
/// with unread input would reset the connection, and a reset can discard the frame before the peer reads it).
const LINGER_TIME: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1 << 20;

/// Ends a connection that broke the protocol: writes `pending` (replies already owed) and `body` as a last
/// frame under request id 0, then closes gracefully (FIN, then reads and discards, bounded in time and bytes,
/// until the peer closes), so the frame reaches the peer instead of being lost to a reset. Best effort: the
/// connection is closing either way.
pub async fn refuse<S: AsyncRead + AsyncWrite + Unpin, T: Serialize>(io: &mut S, pending: &[u8], body: &T) {
    let sent = async {
        let mut out = pending.to_vec();
        if let Ok(frame) = Frame::encode(0, body, bytes::Bytes::new()) {
            out.extend_from_slice(&frame_prefix(frame.header.len(), 0)?);
            out.extend_from_slice(&frame.header);
        }
        io.write_all(&out).await?;
        io.flush().await?;
        io.shutdown().await?;
        let mut sink = [0u8; 16 << 10];
        let mut drained = 0;
        while drained < LINGER_BYTES {
            match io.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok::<(), WireError>(())
    };
    let _ = tokio::time::timeout(LINGER_TIME, sent).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crescent_proto::ErrorCode;
    use crescent_proto::wire::{Envelope, ErrorFrame, Head, Limits};
    use tokio::io::BufReader;

    #[tokio::test]
    async fn shapes_are_checked_field_by_field_and_payloads_skipped() {
        let head = Head::encode(5, &"header", 3).unwrap();
        let mut bytes = head.as_bytes().to_vec();
        bytes.extend_from_slice(b"xyz");
        bytes.extend_from_slice(Head::encode(6, &"next", 0).unwrap().as_bytes());
        let mut r = BufReader::new(&bytes[..]);
        assert!(frame_starts(&mut r).await.unwrap());
        let shape = read_shape(&mut r, 1024).await.unwrap();
        assert_eq!(shape.payload_len, 3);
        let mut header = vec![0u8; shape.header_len];
        r.read_exact(&mut header).await.unwrap();
        assert_eq!(postcard::from_bytes::<Envelope<String>>(&header).unwrap().id, 5);
        skip(&mut r, 3).await.unwrap();
        let next = read_shape(&mut r, 1024).await.unwrap();
        skip(&mut r, next.header_len).await.unwrap();
        assert!(!frame_starts(&mut r).await.unwrap(), "clean end between frames");
        assert!(matches!(skip(&mut r, 1).await, Err(e) if e.kind() == io::ErrorKind::UnexpectedEof));
        // Too large: refused on the length field alone, with no further bytes needed.
        let huge = u32::MAX.to_be_bytes();
        let mut r = BufReader::new(&huge[..]);
        assert!(matches!(read_shape(&mut r, Limits::DATA.max_frame as usize).await, Err(ShapeError::Wire(_))));
        // Truncated mid-prefix.
        let mut r = BufReader::new(&[0u8, 0, 0, 9, 0][..]);
        assert!(matches!(read_shape(&mut r, 1024).await, Err(ShapeError::Io(_))));
    }

    #[tokio::test]
    async fn a_refusal_is_delivered_before_the_close() {
        let (mut server, mut client) = tokio::io::duplex(1 << 16);
        let refusal = ErrorFrame { code: ErrorCode::InvalidParams, message: "bad frame".into() };
        let pending = Head::encode(3, &"owed", 0).unwrap();
        // The peer reads everything, then closes (ending the refusing end's linger).
        let (_, got) = tokio::join!(refuse(&mut server, pending.as_bytes(), &refusal), async move {
            let mut all = Vec::new();
            client.read_to_end(&mut all).await.unwrap();
            all
        });
        let mut r = BufReader::new(&got[..]);
        let first = read_shape(&mut r, 1024).await.unwrap();
        skip(&mut r, first.header_len).await.unwrap();
        let last = read_shape(&mut r, 1024).await.unwrap();
        let mut header = vec![0u8; last.header_len];
        r.read_exact(&mut header).await.unwrap();
        let env: Envelope<ErrorFrame> = postcard::from_bytes(&header).unwrap();
        assert_eq!((env.id, env.body), (0, refusal));
    }
}
