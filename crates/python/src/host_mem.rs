//! Host memory for an engine's buffers: the original's `MooncakeHostMemAllocator` (`alloc`/`free`) and
//! `alloc_from_mem_pool`, which SGLang's standalone mode allocates its host KV pool with.
//!
//! The original hands out memfd-backed shared memory, because its attached ("dummy") client passes the buffer
//! to a separate process that moves the bytes. A Crescent store moves the bytes itself (an attached store maps
//! its node's segments instead: `Store::setup_dummy`), so these are private anonymous mappings, prefaulted (the
//! engine writes them at once, and a first touch costs a page fault per 4 KiB: several times a memcpy's cost on
//! a VM) and on transparent huge pages where the kernel allows. The addresses stay valid until `free`; using
//! one after that is the caller's bug, as with the original.

use memmap2::{MmapMut, MmapOptions};
use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::collections::HashMap;

/// Every live allocation by address; process-wide, as the original's one `ShmHelper` is.
static ALLOCATIONS: Mutex<Option<HashMap<usize, MmapMut>>> = Mutex::new(None);

/// `size` bytes of prefaulted host memory; its address.
pub fn alloc(size: usize) -> std::io::Result<usize> {
    if size == 0 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "cannot allocate 0 bytes"));
    }
    let map = MmapOptions::new().len(size).map_anon()?;
    // Huge pages are a hint; populating is best effort too (an old kernel faults the pages lazily instead).
    let _ = map.advise(memmap2::Advice::HugePage);
    let _ = map.advise(memmap2::Advice::PopulateWrite);
    let addr = map.as_ptr() as usize;
    ALLOCATIONS.lock().get_or_insert_with(HashMap::new).insert(addr, map);
    Ok(addr)
}

/// Frees what [`alloc`] returned at `addr`; `false` if nothing was allocated there.
pub fn free(addr: usize) -> bool {
    ALLOCATIONS.lock().as_mut().and_then(|m| m.remove(&addr)).is_some()
}

/// The original's `MooncakeHostMemAllocator`: host memory for buffers an engine registers with its store.
#[pyclass(name = "MooncakeHostMemAllocator", module = "crescent._crescent")]
#[derive(Debug, Default)]
pub struct HostMemAllocator;

#[pymethods]
impl HostMemAllocator {
    #[new]
    fn new() -> Self {
        HostMemAllocator
    }

    /// `size` bytes of prefaulted host memory; its address (RuntimeError when it cannot be had, as the original).
    fn alloc(&self, py: Python<'_>, size: usize) -> PyResult<usize> {
        py.detach(|| alloc(size)).map_err(|e| PyRuntimeError::new_err(format!("cannot allocate {size} bytes: {e}")))
    }

    /// Frees memory `alloc` returned: 0, or -1 for an address it did not return (as the original).
    fn free(&self, py: Python<'_>, ptr: usize) -> i64 {
        if py.detach(|| free(ptr)) { 0 } else { -1 }
    }
}
