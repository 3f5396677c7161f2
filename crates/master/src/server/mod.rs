//! The master's network edge: the framed RPC server (every `MasterService` operation) and the admin HTTP
//! endpoint. Handlers translate wire messages 1:1 into service calls; no business logic lives here.

mod admin;
mod rpc;

pub use admin::{AdminServer, admin_router};
pub use rpc::{RpcMetrics, RpcServer, RpcServerHandle, dispatch};
