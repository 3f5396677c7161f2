//! A reader's lease ends when it has its bytes: the release leaves with the reader's next request, or on its
//! own shortly after if none comes, so a removal right after a read is not refused for the lease's full TTL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_proto::ErrorCode;
use crescent_testkit::{LocalCluster, eventually, pattern};
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
