//! Waiting for a condition to hold, bounded by a deadline: the way a test synchronises with something it
//! cannot observe directly (a process's timer, another host's liveness), instead of sleeping and hoping.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often an async condition is re-checked.
const RECHECK: Duration = Duration::from_millis(20);

/// Re-checks `condition` until it holds (`true`) or `deadline` has passed (`false`, after one last check).
pub async fn eventually<F, Fut>(deadline: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if condition().await {
            return true;
        }
        if start.elapsed() >= deadline {
            return false;
        }
        tokio::time::sleep(RECHECK).await;
    }
}

/// Blocking form of [`eventually`], for a condition another thread makes true: spins, yielding the CPU.
pub fn wait_for(deadline: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if condition() {
            return true;
        }
        std::thread::yield_now();
    }
    condition()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn eventually_returns_when_the_condition_holds_or_after_the_deadline() {
        let calls = AtomicU32::new(0);
        assert!(eventually(Duration::from_secs(10), || async { calls.fetch_add(1, Ordering::Relaxed) >= 2 }).await);
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        assert!(!eventually(Duration::ZERO, || async { false }).await);
        assert!(wait_for(Duration::from_secs(10), || calls.fetch_add(1, Ordering::Relaxed) >= 5));
        assert!(!wait_for(Duration::ZERO, || false));
    }
}
