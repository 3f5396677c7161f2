//! Data-plane messages: one-sided reads and writes of `(segment, offset, length)` ranges. Object bytes travel
//! as the frame payload, never through serde.

use crate::error::ErrorCode;
use crate::ids::SegmentId;
use serde::{Deserialize, Serialize};

/// A data-plane request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TransferRequest {
    /// Write the frame payload at `offset` of `segment`; acknowledged once the bytes are in place.
    Write {
        /// Target segment.
        segment: SegmentId,
        /// Byte offset inside it.
        offset: u64,
        /// The master's write grant for a range holding this one (required by nodes that authenticate).
        grant: Option<GrantUse>,
    },
    /// Read `length` bytes at `offset` of `segment`; the reply carries them as its payload.
    Read {
        /// Source segment.
        segment: SegmentId,
        /// Byte offset inside it.
        offset: u64,
        /// Bytes wanted.
        length: u64,
        /// The master's read grant for a range holding this one (required by nodes that authenticate).
        grant: Option<GrantUse>,
    },
    /// Same host only, on a local lane whose hello agreed [`caps::LOCAL_COPY`](crate::wire::caps::LOCAL_COPY):
    /// check `[offset, offset + length)` of `segment` as a READ (or, if `write`, a WRITE) of it would be checked
    /// — grant, range, conflicting transfers — and answer [`TransferResponse::Located`] with the range's address
    /// in the node's memory, which the client then copies to or from itself in one kernel copy
    /// (`process_vm_writev`/`readv`, which its own privileges over the node must allow). The node holds the
    /// range as a transfer would, and keeps it mapped, until [`TransferRequest::Release`] or the connection's
    /// close.
    Locate {
        /// The segment.
        segment: SegmentId,
        /// Byte offset inside it.
        offset: u64,
        /// Bytes to copy.
        length: u64,
        /// Whether the client will write the range (else read it).
        write: bool,
        /// The master's grant for a range holding this one (required by nodes that authenticate).
        grant: Option<GrantUse>,
    },
    /// Ends the holds of every `Locate` of this connection so far: the client's copies are done. Answered with
    /// [`TransferResponse::Released`] once they are over, so a request the client sends after that reply (on any
    /// connection) never meets them.
    Release,
    /// Same host only, on a local lane whose hello agreed [`caps::LOCAL_COPY`](crate::wire::caps::LOCAL_COPY): a
    /// process attaching to this storage node to use it as its store (the Python package's `setup_dummy`). The
    /// node answers [`TransferResponse::Attached`]: where its master is, its name, and the descriptors of its
    /// memfd-backed segments, which the client takes with `pidfd_getfd(2)` (the kernel allows that only to a
    /// process it lets write the node's memory anyway, as for `Locate`'s copies) and maps, so its copies to and
    /// from them are memory copies. The node keeps those segments (and so the descriptor numbers it named) open
    /// until [`TransferRequest::Release`] or the connection's close.
    Attach,
}

/// What a storage node tells a process attaching to it ([`TransferRequest::Attach`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// The master address the node mounts its segments with (`host:port`, or `etcd://…`).
    pub master: String,
    /// The name the node's memory segments are mounted under (a placement preference names it).
    pub name: String,
    /// The host the node says it is on (replicas there count as on the attached process's host).
    pub host_id: String,
    /// The node's memory segments that can be shared (memfd-backed); anonymous ones are reached by `Locate`.
    pub segments: Vec<SharedSegment>,
}

/// One memfd-backed segment of a node, as [`Attachment`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedSegment {
    /// The segment.
    pub segment: SegmentId,
    /// Its memfd's descriptor number in the node's process.
    pub fd: i32,
    /// The memfd's inode number, so the attaching process can tell it took that file and no other.
    pub inode: u64,
    /// Bytes in the segment.
    pub length: u64,
}

/// Bytes of a grant's tag (a truncated HMAC-SHA256).
pub const GRANT_TAG_LEN: usize = 16;

/// Most ranges one grant lists: a batch reply seals one grant per segment and operation for up to this many of
/// its ranges (more take more grants), so a grant carried in a transfer request stays well inside
/// [`MAX_DATA_HEADER`](crate::wire::MAX_DATA_HEADER).
pub const MAX_GRANT_RANGES: usize = 128;

/// Grants a data-plane connection holds at once ([`GrantUse::Carried`] into one of these slots).
pub const MAX_GRANT_SLOTS: usize = 16;

/// One range a grant covers: `[offset, offset + length)` of its segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GrantRange {
    /// Start of the range.
    pub offset: u64,
    /// Bytes in it.
    pub length: u64,
}

impl GrantRange {
    /// Whether `[offset, offset + length)` lies inside this range.
    pub fn covers(&self, offset: u64, length: u64) -> bool {
        let (Some(end), Some(granted_end)) = (offset.checked_add(length), self.offset.checked_add(self.length)) else {
            return false;
        };
        offset >= self.offset && end <= granted_end
    }
}

/// A capability the master sealed: its holder may read or write (the request says which) any of `ranges` of
/// the request's segment until `expires_ms` (Unix ms), on the connection of the client it was sealed for. A
/// single object's reply holds one grant per range; a batch reply one per segment and operation, listing every
/// range of that segment it hands out (up to [`MAX_GRANT_RANGES`]), so a node checks one tag per batch. Nodes
/// check the tag; the master seals it (`crescent_net::grant`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Grant {
    /// The granted ranges, in the order the tag covers them (requests name one by its index).
    pub ranges: Vec<GrantRange>,
    /// When the grant ends, in Unix milliseconds.
    pub expires_ms: u64,
    /// The term of the master that sealed it (when that master began to lead, Unix ms; 0: none): a node
    /// refuses a grant of a term older than the newest it has honoured, so a deposed or restarted master's grants
    /// cannot reach space its successor gave to another object.
    pub epoch: u64,
    /// The seal over the operation, segment, client, ranges, expiry and term.
    pub tag: [u8; GRANT_TAG_LEN],
}

/// Where a replica descriptor's grant is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GrantRef {
    /// The range's own grant (single-object replies): its one range is the descriptor's.
    Own(Grant),
    /// Range `range` of the reply's grant number `grant` ([`GrantedBatch::grants`](crate::rpc::GrantedBatch)).
    Shared {
        /// Index into the reply's grants.
        grant: u32,
        /// Index into that grant's ranges.
        range: u32,
    },
}

/// How a transfer request shows its grant. A connection holds up to [`MAX_GRANT_SLOTS`] grants: a request
/// carries a grant into a slot (the node checks its tag then, once) and later requests of the same batch name
/// the slot, so a pipelined run of many ranges costs one check per grant, not one per range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GrantUse {
    /// This request brings `grant` (replacing what `slot` held) and is range `range` of it.
    Carried {
        /// The slot the grant is kept in for later requests.
        slot: u8,
        /// The index of this request's range in the grant.
        range: u16,
        /// The grant.
        grant: Grant,
    },
    /// This request is range `range` of the grant an earlier request of this connection carried into `slot`.
    Held {
        /// The slot.
        slot: u8,
        /// The index of this request's range in the grant.
        range: u16,
    },
}

impl GrantUse {
    /// The slot the request names.
    pub fn slot(&self) -> u8 {
        match self {
            Self::Carried { slot, .. } | Self::Held { slot, .. } => *slot,
        }
    }

    /// The index of the request's range in its grant.
    pub fn range(&self) -> u16 {
        match self {
            Self::Carried { range, .. } | Self::Held { range, .. } => *range,
        }
    }
}

/// A data-plane reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TransferResponse {
    /// The write landed.
    Written,
    /// The payload holds the bytes read.
    Data,
    /// The located range starts at this address of the node's memory.
    Located(u64),
    /// The located ranges are released.
    Released,
    /// The answer to [`TransferRequest::Attach`].
    Attached(Attachment),
    /// The request was refused (e.g. `INVALID_PARAMS` for a range outside the segment).
    Error(ErrorCode),
}
