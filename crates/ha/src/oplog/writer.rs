//! `OrderedOpLogWriter`: the primary's only oplog admission point (RFC §7–§12). `reserve` before a mutation (a
//! bounded slot, no sequence), `commit` inside the mutation's lock (assigns the next sequence, queues the entry,
//! no I/O), `abort` otherwise (no gap). One writer task seals whatever is committed whenever no batch is in
//! flight (work-conserving, no timer), keeps exactly one batch in flight, retries it forever on backend failure
//! with admission closed (fail closed; later batches never pass it), and hands durable callbacks, in sequence
//! order, to a separate callback task only after the durable prefix has advanced past them.
//! [`WriterMode::LegacyPerEntry`] keeps all of that and only changes what a write is: one txn per entry under the
//! legacy layout (`/oplog/<cluster>/<seq>` plus `/latest`). [`OrderedOpLogWriter::metrics`] gives its figures.

use super::codec::{DurablePrefix, OpLogBatchRecord, OpLogEntry, RECORD_OVERHEAD_BOUND};
use super::metrics::{
    AdmissionFailures, BATCH_BYTES_BOUNDS, BATCH_ENTRIES_BOUNDS, Histogram, LatencyWindow, WriterMetrics,
};
use super::storage::{BatchLimits, OpLogBatchStorage, StorageError};
use crate::kv::KvError;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Runs once its entry is durable, with the entry's sequence number, on the writer's callback task. Keep it
/// short: callbacks run one after another in sequence order. One that panics is logged and counted
/// ([`WriterMetrics::callback_panics`]); the callbacks after it still run.
pub type DurableCallback = Box<dyn FnOnce(u64) + Send + 'static>;

/// Why the writer refused a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriterError {
    /// Admission is closed: the backend is failing (the writer is retrying), or the writer is stopping.
    #[error("the oplog writer is not accepting (backend failing or stopped)")]
    Unavailable,
    /// As many entries as allowed are already reserved or waiting to be sealed.
    #[error("oplog admission is full ({0} entries reserved or waiting)")]
    QueueFull(usize),
    /// The entry breaks a limit (it could never be written).
    #[error("invalid oplog entry: {0}")]
    InvalidEntry(String),
    /// The reservation was taken from another writer.
    #[error("the reservation belongs to another writer")]
    ForeignReservation,
    /// The writer stopped for good (fenced by a newer producer, or a non-retryable backend error).
    #[error("the oplog writer stopped for good: {0}")]
    Terminal(StorageError),
}

/// How the writer stores what it seals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WriterMode {
    /// One batch record and the durable prefix per txn (RFC §10).
    #[default]
    Batch,
    /// The legacy layout (RFC §4): each entry its own key plus `/latest`, one txn per entry compared on the
    /// expected `/latest`. Same admission, sealing, retry and callbacks as [`WriterMode::Batch`]: the honest
    /// per-entry baseline for benchmarks, and the writer that produces a legacy log to cut over from. Start it
    /// from [`OpLogBatchStorage::init_legacy`]; it refuses to write once the namespace is cut over.
    LegacyPerEntry,
}

/// Writer settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterConfig {
    /// Most entries reserved or committed-but-unsealed at once (the RFC's `oplog_batch_max_entries`): an
    /// admission limit, not a flush threshold.
    pub max_waiting_entries: usize,
    /// First retry delay after a backend failure.
    pub retry_initial: Duration,
    /// Retry delays double up to this.
    pub retry_max: Duration,
    /// The storage layout written.
    pub mode: WriterMode,
}

impl Default for WriterConfig {
    fn default() -> Self {
        Self {
            max_waiting_entries: super::storage::DEFAULT_MAX_BATCH_ENTRIES,
            retry_initial: Duration::from_millis(1),
            retry_max: Duration::from_secs(1),
            mode: WriterMode::Batch,
        }
    }
}

/// A point-in-time view of the writer, for health and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterStatus {
    /// New reservations are admitted.
    pub accepting: bool,
    /// The durable prefix as this writer last advanced it.
    pub durable: DurablePrefix,
    /// The next sequence number `commit` will assign.
    pub next_seq: u64,
    /// Reserved plus committed-but-unsealed entries.
    pub waiting: usize,
    /// A batch is in flight.
    pub in_flight: bool,
    /// Failed write attempts so far.
    pub failed_attempts: u64,
    /// The last backend error (cleared on success).
    pub last_error: Option<StorageError>,
    /// Set once the writer stopped for good.
    pub terminal: Option<StorageError>,
}

struct Pending {
    entry: OpLogEntry,
    callback: Option<DurableCallback>,
    committed_at: Instant,
}

/// Durable batches whose callbacks may wait for the callback task at once. Past this the writer waits before
/// writing more (a stalled callback turns into back-pressure on admission, not an unbounded queue).
pub const CALLBACK_QUEUE_BATCHES: usize = 64;

/// Counters and distributions behind [`OrderedOpLogWriter::metrics`] (updated under the state lock).
struct Stats {
    durable_writes: u64,
    durable_entries: u64,
    batch_entries: Histogram,
    batch_bytes: Histogram,
    commit_to_durable: LatencyWindow,
    callback_latency: LatencyWindow,
    /// Durable entries whose callbacks were handed to the callback task and have not run yet.
    callback_queue: usize,
    /// Callbacks that panicked.
    callback_panics: u64,
    admission: AdmissionFailures,
}

impl Stats {
    fn new() -> Self {
        Self {
            durable_writes: 0,
            durable_entries: 0,
            batch_entries: Histogram::new(&BATCH_ENTRIES_BOUNDS),
            batch_bytes: Histogram::new(&BATCH_BYTES_BOUNDS),
            commit_to_durable: LatencyWindow::default(),
            callback_latency: LatencyWindow::default(),
            callback_queue: 0,
            callback_panics: 0,
            admission: AdmissionFailures::default(),
        }
    }
}

struct State {
    accepting: bool,
    stopping: bool,
    /// `stop` has returned: nothing more becomes durable.
    ended: bool,
    terminal: Option<StorageError>,
    last_error: Option<StorageError>,
    failed_attempts: u64,
    /// Reservations plus committed entries not sealed yet.
    waiting: usize,
    /// Reservations neither committed nor aborted: a stop drains them (their mutations are under way and
    /// cannot be undone, so their entries must still be taken).
    reserved: usize,
    next_seq: u64,
    committed: VecDeque<Pending>,
    in_flight: bool,
    /// Entries of the batch in flight not durable yet, their commit times, and when it was sealed.
    in_flight_commits: VecDeque<Instant>,
    in_flight_since: Option<Instant>,
    /// First failure of the batch in flight, while it keeps failing.
    stuck_since: Option<Instant>,
    /// Since when admission has been closed by a failing backend, a terminal error or a stop (`None` while it
    /// is open).
    closed_since: Option<Instant>,
    durable: DurablePrefix,
    stats: Stats,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the writer task: a commit or stop happened.
    wake: Notify,
    /// Interrupts a retry back-off on stop.
    stop: Notify,
    /// Wakes [`OrderedOpLogWriter::wait_durable`] callers: the prefix advanced, or the writer ended.
    durable_changed: Notify,
    storage: OpLogBatchStorage,
    limits: BatchLimits,
    view: u64,
    config: WriterConfig,
}

/// An admission slot from [`OrderedOpLogWriter::reserve`]; dropping it unused is an abort.
pub struct Reservation {
    owner: Option<Arc<Shared>>,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation").field("live", &self.owner.is_some()).finish()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(shared) = self.owner.take() {
            let stopping = {
                let mut s = shared.state.lock();
                s.waiting = s.waiting.saturating_sub(1);
                s.reserved = s.reserved.saturating_sub(1);
                s.stopping
            };
            // A stop waits for every reservation to be committed or aborted.
            if stopping {
                shared.wake.notify_one();
            }
        }
    }
}

/// The ordered batch writer of one producer view.
pub struct OrderedOpLogWriter {
    shared: Arc<Shared>,
    tasks: Mutex<Option<(JoinHandle<()>, JoinHandle<()>)>>,
}

impl std::fmt::Debug for OrderedOpLogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrderedOpLogWriter").field("status", &self.status()).finish()
    }
}

fn retryable(e: &StorageError) -> bool {
    // Backend trouble may pass (etcd back, space freed, load gone); fencing, conflicts and bad data never do.
    matches!(e, StorageError::Kv(k) if !matches!(k, KvError::Rejected(_) | KvError::Unsupported))
}

impl OrderedOpLogWriter {
    /// A writer that continues `initial` (the prefix `init_durable_prefix` returned) under producer `view`
    /// (already claimed). Admission is open at once; nothing is written before [`Self::start`].
    pub fn new(storage: OpLogBatchStorage, view: u64, initial: DurablePrefix, config: WriterConfig) -> Self {
        let config = WriterConfig { max_waiting_entries: config.max_waiting_entries.max(1), ..config };
        let next_seq = initial.last_seq.checked_add(1);
        let state = State {
            // A prefix at the end of the sequence space can never be continued.
            accepting: next_seq.is_some() && initial.batch_id < u64::MAX,
            stopping: false,
            ended: false,
            reserved: 0,
            terminal: None,
            last_error: None,
            failed_attempts: 0,
            waiting: 0,
            next_seq: next_seq.unwrap_or(u64::MAX),
            committed: VecDeque::new(),
            in_flight: false,
            in_flight_commits: VecDeque::new(),
            in_flight_since: None,
            stuck_since: None,
            closed_since: next_seq.is_none().then(Instant::now),
            durable: initial,
            stats: Stats::new(),
        };
        let limits = storage.batch_limits();
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake: Notify::new(),
            stop: Notify::new(),
            durable_changed: Notify::new(),
            storage,
            limits,
            view,
            config,
        });
        Self { shared, tasks: Mutex::new(None) }
    }

    /// Starts the writer and callback tasks on the current tokio runtime (a second call does nothing).
    pub fn start(&self) {
        let mut tasks = self.tasks.lock();
        if tasks.is_some() {
            return;
        }
        let (tx, rx) = mpsc::channel(CALLBACK_QUEUE_BATCHES);
        let writer = tokio::spawn(write_loop(Arc::clone(&self.shared), tx));
        let callbacks = tokio::spawn(callback_loop(Arc::clone(&self.shared), rx));
        *tasks = Some((writer, callbacks));
    }

    /// Takes an admission slot before a mutation. Fails fast: closed admission, a full queue, or a terminal writer.
    pub fn reserve(&self) -> Result<Reservation, WriterError> {
        let mut s = self.shared.state.lock();
        if let Some(t) = &s.terminal {
            let e = WriterError::Terminal(t.clone());
            s.stats.admission.terminal += 1;
            return Err(e);
        }
        if !s.accepting || s.stopping {
            s.stats.admission.unavailable += 1;
            return Err(WriterError::Unavailable);
        }
        if s.waiting >= self.shared.config.max_waiting_entries {
            s.stats.admission.queue_full += 1;
            return Err(WriterError::QueueFull(s.waiting));
        }
        s.waiting += 1;
        s.reserved += 1;
        Ok(Reservation { owner: Some(Arc::clone(&self.shared)) })
    }

    /// Consumes a reservation: assigns the next sequence number to `entry`, queues it with `callback`, and wakes
    /// the writer. No I/O, no waiting. Works while admission is closed for retries or a stop (the slot was
    /// taken before).
    pub fn commit(
        &self,
        mut reservation: Reservation,
        entry: OpLogEntry,
        callback: Option<DurableCallback>,
    ) -> Result<u64, WriterError> {
        match &reservation.owner {
            Some(owner) if Arc::ptr_eq(owner, &self.shared) => {}
            // Dropping it releases the slot on its own writer.
            _ => return Err(WriterError::ForeignReservation),
        }
        let invalid = |e: WriterError| {
            self.shared.state.lock().stats.admission.invalid_entry += 1;
            e
        };
        entry.validate().map_err(|e| invalid(WriterError::InvalidEntry(e.to_string())))?;
        if !self.shared.limits.fits(1, entry.encoded_len_bound()) {
            return Err(invalid(WriterError::InvalidEntry(format!(
                "entry of up to {} bytes cannot fit a batch of {} bytes",
                entry.encoded_len_bound() + RECORD_OVERHEAD_BOUND,
                self.shared.limits.max_bytes
            ))));
        }
        // From here the slot is this function's: it either becomes a committed entry or is released below.
        reservation.owner = None;
        let seq = {
            let mut s = self.shared.state.lock();
            s.reserved = s.reserved.saturating_sub(1);
            // A stopping writer still takes the entries of slots it admitted (stop waits for them).
            let refused = match &s.terminal {
                Some(t) => Some(WriterError::Terminal(t.clone())),
                None if s.next_seq == u64::MAX => Some(WriterError::Unavailable),
                None => None,
            };
            if let Some(e) = refused {
                s.waiting = s.waiting.saturating_sub(1);
                match e {
                    WriterError::Terminal(_) => s.stats.admission.terminal += 1,
                    _ => s.stats.admission.unavailable += 1,
                }
                return Err(e);
            }
            let seq = s.next_seq;
            s.next_seq += 1;
            s.committed.push_back(Pending { entry, callback, committed_at: Instant::now() });
            seq
        };
        self.shared.wake.notify_one();
        Ok(seq)
    }

    /// The last sequence number assigned (0: none yet): once it is durable, every mutation made so far is.
    pub fn last_committed(&self) -> u64 {
        self.shared.state.lock().next_seq.saturating_sub(1)
    }

    /// Waits until every entry up to `seq` is durable. Fails when the writer stopped for good (fenced by a newer
    /// producer, or a fatal backend error), stopped with `seq` not durable, or `timeout` passed first: the caller
    /// must then not report those entries' mutations as done.
    pub async fn wait_durable(&self, seq: u64, timeout: Duration) -> Result<(), WriterError> {
        let deadline = Instant::now() + timeout;
        loop {
            let changed = self.shared.durable_changed.notified();
            tokio::pin!(changed);
            // Registered before the state is read, so an advance in between is not missed.
            changed.as_mut().enable();
            {
                let s = self.shared.state.lock();
                if s.durable.last_seq >= seq {
                    return Ok(());
                }
                if let Some(t) = &s.terminal {
                    return Err(WriterError::Terminal(t.clone()));
                }
                if s.ended {
                    return Err(WriterError::Unavailable);
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(WriterError::Unavailable);
            }
        }
    }

    /// Releases a reservation without a sequence number (same as dropping it).
    pub fn abort(&self, reservation: Reservation) {
        drop(reservation);
    }

    /// True while new reservations are admitted.
    pub fn is_accepting(&self) -> bool {
        let s = self.shared.state.lock();
        s.accepting && !s.stopping && s.terminal.is_none()
    }

    /// The writer's state now.
    pub fn status(&self) -> WriterStatus {
        let s = self.shared.state.lock();
        WriterStatus {
            accepting: s.accepting && !s.stopping && s.terminal.is_none(),
            durable: s.durable,
            next_seq: s.next_seq,
            waiting: s.waiting,
            in_flight: s.in_flight,
            failed_attempts: s.failed_attempts,
            last_error: s.last_error.clone(),
            terminal: s.terminal.clone(),
        }
    }

    /// The writer's figures now, for `/metrics` and `/health` (RFC Phase 5).
    pub fn metrics(&self) -> WriterMetrics {
        let now = Instant::now();
        let s = self.shared.state.lock();
        WriterMetrics {
            accepting: s.accepting && !s.stopping && s.terminal.is_none(),
            terminal: s.terminal.is_some(),
            durable: s.durable,
            durable_writes: s.stats.durable_writes,
            durable_entries: s.stats.durable_entries,
            batch_entries: s.stats.batch_entries.clone(),
            batch_bytes: s.stats.batch_bytes.clone(),
            commit_to_durable: s.stats.commit_to_durable.summary(),
            callback_latency: s.stats.callback_latency.summary(),
            retries: s.failed_attempts,
            in_flight_age: s.in_flight_since.map(|t| now - t),
            stuck_for: s.stuck_since.map(|t| now - t),
            closed_for: s.closed_since.map(|t| now - t),
            callback_panics: s.stats.callback_panics,
            committed_not_durable: s.committed.len() + s.in_flight_commits.len(),
            callback_queue: s.stats.callback_queue,
            admission_failures: s.stats.admission,
        }
    }

    /// Closes admission, waits for the slots already admitted to be committed or aborted, writes what was
    /// committed (unless the backend keeps failing: a retry back-off is cut short and the writer exits), runs
    /// the callbacks of everything that became durable, and returns.
    pub async fn stop(&self) {
        {
            let mut s = self.shared.state.lock();
            s.stopping = true;
            s.closed_since.get_or_insert_with(Instant::now);
        }
        self.shared.wake.notify_one();
        self.shared.stop.notify_waiters();
        let tasks = self.tasks.lock().take();
        if let Some((writer, callbacks)) = tasks {
            if let Err(e) = writer.await {
                tracing::error!(error = %e, "oplog writer task failed");
            }
            if let Err(e) = callbacks.await {
                tracing::error!(error = %e, "oplog callback task failed");
            }
        }
        self.shared.state.lock().ended = true;
        self.shared.durable_changed.notify_waiters();
    }
}

impl Drop for OrderedOpLogWriter {
    fn drop(&mut self) {
        // Without `stop`, the tasks would keep the shared state alive; end them.
        if let Some((writer, callbacks)) = self.tasks.lock().take() {
            writer.abort();
            callbacks.abort();
        }
    }
}

type Dispatch = Vec<(u64, DurableCallback)>;
/// Callbacks made runnable together, and when they became durable.
type CallbackBatch = (Instant, Dispatch);

/// Seals the committed entries that fit one batch; `None` when nothing to seal or a batch is in flight.
fn seal(shared: &Shared, s: &mut State) -> Option<Result<(OpLogBatchRecord, DurablePrefix, Dispatch), StorageError>> {
    if s.in_flight || s.committed.is_empty() {
        return None;
    }
    let mut n = 0;
    let mut bytes = 0usize;
    for p in &s.committed {
        let b = bytes.saturating_add(p.entry.encoded_len_bound());
        if n > 0 && !shared.limits.fits(n + 1, b) {
            break;
        }
        n += 1;
        bytes = b;
    }
    let expected = s.durable;
    let (batch_id, first_seq) = match (expected.batch_id.checked_add(1), expected.last_seq.checked_add(1)) {
        (Some(b), Some(f)) => (b, f),
        _ => return Some(Err(StorageError::InvalidBatch("the sequence space is exhausted".into()))),
    };
    let mut entries = Vec::with_capacity(n);
    let mut dispatch = Vec::new();
    let mut commits = VecDeque::with_capacity(n);
    for (seq, p) in (first_seq..).zip(s.committed.drain(..n)) {
        entries.push(p.entry);
        commits.push_back(p.committed_at);
        if let Some(cb) = p.callback {
            dispatch.push((seq, cb));
        }
    }
    s.waiting = s.waiting.saturating_sub(n);
    s.in_flight = true;
    s.in_flight_commits = commits;
    s.in_flight_since = Some(Instant::now());
    Some(
        OpLogBatchRecord::new(batch_id, first_seq, entries)
            .map(|b| (b, expected, dispatch))
            .map_err(|e| StorageError::InvalidBatch(e.to_string())),
    )
}

fn enter_terminal(shared: &Shared, e: StorageError) {
    tracing::error!(error = %e, "oplog writer stopped for good");
    {
        let mut s = shared.state.lock();
        s.accepting = false;
        s.closed_since.get_or_insert_with(Instant::now);
        s.terminal = Some(e);
    }
    shared.durable_changed.notify_waiters();
}

async fn write_loop(shared: Arc<Shared>, callbacks: mpsc::Sender<CallbackBatch>) {
    loop {
        let woken = shared.wake.notified();
        tokio::pin!(woken);
        // Register before looking at the state so a commit in between is not missed.
        woken.as_mut().enable();
        let sealed = {
            let mut s = shared.state.lock();
            if s.terminal.is_some() {
                return;
            }
            match seal(&shared, &mut s) {
                None if s.stopping && s.reserved == 0 => return,
                other => other,
            }
        };
        match sealed {
            None => woken.await,
            Some(Err(e)) => return enter_terminal(&shared, e),
            Some(Ok((batch, expected, dispatch))) => {
                let durable = match shared.config.mode {
                    WriterMode::Batch => write_one(&shared, &batch, expected, dispatch).await,
                    WriterMode::LegacyPerEntry => write_legacy(&shared, &batch, expected, dispatch, &callbacks).await,
                };
                let Some(dispatch) = durable else { return };
                // Ordered: batches are written one at a time and their callbacks queued in that order.
                send_callbacks(&shared, &callbacks, dispatch).await;
            }
        }
    }
}

/// Writes one sealed batch until it is durable (its callbacks are returned) or the writer must stop (`None`:
/// terminal or stopping).
async fn write_one(
    shared: &Shared,
    batch: &OpLogBatchRecord,
    expected: DurablePrefix,
    dispatch: Dispatch,
) -> Option<Dispatch> {
    let attempt = || shared.storage.write_batch(batch, expected, shared.view);
    let prefix = retry_until_durable(shared, batch.batch_id, attempt).await?;
    let bytes = batch.entries.iter().map(OpLogEntry::encoded_len_bound).sum::<usize>() + RECORD_OVERHEAD_BOUND;
    mark_durable(shared, prefix, batch.entries.len(), bytes, true);
    Some(dispatch)
}

/// Hands durable callbacks to the callback task (counted until they run), waiting while it is
/// [`CALLBACK_QUEUE_BATCHES`] batches behind.
async fn send_callbacks(shared: &Shared, callbacks: &mpsc::Sender<CallbackBatch>, dispatch: Dispatch) {
    if dispatch.is_empty() {
        return;
    }
    let n = dispatch.len();
    shared.state.lock().stats.callback_queue += n;
    if callbacks.send((Instant::now(), dispatch)).await.is_err() {
        shared.state.lock().stats.callback_queue -= n;
        tracing::warn!("oplog callback task is gone; durable callbacks dropped");
    }
}

/// Records a durable write of the next `entries` in-flight entries (`bytes` encoded, at most) advancing the
/// prefix to `prefix` (and, when `done`, that no batch is in flight), reopening admission.
fn mark_durable(shared: &Shared, prefix: DurablePrefix, entries: usize, bytes: usize, done: bool) {
    let now = Instant::now();
    let mut s = shared.state.lock();
    if s.last_error.is_some() {
        tracing::info!(durable = ?prefix, "oplog backend recovered; admission reopened");
    }
    s.durable = prefix;
    s.last_error = None;
    s.stuck_since = None;
    s.accepting = true;
    if !s.stopping {
        s.closed_since = None;
    }
    for _ in 0..entries {
        if let Some(at) = s.in_flight_commits.pop_front() {
            s.stats.commit_to_durable.record(now - at);
        }
    }
    s.stats.durable_writes += 1;
    s.stats.durable_entries += entries as u64;
    s.stats.batch_entries.record(entries as u64);
    s.stats.batch_bytes.record(bytes as u64);
    if done {
        s.in_flight = false;
        s.in_flight_since = None;
        s.in_flight_commits.clear();
    }
    drop(s);
    shared.durable_changed.notify_waiters();
}

/// Legacy mode: writes a sealed batch's entries one txn each, in order; each entry's callback is queued as soon
/// as its own txn is durable. Returns the (empty) rest, or `None` when the writer must stop.
async fn write_legacy(
    shared: &Shared,
    batch: &OpLogBatchRecord,
    expected: DurablePrefix,
    dispatch: Dispatch,
    callbacks: &mpsc::Sender<CallbackBatch>,
) -> Option<Dispatch> {
    let mut dispatch: VecDeque<(u64, DurableCallback)> = dispatch.into();
    let mut latest = expected.last_seq;
    for (seq, entry) in batch.sequenced() {
        let attempt = || async move {
            shared
                .storage
                .write_legacy_entry(seq, entry, latest, shared.view)
                .await
                .map(|l| DurablePrefix { batch_id: expected.batch_id, last_seq: l })
        };
        let prefix = retry_until_durable(shared, seq, attempt).await?;
        latest = prefix.last_seq;
        mark_durable(shared, prefix, 1, entry.encoded_len_bound() + RECORD_OVERHEAD_BOUND, seq == batch.last_seq);
        let mut ready = Vec::new();
        while dispatch.front().is_some_and(|(s, _)| *s <= seq) {
            ready.extend(dispatch.pop_front());
        }
        send_callbacks(shared, callbacks, ready).await;
    }
    Some(dispatch.into())
}

/// Runs `attempt` until it succeeds (admission reopened, the new prefix returned) or the writer must stop
/// (`None`): retryable errors close admission and back off; anything else is terminal.
async fn retry_until_durable<F, Fut>(shared: &Shared, batch: u64, attempt: F) -> Option<DurablePrefix>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<DurablePrefix, StorageError>>,
{
    let mut delay = shared.config.retry_initial;
    loop {
        match attempt().await {
            Ok(prefix) => {
                return Some(prefix);
            }
            Err(e) if retryable(&e) => {
                let stopping = {
                    let mut s = shared.state.lock();
                    if s.last_error.is_none() {
                        if matches!(e, StorageError::Kv(KvError::Exhausted(_))) {
                            tracing::error!(
                                error = %e,
                                batch,
                                "oplog backend out of space or overloaded; admission closed, retrying (a full \
                                 etcd needs compaction, defragmentation and its NOSPACE alarm disarmed)"
                            );
                        } else {
                            tracing::warn!(error = %e, batch, "oplog write failed; admission closed, retrying");
                        }
                    }
                    s.accepting = false;
                    s.failed_attempts += 1;
                    s.stuck_since.get_or_insert_with(Instant::now);
                    s.closed_since.get_or_insert_with(Instant::now);
                    s.last_error = Some(e);
                    s.stopping
                };
                if stopping {
                    return None;
                }
                let stop = shared.stop.notified();
                tokio::pin!(stop);
                stop.as_mut().enable();
                // Re-check after registering: a stop between the two would otherwise be missed.
                if shared.state.lock().stopping {
                    return None;
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop => return None,
                }
                delay = (delay * 2).min(shared.config.retry_max);
            }
            Err(e) => {
                enter_terminal(shared, e);
                return None;
            }
        }
    }
}

async fn callback_loop(shared: Arc<Shared>, mut rx: mpsc::Receiver<CallbackBatch>) {
    while let Some((durable_at, batch)) = rx.recv().await {
        for (seq, cb) in batch {
            shared.state.lock().stats.callback_latency.record(durable_at.elapsed());
            // No lock while the callback runs: it may take its own locks or call back into the writer. A panic
            // is caught so the callbacks after it (space freed once durable, replies released) still run.
            let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| cb(seq))).is_err();
            if panicked {
                tracing::error!(seq, "an oplog durable callback panicked; the next ones still run");
            }
            let mut s = shared.state.lock();
            s.stats.callback_queue = s.stats.callback_queue.saturating_sub(1);
            s.stats.callback_panics += u64::from(panicked);
        }
    }
}
