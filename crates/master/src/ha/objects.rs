//! The readable objects of a [`ReplayState`](super::ReplayState), held compactly.
//!
//! A standby folds every PUT_END into this table and a leader's snapshotter keeps one beside the live master, so
//! at tens of millions of objects its size per object decides whether a machine can hold a cluster's metadata
//! at all. Built from [`ObjectRecord`]s as a map of `(String, String)` to them it took ~300 bytes per object
//! (two strings and a replica vector on the heap, a 160-byte slot); here a slot is 96 bytes with nothing on
//! the heap for the usual object (one replica, a key of at most 24 bytes, no group, no soft pin): tenants,
//! segments and writers are numbers into small tables of their own, and what few objects carry more (more
//! replicas, a group, a soft pin, a checksum wider than a crc32c) keeps it in one box. Slots are kept densely
//! in a vector, found through a hash table of 32-bit slot numbers: a hash table of the slots themselves is up
//! to half empty at a power of two, with every page of it touched.
//!
//! The table answers in [`ObjectRecord`]s (built on demand) and [`ReplayObject`] views, so what goes in comes
//! out unchanged: the oplog, the snapshot codec and a restore see the records they always saw.

use super::payload::{ObjectRecord, ReplicaRecord};
use compact_str::CompactString;
use crescent_proto::{ClientId, SegmentId};
use std::hash::{BuildHasher, Hash, Hasher};
use uuid::Uuid;

/// Values interned by number (tenant names, segment ids, writer ids): few distinct values, each stored once
/// however many objects name it. Numbers are never reused; the tables only grow, by one entry per tenant,
/// segment or writer ever seen.
#[derive(Debug, Clone, Default)]
struct Interner<T: Hash + Eq + Clone> {
    values: Vec<T>,
    numbers: hashbrown::HashMap<T, u32>,
}

impl<T: Hash + Eq + Clone> Interner<T> {
    fn number(&mut self, value: &T) -> u32 {
        if let Some(n) = self.numbers.get(value) {
            return *n;
        }
        // More than 4 billion distinct tenants, segments or writers would need more memory than any master has.
        let n = u32::try_from(self.values.len()).unwrap_or(u32::MAX);
        self.values.push(value.clone());
        self.numbers.insert(value.clone(), n);
        n
    }

    fn find<Q: Hash + hashbrown::Equivalent<T> + ?Sized>(&self, value: &Q) -> Option<u32> {
        self.numbers.get(value).copied()
    }

    fn get(&self, n: u32) -> &T {
        &self.values[n as usize]
    }
}

/// A slot's key: the tenant's number and the key (inline up to 24 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    key: CompactString,
    tenant: u32,
}

/// A key as it is hashed.
struct Lookup<'a> {
    tenant: u32,
    key: &'a str,
}

impl Hash for Lookup<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u32(self.tenant);
        self.key.hash(state);
    }
}

/// No replica in a [`Replica`] slot.
const NO_SEGMENT: u32 = u32::MAX;

/// The first replica of an object, its segment by number (`NO_SEGMENT`: the object has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Replica {
    id: u64,
    offset: u64,
    length: u64,
    segment: u32,
    tier: u8,
}

/// What only some objects have, out of line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Extra {
    /// Replicas after the first.
    more: Vec<ReplicaRecord>,
    group: Option<String>,
    soft_pin_ms: u64,
    /// A checksum that does not fit 32 bits (never one a master wrote; kept so what went in comes out).
    wide_checksum: Option<u64>,
}

/// Flag bits of a [`Packed`] object.
const HAS_CHECKSUM: u8 = 1;
const HARD_PINNED: u8 = 2;
const NO_OFFLOAD: u8 = 4;

/// One object's record, packed (64 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Packed {
    size: u64,
    first: Replica,
    checksum: u32,
    /// The writer's number + 1 (0: unknown).
    writer: u32,
    flags: u8,
    data_type: u8,
    extra: Option<Box<Extra>>,
}

/// One object: its key and record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    key: Key,
    packed: Packed,
}

/// The readable objects by `(tenant, key)` (see the module).
#[derive(Clone, Default)]
pub struct ReplayObjects {
    /// The objects, densely (a removal moves the last one into its place): a hash table of 96-byte slots would
    /// be up to half empty, and every page of it touched.
    slots: Vec<Slot>,
    /// Each object's slot number, by the hash of its key (5 bytes a bucket).
    index: hashbrown::HashTable<u32>,
    hasher: hashbrown::DefaultHashBuilder,
    tenants: Interner<CompactString>,
    segments: Interner<[u8; 16]>,
    writers: Interner<[u8; 16]>,
}

/// One object of a [`ReplayObjects`], read in place.
#[derive(Clone, Copy)]
pub struct ReplayObject<'a> {
    table: &'a ReplayObjects,
    key: &'a Key,
    packed: &'a Packed,
}

impl<'a> ReplayObject<'a> {
    /// Its tenant.
    pub fn tenant(&self) -> &'a str {
        self.table.tenants.get(self.key.tenant)
    }

    /// Its key.
    pub fn key(&self) -> &'a str {
        &self.key.key
    }

    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.packed.size
    }

    /// Its replicas, in placement order.
    pub fn replicas(&self) -> impl Iterator<Item = ReplicaRecord> + use<'a> {
        let table = self.table;
        let first = self.packed.first;
        let more = self.packed.extra.as_deref().map_or(&[][..], |e| &e.more[..]);
        (first.segment != NO_SEGMENT)
            .then(move || ReplicaRecord {
                id: first.id,
                segment: *table.segments.get(first.segment),
                offset: first.offset,
                length: first.length,
                tier: first.tier,
            })
            .into_iter()
            .chain(more.iter().cloned())
    }

    /// Its record, as it went in.
    pub fn record(&self) -> ObjectRecord {
        ObjectRecord {
            size: self.size(),
            replicas: self.replicas().collect(),
            checksum: self.checksum(),
            group: self.group().map(str::to_owned),
            hard_pinned: self.hard_pinned(),
            soft_pin_ms: self.soft_pin_ms(),
            data_type: self.data_type(),
            no_offload: self.no_offload(),
            writer: self.writer(),
        }
    }

    /// Its group, if it is in one.
    pub fn group(&self) -> Option<&'a str> {
        self.packed.extra.as_deref().and_then(|e| e.group.as_deref())
    }

    /// The writer's checksum, if given.
    pub fn checksum(&self) -> Option<u64> {
        let p = self.packed;
        match p.extra.as_deref().and_then(|e| e.wide_checksum) {
            Some(wide) => Some(wide),
            None => (p.flags & HAS_CHECKSUM != 0).then_some(u64::from(p.checksum)),
        }
    }

    /// Never evicted.
    pub fn hard_pinned(&self) -> bool {
        self.packed.flags & HARD_PINNED != 0
    }

    /// Dropped rather than kept on a disk tier when memory eviction takes it.
    pub fn no_offload(&self) -> bool {
        self.packed.flags & NO_OFFLOAD != 0
    }

    /// The soft pin it had left (ms; 0: none).
    pub fn soft_pin_ms(&self) -> u64 {
        self.packed.extra.as_deref().map_or(0, |e| e.soft_pin_ms)
    }

    /// Its `ObjectDataType` wire number.
    pub fn data_type(&self) -> u8 {
        self.packed.data_type
    }

    /// The client that wrote it, if known.
    pub fn writer_id(&self) -> Option<ClientId> {
        self.writer().map(|b| ClientId(Uuid::from_bytes(b)))
    }

    fn writer(&self) -> Option<[u8; 16]> {
        self.packed.writer.checked_sub(1).map(|n| *self.table.writers.get(n))
    }
}

impl ReplayObjects {
    /// An empty table with room for `n` objects.
    pub fn with_capacity(n: usize) -> Self {
        Self { slots: Vec::with_capacity(n), index: hashbrown::HashTable::with_capacity(n), ..Self::default() }
    }

    /// How many objects it holds.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// How many objects it holds without growing.
    pub fn capacity(&self) -> usize {
        self.slots.capacity().min(self.index.capacity())
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Makes room for `n` more objects.
    pub fn reserve(&mut self, n: usize) {
        self.slots.reserve(n);
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index.reserve(n, |&i| hash_of(hasher, &slots[i as usize].key));
    }

    /// [`ReplayObjects::reserve`] that gives up (and says so) when the room cannot be had.
    pub fn try_reserve(&mut self, n: usize) -> bool {
        if self.slots.try_reserve(n).is_err() {
            return false;
        }
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index.try_reserve(n, |&i| hash_of(hasher, &slots[i as usize].key)).is_ok()
    }

    /// The slot number of tenant number `tenant`'s `key`, and its hash.
    fn find(&self, tenant: u32, key: &str) -> (Option<usize>, u64) {
        let hash = self.hasher.hash_one(Lookup { tenant, key });
        let slots = &self.slots;
        let found = self.index.find(hash, |&i| {
            let k = &slots[i as usize].key;
            k.tenant == tenant && k.key == key
        });
        (found.map(|&i| i as usize), hash)
    }

    /// Removes slot `i` (its index entry already gone): the last slot moves into its place.
    fn remove_slot(&mut self, i: usize) {
        let last = self.slots.len() - 1;
        self.slots.swap_remove(i);
        if i != last {
            let hash = hash_of(&self.hasher, &self.slots[i].key);
            if let Some(moved) = self.index.find_mut(hash, |&j| j as usize == last) {
                *moved = i as u32;
            }
        }
    }

    /// Removes slot `i` and its index entry.
    fn remove_at(&mut self, i: usize) {
        let hash = hash_of(&self.hasher, &self.slots[i].key);
        if let Ok(entry) = self.index.find_entry(hash, |&j| j as usize == i) {
            entry.remove();
        }
        self.remove_slot(i);
    }

    /// Sets `(tenant, key)` to `o` (replacing what it held).
    pub fn insert(&mut self, tenant: &str, key: &str, o: ObjectRecord) {
        let tenant = match self.tenants.find(tenant) {
            Some(n) => n,
            None => self.tenants.number(&CompactString::from(tenant)),
        };
        let packed = self.pack(o);
        match self.find(tenant, key) {
            (Some(i), _) => self.slots[i].packed = packed,
            (None, hash) => {
                // Slot numbers are 32-bit: four billion objects would take half a terabyte of this table alone.
                let Ok(i) = u32::try_from(self.slots.len()) else {
                    tracing::error!(tenant, key, "replayed table full: object dropped");
                    return;
                };
                self.slots.push(Slot { key: Key { key: key.into(), tenant }, packed });
                let (slots, hasher) = (&self.slots, &self.hasher);
                self.index.insert_unique(hash, i, |&j| hash_of(hasher, &slots[j as usize].key));
            }
        }
    }

    /// The record of `(tenant, key)`, if it is held.
    pub fn get(&self, tenant: &str, key: &str) -> Option<ObjectRecord> {
        self.view(tenant, key).map(|o| o.record())
    }

    /// Whether `(tenant, key)` is held.
    pub fn contains(&self, tenant: &str, key: &str) -> bool {
        self.view(tenant, key).is_some()
    }

    /// The object `(tenant, key)`, read in place.
    pub fn view(&self, tenant: &str, key: &str) -> Option<ReplayObject<'_>> {
        let tenant = self.tenants.find(tenant)?;
        let slot = &self.slots[self.find(tenant, key).0?];
        Some(ReplayObject { table: self, key: &slot.key, packed: &slot.packed })
    }

    /// Drops `(tenant, key)`; whether it was held.
    pub fn remove(&mut self, tenant: &str, key: &str) -> bool {
        let Some(tenant) = self.tenants.find(tenant) else { return false };
        let Some(i) = self.find(tenant, key).0 else { return false };
        self.remove_at(i);
        true
    }

    /// Every object, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = ReplayObject<'_>> {
        self.slots.iter().map(move |s| ReplayObject { table: self, key: &s.key, packed: &s.packed })
    }

    /// Drops every replica on `segment`, and the objects left with none (a SEGMENT_UNMOUNT).
    pub fn drop_segment(&mut self, segment: &[u8; 16]) {
        let Some(n) = self.segments.find(segment) else { return };
        // From the end: a removal moves the last slot, one already seen, into the place of the one it removes.
        for i in (0..self.slots.len()).rev() {
            let p = &mut self.slots[i].packed;
            if let Some(extra) = p.extra.as_deref_mut() {
                extra.more.retain(|r| r.segment != *segment);
            }
            if p.first.segment == n {
                // The next replica, if any, moves up.
                let next = p.extra.as_deref_mut().and_then(|e| (!e.more.is_empty()).then(|| e.more.remove(0)));
                p.first = match next {
                    Some(r) => Replica {
                        id: r.id,
                        offset: r.offset,
                        length: r.length,
                        segment: self.segments.find(&r.segment).unwrap_or(NO_SEGMENT),
                        tier: r.tier,
                    },
                    None => Replica { segment: NO_SEGMENT, ..p.first },
                };
            }
            if p.first.segment == NO_SEGMENT {
                self.remove_at(i);
            }
        }
    }

    /// Drops every object of `tenant` in `group` (a GROUP_REMOVE).
    pub fn remove_group(&mut self, tenant: &str, group: &str) {
        let Some(tenant) = self.tenants.find(tenant) else { return };
        for i in (0..self.slots.len()).rev() {
            let Slot { key, packed } = &self.slots[i];
            if key.tenant == tenant && packed.extra.as_deref().and_then(|e| e.group.as_deref()) == Some(group) {
                self.remove_at(i);
            }
        }
    }

    /// Every replica's range `(offset, length)` by segment (what a restore rebuilds each region's allocator
    /// from), each segment's list sized once: counted by the segments' numbers first, no lookup per replica.
    pub fn ranges_by_segment(&self) -> hashbrown::HashMap<SegmentId, Vec<(u64, u64)>> {
        let mut counts = vec![0usize; self.segments.values.len()];
        self.each_range(|n, _, _| counts[n] += 1);
        let mut lists: Vec<Vec<(u64, u64)>> = counts.iter().map(|&n| Vec::with_capacity(n)).collect();
        self.each_range(|n, offset, length| lists[n].push((offset, length)));
        lists
            .into_iter()
            .enumerate()
            .filter(|(_, l)| !l.is_empty())
            .map(|(n, l)| (SegmentId(Uuid::from_bytes(*self.segments.get(n as u32))), l))
            .collect()
    }

    /// Calls `f(segment number, offset, length)` for every replica of every object.
    fn each_range(&self, mut f: impl FnMut(usize, u64, u64)) {
        for Slot { packed: p, .. } in &self.slots {
            if p.first.segment != NO_SEGMENT {
                f(p.first.segment as usize, p.first.offset, p.first.length);
            }
            for r in p.extra.as_deref().map_or(&[][..], |e| &e.more[..]) {
                if let Some(n) = self.segments.find(&r.segment) {
                    f(n as usize, r.offset, r.length);
                }
            }
        }
    }

    /// How many objects each tenant holds (tenants holding none left out).
    pub fn per_tenant(&self) -> Vec<(&str, usize)> {
        let mut counts = vec![0usize; self.tenants.values.len()];
        for Slot { key: k, .. } in &self.slots {
            counts[k.tenant as usize] += 1;
        }
        counts
            .into_iter()
            .enumerate()
            .filter(|(_, n)| *n > 0)
            .map(|(t, n)| (self.tenants.get(t as u32).as_str(), n))
            .collect()
    }

    /// Clears every soft pin (they are the old process's: a restored master's objects compete evenly).
    pub fn clear_soft_pins(&mut self) {
        for Slot { packed: p, .. } in &mut self.slots {
            if let Some(extra) = p.extra.as_deref_mut() {
                extra.soft_pin_ms = 0;
            }
            if p.extra.as_deref().is_some_and(|e| *e == Extra::default()) {
                p.extra = None;
            }
        }
    }

    fn pack(&mut self, o: ObjectRecord) -> Packed {
        let ObjectRecord { size, replicas, checksum, group, hard_pinned, soft_pin_ms, data_type, no_offload, writer } =
            o;
        let mut replicas = replicas.into_iter();
        let first = match replicas.next() {
            Some(r) => Replica {
                id: r.id,
                offset: r.offset,
                length: r.length,
                segment: self.segments.number(&r.segment),
                tier: r.tier,
            },
            None => Replica { id: 0, offset: 0, length: 0, segment: NO_SEGMENT, tier: 0 },
        };
        // Later replicas' segments are interned too, so a drop of their segment finds them by number.
        let more: Vec<ReplicaRecord> = replicas.collect();
        for r in &more {
            self.segments.number(&r.segment);
        }
        let narrow = checksum.map(u32::try_from);
        let wide_checksum = match narrow {
            Some(Err(_)) => checksum,
            _ => None,
        };
        let extra = Extra { more, group, soft_pin_ms, wide_checksum };
        let mut flags = 0;
        if matches!(narrow, Some(Ok(_))) {
            flags |= HAS_CHECKSUM;
        }
        if hard_pinned {
            flags |= HARD_PINNED;
        }
        if no_offload {
            flags |= NO_OFFLOAD;
        }
        Packed {
            size,
            first,
            checksum: match narrow {
                Some(Ok(c)) => c,
                _ => 0,
            },
            writer: writer.map_or(0, |w| self.writers.number(&w).saturating_add(1)),
            flags,
            data_type,
            extra: (extra != Extra::default()).then(|| Box::new(extra)),
        }
    }
}

/// An object serialises as its [`ObjectRecord`] does, field for field, without building one (a snapshot writes
/// tens of millions of them).
impl serde::Serialize for ReplayObject<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("ObjectRecord", 9)?;
        s.serialize_field("size", &self.size())?;
        s.serialize_field("replicas", &ReplicasOf(*self))?;
        s.serialize_field("checksum", &self.checksum())?;
        s.serialize_field("group", &self.group())?;
        s.serialize_field("hard_pinned", &self.hard_pinned())?;
        s.serialize_field("soft_pin_ms", &self.soft_pin_ms())?;
        s.serialize_field("data_type", &self.data_type())?;
        s.serialize_field("no_offload", &self.no_offload())?;
        s.serialize_field("writer", &self.writer())?;
        s.end()
    }
}

/// An object's replicas, serialised as its record's vector.
struct ReplicasOf<'a>(ReplayObject<'a>);

impl serde::Serialize for ReplicasOf<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let p = self.0.packed;
        let count = usize::from(p.first.segment != NO_SEGMENT) + p.extra.as_deref().map_or(0, |e| e.more.len());
        let mut seq = serializer.serialize_seq(Some(count))?;
        for r in self.0.replicas() {
            seq.serialize_element(&r)?;
        }
        seq.end()
    }
}

/// The hash of `key` in a table hashing with `hasher`.
fn hash_of(hasher: &hashbrown::DefaultHashBuilder, key: &Key) -> u64 {
    hasher.hash_one(Lookup { tenant: key.tenant, key: &key.key })
}

impl PartialEq for ReplayObjects {
    /// The same objects with the same records (whatever numbers each table gave tenants, segments and writers).
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().all(|o| other.get(o.tenant(), o.key()) == Some(o.record()))
    }
}

impl Eq for ReplayObjects {}

impl std::fmt::Debug for ReplayObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter().map(|o| ((o.tenant(), o.key()), o.record()))).finish()
    }
}

impl<'a> FromIterator<(&'a str, &'a str, ObjectRecord)> for ReplayObjects {
    fn from_iter<I: IntoIterator<Item = (&'a str, &'a str, ObjectRecord)>>(iter: I) -> Self {
        let mut table = ReplayObjects::default();
        for (tenant, key, o) in iter {
            table.insert(tenant, key, o);
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(id: u64, segment: u8) -> ReplicaRecord {
        ReplicaRecord { id, segment: [segment; 16], offset: id * 4096, length: 4096, tier: 0 }
    }

    fn record(replicas: Vec<ReplicaRecord>) -> ObjectRecord {
        ObjectRecord {
            size: 4096,
            replicas,
            checksum: Some(7),
            group: None,
            hard_pinned: false,
            soft_pin_ms: 0,
            data_type: 1,
            no_offload: false,
            writer: Some([9; 16]),
        }
    }

    #[test]
    fn a_slot_is_96_bytes_and_the_usual_object_has_nothing_on_the_heap() {
        assert_eq!(std::mem::size_of::<Packed>(), 64);
        assert_eq!(std::mem::size_of::<Slot>(), 96);
        let mut t = ReplayObjects::default();
        t.insert("default", "a-key-of-24-bytes-at-mos", record(vec![replica(1, 1)]));
        let o = t.view("default", "a-key-of-24-bytes-at-mos").unwrap();
        assert!(o.packed.extra.is_none() && !o.key.key.is_heap_allocated());
    }

    #[test]
    fn removals_keep_every_other_object_findable() {
        let mut t = ReplayObjects::default();
        let key = |i: u64| format!("k{i}");
        for i in 0..300 {
            t.insert(if i % 2 == 0 { "a" } else { "b" }, &key(i), record(vec![replica(i, (i % 5) as u8)]));
        }
        // Every third, in an order that moves slots from the end into the middle.
        for i in (0..300).filter(|i| i % 3 == 0).rev().chain([1000]) {
            let tenant = if i % 2 == 0 { "a" } else { "b" };
            assert_eq!(t.remove(tenant, &key(i)), i < 300, "{i}");
        }
        t.drop_segment(&[4; 16]);
        t.remove_group("a", "none");
        for i in 0..300 {
            let tenant = if i % 2 == 0 { "a" } else { "b" };
            let kept = i % 3 != 0 && i % 5 != 4;
            let got = t.get(tenant, &key(i));
            assert_eq!(got.map(|o| o.replicas[0].id), kept.then_some(i), "{i}");
        }
        assert_eq!(t.len(), (0..300).filter(|i| i % 3 != 0 && i % 5 != 4).count());
        assert_eq!(t.iter().count(), t.len());
    }

    #[test]
    fn every_field_comes_out_as_it_went_in() {
        let mut t = ReplayObjects::default();
        let plain = record(vec![replica(1, 1)]);
        let full = ObjectRecord {
            replicas: vec![replica(2, 1), replica(3, 2), replica(4, 3)],
            checksum: Some(u64::from(u32::MAX) + 1),
            group: Some("g".into()),
            hard_pinned: true,
            soft_pin_ms: 30_000,
            data_type: 3,
            no_offload: true,
            writer: None,
            ..plain.clone()
        };
        let none = ObjectRecord { replicas: vec![], checksum: None, ..plain.clone() };
        t.insert("default", "plain", plain.clone());
        t.insert("t2", "full", full.clone());
        t.insert("default", "none", none.clone());
        assert_eq!(t.get("default", "plain"), Some(plain.clone()));
        assert_eq!(t.get("t2", "full"), Some(full.clone()));
        assert_eq!(t.get("default", "none"), Some(none));
        assert_eq!(t.get("t2", "plain"), None, "keys are per tenant");
        assert_eq!(t.get("t3", "plain"), None);
        assert_eq!(t.view("t2", "full").unwrap().group(), Some("g"));
        // Replacing keeps one slot.
        t.insert("default", "plain", full.clone());
        assert_eq!((t.len(), t.get("default", "plain")), (3, Some(full)));
        assert!(t.remove("default", "plain") && !t.remove("default", "plain") && !t.contains("default", "plain"));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn a_segment_dropped_takes_its_replicas_and_the_objects_left_with_none() {
        let mut t = ReplayObjects::default();
        t.insert("default", "only-on-1", record(vec![replica(1, 1)]));
        t.insert("default", "first-on-1", record(vec![replica(2, 1), replica(3, 2), replica(4, 3)]));
        t.insert("default", "second-on-1", record(vec![replica(5, 2), replica(6, 1)]));
        t.insert("default", "elsewhere", record(vec![replica(7, 3)]));
        t.drop_segment(&[1; 16]);
        t.drop_segment(&[8; 16]);
        assert!(!t.contains("default", "only-on-1"));
        let ids =
            |t: &ReplayObjects, k: &str| t.view("default", k).unwrap().replicas().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(ids(&t, "first-on-1"), [3, 4], "the next replica moved up");
        assert_eq!(ids(&t, "second-on-1"), [5]);
        assert_eq!(ids(&t, "elsewhere"), [7]);
        let ranges = t.ranges_by_segment();
        assert_eq!(ranges.len(), 2, "segment 1 holds nothing now: {ranges:?}");
        let on = |s: u8| {
            let mut l = ranges[&SegmentId(Uuid::from_bytes([s; 16]))].clone();
            l.sort_unstable();
            l
        };
        assert_eq!(on(2), [(3 * 4096, 4096), (5 * 4096, 4096)]);
        assert_eq!(on(3), [(4 * 4096, 4096), (7 * 4096, 4096)]);
        t.drop_segment(&[2; 16]);
        assert_eq!(ids(&t, "first-on-1"), [4]);
        assert!(!t.contains("default", "second-on-1"));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn an_object_serialises_byte_for_byte_as_its_record() {
        let mut t = ReplayObjects::default();
        let plain = record(vec![replica(1, 1)]);
        let full = ObjectRecord {
            replicas: vec![replica(2, 1), replica(3, 2)],
            checksum: Some(u64::MAX),
            group: Some("g".into()),
            hard_pinned: true,
            soft_pin_ms: 30_000,
            no_offload: true,
            writer: None,
            ..plain.clone()
        };
        let none = ObjectRecord { replicas: vec![], checksum: None, ..plain.clone() };
        for (k, o) in [("plain", plain), ("full", full), ("none", none)] {
            t.insert("default", k, o.clone());
            let view = t.view("default", k).unwrap();
            assert_eq!(postcard::to_stdvec(&view).unwrap(), postcard::to_stdvec(&o).unwrap(), "{k}");
        }
    }

    #[test]
    fn groups_and_soft_pins() {
        let mut t = ReplayObjects::default();
        let member = |g: &str| ObjectRecord { group: Some(g.into()), soft_pin_ms: 5, ..record(vec![replica(1, 1)]) };
        t.insert("a", "x", member("g"));
        t.insert("b", "x", member("g"));
        t.insert("a", "y", member("h"));
        t.remove_group("a", "g");
        t.remove_group("c", "g");
        assert!(!t.contains("a", "x") && t.contains("b", "x") && t.contains("a", "y"));
        t.insert("a", "pinned", ObjectRecord { soft_pin_ms: 9, ..record(vec![replica(2, 1)]) });
        let mut per_tenant = t.per_tenant();
        per_tenant.sort_unstable();
        assert_eq!(per_tenant, [("a", 2), ("b", 1)]);
        t.clear_soft_pins();
        assert!(t.iter().all(|o| o.record().soft_pin_ms == 0));
        assert!(t.view("a", "pinned").unwrap().packed.extra.is_none(), "an emptied box is freed");
        assert_eq!(t.get("a", "y").unwrap().group.as_deref(), Some("h"));
    }

    #[test]
    fn tables_are_equal_by_content_whatever_their_numbering() {
        let (a, b) = (record(vec![replica(1, 1)]), record(vec![replica(2, 2)]));
        let one: ReplayObjects = [("t", "a", a.clone()), ("u", "b", b.clone())].into_iter().collect();
        let two: ReplayObjects = [("u", "b", b), ("t", "a", a.clone())].into_iter().collect();
        assert_eq!(one, two);
        let three: ReplayObjects = [("t", "a", a)].into_iter().collect();
        assert_ne!(one, three);
    }
}
