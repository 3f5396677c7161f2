//! Caller memory named by address: the buffers registered with `register_buffer`, and the only place raw
//! addresses become slices. A range is used if it lies wholly inside one registered buffer ([`Registered::span`]),
//! or — for the calls the original serves from any memory over TCP (`put_from`, `get_into` and their batch forms,
//! LMCache's use without a pinned buffer) — if it touches no registered buffer at all ([`Registered::caller_span`]:
//! the caller vouches for it, as the original's API requires). Anything else is refused with `INVALID_PARAMS`
//! before any byte is touched. Also the `bytes` objects reads land in directly.
#![allow(unsafe_code)]

use parking_lot::RwLock;
use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::{ffi, types::PyBytes};
use std::collections::BTreeMap;

/// The buffers a store's caller registered: base address → length.
#[derive(Debug, Default)]
pub struct Registered {
    buffers: RwLock<BTreeMap<usize, usize>>,
}

/// A range of registered caller memory, checked against the registrations; becomes a slice only in
/// [`Span::bytes`] / [`Span::bytes_mut`].
#[derive(Debug, Clone, Copy)]
pub struct Span {
    ptr: usize,
    len: usize,
}

impl Registered {
    /// Registers `[ptr, ptr + len)`; `false` for a null or empty buffer, one that wraps around the address
    /// space, or one overlapping a registered buffer (registering the same buffer again is accepted).
    pub fn register(&self, ptr: usize, len: usize) -> bool {
        let Some(end) = ptr.checked_add(len) else { return false };
        if ptr == 0 || len == 0 {
            return false;
        }
        let mut buffers = self.buffers.write();
        if buffers.get(&ptr) == Some(&len) {
            return true;
        }
        let before = buffers.range(..end).next_back().is_some_and(|(&b, &l)| b + l > ptr);
        if before {
            return false;
        }
        buffers.insert(ptr, len);
        true
    }

    /// Forgets the buffer registered at `ptr`; `false` if none was.
    pub fn unregister(&self, ptr: usize) -> bool {
        self.buffers.write().remove(&ptr).is_some()
    }

    /// `[ptr, ptr + len)` for a call that takes any caller memory, as the original's over TCP: inside one
    /// registered buffer, or clear of every registered buffer (unregistered memory the caller names as its own).
    /// A null address, a range that wraps, or one that straddles a registered buffer's bounds is refused.
    pub fn caller_span(&self, ptr: usize, len: usize) -> Option<Span> {
        let end = ptr.checked_add(len)?;
        if ptr == 0 && len > 0 {
            return None;
        }
        let buffers = self.buffers.read();
        if let Some((&base, &blen)) = buffers.range(..=ptr).next_back()
            && ptr < base + blen
        {
            return (end <= base + blen).then_some(Span { ptr, len });
        }
        // No registered buffer may start inside the range either.
        buffers.range(ptr..end).next().is_none().then_some(Span { ptr, len })
    }

    /// `[ptr, ptr + len)` if it lies inside one registered buffer.
    pub fn span(&self, ptr: usize, len: usize) -> Option<Span> {
        let end = ptr.checked_add(len)?;
        let buffers = self.buffers.read();
        let (&base, &blen) = buffers.range(..=ptr).next_back()?;
        (end <= base + blen).then_some(Span { ptr, len })
    }
}

impl Span {
    /// Bytes in the span.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the span has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The span as bytes to send.
    pub fn bytes<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the span lies inside a buffer the caller registered as `len` bytes of its own memory at that
        // address (checked in `Registered::span`), or is memory the caller passed as its own to a call that takes
        // any (`Registered::caller_span`); the original's contract, which this API keeps, is that the caller keeps
        // such memory allocated and does not write it while a call uses it. The store only reads it for the
        // duration of the call.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// The span as a destination for bytes read.
    #[allow(clippy::mut_from_ref)]
    pub fn bytes_mut<'a>(self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`: caller memory (registered and checked to contain the span, or named by the caller
        // as its own); the caller keeps it allocated and gives the call exclusive use of the range for its
        // duration (the original's contract), so no other reference to these bytes is used while this one lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }
}

/// A new `bytes` object of a known length whose contents are being written: made with its bytes unset, and seen
/// by no Python code until [`FreshBytes::into_bytes`] hands it over, so a read can land in it directly (no
/// staging buffer, no copy).
pub struct FreshBytes {
    obj: Py<PyBytes>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the object is reachable only through this value (nothing else holds a reference to it), and `ptr`
// points into it; moving both to another thread moves the only access with them. `Py` itself is `Send`.
unsafe impl Send for FreshBytes {}

impl FreshBytes {
    /// A `bytes` of `len` unset bytes (takes the GIL for the allocation).
    pub fn new(len: usize) -> PyResult<Self> {
        let size = isize::try_from(len).map_err(|_| PyOverflowError::new_err("value too large for bytes"))?;
        Python::attach(|py| {
            // SAFETY: a null source asks CPython for an uninitialised `bytes` of `size` bytes (the documented way
            // to build one in place); the result is a new reference or null with an exception set, which
            // `from_owned_ptr_or_err` turns into an error.
            let obj =
                unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyBytes_FromStringAndSize(std::ptr::null(), size))? };
            let obj = obj.cast_into::<PyBytes>()?;
            // SAFETY: `obj` is a `bytes` object, for which PyBytes_AsString returns its data pointer (never null).
            let ptr = unsafe { ffi::PyBytes_AsString(obj.as_ptr()) }.cast::<u8>();
            Ok(Self { obj: obj.unbind(), ptr, len })
        })
    }

    /// The finished object.
    pub fn into_bytes(self, py: Python<'_>) -> Bound<'_, PyBytes> {
        self.obj.into_bound(py)
    }
}

impl AsMut<[u8]> for FreshBytes {
    fn as_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `ptr` is the data of a `bytes` object of `len` bytes that this value keeps alive and that no
        // Python code can see yet (it was just made and is handed out only by `into_bytes`, which consumes
        // this value), so this is the only reference to those bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
