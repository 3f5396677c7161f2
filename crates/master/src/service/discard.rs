//! The discard queue: buffers taken from objects whose space may still be in use by someone else (a preempted
//! writer still writing, a reader still reading under its lease), freed only at a release time — and, with an
//! oplog, only once the log holds the change that took them (a failover before that would show the old object
//! over space another object had been given).

use crate::clock::Timestamp;
use crate::segment_pool::AllocatedBuffer;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Buffers waiting in the queue.
#[derive(Debug)]
struct Held {
    /// The oplog sequence that must be durable before they are freed (0: none).
    after_seq: u64,
    buffers: Vec<AllocatedBuffer>,
}

/// Owner of delayed-release buffers.
#[derive(Debug, Default)]
pub(super) struct DiscardQueue {
    /// By release time, then arrival.
    due: Mutex<BTreeMap<(Timestamp, u64), Held>>,
    seq: AtomicU64,
    bytes: AtomicU64,
}

impl DiscardQueue {
    /// Holds `buffers` until `release_at` and until the oplog is durable through `after_seq` (0: no oplog).
    pub fn push(&self, release_at: Timestamp, after_seq: u64, buffers: Vec<AllocatedBuffer>) {
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
        self.due.lock().insert((release_at, seq), Held { after_seq, buffers });
    }

    /// Frees every batch due at `now` whose oplog sequence is durable (`durable`: the durable prefix's last
    /// sequence, `u64::MAX` without an oplog), outside the queue lock; returns the number of buffers freed. A
    /// batch due but not yet durable stays for a later call.
    pub fn release_due(&self, now: Timestamp, durable: u64) -> usize {
        let ready: Vec<Vec<AllocatedBuffer>> = {
            let mut due = self.due.lock();
            let later = due.split_off(&(Timestamp(now.0.saturating_add(1)), 0));
            let expired = std::mem::replace(&mut *due, later);
            let mut ready = Vec::new();
            for (k, held) in expired {
                if held.after_seq <= durable {
                    ready.push(held.buffers);
                } else {
                    due.insert(k, held);
                }
            }
            ready
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
