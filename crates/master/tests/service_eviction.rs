//! Eviction: the watermark trigger and its target, leases and pins, groups evicted together, allocation and
//! quota triggers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::eviction::{EvictionScope, EvictionTarget};
use crescent_master::metadata::Tier;
use crescent_master::service::MasterConfig;
use crescent_proto::{ClientId, ErrorCode, ReplicaLocation, ReplicateConfig, SegmentKind, SoftPinAction};
use std::sync::atomic::Ordering;
use std::time::Duration;

const KIB: u64 = 1024;

fn frac(t: f64, l: f64) -> EvictionTarget {
    EvictionTarget::Fraction { target: t, lower: l }
}

/// Puts `keys` 1 ms apart so their (expired) leases are unique and increasing.
fn put_aged(h: &Harness, keys: &[String], cfg: &ReplicateConfig) {
    for k in keys {
        h.put_in("", k, KIB, cfg).unwrap();
        h.advance(Duration::from_millis(1));
    }
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:04}")).collect()
}

fn alive(h: &Harness, keys: &[String]) -> Vec<bool> {
    keys.iter().map(|k| probe(h, k)).collect()
}

/// Whether `k` still exists, without granting a lease (a lease would change later eviction order).
fn probe(h: &Harness, k: &str) -> bool {
    h.svc.list_keys("", k, 1).unwrap().first().is_some_and(|x| x == k)
}

#[test]
fn evicts_exactly_ceil_base_times_target_oldest_first() {
    let h = Harness::new(MasterConfig::default(), 2, 64 * MIB);
    let keys = names("k", 400);
    put_aged(&h, &keys, &ReplicateConfig::default());
    let r = h.svc.evict(EvictionScope::All, frac(0.05, 0.025));
    assert_eq!((r.base, r.candidates, r.objects, r.bytes), (400, 400, 20, 20 * KIB));
    let a = alive(&h, &keys);
    assert!(a[..20].iter().all(|x| !x) && a[20..].iter().all(|x| *x));
    let keys = names("j", 250);
    let h = Harness::new(MasterConfig::default(), 2, 64 * MIB);
    put_aged(&h, &keys, &ReplicateConfig::default());
    assert_eq!(h.svc.evict(EvictionScope::All, frac(0.10, 0.10)).objects, 25);
}

#[test]
fn soft_pinned_objects_go_last_and_only_if_allowed() {
    let soft = ReplicateConfig { soft_pin_action: SoftPinAction::Enable, ..ReplicateConfig::default() };
    for allow in [true, false] {
        let config = MasterConfig { allow_evict_soft_pinned: allow, ..MasterConfig::default() };
        let h = Harness::new(config, 1, 64 * MIB);
        let pinned = names("p", 10);
        let plain = names("u", 10);
        put_aged(&h, &pinned, &soft); // older than the plain ones
        put_aged(&h, &plain, &ReplicateConfig::default());
        let r = h.svc.evict(EvictionScope::All, frac(0.8, 0.8));
        assert!(alive(&h, &plain).iter().all(|x| !x));
        let p = alive(&h, &pinned);
        if allow {
            assert_eq!(r.objects, 16);
            assert!(p[..6].iter().all(|x| !x) && p[6..].iter().all(|x| *x), "6 oldest pinned: {p:?}");
        } else {
            assert_eq!(r.objects, 10);
            assert!(p.iter().all(|x| *x));
        }
    }
}

#[test]
fn soft_pin_expires_and_reads_do_not_extend_it() {
    let config = MasterConfig { allow_evict_soft_pinned: false, ..MasterConfig::default() };
    let h = Harness::new(config, 1, 64 * MIB);
    let soft = ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(60_000),
        ..ReplicateConfig::default()
    };
    put_aged(&h, &["pinned".to_string()], &soft);
    put_aged(&h, &["plain".to_string()], &ReplicateConfig::default());
    h.advance(Duration::from_secs(50));
    h.get("pinned").unwrap(); // lease to +60 s; the soft pin still ends at +60 s
    h.advance(Duration::from_secs(5));
    assert_eq!(h.svc.evict(EvictionScope::All, frac(1.0, 1.0)).objects, 1);
    assert!(probe(&h, "pinned") && !probe(&h, "plain"));
    h.advance(Duration::from_secs(6));
    assert_eq!(
        h.svc.evict(EvictionScope::All, frac(1.0, 1.0)).objects,
        1,
        "the pin expired; the read did not extend it"
    );
}

#[test]
fn hard_pinned_leased_and_unfinished_objects_are_never_evicted() {
    let h = Harness::new(MasterConfig::default(), 1, 64 * MIB);
    put_aged(&h, &["hard".to_string()], &ReplicateConfig { with_hard_pin: true, ..ReplicateConfig::default() });
    put_aged(&h, &["leased".to_string(), "plain".to_string()], &ReplicateConfig::default());
    h.svc.put_start(h.writer, "", "pending", KIB, &ReplicateConfig::default()).unwrap();
    h.get("leased").unwrap();
    let r = h.svc.evict(EvictionScope::All, frac(1.0, 1.0));
    assert_eq!(r.base, 2, "hard-pinned and unfinished objects are outside the base");
    assert_eq!(r.objects, 1);
    assert!(probe(&h, "hard") && probe(&h, "leased") && !probe(&h, "plain"));
    assert!(h.svc.put_end(h.writer, "", "pending", None).is_ok());
}

#[test]
fn watermark_step_evicts_the_reference_amount() {
    let keys = names("w", 95);
    let few = Harness::new(MasterConfig::default(), 1, 100 * KIB);
    put_aged(&few, &keys[..90], &ReplicateConfig::default());
    assert!(!few.svc.step_eviction().ran, "0.90 is not above the watermark");
    assert!(!few.svc.under_memory_pressure());
    // used 0.95 > 0.90: target = max(0.05, 0.95 − 0.90 + 0.05) = 0.10 → ceil(95 × 0.10) = 10 objects.
    let h2 = Harness::new(MasterConfig::default(), 1, 100 * KIB);
    put_aged(&h2, &keys, &ReplicateConfig::default());
    let step = h2.svc.step_eviction();
    assert!(step.ran);
    assert!(h2.svc.under_memory_pressure(), "writes may evict until the next step");
    assert!((step.used_ratio - 0.95).abs() < 1e-9);
    assert_eq!(step.report.objects, 10);
    assert!(alive(&h2, &keys)[..10].iter().all(|x| !x));
    assert!(!h2.svc.step_eviction().ran, "0.85 is under the watermark");
    assert!(!h2.svc.under_memory_pressure());
}

#[test]
fn a_failed_allocation_evicts_and_the_write_succeeds() {
    let h = Harness::new(MasterConfig::default(), 1, 64 * KIB);
    let keys = names("f", 64);
    put_aged(&h, &keys, &ReplicateConfig::default());
    assert_eq!(h.used(), 64 * KIB);
    assert!(!h.svc.under_memory_pressure(), "no eviction step has seen the full pool yet");
    h.put("one-more", KIB);
    assert!(!probe(&h, &keys[0]), "the oldest made room");
    assert!(h.svc.under_memory_pressure(), "the failed allocation is remembered until the next step");
    assert!(h.svc.metrics().evicted_objects.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    // With everything leased nothing can be evicted: the write fails cleanly.
    let full = Harness::new(MasterConfig::default(), 1, 64 * KIB);
    put_aged(&full, &keys, &ReplicateConfig::default());
    for k in &keys {
        full.get(k).unwrap();
    }
    let e = full.svc.put_start(full.writer, "", "no-room", KIB, &ReplicateConfig::default()).unwrap_err();
    assert_eq!(e, ErrorCode::NoAvailableHandle);
    assert_eq!(full.svc.key_count(None), 64);
}

fn grouped(g: &str) -> ReplicateConfig {
    ReplicateConfig { group_id: Some(g.to_string()), ..ReplicateConfig::default() }
}

#[test]
fn a_group_is_evicted_together_and_skipped_while_any_member_is_leased() {
    let h = Harness::new(MasterConfig::default(), 1, 64 * MIB);
    let members = names("g", 3);
    put_aged(&h, &members, &grouped("G"));
    let rest = names("r", 7);
    put_aged(&h, &rest, &ReplicateConfig::default());
    let r = h.svc.evict(EvictionScope::All, frac(0.10, 0.10));
    assert_eq!(r.objects, 3, "the oldest candidate's whole group");
    assert!(alive(&h, &members).iter().all(|x| !x));
    assert!(alive(&h, &rest).iter().all(|x| *x));

    let h = Harness::new(MasterConfig::default(), 1, 64 * MIB);
    put_aged(&h, &members, &grouped("G"));
    put_aged(&h, &rest, &ReplicateConfig::default());
    // Reading one member leases all of them (a changed group refreshes immediately).
    h.get(&members[2]).unwrap();
    let r = h.svc.evict(EvictionScope::All, frac(0.10, 0.10));
    assert_eq!(r.objects, 1);
    assert!(alive(&h, &members).iter().all(|x| *x));
    assert!(!probe(&h, &rest[0]));
}

#[test]
fn reading_one_member_refreshes_every_member_lease() {
    let h = Harness::new(MasterConfig::default(), 1, 64 * MIB);
    h.put_in("", "a", KIB, &grouped("G")).unwrap();
    h.put_in("", "b", KIB, &grouped("G")).unwrap();
    h.get("a").unwrap();
    assert_eq!(h.svc.remove("", "b", false).unwrap_err(), ErrorCode::ObjectHasLease);
    // Near expiry (within ttl/2) a read of a refreshes b again.
    h.advance(Duration::from_secs(6));
    h.get("a").unwrap();
    h.advance(Duration::from_secs(5));
    assert_eq!(h.svc.remove("", "b", false).unwrap_err(), ErrorCode::ObjectHasLease);
    // Removing one member keeps the others.
    h.svc.remove("", "b", true).unwrap();
    assert!(h.get("a").is_ok());
}

#[test]
fn unsafe_members_are_skipped_and_safe_peers_evicted() {
    let h = Harness::new(MasterConfig::default(), 1, 64 * MIB);
    let hard = ReplicateConfig { with_hard_pin: true, ..grouped("G") };
    put_aged(&h, &["peer".to_string()], &grouped("G"));
    put_aged(&h, &["hard".to_string()], &hard);
    let r = h.svc.evict(EvictionScope::All, frac(1.0, 1.0));
    assert_eq!(r.objects, 1);
    assert!(probe(&h, "hard") && !probe(&h, "peer"));
}

#[test]
fn grouped_objects_fill_and_a_third_put_evicts_the_unleased_group() {
    // 4 MiB segment, 2 × 2 MiB grouped objects; a third put evicts both (they share a group).
    let h = Harness::new(MasterConfig::default(), 1, 4 * MIB);
    h.put_in("", "a", 2 * MIB, &grouped("G")).unwrap();
    h.advance(Duration::from_millis(1));
    h.put_in("", "b", 2 * MIB, &grouped("G")).unwrap();
    h.advance(Duration::from_millis(1));
    h.put("c", 2 * MIB);
    assert!(!probe(&h, "a") && !probe(&h, "b") && probe(&h, "c"));
}

fn evicted(h: &Harness) -> u64 {
    h.svc.metrics().evicted_objects.load(std::sync::atomic::Ordering::Relaxed)
}

/// 54 aged 1 MiB objects in one 64 MiB segment (the high watermark, 0.90, is 57.6 MiB).
fn cache_of_54(h: &Harness) -> Vec<String> {
    let keys = names("k", 54);
    for k in &keys {
        h.put_in("", k, MIB, &ReplicateConfig::default()).unwrap();
        h.advance(Duration::from_millis(1));
    }
    keys
}

#[test]
fn an_object_over_the_watermark_share_is_refused_and_evicts_nothing() {
    let h = Harness::new(MasterConfig::default(), 1, 64 * MIB);
    let keys = cache_of_54(&h);
    for _ in 0..17 {
        let e = h.svc.put_start(h.writer, "", "big", 60 * MIB, &ReplicateConfig::default()).unwrap_err();
        assert_eq!(e, ErrorCode::NoAvailableHandle);
    }
    assert_eq!(evicted(&h), 0, "no round may run for a write that can never stay");
    assert!(alive(&h, &keys).iter().all(|x| *x));
    // Even into an empty pool: the first watermark round would take it back at once.
    let empty = Harness::new(MasterConfig::default(), 1, 64 * MIB);
    let e = empty.svc.put_start(empty.writer, "", "big", 60 * MIB, &ReplicateConfig::default()).unwrap_err();
    assert_eq!(e, ErrorCode::NoAvailableHandle);
    // With the watermark off it fits.
    let off = Harness::new(MasterConfig { eviction_high_watermark: 1.0, ..MasterConfig::default() }, 1, 64 * MIB);
    off.put("big", 60 * MIB);
}

#[test]
fn a_failed_allocation_evicts_the_oldest_hole_and_its_object_survives_the_next_round() {
    let h = Harness::new(MasterConfig::default(), 1, 64 * MIB);
    let keys = cache_of_54(&h);
    h.put("big", 50 * MIB);
    // The objects lie in write order; 50 contiguous MiB: the 50 oldest (a hole at the free tail would take the
    // 4 newest too). That also brings 104 MiB to 54, under the watermark less one ratio (54.4 MiB).
    let left = alive(&h, &keys);
    assert!(left[..50].iter().all(|x| !x) && left[50..].iter().all(|x| *x), "{left:?}");
    assert_eq!(evicted(&h), 50);
    // The next step sees 57/64 < 0.90: no round, and the new object is readable.
    assert!(!h.svc.step_eviction().ran);
    assert_eq!(h.get("big").unwrap().size, 50 * MIB);
}

#[test]
fn a_failed_allocation_that_cannot_make_room_evicts_nothing() {
    let h = Harness::new(MasterConfig::default(), 1, 64 * MIB);
    let keys = cache_of_54(&h);
    // Readers hold all but the 10 newest: 10 MiB free + 10 MiB evictable cannot hold 30 MiB.
    for k in &keys[..44] {
        h.get(k).unwrap();
    }
    for _ in 0..5 {
        let e = h.svc.put_start(h.writer, "", "mid", 30 * MIB, &ReplicateConfig::default()).unwrap_err();
        assert_eq!(e, ErrorCode::NoAvailableHandle);
    }
    assert_eq!(evicted(&h), 0);
    assert!(alive(&h, &keys).iter().all(|x| *x));
    // 12 MiB fits: a hole of the 2 newest and the free tail; then, to bring the pool to the watermark less one
    // ratio (0.85 × 64 = 54.4 MiB), 54 + 12 − 54.4 = 11.6 MiB would go: as much as readers allow, the other 8.
    h.put("fits", 12 * MIB);
    assert_eq!(evicted(&h), 10);
    assert!(alive(&h, &keys)[..44].iter().all(|x| *x), "leased objects stay");
}

#[test]
fn room_is_made_where_it_evicts_nothing_newer_than_it_must() {
    // Two 8 MiB segments: seg0 holds 7 older × 1 MiB (1 free), seg1 4 newer × 1 MiB (4 free). A 6 MiB hole
    // takes seg1's 2 newest, or on seg0 a0..a5 or a2..a6: a0..a5, none newer than a5, all older than seg1's.
    let off = MasterConfig { eviction_high_watermark: 1.0, ..MasterConfig::default() };
    let h = Harness::new(off, 2, 8 * MIB);
    let on =
        |seg: usize| ReplicateConfig { preferred_segments: vec![format!("seg{seg}")], ..ReplicateConfig::default() };
    let a = names("a", 7);
    let b = names("b", 4);
    for (k, seg) in a.iter().map(|k| (k, 0)).chain(b.iter().map(|k| (k, 1))) {
        h.put_in("", k, MIB, &on(seg)).unwrap();
        h.advance(Duration::from_millis(1));
    }
    h.put("six", 6 * MIB);
    assert_eq!(alive(&h, &a), [false, false, false, false, false, false, true]);
    assert!(alive(&h, &b).iter().all(|x| *x));
    // A reader on a4 makes seg0's hole impossible: seg1's 2 newest go instead.
    let h2 = Harness::new(MasterConfig { eviction_high_watermark: 1.0, ..MasterConfig::default() }, 2, 8 * MIB);
    for (k, seg) in a.iter().map(|k| (k, 0)).chain(b.iter().map(|k| (k, 1))) {
        h2.put_in("", k, MIB, &on(seg)).unwrap();
        h2.advance(Duration::from_millis(1));
    }
    h2.get(&a[4]).unwrap();
    h2.put("six", 6 * MIB);
    assert!(alive(&h2, &a).iter().all(|x| *x));
    assert_eq!(alive(&h2, &b), [true, true, false, false]);
}

/// A harness with one 64 MiB memory segment and one NoF segment of `nof` bytes.
fn with_nof(config: MasterConfig, nof: u64) -> Harness {
    let h = Harness::new(config, 1, 64 * MIB);
    let mut s = spec("nof0", nof);
    s.kind = SegmentKind::Nof;
    h.svc.mount_segment(ClientId::random(), s).unwrap();
    h
}

fn nof_replicas(h: &Harness, k: &str) -> usize {
    let r = h.svc.stat("", k).unwrap();
    r.replicas.iter().filter(|d| matches!(d.location, ReplicaLocation::Nof { .. })).count()
}

#[test]
fn nof_segments_are_evicted_on_their_own_pressure_keeping_memory_replicas() {
    let h = with_nof(MasterConfig::default(), MIB);
    let both = ReplicateConfig { nof_replica_num: 1, ..ReplicateConfig::default() };
    let nof_only = ReplicateConfig { replica_num: 0, nof_replica_num: 1, ..ReplicateConfig::default() };
    let (dual, single) = (names("d", 480), names("n", 460));
    put_aged(&h, &dual, &both);
    put_aged(&h, &single, &nof_only);
    let step = h.svc.step_eviction();
    assert!(!step.ran, "memory is far below its watermark");
    let m = h.svc.metrics();
    let evicted = m.evicted_nof_objects.load(Ordering::Relaxed);
    // 940 KiB of 1 MiB is above the 90 % watermark: the NoF round takes the oldest objects' NoF replicas.
    assert!(evicted > 0, "the NoF tier was evicted");
    assert_eq!(m.evicted_nof_bytes.load(Ordering::Relaxed), evicted * KIB);
    let gone = evicted as usize;
    for k in &dual[..gone] {
        assert!(probe(&h, k), "{k} keeps its memory replica");
        assert_eq!(nof_replicas(&h, k), 0, "{k} lost its NoF replica");
    }
    assert!(dual[gone..].iter().all(|k| nof_replicas(&h, k) == 1));
    assert!(alive(&h, &single).iter().all(|x| *x), "newer NoF-only objects are kept");
    // A NoF-only object whose replica is evicted is gone.
    let r = h.svc.evict_in(Tier::Nof, EvictionScope::All, frac(1.0, 1.0));
    assert_eq!(r.objects, (dual.len() - gone + single.len()) as u64);
    assert!(alive(&h, &single).iter().all(|x| !x));
    assert!(alive(&h, &dual).iter().all(|x| *x), "memory replicas are not the NoF tier's to take");
}

#[test]
fn a_full_nof_segment_makes_room_for_a_new_nof_write() {
    let config = MasterConfig { eviction_high_watermark: 1.0, ..MasterConfig::default() };
    let h = with_nof(config, 64 * KIB);
    let nof_only = ReplicateConfig { replica_num: 0, nof_replica_num: 1, ..ReplicateConfig::default() };
    let keys = names("n", 64);
    put_aged(&h, &keys, &nof_only);
    let next = h.put_in("", "new", KIB, &nof_only);
    assert!(next.is_ok(), "the oldest NoF object makes room: {next:?}");
    let a = alive(&h, &keys);
    assert!(!a[0] && a[1..].iter().all(|x| *x), "only the oldest was evicted: {a:?}");
    assert_eq!(h.svc.metrics().evicted_nof_objects.load(Ordering::Relaxed), 1);
}
