//! The master's network edge: the framed RPC server (every `MasterService` operation), the admin HTTP
//! endpoint, and [`MasterServer`], which runs both with the service and its background loop. Handlers
//! translate wire messages 1:1 into service calls; no business logic lives here.

mod admin;
mod explain;
mod lister;
mod master_server;
mod rpc;

pub use admin::{AdminServer, admin_router};
pub use master_server::{MasterServer, MasterServerBuilder, StartError};
pub use rpc::{RpcMetrics, RpcServer, RpcServerHandle, dispatch};
