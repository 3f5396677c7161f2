//! Snapshots of the master's metadata and restore from them: the baseline a restarted master or a standby
//! starts from ([`load_baseline`]), and the [`Snapshotter`] that writes them.
//!
//! A snapshot must hold exactly the oplog up to one sequence and must not pause the write path. So it is not
//! taken from the live service (whose objects change under their own locks, with writes in flight that the log
//! does not hold yet) but from a [`ReplayState`] that *follows the durable log*: the snapshotter runs a standby
//! reader over its own master's log, folding whole batches, and encodes its state between two polls — at a
//! batch boundary, so the snapshot includes exactly the batches up to one id. The write path never waits on it;
//! the cost is a second, compact copy of the metadata (the readable objects' records) in the process, and one
//! more reader of the log. Encoding runs on a blocking thread, the publish ([`Catalog::publish`]: data, verify,
//! manifest, verify, `latest`, retention) on the runtime.
//!
//! After a publish, oplog batches every retained snapshot includes are compacted away
//! ([`OpLogBatchStorage::compact_through`], never the durable prefix's own batch), and so is the backend's
//! history of changes up to now ([`OpLogBatchStorage::compact_history`]: etcd's revisions). A reader whose position is
//! below the compacted range (a standby far behind) then fails closed with a gap and must bootstrap again from
//! a snapshot; a restore without a usable snapshot over a compacted log is refused
//! ([`OpenError::MissingBaseline`]), never completed with what is left.

use super::replay::{OpenError, ReplayState, replay_log_after};
use crate::snapshot::catalog::{Catalog, CatalogError, Manifest, Published};
use crate::snapshot::store::SnapshotStore;
use crate::snapshot::{self, MasterSnapshotView, SnapshotMetadata};
use crescent_ha::oplog::{DurablePrefix, OpLogBatchStorage, OpLogStandbyReader, StandbyError, StorageError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Default time between snapshots.
pub const DEFAULT_SNAPSHOT_INTERVAL: Duration = Duration::from_secs(600);
/// Default number of snapshots kept.
pub const DEFAULT_SNAPSHOT_RETAIN: usize = 2;
/// Batches the snapshotter's reader applies per poll.
const FOLLOW_PAGE: usize = 64;

/// Where and how often a master snapshots.
#[derive(Clone)]
pub struct SnapshotOptions {
    /// Where snapshots are kept.
    pub store: Arc<dyn SnapshotStore>,
    /// Time between snapshots (one is written only if the log moved).
    pub interval: Duration,
    /// Snapshots kept (at least 1).
    pub retain: usize,
    /// Delete the oplog batches every retained snapshot includes.
    pub compact: bool,
}

impl SnapshotOptions {
    /// Snapshots in `store` at the default interval and retention, compacting the log.
    pub fn new(store: Arc<dyn SnapshotStore>) -> Self {
        Self { store, interval: DEFAULT_SNAPSHOT_INTERVAL, retain: DEFAULT_SNAPSHOT_RETAIN, compact: true }
    }
}

impl std::fmt::Debug for SnapshotOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotOptions")
            .field("store", &self.store.describe())
            .field("interval", &self.interval)
            .field("retain", &self.retain)
            .field("compact", &self.compact)
            .finish()
    }
}

/// What a restore starts from before it replays the log.
#[derive(Debug, Clone, Default)]
pub struct Baseline {
    /// The snapshot's state (empty without one).
    pub state: ReplayState,
    /// The oplog position it includes: replay the batches after `batch_id` (`{0, 0}` without a snapshot).
    pub position: DurablePrefix,
    /// The snapshot's manifest, if one was used.
    pub snapshot: Option<Manifest>,
    /// Newer snapshots refused (id, why).
    pub skipped: Vec<(String, String)>,
}

/// The newest whole snapshot in `store` (if any) as a baseline for `storage`'s log, checked against it: a
/// snapshot beyond the durable prefix is refused, and so is starting from nothing when the log's first batches
/// were compacted. The caller replays the batches after `position` ([`replay_log_after`], or a standby reader
/// made with `OpLogStandbyReader::from(storage, position.last_seq, position.batch_id)`).
pub async fn load_baseline(
    store: Option<&dyn SnapshotStore>,
    storage: &OpLogBatchStorage,
) -> Result<Baseline, OpenError> {
    let prefix = storage.read_durable_prefix().await?.unwrap_or(DurablePrefix { batch_id: 0, last_seq: 0 });
    let mut skipped = Vec::new();
    if let Some(store) = store
        && let Some(loaded) = Catalog::new(store).load_newest(prefix.last_seq).await?
    {
        skipped = loaded.skipped;
        let m = loaded.manifest;
        if m.last_seq > prefix.last_seq || m.batch_id > prefix.batch_id {
            return Err(OpenError::SnapshotAhead { id: m.id, snapshot_seq: m.last_seq, prefix });
        }
        if let Some(meta) = loaded.view.metadata {
            let position = DurablePrefix { batch_id: meta.batch_id, last_seq: meta.state.last_seq };
            tracing::info!(
                id = %m.id, batch = position.batch_id, seq = position.last_seq,
                objects = meta.state.objects.len(), segments = meta.state.segments.len(),
                "restoring from snapshot"
            );
            return Ok(Baseline { state: meta.state, position, snapshot: Some(m), skipped });
        }
    }
    if let Some(first) = storage.first_stored_batch().await?
        && first > 1
    {
        let detail = if skipped.is_empty() { String::new() } else { format!(" (refused: {skipped:?})") };
        return Err(OpenError::MissingBaseline { first_batch: first, detail });
    }
    Ok(Baseline { skipped, ..Baseline::default() })
}

/// [`load_baseline`] then the log after it, up to the durable prefix: the whole state a restarted master
/// restores. Returns the state and the baseline it started from (its `state` left empty). Soft pins are dropped
/// (reference §8.1, issue 15 §3: restore keeps no leases, pins or in-flight writes; a pin's time left was
/// measured on the old process's clock), so a restored master's objects compete for eviction evenly.
pub async fn restore_state(
    store: Option<&dyn SnapshotStore>,
    storage: &OpLogBatchStorage,
    prefix: DurablePrefix,
) -> Result<(ReplayState, Baseline), OpenError> {
    let mut baseline = load_baseline(store, storage).await?;
    let mut state = std::mem::take(&mut baseline.state);
    let started = std::time::Instant::now();
    replay_log_after(storage, prefix, baseline.position, &mut state).await?;
    state.objects.clear_soft_pins();
    tracing::info!(
        from = baseline.position.last_seq,
        to = state.last_seq,
        replay_ms = started.elapsed().as_millis() as u64,
        "log after the baseline replayed"
    );
    Ok((state, baseline))
}

/// Why the snapshotter failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SnapshotterError {
    /// Its reader of the log failed (retryable: the backend is unreachable).
    #[error("following the oplog: {0}")]
    Follow(#[from] StandbyError),
    /// The store or the publish failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// Compaction failed (the snapshot was published).
    #[error("compacting the oplog: {0}")]
    Compact(#[from] StorageError),
    /// The encoding task died; the snapshotter's state is gone with it.
    #[error("snapshot encoding failed: {0}")]
    Broken(String),
}

impl SnapshotterError {
    /// True when a later attempt may succeed (the store or the log's backend was unreachable).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Follow(e) => e.is_retryable(),
            Self::Catalog(_) | Self::Compact(_) => true,
            Self::Broken(_) => false,
        }
    }
}

/// What the snapshotter has done, for health and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotterStatus {
    /// The last snapshot published (or found already published).
    pub last: Option<Manifest>,
    /// Snapshots written.
    pub written: u64,
    /// Failed attempts.
    pub failures: u64,
    /// The last failure.
    pub last_error: Option<String>,
    /// Oplog batches deleted by compaction.
    pub compacted: u64,
    /// The backend revision its history was last compacted up to (0: none, or a backend without history).
    pub history_compacted_to: u64,
}

/// Follows one master's durable log into a [`ReplayState`] and snapshots it. See the module doc.
pub struct Snapshotter {
    options: SnapshotOptions,
    storage: OpLogBatchStorage,
    reader: OpLogStandbyReader,
    state: ReplayState,
    broken: bool,
    status: watch::Sender<SnapshotterStatus>,
}

impl Snapshotter {
    /// A snapshotter whose `state` holds the log up to `position` (what the master restored).
    pub fn new(
        storage: OpLogBatchStorage,
        options: SnapshotOptions,
        state: ReplayState,
        position: DurablePrefix,
    ) -> Self {
        let reader = OpLogStandbyReader::from(storage.clone(), position.last_seq, position.batch_id);
        let (status, _) = watch::channel(SnapshotterStatus::default());
        Self { options, storage, reader, state, broken: false, status }
    }

    /// The state followed so far.
    pub fn state(&self) -> &ReplayState {
        &self.state
    }

    /// Its status, as it changes.
    pub fn subscribe(&self) -> watch::Receiver<SnapshotterStatus> {
        self.status.subscribe()
    }

    /// Applies the durable log up to the prefix it reads; returns the position reached (a batch boundary).
    pub async fn catch_up(&mut self) -> Result<DurablePrefix, SnapshotterError> {
        loop {
            let report = self.reader.poll_once(&mut self.state, FOLLOW_PAGE).await?;
            if report.caught_up {
                let s = self.reader.status();
                return Ok(DurablePrefix { batch_id: s.applied_batch, last_seq: s.applied_seq });
            }
        }
    }

    /// Catches up, then publishes a snapshot of the position reached unless the newest one already holds it;
    /// then compacts. Returns what was published (`None`: nothing new).
    pub async fn snapshot_now(&mut self) -> Result<Option<Published>, SnapshotterError> {
        let result = self.snapshot_inner().await;
        self.status.send_modify(|s| match &result {
            Ok(Some(p)) => {
                s.last = Some(p.manifest.clone());
                s.written += u64::from(p.written);
            }
            Ok(None) => {}
            Err(e) => {
                s.failures += 1;
                s.last_error = Some(e.to_string());
            }
        });
        result
    }

    async fn snapshot_inner(&mut self) -> Result<Option<Published>, SnapshotterError> {
        if self.broken {
            return Err(SnapshotterError::Broken("an earlier encoding task died".into()));
        }
        let position = self.catch_up().await?;
        let catalog = Catalog::new(&*self.options.store);
        if self.status.borrow().last.as_ref().is_some_and(|m| m.last_seq == position.last_seq) {
            return Ok(None);
        }
        let producer_view = self.storage.read_producer_view().await.ok().flatten().unwrap_or(0);
        let meta =
            SnapshotMetadata { state: std::mem::take(&mut self.state), batch_id: position.batch_id, producer_view };
        // Encoding a large directory is CPU work: a blocking thread, with the state moved there and back.
        let joined = tokio::task::spawn_blocking(move || {
            let view = MasterSnapshotView { metadata: Some(meta), ..MasterSnapshotView::default() };
            let bytes = snapshot::encode(&view);
            (view, bytes)
        })
        .await;
        let bytes = match joined {
            Ok((view, bytes)) => {
                if let Some(m) = view.metadata {
                    self.state = m.state;
                }
                bytes
            }
            Err(e) => {
                self.broken = true;
                return Err(SnapshotterError::Broken(e.to_string()));
            }
        };
        let published = catalog
            .publish(bytes.into(), position.batch_id, position.last_seq, producer_view, self.options.retain)
            .await?;
        if self.options.compact {
            // Every retained snapshot includes the batches up to the oldest one's.
            if let Some(oldest) = catalog.list().await?.first()
                && let Some(batch) = oldest.split_once('-').and_then(|(b, _)| b.parse::<u64>().ok())
            {
                let deleted = self.storage.compact_through(batch).await?;
                // The backend's history (etcd's revisions) of what was deleted and of every overwritten prefix
                // is needed by nobody: dropped too, or etcd grows until it refuses writes.
                let revision = self.storage.compact_history().await?;
                self.status.send_modify(|s| {
                    s.compacted += deleted;
                    s.history_compacted_to = s.history_compacted_to.max(revision);
                });
            }
        }
        Ok(Some(published))
    }

    /// Runs [`Snapshotter::snapshot_now`] every `interval` on the current runtime until stopped. A retryable
    /// failure is logged and tried again at the next tick; a fatal one (the reader failed closed) ends it.
    pub fn spawn(mut self) -> SnapshotterHandle {
        let (stop, mut stopped) = watch::channel(false);
        let status = self.subscribe();
        let interval = self.options.interval;
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = tokio::time::sleep(interval) => {}
                }
                match self.snapshot_now().await {
                    Ok(_) => {}
                    Err(e) if e.is_retryable() => tracing::warn!(error = %e, "snapshot failed; retried next interval"),
                    Err(e) => {
                        tracing::error!(error = %e, "snapshotter stopped: no more snapshots until restart");
                        break;
                    }
                }
            }
        });
        SnapshotterHandle { stop, status, task }
    }
}

/// A running [`Snapshotter`].
#[derive(Debug)]
pub struct SnapshotterHandle {
    stop: watch::Sender<bool>,
    status: watch::Receiver<SnapshotterStatus>,
    task: tokio::task::JoinHandle<()>,
}

impl SnapshotterHandle {
    /// Its status, as it changes.
    pub fn subscribe(&self) -> watch::Receiver<SnapshotterStatus> {
        self.status.clone()
    }

    /// Stops it after the snapshot in hand, if any.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
