//! A client that hosts its own segment (embedded mode), against a master server in this process: its own
//! replicas are reached by memcpy, corrupt bytes are refused, and a remote node's replicas over TCP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_client::{Client, ClientConfig};
use crescent_node::StorageNode;
use crescent_proto::{ErrorCode, ReplicateConfig};
use crescent_testkit::LocalCluster;
use crescent_transfer::SegmentRegistry;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_client_reads_its_own_replicas_by_memcpy_and_refuses_corrupt_bytes() {
    let cluster = LocalCluster::start(0, 0).await;
    let addr = cluster.addr();
    let local = SegmentRegistry::default();
    let node = StorageNode::start_with(cluster.node_config(16 << 20), local.clone()).await.unwrap();
    let client = Client::with_local_segments(ClientConfig::new(addr.clone()), local.clone());
    let value: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    client.put_from("k", &value, &ReplicateConfig::default()).await.unwrap();
    assert_eq!(client.get("k").await.unwrap(), value);
    let endpoint = node.endpoint().to_string();
    assert_eq!(client.transfer().open_connections(&endpoint), 0, "own replicas never touch a socket");

    // Corrupt the stored bytes behind the master's back: the read is refused, never returned.
    let stat = client.stat("k").await.unwrap();
    let seg = stat.replicas[0].location.segment_id().unwrap();
    let offset = match &stat.replicas[0].location {
        crescent_proto::ReplicaLocation::Memory { offset, .. } => *offset,
        other => panic!("{other:?}"),
    };
    local.get(&seg).unwrap().write_at(offset + 10, &[0xff]).unwrap();
    let err = client.get("k").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::ChecksumMismatch);
    assert_eq!(client.checksum_mismatches(), 1);

    // Another client (not hosting the segment) reads the same object over TCP.
    let remote = Client::new(ClientConfig::new(addr));
    client.put_from("k2", &value, &ReplicateConfig::default()).await.unwrap();
    assert_eq!(remote.get("k2").await.unwrap(), value);
    assert!(remote.transfer().open_connections(&endpoint) > 0);
    node.shutdown(std::time::Duration::ZERO).await.unwrap();
    assert_eq!(remote.get("k2").await.unwrap_err().code(), ErrorCode::ObjectNotFound, "unmounted on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_clients_batches_are_copied_and_summed_in_process_and_verified() {
    let cluster = LocalCluster::start(0, 0).await;
    let addr = cluster.addr();
    let local = SegmentRegistry::default();
    let node = StorageNode::start_with(cluster.node_config(64 << 20), local.clone()).await.unwrap();
    let client = Client::with_local_segments(ClientConfig::new(addr.clone()), local.clone());
    // Odd sizes, and enough bytes in all (and one value alone) for the copies to be split over
    // two threads, cutting ranges in the middle.
    let sizes = [1usize, 4093, 65_537, (3 << 20) + 7, 1 << 20, (2 << 20) - 1];
    let values: Vec<Vec<u8>> =
        sizes.iter().enumerate().map(|(k, &n)| (0..n).map(|i| (i * 7 + k * 13) as u8).collect()).collect();
    let keys: Vec<String> = (0..sizes.len()).map(|k| format!("b{k}")).collect();
    let items: Vec<(&str, &[u8])> = keys.iter().map(|k| k.as_str()).zip(values.iter().map(|v| v.as_slice())).collect();
    for r in client.batch_put_from(&items, &ReplicateConfig::default()).await {
        r.unwrap();
    }
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
    let mut reads: Vec<(&str, &mut [u8])> =
        keys.iter().map(|k| k.as_str()).zip(bufs.iter_mut().map(|b| b.as_mut_slice())).collect();
    let got: Vec<usize> = client.batch_get_into(&mut reads).await.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(got, sizes);
    assert_eq!(bufs, values);
    let endpoint = node.endpoint().to_string();
    assert_eq!(client.transfer().open_connections(&endpoint), 0, "own replicas never touch a socket");
    // The checksums the copies summed are the stored ones: a reader over TCP verifies the bytes against them.
    let remote = Client::new(ClientConfig::new(addr));
    for (k, v) in keys.iter().zip(&values) {
        assert_eq!(&remote.get(k).await.unwrap(), v, "{k}");
    }

    // A corrupted object fails its own read in a batch; the others are read.
    let stat = client.stat("b3").await.unwrap();
    let seg = stat.replicas[0].location.segment_id().unwrap();
    let offset = match &stat.replicas[0].location {
        crescent_proto::ReplicaLocation::Memory { offset, .. } => *offset,
        other => panic!("{other:?}"),
    };
    local.get(&seg).unwrap().write_at(offset + (2 << 20), &[!values[3][2 << 20]]).unwrap();
    let mut reads: Vec<(&str, &mut [u8])> =
        keys.iter().map(|k| k.as_str()).zip(bufs.iter_mut().map(|b| b.as_mut_slice())).collect();
    let got = client.batch_get_into(&mut reads).await;
    for (k, r) in got.iter().enumerate() {
        match r {
            Err(e) if k == 3 => assert_eq!(e.code(), ErrorCode::ChecksumMismatch),
            Ok(n) if k != 3 => assert_eq!(*n, sizes[k]),
            other => panic!("object {k}: {other:?}"),
        }
    }
    assert_eq!(client.checksum_mismatches(), 1);
    node.shutdown(std::time::Duration::ZERO).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_address_list_falls_through_to_a_reachable_master() {
    let cluster = LocalCluster::start(0, 0).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    // `dead` is closed again when the listener drops: connecting to it is refused.
    let list = format!("{dead}, {}", cluster.addr());
    let client = Client::new(ClientConfig::new(list));
    assert!(!client.is_exist("nothing").await.unwrap());
    let none = Client::new(ClientConfig::new(format!("{dead}")));
    assert_eq!(none.is_exist("nothing").await.unwrap_err().code(), ErrorCode::RpcFail);
}

#[test]
fn a_blocking_client_serves_several_calling_threads_at_once() {
    // The cluster runs on its own runtime; the blocking client drives its calls on the callers' threads.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cluster = rt.block_on(LocalCluster::start(1, 64 << 20));
    let client = crescent_client::BlockingClient::new(ClientConfig::new(cluster.addr())).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let client = &client;
            s.spawn(move || {
                for i in 0..50u32 {
                    let key = format!("t{t}-{i}");
                    let value = vec![t ^ i as u8; 1000 + i as usize * 300];
                    client.put(&key, &value).unwrap();
                    assert_eq!(client.get(&key).unwrap(), value, "{key}");
                }
            });
        }
    });
    let keys: Vec<String> = (0..4).flat_map(|t| (0..50).map(move |i| format!("t{t}-{i}"))).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    assert!(client.batch_is_exist(&refs).into_iter().all(|r| r.unwrap()), "every thread's puts are visible");
    rt.block_on(cluster.shutdown());
}
