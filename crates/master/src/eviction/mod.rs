//! The eviction kernel: one census + selection + commit protocol behind every trigger (high watermark,
//! allocation failure, tenant quota).
//!
//! 1. **Census**: copy object handles in bounded chunks under shared route locks; read each object's summary
//!    under its own lock, briefly (never two locks at once).
//! 2. **Select** with no lock held: candidates are objects with evictable replicas in the round's tier
//!    (complete, unpinned by refcount, on a live segment), not hard-pinned, lease expired; oldest lease first;
//!    soft-pinned objects only after all others, and only if allowed.
//! 3. **Commit** each candidate: singleton → its object lock; explicit group → the group lock, then every
//!    member's lock in key order (the whole group is skipped if any member holds a lease). Everything is
//!    revalidated under the locks. Emptied objects are retired and matched-unlinked; buffers and quota are
//!    released after the locks are dropped — with an oplog, only once the eviction's entry is durable (RFC §13:
//!    space an undurable eviction frees could be written by a new object while a crash would bring the
//!    evicted one back over those bytes). [`PendingFrees`] counts what is still waiting, so a write that
//!    needs that room can wait for it instead of evicting again.
//!
//! A round works on one [`Tier`] (memory, or NoF): it takes only that tier's replicas, and an object is erased
//! only when no valid replica is left in any tier. Counts are objects (the original's unit, for the watermark
//! trigger) and bytes (the quota trigger's unit).
//! An allocation failure asks [`make_room`] for room for one buffer on one segment, chosen so the
//! round evicts only what makes that room, and nothing at all when no segment can be freed enough.

use crate::clock::Timestamp;
use crate::events::object::{removed_event, state_event};
use crate::events::{EventHub, Events, KvEvent, RemoveCause};
use crate::metadata::{
    GroupEntry, Lifecycle, ObjectEntry, ObjectState, Replica, ReplicaList, TenantLifecycle, TenantState, Tier,
};
use crescent_proto::{ReplicaStatus, SegmentId, TenantId};
use smallvec::SmallVec;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// Where a round's decisions are logged: the service's operation log (the kernel knows nothing of entries). The
/// kernel takes a slot before an object's lock — a refusal means that object is not evicted — and records the
/// object's post-state inside its lock, right after stripping it, so the log orders the eviction exactly where the
/// lock did: a removal or a write of the same object can never be logged on the wrong side of it.
pub trait EvictionLog {
    /// A reserved place in the log (no sequence yet; dropping it gives it back).
    type Slot<'a>
    where
        Self: 'a;
    /// Takes a slot with no lock held (may wait briefly while admission is merely full); `None`: refused.
    fn reserve(&self) -> Option<Self::Slot<'_>>;
    /// Takes a slot without waiting (under a group lock); `None`: refused.
    fn try_reserve(&self) -> Option<Self::Slot<'_>>;
    /// Records `entry`'s post-state `st` in `tenant` (PUT_END of what is left, or REMOVE), called under the
    /// object's lock; `on_durable` runs once the record is durable, with its sequence. False: the log will never hold it (its writer
    /// stopped for good), and `on_durable` was dropped unrun.
    fn record(
        &self,
        slot: Self::Slot<'_>,
        tenant: &TenantState,
        entry: &ObjectEntry,
        st: &ObjectState,
        now: Timestamp,
        on_durable: Box<dyn FnOnce(u64) + Send>,
    ) -> bool;
}

/// Where a memory eviction may keep an object's bytes instead of dropping them: the disk tier of the node that
/// holds them (the service's `DiskTier`). Asked inside the object's lock, for an object the round may evict.
pub trait Offload {
    /// Readies room on the disks that would take `entries` (disk eviction, oldest first), with no lock held: for
    /// each entry, false means it will not be offloaded (plain eviction). All at once: a group's members share
    /// their disks' room.
    fn prepare_all(&self, entries: &[Arc<ObjectEntry>]) -> Vec<bool>;
    /// [`Offload::prepare_all`] for one object.
    fn prepare(&self, entry: &Arc<ObjectEntry>) -> bool {
        self.prepare_all(std::slice::from_ref(entry)).first().copied().unwrap_or(false)
    }
    /// Starts keeping `st` on disk — a `Processing` disk replica and a copy task for its node — and returns true;
    /// the object then stays in memory until the copy is done (it is then stripped of its memory replicas, logged
    /// and freed as an eviction). False: nothing changed, the round evicts it as usual.
    fn start(&self, tenant: &Arc<TenantState>, entry: &Arc<ObjectEntry>, st: &mut ObjectState) -> bool;
}

/// Where a round's decisions go: the log that records them (with the count of frees waiting for it), and the disk
/// tier that may keep a memory round's objects.
pub struct Outlets<'a, L> {
    /// The log, if any.
    pub oplog: Option<(&'a L, &'a Arc<PendingFrees>)>,
    /// The disk tier, for a memory round on a master that has one.
    pub offload: Option<&'a dyn Offload>,
    /// The KV event stream each eviction is reported to, if one is attached.
    pub events: Option<&'a Arc<EventHub>>,
}

/// Evictions logged but not yet durable, whose space and quota are still held: a write that evicted for its
/// room waits here (bounded) rather than evicting more, and the watermark loop skips rounds while any are
/// pending (the pool's usage does not show them yet).
#[derive(Debug, Default)]
pub struct PendingFrees {
    count: parking_lot::Mutex<usize>,
    settled: parking_lot::Condvar,
}

impl PendingFrees {
    /// Whether any eviction's space is still waiting for durability.
    pub fn any(&self) -> bool {
        *self.count.lock() > 0
    }

    /// Waits up to `timeout` until no eviction's space is waiting; true when none is.
    pub fn wait_settled(&self, timeout: Duration) -> bool {
        let mut n = self.count.lock();
        let deadline = std::time::Instant::now() + timeout;
        while *n > 0 {
            if self.settled.wait_until(&mut n, deadline).timed_out() {
                return *n == 0;
            }
        }
        true
    }

    /// One more free waiting (an eviction logged, or an offload under way whose memory is freed when it ends).
    pub(crate) fn begin(&self) {
        *self.count.lock() += 1;
    }

    /// One free settled.
    pub(crate) fn end(&self) {
        let mut n = self.count.lock();
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.settled.notify_all();
        }
    }
}

/// What one evicted object gives back — its buffers and its tenant's quota — held until its entry is
/// durable ([`DeferredFree::release`]). One dropped unreleased — its entry's callback dropped unrun because the
/// log stopped for good, so the log may still name the object at that space — keeps the space out of reuse for
/// good (the term ends with its log; a leak is safe, a reuse is not).
pub(crate) struct DeferredFree {
    replicas: ReplicaList,
    tenant: Arc<TenantState>,
    quota: u64,
    pending: Option<Arc<PendingFrees>>,
    released: bool,
}

impl DeferredFree {
    /// What `replicas` and `quota` bytes of `tenant`'s account hold, taken out of an object by a mutation other
    /// than eviction (BatchReplicaClear's strip): given back by [`DeferredFree::release`], kept out of reuse if
    /// dropped unreleased (the log never held the mutation).
    pub(crate) fn new(replicas: ReplicaList, tenant: Arc<TenantState>, quota: u64) -> Self {
        Self { replicas, tenant, quota, pending: None, released: false }
    }

    /// Gives the space and quota back: the eviction is durable (or nothing logs it).
    pub(crate) fn release(mut self) {
        self.released = true;
    }
}

impl Drop for DeferredFree {
    fn drop(&mut self) {
        let replicas = std::mem::take(&mut self.replicas);
        if self.released {
            // Buffers first, then the quota that accounts for them.
            drop(replicas);
            self.tenant.release_quota(self.quota);
        } else {
            tracing::warn!(buffers = replicas.len(), "an eviction the log never held keeps its space out of reuse");
            std::mem::forget(replicas);
        }
        if let Some(p) = &self.pending {
            p.end();
        }
    }
}

/// Which objects an eviction round may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionScope {
    /// Every tenant (selection is tenant-blind; each object's bytes are released to its own tenant).
    All,
    /// One tenant (quota-triggered eviction never touches other tenants).
    Tenant(TenantId),
}

/// How much to evict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EvictionTarget {
    /// Evict `ceil(base × target)` non-soft-pinned objects (oldest lease first); if that falls short of
    /// `ceil(base × lower)`, continue with soft-pinned ones (when allowed). `base` = objects with evictable
    /// replicas in the round's tier that are not hard-pinned.
    Fraction {
        /// Primary fraction.
        target: f64,
        /// Minimum fraction, reached with soft-pinned objects if needed.
        lower: f64,
    },
    /// Evict until at least this many replica bytes are freed.
    Bytes(u64),
}

/// Room for one allocation that failed: the buffer's size, the segments that could take it with where their
/// space is taken, and how many bytes the whole pool must free to stay under the high watermark once the buffer
/// is placed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RoomRequest {
    /// Bytes of the buffer.
    pub size: u64,
    /// Candidate segments.
    pub segments: Vec<SegmentMap>,
    /// Bytes to free anywhere, as far as unleased objects allow (0 = none).
    pub total: u64,
}

/// One segment's space: its capacity and its live allocations `(offset, bytes occupied)` in address order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentMap {
    /// The segment.
    pub id: SegmentId,
    /// Bytes it offers.
    pub capacity: u64,
    /// Live allocations in address order.
    pub occupied: Vec<(u64, u64)>,
}

/// What an allocation-failure round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoomReport {
    /// The segment the round freed room on; `None`: no segment's evictable objects could make the room, so
    /// nothing was evicted.
    pub segment: Option<SegmentId>,
    /// It took every candidate its census found and still fell short of the pool's target: whatever is
    /// evictable now became so after its census.
    pub exhausted: bool,
    /// The round's counts.
    pub report: EvictionReport,
}

/// What a round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictionReport {
    /// Objects with evictable replicas in the round's tier that are not hard-pinned.
    pub base: u64,
    /// Of those, with an expired lease.
    pub candidates: u64,
    /// Objects evicted (each member of a group counts).
    pub objects: u64,
    /// Replica bytes freed.
    pub bytes: u64,
    /// Candidates that failed revalidation at commit (leased meanwhile, group member leased, ...).
    pub skipped: u64,
    /// Objects whose bytes went to a disk tier instead (their memory is freed when each copy is done).
    pub offloading: u64,
    /// Memory bytes those objects free once copied (counted toward a byte goal: they are on their way out).
    pub offloading_bytes: u64,
}

impl EvictionReport {
    /// Memory bytes freed, or to be freed once the copies under way are done.
    pub fn bytes_going(&self) -> u64 {
        self.bytes + self.offloading_bytes
    }
}

struct Candidate {
    tenant: usize,
    entry: Arc<ObjectEntry>,
    /// The version the census saw: commit skips an object written again since.
    version: u16,
    lease: Timestamp,
    /// Where its evictable buffers are, `(segment, offset)` (collected for [`make_room`] only).
    at: SmallVec<[(SegmentId, u64); 1]>,
}

/// Whether the object may lose its replicas in `tier` now.
fn eligible(st: &ObjectState, tier: Tier, now: Timestamp, allow_soft: bool) -> bool {
    st.lifecycle() == Lifecycle::Active
        && !st.hard_pinned()
        && !st.leased(now)
        && (allow_soft || !st.soft_pinned(now))
        && st.evictable_bytes(tier) > 0
        && !st.offloading()
}

/// Takes the evictable replicas in `tier`; retires the object if nothing valid remains. Returns the replicas
/// taken (and the retired object's leftovers), the quota they held (not yet released) and whether the object
/// was retired.
fn strip(st: &mut ObjectState, tier: Tier) -> (ReplicaList, u64, bool) {
    let (taken, keep): (ReplicaList, ReplicaList) =
        std::mem::take(&mut st.replicas).into_iter().partition(|r| r.is_evictable(tier));
    st.replicas = keep;
    let quota = TenantState::resettle_unreleased(st);
    if st.replicas.iter().any(Replica::is_valid) {
        return (taken, quota, false);
    }
    let mut all = taken;
    let (rest, retired_quota) = TenantState::retire_unreleased(st);
    all.extend(rest);
    (all, quota + retired_quota, true)
}

/// Bytes freed in `tier` (a retired object's other leftovers are freed too, but count in their own tier).
fn bytes_of(replicas: &[Replica], tier: Tier) -> u64 {
    replicas.iter().filter(|r| r.tier == tier).map(|r| r.buffer.size()).sum()
}

/// Where the evictable buffers of `st` in `tier` are.
fn evictable_at(st: &ObjectState, tier: Tier) -> SmallVec<[(SegmentId, u64); 1]> {
    st.replicas
        .iter()
        .filter(|r| r.is_evictable(tier))
        .filter_map(|r| Some((r.buffer.segment_id()?, r.buffer.offset())))
        .collect()
}

struct Committer<'a, L: EvictionLog> {
    tenants: &'a [Arc<TenantState>],
    /// Each evicted object's post-state is logged here (PUT_END of what is left, or REMOVE); its space and
    /// quota are released when that entry is durable.
    oplog: Option<(&'a L, &'a Arc<PendingFrees>)>,
    /// A memory round's disk tier, if any node has one.
    offload: Option<&'a dyn Offload>,
    tier: Tier,
    now: Timestamp,
    groups_done: HashSet<*const GroupEntry>,
    report: EvictionReport,
    /// Where each eviction is reported, if anywhere.
    events: Option<&'a Arc<EventHub>>,
}

impl<'a, L: EvictionLog> Committer<'a, L> {
    /// The events of `entry` as `st` holds it after an eviction for `cause` (none without a stream).
    fn events_of(&self, tenant: &TenantState, entry: &ObjectEntry, st: &ObjectState, cause: RemoveCause) -> Events {
        self.events.map(|_| Events::from_iter([state_event(tenant, entry, st, cause)])).unwrap_or_default()
    }

    /// Settles an eviction made under `st`'s lock: with a log, its post-state recorded through `slot`, and once
    /// that is durable its space released and `events` published (under the entry's sequence); without one, both
    /// at once.
    #[allow(clippy::too_many_arguments)]
    fn settle(
        &self,
        slot: Option<L::Slot<'a>>,
        tenant: &TenantState,
        entry: &ObjectEntry,
        st: &ObjectState,
        free: DeferredFree,
        events: Events,
    ) {
        let hub = self.events.filter(|_| !events.is_empty()).cloned();
        match (slot, self.oplog) {
            (Some(slot), Some((log, _))) => {
                let on_durable = move |seq: u64| {
                    free.release();
                    if let Some(hub) = hub {
                        hub.publish(seq, events);
                    }
                };
                log.record(slot, tenant, entry, st, self.now, Box::new(on_durable));
            }
            _ => {
                free.release();
                if let Some(hub) = hub {
                    hub.publish_now(events);
                }
            }
        }
    }

    /// Gives back what an evicted object held: at once without an oplog, else once `slot`'s entry (the
    /// object's post-state) is durable.
    fn release(&self, tenant: &Arc<TenantState>, replicas: ReplicaList, quota: u64) -> DeferredFree {
        let pending = self.oplog.map(|(_, p)| {
            p.begin();
            Arc::clone(p)
        });
        DeferredFree { replicas, tenant: Arc::clone(tenant), quota, pending, released: false }
    }

    /// Evicts one candidate (its whole group for a member). Returns objects evicted.
    fn commit(&mut self, c: &Candidate, allow_soft: bool) -> u64 {
        let tenant = &self.tenants[c.tenant];
        #[cfg(test)]
        crate::test_hooks::before_eviction_commit();
        // The tenant instance the census saw must still be the registered one (a removed instance's objects
        // are no one's to evict).
        if tenant.lifecycle() == TenantLifecycle::Removed {
            self.report.skipped += 1;
            return 0;
        }
        match c.entry.group() {
            None => {
                // Room on the disk is made before the object's lock (it evicts other objects there).
                let offload = self.offload.filter(|o| self.tier == Tier::Memory && o.prepare(&c.entry));
                // Reserved before the lock: an eviction the log cannot take does not happen.
                let slot = match self.oplog.map(|(log, _)| log.reserve().ok_or(())).transpose() {
                    Ok(slot) => slot,
                    Err(()) => {
                        self.report.skipped += 1;
                        return 0;
                    }
                };
                let mut st = c.entry.lock();
                if !eligible(&st, self.tier, self.now, allow_soft) || st.version != c.version {
                    self.report.skipped += 1;
                    return 0;
                }
                let going = st.evictable_bytes(self.tier);
                if offload.is_some_and(|o| o.start(tenant, &c.entry, &mut st)) {
                    // Counts toward the round's target: its memory is freed when the copy is done.
                    self.report.offloading += 1;
                    self.report.offloading_bytes += going;
                    return 1;
                }
                let (freed, quota, retired) = strip(&mut st, self.tier);
                self.report.objects += 1;
                self.report.bytes += bytes_of(&freed, self.tier);
                let free = self.release(tenant, freed, quota);
                // Logged inside the object's lock: a removal that takes the lock next is logged after this.
                let events = self.events_of(tenant, &c.entry, &st, RemoveCause::Evicted);
                self.settle(slot, tenant, &c.entry, &st, free, events);
                drop(st);
                #[cfg(test)]
                crate::test_hooks::after_eviction_unlock();
                if retired {
                    tenant.detach(&c.entry);
                }
                1
            }
            Some(group) => {
                if !self.groups_done.insert(Arc::as_ptr(group)) {
                    return 0;
                }
                // Disk room for the members is made before the group's lock, like a singleton's.
                let prepared: HashSet<*const ObjectEntry> = match self.offload.filter(|_| self.tier == Tier::Memory) {
                    Some(o) => {
                        let members = group.lock().live_sorted();
                        let ready = o.prepare_all(&members);
                        members.iter().zip(ready).filter(|(_, r)| *r).map(|(m, _)| Arc::as_ptr(m)).collect()
                    }
                    None => HashSet::new(),
                };
                self.commit_group(tenant, group, c, allow_soft, &prepared)
            }
        }
    }

    fn commit_group(
        &mut self,
        tenant: &Arc<TenantState>,
        group: &Arc<GroupEntry>,
        c: &Candidate,
        allow_soft: bool,
        prepared: &HashSet<*const ObjectEntry>,
    ) -> u64 {
        let mut members_guard = group.lock();
        let members = members_guard.live_sorted();
        // One slot per member, all or none (the writer's lock is a leaf: taking them under the group lock is
        // safe, and a refusal still changes nothing).
        let mut slots = Vec::new();
        if let Some((log, _)) = self.oplog {
            for _ in &members {
                // Under the group lock: no waiting for admission here.
                match log.try_reserve() {
                    Some(slot) => slots.push(slot),
                    None => {
                        self.report.skipped += 1;
                        return 0;
                    }
                }
            }
        }
        // Members evicted, members going to disk instead, bytes evicted.
        let (mut n, mut kept, mut bytes) = (0u64, 0u64, 0u64);
        let mut retired: Vec<&Arc<ObjectEntry>> = Vec::new();
        {
            let mut guards: Vec<_> = members.iter().map(|m| m.lock()).collect();
            // The member that made the group a candidate must be the version the census saw.
            let rewritten =
                members.iter().zip(guards.iter()).any(|(m, st)| Arc::ptr_eq(m, &c.entry) && st.version != c.version);
            if rewritten || guards.iter().any(|st| st.lifecycle() == Lifecycle::Active && st.leased(self.now)) {
                self.report.skipped += 1;
                return 0;
            }
            for (m, st) in members.iter().zip(guards.iter_mut()) {
                if !eligible(st, self.tier, self.now, allow_soft) {
                    continue;
                }
                // A member kept on disk stays in memory until its copy is done (then it is stripped and logged
                // as a singleton's offload is); its reserved slot goes unused.
                let going = st.evictable_bytes(self.tier);
                let offload = self.offload.filter(|_| prepared.contains(&Arc::as_ptr(m)));
                if offload.is_some_and(|o| o.start(tenant, m, st)) {
                    kept += 1;
                    self.report.offloading += 1;
                    self.report.offloading_bytes += going;
                    continue;
                }
                let (f, quota, r) = strip(st, self.tier);
                n += 1;
                bytes += bytes_of(&f, self.tier);
                let free = self.release(tenant, f, quota);
                // Committed under the member's lock (the entry order is the lock order); released on durable.
                let events = self.events_of(tenant, m, st, RemoveCause::Evicted);
                self.settle(slots.pop(), tenant, m, st, free, events);
                if r {
                    retired.push(m);
                }
            }
        }
        for m in retired {
            tenant.detach_locked(m, group, &mut members_guard);
        }
        drop(members_guard);
        self.report.objects += n;
        self.report.bytes += bytes;
        n + kept
    }
}

/// The census: every object's summary, read under its own lock; candidates oldest lease first, soft-pinned
/// ones apart. `per_seg` also records where each candidate's evictable buffers are.
fn census(
    tenants: &[Arc<TenantState>],
    tier: Tier,
    now: Timestamp,
    census_chunk: usize,
    per_seg: bool,
) -> (EvictionReport, Vec<Candidate>, Vec<Candidate>) {
    let mut report = EvictionReport::default();
    // Sized once for every object (most are candidates when memory is full): growing by doubling instead copied
    // the whole list several times a round and faulted fresh pages in for each copy.
    let objects: usize = tenants.iter().map(|t| t.objects().len()).sum();
    let mut normal: Vec<Candidate> = Vec::with_capacity(objects);
    let mut soft: Vec<Candidate> = Vec::new();
    for (ti, t) in tenants.iter().enumerate() {
        t.objects().visit_chunks(census_chunk, |chunk| {
            for entry in chunk {
                let (in_base, candidate, soft_pinned, lease, version, at) = {
                    let st = entry.lock();
                    let in_base =
                        st.lifecycle() == Lifecycle::Active && !st.hard_pinned() && st.evictable_bytes(tier) > 0;
                    let candidate = in_base && !st.leased(now) && !st.offloading();
                    let at = if candidate && per_seg { evictable_at(&st, tier) } else { SmallVec::new() };
                    (in_base, candidate, st.soft_pinned(now), st.lease(), st.version, at)
                };
                report.base += u64::from(in_base);
                if candidate {
                    report.candidates += 1;
                    let c = Candidate { tenant: ti, entry, version, lease, at };
                    if soft_pinned { soft.push(c) } else { normal.push(c) }
                }
            }
        });
    }
    normal.sort_unstable_by_key(|c| c.lease);
    soft.sort_unstable_by_key(|c| c.lease);
    (report, normal, soft)
}

/// The evictions that open a hole of at least `size` bytes in one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Window {
    /// The newest candidate (highest rank) it evicts: the best window evicts nothing hotter than it must.
    worst: usize,
    /// Bytes it evicts.
    bytes: u64,
    /// Candidate ranks, in address order.
    ranks: Vec<usize>,
}

/// The best window of `seg` for `size` bytes: consecutive allocations, all evictable (`rank[k]`: the rank of
/// the candidate owning `seg.occupied[k]`, `None` if it cannot go), whose eviction joins the free space around
/// them into one hole of `size` bytes. Two pointers over each run of evictable allocations, with a monotonic
/// queue for the window's newest rank: linear in the segment's allocations, and a run too short to matter costs
/// O(1).
fn best_window(seg: &SegmentMap, size: u64, rank: &[Option<usize>]) -> Option<Window> {
    let occ = &seg.occupied;
    let n = occ.len().min(rank.len());
    let end_of = |k: usize| occ[k].0 + occ[k].1;
    // (worst, bytes, i, j) of the best window so far.
    let mut best: Option<(usize, u64, usize, usize)> = None;
    let mut queue: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    let mut start = 0; // first allocation of the current run
    while start <= n {
        // The run: allocations start..end are evictable; the one at `end` (if any) is not.
        let mut end = start;
        while end < n && rank[end].is_some() {
            end += 1;
        }
        let left_edge = if start == 0 { 0 } else { end_of(start - 1) };
        let right_edge = if end < n { occ[end].0 } else { seg.capacity };
        if right_edge.saturating_sub(left_edge) >= size {
            // Evicting allocations i..j (half-open) leaves the hole [end of i−1, start of j).
            let hole = |i: usize, j: usize| {
                let l = if i == start { left_edge } else { end_of(i - 1) };
                let r = if j == end { right_edge } else { occ[j].0 };
                r.saturating_sub(l)
            };
            queue.clear();
            let (mut j, mut bytes) = (start, 0u64); // bytes of occ[i..j]
            for i in start..=end {
                if j < i {
                    (j, bytes) = (i, 0);
                }
                while queue.front().is_some_and(|&q| q < i) {
                    queue.pop_front();
                }
                while j < end && hole(i, j) < size {
                    while queue.back().is_some_and(|&q| rank[q] <= rank[j]) {
                        queue.pop_back();
                    }
                    queue.push_back(j);
                    bytes += occ[j].1;
                    j += 1;
                }
                if hole(i, j) >= size {
                    let worst = queue.front().and_then(|&q| rank[q]).unwrap_or(0);
                    if best.is_none_or(|b| (worst, bytes) < (b.0, b.1)) {
                        best = Some((worst, bytes, i, j));
                    }
                }
                if i < j {
                    bytes -= occ[i].1;
                }
            }
        }
        start = end + 1;
    }
    best.map(|(worst, bytes, i, j)| Window { worst, bytes, ranks: rank[i..j].iter().flatten().copied().collect() })
}

/// `rank[k]` for each of `seg`'s allocations: the place in eviction order of the candidate owning it.
fn ranks_on(seg: &SegmentMap, mut mine: Vec<(u64, usize)>) -> Vec<Option<usize>> {
    mine.sort_unstable();
    let mut it = mine.into_iter().peekable();
    seg.occupied
        .iter()
        .map(|&(offset, _)| {
            while it.next_if(|&(o, _)| o < offset).is_some() {}
            it.next_if(|&(o, _)| o == offset).map(|(_, r)| r)
        })
        .collect()
}

/// Frees room for one allocation (see [`RoomRequest`]): on the segment whose best hole evicts nothing newer
/// than it must (then the fewest bytes), evicts the objects in that hole, then, as far as the unleased objects
/// allow, the oldest anywhere until the pool is back under its target (so the next watermark round has no
/// reason to reach the new object). Evicts nothing when no segment has such a hole: a write that cannot be
/// placed must not empty the cache on its way to failing.
pub fn make_room<L: EvictionLog>(
    tenants: &[Arc<TenantState>],
    tier: Tier,
    room: &RoomRequest,
    now: Timestamp,
    allow_evict_soft_pinned: bool,
    census_chunk: usize,
    outlets: Outlets<'_, L>,
) -> RoomReport {
    let Outlets { oplog, offload, events } = outlets;
    let (report, normal, soft) = census(tenants, tier, now, census_chunk, true);
    let soft_pass: &[Candidate] = if allow_evict_soft_pinned { &soft } else { &[] };
    // Rank = eviction order: oldest lease first, soft-pinned after all others.
    let ordered: Vec<(&Candidate, bool)> =
        normal.iter().map(|c| (c, false)).chain(soft_pass.iter().map(|c| (c, true))).collect();
    let mut by_segment: std::collections::HashMap<SegmentId, Vec<(u64, usize)>> = std::collections::HashMap::new();
    for (i, (c, _)) in ordered.iter().enumerate() {
        for &(seg, offset) in &c.at {
            by_segment.entry(seg).or_default().push((offset, i));
        }
    }
    let choice = room
        .segments
        .iter()
        .filter_map(|s| {
            let rank = ranks_on(s, by_segment.remove(&s.id).unwrap_or_default());
            Some((s.id, best_window(s, room.size, &rank)?))
        })
        .min_by_key(|(_, w)| (w.worst, w.bytes));
    let Some((seg, window)) = choice else {
        return RoomReport { segment: None, exhausted: false, report };
    };
    let mut k = Committer { tenants, oplog, offload, tier, now, groups_done: HashSet::new(), report, events };
    let mut done = vec![false; ordered.len()];
    for &r in &window.ranks {
        done[r] = true;
        let (c, allow_soft) = ordered[r];
        k.commit(c, allow_soft);
    }
    for (i, (c, allow_soft)) in ordered.iter().enumerate() {
        if k.report.bytes_going() >= room.total {
            break;
        }
        if !done[i] {
            k.commit(c, *allow_soft);
        }
    }
    let exhausted = k.report.bytes_going() < room.total;
    RoomReport { segment: Some(seg), exhausted, report: k.report }
}

/// Evicts one disk replica (`replica`, of `entry` in `tenant`): the disk tier's own eviction, oldest first, when
/// its node's disk has no room, or (`unreadable`) a replica its node could not read. Skipped (`None`) when gone,
/// or while the object is read (leased) unless unreadable; otherwise the replica is taken and the object's
/// post-state logged under its lock (the object is retired when nothing valid is left), its space released once
/// that is durable, as any eviction's. Returns the bytes freed.
pub fn evict_disk_replica<L: EvictionLog>(
    tenant: &Arc<TenantState>,
    entry: &Arc<ObjectEntry>,
    replica: u64,
    unreadable: bool,
    now: Timestamp,
    oplog: Option<(&L, &Arc<PendingFrees>)>,
    events: Option<&Arc<EventHub>>,
) -> Option<u64> {
    let k = Committer {
        tenants: &[],
        oplog,
        offload: None,
        tier: Tier::Disk,
        now,
        groups_done: HashSet::new(),
        report: EvictionReport::default(),
        events,
    };
    if tenant.lifecycle() == TenantLifecycle::Removed {
        return None;
    }
    let slot = match oplog.map(|(log, _)| log.reserve().ok_or(())).transpose() {
        Ok(slot) => slot,
        Err(()) => return None,
    };
    let mut st = entry.lock();
    let at = st.replicas.iter().position(|r| r.id == replica && r.is_evictable(Tier::Disk))?;
    if st.lifecycle() != Lifecycle::Active || (st.leased(now) && !unreadable) {
        return None;
    }
    let taken = st.replicas.remove(at);
    let bytes = taken.buffer.size();
    let mut freed = ReplicaList::new();
    freed.push(taken);
    let mut quota = TenantState::resettle_unreleased(&mut st);
    let retired = !st.replicas.iter().any(Replica::is_valid);
    if retired {
        let (rest, retired_quota) = TenantState::retire_unreleased(&mut st);
        freed.extend(rest);
        quota += retired_quota;
    }
    let free = k.release(tenant, freed, quota);
    let events = k.events_of(tenant, entry, &st, RemoveCause::Evicted);
    k.settle(slot, tenant, entry, &st, free, events);
    drop(st);
    if retired {
        tenant.detach(entry);
    }
    Some(bytes)
}

/// What became of an offload when its node reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadEnd {
    /// The disk replica is readable; the memory replicas went (freed once durable) unless a reader came.
    Kept {
        /// Memory bytes the object gave up.
        freed: u64,
    },
    /// The copy failed (or its bytes did not match the object's checksum): the disk replica is dropped, the
    /// object left in memory.
    Failed,
    /// The object was removed or rewritten meanwhile: nothing to do (its removal freed the disk range).
    Gone,
}

/// Ends an offload of `entry` to its `Processing` disk replica `replica`: `crc` is the crc32c of the bytes the
/// node wrote (`None`: the copy failed). Under the object's lock: a copy whose bytes match the object's checksum
/// (or whose object has none) turns the replica readable, and, when no reader holds a lease, the memory
/// replicas go as a memory eviction's do — the post-state logged under the lock, their space and quota released
/// once durable; a failed copy's replica is dropped (its space stays held past the task's deadline: see the disk
/// hold). With no place in the log the offload counts as failed and only the disk replica goes.
pub fn complete_offload<L: EvictionLog>(
    tenant: &Arc<TenantState>,
    entry: &Arc<ObjectEntry>,
    replica: u64,
    crc: Option<u32>,
    now: Timestamp,
    oplog: Option<(&L, &Arc<PendingFrees>)>,
    events: Option<&Arc<EventHub>>,
) -> OffloadEnd {
    let k = Committer {
        tenants: &[],
        oplog,
        offload: None,
        tier: Tier::Memory,
        now,
        groups_done: HashSet::new(),
        report: EvictionReport::default(),
        events,
    };
    let slot = oplog.map(|(log, _)| log.reserve());
    let mut st = entry.lock();
    let Some(at) = st.replicas.iter().position(|r| r.id == replica && r.status == ReplicaStatus::Processing) else {
        return OffloadEnd::Gone;
    };
    if st.lifecycle() != Lifecycle::Active {
        return OffloadEnd::Gone;
    }
    let matches = crc.is_some_and(|c| !st.flags.has_checksum() || st.checksum == c);
    let slot = match slot {
        None => None,
        Some(Some(slot)) if matches => Some(slot),
        // No place in the log, or a failed copy: the replica goes (it was never logged).
        Some(_) => {
            drop(st.replicas.remove(at));
            return OffloadEnd::Failed;
        }
    };
    if !matches {
        drop(st.replicas.remove(at));
        return OffloadEnd::Failed;
    }
    st.replicas[at].status = ReplicaStatus::Complete;
    // The node's copy is over: no late write can land in the range any more.
    st.replicas[at].buffer.end_hold();
    let mut freed_bytes = 0;
    let (freed, quota) = if st.leased(now) {
        (ReplicaList::new(), 0)
    } else {
        let (taken, keep): (ReplicaList, ReplicaList) =
            std::mem::take(&mut st.replicas).into_iter().partition(|r| r.is_evictable(Tier::Memory));
        st.replicas = keep;
        freed_bytes = bytes_of(&taken, Tier::Memory);
        (taken, TenantState::resettle_unreleased(&mut st))
    };
    // Reported as the memory copy's removal (offloaded), then the object as it now stands (on disk).
    let mut events = Events::new();
    if let Some(gone) = k.events.and(freed.first()).map(|_| removed_event(tenant, entry, &st, RemoveCause::Offloaded)) {
        events.push(KvEvent { medium: "cpu", ..gone });
    }
    events.extend(k.events_of(tenant, entry, &st, RemoveCause::Evicted));
    let free = k.release(tenant, freed, quota);
    // A record the log refuses (its writer stopped for good) keeps the freed space out of reuse for good.
    k.settle(slot, tenant, entry, &st, free, events);
    OffloadEnd::Kept { freed: freed_bytes }
}

/// Runs one eviction round over `tenants`.
pub fn run<L: EvictionLog>(
    tenants: &[Arc<TenantState>],
    tier: Tier,
    target: EvictionTarget,
    now: Timestamp,
    allow_evict_soft_pinned: bool,
    census_chunk: usize,
    outlets: Outlets<'_, L>,
) -> EvictionReport {
    let Outlets { oplog, offload, events } = outlets;
    let (report, normal, soft) = census(tenants, tier, now, census_chunk, false);
    let mut k = Committer { tenants, oplog, offload, tier, now, groups_done: HashSet::new(), report, events };
    let mut evicted = 0u64;
    match target {
        EvictionTarget::Fraction { target, lower } => {
            let base = k.report.base as f64;
            let n1 = (base * target.max(0.0)).ceil() as u64;
            let n2 = (base * lower.max(0.0)).ceil() as u64;
            let mut rest = normal.iter();
            for c in rest.by_ref() {
                if evicted >= n1 {
                    break;
                }
                evicted += k.commit(c, false);
            }
            if evicted < n2 {
                for c in rest {
                    if evicted >= n2 {
                        break;
                    }
                    evicted += k.commit(c, false);
                }
                if allow_evict_soft_pinned {
                    for c in &soft {
                        if evicted >= n2 {
                            break;
                        }
                        evicted += k.commit(c, true);
                    }
                }
            }
        }
        EvictionTarget::Bytes(goal) => {
            let passes: &[(&[Candidate], bool)] =
                if allow_evict_soft_pinned { &[(&normal, false), (&soft, true)] } else { &[(&normal, false)] };
            'outer: for (list, allow_soft) in passes {
                for c in list.iter() {
                    if k.report.bytes_going() >= goal {
                        break 'outer;
                    }
                    k.commit(c, *allow_soft);
                }
            }
        }
    }
    k.report
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{SegmentMap, best_window, ranks_on};
    use crescent_proto::SegmentId;
    use proptest::prelude::*;

    /// Every window by brute force: `(worst rank, bytes)` of the best one.
    fn brute(seg: &SegmentMap, size: u64, rank: &dyn Fn(u64) -> Option<usize>) -> Option<(usize, u64)> {
        let occ = &seg.occupied;
        let mut best: Option<(usize, u64)> = None;
        for i in 0..=occ.len() {
            for j in i..=occ.len() {
                if occ[i..j].iter().any(|a| rank(a.0).is_none()) {
                    break;
                }
                let l = if i == 0 { 0 } else { occ[i - 1].0 + occ[i - 1].1 };
                let r = if j == occ.len() { seg.capacity } else { occ[j].0 };
                if r - l >= size {
                    let worst = occ[i..j].iter().filter_map(|a| rank(a.0)).max().unwrap_or(0);
                    let bytes = occ[i..j].iter().map(|a| a.1).sum();
                    if best.is_none_or(|b| (worst, bytes) < b) {
                        best = Some((worst, bytes));
                    }
                }
            }
        }
        best
    }

    proptest! {
        #[test]
        fn the_two_pointer_window_is_the_best_window(
            layout in proptest::collection::vec((0u64..4, 1u64..6, proptest::option::of(0usize..40)), 0..24),
            size in 1u64..30,
        ) {
            // (gap before, bytes, rank or blocked) → a segment map.
            let mut occupied = Vec::new();
            let mut ranks = std::collections::HashMap::new();
            let mut at = 0;
            for (i, (gap, bytes, rank)) in layout.into_iter().enumerate() {
                at += gap;
                occupied.push((at, bytes));
                if let Some(r) = rank {
                    ranks.insert(at, r * 100 + i); // unique, like a candidate's place in eviction order
                }
                at += bytes;
            }
            let seg = SegmentMap { id: SegmentId::random(), capacity: at + 2, occupied };
            let rank = |o: u64| ranks.get(&o).copied();
            let mine: Vec<(u64, usize)> = ranks.iter().map(|(o, r)| (*o, *r)).collect();
            let got = best_window(&seg, size, &ranks_on(&seg, mine));
            if let Some(w) = &got {
                let bytes: u64 = seg
                    .occupied
                    .iter()
                    .filter(|a| ranks.get(&a.0).is_some_and(|r| w.ranks.contains(r)))
                    .map(|a| a.1)
                    .sum();
                prop_assert_eq!(bytes, w.bytes, "the ranks it names are the bytes it counts");
            }
            prop_assert_eq!(got.map(|w| (w.worst, w.bytes)), brute(&seg, size, &rank));
        }
    }
}

/// Commit revalidates what the census selected: each test changes the candidate between census and commit
/// (on the round's own thread, through a test hook) and checks it is skipped, counted, and left as changed.
#[cfg(test)]
mod revalidation_tests {
    #![allow(clippy::unwrap_used)]
    use super::{EvictionReport, EvictionScope, EvictionTarget};
    use crate::clock::{ManualClock, Timestamp};
    use crate::service::{MasterConfig, MasterService};
    use crate::test_hooks::set_before_eviction_commit;
    use crescent_proto::{ClientId, ReplicateConfig, TenantId};
    use std::sync::Arc;
    use std::time::Duration;

    struct Setup {
        svc: Arc<MasterService>,
        clock: Arc<ManualClock>,
        tenant: &'static str,
    }

    /// One aged object `k` (lease expired) in tenant `tenant` ("" = single-tenant mode).
    fn setup(tenant: &'static str) -> Setup {
        let config = MasterConfig { enable_multi_tenants: !tenant.is_empty(), ..MasterConfig::default() };
        let clock = ManualClock::new(Timestamp(1_000));
        let svc = Arc::new(MasterService::new(config, clock.clone()).unwrap());
        svc.mount_segment(ClientId::random(), crescent_testkit::segment("s", 1 << 24)).unwrap();
        if !tenant.is_empty() {
            svc.upsert_tenant_quota(tenant, 1 << 22).unwrap();
        }
        put(&svc, tenant, "k", 100);
        clock.advance(Duration::from_secs(1));
        Setup { svc, clock, tenant }
    }

    fn put(svc: &MasterService, tenant: &str, key: &str, size: u64) {
        let w = ClientId::random();
        svc.upsert_start(w, tenant, key, size, &ReplicateConfig::default()).unwrap();
        svc.upsert_end(w, tenant, key, None).unwrap();
    }

    /// Runs a round that would take everything, with `change` between its census and commit.
    fn evict_with(s: &Setup, change: impl FnMut() + 'static) -> EvictionReport {
        set_before_eviction_commit(change);
        s.svc.evict(EvictionScope::All, EvictionTarget::Fraction { target: 1.0, lower: 1.0 })
    }

    fn skipped_only(r: EvictionReport) {
        assert_eq!((r.candidates, r.objects, r.skipped), (1, 0, 1), "{r:?}");
    }

    #[test]
    fn a_lease_taken_after_the_census_saves_the_object() {
        let s = setup("");
        let svc = s.svc.clone();
        skipped_only(evict_with(&s, move || {
            svc.get_replica_list("", "k").unwrap();
        }));
        assert!(s.svc.exist_key("", "k").unwrap());
    }

    #[test]
    fn a_pin_set_after_the_census_saves_the_object() {
        let s = setup("");
        let svc = s.svc.clone();
        skipped_only(evict_with(&s, move || {
            let t = svc.tenant_for_tests(&TenantId::default_tenant());
            t.objects().get("k").unwrap().lock().set_hard_pinned(true);
        }));
        assert!(s.svc.exist_key("", "k").unwrap());
    }

    #[test]
    fn a_key_removed_and_recreated_after_the_census_keeps_the_new_object() {
        let s = setup("");
        let svc = s.svc.clone();
        skipped_only(evict_with(&s, move || {
            svc.remove("", "k", true).unwrap();
            put(&svc, "", "k", 200);
        }));
        assert_eq!(s.svc.get_replica_list("", "k").unwrap().size, 200);
    }

    #[test]
    fn an_object_written_again_after_the_census_is_not_taken_for_its_old_age() {
        let s = setup("");
        let (svc, clock) = (s.svc.clone(), s.clock.clone());
        skipped_only(evict_with(&s, move || {
            // Same size: written in place, same entry; its completion is the newest thing in the cache.
            put(&svc, "", "k", 100);
            clock.advance(Duration::from_millis(1));
        }));
        assert!(s.svc.exist_key("", "k").unwrap());
    }

    #[test]
    fn a_tenant_deleted_after_the_census_is_not_evicted_from() {
        let s = setup("t");
        let svc = s.svc.clone();
        let tenant = s.tenant;
        skipped_only(evict_with(&s, move || {
            svc.remove(tenant, "k", true).unwrap();
            svc.delete_tenant_quota(tenant).unwrap();
            svc.upsert_tenant_quota(tenant, 1 << 22).unwrap();
            put(&svc, tenant, "k", 300);
        }));
        assert_eq!(s.svc.get_replica_list(tenant, "k").unwrap().size, 300, "the new tenant's object stays");
    }
}
