//! The master snapshot codec: owners' read views in, the same views out; a damaged payload is a typed error
//! and restores nothing; the encoding is pinned.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::clock::Timestamp;
use crescent_master::local_ssd::{LocalSsdManager, LocalSsdRecord};
use crescent_master::placement::{Placer, ReplicaPlacement};
use crescent_master::segment_pool::{PoolConfig, SegmentPool};
use crescent_master::snapshot::{self, HEADER_LEN, MasterSnapshotView, SnapshotError};
use crescent_proto::{ClientId, ErrorCode, SegmentId, SegmentKind, SegmentSpec, SegmentStatus};

/// A pool with allocations and every restorable status, and LocalSSD registrations.
fn populated() -> (SegmentPool, LocalSsdManager, Vec<crescent_master::segment_pool::AllocatedBuffer>) {
    let p = pool();
    let c = ClientId::random();
    let names = ["a", "b", "g", "s"];
    let specs: Vec<_> = names.iter().map(|n| spec(n, 16 * MIB)).collect();
    for s in &specs {
        p.mount(c, s.clone()).unwrap();
    }
    let placer = Placer::new(Default::default());
    let held = [("a", 3 * MIB + 5), ("a", MIB), ("s", 4096)]
        .iter()
        .map(|(n, size)| ReplicaPlacement::new(&p, &placer).allocate_from(SegmentKind::Memory, n, *size).unwrap())
        .collect();
    p.set_status(specs[1].id, SegmentStatus::Draining).unwrap();
    p.graceful_unmount(specs[2].id, c, Timestamp(777)).unwrap();
    p.suspect(specs[3].id).unwrap();
    let ssd = LocalSsdManager::new();
    for (i, offload) in [true, false].into_iter().enumerate() {
        let client = ClientId::random();
        ssd.register(client, offload).unwrap();
        ssd.report_capacity(client, (i as i64 + 1) << 30).unwrap();
        ssd.adjust_used(client, 1000).unwrap();
    }
    (p, ssd, held)
}

#[test]
fn views_round_trip_through_the_codec_into_the_owners_restores() {
    let (p, ssd, held) = populated();
    let view = MasterSnapshotView { pool: p.snapshot_view(), local_ssd: ssd.snapshot(), metadata: None };
    let bytes = snapshot::encode(&view);
    let decoded = snapshot::decode(&bytes).unwrap();
    assert_eq!(decoded.pool, view.pool, "the pool's view comes back as it went in");
    let expected: Vec<_> = view.local_ssd.iter().map(|(c, r)| (*c, LocalSsdRecord { used: 0, ..*r })).collect();
    assert_eq!(decoded.local_ssd, expected, "registrations are kept; usage is runtime state");

    let (q, ssd2) = (pool(), LocalSsdManager::new());
    assert_eq!(q.restore(decoded.pool).unwrap(), 4);
    ssd2.restore(decoded.local_ssd);
    assert_eq!(ssd2.snapshot(), expected);
    for info in p.segments() {
        let r = q.segment(info.spec.id).unwrap();
        assert_eq!(
            (r.spec, r.client, r.status, r.graceful_deadline, r.usage),
            (info.spec, info.client, info.status, info.graceful_deadline, info.usage)
        );
    }
    // The restored pool's snapshot encodes to the same bytes.
    let again = MasterSnapshotView { pool: q.snapshot_view(), local_ssd: ssd2.snapshot(), metadata: None };
    let expected_bytes =
        snapshot::encode(&MasterSnapshotView { pool: view.pool, local_ssd: expected.clone(), metadata: None });
    assert_eq!(snapshot::encode(&again), expected_bytes);
    drop(held);
}

#[test]
fn a_damaged_payload_is_a_typed_error_and_restores_nothing() {
    let (p, ssd, _held) = populated();
    let bytes =
        snapshot::encode(&MasterSnapshotView { pool: p.snapshot_view(), local_ssd: ssd.snapshot(), metadata: None });
    assert_eq!(snapshot::decode(&[]).unwrap_err(), SnapshotError::BadHeader);
    assert_eq!(snapshot::decode(&bytes[..HEADER_LEN - 1]).unwrap_err(), SnapshotError::BadHeader);
    let mut v = bytes.clone();
    v[4] = 9;
    assert_eq!(snapshot::decode(&v).unwrap_err(), SnapshotError::UnsupportedVersion(9));
    assert_eq!(snapshot::decode(&bytes[..bytes.len() - 1]).unwrap_err(), SnapshotError::Checksum);
    for i in [0, 7, HEADER_LEN, bytes.len() / 2, bytes.len() - 1] {
        let mut x = bytes.clone();
        x[i] ^= 0x5a;
        let e = snapshot::decode(&x).unwrap_err();
        assert_eq!(e.code(), ErrorCode::DeserializeFail, "{e}");
    }
    // A body that passes the checksum but does not decode, or names a LocalSSD client twice.
    let reseal = |body: &[u8]| {
        let mut out = bytes[..6].to_vec();
        out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
        out.extend_from_slice(body);
        out
    };
    assert!(matches!(snapshot::decode(&reseal(&bytes[HEADER_LEN..bytes.len() - 3])), Err(SnapshotError::Corrupt(_))));
    let c = ClientId::random();
    let twice = MasterSnapshotView {
        local_ssd: vec![(c, LocalSsdRecord::default()), (c, LocalSsdRecord::default())],
        ..Default::default()
    };
    let e = snapshot::decode(&snapshot::encode(&twice)).unwrap_err();
    assert!(matches!(&e, SnapshotError::Corrupt(m) if m.contains("twice")), "{e}");
}

#[test]
fn the_encoding_is_pinned() {
    // An empty snapshot: magic, version 6, crc32c of the body, body (no regions, no window, no LocalSSD, no
    // object directory).
    let empty = snapshot::encode(&MasterSnapshotView::default());
    assert_eq!(hex(&empty), "43534e500600c74b674800000000");
    // One region with one allocation, a CXL-less pool, one LocalSSD client.
    let p = SegmentPool::new(PoolConfig { cxl_window: None, ..Default::default() }).unwrap();
    let client = ClientId::from_u64_pair(1, 2);
    let spec = SegmentSpec {
        id: SegmentId::from_u64_pair(3, 4),
        name: "n".into(),
        base: 0x1000,
        size: 4096,
        endpoint: "h:1".into(),
        kind: SegmentKind::Memory,
        host_id: "h".into(),
    };
    p.mount(client, spec).unwrap();
    let placer = Placer::new(Default::default());
    let _b = ReplicaPlacement::new(&p, &placer).allocate_from(SegmentKind::Memory, "n", 100).unwrap();
    let view = MasterSnapshotView {
        pool: p.snapshot_view(),
        local_ssd: vec![(client, LocalSsdRecord { enable_offloading: true, total_capacity: 300, used: 7 })],
        metadata: None,
    };
    let bytes = snapshot::encode(&view);
    assert_eq!(hex(&bytes), GOLDEN_ONE_REGION);
    assert_eq!(snapshot::decode(&bytes).unwrap().pool, view.pool);
}

/// Magic, version, crc; then postcard: 1 region {spec: id (16-byte uuid), "n", base 0x1000, size 4096, "h:1",
/// Memory, "h"; client; status Ok; no deadline; Own allocator {4096, [{0, consumed 104, requested 100}]}}, no
/// CXL window, 1 LocalSSD client {offloading, 300 bytes} (its usage is not encoded), no object directory.
const GOLDEN_ONE_REGION: &str = "43534e5006001a75190e011000000000000000030000000000000004016e8020802003683a3100016810000000000000000100000000000000020100008020010068640001100000000000000001000000000000000201ac0200";

/// The object directory part: one segment, one object in tenant "t", policies {t: 1024}, at batch 2 / seq 5,
/// producer view 3, one drain job. Magic, version, crc; an empty pool part; then `Some` {last_seq 5, batch 2, view
/// 3, [segment record, its principal "node:a" = 06 6e6f64653a61 last], Some([("t", 1024)]), [{"t", [("k", object
/// record)]}], [drain record]}.
#[test]
fn the_object_directory_encoding_is_pinned() {
    use crescent_master::ha::{DrainRecord, ObjectRecord, ReplayState, ReplicaRecord, SegmentRecord};
    use crescent_master::snapshot::SnapshotMetadata;
    let segment = SegmentRecord {
        client: [1; 16],
        id: [2; 16],
        name: "n".into(),
        base: 0,
        size: 4096,
        endpoint: "h:1".into(),
        kind: 0,
        host: "h".into(),
        principal: "node:a".into(),
    };
    let object = ObjectRecord {
        size: 100,
        replicas: vec![ReplicaRecord { id: 9, segment: [2; 16], offset: 0, length: 100, tier: 0 }],
        checksum: Some(7),
        group: Some("g".into()),
        hard_pinned: true,
        soft_pin_ms: 0,
        data_type: 1,
        no_offload: true,
        writer: Some([3; 16]),
    };
    let mut state = ReplayState { last_seq: 5, ..ReplayState::default() };
    state.segments.insert(segment.spec().unwrap().id, segment);
    state.objects.insert("t", "k", object);
    state.policies = Some([("t".to_owned(), 1024)].into_iter().collect());
    let drain = DrainRecord {
        id: [4; 16],
        order: 7,
        status: 2,
        created_at_ms: 300,
        updated_at_ms: 301,
        segments: vec![[2; 16]],
        names: vec!["n".into()],
        targets: vec![],
        max_concurrency: 4,
        succeeded: 5,
        failed: 0,
        migrated_bytes: 300,
        message: String::new(),
    };
    state.drains.insert(drain.job_id(), drain);
    let meta = SnapshotMetadata { state, batch_id: 2, producer_view: 3 };
    let view = MasterSnapshotView { metadata: Some(meta), ..MasterSnapshotView::default() };
    let bytes = snapshot::encode(&view);
    assert_eq!(hex(&bytes), GOLDEN_DIRECTORY);
    assert_eq!(snapshot::decode(&bytes).unwrap(), view);
    // The previous versions' bytes still decode: a build restores the snapshots of the ones before it. Version 5
    // had no drain jobs, version 4
    // did not record the writer (unknown: no client's BatchReplicaClear takes the object), version 3 not
    // `no_offload` either (its objects may be offloaded), version 2 not the segment's principal either.
    let mut v5 = view.clone();
    if let Some(m) = v5.metadata.as_mut() {
        m.state.drains.clear();
    }
    assert_eq!(snapshot::decode(&unhex(GOLDEN_DIRECTORY_V5)).unwrap(), v5);
    let mut v4 = v5;
    if let Some(m) = v4.metadata.as_mut() {
        m.state.objects = each_record(&m.state.objects, |o| o.writer = None);
    }
    assert_eq!(snapshot::decode(&unhex(GOLDEN_DIRECTORY_V4)).unwrap(), v4);
    let mut v3 = v4;
    if let Some(m) = v3.metadata.as_mut() {
        m.state.objects = each_record(&m.state.objects, |o| o.no_offload = false);
    }
    assert_eq!(snapshot::decode(&unhex(GOLDEN_DIRECTORY_V3)).unwrap(), v3);
    let mut v2 = v3;
    if let Some(m) = v2.metadata.as_mut() {
        m.state.segments.values_mut().for_each(|s| s.principal.clear());
    }
    assert_eq!(snapshot::decode(&unhex(GOLDEN_DIRECTORY_V2)).unwrap(), v2);
}

/// `objects` with `change` applied to every record.
fn each_record(
    objects: &crescent_master::ha::ReplayObjects,
    change: impl Fn(&mut crescent_master::ha::ObjectRecord),
) -> crescent_master::ha::ReplayObjects {
    let mut changed = crescent_master::ha::ReplayObjects::default();
    for o in objects.iter() {
        let mut record = o.record();
        change(&mut record);
        changed.insert(o.tenant(), o.key(), record);
    }
    changed
}

/// An HA snapshot's local SSD registrations (its folded log's) travel in the codec's LocalSSD records and come
/// back into its state; the golden bytes of a snapshot without any are unchanged (the records were always there).
#[test]
fn an_ha_snapshot_carries_the_local_ssd_registrations_of_its_state() {
    use crescent_master::ha::ReplayState;
    use crescent_master::snapshot::SnapshotMetadata;
    let (c1, c2) = (ClientId::random(), ClientId::random());
    let mut state = ReplayState { last_seq: 5, ..ReplayState::default() };
    state.local_ssd.insert(c1, LocalSsdRecord { enable_offloading: true, total_capacity: 1 << 30, used: 0 });
    state.local_ssd.insert(c2, LocalSsdRecord { enable_offloading: false, total_capacity: 0, used: 0 });
    let view = MasterSnapshotView {
        metadata: Some(SnapshotMetadata { state, batch_id: 2, producer_view: 3 }),
        ..MasterSnapshotView::default()
    };
    let back = snapshot::decode(&snapshot::encode(&view)).unwrap();
    assert_eq!(back.metadata, view.metadata, "the registrations are back in the state");
    let mut listed: Vec<ClientId> = back.local_ssd.iter().map(|(c, _)| *c).collect();
    listed.sort();
    let mut want = vec![c1, c2];
    want.sort();
    assert_eq!(listed, want, "written in the LocalSSD records");
}

/// [`GOLDEN_DIRECTORY`] as version 2 wrote it: its segment record ends at the host ("h" = 0168).
const GOLDEN_DIRECTORY_V2: &str = "43534e500200b09c1d3900000001050203010101010101010101010101010101010102020202020202020202020202020202016e00802003683a3100016801010174800801017401016b640109020202020202020202020202020202020064000107010167010001";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

/// [`GOLDEN_DIRECTORY`] as version 3 wrote it: its object record ends at the data type (01).
const GOLDEN_DIRECTORY_V3: &str = "43534e500300428b920200000001050203010101010101010101010101010101010102020202020202020202020202020202016e00802003683a31000168066e6f64653a6101010174800801017401016b640109020202020202020202020202020202020064000107010167010001";

/// [`GOLDEN_DIRECTORY`] as version 4 wrote it: its object record ends with `no_offload` (01).
const GOLDEN_DIRECTORY_V4: &str = "43534e500400922f540000000001050203010101010101010101010101010101010102020202020202020202020202020202016e00802003683a31000168066e6f64653a6101010174800801017401016b64010902020202020202020202020202020202006400010701016701000101";

/// [`GOLDEN_DIRECTORY`] as version 5 wrote it: no drain jobs after the objects.
const GOLDEN_DIRECTORY_V5: &str = "43534e500500e13e11bf00000001050203010101010101010101010101010101010102020202020202020202020202020202016e00802003683a31000168066e6f64653a6101010174800801017401016b640109020202020202020202020202020202020064000107010167010001010103030303030303030303030303030303";

/// The object record ends with `no_offload` (01), then the writer: `Some` (01), 16 × 03; then one drain job: id
/// 16 × 04, order 07, status 02, created 300 = ac02, updated 301 = ad02, segments [16 × 02], names ["n"], no targets,
/// concurrency 04, succeeded 05, failed 00, bytes 300 = ac02, message "".
const GOLDEN_DIRECTORY: &str = "43534e500600b02be7e000000001050203010101010101010101010101010101010102020202020202020202020202020202016e00802003683a31000168066e6f64653a6101010174800801017401016b64010902020202020202020202020202020202006400010701016701000101010303030303030303030303030303030301040404040404040404040404040404040702ac02ad02010202020202020202020202020202020201016e00040500ac0200";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn nof_regions_are_left_out() {
    let p = pool();
    let c = ClientId::random();
    let mut nof = spec("nof", 16 * MIB);
    nof.kind = SegmentKind::Nof;
    let memory = spec("m", 16 * MIB);
    p.mount(c, nof).unwrap();
    p.mount(c, memory.clone()).unwrap();
    let view = snapshot::decode(&snapshot::encode(&MasterSnapshotView {
        pool: p.snapshot_view(),
        local_ssd: vec![],
        metadata: None,
    }))
    .unwrap();
    let ids: Vec<_> = view.pool.regions.iter().map(|r| r.spec.id).collect();
    assert_eq!(ids, vec![memory.id]);
}
