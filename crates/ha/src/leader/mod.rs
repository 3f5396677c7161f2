//! Leadership: which master of a cluster serves. [`view`] is the shared vocabulary every party uses — the
//! master-view key and value, and the `etcd://` form of a master address that clients, nodes and the CLI resolve
//! through it.

pub mod view;

pub use view::{MasterAddress, MasterView, ViewError, master_view_key};
