//! The Crescent client library.
//!
//! [`Client`] (async) and [`BlockingClient`] put and get objects: control through the master
//! ([`master::MasterConnection`]), bytes straight to and from storage nodes over the data plane
//! (`crescent-transfer`). Module map: [`client`] (the async client: put/get, batches, replicas, checksums),
//! [`blocking`] (the same for synchronous callers), [`master`] (the pooled, pipelined master connection, also
//! used by storage nodes; with an `etcd://` address it follows the cluster's leader), [`error`] ([`ClientError`]).

pub mod blocking;
pub mod client;
pub mod error;
pub mod master;
pub mod tickets;

pub use blocking::BlockingClient;
pub use client::{Client, ClientConfig, PutMode, PutOutcome, ReadSession, WriteSession};
/// The environment variable naming the cluster when an `etcd://` address names none.
pub use crescent_ha::leader::view::CLUSTER_ID_ENV;
/// The master address forms (`host:port[,…]`, `etcd://…`) and the view they resolve to, from `crescent-ha`.
pub use crescent_ha::leader::{MasterAddress, MasterView};
pub use error::ClientError;
