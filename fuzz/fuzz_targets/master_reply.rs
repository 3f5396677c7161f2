//! Master reply headers as a client decodes them (`Frame::decode::<MasterReply>`, i.e.
//! `Result<MasterResponse, ErrorFrame>`), and the `HelloReply` a client reads after its hello.
//!
//! Properties: no panic; an accepted reply has the id `request_id` reads, displays, and re-encodes stably
//! (byte-wise: replies may carry floats, so values are not compared).
#![no_main]

use bytes::Bytes;
use crescent_fuzz::{reencodes_stably, write_seeds};
use crescent_proto::rpc::{GrantedBatch, SnapshotChunk};
use crescent_proto::transfer::{GRANT_TAG_LEN, Grant, GrantRange, GrantRef};
use crescent_proto::wire::{ErrorFrame, Frame, Hello, HelloReply, Limits, PeerRole};
use crescent_proto::{
    ClientStatus, ClusterInfo, ErrorCode, GetReplicaListResponse, MasterReply, MasterResponse, ObjectStat,
    RemoveAllReport, ReplicaDescriptor, ReplicaLocation, ReplicaStatus, SegmentId, SegmentStatus,
};
use libfuzzer_sys::fuzz_target;

fn seeds() -> Vec<Vec<u8>> {
    let list = GetReplicaListResponse { replicas: Vec::new(), lease_ttl_ms: 5000, checksum: Some(3), size: 4096 };
    let segment_id = SegmentId::random();
    let replica = |offset, grant| ReplicaDescriptor {
        id: 1,
        location: ReplicaLocation::Memory { segment_id, offset, length: 4096, endpoint: "127.0.0.1:1".into() },
        status: ReplicaStatus::Complete,
        grant,
    };
    let ranges = vec![GrantRange { offset: 0, length: 4096 }, GrantRange { offset: 8192, length: 4096 }];
    let grant = Grant { ranges, expires_ms: u64::MAX, epoch: 7, tag: [3; GRANT_TAG_LEN] };
    let shared = |range| Some(GrantRef::Shared { grant: 0, range });
    let granted =
        GetReplicaListResponse { replicas: vec![replica(0, shared(0)), replica(8192, shared(1))], ..list.clone() };
    let replies: Vec<MasterReply> = vec![
        Ok(MasterResponse::Pong { status: ClientStatus::Ok, view_version: 0 }),
        Ok(MasterResponse::Done),
        Ok(MasterResponse::Replicas(vec![replica(0, Some(GrantRef::Own(grant.clone())))])),
        Ok(MasterResponse::ReplicaList(list.clone())),
        Ok(MasterResponse::Stat(ObjectStat {
            size: 1,
            checksum: None,
            replicas: Vec::new(),
            lease_remaining_ms: 0,
            lease_readers: 0,
            soft_pin_remaining_ms: 0,
            hard_pinned: false,
            writing: true,
        })),
        Ok(MasterResponse::ClusterInfo(ClusterInfo {
            multi_tenant: true,
            lease_ttl_ms: 5000,
            memory_segments: 2,
            memory_capacity: 1 << 30,
            memory_used: 1 << 20,
            memory_held: 1 << 19,
            eviction_high_watermark: 0.95,
            largest_free: 1 << 29,
            memories: Vec::new(),
            disks: Vec::new(),
        })),
        Ok(MasterResponse::Keys(vec!["a".into(), "b".into()])),
        Ok(MasterResponse::Status(SegmentStatus::Ok)),
        Ok(MasterResponse::BatchDone(vec![Ok(()), Err(ErrorCode::ObjectNotFound)])),
        Ok(MasterResponse::BatchReplicaList(GrantedBatch {
            items: vec![Ok(list), Ok(granted), Err(ErrorCode::InvalidKey)],
            grants: vec![grant],
        })),
        Ok(MasterResponse::BatchExists(vec![Ok(true), Err(ErrorCode::InvalidParams)])),
        Ok(MasterResponse::RemovedAll(RemoveAllReport { removed: 3, ..Default::default() })),
        Ok(MasterResponse::SnapshotChunk(SnapshotChunk {
            id: "00000000000000000004-00000000000000000061".into(),
            batch_id: 4,
            last_seq: 61,
            producer_view: 2,
            size: 9000,
            crc32c: 0xdead_beef,
            offset: 4096,
        })),
        Err(ErrorFrame { code: ErrorCode::ObjectNotFound, message: "key \"x\" not found".into() }),
    ];
    let mut out: Vec<Vec<u8>> = replies
        .iter()
        .enumerate()
        .map(|(i, r)| Frame::encode(i as u64 + 1, r, Bytes::new()).unwrap().header.to_vec())
        .collect();
    let ack: HelloReply = Ok(Hello::new(PeerRole::Client, None).negotiate(Limits::CONTROL).unwrap());
    out.push(Frame::encode(0, &ack, Bytes::new()).unwrap().header.to_vec());
    let refused: HelloReply = Err(ErrorFrame::bare(ErrorCode::InvalidVersion));
    out.push(Frame::encode(0, &refused, Bytes::new()).unwrap().header.to_vec());
    out
}

fuzz_target!(init: write_seeds(seeds), |data: &[u8]| {
    let frame = Frame { header: Bytes::copy_from_slice(data), payload: Bytes::new() };
    if let Ok(env) = frame.decode::<MasterReply>() {
        assert_eq!(frame.request_id().expect("a decoded header has an id"), env.id);
        if let Err(e) = &env.body {
            let _ = e.to_string();
        }
        reencodes_stably(env.id, &env.body);
    }
    if let Ok(env) = frame.decode::<HelloReply>() {
        if let Err(e) = &env.body {
            let _ = e.to_string();
        }
        reencodes_stably(env.id, &env.body);
    }
});
