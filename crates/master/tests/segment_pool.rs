//! SegmentPool behaviour: mount/remount/unmount lifecycle, statuses, CXL/NoF drivers, snapshots.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::clock::Timestamp;
use crescent_master::placement::{PlacementRequest, Placer, ReplicaPlacement};
use crescent_master::segment_pool::{
    AllocatedBuffer, MountOutcome, PoolConfig, PoolError, RegionAllocState, SegmentPool, SegmentPoolSnapshotView,
};
use crescent_proto::{ClientId, ErrorCode, ReplicaLocation, SegmentId, SegmentKind, SegmentStatus};
use std::time::Duration;

fn place(pool: &SegmentPool, size: u64, n: usize) -> Result<Vec<AllocatedBuffer>, ErrorCode> {
    let a = Placer::new(Default::default());
    ReplicaPlacement::new(pool, &a).place(&PlacementRequest::memory(size, n)).map_err(|e| e.code())
}

fn place_on(pool: &SegmentPool, name: &str, size: u64) -> Result<AllocatedBuffer, ErrorCode> {
    let a = Placer::new(Default::default());
    ReplicaPlacement::new(pool, &a).allocate_from(SegmentKind::Memory, name, size).map_err(|e| e.code())
}

// Mount idempotency.
#[test]
fn mounting_the_same_segment_twice_is_ok_and_registers_one_target() {
    let p = pool();
    let c = ClientId::random();
    let s = spec("a", 64 * MIB);
    assert_eq!(p.mount(c, s.clone()), Ok(MountOutcome::Mounted));
    assert_eq!(p.mount(c, s.clone()), Ok(MountOutcome::AlreadyMounted));
    assert_eq!(p.len(), 1);
    let access = p.placement_access();
    assert_eq!(access.names(SegmentKind::Memory).len(), 1);
    assert_eq!(access.segment_of(SegmentKind::Memory, "a"), vec![s.id]);
}

#[test]
fn mounting_an_id_with_different_fields_or_owner_is_invalid_params() {
    let p = pool();
    let c = ClientId::random();
    let s = spec("a", 64 * MIB);
    p.mount(c, s.clone()).unwrap();
    let mut other = s.clone();
    other.size = 32 * MIB;
    assert_eq!(p.mount(c, other).unwrap_err().code(), ErrorCode::InvalidParams);
    assert_eq!(p.mount(ClientId::random(), s.clone()).unwrap_err().code(), ErrorCode::InvalidParams);
    assert_eq!(p.segment(s.id).unwrap().spec.size, 64 * MIB, "the failed mounts changed nothing");
}

#[test]
fn mounting_an_id_that_is_not_ok_is_unavailable() {
    let p = pool();
    let c = ClientId::random();
    let s = spec("a", 64 * MIB);
    p.mount(c, s.clone()).unwrap();
    p.set_status(s.id, SegmentStatus::Draining).unwrap();
    assert_eq!(p.mount(c, s.clone()).unwrap_err().code(), ErrorCode::UnavailableInCurrentStatus);
    p.set_status(s.id, SegmentStatus::Ok).unwrap();
    p.deactivate(s.id).unwrap();
    assert_eq!(p.mount(c, s.clone()).unwrap_err().code(), ErrorCode::UnavailableInCurrentStatus);
    assert_eq!(p.remount(c, std::slice::from_ref(&s)).unwrap_err().code(), ErrorCode::UnavailableInCurrentStatus);
}

// Mount validation.
#[test]
fn mount_validation_per_medium() {
    let p = pool();
    let c = ClientId::random();
    let mut s = spec("a", 64 * MIB);
    s.base = 0;
    assert_eq!(p.mount(c, s.clone()).unwrap_err().code(), ErrorCode::InvalidParams);
    let mut s = spec("a", 0);
    assert_eq!(p.mount(c, s.clone()).unwrap_err().code(), ErrorCode::InvalidParams);
    s.size = 1;
    s.base = u64::MAX;
    assert_eq!(p.mount(c, s.clone()).unwrap_err().code(), ErrorCode::InvalidParams, "base + size overflows");
    let s = spec("", 64 * MIB);
    assert_eq!(p.mount(c, s).unwrap_err().code(), ErrorCode::InvalidParams, "empty name");
    assert!(p.is_empty());
    // NoF: base 0 is a valid namespace offset.
    let mut nof = spec("nof", 64 * MIB);
    nof.kind = SegmentKind::Nof;
    nof.base = 0;
    assert_eq!(p.mount(c, nof.clone()), Ok(MountOutcome::Mounted));
    nof.size = 0;
    nof.id = SegmentId::random();
    assert_eq!(p.mount(c, nof).unwrap_err().code(), ErrorCode::InvalidParams);
}

#[test]
fn nof_endpoint_of_a_live_segment_cannot_be_mounted_twice() {
    let p = pool();
    let c = ClientId::random();
    let mut a = spec("nof-a", 64 * MIB);
    a.kind = SegmentKind::Nof;
    p.mount(c, a.clone()).unwrap();
    let mut b = a.clone();
    b.id = SegmentId::random();
    assert_eq!(p.mount(c, b.clone()).unwrap_err().code(), ErrorCode::SegmentAlreadyExists);
    p.unmount(a.id, |_| {}).unwrap();
    assert_eq!(p.mount(c, b), Ok(MountOutcome::Mounted), "free again after the first is gone");
}

// Allocatable ⇔ OK.
#[test]
fn only_ok_segments_receive_replicas() {
    let p = pool();
    let ids = mount_n(&p, 1, 64 * MIB);
    let (c, id) = ids[0];
    for status in [SegmentStatus::Draining, SegmentStatus::Drained] {
        p.set_status(id, status).unwrap();
        assert!(!p.is_allocatable(id));
        assert_eq!(place(&p, 4096, 1).unwrap_err(), ErrorCode::NoAvailableHandle);
        assert_eq!(place_on(&p, "seg0", 4096).unwrap_err(), ErrorCode::NoAvailableHandle);
        p.set_status(id, SegmentStatus::Ok).unwrap();
        assert!(p.is_allocatable(id));
        assert_eq!(place(&p, 4096, 1).unwrap().len(), 1);
    }
    p.graceful_unmount(id, c, Timestamp(100)).unwrap();
    assert!(!p.is_allocatable(id));
    assert_eq!(place(&p, 4096, 1).unwrap_err(), ErrorCode::NoAvailableHandle);
    assert_eq!(p.set_status(id, SegmentStatus::Ok).unwrap_err().code(), ErrorCode::UnavailableInCurrentStatus);
    assert_eq!(
        p.set_status(id, SegmentStatus::Unmounting).unwrap_err().code(),
        ErrorCode::InvalidParams,
        "unmounting is reached only through deactivate"
    );
}

#[test]
fn status_index_tracks_every_transition() {
    let p = pool();
    let ids = mount_n(&p, 3, 16 * MIB);
    p.set_status(ids[1].1, SegmentStatus::Draining).unwrap();
    p.deactivate(ids[2].1).unwrap();
    assert_eq!(p.segments_with_status(SegmentStatus::Ok), vec![ids[0].1]);
    assert_eq!(p.segments_with_status(SegmentStatus::Draining), vec![ids[1].1]);
    assert_eq!(p.segments_with_status(SegmentStatus::Unmounting), vec![ids[2].1]);
    p.erase(ids[2].1).unwrap();
    assert!(p.segments_with_status(SegmentStatus::Unmounting).is_empty());
    assert_eq!(p.segments_named("seg1"), vec![ids[1].1]);
    assert_eq!(p.client_segments(ids[0].0), vec![ids[0].1]);
    assert!(p.client_segments(ids[2].0).is_empty());
}

// Two-phase unmount visibility.
#[test]
fn deactivation_hides_buffers_before_the_sweep_and_erase_forgets_the_segment() {
    let p = pool();
    let ids = mount_n(&p, 1, 64 * MIB);
    let id = ids[0].1;
    let bufs: Vec<_> = (0..10).map(|_| place(&p, 1 << 20, 1).unwrap().pop().unwrap()).collect();
    assert!(bufs.iter().all(|b| b.is_readable() && b.location().is_some()));
    let mut swept = 0;
    let d = p
        .unmount(id, |d| {
            // Between the phases: already unreadable, still cataloged as UNMOUNTING.
            assert!(bufs.iter().all(|b| !b.is_readable() && b.location().is_none()));
            assert!(bufs.iter().all(|b| d.holds(b)));
            assert_eq!(p.segment(id).unwrap().status, SegmentStatus::Unmounting);
            assert_eq!(place(&p, 1, 1).unwrap_err(), ErrorCode::NoAvailableHandle);
            swept = bufs.len();
        })
        .unwrap()
        .unwrap();
    assert_eq!(swept, 10);
    assert_eq!(d.usage.used, 10 << 20);
    assert!(p.segment(id).is_none());
    assert!(bufs.iter().all(|b| b.region().is_none()), "the resource is gone once erased");
    drop(bufs); // Releasing buffers of an erased region is a harmless no-op.
}

// Unmount idempotency.
#[test]
fn unmounting_unknown_or_twice_is_ok_and_deactivating_twice_is_unavailable() {
    let p = pool();
    assert!(p.unmount(SegmentId::random(), |_| panic!("no sweep for unknown ids")).unwrap().is_none());
    let ids = mount_n(&p, 1, 16 * MIB);
    p.deactivate(ids[0].1).unwrap().unwrap();
    assert_eq!(p.deactivate(ids[0].1).unwrap_err().code(), ErrorCode::UnavailableInCurrentStatus);
    p.erase(ids[0].1).unwrap();
    p.erase(ids[0].1).unwrap();
    assert!(p.unmount(ids[0].1, |_| {}).unwrap().is_none());
}

#[test]
fn erase_requires_deactivation() {
    let p = pool();
    let ids = mount_n(&p, 1, 16 * MIB);
    assert_eq!(p.erase(ids[0].1).unwrap_err().code(), ErrorCode::UnavailableInCurrentStatus);
    assert!(p.is_allocatable(ids[0].1));
}

#[test]
fn remount_after_unmount_and_random_sizes_of_the_same_id() {
    let p = pool();
    let c = ClientId::random();
    let mut s = spec("a", 16 * MIB);
    for i in 0..10u64 {
        s.size = (i + 1) * 3 * MIB + i;
        p.mount(c, s.clone()).unwrap();
        assert_eq!(p.segment(s.id).unwrap().usage.capacity, s.size);
        p.unmount(s.id, |_| {}).unwrap();
    }
    assert!(p.is_empty());
}

// Surviving replicas.
#[test]
fn replicas_on_other_segments_survive_an_unmount() {
    let p = pool();
    let ids = mount_n(&p, 2, 16 * MIB);
    let bufs = place(&p, 4096, 2).unwrap();
    assert_eq!(bufs.len(), 2);
    let victim = ids[0].1;
    p.unmount(victim, |_| {}).unwrap();
    let readable: Vec<_> = bufs.iter().filter(|b| b.is_readable()).collect();
    assert_eq!(readable.len(), 1);
    assert_eq!(readable[0].segment_id(), Some(ids[1].1));
    match readable[0].location().unwrap() {
        ReplicaLocation::Memory { segment_id, length, .. } => {
            assert_eq!((segment_id, length), (ids[1].1, 4096));
        }
        other => panic!("unexpected {other:?}"),
    }
}

// Graceful unmount.
#[test]
fn graceful_unmount_keeps_replicas_readable_until_the_deadline() {
    let p = pool();
    let ids = mount_n(&p, 2, 16 * MIB);
    let (c0, s0) = ids[0];
    let kept = place_on(&p, "seg0", 4096).unwrap();
    assert_eq!(
        p.graceful_unmount(s0, ClientId::random(), Timestamp(50)).unwrap_err().code(),
        ErrorCode::SegmentNotFound
    );
    assert_eq!(p.graceful_unmount(s0, ids[1].0, Timestamp(50)).unwrap_err().code(), ErrorCode::InvalidParams);
    p.graceful_unmount(s0, c0, Timestamp(50)).unwrap();
    p.graceful_unmount(s0, c0, Timestamp(10_000)).unwrap(); // idempotent, keeps the first deadline
    let info = p.segment(s0).unwrap();
    assert_eq!((info.status, info.graceful_deadline), (SegmentStatus::GracefullyUnmounting, Some(Timestamp(50))));
    assert!(kept.is_readable());
    for _ in 0..20 {
        let b = place(&p, 4096, 1).unwrap();
        assert_eq!(b[0].segment_id(), Some(ids[1].1), "new replicas avoid the draining segment");
    }
    assert!(p.due_graceful_unmounts(Timestamp(49)).is_empty());
    assert_eq!(p.due_graceful_unmounts(Timestamp(50)), vec![s0]);
    p.unmount(s0, |_| {}).unwrap();
    assert!(!kept.is_readable());
    assert!(p.due_graceful_unmounts(Timestamp(u64::MAX)).is_empty());
}

#[test]
fn graceful_deadlines_fire_earliest_first_and_reused_names_are_independent() {
    let p = pool();
    let c = ClientId::random();
    let old = spec("same", 16 * MIB);
    let new = spec("same", 16 * MIB);
    let third = spec("other", 16 * MIB);
    for s in [&old, &new, &third] {
        p.mount(c, s.clone()).unwrap();
    }
    p.graceful_unmount(old.id, c, Timestamp(1000)).unwrap();
    p.graceful_unmount(third.id, c, Timestamp(50)).unwrap();
    assert_eq!(p.segment(new.id).unwrap().status, SegmentStatus::Ok);
    assert_eq!(p.next_graceful_deadline(), Some(Timestamp(50)));
    assert_eq!(p.due_graceful_unmounts(Timestamp(2000)), vec![third.id, old.id]);
    // The name is still allocatable through the other segment that carries it.
    assert_eq!(place_on(&p, "same", 4096).unwrap().segment_id(), Some(new.id));
}

#[test]
fn graceful_unmount_refuses_unmounting_and_drained_segments() {
    let p = pool();
    let ids = mount_n(&p, 2, 16 * MIB);
    p.set_status(ids[0].1, SegmentStatus::Drained).unwrap();
    assert_eq!(
        p.graceful_unmount(ids[0].1, ids[0].0, Timestamp(1)).unwrap_err().code(),
        ErrorCode::UnavailableInCurrentStatus
    );
    p.deactivate(ids[1].1).unwrap();
    assert_eq!(
        p.graceful_unmount(ids[1].1, ids[1].0, Timestamp(1)).unwrap_err().code(),
        ErrorCode::UnavailableInCurrentStatus
    );
}

// A client's expiry unmounts all of its memory segments; its NoF segments stay.
#[test]
fn expiring_a_client_unmounts_its_memory_segments_only() {
    let p = pool();
    let c = ClientId::random();
    let other = ClientId::random();
    let m1 = spec("m1", 16 * MIB);
    let m2 = spec("m2", 16 * MIB);
    let mut n1 = spec("n1", 16 * MIB);
    n1.kind = SegmentKind::Nof;
    let keep = spec("k", 16 * MIB);
    for s in [&m1, &m2, &n1] {
        p.mount(c, s.clone()).unwrap();
    }
    p.mount(other, keep.clone()).unwrap();
    for id in p.client_segments(c) {
        if p.segment(id).unwrap().spec.kind == SegmentKind::Memory {
            p.unmount(id, |_| {}).unwrap();
        }
    }
    assert_eq!(p.client_segments(c), vec![n1.id]);
    assert_eq!(p.client_segments(other), vec![keep.id]);
}

#[test]
fn remount_readopts_existing_mounts_new_and_is_all_or_nothing() {
    let p = pool();
    let c = ClientId::random();
    let a = spec("a", 16 * MIB);
    let b = spec("b", 16 * MIB);
    p.mount(c, a.clone()).unwrap();
    let report = p.remount(c, &[a.clone(), b.clone()]).unwrap();
    assert_eq!(report.readopted, vec![a.id]);
    assert_eq!(report.mounted, vec![b.id]);
    // Idempotent.
    let again = p.remount(c, &[a.clone(), b.clone()]).unwrap();
    assert_eq!(again.readopted, vec![a.id, b.id]);
    assert!(again.mounted.is_empty());
    // A mismatching segment fails the whole batch: the fresh `d` is not mounted either.
    let d = spec("d", 16 * MIB);
    let mut a_changed = a.clone();
    a_changed.endpoint = "10.0.0.1:1".into();
    assert_eq!(p.remount(c, &[d.clone(), a_changed]).unwrap_err().code(), ErrorCode::InvalidParams);
    assert!(p.segment(d.id).is_none());
    // Another client's segment cannot be re-adopted.
    assert_eq!(p.remount(ClientId::random(), std::slice::from_ref(&a)).unwrap_err().code(), ErrorCode::InvalidParams);
    // An invalid fresh segment fails the batch before anything is mounted.
    let mut bad = spec("bad", 16 * MIB);
    bad.base = 0;
    let e = spec("e", 16 * MIB);
    assert_eq!(p.remount(c, &[e.clone(), bad]).unwrap_err().code(), ErrorCode::InvalidParams);
    assert!(p.segment(e.id).is_none());
    assert_eq!(p.remount(c, &[e.clone(), e.clone()]).unwrap_err().code(), ErrorCode::InvalidParams);
}

#[test]
fn cxl_mounts_need_a_window_and_bind_to_it() {
    let p = pool();
    let mut s = spec("cxl0", 64 * MIB);
    s.kind = SegmentKind::Cxl;
    assert_eq!(p.mount(ClientId::random(), s.clone()).unwrap_err().code(), ErrorCode::UnavailableInCurrentMode);

    let p = SegmentPool::new(PoolConfig { cxl_window: Some(64 * MIB), ..Default::default() }).unwrap();
    let c = ClientId::random();
    let mut t = s.clone();
    t.id = SegmentId::random();
    t.name = "cxl1".into();
    p.mount(c, s.clone()).unwrap();
    p.mount(c, t.clone()).unwrap();
    let a = Placer::new(Default::default());
    let placement = ReplicaPlacement::new(&p, &a);
    let mut req = PlacementRequest::memory(16 * MIB, 3);
    req.kind = SegmentKind::Cxl;
    let one = placement.place(&req).unwrap();
    assert_eq!(one.len(), 1, "CXL objects get a single replica");
    let holder = one[0].segment_id().unwrap();
    let other = if holder == s.id { t.id } else { s.id };
    // Both bindings share one 64 MiB window.
    let more: Vec<_> = (0..3).map(|_| placement.place(&req).unwrap().pop().unwrap()).collect();
    assert_eq!(placement.place(&req).unwrap_err().code(), ErrorCode::NoAvailableHandle);
    // Erasing a binding returns its space to the window; the other binding's buffers stay readable.
    let on_holder = more.iter().filter(|b| b.segment_id() == Some(holder)).count() + 1;
    p.unmount(holder, |_| {}).unwrap();
    assert!(!one[0].is_readable());
    assert!(more.iter().filter(|b| b.segment_id() == Some(other)).all(|b| b.is_readable()));
    let freed: Vec<_> = (0..on_holder).map(|_| placement.place(&req).unwrap().pop().unwrap()).collect();
    assert!(freed.iter().all(|b| b.segment_id() == Some(other)));
    assert_eq!(placement.place(&req).unwrap_err().code(), ErrorCode::NoAvailableHandle);
    drop(one); // A buffer of an erased binding must not free anything twice.
    assert_eq!(placement.place(&req).unwrap_err().code(), ErrorCode::NoAvailableHandle);
}

#[test]
fn buffers_return_their_space_when_dropped() {
    let p = pool();
    let ids = mount_n(&p, 1, 8 * MIB);
    let bufs: Vec<_> = (0..8).map(|_| place(&p, MIB, 1).unwrap().pop().unwrap()).collect();
    assert_eq!(place(&p, MIB, 1).unwrap_err(), ErrorCode::NoAvailableHandle);
    assert_eq!(p.segment(ids[0].1).unwrap().usage.used, 8 * MIB);
    drop(bufs);
    let u = p.segment(ids[0].1).unwrap().usage;
    assert_eq!((u.used, u.slack, u.live_allocations, u.largest_free), (0, 0, 0, 8 * MIB));
    assert_eq!(p.usage(SegmentKind::Memory).used_ratio(), 0.0);
}

#[test]
fn snapshot_restore_round_trips_catalog_allocators_and_rebinds_buffers() {
    let p = pool();
    let c = ClientId::random();
    let a = spec_on("a", 32 * MIB, "h1");
    let b = spec_on("b", 32 * MIB, "h2");
    let g = spec("g", 32 * MIB);
    for s in [&a, &b, &g] {
        p.mount(c, s.clone()).unwrap();
    }
    p.set_status(b.id, SegmentStatus::Draining).unwrap();
    p.graceful_unmount(g.id, c, Timestamp(777)).unwrap();
    let kept = place_on(&p, "a", 3 * MIB + 5).unwrap();
    let orphan = place_on(&p, "a", MIB).unwrap();
    let view = p.snapshot_view();

    let q = pool();
    assert_eq!(q.restore(view.clone()).unwrap(), 3);
    for s in [&a, &b, &g] {
        let (x, y) = (p.segment(s.id).unwrap(), q.segment(s.id).unwrap());
        assert_eq!(
            (x.spec, x.client, x.status, x.graceful_deadline),
            (y.spec, y.client, y.status, y.graceful_deadline)
        );
        assert_eq!(x.usage, y.usage);
    }
    assert!(q.is_allocatable(a.id) && !q.is_allocatable(b.id) && !q.is_allocatable(g.id));
    // The metadata restore re-binds the buffers it knows; wrong sizes/offsets are refused; the rest is freed.
    let restored = q.take_restored();
    assert_eq!(restored.rebind(a.id, kept.offset(), 1).unwrap_err().code(), ErrorCode::InvalidReplica);
    let rebound = restored.rebind(a.id, kept.offset(), kept.size()).unwrap();
    assert!(restored.rebind(a.id, kept.offset(), kept.size()).is_err(), "only once");
    assert_eq!(restored.finish(), 1);
    assert_eq!(q.segment(a.id).unwrap().usage.used, 3 * MIB + 5);
    drop(rebound);
    assert_eq!(q.segment(a.id).unwrap().usage.used, 0);
    drop(orphan);
    // Restore needs an empty pool.
    assert_eq!(q.restore(view).unwrap_err(), PoolError::NotEmpty);
}

#[test]
fn inconsistent_snapshot_views_are_rejected_and_change_nothing() {
    let p = pool();
    let c = ClientId::random();
    for i in 0..3 {
        p.mount(c, spec(&format!("s{i}"), 16 * MIB)).unwrap();
    }
    let _held = place(&p, 4096, 3).unwrap();
    let view = p.snapshot_view();
    let q = pool();
    let broken = |f: &dyn Fn(&mut SegmentPoolSnapshotView)| {
        let mut v = view.clone();
        f(&mut v);
        v
    };
    let cases = [
        broken(&|v| v.regions.push(v.regions[0].clone())),
        broken(&|v| v.regions[1].status = SegmentStatus::Unmounting),
        broken(&|v| v.regions[1].graceful_deadline = Some(Timestamp(5))),
        broken(&|v| v.regions[2].spec.size = 0),
        broken(&|v| v.regions[2].alloc = RegionAllocState::CxlBinding(vec![0])),
        broken(&|v| {
            let RegionAllocState::Own(a) = &mut v.regions[0].alloc else { unreachable!() };
            a.allocations.push(a.allocations[0].clone());
        }),
        broken(&|v| {
            let RegionAllocState::Own(a) = &mut v.regions[0].alloc else { unreachable!() };
            a.capacity += 1;
        }),
    ];
    for case in cases {
        let e = q.restore(case).unwrap_err();
        assert!(matches!(e, PoolError::CorruptSnapshot(_) | PoolError::InvalidSpec(_)), "{e}");
        assert!(q.is_empty());
    }
    // A view of a CXL pool cannot be restored where CXL is off.
    let cxl = SegmentPool::new(PoolConfig { cxl_window: Some(MIB), ..Default::default() }).unwrap();
    assert_eq!(q.restore(cxl.snapshot_view()).unwrap_err(), PoolError::CxlDisabled);
    assert_eq!(q.restore(view).unwrap(), 3);
}

#[test]
fn a_suspect_segment_is_restored_suspect_and_its_owner_clears_it() {
    let p = pool();
    let ids = mount_n(&p, 2, 8 * MIB);
    let (owner, id) = ids[0];
    let held = place_on(&p, "seg0", MIB).unwrap();
    assert!(p.suspect(id).unwrap());
    let q = pool();
    q.restore(p.snapshot_view()).unwrap();
    assert_eq!(q.segment(id).unwrap().status, SegmentStatus::Suspect);
    assert!(!q.is_allocatable(id));
    let rebound = q.take_restored().rebind(id, held.offset(), MIB).unwrap();
    assert!(!rebound.is_readable() && rebound.is_live(), "its replicas are kept but not handed to readers");
    assert_eq!(q.clear_suspect(ids[1].0), 0, "another client's ping clears nothing");
    assert_eq!(q.clear_suspect(owner), 1);
    assert!(q.is_allocatable(id) && rebound.is_readable());
}

#[test]
fn cxl_snapshot_round_trips_bindings() {
    let cfg = PoolConfig { cxl_window: Some(64 * MIB), ..Default::default() };
    let p = SegmentPool::new(cfg.clone()).unwrap();
    let c = ClientId::random();
    let mut s = spec("cxl", 64 * MIB);
    s.kind = SegmentKind::Cxl;
    p.mount(c, s.clone()).unwrap();
    let a = Placer::new(Default::default());
    let b = ReplicaPlacement::new(&p, &a).allocate_from(SegmentKind::Cxl, "cxl", 5 * MIB).unwrap();
    let q = SegmentPool::new(cfg).unwrap();
    q.restore(p.snapshot_view()).unwrap();
    assert_eq!(q.segment(s.id).unwrap().usage.used, 5 * MIB);
    let restored = q.take_restored();
    let r = restored.rebind(s.id, b.offset(), 5 * MIB).unwrap();
    assert_eq!(restored.finish(), 0);
    drop(r);
    assert_eq!(q.segment(s.id).unwrap().usage.used, 0);
}

// Write hold (issue 17 §2): space freed while a write grant for it may be live is not handed out again.

/// A pool with a 10 s write hold on a manual clock, one 4 MiB segment mounted.
fn held_pool() -> (SegmentPool, crescent_proto::SegmentSpec, std::sync::Arc<crescent_master::clock::ManualClock>) {
    use crescent_master::segment_pool::WriteHold;
    let clock = crescent_master::clock::ManualClock::new(Timestamp(1_000));
    let hold = WriteHold { clock: clock.clone(), window: Duration::from_secs(10) };
    let p = SegmentPool::new(PoolConfig { write_hold: Some(hold), ..Default::default() }).unwrap();
    let s = spec("a", 4 * MIB);
    p.mount(ClientId::random(), s.clone()).unwrap();
    (p, s, clock)
}

#[test]
fn space_freed_within_the_write_hold_is_reused_only_after_it() {
    let (p, s, clock) = held_pool();

    // The whole segment, freed 1 s after allocation: held, so nothing fits until 10 s after the allocation.
    let first = place_on(&p, "a", 4 * MIB).unwrap();
    let first_offset = first.offset();
    clock.advance(Duration::from_secs(1));
    drop(first);
    let usage = p.segment(s.id).unwrap().usage;
    assert_eq!((usage.used, usage.held), (4 * MIB, 4 * MIB), "held space counts as used, and as held");
    assert_eq!(place_on(&p, "a", MIB).unwrap_err(), ErrorCode::NoAvailableHandle, "nothing free while held");
    clock.advance(Duration::from_millis(8_999));
    assert!(place_on(&p, "a", MIB).is_err(), "still 1 ms to go");
    clock.advance(Duration::from_millis(1));
    let again = place_on(&p, "a", 4 * MIB).unwrap();
    assert_eq!(again.offset(), first_offset, "released at the hold's end");
    assert_eq!(p.segment(s.id).unwrap().usage.held, 0);

    // A buffer freed after its hold is reusable at once.
    clock.advance(Duration::from_secs(10));
    drop(again);
    assert_eq!(p.segment(s.id).unwrap().usage.used, 0);
    assert!(place_on(&p, "a", 4 * MIB).is_ok());
}

#[test]
fn without_a_write_hold_freed_space_is_reused_at_once() {
    let p = pool();
    let s = spec("a", 4 * MIB);
    p.mount(ClientId::random(), s).unwrap();
    drop(place_on(&p, "a", 4 * MIB).unwrap());
    assert!(place_on(&p, "a", 4 * MIB).is_ok());
}

#[test]
fn a_buffer_handed_out_holds_its_space_until_the_handout_is_over() {
    let (p, s, clock) = held_pool();
    let old = place_on(&p, "a", 4 * MIB).unwrap();
    // Long after its allocation, a reader is granted the range for 5 s (a lease), then the object goes (a
    // forced removal, or an upsert in place re-granted for writing): the space waits for the grant.
    clock.advance(Duration::from_secs(60));
    old.hold_for(Duration::from_secs(5));
    clock.advance(Duration::from_secs(1));
    drop(old);
    assert_eq!(p.segment(s.id).unwrap().usage.held, 4 * MIB);
    clock.advance(Duration::from_millis(3_999));
    assert!(place_on(&p, "a", MIB).is_err(), "the grant has 1 ms left");
    clock.advance(Duration::from_millis(1));
    assert!(place_on(&p, "a", 4 * MIB).is_ok(), "free once the grant is over");
}

#[test]
fn holds_ending_out_of_their_freeing_order_are_released_each_at_its_own_end() {
    let (p, s, clock) = held_pool();
    let bufs: Vec<_> = (0..4).map(|_| place_on(&p, "a", MIB).unwrap()).collect();
    // Past the allocation windows, grants of 4, 1, 3 and 2 s: freed in one order, due in another.
    clock.advance(Duration::from_secs(60));
    for (b, secs) in bufs.iter().zip([4, 1, 3, 2]) {
        b.hold_for(Duration::from_secs(secs));
    }
    drop(bufs);
    assert_eq!(p.segment(s.id).unwrap().usage.held, 4 * MIB);
    for left in [3, 2, 1, 0] {
        clock.advance(Duration::from_secs(1));
        let usage = p.segment(s.id).unwrap().usage;
        assert_eq!((usage.held, usage.used), (left * MIB, left * MIB), "one hold ends each second");
    }
    assert!(place_on(&p, "a", 4 * MIB).is_ok(), "all of it free again");
}

#[test]
fn a_short_handout_never_shortens_a_hold_and_a_new_allocation_starts_its_own() {
    let (p, s, clock) = held_pool();
    let first = place_on(&p, "a", 4 * MIB).unwrap();
    // A grant of 1 s right after the allocation: the allocation's 10 s window still holds.
    first.hold_for(Duration::from_secs(1));
    clock.advance(Duration::from_secs(2));
    drop(first);
    clock.advance(Duration::from_millis(7_999));
    assert!(place_on(&p, "a", MIB).is_err(), "held to the end of the allocation's window");
    clock.advance(Duration::from_millis(1));
    // The same space (and allocator slot) again: held by its own window and handouts only.
    let second = place_on(&p, "a", 4 * MIB).unwrap();
    clock.advance(Duration::from_secs(30));
    second.hold_for(Duration::from_secs(3));
    drop(second);
    assert_eq!(p.segment(s.id).unwrap().usage.held, 4 * MIB);
    clock.advance(Duration::from_secs(3));
    assert_eq!(p.segment(s.id).unwrap().usage.held, 0, "its handout over, nothing of the first one's lingers");
    assert!(place_on(&p, "a", 4 * MIB).is_ok());
}
