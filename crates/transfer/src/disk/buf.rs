//! [`AlignedBuf`]: a heap buffer whose address and capacity are multiples of the disk block, as `O_DIRECT` I/O
//! requires of the memory it transfers.
//!
//! The one `unsafe` spot of the disk module: `std::alloc` with a 4096-byte alignment (a `Vec<u8>` only
//! guarantees alignment 1). Every block is a few lines with its own `SAFETY:` note.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::fmt;
use std::io;
use std::ptr::NonNull;

/// The disk block: alignment of every buffer, offset and length `O_DIRECT` transfers.
pub const BLOCK: usize = 4096;

/// `n` rounded up to a multiple of [`BLOCK`], `None` on overflow.
pub(crate) fn round_up(n: u64) -> Option<u64> {
    n.checked_add(BLOCK as u64 - 1).map(|n| n & !(BLOCK as u64 - 1))
}

/// A zero-initialised heap buffer aligned to [`BLOCK`] bytes: a logical length (what [`AlignedBuf::as_slice`]
/// shows), padded to a whole number of blocks (what a device transfers: [`AlignedBuf::padded`]), inside a
/// capacity of whole blocks (at least the padded length; more for a buffer reused for a shorter range).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// A non-zero multiple of `BLOCK`; the allocation's size.
    capacity: usize,
}

// SAFETY: `AlignedBuf` owns its allocation exclusively (like a `Box<[u8]>`); no interior mutability, so sharing
// `&AlignedBuf` between threads only allows reads and moving it moves the ownership.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above: `&self` methods only read.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zero bytes in a block-aligned allocation of `len` rounded up to a block (at least one block).
    /// An `OutOfMemory` error if the size cannot be laid out; an allocation failure aborts, as for a `Vec`.
    pub fn zeroed(len: usize) -> io::Result<AlignedBuf> {
        let too_big = || io::Error::new(io::ErrorKind::OutOfMemory, format!("aligned buffer of {len} bytes"));
        let capacity = round_up(len as u64).and_then(|c| usize::try_from(c).ok()).ok_or_else(too_big)?.max(BLOCK);
        let layout = Layout::from_size_align(capacity, BLOCK).map_err(|_| too_big())?;
        // SAFETY: `layout` has a non-zero size (`capacity >= BLOCK`), as `alloc_zeroed` requires.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        Ok(AlignedBuf { ptr, len, capacity })
    }

    /// A buffer holding a copy of `src` (its padding zero).
    pub fn copy_from(src: &[u8]) -> io::Result<AlignedBuf> {
        let mut buf = AlignedBuf::zeroed(src.len())?;
        buf.as_mut_slice().copy_from_slice(src);
        Ok(buf)
    }

    /// The logical length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the logical length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The allocation's size: whole blocks, at least one, at least the padded length.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The logical length rounded up to a whole block (the length of [`AlignedBuf::padded`]).
    pub fn padded_len(&self) -> usize {
        // Cannot overflow: at most `capacity`, itself a whole number of blocks.
        self.len.div_ceil(BLOCK) * BLOCK
    }

    /// This buffer with logical length `len`, if its capacity holds `len` padded to a block (else it is given
    /// back). The bytes are whatever the buffer held: for a buffer about to be filled whole by a device read.
    pub(crate) fn reuse(mut self, len: usize) -> Result<AlignedBuf, AlignedBuf> {
        if len.div_ceil(BLOCK).checked_mul(BLOCK).is_some_and(|padded| padded <= self.capacity) {
            self.len = len;
            Ok(self)
        } else {
            Err(self)
        }
    }

    /// The logical bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.padded()[..self.len]
    }

    /// The logical bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.padded_mut()[..len]
    }

    /// The logical bytes and their padding to a whole block (what a block device transfers).
    pub fn padded(&self) -> &[u8] {
        // SAFETY: `ptr` points to an initialised (zeroed at allocation) block of `capacity` bytes owned by
        // `self`, and `padded_len() <= capacity`; the shared borrow of `self` keeps it alive and unmutated for
        // the slice's life.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.padded_len()) }
    }

    /// The logical bytes and their padding, writable.
    pub fn padded_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `padded`; the exclusive borrow of `self` makes this the only reference to the bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.padded_len()) }
    }

    /// Zeroes the padding (whatever a read left there), so a write of this buffer writes zeros past its data.
    pub fn zero_padding(&mut self) {
        let len = self.len;
        self.padded_mut()[len..].fill(0);
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: the allocation was made in `zeroed` with exactly this size and alignment (both checked there
        // to form a valid layout), and is freed only here, once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.capacity, BLOCK)) }
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).field("capacity", &self.capacity).finish()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn aligned_zeroed_and_padded_to_a_block() {
        for len in [0, 1, 511, 4095, 4096, 4097, 3 * 4096, 1 << 20, (1 << 20) + 17] {
            let mut buf = AlignedBuf::zeroed(len).unwrap();
            assert_eq!(buf.as_slice().as_ptr() as usize % BLOCK, 0, "{len}: aligned");
            assert_eq!(buf.len(), len);
            assert_eq!(buf.capacity() % BLOCK, 0, "{len}");
            assert!(buf.capacity() >= len.max(1) && buf.capacity() < len + BLOCK + 1, "{len}: {}", buf.capacity());
            assert_eq!(buf.padded().len(), len.div_ceil(BLOCK) * BLOCK, "{len}");
            assert!(buf.padded().iter().all(|&b| b == 0), "{len}: zeroed");
            buf.as_mut_slice().fill(7);
            assert!(buf.as_slice().iter().all(|&b| b == 7));
            assert!(buf.padded()[len..].iter().all(|&b| b == 0), "{len}: the padding untouched");
            buf.padded_mut().fill(9);
            buf.zero_padding();
            assert!(buf.as_slice().iter().all(|&b| b == 9) && buf.padded()[len..].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn copy_from_keeps_the_bytes_and_an_absurd_size_is_an_error() {
        let src: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let buf = AlignedBuf::copy_from(&src).unwrap();
        assert_eq!(buf.as_slice(), &src[..]);
        assert_eq!(buf.capacity(), 3 * BLOCK);
        assert_eq!(AlignedBuf::zeroed(usize::MAX).unwrap_err().kind(), io::ErrorKind::OutOfMemory);
        assert_eq!(AlignedBuf::zeroed(isize::MAX as usize).unwrap_err().kind(), io::ErrorKind::OutOfMemory);
    }

    #[test]
    fn a_buffer_is_reused_for_a_range_its_capacity_holds() {
        let buf = AlignedBuf::zeroed(3 * BLOCK).unwrap();
        let buf = buf.reuse(BLOCK + 1).unwrap();
        assert_eq!((buf.len(), buf.padded_len(), buf.capacity()), (BLOCK + 1, 2 * BLOCK, 3 * BLOCK));
        let buf = buf.reuse(3 * BLOCK).unwrap();
        assert_eq!(buf.padded().len(), 3 * BLOCK);
        let buf = buf.reuse(3 * BLOCK + 1).unwrap_err();
        assert!(buf.reuse(usize::MAX).is_err());
    }

    #[test]
    fn send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<AlignedBuf>();
        let buf = AlignedBuf::copy_from(b"moved").unwrap();
        let back = std::thread::spawn(move || buf).join().unwrap();
        assert_eq!(back.as_slice(), b"moved");
    }
}
