//! A drain against real storage nodes: every replica on a node is moved (by that node, over the data plane) to
//! the others, the node is stopped, and every object reads back whole; a copy task between nodes likewise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_client::{Client, ClientConfig, PutMode};
use crescent_master::server::MasterServer;
use crescent_master::service::MasterConfig;
use crescent_node::{NodeConfig, StorageNode};
use crescent_proto::{JobStatus, ReplicateConfig, SegmentStatus, TaskStatus};
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn value(i: usize) -> Vec<u8> {
    (0..200_000 + i).map(|j| (j * 31 + i * 7) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_stops_and_every_object_reads_back_whole() {
    let master = MasterServer::builder(MasterConfig::default()).start().await.unwrap();
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let mut config = NodeConfig::new(master.rpc_addr().to_string(), 64 * MIB);
        config.prefault = crescent_node::Prefault::Off;
        nodes.push(StorageNode::start(config).await.unwrap());
    }
    let names: Vec<String> = nodes.iter().map(|n| n.segments()[0].name.clone()).collect();
    let client = Client::new(ClientConfig::new(master.rpc_addr().to_string()));
    let on_first = ReplicateConfig { preferred_segments: vec![names[0].clone()], ..ReplicateConfig::default() };
    for i in 0..40 {
        client.put_with(&format!("k{i}"), &value(i), &on_first, PutMode::IfAbsent).await.unwrap();
    }

    // A copy task first: k0 gains a replica on the third node.
    let task = client.create_copy_task("k0", std::slice::from_ref(&names[2])).await.unwrap();
    let info = loop {
        let info = client.query_task(task).await.unwrap();
        if info.status.is_final() {
            break info;
        }
        tokio::time::sleep(Duration::from_millis(5)).await; // polling the task: nothing else tells its end
    };
    assert_eq!(info.status, TaskStatus::Success, "{}", info.message);
    assert_eq!(client.stat("k0").await.unwrap().replicas.len(), 2);

    let job = client.create_drain(std::slice::from_ref(&names[0]), &[], 4).await.unwrap();
    let mut waits = 0;
    let info = loop {
        let info = client.query_drain(job).await.unwrap();
        if info.status.is_final() {
            break info;
        }
        waits += 1;
        assert!(waits < 3000, "the drain never ended: {info:?}");
        tokio::time::sleep(Duration::from_millis(10)).await; // polling the job: the master's step is periodic
    };
    assert_eq!(info.status, JobStatus::Succeeded, "{info:?}");
    assert_eq!(info.succeeded, 40);
    let first = nodes.remove(0);
    assert_eq!(master.service().segment_status(first.segments()[0].id), Ok(SegmentStatus::Drained));
    first.shutdown(Duration::ZERO).await.unwrap();
    for i in 0..40 {
        assert_eq!(client.get(&format!("k{i}")).await.unwrap(), value(i), "k{i}");
    }
    for n in nodes {
        n.shutdown(Duration::ZERO).await.unwrap();
    }
    master.shutdown().await;
}
