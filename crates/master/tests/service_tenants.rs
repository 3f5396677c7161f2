//! Tenants, quotas and groups: namespaces, orphans, quota limits and settlement, capacity changes, quota
//! eviction, group routing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::eviction::{EvictionScope, EvictionTarget};
use crescent_master::service::MasterConfig;
use crescent_proto::{ClientId, ErrorCode, ReplicateConfig, TenantId};
use std::collections::BTreeMap;
use std::sync::Barrier;
use std::time::Duration;

const KIB: u64 = 1024;

fn multi(n: usize, size: u64) -> Harness {
    Harness::new(MasterConfig { enable_multi_tenants: true, ..MasterConfig::default() }, n, size)
}

fn put(h: &Harness, tenant: &str, key: &str, size: u64) -> Result<(), ErrorCode> {
    h.put_in(tenant, key, size, &ReplicateConfig::default()).map(|_| ())
}

// Tenants collapse.
#[test]
fn single_tenant_mode_ignores_the_tenant() {
    let h = Harness::default3();
    put(&h, "tenant-a", "k", 10).unwrap();
    assert_eq!(put(&h, "tenant-b", "k", 10).unwrap_err(), ErrorCode::ObjectAlreadyExists);
    assert!(h.svc.get_replica_list("_invalid", "k").is_ok(), "even an invalid tenant collapses to default");
    assert!(h.svc.tenant_quotas().is_none());
    assert_eq!(h.svc.upsert_tenant_quota("a", 10).unwrap_err(), ErrorCode::UnavailableInCurrentMode);
}

/// No tenant named is `default`, for writes as for reads, once `default` is registered.
#[test]
fn no_tenant_is_the_default_tenant_on_a_multi_tenant_master() {
    let h = multi(2, 64 * MIB);
    h.svc.upsert_tenant_quota("default", 10 * MIB).unwrap();
    put(&h, "", "k", 10).unwrap();
    assert_eq!(put(&h, "default", "k", 10).unwrap_err(), ErrorCode::ObjectAlreadyExists, "one namespace");
    assert_eq!(h.svc.get_replica_list("default", "k").unwrap().size, 10);
    put(&h, "default", "k2", 20).unwrap();
    assert_eq!(h.svc.get_replica_list("", "k2").unwrap().size, 20);
    assert_eq!(h.svc.list_keys("", "", 10).unwrap(), vec!["k".to_string(), "k2".to_string()]);
}

#[test]
fn tenants_are_namespaces_and_writes_need_registration() {
    let h = multi(2, 64 * MIB);
    assert_eq!(put(&h, "a", "k", 10).unwrap_err(), ErrorCode::TenantNotRegistered);
    assert_eq!(put(&h, "", "k", 10).unwrap_err(), ErrorCode::TenantNotRegistered);
    assert_eq!(put(&h, "default", "k", 10).unwrap_err(), ErrorCode::TenantNotRegistered);
    assert_eq!(h.used(), 0, "refused before any allocation");
    assert_eq!(h.svc.get_replica_list("_bad", "k").unwrap_err(), ErrorCode::InvalidParams);
    assert_eq!(h.svc.exist_key("unknown", "k"), Ok(false));
    h.svc.upsert_tenant_quota("a", 10 * MIB).unwrap();
    h.svc.upsert_tenant_quota("b", 10 * MIB).unwrap();
    put(&h, "a", "k", 10).unwrap();
    put(&h, "b", "k", 20).unwrap();
    put(&h, "a", "x/1", 10).unwrap();
    put(&h, "b", "x/1", 10).unwrap();
    assert_eq!(h.svc.get_replica_list("a", "k").unwrap().size, 10);
    assert_eq!(h.svc.get_replica_list("b", "k").unwrap().size, 20);
    h.advance(Duration::from_secs(11));
    h.svc.remove("a", "k", false).unwrap();
    assert!(h.svc.get_replica_list("b", "k").is_ok());
    assert_eq!(h.svc.remove_by_regex("a", "x/", false), Ok(1));
    assert_eq!(h.svc.list_keys("b", "", 10).unwrap(), vec!["k".to_string(), "x/1".to_string()]);
    h.advance(Duration::from_secs(11)); // the read of b/k above leased it
    assert_eq!(h.svc.remove_all(Some("b"), false), Ok(2));
    assert_eq!(h.svc.remove_all(Some("_bad"), false), Ok(0));
    assert_eq!(h.svc.tenant_quota("a").unwrap().charged_bytes, 0);
}

// Objects of a removed tenant.
#[test]
fn orphan_tenants_stay_readable_and_removable_but_not_writable() {
    let h = multi(1, 64 * MIB);
    h.svc.upsert_tenant_quota("a", MIB).unwrap();
    h.svc.upsert_tenant_quota("b", MIB).unwrap();
    put(&h, "b", "k", 100).unwrap();
    h.svc.apply_tenant_policies(&BTreeMap::from([("a".to_string(), MIB)])).unwrap();
    let snap = h.svc.tenant_quota("b").unwrap();
    assert!(snap.admission_closed && !snap.has_explicit_policy && snap.over_quota);
    assert_eq!((snap.requested_quota_bytes, snap.effective_quota_bytes, snap.charged_bytes), (0, 0, 100));
    assert!(h.svc.get_replica_list("b", "k").is_ok());
    assert_eq!(put(&h, "b", "k2", 1).unwrap_err(), ErrorCode::TenantNotRegistered);
    h.advance(Duration::from_secs(11));
    h.svc.remove("b", "k", false).unwrap();
    assert_eq!(h.svc.tenant_quota("b").map(|s| s.charged_bytes), None, "drained orphan disappears from snapshots");
}

// Quota limit, settlement, conservation.
#[test]
fn quota_is_charged_per_memory_replica_and_settled_at_put_end() {
    let h = multi(3, 64 * MIB);
    h.svc.upsert_tenant_quota("a", 1000).unwrap();
    let two = ReplicateConfig::with_replicas(2);
    h.svc.put_start(h.writer, "a", "k", 100, &two).unwrap();
    assert_eq!(h.svc.tenant_quota("a").unwrap().charged_bytes, 200, "requested size × replicas at start");
    h.svc.put_end(h.writer, "a", "k", None).unwrap();
    assert_eq!(h.svc.tenant_quota("a").unwrap().charged_bytes, 200);
    // Best-effort placement: 5 requested, 3 placed → settled to 3 replicas.
    h.svc.put_start(h.writer, "a", "five", 100, &ReplicateConfig::with_replicas(5)).unwrap();
    assert_eq!(h.svc.tenant_quota("a").unwrap().charged_bytes, 700);
    h.svc.put_end(h.writer, "a", "five", None).unwrap();
    assert_eq!(h.svc.tenant_quota("a").unwrap().charged_bytes, 500);
    // Over quota, nothing evictable (all leased): refused after the eviction retries, charge unchanged.
    h.svc.get_replica_list("a", "k").unwrap();
    h.svc.get_replica_list("a", "five").unwrap();
    let e = h.svc.put_start(h.writer, "a", "big", 600, &ReplicateConfig::default()).unwrap_err();
    assert_eq!(e, ErrorCode::TenantQuotaExceeded);
    assert_eq!(h.svc.tenant_quota("a").unwrap().charged_bytes, 500);
    // Revoke refunds, removal releases.
    h.svc.put_start(h.writer, "a", "r", 100, &ReplicateConfig::default()).unwrap();
    h.svc.put_revoke(h.writer, "a", "r").unwrap();
    assert_eq!(h.svc.tenant_quota("a").unwrap().charged_bytes, 500);
    h.svc.remove("a", "k", true).unwrap();
    h.svc.remove("a", "five", true).unwrap();
    assert_eq!(h.svc.tenant_quota("a").unwrap().charged_bytes, 0);
    // Deleting a policy with objects is refused; an empty tenant can be deleted.
    put(&h, "a", "z", 1).unwrap();
    assert_eq!(h.svc.delete_tenant_quota("a").unwrap_err(), ErrorCode::TenantNotEmpty);
    h.svc.remove("a", "z", false).unwrap();
    h.svc.delete_tenant_quota("a").unwrap();
    assert_eq!(h.svc.delete_tenant_quota("a").unwrap_err(), ErrorCode::ObjectNotFound);
    assert_eq!(put(&h, "a", "z", 1).unwrap_err(), ErrorCode::TenantNotRegistered);
}

// Through the master: capacity changes rescale effective quotas.
#[test]
fn effective_quotas_follow_mounted_capacity() {
    let h = multi(1, 300);
    h.svc.upsert_tenant_quota("a", 200).unwrap();
    h.svc.upsert_tenant_quota("b", 400).unwrap();
    assert_eq!(h.svc.tenant_quota("a").unwrap().effective_quota_bytes, 100);
    assert_eq!(h.svc.tenant_quota("b").unwrap().effective_quota_bytes, 200);
    let c = ClientId::random();
    h.svc.mount_segment(c, spec("more", 300)).unwrap();
    assert_eq!(h.svc.tenant_quota("a").unwrap().effective_quota_bytes, 200);
    assert_eq!(h.svc.tenant_quota("b").unwrap().effective_quota_bytes, 400);
    assert_eq!(h.svc.upsert_tenant_quota("_x", 1).unwrap_err(), ErrorCode::InvalidParams);
    assert_eq!(h.svc.upsert_tenant_quota("a", 0).unwrap_err(), ErrorCode::InvalidParams);
}

// Quota eviction stays inside the tenant.
#[test]
fn quota_triggered_eviction_takes_only_the_tenants_own_objects() {
    let h = multi(1, 64 * MIB);
    h.svc.upsert_tenant_quota("a", 2 * KIB).unwrap();
    h.svc.upsert_tenant_quota("b", 2 * KIB).unwrap();
    put(&h, "b", "old", KIB).unwrap();
    h.advance(Duration::from_millis(1));
    put(&h, "a", "a1", KIB).unwrap();
    h.advance(Duration::from_millis(1));
    put(&h, "a", "a2", KIB).unwrap();
    h.advance(Duration::from_millis(1));
    put(&h, "a", "a3", KIB).unwrap();
    assert!(h.svc.get_replica_list("a", "a1").is_err(), "the tenant's oldest made room");
    assert!(h.svc.get_replica_list("a", "a2").is_ok() && h.svc.get_replica_list("a", "a3").is_ok());
    assert!(h.svc.get_replica_list("b", "old").is_ok(), "other tenants are untouched");
    assert_eq!(h.svc.tenant_quota("b").unwrap().charged_bytes, KIB);
    assert_eq!(h.svc.tenant_quota("a").unwrap().charged_bytes, 2 * KIB);
}

// Global eviction is tenant-blind in selection but releases each object's bytes to its own tenant.
#[test]
fn global_eviction_releases_each_tenants_own_charge() {
    let h = multi(1, 64 * MIB);
    h.svc.upsert_tenant_quota("a", MIB).unwrap();
    h.svc.upsert_tenant_quota("b", MIB).unwrap();
    put(&h, "a", "k", KIB).unwrap();
    h.advance(Duration::from_millis(1));
    put(&h, "b", "k", KIB).unwrap();
    let r = h.svc.evict(EvictionScope::All, EvictionTarget::Fraction { target: 0.5, lower: 0.5 });
    assert_eq!(r.objects, 1);
    assert!(h.svc.get_replica_list("a", "k").is_err() && h.svc.get_replica_list("b", "k").is_ok());
    assert_eq!(h.svc.tenant_quota("a").unwrap().charged_bytes, 0);
    assert_eq!(h.svc.tenant_quota("b").unwrap().charged_bytes, KIB);
}

fn group(g: &str) -> ReplicateConfig {
    ReplicateConfig { group_id: Some(g.to_string()), ..ReplicateConfig::default() }
}

// Routing, immutability, matched unlink.
#[test]
fn grouped_objects_are_found_by_key_and_membership_is_immutable() {
    let h = Harness::default3();
    h.put_in("", "m", 10, &group("G")).unwrap();
    assert!(h.get("m").is_ok() && h.svc.exist_key("", "m").unwrap());
    h.advance(Duration::from_secs(11));
    for bad in [group("H"), group("")] {
        assert_eq!(h.svc.upsert_start(h.writer, "", "m", 10, &bad).unwrap_err(), ErrorCode::InvalidParams);
    }
    // Unset keeps the group; the same group is fine.
    h.svc.upsert_start(h.writer, "", "m", 10, &ReplicateConfig::default()).unwrap();
    h.svc.upsert_end(h.writer, "", "m", None).unwrap();
    h.svc.upsert_start(h.writer, "", "m", 10, &group("G")).unwrap();
    h.svc.upsert_end(h.writer, "", "m", None).unwrap();
    h.put("plain", 10);
    assert_eq!(h.svc.upsert_start(h.writer, "", "plain", 10, &group("G")).unwrap_err(), ErrorCode::InvalidParams);
    // After removal the key can be re-created ungrouped.
    h.svc.remove("", "m", false).unwrap();
    h.put("m", 10);
    assert!(h.get("m").is_ok());
    // An expired unfinished grouped write can be replaced by an ungrouped put.
    h.svc.put_start(ClientId::random(), "", "half", 10, &group("G")).unwrap();
    h.advance(Duration::from_secs(30));
    h.put("half", 10);
}

#[test]
fn concurrent_first_creates_yield_exactly_one_object() {
    for mix in 0..3 {
        let h = Harness::default3();
        let barrier = Barrier::new(16);
        let wins = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..16 {
                let (h, barrier, wins) = (&h, &barrier, &wins);
                s.spawn(move || {
                    let cfg = match (mix, t % 2) {
                        (0, 0) => group("G"),
                        (0, _) => ReplicateConfig::default(),
                        (1, 0) => group("G1"),
                        (1, _) => group("G2"),
                        _ => ReplicateConfig::default(),
                    };
                    barrier.wait();
                    if h.svc.put_start(h.writer, "", "race", 64, &cfg).is_ok() {
                        wins.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(wins.into_inner(), 1, "mix {mix}");
        assert_eq!(h.svc.key_count(Some(&TenantId::default())), 1);
        assert_eq!(h.used(), 64, "losers freed their buffers");
    }
}

/// Writers race deletes and re-creations of their tenant: a write that resolved the tenant before a delete
/// must either finish before the delete looks at the tenant (which then stays) or be refused; nothing is
/// published into a tenant no longer registered. Afterwards the allocator holds exactly the live replicas'
/// bytes and every quota account holds exactly its objects' charges. (A free-running race; the exact
/// interleaving is replayed deterministically by `service::tenants::teardown_tests`.)
#[test]
fn writers_racing_a_delete_and_recreate_of_their_tenant_leak_nothing() {
    let h = multi(2, 64 * MIB);
    h.svc.upsert_tenant_quota("t", 32 * MIB).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (deleted, published) = (std::sync::atomic::AtomicU64::new(0), std::sync::atomic::AtomicU64::new(0));
    std::thread::scope(|s| {
        for w in 0..6 {
            let (h, stop, published) = (&h, &stop, &published);
            s.spawn(move || {
                let writer = ClientId::random();
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    let key = format!("w{w}-{}", i % 4);
                    if h.svc.put_start(writer, "t", &key, KIB, &ReplicateConfig::default()).is_ok()
                        && h.svc.put_end(writer, "t", &key, None).is_ok()
                    {
                        published.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let _ = h.svc.remove("t", &key, true);
                    }
                    // Leave the tenant empty now and then, so deletes can succeed mid-race.
                    std::thread::yield_now();
                }
            });
        }
        let (h, deleted, stop) = (&h, &deleted, &stop);
        s.spawn(move || {
            for _ in 0..5_000 {
                if h.svc.delete_tenant_quota("t").is_ok() {
                    deleted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                h.svc.upsert_tenant_quota("t", 32 * MIB).unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    });
    let (deleted, published) = (deleted.into_inner(), published.into_inner());
    assert!(deleted > 0 && published > 0, "the race ran: {deleted} deletes, {published} writes");
    let audit = h.svc.audit();
    assert!(audit.quota_mismatches.is_empty(), "{audit:?}");
    assert_eq!(h.used(), audit.replica_bytes, "every allocated byte belongs to a reachable object: {audit:?}");
}

#[test]
fn a_group_is_erased_whole_or_not_at_all() {
    let h = Harness::default3();
    let g = ReplicateConfig { group_id: Some("G".into()), ..ReplicateConfig::default() };
    for k in ["a", "b", "c"] {
        h.put_in("", k, 10 * KIB, &g).unwrap();
    }
    put(&h, "", "solo", 10 * KIB).unwrap();
    assert_eq!(h.svc.group_members("", "G").unwrap(), ["a", "b", "c"]);
    // A reader of one member leases the group: the erase refuses and removes nothing.
    h.svc.get_replica_list("", "b").unwrap();
    assert_eq!(h.svc.remove_group("", "G", false), Err(ErrorCode::ObjectHasLease));
    assert_eq!(h.svc.group_members("", "G").unwrap().len(), 3);
    assert_eq!(h.svc.remove_group("", "G", true), Ok(3));
    for k in ["a", "b", "c"] {
        assert_eq!(h.svc.get_replica_list("", k).unwrap_err(), ErrorCode::ObjectNotFound);
    }
    assert_eq!(h.svc.group_members("", "G"), Err(ErrorCode::ObjectNotFound), "the group left the catalog");
    assert_eq!(h.svc.remove_group("", "G", true), Err(ErrorCode::ObjectNotFound));
    assert!(h.svc.get_replica_list("", "solo").is_ok(), "others stay");
    assert_eq!(h.used(), 10 * KIB, "the members' bytes came back");
    // The name can be used again: a new group.
    h.put_in("", "a", KIB, &g).unwrap();
    assert_eq!(h.svc.group_members("", "G").unwrap(), ["a"]);
    let audit = h.svc.audit();
    assert_eq!((audit.objects, audit.not_active, audit.overlapping_replicas), (2, 0, 0));
}

#[test]
fn leaving_a_large_group_does_not_disturb_the_rest() {
    let h = Harness::default3();
    let g = ReplicateConfig { group_id: Some("big".into()), ..ReplicateConfig::default() };
    let keys: Vec<String> = (0..2000).map(|i| format!("m{i:04}")).collect();
    for k in &keys {
        h.put_in("", k, 64, &g).unwrap();
    }
    for k in keys.iter().step_by(2) {
        h.svc.remove("", k, true).unwrap();
    }
    let left = h.svc.group_members("", "big").unwrap();
    assert_eq!(left.len(), 1000);
    assert!(left.iter().all(|k| k[1..].parse::<u32>().unwrap() % 2 == 1));
}

// Administration: the listing operators and the CLI read.
#[test]
fn list_tenants_reports_quotas_charges_and_object_counts() {
    let h = multi(2, 64 * MIB);
    h.svc.upsert_tenant_quota("a", 10 * MIB).unwrap();
    h.svc.upsert_tenant_quota("b", 20 * MIB).unwrap();
    put(&h, "a", "k1", 4 * KIB).unwrap();
    put(&h, "a", "k2", 4 * KIB).unwrap();
    let list = h.svc.list_tenants().unwrap();
    let names: Vec<&str> = list.iter().map(|t| t.tenant.as_str()).collect();
    assert_eq!(names, ["a", "b"], "sorted by id");
    let a = &list[0];
    assert_eq!((a.requested_quota, a.objects, a.has_policy, a.admission_closed), (10 * MIB, 2, true, false));
    assert!(a.charged >= 8 * KIB, "{a:?}");
    assert!(a.effective_quota > 0 && !a.over_quota, "{a:?}");
    assert_eq!((list[1].objects, list[1].charged), (0, 0));
    // An orphan (its policy dropped by a reload) is still listed while it holds objects, closed to writes.
    h.svc.apply_tenant_policies(&BTreeMap::from([("b".to_string(), 20 * MIB)])).unwrap();
    let a = h.svc.list_tenants().unwrap().into_iter().find(|t| t.tenant == "a").unwrap();
    assert_eq!((a.has_policy, a.admission_closed, a.requested_quota, a.objects), (false, true, 0, 2));
    // Single-tenant mode has no tenants to list.
    assert_eq!(Harness::default3().svc.list_tenants().unwrap_err(), ErrorCode::UnavailableInCurrentMode);
}

#[test]
fn local_ssd_registrations_are_reachable_through_the_service() {
    let h = multi(1, 64 * MIB);
    let c = ClientId::random();
    assert_eq!(h.svc.report_local_ssd(c, 100).unwrap_err(), ErrorCode::SegmentNotFound);
    assert_eq!(h.svc.local_ssd_status(Some(c)).unwrap_err(), ErrorCode::SegmentNotFound);
    let before = h.svc.active_clients();
    h.svc.register_local_ssd(c, true).unwrap();
    assert_eq!(h.svc.active_clients(), before + 1, "the client joins the liveness monitor");
    assert_eq!(h.svc.register_local_ssd(c, false).unwrap_err(), ErrorCode::SegmentAlreadyExists);
    h.svc.report_local_ssd(c, 1 << 30).unwrap();
    assert_eq!(h.svc.report_local_ssd(c, u64::MAX).unwrap_err(), ErrorCode::InvalidParams);
    h.svc.set_local_ssd_offloading(c, false).unwrap();
    let s = h.svc.local_ssd_status(Some(c)).unwrap();
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].client, s[0].enable_offloading, s[0].total_capacity, s[0].used), (c, false, 1 << 30, 0));
    assert_eq!(h.svc.local_ssd_status(None).unwrap(), s);
    h.svc.unregister_local_ssd(c).unwrap();
    h.svc.unregister_local_ssd(c).unwrap();
    assert!(h.svc.local_ssd_status(None).unwrap().is_empty());
}
