//! Block devices: the seam between a [`DiskSegment`](super::DiskSegment) and the bytes it stores.
//!
//! Every call transfers whole blocks: the offset, the length and the buffer's address are multiples of
//! [`BLOCK`] (an `O_DIRECT` file refuses anything else with `EINVAL`). Calls are synchronous and may block;
//! the disk segment makes them on its own threads only.

use super::buf::BLOCK;
use parking_lot::{Condvar, Mutex, RwLock};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// The file a [`FileDevice`] keeps in its directory.
pub const DATA_FILE: &str = "crescent-ssd.data";

/// Storage addressed in blocks, read and written in place.
pub trait BlockDevice: Send + Sync + 'static {
    /// Fills `buf` from `offset` (both, and `buf`'s address, multiples of [`BLOCK`]).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes `buf` at `offset` (both, and `buf`'s address, multiples of [`BLOCK`]).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Bytes the device holds (a multiple of [`BLOCK`]).
    fn capacity(&self) -> u64;
    /// What the device is, for logs and status ("O_DIRECT file /x/crescent-ssd.data", "memory", ...).
    fn describe(&self) -> String;
}

/// Why a [`FileDevice`] could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The size is zero or not a whole number of blocks.
    #[error("disk size {0} is not a positive multiple of 4096 bytes")]
    BadSize(u64),
    /// The directory could not be created or its file not created, opened or sized there.
    #[error("disk directory {path}: {source}", path = .path.display())]
    Dir {
        /// The path that failed.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// Another process (another storage node) holds the file.
    #[error("disk file {path} is in use by another process (another node on this directory?)", path = .path.display())]
    Locked {
        /// The locked file.
        path: PathBuf,
    },
}

/// Whether `e` is the kernel refusing `O_DIRECT` (the filesystem does not support it, or not for this buffer).
fn direct_refused(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

/// A file of a local filesystem, `DIR/crescent-ssd.data`, read and written with `O_DIRECT` (bypassing the page
/// cache, which would otherwise hold a second copy of what the node evicted from memory), or buffered where the
/// filesystem refuses `O_DIRECT`.
#[derive(Debug)]
pub struct FileDevice {
    /// The descriptor I/O goes through (`O_DIRECT` unless refused).
    io: File,
    /// The descriptor holding the exclusive `flock` (kept open for the device's life).
    _lock: File,
    path: PathBuf,
    size: u64,
    direct: bool,
}

impl FileDevice {
    /// Creates `dir` if missing, and in it a `size`-byte `crescent-ssd.data` holding only zeros: whatever the
    /// file held is wiped (a restarted node must never serve bytes from before), after taking an exclusive
    /// lock on it (two nodes cannot share a directory). Falls back to buffered I/O, with a warning, where the
    /// filesystem refuses `O_DIRECT` (see [`FileDevice::is_direct`]).
    pub fn create(dir: &Path, size: u64) -> Result<FileDevice, DeviceError> {
        Self::create_with(dir, size, true)
    }

    /// [`FileDevice::create`] with buffered I/O (through the page cache) whatever the filesystem supports: to
    /// compare with `O_DIRECT`, or where a cache of the disk's bytes in memory is wanted.
    pub fn create_buffered(dir: &Path, size: u64) -> Result<FileDevice, DeviceError> {
        Self::create_with(dir, size, false)
    }

    fn create_with(dir: &Path, size: u64, direct: bool) -> Result<FileDevice, DeviceError> {
        if size == 0 || !size.is_multiple_of(BLOCK as u64) {
            return Err(DeviceError::BadSize(size));
        }
        let in_dir = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DeviceError::Dir { path, source }
        };
        fs::create_dir_all(dir).map_err(in_dir(dir))?;
        let path = dir.join(DATA_FILE);
        let lock = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path);
        let lock = lock.map_err(in_dir(&path))?;
        // Locked before anything is wiped: a second node on this directory must not zero the first one's data.
        match rustix::fs::flock(lock.as_fd(), rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Err(DeviceError::Locked { path }),
            Err(e) => return Err(DeviceError::Dir { path, source: e.into() }),
        }
        // Truncated to nothing, then grown: every block reads as zeros, with no old extent left behind.
        lock.set_len(0).map_err(in_dir(&path))?;
        match rustix::fs::fallocate(lock.as_fd(), rustix::fs::FallocateFlags::empty(), 0, size) {
            Ok(()) => {}
            // Not every filesystem preallocates; a sparse file reads as zeros all the same.
            Err(rustix::io::Errno::OPNOTSUPP) => lock.set_len(size).map_err(in_dir(&path))?,
            Err(e) => return Err(DeviceError::Dir { path, source: e.into() }),
        }
        let buffered = || OpenOptions::new().read(true).write(true).open(&path).map_err(in_dir(&path));
        let (io, direct) = match direct.then(|| Self::open_direct(&path)) {
            None => (buffered()?, false),
            Some(Ok(file)) => (file, true),
            Some(Err(e)) if direct_refused(&e) => {
                tracing::warn!(path = %path.display(), "the filesystem refuses O_DIRECT: disk I/O goes through the page cache");
                (buffered()?, false)
            }
            Some(Err(e)) => return Err(DeviceError::Dir { path, source: e }),
        };
        Ok(FileDevice { io, _lock: lock, path, size, direct })
    }

    /// Opens `path` with `O_DIRECT` and proves it works with one block read (some filesystems accept the flag
    /// at open and refuse the I/O).
    fn open_direct(path: &Path) -> io::Result<File> {
        let file = OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(path)?;
        let mut probe = super::AlignedBuf::zeroed(BLOCK)?;
        file.read_exact_at(probe.padded_mut(), 0)?;
        Ok(file)
    }

    /// Whether I/O bypasses the page cache (`O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The data file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.io.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.io.write_all_at(buf, offset)
    }

    fn capacity(&self) -> u64 {
        self.size
    }

    fn describe(&self) -> String {
        let how = if self.direct { "O_DIRECT" } else { "buffered" };
        format!("{how} file {}", self.path.display())
    }
}

/// Checks a device call against `capacity`: `[offset, offset + len)` inside it.
fn check_range(capacity: u64, offset: u64, len: usize) -> io::Result<Range<usize>> {
    let end = offset.checked_add(len as u64).filter(|&end| end <= capacity);
    match end {
        // Both fit in usize: a memory device's capacity came from a `Vec` length.
        Some(end) => Ok(offset as usize..end as usize),
        None => Err(io::Error::new(io::ErrorKind::InvalidInput, "range outside the device")),
    }
}

/// A device in memory: for tests, and as the seam's no-op implementation.
#[derive(Debug)]
pub struct MemoryDevice {
    bytes: RwLock<Vec<u8>>,
}

impl MemoryDevice {
    /// `size` zero bytes (`InvalidInput` unless a positive multiple of [`BLOCK`]).
    pub fn new(size: u64) -> io::Result<MemoryDevice> {
        let len = usize::try_from(size).ok().filter(|&n| n > 0 && n.is_multiple_of(BLOCK));
        let len =
            len.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("memory device of {size} bytes")))?;
        Ok(MemoryDevice { bytes: RwLock::new(vec![0; len]) })
    }
}

impl BlockDevice for MemoryDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let bytes = self.bytes.read();
        let range = check_range(bytes.len() as u64, offset, buf.len())?;
        buf.copy_from_slice(&bytes[range]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut bytes = self.bytes.write();
        let range = check_range(bytes.len() as u64, offset, buf.len())?;
        bytes[range].copy_from_slice(buf);
        Ok(())
    }

    fn capacity(&self) -> u64 {
        self.bytes.read().len() as u64
    }

    fn describe(&self) -> String {
        "memory".to_string()
    }
}

/// Wraps a device with injectable faults, for tests: failing calls return `io::ErrorKind::Other` "injected
/// EIO" without reaching the inner device. Counts every call.
#[derive(Debug)]
pub struct FaultyDevice<D> {
    inner: D,
    /// Reads overlapping one of these byte ranges fail.
    failing_reads: Mutex<Vec<Range<u64>>>,
    /// The next this-many writes fail.
    failing_writes: AtomicU32,
    /// Every call fails.
    all: AtomicBool,
    /// While set, calls wait (to hold operations in flight); see [`FaultyDevice::pause`].
    paused: Mutex<bool>,
    resumed: Condvar,
    reads: AtomicU64,
    writes: AtomicU64,
    injected: AtomicU64,
}

impl<D: BlockDevice> FaultyDevice<D> {
    /// `inner`, with no fault injected yet.
    pub fn new(inner: D) -> Self {
        FaultyDevice {
            inner,
            failing_reads: Mutex::new(Vec::new()),
            failing_writes: AtomicU32::new(0),
            all: AtomicBool::new(false),
            paused: Mutex::new(false),
            resumed: Condvar::new(),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            injected: AtomicU64::new(0),
        }
    }

    /// Fails every read overlapping `range` (of device bytes) from now on, until [`FaultyDevice::heal`].
    pub fn fail_reads_at(&self, range: Range<u64>) {
        self.failing_reads.lock().push(range);
    }

    /// Fails the next `n` writes.
    pub fn fail_next_writes(&self, n: u32) {
        self.failing_writes.store(n, Ordering::SeqCst);
    }

    /// Fails every call while `on`.
    pub fn fail_all(&self, on: bool) {
        self.all.store(on, Ordering::SeqCst);
    }

    /// Clears every injected fault.
    pub fn heal(&self) {
        self.failing_reads.lock().clear();
        self.failing_writes.store(0, Ordering::SeqCst);
        self.all.store(false, Ordering::SeqCst);
    }

    /// While `on`, every call waits before doing anything (operations stay in flight until resumed).
    pub fn pause(&self, on: bool) {
        *self.paused.lock() = on;
        if !on {
            self.resumed.notify_all();
        }
    }

    /// Reads asked of this device (failed ones included).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    /// Writes asked of this device (failed ones included).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// Calls failed by an injected fault.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn wait_resumed(&self) {
        let mut paused = self.paused.lock();
        while *paused {
            self.resumed.wait(&mut paused);
        }
    }

    fn fail(&self) -> io::Result<()> {
        self.injected.fetch_add(1, Ordering::SeqCst);
        Err(io::Error::other("injected EIO"))
    }
}

impl<D: BlockDevice> BlockDevice for FaultyDevice<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.wait_resumed();
        let end = offset.saturating_add(buf.len() as u64);
        let hit = self.failing_reads.lock().iter().any(|r| r.start < end && offset < r.end);
        if hit || self.all.load(Ordering::SeqCst) {
            return self.fail();
        }
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.wait_resumed();
        let counted_down =
            self.failing_writes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if counted_down || self.all.load(Ordering::SeqCst) {
            return self.fail();
        }
        self.inner.write_at(buf, offset)
    }

    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    fn describe(&self) -> String {
        format!("faulty {}", self.inner.describe())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::disk::AlignedBuf;

    fn block(fill: u8) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(BLOCK).unwrap();
        b.as_mut_slice().fill(fill);
        b
    }

    #[test]
    fn memory_device_round_trips_and_checks_ranges() {
        assert!(MemoryDevice::new(0).is_err());
        assert!(MemoryDevice::new(4097).is_err());
        let d = MemoryDevice::new(4 * BLOCK as u64).unwrap();
        assert_eq!(d.capacity(), 4 * BLOCK as u64);
        d.write_at(block(3).padded(), BLOCK as u64).unwrap();
        let mut got = block(0);
        d.read_at(got.padded_mut(), BLOCK as u64).unwrap();
        assert!(got.as_slice().iter().all(|&b| b == 3));
        assert!(d.read_at(got.padded_mut(), 4 * BLOCK as u64).is_err());
        assert!(d.write_at(block(1).padded(), u64::MAX - 10).is_err());
        assert_eq!(d.describe(), "memory");
    }

    #[test]
    fn faults_are_injected_counted_and_healed() {
        let d = FaultyDevice::new(MemoryDevice::new(8 * BLOCK as u64).unwrap());
        let mut buf = block(0);
        d.fail_reads_at(2 * BLOCK as u64..2 * BLOCK as u64 + 1);
        d.read_at(buf.padded_mut(), BLOCK as u64).unwrap();
        let e = d.read_at(buf.padded_mut(), 2 * BLOCK as u64).unwrap_err();
        assert_eq!((e.kind(), e.to_string().as_str()), (io::ErrorKind::Other, "injected EIO"));
        d.fail_next_writes(2);
        assert!(d.write_at(block(1).padded(), 0).is_err());
        assert!(d.write_at(block(1).padded(), 0).is_err());
        d.write_at(block(1).padded(), 0).unwrap();
        d.fail_all(true);
        assert!(d.read_at(buf.padded_mut(), 0).is_err());
        d.heal();
        d.read_at(buf.padded_mut(), 2 * BLOCK as u64).unwrap();
        d.read_at(buf.padded_mut(), 0).unwrap();
        assert!(buf.as_slice().iter().all(|&b| b == 1));
        assert_eq!((d.reads(), d.writes(), d.injected()), (5, 3, 4));
        assert_eq!(d.describe(), "faulty memory");
    }
}
