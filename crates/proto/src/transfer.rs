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
    },
    /// Read `length` bytes at `offset` of `segment`; the reply carries them as its payload.
    Read {
        /// Source segment.
        segment: SegmentId,
        /// Byte offset inside it.
        offset: u64,
        /// Bytes wanted.
        length: u64,
    },
}

/// A data-plane reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TransferResponse {
    /// The write landed.
    Written,
    /// The payload holds the bytes read.
    Data,
    /// The request was refused (e.g. `INVALID_PARAMS` for a range outside the segment).
    Error(ErrorCode),
}
