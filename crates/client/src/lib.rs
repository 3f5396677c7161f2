//! The Crescent client library.
//!
//! [`Client`] (async) and [`BlockingClient`] put and get objects: control through the master
//! ([`master::MasterConnection`]), bytes straight to and from storage nodes over the data plane
//! (`crescent-transfer`). Module map: [`client`] (the async client: put/get, batches, replicas, checksums),
//! [`blocking`] (the same for synchronous callers), [`master`] (the pooled, pipelined master connection, also
//! used by storage nodes), [`error`] ([`ClientError`]).

pub mod blocking;
pub mod client;
pub mod error;
pub mod master;

pub use blocking::BlockingClient;
pub use client::{Client, ClientConfig, PutMode, PutOutcome};
pub use error::ClientError;
