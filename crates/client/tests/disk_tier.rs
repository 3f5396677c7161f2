//! The disk tier end to end: a real master, a storage node with a disk tier in a temporary directory (O_DIRECT
//! where the filesystem allows it), real TCP. Objects memory evicts are copied to the node's disk and read back
//! from it, checksum verified; a disk error drops that replica only; a removal frees disk space.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_client::{Client, ClientConfig};
use crescent_master::server::MasterServer;
use crescent_master::service::MasterConfig;
use crescent_node::{DiskSettings, NodeConfig, StorageNode};
use crescent_proto::{ReplicaLocation, ReplicaStatus, SegmentKind};
use crescent_testkit::{check, eventually, pattern};
use std::sync::atomic::Ordering;
use std::time::Duration;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const WAIT: Duration = Duration::from_secs(20);

struct Tier {
    master: MasterServer,
    node: StorageNode,
    client: Client,
    _dir: tempfile::TempDir,
}

/// A master and one node: `memory` bytes of memory, `disk` bytes of disk tier.
async fn tier(memory: u64, disk: u64) -> Tier {
    tier_with(MasterConfig::default(), memory, disk).await
}

/// [`tier`] with a master configured as `config` (its lease shortened).
async fn tier_with(config: MasterConfig, memory: u64, disk: u64) -> Tier {
    // Short leases: a removed object's range is held past its readers' leases before reuse.
    let config = MasterConfig { lease_ttl_ms: 500, ..config };
    let master = MasterServer::builder(config).start().await.unwrap();
    let dir = tempfile::tempdir_in(std::env::var_os("CARGO_TARGET_TMPDIR").unwrap_or_else(|| ".".into())).unwrap();
    let mut config = NodeConfig::new(master.rpc_addr().to_string(), memory);
    config.prefault = crescent_node::Prefault::Off;
    config.disk = Some(DiskSettings { dir: dir.path().to_owned(), size: disk });
    let node = StorageNode::start(config).await.unwrap();
    let client = Client::new(ClientConfig::new(master.rpc_addr().to_string()));
    Tier { master, node, client, _dir: dir }
}

impl Tier {
    /// Where `key` is readable (looked at without leasing it).
    async fn tiers(&self, key: &str) -> Vec<SegmentKind> {
        let stat = self.client.stat(key).await.unwrap();
        stat.replicas
            .iter()
            .filter(|d| d.status == ReplicaStatus::Complete)
            .map(|d| match d.location {
                ReplicaLocation::Disk { .. } => SegmentKind::Disk,
                _ => SegmentKind::Memory,
            })
            .collect()
    }

    async fn on_disk(&self, key: &str) -> bool {
        self.tiers(key).await == [SegmentKind::Disk]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_memory_evicts_are_read_back_from_the_nodes_disk() {
    let t = tier(8 * MIB, 64 * MIB).await;
    let n = 64;
    let size = 256 * KIB as usize;
    // Four times what memory holds: the oldest go to disk as the newest arrive.
    for i in 0..n {
        t.client.put(&format!("k{i}"), &pattern(size, i)).await.unwrap();
    }
    let svc = t.master.service();
    assert!(
        eventually(WAIT, || async { svc.disk_tier().metrics().offloads_done.load(Ordering::Relaxed) > 0 }).await,
        "evictions are kept on disk"
    );
    let mut disk = Vec::new();
    for i in 0..n {
        let key = format!("k{i}");
        if t.on_disk(&key).await {
            disk.push(i);
        }
    }
    assert!(disk.len() >= n as usize / 2, "most of the early objects are on disk: {disk:?}");
    // Every object is still there, whole: memory or disk.
    assert_eq!(t.client.disk_reads(), 0);
    for i in 0..n {
        let got = t.client.get(&format!("k{i}")).await.unwrap();
        check(&got, size, i).unwrap();
    }
    // Each object that was only on disk was read from there (others may have reached the disk meanwhile).
    let disk_reads = t.client.disk_reads();
    assert!(disk_reads >= disk.len() as u64 && disk_reads <= n, "{disk_reads} disk reads, {} on disk", disk.len());
    let stats = t.node.registry().disk(&disk_id(&t)).unwrap().stats();
    assert!(stats.writes >= disk.len() as u64, "{stats:?}");
    assert!(stats.reads >= disk.len() as u64, "every disk object was read from the disk: {stats:?}");
    // The node's counters reach the master with its next poll.
    assert!(
        eventually(WAIT, || async { svc.disk_tier().segment_stats(disk_id(&t)).counters.reads >= stats.reads }).await
    );
    // With room in memory again (the objects there removed), a read brings a disk object back to memory (the
    // node copies it disk → memory), where it reads whole.
    let m = svc.disk_tier().metrics();
    for i in 0..n {
        let key = format!("k{i}");
        if !disk.contains(&i) {
            t.client.remove(&key, true).await.unwrap();
        }
    }
    for &i in &disk {
        check(&t.client.get(&format!("k{i}")).await.unwrap(), size, i).unwrap();
    }
    assert!(eventually(WAIT, || async { m.promotions_done.load(Ordering::Relaxed) > 0 }).await, "promoted");
    let mut promoted = 0;
    for &i in &disk {
        let key = format!("k{i}");
        if t.tiers(&key).await.contains(&SegmentKind::Memory) {
            promoted += 1;
            let before = t.client.disk_reads();
            check(&t.client.get(&key).await.unwrap(), size, i).unwrap();
            assert_eq!(t.client.disk_reads(), before, "a promoted object is read from memory, not disk");
        }
    }
    assert!(promoted > 0, "some disk objects are in memory again");
}

fn disk_id(t: &Tier) -> crescent_proto::SegmentId {
    t.node.segments().iter().find(|s| s.kind == SegmentKind::Disk).unwrap().id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_frees_the_disk_and_a_full_disk_evicts_its_oldest() {
    // The disk holds 16 objects of 256 KiB. No promotion: the reads below would otherwise bring disk objects back
    // to memory, whose eviction sends others to the full disk, which drops its oldest — churn this test does not
    // measure (promotion has its own).
    let t = tier_with(MasterConfig { disk_promotion: false, ..MasterConfig::default() }, 4 * MIB, 4 * MIB).await;
    let size = 256 * KIB as usize;
    for i in 0..48 {
        t.client.put(&format!("k{i}"), &pattern(size, i)).await.unwrap();
    }
    let svc = t.master.service();
    assert!(eventually(WAIT, || async { svc.disk_tier().metrics().disk_evictions.load(Ordering::Relaxed) > 0 }).await);
    // The oldest are gone (from disk: never a replica listed that the disk does not hold), the rest read whole.
    let mut found = 0;
    for i in 0..48 {
        match t.client.get(&format!("k{i}")).await {
            Ok(got) => {
                check(&got, size, i).unwrap();
                found += 1;
            }
            Err(e) => assert_eq!(e.code(), crescent_proto::ErrorCode::ObjectNotFound, "k{i}: {e}"),
        }
    }
    assert!(found >= 16, "memory and disk both serve: {found}");
    assert!(t.client.get("k0").await.is_err(), "the oldest went first");
    let used = svc.pool().usage(SegmentKind::Disk).used;
    assert!(used > 0);
    // Removing what is on disk frees it (once the reads' leases are over).
    for i in 0..48 {
        let key = format!("k{i}");
        if t.client.stat(&key).await.is_ok() && t.on_disk(&key).await {
            t.client.remove(&key, true).await.unwrap();
        }
    }
    assert!(eventually(WAIT, || async { svc.pool().usage(SegmentKind::Disk).used == 0 }).await);
}

/// A master and one node whose disk tier is `device`.
async fn tier_on(memory: u64, device: std::sync::Arc<dyn crescent_transfer::disk::BlockDevice>) -> Tier {
    let config = MasterConfig { lease_ttl_ms: 500, ..MasterConfig::default() };
    let master = MasterServer::builder(config).start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = NodeConfig::new(master.rpc_addr().to_string(), memory);
    config.prefault = crescent_node::Prefault::Off;
    config.disk_device = Some(crescent_node::DiskDevice(device));
    let node = StorageNode::start(config).await.unwrap();
    let client = Client::new(ClientConfig::new(master.rpc_addr().to_string()));
    Tier { master, node, client, _dir: dir }
}

/// Where `key`'s disk replica starts.
async fn disk_offset(t: &Tier, key: &str) -> u64 {
    let stat = t.client.stat(key).await.unwrap();
    stat.replicas
        .iter()
        .find_map(|d| match d.location {
            ReplicaLocation::Disk { offset, .. } => Some(offset),
            _ => None,
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_error_fails_that_replica_only_and_the_node_serves_on() {
    use crescent_transfer::disk::{FaultyDevice, MemoryDevice};
    let device = std::sync::Arc::new(FaultyDevice::new(MemoryDevice::new(16 * MIB).unwrap()));
    let t = tier_on(2 * MIB, device.clone()).await;
    let size = 128 * KIB as usize;
    // A write error first: that offload fails, its object stays in memory.
    device.fail_next_writes(1);
    for i in 0..48 {
        t.client.put(&format!("k{i}"), &pattern(size, i)).await.unwrap();
    }
    let svc = t.master.service();
    let m = svc.disk_tier().metrics();
    assert!(eventually(WAIT, || async { m.offloads_failed.load(Ordering::Relaxed) >= 1 }).await, "the write error");
    assert!(eventually(WAIT, || async { m.offloads_done.load(Ordering::Relaxed) >= 8 }).await);
    let mut disk = Vec::new();
    for i in 0..48 {
        if t.client.stat(&format!("k{i}")).await.is_ok() && t.on_disk(&format!("k{i}")).await {
            disk.push(i);
        }
    }
    assert!(disk.len() >= 2, "{disk:?}");
    // A read error on one object's range: that read fails, the node reports the range, the master drops it.
    let (bad, good) = (disk[0], disk[1]);
    let at = disk_offset(&t, &format!("k{bad}")).await;
    device.fail_reads_at(at..at + 1);
    let err = t.client.get(&format!("k{bad}")).await.unwrap_err();
    assert_ne!(err.code(), crescent_proto::ErrorCode::Ok, "{err}");
    assert!(
        eventually(WAIT, || async { m.disk_faults.load(Ordering::Relaxed) == 1 }).await,
        "the node told the master"
    );
    assert_eq!(t.client.get(&format!("k{bad}")).await.unwrap_err().code(), crescent_proto::ErrorCode::ObjectNotFound);
    // The rest of the disk, and the node, serve on.
    check(&t.client.get(&format!("k{good}")).await.unwrap(), size, good).unwrap();
    for i in 40..48 {
        check(&t.client.get(&format!("k{i}")).await.unwrap(), size, i).unwrap();
    }
}
