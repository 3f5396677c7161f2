//! The node's disk tier: a file on its local SSD mounted as a `Disk` segment (the master allocates in it), and
//! the worker that makes the copies the master asks for — memory to disk when memory eviction keeps an object
//! there — and reports the disk's counters and the ranges it could not read.

use crescent_client::master::MasterConnection;
use crescent_proto::{
    ClientId, DISK_TASK_WAIT_MAX_MS, DiskCounters, DiskFault, DiskTask, DiskTaskKind, DiskTaskResult, ErrorCode,
    MasterRequest, MasterResponse, SegmentId,
};
use crescent_transfer::SegmentRegistry;
use crescent_transfer::disk::DiskSegment;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;

/// A node's disk tier settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSettings {
    /// The directory of the tier's file (`crescent-ssd.data`), on the SSD; wiped at start.
    pub dir: PathBuf,
    /// Bytes of the tier (whole 4 KiB blocks).
    pub size: u64,
}

/// A disk tier's device given to the node instead of the file in its directory (tests: an in-memory or a
/// fault-injecting device).
#[derive(Clone)]
pub struct DiskDevice(pub Arc<dyn crescent_transfer::disk::BlockDevice>);

impl std::fmt::Debug for DiskDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DiskDevice").field(&self.0.describe()).finish()
    }
}

/// Runs one task: checks it is the node's own and still in time, then copies.
async fn run(task: &DiskTask, registry: &SegmentRegistry, disk_id: SegmentId, disk: &DiskSegment) -> DiskTaskResult {
    let outcome = async {
        // The master holds the destination only so long: a copy started later could land in reused space.
        if crescent_net::grant::unix_ms() >= task.deadline_unix_ms {
            return Err(ErrorCode::TransferFail);
        }
        let len = task.length;
        match task.kind {
            DiskTaskKind::Offload if task.dst == disk_id => {
                let mem = registry.get(&task.src).ok_or(ErrorCode::SegmentNotFound)?;
                disk.copy_in(&mem, task.src_offset, len, task.dst_offset).await.map_err(|e| e.code())
            }
            DiskTaskKind::Promote if task.src == disk_id => {
                let mem = registry.get(&task.dst).ok_or(ErrorCode::SegmentNotFound)?;
                disk.copy_out(task.src_offset, len, &mem, task.dst_offset).await.map_err(|e| e.code())
            }
            _ => Err(ErrorCode::SegmentNotFound),
        }
    }
    .await;
    if let Err(code) = outcome {
        tracing::debug!(task = task.id, ?task.kind, %code, "disk task failed");
    }
    DiskTaskResult { id: task.id, outcome }
}

/// The disk's counters as the master shows them.
fn counters(disk_id: SegmentId, disk: &DiskSegment) -> DiskCounters {
    let s = disk.stats();
    DiskCounters {
        segment: disk_id,
        reads: s.reads,
        read_bytes: s.read_bytes,
        writes: s.writes,
        write_bytes: s.write_bytes,
        errors: s.errors,
    }
}

/// Polls the master for disk tasks (on a connection of its own: a poll waits up to a second for work), runs each
/// batch concurrently (the disk's queue bounds what is in flight), and reports the outcomes with the next poll;
/// outcomes a failed poll could not deliver go with the one after.
pub(crate) fn spawn_worker(
    master: Arc<MasterConnection>,
    id: ClientId,
    registry: SegmentRegistry,
    disk_id: SegmentId,
    disk: Arc<DiskSegment>,
    stopped: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut done: Vec<DiskTaskResult> = Vec::new();
        let mut faults: Vec<DiskFault> = Vec::new();
        let mut poller = crate::poll::Poller::new("disk-task", stopped);
        loop {
            faults.extend(disk.take_faults().into_iter().map(|(offset, length)| DiskFault {
                segment: disk_id,
                offset,
                length,
            }));
            let req = MasterRequest::DiskTasks {
                client: id,
                done: done.clone(),
                faults: faults.clone(),
                counters: vec![counters(disk_id, &disk)],
                wait_ms: DISK_TASK_WAIT_MAX_MS,
            };
            let Some(reply) = poller.call(&master, &req).await else { break };
            match reply {
                Ok(MasterResponse::DiskTasks(tasks)) => {
                    done.clear();
                    faults.clear();
                    poller.answered();
                    let runs = tasks.iter().map(|t| run(t, &registry, disk_id, &disk));
                    done = futures_util::future::join_all(runs).await;
                }
                other => poller.failed(other),
            }
        }
    })
}
