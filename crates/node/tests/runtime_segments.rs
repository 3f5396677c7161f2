//! Segments mounted and unmounted while a node runs: the master knows them, the node serves them, and a remount
//! after `NEED_REMOUNT` (a restarted master that has never heard of the node) sends the list as it is now.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_master::server::MasterServer;
use crescent_master::service::MasterConfig;
use crescent_node::{NodeConfig, StorageNode};
use crescent_proto::{ErrorCode, SegmentId, SegmentStatus};
use crescent_testkit::eventually;
use crescent_transfer::SegmentMemory;
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);

fn status(master: &MasterServer, id: SegmentId) -> Result<SegmentStatus, ErrorCode> {
    master.service().segment_status(id)
}

/// A fresh master (no oplog: it remembers nothing) on the address of the one it replaces.
async fn restart(master: MasterServer) -> MasterServer {
    let addr = master.rpc_addr();
    master.shutdown().await;
    MasterServer::builder(MasterConfig::default()).rpc_addr(addr).start().await.expect("master restarts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_segment_is_remounted_and_an_unmounted_one_is_not() {
    let mut master = MasterServer::builder(MasterConfig::default()).start().await.unwrap();
    let mut config = NodeConfig::new(master.rpc_addr().to_string(), 4 * MIB);
    config.prefault = crescent_node::Prefault::Off;
    config.ping_interval = Duration::from_millis(50);
    let node = StorageNode::start(config).await.unwrap();
    let first = node.segments()[0].id;
    let control = node.control();

    let added = control
        .mount(Arc::new(SegmentMemory::anonymous(8 * MIB).unwrap()), crescent_node::Prefault::Whole)
        .await
        .unwrap();
    assert_eq!((added.size, added.name.as_str()), (8 * MIB, node.segments()[0].name.as_str()), "named as the node");
    assert_eq!(status(&master, added.id), Ok(SegmentStatus::Ok));
    assert!(node.registry().get(&added.id).is_some(), "served by the node's transfer server");
    assert_eq!(node.segments().iter().map(|s| s.id).collect::<Vec<_>>(), [first, added.id]);
    let dropped = control
        .mount(Arc::new(SegmentMemory::anonymous(4 * MIB).unwrap()), crescent_node::Prefault::Off)
        .await
        .unwrap();

    // A master that never heard of the node answers its ping NEED_REMOUNT: the remount brings both back.
    master = restart(master).await;
    assert!(eventually(WAIT, || async { node.remounts() >= 1 }).await, "the node never remounted");
    for id in [first, added.id, dropped.id] {
        assert_eq!(status(&master, id), Ok(SegmentStatus::Ok), "{id} remounted");
    }

    // Unmounted: gone from the master and from the node, and out of the next remount.
    control.unmount(dropped.id, Duration::ZERO).await.unwrap();
    assert_eq!(status(&master, dropped.id), Err(ErrorCode::SegmentNotFound));
    assert!(node.registry().get(&dropped.id).is_none(), "no longer served");
    assert_eq!(node.segments().len(), 2);
    let again = control.unmount(dropped.id, Duration::ZERO).await.unwrap_err();
    assert_eq!(again.code(), ErrorCode::InvalidParams, "not mounted by this node: {again}");
    assert_eq!(
        control.unmount(SegmentId::random(), Duration::ZERO).await.unwrap_err().code(),
        ErrorCode::InvalidParams
    );

    master = restart(master).await;
    assert!(eventually(WAIT, || async { node.remounts() >= 2 }).await, "the node never remounted again");
    assert_eq!(status(&master, first), Ok(SegmentStatus::Ok));
    assert_eq!(status(&master, added.id), Ok(SegmentStatus::Ok));
    assert_eq!(status(&master, dropped.id), Err(ErrorCode::SegmentNotFound), "an unmounted segment stays out");

    // Shutdown unmounts what is mounted now, the added segment with the first.
    node.shutdown(Duration::ZERO).await.unwrap();
    assert_eq!(status(&master, first), Err(ErrorCode::SegmentNotFound));
    assert_eq!(status(&master, added.id), Err(ErrorCode::SegmentNotFound));
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_unmount_keeps_serving_until_the_master_drops_the_segment() {
    let master = MasterServer::builder(MasterConfig::default()).start().await.unwrap();
    let mut config = NodeConfig::new(master.rpc_addr().to_string(), 4 * MIB);
    config.prefault = crescent_node::Prefault::Off;
    let node = StorageNode::start(config).await.unwrap();
    let control = node.control();
    let added = control
        .mount(Arc::new(SegmentMemory::anonymous(4 * MIB).unwrap()), crescent_node::Prefault::Off)
        .await
        .unwrap();
    control.unmount(added.id, Duration::from_millis(200)).await.unwrap();
    assert_eq!(status(&master, added.id), Ok(SegmentStatus::GracefullyUnmounting));
    assert!(node.registry().get(&added.id).is_some(), "still served during the grace");
    assert!(node.segments().iter().all(|s| s.id != added.id), "out of the remount list at once");
    assert!(
        eventually(WAIT, || async { node.registry().get(&added.id).is_none() }).await,
        "the node kept serving a segment the master dropped"
    );
    assert_eq!(status(&master, added.id), Err(ErrorCode::SegmentNotFound));
    node.shutdown(Duration::ZERO).await.unwrap();
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_segments_mounts_one_later_and_a_stopped_node_refuses() {
    let master = MasterServer::builder(MasterConfig::default()).start().await.unwrap();
    let mut config = NodeConfig::new(master.rpc_addr().to_string(), 0);
    config.segments = 0;
    let node = StorageNode::start(config).await.unwrap();
    assert!(node.segments().is_empty());
    let control = node.control();
    let added = control
        .mount(Arc::new(SegmentMemory::anonymous(4 * MIB).unwrap()), crescent_node::Prefault::Off)
        .await
        .unwrap();
    assert_eq!(status(&master, added.id), Ok(SegmentStatus::Ok));
    assert!(!control.drain_disk(Duration::ZERO).await.unwrap(), "no disk tier to drain");
    node.shutdown(Duration::ZERO).await.unwrap();
    assert_eq!(status(&master, added.id), Err(ErrorCode::SegmentNotFound));
    let refused = control
        .mount(Arc::new(SegmentMemory::anonymous(MIB).unwrap()), crescent_node::Prefault::Off)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::UnavailableInCurrentStatus, "{refused}");
    master.shutdown().await;
}
