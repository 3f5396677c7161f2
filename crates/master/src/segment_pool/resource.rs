//! Physical region resources and the buffers allocated from them.
//!
//! A [`RegionResource`] is owned by its driver (strong `Arc`); the placement index and every
//! [`AllocatedBuffer`] hold only `Weak` references. Deactivation flips `live` under the pool's write lock:
//! from then on the region's buffers are unreadable and releasing them is a no-op, and since the pool has
//! already removed the region from the placement index no allocation can reach it.

use crate::alloc::{AllocError, Allocation, OffsetAllocator};
use crate::clock::{Clock, Timestamp};
use crescent_proto::{ReplicaLocation, SegmentId, SegmentKind};
use parking_lot::Mutex;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// Keeps space freed soon after its allocation out of reuse until `window` after the allocation. A master that
/// seals data-plane write grants sets it (to the grants' life plus clock slack): a writer whose grant is still
/// valid could otherwise write into the next object given that space, if its own object was removed, evicted or
/// revoked early. Held space counts as used until released.
#[derive(Clone)]
pub struct WriteHold {
    /// The master's clock.
    pub clock: Arc<dyn Clock>,
    /// How long after its allocation a buffer's space stays out of reuse.
    pub window: Duration,
}

impl fmt::Debug for WriteHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteHold").field("window", &self.window).finish_non_exhaustive()
    }
}

/// Space accounting of one region, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegionUsage {
    /// Bytes the region offers.
    pub capacity: u64,
    /// Σ requested sizes of live buffers (what replica descriptors say).
    pub used: u64,
    /// Bytes consumed beyond `used` by bin round-up.
    pub slack: u64,
    /// Largest single buffer that could be allocated now.
    pub largest_free: u64,
    /// Live buffers.
    pub live_allocations: u64,
    /// Successful allocations ever made in this region (monotonic).
    pub allocations_total: u64,
    /// Of `used`, bytes already freed but held out of reuse while a write grant may cover them (`WriteHold`).
    pub held: u64,
}

impl RegionUsage {
    /// `(capacity − used − slack) / capacity`, the free-ratio-first score.
    pub fn free_ratio(&self) -> f64 {
        if self.capacity == 0 {
            return 0.0;
        }
        let free = self.capacity.saturating_sub(self.used).saturating_sub(self.slack);
        free as f64 / self.capacity as f64
    }
}

/// Where a region's allocations come from.
#[allow(clippy::large_enum_variant)] // one per mounted region; boxing would add a hop on every allocation
pub(crate) enum AllocationTarget {
    /// Memory and NoF: the region owns one allocator over `[0, size)`.
    Own(Mutex<OffsetAllocator>),
    /// CXL: a logical binding onto the device-wide allocator. The binding tracks its live allocations so erasing
    /// it returns their space to the shared window (dropping a binding frees nothing by itself).
    CxlBinding { window: Arc<Mutex<OffsetAllocator>>, live: Mutex<HashMap<u64, Allocation>> },
}

/// One mounted region's physical resource: its allocation target and identity.
pub struct RegionResource {
    segment_id: SegmentId,
    kind: SegmentKind,
    name: Arc<str>,
    endpoint: Arc<str>,
    capacity: u64,
    /// Published projection of the catalog status "not UNMOUNTING": cleared once, under the pool write lock.
    live: AtomicBool,
    /// Published projection of "not SUSPECT": cleared when a client reports the node unreachable, set again
    /// when the node pings (under the pool write lock). Readers are not handed replicas here meanwhile.
    reachable: AtomicBool,
    target: AllocationTarget,
    /// Set once, before the region is published, on a pool with a write hold.
    hold: OnceLock<WriteHold>,
    /// With a hold: the region's recent allocations and the space held. Never locked together with the
    /// allocation target's locks (due space is taken out first, then released).
    holding: Mutex<Holding>,
    /// The earliest release time of held space (`u64::MAX`: none), so callers skip the lock while none is due.
    next_due: AtomicU64,
}

/// What a region with a write hold tracks: kept here rather than in each buffer, so a replica stays as small
/// without authentication as with it (the hold costs 8 bytes per allocator slot of a region that has one).
#[derive(Debug, Default)]
struct Holding {
    /// Until when each live allocation's space must stay out of reuse once freed, by its allocator slot
    /// (`Allocation::slot`, dense and recycled): its allocation plus the window, pushed later by each handout of
    /// it (`AllocatedBuffer::hold_for`: a grant's life plus slack). A slot's entry is set anew when an allocation
    /// takes it (a slot is recycled only once its previous allocation's hold is over), so nothing is forgotten
    /// and no entry outlives its use — no map, no expiry queue on the put and get paths.
    until: Vec<Timestamp>,
    /// Freed allocations still in their hold, the first to end on top: a release takes only what is due, not a
    /// walk over everything held (under a stream of overwrites that is every free of the last window).
    held: BinaryHeap<Held>,
    /// Their bytes, kept as they come and go (read on every usage check).
    held_bytes: u64,
}

/// A freed allocation in its hold, ordered so that the one whose hold ends first is a max-heap's top.
#[derive(Debug)]
struct Held {
    until: Timestamp,
    alloc: Allocation,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        self.until == other.until
    }
}

impl Eq for Held {}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.until.cmp(&self.until)
    }
}

impl Holding {
    /// The space of the allocation in `slot` must be held, once freed, until `until` at least; a `birth` (a new
    /// allocation in the slot) replaces what the slot's previous allocation had.
    fn hold_until(&mut self, slot: u32, until: Timestamp, birth: bool) {
        let i = slot as usize;
        if self.until.len() <= i {
            self.until.resize(i + 1, Timestamp(0));
        }
        let e = &mut self.until[i];
        if birth || until > *e {
            *e = until;
        }
    }
}

impl fmt::Debug for RegionResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionResource")
            .field("segment_id", &self.segment_id)
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("live", &self.is_live())
            .finish()
    }
}

impl RegionResource {
    pub(crate) fn new(
        segment_id: SegmentId,
        kind: SegmentKind,
        name: Arc<str>,
        endpoint: Arc<str>,
        capacity: u64,
        target: AllocationTarget,
    ) -> Self {
        Self {
            segment_id,
            kind,
            name,
            endpoint,
            capacity,
            live: AtomicBool::new(true),
            reachable: AtomicBool::new(true),
            target,
            hold: OnceLock::new(),
            holding: Mutex::new(Holding::default()),
            next_due: AtomicU64::new(u64::MAX),
        }
    }

    /// Makes the region keep freed space in `hold` (a prepared region, before it is published).
    pub(crate) fn hold_writes(&self, hold: Option<&WriteHold>) {
        if let Some(h) = hold {
            // Set once per region; a second call finds it set and changes nothing.
            let _ = self.hold.set(h.clone());
        }
    }

    /// Notes an allocation made (or, restored, re-bound) now: its space is held for the window once freed.
    fn note_birth(&self, alloc: &Allocation) {
        let Some(h) = self.hold.get() else { return };
        let now = h.clock.now();
        self.holding.lock().hold_until(alloc.slot(), now.saturating_add(h.window), true);
    }

    /// Notes that the live allocation `alloc` was handed out now for a transfer a node honours for at most
    /// `life` on any clock: once freed, its space is held until then.
    fn hold_for(&self, alloc: &Allocation, life: Duration) {
        let Some(h) = self.hold.get() else { return };
        let now = h.clock.now();
        self.holding.lock().hold_until(alloc.slot(), now.saturating_add(life), false);
    }

    /// Ends the hold on the live allocation `alloc` now: what it was held for (a disk copy into it) is over.
    fn end_hold(&self, alloc: &Allocation) {
        let Some(h) = self.hold.get() else { return };
        let now = h.clock.now();
        self.holding.lock().hold_until(alloc.slot(), now, true);
    }

    /// Releases the held allocations whose hold has ended.
    fn reap(&self) {
        let Some(h) = self.hold.get() else { return };
        let now = h.clock.now();
        if now.0 < self.next_due.load(Ordering::Acquire) {
            return;
        }
        let due: Vec<Allocation> = {
            let mut holding = self.holding.lock();
            let mut due = Vec::new();
            while holding.held.peek().is_some_and(|h| h.until <= now) {
                if let Some(h) = holding.held.pop() {
                    holding.held_bytes -= h.alloc.size();
                    due.push(h.alloc);
                }
            }
            let next = holding.held.peek().map_or(u64::MAX, |h| h.until.0);
            self.next_due.store(next, Ordering::Release);
            due
        };
        for a in &due {
            self.release(a);
        }
    }

    /// Bytes held out of reuse now (freed, their hold not over).
    pub fn held_bytes(&self) -> u64 {
        self.holding.lock().held_bytes
    }

    /// Returns a dropped buffer's space, or holds it while its allocation's window or a grant for it lasts.
    fn release_held(&self, alloc: &Allocation) {
        if let Some(h) = self.hold.get().filter(|_| self.is_live()) {
            let now = h.clock.now();
            let mut holding = self.holding.lock();
            if let Some(until) = holding.until.get(alloc.slot() as usize).copied().filter(|u| *u > now) {
                holding.held.push(Held { until, alloc: *alloc });
                holding.held_bytes += alloc.size();
                self.next_due.fetch_min(until.0, Ordering::AcqRel);
                return;
            }
        }
        self.release(alloc);
    }

    /// The segment this resource backs.
    pub fn segment_id(&self) -> SegmentId {
        self.segment_id
    }

    /// The segment's medium.
    pub fn kind(&self) -> SegmentKind {
        self.kind
    }

    /// The segment's placement name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The owner's transfer endpoint.
    pub fn endpoint(&self) -> &Arc<str> {
        &self.endpoint
    }

    /// Whether the region has not been deactivated.
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    pub(crate) fn deactivate(&self) {
        self.live.store(false, Ordering::Release);
    }

    /// Whether the region's node is believed reachable (not SUSPECT).
    pub fn is_reachable(&self) -> bool {
        self.reachable.load(Ordering::Acquire)
    }

    pub(crate) fn set_reachable(&self, reachable: bool) {
        self.reachable.store(reachable, Ordering::Release);
    }

    /// Allocates `size` bytes. Only the placement executor calls this, with the pool's shared lock held.
    pub(crate) fn allocate(self: &Arc<Self>, size: u64) -> Result<AllocatedBuffer, AllocError> {
        self.reap();
        let alloc = match &self.target {
            AllocationTarget::Own(a) => a.lock().allocate(size)?,
            AllocationTarget::CxlBinding { window, live } => {
                // Lock order: binding set, then window.
                let mut live = live.lock();
                let a = window.lock().allocate(size)?;
                live.insert(a.offset(), a);
                a
            }
        };
        self.note_birth(&alloc);
        Ok(AllocatedBuffer { region: Arc::downgrade(self), alloc })
    }

    /// Returns a buffer's space; a no-op once the region is deactivated (its space dies with it).
    fn release(&self, alloc: &Allocation) {
        if !self.is_live() {
            return;
        }
        let result = match &self.target {
            AllocationTarget::Own(a) => a.lock().free(alloc),
            AllocationTarget::CxlBinding { window, live } => {
                let mut live = live.lock();
                if live.remove(&alloc.offset()).is_some() { window.lock().free(alloc) } else { Ok(()) }
            }
        };
        if let Err(e) = result {
            tracing::error!(segment = %self.segment_id, offset = alloc.offset(), error = %e, "buffer release rejected");
        }
    }

    /// Frees what a CXL binding still holds in the shared window (erase); memory/NoF space dies with the allocator.
    pub(crate) fn release_all_bindings(&self) {
        if let AllocationTarget::CxlBinding { window, live } = &self.target {
            let mut live = live.lock();
            let mut window = window.lock();
            for (_, a) in live.drain() {
                if let Err(e) = window.free(&a) {
                    tracing::error!(segment = %self.segment_id, error = %e, "cxl binding release rejected");
                }
            }
        }
    }

    /// Current accounting (held space counts as used).
    pub fn usage(&self) -> RegionUsage {
        self.reap();
        let held = if self.hold.get().is_some() { self.held_bytes() } else { 0 };
        match &self.target {
            AllocationTarget::Own(a) => {
                let a = a.lock();
                RegionUsage {
                    capacity: a.capacity(),
                    used: a.used_bytes(),
                    slack: a.slack_bytes(),
                    largest_free: a.largest_free_extent(),
                    live_allocations: a.live_allocations(),
                    allocations_total: a.allocations_total(),
                    held,
                }
            }
            AllocationTarget::CxlBinding { window, live } => {
                let live = live.lock();
                let window = window.lock();
                let used: u64 = live.values().map(|a| a.size()).sum();
                let consumed: u64 = live.values().filter_map(|a| window.consumed(a)).sum();
                RegionUsage {
                    capacity: self.capacity,
                    used,
                    slack: consumed.saturating_sub(used),
                    largest_free: window.largest_free_extent().min(self.capacity),
                    live_allocations: live.len() as u64,
                    allocations_total: window.allocations_total(),
                    held,
                }
            }
        }
    }

    /// Live allocations as `(offset, bytes occupied)` in address order (what allocation-failure eviction needs
    /// to find a hole it can widen); `None` for a CXL binding, whose space lies in a shared window.
    pub(crate) fn occupancy(&self) -> Option<Vec<(u64, u64)>> {
        self.reap();
        match &self.target {
            AllocationTarget::Own(a) => {
                Some(a.lock().snapshot().allocations.iter().map(|x| (x.offset, x.consumed)).collect())
            }
            AllocationTarget::CxlBinding { .. } => None,
        }
    }

    /// A quick O(1) "could `size` fit" check that never takes a wrong "no" for the normal path.
    pub(crate) fn can_fit(&self, size: u64) -> bool {
        self.reap();
        match &self.target {
            AllocationTarget::Own(a) => a.lock().can_fit(size),
            AllocationTarget::CxlBinding { window, .. } => window.lock().can_fit(size),
        }
    }

    pub(crate) fn target(&self) -> &AllocationTarget {
        &self.target
    }
}

/// Space for one replica. Dropping it returns the space to its region (if the region is still live), so a
/// replica can never leak allocator space. Holds the region weakly: it never keeps a region alive.
pub struct AllocatedBuffer {
    region: Weak<RegionResource>,
    alloc: Allocation,
}

impl AllocatedBuffer {
    /// A buffer over an existing allocation (restore), born now: write grants for it from before a failover
    /// may still be valid.
    pub(crate) fn from_parts(region: Weak<RegionResource>, alloc: Allocation) -> Self {
        if let Some(r) = region.upgrade() {
            r.note_birth(&alloc);
        }
        Self { region, alloc }
    }

    /// Byte offset inside the segment.
    pub fn offset(&self) -> u64 {
        self.alloc.offset()
    }

    /// Keeps the space, once freed, out of reuse for `life` from now (a no-op in a region without a write hold).
    /// The master calls it for every range it hands out, while the object's lock still pins the buffer, so a
    /// removal that follows at once (even forced) cannot free the space under a grant about to be sealed for it.
    pub fn hold_for(&self, life: Duration) {
        if let Some(r) = self.region.upgrade() {
            r.hold_for(&self.alloc, life);
        }
    }

    /// Ends this live buffer's hold at once: the transfer it was held for is known to be over (a disk copy its
    /// node reported), so once freed its space may be reused at once (until the next handout holds it again).
    pub fn end_hold(&self) {
        if let Some(r) = self.region.upgrade() {
            r.end_hold(&self.alloc);
        }
    }

    /// Object bytes this buffer holds (the requested size).
    pub fn size(&self) -> u64 {
        self.alloc.size()
    }

    /// The region, if it still exists.
    pub fn region(&self) -> Option<Arc<RegionResource>> {
        self.region.upgrade()
    }

    /// Whether the bytes may be handed to a reader: the region exists, is not deactivated, and its node is not
    /// suspected unreachable.
    pub fn is_readable(&self) -> bool {
        self.region.upgrade().is_some_and(|r| r.is_live() && r.is_reachable())
    }

    /// Whether the buffer's segment is still mounted (readable or not: a suspect segment's buffers are live).
    pub fn is_live(&self) -> bool {
        self.region.upgrade().is_some_and(|r| r.is_live())
    }

    /// Whether this buffer lies in `region`.
    pub fn is_in(&self, region: &Weak<RegionResource>) -> bool {
        Weak::ptr_eq(&self.region, region)
    }

    /// The segment id, while the region exists.
    pub fn segment_id(&self) -> Option<SegmentId> {
        self.region.upgrade().map(|r| r.segment_id())
    }

    /// The wire address of this buffer, or `None` once its region is deactivated.
    pub fn location(&self) -> Option<ReplicaLocation> {
        let r = self.region.upgrade().filter(|r| r.is_live())?;
        let (segment_id, offset, length, endpoint) = (r.segment_id, self.offset(), self.size(), r.endpoint.clone());
        Some(match r.kind {
            SegmentKind::Memory | SegmentKind::Cxl => ReplicaLocation::Memory { segment_id, offset, length, endpoint },
            SegmentKind::Nof => ReplicaLocation::Nof { segment_id, offset, length, endpoint },
            SegmentKind::Disk => ReplicaLocation::Disk { segment_id, offset, length, endpoint },
        })
    }
}

impl Drop for AllocatedBuffer {
    fn drop(&mut self) {
        if let Some(region) = self.region.upgrade() {
            region.release_held(&self.alloc);
        }
    }
}

impl fmt::Debug for AllocatedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllocatedBuffer")
            .field("segment", &self.segment_id())
            .field("offset", &self.offset())
            .field("size", &self.size())
            .field("readable", &self.is_readable())
            .finish()
    }
}
