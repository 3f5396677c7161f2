//! Test support shared by every Crescent crate's tests, so no helper is written twice.
//!
//! * [`value`]: deterministic value patterns and their checker.
//! * [`wait`]: waiting on a condition with a bound ([`eventually`], [`wait_for`]), never a sleep as a barrier.
//! * [`cluster`]: a master and storage nodes in this process ([`LocalCluster`]).
//! * [`mod@segment`]: segment descriptions for tests that drive the master without a node.
//! * [`mod@tls`]: a test cluster's TLS material ([`tls()`]).
//! * [`process`]: `crescent` processes ([`Proc`], [`ProcCluster`]) on ports the OS picks: each server binds port
//!   0 and reports its address, so no port is chosen, released and re-bound (a race with every other process).
//!
//! A helper here panics when setup fails: that fails the test that asked for it, with the reason.
#![allow(clippy::expect_used, clippy::unwrap_used)]

pub mod cluster;
pub mod process;
pub mod segment;
pub mod tls;
pub mod value;
pub mod wait;

pub use cluster::LocalCluster;
pub use process::{Proc, ProcCluster};
pub use segment::{segment, segment_on};
pub use tls::{TestTls, tls};
pub use value::{check, pattern};
pub use wait::{eventually, wait_for};
