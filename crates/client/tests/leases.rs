//! A reader's lease ends when it has its bytes: the release leaves with the reader's next request, or on its
//! own shortly after if none comes, so a removal right after a read is not refused for the lease's full TTL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_proto::ErrorCode;
use crescent_testkit::{LocalCluster, eventually, pattern};
use std::sync::atomic::Ordering;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_release_their_leases_single_and_batched() {
    let cluster = LocalCluster::start(1, 16 << 20).await;
    let (reader, other) = (cluster.client(), cluster.client());
    for k in ["a", "b", "c"] {
        reader.put(k, &pattern(1000, 1)).await.unwrap();
    }
    // A lease taken and never released blocks removal: the baseline the releases are measured against.
    assert!(other.is_exist("c").await.unwrap());
    assert_eq!(other.remove("c", false).await.unwrap_err().code(), ErrorCode::ObjectHasLease);

    assert_eq!(reader.get("a").await.unwrap(), pattern(1000, 1));
    // The reader sends nothing more: its release leaves on its own, well inside the 10 s lease.
    let released = eventually(Duration::from_secs(5), || async { other.remove("a", false).await.is_ok() }).await;
    assert!(released, "the single read's lease was released");

    let (mut b, mut c) = (vec![0u8; 1000], vec![0u8; 1000]);
    let mut items: Vec<(&str, &mut [u8])> = vec![("b", &mut b), ("c", &mut c)];
    assert!(reader.batch_get_into(&mut items).await.iter().all(Result::is_ok));
    reader.flush().await.unwrap();
    // The batch's release arrived before anything this client sends after the flush.
    reader.remove("b", false).await.unwrap();
    let s = reader.stat("c").await.unwrap();
    assert_eq!(s.lease_readers, 1, "the existence check still holds c; the batch read let go of it");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_lookup_leases_its_run_and_the_read_after_it_asks_the_master_nothing() {
    let cluster = LocalCluster::start(1, 16 << 20).await;
    let (reader, other) = (cluster.client(), cluster.client());
    for (i, k) in ["b0", "b1", "b2", "b4"].into_iter().enumerate() {
        reader.put(k, &pattern(1000, i as u64)).await.unwrap();
    }
    let lookups = || cluster.master.service().metrics().get_replica_list.requests.load(Ordering::Relaxed);
    // b3 is missing: the run is b0..b2, leased; b4 after the gap is not.
    assert_eq!(reader.batch_prefix_lease(&["b0", "b1", "b2", "b3", "b4"]).await.unwrap(), 3);
    assert_eq!(other.remove("b1", false).await.unwrap_err().code(), ErrorCode::ObjectHasLease);
    other.remove("b4", false).await.unwrap();
    assert_eq!(reader.kept_prefix_lookups(), 1);
    // The read of the run (or of part of it) takes the kept lists: no lookup of its own reaches the master.
    let before = lookups();
    let (mut b0, mut b1) = (vec![0u8; 1000], vec![0u8; 1000]);
    let mut items: Vec<(&str, &mut [u8])> = vec![("b1", &mut b1), ("b0", &mut b0)];
    assert!(reader.batch_get_into(&mut items).await.iter().all(|r| matches!(r, Ok(1000))));
    assert_eq!((b0, b1), (pattern(1000, 0), pattern(1000, 1)));
    assert_eq!(lookups(), before, "no replica lookup for the kept run");
    assert_eq!(reader.kept_prefix_lookups(), 0, "a kept lookup serves one read");
    // The read's release ended the run's leases it read; b2, leased but not read, keeps its lease.
    reader.flush().await.unwrap();
    reader.remove("b0", false).await.unwrap();
    assert_eq!(other.remove("b2", false).await.unwrap_err().code(), ErrorCode::ObjectHasLease);
    // A read whose keys no kept lookup holds looks them up as always.
    let mut b2 = vec![0u8; 1000];
    let mut items: Vec<(&str, &mut [u8])> = vec![("b2", &mut b2)];
    assert!(reader.batch_get_into(&mut items).await[0].is_ok());
    assert_eq!(lookups(), before + 1);
    // No run, no lookup kept; an invalid key ends the run before it reaches the master.
    assert_eq!(reader.batch_prefix_lease(&["b3", "b2"]).await.unwrap(), 0);
    assert_eq!(reader.batch_prefix_lease(&["", "b2"]).await.unwrap(), 0);
    assert_eq!(reader.batch_prefix_lease(&["b2", ""]).await.unwrap(), 1);
    cluster.shutdown().await;
}
