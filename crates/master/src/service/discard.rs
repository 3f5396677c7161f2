//! The discard queue: buffers taken from objects whose space may still be in use by someone else (a preempted
//! writer still writing, a reader still reading under its lease), freed only at a release time.

use crate::clock::Timestamp;
use crate::segment_pool::AllocatedBuffer;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Owner of delayed-release buffers.
#[derive(Debug, Default)]
pub(super) struct DiscardQueue {
    due: Mutex<BTreeMap<(Timestamp, u64), Vec<AllocatedBuffer>>>,
    seq: AtomicU64,
    bytes: AtomicU64,
}

impl DiscardQueue {
    /// Holds `buffers` until `release_at`.
    pub fn push(&self, release_at: Timestamp, buffers: Vec<AllocatedBuffer>) {
        debug_assert_eq!(
            crate::metadata::object_locks_held(),
            0,
            "the discard queue (a timer index) is never touched under an object lock"
        );
        if buffers.is_empty() {
            return;
        }
        let bytes: u64 = buffers.iter().map(AllocatedBuffer::size).sum();
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.due.lock().insert((release_at, seq), buffers);
    }

    /// Frees every batch due at `now` (outside the queue lock); returns the number of buffers freed.
    pub fn release_due(&self, now: Timestamp) -> usize {
        let ready: Vec<Vec<AllocatedBuffer>> = {
            let mut due = self.due.lock();
            let later = due.split_off(&(Timestamp(now.0.saturating_add(1)), 0));
            std::mem::replace(&mut *due, later).into_values().collect()
        };
        let mut n = 0;
        for batch in ready {
            let bytes: u64 = batch.iter().map(AllocatedBuffer::size).sum();
            self.bytes.fetch_sub(bytes, Ordering::Relaxed);
            n += batch.len();
        }
        n
    }

    /// Bytes waiting.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}
