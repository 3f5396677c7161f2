//! Concurrency stress: writers, readers, removers, eviction, unmount/remount and the clock race over shared
//! and distinct keys; afterwards the accounting owners must agree exactly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::clock::Clock;
use crescent_master::eviction::{EvictionScope, EvictionTarget};
use crescent_master::service::MasterConfig;
use crescent_proto::{ClientId, ErrorCode, ReplicateConfig, SegmentKind, SoftPinAction};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const TENANTS: [&str; 2] = ["a", "b"];
/// A tenant deleted and re-created throughout the run.
const CHURNED: &str = "c";

#[test]
fn concurrent_operations_keep_every_invariant() {
    let config = MasterConfig { enable_multi_tenants: true, ..MasterConfig::default() };
    let h = Harness::new(config, 0, 0);
    let stable = ClientId::random();
    let mut stable_ids = vec![];
    for name in ["stable0", "stable1"] {
        let sp = spec(name, 4 * MIB);
        stable_ids.push(sp.id);
        h.svc.mount_segment(stable, sp).unwrap();
    }
    let stable_ids = &stable_ids;
    for t in TENANTS.into_iter().chain([CHURNED]) {
        h.svc.upsert_tenant_quota(t, 1 << 40).unwrap();
    }
    let owned_ok = AtomicU64::new(0);
    let (leased_reads, churn_deletes) = (AtomicU64::new(0), AtomicU64::new(0));
    // Fixed operation counts per thread (no time-based stopping): the threads overlap for the whole run.
    let iterations: u64 = 3000;
    let ops: u64 = 6000;
    std::thread::scope(|s| {
        // Writers on shared keys (put and upsert, 1–2 replicas, varying sizes).
        for w in 0..2u64 {
            let h = &h;
            s.spawn(move || {
                let client = ClientId::random();
                let mut rng = fastrand::Rng::with_seed(w);
                for _ in 0..ops {
                    let tenant = TENANTS[rng.usize(..2)];
                    let key = format!("s{}", rng.u32(..300));
                    let size = 1 + rng.u64(..64 * 1024);
                    let mut cfg = ReplicateConfig::with_replicas(1 + rng.u32(..2));
                    match rng.u8(..6) {
                        // Keys s0..s9 and s10..s19 always belong to groups g2 and g0 (membership is immutable).
                        _ if key.len() == 2 || key.starts_with("s1") && key.len() == 3 => {
                            cfg.group_id = Some(format!("g{}", key.len() % 3));
                        }
                        0 => {
                            cfg.soft_pin_action = SoftPinAction::Enable;
                            cfg.soft_pin_ttl_ms = Some(1_500);
                        }
                        1 => cfg.with_hard_pin = true,
                        _ => {}
                    }
                    let started = if rng.bool() {
                        h.svc.put_start(client, tenant, &key, size, &cfg)
                    } else {
                        h.svc.upsert_start(client, tenant, &key, size, &cfg)
                    };
                    if started.is_ok() {
                        if rng.u8(..10) == 0 {
                            let _ = h.svc.put_revoke(client, tenant, &key);
                        } else {
                            let _ = h.svc.put_end(client, tenant, &key, Some(size));
                        }
                    }
                }
            });
        }
        // Readers and removers on the same keys.
        {
            let h = &h;
            s.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(7);
                for _ in 0..ops {
                    let tenant = TENANTS[rng.usize(..2)];
                    let key = format!("s{}", rng.u32(..300));
                    match rng.u8(..4) {
                        0 => drop(h.svc.remove(tenant, &key, rng.bool())),
                        1 => drop(h.svc.exist_key(tenant, &key)),
                        _ => {
                            if let Ok(r) = h.svc.get_replica_list(tenant, &key) {
                                assert!(!r.replicas.is_empty());
                                assert_eq!(r.checksum, Some(r.size), "a reader sees one write's size and checksum");
                            }
                        }
                    }
                }
            });
        }
        // Eviction, discards and time.
        {
            let h = &h;
            s.spawn(move || {
                for _ in 0..ops / 20 {
                    h.svc.step_eviction();
                    h.svc.evict(EvictionScope::All, EvictionTarget::Fraction { target: 0.1, lower: 0.05 });
                    h.advance(Duration::from_millis(700));
                    h.svc.step_discards();
                    std::thread::yield_now();
                }
            });
        }
        // A node that keeps coming and going: unmounted at once, gracefully, or remounted after the master
        // forgot it.
        {
            let h = &h;
            s.spawn(move || {
                let c = ClientId::random();
                for i in 0..ops / 10 {
                    let sp = spec("churn", 2 * MIB);
                    let id = sp.id;
                    h.svc.mount_segment(c, sp.clone()).unwrap();
                    std::thread::yield_now();
                    match i % 3 {
                        0 => h.svc.unmount_segment(id).unwrap(),
                        1 => {
                            h.svc.graceful_unmount_segment(id, c, Duration::from_millis(300)).unwrap();
                            std::thread::yield_now();
                            // The clock thread may or may not have passed the grace: either way it goes.
                            h.svc.step_graceful_unmounts();
                            h.svc.unmount_segment(id).unwrap();
                        }
                        _ => {
                            h.svc.remount_segments(c, &[sp]).unwrap();
                            h.svc.unmount_segment(id).unwrap();
                        }
                    }
                }
            });
        }
        // A tenant deleted and re-created while a writer uses it.
        {
            let (h, churn_deletes) = (&h, &churn_deletes);
            s.spawn(move || {
                let client = ClientId::random();
                for i in 0..ops / 2 {
                    let key = format!("c{}", i % 3);
                    if h.svc.put_start(client, CHURNED, &key, 1024, &ReplicateConfig::default()).is_ok() {
                        let _ = h.svc.put_end(client, CHURNED, &key, Some(1024));
                        let _ = h.svc.remove(CHURNED, &key, true);
                    }
                    if i % 4 == 0 && h.svc.delete_tenant_quota(CHURNED).is_ok() {
                        churn_deletes.fetch_add(1, Ordering::Relaxed);
                        h.svc.upsert_tenant_quota(CHURNED, 1 << 40).unwrap();
                    }
                }
            });
        }
        // A reader of keys nobody removes: what it holds a lease on is never evicted before the lease ends.
        {
            let (h, leased_reads) = (&h, &leased_reads);
            s.spawn(move || {
                let client = ClientId::random();
                let ttl = Duration::from_millis(MasterConfig::default().lease_ttl_ms);
                for i in 0..ops / 2 {
                    let key = format!("l{}", i % 50);
                    if h.svc.exist_key("b", &key) != Ok(true) {
                        if h.svc.put_start(client, "b", &key, 2048, &ReplicateConfig::default()).is_ok() {
                            let _ = h.svc.put_end(client, "b", &key, Some(2048));
                        }
                        continue;
                    }
                    let before = h.clock.now();
                    if let Ok(r) = h.svc.get_replica_list("b", &key) {
                        leased_reads.fetch_add(1, Ordering::Relaxed);
                        let gone = h.svc.exist_key("b", &key) == Ok(false);
                        let lease_end = before.saturating_add(ttl);
                        assert!(!r.replicas.is_empty(), "{key} was found with no readable replica");
                        // A lease keeps an object from eviction and removal, not from its node leaving.
                        let on_churned_node = r
                            .replicas
                            .iter()
                            .any(|d| d.location.segment_id().is_some_and(|id| !stable_ids.contains(&id)));
                        assert!(
                            !gone || on_churned_node || h.clock.now() >= lease_end,
                            "{key} was evicted under its lease"
                        );
                    }
                }
            });
        }
        // An owner of hard-pinned keys nobody else touches: its objects must never be lost or deleted by
        // stale work, however often they are re-created.
        {
            let (h, owned_ok) = (&h, &owned_ok);
            s.spawn(move || {
                let client = ClientId::random();
                let cfg = ReplicateConfig {
                    with_hard_pin: true,
                    preferred_segments: vec!["stable0".into(), "stable1".into()],
                    ..ReplicateConfig::with_replicas(2)
                };
                for i in 0..iterations {
                    let key = format!("own{}", i % 20);
                    match h.svc.put_start(client, "a", &key, 512, &cfg) {
                        Ok(_) => {
                            h.svc.put_end(client, "a", &key, Some(512)).unwrap();
                            assert!(h.svc.get_replica_list("a", &key).is_ok(), "re-created {key} vanished");
                            owned_ok.fetch_add(1, Ordering::Relaxed);
                            if i % 3 != 0 {
                                h.svc.remove("a", &key, true).unwrap();
                            }
                        }
                        Err(ErrorCode::ObjectAlreadyExists) => {}
                        // The other writers share tenant a's quota (and node churn scales it down): a refusal
                        // for want of quota loses nothing; what this thread checks is that nothing it made is lost.
                        Err(ErrorCode::TenantQuotaExceeded) => {}
                        Err(e) => panic!("owner put failed: {e}"),
                    }
                }
            });
        }
    });
    assert!(owned_ok.load(Ordering::Relaxed) > 0);
    assert!(leased_reads.load(Ordering::Relaxed) > 0, "the lease reader took part");
    assert!(churn_deletes.load(Ordering::Relaxed) > 0, "the tenant was deleted and re-created mid-run");
    let m = h.svc.metrics();
    assert!(m.evicted_objects.load(Ordering::Relaxed) > 0, "eviction took part");
    assert!(m.put_end.requests.load(Ordering::Relaxed) > 1000, "writers took part");

    // Quiescent: release what is waiting for a time, then every owner must agree.
    h.advance(Duration::from_secs(700));
    h.svc.step_discards();
    assert_eq!(h.svc.discarded_bytes(), 0);
    let audit = h.svc.audit();
    assert_eq!(audit.duplicate_keys, 0);
    assert_eq!(audit.not_active, 0);
    assert_eq!(audit.overlapping_replicas, 0, "no two replicas share bytes");
    assert!(audit.quota_mismatches.is_empty(), "{:?}", audit.quota_mismatches);
    let pool = h.svc.pool().usage(SegmentKind::Memory);
    assert_eq!(pool.used, audit.replica_bytes, "allocator used bytes = Σ live replica bytes");
    for i in 0..20 {
        let key = format!("own{i}");
        let expect_present = (0..iterations).rev().find(|j| j % 20 == i).is_some_and(|j| j % 3 == 0);
        if expect_present {
            assert!(h.svc.get_replica_list("a", &key).is_ok(), "{key} lost");
        }
    }
    // Removing everything returns every byte and every quota charge.
    h.advance(Duration::from_secs(11));
    h.svc.remove_all(None, true).unwrap();
    let audit = h.svc.audit();
    assert_eq!((audit.objects, audit.replica_bytes), (0, 0));
    assert_eq!(h.svc.pool().usage(SegmentKind::Memory).used, 0);
    for t in TENANTS.into_iter().chain([CHURNED]) {
        assert_eq!(h.svc.tenant_quota(t).unwrap().charged_bytes, 0);
    }
}

/// The RFC's "colliding objects progress" gate: many threads on the same few keys (write, upsert, read,
/// remove) and every one of them keeps succeeding; nothing deadlocks (a watchdog bounds the run).
#[test]
fn threads_colliding_on_a_few_objects_all_make_progress() {
    let h = Harness::new(MasterConfig::default(), 2, 16 * MIB);
    const THREADS: u64 = 8;
    let progress: Vec<AtomicU64> = (0..THREADS).map(|_| AtomicU64::new(0)).collect();
    watchdog(Duration::from_secs(60), || {
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (h, done) = (&h, &progress[t as usize]);
                s.spawn(move || {
                    let client = ClientId::random();
                    let mut rng = fastrand::Rng::with_seed(100 + t);
                    for _ in 0..1500 {
                        let key = format!("hot{}", rng.u8(..3));
                        let ok = match rng.u8(..4) {
                            0 => h
                                .svc
                                .upsert_start(client, "", &key, 1 + rng.u64(..4096), &ReplicateConfig::default())
                                .and_then(|_| h.svc.upsert_end(client, "", &key, None))
                                .is_ok(),
                            1 => h.svc.remove("", &key, true).is_ok(),
                            _ => h.svc.get_replica_list("", &key).is_ok(),
                        };
                        if ok {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
    });
    for (t, p) in progress.iter().enumerate() {
        assert!(p.load(Ordering::Relaxed) > 0, "thread {t} made no progress");
    }
    h.advance(Duration::from_secs(700));
    h.svc.step_discards();
    let audit = h.svc.audit();
    assert_eq!((audit.duplicate_keys, audit.overlapping_replicas), (0, 0));
    assert_eq!(h.svc.pool().usage(SegmentKind::Memory).used, audit.replica_bytes);
}

/// Every path that takes a group lock, on the same groups at once: writes joining a group, reads refreshing
/// the members' leases (group, then each member), member removal (member, then group through matched unlink),
/// eviction of whole groups (group, then members in key order), regex removal. A lock-order mistake deadlocks:
/// the watchdog turns that into a failure.
#[test]
fn group_locks_taken_in_every_order_the_code_can_never_deadlock() {
    let h = Harness::new(MasterConfig::default(), 2, 16 * MIB);
    let joined = AtomicU64::new(0);
    watchdog(Duration::from_secs(60), || {
        std::thread::scope(|s| {
            for t in 0..6u64 {
                let (h, joined) = (&h, &joined);
                s.spawn(move || {
                    let client = ClientId::random();
                    let mut rng = fastrand::Rng::with_seed(200 + t);
                    for _ in 0..1500 {
                        let g = rng.u8(..2);
                        let key = format!("g{g}/m{}", rng.u8(..6));
                        let cfg = ReplicateConfig { group_id: Some(format!("g{g}")), ..ReplicateConfig::default() };
                        match (t + u64::from(rng.u8(..3))) % 5 {
                            0 => {
                                if h.svc.put_start(client, "", &key, 256, &cfg).is_ok()
                                    && h.svc.put_end(client, "", &key, None).is_ok()
                                {
                                    joined.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            1 => drop(h.svc.get_replica_list("", &key)),
                            2 => drop(h.svc.remove("", &key, rng.bool())),
                            3 => {
                                h.advance(Duration::from_millis(500));
                                h.svc.evict(EvictionScope::All, EvictionTarget::Fraction { target: 0.5, lower: 0.5 });
                            }
                            _ => drop(h.svc.remove_by_regex("", &format!("^g{g}/m[0-2]$"), true)),
                        }
                    }
                });
            }
        });
    });
    assert!(joined.load(Ordering::Relaxed) > 0, "members joined groups");
    assert!(h.svc.metrics().evicted_objects.load(Ordering::Relaxed) > 0, "groups were evicted");
    h.advance(Duration::from_secs(700));
    h.svc.step_discards();
    let audit = h.svc.audit();
    assert_eq!((audit.duplicate_keys, audit.not_active, audit.overlapping_replicas), (0, 0, 0));
    assert_eq!(h.svc.pool().usage(SegmentKind::Memory).used, audit.replica_bytes);
}

/// Runs `f`, failing the test if it has not returned within `limit` (a deadlock), instead of hanging.
fn watchdog(limit: Duration, f: impl FnOnce() + Send) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            f();
            let _ = tx.send(());
        });
        if rx.recv_timeout(limit).is_err() {
            eprintln!("no progress for {limit:?}: deadlock");
            std::process::abort();
        }
    });
}
