//! Whole frames a server reads from a connection without letting the peer pin its memory.
//!
//! A connection buffers at most [`ALLOWANCE`] bytes on its own (pipelined small requests). A larger frame, up
//! to the connection's frame limit, is read only once it holds its size from the server's [`FrameBudget`],
//! which all connections share, and it is read into memory mapped for it alone, which goes back to the OS the
//! moment the frame is dropped (a heap buffer would stay with the allocator: glibc keeps freed buffers of a
//! few MiB, and would keep them for a connection's next frame too). So however many peers announce large
//! frames and stall, the server holds at most the budget plus an allowance per connection, and nothing more
//! once they are gone. The caller bounds the time a started frame may take ([`Inbound::rest`] runs under its
//! deadline). The master's RPC connections read this way; the data plane reads payloads straight into segment
//! memory instead.

use crate::conn::Conn;
use bytes::{BufMut, Bytes, BytesMut};
use crescent_proto::wire::{FRAME_PREFIX, Frame, FrameCodec, FrameShape, Limits, WireError};
use memmap2::MmapMut;
use std::io;
use std::sync::Arc;
use tokio::io::AsyncReadExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::codec::Decoder;

/// Bytes a connection may buffer without drawing on the budget: room for many pipelined small requests
/// (a lookup is ~60 bytes, a batch of a hundred keys a few KiB).
pub const ALLOWANCE: usize = 16 << 10;

/// The budget's unit (permits count KiB, so a 16 MiB frame takes 16 384 of them).
const UNIT: usize = 1 << 10;

/// Bytes of frames larger than [`ALLOWANCE`] that all of a server's connections may hold at once.
#[derive(Debug, Clone)]
pub struct FrameBudget {
    permits: Arc<Semaphore>,
    /// Every permit: a frame larger than the whole budget takes all of it.
    units: u32,
}

impl FrameBudget {
    /// A budget of `bytes` (rounded up to a KiB; a frame larger than the budget waits for all of it).
    pub fn new(bytes: usize) -> Self {
        let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX).max(1);
        Self { permits: Arc::new(Semaphore::new(units as usize)), units }
    }

    /// Bytes no frame holds now.
    pub fn available(&self) -> usize {
        self.permits.available_permits() * UNIT
    }

    /// Waits (in turn: the semaphore is fair) until `bytes` of the budget are free, and holds them.
    async fn take(&self, bytes: usize) -> Result<OwnedSemaphorePermit, WireError> {
        let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX).min(self.units);
        // The semaphore is never closed.
        self.permits.clone().acquire_many_owned(units).await.map_err(|_| WireError::Closed)
    }
}

/// A frame, holding its share of the budget (if it needed one) until dropped.
#[derive(Debug)]
pub struct InboundFrame {
    /// The frame.
    pub frame: Frame,
    held: Option<OwnedSemaphorePermit>,
}

impl InboundFrame {
    /// Whether the frame was larger than the per-connection allowance (its memory is unmapped with it).
    pub fn is_large(&self) -> bool {
        self.held.is_some()
    }
}

/// What a connection's input holds after reading what had arrived.
#[derive(Debug)]
pub enum Ready {
    /// A whole frame.
    Frame(InboundFrame),
    /// Nothing: the connection is between frames.
    Empty,
    /// Part of a frame: the rest must come within the caller's deadline ([`Inbound::rest`]).
    Partial,
    /// The peer closed the connection between frames.
    Closed,
}

/// One connection's input: its buffer, the large frame it is reading, and the frame limit.
#[derive(Debug)]
pub struct Inbound {
    codec: FrameCodec,
    /// Small frames, and the first bytes of a large one (at most [`ALLOWANCE`] bytes).
    buf: BytesMut,
    /// The large frame being read.
    large: Option<Large>,
    max_frame: usize,
    /// The peer closed its side: no more bytes will come.
    eof: bool,
}

/// A frame larger than the allowance, being read into memory of its own.
#[derive(Debug)]
struct Large {
    /// Exactly the frame's bytes, prefix included.
    mem: MmapMut,
    /// Bytes read so far.
    filled: usize,
    held: OwnedSemaphorePermit,
}

impl Inbound {
    /// Input enforcing `limits` on every frame (nothing allocated until the first bytes arrive).
    pub fn new(limits: Limits) -> Self {
        Self {
            codec: FrameCodec::new(limits),
            buf: BytesMut::new(),
            large: None,
            max_frame: limits.max_frame as usize,
            eof: false,
        }
    }

    /// Without waiting: a whole frame if one is buffered, or completed by what the socket holds right now (read
    /// through tokio's readiness, so a socket it has not reported readable is not read). Only frames within the
    /// allowance complete here; a larger one reports [`Ready::Partial`] and waits for its budget in
    /// [`Inbound::rest`]. A frame that breaks the protocol is refused as soon as its prefix is in.
    pub fn ready(&mut self, sock: &mut Conn) -> Result<Ready, WireError> {
        if self.large.is_some() {
            return Ok(Ready::Partial);
        }
        if let Some(frame) = self.whole()? {
            return Ok(Ready::Frame(frame));
        }
        let room = ALLOWANCE.saturating_sub(self.buf.len());
        self.read_now(sock, room)?;
        if let Some(frame) = self.whole()? {
            return Ok(Ready::Frame(frame));
        }
        Ok(match (self.buf.is_empty(), self.eof) {
            (true, false) => Ready::Empty,
            (true, true) => Ready::Closed,
            (false, false) => Ready::Partial,
            (false, true) => return Err(mid_frame()),
        })
    }

    /// Reads the rest of the frame that has started, waiting on the socket and, for a frame beyond the
    /// allowance, for its size from `budget` first. Run it under a deadline: a peer that stalls mid-frame holds
    /// the connection, and possibly part of the budget, until then.
    pub async fn rest(&mut self, sock: &mut Conn, budget: &FrameBudget) -> Result<InboundFrame, WireError> {
        loop {
            if let Some(large) = &mut self.large {
                if large.filled == large.mem.len() {
                    return self.finish_large();
                }
                if self.eof {
                    return Err(mid_frame());
                }
                match sock.read(&mut large.mem[large.filled..]).await? {
                    0 => self.eof = true,
                    n => large.filled += n,
                }
                continue;
            }
            if let Some(frame) = self.whole()? {
                return Ok(frame);
            }
            if self.eof {
                return Err(mid_frame());
            }
            if let Some(total) = self.announced()?
                && total > ALLOWANCE
            {
                let held = budget.take(total).await?;
                let mut mem = MmapMut::map_anon(total)?;
                // The buffer holds at most the allowance, all of it this frame's first bytes.
                let have = self.buf.len().min(total);
                mem[..have].copy_from_slice(&self.buf[..have]);
                self.buf.clear();
                self.large = Some(Large { mem, filled: have, held });
                continue;
            }
            let room = ALLOWANCE.saturating_sub(self.buf.len());
            if room == 0 {
                // Unreachable: a buffer this full holds a whole small frame or moved to a large one.
                return Err(WireError::Malformed("frame larger than its allowance"));
            }
            self.buf.reserve(room);
            if sock.read_buf(&mut (&mut self.buf).limit(room)).await? == 0 {
                self.eof = true;
            }
        }
    }

    /// The whole length (prefix included) of the frame at the front of the buffer, once its length field is
    /// in; checked against the limit (and, once in, the header length against the frame) before anything is
    /// reserved for it.
    fn announced(&self) -> Result<Option<usize>, WireError> {
        let Some(len) = self.buf.first_chunk::<4>() else { return Ok(None) };
        let body = FrameShape::check_len(u32::from_be_bytes(*len), self.max_frame)?;
        if let Some(prefix) = self.buf.first_chunk::<FRAME_PREFIX>() {
            FrameShape::split(body, u32::from_be_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]))?;
        }
        Ok(Some(FRAME_PREFIX + body))
    }

    /// The small frame at the front of the buffer, if all of it is in.
    fn whole(&mut self) -> Result<Option<InboundFrame>, WireError> {
        let Some(total) = self.announced()? else { return Ok(None) };
        if total > ALLOWANCE || self.buf.len() < total {
            return Ok(None);
        }
        match self.codec.decode(&mut self.buf)? {
            Some(frame) => Ok(Some(InboundFrame { frame, held: None })),
            None => Err(WireError::Malformed("frame not decoded whole")),
        }
    }

    /// The large frame read whole: its header and payload are views of its own mapping, unmapped (and its
    /// share of the budget returned) when the last of them is dropped.
    fn finish_large(&mut self) -> Result<InboundFrame, WireError> {
        let Some(Large { mem, held, .. }) = self.large.take() else {
            return Err(WireError::Malformed("no large frame in progress"));
        };
        let Some(prefix) = mem.first_chunk::<FRAME_PREFIX>() else {
            return Err(WireError::Malformed("frame shorter than its prefix"));
        };
        let body =
            FrameShape::check_len(u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]), self.max_frame)?;
        let shape = FrameShape::split(body, u32::from_be_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]))?;
        let bytes = Bytes::from_owner(mem);
        let header = bytes.slice(FRAME_PREFIX..FRAME_PREFIX + shape.header_len);
        let payload = bytes.slice(FRAME_PREFIX + shape.header_len..);
        Ok(InboundFrame { frame: Frame { header, payload }, held: Some(held) })
    }

    /// Reads up to `room` bytes that the socket holds now, without waiting.
    fn read_now(&mut self, sock: &mut Conn, room: usize) -> Result<(), WireError> {
        if room == 0 || self.eof {
            return Ok(());
        }
        self.buf.reserve(room);
        loop {
            match sock.try_read_buf(&mut (&mut self.buf).limit(room)) {
                Ok(n) => {
                    self.eof = n == 0;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(WireError::Io(e)),
            }
        }
    }
}

fn mid_frame() -> WireError {
    WireError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed mid-frame"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use bytes::Bytes;
    use crescent_proto::wire::frame_prefix;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    use crate::tls::testing::pair;

    fn encoded(id: u64, payload: usize) -> Vec<u8> {
        let frame = Frame::encode(id, &"request", Bytes::from(vec![7u8; payload])).unwrap();
        let mut out = frame_prefix(frame.header.len(), payload).unwrap().to_vec();
        out.extend_from_slice(&frame.header);
        out.extend_from_slice(&frame.payload);
        out
    }

    /// Waits (bounded) until `inbound` reports something other than an empty input.
    async fn next_ready(inbound: &mut Inbound, sock: &mut Conn) -> Ready {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match inbound.ready(sock).unwrap() {
                    Ready::Empty => sock.readable().await.unwrap(),
                    other => return other,
                }
            }
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn pipelined_small_frames_come_whole_without_the_budget() {
        for tls in [false, true] {
            pipelined_small_frames_come_whole_without_the_budget_over(tls).await;
        }
    }

    async fn pipelined_small_frames_come_whole_without_the_budget_over(tls: bool) {
        let (mut server, mut client) = pair(tls).await;
        let mut inbound = Inbound::new(Limits::CONTROL);
        let mut bytes = encoded(1, 10);
        bytes.extend(encoded(2, 20));
        client.write_all(&bytes).await.unwrap();
        client.flush().await.unwrap();
        for id in [1, 2] {
            let Ready::Frame(f) = next_ready(&mut inbound, &mut server).await else { panic!("not whole") };
            assert_eq!(f.frame.request_id().unwrap(), id);
            assert!(!f.is_large());
        }
        drop(client);
        assert!(matches!(next_ready(&mut inbound, &mut server).await, Ready::Closed));
    }

    #[tokio::test]
    async fn a_large_frame_waits_for_its_budget_and_returns_it_with_its_buffer() {
        for tls in [false, true] {
            a_large_frame_waits_for_its_budget_and_returns_it_with_its_buffer_over(tls).await;
        }
    }

    async fn a_large_frame_waits_for_its_budget_and_returns_it_with_its_buffer_over(tls: bool) {
        let (mut server, mut client) = pair(tls).await;
        let budget = FrameBudget::new(3 << 20);
        let mut inbound = Inbound::new(Limits::CONTROL);
        let big = encoded(1, 2 << 20);
        // Another connection's frame holds most of the budget.
        let other = budget.take(2 << 20).await.unwrap();
        let writer = tokio::spawn(async move {
            client.write_all(&big).await.unwrap();
            client.flush().await.unwrap();
            client.write_all(&encoded(2, 1)).await.unwrap();
            client.flush().await.unwrap();
            client
        });
        assert!(matches!(next_ready(&mut inbound, &mut server).await, Ready::Partial));
        let waiting = tokio::time::timeout(Duration::from_millis(100), inbound.rest(&mut server, &budget)).await;
        assert!(waiting.is_err(), "read past the allowance without its budget");
        assert!(inbound.buf.len() <= ALLOWANCE, "buffered {} bytes", inbound.buf.len());
        drop(other);
        let f =
            tokio::time::timeout(Duration::from_secs(10), inbound.rest(&mut server, &budget)).await.unwrap().unwrap();
        assert!(f.is_large() && f.frame.payload.len() == 2 << 20);
        // Its share: the frame (prefix, a 9-byte header, 2 MiB), rounded up to a KiB.
        assert_eq!(budget.available(), (3 << 20) - (2 << 20) - 1024, "the frame holds its share");
        assert!(inbound.buf.capacity() <= ALLOWANCE && inbound.large.is_none(), "memory kept for the next frame");
        drop(f);
        assert_eq!(budget.available(), 3 << 20);
        let Ready::Frame(f) = next_ready(&mut inbound, &mut server).await else { panic!("not whole") };
        assert_eq!(f.frame.request_id().unwrap(), 2);
        drop(writer.await.unwrap());
    }

    #[tokio::test]
    async fn oversized_and_truncated_frames_are_errors() {
        for tls in [false, true] {
            oversized_and_truncated_frames_are_errors_over(tls).await;
        }
    }

    async fn oversized_and_truncated_frames_are_errors_over(tls: bool) {
        let (mut server, mut client) = pair(tls).await;
        let mut inbound = Inbound::new(Limits { max_frame: 1024 });
        client.write_all(&2048u32.to_be_bytes()).await.unwrap();
        client.flush().await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match inbound.ready(&mut server) {
                    Ok(Ready::Empty) => server.readable().await.unwrap(),
                    other => return other,
                }
            }
        })
        .await
        .unwrap();
        assert!(matches!(r, Err(WireError::FrameTooLarge { len: 2048, max: 1024 })), "{r:?}");

        let (mut server, mut client) = pair(tls).await;
        let mut inbound = Inbound::new(Limits::CONTROL);
        client.write_all(&encoded(1, 100)[..50]).await.unwrap();
        client.flush().await.unwrap();
        assert!(matches!(next_ready(&mut inbound, &mut server).await, Ready::Partial));
        drop(client);
        let r = inbound.rest(&mut server, &FrameBudget::new(1 << 20)).await;
        assert!(matches!(r, Err(WireError::Io(ref e)) if e.kind() == io::ErrorKind::UnexpectedEof), "{r:?}");
    }
}
