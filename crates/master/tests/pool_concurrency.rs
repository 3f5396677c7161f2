//! Allocation racing unmount: no buffer is ever handed out from a region after its deactivation.
//!
//! The proof is by counting: deactivation freezes the region's `allocations_total` under the pool's exclusive
//! lock; if any allocation landed after that point, the region's final count would exceed the frozen one, and
//! an allocator call that *started* after deactivation returned would have received a buffer in it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::placement::{PlacementRequest, Placer, ReplicaPlacement};
use crescent_proto::{ClientId, SegmentStatus};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};

#[test]
fn allocation_never_lands_in_a_deactivated_region() {
    let p = pool();
    let keep = spec("keep", 1 << 30);
    p.mount(ClientId::random(), keep).unwrap();
    let allocator = Placer::new(Default::default());
    const ITERATIONS: usize = 300;
    const THREADS: usize = 3;
    let mut landed_total = 0u64;
    for iter in 0..ITERATIONS {
        let victim = spec("victim", 1 << 30);
        let vid = victim.id;
        p.mount(ClientId::random(), victim).unwrap();
        let deactivated = AtomicBool::new(false);
        let on_victim = AtomicU64::new(0);
        let held = Mutex::new(Vec::new());
        let barrier = Barrier::new(THREADS + 1);
        let frozen = std::thread::scope(|s| {
            for t in 0..THREADS {
                let (p, allocator, deactivated, on_victim, held, barrier) =
                    (&p, &allocator, &deactivated, &on_victim, &held, &barrier);
                s.spawn(move || {
                    let rp = ReplicaPlacement::new(p, allocator);
                    barrier.wait();
                    for i in 0..200u64 {
                        let started_after = deactivated.load(Ordering::SeqCst);
                        let mut req = PlacementRequest::memory(4096 + (i % 7) * 512, 2);
                        req.key_hash = i ^ t as u64;
                        let bufs = rp.place(&req).unwrap();
                        for b in bufs {
                            if b.segment_id() == Some(vid) {
                                assert!(!started_after, "iteration {iter}: allocated in a deactivated region");
                                on_victim.fetch_add(1, Ordering::SeqCst);
                            }
                            held.lock().unwrap().push(b);
                        }
                        if started_after && i % 16 == 0 {
                            break;
                        }
                    }
                });
            }
            barrier.wait();
            // Let the allocators run a little, varying where in their loop the unmount lands.
            for _ in 0..(iter % 50) * 20 {
                std::hint::spin_loop();
            }
            let d = p.deactivate(vid).unwrap().unwrap();
            deactivated.store(true, Ordering::SeqCst);
            d.usage.allocations_total
        });
        // Every buffer the threads received in the victim was allocated before deactivation froze the count,
        // and nothing was allocated there afterwards.
        let after = p.segment(vid).unwrap().usage.allocations_total;
        assert_eq!(after, frozen, "iteration {iter}: allocations after deactivation");
        assert_eq!(on_victim.load(Ordering::SeqCst), frozen, "iteration {iter}: buffers handed out != allocations");
        assert_eq!(p.segment(vid).unwrap().status, SegmentStatus::Unmounting);
        let held = held.into_inner().unwrap();
        assert!(held.iter().filter(|b| b.segment_id() == Some(vid)).all(|b| !b.is_readable()));
        landed_total += frozen;
        p.erase(vid).unwrap();
        drop(held);
    }
    // The race was real: allocations did land in victims before they were deactivated.
    assert!(landed_total > 0);
    let keep_usage = p.usage(crescent_proto::SegmentKind::Memory);
    assert_eq!(keep_usage.used, 0, "every surviving buffer was returned");
}

#[test]
fn concurrent_mount_unmount_and_placement_keep_the_pool_consistent() {
    let p = pool();
    let allocator = Placer::new(Default::default());
    std::thread::scope(|s| {
        for t in 0..4 {
            let (p, allocator) = (&p, &allocator);
            s.spawn(move || {
                let c = ClientId::random();
                let rp = ReplicaPlacement::new(p, allocator);
                for i in 0..100 {
                    let sp = spec(&format!("t{t}-{i}"), 4 * MIB);
                    let id = sp.id;
                    p.mount(c, sp).unwrap();
                    let bufs = rp.place(&PlacementRequest::memory(64 * 1024, 2)).unwrap_or_default();
                    p.unmount(id, |d| {
                        for b in &bufs {
                            if d.holds(b) {
                                assert!(!b.is_readable());
                            }
                        }
                    })
                    .unwrap();
                    drop(bufs);
                }
            });
        }
    });
    assert!(p.is_empty());
    assert!(p.placement_access().names(crescent_proto::SegmentKind::Memory).is_empty());
}
