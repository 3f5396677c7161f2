//! The one error vocabulary used on the wire.
//!
//! Names and numeric values are the original system's (`mooncake-master_api.md` §7) so tools and bindings that
//! know those codes keep working. Crates keep richer `thiserror` enums inside and map to a code at the boundary.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A wire error code (`0` = success, negative = failure).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(i32)]
pub enum ErrorCode {
    /// `OK`
    Ok = 0,
    /// `INTERNAL_ERROR`
    InternalError = -1,
    /// `BUFFER_OVERFLOW`
    BufferOverflow = -10,
    /// `SHARD_INDEX_OUT_OF_RANGE`
    ShardIndexOutOfRange = -100,
    /// `SEGMENT_NOT_FOUND`
    SegmentNotFound = -101,
    /// `SEGMENT_ALREADY_EXISTS`
    SegmentAlreadyExists = -102,
    /// `CLIENT_NOT_FOUND`
    ClientNotFound = -103,
    /// `NO_AVAILABLE_HANDLE`
    NoAvailableHandle = -200,
    /// `INVALID_VERSION`
    InvalidVersion = -300,
    /// `INVALID_KEY`
    InvalidKey = -400,
    /// `WRITE_FAIL`
    WriteFail = -500,
    /// `INVALID_PARAMS`
    InvalidParams = -600,
    /// `ILLEGAL_CLIENT`
    IllegalClient = -601,
    /// `INVALID_WRITE`
    InvalidWrite = -700,
    /// `INVALID_READ`
    InvalidRead = -701,
    /// `INVALID_REPLICA`
    InvalidReplica = -702,
    /// `REPLICA_IS_NOT_READY`
    ReplicaIsNotReady = -703,
    /// `OBJECT_NOT_FOUND`
    ObjectNotFound = -704,
    /// `OBJECT_ALREADY_EXISTS`
    ObjectAlreadyExists = -705,
    /// `OBJECT_HAS_LEASE`
    ObjectHasLease = -706,
    /// `LEASE_EXPIRED`
    LeaseExpired = -707,
    /// `OBJECT_HAS_REPLICATION_TASK`
    ObjectHasReplicationTask = -708,
    /// `OBJECT_NO_REPLICATION_TASK`
    ObjectNoReplicationTask = -709,
    /// `REPLICA_NOT_FOUND`
    ReplicaNotFound = -710,
    /// `REPLICA_ALREADY_EXISTS`
    ReplicaAlreadyExists = -711,
    /// `REPLICA_IS_GONE`
    ReplicaIsGone = -712,
    /// `REPLICA_NOT_IN_LOCAL_MEMORY`
    ReplicaNotInLocalMemory = -713,
    /// `OBJECT_REPLICA_BUSY`
    ObjectReplicaBusy = -714,
    /// `TRANSFER_FAIL`
    TransferFail = -800,
    /// `CHECKSUM_MISMATCH`
    ChecksumMismatch = -801,
    /// `RPC_FAIL`
    RpcFail = -900,
    /// `RPC_TIMEOUT`
    RpcTimeout = -901,
    /// `ETCD_OPERATION_ERROR`
    EtcdOperationError = -1000,
    /// `ETCD_KEY_NOT_EXIST`
    EtcdKeyNotExist = -1001,
    /// `ETCD_TRANSACTION_FAIL`
    EtcdTransactionFail = -1002,
    /// `ETCD_CTX_CANCELLED`
    EtcdCtxCancelled = -1003,
    /// `OPLOG_ENTRY_NOT_FOUND`
    OplogEntryNotFound = -1004,
    /// `K8S_LEASE_OPERATION_ERROR`
    K8sLeaseOperationError = -1005,
    /// `K8S_LEASE_NOT_FOUND`
    K8sLeaseNotFound = -1006,
    /// `INCOMPLETE_OPLOG_CATCH_UP`
    IncompleteOplogCatchUp = -1007,
    /// `UNAVAILABLE_IN_CURRENT_STATUS`
    UnavailableInCurrentStatus = -1010,
    /// `UNAVAILABLE_IN_CURRENT_MODE`
    UnavailableInCurrentMode = -1011,
    /// `NOT_SUPPORTED`
    NotSupported = -1012,
    /// `FILE_NOT_FOUND`
    FileNotFound = -1100,
    /// `FILE_OPEN_FAIL`
    FileOpenFail = -1101,
    /// `FILE_READ_FAIL`
    FileReadFail = -1102,
    /// `FILE_WRITE_FAIL`
    FileWriteFail = -1103,
    /// `FILE_INVALID_BUFFER`
    FileInvalidBuffer = -1104,
    /// `FILE_LOCK_FAIL`
    FileLockFail = -1105,
    /// `FILE_INVALID_HANDLE`
    FileInvalidHandle = -1106,
    /// `BUCKET_NOT_FOUND`
    BucketNotFound = -1200,
    /// `BUCKET_ALREADY_EXISTS`
    BucketAlreadyExists = -1201,
    /// `KEYS_EXCEED_BUCKET_LIMIT`
    KeysExceedBucketLimit = -1202,
    /// `KEYS_ULTRA_LIMIT`
    KeysUltraLimit = -1203,
    /// `UNABLE_OFFLOAD`
    UnableOffload = -1300,
    /// `UNABLE_OFFLOADING`
    UnableOffloading = -1301,
    /// `TASK_NOT_FOUND`
    TaskNotFound = -1400,
    /// `TASK_PENDING_LIMIT_EXCEEDED`
    TaskPendingLimitExceeded = -1401,
    /// `JOB_NOT_FOUND`
    JobNotFound = -1402,
    /// `SERIALIZE_UNSUPPORTED`
    SerializeUnsupported = -1500,
    /// `SERIALIZE_FAIL`
    SerializeFail = -1501,
    /// `DESERIALIZE_FAIL`
    DeserializeFail = -1502,
    /// `PERSISTENT_FAIL`
    PersistentFail = -1503,
    /// `DFS_NETWORK_TIMEOUT`
    DfsNetworkTimeout = -1600,
    /// `DFS_SERVICE_UNAVAILABLE`
    DfsServiceUnavailable = -1601,
    /// `DFS_QUOTA_EXCEEDED`
    DfsQuotaExceeded = -1602,
    /// `DFS_PERMISSION_DENIED`
    DfsPermissionDenied = -1603,
    /// `DFS_STALE_HANDLE`
    DfsStaleHandle = -1604,
    /// `DFS_PARTIAL_WRITE`
    DfsPartialWrite = -1605,
    /// `TENANT_QUOTA_EXCEEDED`
    TenantQuotaExceeded = -1700,
    /// `TENANT_NOT_REGISTERED`
    TenantNotRegistered = -1701,
    /// `TENANT_NOT_EMPTY`
    TenantNotEmpty = -1702,
}

/// A numeric code that names no [`ErrorCode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown error code {0}")]
pub struct ErrorCodeUnknown(pub i32);

impl ErrorCode {
    /// Every code, in the reference's order.
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::Ok,
        ErrorCode::InternalError,
        ErrorCode::BufferOverflow,
        ErrorCode::ShardIndexOutOfRange,
        ErrorCode::SegmentNotFound,
        ErrorCode::SegmentAlreadyExists,
        ErrorCode::ClientNotFound,
        ErrorCode::NoAvailableHandle,
        ErrorCode::InvalidVersion,
        ErrorCode::InvalidKey,
        ErrorCode::WriteFail,
        ErrorCode::InvalidParams,
        ErrorCode::IllegalClient,
        ErrorCode::InvalidWrite,
        ErrorCode::InvalidRead,
        ErrorCode::InvalidReplica,
        ErrorCode::ReplicaIsNotReady,
        ErrorCode::ObjectNotFound,
        ErrorCode::ObjectAlreadyExists,
        ErrorCode::ObjectHasLease,
        ErrorCode::LeaseExpired,
        ErrorCode::ObjectHasReplicationTask,
        ErrorCode::ObjectNoReplicationTask,
        ErrorCode::ReplicaNotFound,
        ErrorCode::ReplicaAlreadyExists,
        ErrorCode::ReplicaIsGone,
        ErrorCode::ReplicaNotInLocalMemory,
        ErrorCode::ObjectReplicaBusy,
        ErrorCode::TransferFail,
        ErrorCode::ChecksumMismatch,
        ErrorCode::RpcFail,
        ErrorCode::RpcTimeout,
        ErrorCode::EtcdOperationError,
        ErrorCode::EtcdKeyNotExist,
        ErrorCode::EtcdTransactionFail,
        ErrorCode::EtcdCtxCancelled,
        ErrorCode::OplogEntryNotFound,
        ErrorCode::K8sLeaseOperationError,
        ErrorCode::K8sLeaseNotFound,
        ErrorCode::IncompleteOplogCatchUp,
        ErrorCode::UnavailableInCurrentStatus,
        ErrorCode::UnavailableInCurrentMode,
        ErrorCode::NotSupported,
        ErrorCode::FileNotFound,
        ErrorCode::FileOpenFail,
        ErrorCode::FileReadFail,
        ErrorCode::FileWriteFail,
        ErrorCode::FileInvalidBuffer,
        ErrorCode::FileLockFail,
        ErrorCode::FileInvalidHandle,
        ErrorCode::BucketNotFound,
        ErrorCode::BucketAlreadyExists,
        ErrorCode::KeysExceedBucketLimit,
        ErrorCode::KeysUltraLimit,
        ErrorCode::UnableOffload,
        ErrorCode::UnableOffloading,
        ErrorCode::TaskNotFound,
        ErrorCode::TaskPendingLimitExceeded,
        ErrorCode::JobNotFound,
        ErrorCode::SerializeUnsupported,
        ErrorCode::SerializeFail,
        ErrorCode::DeserializeFail,
        ErrorCode::PersistentFail,
        ErrorCode::DfsNetworkTimeout,
        ErrorCode::DfsServiceUnavailable,
        ErrorCode::DfsQuotaExceeded,
        ErrorCode::DfsPermissionDenied,
        ErrorCode::DfsStaleHandle,
        ErrorCode::DfsPartialWrite,
        ErrorCode::TenantQuotaExceeded,
        ErrorCode::TenantNotRegistered,
        ErrorCode::TenantNotEmpty,
    ];

    /// The numeric wire value.
    pub fn as_i32(self) -> i32 {
        self as i32
    }

    /// The enumerator name (what CLIs print, e.g. `OBJECT_NOT_FOUND`).
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Ok => "OK",
            ErrorCode::InternalError => "INTERNAL_ERROR",
            ErrorCode::BufferOverflow => "BUFFER_OVERFLOW",
            ErrorCode::ShardIndexOutOfRange => "SHARD_INDEX_OUT_OF_RANGE",
            ErrorCode::SegmentNotFound => "SEGMENT_NOT_FOUND",
            ErrorCode::SegmentAlreadyExists => "SEGMENT_ALREADY_EXISTS",
            ErrorCode::ClientNotFound => "CLIENT_NOT_FOUND",
            ErrorCode::NoAvailableHandle => "NO_AVAILABLE_HANDLE",
            ErrorCode::InvalidVersion => "INVALID_VERSION",
            ErrorCode::InvalidKey => "INVALID_KEY",
            ErrorCode::WriteFail => "WRITE_FAIL",
            ErrorCode::InvalidParams => "INVALID_PARAMS",
            ErrorCode::IllegalClient => "ILLEGAL_CLIENT",
            ErrorCode::InvalidWrite => "INVALID_WRITE",
            ErrorCode::InvalidRead => "INVALID_READ",
            ErrorCode::InvalidReplica => "INVALID_REPLICA",
            ErrorCode::ReplicaIsNotReady => "REPLICA_IS_NOT_READY",
            ErrorCode::ObjectNotFound => "OBJECT_NOT_FOUND",
            ErrorCode::ObjectAlreadyExists => "OBJECT_ALREADY_EXISTS",
            ErrorCode::ObjectHasLease => "OBJECT_HAS_LEASE",
            ErrorCode::LeaseExpired => "LEASE_EXPIRED",
            ErrorCode::ObjectHasReplicationTask => "OBJECT_HAS_REPLICATION_TASK",
            ErrorCode::ObjectNoReplicationTask => "OBJECT_NO_REPLICATION_TASK",
            ErrorCode::ReplicaNotFound => "REPLICA_NOT_FOUND",
            ErrorCode::ReplicaAlreadyExists => "REPLICA_ALREADY_EXISTS",
            ErrorCode::ReplicaIsGone => "REPLICA_IS_GONE",
            ErrorCode::ReplicaNotInLocalMemory => "REPLICA_NOT_IN_LOCAL_MEMORY",
            ErrorCode::ObjectReplicaBusy => "OBJECT_REPLICA_BUSY",
            ErrorCode::TransferFail => "TRANSFER_FAIL",
            ErrorCode::ChecksumMismatch => "CHECKSUM_MISMATCH",
            ErrorCode::RpcFail => "RPC_FAIL",
            ErrorCode::RpcTimeout => "RPC_TIMEOUT",
            ErrorCode::EtcdOperationError => "ETCD_OPERATION_ERROR",
            ErrorCode::EtcdKeyNotExist => "ETCD_KEY_NOT_EXIST",
            ErrorCode::EtcdTransactionFail => "ETCD_TRANSACTION_FAIL",
            ErrorCode::EtcdCtxCancelled => "ETCD_CTX_CANCELLED",
            ErrorCode::OplogEntryNotFound => "OPLOG_ENTRY_NOT_FOUND",
            ErrorCode::K8sLeaseOperationError => "K8S_LEASE_OPERATION_ERROR",
            ErrorCode::K8sLeaseNotFound => "K8S_LEASE_NOT_FOUND",
            ErrorCode::IncompleteOplogCatchUp => "INCOMPLETE_OPLOG_CATCH_UP",
            ErrorCode::UnavailableInCurrentStatus => "UNAVAILABLE_IN_CURRENT_STATUS",
            ErrorCode::UnavailableInCurrentMode => "UNAVAILABLE_IN_CURRENT_MODE",
            ErrorCode::NotSupported => "NOT_SUPPORTED",
            ErrorCode::FileNotFound => "FILE_NOT_FOUND",
            ErrorCode::FileOpenFail => "FILE_OPEN_FAIL",
            ErrorCode::FileReadFail => "FILE_READ_FAIL",
            ErrorCode::FileWriteFail => "FILE_WRITE_FAIL",
            ErrorCode::FileInvalidBuffer => "FILE_INVALID_BUFFER",
            ErrorCode::FileLockFail => "FILE_LOCK_FAIL",
            ErrorCode::FileInvalidHandle => "FILE_INVALID_HANDLE",
            ErrorCode::BucketNotFound => "BUCKET_NOT_FOUND",
            ErrorCode::BucketAlreadyExists => "BUCKET_ALREADY_EXISTS",
            ErrorCode::KeysExceedBucketLimit => "KEYS_EXCEED_BUCKET_LIMIT",
            ErrorCode::KeysUltraLimit => "KEYS_ULTRA_LIMIT",
            ErrorCode::UnableOffload => "UNABLE_OFFLOAD",
            ErrorCode::UnableOffloading => "UNABLE_OFFLOADING",
            ErrorCode::TaskNotFound => "TASK_NOT_FOUND",
            ErrorCode::TaskPendingLimitExceeded => "TASK_PENDING_LIMIT_EXCEEDED",
            ErrorCode::JobNotFound => "JOB_NOT_FOUND",
            ErrorCode::SerializeUnsupported => "SERIALIZE_UNSUPPORTED",
            ErrorCode::SerializeFail => "SERIALIZE_FAIL",
            ErrorCode::DeserializeFail => "DESERIALIZE_FAIL",
            ErrorCode::PersistentFail => "PERSISTENT_FAIL",
            ErrorCode::DfsNetworkTimeout => "DFS_NETWORK_TIMEOUT",
            ErrorCode::DfsServiceUnavailable => "DFS_SERVICE_UNAVAILABLE",
            ErrorCode::DfsQuotaExceeded => "DFS_QUOTA_EXCEEDED",
            ErrorCode::DfsPermissionDenied => "DFS_PERMISSION_DENIED",
            ErrorCode::DfsStaleHandle => "DFS_STALE_HANDLE",
            ErrorCode::DfsPartialWrite => "DFS_PARTIAL_WRITE",
            ErrorCode::TenantQuotaExceeded => "TENANT_QUOTA_EXCEEDED",
            ErrorCode::TenantNotRegistered => "TENANT_NOT_REGISTERED",
            ErrorCode::TenantNotEmpty => "TENANT_NOT_EMPTY",
        }
    }

    /// The code for a numeric wire value.
    pub fn from_i32(v: i32) -> Result<Self, ErrorCodeUnknown> {
        Ok(match v {
            0 => ErrorCode::Ok,
            -1 => ErrorCode::InternalError,
            -10 => ErrorCode::BufferOverflow,
            -100 => ErrorCode::ShardIndexOutOfRange,
            -101 => ErrorCode::SegmentNotFound,
            -102 => ErrorCode::SegmentAlreadyExists,
            -103 => ErrorCode::ClientNotFound,
            -200 => ErrorCode::NoAvailableHandle,
            -300 => ErrorCode::InvalidVersion,
            -400 => ErrorCode::InvalidKey,
            -500 => ErrorCode::WriteFail,
            -600 => ErrorCode::InvalidParams,
            -601 => ErrorCode::IllegalClient,
            -700 => ErrorCode::InvalidWrite,
            -701 => ErrorCode::InvalidRead,
            -702 => ErrorCode::InvalidReplica,
            -703 => ErrorCode::ReplicaIsNotReady,
            -704 => ErrorCode::ObjectNotFound,
            -705 => ErrorCode::ObjectAlreadyExists,
            -706 => ErrorCode::ObjectHasLease,
            -707 => ErrorCode::LeaseExpired,
            -708 => ErrorCode::ObjectHasReplicationTask,
            -709 => ErrorCode::ObjectNoReplicationTask,
            -710 => ErrorCode::ReplicaNotFound,
            -711 => ErrorCode::ReplicaAlreadyExists,
            -712 => ErrorCode::ReplicaIsGone,
            -713 => ErrorCode::ReplicaNotInLocalMemory,
            -714 => ErrorCode::ObjectReplicaBusy,
            -800 => ErrorCode::TransferFail,
            -801 => ErrorCode::ChecksumMismatch,
            -900 => ErrorCode::RpcFail,
            -901 => ErrorCode::RpcTimeout,
            -1000 => ErrorCode::EtcdOperationError,
            -1001 => ErrorCode::EtcdKeyNotExist,
            -1002 => ErrorCode::EtcdTransactionFail,
            -1003 => ErrorCode::EtcdCtxCancelled,
            -1004 => ErrorCode::OplogEntryNotFound,
            -1005 => ErrorCode::K8sLeaseOperationError,
            -1006 => ErrorCode::K8sLeaseNotFound,
            -1007 => ErrorCode::IncompleteOplogCatchUp,
            -1010 => ErrorCode::UnavailableInCurrentStatus,
            -1011 => ErrorCode::UnavailableInCurrentMode,
            -1012 => ErrorCode::NotSupported,
            -1100 => ErrorCode::FileNotFound,
            -1101 => ErrorCode::FileOpenFail,
            -1102 => ErrorCode::FileReadFail,
            -1103 => ErrorCode::FileWriteFail,
            -1104 => ErrorCode::FileInvalidBuffer,
            -1105 => ErrorCode::FileLockFail,
            -1106 => ErrorCode::FileInvalidHandle,
            -1200 => ErrorCode::BucketNotFound,
            -1201 => ErrorCode::BucketAlreadyExists,
            -1202 => ErrorCode::KeysExceedBucketLimit,
            -1203 => ErrorCode::KeysUltraLimit,
            -1300 => ErrorCode::UnableOffload,
            -1301 => ErrorCode::UnableOffloading,
            -1400 => ErrorCode::TaskNotFound,
            -1401 => ErrorCode::TaskPendingLimitExceeded,
            -1402 => ErrorCode::JobNotFound,
            -1500 => ErrorCode::SerializeUnsupported,
            -1501 => ErrorCode::SerializeFail,
            -1502 => ErrorCode::DeserializeFail,
            -1503 => ErrorCode::PersistentFail,
            -1600 => ErrorCode::DfsNetworkTimeout,
            -1601 => ErrorCode::DfsServiceUnavailable,
            -1602 => ErrorCode::DfsQuotaExceeded,
            -1603 => ErrorCode::DfsPermissionDenied,
            -1604 => ErrorCode::DfsStaleHandle,
            -1605 => ErrorCode::DfsPartialWrite,
            -1700 => ErrorCode::TenantQuotaExceeded,
            -1701 => ErrorCode::TenantNotRegistered,
            -1702 => ErrorCode::TenantNotEmpty,
            other => return Err(ErrorCodeUnknown(other)),
        })
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
        assert_eq!(ErrorCode::ALL.len(), 72);
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
