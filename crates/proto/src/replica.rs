//! Where an object's bytes live.

use crate::ids::{ClientId, SegmentId};
use crate::transfer::GrantRef;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Lifecycle of one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[repr(u8)]
pub enum ReplicaStatus {
    /// Not yet set.
    #[default]
    Undefined = 0,
    /// Space reserved, no write started.
    Initialized = 1,
    /// The writer is moving bytes into it (PutStart issued, PutEnd not yet).
    Processing = 2,
    /// Written and readable.
    Complete = 3,
    /// Hidden and waiting to be freed (removal not yet durable).
    Removed = 4,
    /// The write failed.
    Failed = 5,
}

/// The address of one replica. Memory and NoF replicas are `(segment, offset)` ranges, never raw pointers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReplicaLocation {
    /// A range of a mounted memory (or CXL) segment.
    Memory {
        /// The segment.
        segment_id: SegmentId,
        /// Byte offset inside the segment.
        offset: u64,
        /// Object bytes stored there.
        length: u64,
        /// The owner's transfer endpoint (`host:port`).
        endpoint: Arc<str>,
    },
    /// A range of a mounted NoF segment.
    Nof {
        /// The segment.
        segment_id: SegmentId,
        /// Byte offset inside the segment (namespace-relative).
        offset: u64,
        /// Object bytes stored there.
        length: u64,
        /// The target's endpoint.
        endpoint: Arc<str>,
    },
    /// A range of a storage node's disk segment (its SSD tier), read through that node.
    Disk {
        /// The segment.
        segment_id: SegmentId,
        /// Byte offset inside the segment.
        offset: u64,
        /// Object bytes stored there.
        length: u64,
        /// The node's transfer endpoint.
        endpoint: Arc<str>,
    },
    /// An object file on a client's local SSD.
    LocalDisk {
        /// The client that holds the file.
        client_id: ClientId,
        /// Object bytes stored.
        length: u64,
        /// That client's transfer endpoint.
        endpoint: Arc<str>,
    },
}

impl ReplicaLocation {
    /// Object bytes at this location.
    pub fn length(&self) -> u64 {
        match self {
            ReplicaLocation::Memory { length, .. }
            | ReplicaLocation::Nof { length, .. }
            | ReplicaLocation::Disk { length, .. }
            | ReplicaLocation::LocalDisk { length, .. } => *length,
        }
    }

    /// The transfer endpoint that serves it.
    pub fn endpoint(&self) -> &str {
        match self {
            ReplicaLocation::Memory { endpoint, .. }
            | ReplicaLocation::Nof { endpoint, .. }
            | ReplicaLocation::Disk { endpoint, .. }
            | ReplicaLocation::LocalDisk { endpoint, .. } => endpoint,
        }
    }

    /// On a disk (the SSD tier or a client's local SSD), not in memory.
    pub fn is_disk(&self) -> bool {
        matches!(self, ReplicaLocation::Disk { .. } | ReplicaLocation::LocalDisk { .. })
    }

    /// The segment, for segment-addressed locations.
    pub fn segment_id(&self) -> Option<SegmentId> {
        match self {
            ReplicaLocation::Memory { segment_id, .. }
            | ReplicaLocation::Nof { segment_id, .. }
            | ReplicaLocation::Disk { segment_id, .. } => Some(*segment_id),
            ReplicaLocation::LocalDisk { .. } => None,
        }
    }
}

/// One replica as the master reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReplicaDescriptor {
    /// Master-assigned replica id, unique for the master's lifetime.
    pub id: u64,
    /// Where the bytes are.
    pub location: ReplicaLocation,
    /// Write state.
    pub status: ReplicaStatus,
    /// The data-plane grant for this range, sealed by the master for the client it answered (write grants in
    /// put replies, read grants in replica lists) when the cluster authenticates; `None` otherwise. In a batch
    /// reply it points into the reply's shared grants.
    pub grant: Option<GrantRef>,
}

/// The id that names a write at its End or Revoke (`MasterRequest::PutEnd::write`): the `id` of the first
/// replica descriptor its Start returned (0 for none, which names no write).
pub fn write_id(replicas: &[ReplicaDescriptor]) -> u64 {
    replicas.first().map_or(0, |d| d.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip() {
        let d = ReplicaDescriptor {
            id: 7,
            location: ReplicaLocation::Memory {
                segment_id: SegmentId::random(),
                offset: 1 << 40,
                length: 4096,
                endpoint: Arc::from("127.0.0.1:1"),
            },
            status: ReplicaStatus::Processing,
            grant: None,
        };
        let bytes = postcard::to_stdvec(&d).unwrap();
        assert_eq!(postcard::from_bytes::<ReplicaDescriptor>(&bytes).unwrap(), d);
        assert_eq!(d.location.length(), 4096);
        assert!(d.location.segment_id().is_some());
    }
}
