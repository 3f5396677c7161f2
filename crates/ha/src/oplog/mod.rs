//! The batch oplog: entry, batch-record and durable-prefix encodings ([`codec`]), the storage protocol over a
//! KV backend ([`storage`], including the legacy per-entry layout and the cutover from it), the primary's ordered
//! writer ([`writer`], batch or legacy per-entry mode, its figures in [`metrics`]), the seam entries are applied through ([`apply`]) and the
//! standby reader and follower loop ([`standby`]).

pub mod apply;
pub mod codec;
pub mod metrics;
pub mod standby;
pub mod storage;
pub mod writer;

pub use apply::{ApplyError, OpLogApplier};
pub use codec::{CodecError, DurablePrefix, EntryError, OpLogBatchRecord, OpLogEntry, OpLogKeys};
pub use metrics::{AdmissionFailures, Histogram, LatencySummary, WriterMetrics};
pub use standby::{
    FollowerConfig, FollowerExit, FollowerState, FollowerStatus, OpLogStandbyReader, PollReport, StandbyError,
    StandbyFollower, StandbyStatus,
};
pub use storage::{BatchLimits, OpLogBatchStorage, StorageConfig, StorageError};
pub use writer::{
    CALLBACK_QUEUE_BATCHES, DurableCallback, OrderedOpLogWriter, Reservation, WriterConfig, WriterError, WriterMode,
    WriterStatus,
};
