//! The disk tier, master side: memory evictions kept on the disk of the node that held them (offloads), the
//! copy tasks those are for each node, the disk's own eviction (oldest first), the ranges a node could not read,
//! and each disk's counters.
//!
//! The master owns every disk's address space, as it owns memory's: a node mounts its disk as a `Disk` segment,
//! the master allocates each offloaded object's range there (whole 4 KiB blocks) and records the replica, and the
//! node only copies where it is told. So no replica can be listed that the disk no longer holds: a disk is evicted
//! by the master, in the same step that drops the replica.
//!
//! An offload is a `Processing` disk replica plus a task in its node's mailbox. The node copies the memory range
//! to the disk range and reports the bytes' crc32c; the replica then turns readable and the memory replicas go
//! (`eviction::complete_offload`). A task's destination is held out of reuse past its deadline (the disk hold), so
//! a copy that comes late — the object removed meanwhile, the task expired — can never land in space given to
//! another object; the node refuses to start one after its deadline.
//!
//! Locks: the tier's mutex is a leaf. It is taken under an object lock (an offload starting) and never held while
//! taking another lock; disk eviction pops its queue, releases the mutex, then locks the object.

use super::MasterService;
use crate::clock::Timestamp;
use crate::events::RemoveCause;
use crate::eviction::{self, OffloadEnd};
use crate::metadata::{Lifecycle, ObjectEntry, ObjectId, ObjectState, Replica, TenantState, Tier};
use crate::segment_pool::AllocatedBuffer;
use crescent_proto::{
    ClientId, DISK_BLOCK, DiskCounters, DiskFault, DiskTask, DiskTaskKind, DiskTaskResult, ErrorCode, SegmentId,
};
use crescent_proto::{ReplicaStatus, SegmentKind};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Most disk replicas one offload evicts to make its room (a disk full of larger objects than this one frees
/// room after a few; a fragmented one is given up on, and the object dropped as before the tier existed).
const EVICT_FOR_ROOM: usize = 64;

/// Most tasks one poll hands a node.
const TASKS_PER_POLL: usize = 256;

/// How long offloads avoid a disk after [`FAILURES_TO_AVOID`] copies to it failed in a row (a failing disk is
/// not fed the whole eviction; one bad block is not a failing disk).
const FAILING_FOR: Duration = Duration::from_secs(10);

/// Failed copies in a row after which a disk is avoided for [`FAILING_FOR`].
const FAILURES_TO_AVOID: u32 = 3;

/// Counters of the tier, master side (read with [`MasterService::disk_tier`]).
#[derive(Debug, Default)]
pub struct DiskTierMetrics {
    /// Offloads started (a copy task handed to a node).
    pub offloads_started: AtomicU64,
    /// Offloads done: the object is readable on disk.
    pub offloads_done: AtomicU64,
    /// Offloads that failed (a disk error, a checksum mismatch) or expired.
    pub offloads_failed: AtomicU64,
    /// Memory evictions that could not be kept on disk (no room could be made): dropped.
    pub offloads_refused: AtomicU64,
    /// Disk replicas evicted to make room (oldest first).
    pub disk_evictions: AtomicU64,
    /// Disk replicas dropped because their node could not read them.
    pub disk_faults: AtomicU64,
    /// Disk-only objects a read brought back to memory (the disk replica stays).
    pub promotions_done: AtomicU64,
    /// Promotions that failed, expired or found the object gone or changed.
    pub promotions_failed: AtomicU64,
}

/// One disk's figures for `/segments`, `/metrics` and `crescent stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskSegmentStats {
    /// The disk segment.
    pub segment: SegmentId,
    /// Replicas on it the master tracks (readable, in offload order).
    pub objects: u64,
    /// Disk replicas evicted from it.
    pub evictions: u64,
    /// What its node last reported (reads, writes, errors); zeros before its first report.
    pub counters: DiskCounters,
}

/// A copy handed (or to be handed) to a node.
struct Task {
    wire: DiskTask,
    node: ClientId,
    tenant: Arc<TenantState>,
    entry: Arc<ObjectEntry>,
    /// The replica the copy fills (the disk replica of an offload), or reads (the disk replica a promotion copies).
    replica: u64,
    /// When the master gives up on it (its deadline and a margin, on the master's clock).
    expires: Timestamp,
    /// A promotion's memory range: held by the task, not the object, until the node reports (a removal meanwhile
    /// cannot free a range the node may still be writing); it joins the object only if the copy is good.
    promote: Option<AllocatedBuffer>,
}

/// A readable disk replica, in the order it was written (its disk's eviction order).
struct Resident {
    tenant: Weak<TenantState>,
    entry: Weak<ObjectEntry>,
    replica: u64,
    offset: u64,
}

/// One node's queue of tasks not yet handed out.
#[derive(Default)]
struct Mailbox {
    queued: VecDeque<u64>,
    /// Woken when a task is queued (a node's poll waits on it).
    notify: Arc<tokio::sync::Notify>,
}

#[derive(Default)]
struct State {
    tasks: HashMap<u64, Task>,
    mailboxes: HashMap<ClientId, Mailbox>,
    /// Per disk segment: readable replicas, oldest first.
    residents: HashMap<SegmentId, VecDeque<Resident>>,
    evictions: HashMap<SegmentId, u64>,
    counters: HashMap<SegmentId, DiskCounters>,
    /// Per disk: copies failed in a row, and until when offloads avoid it.
    failing: HashMap<SegmentId, (u32, Timestamp)>,
    /// Objects with a promotion under way (one at a time each).
    promoting: std::collections::HashSet<ObjectId>,
}

/// The master's disk tier (see the module docs).
#[derive(Default)]
pub struct DiskTier {
    state: Mutex<State>,
    next_task: AtomicU64,
    metrics: DiskTierMetrics,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier").finish_non_exhaustive()
    }
}

/// The offload seam the eviction kernel calls (a memory round's objects go to their node's disk).
pub(super) struct Offloader<'a> {
    pub(super) svc: &'a MasterService,
}

/// Bytes an object of `size` takes on a disk: whole blocks.
fn disk_bytes(size: u64) -> u64 {
    size.div_ceil(DISK_BLOCK).saturating_mul(DISK_BLOCK)
}

impl Offloader<'_> {
    /// The memory replica to copy and the disk that takes it: the first readable memory replica whose node hosts
    /// an allocatable disk segment that has not failed lately.
    fn source(&self, st: &ObjectState) -> Option<(SegmentId, u64, SegmentId, ClientId)> {
        let svc = self.svc;
        let now = svc.clock.now();
        st.replicas.iter().filter(|r| r.is_memory() && r.is_readable()).find_map(|r| {
            let seg = r.buffer.segment_id()?;
            let node = svc.pool.owner(seg)?;
            let disk = svc.pool.disk_of(node)?;
            let failing = svc.disk.state.lock().failing.get(&disk).is_some_and(|(_, until)| now < *until);
            (!failing).then_some((seg, r.buffer.offset(), disk, node))
        })
    }

    /// Whether the object may go to a disk at all.
    fn wanted(st: &ObjectState) -> bool {
        !st.flags.no_offload() && st.pending().is_none() && !st.on_disk() && !st.offloading()
    }
}

impl eviction::Offload for Offloader<'_> {
    fn prepare_all(&self, entries: &[Arc<ObjectEntry>]) -> Vec<bool> {
        let mut ready = vec![false; entries.len()];
        if !self.svc.config.disk_offload {
            return ready;
        }
        // The disk each object would go to and the bytes it needs there, summed per disk: room for a whole group
        // is made at once (made member by member, each would find the last one's room and make none of its own).
        let mut wanted: Vec<(usize, SegmentId)> = Vec::new();
        let mut per_disk: HashMap<SegmentId, u64> = HashMap::new();
        for (i, entry) in entries.iter().enumerate() {
            let st = entry.lock();
            if !Self::wanted(&st) {
                continue;
            }
            if let Some((_, _, disk, _)) = self.source(&st) {
                wanted.push((i, disk));
                *per_disk.entry(disk).or_default() += disk_bytes(st.size);
            }
        }
        let roomy: HashMap<SegmentId, bool> =
            per_disk.into_iter().map(|(disk, bytes)| (disk, self.svc.disk_room(disk, bytes))).collect();
        for (i, disk) in wanted {
            if roomy.get(&disk).copied().unwrap_or(false) {
                ready[i] = true;
            } else {
                self.svc.disk.metrics.offloads_refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        ready
    }

    fn start(&self, tenant: &Arc<TenantState>, entry: &Arc<ObjectEntry>, st: &mut ObjectState) -> bool {
        let svc = self.svc;
        if !Self::wanted(st) {
            return false;
        }
        let Some((src, src_offset, disk, node)) = self.source(st) else { return false };
        let Ok(buffer) = svc.pool.allocate_in(disk, disk_bytes(st.size)) else {
            svc.disk.metrics.offloads_refused.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let ttl = Duration::from_millis(svc.config.disk_task_timeout_ms);
        // Held past the master's own expiry of the task: the node never starts a copy after its deadline, and
        // the hold covers one still running then.
        buffer.hold_for(ttl.saturating_mul(3));
        let id = svc.next_replica_id();
        let dst_offset = buffer.offset();
        let writer = st.writer();
        st.replicas.push(Replica { writer, ..Replica::processing(id, buffer) });
        let now = svc.clock.now();
        let task = DiskTask {
            id: svc.disk.next_task.fetch_add(1, Ordering::Relaxed) + 1,
            kind: DiskTaskKind::Offload,
            src,
            src_offset,
            dst: disk,
            dst_offset,
            length: st.size,
            deadline_unix_ms: crescent_net::grant::unix_ms().saturating_add(ttl.as_millis() as u64),
        };
        // The eviction's room: a write waiting for it, and the watermark loop, see this free as pending.
        svc.eviction_frees.begin();
        svc.disk.metrics.offloads_started.fetch_add(1, Ordering::Relaxed);
        svc.disk.queue(Task {
            wire: task,
            node,
            tenant: Arc::clone(tenant),
            entry: Arc::clone(entry),
            replica: id,
            expires: now.saturating_add(ttl.saturating_mul(2)),
            promote: None,
        });
        true
    }
}

impl DiskTier {
    /// The tier's counters.
    pub fn metrics(&self) -> &DiskTierMetrics {
        &self.metrics
    }

    fn queue(&self, task: Task) {
        let mut st = self.state.lock();
        let mailbox = st.mailboxes.entry(task.node).or_default();
        mailbox.queued.push_back(task.wire.id);
        // A permit is kept when no poll waits yet: the next one returns at once.
        mailbox.notify.notify_one();
        st.tasks.insert(task.wire.id, task);
    }

    /// What a node's poll waits on.
    pub(crate) fn waiter(&self, node: ClientId) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.state.lock().mailboxes.entry(node).or_default().notify)
    }

    /// Hands out `node`'s queued tasks (at most 256 at a time).
    pub fn take(&self, node: ClientId) -> Vec<DiskTask> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let Some(mailbox) = st.mailboxes.get_mut(&node) else { return Vec::new() };
        let n = mailbox.queued.len().min(TASKS_PER_POLL);
        mailbox.queued.drain(..n).filter_map(|id| st.tasks.get(&id).map(|t| t.wire.clone())).collect()
    }

    /// Takes every task (handed out or queued) that `pick` selects, out of the tier.
    fn take_where(&self, pick: impl Fn(&Task) -> bool) -> Vec<Task> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let ids: Vec<u64> = st.tasks.iter().filter(|(_, t)| pick(t)).map(|(id, _)| *id).collect();
        let tasks: Vec<Task> = ids.iter().filter_map(|id| st.tasks.remove(id)).collect();
        for t in &tasks {
            if let Some(m) = st.mailboxes.get_mut(&t.node) {
                m.queued.retain(|id| *id != t.wire.id);
            }
        }
        tasks
    }

    fn remove(&self, id: u64, node: ClientId) -> Option<Task> {
        let mut st = self.state.lock();
        // Only the node the task was given to may end it.
        if st.tasks.get(&id).is_none_or(|t| t.node != node) {
            return None;
        }
        st.tasks.remove(&id)
    }

    fn resident(
        &self,
        disk: SegmentId,
        tenant: &Arc<TenantState>,
        entry: &Arc<ObjectEntry>,
        replica: u64,
        offset: u64,
    ) {
        self.state.lock().residents.entry(disk).or_default().push_back(Resident {
            tenant: Arc::downgrade(tenant),
            entry: Arc::downgrade(entry),
            replica,
            offset,
        });
    }

    /// The oldest resident of `disk`, taken off its queue.
    fn pop_oldest(&self, disk: SegmentId) -> Option<Resident> {
        self.state.lock().residents.get_mut(&disk)?.pop_front()
    }

    /// Takes the resident at `offset` of `disk` (a fault's range).
    fn take_at(&self, disk: SegmentId, offset: u64) -> Option<Resident> {
        let mut st = self.state.lock();
        let q = st.residents.get_mut(&disk)?;
        let at = q.iter().position(|r| r.offset == offset)?;
        q.remove(at)
    }

    /// Forgets everything about a segment that left the pool.
    pub(crate) fn forget(&self, segment: SegmentId) {
        let mut st = self.state.lock();
        st.residents.remove(&segment);
        st.evictions.remove(&segment);
        st.counters.remove(&segment);
        st.failing.remove(&segment);
    }

    /// Each disk segment's figures, for `segments` (readable replicas tracked, evictions, the node's counters).
    pub fn segment_stats(&self, segment: SegmentId) -> DiskSegmentStats {
        let st = self.state.lock();
        DiskSegmentStats {
            segment,
            objects: st.residents.get(&segment).map_or(0, |q| q.len() as u64),
            evictions: st.evictions.get(&segment).copied().unwrap_or(0),
            counters: st.counters.get(&segment).copied().unwrap_or(DiskCounters {
                segment,
                reads: 0,
                read_bytes: 0,
                writes: 0,
                write_bytes: 0,
                errors: 0,
            }),
        }
    }

    /// Tasks handed out or queued and not yet ended.
    pub fn tasks_in_flight(&self) -> usize {
        self.state.lock().tasks.len()
    }
}

impl MasterService {
    /// The disk tier (counters, per-disk figures).
    pub fn disk_tier(&self) -> &DiskTier {
        &self.disk
    }

    /// The offload seam for a memory eviction round (none when the tier is off).
    pub(super) fn offloader(&self) -> Option<Offloader<'_>> {
        self.config.disk_offload.then_some(Offloader { svc: self })
    }

    /// Where disk evictions log (their frees counted apart from memory's: an offload making room waits for them
    /// alone).
    fn disk_log(&self) -> Option<(&crate::ha::OpLog, &Arc<crate::eviction::PendingFrees>)> {
        self.oplog.get().map(|l| (&**l, &self.disk_frees))
    }

    /// Makes `bytes` of room on `disk`, evicting its oldest replicas (at most [`EVICT_FOR_ROOM`]); with no lock
    /// held. True when the room is there.
    fn disk_room(&self, disk: SegmentId, bytes: u64) -> bool {
        let mut skipped = Vec::new();
        let mut ok = self.pool.can_fit(disk, bytes);
        // Bytes evicted whose space is not back yet: with a log, it comes back once the evictions are durable,
        // waited for once per `bytes` evicted rather than once per replica.
        let mut coming = 0;
        for _ in 0..EVICT_FOR_ROOM {
            if ok {
                break;
            }
            if coming >= bytes {
                self.await_frees(&self.disk_frees);
                coming = 0;
                ok = self.pool.can_fit(disk, bytes);
                continue;
            }
            let Some(r) = self.disk.pop_oldest(disk) else { break };
            let (Some(tenant), Some(entry)) = (r.tenant.upgrade(), r.entry.upgrade()) else { continue };
            let now = self.clock.now();
            match eviction::evict_disk_replica(&tenant, &entry, r.replica, false, now, self.disk_log(), self.events()) {
                Some(freed) => {
                    self.disk.metrics.disk_evictions.fetch_add(1, Ordering::Relaxed);
                    *self.disk.state.lock().evictions.entry(disk).or_default() += 1;
                    coming += freed;
                }
                // Read right now (leased): it goes back in the queue, as the newest.
                None if entry.lock().replicas.iter().any(|x| x.id == r.replica) => skipped.push(r),
                None => {}
            }
            ok = self.pool.can_fit(disk, bytes);
        }
        if !ok && coming > 0 {
            self.await_frees(&self.disk_frees);
            ok = self.pool.can_fit(disk, bytes);
        }
        if !skipped.is_empty() {
            let mut st = self.disk.state.lock();
            let q = st.residents.entry(disk).or_default();
            q.extend(skipped);
        }
        ok
    }

    /// A node's disk-task poll (see `MasterRequest::DiskTasks`): applies the outcomes and faults it reports,
    /// keeps its counters, and hands it its queued tasks (the RPC server waits for some when there are none).
    pub fn disk_tasks(
        &self,
        node: ClientId,
        done: &[DiskTaskResult],
        faults: &[DiskFault],
        counters: &[DiskCounters],
    ) -> Result<Vec<DiskTask>, ErrorCode> {
        // Counters only for the node's own disks.
        let own = self.pool.client_segments(node);
        {
            let mut st = self.disk.state.lock();
            for c in counters.iter().filter(|c| own.contains(&c.segment)) {
                st.counters.insert(c.segment, *c);
            }
        }
        for r in done {
            let Some(task) = self.disk.remove(r.id, node) else { continue };
            self.end_task(task, r.outcome);
        }
        for f in faults.iter().filter(|f| own.contains(&f.segment)) {
            self.drop_unreadable(f);
        }
        Ok(self.disk.take(node))
    }

    /// Starts bringing a disk-only object back to memory, under its lock, after a read found it only on disk
    /// (`disk_promotion`): a memory range on the same node's memory segment while that segment is below the
    /// eviction watermark (the original's gate: a memory under eviction pressure takes no promotions), and a copy
    /// task for the node.
    pub(super) fn maybe_promote(&self, tenant: &Arc<TenantState>, entry: &Arc<ObjectEntry>, st: &ObjectState) {
        if !self.config.disk_promotion || st.pending().is_some() || self.under_memory_pressure() {
            return;
        }
        if st.replicas.iter().any(|r| r.is_memory() && r.is_readable())
            || self.disk.state.lock().promoting.contains(&entry.id())
        {
            return;
        }
        let Some(disk) = st.replicas.iter().find(|r| r.tier == Tier::Disk && r.is_readable()) else { return };
        let Some(src) = disk.buffer.segment_id() else { return };
        let Some(node) = self.pool.owner(src) else { return };
        let watermark = self.config.eviction_high_watermark;
        let target = self.pool.client_segments(node).into_iter().find(|id| {
            self.pool.segment(*id).is_some_and(|s| {
                let used = (s.usage.used + s.usage.slack) as f64;
                s.spec.kind == SegmentKind::Memory && used < watermark * s.usage.capacity as f64
            })
        });
        let Some(dst) = target else { return };
        if !self.disk.state.lock().promoting.insert(entry.id()) {
            return;
        }
        let Ok(buffer) = self.pool.allocate_in(dst, st.size) else {
            self.disk.state.lock().promoting.remove(&entry.id());
            return;
        };
        let ttl = Duration::from_millis(self.config.disk_task_timeout_ms);
        let task = DiskTask {
            id: self.disk.next_task.fetch_add(1, Ordering::Relaxed) + 1,
            kind: DiskTaskKind::Promote,
            src,
            src_offset: disk.buffer.offset(),
            dst,
            dst_offset: buffer.offset(),
            length: st.size,
            deadline_unix_ms: crescent_net::grant::unix_ms().saturating_add(ttl.as_millis() as u64),
        };
        let expires = self.clock.now().saturating_add(ttl.saturating_mul(2));
        let (tenant, entry) = (Arc::clone(tenant), Arc::clone(entry));
        self.disk.queue(Task { wire: task, node, tenant, entry, replica: disk.id, expires, promote: Some(buffer) });
    }

    /// Ends a promotion: a good copy of the object's bytes becomes a readable memory replica (charged to its
    /// tenant, its post-state logged under the lock); anything else frees the range.
    fn end_promotion(&self, task: Task, buffer: AllocatedBuffer, crc: Option<u32>) {
        use crate::eviction::EvictionLog;
        self.disk.state.lock().promoting.remove(&task.entry.id());
        let log = self.oplog.get();
        let slot = log.map(|l| EvictionLog::reserve(&**l));
        let kept = {
            let mut st = task.entry.lock();
            let source_there = st.replicas.iter().any(|r| r.id == task.replica && r.is_readable());
            let good = crc.is_some_and(|c| !st.flags.has_checksum() || st.checksum == c);
            let fits = st.lifecycle() == Lifecycle::Active
                && st.pending().is_none()
                && source_there
                && good
                && task.tenant.quota().try_charge(st.size).is_ok();
            match (fits, slot) {
                // No place in the log: nothing changes.
                (true, Some(None)) => {
                    task.tenant.release_quota(st.size);
                    drop(st);
                    drop(buffer);
                    false
                }
                (true, slot) => {
                    let mut r = Replica::processing(self.next_replica_id(), buffer);
                    r.status = ReplicaStatus::Complete;
                    r.writer = st.writer();
                    st.replicas.push(r);
                    st.charge_copies(1);
                    // Reported as the object now stands: back in memory (and still on disk).
                    let report = self.report_state(&task.tenant, &task.entry, &st, RemoveCause::Evicted);
                    if let (Some(log), Some(Some(slot))) = (log, slot) {
                        EvictionLog::record(
                            &**log,
                            slot,
                            &task.tenant,
                            &task.entry,
                            &st,
                            self.clock.now(),
                            report.on_durable(None).unwrap_or_else(|| Box::new(|_| {})),
                        );
                    } else {
                        report.send();
                    }
                    true
                }
                _ => {
                    drop(st);
                    drop(buffer);
                    false
                }
            }
        };
        let counter = if kept { &self.disk.metrics.promotions_done } else { &self.disk.metrics.promotions_failed };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Ends one task with its outcome (`Err`: failed or expired).
    fn end_task(&self, mut task: Task, outcome: Result<u32, ErrorCode>) {
        if let Some(buffer) = task.promote.take() {
            return self.end_promotion(task, buffer, outcome.ok());
        }
        let now = self.clock.now();
        let crc = outcome.ok();
        let end = eviction::complete_offload(
            &task.tenant,
            &task.entry,
            task.replica,
            crc,
            now,
            self.eviction_log(),
            self.events(),
        );
        match end {
            OffloadEnd::Kept { freed } => {
                self.disk.state.lock().failing.remove(&task.wire.dst);
                self.disk.metrics.offloads_done.fetch_add(1, Ordering::Relaxed);
                self.metrics.evicted_objects.fetch_add(u64::from(freed > 0), Ordering::Relaxed);
                self.metrics.evicted_bytes.fetch_add(freed, Ordering::Relaxed);
                self.disk.resident(task.wire.dst, &task.tenant, &task.entry, task.replica, task.wire.dst_offset);
            }
            OffloadEnd::Failed => {
                self.disk.metrics.offloads_failed.fetch_add(1, Ordering::Relaxed);
                let why = outcome.err().map_or("checksum mismatch".to_owned(), |c| c.to_string());
                tracing::warn!(key = task.entry.key(), disk = %task.wire.dst, %why, "an offload to disk failed");
                let mut st = self.disk.state.lock();
                let (n, until) = st.failing.entry(task.wire.dst).or_insert((0, Timestamp(0)));
                *n += 1;
                if *n >= FAILURES_TO_AVOID {
                    *until = now.saturating_add(FAILING_FOR);
                }
            }
            OffloadEnd::Gone => {}
        }
        self.eviction_frees.end();
    }

    /// Drops the disk replica at a range its node could not read.
    fn drop_unreadable(&self, f: &DiskFault) {
        let Some(r) = self.disk.take_at(f.segment, f.offset) else { return };
        let (Some(tenant), Some(entry)) = (r.tenant.upgrade(), r.entry.upgrade()) else { return };
        let now = self.clock.now();
        if eviction::evict_disk_replica(&tenant, &entry, r.replica, true, now, self.disk_log(), self.events()).is_some()
        {
            self.disk.metrics.disk_faults.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(key = entry.key(), disk = %f.segment, offset = f.offset, "an unreadable disk replica was dropped");
        }
    }

    /// Ends, as failed, the tasks that copy from or to `segment` (it left the pool: no copy there can count), so
    /// their pending frees do not hold the watermark loop back until they expire.
    pub(super) fn end_disk_tasks_on(&self, segment: SegmentId) {
        for t in self.disk.take_where(|t| t.wire.src == segment || t.wire.dst == segment) {
            self.end_task(t, Err(ErrorCode::SegmentNotFound));
        }
    }

    /// Ends tasks whose node did not report in time (dead, stalled): their disk replicas are dropped, the
    /// objects left in memory. The background loop runs this every second. Returns how many expired.
    pub fn step_disk_tasks(&self) -> usize {
        let now = self.clock.now();
        let expired = self.disk.take_where(|t| t.expires <= now);
        let n = expired.len();
        for t in expired {
            self.end_task(t, Err(ErrorCode::TransferFail));
        }
        n
    }
}
