//! Replay: the master's [`OpLogApplier`] and the startup rebuild of a restarted master from its own log.
//!
//! The applier folds entries, strictly in sequence order, into a [`ReplayState`]: the segments mounted, the
//! readable objects (full post-states), the tenant policies, the local SSD registrations, the drain jobs. It never
//! allocates: a master's allocator cannot hand out a given offset, so the state becomes a `MasterService` in one
//! step at the end
//! (`MasterService::restore_replayed`), through the same restore seam a snapshot uses (every region's
//! allocator rebuilt from the replicas that lie in it, each replica re-bound, the rest freed). A standby
//! following a primary folds the same way and materialises when it is promoted.

use super::payload::{DrainRecord, MasterEntry, PayloadError, SegmentRecord};
use super::sink::OpLog;
use super::snapshots::{SnapshotOptions, Snapshotter, SnapshotterHandle, restore_state};
use crate::local_ssd::LocalSsdRecord;
use crate::service::MasterService;
use crescent_ha::kv::HaKvBackend;
use crescent_ha::oplog::{
    ApplyError, DurablePrefix, OpLogApplier, OpLogBatchStorage, OpLogEntry, OrderedOpLogWriter, StorageConfig,
    StorageError, WriterConfig,
};
use crescent_proto::{ClientId, ErrorCode, SegmentId, TaskId};
use std::collections::BTreeMap;

pub use super::objects::{ReplayObject, ReplayObjects};
use std::sync::Arc;

/// Everything a log describes, folded: what a master rebuilds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReplayState {
    /// Mounted segments by id.
    pub segments: BTreeMap<SegmentId, SegmentRecord>,
    /// Readable objects by `(tenant, key)`.
    pub objects: ReplayObjects,
    /// Requested tenant quotas (`None`: no tenant entry seen).
    pub policies: Option<BTreeMap<String, u64>>,
    /// Local SSD registrations by client (usage 0: runtime state, never logged).
    pub local_ssd: BTreeMap<ClientId, LocalSsdRecord>,
    /// Drain jobs by id: every running one, and the [`MAX_ENDED_DRAINS`] that ended last.
    pub drains: BTreeMap<TaskId, DrainRecord>,
    /// The last sequence number applied (0: none).
    pub last_seq: u64,
}

impl ReplayState {
    fn apply_entry(&mut self, e: MasterEntry) {
        match e {
            MasterEntry::PutEnd { tenant, key, mut object } => {
                // A write's End can be logged just after its segment's UNMOUNT (the unmount takes the pool's
                // lock, the End the object's); the primary's sweep dropped that replica. A later MOUNT of the
                // same segment id must not bring it back over space given to another object.
                object.replicas.retain(|r| self.segments.contains_key(&r.segment_id()));
                if object.replicas.is_empty() {
                    self.objects.remove(&tenant, &key);
                } else {
                    self.objects.insert(&tenant, &key, object);
                }
            }
            MasterEntry::Remove { tenant, key } => {
                self.objects.remove(&tenant, &key);
            }
            MasterEntry::SegmentMount(s) => {
                let id = SegmentId(uuid::Uuid::from_bytes(s.id));
                self.segments.insert(id, s);
            }
            MasterEntry::SegmentUnmount(s) => {
                let id = SegmentId(uuid::Uuid::from_bytes(s.id));
                self.segments.remove(&id);
                // Replicas on it went with it; objects left with none went too (the sweep's rule).
                self.objects.drop_segment(&s.id);
            }
            // The status a log records (a graceful unmount) does not survive a restart: replayed segments come
            // back disconnected, for their owner to remount.
            MasterEntry::SegmentUpdate(_) => {}
            MasterEntry::TenantQuotaSet { tenant, quota } => {
                self.policies.get_or_insert_with(BTreeMap::new).insert(tenant, quota.bytes);
            }
            MasterEntry::TenantRemove { tenant } => {
                self.policies.get_or_insert_with(BTreeMap::new).remove(&tenant);
            }
            MasterEntry::TenantPolicies(p) => {
                self.policies = Some(p.policies.into_iter().collect());
            }
            MasterEntry::GroupRemove { tenant, group } => {
                self.objects.remove_group(&tenant, &group);
            }
            MasterEntry::LocalSsdSet(r) => {
                let record = LocalSsdRecord {
                    enable_offloading: r.enable_offloading,
                    total_capacity: r.total_capacity,
                    used: 0,
                };
                self.local_ssd.insert(r.client_id(), record);
            }
            MasterEntry::LocalSsdRemove(r) => {
                self.local_ssd.remove(&ClientId(uuid::Uuid::from_bytes(r.client)));
            }
            MasterEntry::DrainSet(r) => {
                self.drains.insert(r.job_id(), r);
                prune_ended_drains(&mut self.drains);
            }
        }
    }
}

/// Ended drain jobs a master keeps answering for (the oldest ended go first; running ones always stay).
pub const MAX_ENDED_DRAINS: usize = 64;

/// Drops the ended jobs past [`MAX_ENDED_DRAINS`] (see [`ended_drains_past_limit`]).
pub fn prune_ended_drains(drains: &mut BTreeMap<TaskId, DrainRecord>) {
    let jobs = drains.iter().map(|(id, r)| (*id, r.order, r.job_status().is_ok_and(|s| s.is_final())));
    for id in ended_drains_past_limit(jobs) {
        drains.remove(&id);
    }
}

/// Of `jobs` (`(id, order, ended)`: `order` as [`DrainRecord::order`]), the ended ones past [`MAX_ENDED_DRAINS`],
/// those changed longest ago first, so the leader's board and every replay keep the same ones.
pub fn ended_drains_past_limit(jobs: impl Iterator<Item = (TaskId, u64, bool)>) -> Vec<TaskId> {
    let mut ended: Vec<(u64, TaskId)> = jobs.filter(|(_, _, ended)| *ended).map(|(id, at, _)| (at, id)).collect();
    if ended.len() <= MAX_ENDED_DRAINS {
        return Vec::new();
    }
    ended.sort_unstable();
    ended.truncate(ended.len() - MAX_ENDED_DRAINS);
    ended.into_iter().map(|(_, id)| id).collect()
}

impl OpLogApplier for ReplayState {
    fn apply(&mut self, seq: u64, entry: &OpLogEntry) -> Result<(), ApplyError> {
        let fail = |reason: String| ApplyError { seq, op: entry.op, reason };
        if seq != self.last_seq.saturating_add(1) {
            return Err(fail(format!("expected sequence {}, got {seq}", self.last_seq.saturating_add(1))));
        }
        let decoded = MasterEntry::decode(entry).map_err(|e: PayloadError| fail(e.to_string()))?;
        self.apply_entry(decoded);
        self.last_seq = seq;
        Ok(())
    }
}

/// Why a log could not be replayed or opened for writing.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The storage failed or holds an inconsistent log.
    #[error("oplog storage: {0}")]
    Storage(#[from] StorageError),
    /// An entry could not be applied.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// The batches do not continue each other up to the durable prefix.
    #[error("oplog gap: {0}")]
    Gap(String),
    /// The replayed state could not be restored into the service.
    #[error("restoring the replayed state failed: {0}")]
    Restore(ErrorCode),
    /// The log's early batches were compacted away and no usable snapshot covers them: restoring from what is
    /// left would be a silent partial state.
    #[error("oplog batches 1..{first_batch} were compacted and no usable snapshot covers them{detail}")]
    MissingBaseline {
        /// The oldest batch still stored.
        first_batch: u64,
        /// Snapshots refused, if any.
        detail: String,
    },
    /// The snapshot store failed (an unreachable store is not taken for an empty one).
    #[error("snapshot store: {0}")]
    Snapshot(#[from] crate::snapshot::catalog::CatalogError),
    /// A standby's own snapshots do not reach the log and no usable one could be had from the leader.
    #[error("{why}; the leader's snapshot: {fetch}")]
    Fetch {
        /// Why the standby's own snapshots did not do.
        why: String,
        /// Why the leader's did not either.
        fetch: String,
    },
    /// The newest usable snapshot includes more than the log's durable prefix: it belongs to another log.
    #[error("snapshot {id} includes up to seq {snapshot_seq}, beyond the durable prefix {prefix:?}")]
    SnapshotAhead {
        /// The snapshot.
        id: String,
        /// Its last sequence.
        snapshot_seq: u64,
        /// The log's prefix.
        prefix: DurablePrefix,
    },
}

/// Batches read per request while replaying.
const REPLAY_PAGE: usize = 16;

/// Applies every durable entry of `storage`, up to `prefix`, to `applier`, in order; returns the last sequence.
/// (Kept to one function: the generic standby reader will take its place.)
pub async fn replay_log(
    storage: &OpLogBatchStorage,
    prefix: DurablePrefix,
    applier: &mut dyn OpLogApplier,
) -> Result<u64, OpenError> {
    replay_log_after(storage, prefix, DurablePrefix { batch_id: 0, last_seq: 0 }, applier).await
}

/// [`replay_log`] from a baseline: `applier` already holds everything up to `base` (a snapshot), and the
/// batches after `base.batch_id` continue it exactly. A first batch that does not (history compacted beyond
/// the baseline) is refused, never skipped over.
pub async fn replay_log_after(
    storage: &OpLogBatchStorage,
    prefix: DurablePrefix,
    base: DurablePrefix,
    applier: &mut dyn OpLogApplier,
) -> Result<u64, OpenError> {
    let mut after = base.batch_id;
    let mut last_seq = base.last_seq;
    while after < prefix.batch_id {
        let batches = storage.read_batches_after(after, REPLAY_PAGE).await?;
        if batches.is_empty() {
            return Err(OpenError::Gap(format!("batch {} is missing (durable prefix {prefix:?})", after + 1)));
        }
        if after == 0 && batches[0].batch_id > 1 {
            return Err(OpenError::MissingBaseline { first_batch: batches[0].batch_id, detail: String::new() });
        }
        for b in batches {
            if b.batch_id > prefix.batch_id {
                break;
            }
            if b.batch_id != after + 1 || b.first_seq != last_seq + 1 {
                return Err(OpenError::Gap(format!(
                    "batch {} (seq {}..) follows batch {after} (seq ..{last_seq})",
                    b.batch_id, b.first_seq
                )));
            }
            for (seq, e) in b.sequenced() {
                applier.apply(seq, e)?;
            }
            after = b.batch_id;
            last_seq = b.last_seq;
        }
    }
    if last_seq != prefix.last_seq {
        return Err(OpenError::Gap(format!("replayed to seq {last_seq}, durable prefix is {prefix:?}")));
    }
    Ok(last_seq)
}

/// Where a master's oplog lives.
#[derive(Clone)]
pub struct OpLogOptions {
    /// The backend (etcd, embedded).
    pub kv: Arc<dyn HaKvBackend>,
    /// The cluster's namespace in it.
    pub cluster: String,
    /// Writer settings.
    pub writer: WriterConfig,
}

/// Entries reserved or committed but not yet durable that the master admits before refusing mutations
/// (`PERSISTENT_FAIL`). Batch-128 puts from 8 clients keep ~1 000 PutEnds in flight: the writer's default (one
/// batch's worth) refused a fifth of them against etcd. 64 Ki entries of a few hundred bytes each hold ~20 MiB.
pub const MASTER_MAX_WAITING_ENTRIES: usize = 1 << 16;

/// Most entries in one batch record: the byte bound (the backend's request limit) decides first for entries of
/// a few hundred bytes, so one txn carries ~5 000 of them rather than the storage default of 1 024.
pub const MASTER_MAX_BATCH_ENTRIES: usize = 1 << 13;

/// The writer settings a master runs with.
pub fn master_writer_config() -> WriterConfig {
    WriterConfig { max_waiting_entries: MASTER_MAX_WAITING_ENTRIES, ..WriterConfig::default() }
}

/// Cluster id of an oplog kept in an embedded data directory when none is given.
pub const DEFAULT_CLUSTER_ID: &str = "crescent";

impl OpLogOptions {
    /// An oplog in etcd (`endpoints`: `host:port` each), under `/oplog/<cluster>/`.
    pub async fn etcd(endpoints: Vec<String>, cluster: &str) -> Result<Self, OpenError> {
        let kv = crescent_ha::kv::EtcdKv::connect(crescent_ha::kv::EtcdKvConfig::new(endpoints))
            .await
            .map_err(|e| OpenError::Storage(StorageError::Kv(e)))?;
        Ok(Self { kv: Arc::new(kv), cluster: cluster.to_owned(), writer: master_writer_config() })
    }

    /// An oplog in the embedded store (one redb file) under `dir`, created if absent.
    pub fn embedded(dir: &std::path::Path, cluster: &str) -> Result<Self, OpenError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| OpenError::Storage(StorageError::Kv(crescent_ha::kv::KvError::Storage(e.to_string()))))?;
        let kv = crescent_ha::kv::EmbeddedKv::open(dir).map_err(|e| OpenError::Storage(StorageError::Kv(e)))?;
        Ok(Self { kv: Arc::new(kv), cluster: cluster.to_owned(), writer: master_writer_config() })
    }
}

impl std::fmt::Debug for OpLogOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpLogOptions").field("cluster", &self.cluster).finish_non_exhaustive()
    }
}

/// What opening the oplog did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenReport {
    /// The durable prefix found.
    pub prefix: DurablePrefix,
    /// The producer view this master writes under.
    pub view: u64,
    /// Objects restored.
    pub objects: usize,
    /// Segments restored (disconnected until their owners remount).
    pub segments: usize,
    /// The oplog position of the snapshot the restore started from (`{0, 0}`: none, the whole log replayed).
    pub snapshot: DurablePrefix,
}

/// Opens the log for `svc` (a fresh service, before it serves): replays what is durable into it, claims the
/// next producer view and attaches a started writer. Must run on a tokio runtime.
pub async fn open(options: &OpLogOptions, svc: &MasterService) -> Result<(Arc<OpLog>, OpenReport), OpenError> {
    let (log, report, _) = open_with_snapshots(options, None, svc).await?;
    Ok((log, report))
}

/// [`open`] with snapshots: the restore starts from the newest usable snapshot in `snapshots`' store (if any)
/// and replays only the log after it; a [`Snapshotter`] following the log from there is started and returned.
pub async fn open_with_snapshots(
    options: &OpLogOptions,
    snapshots: Option<&SnapshotOptions>,
    svc: &MasterService,
) -> Result<(Arc<OpLog>, OpenReport, Option<SnapshotterHandle>), OpenError> {
    let storage = master_storage(options)?;
    let prefix = storage.init_durable_prefix().await?;
    let (state, baseline) = restore_state(snapshots.map(|s| &*s.store), &storage, prefix).await?;
    let view = storage.read_producer_view().await?.map_or(1, |v| v.saturating_add(1));
    storage.claim_producer_view(view).await?;
    let (log, restored, snapshotter) = start_writing(&storage, options, snapshots, svc, state, prefix, view)?;
    let report = OpenReport { prefix, view, objects: restored.0, segments: restored.1, snapshot: baseline.position };
    tracing::info!(
        cluster = %options.cluster, batch = prefix.batch_id, seq = prefix.last_seq, view,
        snapshot_batch = baseline.position.batch_id,
        "oplog replayed: {} objects on {} segments (disconnected until their nodes remount)",
        report.objects, report.segments
    );
    Ok((log, report, snapshotter))
}

/// What [`start_writing`] started: the oplog handle, `(objects, segments)` restored, and the snapshotter.
pub type Started = (Arc<OpLog>, (usize, usize), Option<SnapshotterHandle>);

/// The storage of `options`' log, with the master's batch size.
pub fn master_storage(options: &OpLogOptions) -> Result<OpLogBatchStorage, OpenError> {
    Ok(OpLogBatchStorage::new(
        options.kv.clone(),
        &options.cluster,
        StorageConfig { max_batch_entries: MASTER_MAX_BATCH_ENTRIES },
    )?)
}

/// Makes `svc` (fresh, not serving yet) the producer of `storage`'s log under `view` (already claimed): restores
/// `state` (the log up to `prefix`) into it, attaches a started writer continuing `prefix`, and starts a
/// snapshotter that follows the log from there (it takes the state over).
pub fn start_writing(
    storage: &OpLogBatchStorage,
    options: &OpLogOptions,
    snapshots: Option<&SnapshotOptions>,
    svc: &MasterService,
    state: ReplayState,
    prefix: DurablePrefix,
    view: u64,
) -> Result<Started, OpenError> {
    let restored = svc.restore_replayed(&state).map_err(OpenError::Restore)?;
    let log = Arc::new(OpLog::new(OrderedOpLogWriter::new(storage.clone(), view, prefix, options.writer)));
    log.start();
    svc.attach_oplog(log.clone());
    let snapshotter = snapshots.map(|o| Snapshotter::new(storage.clone(), o.clone(), state, prefix).spawn());
    Ok((log, restored, snapshotter))
}

#[cfg(test)]
mod drain_tests {
    use super::*;

    fn job(id: u128, status: u8, at: u64) -> DrainRecord {
        DrainRecord {
            id: id.to_be_bytes(),
            order: at,
            status,
            segments: vec![[1; 16]],
            max_concurrency: 1,
            ..DrainRecord::default()
        }
    }

    /// Running jobs always stay; of the ended ones the newest [`MAX_ENDED_DRAINS`] do, whatever order they came in.
    #[test]
    fn a_replay_keeps_every_running_drain_and_the_newest_ended_ones() {
        let mut state = ReplayState::default();
        let n = MAX_ENDED_DRAINS as u128 + 10;
        state.apply_entry(MasterEntry::DrainSet(job(1_000, 2, 0)));
        for i in (0..n).rev() {
            state.apply_entry(MasterEntry::DrainSet(job(i, 3 + (i % 3) as u8, 100 + i as u64)));
        }
        state.apply_entry(MasterEntry::DrainSet(job(1_001, 0, 1)));
        assert_eq!(state.drains.len(), MAX_ENDED_DRAINS + 2);
        let ids = |s: &ReplayState| s.drains.keys().map(|id| id.0.as_u128()).collect::<Vec<_>>();
        let mut want: Vec<u128> = (10..n).collect();
        want.extend([1_000, 1_001]);
        assert_eq!(ids(&state), want);
        // A job logged again replaces its record: the running one ends and the oldest ended one goes.
        state.apply_entry(MasterEntry::DrainSet(job(1_000, 5, 10_000)));
        assert_eq!(state.drains.len(), MAX_ENDED_DRAINS + 1);
        assert!(!state.drains.contains_key(&TaskId(uuid::Uuid::from_u128(10))));
        assert_eq!(state.drains[&TaskId(uuid::Uuid::from_u128(1_000))].status, 5);
    }
}
