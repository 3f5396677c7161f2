//! Master request headers as the master's RPC server decodes them (`Frame::decode::<MasterRequest>`), and the
//! `Hello` body a server reads first on every connection.
//!
//! Properties: no panic; an accepted request has the id `request_id` reads, names its operation, and re-encodes
//! stably (encode . decode . encode gives the same bytes); an accepted hello fits a stack `Head` and negotiates
//! or refuses without panicking.
#![no_main]

use bytes::Bytes;
use crescent_fuzz::{reencodes_stably, write_seeds};
use crescent_proto::wire::{Batch, Frame, Head, Hello, Limits, PeerRole, WireKey};
use crescent_proto::{ClientId, MasterRequest, ReplicateConfig, SegmentId, SegmentKind, SegmentSpec};
use libfuzzer_sys::fuzz_target;

fn seeds() -> Vec<Vec<u8>> {
    let client = ClientId::random();
    let spec = SegmentSpec {
        id: SegmentId::random(),
        name: "seg0".into(),
        base: 0x1000_0000,
        size: 64 << 20,
        endpoint: "127.0.0.1:9001".into(),
        kind: SegmentKind::Memory,
        host_id: "h1".into(),
    };
    let key = || WireKey::from("key-1");
    let reqs = vec![
        MasterRequest::Ping { client },
        MasterRequest::ClusterInfo,
        MasterRequest::MountSegment { client, spec: spec.clone() },
        MasterRequest::RemountSegments { client, specs: Batch(vec![spec.clone(), spec]) },
        MasterRequest::PutStart {
            client,
            tenant: "t".into(),
            key: key(),
            size: 4096,
            config: ReplicateConfig::with_replicas(2),
        },
        MasterRequest::PutEnd { client, tenant: String::new(), key: key(), checksum: Some(7), write: 9 },
        MasterRequest::BatchPutStart {
            client,
            tenant: "t".into(),
            items: Batch(vec![(key(), 1), ("b".into(), 2)]),
            config: ReplicateConfig::default(),
            group_ids: Some(Batch(vec!["g".into()])),
            upsert: true,
        },
        MasterRequest::BatchPutEnd {
            client,
            tenant: "t".into(),
            items: Batch(vec![(key(), None, 3), (key(), Some(1), 4)]),
        },
        MasterRequest::BatchPutRevoke { client, tenant: "t".into(), keys: Batch(vec![(key(), 5)]) },
        MasterRequest::BatchGetReplicaList { tenant: "t".into(), keys: Batch(vec![key(), key()]) },
        MasterRequest::RemoveAll { tenant: None, force: true },
        MasterRequest::RemoveByRegex { tenant: "t".into(), pattern: "^a.*".into(), force: false },
        MasterRequest::ListKeys { tenant: "t".into(), prefix: "k".into(), limit: 10 },
    ];
    let mut out: Vec<Vec<u8>> = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| Frame::encode(i as u64 + 1, r, Bytes::new()).unwrap().header.to_vec())
        .collect();
    out.push(Frame::encode(0, &Hello::new(PeerRole::Client, Some(client)), Bytes::new()).unwrap().header.to_vec());
    out.push(Frame::encode(0, &Hello::new(PeerRole::Node, None), Bytes::new()).unwrap().header.to_vec());
    out
}

fuzz_target!(init: write_seeds(seeds), |data: &[u8]| {
    let frame = Frame { header: Bytes::copy_from_slice(data), payload: Bytes::new() };
    if let Ok(env) = frame.decode::<MasterRequest>() {
        assert_eq!(frame.request_id().expect("a decoded header has an id"), env.id);
        let op = env.body.op();
        assert!(!op.name().is_empty() && op.index() < crescent_proto::MasterOp::ALL.len());
        reencodes_stably(env.id, &env.body);
    }
    if let Ok(env) = frame.decode::<Hello>() {
        let head = Head::encode(env.id, &env.body, 0).expect("every hello fits a stack head");
        assert!(head.as_bytes().len() > crescent_proto::wire::FRAME_PREFIX);
        let _ = env.body.negotiate(Limits::CONTROL);
        reencodes_stably(env.id, &env.body);
    }
});
