//! The client library and storage-node runtime.
//!
//! This crate will own: `Client` (async) and its blocking facade (put/get, zero-copy batch forms, replica
//! selection own process > same host > remote), the master connection with leader discovery, and the
//! storage-node runtime (mount, 1 s ping, remount on `NEED_REMOUNT`, graceful unmount on SIGTERM).
//! Nothing is implemented yet (issue: network cluster).
