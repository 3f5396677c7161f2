//! Copy and move tasks (the original's `CreateCopyTask` / `CreateMoveTask` / `QueryTask`) and drain jobs: what a
//! caller asks and reads back, and the copies the master hands the storage node that holds the source bytes.

use crate::error::ErrorCode;
use crate::ids::{ClientId, SegmentId, TaskId};
use crate::replica::ReplicaDescriptor;
use serde::{Deserialize, Serialize};

/// What a task does (numbered as the original's `TaskType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum TaskKind {
    /// Adds replicas of an object on named segments.
    Copy = 0,
    /// Moves an object's replica from one segment to another.
    Move = 1,
}

/// Where a task stands (numbered as the original's `TaskStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum TaskStatus {
    /// Queued for its node.
    Pending = 0,
    /// Handed to its node, which is copying.
    Processing = 1,
    /// Ended without effect (`message` says why).
    Failed = 2,
    /// The new replicas are readable (and, for a move, the source replica is gone).
    Success = 3,
}

impl TaskStatus {
    /// Whether the task has ended.
    pub fn is_final(self) -> bool {
        matches!(self, TaskStatus::Failed | TaskStatus::Success)
    }
}

/// A task as `QueryTask` shows it (the original's `QueryTaskResponse`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// The task.
    pub id: TaskId,
    /// Copy or move.
    pub kind: TaskKind,
    /// Where it stands.
    pub status: TaskStatus,
    /// When it was created (Unix ms).
    pub created_at_ms: u64,
    /// When its status last changed (Unix ms).
    pub updated_at_ms: u64,
    /// The storage node (client) that makes the copy: the one holding the source replica.
    pub assigned_client: ClientId,
    /// Empty while under way; the outcome once ended.
    pub message: String,
}

/// A copy the master asks of a storage node: `length` bytes at `src_offset` of its own segment `src`, written to
/// every target range (write grants sealed in when the cluster authenticates).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaTask {
    /// The task.
    pub id: TaskId,
    /// The node's own segment holding the bytes.
    pub src: SegmentId,
    /// Byte offset in it.
    pub src_offset: u64,
    /// Bytes to copy.
    pub length: u64,
    /// Where they go: `Processing` replicas the master allocated for the task.
    pub targets: Vec<ReplicaDescriptor>,
    /// Unix ms after which the node must not start writing: the master holds the targets' space out of reuse
    /// until well past it, so a late copy never lands in space given to another object.
    pub deadline_unix_ms: u64,
}

/// What became of a [`ReplicaTask`]: the crc32c of the bytes copied (the master compares it with the object's
/// checksum), or why it failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaTaskResult {
    /// The task.
    pub id: TaskId,
    /// crc32c of the bytes written to every target, or the failure.
    pub outcome: Result<u32, ErrorCode>,
}

/// Longest a `ReplicaTasks` poll waits for work before answering with none.
pub const REPLICA_TASK_WAIT_MAX_MS: u32 = 1000;

/// Where a drain job stands (numbered as the original's `JobStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum JobStatus {
    /// Accepted, not yet scanned.
    Created = 0,
    /// Finding what the segments hold.
    Planning = 1,
    /// Moving replicas off the segments.
    Running = 2,
    /// Nothing left on the segments: they may be unmounted without loss.
    Succeeded = 3,
    /// Ended with replicas left behind (`message` says why).
    Failed = 4,
    /// Cancelled: the segments take placements again.
    Canceled = 5,
}

impl JobStatus {
    /// Whether the job has ended.
    pub fn is_final(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Canceled)
    }

    /// The original's name for it.
    pub fn name(self) -> &'static str {
        match self {
            JobStatus::Created => "CREATED",
            JobStatus::Planning => "PLANNING",
            JobStatus::Running => "RUNNING",
            JobStatus::Succeeded => "SUCCEEDED",
            JobStatus::Failed => "FAILED",
            JobStatus::Canceled => "CANCELED",
        }
    }
}

/// A drain job's progress (the original's `QueryJobResponse`, with the units still to move).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainInfo {
    /// The job.
    pub id: TaskId,
    /// Where it stands.
    pub status: JobStatus,
    /// When it was created (Unix ms).
    pub created_at_ms: u64,
    /// When it last changed (Unix ms).
    pub updated_at_ms: u64,
    /// The names of the segments drained.
    pub segments: Vec<String>,
    /// Replicas moved off.
    pub succeeded: u64,
    /// Replicas that could not be moved (the object changed or went meanwhile count as moved: nothing of them
    /// is left behind).
    pub failed: u64,
    /// Replicas waiting for room elsewhere (retried).
    pub blocked: u64,
    /// Moves under way.
    pub active: u64,
    /// Replicas still on the segments, moved or not yet.
    pub remaining: u64,
    /// Bytes moved.
    pub migrated_bytes: u64,
    /// What happened, for a person.
    pub message: String,
}
