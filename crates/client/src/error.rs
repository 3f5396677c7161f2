//! Client errors: every failure carries the wire [`ErrorCode`] it is reported as.

use crescent_proto::ErrorCode;
use crescent_proto::wire::{ErrorFrame, WireError};

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The master (or a storage node) answered with an error code.
    #[error("{0}")]
    Code(ErrorCode),
    /// The request was refused, with the reason in words (from the master, or the client's own checks).
    #[error("{}", if .0.message.is_empty() { .0.code.name() } else { .0.message.as_str() })]
    Refused(ErrorFrame),
    /// No master answered: every configured address was tried, each within the request timeout.
    #[error("cannot reach the master at {addr}: {reason}")]
    Unreachable {
        /// The addresses tried, in the order tried (`a, b`).
        addr: String,
        /// Why (connection refused, no answer within the timeout, ...); per address when several were tried.
        reason: String,
        /// An address was tried that did not answer in time (`RPC_TIMEOUT`; otherwise `RPC_FAIL`).
        timed_out: bool,
    },
    /// No master leads the cluster an `etcd://` address names: its master view stayed empty (or etcd could not
    /// be read and no leader was known) for the whole request timeout (`UNAVAILABLE_IN_CURRENT_STATUS`).
    #[error("no leader for cluster {cluster} (etcd {endpoints}): {reason}")]
    NoLeader {
        /// The cluster id.
        cluster: String,
        /// The etcd endpoints, comma-separated.
        endpoints: String,
        /// Why: the view is empty, or what etcd said.
        reason: String,
    },
    /// A request that is not safe to repeat may have reached the leader, which then stopped answering or was
    /// replaced; it was not sent again, so whether it took effect is unknown (`RPC_FAIL`).
    #[error(
        "{op} may have reached master {master}, which then {reason}; not repeated (not idempotent), so its outcome is unknown"
    )]
    OutcomeUnknown {
        /// The operation (`put_start`, `remove`, ...).
        op: &'static str,
        /// The master it was sent to.
        master: String,
        /// What happened to that master.
        reason: String,
    },
    /// The connection to the master failed.
    #[error("master connection: {0}")]
    Wire(#[from] WireError),
    /// Moving bytes to or from a storage node failed.
    #[error("transfer: {0}")]
    Transfer(#[from] crescent_transfer::TransferError),
    /// The master did not answer in time. (The master connection itself reports a timeout as `Unreachable`,
    /// which names the addresses tried; this remains for callers that match on it.)
    #[error("master request timed out")]
    Timeout,
    /// The bytes read do not match the checksum stored at PutEnd (nothing is returned).
    #[error("checksum mismatch reading {key}")]
    ChecksumMismatch {
        /// The object.
        key: String,
    },
    /// A read took longer than the lease it was granted (the bytes may have been evicted meanwhile).
    #[error("read of {key} outlived its {lease_ms} ms lease")]
    LeaseExpired {
        /// The object.
        key: String,
        /// The lease granted.
        lease_ms: u64,
    },
    /// A batch larger than the protocol allows, refused before anything was sent.
    #[error("a batch of {items} items exceeds the protocol's limit of {limit} per request")]
    BatchTooLarge {
        /// Items in the batch.
        items: usize,
        /// The limit (`crescent_proto::wire::MAX_BATCH`).
        limit: usize,
    },
    /// A storage node could not listen on its address (`INTERNAL_ERROR`); kept as the I/O error so a caller can
    /// tell a port in use (`AddrInUse`) from other failures and pick another port.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address it tried to bind.
        addr: std::net::SocketAddr,
        /// Why the bind failed.
        source: std::io::Error,
    },
    /// The caller's buffer is smaller than the object.
    #[error("buffer of {have} bytes cannot hold {need} bytes")]
    BufferTooSmall {
        /// Object size.
        need: u64,
        /// Buffer size.
        have: usize,
    },
}

impl ClientError {
    /// Whether a master refused the request because it does not lead (a standby, or a deposed leader): it did
    /// nothing, and the same request may go to the leader once one is known.
    pub fn is_not_leader(&self) -> bool {
        matches!(self, ClientError::Refused(e) if crate::master::refused_as_not_leader(e))
    }

    /// The wire code for this error (what the CLI prints).
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Code(c) => *c,
            ClientError::Refused(f) => f.code,
            ClientError::Unreachable { timed_out: true, .. } => ErrorCode::RpcTimeout,
            ClientError::Unreachable { .. } => ErrorCode::RpcFail,
            ClientError::NoLeader { .. } => ErrorCode::UnavailableInCurrentStatus,
            ClientError::OutcomeUnknown { .. } => ErrorCode::RpcFail,
            ClientError::Wire(e) => e.code(),
            ClientError::Transfer(e) => e.code(),
            ClientError::Timeout => ErrorCode::RpcTimeout,
            ClientError::ChecksumMismatch { .. } => ErrorCode::ChecksumMismatch,
            ClientError::LeaseExpired { .. } => ErrorCode::LeaseExpired,
            ClientError::BufferTooSmall { .. } => ErrorCode::BufferOverflow,
            ClientError::BatchTooLarge { .. } => ErrorCode::InvalidParams,
            ClientError::Listen { .. } => ErrorCode::InternalError,
        }
    }
}

/// An I/O error as a short reason: `connection refused`, not `Connection refused (os error 111)`.
pub(crate) fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::TimedOut => "timed out".into(),
        _ => e.to_string(),
    }
}

impl From<crescent_proto::KeyError> for ClientError {
    fn from(e: crescent_proto::KeyError) -> Self {
        ClientError::Refused(ErrorFrame { code: e.code(), message: e.to_string() })
    }
}

impl From<ErrorCode> for ClientError {
    fn from(c: ErrorCode) -> Self {
        ClientError::Code(c)
    }
}
