//! Crescent's wire vocabulary.
//!
//! Every type that crosses a process boundary lives here, so the master, storage nodes and clients agree on one
//! definition. The crate holds no behaviour beyond validation: a value of one of these types is always valid
//! (constructors check, deserialisation re-checks), so code that receives one never re-validates it.
//!
//! Module map: [`auth`] (principals), [`wire`] (frames, the hello, limits, error frames, wire keys and batches), [`rpc`] (master
//! requests and replies, [`MasterOp`]), [`transfer`] (data-plane requests and replies), [`error`] ([`ErrorCode`]),
//! [`batch`] (the per-item contract of batch calls), [`ids`] (client and segment ids), [`key`] (object keys),
//! [`tenant`] (tenant ids), [`segment`] (what a node mounts), [`replica`] (where an object's bytes live),
//! [`config`] (per-write options). Socket handling is `crescent-net`'s.

pub mod auth;
pub mod batch;
pub mod config;
pub mod error;
pub mod human;
pub mod ids;
pub mod key;
pub mod replica;
pub mod rpc;
pub mod segment;
pub mod task;
pub mod tenant;
pub mod transfer;
pub mod wire;

pub use auth::{Principal, PrincipalError};
pub use config::{MAX_GROUP_LEN, ObjectDataType, ReplicateConfig, SoftPinAction};
pub use error::{ErrorCode, ErrorCodeUnknown};
pub use ids::{ClientId, SegmentId, TaskId};
pub use key::{KeyError, MAX_KEY_LEN, ObjectKey};
pub use replica::{ReplicaDescriptor, ReplicaLocation, ReplicaStatus, write_id};
pub use rpc::{
    ClientStatus, ClusterInfo, DISK_TASK_WAIT_MAX_MS, DiskCounters, DiskFault, DiskTask, DiskTaskKind, DiskTaskResult,
    DiskTierInfo, GetReplicaListResponse, GrantedBatch, KeyPage, LocalSsdInfo, MasterOp, MasterReply, MasterRequest,
    MasterResponse, MemoryTierInfo, ObjectStat, RemoveAllReport, TenantInfo,
};
pub use segment::{DISK_BLOCK, SegmentKind, SegmentSpec, SegmentStatus};
pub use task::{
    DrainInfo, JobStatus, REPLICA_TASK_WAIT_MAX_MS, ReplicaTask, ReplicaTaskResult, TaskInfo, TaskKind, TaskStatus,
};
pub use tenant::{MAX_TENANT_LEN, TenantId, TenantIdError};
