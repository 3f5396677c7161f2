//! `ObjectEntry`: one object, its own lock, its lifecycle and replicas.
//!
//! Layout is tuned for memory (a master holds tens of millions of these): the key is stored once (the route
//! index hashes it from the entry), write-in-flight state is boxed and exists only during a write, a single
//! replica lives inline, deadlines are 8-byte millisecond stamps.

use super::index::GroupEntry;
use super::lock_stats::LockClass;
use crate::clock::Timestamp;
use crate::segment_pool::AllocatedBuffer;
use compact_str::CompactString;
use crescent_proto::{ClientId, ObjectDataType, ReplicaDescriptor, ReplicaStatus, SegmentKind, SoftPinAction};
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;
use std::sync::Arc;

/// Master-lifetime unique object id; erase/recreate of a key yields a new id.
pub type ObjectId = u64;

/// Publication state. Lookups accept only `Active`; a handle retained past erase sees `Removing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// Published and usable. An object is routed only once fully built (there is no half-published state):
    /// a write in progress is an `Active` object with a pending write, whose replicas are not yet readable.
    /// Lookups accept only `Active`.
    Active,
    /// Being (or already) unlinked; every operation treats it as absent.
    Removing,
}

/// The pool of space a replica uses; each tier is evicted on its own pressure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Host memory or CXL (charged to the tenant's quota).
    Memory,
    /// A NoF (NVMe-oF) segment.
    Nof,
    /// A storage node's disk tier: filled by offloads of memory evictions, evicted oldest first when full.
    Disk,
}

impl Tier {
    /// The tier of a segment kind.
    pub fn of(kind: SegmentKind) -> Self {
        match kind {
            SegmentKind::Memory | SegmentKind::Cxl => Tier::Memory,
            SegmentKind::Nof => Tier::Nof,
            SegmentKind::Disk => Tier::Disk,
        }
    }
}

/// One replica of an object.
#[derive(Debug)]
pub struct Replica {
    /// Master-assigned replica id (wire `ReplicaDescriptor::id`).
    pub id: u64,
    /// The space; dropping the replica frees it.
    pub buffer: AllocatedBuffer,
    /// Write state.
    pub status: ReplicaStatus,
    /// Master-side pins (copy/move/offload sources); a pinned replica is never evicted and blocks upsert.
    pub refcnt: u16,
    /// The tier its segment belongs to.
    pub tier: Tier,
    /// Who wrote it ([`super::writers`] number; set when its write ends, `writers::UNKNOWN` before): kept in
    /// what was padding, so recording an object's writer costs no memory.
    pub writer: u32,
}

impl Replica {
    /// A fresh replica in `Processing` state.
    pub fn processing(id: u64, buffer: AllocatedBuffer) -> Self {
        let tier = buffer.region().map_or(Tier::Memory, |r| Tier::of(r.kind()));
        Self { id, buffer, status: ReplicaStatus::Processing, refcnt: 0, tier, writer: super::writers::UNKNOWN }
    }

    /// In host memory or CXL (charged to the tenant's quota).
    pub fn is_memory(&self) -> bool {
        self.tier == Tier::Memory
    }

    /// Eviction may take it: in `tier`, not pinned by refcount, readable.
    pub fn is_evictable(&self, tier: Tier) -> bool {
        self.tier == tier && self.refcnt == 0 && self.is_readable()
    }

    /// Complete and on a live segment.
    pub fn is_readable(&self) -> bool {
        self.status == ReplicaStatus::Complete && self.buffer.is_readable()
    }

    /// The replica's segment still exists (it may still be written or read).
    pub fn is_valid(&self) -> bool {
        self.buffer.is_live()
    }

    /// The wire descriptor, `None` if the segment is gone.
    pub fn descriptor(&self) -> Option<ReplicaDescriptor> {
        Some(ReplicaDescriptor { id: self.id, location: self.buffer.location()?, status: self.status, grant: None })
    }
}

/// An object's switches, packed in one byte (every object carries them: its size is watched).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectFlags(u8);

impl ObjectFlags {
    const CHECKSUM: u8 = 1;
    const NO_OFFLOAD: u8 = 2;

    fn set(&mut self, bit: u8, on: bool) {
        if on { self.0 |= bit } else { self.0 &= !bit }
    }

    /// Whether the object's `checksum` holds the writer's value.
    pub fn has_checksum(self) -> bool {
        self.0 & Self::CHECKSUM != 0
    }

    /// Says whether `checksum` holds a value.
    pub fn set_checksum(&mut self, on: bool) {
        self.set(Self::CHECKSUM, on);
    }

    /// Dropped, not kept on a disk tier, when memory eviction takes it (its writer said it is not worth keeping).
    pub fn no_offload(self) -> bool {
        self.0 & Self::NO_OFFLOAD != 0
    }

    /// Says whether the object is dropped rather than kept on a disk tier.
    pub fn set_no_offload(&mut self, on: bool) {
        self.set(Self::NO_OFFLOAD, on);
    }
}

/// A soft-pin change requested by a write, committed when the write's first replica completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftPinRequest {
    /// What to do.
    pub action: SoftPinAction,
    /// TTL for `Enable` (already defaulted and validated).
    pub ttl_ms: u64,
}

/// State of a write between its Start and End/Revoke.
#[derive(Debug)]
pub struct PendingWrite {
    /// Only this client may End or Revoke.
    pub writer: ClientId,
    /// Which of the writer's writes this is: the id of its first replica (fresh for every Start, in-place
    /// upserts included), so a client's overlapping writes of one key cannot end or revoke each other's.
    pub write: u64,
    /// When the write started (discard/release timers).
    pub started: Timestamp,
    /// Soft-pin change to commit at End.
    pub soft_pin: SoftPinRequest,
    /// Quota charged at Start and not yet settled.
    pub pending_charge: u64,
}

/// An object's rarely present state (see `ObjectState::cold`).
#[derive(Debug, Default)]
pub(crate) struct ColdState {
    /// Present while a write is in flight.
    pending: Option<PendingWrite>,
    /// Soft-pin deadline; `Timestamp(0)` = none.
    soft_pin: Timestamp,
}

/// An object's settled quota charge as counted once ([`ObjectState::settled`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettledCharge {
    copies: u32,
    /// The charge in bytes.
    pub bytes: u64,
}

/// The mutable state of an object, guarded by the object's lock.
#[derive(Debug)]
pub struct ObjectState {
    /// Publication state.
    pub lifecycle: Lifecycle,
    /// Never evicted.
    pub hard_pinned: bool,
    /// Stored with the object.
    pub data_type: ObjectDataType,
    /// Whether `checksum` holds a value, and whether the object is dropped rather than kept on a disk tier.
    pub flags: ObjectFlags,
    /// Object bytes.
    pub size: u64,
    /// Writer-supplied checksum (crc32c of the object), returned to readers. 32 bits, as a crc32c is: a PutEnd
    /// with a wider value is refused, so it sits in the word the small fields share.
    pub checksum: u32,
    /// Read lease: no eviction or non-forced removal before it (expired ⇔ now ≥ lease).
    pub lease: Timestamp,
    /// Readers holding the current lease that have not released it. The last release ends the lease at once;
    /// a reader that never releases (gone, or an existence check) holds it until its deadline. Meaningless
    /// once the lease has expired (the next grant starts again from one). 16 bits keep the object small; at
    /// the cap the count sticks, and the lease then runs to its deadline (never ends early).
    pub readers: u16,
    /// Bumped (wrapping) each time a write completes: eviction that selected an older version must not take
    /// the newer one (a wrap needs 65 536 rewrites of one object within one round: a hot object evicted, no
    /// more).
    pub version: u16,
    /// Memory replicas whose quota is charged (the settled charge is `size` × this): a count, not bytes, so it
    /// shares a word with the small fields above instead of taking one of its own.
    pub(crate) charged_copies: u32,
    /// What most objects do not have, out of line in one box (present only while either is): the write in
    /// flight and the soft-pin deadline.
    pub(crate) cold: Option<Box<ColdState>>,
    /// Replicas in placement order.
    pub replicas: SmallVec<[Replica; 1]>,
}

impl ObjectState {
    /// A published object of `size` bytes with no replica, lease, pin, charge or write yet: what a writer
    /// fills in (`ObjectState { replicas, pending, ..ObjectState::new(size) }`).
    pub fn new(size: u64) -> Self {
        Self {
            lifecycle: Lifecycle::Active,
            hard_pinned: false,
            data_type: ObjectDataType::Unknown,
            flags: ObjectFlags::default(),
            size,
            checksum: 0,
            lease: Timestamp(0),
            readers: 0,
            version: 0,
            charged_copies: 0,
            cold: None,
            replicas: SmallVec::new(),
        }
    }

    /// Whether any replica is readable.
    pub fn has_readable(&self) -> bool {
        self.replicas.iter().any(Replica::is_readable)
    }

    /// Whether the soft pin is in force at `now`.
    pub fn soft_pinned(&self, now: Timestamp) -> bool {
        let pin = self.soft_pin();
        pin.0 != 0 && now < pin
    }

    /// The soft-pin deadline (`Timestamp(0)`: none).
    pub fn soft_pin(&self) -> Timestamp {
        self.cold.as_ref().map_or(Timestamp(0), |c| c.soft_pin)
    }

    /// Sets the soft-pin deadline (`Timestamp(0)`: none).
    pub fn set_soft_pin(&mut self, deadline: Timestamp) {
        if deadline.0 == 0 && self.cold.is_none() {
            return;
        }
        self.cold.get_or_insert_with(Box::default).soft_pin = deadline;
        self.shed_cold();
    }

    /// The write in flight, if any.
    pub fn pending(&self) -> Option<&PendingWrite> {
        self.cold.as_ref().and_then(|c| c.pending.as_ref())
    }

    /// Starts tracking a write in flight (replacing any).
    pub fn set_pending(&mut self, write: PendingWrite) {
        self.cold.get_or_insert_with(Box::default).pending = Some(write);
    }

    /// Takes the write in flight out of the object.
    pub fn take_pending(&mut self) -> Option<PendingWrite> {
        let write = self.cold.as_mut().and_then(|c| c.pending.take());
        self.shed_cold();
        write
    }

    /// Frees the out-of-line state once it holds nothing.
    fn shed_cold(&mut self) {
        if self.cold.as_ref().is_some_and(|c| c.pending.is_none() && c.soft_pin.0 == 0) {
            self.cold = None;
        }
    }

    /// Whether a read lease is in force at `now`.
    pub fn leased(&self, now: Timestamp) -> bool {
        now < self.lease
    }

    /// Grants a read lease until at least `deadline` to one more reader.
    pub fn grant_lease(&mut self, now: Timestamp, deadline: Timestamp) {
        if !self.leased(now) {
            self.readers = 0;
        }
        self.readers = self.readers.saturating_add(1);
        self.lease = self.lease.max(deadline);
    }

    /// One reader is done with its lease; the last one ends it at `now`.
    pub fn release_lease(&mut self, now: Timestamp) {
        if !self.leased(now) || self.readers == 0 || self.readers == u16::MAX {
            return;
        }
        self.readers -= 1;
        if self.readers == 0 {
            self.lease = now;
        }
    }

    /// The charge the object settles at now: size × completed, valid memory replicas. Read it once and settle
    /// with that value ([`ObjectState::settle`]): a replica's validity is its segment's liveness, which an
    /// unmount changes without the object's lock, so a second count may differ from the one the quota was
    /// settled against.
    pub fn settled(&self) -> SettledCharge {
        let n = self.replicas.iter().filter(|r| r.is_memory() && r.status == ReplicaStatus::Complete && r.is_valid());
        let copies = u32::try_from(n.count()).unwrap_or(u32::MAX);
        SettledCharge { copies, bytes: self.size.saturating_mul(u64::from(copies)) }
    }

    /// Quota bytes charged for completed memory replicas (the settled charge).
    pub fn charged(&self) -> u64 {
        self.size.saturating_mul(u64::from(self.charged_copies))
    }

    /// Makes `s` (read by [`ObjectState::settled`] under this lock) the object's charge.
    pub fn settle(&mut self, s: SettledCharge) {
        self.charged_copies = s.copies;
    }

    /// Takes the whole charge out of the object (it now holds none); returns its bytes.
    pub fn take_charge(&mut self) -> u64 {
        let bytes = self.charged();
        self.charged_copies = 0;
        bytes
    }

    /// Puts back a charge [`ObjectState::take_charge`] took (the size has not changed since).
    pub fn restore_charge(&mut self, bytes: u64) {
        debug_assert!(self.size > 0 && bytes.is_multiple_of(self.size), "a charge is whole copies of the object");
        self.charged_copies = u32::try_from(bytes.checked_div(self.size).unwrap_or(0)).unwrap_or(u32::MAX);
    }

    /// Charges `copies` more memory replicas (copies just completed).
    pub fn charge_copies(&mut self, copies: u32) {
        self.charged_copies = self.charged_copies.saturating_add(copies);
    }

    /// Whether a copy of it to a disk tier is under way (a `Processing` disk replica: only offloads make one).
    pub fn offloading(&self) -> bool {
        self.replicas.iter().any(|r| r.tier == Tier::Disk && r.status == ReplicaStatus::Processing)
    }

    /// Whether a disk tier holds a readable copy.
    pub fn on_disk(&self) -> bool {
        self.replicas.iter().any(|r| r.tier == Tier::Disk && r.is_readable())
    }

    /// The object's writer ([`super::writers`] number of the client whose PutEnd made its replicas readable;
    /// a disk copy inherits it): its first replica's.
    pub fn writer(&self) -> u32 {
        self.replicas.first().map_or(super::writers::UNKNOWN, |r| r.writer)
    }

    /// Bytes eviction may take from this object in `tier`: complete replicas there, unpinned by refcount,
    /// readable.
    pub fn evictable_bytes(&self, tier: Tier) -> u64 {
        self.replicas.iter().filter(|r| r.is_evictable(tier)).map(|r| r.buffer.size()).sum()
    }
}

/// One object: identity, its group (if any) and its lock.
pub struct ObjectEntry {
    id: ObjectId,
    /// Keys up to 24 bytes are stored inline (no second allocation per object).
    key: CompactString,
    /// Holds the explicit group alive for as long as any handle to a member exists.
    group: Option<Arc<GroupEntry>>,
    state: Mutex<ObjectState>,
}

impl std::fmt::Debug for ObjectEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectEntry").field("id", &self.id).field("key", &self.key).finish_non_exhaustive()
    }
}

impl ObjectEntry {
    /// A new entry (lifecycle taken from `state`).
    pub fn new(id: ObjectId, key: &str, group: Option<Arc<GroupEntry>>, state: ObjectState) -> Self {
        Self { id, key: CompactString::new(key), group, state: Mutex::new(state) }
    }

    /// The object id.
    pub fn id(&self) -> ObjectId {
        self.id
    }

    /// The user key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The explicit group, if the object is a member of one.
    pub fn group(&self) -> Option<&Arc<GroupEntry>> {
        self.group.as_ref()
    }

    /// Locks the object.
    pub fn lock(&self) -> ObjectGuard<'_> {
        let guard = super::lock_stats::acquire(LockClass::Object, || self.state.try_lock(), || self.state.lock());
        #[cfg(debug_assertions)]
        OBJECT_LOCKS_HELD.with(|n| n.set(n.get() + 1));
        ObjectGuard { guard }
    }
}

#[cfg(debug_assertions)]
thread_local! {
    /// Object locks this thread holds (debug builds): lets the code that must never run under one check it.
    static OBJECT_LOCKS_HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// How many object locks the calling thread holds (always 0 in release builds, which do not count).
pub fn object_locks_held() -> u32 {
    #[cfg(debug_assertions)]
    return OBJECT_LOCKS_HELD.with(std::cell::Cell::get);
    #[cfg(not(debug_assertions))]
    0
}

/// A held object lock. Counts itself in debug builds, so timer and retry indexes can assert they are never
/// touched under an object lock (the RFC's rule).
pub struct ObjectGuard<'a> {
    guard: MutexGuard<'a, ObjectState>,
}

impl std::ops::Deref for ObjectGuard<'_> {
    type Target = ObjectState;
    fn deref(&self) -> &ObjectState {
        &self.guard
    }
}

impl std::ops::DerefMut for ObjectGuard<'_> {
    fn deref_mut(&mut self) -> &mut ObjectState {
        &mut self.guard
    }
}

impl Drop for ObjectGuard<'_> {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        OBJECT_LOCKS_HELD.with(|n| n.set(n.get().saturating_sub(1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_whose_reader_count_saturated_runs_to_its_deadline() {
        let mut st = ObjectState::new(1);
        let (now, deadline) = (Timestamp(10), Timestamp(100));
        for _ in 0..70_000 {
            st.grant_lease(now, deadline);
        }
        st.release_lease(now);
        assert!(st.leased(now), "more readers than the count holds: none may end it early");
        let mut one = st;
        one.lease = Timestamp(0);
        one.grant_lease(now, deadline);
        one.release_lease(now);
        assert!(!one.leased(now), "a lone reader's release ends it");
    }

    #[test]
    fn layout_stays_compact() {
        // Memory per object is a target (≤ 200 B with a ~20-byte key): keep an eye on the hot structs.
        let (entry, state, replica) =
            (std::mem::size_of::<ObjectEntry>(), std::mem::size_of::<ObjectState>(), std::mem::size_of::<Replica>());
        eprintln!("ObjectEntry {entry} B, ObjectState {state} B, Replica {replica} B");
        assert!(replica <= 48, "Replica grew to {replica} B");
        // The writer number lives in Replica's former padding: the object's layout did not grow for it.
        assert!(state <= 96, "ObjectState grew to {state} B");
        // With its `Arc` counts an entry is 160 B: mimalloc's 160-byte class (v2; v3 serves aligned 160-byte
        // blocks from its 192 class). 8 bytes more and every object takes a 192-byte block; 112 would make it 128.
        assert!(entry + 16 <= 160, "ObjectEntry grew to {entry} B");
    }
}
