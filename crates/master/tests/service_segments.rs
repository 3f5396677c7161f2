//! Segments and liveness through the master: mounts, unmounts and their objects, remounts, client expiry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::service::{ClientStatus, MasterConfig};
use crescent_proto::{ClientId, ErrorCode, ReplicateConfig, SegmentId, SegmentStatus};
use std::time::Duration;

#[test]
fn mount_is_idempotent_and_validated_unmount_of_unknown_is_ok() {
    let h = Harness::default3();
    let c = ClientId::random();
    let s = spec("x", 16 * MIB);
    h.svc.mount_segment(c, s.clone()).unwrap();
    h.svc.mount_segment(c, s.clone()).unwrap();
    let mut bad = spec("y", 16 * MIB);
    bad.base = 0;
    assert_eq!(h.svc.mount_segment(c, bad).unwrap_err(), ErrorCode::InvalidParams);
    assert_eq!(h.svc.mount_segment(c, spec("z", 0)).unwrap_err(), ErrorCode::InvalidParams);
    h.svc.unmount_segment(SegmentId::random()).unwrap();
    h.svc.unmount_segment(s.id).unwrap();
    h.svc.unmount_segment(s.id).unwrap();
    assert_eq!(h.svc.segment_status(s.id).unwrap_err(), ErrorCode::SegmentNotFound);
}

#[test]
fn unmount_hides_replicas_at_once_and_keeps_objects_with_survivors() {
    let h = Harness::default3();
    let (_, s0) = h.segments[0];
    let pinned = ReplicateConfig { preferred_segments: vec!["seg0".into()], ..ReplicateConfig::with_replicas(1) };
    for i in 0..1000 {
        h.put_in("", &format!("only{i}"), 100, &pinned).unwrap();
    }
    let both =
        ReplicateConfig { preferred_segments: vec!["seg0".into(), "seg1".into()], ..ReplicateConfig::with_replicas(2) };
    h.put_in("", "both", 100, &both).unwrap();
    h.get("only0").unwrap(); // leases do not block unmount
    h.svc.unmount_segment(s0).unwrap();
    for i in [0, 1, 999] {
        assert_eq!(h.get(&format!("only{i}")).unwrap_err(), ErrorCode::ObjectNotFound);
        assert_eq!(h.svc.exist_key("", &format!("only{i}")), Ok(false));
    }
    let r = h.get("both").unwrap();
    assert_eq!(r.replicas.len(), 1);
    assert_eq!(r.replicas[0].location.segment_id(), Some(h.segments[1].1));
    assert_eq!(h.svc.key_count(None), 1, "the sweep erased the objects with nothing left");
    assert_eq!(h.used(), 100);
    // A write whose only segment vanishes mid-flight ends with OBJECT_NOT_FOUND, not a half object.
    let only1 = ReplicateConfig { preferred_segments: vec!["seg1".into()], ..ReplicateConfig::with_replicas(1) };
    h.svc.put_start(h.writer, "", "inflight", 10, &only1).unwrap();
    h.svc.unmount_segment(h.segments[1].1).unwrap();
    assert_eq!(h.svc.put_end(h.writer, "", "inflight", None).unwrap_err(), ErrorCode::ObjectNotFound);
    assert_eq!(h.get("both").unwrap_err(), ErrorCode::ObjectNotFound);
}

#[test]
fn ping_asks_for_remount_until_the_client_remounts() {
    let h = Harness::new(MasterConfig::default(), 0, 0);
    let c = ClientId::random();
    assert_eq!(h.svc.ping(c), ClientStatus::NeedRemount);
    let s = spec("a", 16 * MIB);
    h.svc.mount_segment(c, s.clone()).unwrap();
    assert_eq!(h.svc.ping(c), ClientStatus::NeedRemount);
    let mut changed = s.clone();
    changed.size = 32 * MIB;
    assert_eq!(h.svc.remount_segments(c, &[changed]).unwrap_err(), ErrorCode::InvalidParams);
    assert_eq!(h.svc.ping(c), ClientStatus::NeedRemount);
    h.svc.remount_segments(c, &[s]).unwrap();
    assert_eq!(h.svc.ping(c), ClientStatus::Ok);
    // Remount with an empty list is valid too.
    let d = ClientId::random();
    h.svc.remount_segments(d, &[]).unwrap();
    assert_eq!(h.svc.ping(d), ClientStatus::Ok);
}

/// Silent clients are expired at their TTL: their memory segments are disconnected (NoF segments are not tied
/// to client liveness), their LocalSSD registration dropped, and their next ping asks for a remount. With no
/// grace period the segments are unmounted at once.
#[test]
fn silent_clients_are_expired_and_must_remount() {
    for grace_ms in [0, 60_000] {
        let config = MasterConfig { disconnect_grace_ms: grace_ms, ..MasterConfig::default() };
        let h = Harness::new(config, 3, 64 * MIB);
        let (c0, s0) = h.segments[0];
        let (c1, _) = h.segments[1];
        let mut nof = spec("nof", 16 * MIB);
        nof.kind = crescent_proto::SegmentKind::Nof;
        h.svc.mount_segment(c0, nof.clone()).unwrap();
        let pinned = ReplicateConfig { preferred_segments: vec!["seg0".into()], ..ReplicateConfig::with_replicas(1) };
        h.put_in("", "on0", 10, &pinned).unwrap();
        h.svc.local_ssd().register(c0, true).unwrap();
        for _ in 0..9 {
            h.advance(Duration::from_secs(1));
            h.svc.ping(c1);
            h.svc.ping(h.segments[2].0);
            assert!(h.svc.step_liveness().is_empty());
        }
        h.advance(Duration::from_secs(1));
        assert_eq!(h.svc.step_liveness(), vec![c0]);
        assert_eq!(h.svc.segment_status(nof.id), Ok(SegmentStatus::Ok), "NoF is not tied to client TTL");
        if grace_ms == 0 {
            assert_eq!(h.svc.segment_status(s0).unwrap_err(), ErrorCode::SegmentNotFound);
            assert_eq!(h.get("on0").unwrap_err(), ErrorCode::ObjectNotFound);
        } else {
            assert_eq!(h.svc.segment_status(s0), Ok(SegmentStatus::Disconnected));
            assert_eq!(h.get("on0").unwrap_err(), ErrorCode::UnavailableInCurrentStatus, "kept, not served");
        }
        assert!(!h.svc.local_ssd().is_registered(c0));
        assert_eq!(h.svc.ping(c0), ClientStatus::NeedRemount);
        assert_eq!(h.svc.metrics().expired_clients.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}

fn spec_of(h: &Harness, id: SegmentId) -> crescent_proto::SegmentSpec {
    (*h.svc.pool().segment(id).unwrap().spec).clone()
}

/// Expires `client` (everyone else keeps pinging).
fn expire(h: &Harness, client: ClientId) {
    h.advance(Duration::from_secs(11));
    for (c, _) in &h.segments {
        if *c != client {
            h.svc.ping(*c);
        }
    }
    h.svc.ping(h.writer);
    assert_eq!(h.svc.step_liveness(), vec![client]);
}

/// A node that pauses past its TTL loses nothing: its segment is disconnected — no placements, replicas not
/// handed out (readers use the others), its space neither free (out of the usage the eviction trigger sees)
/// nor evictable — and when the same instance remounts, every object on it is served again.
#[test]
fn a_paused_node_is_disconnected_and_comes_back_with_every_object() {
    let h = Harness::new(MasterConfig::default(), 2, 16 * MIB);
    let ((c0, s0), (_, s1)) = (h.segments[0], h.segments[1]);
    let on0 = ReplicateConfig { preferred_segments: vec!["seg0".into()], ..ReplicateConfig::with_replicas(1) };
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let mut placed = Vec::new();
    for k in &keys {
        placed.push(h.put_in("", k, 4096, &on0).unwrap());
    }
    h.put_in("", "both", 4096, &ReplicateConfig::with_replicas(2)).unwrap();
    let used_before = h.svc.pool().segment(s0).unwrap().usage;
    expire(&h, c0);
    assert_eq!(h.svc.segment_status(s0), Ok(SegmentStatus::Disconnected));
    for k in &keys {
        assert_eq!(h.get(k).unwrap_err(), ErrorCode::UnavailableInCurrentStatus);
    }
    assert_eq!(h.get("both").unwrap().replicas.len(), 1, "the reader uses the other replica");
    for i in 0..5 {
        let r = h.put_in("", &format!("new{i}"), 4096, &ReplicateConfig::with_replicas(2)).unwrap();
        assert!(r.iter().all(|d| d.location.segment_id() == Some(s1)), "nothing is placed on it");
    }
    assert_eq!(h.svc.pool().usage(crescent_proto::SegmentKind::Memory).capacity, 16 * MIB);
    let r = h.svc.evict(
        crescent_master::eviction::EvictionScope::All,
        crescent_master::eviction::EvictionTarget::Fraction { target: 1.0, lower: 1.0 },
    );
    assert!(r.objects > 0);
    assert_eq!(h.svc.pool().segment(s0).unwrap().usage, used_before, "nothing on it was evicted or freed");
    // The same instance comes back: asked to remount, it remounts its segment, and everything is served.
    assert_eq!(h.svc.ping(c0), ClientStatus::NeedRemount);
    h.svc.remount_segments(c0, &[spec_of(&h, s0)]).unwrap();
    assert_eq!(h.svc.segment_status(s0), Ok(SegmentStatus::Ok));
    for (k, before) in keys.iter().zip(&placed) {
        let now: Vec<_> = h.get(k).unwrap().replicas.into_iter().map(|d| d.location).collect();
        let then: Vec<_> = before.iter().map(|d| d.location.clone()).collect();
        assert_eq!(now, then, "{k} is served from where it was");
    }
    h.advance(Duration::from_secs(600));
    h.svc.step_graceful_unmounts();
    assert_eq!(h.svc.segment_status(s0), Ok(SegmentStatus::Ok), "the grace deadline was cancelled");
}

/// The grace period ends: the disconnected segment is unmounted and its objects dropped; the node, if it ever
/// comes back, is asked to remount and mounts its segment again, empty.
#[test]
fn a_disconnected_segment_is_dropped_at_the_end_of_its_grace() {
    let config = MasterConfig { disconnect_grace_ms: 30_000, ..MasterConfig::default() };
    let h = Harness::new(config, 2, 16 * MIB);
    let (c0, s0) = h.segments[0];
    let on0 = ReplicateConfig { preferred_segments: vec!["seg0".into()], ..ReplicateConfig::with_replicas(1) };
    h.put_in("", "k", 4096, &on0).unwrap();
    expire(&h, c0);
    h.advance(Duration::from_secs(29));
    assert_eq!(h.svc.step_graceful_unmounts(), 0);
    h.advance(Duration::from_secs(1));
    assert_eq!(h.svc.step_graceful_unmounts(), 1);
    assert_eq!(h.svc.segment_status(s0).unwrap_err(), ErrorCode::SegmentNotFound);
    assert_eq!(h.get("k").unwrap_err(), ErrorCode::ObjectNotFound);
    assert_eq!(h.svc.ping(c0), ClientStatus::NeedRemount);
    h.svc.remount_segments(c0, &[spec("seg0", 16 * MIB)]).unwrap();
    assert_eq!(h.svc.ping(c0), ClientStatus::Ok);
}

/// A node that restarted (a new client id: a new process, its memory gone) at the same endpoint: the old
/// instance's disconnected segment is dropped at once, so nothing stale is ever served from it.
#[test]
fn a_restarted_node_drops_its_old_instance_at_once() {
    let h = Harness::new(MasterConfig::default(), 2, 16 * MIB);
    let (c0, s0) = h.segments[0];
    let on0 = ReplicateConfig { preferred_segments: vec!["seg0".into()], ..ReplicateConfig::with_replicas(1) };
    h.put_in("", "k", 4096, &on0).unwrap();
    expire(&h, c0);
    let old = spec_of(&h, s0);
    let mut fresh = spec(&old.name, old.size);
    fresh.endpoint = old.endpoint.clone();
    h.svc.mount_segment(ClientId::random(), fresh.clone()).unwrap();
    assert_eq!(h.svc.segment_status(s0).unwrap_err(), ErrorCode::SegmentNotFound);
    assert_eq!(h.get("k").unwrap_err(), ErrorCode::ObjectNotFound);
    assert_eq!(h.svc.segment_status(fresh.id), Ok(SegmentStatus::Ok));
    // A live segment at another endpoint, or of the same client, is never taken for a replaced instance.
    assert_eq!(h.svc.segment_status(h.segments[1].1), Ok(SegmentStatus::Ok));
}

/// Only a segment's owner may unmount it.
#[test]
fn only_the_owner_unmounts_a_segment() {
    let h = Harness::default3();
    let (c0, s0) = h.segments[0];
    h.put("k", 10);
    assert_eq!(h.svc.unmount_own_segment(ClientId::random(), s0).unwrap_err(), ErrorCode::InvalidParams);
    assert_eq!(h.svc.unmount_own_segment(h.segments[1].0, s0).unwrap_err(), ErrorCode::InvalidParams);
    assert_eq!(h.svc.segment_status(s0), Ok(SegmentStatus::Ok));
    assert!(h.svc.unmount_own_segment(ClientId::random(), SegmentId::random()).is_ok(), "unknown id: OK");
    h.svc.unmount_own_segment(c0, s0).unwrap();
    assert_eq!(h.svc.segment_status(s0).unwrap_err(), ErrorCode::SegmentNotFound);
}

// Graceful unmount through the master.
#[test]
fn graceful_unmount_runs_at_its_deadline() {
    let h = Harness::default3();
    let (c0, s0) = h.segments[0];
    let pinned = ReplicateConfig { preferred_segments: vec!["seg0".into()], ..ReplicateConfig::with_replicas(1) };
    h.put_in("", "k", 10, &pinned).unwrap();
    assert_eq!(
        h.svc.graceful_unmount_segment(s0, h.segments[1].0, Duration::from_millis(50)).unwrap_err(),
        ErrorCode::InvalidParams
    );
    h.svc.graceful_unmount_segment(s0, c0, Duration::from_millis(50)).unwrap();
    assert_eq!(h.svc.segment_status(s0), Ok(SegmentStatus::GracefullyUnmounting));
    assert!(h.get("k").is_ok(), "readable during the grace period");
    let d = h.svc.put_start(h.writer, "", "new", 10, &pinned).unwrap();
    assert_ne!(d[0].location.segment_id(), Some(s0), "no new replicas on it");
    assert_eq!(h.svc.step_graceful_unmounts(), 0);
    h.advance(Duration::from_millis(50));
    assert_eq!(h.svc.step_graceful_unmounts(), 1);
    assert_eq!(h.get("k").unwrap_err(), ErrorCode::ObjectNotFound);
}

/// The RFC's reactivate: a graceful unmount is rolled back when the owner mounts the same segment again
/// before its deadline; the segment is allocatable again and keeps every replica.
#[test]
fn mounting_again_cancels_a_pending_graceful_unmount() {
    let h = Harness::new(MasterConfig::default(), 0, 0);
    let c = ClientId::random();
    let s = spec("only", 16 * MIB);
    h.svc.mount_segment(c, s.clone()).unwrap();
    h.put("k", 4096);
    h.svc.graceful_unmount_segment(s.id, c, Duration::from_secs(5)).unwrap();
    assert_eq!(h.svc.segment_status(s.id).unwrap(), SegmentStatus::GracefullyUnmounting);
    assert_eq!(
        h.svc.put_start(h.writer, "", "new", 1, &ReplicateConfig::default()).unwrap_err(),
        ErrorCode::NoAvailableHandle,
        "a segment on its way out takes no writes"
    );
    h.svc.mount_segment(c, s.clone()).unwrap();
    assert_eq!(h.svc.segment_status(s.id).unwrap(), SegmentStatus::Ok);
    h.advance(Duration::from_secs(6));
    assert_eq!(h.svc.step_graceful_unmounts(), 0, "the cancelled deadline does not fire");
    assert!(h.get("k").is_ok(), "its objects stayed");
    h.put("new", 1);
    // Someone else's mount of it is still a conflict.
    assert!(h.svc.mount_segment(ClientId::random(), s).is_err());
}

/// On a master that checks reports, a report only queues a probe of each reported OK segment (once, however
/// many reports name it); the probe's outcome decides.
#[test]
fn a_checked_unreachable_report_waits_for_the_masters_probe() {
    let config = MasterConfig { verify_unreachable_reports: true, ..MasterConfig::default() };
    let h = Harness::new(config, 2, 16 * MIB);
    let ((_, s0), (_, s1)) = (h.segments[0], h.segments[1]);
    let reporter = ClientId::random();
    assert_eq!(h.svc.report_unreachable(reporter, &[s0, s1, SegmentId::random()]), 0, "nothing suspect yet");
    h.svc.report_unreachable(reporter, &[s1]);
    assert_eq!(h.svc.segment_status(s0).unwrap(), SegmentStatus::Ok);
    assert_eq!(h.svc.segment_status(s1).unwrap(), SegmentStatus::Ok);
    let mut probes: Vec<SegmentId> = h.svc.take_unreachable_reports().into_iter().map(|p| p.segment).collect();
    probes.sort();
    let mut want = vec![s0, s1];
    want.sort();
    assert_eq!(probes, want, "each reported segment once, the unknown one not at all");
    assert!(h.svc.take_unreachable_reports().is_empty(), "taken once");
    // s0's node answered, s1's did not.
    assert!(!h.svc.confirm_unreachable(s0, true));
    assert!(h.svc.confirm_unreachable(s1, false));
    assert_eq!(h.svc.segment_status(s0).unwrap(), SegmentStatus::Ok);
    assert_eq!(h.svc.segment_status(s1).unwrap(), SegmentStatus::Suspect);
    let m = h.svc.metrics();
    assert_eq!(m.unreachable_refuted.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(m.unreachable_confirmed.load(std::sync::atomic::Ordering::Relaxed), 1);
    // A suspect segment is not probed again on a new report.
    h.svc.report_unreachable(reporter, &[s1]);
    assert!(h.svc.take_unreachable_reports().is_empty());
}

/// A segment a client reports unreachable: no placements, its replicas not handed out (others are), its
/// capacity out of the eviction trigger's denominator; its node's ping brings it back; its TTL unmounts it.
#[test]
fn a_suspect_segment_takes_no_writes_hands_out_no_replicas_and_comes_back_on_ping() {
    let h = Harness::new(MasterConfig::default(), 2, 16 * MIB);
    let ((c0, s0), (c1, s1)) = (h.segments[0], h.segments[1]);
    let two = ReplicateConfig::with_replicas(2);
    h.put_in("", "both", 4096, &two).unwrap();
    assert_eq!(h.svc.report_unreachable(ClientId::random(), &[s1, SegmentId::random()]), 1);
    assert_eq!(h.svc.segment_status(s1).unwrap(), SegmentStatus::Suspect);
    let r = h.get("both").unwrap();
    assert_eq!(r.replicas.len(), 1, "only the reachable replica is handed out");
    for i in 0..10 {
        let placed = h.put_in("", &format!("k{i}"), 4096, &two).unwrap();
        assert_eq!(placed.len(), 1, "nothing is placed on the suspect segment");
    }
    assert_eq!(h.svc.pool().usage(crescent_proto::SegmentKind::Memory).capacity, 16 * MIB, "usable capacity only");
    // The suspect segment's node pings: back in service.
    h.svc.ping(c1);
    assert_eq!(h.svc.segment_status(s1).unwrap(), SegmentStatus::Ok);
    assert_eq!(h.get("both").unwrap().replicas.len(), 2);
    // Suspect again, and its node stays silent past the client TTL: disconnected, then unmounted at the end
    // of the grace, objects on it dropped or left with their other replica.
    h.svc.report_unreachable(ClientId::random(), &[s1]);
    h.advance(Duration::from_secs(11));
    h.svc.ping(c0);
    h.svc.step_liveness();
    assert_eq!(h.svc.segment_status(s1), Ok(SegmentStatus::Disconnected));
    h.advance(Duration::from_millis(MasterConfig::default().disconnect_grace_ms));
    h.svc.ping(c0);
    h.svc.step_graceful_unmounts();
    assert!(h.svc.segment_status(s1).is_err(), "unmounted at the end of the grace");
    assert_eq!(h.get("both").unwrap().replicas.len(), 1);
    assert_eq!(h.svc.segment_status(s0).unwrap(), SegmentStatus::Ok);
}
