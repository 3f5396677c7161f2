//! NoF heartbeat bookkeeping: which OK NoF segments are due for a probe of their target, and how many probes
//! in a row each has failed. NoF segments outlive their client's TTL (the target is not the client), so this
//! is what notices a dead target: after `nof_heartbeat_failures` consecutive failed probes its segment is
//! unmounted. The probe itself is I/O and runs in the server (`server::nof_heartbeat`); this side is
//! synchronous and reads the service clock, so tests drive it without sleeping.

use super::{MasterConfig, MasterService};
use crate::clock::Timestamp;
use crescent_proto::{ErrorCode, SegmentId, SegmentKind, SegmentStatus};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A probe the server should run now: a read of `segment` from the target at `endpoint`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NofProbe {
    /// The segment probed.
    pub segment: SegmentId,
    /// Where its target serves it.
    pub endpoint: String,
}

/// One segment's probe schedule.
#[derive(Debug)]
struct Schedule {
    /// The endpoint the schedule was made for (a segment mounted again elsewhere starts over).
    endpoint: String,
    next_due: Timestamp,
    /// Consecutive failed probes.
    failures: u32,
    /// A probe was handed out and not reported yet; past this time its report is given up for lost (the task
    /// running it died) so the schedule cannot stall.
    in_flight_until: Option<Timestamp>,
}

/// What a probe report amounts to.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// No probe of this segment was in flight (pruned, unmounted or mounted again meanwhile).
    Ignored,
    /// The target answered; it had failed this many probes before.
    Alive { after_failures: u32 },
    /// The target failed, below the threshold.
    Failed { endpoint: String, failures: u32 },
    /// The target failed the threshold's worth in a row: the segment goes.
    Dead { endpoint: String, failures: u32 },
}

/// The heartbeat schedules of the OK NoF segments (the one owner of that state). Its mutex is a leaf.
#[derive(Debug)]
pub(super) struct NofHealth {
    interval: Duration,
    timeout: Duration,
    threshold: u32,
    schedules: Mutex<HashMap<SegmentId, Schedule>>,
}

impl NofHealth {
    /// Schedules for `config`'s interval, probe timeout and failure threshold (each must be positive).
    pub(super) fn new(config: &MasterConfig) -> Result<Self, ErrorCode> {
        for (name, value) in [
            ("nof_heartbeat_interval_ms", config.nof_heartbeat_interval_ms),
            ("nof_probe_timeout_ms", config.nof_probe_timeout_ms),
            ("nof_heartbeat_failures", u64::from(config.nof_heartbeat_failures)),
        ] {
            if value == 0 {
                tracing::error!("invalid master configuration: {name} must be positive");
                return Err(ErrorCode::InvalidParams);
            }
        }
        Ok(Self {
            interval: Duration::from_millis(config.nof_heartbeat_interval_ms),
            timeout: Duration::from_millis(config.nof_probe_timeout_ms),
            threshold: config.nof_heartbeat_failures,
            schedules: Mutex::new(HashMap::new()),
        })
    }

    /// Where in the interval a segment's first probe falls: spread by its id so that segments mounted together
    /// (a node's, or every segment after a master restart) are not all probed in the same tick.
    fn stagger(&self, id: SegmentId) -> Duration {
        let (hi, lo) = id.as_u64_pair();
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&hi.to_le_bytes());
        bytes[8..].copy_from_slice(&lo.to_le_bytes());
        let interval_ms = u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX).max(1);
        Duration::from_millis(xxhash_rust::xxh3::xxh3_64(&bytes) % interval_ms)
    }

    /// The probes due at `now` among `targets` (every OK NoF segment and its endpoint); each is marked in
    /// flight and its next probe scheduled one interval on. Schedules of segments not in `targets` are dropped.
    fn due(&self, now: Timestamp, mut targets: Vec<(SegmentId, String)>) -> Vec<NofProbe> {
        targets.sort_unstable_by_key(|t| t.0);
        let mut schedules = self.schedules.lock();
        schedules.retain(|id, _| targets.binary_search_by_key(id, |t| t.0).is_ok());
        let mut due = Vec::new();
        for (id, endpoint) in targets {
            let s = schedules.entry(id).or_insert_with(|| self.fresh(id, now, &endpoint));
            if s.endpoint != endpoint {
                *s = self.fresh(id, now, &endpoint);
            }
            match s.in_flight_until {
                Some(until) if until > now => continue,
                Some(_) => {
                    tracing::debug!(segment = %id, "NoF probe report lost; probing again");
                    s.in_flight_until = None;
                }
                None => {}
            }
            if s.next_due > now {
                continue;
            }
            s.in_flight_until = Some(now.saturating_add(self.interval + self.timeout));
            // Keep the staggered cadence; after a long stall start again from now rather than catch up.
            let next = s.next_due.saturating_add(self.interval);
            s.next_due = if next > now { next } else { now.saturating_add(self.interval) };
            due.push(NofProbe { segment: id, endpoint });
        }
        due
    }

    fn fresh(&self, id: SegmentId, now: Timestamp, endpoint: &str) -> Schedule {
        Schedule {
            endpoint: endpoint.to_owned(),
            next_due: now.saturating_add(self.stagger(id)),
            failures: 0,
            in_flight_until: None,
        }
    }

    /// Takes a probe's outcome. Only a probe handed out by `due` and not yet reported counts.
    fn record(&self, segment: SegmentId, ok: bool) -> Verdict {
        let mut schedules = self.schedules.lock();
        let Some(s) = schedules.get_mut(&segment) else { return Verdict::Ignored };
        if s.in_flight_until.take().is_none() {
            return Verdict::Ignored;
        }
        if ok {
            return Verdict::Alive { after_failures: std::mem::take(&mut s.failures) };
        }
        s.failures = s.failures.saturating_add(1);
        let failures = s.failures;
        if failures < self.threshold {
            return Verdict::Failed { endpoint: s.endpoint.clone(), failures };
        }
        let endpoint = std::mem::take(&mut s.endpoint);
        schedules.remove(&segment);
        Verdict::Dead { endpoint, failures }
    }

    /// Drops a segment's schedule (it was unmounted or mounted anew: a later mount starts fresh).
    pub(super) fn forget(&self, segment: SegmentId) {
        self.schedules.lock().remove(&segment);
    }
}

impl MasterService {
    /// The NoF heartbeat probes due now: one per OK NoF segment whose turn has come (every
    /// `nof_heartbeat_interval_ms`, the first staggered over one interval by segment id). Each is marked in
    /// flight until its [`MasterService::record_nof_probe`]; segments no longer mounted (or no longer OK) lose
    /// their schedule, so one that comes back starts fresh.
    pub fn due_nof_probes(&self) -> Vec<NofProbe> {
        // The placement index lists exactly the OK segments of a kind; a walk of every segment instead would
        // take each memory region's allocator lock ten times a second. The pool's shared lock is released before
        // the segments are looked up, and before the schedules' lock is taken.
        let ids: Vec<SegmentId> = {
            let access = self.pool.placement_access();
            let names = access.names(SegmentKind::Nof);
            names.iter().flat_map(|name| access.segment_of(SegmentKind::Nof, name)).collect()
        };
        let targets: Vec<(SegmentId, String)> = ids
            .into_iter()
            .filter_map(|id| self.pool.segment(id))
            .filter(|s| s.spec.kind == SegmentKind::Nof && s.status == SegmentStatus::Ok)
            .map(|s| (s.spec.id, s.spec.endpoint.clone()))
            .collect();
        self.nof_health.due(self.clock.now(), targets)
    }

    /// Reports the outcome of a probe from [`MasterService::due_nof_probes`]: a success resets the segment's
    /// consecutive failures; the `nof_heartbeat_failures`-th failure in a row unmounts the segment (its replicas
    /// become unreadable, objects left with none are erased). Reports of probes not in flight are ignored.
    /// Returns whether the segment was unmounted.
    pub fn record_nof_probe(&self, segment: SegmentId, ok: bool) -> bool {
        let threshold = self.nof_health.threshold;
        match self.nof_health.record(segment, ok) {
            Verdict::Ignored => false,
            Verdict::Alive { after_failures } => {
                if after_failures > 0 {
                    tracing::info!(%segment, "NoF target answers again after {after_failures} failed probe(s)");
                }
                false
            }
            Verdict::Failed { endpoint, failures } => {
                tracing::warn!(%segment, %endpoint, failures, "NoF heartbeat probe failed ({failures} of {threshold})");
                false
            }
            Verdict::Dead { endpoint, failures } => {
                tracing::warn!(
                    %segment, %endpoint, failures,
                    "NoF target failed {failures} heartbeat probes in a row: unmounting its segment"
                );
                match self.unmount(segment, crate::events::RemoveCause::Expired) {
                    Ok(unmounted) => {
                        if unmounted {
                            self.metrics.nof_unmounted_segments.fetch_add(1, Ordering::Relaxed);
                        }
                        unmounted
                    }
                    Err(e) => {
                        tracing::warn!(%segment, error = %e, "unmount of a dead NoF target's segment failed");
                        false
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(interval_ms: u64, threshold: u32) -> NofHealth {
        let config = MasterConfig {
            nof_heartbeat_interval_ms: interval_ms,
            nof_heartbeat_failures: threshold,
            ..MasterConfig::default()
        };
        NofHealth::new(&config).unwrap_or_else(|e| panic!("{e:?}"))
    }

    #[test]
    fn zero_interval_timeout_or_threshold_is_refused() {
        for config in [
            MasterConfig { nof_heartbeat_interval_ms: 0, ..MasterConfig::default() },
            MasterConfig { nof_probe_timeout_ms: 0, ..MasterConfig::default() },
            MasterConfig { nof_heartbeat_failures: 0, ..MasterConfig::default() },
        ] {
            assert_eq!(NofHealth::new(&config).err(), Some(ErrorCode::InvalidParams));
        }
    }

    #[test]
    fn a_lost_report_does_not_stall_the_schedule() {
        let h = health(1_000, 3);
        let id = SegmentId::random();
        let targets = || vec![(id, "t:1".to_owned())];
        let mut now = Timestamp(0);
        while h.due(now, targets()).is_empty() {
            now = now.saturating_add(Duration::from_millis(1));
        }
        // No report: not due again while in flight, then given up and probed again.
        now = now.saturating_add(Duration::from_millis(1_000));
        assert!(h.due(now, targets()).is_empty(), "still in flight");
        now = now.saturating_add(Duration::from_millis(1_000));
        assert_eq!(h.due(now, targets()).len(), 1);
        assert_eq!(h.record(id, false), Verdict::Failed { endpoint: "t:1".into(), failures: 1 });
        assert_eq!(h.record(id, false), Verdict::Ignored, "one report per probe");
    }

    #[test]
    fn a_new_endpoint_starts_a_fresh_schedule() {
        let h = health(1_000, 2);
        let id = SegmentId::random();
        let mut now = Timestamp(0);
        while h.due(now, vec![(id, "a:1".into())]).is_empty() {
            now = now.saturating_add(Duration::from_millis(1));
        }
        assert!(matches!(h.record(id, false), Verdict::Failed { failures: 1, .. }));
        now = now.saturating_add(Duration::from_millis(1_000));
        let mut probes = h.due(now, vec![(id, "b:1".into())]);
        while probes.is_empty() {
            now = now.saturating_add(Duration::from_millis(1));
            probes = h.due(now, vec![(id, "b:1".into())]);
        }
        assert_eq!(probes[0].endpoint, "b:1");
        assert!(matches!(h.record(id, false), Verdict::Failed { failures: 1, .. }), "the count started over");
    }
}
