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
        grant: Option<Grant>,
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
        grant: Option<Grant>,
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
        grant: Option<Grant>,
    },
    /// Ends the holds of every `Locate` of this connection so far: the client's copies are done. Answered with
    /// [`TransferResponse::Released`] once they are over, so a request the client sends after that reply (on any
    /// connection) never meets them.
    Release,
}

/// Bytes of a grant's tag (a truncated HMAC-SHA256).
pub const GRANT_TAG_LEN: usize = 16;

/// A capability the master sealed: its holder may read or write (the request says which) `[offset, offset +
/// length)` of the request's segment until `expires_ms` (Unix ms), on the connection of the client it was sealed
/// for. Nodes check the tag; the master seals it (`crescent_net::grant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Grant {
    /// Start of the granted range.
    pub offset: u64,
    /// Bytes granted.
    pub length: u64,
    /// When the grant ends, in Unix milliseconds.
    pub expires_ms: u64,
    /// The term of the master that sealed it (when that master began to lead, Unix ms; 0: none): a node
    /// refuses a grant of a term older than the newest it has honoured, so a deposed or restarted master's grants
    /// cannot reach space its successor gave to another object.
    pub epoch: u64,
    /// The seal over the operation, segment, client, range, expiry and term.
    pub tag: [u8; GRANT_TAG_LEN],
}

impl Grant {
    /// Whether `[offset, offset + length)` lies inside the granted range.
    pub fn covers(&self, offset: u64, length: u64) -> bool {
        let (Some(end), Some(granted_end)) = (offset.checked_add(length), self.offset.checked_add(self.length)) else {
            return false;
        };
        offset >= self.offset && end <= granted_end
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
    /// The request was refused (e.g. `INVALID_PARAMS` for a range outside the segment).
    Error(ErrorCode),
}
