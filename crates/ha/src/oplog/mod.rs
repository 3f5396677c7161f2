//! The batch oplog: entry, batch-record and durable-prefix encodings ([`codec`]), the storage protocol over a
//! KV backend ([`storage`]) and the primary's ordered batch writer ([`writer`]).

pub mod apply;
pub mod codec;
pub mod storage;
pub mod writer;

pub use apply::{ApplyError, OpLogApplier};
pub use codec::{CodecError, DurablePrefix, EntryError, OpLogBatchRecord, OpLogEntry, OpLogKeys};
pub use storage::{BatchLimits, OpLogBatchStorage, StorageConfig, StorageError};
pub use writer::{DurableCallback, OrderedOpLogWriter, Reservation, WriterConfig, WriterError, WriterStatus};
