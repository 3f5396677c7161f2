//! The master's network edge: the framed RPC server (every `MasterService` operation), the admin HTTP
//! endpoint, the NoF heartbeat (probes of NoF targets), and [`MasterServer`], which runs them with the service
//! and its background loop. Handlers translate wire messages 1:1 into service calls; no business logic lives
//! here.

mod admin;
mod explain;
mod lister;
mod master_server;
mod nof_heartbeat;
mod rpc;

pub use admin::{ADMIN_HEADER_DEADLINE, ADMIN_MAX_CONNECTIONS, AdminServer, admin_router};
pub use master_server::{MasterServer, MasterServerBuilder, StartError};
pub use nof_heartbeat::{NOF_HEARTBEAT_TICK, NofProber, TransferProber};
pub use rpc::{RpcLimits, RpcMetrics, RpcServer, RpcServerHandle, dispatch};
