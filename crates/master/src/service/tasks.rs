//! Copy and move tasks (the original's `CreateCopyTask` / `CreateMoveTask` / `QueryTask`) and drain jobs, which
//! are move tasks for every replica on a set of segments.
//!
//! A task is queued for the storage node that holds its source replica (the master moves no bytes). When the
//! node's poll takes it, the master allocates the target ranges, under the object's lock, and hands the node the
//! source range and the targets; the ranges are held by the task, not by the object, until the node reports, so a
//! removal meanwhile never frees a range the node may still be writing, and readers never see a replica half
//! written. The node copies its own bytes to every target and reports their crc32c; the master then checks, under
//! the object's lock, that the object is the one the task copied (the source replica still there, the sum equal
//! to the object's), adds the targets as readable replicas — for a move, drops the source replica, whose space is
//! freed once the change is durable — and logs the object's new state inside the lock, as every mutation is.
//!
//! A task whose node does not report in time ends as failed, and its ranges go through the discard queue (freed
//! one more timeout later) rather than at once: the node never starts a copy after its deadline, and the wait
//! covers one still running then.
//!
//! A drain job marks its segments unallocatable, lists what they hold, and keeps at most `max_concurrency` move
//! tasks under way until nothing is left on them (a last scan catches writes that were in flight); the segments
//! then stay out of placement until their node unmounts them. A job's durable part (its segments, targets, status and
//! counts) is logged (DRAIN_SET) under the board's lock whenever it is created, scanned, ends or is cancelled, and its
//! counts at most once a step while moves end, so a restarted master or a new leader takes a running drain over: its
//! segments stay out of placement (held by the pool through a disconnection and a remount) and it scans them afresh
//! (the moves already made are in the log as the objects' new states); an ended job still answers its query. The last
//! [`crate::ha::replay::MAX_ENDED_DRAINS`] ended jobs are kept, by the board and by every replay alike. Copy and move
//! tasks themselves are not logged: a failover ends them (their caller asks again).
//!
//! Locks: the board's mutex is taken before the pool's (a drain's segments change status under it) and is
//! never held while an object's lock is taken. Object-side work (starting, ending a task) takes what it needs
//! from the board, drops the mutex, then locks the object.

use super::MasterService;
use crate::clock::Timestamp;
use crate::ha::replay::ended_drains_past_limit;
use crate::ha::{DrainRecord, MasterEntry, Slot};
use crate::metadata::{Lifecycle, ObjectEntry, Replica, TenantState, Tier};
use crate::placement::{PlacementRequest, ReplicaPlacement};
use crate::segment_pool::AllocatedBuffer;
use crescent_proto::{
    ClientId, DrainInfo, ErrorCode, JobStatus, ReplicaDescriptor, ReplicaStatus, ReplicaTask, ReplicaTaskResult,
    SegmentId, SegmentKind, SegmentStatus, TaskId, TaskInfo, TaskKind, TaskStatus,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Most tasks one poll hands a node.
const TASKS_PER_POLL: usize = 64;

/// The message of a task that did what it was asked (the original's words).
const SUCCESS_MESSAGE: &str = "Task completed successfully";

/// Times a drain retries a replica that found no room elsewhere before counting it failed.
const DRAIN_RETRIES: u32 = 3;

/// Counters of tasks and drains (on `/metrics`).
#[derive(Debug, Default)]
pub struct TaskMetrics {
    /// Tasks created (copy, move, a drain's moves).
    pub created: AtomicU64,
    /// Tasks that ended with their replicas in place.
    pub succeeded: AtomicU64,
    /// Tasks that ended without effect.
    pub failed: AtomicU64,
    /// Bytes copied by tasks that succeeded.
    pub copied_bytes: AtomicU64,
}

/// Where a task's new replicas go.
#[derive(Debug, Clone)]
enum Targets {
    /// Copy: every segment name listed (those already holding a replica are skipped).
    Named(Vec<String>),
    /// Move to one name.
    One(String),
    /// A drain's move: the first of these names with room, or (empty) wherever placement puts it; never a name
    /// that is being drained or already holds the object.
    Anywhere(Vec<String>),
}

/// A task the master has taken on.
struct Task {
    info: TaskInfo,
    tenant: Arc<TenantState>,
    entry: Arc<ObjectEntry>,
    /// The segment whose bytes are copied (one of its node's).
    source: SegmentId,
    targets: Targets,
    /// Move: drop the source replica when the copy is in.
    drop_source: bool,
    /// When the master gives up on it (pending: the pending timeout; processing: twice the task timeout).
    expires: Timestamp,
    /// Allocation failures so far (room elsewhere may come: retried).
    retries: u32,
    /// While processing: the target ranges, held by the task until it ends.
    run: Option<Run>,
    /// The drain job it belongs to.
    drain: Option<TaskId>,
}

/// A task handed to its node.
struct Run {
    /// The replica read (its id: a rewrite meanwhile replaces it, and the copy is then of old bytes).
    replica: u64,
    buffers: Vec<AllocatedBuffer>,
    /// The node's crc of a copy the master could not take in yet (the object was leased: the source of a move
    /// is dropped only when no reader holds it).
    reported: Option<u32>,
}

/// A replica a drain still has to move.
struct Unit {
    tenant: Weak<TenantState>,
    entry: Weak<ObjectEntry>,
    segment: SegmentId,
    tries: u32,
}

/// One drain job.
struct Drain {
    info: DrainInfo,
    segments: Vec<SegmentId>,
    targets: Vec<String>,
    max_concurrency: usize,
    queue: VecDeque<Unit>,
    active: HashSet<TaskId>,
    /// Scans run (a drain is done only when a scan after the first finds nothing).
    scans: u32,
    /// The record last logged (what a replay of the log holds for this job).
    logged: DrainRecord,
}

impl Drain {
    /// The job's durable part as it now stands.
    fn record(&self) -> DrainRecord {
        DrainRecord {
            id: *self.info.id.0.as_bytes(),
            order: self.logged.order,
            status: self.info.status as u8,
            created_at_ms: self.info.created_at_ms,
            updated_at_ms: self.info.updated_at_ms,
            segments: self.segments.iter().map(|s| *s.0.as_bytes()).collect(),
            names: self.info.segments.clone(),
            targets: self.targets.clone(),
            max_concurrency: u32::try_from(self.max_concurrency).unwrap_or(u32::MAX),
            succeeded: self.info.succeeded,
            failed: self.info.failed,
            migrated_bytes: self.info.migrated_bytes,
            message: self.info.message.clone(),
        }
    }

    /// Logs the job as it now stands into `slot` (none: the master keeps no log), as the board's change `order`
    /// ([`Board::next_order`]). Called under the board's lock right after the change, so the log holds the jobs'
    /// changes in the order they were made. A refusal (the writer stopped for good, its term with it) is returned
    /// for the caller to report.
    fn log(&mut self, slot: Option<Slot<'_>>, order: u64) -> Result<(), ErrorCode> {
        let record = DrainRecord { order, ..self.record() };
        if let Some(slot) = slot {
            slot.commit(MasterEntry::DrainSet(record.clone()), None)?;
        }
        self.logged = record;
        Ok(())
    }

    /// A job taken over from the log (a restart, a promotion): it scans its segments afresh.
    fn from_record(r: &DrainRecord) -> Option<Self> {
        let status = r.job_status().ok()?;
        let info = DrainInfo {
            id: r.job_id(),
            status,
            created_at_ms: r.created_at_ms,
            updated_at_ms: r.updated_at_ms,
            segments: r.names.clone(),
            succeeded: r.succeeded,
            failed: r.failed,
            blocked: 0,
            active: 0,
            remaining: 0,
            migrated_bytes: r.migrated_bytes,
            message: r.message.clone(),
        };
        Some(Drain {
            info,
            segments: r.segment_ids(),
            targets: r.targets.clone(),
            max_concurrency: r.max_concurrency.max(1) as usize,
            queue: VecDeque::new(),
            active: HashSet::new(),
            scans: 0,
            logged: r.clone(),
        })
    }
}

/// Logs a drain's change that its step could not log (the writer stopped for good: the term ends with it).
fn warn_unlogged(id: TaskId, result: Result<(), ErrorCode>) {
    if let Err(e) = result {
        tracing::warn!(job = %id, error = %e, "a drain's change is not logged");
    }
}

#[derive(Default)]
struct Board {
    tasks: HashMap<TaskId, Task>,
    /// Per node: its pending tasks in queue order, and what its poll waits on.
    mailboxes: HashMap<ClientId, (VecDeque<TaskId>, Arc<tokio::sync::Notify>)>,
    /// Ended tasks, oldest first (pruned past the retention).
    finished: VecDeque<TaskId>,
    pending: usize,
    drains: HashMap<TaskId, Drain>,
    /// Drain changes logged so far (see [`DrainRecord::order`]).
    drain_order: u64,
}

/// The master's copy/move tasks and drain jobs (see the module docs).
#[derive(Default)]
pub struct TaskBoard {
    board: Mutex<Board>,
    metrics: TaskMetrics,
}

impl std::fmt::Debug for TaskBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskBoard").finish_non_exhaustive()
    }
}

impl TaskBoard {
    /// The counters.
    pub fn metrics(&self) -> &TaskMetrics {
        &self.metrics
    }

    /// What a node's poll waits on.
    pub(crate) fn waiter(&self, node: ClientId) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.board.lock().mailboxes.entry(node).or_default().1)
    }

    /// Tasks not yet ended.
    pub fn in_flight(&self) -> usize {
        self.board.lock().tasks.values().filter(|t| !t.info.status.is_final()).count()
    }
}

/// Wall-clock Unix ms (what task and job times are in, as the original's).
fn unix_ms() -> u64 {
    crescent_net::grant::unix_ms()
}

impl Board {
    /// The order of the next drain change logged.
    fn next_order(&mut self) -> u64 {
        self.drain_order += 1;
        self.drain_order
    }

    /// Forgets the ended drain jobs past [`crate::ha::replay::MAX_ENDED_DRAINS`] (the same ones a replay of the
    /// log forgets).
    fn prune_drains(&mut self) {
        // By what was logged: the replay decides on the same figures.
        let jobs = self
            .drains
            .values()
            .map(|j| (j.info.id, j.logged.updated_at_ms, j.logged.job_status().is_ok_and(|s| s.is_final())));
        for id in ended_drains_past_limit(jobs) {
            self.drains.remove(&id);
        }
    }

    fn queue(&mut self, task: Task) {
        let (queue, notify) = self.mailboxes.entry(task.info.assigned_client).or_default();
        queue.push_back(task.info.id);
        // A permit is kept when no poll waits yet: the next one returns at once.
        notify.notify_one();
        self.pending += 1;
        self.tasks.insert(task.info.id, task);
    }

    /// Marks a task ended (its ranges, if any, handed back to the caller) and tells its drain.
    fn finish(&mut self, id: TaskId, status: TaskStatus, message: String, bytes: u64, keep: usize) -> Option<Run> {
        let task = self.tasks.get_mut(&id)?;
        if task.info.status.is_final() {
            return None;
        }
        if task.info.status == TaskStatus::Pending {
            self.pending = self.pending.saturating_sub(1);
        }
        task.info.status = status;
        task.info.message = message;
        task.info.updated_at_ms = unix_ms();
        let run = task.run.take();
        let drain = task.drain;
        let no_room = status == TaskStatus::Failed && task.info.message.starts_with("NO_AVAILABLE_HANDLE");
        let unit = (task.drain.is_some() && no_room).then(|| Unit {
            tenant: Arc::downgrade(&task.tenant),
            entry: Arc::downgrade(&task.entry),
            segment: task.source,
            tries: task.retries,
        });
        self.finished.push_back(id);
        while self.finished.len() > keep {
            if let Some(old) = self.finished.pop_front() {
                self.tasks.remove(&old);
            }
        }
        if let Some(job) = drain.and_then(|d| self.drains.get_mut(&d)) {
            job.active.remove(&id);
            if job.info.status.is_final() {
                // Counted no more once it ended (cancelled, failed): its counts are what it logged then.
                return run;
            }
            job.info.updated_at_ms = unix_ms();
            match (status, unit) {
                (TaskStatus::Success, _) => {
                    job.info.succeeded += 1;
                    job.info.migrated_bytes += bytes;
                }
                // `tries` counts this failure already (`start_task`).
                (_, Some(unit)) if unit.tries <= DRAIN_RETRIES => {
                    job.info.blocked += 1;
                    job.queue.push_back(unit);
                }
                _ => job.info.failed += 1,
            }
        }
        run
    }
}

/// A task's failure message: the code's name and why.
fn failure(code: ErrorCode, why: &str) -> String {
    format!("{code}: {why}")
}

impl MasterService {
    /// The task board (counters).
    pub fn tasks(&self) -> &TaskBoard {
        &self.tasks
    }

    fn task_timeout(&self) -> Duration {
        Duration::from_millis(self.config.replica_task_timeout_ms.max(1))
    }

    /// The object `key` of `tenant`, active, for a task.
    fn task_object(&self, tenant: &str, key: &str) -> Result<(Arc<TenantState>, Arc<ObjectEntry>), ErrorCode> {
        let t = self.read_tenant(tenant)?.ok_or(ErrorCode::ObjectNotFound)?;
        let e = t.objects().get(key).ok_or(ErrorCode::ObjectNotFound)?;
        if e.lock().lifecycle() != Lifecycle::Active {
            return Err(ErrorCode::ObjectNotFound);
        }
        Ok((t, e))
    }

    /// A target name for a copy or a move: mounted (`INVALID_PARAMS` otherwise, as the original) and taking
    /// placements (`UNAVAILABLE_IN_CURRENT_STATUS`).
    fn check_target(&self, name: &str) -> Result<(), ErrorCode> {
        let ids = self.pool.segments_named(name);
        if ids.is_empty() {
            return Err(ErrorCode::InvalidParams);
        }
        if !ids.iter().any(|id| self.pool.is_allocatable(*id)) {
            return Err(ErrorCode::UnavailableInCurrentStatus);
        }
        Ok(())
    }

    /// Queues a task; `TASK_PENDING_LIMIT_EXCEEDED` when the queue is full.
    #[allow(clippy::too_many_arguments)]
    fn submit_task(
        &self,
        kind: TaskKind,
        tenant: Arc<TenantState>,
        entry: Arc<ObjectEntry>,
        source: SegmentId,
        targets: Targets,
        drain: Option<TaskId>,
    ) -> Result<TaskId, ErrorCode> {
        let node = self.pool.owner(source).ok_or(ErrorCode::InternalError)?;
        let now_ms = unix_ms();
        let id = TaskId::random();
        let pending_for = match self.config.pending_task_timeout_ms {
            0 => Duration::from_secs(365 * 24 * 3600),
            ms => Duration::from_millis(ms),
        };
        let task = Task {
            info: TaskInfo {
                id,
                kind,
                status: TaskStatus::Pending,
                created_at_ms: now_ms,
                updated_at_ms: now_ms,
                assigned_client: node,
                message: String::new(),
            },
            tenant,
            entry,
            source,
            targets,
            drop_source: kind == TaskKind::Move,
            expires: self.clock.now().saturating_add(pending_for),
            retries: 0,
            run: None,
            drain,
        };
        let mut board = self.tasks.board.lock();
        if drain.is_none() && board.pending >= self.config.max_pending_tasks {
            return Err(ErrorCode::TaskPendingLimitExceeded);
        }
        board.queue(task);
        self.tasks.metrics.created.fetch_add(1, Ordering::Relaxed);
        Ok(id)
    }

    /// CreateCopyTask: a copy of the object to every segment named in `targets`, made by the node holding one
    /// of its readable memory replicas. `INVALID_PARAMS` for no target or an unknown one,
    /// `UNAVAILABLE_IN_CURRENT_STATUS` for one that takes no placements, `OBJECT_NOT_FOUND` for no such object.
    pub fn create_copy_task(&self, tenant: &str, key: &str, targets: &[String]) -> Result<TaskId, ErrorCode> {
        if targets.is_empty() {
            return Err(ErrorCode::InvalidParams);
        }
        let (t, e) = self.task_object(tenant, key)?;
        for name in targets {
            self.check_target(name)?;
        }
        let sources: Vec<SegmentId> = {
            let st = e.lock();
            st.replicas
                .iter()
                .filter(|r| r.is_memory() && r.is_readable())
                .filter_map(|r| r.buffer.segment_id())
                .collect()
        };
        if sources.is_empty() {
            // Being written, or only on a disk tier.
            return Err(ErrorCode::ReplicaIsNotReady);
        }
        let source = sources[fastrand::usize(..sources.len())];
        self.submit_task(TaskKind::Copy, t, e, source, Targets::Named(targets.to_vec()), None)
    }

    /// CreateMoveTask: the object's replica on segment `source` moved to segment `target`, by `source`'s node.
    /// `INVALID_PARAMS` when they are the same, `target` is unknown, or the object has no readable replica on
    /// `source`; `OBJECT_NOT_FOUND` for no such object.
    pub fn create_move_task(&self, tenant: &str, key: &str, source: &str, target: &str) -> Result<TaskId, ErrorCode> {
        let (t, e) = self.task_object(tenant, key)?;
        if source == target {
            return Err(ErrorCode::InvalidParams);
        }
        self.check_target(target)?;
        let from = {
            let st = e.lock();
            st.replicas.iter().find_map(|r| {
                let region = r.buffer.region()?;
                (r.is_memory() && r.is_readable() && &**region.name() == source).then(|| region.segment_id())
            })
        };
        let from = from.ok_or(ErrorCode::InvalidParams)?;
        self.submit_task(TaskKind::Move, t, e, from, Targets::One(target.to_owned()), None)
    }

    /// QueryTask.
    pub fn query_task(&self, id: TaskId) -> Result<TaskInfo, ErrorCode> {
        self.tasks.board.lock().tasks.get(&id).map(|t| t.info.clone()).ok_or(ErrorCode::TaskNotFound)
    }

    /// A node's task poll (`MasterRequest::ReplicaTasks`): takes in the outcomes it reports, then starts and
    /// hands it its queued tasks (the RPC server waits for some when there are none).
    pub fn replica_tasks(&self, node: ClientId, done: &[ReplicaTaskResult]) -> Vec<ReplicaTask> {
        for r in done {
            self.end_replica_task(node, r.id, r.outcome);
        }
        self.take_replica_tasks(node)
    }

    /// Starts and hands out `node`'s queued tasks (at most 64 at a time).
    pub fn take_replica_tasks(&self, node: ClientId) -> Vec<ReplicaTask> {
        let ids: Vec<TaskId> = {
            let mut board = self.tasks.board.lock();
            let Some((queue, _)) = board.mailboxes.get_mut(&node) else { return Vec::new() };
            let n = queue.len().min(TASKS_PER_POLL);
            queue.drain(..n).collect()
        };
        ids.into_iter().filter_map(|id| self.start_task(id)).collect()
    }

    /// Starts one task: allocates its targets under the object's lock; `None` if it ended instead.
    fn start_task(&self, id: TaskId) -> Option<ReplicaTask> {
        let (entry, source, targets) = {
            let board = self.tasks.board.lock();
            let t = board.tasks.get(&id).filter(|t| t.info.status == TaskStatus::Pending)?;
            (Arc::clone(&t.entry), t.source, t.targets.clone())
        };
        let ttl = self.task_timeout();
        let started = {
            let st = entry.lock();
            self.allocate_targets(&st, source, &targets)
        };
        match started {
            Err((code, why)) => {
                let retry = code == ErrorCode::NoAvailableHandle;
                let mut board = self.tasks.board.lock();
                let keep = self.config.max_finished_tasks;
                let requeue = retry
                    && board.tasks.get_mut(&id).is_some_and(|t| {
                        t.retries += 1;
                        t.drain.is_none() && t.retries <= self.config.task_retry_attempts
                    });
                if requeue {
                    // Room may come (eviction, a node joining): the task waits in its queue for the next poll.
                    let node = board.tasks.get(&id).map(|t| t.info.assigned_client);
                    if let Some((queue, _)) = node.and_then(|n| board.mailboxes.get_mut(&n)) {
                        queue.push_back(id);
                    }
                    return None;
                }
                let msg =
                    if retry { format!("{} (max retries reached)", failure(code, &why)) } else { failure(code, &why) };
                board.finish(id, TaskStatus::Failed, msg, 0, keep);
                drop(board);
                self.tasks.metrics.failed.fetch_add(1, Ordering::Relaxed);
                self.ended(id);
                None
            }
            Ok((replica, src_offset, length, buffers)) => {
                let life = self.handout_life(super::Handout::Write).max(ttl.saturating_mul(3));
                let descriptors: Vec<ReplicaDescriptor> = buffers
                    .iter()
                    .filter_map(|b| {
                        b.hold_for(life);
                        Some(ReplicaDescriptor {
                            id: self.next_replica_id(),
                            location: b.location()?,
                            status: ReplicaStatus::Processing,
                            grant: None,
                        })
                    })
                    .collect();
                let wire = ReplicaTask {
                    id,
                    src: source,
                    src_offset,
                    length,
                    targets: descriptors,
                    deadline_unix_ms: unix_ms().saturating_add(ttl.as_millis() as u64),
                };
                let mut board = self.tasks.board.lock();
                let t = board.tasks.get_mut(&id)?;
                t.info.status = TaskStatus::Processing;
                t.info.updated_at_ms = unix_ms();
                t.expires = self.clock.now().saturating_add(ttl.saturating_mul(2));
                t.run = Some(Run { replica, buffers, reported: None });
                board.pending = board.pending.saturating_sub(1);
                Some(wire)
            }
        }
    }

    /// The source replica (id, offset, size) and the target ranges of a task, under the object's lock.
    #[allow(clippy::type_complexity)]
    fn allocate_targets(
        &self,
        st: &crate::metadata::ObjectState,
        source: SegmentId,
        targets: &Targets,
    ) -> Result<(u64, u64, u64, Vec<AllocatedBuffer>), (ErrorCode, String)> {
        if st.lifecycle() != Lifecycle::Active {
            return Err((ErrorCode::ObjectNotFound, "the object was removed".into()));
        }
        if st.pending().is_some() {
            return Err((ErrorCode::ReplicaIsNotReady, "the object is being rewritten".into()));
        }
        let src = st
            .replicas
            .iter()
            .find(|r| r.is_memory() && r.is_readable() && r.buffer.segment_id() == Some(source))
            .ok_or((ErrorCode::ReplicaNotFound, "the source replica is gone".to_owned()))?;
        let holds = |name: &str| {
            st.replicas.iter().any(|r| r.is_valid() && r.buffer.region().is_some_and(|g| &**g.name() == name))
        };
        let size = st.size;
        let no_room = |name: &str| (ErrorCode::NoAvailableHandle, format!("no room for {size} bytes on {name:?}"));
        let placement = ReplicaPlacement::new(&self.pool, &self.placement);
        let on = |name: &str| placement.allocate_from(SegmentKind::Memory, name, size).map_err(|_| no_room(name));
        let mut buffers = Vec::new();
        match targets {
            Targets::Named(names) => {
                for name in names.iter().filter(|n| !holds(n)) {
                    buffers.push(on(name)?);
                }
            }
            Targets::One(name) if holds(name) => {}
            Targets::One(name) => {
                buffers.push(on(name)?);
            }
            Targets::Anywhere(names) => {
                let held: Vec<String> =
                    st.replicas.iter().filter_map(|r| r.buffer.region().map(|g| g.name().to_string())).collect();
                let listed = names.iter().filter(|n| !held.contains(n)).find_map(|n| on(n).ok());
                let b = match listed {
                    Some(b) => b,
                    None if !names.is_empty() => return Err(no_room("the drain's targets")),
                    None => {
                        let req = PlacementRequest { excluded: &held, ..PlacementRequest::memory(size, 1) };
                        let placed = placement.place(&req).map_err(|_| no_room("any other segment"))?;
                        placed.into_iter().next().ok_or_else(|| no_room("any other segment"))?
                    }
                };
                buffers.push(b);
            }
        }
        Ok((src.id, src.buffer.offset(), size, buffers))
    }

    /// Ends a task its node reported (only the node it was given to may end it).
    fn end_replica_task(&self, node: ClientId, id: TaskId, outcome: Result<u32, ErrorCode>) {
        {
            let mut board = self.tasks.board.lock();
            let Some(t) = board.tasks.get_mut(&id) else { return };
            if t.info.assigned_client != node || t.info.status != TaskStatus::Processing {
                return;
            }
            match outcome {
                Ok(crc) => {
                    if let Some(run) = t.run.as_mut() {
                        run.reported = Some(crc);
                    }
                }
                Err(code) => {
                    let keep = self.config.max_finished_tasks;
                    let run = board.finish(id, TaskStatus::Failed, failure(code, "the copy failed"), 0, keep);
                    drop(board);
                    // The node is done with the ranges: they go at once (freed with the board's lock released).
                    if let Some(run) = run {
                        run.buffers.iter().for_each(AllocatedBuffer::end_hold);
                    }
                    self.tasks.metrics.failed.fetch_add(1, Ordering::Relaxed);
                    self.ended(id);
                    return;
                }
            }
        }
        self.complete_task(id);
    }

    /// Takes a reported copy in, under the object's lock (see the module docs); a move whose object is leased
    /// waits for the next step.
    fn complete_task(&self, id: TaskId) {
        let (tenant, entry, drop_source, run) = {
            let mut board = self.tasks.board.lock();
            let Some(t) = board.tasks.get_mut(&id) else { return };
            let Some(run) = t.run.take() else { return };
            (Arc::clone(&t.tenant), Arc::clone(&t.entry), t.drop_source, run)
        };
        let Some(crc) = run.reported else {
            self.restore_run(id, run);
            return;
        };
        let slot = match self.reserve_oplog() {
            Ok(slot) => slot,
            Err(code) => return self.fail_task(id, failure(code, "the log took no more entries"), Vec::new()),
        };
        let now = self.clock.now();
        let mut st = entry.lock();
        let source = st.replicas.iter().position(|r| r.id == run.replica && r.is_readable());
        let why = if st.lifecycle() != Lifecycle::Active {
            Some((ErrorCode::ObjectNotFound, "the object was removed while it was copied"))
        } else if source.is_none() || st.pending().is_some() {
            Some((ErrorCode::ReplicaNotFound, "the object changed while it was copied"))
        } else if st.flags.has_checksum() && st.checksum != crc {
            Some((ErrorCode::ChecksumMismatch, "the bytes copied do not match the object's checksum"))
        } else if run.buffers.iter().any(|b| !b.is_live()) {
            Some((ErrorCode::SegmentNotFound, "a target segment left the cluster while it was copied to"))
        } else {
            None
        };
        if let Some((code, why)) = why {
            drop(st);
            drop(slot);
            return self.fail_task(id, failure(code, why), run.buffers);
        }
        if drop_source && st.leased(now) {
            // A reader may be reading the source: the move ends when its lease does.
            drop(st);
            drop(slot);
            return self.restore_run(id, Run { reported: Some(crc), ..run });
        }
        let added = run.buffers.len() as u64;
        let size = st.size;
        if !drop_source && added > 0 && tenant.quota().try_charge(size * added).is_err() {
            drop(st);
            drop(slot);
            let why = failure(ErrorCode::TenantQuotaExceeded, "the tenant's quota has no room for the copies");
            return self.fail_task(id, why, run.buffers);
        }
        let writer = source.and_then(|i| st.replicas.get(i)).map_or(crate::metadata::writers::UNKNOWN, |r| r.writer);
        for buffer in run.buffers {
            buffer.end_hold();
            let mut r = Replica::processing(self.next_replica_id(), buffer);
            r.status = ReplicaStatus::Complete;
            r.writer = writer;
            st.replicas.push(r);
        }
        if !drop_source {
            st.charge_copies(u16::try_from(added).unwrap_or(u16::MAX));
        }
        let mut freed = crate::metadata::ReplicaList::new();
        if drop_source && let Some(i) = source {
            freed.push(st.replicas.remove(i));
        }
        let quota = TenantState::resettle_unreleased(&mut st);
        let free = crate::eviction::DeferredFree::new(freed, Arc::clone(&tenant), quota);
        // Logged inside the object's lock; a dropped source's space is freed once the entry is durable.
        // A refusal (the writer stopped for good, its term ending with it) leaves the change on this primary
        // unacknowledged and the source's space out of reuse (the callback never runs); the task says so.
        // Reported as the object now stands (its replicas where the copy or move put them).
        let report = self.report_state(&tenant, &entry, &st, crate::events::RemoveCause::Removed);
        let (logged, free_now) = match slot {
            Some(slot) => {
                let post = super::ha::post_state_entry(&tenant, &entry, &st, now);
                let release: crescent_ha::oplog::DurableCallback = Box::new(move |_seq| free.release());
                (slot.commit(post, report.on_durable(Some(release))), None)
            }
            None => {
                report.send();
                (Ok(0), Some(free))
            }
        };
        drop(st);
        if let Some(free) = free_now {
            free.release();
        }
        let keep = self.config.max_finished_tasks;
        if let Err(code) = logged {
            tracing::warn!(%code, key = entry.key(), "a task's outcome was not logged");
            drop(self.tasks.board.lock().finish(id, TaskStatus::Failed, failure(code, "the log refused it"), 0, keep));
            self.tasks.metrics.failed.fetch_add(1, Ordering::Relaxed);
            return self.ended(id);
        }
        let bytes = size * added.max(u64::from(drop_source));
        drop(self.tasks.board.lock().finish(id, TaskStatus::Success, SUCCESS_MESSAGE.into(), bytes, keep));
        self.tasks.metrics.succeeded.fetch_add(1, Ordering::Relaxed);
        self.tasks.metrics.copied_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.ended(id);
    }

    /// After a task ended: its drain (if any) starts its next move at once rather than at the next step.
    fn ended(&self, id: TaskId) {
        let drain = self.tasks.board.lock().tasks.get(&id).and_then(|t| t.drain);
        if let Some(job) = drain {
            self.drain_dispatch(job);
        }
    }

    /// Puts a run back on its task (to be taken in later).
    fn restore_run(&self, id: TaskId, run: Run) {
        let mut board = self.tasks.board.lock();
        match board.tasks.get_mut(&id) {
            Some(t) if !t.info.status.is_final() => t.run = Some(run),
            _ => {}
        }
    }

    /// Ends a task as failed; `buffers` (ranges its node is done with) are freed at once.
    fn fail_task(&self, id: TaskId, message: String, buffers: Vec<AllocatedBuffer>) {
        let keep = self.config.max_finished_tasks;
        drop(self.tasks.board.lock().finish(id, TaskStatus::Failed, message, 0, keep));
        // No transfer to them is coming: reusable at once.
        buffers.iter().for_each(AllocatedBuffer::end_hold);
        drop(buffers);
        self.tasks.metrics.failed.fetch_add(1, Ordering::Relaxed);
        self.ended(id);
    }

    /// Ends the tasks of `segment`'s node that read from it, as failed (it left the pool), their ranges through
    /// the discard queue.
    pub(super) fn end_tasks_on(&self, segment: SegmentId) {
        let ids: Vec<TaskId> = {
            let board = self.tasks.board.lock();
            board
                .tasks
                .values()
                .filter(|t| t.source == segment && !t.info.status.is_final())
                .map(|t| t.info.id)
                .collect()
        };
        for id in ids {
            self.expire_task(id, failure(ErrorCode::SegmentNotFound, "the source segment left the cluster"));
        }
    }

    /// Ends a task its node may still be working on: its ranges wait in the discard queue one more timeout.
    fn expire_task(&self, id: TaskId, message: String) {
        let keep = self.config.max_finished_tasks;
        let run = self.tasks.board.lock().finish(id, TaskStatus::Failed, message, 0, keep);
        self.tasks.metrics.failed.fetch_add(1, Ordering::Relaxed);
        if let Some(run) = run {
            let release_at = self.clock.now().saturating_add(self.task_timeout());
            self.discards.push(release_at, 0, run.buffers);
        }
    }

    /// Timeouts, moves waiting for a lease, and drains: the background loop runs this every second. Returns
    /// how many tasks ended.
    pub fn step_replica_tasks(&self) -> usize {
        let now = self.clock.now();
        let (expired, waiting): (Vec<(TaskId, bool)>, Vec<TaskId>) = {
            let board = self.tasks.board.lock();
            let expired = board
                .tasks
                .values()
                .filter(|t| !t.info.status.is_final() && t.expires <= now)
                .map(|t| (t.info.id, t.info.status == TaskStatus::Pending))
                .collect();
            let waiting = board
                .tasks
                .values()
                .filter(|t| t.run.as_ref().is_some_and(|r| r.reported.is_some()))
                .map(|t| t.info.id)
                .collect();
            (expired, waiting)
        };
        let n = expired.len();
        for (id, pending) in expired {
            let why = if pending { "its node did not take it in time" } else { "its node did not report in time" };
            self.expire_task(id, failure(ErrorCode::TransferFail, why));
            // A pending task is also in its node's queue: taken later, it is found ended and skipped.
        }
        for id in waiting {
            self.complete_task(id);
        }
        self.step_drains();
        n
    }

    // ---- drains ----

    /// CreateDrain (admin): see `MasterRequest::CreateDrain`. `INVALID_PARAMS` for no segment or a concurrency
    /// of 0, `SEGMENT_NOT_FOUND` for a name no memory segment carries, `UNAVAILABLE_IN_CURRENT_STATUS` for a
    /// segment that is leaving. Asked again for the same segments while their job runs, it answers that job.
    pub fn create_drain(
        &self,
        names: &[String],
        targets: &[String],
        max_concurrency: u32,
    ) -> Result<TaskId, ErrorCode> {
        self.start_drain(names, targets, max_concurrency, true)
    }

    /// [`Self::create_drain`] as the original's `POST /api/v1/drain_jobs`: segments a running job drains are
    /// refused (`UNAVAILABLE_IN_CURRENT_STATUS`) rather than followed.
    pub fn create_drain_exclusive(
        &self,
        names: &[String],
        targets: &[String],
        max_concurrency: u32,
    ) -> Result<TaskId, ErrorCode> {
        self.start_drain(names, targets, max_concurrency, false)
    }

    fn start_drain(
        &self,
        names: &[String],
        targets: &[String],
        max_concurrency: u32,
        follow: bool,
    ) -> Result<TaskId, ErrorCode> {
        if names.is_empty() || max_concurrency == 0 {
            return Err(ErrorCode::InvalidParams);
        }
        let mut segments = Vec::new();
        for name in names {
            let ids: Vec<SegmentId> = self
                .pool
                .segments_named(name)
                .into_iter()
                .filter(|id| self.pool.segment(*id).is_some_and(|s| s.spec.kind == SegmentKind::Memory))
                .collect();
            if ids.is_empty() {
                return Err(ErrorCode::SegmentNotFound);
            }
            segments.extend(ids);
        }
        segments.sort();
        segments.dedup();
        for name in targets {
            if names.contains(name) {
                return Err(ErrorCode::InvalidParams);
            }
            self.check_target(name)?;
        }
        // Taken before the board's lock (it may wait for the writer); dropped unused when nothing changes.
        let slot = self.reserve_oplog()?;
        let mut board = self.tasks.board.lock();
        // The same segments already draining: that job (a second `crescent drain` follows it).
        if let Some(job) = board.drains.values().find(|j| !j.info.status.is_final() && j.segments == segments)
            && follow
        {
            return Ok(job.info.id);
        }
        if board.drains.values().any(|j| !j.info.status.is_final() && j.segments.iter().any(|s| segments.contains(s))) {
            return Err(ErrorCode::UnavailableInCurrentStatus);
        }
        for id in &segments {
            match self.pool.segment(*id).map(|s| s.status) {
                Some(SegmentStatus::Ok | SegmentStatus::Draining | SegmentStatus::Drained) => {}
                _ => return Err(ErrorCode::UnavailableInCurrentStatus),
            }
        }
        let id = TaskId::random();
        let now = unix_ms();
        let mut names: Vec<String> = names.to_vec();
        names.dedup();
        let mut job = Drain {
            info: DrainInfo {
                id,
                status: JobStatus::Created,
                created_at_ms: now,
                updated_at_ms: now,
                segments: names,
                succeeded: 0,
                failed: 0,
                blocked: 0,
                active: 0,
                remaining: 0,
                migrated_bytes: 0,
                message: String::new(),
            },
            segments,
            targets: targets.to_vec(),
            max_concurrency: max_concurrency as usize,
            queue: VecDeque::new(),
            active: HashSet::new(),
            scans: 0,
            logged: DrainRecord::default(),
        };
        // Out of placement first, undone (to what each was) if a segment refuses (it began leaving meanwhile) or
        // the log does.
        let mut held = Vec::with_capacity(job.segments.len());
        let mut outcome = Ok(());
        for s in &job.segments {
            let was = self.pool.segment(*s).map_or(SegmentStatus::Ok, |i| i.status);
            match self.pool.set_status(*s, SegmentStatus::Draining) {
                Ok(()) => held.push((*s, was)),
                Err(e) => {
                    outcome = Err(e.code());
                    break;
                }
            }
        }
        if outcome.is_ok() {
            outcome = job.log(slot, board.next_order());
        }
        if let Err(e) = outcome {
            for (s, was) in held {
                let _ = self.pool.set_status(s, was);
            }
            return Err(e);
        }
        board.drains.insert(id, job);
        tracing::info!(job = %id, "drain started");
        Ok(id)
    }

    /// A drain job's progress.
    pub fn query_drain(&self, id: TaskId) -> Result<DrainInfo, ErrorCode> {
        let board = self.tasks.board.lock();
        let job = board.drains.get(&id).ok_or(ErrorCode::JobNotFound)?;
        let mut info = job.info.clone();
        info.active = job.active.len() as u64;
        info.remaining = (job.queue.len() + job.active.len()) as u64;
        Ok(info)
    }

    /// Cancels a drain job: no new moves; its segments take placements again (also after it succeeded: its
    /// segments back in service).
    pub fn cancel_drain(&self, id: TaskId) -> Result<DrainInfo, ErrorCode> {
        self.stop_drain(id, true)
    }

    /// [`Self::cancel_drain`] as the original's `POST /api/v1/drain_jobs/cancel`: a job that ended is refused
    /// (`UNAVAILABLE_IN_CURRENT_STATUS`).
    pub fn cancel_running_drain(&self, id: TaskId) -> Result<DrainInfo, ErrorCode> {
        self.stop_drain(id, false)
    }

    fn stop_drain(&self, id: TaskId, ended_too: bool) -> Result<DrainInfo, ErrorCode> {
        let slot = self.reserve_oplog()?;
        let mut board = self.tasks.board.lock();
        let order = board.next_order();
        let job = board.drains.get_mut(&id).ok_or(ErrorCode::JobNotFound)?;
        if job.info.status.is_final() && !ended_too {
            return Err(ErrorCode::UnavailableInCurrentStatus);
        }
        if !job.info.status.is_final() || job.info.status == JobStatus::Succeeded {
            let before = job.info.clone();
            job.info.status = JobStatus::Canceled;
            job.info.message = "cancelled: the segments take placements again".into();
            job.info.updated_at_ms = unix_ms();
            if let Err(e) = job.log(slot, order) {
                // Not in the log: not cancelled (the caller is told).
                job.info = before;
                return Err(e);
            }
        }
        job.queue.clear();
        let mut info = job.info.clone();
        (info.active, info.remaining) = (job.active.len() as u64, job.active.len() as u64);
        // Under the board's lock, as the job's change: a drain started next on these segments holds them after.
        self.release_segments(&job.segments);
        board.prune_drains();
        Ok(info)
    }

    /// Puts a drain's segments back in service (a segment that left meanwhile has no status to restore). Called
    /// under the board's lock.
    fn release_segments(&self, segments: &[SegmentId]) {
        for s in segments {
            let _ = self.pool.set_status(*s, SegmentStatus::Ok);
        }
    }

    /// Takes over the drain jobs of a replayed log (before the master serves): running ones hold their
    /// segments out of placement (they come back disconnected; their remount keeps them out) and scan them
    /// afresh at their next step; ended ones answer their queries.
    pub(crate) fn restore_drains(&self, drains: &BTreeMap<TaskId, DrainRecord>) {
        let mut board = self.tasks.board.lock();
        // In the order they were logged, so a segment ends as the last job that named it left it, as on the leader: a
        // running job's draining, a finished one's drained (until its node unmounts it), a failed or cancelled
        // one's in service.
        let mut records: Vec<&DrainRecord> = drains.values().collect();
        records.sort_by_key(|r| r.order);
        for r in records {
            // Counted on from the highest restored.
            board.drain_order = board.drain_order.max(r.order);
            let Some(mut job) = Drain::from_record(r) else { continue };
            let status = match job.info.status {
                JobStatus::Succeeded => SegmentStatus::Drained,
                JobStatus::Failed | JobStatus::Canceled => SegmentStatus::Ok,
                _ => {
                    job.info.message = "taken over after a restart or a failover: scanning its segments again".into();
                    SegmentStatus::Draining
                }
            };
            for s in &job.segments {
                // A segment not replayed is gone: a running job's next step says so.
                let _ = self.pool.set_status(*s, status);
            }
            board.drains.insert(job.info.id, job);
        }
    }

    /// Every drain job as the log last recorded it (what a replay holds).
    pub(crate) fn drain_records(&self) -> BTreeMap<TaskId, DrainRecord> {
        let board = self.tasks.board.lock();
        board.drains.iter().map(|(id, j)| (*id, j.logged.clone())).collect()
    }

    /// One step of every running drain: keep its segments out of placement, wait while its node is unreachable,
    /// scan what is left when idle, keep its moves going, end it when a scan finds nothing. Every change of a
    /// job's status, and each scan's counts, is logged.
    fn step_drains(&self) {
        let jobs: Vec<(TaskId, Vec<SegmentId>, bool)> = {
            let board = self.tasks.board.lock();
            board
                .drains
                .values()
                .filter(|j| !j.info.status.is_final())
                .map(|j| (j.info.id, j.segments.clone(), j.queue.is_empty() && j.active.is_empty()))
                .collect()
        };
        for (id, segments, idle) in jobs {
            let statuses: Vec<Option<SegmentStatus>> =
                segments.iter().map(|s| self.pool.segment(*s).map(|i| i.status)).collect();
            let lost = statuses.iter().filter(|s| s.is_none()).count();
            if lost > 0 {
                // A log that takes nothing now: tried again at the next step.
                let Ok(slot) = self.reserve_oplog() else { continue };
                let mut board = self.tasks.board.lock();
                let order = board.next_order();
                if let Some(job) = board.drains.get_mut(&id).filter(|j| !j.info.status.is_final()) {
                    let left = job.queue.len() as u64;
                    job.info.failed += left;
                    job.queue.clear();
                    job.info.status = JobStatus::Failed;
                    job.info.updated_at_ms = unix_ms();
                    job.info.message = format!(
                        "{lost} of its segments left the cluster (their node stopped?) before the drain ended: the \
                         replicas not yet moved went with them"
                    );
                    tracing::warn!(job = %id, "{}", job.info.message);
                    warn_unlogged(id, job.log(slot, order));
                    // As the original: a failed drain's segments (those still here) take placements again.
                    self.release_segments(&segments);
                    board.prune_drains();
                }
                continue;
            }
            let unreachable =
                statuses.iter().any(|s| matches!(s, Some(SegmentStatus::Suspect | SegmentStatus::Disconnected)));
            {
                let mut board = self.tasks.board.lock();
                let Some(job) = board.drains.get_mut(&id).filter(|j| !j.info.status.is_final()) else { continue };
                // Held out of placement by the pool; a segment found in service anyway is taken out again (under
                // the board's lock: a cancel meanwhile would find it held by no job).
                for (s, st) in segments.iter().zip(&statuses) {
                    if *st == Some(SegmentStatus::Ok) {
                        let _ = self.pool.set_status(*s, SegmentStatus::Draining);
                    }
                }
                if unreachable {
                    // Its replicas cannot be read now; the node may come back (or its segments be dropped: above).
                    job.info.message = "waiting: a drained node is unreachable".into();
                    continue;
                }
            }
            if idle {
                let units = self.drain_scan(&segments);
                // Taken after the scan (a slot held through a long scan would hold up the writer's stop).
                let Ok(slot) = self.reserve_oplog() else { continue };
                let mut board = self.tasks.board.lock();
                let order = board.next_order();
                let Some(job) = board.drains.get_mut(&id) else { continue };
                if job.info.status.is_final() {
                    // Cancelled while it scanned.
                    continue;
                }
                job.scans += 1;
                job.info.updated_at_ms = unix_ms();
                // The first scan lists the work; a later one that finds nothing proves it done (writes that were
                // in flight when the drain began land before it).
                if units.is_empty() && job.scans > 1 {
                    job.info.status = JobStatus::Succeeded;
                    job.info.message = "nothing is left on the segments: their node may stop".into();
                    warn_unlogged(id, job.log(slot, order));
                    for s in &segments {
                        let _ = self.pool.set_status(*s, SegmentStatus::Drained);
                    }
                    board.prune_drains();
                    tracing::info!(job = %id, "drain done");
                    continue;
                }
                if job.scans > 1 + DRAIN_RETRIES {
                    job.info.status = JobStatus::Failed;
                    job.info.message = format!(
                        "{} replicas could not be moved after {DRAIN_RETRIES} rounds and stay on the segments",
                        units.len()
                    );
                    warn_unlogged(id, job.log(slot, order));
                    // As the original: a failed drain's segments take placements again.
                    self.release_segments(&segments);
                    board.prune_drains();
                    continue;
                }
                job.info.status = JobStatus::Running;
                job.info.message.clear();
                job.queue = units.into();
                warn_unlogged(id, job.log(slot, order));
            }
            self.drain_dispatch(id);
            self.log_drain_progress(id);
        }
    }

    /// Logs a running job's counts when moves ended since they were last logged (once a step at most: a job
    /// taken over counts from there).
    fn log_drain_progress(&self, id: TaskId) {
        let moved = |j: &Drain| {
            !j.info.status.is_final()
                && (j.info.succeeded, j.info.failed, j.info.migrated_bytes)
                    != (j.logged.succeeded, j.logged.failed, j.logged.migrated_bytes)
        };
        if !self.tasks.board.lock().drains.get(&id).is_some_and(moved) {
            return;
        }
        let Ok(slot) = self.reserve_oplog() else { return };
        let mut board = self.tasks.board.lock();
        let order = board.next_order();
        if let Some(job) = board.drains.get_mut(&id).filter(|j| moved(j)) {
            warn_unlogged(id, job.log(slot, order));
        }
    }

    /// Complete memory replicas on `segments`, as units to move.
    fn drain_scan(&self, segments: &[SegmentId]) -> Vec<Unit> {
        let mut units = Vec::new();
        for tenant in self.tenants.all() {
            tenant.objects().visit_chunks(self.config.census_chunk, |chunk| {
                for entry in chunk {
                    let st = entry.lock();
                    if st.lifecycle() != Lifecycle::Active {
                        continue;
                    }
                    for r in
                        st.replicas.iter().filter(|r| r.tier == Tier::Memory && r.status == ReplicaStatus::Complete)
                    {
                        if let Some(seg) = r.buffer.segment_id().filter(|s| segments.contains(s)) {
                            units.push(Unit {
                                tenant: Arc::downgrade(&tenant),
                                entry: Arc::downgrade(&entry),
                                segment: seg,
                                tries: 0,
                            });
                        }
                    }
                }
            });
        }
        units
    }

    /// Starts moves of a drain's queued units while it has room for more.
    fn drain_dispatch(&self, id: TaskId) {
        loop {
            let (unit, targets) = {
                let mut board = self.tasks.board.lock();
                let Some(job) = board.drains.get_mut(&id) else { return };
                if job.info.status != JobStatus::Running || job.active.len() >= job.max_concurrency {
                    return;
                }
                let Some(unit) = job.queue.pop_front() else { return };
                if unit.tries > 0 {
                    job.info.blocked = job.info.blocked.saturating_sub(1);
                }
                (unit, job.targets.clone())
            };
            let (Some(tenant), Some(entry)) = (unit.tenant.upgrade(), unit.entry.upgrade()) else { continue };
            // Gone from the segment meanwhile (removed, evicted): nothing to move.
            let there = {
                let st = entry.lock();
                st.lifecycle() == Lifecycle::Active
                    && st
                        .replicas
                        .iter()
                        .any(|r| r.status == ReplicaStatus::Complete && r.buffer.segment_id() == Some(unit.segment))
            };
            if !there {
                continue;
            }
            let submitted =
                self.submit_task(TaskKind::Move, tenant, entry, unit.segment, Targets::Anywhere(targets), Some(id));
            let mut board = self.tasks.board.lock();
            match submitted {
                Ok(task) => {
                    if let Some(t) = board.tasks.get_mut(&task) {
                        t.retries = unit.tries;
                    }
                    if let Some(job) = board.drains.get_mut(&id) {
                        job.active.insert(task);
                    }
                }
                Err(_) => {
                    if let Some(job) = board.drains.get_mut(&id) {
                        job.info.failed += 1;
                    }
                }
            }
        }
    }
}
