//! The Crescent client library and storage-node runtime.
//!
//! [`Client`] (async) and [`BlockingClient`] put and get objects: control through the master
//! ([`master::MasterConnection`]), bytes straight to and from storage nodes over the data plane
//! (`crescent-transfer`). [`node::StorageNode`] hosts segments, mounts them, pings the master every second and
//! remounts when told to.

pub mod blocking;
pub mod client;
pub mod error;
pub mod master;
pub mod node;

pub use blocking::BlockingClient;
pub use client::{Client, ClientConfig};
pub use error::ClientError;
