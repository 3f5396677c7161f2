//! The NoF heartbeat through the master, on a manual clock: which segments are probed and when, and what the
//! probes' outcomes do (the probe I/O itself is the server's; `nof_heartbeat.rs` runs it for real).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::service::{MasterConfig, NofProbe};
use crescent_proto::{ClientId, ErrorCode, ReplicateConfig, SegmentId, SegmentKind, SegmentStatus};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

const INTERVAL: Duration = Duration::from_millis(10_000);
/// The server's tick: tests step the clock by it, as the heartbeat task would look.
const TICK: Duration = Duration::from_millis(100);

fn config() -> MasterConfig {
    MasterConfig {
        nof_heartbeat_interval_ms: 10_000,
        nof_probe_timeout_ms: 1_000,
        nof_heartbeat_failures: 3,
        ..MasterConfig::default()
    }
}

/// Mounts a NoF segment named `name` (its own endpoint) for `client`; returns its id.
fn mount_nof(h: &Harness, client: ClientId, name: &str) -> SegmentId {
    let mut s = spec(name, 16 * MIB);
    s.kind = SegmentKind::Nof;
    s.endpoint = format!("nof-target-{name}:4420");
    let id = s.id;
    h.svc.mount_segment(client, s).unwrap();
    id
}

/// Steps the clock one tick at a time until `segment` is due (at most one interval); returns the probe.
fn next_probe_of(h: &Harness, segment: SegmentId) -> NofProbe {
    for _ in 0..=INTERVAL.as_millis() / TICK.as_millis() {
        if let Some(p) = h.svc.due_nof_probes().into_iter().find(|p| p.segment == segment) {
            return p;
        }
        h.advance(TICK);
    }
    panic!("{segment} was not probed within an interval");
}

/// Runs `segment`'s next probe with outcome `ok`; returns whether that unmounted it.
fn probe(h: &Harness, segment: SegmentId, ok: bool) -> bool {
    next_probe_of(h, segment);
    h.svc.record_nof_probe(segment, ok)
}

fn nof_only() -> ReplicateConfig {
    ReplicateConfig { replica_num: 0, nof_replica_num: 1, ..ReplicateConfig::default() }
}

#[test]
fn a_nof_segment_failing_its_probes_threshold_times_in_a_row_is_unmounted() {
    let h = Harness::new(config(), 1, 64 * MIB);
    let nof = mount_nof(&h, ClientId::random(), "nof0");
    h.put_in("", "on-nof", 100, &nof_only()).unwrap();
    h.put("on-memory", 100);
    let p = next_probe_of(&h, nof);
    assert_eq!(p.endpoint, "nof-target-nof0:4420", "the probe goes to the segment's endpoint");
    assert!(!h.svc.record_nof_probe(nof, false));
    assert!(!probe(&h, nof, false));
    assert_eq!(h.svc.segment_status(nof), Ok(SegmentStatus::Ok), "two failures are below the threshold");
    assert_eq!(h.get("on-nof").unwrap().replicas.len(), 1, "still readable");
    assert!(probe(&h, nof, false), "the third failure in a row unmounts it");
    assert_eq!(h.svc.segment_status(nof), Err(ErrorCode::SegmentNotFound));
    assert_eq!(h.get("on-nof").unwrap_err(), ErrorCode::ObjectNotFound, "an object only on it is gone");
    assert_eq!(h.get("on-memory").unwrap().replicas.len(), 1, "other segments are untouched");
    assert_eq!(h.svc.metrics().nof_unmounted_segments.load(Ordering::Relaxed), 1);
    // Nothing left to probe, and a late report changes nothing.
    for _ in 0..3 {
        h.advance(INTERVAL);
        assert_eq!(h.svc.due_nof_probes(), Vec::new());
    }
    assert!(!h.svc.record_nof_probe(nof, false));
    assert_eq!(h.svc.metrics().nof_unmounted_segments.load(Ordering::Relaxed), 1);
    assert!(h.put_in("", "after", 100, &nof_only()).is_err(), "no NoF segment takes writes any more");
}

#[test]
fn one_success_in_between_resets_the_count() {
    let h = Harness::new(config(), 0, 0);
    let nof = mount_nof(&h, ClientId::random(), "nof0");
    for ok in [false, false, true, false, false] {
        assert!(!probe(&h, nof, ok));
    }
    assert_eq!(h.svc.segment_status(nof), Ok(SegmentStatus::Ok), "only two failures since the success");
    assert!(probe(&h, nof, false));
    assert_eq!(h.svc.segment_status(nof), Err(ErrorCode::SegmentNotFound));
}

#[test]
fn memory_segments_are_never_probed() {
    let h = Harness::new(config(), 3, 64 * MIB);
    h.put("k", 100);
    for _ in 0..3 * INTERVAL.as_millis() / TICK.as_millis() {
        assert_eq!(h.svc.due_nof_probes(), Vec::new());
        h.advance(TICK);
    }
    let nof = mount_nof(&h, ClientId::random(), "nof0");
    let mut probed = Vec::new();
    for _ in 0..3 * INTERVAL.as_millis() / TICK.as_millis() {
        for p in h.svc.due_nof_probes() {
            probed.push(p.segment);
            h.svc.record_nof_probe(p.segment, false);
        }
        h.advance(TICK);
    }
    assert_eq!(probed, vec![nof; 3], "only the NoF segment, until its third failure unmounted it");
    assert_eq!(h.svc.pool().len(), 3, "the memory segments stay");
}

#[test]
fn probes_are_due_once_per_interval_and_first_probes_are_staggered() {
    let h = Harness::new(config(), 0, 0);
    let client = ClientId::random();
    let ids: Vec<SegmentId> = (0..8).map(|i| mount_nof(&h, client, &format!("nof{i}"))).collect();
    let start = h.svc.now();
    // When (ms after the mounts) each segment was probed, over three intervals, looking every millisecond.
    let mut probed: HashMap<SegmentId, Vec<u64>> = HashMap::new();
    for _ in 0..3 * INTERVAL.as_millis() {
        for p in h.svc.due_nof_probes() {
            probed.entry(p.segment).or_default().push(h.svc.now().0 - start.0);
            assert!(!h.svc.record_nof_probe(p.segment, true));
        }
        h.advance(Duration::from_millis(1));
    }
    let interval = INTERVAL.as_millis() as u64;
    let mut firsts = Vec::new();
    for id in &ids {
        let at = &probed[id];
        assert_eq!(at.len(), 3, "{id}: once per interval, {at:?}");
        assert!(at[0] < interval, "{id}: first probe within the first interval, {at:?}");
        assert_eq!((at[1] - at[0], at[2] - at[1]), (interval, interval), "{id}: {at:?}");
        firsts.push(at[0]);
    }
    firsts.sort_unstable();
    firsts.dedup();
    assert!(firsts.len() >= 6, "first probes are spread over the interval, not bunched: {firsts:?}");
    assert!(firsts[firsts.len() - 1] - firsts[0] >= interval / 4, "spread over the interval: {firsts:?}");
}

#[test]
fn client_expiry_leaves_nof_segments_to_the_heartbeat() {
    let h = Harness::new(config(), 0, 0);
    let c = ClientId::random();
    let nof = mount_nof(&h, c, "nof0");
    h.put_in("", "on-nof", 100, &nof_only()).unwrap();
    assert!(!probe(&h, nof, true));
    h.advance(Duration::from_millis(h.svc.config().client_ttl_ms));
    assert_eq!(h.svc.step_liveness(), vec![c], "its client is silent");
    assert_eq!(h.svc.segment_status(nof), Ok(SegmentStatus::Ok), "client expiry does not unmount NoF");
    assert!(!probe(&h, nof, true), "a target that answers keeps its segment");
    assert!(h.get("on-nof").is_ok());
    for _ in 0..2 {
        assert!(!probe(&h, nof, false));
    }
    assert!(probe(&h, nof, false), "a target that stops answering loses it");
    assert_eq!(h.get("on-nof").unwrap_err(), ErrorCode::ObjectNotFound);
}

#[test]
fn a_segment_back_to_ok_starts_fresh_and_is_not_probed_meanwhile() {
    let h = Harness::new(config(), 0, 0);
    let c = ClientId::random();
    let s = nof_spec();
    let nof = s.id;
    h.svc.mount_segment(c, s.clone()).unwrap();
    assert!(!probe(&h, nof, false));
    assert!(!probe(&h, nof, false));
    // A client reports it unreachable: SUSPECT, not OK, so not probed.
    assert_eq!(h.svc.report_unreachable(ClientId::random(), &[nof]), 1);
    for _ in 0..2 * INTERVAL.as_millis() / TICK.as_millis() {
        assert_eq!(h.svc.due_nof_probes(), Vec::new());
        h.advance(TICK);
    }
    // Its owner mounts it again: OK, and its two earlier failures are forgotten.
    h.svc.mount_segment(c, s).unwrap();
    assert_eq!(h.svc.segment_status(nof), Ok(SegmentStatus::Ok));
    assert!(!probe(&h, nof, false));
    assert!(!probe(&h, nof, false));
    assert_eq!(h.svc.segment_status(nof), Ok(SegmentStatus::Ok));
    assert!(probe(&h, nof, false));
}

#[test]
fn a_report_for_a_segment_mounted_again_since_its_probe_is_ignored() {
    let h = Harness::new(MasterConfig { nof_heartbeat_failures: 1, ..config() }, 0, 0);
    let c = ClientId::random();
    let s = nof_spec();
    let nof = s.id;
    h.svc.mount_segment(c, s.clone()).unwrap();
    next_probe_of(&h, nof);
    // Unmounted and mounted again while the probe was out: its failure is about the old mount.
    h.svc.unmount_segment(nof).unwrap();
    h.svc.mount_segment(c, s).unwrap();
    assert!(!h.svc.record_nof_probe(nof, false));
    assert_eq!(h.svc.segment_status(nof), Ok(SegmentStatus::Ok));
    assert!(probe(&h, nof, false), "a probe of the new mount counts");
}

/// A 16 MiB NoF segment at a target nothing serves (the tests drive the probe outcomes).
fn nof_spec() -> crescent_proto::SegmentSpec {
    let mut s = spec("nof0", 16 * MIB);
    s.kind = SegmentKind::Nof;
    s.endpoint = "nof-target:4420".into();
    s
}
