//! Segment-pool snapshots (`SegmentPool::restore`) and allocator snapshots (`OffsetAllocator::restore` of a
//! postcard-decoded `AllocatorSnapshot`, the form they take inside a pool snapshot).
//!
//! Input: byte 0 is a mode: bit 0 turns the pool's CXL window (64 MiB) on; bit 1 wraps the rest as a snapshot
//! body under a valid header (magic, version, crc32c), so mutations get past the checksum into the decoder and
//! the validation; bit 2 decodes the rest as an `AllocatorSnapshot` instead.
//! Properties: no panic; a refused snapshot leaves the pool empty; an accepted one restores again from its own
//! snapshot to the same snapshot, and finishes restore; an accepted allocator snapshot passes the allocator's
//! invariant check, gives back the same snapshot, and keeps them through a few allocations and frees.
#![no_main]

use crescent_fuzz::write_seeds;
use crescent_master::alloc::{AllocatorSnapshot, OffsetAllocator, SnapshotAllocation};
use crescent_master::clock::Timestamp;
use crescent_master::placement::{Placer, ReplicaPlacement};
use crescent_master::segment_pool::{PoolConfig, SegmentPool};
use crescent_proto::{ClientId, SegmentId, SegmentKind, SegmentSpec, SegmentStatus};
use libfuzzer_sys::fuzz_target;

const MIB: u64 = 1 << 20;
const CXL_WINDOW: u64 = 64 * MIB;
const HEADER: usize = 10;

fn config(mode: u8) -> PoolConfig {
    PoolConfig { cxl_window: (mode & 1 == 1).then_some(CXL_WINDOW) }
}

fn spec(name: &str, size: u64, kind: SegmentKind) -> SegmentSpec {
    SegmentSpec {
        id: SegmentId::random(),
        name: name.to_owned(),
        base: 0x1000_0000,
        size,
        endpoint: "127.0.0.1:9001".to_owned(),
        kind,
        host_id: format!("host-{name}"),
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    // A memory pool with allocations and every restorable status.
    let p = SegmentPool::new(config(0)).unwrap();
    let c = ClientId::random();
    let (a, b, g) = (
        spec("a", 32 * MIB, SegmentKind::Memory),
        spec("b", 8 * MIB, SegmentKind::Memory),
        spec("g", 4 * MIB, SegmentKind::Memory),
    );
    for s in [&a, &b, &g] {
        p.mount(c, s.clone()).unwrap();
    }
    let placer = Placer::new(Default::default());
    let _held: Vec<_> = [(3 * MIB + 5, "a"), (MIB, "a"), (4096, "b")]
        .iter()
        .map(|(size, name)| ReplicaPlacement::new(&p, &placer).allocate_from(SegmentKind::Memory, name, *size).unwrap())
        .collect();
    p.set_status(b.id, SegmentStatus::Draining).unwrap();
    p.graceful_unmount(g.id, c, Timestamp(777)).unwrap();
    let snap = p.snapshot();
    out.push([&[0u8][..], &snap].concat());
    out.push([&[2u8][..], &snap[HEADER..]].concat());
    // A CXL pool with a binding holding an allocation.
    let p = SegmentPool::new(config(1)).unwrap();
    let cxl = spec("cxl", CXL_WINDOW, SegmentKind::Cxl);
    p.mount(c, cxl).unwrap();
    let _held = ReplicaPlacement::new(&p, &placer).allocate_from(SegmentKind::Cxl, "cxl", 5 * MIB).unwrap();
    let snap = p.snapshot();
    out.push([&[1u8][..], &snap].concat());
    out.push([&[3u8][..], &snap[HEADER..]].concat());
    // Allocator snapshots.
    let mut alloc = OffsetAllocator::new(64 * MIB + 77).unwrap();
    let handles: Vec<_> = [576 << 10, 2 * MIB, 1, 5000, 16 * MIB].iter().map(|s| alloc.allocate(*s).unwrap()).collect();
    alloc.free(&handles[1]).unwrap();
    out.push([&[4u8][..], &postcard::to_stdvec(&alloc.snapshot()).unwrap()].concat());
    let full = AllocatorSnapshot {
        capacity: 10,
        allocations: vec![SnapshotAllocation { offset: 0, consumed: 10, requested: 3 }],
    };
    out.push([&[4u8][..], &postcard::to_stdvec(&full).unwrap()].concat());
    out
}

fn allocator(data: &[u8]) {
    let Ok((snap, ops)) = postcard::take_from_bytes::<AllocatorSnapshot>(data) else { return };
    let Ok((mut alloc, mut handles)) = OffsetAllocator::restore(&snap) else { return };
    alloc.check_invariants().expect("a restored allocator is consistent");
    assert_eq!(alloc.snapshot(), snap, "restore gives back the snapshot it was built from");
    assert_eq!(handles.len(), snap.allocations.len());
    // A few operations on the restored allocator: even bytes allocate, odd bytes free.
    for &op in ops.iter().take(16) {
        if op & 1 == 0 {
            if let Ok(h) = alloc.allocate(1u64 << (op >> 3).min(40)) {
                handles.push(h);
            }
        } else if !handles.is_empty() {
            let h = handles.swap_remove(op as usize % handles.len());
            alloc.free(&h).expect("a live handle frees");
        }
        alloc.check_invariants().expect("the allocator stays consistent");
    }
}

fuzz_target!(init: write_seeds(seeds), |data: &[u8]| {
    let (mode, rest) = crescent_fuzz::split_first(data);
    if mode & 4 != 0 {
        return allocator(rest);
    }
    let payload = if mode & 2 != 0 {
        let mut p = Vec::with_capacity(HEADER + rest.len());
        p.extend_from_slice(b"CSPS");
        p.extend_from_slice(&1u16.to_le_bytes());
        p.extend_from_slice(&crc32c::crc32c(rest).to_le_bytes());
        p.extend_from_slice(rest);
        p
    } else {
        rest.to_vec()
    };
    let pool = SegmentPool::new(config(mode)).unwrap();
    match pool.restore(&payload) {
        Err(_) => assert!(pool.is_empty(), "a refused snapshot changes nothing"),
        Ok(n) => {
            assert_eq!(pool.len(), n);
            let snap = pool.snapshot();
            let again = SegmentPool::new(config(mode)).unwrap();
            assert_eq!(again.restore(&snap).expect("a restored pool's snapshot restores"), n);
            assert_eq!(again.snapshot(), snap, "snapshot . restore is stable");
            pool.finish_restore();
            again.finish_restore();
        }
    }
});
