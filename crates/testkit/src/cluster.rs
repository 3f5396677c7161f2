//! A master and storage nodes in this process, on free loopback ports.

use crescent_client::{Client, ClientConfig};
use crescent_master::server::MasterServer;
use crescent_master::service::MasterConfig;
use crescent_node::{NodeConfig, StorageNode};
use std::time::Duration;

/// A master (RPC only) and `n` storage nodes, all in this process.
pub struct LocalCluster {
    /// The master.
    pub master: MasterServer,
    /// The storage nodes, in start order.
    pub nodes: Vec<StorageNode>,
}

impl LocalCluster {
    /// A master with the default configuration and `nodes` nodes of one `segment_size` segment each.
    pub async fn start(nodes: usize, segment_size: u64) -> LocalCluster {
        Self::with_config(MasterConfig::default(), nodes, segment_size).await
    }

    /// Like [`LocalCluster::start`], with a master configuration of the caller's.
    pub async fn with_config(config: MasterConfig, nodes: usize, segment_size: u64) -> LocalCluster {
        let master = MasterServer::builder(config).start().await.expect("master starts");
        let mut cluster = LocalCluster { master, nodes: Vec::new() };
        for _ in 0..nodes {
            let node = StorageNode::start(cluster.node_config(segment_size)).await.expect("storage node starts");
            cluster.nodes.push(node);
        }
        cluster
    }

    /// The master's RPC address.
    pub fn addr(&self) -> String {
        self.master.rpc_addr().to_string()
    }

    /// A fresh client of this cluster.
    pub fn client(&self) -> Client {
        Client::new(ClientConfig::new(self.addr()))
    }

    /// A node configuration for this cluster: one `segment_size` segment on a free loopback port, pages left
    /// to fault on first use (tests do not pay for memory they never touch).
    pub fn node_config(&self, segment_size: u64) -> NodeConfig {
        let mut config = NodeConfig::new(self.addr(), segment_size);
        config.prefault = crescent_node::Prefault::Off;
        config
    }

    /// Unmounts every node and stops the master.
    pub async fn shutdown(self) {
        for node in self.nodes {
            node.shutdown(Duration::ZERO).await.expect("node unmounts");
        }
        self.master.shutdown().await;
    }
}
