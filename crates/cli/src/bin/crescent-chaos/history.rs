//! The history a workload writes and the checker reads: one JSON object per line and operation, written when the
//! operation completed, with its invocation and completion times (nanoseconds on one monotonic clock shared by
//! every client of the workload process) and its outcome.

use serde::{Deserialize, Serialize};

/// What an operation was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Put-if-absent of one key.
    Put,
    /// Insert-or-replace of one key.
    Upsert,
    /// Read of one key.
    Get,
    /// Removal of one key.
    Remove,
    /// Removal of every object of the tenant (`rm --all`).
    RmAll,
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Acknowledged: a write stored its value, a get returned bytes, a removal removed (or an rm-all finished).
    Ok,
    /// A put-if-absent found the key holding a value: nothing was written.
    Existed,
    /// A get or a removal found no such object (`OBJECT_NOT_FOUND`): for a removal, the key is absent, which is
    /// as good as an acknowledged removal.
    Missing,
    /// Refused with an error code that says the request was not carried out (it may still have been, for a
    /// write: a refusal after the start of a put is not a promise that nothing stays).
    Failed,
    /// The request may have reached a master that then died or was replaced (`RPC_FAIL`, `RPC_TIMEOUT`): it may
    /// or may not have been applied.
    Unknown,
}

/// One operation of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// The client task that ran it.
    pub client: u32,
    /// What it was.
    pub kind: Kind,
    /// Its key (none for an rm-all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The write id a put or upsert wrote (unique in the history).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wid: Option<u64>,
    /// Invoked at (ns).
    pub t0: u64,
    /// Completed at (ns).
    pub t1: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// The error code's name, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// For a get that returned bytes: the write id they carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub got: Option<u64>,
    /// For a get that returned bytes that are not a whole value of its key: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torn: Option<String>,
    /// For an rm-all: the objects it left (leased, being written, pinned); a removal that left some is not a
    /// removal of every key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left: Option<u64>,
    /// For an rm-all: of those left, the ones held by a reader's lease or a replication task's pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leased: Option<u64>,
    /// For an rm-all: the read lease the cluster grants, in ms (a key read less than this before the rm-all may
    /// still be leased).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// A removal's `force`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// The get was part of the final sweep, after every fault was healed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sweep: bool,
}

impl Op {
    /// An operation of `kind` by `client` on `key`, invoked at `t0`, not yet completed (outcome ok).
    pub fn new(client: u32, kind: Kind, key: Option<&str>, t0: u64) -> Op {
        Op {
            client,
            kind,
            key: key.map(str::to_owned),
            wid: None,
            t0,
            t1: t0,
            outcome: Outcome::Ok,
            code: None,
            got: None,
            torn: None,
            left: None,
            leased: None,
            lease_ms: None,
            force: false,
            sweep: false,
        }
    }
}

/// Reads a history file (JSON lines); a line that does not parse is an error naming it.
pub fn read(path: &std::path::Path) -> anyhow::Result<Vec<Op>> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{}:{}: {l}", path.display(), i + 1)))
        .collect()
}
