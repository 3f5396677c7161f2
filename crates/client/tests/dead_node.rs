//! A storage node that dies stops costing writes at once: the first write that cannot reach it reports its
//! segments, the master stops placing on them and stops handing out their replicas, and writes and reads go
//! on with the live node. A node that comes back (its next ping) is in service again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_node::StorageNode;
use crescent_proto::{ReplicateConfig, SegmentStatus};
use crescent_testkit::{LocalCluster, pattern};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_keep_succeeding_after_a_node_dies_and_surviving_replicas_stay_readable() {
    let mut cluster = LocalCluster::start(2, 16 << 20).await;
    let client = cluster.client();
    let two = ReplicateConfig::with_replicas(2);
    client.put_from("both", &pattern(4096, 1), &two).await.unwrap();
    // The second node dies without unmounting (dropped: its server stops, it never pings again).
    let dead: StorageNode = cluster.nodes.pop().unwrap();
    let dead_segment = dead.segments()[0].id;
    drop(dead);
    let svc = cluster.master.service();
    // A reader that tries the dead replica first falls back to the live one, and says what it could not reach.
    for _ in 0..8 {
        assert_eq!(cluster.client().get("both").await.unwrap(), pattern(4096, 1));
    }
    let mut failures = 0;
    for i in 0..40 {
        if client.put(&format!("k{i}"), &pattern(4096, i)).await.is_err() {
            failures += 1;
        }
    }
    assert!(failures <= 1, "only a write that found the dead node before anyone reported it fails: {failures}");
    assert_eq!(svc.segment_status(dead_segment).unwrap(), SegmentStatus::Suspect);
    // Every write after the report landed on the live node, and reads of them work.
    assert_eq!(client.get("k39").await.unwrap(), pattern(4096, 39));
    // The object with a replica on each node stays readable through the survivor.
    assert_eq!(client.get("both").await.unwrap(), pattern(4096, 1));
    // The live node's pings do not revive the dead node's segment.
    let live_segment = cluster.nodes[0].segments()[0].id;
    assert_eq!(svc.segment_status(live_segment).unwrap(), SegmentStatus::Ok);
}

/// A node is ready before its segment is backed: prefaulting runs after the mount, and writes that land while
/// it runs keep their bytes (`MADV_POPULATE_WRITE` never changes a written page).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_during_the_background_prefault_keep_their_bytes() {
    let mut cluster = LocalCluster::start(0, 0).await;
    let mut config = cluster.node_config(512 << 20);
    config.prefault = crescent_node::Prefault::Whole;
    cluster.nodes.push(StorageNode::start(config).await.unwrap());
    let client = cluster.client();
    for i in 0..300u64 {
        client.put(&format!("p{i}"), &pattern(1 << 20, i)).await.unwrap();
    }
    for i in 0..300u64 {
        assert_eq!(client.get(&format!("p{i}")).await.unwrap(), pattern(1 << 20, i), "p{i}");
    }
}
