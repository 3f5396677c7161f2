//! Lock contention counters (the locking RFC's first step): for route shards, object locks and group locks,
//! how often an acquisition found the lock taken and how long such acquisitions waited. Only a contended
//! acquisition touches them: an uncontended one costs a `try_lock`, the same atomic step as `lock`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Which kind of metadata lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockClass {
    /// A route shard of an object index (read or write).
    Route = 0,
    /// One object's lock.
    Object = 1,
    /// An explicit group's membership lock.
    Group = 2,
}

impl LockClass {
    /// Every class, in export order.
    pub const ALL: [LockClass; 3] = [LockClass::Route, LockClass::Object, LockClass::Group];

    /// The label value on `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            LockClass::Route => "route",
            LockClass::Object => "object",
            LockClass::Group => "group",
        }
    }
}

struct ClassStats {
    contended: AtomicU64,
    wait_ns: AtomicU64,
}

static STATS: [ClassStats; 3] = [
    ClassStats { contended: AtomicU64::new(0), wait_ns: AtomicU64::new(0) },
    ClassStats { contended: AtomicU64::new(0), wait_ns: AtomicU64::new(0) },
    ClassStats { contended: AtomicU64::new(0), wait_ns: AtomicU64::new(0) },
];

/// `(contended acquisitions, nanoseconds they waited)` of `class`, process-wide since start.
pub fn lock_stats(class: LockClass) -> (u64, u64) {
    let s = &STATS[class as usize];
    (s.contended.load(Ordering::Relaxed), s.wait_ns.load(Ordering::Relaxed))
}

/// Takes a lock of `class`: `try_take` first; if the lock is held, counts the contention (before blocking, so
/// a waiter is visible while it waits), then `take`s it and adds the time waited.
#[inline]
pub(crate) fn acquire<G>(class: LockClass, try_take: impl FnOnce() -> Option<G>, take: impl FnOnce() -> G) -> G {
    if let Some(g) = try_take() {
        return g;
    }
    let s = &STATS[class as usize];
    s.contended.fetch_add(1, Ordering::Relaxed);
    let start = Instant::now();
    let g = take();
    s.wait_ns.fetch_add(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    g
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{LockClass, acquire, lock_stats};
    use parking_lot::Mutex;
    use std::time::Duration;

    #[test]
    fn a_waiter_is_counted_while_it_waits_and_its_wait_is_timed() {
        let m = Mutex::new(0u32);
        let (before, waited_before) = lock_stats(LockClass::Group);
        let held = m.lock();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| *acquire(LockClass::Group, || m.try_lock(), || m.lock()) += 1);
            assert!(
                crescent_testkit::wait_for(Duration::from_secs(10), || lock_stats(LockClass::Group).0 > before),
                "the waiter is counted before it gets the lock"
            );
            drop(held);
            waiter.join().unwrap();
        });
        let (after, waited) = lock_stats(LockClass::Group);
        assert!(after > before && waited > waited_before);
        assert_eq!(*m.lock(), 1);
        // Uncontended: nothing counted (other tests in this process may contend on other classes only).
        let route = lock_stats(LockClass::Route).0;
        drop(acquire(LockClass::Route, || m.try_lock(), || m.lock()));
        assert_eq!(lock_stats(LockClass::Route).0, route);
    }
}
