//! The Crescent master: metadata only, it never touches object bytes.
//!
//! Module map (see `docs/architecture.md`): [`alloc`] is the offset allocator over one region; [`segment_pool`]
//! is the single owner of mounted Memory/CXL/NoF regions; [`placement`] is the stateless replica placement that
//! borrows a lock-scoped view of the pool; [`local_ssd`] owns client-local SSD registrations; [`clock`] is the
//! injectable time source every lease and timeout reads.

pub mod alloc;
pub mod clock;
pub mod eviction;
pub mod local_ssd;
pub mod memory;
pub mod metadata;
pub mod placement;
pub mod segment_pool;
pub mod server;
pub mod service;
pub mod sim;
