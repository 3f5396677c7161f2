//! The master's network edge: the framed RPC server (every `MasterService` operation), the admin HTTP
//! endpoint, the NoF heartbeat (probes of NoF targets), and [`MasterServer`], which runs them with the service
//! and its background loop, or [`CandidateServer`], which serves only while it leads. Handlers translate wire
//! messages 1:1 into service calls; no business logic lives here.

mod admin;
mod admin_compat;
mod admin_compat_ops;
pub mod authz;
mod candidate;
pub mod claims;
mod explain;
pub mod grants;
pub mod hosts;
mod lister;
mod master_server;
mod nof_heartbeat;
mod rpc;
pub mod snapshot_fetch;
mod target;

pub use admin::{ADMIN_HEADER_DEADLINE, ADMIN_MAX_CONNECTIONS, AdminServer, SnapshotSlot, admin_router};
pub use candidate::{CandidateOptions, CandidateServer};
pub use master_server::{MasterServer, MasterServerBuilder, StartError};
pub use nof_heartbeat::{NOF_HEARTBEAT_TICK, NofProber, TransferProber};
pub use rpc::{RpcLimits, RpcMetrics, RpcServer, RpcServerHandle, dispatch};
pub use target::{Elected, NOT_LEADER, Served, Target};
