//! Mounted segments: what a client offers the master to allocate from.

use crate::ids::SegmentId;
use serde::{Deserialize, Serialize};

/// The medium of a mounted region; decides which driver owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SegmentKind {
    /// Ordinary host memory (mmap'd by a storage node or an embedded client).
    Memory,
    /// A window of a shared CXL device; one master-wide allocator, single replica per object.
    Cxl,
    /// NVMe-over-Fabrics namespace; `base` is a namespace offset and may be 0.
    Nof,
    /// A storage node's local disk tier (a file on its SSD): only the master's offloads write it, readers read it
    /// through the node; ranges are 4 KiB-aligned.
    Disk,
}

/// The block of a disk segment: its size and every range in it are whole blocks (direct I/O needs them aligned).
pub const DISK_BLOCK: u64 = 4096;

/// A segment as its owner describes it at mount. Identity is `id`; every field must match on a repeated mount.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SegmentSpec {
    /// Unique id chosen by the owner.
    pub id: SegmentId,
    /// Placement name; replicas of one object land on distinct names.
    pub name: String,
    /// The region's base in its owner's address space (or device offset). Informational: replicas are addressed
    /// as `(segment, offset)` and never by another process's pointer.
    pub base: u64,
    /// Bytes offered.
    pub size: u64,
    /// Where the owner's transfer server listens (`host:port`).
    pub endpoint: String,
    /// Medium and driver.
    pub kind: SegmentKind,
    /// The owner's host, for local-first placement (empty = unknown).
    pub host_id: String,
}

/// Lifecycle of a mounted segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[repr(u8)]
pub enum SegmentStatus {
    /// Never a live segment's status.
    #[default]
    Undefined = 0,
    /// Allocatable and readable.
    Ok = 1,
    /// Readable, no new allocations (a drain job is moving replicas off it).
    Draining = 2,
    /// Drain finished; readable, waiting for unmount.
    Drained = 3,
    /// Readable, no new allocations; fully unmounted at a deadline.
    GracefullyUnmounting = 4,
    /// Deactivated: unallocatable, every replica on it unreadable; waiting for erase.
    Unmounting = 5,
    /// A client could not reach its node: no new allocations and its replicas are not handed to readers (they
    /// use other replicas), metadata kept; back to `Ok` at the node's next ping, unmounted at its client TTL.
    Suspect = 6,
    /// Its owner missed its client TTL (paused, partitioned or dead): no new allocations, replicas not handed to
    /// readers, its space neither free nor evictable, metadata kept until a grace deadline; back to `Ok` when the
    /// same node instance (same client id, i.e. the same process and memory) remounts, unmounted at the deadline
    /// or as soon as another instance mounts at its endpoint.
    Disconnected = 7,
}

impl SegmentStatus {
    /// Only `Ok` segments receive new replicas.
    pub fn is_allocatable(self) -> bool {
        self == SegmentStatus::Ok
    }

    /// Replicas on a segment are readable in every live status but `Unmounting`, `Suspect` and `Disconnected`.
    pub fn is_readable(self) -> bool {
        matches!(
            self,
            SegmentStatus::Ok | SegmentStatus::Draining | SegmentStatus::Drained | SegmentStatus::GracefullyUnmounting
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocatable_iff_ok_and_readable_unless_unmounting() {
        use SegmentStatus::*;
        for s in [Undefined, Ok, Draining, Drained, GracefullyUnmounting, Unmounting, Suspect, Disconnected] {
            assert_eq!(s.is_allocatable(), s == Ok);
            assert_eq!(s.is_readable(), !matches!(s, Undefined | Unmounting | Suspect | Disconnected));
        }
        assert_eq!((Unmounting as u8, Suspect as u8, Disconnected as u8), (5, 6, 7));
    }
}
