//! The data plane: moves object bytes between a client and the segments that hold its replicas.
//!
//! * [`SegmentMemory`]: a mounted segment's bytes (an anonymous or memfd-backed mmap), shared by many concurrent
//!   transfers through range leases (`unsafe` confined to `memory.rs`, for local copies `vm.rs`, and for
//!   aligned disk buffers `disk/buf.rs`).
//! * [`SegmentRegistry`]: the segments this process hosts.
//! * [`TransferServer`]: serves one-sided READ/WRITE of `(segment, offset, length)` ranges over TCP, validating
//!   every range against what it hosts; payloads go between the socket and segment memory without staging.
//! * [`TransferClient`]: pooled persistent connections per peer (a bounded number of lanes, TCP_NODELAY, large
//!   socket buffers), striping of large transfers over the lanes, and a memcpy fast path for segments hosted
//!   by this very process. To a node on the same host it dials local lanes (a Unix socket) and copies large
//!   transfers straight between the two processes' memory.
//!
//! Modules: `memory` ([`SegmentMemory`] and its range leases), `registry`, `server`, `client` (and
//! `client::batch`, pipelined runs of small ranges), `local` (local lanes: the Unix socket a node on this host
//! answers under its endpoint's name), `vm` (local copies: `process_vm_writev`/`readv` into a located range),
//! `copy` (copies within this process: summed piece by piece as they go, split over two threads when long), `net` (socket sizing, payloads into their destination, sendfile), `checksum` (joining crc32c sums of adjacent
//! pieces), `error` ([`TransferError`]), [`disk`] (the SSD tier's node side: block devices, [`DiskSegment`]
//! served from its own I/O threads, hosted beside memory segments and served for reads).
//!
//! The design keeps the original's one-sided `(addr, len, opcode)` semantics and its "applied" acknowledgement
//! for writes, and drops its TCP transport's structural limits: no single I/O thread (a task per connection on
//! the multi-threaded runtime), no socket per transfer (persistent lanes), no serialised slices (stripes in
//! parallel), and `TCP_NODELAY` on both ends. The wire format is `crescent_proto::wire`'s frame with
//! `crescent_proto::transfer` messages in the header and object bytes as the raw payload.

mod checksum;
mod client;
mod copy;
pub mod disk;
mod error;
mod local;
mod memory;
mod net;
mod registry;
mod server;
mod vm;

pub use client::{Attached, BatchRead, BatchWrite, Place, RangeGrant, Tickets, TransferClient, TransferConfig};
pub use disk::{DiskConfig, DiskError, DiskSegment};
pub use error::TransferError;
pub use local::local_lane_address;
pub use memory::{SegmentMemory, SegmentMut, SegmentRef};
pub use registry::SegmentRegistry;
pub use server::{DEFAULT_SERVER_IO_TIMEOUT, ServerStats, TransferServer, TransferServerHandle};

/// Most payload bytes one frame carries (the data-plane frame limit minus room for the header). Larger
/// transfers are split by the client; a larger read is refused by the server.
pub const MAX_TRANSFER: u64 = 64 << 20;
