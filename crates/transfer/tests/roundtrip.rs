#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Round trips through a real transfer server on 127.0.0.1: sizes, striping, concurrency over bounded lanes,
//! the same-process fast path, lane failure and timeouts.

mod common;

use bytes::Bytes;
use common::{KIB, MIB, local_node, memfd_node, node, pattern, polling_node, tls_node};
use crescent_net::tls::TlsClient;
use crescent_proto::SegmentId;
use crescent_proto::wire::{Hello, HelloAck, HelloReply, Limits, PROTOCOL_VERSION};
use crescent_transfer::{SegmentMemory, SegmentRegistry, TransferClient, TransferConfig, TransferError};
use std::sync::Arc;
use std::time::Duration;

fn client(stripe_size: u64, lanes: usize) -> TransferClient {
    tls_client(stripe_size, lanes, None)
}

fn tls_client(stripe_size: u64, lanes: usize, tls: Option<Arc<TlsClient>>) -> TransferClient {
    TransferClient::new(
        TransferConfig {
            lanes_per_peer: lanes,
            stripe_size,
            write_stripe_size: stripe_size,
            tls,
            ..TransferConfig::default()
        },
        SegmentRegistry::new(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_every_size_striped_and_unstriped() {
    for (n, backing) in
        [(node(160 << 20), "anonymous"), (memfd_node(160 << 20), "memfd"), (polling_node(160 << 20), "polling")]
    {
        round_trips(&n, backing, None).await;
    }
}

/// Over TLS (no sendfile, no direct receive: every byte through rustls) the same bytes arrive, whatever the
/// size, striping or backing; a plain client cannot use a TLS node, nor a TLS client a plain one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_over_tls_and_plain_and_tls_peers_do_not_mix() {
    let t = crescent_testkit::tls();
    for (memfd, backing) in [(false, "tls anonymous"), (true, "tls memfd")] {
        let n = tls_node(160 << 20, memfd, &t.tls);
        round_trips(&n, backing, t.tls.client.clone()).await;
        let plain = client(MIB as u64, 1);
        let e = plain.read(&n.endpoint, n.segment, 0, 1).await.unwrap_err();
        assert!(e.to_string().contains("speaks TLS"), "{backing}: a plain client is told why: {e}");
    }
    let plain_node = node(1 << 20);
    let e = tls_client(MIB as u64, 1, t.tls.client.clone()).read(&plain_node.endpoint, plain_node.segment, 0, 1).await;
    assert!(e.is_err(), "a TLS client took a plain node for a TLS one");
}

/// A node on this host that serves local lanes is reached over its Unix socket, with the same results; a client
/// told not to use local lanes, or a node serving TLS, goes over TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_on_this_host_is_reached_over_its_local_lanes() {
    for (memfd, backing) in [(false, "local anonymous"), (true, "local memfd")] {
        let n = local_node(160 << 20, memfd, None);
        assert!(n.server.serves_local_lanes());
        round_trips(&n, backing, None).await;
        let stats = n.server.stats();
        assert!(stats.accepted > 0 && stats.local_accepted == stats.accepted, "{backing}: every lane local: {stats:?}");
        assert!(stats.located > 0, "{backing}: large transfers copied by the client itself: {stats:?}");
        let tcp = TransferClient::new(
            TransferConfig { local_lanes: false, ..TransferConfig::default() },
            SegmentRegistry::new(),
        );
        tcp.write(&n.endpoint, n.segment, 0, Bytes::from_static(b"over tcp")).await.unwrap();
        let after = n.server.stats();
        assert_eq!((after.accepted, after.local_accepted), (stats.accepted + 1, stats.local_accepted), "{backing}");
    }
    let t = crescent_testkit::tls();
    let n = local_node(1 << 20, false, t.tls.server.clone());
    assert!(!n.server.serves_local_lanes(), "no local lanes beside TLS");
    tls_client(MIB as u64, 1, t.tls.client.clone())
        .write(&n.endpoint, n.segment, 0, Bytes::from_static(b"x"))
        .await
        .unwrap();
    assert_eq!(n.server.stats().local_accepted, 0);
}

async fn round_trips(n: &common::Node, backing: &str, tls: Option<Arc<TlsClient>>) {
    let sizes = [1, 4 * KIB, MIB, 4 * MIB + 7, 64 * MIB];
    for (stripe, striping) in [(MIB as u64, "striped"), (64 * MIB as u64, "unstriped")] {
        let label = format!("{backing} {striping}");
        let c = tls_client(stripe, 4, tls.clone());
        for (i, &size) in sizes.iter().enumerate() {
            // Odd offsets, so stripes are not page aligned.
            let offset = 13 + (i as u64) * 7;
            let data = pattern(size, (i as u64) << 8 | u64::from(stripe == MIB as u64));
            c.write(&n.endpoint, n.segment, offset, Bytes::from(data.clone())).await.unwrap();
            // The bytes are in the destination segment when write returns.
            assert!(*n.mem.lease(offset, size as u64).unwrap() == data[..], "{label} {size}: segment content");
            let back = c.read(&n.endpoint, n.segment, offset, size as u64).await.unwrap();
            assert!(back[..] == data[..], "{label} {size}: read");
            let mut into = vec![0u8; size];
            c.read_into(&n.endpoint, n.segment, offset, &mut into).await.unwrap();
            assert!(into == data, "{label} {size}: read_into");
            into.fill(0);
            let crc = c.read_into_checksummed(&n.endpoint, n.segment, offset, &mut into).await.unwrap();
            assert!(into == data, "{label} {size}: read_into_checksummed");
            assert_eq!(crc, crc32c::crc32c(&data), "{label} {size}: stripes summed in order");
            // The caller's-buffer write, summed as it is sent: same bytes in place, same checksum.
            let offset = offset + 1;
            let crc = c.write_from_checksummed(&n.endpoint, n.segment, offset, &data).await.unwrap();
            assert_eq!(crc, crc32c::crc32c(&data), "{label} {size}: write summed as sent");
            assert!(*n.mem.lease(offset, size as u64).unwrap() == data[..], "{label} {size}: write_from content");
        }
        assert!(c.open_connections(&n.endpoint) <= 4);
    }
    // Zero-length transfers are valid no-ops.
    let c = tls_client(MIB as u64, 1, tls);
    c.write(&n.endpoint, n.segment, 5, Bytes::new()).await.unwrap();
    assert!(c.read(&n.endpoint, n.segment, 5, 0).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_transfers_share_a_bounded_set_of_lanes() {
    const TASKS: usize = 48;
    const SIZE: usize = 300 * KIB; // with 64 KiB stripes: 5 stripes per transfer
    let n = node((TASKS * SIZE) as u64);
    let c = client(64 * KIB as u64, 3);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (c, endpoint, segment) = (c.clone(), n.endpoint.clone(), n.segment);
        tasks.push(tokio::spawn(async move {
            let offset = (t * SIZE) as u64;
            for round in 0..3u64 {
                let data = pattern(SIZE, (t as u64) << 4 | round);
                c.write(&endpoint, segment, offset, Bytes::from(data.clone())).await.unwrap();
                let back = c.read(&endpoint, segment, offset, SIZE as u64).await.unwrap();
                assert!(back[..] == data[..], "task {t} round {round}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for t in 0..TASKS {
        assert!(*n.mem.lease((t * SIZE) as u64, SIZE as u64).unwrap() == pattern(SIZE, (t as u64) << 4 | 2)[..]);
    }
    // The socket count is bounded by the lanes, however many tasks ran.
    assert!(c.open_connections(&n.endpoint) <= 3);
    let stats = n.server.stats();
    assert!(stats.accepted <= 3 && stats.open <= 3, "{stats:?}");
    assert_eq!(stats.malformed, 0);
    c.close_idle();
    assert_eq!(c.open_connections(&n.endpoint), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_process_segments_are_copied_without_a_socket() {
    // A port that nobody listens on: any connection attempt would fail.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = closed.local_addr().unwrap().to_string();
    drop(closed);

    let local = SegmentRegistry::new();
    let segment = SegmentId::random();
    let mem = Arc::new(SegmentMemory::memfd("crescent-local-test", 8 << 20).unwrap());
    local.register(segment, mem.clone());
    let c = TransferClient::new(TransferConfig::default(), local);

    let data = pattern(5 * MIB + 3, 42);
    c.write(&endpoint, segment, 100, Bytes::from(data.clone())).await.unwrap();
    assert!(c.read(&endpoint, segment, 100, data.len() as u64).await.unwrap()[..] == data[..]);
    let mut into = vec![0u8; 1000];
    c.read_into(&endpoint, segment, 100, &mut into).await.unwrap();
    assert_eq!(into, data[..1000]);
    assert!(*mem.lease(100, data.len() as u64).unwrap() == data[..]);
    // Local bounds are checked too.
    assert!(matches!(
        c.write(&endpoint, segment, 8 << 20, Bytes::from_static(b"x")).await,
        Err(TransferError::OutOfRange)
    ));
    assert!(matches!(c.read(&endpoint, segment, u64::MAX, 2).await, Err(TransferError::OutOfRange)));
    assert_eq!(c.open_connections(&endpoint), 0);

    // A segment that is not local does go to the network, and fails there.
    let err = c.read(&endpoint, SegmentId::random(), 0, 1).await.unwrap_err();
    assert!(matches!(err, TransferError::Io(_)), "{err:?}");
    assert_eq!(err.code(), crescent_proto::ErrorCode::TransferFail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_lane_is_dropped_and_the_error_returned() {
    let n = node(MIB as u64);
    let c = client(MIB as u64, 2);
    c.write(&n.endpoint, n.segment, 0, Bytes::from(pattern(1000, 1))).await.unwrap();
    assert_eq!(c.open_connections(&n.endpoint), 1);
    n.server.shutdown().await; // closes the pooled connection from the server side
    let err = c.read(&n.endpoint, n.segment, 0, 1000).await.unwrap_err();
    assert!(matches!(err, TransferError::Io(_) | TransferError::Closed), "{err:?}");
    assert_eq!(c.open_connections(&n.endpoint), 0, "broken lanes are not pooled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_times_out() {
    // A server that completes the hello and then never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    let (hold_tx, hold_rx) = tokio::sync::oneshot::channel::<()>();
    let silent = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let (hello, _) = common::recv::<Hello>(&mut s).await.unwrap();
        assert_eq!(hello.body.version, PROTOCOL_VERSION);
        let ack: HelloReply =
            Ok(HelloAck { version: PROTOCOL_VERSION, capabilities: 0, limits: Limits::DATA, challenge: None });
        common::send(&mut s, 0, &ack, &[]).await;
        let _ = hold_rx.await;
        drop(s);
    });
    let c = TransferClient::new(
        TransferConfig { io_timeout: Duration::from_millis(200), ..TransferConfig::default() },
        SegmentRegistry::new(),
    );
    let err = c.read(&endpoint, SegmentId::random(), 0, 10).await.unwrap_err();
    assert!(matches!(err, TransferError::Timeout), "{err:?}");
    assert_eq!(err.code(), crescent_proto::ErrorCode::RpcTimeout);
    assert_eq!(c.open_connections(&endpoint), 0, "a timed-out lane is dropped");
    hold_tx.send(()).unwrap();
    silent.await.unwrap();
}

#[tokio::test] // a current-thread runtime: server, lanes and stripes all share one thread
async fn works_on_a_single_threaded_runtime() {
    let n = node(16 << 20);
    let c = client(MIB as u64, 4);
    let data = pattern(4 * MIB + 7, 77);
    c.write(&n.endpoint, n.segment, 3, Bytes::from(data.clone())).await.unwrap();
    let mut back = vec![0u8; data.len()];
    c.read_into(&n.endpoint, n.segment, 3, &mut back).await.unwrap();
    assert!(back == data);
}

#[tokio::test(flavor = "current_thread")]
async fn batches_pipeline_small_ranges_and_answer_per_range_in_order() {
    let t = crescent_testkit::tls();
    for (tls, local) in [(None, false), (Some(&t.tls), false), (None, true)] {
        batches_pipeline_over(tls, local).await;
    }
}

/// Over TCP, TLS, or a local lane (`local`: ranges of 64 KiB and more copied by the client itself, the others
/// carried by the lane).
async fn batches_pipeline_over(tls: Option<&crescent_net::tls::Tls>, local: bool) {
    use crescent_transfer::{BatchRead, BatchWrite};
    let n = match tls {
        Some(t) => tls_node(32 * MIB as u64, false, t),
        None if local => local_node(32 * MIB as u64, false, None),
        None => node(32 * MIB as u64),
    };
    let c = tls_client(256 * KIB as u64, 4, tls.and_then(|t| t.client.clone()));
    // Small ranges (pipelined), one larger than a stripe (striped), one outside the segment, one unknown segment.
    let sizes = [1, 4 * KIB, 100, 700 * KIB, 4 * KIB, 64 * KIB];
    let data: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &s)| pattern(s, 100 + i as u64)).collect();
    let offsets: Vec<u64> = (0..sizes.len() as u64).map(|i| i * MIB as u64 + 3).collect();
    let mut writes: Vec<BatchWrite<'_>> = data
        .iter()
        .zip(&offsets)
        .map(|(d, &offset)| BatchWrite { segment: n.segment, grant: None, offset, data: d })
        .collect();
    let past_end = pattern(10, 1);
    writes.insert(2, BatchWrite { segment: n.segment, grant: None, offset: 32 * MIB as u64 - 5, data: &past_end });
    writes.insert(4, BatchWrite { segment: SegmentId::random(), grant: None, offset: 0, data: &past_end });
    let written = c.write_batch(&n.endpoint, &writes).await;
    assert_eq!(written.len(), writes.len());
    for (i, r) in written.iter().enumerate() {
        match i {
            2 => assert!(matches!(r, Err(TransferError::Refused(_))), "out of range: {r:?}"),
            4 => assert!(matches!(r, Err(TransferError::Refused(_))), "unknown segment: {r:?}"),
            _ => assert!(r.is_ok(), "range {i}: {r:?}"),
        }
    }
    for (d, &offset) in data.iter().zip(&offsets) {
        assert!(*n.mem.lease(offset, d.len() as u64).unwrap() == d[..], "written before the batch returned");
    }

    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![0u8; s]).collect();
    let mut past = vec![0u8; 10];
    let mut reads: Vec<BatchRead<'_>> = bufs
        .iter_mut()
        .zip(&offsets)
        .map(|(buf, &offset)| BatchRead { segment: n.segment, grant: None, offset, buf })
        .collect();
    reads.insert(1, BatchRead { segment: n.segment, grant: None, offset: 32 * MIB as u64 - 5, buf: &mut past });
    let crcs = c.read_batch_checksummed(&n.endpoint, &mut reads).await;
    drop(reads);
    assert!(matches!(crcs[1], Err(TransferError::Refused(_))), "{:?}", crcs[1]);
    let good: Vec<_> = crcs.iter().enumerate().filter(|(i, _)| *i != 1).map(|(_, r)| r).collect();
    for ((buf, d), crc) in bufs.iter().zip(&data).zip(good) {
        assert!(buf == d, "read back in input order");
        assert_eq!(*crc.as_ref().unwrap(), crc32c::crc32c(d));
    }
    // A refused range leaves the lanes usable: one socket served every pipelined run.
    assert_eq!(n.server.stats().malformed, 0);
    assert_eq!(n.server.stats().located > 0, local, "large ranges copied locally on a local lane only");
    assert!(c.open_connections(&n.endpoint) <= 4);
    let again = c
        .read_batch_checksummed(
            &n.endpoint,
            &mut [BatchRead { segment: n.segment, grant: None, offset: offsets[0], buf: &mut [0u8; 1] }],
        )
        .await;
    assert!(again[0].is_ok());
}

#[tokio::test(flavor = "current_thread")]
async fn a_batch_to_a_dead_peer_fails_every_range() {
    use crescent_transfer::BatchWrite;
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = closed.local_addr().unwrap().to_string();
    drop(closed);
    let c = client(256 * KIB as u64, 2);
    let data = pattern(100, 3);
    let writes: Vec<BatchWrite<'_>> = (0..5)
        .map(|i| BatchWrite { segment: SegmentId::random(), grant: None, offset: i * 100, data: &data })
        .collect();
    let r = c.write_batch(&endpoint, &writes).await;
    assert_eq!(r.len(), 5);
    assert!(r.iter().all(Result::is_err), "{r:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_peer_dying_mid_batch_fails_the_unanswered_ranges_only() {
    use common::{recv, send};
    use crescent_proto::transfer::{TransferRequest, TransferResponse};
    use crescent_transfer::BatchRead;
    // A fake node: answers the hello and the first read of the run, then drops the connection.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    let fake = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let (hello, _) = recv::<Hello>(&mut s).await.unwrap();
        let ack: HelloReply =
            Ok(HelloAck { version: PROTOCOL_VERSION, limits: Limits::DATA, capabilities: 0, challenge: None });
        assert_eq!(hello.id, 0);
        send(&mut s, 0, &ack, &[]).await;
        let (first, _) = recv::<TransferRequest>(&mut s).await.unwrap();
        let TransferRequest::Read { length, .. } = first.body else { panic!("a read") };
        send(&mut s, first.id, &TransferResponse::Data, &vec![7u8; length as usize]).await;
    });
    let c = client(256 * KIB as u64, 1);
    let segment = SegmentId::random();
    let mut bufs = [[0u8; 100]; 4];
    let mut reads: Vec<BatchRead<'_>> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, buf)| BatchRead { segment, grant: None, offset: i as u64 * 100, buf })
        .collect();
    let r = c.read_batch_checksummed(&endpoint, &mut reads).await;
    fake.await.unwrap();
    drop(reads);
    assert_eq!(*r[0].as_ref().unwrap(), crc32c::crc32c(&[7u8; 100]), "the answered range is good");
    assert!(bufs[0] == [7u8; 100]);
    assert!(r[1..].iter().all(Result::is_err), "{r:?}");
    assert_eq!(c.open_connections(&endpoint), 0, "the broken lane is not pooled");
}

/// A read's range lease must be gone by the time its reader has the last byte: a write of the same range sent
/// right after the read returns (the same client rewriting it, or a new put into a range eviction just freed)
/// is never refused as busy. Several tasks over several lanes, small (pipelined, copied) and large (striped,
/// sent from memory or with sendfile) ranges, many times each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_right_after_a_read_of_the_same_range_is_never_busy() {
    const TASKS: usize = 8;
    const ROUNDS: u64 = 300;
    const SLOT: usize = 512 * KIB;
    for n in [node((TASKS * SLOT) as u64), memfd_node((TASKS * SLOT) as u64)] {
        let c = client(64 * KIB as u64, 4);
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..TASKS {
            let (c, endpoint, segment) = (c.clone(), n.endpoint.clone(), n.segment);
            tasks.spawn(async move {
                let base = (t * SLOT) as u64;
                let mut buf = vec![0u8; SLOT];
                for round in 0..ROUNDS {
                    // Sizes from one byte to several stripes; the write overlaps the read by one byte or more.
                    let size = [1, 4 * KIB, 60 * KIB, 200 * KIB][(round as usize + t) % 4];
                    let data = pattern(size, (t as u64) << 32 | round);
                    let into = &mut buf[..size];
                    c.read_into(&endpoint, segment, base, into).await.unwrap();
                    let at = base + (size as u64 - 1) / 2;
                    if let Err(e) = c.write_from_checksummed(&endpoint, segment, at, &data).await {
                        panic!("task {t} round {round} ({size} B): write after read refused: {e:?}");
                    }
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
    }
}
