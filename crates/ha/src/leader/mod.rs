//! Leadership: which master of a cluster serves. [`view`] is the shared vocabulary every party uses — the
//! master-view key and value, and the `etcd://` form of a master address that clients, nodes and the CLI resolve
//! through it. [`watch`] is the reading side: the "ignore older views" rule, the not-leader refusal's marker,
//! and (feature `etcd`) the follower clients and nodes resolve the leader with. [`coordinator`] is the
//! candidates' side: the [`LeaderCoordinator`] seam, leases as [`LeaseGuard`]s, the in-process coordinator;
//! `etcd` (feature `etcd`) is the coordinator on etcd.

pub mod coordinator;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod view;
pub mod watch;

pub use coordinator::{Campaign, CoordError, LeaderCoordinator, LeaderSession, LeaseGuard, LocalCoordinator};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdCoordinator, EtcdCoordinatorConfig};
pub use view::{MasterAddress, MasterView, ViewError, master_view_key};
