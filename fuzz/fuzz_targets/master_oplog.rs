//! The master's oplog payloads (`crescent_master::ha::MasterEntry::decode`) as a restarted master or a standby
//! reads them back, and what it does with them: the applier (`ReplayState`) and the rebuild of a service from
//! the replayed state (`MasterService::restore_replayed`: regions rebuilt from the replicas' ranges).
//!
//! Input: byte 0 is a mode, bytes 1-2 the operation code (little endian), the rest the payload. Mode bit 0:
//! also mount the segment of a PUT_END's first replica (64 KiB) before the entry, and rebuild a service from
//! the result, so fuzzed offsets and lengths reach the allocator restore.
//! Properties: no panic on any bytes; an accepted entry encodes to an entry that decodes to the same value.
#![no_main]

use crescent_fuzz::{split_first, write_seeds};
use crescent_ha::oplog::{OpLogApplier, OpLogEntry};
use crescent_master::clock::{ManualClock, Timestamp};
use crescent_master::ha::payload::{ClientRef, LocalSsdEntry, SegmentRef, SegmentUpdate, TenantPolicies, TenantQuota};
use crescent_master::ha::{DrainRecord, MasterEntry, ObjectRecord, ReplayState, ReplicaRecord, SegmentRecord};
use crescent_master::service::{MasterConfig, MasterService};
use libfuzzer_sys::fuzz_target;

fn seeds() -> Vec<Vec<u8>> {
    let object = ObjectRecord {
        size: 300,
        replicas: vec![ReplicaRecord { id: 7, segment: [0xab; 16], offset: 4096, length: 300, tier: 0 }],
        checksum: Some(0xdead_beef),
        group: Some("g".into()),
        hard_pinned: true,
        soft_pin_ms: 10,
        data_type: 1,
        no_offload: false,
        writer: None,
    };
    let segment = SegmentRecord {
        client: [1; 16],
        id: [2; 16],
        name: "n".into(),
        base: 0,
        size: 1 << 16,
        endpoint: "h:1".into(),
        kind: 0,
        host: "h".into(),
        principal: "node:n".into(),
    };
    let entries = [
        MasterEntry::PutEnd { tenant: "default".into(), key: "k".into(), object },
        MasterEntry::Remove { tenant: "default".into(), key: "k".into() },
        MasterEntry::SegmentMount(segment),
        MasterEntry::SegmentUnmount(SegmentRef { id: [2; 16] }),
        MasterEntry::SegmentUpdate(SegmentUpdate { id: [2; 16], status: 4, deadline_ms: 5 }),
        MasterEntry::TenantQuotaSet { tenant: "a".into(), quota: TenantQuota { bytes: 1 << 20 } },
        MasterEntry::TenantRemove { tenant: "a".into() },
        MasterEntry::TenantPolicies(TenantPolicies { policies: vec![("a".into(), 5)] }),
        MasterEntry::GroupRemove { tenant: "default".into(), group: "g".into() },
        MasterEntry::LocalSsdSet(LocalSsdEntry { client: [3; 16], enable_offloading: true, total_capacity: 1 << 30 }),
        MasterEntry::LocalSsdRemove(ClientRef { client: [3; 16] }),
        MasterEntry::DrainSet(DrainRecord {
            id: [4; 16],
            order: 1,
            status: 2,
            segments: vec![[2; 16]],
            names: vec!["n".into()],
            max_concurrency: 4,
            ..DrainRecord::default()
        }),
    ];
    let mut out = Vec::new();
    for e in entries {
        let e = e.encode();
        for mode in [0u8, 1] {
            out.push([&[mode][..], &e.op.to_le_bytes(), &e.payload].concat());
        }
    }
    out
}

fuzz_target!(init: write_seeds(seeds), |data: &[u8]| {
    let (mode, rest) = split_first(data);
    if rest.len() < 2 {
        return;
    }
    let op = u16::from_le_bytes([rest[0], rest[1]]);
    let raw = OpLogEntry { op, tenant: "default".into(), key: "k".into(), payload: rest[2..].to_vec() };
    let Ok(decoded) = MasterEntry::decode(&raw) else { return };
    // Segment entries are keyed by their id: use the entry the encoder makes.
    let entry = decoded.encode();
    assert_eq!(MasterEntry::decode(&entry).as_ref(), Ok(&decoded), "an accepted entry round-trips");
    let mut state = ReplayState::default();
    let mut seq = 1;
    if mode & 1 != 0
        && let MasterEntry::PutEnd { object, .. } = &decoded
        && let Some(r) = object.replicas.first()
    {
        let segment = SegmentRecord {
            client: [1; 16],
            id: r.segment,
            name: "n".into(),
            base: 0,
            size: 1 << 16,
            endpoint: "h:1".into(),
            kind: 0,
            host: String::new(),
            principal: String::new(),
        };
        state.apply(seq, &MasterEntry::SegmentMount(segment).encode()).expect("a mount applies");
        seq += 1;
    }
    state.apply(seq, &entry).expect("a decoded entry applies");
    if mode & 1 != 0 {
        let svc = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1))).expect("a master");
        let _ = svc.restore_replayed(&state);
        let audit = svc.audit();
        assert_eq!(audit.overlapping_replicas, 0, "restored replicas never overlap");
    }
});
