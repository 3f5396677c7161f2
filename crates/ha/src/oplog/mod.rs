//! The batch oplog: entry, batch-record and durable-prefix encodings ([`codec`]) and the storage protocol over a
//! KV backend ([`storage`]).

pub mod codec;
pub mod storage;

pub use codec::{CodecError, DurablePrefix, EntryError, OpLogBatchRecord, OpLogEntry, OpLogKeys};
pub use storage::{BatchLimits, OpLogBatchStorage, StorageConfig, StorageError};
