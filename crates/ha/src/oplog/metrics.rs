//! The writer's figures for `/metrics` and `/health` (RFC Phase 5), as plain snapshot types: fixed-bucket
//! histograms, latency summaries over a bounded window of recent samples, and counters. No metrics library and
//! no master types: the master copies a [`WriterMetrics`] snapshot into whatever it exports.

use super::codec::DurablePrefix;
use std::collections::VecDeque;
use std::time::Duration;

/// Recent samples a latency summary is computed over (older ones are forgotten, so memory stays bounded).
pub const LATENCY_WINDOW: usize = 1024;
/// Upper bounds of the entries-per-batch buckets (the reference's 1..4096, powers of two; one more bucket
/// above the last bound).
pub const BATCH_ENTRIES_BOUNDS: [u64; 13] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096];
/// Upper bounds of the bytes-per-batch buckets (the reference's 256 B..4 MiB, powers of four).
pub const BATCH_BYTES_BOUNDS: [u64; 9] = [256, 1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24];

/// A fixed-bucket histogram: `counts[i]` samples were `<= bounds[i]` (and above the bound before); the last
/// count is the overflow bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    /// Inclusive upper bounds, ascending.
    pub bounds: &'static [u64],
    /// One count per bound plus the overflow bucket.
    pub counts: Vec<u64>,
    /// Samples recorded.
    pub total: u64,
    /// Sum of the samples.
    pub sum: u64,
}

impl Histogram {
    /// An empty histogram over `bounds`.
    pub fn new(bounds: &'static [u64]) -> Self {
        Self { bounds, counts: vec![0; bounds.len() + 1], total: 0, sum: 0 }
    }

    /// Counts one sample.
    pub fn record(&mut self, v: u64) {
        let i = self.bounds.partition_point(|&b| b < v);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.total += 1;
        self.sum = self.sum.saturating_add(v);
    }
}

/// Percentiles of the most recent samples (at most [`LATENCY_WINDOW`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LatencySummary {
    /// Samples ever recorded.
    pub count: u64,
    /// Samples in the window the percentiles come from.
    pub window: usize,
    /// Median of the window.
    pub p50: Duration,
    /// 99th percentile of the window.
    pub p99: Duration,
    /// Largest sample in the window.
    pub max: Duration,
}

/// The bounded window of recent latency samples.
#[derive(Debug, Clone, Default)]
pub(crate) struct LatencyWindow {
    samples: VecDeque<Duration>,
    count: u64,
}

impl LatencyWindow {
    pub(crate) fn record(&mut self, d: Duration) {
        if self.samples.len() == LATENCY_WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(d);
        self.count += 1;
    }

    pub(crate) fn summary(&self) -> LatencySummary {
        let mut sorted: Vec<Duration> = self.samples.iter().copied().collect();
        sorted.sort_unstable();
        // Nearest-rank percentile: the smallest sample with at least q of the window at or below it.
        let rank = |percent: usize| -> Duration {
            let n = sorted.len();
            let k = (n * percent).div_ceil(100).clamp(1, n.max(1));
            sorted.get(k - 1).copied().unwrap_or_default()
        };
        LatencySummary {
            count: self.count,
            window: sorted.len(),
            p50: rank(50),
            p99: rank(99),
            max: sorted.last().copied().unwrap_or_default(),
        }
    }
}

/// Refused admissions, by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdmissionFailures {
    /// Admission closed: the backend is failing (the writer retries) or the writer is stopping.
    pub unavailable: u64,
    /// The admission limit was reached.
    pub queue_full: u64,
    /// The writer is terminal (fenced, conflicting, or a non-retryable error).
    pub terminal: u64,
    /// The entry was invalid (limits) at commit.
    pub invalid_entry: u64,
}

/// A snapshot of the writer's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterMetrics {
    /// New reservations are admitted (health).
    pub accepting: bool,
    /// The writer stopped for good (health).
    pub terminal: bool,
    /// The durable prefix (in legacy mode `{0, latest}`): durable sequence and batch id.
    pub durable: DurablePrefix,
    /// Writes made durable (batches; in legacy mode, per-entry txns).
    pub durable_writes: u64,
    /// Entries made durable.
    pub durable_entries: u64,
    /// Entries per durable write.
    pub batch_entries: Histogram,
    /// Encoded bytes per durable write (an upper bound: entries' size bounds plus the record overhead bound).
    pub batch_bytes: Histogram,
    /// From `commit` to the entry's write being durable.
    pub commit_to_durable: LatencySummary,
    /// From durability to the entry's callback starting (how far the callback task lags).
    pub callback_latency: LatencySummary,
    /// Failed write attempts (each retried).
    pub retries: u64,
    /// How long the batch in flight has been in flight, when one is.
    pub in_flight_age: Option<Duration>,
    /// Set while the in-flight batch is failing: how long since its first failure (the stuck batch's age).
    pub stuck_for: Option<Duration>,
    /// Set while admission is closed (the backend failing, the writer terminal or stopping): for how long.
    pub closed_for: Option<Duration>,
    /// Committed entries not durable yet (waiting to be sealed plus in flight).
    pub committed_not_durable: usize,
    /// Durable entries whose callbacks have not run yet.
    pub callback_queue: usize,
    /// Durable callbacks that panicked (each caught; the later ones still ran).
    pub callback_panics: u64,
    /// Refused admissions, by cause.
    pub admission_failures: AdmissionFailures,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_inclusive_upper_bounds() {
        let mut h = Histogram::new(&BATCH_ENTRIES_BOUNDS);
        for v in [1, 2, 3, 4096, 4097, 1_000_000] {
            h.record(v);
        }
        assert_eq!(h.counts[0], 1, "1 -> <=1");
        assert_eq!(h.counts[1], 1, "2 -> <=2");
        assert_eq!(h.counts[2], 1, "3 -> <=4");
        assert_eq!(h.counts[12], 1, "4096 -> <=4096");
        assert_eq!(h.counts[13], 2, "overflow");
        assert_eq!((h.total, h.sum), (6, 1 + 2 + 3 + 4096 + 4097 + 1_000_000));
    }

    #[test]
    fn latency_window_is_bounded_and_ranks_nearest() {
        let mut w = LatencyWindow::default();
        assert_eq!(w.summary(), LatencySummary::default());
        for ms in 1..=100 {
            w.record(Duration::from_millis(ms));
        }
        let s = w.summary();
        assert_eq!((s.count, s.window), (100, 100));
        assert_eq!(
            (s.p50, s.p99, s.max),
            (Duration::from_millis(50), Duration::from_millis(99), Duration::from_millis(100))
        );
        for _ in 0..LATENCY_WINDOW {
            w.record(Duration::from_millis(7));
        }
        let s = w.summary();
        assert_eq!((s.count, s.window, s.max), (100 + LATENCY_WINDOW as u64, LATENCY_WINDOW, Duration::from_millis(7)));
    }
}
