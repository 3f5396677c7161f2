//! Segment memory: the mmap'd bytes of one mounted segment.
//!
//! Many tasks read and write disjoint ranges of one segment at once (several connections, several stripes of
//! one object), so the memory is shared through `&self` and reached through a raw pointer. This is one of
//! the crate's three modules that use `unsafe` (with `vm` and `disk::buf`); every block is a few lines and carries its own `SAFETY:` note.
//!
//! # Why the accesses are sound
//! Every access goes through a *range lease*: [`SegmentMemory::lease`] (shared, for reads) or
//! [`SegmentMemory::lease_mut`] (exclusive, for writes). A lease is granted only after the range has been checked
//! against the mapping with checked arithmetic, and only if it does not overlap a conflicting live lease
//! (a writer excludes everyone, readers exclude writers). So the `&[u8]` / `&mut [u8]` a lease hands out never
//! aliases a `&mut [u8]` handed out to anybody else, exactly as a `RwLock` per byte range would guarantee.
//!
//! In normal operation leases never conflict: the master's protocol keeps accesses apart (a range is written
//! only while its replica is PROCESSING, by the one writer that allocated it, and read only once it is
//! COMPLETE, under a read lease that keeps it from being freed and reused). The lease table turns a violation
//! of that protocol (a buggy or hostile peer writing a range someone is reading) into a refusal
//! ([`TransferError::Busy`]) instead of a data race. It costs one uncontended mutex round trip per transfer.
//!
//! A memfd-backed segment's file descriptor can be shared with another process ([`SegmentMemory::fd`]); what
//! that process does to the bytes is outside this process's memory model (as with any shared memory): it can
//! corrupt data but cannot invalidate the mapping, unless it truncates the file (which raises `SIGBUS` on
//! access, as for any file mapping).
//!
//! A [`SegmentPin`] holds a range for a client on this host that copies to or from it itself (a local lane's
//! `Locate`): the lease keeps every reference of this process off the range while that client writes it (or
//! off writes while it reads), and the pin keeps the mapping alive until the client says it is done.
#![allow(unsafe_code)]

use crate::copy;
use crate::error::TransferError;
use crate::vm::RemoteProcess;
use memmap2::{MmapOptions, MmapRaw};
use parking_lot::Mutex;
use std::ffi::CString;
use std::fmt;
use std::fs::File;
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// One live lease: `[start, end)` of the mapping, exclusive for writers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lease {
    start: usize,
    end: usize,
    exclusive: bool,
}

impl Lease {
    fn conflicts(&self, other: &Lease) -> bool {
        (self.exclusive || other.exclusive) && self.start < other.end && other.start < self.end
    }
}

/// Bytes [`SegmentMemory::prefault_while`] backs per step (a multiple of the 2 MiB huge page). Small, because
/// `MADV_POPULATE_WRITE` holds the process's mmap lock for its whole range: every `mmap`/`mprotect` of the
/// process (a thread's stack, a malloc arena, a large buffer) waits for the step in progress. With 256 MiB steps
/// (~1 s each on a busy host) a master beside a prefaulting node took seconds to start a thread; one huge page
/// per step keeps such a wait to milliseconds, and 512 `madvise` calls per GiB cost nothing next to the faults.
pub const PREFAULT_CHUNK: usize = 2 << 20;

/// The bytes of one segment: an anonymous or memfd-backed shared mapping.
pub struct SegmentMemory {
    map: MmapRaw,
    /// Live leases. Few at a time (one per in-flight transfer touching this segment), so a vector scan is
    /// cheaper than any tree.
    leases: Mutex<Vec<Lease>>,
    /// The memfd behind the mapping, if any (kept so it can be shared).
    file: Option<File>,
    /// For a segment mapped from a storage node (`map_shared`): that node, checked before every access, so bytes
    /// are never written into (or read from) the memory of a node that exited, whose master is about to drop
    /// whatever it holds.
    owner: Option<RemoteProcess>,
}

impl fmt::Debug for SegmentMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentMemory")
            .field("base", &format_args!("{:#x}", self.base_addr()))
            .field("len", &self.len())
            .field("memfd", &self.file.is_some())
            .finish()
    }
}

fn to_usize(size: u64) -> io::Result<usize> {
    usize::try_from(size).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment size exceeds usize"))
}

impl SegmentMemory {
    /// A private anonymous mapping of `size` bytes (zero-filled, pages allocated on first touch).
    pub fn anonymous(size: u64) -> io::Result<Self> {
        let map = MmapOptions::new().len(to_usize(size)?).map_anon()?;
        Ok(Self { map: MmapRaw::from(map), leases: Mutex::new(Vec::new()), file: None, owner: None })
    }

    /// A mapping of a fresh `memfd` named `name` (visible in `/proc/<pid>/fd`), `size` bytes long; its
    /// descriptor can be handed to another process ([`SegmentMemory::fd`]).
    pub fn memfd(name: &str, size: u64) -> io::Result<Self> {
        let len = to_usize(size)?;
        let cname = CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in memfd name"))?;
        // SAFETY: `cname` is a valid NUL-terminated string that outlives the call; memfd_create reads it only
        // during the call and returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by memfd_create, is open, and nothing else owns it.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        file.set_len(size)?;
        let map = MmapOptions::new().len(len).map_raw(&file)?;
        Ok(Self { map, leases: Mutex::new(Vec::new()), file: Some(file), owner: None })
    }

    /// Maps `length` bytes of a memfd another process shares (a storage node's segment, taken by a process
    /// attached to it: `TransferClient::attach`), with its page tables filled at once: the node backed its pages
    /// already, and without this every first touch of a page would fault (measured on the 2-vCPU VM: 4 MiB
    /// copies into a fresh mapping 2.5 GB/s, into a populated one 12 GB/s; populating 4 GiB takes ~0.45 s).
    /// Fails if the file is shorter than `length`. Accesses fail with [`TransferError::Closed`] once `owner`, the
    /// node sharing it, has exited.
    pub(crate) fn map_shared(fd: OwnedFd, length: u64, owner: RemoteProcess) -> io::Result<Self> {
        let file = File::from(fd);
        if file.metadata()?.len() < length {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the shared segment is shorter than announced"));
        }
        let map = MmapOptions::new().len(to_usize(length)?).populate().map_raw(&file)?;
        Ok(Self { map, leases: Mutex::new(Vec::new()), file: Some(file), owner: Some(owner) })
    }

    /// A shared mapping of `size` bytes of `file` from `offset`, as the original's
    /// `mount_segment(path, size, offset)` maps a file or shared-memory object: writes land in the file, and the
    /// mapping outlives `file`'s descriptor. Whoever else maps or writes the file shares the bytes (as with
    /// [`SegmentMemory::memfd`]); one that truncates it below the mapping makes an access raise `SIGBUS`, as
    /// for any file mapping. Not a [`SegmentMemory::fd`] segment: offsets into it are not offsets into the
    /// file.
    pub fn file(file: &File, offset: u64, size: u64) -> io::Result<Self> {
        let map = MmapOptions::new().offset(offset).len(to_usize(size)?).map_raw(file)?;
        Ok(Self { map, leases: Mutex::new(Vec::new()), file: None, owner: None })
    }

    /// Asks for transparent huge pages for the whole segment (a hint: 2 MiB pages cut both fault and TLB-miss
    /// costs for MiB-sized objects; what a storage node asks before it backs its segments).
    pub fn advise_huge_pages(&self) {
        let _ = self.map.advise(memmap2::Advice::HugePage);
    }

    /// Backs the segment from its start, `PREFAULT_CHUNK` (2 MiB) at a time, for as long as `go_on(done, total)`
    /// says so after each step (asking for no huge pages itself: with the kernel's default `defrag=madvise` it
    /// compacts memory at every fault of a range that asked, which made a background prefault slow down the writes
    /// it ran beside, measured 4 MiB writes at 0.5–0.6 GB/s with the hint, 2.7–3.9 without). Returns the bytes
    /// backed.
    pub fn prefault_while(&self, go_on: impl FnMut(u64, u64) -> bool) -> io::Result<u64> {
        self.populate(PREFAULT_CHUNK, go_on)
    }

    fn populate(&self, chunk: usize, mut go_on: impl FnMut(u64, u64) -> bool) -> io::Result<u64> {
        let len = self.map.len();
        let mut done = 0;
        while done < len {
            let n = chunk.min(len - done);
            self.map.advise_range(memmap2::Advice::PopulateWrite, done, n)?;
            done += n;
            if !go_on(done as u64, len as u64) {
                break;
            }
        }
        Ok(done as u64)
    }

    /// Bytes in the segment.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Whether the segment has no bytes.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The mapping's address in this process (for the mount spec, and the `Locate` answers of local lanes: an
    /// address only a process on this host can use).
    pub fn base_addr(&self) -> u64 {
        self.map.as_ptr() as u64
    }

    /// The memfd behind a memfd-backed segment (to share it with another process), `None` if anonymous.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.file.as_ref().map(|f| f.as_fd())
    }

    /// Checks `[offset, offset + len)` against the mapping and returns it as a `usize` range.
    fn range(&self, offset: u64, len: u64, exclusive: bool) -> Result<Lease, TransferError> {
        let end = offset.checked_add(len).ok_or(TransferError::OutOfRange)?;
        if end > self.len() {
            return Err(TransferError::OutOfRange);
        }
        // Both fit: `end <= self.len()`, which came from a usize.
        let (start, end) = (offset as usize, end as usize);
        Ok(Lease { start, end, exclusive })
    }

    fn acquire(&self, lease: Lease) -> Result<(), TransferError> {
        if lease.start == lease.end {
            return Ok(()); // an empty range touches nothing
        }
        if self.owner.as_ref().is_some_and(|o| !o.alive()) {
            return Err(TransferError::Closed);
        }
        let mut leases = self.leases.lock();
        if leases.iter().any(|l| l.conflicts(&lease)) {
            return Err(TransferError::Busy);
        }
        leases.push(lease);
        Ok(())
    }

    fn release(&self, lease: Lease) {
        if lease.start == lease.end {
            return;
        }
        let mut leases = self.leases.lock();
        // Identical shared leases are interchangeable, so removing any one match is correct.
        if let Some(i) = leases.iter().position(|l| *l == lease) {
            leases.swap_remove(i);
        }
    }

    /// Shared access to `[offset, offset + len)` until the guard drops (`OutOfRange` outside the segment,
    /// `Busy` while a writer holds an overlapping range).
    pub fn lease(&self, offset: u64, len: u64) -> Result<SegmentRef<'_>, TransferError> {
        let lease = self.range(offset, len, false)?;
        self.acquire(lease)?;
        // SAFETY: `lease.start..lease.end` lies inside the mapping (checked by `range`), so the pointer and
        // length describe initialised, mapped bytes that stay mapped while `self` is borrowed. The lease table
        // guarantees no `&mut` to an overlapping range exists until this guard releases the lease on drop.
        let bytes = unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(lease.start), lease.end - lease.start) };
        Ok(SegmentRef { mem: self, lease, bytes })
    }

    /// Exclusive access to `[offset, offset + len)` until the guard drops (`OutOfRange` outside the segment,
    /// `Busy` while anyone holds an overlapping range).
    pub fn lease_mut(&self, offset: u64, len: u64) -> Result<SegmentMut<'_>, TransferError> {
        let lease = self.range(offset, len, true)?;
        self.acquire(lease)?;
        // SAFETY: as in `lease`, the range is inside the writable mapping; the exclusive lease guarantees no
        // other reference to an overlapping range exists until this guard drops, so this `&mut` is unique.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(lease.start), lease.end - lease.start) };
        Ok(SegmentMut { mem: self, lease, bytes })
    }

    /// Holds `[offset, offset + len)` for another process to copy to (`exclusive`) or from, as [`lease_mut`] or
    /// [`lease`] would, and keeps the mapping alive while the pin lives.
    ///
    /// [`lease_mut`]: SegmentMemory::lease_mut
    /// [`lease`]: SegmentMemory::lease
    pub(crate) fn pin(self: &Arc<Self>, offset: u64, len: u64, exclusive: bool) -> Result<SegmentPin, TransferError> {
        let lease = self.range(offset, len, exclusive)?;
        self.acquire(lease)?;
        Ok(SegmentPin { mem: self.clone(), lease })
    }

    /// Copies `data` into the segment at `offset`.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), TransferError> {
        self.lease_mut(offset, data.len() as u64)?.copy_from_slice(data);
        Ok(())
    }

    /// Fills `buf` from the segment at `offset`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), TransferError> {
        buf.copy_from_slice(&self.lease(offset, buf.len() as u64)?);
        Ok(())
    }

    /// [`SegmentMemory::write_at`] that also returns the crc32c of the bytes if `checksum` (else 0), summed as
    /// they are copied; with `parallel`, a long copy is split over two threads (`copy::copy_all`).
    pub(crate) fn write_at_summed(
        &self,
        offset: u64,
        data: &[u8],
        checksum: bool,
        parallel: bool,
    ) -> Result<u32, TransferError> {
        let mut dst = self.lease_mut(offset, data.len() as u64)?;
        Ok(copy::copy_all(vec![(&mut *dst, data)], checksum, parallel).first().copied().unwrap_or(0))
    }

    /// [`SegmentMemory::read_at`] that also returns the crc32c of the bytes if `checksum` (else 0), as
    /// [`SegmentMemory::write_at_summed`].
    pub(crate) fn read_at_summed(
        &self,
        offset: u64,
        buf: &mut [u8],
        checksum: bool,
        parallel: bool,
    ) -> Result<u32, TransferError> {
        let src = self.lease(offset, buf.len() as u64)?;
        Ok(copy::copy_all(vec![(buf, &*src)], checksum, parallel).first().copied().unwrap_or(0))
    }
}

/// Shared access to a range of a segment (see [`SegmentMemory::lease`]); dereferences to the bytes.
pub struct SegmentRef<'a> {
    mem: &'a SegmentMemory,
    lease: Lease,
    bytes: &'a [u8],
}

impl Deref for SegmentRef<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl Drop for SegmentRef<'_> {
    fn drop(&mut self) {
        self.mem.release(self.lease);
    }
}

impl fmt::Debug for SegmentRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SegmentRef({}..{})", self.lease.start, self.lease.end)
    }
}

/// Exclusive access to a range of a segment (see [`SegmentMemory::lease_mut`]); dereferences to the bytes.
pub struct SegmentMut<'a> {
    mem: &'a SegmentMemory,
    lease: Lease,
    bytes: &'a mut [u8],
}

impl Deref for SegmentMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl DerefMut for SegmentMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.bytes
    }
}

impl Drop for SegmentMut<'_> {
    fn drop(&mut self) {
        self.mem.release(self.lease);
    }
}

impl fmt::Debug for SegmentMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SegmentMut({}..{})", self.lease.start, self.lease.end)
    }
}

/// A range held for another process's copy (see [`SegmentMemory::pin`]); released on drop.
pub(crate) struct SegmentPin {
    mem: Arc<SegmentMemory>,
    lease: Lease,
}

impl SegmentPin {
    /// Where the range starts in this process's memory.
    pub(crate) fn addr(&self) -> u64 {
        self.mem.base_addr() + self.lease.start as u64
    }
}

impl Drop for SegmentPin {
    fn drop(&mut self) {
        self.mem.release(self.lease);
    }
}

impl fmt::Debug for SegmentPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SegmentPin({}..{}, exclusive {})", self.lease.start, self.lease.end, self.lease.exclusive)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_prefault_while_stops_when_asked_and_says_how_far_it_got() {
        let m = SegmentMemory::anonymous(8 << 20).unwrap();
        let mut seen = Vec::new();
        let backed = m
            .prefault_while(|done, total| {
                seen.push((done >> 20, total >> 20));
                done < 4 << 20
            })
            .unwrap();
        assert_eq!(backed, 4 << 20);
        assert_eq!(seen, vec![(2, 8), (4, 8)]);
        assert_eq!(m.prefault_while(|_, _| true).unwrap(), 8 << 20);
    }

    #[test]
    fn prefault_reports_progress_chunk_by_chunk_up_to_the_whole_segment() {
        let m = SegmentMemory::anonymous(PREFAULT_CHUNK as u64 + (1 << 20)).unwrap();
        let mut seen = Vec::new();
        m.populate(2 << 20, |done, total| {
            seen.push((done >> 20, total >> 20));
            true
        })
        .unwrap();
        let mb = (PREFAULT_CHUNK >> 20) as u64 + 1;
        assert_eq!(seen.last(), Some(&(mb, mb)));
        assert_eq!(seen.len() as u64, mb.div_ceil(2));
        let mut calls = 0;
        m.prefault_while(|_, _| {
            calls += 1;
            true
        })
        .unwrap();
        assert_eq!(calls, 2, "{PREFAULT_CHUNK} bytes and 1 MiB more take two steps");
    }

    #[test]
    fn bounds_are_checked_with_overflow_safe_arithmetic() {
        let m = SegmentMemory::anonymous(4096).unwrap();
        assert_eq!(m.len(), 4096);
        assert!(!m.is_empty());
        assert_ne!(m.base_addr(), 0);
        m.write_at(0, &[1; 4096]).unwrap();
        m.write_at(4095, &[2]).unwrap();
        m.write_at(4096, &[]).unwrap(); // empty range at the very end is fine
        assert!(matches!(m.write_at(4096, &[0]), Err(TransferError::OutOfRange)));
        assert!(matches!(m.write_at(4000, &[0; 97]), Err(TransferError::OutOfRange)));
        assert!(matches!(m.write_at(u64::MAX, &[0]), Err(TransferError::OutOfRange)));
        assert!(matches!(m.write_at(4097, &[]), Err(TransferError::OutOfRange)));
        let mut buf = [0u8; 2];
        m.read_at(4094, &mut buf).unwrap();
        assert_eq!(buf, [1, 2]);
        assert!(matches!(m.read_at(4095, &mut buf), Err(TransferError::OutOfRange)));
        assert!(matches!(m.read_at(u64::MAX - 1, &mut buf), Err(TransferError::OutOfRange)));
        assert!(matches!(m.lease(1, u64::MAX), Err(TransferError::OutOfRange)));
        assert!(matches!(m.lease_mut(u64::MAX, u64::MAX), Err(TransferError::OutOfRange)));
        assert_eq!(TransferError::OutOfRange.code(), crescent_proto::ErrorCode::InvalidParams);
    }

    #[test]
    fn empty_segment_has_no_bytes() {
        let m = SegmentMemory::anonymous(0).unwrap();
        assert!(m.is_empty());
        m.write_at(0, &[]).unwrap();
        assert!(matches!(m.write_at(0, &[1]), Err(TransferError::OutOfRange)));
    }

    #[test]
    fn memfd_segments_are_shared_mappings_of_the_file() {
        use std::io::{Read, Seek, SeekFrom};
        let m = SegmentMemory::memfd("crescent-test", 1 << 20).unwrap();
        assert_eq!(m.len(), 1 << 20);
        m.write_at(12345, b"hello memfd").unwrap();
        let mut back = [0u8; 11];
        m.read_at(12345, &mut back).unwrap();
        assert_eq!(&back, b"hello memfd");
        // The bytes are in the file itself (what another process mapping the fd would see).
        let mut f = File::from(m.fd().unwrap().try_clone_to_owned().unwrap());
        f.seek(SeekFrom::Start(12345)).unwrap();
        let mut via_fd = [0u8; 11];
        f.read_exact(&mut via_fd).unwrap();
        assert_eq!(&via_fd, b"hello memfd");
        assert!(SegmentMemory::anonymous(16).unwrap().fd().is_none());
        assert!(SegmentMemory::memfd("bad\0name", 16).is_err());
    }

    #[test]
    fn file_segments_map_a_range_of_the_file_shared() {
        use std::io::{Read, Seek, SeekFrom, Write};
        let page = 4096u64;
        let path = std::env::temp_dir().join(format!("crescent-file-segment-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        f.set_len(4 * page).unwrap();
        f.seek(SeekFrom::Start(page)).unwrap();
        f.write_all(b"already there").unwrap();
        let m = SegmentMemory::file(&f, page, 2 * page).unwrap();
        assert_eq!(m.len(), 2 * page);
        assert!(m.fd().is_none(), "offsets into it are not the file's");
        let mut back = [0u8; 13];
        m.read_at(0, &mut back).unwrap();
        assert_eq!(&back, b"already there");
        m.write_at(page, b"into the file").unwrap();
        f.seek(SeekFrom::Start(2 * page)).unwrap();
        let mut via_file = [0u8; 13];
        f.read_exact(&mut via_file).unwrap();
        assert_eq!(&via_file, b"into the file");
        assert!(SegmentMemory::file(&f, 0, u64::MAX).is_err(), "a size beyond usize is refused");
        drop(f);
        m.write_at(0, b"after close").unwrap(); // the mapping outlives the descriptor
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn overlapping_leases_conflict_disjoint_ones_do_not() {
        let m = SegmentMemory::anonymous(1024).unwrap();
        let w = m.lease_mut(0, 100).unwrap();
        assert!(matches!(m.lease(99, 1), Err(TransferError::Busy)));
        assert!(matches!(m.lease_mut(50, 10), Err(TransferError::Busy)));
        assert!(matches!(m.write_at(0, &[0; 1000]), Err(TransferError::Busy)));
        let r1 = m.lease(100, 100).unwrap(); // adjacent, disjoint
        let r2 = m.lease(150, 100).unwrap(); // readers share
        assert!(matches!(m.lease_mut(199, 1), Err(TransferError::Busy)));
        let _empty = m.lease_mut(150, 0).unwrap(); // an empty range conflicts with nothing
        drop((w, r1));
        m.write_at(0, &[7; 100]).unwrap();
        assert!(matches!(m.lease_mut(249, 1), Err(TransferError::Busy)));
        drop(r2);
        m.write_at(0, &[9; 1024]).unwrap();
        assert_eq!(m.leases.lock().len(), 0);
    }

    #[test]
    fn disjoint_ranges_are_written_concurrently() {
        let m = std::sync::Arc::new(SegmentMemory::anonymous(8 << 20).unwrap());
        let threads: Vec<_> = (0..8u8)
            .map(|i| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        m.write_at(u64::from(i) << 20, &vec![i; 1 << 20]).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for i in 0..8u8 {
            assert!(m.lease(u64::from(i) << 20, 1 << 20).unwrap().iter().all(|b| *b == i));
        }
    }
}
