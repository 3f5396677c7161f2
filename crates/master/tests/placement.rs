//! Replica placement: distinct names, preferences and exclusions, best effort, local-first, free-ratio-first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::placement::{
    PlacementError, PlacementPolicy, PlacementRequest, Placer, ReplicaPlacement, host_ordered_names,
};
use crescent_master::segment_pool::{AllocatedBuffer, SegmentPool};
use crescent_proto::SegmentKind;
use crescent_proto::{ClientId, ErrorCode, SegmentId};
use std::collections::HashSet;

fn names_of(pool: &SegmentPool, bufs: &[AllocatedBuffer]) -> Vec<String> {
    bufs.iter().map(|b| pool.segment(b.segment_id().unwrap()).unwrap().spec.name.clone()).collect()
}

fn placer(policy: PlacementPolicy) -> Placer {
    Placer::new(policy)
}

// Distinct placement, best effort.
#[test]
fn replicas_land_on_distinct_names_and_are_best_effort() {
    let p = pool();
    mount_n(&p, 20, 16 * MIB);
    let a = placer(PlacementPolicy::Random);
    let rp = ReplicaPlacement::new(&p, &a);
    for _ in 0..50 {
        let bufs = rp.place(&PlacementRequest::memory(4096, 10)).unwrap();
        let names: HashSet<_> = names_of(&p, &bufs).into_iter().collect();
        assert_eq!((bufs.len(), names.len()), (10, 10));
    }
    let p2 = pool();
    mount_n(&p2, 2, 16 * MIB);
    let rp2 = ReplicaPlacement::new(&p2, &a);
    assert_eq!(rp2.place(&PlacementRequest::memory(4096, 3)).unwrap().len(), 2, "min(n, #names)");
    let p1 = pool();
    mount_n(&p1, 1, 16 * MIB);
    assert_eq!(ReplicaPlacement::new(&p1, &a).place(&PlacementRequest::memory(4096, 2)).unwrap().len(), 1);
}

#[test]
fn segments_sharing_a_name_count_as_one_name() {
    let p = pool();
    let c = ClientId::random();
    let s1 = spec("same", 16 * MIB);
    let s2 = spec("same", 16 * MIB);
    p.mount(c, s1.clone()).unwrap();
    p.mount(c, s2.clone()).unwrap();
    let a = placer(PlacementPolicy::Random);
    let rp = ReplicaPlacement::new(&p, &a);
    assert_eq!(rp.place(&PlacementRequest::memory(4096, 2)).unwrap().len(), 1);
    // Both segments behind the name are used (random start among them).
    let mut seen = HashSet::new();
    let mut held = Vec::new();
    for _ in 0..64 {
        let b = rp.place(&PlacementRequest::memory(4096, 1)).unwrap().pop().unwrap();
        seen.insert(b.segment_id().unwrap());
        held.push(b);
    }
    assert_eq!(seen, HashSet::from([s1.id, s2.id]));
}

#[test]
fn fails_with_no_available_handle_only_when_nothing_fits() {
    let p = pool();
    let a = placer(PlacementPolicy::Random);
    let rp = ReplicaPlacement::new(&p, &a);
    assert_eq!(
        rp.place(&PlacementRequest::memory(1, 1)).unwrap_err(),
        PlacementError::NoAvailableHandle { eligible_names: 0 }
    );
    mount_n(&p, 2, MIB);
    assert_eq!(
        rp.place(&PlacementRequest::memory(2 * MIB, 1)).unwrap_err(),
        PlacementError::NoAvailableHandle { eligible_names: 2 }
    );
    assert_eq!(rp.place(&PlacementRequest::memory(0, 1)).unwrap_err().code(), ErrorCode::InvalidParams);
    assert_eq!(rp.place(&PlacementRequest::memory(1, 0)).unwrap_err().code(), ErrorCode::InvalidParams);
    // One segment full, the other not: a 2-replica request gets the one that fits.
    let _big = rp.allocate_from(SegmentKind::Memory, "seg0", MIB).unwrap();
    let got = rp.place(&PlacementRequest::memory(4096, 2)).unwrap();
    assert_eq!(names_of(&p, &got), vec!["seg1".to_string()]);
    assert_eq!(rp.allocate_from(SegmentKind::Memory, "nope", 1).unwrap_err().code(), ErrorCode::NoAvailableHandle);
}

// Preferred then fallback; exclusion wins.
#[test]
fn preferred_names_first_then_fallback_and_exclusions_win() {
    let p = pool();
    mount_n(&p, 4, MIB);
    let a = placer(PlacementPolicy::Random);
    let rp = ReplicaPlacement::new(&p, &a);
    let preferred = vec!["missing".to_string(), "seg2".to_string(), "seg1".to_string()];
    let mut req = PlacementRequest::memory(4096, 2);
    req.preferred = &preferred;
    for _ in 0..10 {
        let names = names_of(&p, &rp.place(&req).unwrap());
        assert_eq!(names, vec!["seg2".to_string(), "seg1".to_string()]);
    }
    let excluded = vec!["seg2".to_string()];
    req.excluded = &excluded;
    for _ in 0..10 {
        let names = names_of(&p, &rp.place(&req).unwrap());
        assert_eq!(names[0], "seg1");
        assert!(!names.contains(&"seg2".to_string()));
    }
    // A full preferred segment falls back to the others.
    let _fill = rp.allocate_from(SegmentKind::Memory, "seg1", MIB).unwrap();
    let names = names_of(&p, &rp.place(&req).unwrap());
    assert_eq!(names.len(), 2);
    assert!(!names.contains(&"seg1".to_string()) && !names.contains(&"seg2".to_string()));
    // Everything excluded: nothing is eligible.
    let all: Vec<String> = (0..4).map(|i| format!("seg{i}")).collect();
    req.excluded = &all;
    assert_eq!(rp.place(&req).unwrap_err(), PlacementError::NoAvailableHandle { eligible_names: 0 });
}

// Local-first ordering.
#[test]
fn local_first_orders_hosts_cyclically_and_rotates_names_by_key() {
    let p = pool();
    let c = ClientId::random();
    for (name, host) in [("a1", "h1"), ("a2", "h1"), ("b1", "h2"), ("c1", "h3"), ("c2", "h3")] {
        p.mount(c, spec_on(name, MIB, host)).unwrap();
    }
    let acc = p.placement_access();
    let order = |host: &str, hash: u64| -> Vec<String> {
        host_ordered_names(&acc, SegmentKind::Memory, host, hash).iter().map(|s| s.to_string()).collect()
    };
    assert_eq!(order("h2", 0), ["b1", "c1", "c2", "a1", "a2"]);
    assert_eq!(order("h1", 1), ["a2", "a1", "b1", "c2", "c1"]);
    assert_eq!(order("h0", 0), ["a1", "a2", "b1", "c1", "c2"], "unknown host starts at the next one");
    assert_eq!(order("h9", 0), ["a1", "a2", "b1", "c1", "c2"], "wraps to the first host");
    assert!(order("", 0).is_empty());
    drop(acc);

    let a = placer(PlacementPolicy::LocalFirst);
    let rp = ReplicaPlacement::new(&p, &a);
    let mut req = PlacementRequest::memory(4096, 1);
    req.writer_host = Some("h3");
    for key in 0..20u64 {
        req.key_hash = key;
        assert!(names_of(&p, &rp.place(&req).unwrap())[0].starts_with('c'));
    }
    // The local host full → the next host (wrapping past the last), its names rotated by the key.
    req.key_hash = 0;
    let _f1 = rp.allocate_from(SegmentKind::Memory, "c1", MIB).unwrap();
    let _f2 = rp.allocate_from(SegmentKind::Memory, "c2", MIB).unwrap();
    assert_eq!(names_of(&p, &rp.place(&req).unwrap()), ["a1"]);
    req.key_hash = 1;
    assert_eq!(names_of(&p, &rp.place(&req).unwrap()), ["a2"]);
    // Explicit preference overrides local-first.
    let preferred = vec!["b1".to_string()];
    req.preferred = &preferred;
    assert_eq!(names_of(&p, &rp.place(&req).unwrap()), ["b1"]);
    // prefer_same_node on the default policy behaves the same.
    let r = placer(PlacementPolicy::Random);
    let rp = ReplicaPlacement::new(&p, &r);
    let mut req = PlacementRequest::memory(4096, 1);
    req.writer_host = Some("h2");
    req.prefer_same_node = true;
    assert_eq!(names_of(&p, &rp.place(&req).unwrap()), ["b1"]);
}

// Free-ratio balancing on heterogeneous segments.
#[test]
fn free_ratio_first_keeps_utilisation_balanced() {
    let p = pool();
    let c = ClientId::random();
    let sizes = [64 * MIB, 128 * MIB, 256 * MIB, 512 * MIB];
    let ids: Vec<SegmentId> = sizes
        .iter()
        .enumerate()
        .map(|(i, &sz)| {
            let s = spec(&format!("s{i}"), sz);
            let id = s.id;
            p.mount(c, s).unwrap();
            id
        })
        .collect();
    let a = placer(PlacementPolicy::FreeRatioFirst);
    let rp = ReplicaPlacement::new(&p, &a);
    let mut held = Vec::new();
    // Fill to ~60% of total capacity.
    let total: u64 = sizes.iter().sum();
    while (held.len() as u64) * MIB < total * 6 / 10 {
        held.extend(rp.place(&PlacementRequest::memory(MIB, 1)).unwrap());
    }
    let utils: Vec<f64> = ids
        .iter()
        .map(|id| {
            let u = p.segment(*id).unwrap().usage;
            u.used as f64 / u.capacity as f64
        })
        .collect();
    let (lo, hi) = utils.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &u| (lo.min(u), hi.max(u)));
    assert!(hi - lo <= 0.15, "utilisation spread {utils:?}");
}
