//! The seam between `MasterService` mutations and the ordered oplog writer.
//!
//! A service without an oplog holds no [`OpLog`] at all: every mutation checks one `OnceLock` and goes on as
//! before (no entry built, no lock taken). With one, a mutation takes a [`Slot`] before touching metadata and
//! commits its entry (built only then) inside the object's lock.

use super::payload::MasterEntry;
use crescent_ha::oplog::{DurableCallback, OrderedOpLogWriter, Reservation, WriterError, WriterStatus};
use crescent_proto::ErrorCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The wire code of a mutation refused because the oplog cannot take it: the mutation could not be made
/// durable, and nothing was changed (`PERSISTENT_FAIL`, the vocabulary's code for a failed persistence).
pub const OPLOG_REFUSED: ErrorCode = ErrorCode::PersistentFail;

/// Longest a mutation waits for admission while the writer's queue is full, before it is refused. A full
/// queue means the backend is a moment behind (64 Ki entries waiting is a fraction of a second of its
/// throughput): waiting turns a burst into back-pressure; a backend that stays behind longer is failing.
pub const ADMISSION_PATIENCE: Duration = Duration::from_millis(500);

/// The master's handle on its oplog writer.
pub struct OpLog {
    writer: OrderedOpLogWriter,
    /// Reservations refused (writer closed, full or terminal).
    admission_failures: AtomicU64,
    /// Commits refused after a reservation (0 unless the writer stopped for good).
    commit_failures: AtomicU64,
}

impl std::fmt::Debug for OpLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpLog").field("writer", &self.writer).finish_non_exhaustive()
    }
}

/// An admission slot: commit it with the mutation's entry, or drop it (abort: no sequence, no gap).
#[must_use = "commit the slot with the mutation's entry, or drop it to abort"]
pub struct Slot<'a> {
    log: &'a OpLog,
    reservation: Reservation,
}

impl Slot<'_> {
    /// Queues the entry (no I/O); `callback` runs once it is durable. Call it inside the lock that orders the
    /// mutation, right after making it. A refusal here (the writer stopped for good between reserve and commit:
    /// fenced or failed; entries are checked against the log's limits before anything changes, so an invalid
    /// one is a bug) is counted, logged and answered `PERSISTENT_FAIL`: the caller fails its request, since the
    /// log will never hold this change. The callback is dropped unrun then. Most callers commit before they change
    /// anything; a few (a write's End, tenant policy changes, a put preempting a stale write) change first, so a
    /// refusal leaves that change on this primary unacknowledged — reachable only with a writer stopped for good,
    /// whose term ends with it.
    pub fn commit(self, entry: MasterEntry, callback: Option<DurableCallback>) -> Result<u64, ErrorCode> {
        if matches!(entry, MasterEntry::Remove { .. } | MasterEntry::GroupRemove { .. }) {
            HID_OBJECTS.set(true);
        }
        self.log.writer.commit(self.reservation, entry.encode(), callback).map_err(|e| {
            let n = self.log.commit_failures.fetch_add(1, Ordering::Relaxed);
            if n.is_multiple_of(1024) {
                tracing::error!(error = %e, refused = n + 1, "oplog commit refused after reservation: the mutation is not logged");
            }
            OPLOG_REFUSED
        })
    }
}

thread_local! {
    /// Whether a mutation on this thread logged an object's removal since [`take_hid_objects`] last asked.
    static HID_OBJECTS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether a mutation on this thread logged an object's removal (REMOVE, GROUP_REMOVE) since the last call, and
/// forgets it. The RPC server asks around each request it answers on its own thread: a write that removed an
/// object along the way (an upsert onto a readable object, a put preempting a stale write) hands out or frees
/// that object's space, so its reply waits until the removal is durable, while a write of a new key (nothing
/// logged) is answered at once.
pub fn take_hid_objects() -> bool {
    HID_OBJECTS.replace(false)
}

// The vocabulary's limits fit the log's: a tenant, key or group name the service accepts is never refused by the
// log after the change it names was made (checked when the master compiles).
const _: () = {
    use crescent_ha::oplog::codec;
    assert!(crescent_proto::MAX_TENANT_LEN <= codec::MAX_TENANT_LEN);
    assert!(crescent_proto::MAX_KEY_LEN <= codec::MAX_ENTRY_KEY_LEN);
    assert!(crescent_proto::MAX_GROUP_LEN <= codec::MAX_ENTRY_KEY_LEN);
};

impl OpLog {
    /// A handle on a started (or to be started) writer.
    pub fn new(writer: OrderedOpLogWriter) -> Self {
        Self { writer, admission_failures: AtomicU64::new(0), commit_failures: AtomicU64::new(0) }
    }

    /// Takes a slot before a mutation. While admission is merely full (mutations outpace the backend for a
    /// moment, e.g. an eviction round's burst of entries), waits for room up to [`ADMISSION_PATIENCE`] where
    /// waiting is safe — off any runtime, or on a multi-threaded one as `block_in_place` — so a burst slows
    /// writers down instead of failing them; a single-threaded runtime (which runs the writer itself) does not
    /// wait. A closed or terminal writer fails at once with [`OPLOG_REFUSED`]. Take it with no lock held.
    pub fn reserve(&self) -> Result<Slot<'_>, ErrorCode> {
        match self.writer.reserve() {
            Err(WriterError::QueueFull(_)) => match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
                Err(_) => self.reserve_within(ADMISSION_PATIENCE),
                Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                    tokio::task::block_in_place(|| self.reserve_within(ADMISSION_PATIENCE))
                }
                Ok(_) => self.admit(self.writer.reserve()),
            },
            first => self.admit(first),
        }
    }

    /// [`OpLog::reserve`] without waiting: for callers holding a lock others need (a group's).
    pub fn try_reserve(&self) -> Result<Slot<'_>, ErrorCode> {
        self.admit(self.writer.reserve())
    }

    /// [`OpLog::reserve`] for bulk operations (remove-all, regex removal) run off the async workers: while
    /// admission is merely full (the writer is sealing), waits for room up to `patience` instead of failing
    /// every key past the admission limit (not on a current-thread runtime, which runs the writer itself). Closed
    /// or terminal writers still fail at once.
    pub fn reserve_within(&self, patience: Duration) -> Result<Slot<'_>, ErrorCode> {
        // On a current-thread runtime the writer runs on this very thread: waiting could only delay the refusal.
        let current_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        let patience = if current_thread { Duration::ZERO } else { patience };
        let start = std::time::Instant::now();
        let mut result = self.writer.reserve();
        while matches!(result, Err(WriterError::QueueFull(_))) && start.elapsed() < patience {
            std::thread::sleep(Duration::from_micros(200));
            result = self.writer.reserve();
        }
        self.admit(result)
    }

    /// A slot, or the refusal counted and logged.
    fn admit(&self, result: Result<Reservation, WriterError>) -> Result<Slot<'_>, ErrorCode> {
        match result {
            Ok(reservation) => Ok(Slot { log: self, reservation }),
            Err(e) => {
                let n = self.admission_failures.fetch_add(1, Ordering::Relaxed);
                // One line per 1024 refusals: a failing backend refuses every mutation.
                if n.is_multiple_of(1024) {
                    let why = match &e {
                        WriterError::QueueFull(_) => "admission full",
                        WriterError::Terminal(_) => "writer stopped for good",
                        _ => "writer not accepting (backend failing or stopping)",
                    };
                    tracing::warn!(error = %e, refused = n + 1, "mutation refused: oplog {why}");
                }
                Err(OPLOG_REFUSED)
            }
        }
    }

    /// The writer's state now.
    pub fn status(&self) -> WriterStatus {
        self.writer.status()
    }

    /// The writer's figures now (latencies, batch sizes, queues, refusals by cause).
    pub fn metrics(&self) -> crescent_ha::oplog::WriterMetrics {
        self.writer.metrics()
    }

    /// Reservations refused so far.
    pub fn admission_failures(&self) -> u64 {
        self.admission_failures.load(Ordering::Relaxed)
    }

    /// Commits refused after a reservation so far.
    pub fn commit_failures(&self) -> u64 {
        self.commit_failures.load(Ordering::Relaxed)
    }

    /// The last sequence committed (0: none): once it is durable, every mutation made so far is.
    pub fn last_committed(&self) -> u64 {
        self.writer.last_committed()
    }

    /// Waits until everything up to `seq` is durable; fails (the writer fenced, stopped, or `timeout` passed)
    /// when it may never be, so the mutations behind it must not be acknowledged.
    pub async fn wait_durable(&self, seq: u64, timeout: Duration) -> Result<(), WriterError> {
        self.writer.wait_durable(seq, timeout).await
    }

    /// Starts the writer's tasks on the current runtime.
    pub fn start(&self) {
        self.writer.start();
    }

    /// Closes admission and drains what was committed (see `OrderedOpLogWriter::stop`).
    pub async fn stop(&self) {
        self.writer.stop().await;
    }
}
