//! The one error vocabulary used on the wire.
//!
//! Names and numeric values are those of the original Mooncake store, so tools and bindings that
//! know those codes keep working. Crates keep richer `thiserror` enums inside and map to a code at the boundary.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// Declares [`ErrorCode`] from one table — variant, wire value, enumerator name — and derives from it the
/// enum, [`ErrorCode::ALL`], [`ErrorCode::name`] and [`ErrorCode::from_i32`], so the four can never disagree.
macro_rules! error_codes {
    ($($variant:ident = $value:literal => $name:literal,)+) => {
        /// A wire error code (`0` = success, negative = failure).
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
        #[repr(i32)]
        pub enum ErrorCode {
            $(
                #[doc = concat!("`", $name, "`")]
                $variant = $value,
            )+
        }

        impl ErrorCode {
            /// Every code, in ascending order of magnitude (the original's order).
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),+];

            /// The enumerator name (what CLIs print, e.g. `OBJECT_NOT_FOUND`).
            pub fn name(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $name,)+
                }
            }

            /// The code for a numeric wire value.
            pub fn from_i32(v: i32) -> Result<Self, ErrorCodeUnknown> {
                match v {
                    $($value => Ok(ErrorCode::$variant),)+
                    other => Err(ErrorCodeUnknown(other)),
                }
            }
        }
    };
}

error_codes! {
    Ok = 0 => "OK",
    InternalError = -1 => "INTERNAL_ERROR",
    BufferOverflow = -10 => "BUFFER_OVERFLOW",
    ShardIndexOutOfRange = -100 => "SHARD_INDEX_OUT_OF_RANGE",
    SegmentNotFound = -101 => "SEGMENT_NOT_FOUND",
    SegmentAlreadyExists = -102 => "SEGMENT_ALREADY_EXISTS",
    ClientNotFound = -103 => "CLIENT_NOT_FOUND",
    NoAvailableHandle = -200 => "NO_AVAILABLE_HANDLE",
    InvalidVersion = -300 => "INVALID_VERSION",
    InvalidKey = -400 => "INVALID_KEY",
    WriteFail = -500 => "WRITE_FAIL",
    InvalidParams = -600 => "INVALID_PARAMS",
    IllegalClient = -601 => "ILLEGAL_CLIENT",
    InvalidWrite = -700 => "INVALID_WRITE",
    InvalidRead = -701 => "INVALID_READ",
    InvalidReplica = -702 => "INVALID_REPLICA",
    ReplicaIsNotReady = -703 => "REPLICA_IS_NOT_READY",
    ObjectNotFound = -704 => "OBJECT_NOT_FOUND",
    ObjectAlreadyExists = -705 => "OBJECT_ALREADY_EXISTS",
    ObjectHasLease = -706 => "OBJECT_HAS_LEASE",
    LeaseExpired = -707 => "LEASE_EXPIRED",
    ObjectHasReplicationTask = -708 => "OBJECT_HAS_REPLICATION_TASK",
    ObjectNoReplicationTask = -709 => "OBJECT_NO_REPLICATION_TASK",
    ReplicaNotFound = -710 => "REPLICA_NOT_FOUND",
    ReplicaAlreadyExists = -711 => "REPLICA_ALREADY_EXISTS",
    ReplicaIsGone = -712 => "REPLICA_IS_GONE",
    ReplicaNotInLocalMemory = -713 => "REPLICA_NOT_IN_LOCAL_MEMORY",
    ObjectReplicaBusy = -714 => "OBJECT_REPLICA_BUSY",
    TransferFail = -800 => "TRANSFER_FAIL",
    ChecksumMismatch = -801 => "CHECKSUM_MISMATCH",
    RpcFail = -900 => "RPC_FAIL",
    RpcTimeout = -901 => "RPC_TIMEOUT",
    EtcdOperationError = -1000 => "ETCD_OPERATION_ERROR",
    EtcdKeyNotExist = -1001 => "ETCD_KEY_NOT_EXIST",
    EtcdTransactionFail = -1002 => "ETCD_TRANSACTION_FAIL",
    EtcdCtxCancelled = -1003 => "ETCD_CTX_CANCELLED",
    OplogEntryNotFound = -1004 => "OPLOG_ENTRY_NOT_FOUND",
    K8sLeaseOperationError = -1005 => "K8S_LEASE_OPERATION_ERROR",
    K8sLeaseNotFound = -1006 => "K8S_LEASE_NOT_FOUND",
    IncompleteOplogCatchUp = -1007 => "INCOMPLETE_OPLOG_CATCH_UP",
    UnavailableInCurrentStatus = -1010 => "UNAVAILABLE_IN_CURRENT_STATUS",
    UnavailableInCurrentMode = -1011 => "UNAVAILABLE_IN_CURRENT_MODE",
    NotSupported = -1012 => "NOT_SUPPORTED",
    FileNotFound = -1100 => "FILE_NOT_FOUND",
    FileOpenFail = -1101 => "FILE_OPEN_FAIL",
    FileReadFail = -1102 => "FILE_READ_FAIL",
    FileWriteFail = -1103 => "FILE_WRITE_FAIL",
    FileInvalidBuffer = -1104 => "FILE_INVALID_BUFFER",
    FileLockFail = -1105 => "FILE_LOCK_FAIL",
    FileInvalidHandle = -1106 => "FILE_INVALID_HANDLE",
    BucketNotFound = -1200 => "BUCKET_NOT_FOUND",
    BucketAlreadyExists = -1201 => "BUCKET_ALREADY_EXISTS",
    KeysExceedBucketLimit = -1202 => "KEYS_EXCEED_BUCKET_LIMIT",
    KeysUltraLimit = -1203 => "KEYS_ULTRA_LIMIT",
    UnableOffload = -1300 => "UNABLE_OFFLOAD",
    UnableOffloading = -1301 => "UNABLE_OFFLOADING",
    TaskNotFound = -1400 => "TASK_NOT_FOUND",
    TaskPendingLimitExceeded = -1401 => "TASK_PENDING_LIMIT_EXCEEDED",
    JobNotFound = -1402 => "JOB_NOT_FOUND",
    SerializeUnsupported = -1500 => "SERIALIZE_UNSUPPORTED",
    SerializeFail = -1501 => "SERIALIZE_FAIL",
    DeserializeFail = -1502 => "DESERIALIZE_FAIL",
    PersistentFail = -1503 => "PERSISTENT_FAIL",
    DfsNetworkTimeout = -1600 => "DFS_NETWORK_TIMEOUT",
    DfsServiceUnavailable = -1601 => "DFS_SERVICE_UNAVAILABLE",
    DfsQuotaExceeded = -1602 => "DFS_QUOTA_EXCEEDED",
    DfsPermissionDenied = -1603 => "DFS_PERMISSION_DENIED",
    DfsStaleHandle = -1604 => "DFS_STALE_HANDLE",
    DfsPartialWrite = -1605 => "DFS_PARTIAL_WRITE",
    TenantQuotaExceeded = -1700 => "TENANT_QUOTA_EXCEEDED",
    TenantNotRegistered = -1701 => "TENANT_NOT_REGISTERED",
    TenantNotEmpty = -1702 => "TENANT_NOT_EMPTY",
    AuthenticationFailed = -1800 => "AUTHENTICATION_FAILED",
    PermissionDenied = -1801 => "PERMISSION_DENIED",
    GrantExpired = -1802 => "GRANT_EXPIRED",
}

/// A numeric code that names no [`ErrorCode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown error code {0}")]
pub struct ErrorCodeUnknown(pub i32);

impl ErrorCode {
    /// The numeric wire value.
    pub fn as_i32(self) -> i32 {
        self as i32
    }

    /// The code with this enumerator name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.name() == name)
    }

    /// Whether this is `OK`.
    pub fn is_ok(self) -> bool {
        self == ErrorCode::Ok
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::error::Error for ErrorCode {}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i32(self.as_i32())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i32::deserialize(d)?;
        ErrorCode::from_i32(v).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_the_reference() {
        assert_eq!(ErrorCode::ALL.len(), 75);
        assert_eq!(ErrorCode::Ok.as_i32(), 0);
        assert_eq!(ErrorCode::InternalError.as_i32(), -1);
        assert_eq!(ErrorCode::NoAvailableHandle.as_i32(), -200);
        assert_eq!(ErrorCode::InvalidParams.as_i32(), -600);
        assert_eq!(ErrorCode::ObjectNotFound.as_i32(), -704);
        assert_eq!(ErrorCode::UnavailableInCurrentStatus.as_i32(), -1010);
        assert_eq!(ErrorCode::TenantNotEmpty.as_i32(), -1702);
        assert_eq!(ErrorCode::ObjectNotFound.to_string(), "OBJECT_NOT_FOUND");
    }

    #[test]
    fn every_code_round_trips() {
        let mut seen = std::collections::HashSet::new();
        for &c in ErrorCode::ALL {
            assert!(seen.insert(c.as_i32()), "duplicate value {}", c.as_i32());
            assert_eq!(ErrorCode::from_i32(c.as_i32()), Ok(c));
            assert_eq!(ErrorCode::from_name(c.name()), Some(c));
            let bytes = postcard::to_stdvec(&c).unwrap();
            assert_eq!(postcard::from_bytes::<ErrorCode>(&bytes).unwrap(), c);
        }
        assert_eq!(ErrorCode::from_i32(-2), Err(ErrorCodeUnknown(-2)));
        assert!(postcard::from_bytes::<ErrorCode>(&postcard::to_stdvec(&7i32).unwrap()).is_err());
    }
}
