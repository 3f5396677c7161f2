//! Object metadata, tenant first: `TenantRegistry` → `TenantState` (quota account + `ObjectIndex`) →
//! explicit `GroupEntry` or implicit singleton → `ObjectEntry` (its own lock).
//!
//! Unrelated objects never share a mutation lock. See `docs/architecture.md` for the lock order.

pub mod index;
mod lock_stats;
pub mod object;
pub mod quota;
pub mod tenant;
pub mod writers;

pub use index::{GroupEntry, GroupMembers, ObjectIndex, route_hash};
pub use lock_stats::{LockClass, lock_stats};
pub use object::{
    Lifecycle, ObjectEntry, ObjectFlags, ObjectGuard, ObjectId, ObjectState, PendingWrite, Replica, ReplicaList,
    SoftPinRequest, Tier, object_locks_held,
};
pub use quota::{QuotaAccount, QuotaError, QuotaPolicies};
pub use tenant::{TenantLifecycle, TenantOp, TenantRegistry, TenantState};
