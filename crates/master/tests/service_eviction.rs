//! Eviction: the watermark trigger and its target, leases and pins, groups evicted together, allocation and
//! quota triggers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::eviction::{EvictionScope, EvictionTarget};
use crescent_master::service::MasterConfig;
use crescent_proto::{ErrorCode, ReplicateConfig, SoftPinAction};
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
