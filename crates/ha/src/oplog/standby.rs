//! The standby side of the oplog (RFC §14, reference §6.2–§6.3): [`OpLogStandbyReader`] follows one cluster's
//! oplog and applies it, strictly in sequence order and never beyond the durable boundary, through an
//! [`OpLogApplier`]; [`StandbyFollower`] polls it on an interval, backs off while the backend is unreachable and
//! turns fatal when that lasts longer than a retry window.
//!
//! One sequence, three layouts: legacy per-entry keys up to `/latest` while no durable prefix exists; legacy
//! entries up to the cutover boundary `{0, last_seq}`; batch records after it. Every anomaly (regression,
//! gap, overlap, corrupt value, missing terminal batch, applier error) is fatal: the reader fails closed and
//! refuses further polls until it is recreated. Only an unreachable or ambiguous backend is retryable.

use super::apply::{ApplyError, OpLogApplier};
use super::codec::{DurablePrefix, OpLogBatchRecord, OpLogEntry};
use super::storage::{OpLogBatchStorage, StorageError};
use crate::kv::KvError;
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;

/// Default most batch records (or legacy entries) read in one poll (the reference's `PollOnce(1024)`).
pub const DEFAULT_MAX_BATCHES_PER_POLL: usize = 1024;

/// Why a poll failed. [`StandbyError::is_retryable`] tells the two classes apart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StandbyError {
    /// The backend is unreachable or its answer was ambiguous: retryable (nothing was applied past the last
    /// verified entry).
    #[error("backend unavailable: {0}")]
    Unavailable(KvError),
    /// The backend refused or failed locally (not a transient condition).
    #[error("backend error: {0}")]
    Backend(KvError),
    /// A stored value is corrupt (checksum, schema, decoding) or misplaced.
    #[error("corrupt oplog: {0}")]
    Corrupt(StorageError),
    /// The durable prefix disappeared after this reader had seen one.
    #[error("durable prefix disappeared after {seen:?} was seen")]
    PrefixVanished {
        /// The last prefix seen.
        seen: DurablePrefix,
    },
    /// The legacy `/latest` disappeared after this reader had seen it (and no prefix replaced it).
    #[error("legacy /latest disappeared after {seen} was seen")]
    LatestVanished {
        /// The last value seen.
        seen: u64,
    },
    /// The durable prefix moved backwards or sideways (batch id or last seq decreased, same id with another
    /// seq, a higher id with the same seq).
    #[error("durable prefix regressed from {seen:?} to {found:?}")]
    PrefixRegressed {
        /// The last prefix seen.
        seen: DurablePrefix,
        /// The prefix read now.
        found: DurablePrefix,
    },
    /// The legacy `/latest` decreased.
    #[error("legacy /latest regressed from {seen} to {found}")]
    LatestRegressed {
        /// The last value seen.
        seen: u64,
        /// The value read now.
        found: u64,
    },
    /// `{0, n}` with `n > 0` is only valid as a cutover boundary: the legacy `/latest` must exist and reach `n`.
    #[error("durable prefix {prefix:?} is not a cutover boundary (legacy /latest is {latest:?})")]
    NotACutover {
        /// The prefix read.
        prefix: DurablePrefix,
        /// The legacy `/latest` found.
        latest: Option<u64>,
    },
    /// The batch the durable prefix names is missing.
    #[error("durable prefix {prefix:?}: its batch is missing")]
    TerminalBatchMissing {
        /// The prefix read.
        prefix: DurablePrefix,
    },
    /// The batch the durable prefix names does not end at the prefix.
    #[error("durable prefix {prefix:?}: its batch ends at seq {batch_last_seq}")]
    TerminalMismatch {
        /// The prefix read.
        prefix: DurablePrefix,
        /// Where the batch ends.
        batch_last_seq: u64,
    },
    /// A batch id was skipped.
    #[error("batch gap: expected batch {expected}, found {found}")]
    BatchGap {
        /// The id that should come next.
        expected: u64,
        /// The id found.
        found: u64,
    },
    /// A batch or legacy entry does not start right after the last applied sequence (a gap or an overlap).
    #[error("sequence discontinuity: expected seq {expected}, found {found}")]
    SeqGap {
        /// The sequence that should come next.
        expected: u64,
        /// The sequence found.
        found: u64,
    },
    /// A batch at or below the prefix's batch id ends past the prefix.
    #[error("batch {batch_id} ends at seq {last_seq}, past the durable prefix {prefix:?}")]
    BeyondPrefix {
        /// The batch.
        batch_id: u64,
        /// Where it ends.
        last_seq: u64,
        /// The prefix.
        prefix: DurablePrefix,
    },
    /// The log ends before the durable boundary: entries up to it are missing.
    #[error("the log has no entry {missing} but the durable boundary is {boundary}")]
    Incomplete {
        /// The first missing sequence.
        missing: u64,
        /// The boundary that must be reachable.
        boundary: u64,
    },
    /// This reader has applied past the durable boundary (its baseline is ahead of the log).
    #[error("applied seq {applied} (batch {applied_batch}) is ahead of the durable boundary {boundary:?}")]
    AheadOfLog {
        /// Applied sequence.
        applied: u64,
        /// Applied batch id.
        applied_batch: u64,
        /// The boundary read.
        boundary: DurablePrefix,
    },
    /// The applier refused an entry.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// The reader failed closed earlier and refuses to poll until it is recreated.
    #[error("the standby reader failed closed earlier: {0}")]
    Halted(Box<StandbyError>),
    /// Retryable errors lasted longer than the follower's retry window.
    #[error("the backend stayed unavailable for {waited:?} (window {window:?}): {last}")]
    RetryWindowExpired {
        /// How long retries went on without progress.
        waited: Duration,
        /// The window.
        window: Duration,
        /// The last retryable error.
        last: Box<StandbyError>,
    },
}

impl StandbyError {
    /// True for the errors a later poll may get past (an unreachable or ambiguous backend); everything else is
    /// fatal.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StandbyError::Unavailable(_))
    }
}

impl From<StorageError> for StandbyError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::Kv(k) if k.is_retryable() => StandbyError::Unavailable(k),
            StorageError::Kv(k) => StandbyError::Backend(k),
            other => StandbyError::Corrupt(other),
        }
    }
}

/// What one successful poll saw and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollReport {
    /// The durable prefix read (`None`: none exists yet).
    pub prefix: Option<DurablePrefix>,
    /// The legacy `/latest`, when the reader had to read it (no prefix, or a cutover boundary).
    pub legacy_latest: Option<u64>,
    /// Entries applied by this poll.
    pub applied: u64,
    /// The reader has applied everything up to the boundary it read.
    pub caught_up: bool,
}

/// The reader's position, for health, lag and promotion checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbyStatus {
    /// Last applied sequence.
    pub applied_seq: u64,
    /// Last applied batch id (0 while in the legacy part of the log).
    pub applied_batch: u64,
    /// The last durable prefix seen.
    pub seen_prefix: Option<DurablePrefix>,
    /// The last legacy `/latest` seen.
    pub seen_latest: Option<u64>,
    /// Entries durable but not applied yet: boundary − applied (the boundary is the prefix's `last_seq`, or
    /// `/latest` before cutover).
    pub lag: u64,
    /// Set once the reader failed closed.
    pub failed: Option<StandbyError>,
}

/// Follows one cluster's oplog and applies it in strict order. See the module doc.
#[derive(Debug)]
pub struct OpLogStandbyReader {
    storage: OpLogBatchStorage,
    applied_seq: u64,
    applied_batch: u64,
    /// Started from a snapshot baseline and nothing scanned yet: the first batch may follow compacted history
    /// (an id beyond `applied_batch + 1`) and may overlap what the baseline holds.
    baseline: bool,
    seen_prefix: Option<DurablePrefix>,
    seen_latest: Option<u64>,
    failed: Option<StandbyError>,
}

impl OpLogStandbyReader {
    /// A reader of an empty state: it must read the whole log from sequence 1, with no tolerance.
    pub fn new(storage: OpLogBatchStorage) -> Self {
        Self {
            storage,
            applied_seq: 0,
            applied_batch: 0,
            baseline: false,
            seen_prefix: None,
            seen_latest: None,
            failed: None,
        }
    }

    /// A reader whose applier already holds every entry up to `applied_seq` (a snapshot baseline, or a warm
    /// restart) whose last batch was `applied_batch` (0: unknown or legacy). Only the first batch it scans may
    /// skip ids (history compacted below the baseline) and repeat entries it already has (they are skipped).
    pub fn from(storage: OpLogBatchStorage, applied_seq: u64, applied_batch: u64) -> Self {
        Self { applied_seq, applied_batch, baseline: true, ..Self::new(storage) }
    }

    /// The last applied sequence.
    pub fn applied_seq(&self) -> u64 {
        self.applied_seq
    }

    /// The reader's position now.
    pub fn status(&self) -> StandbyStatus {
        let boundary = match (self.seen_prefix, self.seen_latest) {
            (Some(p), _) => p.last_seq,
            (None, Some(l)) => l,
            (None, None) => 0,
        };
        StandbyStatus {
            applied_seq: self.applied_seq,
            applied_batch: self.applied_batch,
            seen_prefix: self.seen_prefix,
            seen_latest: self.seen_latest,
            lag: boundary.saturating_sub(self.applied_seq),
            failed: self.failed.clone(),
        }
    }

    /// Reads the boundary and applies up to `max_batches` batch records (legacy entries count one each) through
    /// `applier`. A full page leaves the rest for the next poll. A fatal error fails the reader closed.
    pub async fn poll_once(
        &mut self,
        applier: &mut dyn OpLogApplier,
        max_batches: usize,
    ) -> Result<PollReport, StandbyError> {
        if let Some(f) = &self.failed {
            return Err(StandbyError::Halted(Box::new(f.clone())));
        }
        let before = self.applied_seq;
        let result = self.poll_inner(applier, max_batches.max(1)).await;
        match result {
            Ok(mut report) => {
                report.applied = self.applied_seq - before;
                Ok(report)
            }
            Err(e) if e.is_retryable() => {
                tracing::debug!(error = %e, applied = self.applied_seq, "standby poll: backend unavailable");
                Err(e)
            }
            Err(e) => {
                tracing::error!(error = %e, applied = self.applied_seq, "standby reader failed closed");
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    async fn poll_inner(&mut self, applier: &mut dyn OpLogApplier, budget: usize) -> Result<PollReport, StandbyError> {
        let Some(prefix) = self.storage.read_durable_prefix().await? else {
            return self.poll_legacy(applier, budget).await;
        };
        self.guard_prefix(prefix)?;
        if prefix.batch_id == 0 {
            return self.poll_cutover(applier, prefix, budget).await;
        }
        self.check_not_ahead(prefix)?;
        // The prefix must name a complete batch ending exactly at it (it never points into a batch).
        let Some(terminal) = self.storage.read_batch(prefix.batch_id).await? else {
            return Err(StandbyError::TerminalBatchMissing { prefix });
        };
        if terminal.last_seq != prefix.last_seq {
            return Err(StandbyError::TerminalMismatch { prefix, batch_last_seq: terminal.last_seq });
        }
        let mut report = PollReport { prefix: Some(prefix), legacy_latest: None, applied: 0, caught_up: false };
        if self.applied_batch >= prefix.batch_id {
            // Nothing new: no range read.
            self.seen_prefix = Some(prefix);
            report.caught_up = true;
            return Ok(report);
        }
        let batches = self.storage.read_batches_after(self.applied_batch, budget).await?;
        let full_page = batches.len() >= budget;
        let mut batches = batches.into_iter().peekable();
        if let Some(first) = batches.peek() {
            // Batch 1 continuing a legacy log: the legacy entries up to the cutover come first.
            if self.applied_batch == 0 && first.batch_id == 1 && first.first_seq > self.applied_seq + 1 {
                let cutover = first.first_seq - 1;
                self.apply_legacy(applier, cutover, budget).await?;
                if self.applied_seq < cutover {
                    // Out of budget: continue with the legacy part next poll (nothing recorded as seen yet that
                    // the next poll would not re-check).
                    self.seen_prefix = Some(prefix);
                    return Ok(report);
                }
            }
        }
        for b in batches {
            if b.batch_id > prefix.batch_id {
                // A batch beyond the prefix is not durable (yet): never apply it.
                break;
            }
            self.apply_batch(applier, &b, prefix)?;
            if b.batch_id == prefix.batch_id {
                break;
            }
        }
        if self.applied_batch < prefix.batch_id && !full_page {
            return Err(StandbyError::Incomplete { missing: self.applied_seq + 1, boundary: prefix.last_seq });
        }
        self.seen_prefix = Some(prefix);
        report.caught_up = self.applied_seq == prefix.last_seq;
        Ok(report)
    }

    /// No durable prefix: the legacy layout up to `/latest`, or nothing at all yet.
    async fn poll_legacy(&mut self, applier: &mut dyn OpLogApplier, budget: usize) -> Result<PollReport, StandbyError> {
        if let Some(seen) = self.seen_prefix {
            return Err(StandbyError::PrefixVanished { seen });
        }
        let latest = self.storage.read_legacy_latest().await?;
        let Some(latest) = latest else {
            if let Some(seen) = self.seen_latest {
                return Err(StandbyError::LatestVanished { seen });
            }
            // The primary has not written anything yet.
            return Ok(PollReport { prefix: None, legacy_latest: None, applied: 0, caught_up: self.applied_seq == 0 });
        };
        if let Some(seen) = self.seen_latest
            && latest < seen
        {
            return Err(StandbyError::LatestRegressed { seen, found: latest });
        }
        self.check_not_ahead(DurablePrefix { batch_id: 0, last_seq: latest })?;
        self.seen_latest = Some(latest);
        self.apply_legacy(applier, latest, budget).await?;
        Ok(PollReport { prefix: None, legacy_latest: Some(latest), applied: 0, caught_up: self.applied_seq == latest })
    }

    /// A prefix `{0, n}`: the empty log (`n == 0`), or a cutover boundary whose legacy part ends at `n`.
    async fn poll_cutover(
        &mut self,
        applier: &mut dyn OpLogApplier,
        prefix: DurablePrefix,
        budget: usize,
    ) -> Result<PollReport, StandbyError> {
        let mut report = PollReport { prefix: Some(prefix), legacy_latest: None, applied: 0, caught_up: false };
        if prefix.last_seq > 0 {
            // Cutover copies `/latest` into the prefix: without a `/latest` reaching it, this is no cutover.
            let latest = self.storage.read_legacy_latest().await?;
            report.legacy_latest = latest;
            if latest.is_none_or(|l| l < prefix.last_seq) {
                return Err(StandbyError::NotACutover { prefix, latest });
            }
            self.check_not_ahead(prefix)?;
            self.apply_legacy(applier, prefix.last_seq, budget).await?;
        } else {
            self.check_not_ahead(prefix)?;
        }
        self.seen_prefix = Some(prefix);
        report.caught_up = self.applied_seq == prefix.last_seq;
        Ok(report)
    }

    /// The regression guard against the last prefix seen.
    fn guard_prefix(&self, found: DurablePrefix) -> Result<(), StandbyError> {
        let Some(seen) = self.seen_prefix else { return Ok(()) };
        let regressed = found.batch_id < seen.batch_id
            || found.last_seq < seen.last_seq
            || (found.batch_id == seen.batch_id && found.last_seq != seen.last_seq)
            || (found.batch_id > seen.batch_id && found.last_seq == seen.last_seq);
        if regressed {
            return Err(StandbyError::PrefixRegressed { seen, found });
        }
        Ok(())
    }

    /// Fails when this reader's position is past `boundary` (a baseline ahead of the log, or a rewound log).
    fn check_not_ahead(&self, boundary: DurablePrefix) -> Result<(), StandbyError> {
        let ahead = self.applied_seq > boundary.last_seq
            || self.applied_batch > boundary.batch_id
            || (self.applied_batch == boundary.batch_id
                && boundary.batch_id > 0
                && self.applied_seq != boundary.last_seq);
        if ahead {
            return Err(StandbyError::AheadOfLog {
                applied: self.applied_seq,
                applied_batch: self.applied_batch,
                boundary,
            });
        }
        Ok(())
    }

    /// Applies legacy entries after the applied sequence up to `upto`, at most `budget` of them; each must be
    /// exactly the next sequence. Returns how many were applied. Stops short only when out of budget; a missing
    /// entry below `upto` is fatal.
    async fn apply_legacy(
        &mut self,
        applier: &mut dyn OpLogApplier,
        upto: u64,
        budget: usize,
    ) -> Result<usize, StandbyError> {
        let mut applied = 0;
        while self.applied_seq < upto && applied < budget {
            let page = self.storage.read_legacy_entries(self.applied_seq, upto, (budget - applied).min(256)).await?;
            if page.is_empty() {
                return Err(StandbyError::Incomplete { missing: self.applied_seq + 1, boundary: upto });
            }
            for (seq, entry) in page {
                self.apply_entry(applier, seq, &entry)?;
                applied += 1;
            }
        }
        Ok(applied)
    }

    /// Applies one batch's entries after the applied sequence, checking it continues what was applied.
    fn apply_batch(
        &mut self,
        applier: &mut dyn OpLogApplier,
        b: &OpLogBatchRecord,
        prefix: DurablePrefix,
    ) -> Result<(), StandbyError> {
        let next = self.applied_seq + 1;
        if self.baseline {
            // The first batch after a baseline may follow compacted batches and overlap the baseline, but must
            // not leave a hole after it.
            if b.first_seq > next {
                return Err(StandbyError::SeqGap { expected: next, found: b.first_seq });
            }
        } else {
            if b.batch_id != self.applied_batch + 1 {
                return Err(StandbyError::BatchGap { expected: self.applied_batch + 1, found: b.batch_id });
            }
            if b.first_seq != next {
                return Err(StandbyError::SeqGap { expected: next, found: b.first_seq });
            }
        }
        if b.last_seq > prefix.last_seq {
            return Err(StandbyError::BeyondPrefix { batch_id: b.batch_id, last_seq: b.last_seq, prefix });
        }
        for (seq, entry) in b.sequenced() {
            if seq <= self.applied_seq {
                // Held by the baseline already.
                continue;
            }
            self.apply_entry(applier, seq, entry)?;
        }
        self.applied_batch = b.batch_id;
        self.baseline = false;
        Ok(())
    }

    fn apply_entry(
        &mut self,
        applier: &mut dyn OpLogApplier,
        seq: u64,
        entry: &OpLogEntry,
    ) -> Result<(), StandbyError> {
        if seq != self.applied_seq + 1 {
            return Err(StandbyError::SeqGap { expected: self.applied_seq + 1, found: seq });
        }
        applier.apply(seq, entry)?;
        self.applied_seq = seq;
        Ok(())
    }
}

/// Follower settings (the reference's `HotStandbyService` defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerConfig {
    /// Pause between polls that succeeded (the first retry delay, too).
    pub poll_interval: Duration,
    /// Most batch records (or legacy entries) per poll.
    pub max_batches_per_poll: usize,
    /// Retry delays double from `poll_interval` up to `max(poll_interval, retry_max)`.
    pub retry_max: Duration,
    /// How long retryable errors may last without progress before the follower turns fatal.
    pub retry_window: Duration,
}

impl Default for FollowerConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            max_batches_per_poll: DEFAULT_MAX_BATCHES_PER_POLL,
            retry_max: Duration::from_secs(5),
            retry_window: Duration::from_secs(180),
        }
    }
}

/// What the follower is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowerState {
    /// Polling normally.
    Following,
    /// Retrying after retryable errors.
    Retrying {
        /// Failed polls in this window.
        attempts: u64,
        /// Time since the first failure of the window, at the last attempt.
        elapsed: Duration,
        /// The last error.
        last: StandbyError,
    },
    /// Failed closed (fatal error or retry window expired); the loop has ended.
    Failed(StandbyError),
    /// Stopped on request.
    Stopped,
}

/// The follower's published view: its state and the reader's position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowerStatus {
    /// Loop state.
    pub state: FollowerState,
    /// The reader's position.
    pub reader: StandbyStatus,
    /// Polls made (successful or not).
    pub polls: u64,
}

/// The replication loop around an [`OpLogStandbyReader`] (reference §6.3): poll, sleep `poll_interval` (not after
/// a full page that left more to read: that backlog is read at once); on a
/// retryable error back off (doubling, capped) and keep trying for at most `retry_window` without progress
/// (progress = entries applied; it resets the window); any fatal error ends the loop. Time is tokio's, so tests
/// drive it with a paused clock.
pub struct StandbyFollower<A: OpLogApplier> {
    reader: OpLogStandbyReader,
    applier: A,
    config: FollowerConfig,
    status: watch::Sender<FollowerStatus>,
}

impl<A: OpLogApplier> std::fmt::Debug for StandbyFollower<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandbyFollower").field("reader", &self.reader).field("config", &self.config).finish()
    }
}

/// How a follower's loop ended, with its parts handed back (e.g. for promotion's final catch-up).
#[derive(Debug)]
pub struct FollowerExit<A> {
    /// `Ok` when stopped on request; the fatal error otherwise.
    pub result: Result<(), StandbyError>,
    /// The reader (refuses polls if it failed closed).
    pub reader: OpLogStandbyReader,
    /// The applier.
    pub applier: A,
}

impl<A: OpLogApplier> StandbyFollower<A> {
    /// A follower of `reader` applying into `applier`.
    pub fn new(reader: OpLogStandbyReader, applier: A, config: FollowerConfig) -> Self {
        let status = FollowerStatus { state: FollowerState::Following, reader: reader.status(), polls: 0 };
        let (tx, _) = watch::channel(status);
        Self { reader, applier, config, status: tx }
    }

    /// A receiver of the follower's status, updated after every poll (tests and health await conditions on it).
    pub fn subscribe(&self) -> watch::Receiver<FollowerStatus> {
        self.status.subscribe()
    }

    fn publish(&self, state: FollowerState, polls: u64) {
        self.status.send_replace(FollowerStatus { state, reader: self.reader.status(), polls });
    }

    /// Runs until `stop` completes (`Ok`) or a fatal error (`Err`). A poll in progress when `stop` completes is
    /// abandoned at its next await (nothing is applied twice: a new follower resumes from the reader's position).
    pub async fn run(mut self, stop: impl Future<Output = ()>) -> FollowerExit<A> {
        tokio::pin!(stop);
        let result = tokio::select! {
            biased;
            _ = &mut stop => Ok(()),
            r = self.follow() => r,
        };
        if result.is_ok() {
            let polls = self.status.borrow().polls;
            self.publish(FollowerState::Stopped, polls);
        }
        FollowerExit { result, reader: self.reader, applier: self.applier }
    }

    async fn follow(&mut self) -> Result<(), StandbyError> {
        let cap = self.config.retry_max.max(self.config.poll_interval);
        let mut polls = 0u64;
        // (opened at, applied seq then, failed polls since).
        let mut window: Option<(tokio::time::Instant, u64, u64)> = None;
        let mut delay = self.config.poll_interval;
        loop {
            polls += 1;
            let outcome = self.reader.poll_once(&mut self.applier, self.config.max_batches_per_poll).await;
            match outcome {
                Ok(report) => {
                    window = None;
                    delay = self.config.poll_interval;
                    self.publish(FollowerState::Following, polls);
                    // A full page with more behind it: catch up at once instead of an interval per page.
                    if report.caught_up || report.applied == 0 {
                        tokio::time::sleep(self.config.poll_interval).await;
                    }
                }
                Err(e) if e.is_retryable() => {
                    let now = tokio::time::Instant::now();
                    let applied = self.reader.applied_seq();
                    // Progress since the window opened (a partial poll applied entries) resets it.
                    let (since, at, attempts) = match window {
                        Some((since, at, n)) if at == applied => (since, at, n + 1),
                        _ => (now, applied, 1),
                    };
                    window = Some((since, at, attempts));
                    let waited = now - since;
                    if waited >= self.config.retry_window {
                        tracing::error!(?waited, error = %e, "standby retry window expired");
                        let e = StandbyError::RetryWindowExpired {
                            waited,
                            window: self.config.retry_window,
                            last: Box::new(e),
                        };
                        self.publish(FollowerState::Failed(e.clone()), polls);
                        return Err(e);
                    }
                    tracing::warn!(attempts, ?delay, error = %e, "standby poll failed; retrying");
                    self.publish(FollowerState::Retrying { attempts, elapsed: waited, last: e }, polls);
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(cap);
                }
                Err(e) => {
                    self.publish(FollowerState::Failed(e.clone()), polls);
                    return Err(e);
                }
            }
        }
    }
}
