#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Requests outside what the server hosts are refused with the right code, and the connection (and server)
//! keep working afterwards.

mod common;

use bytes::Bytes;
use common::{KIB, MIB, node, pattern, raw_connect, recv, send};
use crescent_proto::transfer::{TransferRequest, TransferResponse};
use crescent_proto::{ErrorCode, SegmentId};
use crescent_transfer::{MAX_TRANSFER, SegmentRegistry, TransferClient, TransferConfig, TransferError};

fn refused(r: Result<impl std::fmt::Debug, TransferError>) -> ErrorCode {
    match r {
        Err(TransferError::Refused(code)) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_and_unknown_segments_are_refused_on_a_live_connection() {
    let n = node(MIB as u64);
    // One lane: every request below travels on the same connection. No striping either: a striped write is
    // not atomic (stripes inside the segment land even when another is refused; the master only hands out
    // in-range replicas), and this test checks that a refused write changes nothing.
    let config = TransferConfig { lanes_per_peer: 1, stripe_size: 2 * MIB as u64, ..TransferConfig::default() };
    let c = TransferClient::new(config, SegmentRegistry::new());
    let good = pattern(4 * KIB, 7);
    c.write(&n.endpoint, n.segment, 0, Bytes::from(good.clone())).await.unwrap();

    let size = MIB as u64;
    let ep = n.endpoint.as_str();
    // Offset past the end, for reads and writes.
    assert_eq!(refused(c.read(ep, n.segment, size + 1, 1).await), ErrorCode::InvalidParams);
    assert_eq!(refused(c.read(ep, n.segment, size - 1, 2).await), ErrorCode::InvalidParams);
    assert_eq!(refused(c.write(ep, n.segment, size, Bytes::from_static(b"x")).await), ErrorCode::InvalidParams);
    // A refused write of a large payload: the payload is skipped and the connection stays in sync.
    let big = Bytes::from(pattern(MIB, 9));
    assert_eq!(refused(c.write(ep, n.segment, 1, big.clone()).await), ErrorCode::InvalidParams);
    // Unknown segment.
    let unknown = SegmentId::random();
    assert_eq!(refused(c.read(ep, unknown, 0, 1).await), ErrorCode::SegmentNotFound);
    assert_eq!(refused(c.write(ep, unknown, 0, big).await), ErrorCode::SegmentNotFound);
    // Overflowing ranges are caught before anything is sent.
    let err = c.read(ep, n.segment, u64::MAX - 10, 100).await.unwrap_err();
    assert!(matches!(err, TransferError::OutOfRange));
    assert_eq!(err.code(), ErrorCode::InvalidParams);

    // The same connection still works, and the refused writes changed nothing.
    assert!(c.read(ep, n.segment, 0, good.len() as u64).await.unwrap()[..] == good[..]);
    assert!(n.mem.lease(good.len() as u64, (MIB - good.len()) as u64).unwrap().iter().all(|b| *b == 0));
    let stats = n.server.stats();
    assert_eq!((stats.accepted, stats.open, stats.malformed), (1, 1, 0), "one connection served everything");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_requests_are_validated_and_pipelined_replies_come_in_order() {
    let n = node(MIB as u64);
    let mut s = raw_connect(n.addr).await;
    let seg = n.segment;
    let data = pattern(3000, 3);
    // Five requests back to back, before reading any reply.
    send(&mut s, 1, &TransferRequest::Write { segment: seg, offset: 10, grant: None }, &data).await;
    send(&mut s, 2, &TransferRequest::Read { segment: seg, offset: u64::MAX - 5, length: 100, grant: None }, &[]).await;
    send(&mut s, 3, &TransferRequest::Write { segment: seg, offset: u64::MAX - 1, grant: None }, &data).await;
    send(&mut s, 4, &TransferRequest::Read { segment: seg, offset: 0, length: MAX_TRANSFER + 1, grant: None }, &[])
        .await;
    send(&mut s, 5, &TransferRequest::Read { segment: seg, offset: 10, length: data.len() as u64, grant: None }, &[])
        .await;
    send(&mut s, 6, &TransferRequest::Read { segment: seg, offset: 0, length: 1, grant: None }, b"unexpected payload")
        .await;
    send(&mut s, 7, &TransferRequest::Read { segment: SegmentId::random(), offset: 0, length: 1, grant: None }, &[])
        .await;
    let expected = [
        TransferResponse::Written,
        TransferResponse::Error(ErrorCode::InvalidParams),
        TransferResponse::Error(ErrorCode::InvalidParams),
        TransferResponse::Error(ErrorCode::InvalidParams),
        TransferResponse::Data,
        TransferResponse::Error(ErrorCode::InvalidParams),
        TransferResponse::Error(ErrorCode::SegmentNotFound),
    ];
    for (i, want) in expected.iter().enumerate() {
        let (env, payload) = recv::<TransferResponse>(&mut s).await.unwrap();
        assert_eq!(env.id, i as u64 + 1);
        assert_eq!(&env.body, want, "reply {}", env.id);
        if env.body == TransferResponse::Data {
            assert_eq!(payload, data);
        } else {
            assert!(payload.is_empty());
        }
    }
    assert_eq!(n.server.stats().malformed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_racing_an_access_to_the_same_range_is_refused_as_busy() {
    let n = node(MIB as u64);
    let c = TransferClient::new(TransferConfig::default(), SegmentRegistry::new());
    let ep = n.endpoint.as_str();
    {
        // Someone in the hosting process is reading [0, 100) (e.g. a reader whose lease outlived the object).
        let _reading = n.mem.lease(0, 100).unwrap();
        let err = c.write(ep, n.segment, 50, Bytes::from_static(b"overlap")).await.unwrap_err();
        assert!(matches!(err, TransferError::Refused(ErrorCode::ObjectReplicaBusy)), "{err:?}");
        // Readers share; disjoint writers proceed.
        c.read(ep, n.segment, 0, 100).await.unwrap();
        c.write(ep, n.segment, 100, Bytes::from_static(b"adjacent")).await.unwrap();
    }
    c.write(ep, n.segment, 50, Bytes::from_static(b"overlap")).await.unwrap();
    assert_eq!(&c.read(ep, n.segment, 50, 7).await.unwrap()[..], b"overlap");
    assert_eq!(&c.read(ep, n.segment, 100, 8).await.unwrap()[..], b"adjacent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_transfer_reports_its_failing_stripe_and_keeps_the_lanes() {
    let n = node(4 * MIB as u64);
    let c =
        TransferClient::new(TransferConfig { lanes_per_peer: 2, ..TransferConfig::default() }, SegmentRegistry::new());
    let ep = n.endpoint.as_str();
    // 3 MiB at 2 MiB: the stripe crossing the end is refused, the others land.
    let data = pattern(3 * MIB, 5);
    assert_eq!(
        refused(c.write(ep, n.segment, 2 * MIB as u64, Bytes::from(data.clone())).await),
        ErrorCode::InvalidParams
    );
    let mut buf = vec![0u8; 3 * MIB];
    assert_eq!(refused(c.read_into(ep, n.segment, 2 * MIB as u64, &mut buf).await), ErrorCode::InvalidParams);
    // Refusals leave the lanes pooled: everything ran over at most two connections.
    c.write(ep, n.segment, 0, Bytes::from(data.clone())).await.unwrap();
    assert!(c.read(ep, n.segment, 0, data.len() as u64).await.unwrap()[..] == data[..]);
    let stats = n.server.stats();
    assert!(stats.accepted <= 2, "{stats:?}");

    // A peer that is gone fails a 16-stripe write promptly with the connection error.
    let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone_ep = gone.local_addr().unwrap().to_string();
    drop(gone);
    let err = c.write(&gone_ep, n.segment, 0, Bytes::from(pattern(16 * MIB, 1))).await.unwrap_err();
    assert!(matches!(err, TransferError::Io(_)), "{err:?}");
    assert_eq!(c.open_connections(&gone_ep), 0);
}
