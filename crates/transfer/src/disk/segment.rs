//! [`DiskSegment`]: a block device served to async callers from a small pool of dedicated threads.

use super::buf::{AlignedBuf, BLOCK, round_up};
use super::device::BlockDevice;
use crate::error::TransferError;
use crate::memory::SegmentMemory;
use crescent_proto::ErrorCode;
use parking_lot::Mutex;
use std::fmt;
use std::io;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// How a [`DiskSegment`] runs its I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskConfig {
    /// Threads making device calls (at least one).
    pub io_threads: usize,
    /// Most operations queued or in flight at once (at least one); further submitters wait.
    pub queue_depth: usize,
}

impl Default for DiskConfig {
    fn default() -> Self {
        DiskConfig { io_threads: 2, queue_depth: 32 }
    }
}

/// Why a disk operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiskError {
    /// The range lies outside the disk (or the memory segment), or its end overflows.
    #[error("range outside the segment")]
    OutOfRange,
    /// A write's disk offset is not a multiple of 4096.
    #[error("disk offset {0} is not a multiple of 4096")]
    Unaligned(u64),
    /// The memory range is held by a conflicting transfer.
    #[error("memory range busy")]
    Busy,
    /// The device failed (or a buffer could not be allocated).
    #[error("disk {op} failed ({kind:?}): {message}")]
    Io {
        /// `"read"` or `"write"`.
        op: &'static str,
        /// The error's kind.
        kind: io::ErrorKind,
        /// The error, as text.
        message: String,
    },
    /// The segment's I/O threads are gone.
    #[error("disk segment closed")]
    Closed,
}

impl DiskError {
    fn io(op: &'static str, e: &io::Error) -> DiskError {
        DiskError::Io { op, kind: e.kind(), message: e.to_string() }
    }

    /// The wire code reported for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            DiskError::OutOfRange | DiskError::Unaligned(_) => ErrorCode::InvalidParams,
            DiskError::Busy => ErrorCode::ObjectReplicaBusy,
            DiskError::Io { op: "write", .. } => ErrorCode::FileWriteFail,
            DiskError::Io { .. } => ErrorCode::FileReadFail,
            DiskError::Closed => ErrorCode::TransferFail,
        }
    }

    /// Whether the disk itself failed (as opposed to a refused request).
    pub fn is_device(&self) -> bool {
        matches!(self, DiskError::Io { .. } | DiskError::Closed)
    }
}

impl From<TransferError> for DiskError {
    fn from(e: TransferError) -> Self {
        // A memory lease fails only for a range outside the segment or a conflicting lease.
        match e {
            TransferError::Busy => DiskError::Busy,
            _ => DiskError::OutOfRange,
        }
    }
}

/// Bytes read from a disk segment: exactly the range asked for, inside the block-aligned buffer read (given
/// back to the segment for its next reads when dropped).
pub struct DiskBytes {
    /// `None` only while dropping.
    buf: Option<AlignedBuf>,
    pool: Arc<Pool>,
    start: usize,
    len: usize,
}

impl Deref for DiskBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.buf {
            Some(buf) => &buf.padded()[self.start..self.start + self.len],
            None => &[],
        }
    }
}

impl Drop for DiskBytes {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.give(buf);
        }
    }
}

/// Buffers no longer read from, kept for the next reads: a new buffer is new pages, which the kernel faults in
/// as the device fills them (measured with `O_DIRECT`: a new 1 MiB buffer per read cut a one-at-a-time
/// reader's throughput by about 45 %).
#[derive(Debug, Default)]
struct Pool {
    /// The buffers, and their total capacity.
    free: Mutex<(Vec<AlignedBuf>, usize)>,
}

/// Most bytes a segment keeps in buffers for reuse.
const POOL_BYTES: usize = 32 << 20;

impl Pool {
    /// A buffer of logical length `len`: the last kept one whose capacity holds it (and is not more than twice
    /// what it needs; the last, as the likeliest still in cache), else a new one. Its bytes are stale: only for a device read that fills it.
    fn take(&self, len: usize) -> io::Result<AlignedBuf> {
        let need = round_up(len as u64).and_then(|n| usize::try_from(n).ok()).unwrap_or(usize::MAX).max(BLOCK);
        let kept = {
            let mut free = self.free.lock();
            let fits = free.0.iter().rposition(|b| b.capacity() >= need && b.capacity() / 2 <= need);
            fits.map(|i| {
                let buf = free.0.swap_remove(i);
                free.1 -= buf.capacity();
                buf
            })
        };
        match kept.map(|buf| buf.reuse(len)) {
            Some(Ok(buf)) => Ok(buf),
            _ => AlignedBuf::zeroed(len),
        }
    }

    /// Keeps `buf` for reuse, unless the pool is full (then it is freed, outside the lock).
    fn give(&self, buf: AlignedBuf) {
        let mut free = self.free.lock();
        if free.1 + buf.capacity() <= POOL_BYTES {
            free.1 += buf.capacity();
            free.0.push(buf);
        } else {
            drop(free);
            drop(buf);
        }
    }
}

impl fmt::Debug for DiskBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiskBytes").field("len", &self.len).finish()
    }
}

/// A snapshot of a disk segment's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskStats {
    /// Reads completed (failed ones included).
    pub reads: u64,
    /// Writes completed (failed ones included).
    pub writes: u64,
    /// Bytes read from the device (whole blocks).
    pub read_bytes: u64,
    /// Bytes written to the device (whole blocks).
    pub write_bytes: u64,
    /// Device calls that failed.
    pub errors: u64,
    /// Operations queued or in flight now.
    pub in_flight: u64,
    /// Most operations queued or in flight at once, ever.
    pub max_in_flight: u64,
    /// The configured bound on `in_flight`.
    pub queue_depth: u64,
}

#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    errors: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

/// One device call for an I/O thread; `permit` is the queue-depth slot, released once the call is done (not
/// when the submitter stops waiting, so a cancelled submitter cannot let more than the depth through).
struct Job {
    write: bool,
    offset: u64,
    buf: AlignedBuf,
    reply: oneshot::Sender<(AlignedBuf, io::Result<()>)>,
    _slot: Slot,
}

/// A queue-depth slot: its permit and its place in the in-flight gauge.
struct Slot {
    _permit: OwnedSemaphorePermit,
    counters: Arc<Counters>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.counters.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A disk (or part of one) a storage node stores evicted objects in: reads and writes of byte ranges, each
/// made by one of the segment's own I/O threads (device calls block; they never run on a tokio worker, which
/// would stall the memory transfers it serves), at most `queue_depth` at once. Dropping the segment stops its
/// threads once the operations queued have been made.
pub struct DiskSegment {
    device: Arc<dyn BlockDevice>,
    /// `None` once dropping (closing the channel tells the threads to stop).
    jobs: Option<mpsc::SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
    slots: Arc<Semaphore>,
    counters: Arc<Counters>,
    pool: Arc<Pool>,
    config: DiskConfig,
    size: u64,
    /// Ranges reads failed on since the last [`DiskSegment::take_faults`] (at most [`MAX_FAULTS`]): its node tells
    /// the master, which drops the replicas there.
    faults: Mutex<Vec<(u64, u64)>>,
}

/// Most failed ranges kept between two [`DiskSegment::take_faults`] (more are counted, not kept: a disk failing
/// that much fails its every replica, and the master learns of them as readers fail).
pub const MAX_FAULTS: usize = 4096;

impl fmt::Debug for DiskSegment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiskSegment")
            .field("device", &self.device.describe())
            .field("size", &self.size)
            .field("config", &self.config)
            .finish()
    }
}

impl DiskSegment {
    /// Serves `device` (its capacity rounded down to whole blocks) from `config.io_threads` new threads.
    pub fn new(device: Arc<dyn BlockDevice>, config: DiskConfig) -> io::Result<DiskSegment> {
        let config = DiskConfig { io_threads: config.io_threads.max(1), queue_depth: config.queue_depth.max(1) };
        let size = device.capacity() & !(BLOCK as u64 - 1);
        // The queue holds at most `queue_depth` jobs: a submitter sends only with a slot, so a send never blocks.
        let (tx, rx) = mpsc::sync_channel::<Job>(config.queue_depth);
        let rx = Arc::new(Mutex::new(rx));
        let counters = Arc::new(Counters::default());
        let mut segment = DiskSegment {
            device: device.clone(),
            jobs: Some(tx),
            threads: Vec::with_capacity(config.io_threads),
            slots: Arc::new(Semaphore::new(config.queue_depth)),
            counters: counters.clone(),
            pool: Arc::default(),
            config,
            size,
            faults: Mutex::default(),
        };
        for i in 0..config.io_threads {
            let (rx, device, counters) = (rx.clone(), device.clone(), counters.clone());
            let thread = std::thread::Builder::new()
                .name(format!("crescent-disk-{i}"))
                .spawn(move || io_thread(&rx, &*device, &counters))?;
            // On an error here, the threads already started stop when `segment` drops.
            segment.threads.push(thread);
        }
        Ok(segment)
    }

    /// Bytes the segment holds.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// What the device is (see [`BlockDevice::describe`]).
    pub fn describe(&self) -> String {
        self.device.describe()
    }

    /// The configuration in force (thread count and depth at least one).
    pub fn config(&self) -> DiskConfig {
        self.config
    }

    /// The segment's counters.
    pub fn stats(&self) -> DiskStats {
        let c = &self.counters;
        DiskStats {
            reads: c.reads.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            read_bytes: c.read_bytes.load(Ordering::Relaxed),
            write_bytes: c.write_bytes.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            in_flight: c.in_flight.load(Ordering::SeqCst),
            max_in_flight: c.max_in_flight.load(Ordering::SeqCst),
            queue_depth: self.config.queue_depth as u64,
        }
    }

    /// The ranges reads failed on since the last call, `(offset, length)`: each holds a replica its node could not
    /// read (a bad sector, a dying disk).
    pub fn take_faults(&self) -> Vec<(u64, u64)> {
        std::mem::take(&mut *self.faults.lock())
    }

    /// Checks `[offset, offset + len)` against the segment; returns its end.
    fn check(&self, offset: u64, len: u64) -> Result<u64, DiskError> {
        offset.checked_add(len).filter(|&end| end <= self.size).ok_or(DiskError::OutOfRange)
    }

    /// The `len` bytes at `offset` (any alignment: the covering blocks are read).
    pub async fn read(&self, offset: u64, len: usize) -> Result<DiskBytes, DiskError> {
        let end = self.check(offset, len as u64)?;
        let pool = self.pool.clone();
        if len == 0 {
            let buf = AlignedBuf::zeroed(0).map_err(|e| DiskError::io("read", &e))?;
            return Ok(DiskBytes { buf: Some(buf), pool, start: 0, len: 0 });
        }
        let first = offset & !(BLOCK as u64 - 1);
        // Within the segment: its size is a whole number of blocks.
        let last = round_up(end).ok_or(DiskError::OutOfRange)?;
        let span = usize::try_from(last - first).map_err(|_| DiskError::OutOfRange)?;
        let buf = self.pool.take(span).map_err(|e| DiskError::io("read", &e))?;
        let buf = self.submit(false, first, buf).await.inspect_err(|e| {
            if matches!(e, DiskError::Io { .. }) {
                let mut faults = self.faults.lock();
                if faults.len() < MAX_FAULTS {
                    faults.push((offset, len as u64));
                }
            }
        })?;
        Ok(DiskBytes { buf: Some(buf), pool, start: (offset - first) as usize, len })
    }

    /// Writes `data` at `offset` (a multiple of 4096), followed by zeros to the end of its last block.
    pub async fn write(&self, offset: u64, mut data: AlignedBuf) -> Result<(), DiskError> {
        if !offset.is_multiple_of(BLOCK as u64) {
            return Err(DiskError::Unaligned(offset));
        }
        self.check(offset, data.padded_len() as u64)?;
        data.zero_padding();
        let data = self.submit(true, offset, data).await?;
        self.pool.give(data);
        Ok(())
    }

    /// Copies `len` bytes of `src` at `src_offset` to the disk at `dst_offset` (a multiple of 4096); returns
    /// their crc32c. The memory range is leased only while it is copied out, not during the disk write.
    pub async fn copy_in(
        &self,
        src: &SegmentMemory,
        src_offset: u64,
        len: u64,
        dst_offset: u64,
    ) -> Result<u32, DiskError> {
        if !dst_offset.is_multiple_of(BLOCK as u64) {
            return Err(DiskError::Unaligned(dst_offset));
        }
        self.check(dst_offset, len)?;
        let len = usize::try_from(len).map_err(|_| DiskError::OutOfRange)?;
        let mut buf = self.pool.take(len).map_err(|e| DiskError::io("write", &e))?;
        // Every logical byte is overwritten here, and `write` zeroes the padding.
        buf.as_mut_slice().copy_from_slice(&src.lease(src_offset, len as u64)?);
        let crc = crc32c::crc32c(buf.as_slice());
        self.write(dst_offset, buf).await?;
        Ok(crc)
    }

    /// Copies `len` bytes of the disk at `src_offset` into `dst` at `dst_offset`; returns their crc32c.
    pub async fn copy_out(
        &self,
        src_offset: u64,
        len: u64,
        dst: &SegmentMemory,
        dst_offset: u64,
    ) -> Result<u32, DiskError> {
        // Both ranges checked before the disk is read.
        dst_offset.checked_add(len).filter(|&end| end <= dst.len()).ok_or(DiskError::OutOfRange)?;
        let len = usize::try_from(len).map_err(|_| DiskError::OutOfRange)?;
        let bytes = self.read(src_offset, len).await?;
        let crc = crc32c::crc32c(&bytes);
        dst.lease_mut(dst_offset, len as u64)?.copy_from_slice(&bytes);
        Ok(crc)
    }

    /// Queues one device call (waiting for a slot while `queue_depth` are queued or in flight) and awaits it.
    async fn submit(&self, write: bool, offset: u64, buf: AlignedBuf) -> Result<AlignedBuf, DiskError> {
        let op = if write { "write" } else { "read" };
        let permit = self.slots.clone().acquire_owned().await.map_err(|_| DiskError::Closed)?;
        let c = &self.counters;
        let now = c.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        c.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let slot = Slot { _permit: permit, counters: c.clone() };
        let (reply, answer) = oneshot::channel();
        let jobs = self.jobs.as_ref().ok_or(DiskError::Closed)?;
        // Never blocks: the slot guarantees room in the queue.
        jobs.try_send(Job { write, offset, buf, reply, _slot: slot }).map_err(|_| DiskError::Closed)?;
        let (buf, result) = answer.await.map_err(|_| DiskError::Closed)?;
        match result {
            Ok(()) => Ok(buf),
            Err(e) => {
                tracing::warn!(op, offset, len = buf.padded_len(), device = %self.device.describe(), error = %e, "disk i/o failed");
                Err(DiskError::io(op, &e))
            }
        }
    }
}

/// An I/O thread: makes the queued device calls until the queue closes.
fn io_thread(jobs: &Mutex<mpsc::Receiver<Job>>, device: &dyn BlockDevice, counters: &Counters) {
    loop {
        // The lock is held only while waiting for a job, never during a device call.
        let job = jobs.lock().recv();
        let Ok(Job { write, offset, mut buf, reply, _slot: slot }) = job else { return };
        let result =
            if write { device.write_at(buf.padded(), offset) } else { device.read_at(buf.padded_mut(), offset) };
        let (ops, bytes) =
            if write { (&counters.writes, &counters.write_bytes) } else { (&counters.reads, &counters.read_bytes) };
        ops.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(()) => {
                bytes.fetch_add(buf.padded_len() as u64, Ordering::Relaxed);
            }
            Err(_) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        // The slot is freed before the submitter hears back, so its next call finds it free.
        drop(slot);
        // The submitter may have stopped waiting; the buffer is then simply dropped.
        let _ = reply.send((buf, result));
    }
}

impl Drop for DiskSegment {
    fn drop(&mut self) {
        // Closing the queue stops each thread once the jobs already queued are done.
        self.jobs = None;
        self.slots.close();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
