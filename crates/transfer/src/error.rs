//! The data plane's error type and its mapping to wire codes.

use crescent_proto::ErrorCode;
use crescent_proto::wire::WireError;
use std::io;

/// Why a transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// A socket error (the connection it happened on is dropped).
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// The server answered with an error (`SEGMENT_NOT_FOUND`, `INVALID_PARAMS`, ...).
    #[error("refused by the server: {0}")]
    Refused(ErrorCode),
    /// The range lies outside the segment (or its end overflows).
    #[error("range outside the segment")]
    OutOfRange,
    /// The peer broke the framing protocol.
    #[error("protocol: {0}")]
    Protocol(WireError),
    /// A connect or a request/response exchange exceeded its deadline.
    #[error("timed out")]
    Timeout,
    /// The peer closed the connection mid-exchange.
    #[error("connection closed")]
    Closed,
    /// The range overlaps a conflicting in-flight access in this process (a write racing another access).
    #[error("range busy: a conflicting transfer is in flight")]
    Busy,
    /// No storage node on this host answers at the endpoint over a local lane (another host, a node without
    /// local lanes, or one serving TLS): attaching needs one.
    #[error("no storage node on this host serves local lanes at {0}")]
    NotLocal(String),
}

impl TransferError {
    /// The wire code reported for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            TransferError::Refused(c) => *c,
            TransferError::OutOfRange => ErrorCode::InvalidParams,
            TransferError::Timeout => ErrorCode::RpcTimeout,
            TransferError::Busy => ErrorCode::ObjectReplicaBusy,
            TransferError::NotLocal(_) => ErrorCode::InvalidParams,
            TransferError::Io(_) | TransferError::Protocol(_) | TransferError::Closed => ErrorCode::TransferFail,
        }
    }
}

impl From<WireError> for TransferError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Io(e) => io_error(e),
            WireError::Closed => TransferError::Closed,
            other => TransferError::Protocol(other),
        }
    }
}

/// An unexpected EOF is the peer closing; everything else stays an I/O error.
pub(crate) fn io_error(e: io::Error) -> TransferError {
    if e.kind() == io::ErrorKind::UnexpectedEof { TransferError::Closed } else { TransferError::Io(e) }
}
