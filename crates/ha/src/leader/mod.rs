//! Leadership: which master of a cluster serves. [`view`] is the shared vocabulary every party uses — the
//! master-view key and value, and the `etcd://` form of a master address that clients, nodes and the CLI resolve
//! through it. [`watch`] is the reading side: the "ignore older views" rule, the not-leader refusal's marker,
//! and (feature `etcd`) the follower clients and nodes resolve the leader with.

pub mod view;
pub mod watch;

pub use view::{MasterAddress, MasterView, ViewError, master_view_key};
