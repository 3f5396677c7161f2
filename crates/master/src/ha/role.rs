//! The candidate's HA steps (issue 15 §2, reference §6.5): a standby's bootstrap (the newest usable snapshot —
//! its own, or the leader's fetched over the master's port when its own do not reach the log — then a reader of
//! the log after it) and promotion with fencing, plus the [`HaStatus`] `/health` and
//! `/metrics` show. The loop that strings them together, and serves, is `server::candidate`.
//!
//! Promotion closes the gap the reference records (promotion without fencing): the new leader first claims the
//! oplog's producer view = its view version, so every later write of a deposed leader fails its compare; only
//! then does it catch up to the durable prefix — which nobody else can move any more — within a deadline, and
//! starts its writer from exactly that prefix.

use super::replay::{OpenError, ReplayState};
use super::snapshots::{Baseline, load_baseline};
use crate::snapshot::catalog::{Catalog, Manifest, verify_payload};
use crate::snapshot::store::SnapshotStore;
use bytes::Bytes;
use crescent_ha::leader::LeaseGuard;
use crescent_ha::oplog::{DurablePrefix, OpLogBatchStorage, OpLogStandbyReader, StandbyError, StorageError};
use serde::Serialize;
use std::time::Duration;

/// Default deadline of promotion's final catch-up (the reference's).
pub const DEFAULT_CATCH_UP_DEADLINE: Duration = Duration::from_secs(30);

/// What a candidate is doing (`/health`'s `ha.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HaState {
    /// Loading the baseline (snapshot) before following.
    Bootstrapping,
    /// A hot standby following the log.
    Following,
    /// Following, but the log's backend is failing (retrying).
    Retrying,
    /// Won the lease: fencing and catching up.
    Promoting,
    /// Serving as the leader.
    Leading,
    /// The standby reader failed closed; bootstrapping again.
    Failed,
    /// Stopped.
    Stopped,
}

impl HaState {
    /// The number `/metrics` exports.
    pub fn code(self) -> u64 {
        self as u64
    }
}

/// A candidate's HA status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HaStatus {
    /// What it is doing.
    pub state: HaState,
    /// The last sequence applied (standby) or durable (leader).
    pub applied_seq: u64,
    /// The last durable sequence seen in the log.
    pub durable_seq: u64,
    /// Entries durable but not applied yet.
    pub lag: u64,
    /// The current leader's view version (this candidate's own while it leads; 0: none known).
    pub view_version: u64,
    /// The current leader's RPC address, if known.
    pub leader: Option<String>,
    /// The current leader's admin address, if known.
    pub leader_admin: Option<String>,
    /// Where leadership is decided.
    pub coordinator: String,
    /// Times this candidate became the leader.
    pub promotions: u64,
    /// Promotions that failed (catch-up deadline, fenced, lease lost while promoting).
    pub failed_promotions: u64,
    /// Times it stopped leading (lease lost, view moved, writer fenced).
    pub step_downs: u64,
    /// The last error, if any.
    pub last_error: Option<String>,
}

impl HaStatus {
    /// A candidate that has not started.
    pub fn new(coordinator: String) -> Self {
        Self {
            state: HaState::Bootstrapping,
            applied_seq: 0,
            durable_seq: 0,
            lag: 0,
            view_version: 0,
            leader: None,
            leader_admin: None,
            coordinator,
            promotions: 0,
            failed_promotions: 0,
            step_downs: 0,
            last_error: None,
        }
    }

    /// Whether it serves as the leader.
    pub fn is_leader(&self) -> bool {
        self.state == HaState::Leading
    }

    /// `"leader"` or `"standby"`.
    pub fn role(&self) -> &'static str {
        if self.is_leader() { "leader" } else { "standby" }
    }
}

/// What [`SnapshotSource::fetch`] returns.
pub type FetchFuture<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<(Manifest, Bytes), crate::server::snapshot_fetch::FetchError>>
            + Send
            + 'a,
    >,
>;

/// Where a standby gets a snapshot when its own store has none that reaches the log: the leader
/// (`server::snapshot_fetch`). The bytes are checked here, against the manifest, before any use.
pub trait SnapshotSource: Send + Sync {
    /// The newest snapshot the source has: its manifest and its bytes (unchecked).
    fn fetch(&self) -> FetchFuture<'_>;
}

/// A standby's starting point: the newest usable snapshot (if any) and a reader of the log after it. A
/// compacted log with no snapshot covering it is refused, never followed from the middle. When the standby's
/// own `snapshots` hold none that reaches the log's oldest stored batch (no shared store, and the leader
/// compacted), the newest one is fetched from `source` (the leader), used only once it passes every check a
/// loaded one does (size and crc32c against its manifest, decode, position), and kept in the standby's own
/// store (`retain` of them) so a restart need not fetch it again.
pub async fn bootstrap(
    storage: &OpLogBatchStorage,
    snapshots: Option<&dyn SnapshotStore>,
    source: Option<&dyn SnapshotSource>,
    retain: usize,
) -> Result<(OpLogStandbyReader, ReplayState), OpenError> {
    let first = storage.first_stored_batch().await?;
    let baseline = match load_baseline(snapshots, storage).await {
        // Batches after the baseline's continue it exactly (the first stored one is at most the next).
        Ok(b) if first.is_none_or(|f| f <= b.position.batch_id + 1) => b,
        Ok(b) => {
            let why = format!(
                "the newest own snapshot includes batches up to {}, the log keeps only {} on",
                b.position.batch_id,
                first.unwrap_or(0)
            );
            fetch_baseline(storage, snapshots, source, retain, why).await?
        }
        Err(e @ OpenError::MissingBaseline { .. }) => {
            fetch_baseline(storage, snapshots, source, retain, e.to_string()).await?
        }
        Err(e) => return Err(e),
    };
    let reader = match &baseline.snapshot {
        Some(_) => OpLogStandbyReader::from(storage.clone(), baseline.position.last_seq, baseline.position.batch_id),
        None => OpLogStandbyReader::new(storage.clone()),
    };
    Ok((reader, baseline.state))
}

/// The leader's snapshot as a baseline (see [`bootstrap`]); `why` says why the standby's own did not do.
async fn fetch_baseline(
    storage: &OpLogBatchStorage,
    snapshots: Option<&dyn SnapshotStore>,
    source: Option<&dyn SnapshotSource>,
    retain: usize,
    why: String,
) -> Result<Baseline, OpenError> {
    let fail = |fetch: String| OpenError::Fetch { why: why.clone(), fetch };
    let Some(source) = source else { return Err(fail("no leader to fetch from".into())) };
    let (manifest, bytes) = source.fetch().await.map_err(|e| fail(e.to_string()))?;
    // Read first: the table is decoded with room for the log the standby replays next.
    let prefix = storage.read_durable_prefix().await?.unwrap_or(DurablePrefix { batch_id: 0, last_seq: 0 });
    let view = verify_payload(&manifest, bytes.clone(), prefix.last_seq).await.map_err(|e| fail(e.to_string()))?;
    let Some(meta) = view.metadata else { return Err(fail("a snapshot without metadata".into())) };
    if manifest.last_seq > prefix.last_seq || manifest.batch_id > prefix.batch_id {
        return Err(OpenError::SnapshotAhead { id: manifest.id, snapshot_seq: manifest.last_seq, prefix });
    }
    if let Some(first) = storage.first_stored_batch().await?
        && first > manifest.batch_id + 1
    {
        let e =
            format!("snapshot {} includes batches up to {}, the log keeps {first} on", manifest.id, manifest.batch_id);
        return Err(fail(e));
    }
    if let Some(store) = snapshots {
        // Kept so that a restart finds it; a failure only costs a fetch then.
        let kept = Catalog::new(store)
            .publish(bytes, manifest.batch_id, manifest.last_seq, manifest.producer_view, retain)
            .await;
        if let Err(e) = kept {
            tracing::warn!(id = %manifest.id, error = %e, "the leader's snapshot could not be kept locally");
        }
    }
    let position = DurablePrefix { batch_id: meta.batch_id, last_seq: meta.state.last_seq };
    tracing::info!(
        id = %manifest.id, batch = position.batch_id, seq = position.last_seq, %why,
        "standby bootstraps from the leader's snapshot"
    );
    Ok(Baseline { state: meta.state, position, snapshot: Some(manifest), skipped: Vec::new() })
}

/// Why a promotion did not complete (the candidate gives the lease up and stays a standby).
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    /// A newer producer view is already claimed: another master was promoted after this lease was won.
    #[error("fenced: {0}")]
    Fenced(StorageError),
    /// The log's store failed.
    #[error("oplog: {0}")]
    Storage(StorageError),
    /// The log could not be applied up to the durable prefix in time, or the reader failed closed.
    #[error("incomplete oplog catch-up (applied seq {applied}, durable prefix seq {durable}): {reason}")]
    CatchUp {
        /// Applied so far.
        applied: u64,
        /// The prefix to reach.
        durable: u64,
        /// Why it stopped.
        reason: String,
    },
    /// The lease ended while promoting.
    #[error("the leader lease ended during promotion")]
    LeaseLost,
}

/// Promotes a standby whose `reader` has applied into `state`: claims producer view `view` (fencing every
/// older producer), then applies the log up to its durable prefix within `deadline`, while `guard` holds.
/// Returns the prefix the new writer continues. Soft pins are dropped (their time left was measured on the old
/// leader's clock).
pub async fn promote(
    storage: &OpLogBatchStorage,
    view: u64,
    reader: &mut OpLogStandbyReader,
    state: &mut ReplayState,
    deadline: Duration,
    guard: &LeaseGuard,
) -> Result<DurablePrefix, PromoteError> {
    storage.claim_producer_view(view).await.map_err(|e| match e {
        StorageError::StaleView { .. } | StorageError::Fenced { .. } => PromoteError::Fenced(e),
        e => PromoteError::Storage(e),
    })?;
    let prefix = storage.init_durable_prefix().await.map_err(PromoteError::Storage)?;
    let until = tokio::time::Instant::now() + deadline;
    let mut delay = Duration::from_millis(20);
    let fail = |reader: &OpLogStandbyReader, reason: String| PromoteError::CatchUp {
        applied: reader.applied_seq(),
        durable: prefix.last_seq,
        reason,
    };
    while reader.applied_seq() < prefix.last_seq {
        if !guard.holds() {
            return Err(PromoteError::LeaseLost);
        }
        if tokio::time::Instant::now() >= until {
            return Err(fail(reader, format!("not done within {deadline:?}")));
        }
        match reader.poll_once(state, 1024).await {
            Ok(_) => delay = Duration::from_millis(20),
            Err(e) if e.is_retryable() => {
                tracing::warn!(error = %e, "promotion catch-up: retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            Err(e @ StandbyError::Halted(_)) | Err(e) => return Err(fail(reader, e.to_string())),
        }
    }
    if reader.applied_seq() != prefix.last_seq {
        return Err(fail(reader, "applied beyond the durable prefix".into()));
    }
    if !guard.holds() {
        return Err(PromoteError::LeaseLost);
    }
    state.objects.clear_soft_pins();
    Ok(prefix)
}
