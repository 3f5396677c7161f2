//! The seam between the oplog's readers (a standby following the primary, a restarted master replaying its own
//! log) and whatever the entries mean: the reader decides *which* entry comes next and in what order; an
//! [`OpLogApplier`] (the master's) decides what the entry does.

use super::codec::OpLogEntry;

/// Applies sequenced oplog entries, strictly in order, into some state (a `MasterService` of its own).
pub trait OpLogApplier: Send {
    /// Applies the entry with sequence number `seq`. An error is fatal for the reader: it stops, fails closed
    /// and never skips the entry.
    fn apply(&mut self, seq: u64, entry: &OpLogEntry) -> Result<(), ApplyError>;
}

/// Why an entry could not be applied (unknown operation, undecodable payload, state it contradicts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("oplog entry {seq} (op {op}) could not be applied: {reason}")]
pub struct ApplyError {
    /// The entry's sequence number.
    pub seq: u64,
    /// The entry's operation type.
    pub op: u16,
    /// What was wrong.
    pub reason: String,
}
