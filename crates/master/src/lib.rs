//! The Crescent master: metadata only, it never touches object bytes.
//!
//! Module map (the data flow and lock order are in `docs/architecture.md`):
//! * [`server`]: the network edge — RPC server, admin HTTP, and [`server::MasterServer`] that runs a master.
//! * [`service`]: `MasterService`, request orchestration for every RPC, client liveness, delayed releases,
//!   metrics and the background loop.
//! * [`metadata`]: object metadata, tenant first (tenants, quotas, object indexes, groups, objects).
//! * [`events`]: the KV event stream routers follow (stored/removed events on a ZMQ PUB socket).
//! * [`eviction`]: the eviction kernel every trigger runs (census, selection, commit).
//! * [`segment_pool`]: the single owner of mounted Memory/CXL/NoF segments and the regions behind them.
//! * [`placement`]: stateless replica placement over a lock-scoped view of the pool.
//! * [`alloc`]: the offset allocator over one region.
//! * [`local_ssd`]: client-local SSD registrations (not allocatable by the master).
//! * [`ha`]: the oplog's business side — entry payloads, the mutation seam, replay of a restarted master.
//! * [`clock`]: the injectable time source every lease and timeout reads.
//! * [`memory`]: returning freed heap to the OS after bulk removals.
//! * [`sim`]: a KV-cache workload replayed through the master core in-process (`crescent demo`).

pub mod alloc;
pub mod clock;
pub mod events;
pub mod eviction;
pub mod ha;
pub mod local_ssd;
pub mod memory;
pub mod metadata;
pub(crate) mod parallel;
pub mod placement;
pub mod segment_pool;
pub mod server;
pub mod service;
pub mod sim;
pub mod snapshot;
#[cfg(test)]
pub(crate) mod test_hooks;
