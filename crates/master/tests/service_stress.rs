//! Concurrency stress: writers, readers, removers, eviction, unmount/remount and the clock race over shared
//! and distinct keys; afterwards the accounting owners must agree exactly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::eviction::{EvictionScope, EvictionTarget};
use crescent_master::service::MasterConfig;
use crescent_proto::{ClientId, ErrorCode, ReplicateConfig, SegmentKind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const TENANTS: [&str; 2] = ["a", "b"];

#[test]
fn concurrent_operations_keep_every_invariant() {
    let config = MasterConfig { enable_multi_tenants: true, ..MasterConfig::default() };
    let h = Harness::new(config, 0, 0);
    let stable = ClientId::random();
    for name in ["stable0", "stable1"] {
        h.svc.mount_segment(stable, spec(name, 4 * MIB)).unwrap();
    }
    for t in TENANTS {
        h.svc.upsert_tenant_quota(t, 1 << 40).unwrap();
    }
    let owned_ok = AtomicU64::new(0);
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
                    let cfg = ReplicateConfig::with_replicas(1 + rng.u32(..2));
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
        // A node that keeps coming and going.
        {
            let h = &h;
            s.spawn(move || {
                let c = ClientId::random();
                for _ in 0..ops / 10 {
                    let sp = spec("churn", 2 * MIB);
                    let id = sp.id;
                    h.svc.mount_segment(c, sp).unwrap();
                    std::thread::yield_now();
                    h.svc.unmount_segment(id).unwrap();
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
                        Err(e) => panic!("owner put failed: {e}"),
                    }
                }
            });
        }
    });
    assert!(owned_ok.load(Ordering::Relaxed) > 0);
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
    h.svc.remove_all(None, true);
    let audit = h.svc.audit();
    assert_eq!((audit.objects, audit.replica_bytes), (0, 0));
    assert_eq!(h.svc.pool().usage(SegmentKind::Memory).used, 0);
    for t in TENANTS {
        assert_eq!(h.svc.tenant_quota(t).unwrap().charged_bytes, 0);
    }
}
