//! The node's copy and move tasks: the master asks the node holding an object's replica to copy it to ranges it
//! allocated on other segments (`create_copy_task`, `create_move_task`, a drain); the node reads its own bytes
//! and writes them to each target over the data plane, and reports their crc32c, which the master checks against
//! the object's before the new replicas count.

use bytes::Bytes;
use crescent_client::master::MasterConnection;
use crescent_proto::{
    ClientId, ErrorCode, MasterRequest, MasterResponse, REPLICA_TASK_WAIT_MAX_MS, ReplicaTask, ReplicaTaskResult,
};
use crescent_transfer::{SegmentRegistry, TransferClient};
use futures_util::StreamExt;
use std::sync::Arc;
use tokio::sync::watch;

/// Tasks of one poll run at once (each holds its object's bytes while it writes them).
const CONCURRENT: usize = 8;

/// Runs one task: checks it is in time and the source is the node's own, reads the bytes once, writes them to
/// every target.
async fn run(task: &ReplicaTask, registry: &SegmentRegistry, transfer: &TransferClient) -> ReplicaTaskResult {
    let outcome = async {
        // The master holds the targets only so long: a copy started later could land in reused space.
        if crescent_net::grant::unix_ms() >= task.deadline_unix_ms {
            return Err(ErrorCode::TransferFail);
        }
        let mem = registry.get(&task.src).ok_or(ErrorCode::SegmentNotFound)?;
        let len = usize::try_from(task.length).map_err(|_| ErrorCode::InvalidParams)?;
        let mut buf = vec![0u8; len];
        mem.read_at(task.src_offset, &mut buf).map_err(|e| e.code())?;
        let crc = crc32c::crc32c(&buf);
        let data = Bytes::from(buf);
        for d in &task.targets {
            let (endpoint, _, offset, length, place) =
                crescent_client::client::address(d, &[]).ok_or(ErrorCode::InvalidParams)?;
            if length != task.length {
                return Err(ErrorCode::InvalidParams);
            }
            transfer.write(endpoint, place, offset, data.clone()).await.map_err(|e| e.code())?;
        }
        Ok(crc)
    }
    .await;
    if let Err(code) = outcome {
        tracing::debug!(task = %task.id, %code, "copy task failed");
    }
    ReplicaTaskResult { id: task.id, outcome }
}

/// Polls the master for tasks (on a connection of its own: a poll waits up to a second for work), runs each
/// batch, and reports the outcomes with the next poll; outcomes a failed poll could not deliver go with the one
/// after.
pub(crate) fn spawn_worker(
    master: Arc<MasterConnection>,
    id: ClientId,
    registry: SegmentRegistry,
    transfer: TransferClient,
    stopped: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut done: Vec<ReplicaTaskResult> = Vec::new();
        let mut poller = crate::poll::Poller::new("task", stopped);
        loop {
            let req = MasterRequest::ReplicaTasks { client: id, done: done.clone(), wait_ms: REPLICA_TASK_WAIT_MAX_MS };
            let Some(reply) = poller.call(&master, &req).await else { break };
            match reply {
                Ok(MasterResponse::ReplicaTasks(tasks)) => {
                    poller.answered();
                    let runs = futures_util::stream::iter(tasks.into_iter().map(|t| {
                        let (registry, transfer) = (registry.clone(), transfer.clone());
                        async move { run(&t, &registry, &transfer).await }
                    }));
                    done = runs.buffer_unordered(CONCURRENT).collect().await;
                }
                other => poller.failed(other),
            }
        }
    })
}
