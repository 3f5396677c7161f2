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
use std::sync::Arc;

/// An object's identity ([`ObjectEntry::id`]): erase/recreate of a key yields a new one.
pub type ObjectId = usize;

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

/// An object's replicas in placement order: one inline (most objects have one), more in a vector. Not a
/// `SmallVec`: its length word would cost every object 8 bytes, where this enum's tag takes a value the inline
/// replica's own fields never hold (the layout test checks it stays the size of one replica).
#[derive(Debug)]
pub struct ReplicaList(Replicas);

#[derive(Debug)]
enum Replicas {
    One(Replica),
    /// None, or two and more: a list that shrinks to one goes back inline (its vector freed).
    Many(Vec<Replica>),
}

impl Default for ReplicaList {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplicaList {
    /// No replicas (allocates nothing).
    pub const fn new() -> Self {
        Self(Replicas::Many(Vec::new()))
    }

    /// Appends `r` (the last in placement order).
    pub fn push(&mut self, r: Replica) {
        self.0 = match std::mem::take(self).0 {
            Replicas::One(first) => Replicas::Many(vec![first, r]),
            Replicas::Many(v) if v.is_empty() => Replicas::One(r),
            Replicas::Many(mut v) => {
                v.push(r);
                Replicas::Many(v)
            }
        };
    }

    /// Removes and returns the replica at `at`, keeping the order of the rest.
    ///
    /// # Panics
    /// If `at` is out of bounds, as `Vec::remove` does.
    pub fn remove(&mut self, at: usize) -> Replica {
        let len = self.len();
        assert!(at < len, "replica index {at} out of bounds ({len} replicas)");
        match std::mem::take(self).0 {
            Replicas::One(r) => r,
            Replicas::Many(mut v) => {
                let r = v.remove(at);
                *self = Self::from(v);
                r
            }
        }
    }

    /// Keeps only the replicas `keep` accepts, in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&Replica) -> bool) {
        match &mut self.0 {
            Replicas::One(r) => {
                if !keep(r) {
                    *self = Self::new();
                }
            }
            Replicas::Many(v) => {
                v.retain(|r| keep(r));
                self.shrink();
            }
        }
    }

    /// A vector left with one replica moves it inline; an empty one frees its buffer.
    fn shrink(&mut self) {
        if let Replicas::Many(v) = &mut self.0 {
            if v.len() == 1 {
                if let Some(r) = v.pop() {
                    self.0 = Replicas::One(r);
                }
            } else if v.is_empty() {
                *v = Vec::new();
            }
        }
    }
}

impl std::ops::Deref for ReplicaList {
    type Target = [Replica];
    fn deref(&self) -> &[Replica] {
        match &self.0 {
            Replicas::One(r) => std::slice::from_ref(r),
            Replicas::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for ReplicaList {
    fn deref_mut(&mut self) -> &mut [Replica] {
        match &mut self.0 {
            Replicas::One(r) => std::slice::from_mut(r),
            Replicas::Many(v) => v,
        }
    }
}

impl IntoIterator for ReplicaList {
    type Item = Replica;
    type IntoIter = std::iter::Chain<std::option::IntoIter<Replica>, std::vec::IntoIter<Replica>>;
    fn into_iter(self) -> Self::IntoIter {
        match self.0 {
            Replicas::One(r) => Some(r).into_iter().chain(Vec::new()),
            Replicas::Many(v) => None.into_iter().chain(v),
        }
    }
}

impl<'a> IntoIterator for &'a ReplicaList {
    type Item = &'a Replica;
    type IntoIter = std::slice::Iter<'a, Replica>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl Extend<Replica> for ReplicaList {
    fn extend<I: IntoIterator<Item = Replica>>(&mut self, iter: I) {
        for r in iter {
            self.push(r);
        }
    }
}

impl FromIterator<Replica> for ReplicaList {
    fn from_iter<I: IntoIterator<Item = Replica>>(iter: I) -> Self {
        let mut list = Self::new();
        list.extend(iter);
        list
    }
}

impl From<Vec<Replica>> for ReplicaList {
    fn from(v: Vec<Replica>) -> Self {
        let mut list = Self(Replicas::Many(v));
        list.shrink();
        list
    }
}

/// An object's switches and data type, packed in one byte (every object carries them: its size is watched).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectFlags(u8);

impl ObjectFlags {
    const CHECKSUM: u8 = 1;
    const NO_OFFLOAD: u8 = 2;
    const HARD_PINNED: u8 = 4;
    /// Set: [`Lifecycle::Removing`].
    const REMOVING: u8 = 8;
    /// The data type takes the high four bits (ten types today; the layout test checks they fit).
    const DATA_TYPE_SHIFT: u8 = 4;

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
    copies: u16,
    /// The charge in bytes.
    pub bytes: u64,
}

/// The mutable state of an object, guarded by the object's lock.
///
/// Its small fields fill three words exactly (the layout test holds them to it): with the replica list and the
/// lock, an entry is 112 bytes, and its `Arc` lands in the allocator's 128-byte class. Fields narrower than
/// their natural type say so and what happens at their limit.
#[derive(Debug)]
pub struct ObjectState {
    /// Checksum presence, no-offload, hard pin, lifecycle and data type (through the accessors below).
    pub flags: ObjectFlags,
    /// Readers holding the current lease that have not released it. The last release ends the lease at once;
    /// a reader that never releases (gone, or an existence check) holds it until its deadline. Meaningless
    /// once the lease has expired (the next grant starts again from one). At the cap (255) the count sticks,
    /// and the lease then runs to its deadline (never ends early).
    pub readers: u8,
    /// Bumped (wrapping) each time a write completes: eviction that selected an older version must not take
    /// the newer one (a wrap needs 65 536 rewrites of one object within one round: a hot object evicted, no
    /// more).
    pub version: u16,
    /// Writer-supplied checksum (crc32c of the object), returned to readers. 32 bits, as a crc32c is: a PutEnd
    /// with a wider value is refused.
    pub checksum: u32,
    /// Object bytes.
    pub size: u64,
    /// Read lease deadline (no eviction or non-forced removal before it; expired ⇔ now ≥ lease) in 48 bits,
    /// split so the halves share words with the small fields: milliseconds since the clock's epoch, which
    /// 2^48 holds for 8 900 years ([`ObjectState::lease`]).
    lease_low: u32,
    lease_high: u16,
    /// Memory replicas whose quota is charged (the settled charge is `size` × this): a count, not bytes, so it
    /// shares a word with the small fields above instead of taking one of its own. One object has at most one
    /// replica per segment, far fewer than 65 536.
    pub(crate) charged_copies: u16,
    /// What most objects do not have, out of line in one box (present only while either is): the write in
    /// flight and the soft-pin deadline.
    pub(crate) cold: Option<Box<ColdState>>,
    /// Replicas in placement order.
    pub replicas: ReplicaList,
}

/// The largest lease deadline an object stores (48 bits of milliseconds).
const LEASE_MAX: u64 = (1 << 48) - 1;

impl ObjectState {
    /// A published object of `size` bytes with no replica, lease, pin, charge or write yet: what a writer
    /// fills in.
    pub fn new(size: u64) -> Self {
        Self {
            flags: ObjectFlags::default(),
            readers: 0,
            version: 0,
            checksum: 0,
            size,
            lease_low: 0,
            lease_high: 0,
            charged_copies: 0,
            cold: None,
            replicas: ReplicaList::new(),
        }
    }

    /// Publication state.
    pub fn lifecycle(&self) -> Lifecycle {
        if self.flags.0 & ObjectFlags::REMOVING != 0 { Lifecycle::Removing } else { Lifecycle::Active }
    }

    /// Sets the publication state.
    pub fn set_lifecycle(&mut self, l: Lifecycle) {
        self.flags.set(ObjectFlags::REMOVING, l == Lifecycle::Removing);
    }

    /// Never evicted.
    pub fn hard_pinned(&self) -> bool {
        self.flags.0 & ObjectFlags::HARD_PINNED != 0
    }

    /// Pins (or unpins) the object against eviction.
    pub fn set_hard_pinned(&mut self, on: bool) {
        self.flags.set(ObjectFlags::HARD_PINNED, on);
    }

    /// Stored with the object.
    pub fn data_type(&self) -> ObjectDataType {
        // Only `set_data_type` writes these bits: every value there is a type's number.
        ObjectDataType::from_number(self.flags.0 >> ObjectFlags::DATA_TYPE_SHIFT).unwrap_or_default()
    }

    /// Sets the stored data type.
    pub fn set_data_type(&mut self, t: ObjectDataType) {
        self.flags.0 =
            (self.flags.0 & ((1 << ObjectFlags::DATA_TYPE_SHIFT) - 1)) | ((t as u8) << ObjectFlags::DATA_TYPE_SHIFT);
    }

    /// The read lease's deadline (`Timestamp(0)`: never granted).
    pub fn lease(&self) -> Timestamp {
        Timestamp(u64::from(self.lease_high) << 32 | u64::from(self.lease_low))
    }

    /// Moves the read lease's deadline out to `to` if it is earlier.
    pub fn extend_lease(&mut self, to: Timestamp) {
        self.set_lease(self.lease().max(to));
    }

    /// Sets the read lease's deadline (saturating at 2^48 − 1 ms).
    pub fn set_lease(&mut self, t: Timestamp) {
        let ms = t.0.min(LEASE_MAX);
        (self.lease_low, self.lease_high) = (ms as u32, (ms >> 32) as u16);
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
        now < self.lease()
    }

    /// Grants a read lease until at least `deadline` to one more reader.
    pub fn grant_lease(&mut self, now: Timestamp, deadline: Timestamp) {
        if !self.leased(now) {
            self.readers = 0;
        }
        self.readers = self.readers.saturating_add(1);
        self.extend_lease(deadline);
    }

    /// One reader is done with its lease; the last one ends it at `now`.
    pub fn release_lease(&mut self, now: Timestamp) {
        if !self.leased(now) || self.readers == 0 || self.readers == u8::MAX {
            return;
        }
        self.readers -= 1;
        if self.readers == 0 {
            self.set_lease(now);
        }
    }

    /// The charge the object settles at now: size × completed, valid memory replicas. Read it once and settle
    /// with that value ([`ObjectState::settle`]): a replica's validity is its segment's liveness, which an
    /// unmount changes without the object's lock, so a second count may differ from the one the quota was
    /// settled against.
    pub fn settled(&self) -> SettledCharge {
        let n = self.replicas.iter().filter(|r| r.is_memory() && r.status == ReplicaStatus::Complete && r.is_valid());
        let copies = u16::try_from(n.count()).unwrap_or(u16::MAX);
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
        self.charged_copies = u16::try_from(bytes.checked_div(self.size).unwrap_or(0)).unwrap_or(u16::MAX);
    }

    /// Charges `copies` more memory replicas (copies just completed).
    pub fn charge_copies(&mut self, copies: u16) {
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

/// One object: its key, its group (if any) and its lock.
pub struct ObjectEntry {
    name: Name,
    state: Mutex<ObjectState>,
}

/// An object's key and explicit group. Most objects are in no group: the group shares the key's 24 bytes (a
/// member's key and group sit together in one box) instead of costing every object a pointer. Keys up to 24
/// bytes are stored inline (no second allocation per object).
enum Name {
    Plain(CompactString),
    /// The group is held alive for as long as any handle to a member exists.
    Member(Box<(CompactString, Arc<GroupEntry>)>),
}

impl std::fmt::Debug for ObjectEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectEntry").field("id", &self.id()).field("key", &self.key()).finish_non_exhaustive()
    }
}

impl ObjectEntry {
    /// A new entry (lifecycle taken from `state`).
    pub fn new(key: &str, group: Option<Arc<GroupEntry>>, state: ObjectState) -> Self {
        let key = CompactString::new(key);
        let name = match group {
            None => Name::Plain(key),
            Some(g) => Name::Member(Box::new((key, g))),
        };
        Self { name, state: Mutex::new(state) }
    }

    /// The object's identity: its entry's address. No two live entries share it, nor does any entry a handle
    /// (strong or weak) still refers to, since a handle keeps the allocation: an erased and re-created key
    /// never matches an id taken from the old entry while that entry is held.
    pub fn id(&self) -> ObjectId {
        std::ptr::from_ref(self).addr()
    }

    /// The user key.
    pub fn key(&self) -> &str {
        match &self.name {
            Name::Plain(k) => k,
            Name::Member(m) => &m.0,
        }
    }

    /// The explicit group, if the object is a member of one.
    pub fn group(&self) -> Option<&Arc<GroupEntry>> {
        match &self.name {
            Name::Plain(_) => None,
            Name::Member(m) => Some(&m.1),
        }
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
        one.set_lease(Timestamp(0));
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
        // The list's tag lives in a value the inline replica never holds, and a group shares the key's bytes.
        assert_eq!(std::mem::size_of::<ReplicaList>(), replica, "the replica list needs a word of its own");
        assert_eq!(std::mem::size_of::<Name>(), std::mem::size_of::<CompactString>(), "the group costs a word");
        assert!(state <= 80, "ObjectState grew to {state} B");
        // With its `Arc` counts an entry is 128 B: mimalloc's 128-byte class. 8 bytes more and every object
        // takes a 160-byte block.
        assert!(entry + 16 <= 128, "ObjectEntry grew to {entry} B");
    }

    #[test]
    fn every_data_type_fits_the_flags_nibble_beside_the_switches() {
        for n in 0..=u8::MAX {
            let Some(t) = ObjectDataType::from_number(n) else { continue };
            let mut st = ObjectState::new(1);
            st.flags.set_checksum(true);
            st.set_hard_pinned(true);
            st.set_lifecycle(Lifecycle::Removing);
            st.set_data_type(t);
            assert_eq!(st.data_type(), t, "type {n} does not fit four bits");
            assert!(st.flags.has_checksum() && st.hard_pinned() && st.lifecycle() == Lifecycle::Removing);
            assert!(!st.flags.no_offload());
            st.set_lifecycle(Lifecycle::Active);
            st.set_hard_pinned(false);
            assert_eq!((st.data_type(), st.lifecycle(), st.hard_pinned()), (t, Lifecycle::Active, false));
        }
    }

    #[test]
    fn a_lease_deadline_round_trips_through_its_48_bits_and_saturates_past_them() {
        let mut st = ObjectState::new(1);
        for ms in [0, 1, u64::from(u32::MAX), u64::from(u32::MAX) + 1, 1 << 40, LEASE_MAX] {
            st.set_lease(Timestamp(ms));
            assert_eq!(st.lease(), Timestamp(ms));
        }
        st.set_lease(Timestamp(u64::MAX));
        assert_eq!(st.lease(), Timestamp(LEASE_MAX));
        assert!(st.leased(Timestamp(LEASE_MAX - 1)));
    }

    fn replica(id: u64) -> Replica {
        // A buffer in no region (a weak handle to nothing): enough for a list that never reads its space.
        let mut space = crate::alloc::OffsetAllocator::new(1 << 20).unwrap();
        Replica::processing(id, AllocatedBuffer::from_parts(std::sync::Weak::new(), space.allocate(64).unwrap()))
    }

    fn ids(l: &ReplicaList) -> Vec<u64> {
        l.iter().map(|r| r.id).collect()
    }

    #[test]
    fn a_replica_list_keeps_placement_order_through_every_change() {
        let mut l = ReplicaList::new();
        assert!(l.is_empty());
        l.push(replica(1));
        assert_eq!(ids(&l), [1]);
        assert!(matches!(l.0, Replicas::One(_)), "one replica lives inline");
        l.push(replica(2));
        l.push(replica(3));
        assert_eq!(ids(&l), [1, 2, 3]);
        assert_eq!(l.remove(1).id, 2);
        assert_eq!(ids(&l), [1, 3]);
        l.retain(|r| r.id != 1);
        assert_eq!(ids(&l), [3]);
        assert!(matches!(l.0, Replicas::One(_)), "a list shrunk to one goes back inline");
        l.extend([replica(4), replica(5)]);
        let (odd, even): (ReplicaList, ReplicaList) = std::mem::take(&mut l).into_iter().partition(|r| r.id % 2 == 1);
        assert_eq!((ids(&odd), ids(&even)), (vec![3, 5], vec![4]));
        assert!(l.is_empty());
        let mut one = even;
        assert_eq!(one.remove(0).id, 4);
        assert!(one.is_empty() && matches!(&one.0, Replicas::Many(v) if v.capacity() == 0));
        let mut many: ReplicaList = (6..9).map(replica).collect();
        many.retain(|_| false);
        assert!(many.is_empty() && matches!(&many.0, Replicas::Many(v) if v.capacity() == 0), "emptied: freed");
        assert_eq!(ids(&ReplicaList::from(vec![replica(9)])), [9]);
        for r in &mut *many {
            r.refcnt += 1;
        }
    }
}
