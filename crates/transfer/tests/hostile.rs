#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Malformed and hostile frames from raw sockets: each gets an error frame (where the protocol allows one) and
//! loses its own connection, while another client's transfers keep succeeding.

mod common;

use bytes::Bytes;
use common::{MIB, Node, closed, node, pattern, raw_connect, recv, send, send_raw};
use crescent_proto::transfer::TransferRequest;
use crescent_proto::transfer::TransferResponse;
use crescent_proto::wire::{Envelope, ErrorFrame, Hello, HelloReply, PeerRole};
use crescent_proto::{ErrorCode, SegmentId};
use crescent_transfer::{SegmentRegistry, TransferClient, TransferConfig, TransferServer};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Expects an error frame under request id 0 and then the end of the connection.
async fn expect_error_frame(s: &mut TcpStream) -> ErrorFrame {
    let (env, payload) = recv::<ErrorFrame>(s).await.expect("an error frame before the close");
    assert_eq!(env.id, 0);
    assert!(payload.is_empty());
    assert!(closed(s).await, "the connection is closed after the error frame");
    env.body
}

/// Expects a refused hello and then the end of the connection.
async fn expect_hello_refused(s: &mut TcpStream) -> ErrorFrame {
    let (env, _) = recv::<HelloReply>(s).await.expect("a hello reply before the close");
    assert_eq!(env.id, 0);
    assert!(closed(s).await, "the connection is closed after the refusal");
    env.body.unwrap_err()
}

/// A well-behaved client hammering the node until `stop`; returns how many round trips succeeded.
fn background_traffic(n: &Node, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    let (endpoint, segment) = (n.endpoint.clone(), n.segment);
    tokio::spawn(async move {
        let c = TransferClient::new(
            TransferConfig { stripe_size: 256 << 10, write_stripe_size: 256 << 10, ..TransferConfig::default() },
            SegmentRegistry::new(),
        );
        let done = AtomicU64::new(0);
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) || round < 3 {
            let data = pattern(MIB + 5, round);
            c.write(&endpoint, segment, 4096, Bytes::from(data.clone())).await.unwrap();
            assert!(c.read(&endpoint, segment, 4096, data.len() as u64).await.unwrap()[..] == data[..]);
            done.fetch_add(1, Ordering::Relaxed);
            round += 1;
            tokio::task::yield_now().await;
        }
        done.load(Ordering::Relaxed)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_frames_close_only_their_own_connection() {
    let n = node(4 * MIB as u64);
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = background_traffic(&n, stop.clone());
    let mut hostile = 0;

    // 1. A hello with the wrong magic.
    let mut s = TcpStream::connect(n.addr).await.unwrap();
    send(&mut s, 0, &Hello { magic: *b"HTTP", ..Hello::new(PeerRole::Client, None) }, &[]).await;
    assert_eq!(expect_hello_refused(&mut s).await.code, ErrorCode::InvalidParams);
    hostile += 1;

    // 2. A hello from a future protocol only.
    let mut s = TcpStream::connect(n.addr).await.unwrap();
    send(&mut s, 0, &Hello { version: 90, min_version: 90, ..Hello::new(PeerRole::Client, None) }, &[]).await;
    assert_eq!(expect_hello_refused(&mut s).await.code, ErrorCode::InvalidVersion);
    hostile += 1;

    // 3. Not our protocol at all (an HTTP request): the "length" is huge, refused before allocation.
    let mut s = TcpStream::connect(n.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    assert_eq!(expect_hello_refused(&mut s).await.code, ErrorCode::InvalidParams);
    hostile += 1;

    // 4. A hello whose header is garbage.
    let mut s = TcpStream::connect(n.addr).await.unwrap();
    send_raw(&mut s, &[0xff; 40], &[]).await;
    assert_eq!(expect_hello_refused(&mut s).await.code, ErrorCode::InvalidParams);
    hostile += 1;

    // 5. After a good hello: an oversized length prefix (4 GiB), refused before anything is allocated.
    let mut s = raw_connect(n.addr).await;
    s.write_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 10]).await.unwrap();
    let e = expect_error_frame(&mut s).await;
    assert_eq!(e.code, ErrorCode::InvalidParams);
    assert!(e.message.contains("exceeds"), "{}", e.message);
    hostile += 1;

    // 6. Just over the data-plane limit, with bytes following: still refused, error frame still delivered.
    let mut s = raw_connect(n.addr).await;
    let len = crescent_proto::wire::Limits::DATA.max_frame + 1;
    let mut frame = len.to_be_bytes().to_vec();
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame.extend_from_slice(&[0u8; 4096]);
    s.write_all(&frame).await.unwrap();
    assert_eq!(expect_error_frame(&mut s).await.code, ErrorCode::InvalidParams);
    hostile += 1;

    // 7. A header longer than the frame.
    let mut s = raw_connect(n.addr).await;
    s.write_all(&[0, 0, 0, 12, 0, 0, 0, 200]).await.unwrap();
    s.write_all(&[1; 8]).await.unwrap();
    let e = expect_error_frame(&mut s).await;
    assert!(e.message.contains("header longer"), "{}", e.message);
    hostile += 1;

    // 8. A frame too short to hold its header length.
    let mut s = raw_connect(n.addr).await;
    s.write_all(&[0, 0, 0, 3, 0, 0, 0]).await.unwrap();
    assert_eq!(expect_error_frame(&mut s).await.code, ErrorCode::InvalidParams);
    hostile += 1;

    // 9. Garbage header bytes (an unknown request variant) with a payload.
    let mut s = raw_connect(n.addr).await;
    send_raw(&mut s, &[1, 0x7f, 0xde, 0xad, 0xbe, 0xef], &[0u8; 1000]).await;
    assert_eq!(expect_error_frame(&mut s).await.code, ErrorCode::InvalidParams);
    hostile += 1;

    // 10. Request id 0 (reserved for the hello).
    let mut s = raw_connect(n.addr).await;
    send(&mut s, 0, &TransferRequest::Read { segment: n.segment, offset: 0, length: 1, grant: None }, &[]).await;
    assert_eq!(expect_error_frame(&mut s).await.code, ErrorCode::InvalidParams);
    hostile += 1;

    // 11. A second hello where a request is expected is garbage too.
    let mut s = raw_connect(n.addr).await;
    send(&mut s, 1, &Hello::new(PeerRole::Client, None), &[]).await;
    assert_eq!(expect_error_frame(&mut s).await.code, ErrorCode::InvalidParams);
    hostile += 1;

    // Not counted as protocol violations: a peer vanishing mid-payload, or before its hello. Its write lease
    // lasts until the server sees it gone, so it targets a range the background traffic does not touch (a
    // read overlapping it would rightly be refused as busy meanwhile).
    let mut s = raw_connect(n.addr).await;
    let offset = 3 * MIB as u64;
    let header = postcard::to_stdvec(&Envelope {
        id: 1,
        body: TransferRequest::Write { segment: n.segment, offset, grant: None },
    })
    .unwrap();
    let mut partial = crescent_proto::wire::frame_prefix(header.len(), 1 << 20).unwrap().to_vec();
    partial.extend_from_slice(&header);
    partial.extend_from_slice(&[7u8; 1000]);
    s.write_all(&partial).await.unwrap();
    drop(s);
    drop(TcpStream::connect(n.addr).await.unwrap());

    // The well-behaved client kept going throughout, and keeps going now.
    stop.store(true, Ordering::Relaxed);
    let rounds = traffic.await.unwrap();
    assert!(rounds >= 3);
    let c = TransferClient::new(TransferConfig::default(), SegmentRegistry::new());
    let data = pattern(3 * MIB, 99);
    c.write(&n.endpoint, n.segment, 0, Bytes::from(data.clone())).await.unwrap();
    assert!(c.read(&n.endpoint, n.segment, 0, data.len() as u64).await.unwrap()[..] == data[..]);
    assert_eq!(n.server.stats().malformed, hostile);
    let err = c.read(&n.endpoint, SegmentId::random(), 0, 1).await.unwrap_err();
    assert!(matches!(err, crescent_transfer::TransferError::Refused(ErrorCode::SegmentNotFound)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_frames_and_silent_peers_are_cut_off_after_the_io_timeout() {
    let segments = SegmentRegistry::new();
    let server = TransferServer::bind("127.0.0.1:0".parse().unwrap(), segments)
        .unwrap()
        .with_io_timeout(Duration::from_millis(200))
        .spawn()
        .unwrap();
    // Connects and never says hello.
    let mut silent = TcpStream::connect(server.local_addr()).await.unwrap();
    // Starts a frame and stalls in the middle of its prefix.
    let mut stalled = raw_connect(server.local_addr()).await;
    stalled.write_all(&[0, 0, 0]).await.unwrap();
    // An idle connection between frames is a pooled lane: it is kept.
    let mut idle = raw_connect(server.local_addr()).await;
    assert!(closed(&mut silent).await);
    assert!(closed(&mut stalled).await);
    send(&mut idle, 1, &TransferRequest::Read { segment: SegmentId::random(), offset: 0, length: 1, grant: None }, &[])
        .await;
    let (env, _) = recv::<TransferResponse>(&mut idle).await.unwrap();
    assert_eq!(env.body, TransferResponse::Error(ErrorCode::SegmentNotFound));
    assert_eq!(server.stats().malformed, 0);
    server.shutdown().await;
    assert!(closed(&mut idle).await, "shutdown closes open connections");
}
