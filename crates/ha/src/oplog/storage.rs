//! `OpLogBatchStorage`: the oplog's layout and CAS protocol over any [`HaKvBackend`]. It owns keys, codecs and the
//! one-txn "write batch + advance durable prefix" step with unknown-outcome resolution; it does not own admission,
//! sequence assignment, retry policy or callbacks (the writer's) nor what entries mean (the master's).
//! It also owns the legacy per-entry layout (RFC §4: one key per entry plus `/latest`, read by standbys and written
//! by the writer's legacy mode) and the cutover from it (RFC §6: the durable prefix created as `{0, latest}`).

use super::codec::{
    ClusterIdError, CodecError, DurablePrefix, OpLogBatchRecord, OpLogEntry, OpLogKeys, RECORD_OVERHEAD_BOUND,
    decode_legacy_entry, decode_legacy_latest, decode_producer_view, encode_legacy_entry, encode_legacy_latest,
    encode_producer_view,
};
use crate::kv::{HaKvBackend, KvCompare, KvError, KvPair, KvTxn, TxnOutcome};
use std::sync::Arc;

/// Default most entries in one batch (the RFC's `oplog_batch_max_entries`).
pub const DEFAULT_MAX_BATCH_ENTRIES: usize = 1024;
/// Request bytes kept free for the txn's keys, compares, the prefix value and protobuf framing.
pub const TXN_OVERHEAD_BYTES: usize = 4096;
/// Batch records fetched per range request (bounded so a page of full batches stays far below the response limit).
pub const RANGE_PAGE: usize = 16;
/// Attempts of the producer-view claim loop (and of the cutover loop) before giving up on a contended key.
const CLAIM_ATTEMPTS: usize = 16;

/// Why a storage call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// The backend failed; [`KvError::Ambiguous`] means the write's outcome is still unknown (retry it as is).
    #[error("backend: {0}")]
    Kv(#[from] KvError),
    /// The backend has no transactions: the batch oplog cannot be HA-correct on it.
    #[error("the backend has no transactions; the batch oplog requires them")]
    Unsupported,
    /// The producer view is not this writer's: a newer producer took over. Never retry.
    #[error("fenced: producer view is {found:?}, this writer holds {held}")]
    Fenced {
        /// The view this writer wrote under.
        held: u64,
        /// The view stored now.
        found: Option<u64>,
    },
    /// A producer view older than the stored one was claimed.
    #[error("producer view {requested} is older than the stored {current}")]
    StaleView {
        /// The view asked for.
        requested: u64,
        /// The view stored.
        current: u64,
    },
    /// The durable prefix is not the one this write expected and not this write's result: another writer moved it.
    #[error("durable prefix is {found:?}, expected {expected:?}")]
    Conflict {
        /// The prefix the write was built on.
        expected: DurablePrefix,
        /// The prefix found.
        found: Option<DurablePrefix>,
    },
    /// The batch does not continue the expected prefix, or is malformed.
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// The batch exceeds the storage's entry or byte cap.
    #[error("batch of {entries} entries / {bytes} bytes exceeds {max_entries} entries / {max_bytes} bytes")]
    BatchTooLarge {
        /// Entries in the batch.
        entries: usize,
        /// Encoded bytes (or a bound of them).
        bytes: usize,
        /// The entry cap.
        max_entries: usize,
        /// The byte cap.
        max_bytes: usize,
    },
    /// A stored value does not decode.
    #[error("corrupt value at {key}: {error}")]
    Corrupt {
        /// The key, as text.
        key: String,
        /// Why it does not decode.
        error: CodecError,
    },
    /// The stored oplog breaks an invariant (missing terminal batch, batches without a prefix, ...). Fail closed.
    #[error("inconsistent oplog: {0}")]
    Inconsistent(String),
    /// The cluster id cannot name a namespace.
    #[error(transparent)]
    ClusterId(#[from] ClusterIdError),
    /// The oplog was cut over to batch records (a durable prefix exists): per-entry writes would land outside
    /// the durable boundary and no reader would apply them.
    #[error("the oplog was cut over to batch records at {0:?}; per-entry writes are refused")]
    CutOver(DurablePrefix),
}

/// Caps on one batch, derived from the backend's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Most entries in one batch.
    pub max_entries: usize,
    /// Most encoded bytes of one batch record.
    pub max_bytes: usize,
}

impl BatchLimits {
    /// Whether a batch of `entries` entries whose entries' encoded-size bounds sum to `entry_bytes` fits.
    pub fn fits(&self, entries: usize, entry_bytes: usize) -> bool {
        entries <= self.max_entries && entry_bytes.saturating_add(RECORD_OVERHEAD_BOUND) <= self.max_bytes
    }
}

/// Storage settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageConfig {
    /// Most entries in one batch.
    pub max_batch_entries: usize,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self { max_batch_entries: DEFAULT_MAX_BATCH_ENTRIES }
    }
}

/// The batch oplog of one cluster over a KV backend.
#[derive(Clone)]
pub struct OpLogBatchStorage {
    kv: Arc<dyn HaKvBackend>,
    keys: OpLogKeys,
    limits: BatchLimits,
}

impl std::fmt::Debug for OpLogBatchStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpLogBatchStorage").field("keys", &self.keys).field("limits", &self.limits).finish()
    }
}

fn key_text(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

impl OpLogBatchStorage {
    /// The oplog of `cluster` on `kv`. Refuses a backend without transactions.
    pub fn new(kv: Arc<dyn HaKvBackend>, cluster: &str, config: StorageConfig) -> Result<Self, StorageError> {
        if !kv.supports_txn() {
            return Err(StorageError::Unsupported);
        }
        let keys = OpLogKeys::new(cluster)?;
        let kv_limits = kv.limits();
        // One txn = two compares + two puts; a backend that cannot take that cannot host the oplog.
        if kv_limits.max_txn_ops < 4 {
            return Err(StorageError::Unsupported);
        }
        let max_bytes =
            kv_limits.max_request_bytes.saturating_sub(TXN_OVERHEAD_BYTES).min(super::codec::MAX_RECORD_BYTES);
        let limits = BatchLimits { max_entries: config.max_batch_entries.max(1), max_bytes };
        Ok(Self { kv, keys, limits })
    }

    /// The key layout.
    pub fn keys(&self) -> &OpLogKeys {
        &self.keys
    }

    /// Caps a batch must respect.
    pub fn batch_limits(&self) -> BatchLimits {
        self.limits
    }

    /// The stored durable prefix, or `None` if the oplog was never initialised.
    pub async fn read_durable_prefix(&self) -> Result<Option<DurablePrefix>, StorageError> {
        let key = self.keys.durable_prefix();
        match self.kv.get(&key).await? {
            None => Ok(None),
            Some(v) => DurablePrefix::decode(&v)
                .map(Some)
                .map_err(|error| StorageError::Corrupt { key: key_text(&key), error }),
        }
    }

    /// The stored producer view, or `None` if none was claimed.
    pub async fn read_producer_view(&self) -> Result<Option<u64>, StorageError> {
        let key = self.keys.producer_view();
        match self.kv.get(&key).await? {
            None => Ok(None),
            Some(v) => {
                decode_producer_view(&v).map(Some).map_err(|error| StorageError::Corrupt { key: key_text(&key), error })
            }
        }
    }

    /// Returns the durable prefix, creating it if absent (create-if-absent, so racing initialisers agree), after
    /// checking the stored oplog is consistent with it. A namespace written by the legacy per-entry writer is cut
    /// over (RFC §6): the prefix is created as `{0, latest}` from `/latest` (trusted, not scanned), compared in the
    /// same txn so a per-entry writer still advancing `/latest` makes the cutover re-read instead of losing entries.
    pub async fn init_durable_prefix(&self) -> Result<DurablePrefix, StorageError> {
        if let Some(p) = self.read_durable_prefix().await? {
            self.validate_prefix(p).await?;
            return Ok(p);
        }
        if self.first_batch_after(0).await?.is_some() {
            return Err(StorageError::Inconsistent("batch records exist but no durable prefix".into()));
        }
        let key = self.keys.durable_prefix();
        let latest_key = self.keys.legacy_latest();
        for _ in 0..CLAIM_ATTEMPTS {
            let latest = self.read_legacy_latest().await?;
            let base = DurablePrefix { batch_id: 0, last_seq: latest.unwrap_or(0) };
            let latest_compare = match latest {
                Some(l) => KvCompare::ValueEquals(latest_key.clone(), encode_legacy_latest(l)),
                None => KvCompare::KeyAbsent(latest_key.clone()),
            };
            let txn = KvTxn {
                compares: vec![KvCompare::KeyAbsent(key.clone()), latest_compare],
                puts: vec![KvPair { key: key.clone(), value: base.encode() }],
            };
            let outcome = self.kv.txn(&txn).await;
            match &outcome {
                Ok(TxnOutcome::Succeeded) => {
                    if latest.is_some() {
                        tracing::info!(keys = ?self.keys, prefix = ?base, "cut the per-entry oplog over to batch records");
                    } else {
                        tracing::info!(keys = ?self.keys, "created the durable prefix {{0, 0}}");
                    }
                    return Ok(base);
                }
                Err(e) if !e.is_ambiguous() => return Err(e.clone().into()),
                Ok(TxnOutcome::CompareFailed) | Err(_) => {
                    // Another initialiser won, ours landed without an answer, or `/latest` moved: what is stored
                    // now is the truth.
                    if let Some(p) = self.read_durable_prefix().await? {
                        self.validate_prefix(p).await?;
                        return Ok(p);
                    }
                    if let Err(e) = outcome {
                        return Err(StorageError::Kv(e));
                    }
                    tracing::warn!(keys = ?self.keys, "legacy /latest moved during cutover; re-reading");
                }
            }
        }
        Err(StorageError::Inconsistent("legacy /latest kept moving during cutover: stop the per-entry writer".into()))
    }

    /// The legacy `/latest` (the per-entry writer's last sequence), or `None` if the namespace never had one.
    pub async fn read_legacy_latest(&self) -> Result<Option<u64>, StorageError> {
        let key = self.keys.legacy_latest();
        match self.kv.get(&key).await? {
            None => Ok(None),
            Some(v) => {
                decode_legacy_latest(&v).map(Some).map_err(|error| StorageError::Corrupt { key: key_text(&key), error })
            }
        }
    }

    /// Legacy entries with sequence in `(after, upto]`, in order, at most `limit` (0 = all), read [`RANGE_PAGE`]
    /// keys at a time; each value must decode and carry its key's sequence number.
    pub async fn read_legacy_entries(
        &self,
        after: u64,
        upto: u64,
        limit: usize,
    ) -> Result<Vec<(u64, OpLogEntry)>, StorageError> {
        let (begin, end) = self.keys.legacy_entries_between(after, upto);
        self.collect_range(begin, end, limit, |kv| {
            let Some(seq) = self.keys.parse_legacy_entry(&kv.key) else { return Ok(None) };
            let (stored, entry) = decode_legacy_entry(&kv.value)
                .map_err(|error| StorageError::Corrupt { key: key_text(&kv.key), error })?;
            if stored != seq {
                return Err(StorageError::Corrupt {
                    key: key_text(&kv.key),
                    error: CodecError::Inconsistent(format!("value says seq {stored}")),
                });
            }
            Ok(Some((seq, entry)))
        })
        .await
    }

    /// Startup of the legacy per-entry writer: `{0, latest}` (`latest` 0 when absent), after checking the entry
    /// at `latest` exists and that the namespace was not cut over to batch records.
    pub async fn init_legacy(&self) -> Result<DurablePrefix, StorageError> {
        if let Some(p) = self.read_durable_prefix().await? {
            return Err(StorageError::CutOver(p));
        }
        let latest = self.read_legacy_latest().await?.unwrap_or(0);
        if latest > 0 && self.read_legacy_entries(latest - 1, latest, 1).await?.is_empty() {
            return Err(StorageError::Inconsistent(format!("legacy /latest is {latest} but its entry is missing")));
        }
        Ok(DurablePrefix { batch_id: 0, last_seq: latest })
    }

    /// The legacy per-entry write of entry `seq` (RFC §4's old layout): ONE txn {compare producer view == `view`,
    /// durable prefix absent (not cut over), `/latest` == `expected_latest` (absent for 0); put the entry key,
    /// put `/latest` = `seq`}. Unknown outcomes are resolved by re-reading, as for batches. Returns `seq`.
    pub async fn write_legacy_entry(
        &self,
        seq: u64,
        entry: &OpLogEntry,
        expected_latest: u64,
        view: u64,
    ) -> Result<u64, StorageError> {
        if view == 0 {
            return Err(StorageError::InvalidBatch("producer view 0 is reserved".into()));
        }
        if expected_latest.checked_add(1) != Some(seq) {
            return Err(StorageError::InvalidBatch(format!("entry {seq} does not follow /latest {expected_latest}")));
        }
        let value = encode_legacy_entry(seq, entry).map_err(|e| StorageError::InvalidBatch(e.to_string()))?;
        let latest_key = self.keys.legacy_latest();
        let latest_compare = if expected_latest == 0 {
            KvCompare::KeyAbsent(latest_key.clone())
        } else {
            KvCompare::ValueEquals(latest_key.clone(), encode_legacy_latest(expected_latest))
        };
        let txn = KvTxn {
            compares: vec![
                KvCompare::ValueEquals(self.keys.producer_view(), encode_producer_view(view)),
                KvCompare::KeyAbsent(self.keys.durable_prefix()),
                latest_compare,
            ],
            puts: vec![
                KvPair { key: self.keys.legacy_entry(seq), value: value.clone() },
                KvPair { key: latest_key, value: encode_legacy_latest(seq) },
            ],
        };
        let ambiguous = match self.kv.txn(&txn).await {
            Ok(TxnOutcome::Succeeded) => return Ok(seq),
            Ok(TxnOutcome::CompareFailed) => None,
            Err(e) if e.is_ambiguous() => Some(e),
            Err(e) => return Err(e.into()),
        };
        let unknown = |e: StorageError| match &ambiguous {
            Some(a) if matches!(e, StorageError::Kv(_)) => StorageError::Kv(a.clone()),
            _ => e,
        };
        let prefix = self.read_durable_prefix().await.map_err(unknown)?;
        let latest = self.read_legacy_latest().await.map_err(unknown)?;
        let landed = if latest == Some(seq) {
            let stored = self.kv.get(&self.keys.legacy_entry(seq)).await.map_err(|e| unknown(e.into()))?;
            stored.as_deref() == Some(value.as_slice())
        } else {
            false
        };
        let current_view = self.read_producer_view().await.map_err(unknown)?;
        if current_view != Some(view) {
            tracing::warn!(view, found = ?current_view, seq, "legacy oplog write fenced");
            return Err(StorageError::Fenced { held: view, found: current_view });
        }
        if landed {
            return Ok(seq);
        }
        if let Some(p) = prefix {
            return Err(StorageError::CutOver(p));
        }
        let as_prefix = |l: u64| DurablePrefix { batch_id: 0, last_seq: l };
        match ambiguous {
            Some(e) if latest.unwrap_or(0) == expected_latest => Err(StorageError::Kv(e)),
            _ => Err(StorageError::Conflict { expected: as_prefix(expected_latest), found: latest.map(as_prefix) }),
        }
    }

    /// Startup checks: `{0, n}` has no batches; `{id, n}` has its terminal batch, ending at `n`, and nothing after.
    async fn validate_prefix(&self, p: DurablePrefix) -> Result<(), StorageError> {
        if p.batch_id > 0 {
            let Some(b) = self.read_batch(p.batch_id).await? else {
                return Err(StorageError::Inconsistent(format!("durable prefix {p:?}: its batch is missing")));
            };
            if b.last_seq != p.last_seq {
                return Err(StorageError::Inconsistent(format!(
                    "durable prefix {p:?}: batch {} ends at seq {}",
                    b.batch_id, b.last_seq
                )));
            }
        }
        if let Some(id) = self.first_batch_after(p.batch_id).await? {
            return Err(StorageError::Inconsistent(format!("batch {id} exists beyond durable prefix {p:?}")));
        }
        Ok(())
    }

    /// The id of the oldest stored batch, if any: 1 for a log never compacted, higher after
    /// [`OpLogBatchStorage::compact_through`].
    pub async fn first_stored_batch(&self) -> Result<Option<u64>, StorageError> {
        self.first_batch_after(0).await
    }

    /// Deletes the batches with ids up to `through` (a snapshot includes them), in one request; returns how many
    /// keys went. The durable prefix's own batch is always kept, whatever `through` says: startup checks read
    /// it, and a writer's next batch is validated against it. Idempotent: a retry after a failure deletes the rest.
    pub async fn compact_through(&self, through: u64) -> Result<u64, StorageError> {
        let Some(prefix) = self.read_durable_prefix().await? else {
            return Ok(0);
        };
        let last = through.min(prefix.batch_id.saturating_sub(1));
        if last == 0 {
            return Ok(0);
        }
        // Zero-padded ids sort numerically: [batch 0, batch last+1) is exactly ids 0..=last (and any sidecar
        // key of those batches).
        let deleted = self.kv.delete_range(&self.keys.batch(0), &self.keys.batch(last + 1)).await?;
        tracing::info!(keys = ?self.keys, through = last, deleted, "compacted oplog batches a snapshot covers");
        Ok(deleted)
    }

    /// Discards the backend's history of changes up to its current revision and returns that revision (0: the
    /// backend keeps no history). etcd keeps every value a key ever had until it is compacted — every batch
    /// rewrites the durable prefix, and [`OpLogBatchStorage::compact_through`] only deletes the current values —
    /// so without this its database grows with every write until it refuses writes (`NOSPACE`). The oplog reads
    /// only current values, never history; nor does anything else here (the leader view is watched from now).
    pub async fn compact_history(&self) -> Result<u64, StorageError> {
        let revision = self.kv.revision().await?;
        if revision > 0 {
            self.kv.compact(revision).await?;
            tracing::debug!(keys = ?self.keys, revision, "compacted the backend's history");
        }
        Ok(revision)
    }

    /// The id of the first batch key after `after`, if any.
    async fn first_batch_after(&self, after: u64) -> Result<Option<u64>, StorageError> {
        let (begin, end) = self.keys.batches_after(after);
        Ok(self.collect_range(begin, end, 1, |kv| Ok(self.keys.parse_batch(&kv.key))).await?.pop())
    }

    /// Makes `view` the producer view unless a newer one is stored (idempotent for the current view).
    pub async fn claim_producer_view(&self, view: u64) -> Result<(), StorageError> {
        if view == 0 {
            return Err(StorageError::InvalidBatch("producer view 0 is reserved".into()));
        }
        let key = self.keys.producer_view();
        let mut last_err = None;
        for _ in 0..CLAIM_ATTEMPTS {
            let current = self.read_producer_view().await?;
            let compare = match current {
                Some(c) if c > view => return Err(StorageError::StaleView { requested: view, current: c }),
                Some(c) if c == view => return Ok(()),
                Some(c) => KvCompare::ValueEquals(key.clone(), encode_producer_view(c)),
                None => KvCompare::KeyAbsent(key.clone()),
            };
            let txn = KvTxn {
                compares: vec![compare],
                puts: vec![KvPair { key: key.clone(), value: encode_producer_view(view) }],
            };
            match self.kv.txn(&txn).await {
                Ok(TxnOutcome::Succeeded) => {
                    tracing::info!(view, previous = ?current, "claimed the oplog producer view");
                    return Ok(());
                }
                // Lost a race or an unknown outcome: the next read decides.
                Ok(TxnOutcome::CompareFailed) => {}
                Err(e) if e.is_ambiguous() => last_err = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(match last_err {
            Some(e) => StorageError::Kv(e),
            None => StorageError::Inconsistent("producer view claim kept losing races".into()),
        })
    }

    /// Writes `batch` and advances the durable prefix from `expected` to the batch's end, in one txn that holds only
    /// while the prefix is exactly `expected` and the producer view is exactly `view`. An unknown outcome is resolved
    /// by re-reading; success is reported only if this batch is durable under `view`.
    pub async fn write_batch(
        &self,
        batch: &OpLogBatchRecord,
        expected: DurablePrefix,
        view: u64,
    ) -> Result<DurablePrefix, StorageError> {
        let value = self.check_batch(batch, expected, view)?;
        let target = batch.prefix();
        let prefix_key = self.keys.durable_prefix();
        let batch_key = self.keys.batch(batch.batch_id);
        let txn = KvTxn {
            compares: vec![
                KvCompare::ValueEquals(self.keys.producer_view(), encode_producer_view(view)),
                KvCompare::ValueEquals(prefix_key.clone(), expected.encode()),
            ],
            puts: vec![
                KvPair { key: batch_key, value: value.clone() },
                KvPair { key: prefix_key, value: target.encode() },
            ],
        };
        match self.kv.txn(&txn).await {
            Ok(TxnOutcome::Succeeded) => Ok(target),
            Ok(TxnOutcome::CompareFailed) => self.resolve(batch, &value, expected, view, None).await,
            Err(e) if e.is_ambiguous() => self.resolve(batch, &value, expected, view, Some(e)).await,
            Err(e) => Err(e.into()),
        }
    }

    /// Pre-checks of [`Self::write_batch`]; returns the encoded record.
    fn check_batch(
        &self,
        batch: &OpLogBatchRecord,
        expected: DurablePrefix,
        view: u64,
    ) -> Result<Vec<u8>, StorageError> {
        if view == 0 {
            return Err(StorageError::InvalidBatch("producer view 0 is reserved".into()));
        }
        if expected.batch_id.checked_add(1) != Some(batch.batch_id) {
            return Err(StorageError::InvalidBatch(format!(
                "batch {} does not follow durable batch {}",
                batch.batch_id, expected.batch_id
            )));
        }
        if expected.last_seq.checked_add(1) != Some(batch.first_seq) {
            return Err(StorageError::InvalidBatch(format!(
                "batch starts at seq {}, durable prefix ends at {}",
                batch.first_seq, expected.last_seq
            )));
        }
        let too_large = |bytes| StorageError::BatchTooLarge {
            entries: batch.entries.len(),
            bytes,
            max_entries: self.limits.max_entries,
            max_bytes: self.limits.max_bytes,
        };
        if batch.entries.len() > self.limits.max_entries {
            return Err(too_large(0));
        }
        let value = batch.encode().map_err(|e| match e {
            CodecError::TooLarge { len, .. } => too_large(len),
            other => StorageError::InvalidBatch(other.to_string()),
        })?;
        if value.len() > self.limits.max_bytes {
            return Err(too_large(value.len()));
        }
        Ok(value)
    }

    /// After a failed compare or an unknown outcome: success only if the prefix is this batch's end, the stored
    /// batch is byte-identical, and the view is still ours; otherwise fenced, conflicting, or still unknown.
    async fn resolve(
        &self,
        batch: &OpLogBatchRecord,
        value: &[u8],
        expected: DurablePrefix,
        view: u64,
        ambiguous: Option<KvError>,
    ) -> Result<DurablePrefix, StorageError> {
        let target = batch.prefix();
        // A read failing here leaves the outcome unknown: report the original ambiguity (or the read's error).
        let unknown = |e: StorageError| match &ambiguous {
            Some(a) if matches!(e, StorageError::Kv(_)) => StorageError::Kv(a.clone()),
            _ => e,
        };
        let found = self.read_durable_prefix().await.map_err(unknown)?;
        let landed = if found == Some(target) {
            let stored = self.kv.get(&self.keys.batch(batch.batch_id)).await.map_err(|e| unknown(e.into()))?;
            stored.as_deref() == Some(value)
        } else {
            false
        };
        // Read the view last: a view that is ours after the batch was seen means no newer producer preceded it.
        let current_view = self.read_producer_view().await.map_err(unknown)?;
        if current_view != Some(view) {
            tracing::warn!(view, found = ?current_view, batch = batch.batch_id, "oplog write fenced");
            return Err(StorageError::Fenced { held: view, found: current_view });
        }
        if landed {
            if ambiguous.is_some() {
                tracing::info!(batch = batch.batch_id, "unknown txn outcome resolved: the batch is durable");
            }
            return Ok(target);
        }
        match ambiguous {
            // Not applied (the prefix has not moved): retrying this same batch is safe.
            Some(e) if found == Some(expected) => Err(StorageError::Kv(e)),
            _ => Err(StorageError::Conflict { expected, found }),
        }
    }

    /// The batch with `batch_id`, or `None`.
    pub async fn read_batch(&self, batch_id: u64) -> Result<Option<OpLogBatchRecord>, StorageError> {
        let key = self.keys.batch(batch_id);
        match self.kv.get(&key).await? {
            None => Ok(None),
            Some(v) => self.decode_batch(&key, batch_id, &v).map(Some),
        }
    }

    fn decode_batch(&self, key: &[u8], batch_id: u64, value: &[u8]) -> Result<OpLogBatchRecord, StorageError> {
        let b = OpLogBatchRecord::decode(value).map_err(|error| StorageError::Corrupt { key: key_text(key), error })?;
        if b.batch_id != batch_id {
            return Err(StorageError::Corrupt {
                key: key_text(key),
                error: CodecError::Inconsistent(format!("record says batch {}", b.batch_id)),
            });
        }
        Ok(b)
    }

    /// Up to `limit` batches (0 = all) with ids greater than `after`, in id order, reading [`RANGE_PAGE`] at a
    /// time; keys under `batches/` that are not batch keys are skipped and not counted.
    pub async fn read_batches_after(&self, after: u64, limit: usize) -> Result<Vec<OpLogBatchRecord>, StorageError> {
        let (begin, end) = self.keys.batches_after(after);
        self.collect_range(begin, end, limit, |kv| match self.keys.parse_batch(&kv.key) {
            Some(id) => self.decode_batch(&kv.key, id, &kv.value).map(Some),
            None => Ok(None),
        })
        .await
    }

    /// Up to `limit` items (0 = all) that `decode` makes of the pairs in `[begin, end)`, in key order, reading
    /// [`RANGE_PAGE`] keys at a time; pairs it maps to `None` are skipped and not counted.
    async fn collect_range<T>(
        &self,
        mut begin: Vec<u8>,
        end: Vec<u8>,
        limit: usize,
        mut decode: impl FnMut(&KvPair) -> Result<Option<T>, StorageError>,
    ) -> Result<Vec<T>, StorageError> {
        let mut out = Vec::new();
        while begin < end {
            let want = if limit == 0 { RANGE_PAGE } else { (limit - out.len()).min(RANGE_PAGE) };
            let page = self.kv.range(&begin, &end, want).await?;
            for kv in &page.kvs {
                if let Some(item) = decode(kv)? {
                    out.push(item);
                    if limit != 0 && out.len() == limit {
                        return Ok(out);
                    }
                }
            }
            match page.kvs.last() {
                Some(last) if page.more => begin = successor(&last.key),
                _ => break,
            }
        }
        Ok(out)
    }
}

/// The smallest key after `key`.
fn successor(key: &[u8]) -> Vec<u8> {
    let mut k = key.to_vec();
    k.push(0);
    k
}
