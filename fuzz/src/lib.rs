//! Helpers shared by the fuzz targets: seed corpora written from real encodings, a byte stream that arrives in
//! arbitrary chunks, a way to run the async frame readers over it, and the re-encoding property.

use bytes::Bytes;
use crescent_proto::wire::Frame;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

/// When `CRESCENT_FUZZ_SEEDS` names a directory, writes `make()`'s inputs there as `seed-N` (scripts/fuzz.sh
/// points it at the target's corpus before a run, so every run starts from valid encodings of this build).
pub fn write_seeds(make: impl FnOnce() -> Vec<Vec<u8>>) {
    let Some(dir) = std::env::var_os("CRESCENT_FUZZ_SEEDS") else { return };
    let dir = std::path::PathBuf::from(dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("seeds: {}: {e}", dir.display());
        return;
    }
    for (i, seed) in make().into_iter().enumerate() {
        if let Err(e) = std::fs::write(dir.join(format!("seed-{i}")), seed) {
            eprintln!("seeds: {}: {e}", dir.display());
        }
    }
}

/// Splits a fuzz input into a control byte and the rest (empty input: 0 and nothing).
pub fn split_first(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((&b, rest)) => (b, rest),
        None => (0, &[]),
    }
}

/// A stream over fixed bytes that hands them out in chunks (sizes from `pattern`, cycled, each 1..=16 bytes) and
/// answers "not ready" before every other chunk, so readers see short reads and wake-ups; writes go to `written`.
pub struct Chunked<'a> {
    data: &'a [u8],
    pattern: u64,
    step: u32,
    /// Bytes of the current chunk not handed out yet.
    avail: usize,
    pending_next: bool,
    /// Everything written to the stream.
    pub written: Vec<u8>,
}

impl<'a> Chunked<'a> {
    /// A stream of `data` cut as `pattern` says.
    pub fn new(data: &'a [u8], pattern: u64) -> Self {
        Self { data, pattern, step: 0, avail: 0, pending_next: false, written: Vec::new() }
    }

    /// The size of the next chunk.
    pub fn next_chunk(&mut self) -> usize {
        let nibble = (self.pattern >> ((self.step % 16) * 4)) & 0xf;
        self.step = self.step.wrapping_add(1);
        nibble as usize + 1
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.data.len()
    }
}

impl Chunked<'_> {
    /// Starts a new chunk if the current one is used up; `false` when the stream says "not ready" first.
    fn refill(&mut self, cx: &mut Context<'_>) -> bool {
        if self.avail == 0 {
            if self.pending_next && self.pattern & 1 == 1 {
                self.pending_next = false;
                cx.waker().wake_by_ref();
                return false;
            }
            self.pending_next = true;
            self.avail = self.next_chunk().min(self.data.len());
        }
        true
    }
}

impl tokio::io::AsyncRead for Chunked<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.refill(cx) {
            return Poll::Pending;
        }
        let n = self.avail.min(buf.remaining());
        buf.put_slice(&self.data[..n]);
        tokio::io::AsyncBufRead::consume(self, n);
        Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncBufRead for Chunked<'_> {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this = self.get_mut();
        if !this.refill(cx) {
            return Poll::Pending;
        }
        Poll::Ready(Ok(&this.data[..this.avail]))
    }

    fn consume(mut self: Pin<&mut Self>, n: usize) {
        let n = n.min(self.avail);
        self.data = &self.data[n..];
        self.avail -= n;
    }
}

impl tokio::io::AsyncWrite for Chunked<'_> {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.written.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime");
}

/// Runs `f` to completion on a single-threaded runtime (with a timer, for the handshake's deadline).
pub fn block_on<F: Future>(f: F) -> F::Output {
    RUNTIME.with(|rt| rt.block_on(f))
}

/// The re-encoding property of a header type: whatever a decoder accepted encodes, decodes again, and encodes to
/// the same bytes (so a value that crossed the wire once crosses it again unchanged). Returns the re-encoded frame.
pub fn reencodes_stably<T: Serialize + DeserializeOwned>(id: u64, body: &T) -> Frame {
    let first = Frame::encode(id, body, Bytes::new()).expect("a decoded value encodes");
    let again = first.decode::<T>().expect("an encoded value decodes");
    assert_eq!(again.id, id);
    let second = Frame::encode(id, &again.body, Bytes::new()).expect("a decoded value encodes");
    assert_eq!(first.header, second.header, "encode . decode . encode is stable");
    assert_eq!(first.request_id().expect("an encoded header has an id"), id);
    first
}
