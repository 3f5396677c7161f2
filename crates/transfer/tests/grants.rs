//! Data-plane grants against a real transfer server that authenticates (issue 17 §2): a batch's ranges on one
//! segment travel under one grant, checked once per run of requests, and each range only as granted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_net::auth::{Credential, Keyring};
use crescent_net::grant::{Bearer, GrantOp, unix_ms};
use crescent_net::host::{HostKeys, NodeKeys};
use crescent_proto::transfer::{Grant, GrantRange};
use crescent_proto::{ClientId, ErrorCode, Principal, SegmentId};
use crescent_transfer::{
    BatchRead, BatchWrite, Place, RangeGrant, SegmentMemory, SegmentRegistry, Tickets, TransferClient, TransferConfig,
    TransferError, TransferServer, TransferServerHandle,
};
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

const SECRET: &str = "0123456789abcdef-grants-test";
const KIB4: u64 = 4096;

/// Tickets minted from the host's keys, as the master would issue them.
#[derive(Debug)]
struct Minted {
    keys: Arc<HostKeys>,
    client: Principal,
    id: ClientId,
}

impl Tickets for Minted {
    fn ticket<'a>(&'a self, _: &'a str, _: SegmentId) -> BoxFuture<'a, Result<Credential, TransferError>> {
        Box::pin(async move { Ok(self.keys.ticket(&self.client, self.id, unix_ms() + 60_000)) })
    }

    fn forget(&self, _: &str) {}
}

/// A node (`node:g`) hosting one 1 MiB segment, the master's keys for it, and a client of `tenant:a` with its
/// bearer.
struct Setup {
    node: TransferServerHandle,
    segment: SegmentId,
    master: Arc<HostKeys>,
    client: TransferClient,
    bearer: Bearer,
}

fn setup() -> Setup {
    let ring = Keyring::parse(SECRET).unwrap();
    let host: Principal = "node:g".parse().unwrap();
    let master = Arc::new(ring.host_keys(&host, None));
    let segment = SegmentId::random();
    let segments = SegmentRegistry::new();
    segments.register(segment, Arc::new(SegmentMemory::anonymous(1 << 20).unwrap()));
    let node = TransferServer::bind("127.0.0.1:0".parse().unwrap(), segments)
        .unwrap()
        .with_keys(Some(Arc::new(NodeKeys::fixed(ring.credential(host)))))
        .spawn()
        .unwrap();
    let (client, id): (Principal, _) = ("tenant:a".parse().unwrap(), ClientId::random());
    let bearer = Bearer::new(client.clone(), Some(id));
    let config = TransferConfig {
        tickets: Some(Arc::new(Minted { keys: master.clone(), client, id })),
        client_id: Some(id),
        lanes_per_peer: 1,
        io_timeout: Duration::from_secs(10),
        ..TransferConfig::default()
    };
    Setup { node, segment, master, client: TransferClient::new(config, SegmentRegistry::default()), bearer }
}

impl Setup {
    fn endpoint(&self) -> String {
        self.node.local_addr().to_string()
    }

    /// One grant over `ranges` of the segment, for a minute.
    fn grant(&self, op: GrantOp, ranges: &[(u64, u64)]) -> Arc<Grant> {
        let ranges = ranges.iter().map(|&(offset, length)| GrantRange { offset, length }).collect();
        Arc::new(self.master.seal_grant(op, &self.segment, &self.bearer, ranges, unix_ms() + 60_000))
    }
}

fn refused<T: std::fmt::Debug>(r: &Result<T, TransferError>) -> Option<ErrorCode> {
    match r {
        Err(TransferError::Refused(code)) => Some(*code),
        _ => None,
    }
}

#[tokio::test]
async fn a_batch_on_one_segment_is_checked_once_per_run_and_each_range_only_as_granted() {
    let s = setup();
    let endpoint = s.endpoint();
    let ranges: Vec<(u64, u64)> = (0..32).map(|i| (i * KIB4, KIB4)).collect();
    let values: Vec<Vec<u8>> = (0..32u8).map(|i| vec![i; KIB4 as usize]).collect();
    let write = s.grant(GrantOp::Write, &ranges);
    let writes: Vec<BatchWrite<'_>> = (0..32)
        .map(|i| BatchWrite {
            segment: s.segment,
            grant: Some(RangeGrant::new(write.clone(), i as u16)),
            offset: i * KIB4,
            data: &values[i as usize],
        })
        .collect();
    let before = s.node.stats().grants_checked;
    assert!(s.client.write_batch(&endpoint, &writes).await.iter().all(Result::is_ok));
    assert_eq!(s.node.stats().grants_checked - before, 1, "32 writes under one grant: one check");

    // Reads under a read grant; one range named by another's index is refused, the rest read.
    let read = s.grant(GrantOp::Read, &ranges);
    let mut bufs = vec![vec![0u8; KIB4 as usize]; 32];
    let mut reads: Vec<BatchRead<'_>> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, buf)| BatchRead {
            segment: s.segment,
            grant: Some(RangeGrant::new(read.clone(), if i == 5 { 6 } else { i as u16 })),
            offset: i as u64 * KIB4,
            buf,
        })
        .collect();
    let results = s.client.read_batch_checksummed(&endpoint, &mut reads).await;
    for (i, r) in results.iter().enumerate() {
        if i == 5 {
            assert_eq!(refused(r), Some(ErrorCode::PermissionDenied), "range 6's index on range 5");
        } else {
            assert_eq!(*r.as_ref().unwrap(), crc32c::crc32c(&values[i]), "range {i}");
        }
    }
    assert_eq!(s.node.stats().grants_checked - before, 2);
    // The write grant does not read; a grant of another segment's ranges does not cover this one.
    let mut buf = vec![0u8; KIB4 as usize];
    let as_write = Place::new(s.segment, Some(RangeGrant::new(write.clone(), 0)));
    let r = s.client.read_into(&endpoint, as_write, 0, &mut buf).await;
    assert_eq!(refused(&r), Some(ErrorCode::PermissionDenied));
}

#[tokio::test]
async fn a_run_naming_more_grants_than_a_connection_holds_carries_them_again() {
    let s = setup();
    let endpoint = s.endpoint();
    // 20 grants of one range each, then the first again: 16 slots, so the first was displaced and is carried
    // anew; every write lands.
    let grants: Vec<Arc<Grant>> = (0..20).map(|i| s.grant(GrantOp::Write, &[(i * KIB4, KIB4)])).collect();
    let data = vec![9u8; KIB4 as usize];
    let mut writes: Vec<BatchWrite<'_>> = (0..20)
        .map(|i| BatchWrite {
            segment: s.segment,
            grant: Some(RangeGrant::new(grants[i as usize].clone(), 0)),
            offset: i * KIB4,
            data: &data,
        })
        .collect();
    writes.push(writes[0].clone());
    let before = s.node.stats().grants_checked;
    let results = s.client.write_batch(&endpoint, &writes).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(s.node.stats().grants_checked - before, 21, "each grant once, the displaced one twice");
    assert_eq!(s.node.stats().grant_refusals, 0);
}
