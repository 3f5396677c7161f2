//! Returning freed heap memory to the operating system.
//!
//! glibc keeps freed small allocations in its arenas; after a master drops millions of objects (eviction,
//! `RemoveAll`, a lost node) the process would stay at its peak RSS. Bulk removals call
//! [`release_free_memory`] so the memory is given back.

/// Objects a bulk removal must free before it is worth trimming the heap.
pub const TRIM_THRESHOLD: u64 = 4096;

/// Asks the C allocator to return free pages to the OS (glibc `malloc_trim`); a no-op elsewhere.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: `malloc_trim` takes a plain integer, has no preconditions and only touches glibc's own heap
    // bookkeeping under glibc's locks.
    unsafe {
        libc::malloc_trim(0);
    }
}
