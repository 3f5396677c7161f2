//! The master's HA business side, over the generic machinery of `crescent-ha`: what oplog entries mean
//! ([`payload`]: operation codes and payloads), the seam mutations log through ([`sink`]: `OpLog`, `Slot`), and
//! replay ([`replay`]: the `OpLogApplier`, the startup rebuild of a restarted master, opening the log),
//! snapshots ([`snapshots`]) and a candidate's standby bootstrap and fenced promotion ([`role`]).

pub mod objects;
pub mod payload;
pub mod replay;
pub mod role;
pub mod sink;
pub mod snapshots;

pub use payload::{
    DrainRecord, MasterEntry, ObjectRecord, ObjectRecordV2, ObjectRecordV3, OpCode, PayloadError, ReplicaRecord,
    SegmentRecord, SegmentRecordV1,
};
pub use replay::{
    OpLogOptions, OpenError, OpenReport, ReplayObject, ReplayObjects, ReplayState, master_storage,
    master_writer_config, open, open_with_snapshots, replay_log, replay_log_after, start_writing,
};
pub use role::{HaState, HaStatus, PromoteError};
pub use sink::{OPLOG_REFUSED, OpLog, Slot, take_hid_objects};
pub use snapshots::{
    Baseline, SnapshotOptions, Snapshotter, SnapshotterError, SnapshotterHandle, SnapshotterStatus, load_baseline,
    restore_state,
};
