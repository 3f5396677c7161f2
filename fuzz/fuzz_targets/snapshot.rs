//! Master snapshots (`snapshot::decode`, then `SegmentPool::restore` and `LocalSsdManager::restore` of what it
//! decoded, and the object directory's part: a `ReplayState` restored into a fresh `MasterService` with
//! `restore_replayed`) and allocator states (`OffsetAllocator::restore`, the form they take inside a snapshot).
//!
//! Input: byte 0 is a mode: bit 0 turns the pool's CXL window (64 MiB) on; bit 1 wraps the rest as a snapshot
//! body under a valid header (magic, version, crc32c), so mutations get past the checksum into the decoder and
//! the validation; bit 2 reads the rest as an allocator state instead (capacity, then offset/consumed/requested
//! triples, each a little-endian u64) followed by operation bytes.
//! Properties: no panic; a refused snapshot leaves the pool empty; an accepted one snapshots again to bytes that
//! restore to the same bytes (its object directory carried along unchanged), and finishes restore; an accepted
//! object directory decodes again to the same state and restores into a service without overlapping replicas; an accepted allocator state passes the allocator's
//! invariant check, gives back the same state, and keeps them through a few allocations and frees.
#![no_main]

use crescent_fuzz::write_seeds;
use crescent_master::alloc::{AllocatorSnapshot, OffsetAllocator, SnapshotAllocation};
use crescent_master::clock::ManualClock;
use crescent_master::clock::Timestamp;
use crescent_master::ha::{ObjectRecord, ReplayState, ReplicaRecord, SegmentRecord};
use crescent_master::local_ssd::LocalSsdManager;
use crescent_master::placement::{Placer, ReplicaPlacement};
use crescent_master::segment_pool::{PoolConfig, SegmentPool};
use crescent_master::service::{MasterConfig, MasterService};
use crescent_master::snapshot::{self, HEADER_LEN, MasterSnapshotView, SnapshotMetadata, VERSION};
use crescent_proto::{ClientId, SegmentId, SegmentKind, SegmentSpec, SegmentStatus};
use libfuzzer_sys::fuzz_target;

const MIB: u64 = 1 << 20;
const CXL_WINDOW: u64 = 64 * MIB;
/// Allocations an allocator state may name (keeps one input's work bounded).
const MAX_ALLOCATIONS: usize = 64;

fn config(mode: u8) -> PoolConfig {
    PoolConfig { cxl_window: (mode & 1 == 1).then_some(CXL_WINDOW), ..Default::default() }
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

fn encode_state(a: &AllocatorSnapshot) -> Vec<u8> {
    let mut out = a.capacity.to_le_bytes().to_vec();
    for x in &a.allocations {
        for v in [x.offset, x.consumed, x.requested] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    // A memory pool with allocations and every restorable status, and LocalSSD registrations.
    let p = SegmentPool::new(config(0)).unwrap();
    let c = ClientId::random();
    let specs = [
        spec("a", 32 * MIB, SegmentKind::Memory),
        spec("b", 8 * MIB, SegmentKind::Memory),
        spec("g", 4 * MIB, SegmentKind::Memory),
        spec("s", 4 * MIB, SegmentKind::Memory),
    ];
    for s in &specs {
        p.mount(c, s.clone()).unwrap();
    }
    let placer = Placer::new(Default::default());
    let _held: Vec<_> = [(3 * MIB + 5, "a"), (MIB, "a"), (4096, "b")]
        .iter()
        .map(|(size, name)| ReplicaPlacement::new(&p, &placer).allocate_from(SegmentKind::Memory, name, *size).unwrap())
        .collect();
    p.set_status(specs[1].id, SegmentStatus::Draining).unwrap();
    p.graceful_unmount(specs[2].id, c, Timestamp(777)).unwrap();
    p.suspect(specs[3].id).unwrap();
    let ssd = LocalSsdManager::new();
    ssd.register(c, true).unwrap();
    ssd.report_capacity(c, 1 << 30).unwrap();
    let snap =
        snapshot::encode(&MasterSnapshotView { pool: p.snapshot_view(), local_ssd: ssd.snapshot(), metadata: None });
    out.push([&[0u8][..], &snap].concat());
    out.push([&[2u8][..], &snap[HEADER_LEN..]].concat());
    // An object directory: two tenants, a group, a pinned object, two segments, policies.
    let snap = snapshot::encode(&MasterSnapshotView { metadata: Some(directory()), ..MasterSnapshotView::default() });
    out.push([&[0u8][..], &snap].concat());
    out.push([&[2u8][..], &snap[HEADER_LEN..]].concat());
    // A CXL pool with a binding holding an allocation.
    let p = SegmentPool::new(config(1)).unwrap();
    let cxl = spec("cxl", CXL_WINDOW, SegmentKind::Cxl);
    p.mount(c, cxl).unwrap();
    let _held = ReplicaPlacement::new(&p, &placer).allocate_from(SegmentKind::Cxl, "cxl", 5 * MIB).unwrap();
    let snap = snapshot::encode(&MasterSnapshotView { pool: p.snapshot_view(), local_ssd: Vec::new(), metadata: None });
    out.push([&[1u8][..], &snap].concat());
    out.push([&[3u8][..], &snap[HEADER_LEN..]].concat());
    // Allocator states.
    let mut alloc = OffsetAllocator::new(64 * MIB + 77).unwrap();
    let handles: Vec<_> = [576 << 10, 2 * MIB, 1, 5000, 16 * MIB].iter().map(|s| alloc.allocate(*s).unwrap()).collect();
    alloc.free(&handles[1]).unwrap();
    out.push([&[4u8][..], &encode_state(&alloc.snapshot()), &[0, 1, 8, 3][..]].concat());
    let full = AllocatorSnapshot {
        capacity: 10,
        allocations: vec![SnapshotAllocation { offset: 0, consumed: 10, requested: 3 }],
    };
    out.push([&[4u8][..], &encode_state(&full)].concat());
    out
}

fn directory() -> SnapshotMetadata {
    let segment = |n: u8| SegmentRecord {
        client: [n; 16],
        id: [n + 1; 16],
        name: format!("s{n}"),
        base: 0,
        size: 1 << 20,
        endpoint: "127.0.0.1:9001".into(),
        kind: 0,
        host: "h".into(),
        principal: format!("node:s{n}"),
    };
    let object = |seg: u8, offset: u64, group: Option<&str>| ObjectRecord {
        size: 4096,
        replicas: vec![ReplicaRecord { id: offset + 1, segment: [seg + 1; 16], offset, length: 4096, tier: 0 }],
        checksum: Some(offset),
        group: group.map(str::to_owned),
        hard_pinned: offset == 0,
        soft_pin_ms: 5,
        data_type: 1,
        no_offload: false,
        writer: None,
    };
    let mut state = ReplayState { last_seq: 12, ..ReplayState::default() };
    for s in [1, 3] {
        let r = segment(s);
        state.segments.insert(r.spec().expect("a valid segment").id, r);
    }
    state.objects.insert("default", "a", object(1, 0, None));
    state.objects.insert("default", "b", object(1, 8192, Some("g")));
    state.objects.insert("t2", "a", object(3, 4096, None));
    state.policies = Some([("t2".to_owned(), 1u64 << 30)].into_iter().collect());
    // A running drain of segment 1 and a finished one of segment 3.
    for (id, order, status, seg) in [(7u8, 4u64, 2u8, 1u8), (8, 3, 3, 3)] {
        let drain = crescent_master::ha::DrainRecord {
            id: [id; 16],
            order,
            status,
            segments: vec![[seg + 1; 16]],
            names: vec![format!("s{seg}")],
            max_concurrency: 2,
            ..Default::default()
        };
        state.drains.insert(drain.job_id(), drain);
    }
    SnapshotMetadata { state, batch_id: 3, producer_view: 2 }
}

/// An accepted object directory: canonical, and restorable without overlaps (whatever it says).
fn directory_properties(meta: &SnapshotMetadata) {
    let view = MasterSnapshotView { metadata: Some(meta.clone()), ..MasterSnapshotView::default() };
    let again = snapshot::decode(&snapshot::encode(&view)).expect("an encoded directory decodes");
    assert_eq!(again.metadata.as_ref(), Some(meta), "the directory round-trips");
    let svc = MasterService::new(
        MasterConfig { enable_multi_tenants: true, ..MasterConfig::default() },
        ManualClock::new(Timestamp(1)),
    )
    .expect("a master");
    let _ = svc.restore_replayed(&meta.state);
    assert_eq!(svc.audit().overlapping_replicas, 0, "restored replicas never overlap");
}

/// Reads an allocator state from the front of `data`; the bytes after it are operations.
fn decode_state(data: &[u8]) -> Option<(AllocatorSnapshot, &[u8])> {
    let mut words = data.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()));
    let capacity = words.next()?;
    let n = ((data.len() / 8 - 1) / 3).min(MAX_ALLOCATIONS);
    let allocations = (0..n)
        .map(|_| {
            let (offset, consumed, requested) = (words.next()?, words.next()?, words.next()?);
            Some(SnapshotAllocation { offset, consumed, requested })
        })
        .collect::<Option<Vec<_>>>()?;
    Some((AllocatorSnapshot { capacity, allocations }, &data[8 + n * 24..]))
}

fn allocator(data: &[u8]) {
    let Some((snap, ops)) = decode_state(data) else { return };
    let Ok((mut alloc, mut handles)) = OffsetAllocator::restore(&snap) else { return };
    alloc.check_invariants().expect("a restored allocator is consistent");
    assert_eq!(alloc.snapshot(), snap, "restore gives back the state it was built from");
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

/// Decodes and restores into fresh owners; the bytes of what they hold afterwards, or `None` if refused.
fn restore(mode: u8, payload: &[u8]) -> Option<(SegmentPool, Vec<u8>)> {
    let pool = SegmentPool::new(config(mode)).unwrap();
    let restored = snapshot::decode(payload).ok().and_then(|view| {
        let ssd = LocalSsdManager::new();
        if let Some(meta) = &view.metadata {
            directory_properties(meta);
        }
        pool.restore(view.pool).ok()?;
        ssd.restore(view.local_ssd);
        let metadata = view.metadata;
        Some(snapshot::encode(&MasterSnapshotView { pool: pool.snapshot_view(), local_ssd: ssd.snapshot(), metadata }))
    });
    match restored {
        None => {
            assert!(pool.is_empty(), "a refused snapshot changes nothing");
            None
        }
        Some(bytes) => Some((pool, bytes)),
    }
}

fuzz_target!(init: write_seeds(seeds), |data: &[u8]| {
    let (mode, rest) = crescent_fuzz::split_first(data);
    if mode & 4 != 0 {
        return allocator(rest);
    }
    let payload = if mode & 2 != 0 {
        let mut p = Vec::with_capacity(HEADER_LEN + rest.len());
        p.extend_from_slice(b"CSNP");
        p.extend_from_slice(&VERSION.to_le_bytes());
        p.extend_from_slice(&crc32c::crc32c(rest).to_le_bytes());
        p.extend_from_slice(rest);
        p
    } else {
        rest.to_vec()
    };
    if let Some((pool, bytes)) = restore(mode, &payload) {
        let (again, bytes_again) = restore(mode, &bytes).expect("a restored pool's snapshot restores");
        assert_eq!(bytes_again, bytes, "snapshot . restore is stable");
        pool.take_restored().finish();
        again.take_restored().finish();
    }
});
