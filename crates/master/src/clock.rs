//! Injectable time.
//!
//! Leases, TTLs, soft pins and timeouts read a [`Clock`] instead of the system time so tests advance time
//! deterministically instead of sleeping. Time is a monotonic millisecond count ([`Timestamp`]): 8 bytes per
//! stored deadline, which matters at millions of objects.

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Milliseconds on a monotonic clock since that clock's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// `self + d`, saturating.
    pub fn saturating_add(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

/// A source of monotonic time.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The real monotonic clock; its epoch is its creation.
#[derive(Debug)]
pub struct SystemClock {
    epoch: Instant,
}

impl SystemClock {
    /// A clock starting at zero now.
    pub fn new() -> Self {
        Self { epoch: Instant::now() }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp(u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to; for tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
}

impl ManualClock {
    /// A manual clock at `start`.
    pub fn new(start: Timestamp) -> Arc<Self> {
        Arc::new(Self { now_ms: AtomicU64::new(start.0) })
    }

    /// Moves time forward by `d`.
    pub fn advance(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the time (may go backwards; callers that need monotonicity don't do that).
    pub fn set(&self, t: Timestamp) {
        self.now_ms.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.now_ms.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(Timestamp(5));
        assert_eq!(c.now(), Timestamp(5));
        c.advance(Duration::from_secs(2));
        assert_eq!(c.now(), Timestamp(2005));
        assert_eq!(c.now().saturating_since(Timestamp(5)), Duration::from_secs(2));
        assert_eq!(Timestamp(u64::MAX).saturating_add(Duration::from_secs(1)), Timestamp(u64::MAX));
    }

    #[test]
    fn system_clock_is_monotonic() {
        let c = SystemClock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
    }
}
