//! `ObjectIndex`: a tenant's objects and explicit groups.
//!
//! Point lookup is one hash of the key: it picks a route shard and probes that shard's table, which stores
//! only `Arc<ObjectEntry>` (the key lives once, in the entry). The route lock is released before the caller
//! takes any object or group lock. Erase is a *matched unlink*: the route is removed only if it still names
//! the same entry, so delayed work can never unlink a re-created key.
//!
//! Lock order: group members lock → route shard lock (publish/unlink) and group members lock → member object
//! locks in canonical key order. A route shard lock is never held while taking a group or object lock.

use super::lock_stats::{LockClass, acquire};
use super::object::{ObjectEntry, ObjectId};
use hashbrown::HashTable;
use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

const SHARD_BITS: u32 = 6;
const SHARDS: usize = 1 << SHARD_BITS;

/// The route hash of a key.
pub fn route_hash(key: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key.as_bytes())
}

fn entry_hash(e: &Arc<ObjectEntry>) -> u64 {
    route_hash(e.key())
}

/// The route shard of a hash (see `ObjectIndex::shard`).
fn shard_index(hash: u64) -> usize {
    ((hash >> 32) as usize) & (SHARDS - 1)
}

/// A group's id: numeric, unique within its tenant's index for the index's lifetime (member objects and
/// later work name a group by it; the name is stored once, in the group).
pub type GroupId = u64;

/// Membership of an explicit group, guarded by the group lock.
#[derive(Debug, Default)]
pub struct GroupMembers {
    /// Set when the last member left or the group is being erased; a removing group takes no new members.
    pub removing: bool,
    /// Current members by object id (weak: members own the group, not the reverse); adding and removing one
    /// member is O(1) whatever the group's size.
    members: HashMap<ObjectId, Weak<ObjectEntry>>,
}

impl GroupMembers {
    /// Live members sorted by key: the canonical order for locking several members.
    pub fn live_sorted(&self) -> Vec<Arc<ObjectEntry>> {
        let mut v: Vec<Arc<ObjectEntry>> = self.members.values().filter_map(Weak::upgrade).collect();
        v.sort_by(|a, b| a.key().cmp(b.key()));
        v
    }

    /// Adds a member.
    pub fn add(&mut self, entry: &Arc<ObjectEntry>) {
        self.members.insert(entry.id(), Arc::downgrade(entry));
    }

    /// Removes `entry` if it is the member under its id (matched: a re-created object with another id is not
    /// touched). Returns whether it was.
    pub fn remove(&mut self, entry: &Arc<ObjectEntry>) -> bool {
        match self.members.get(&entry.id()) {
            Some(w) if std::ptr::eq(w.as_ptr(), Arc::as_ptr(entry)) => self.members.remove(&entry.id()).is_some(),
            _ => false,
        }
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the group has no member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

/// An explicit group: a named set of objects that share leases and are evicted together.
#[derive(Debug)]
pub struct GroupEntry {
    id: GroupId,
    name: Arc<str>,
    members: Mutex<GroupMembers>,
    /// Membership changed since the last shared lease refresh. Set under the members lock; read without it so
    /// a read of a member that needs no refresh never touches the group lock.
    dirty: AtomicBool,
}

impl GroupEntry {
    /// The group's id.
    pub fn id(&self) -> GroupId {
        self.id
    }

    /// The group's name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Locks the membership (before any member's object lock).
    pub fn lock(&self) -> MutexGuard<'_, GroupMembers> {
        acquire(LockClass::Group, || self.members.try_lock(), || self.members.lock())
    }

    /// Records a membership change (call with the members lock held).
    pub fn mark_dirty(&self) {
        self.dirty.store(true, Ordering::Release);
    }

    /// Whether membership changed since the last refresh.
    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    /// Clears the change mark (call with the members lock held, when refreshing).
    pub fn clear_dirty(&self) {
        self.dirty.store(false, Ordering::Release);
    }
}

/// The explicit groups of one index, by name and by id.
#[derive(Debug, Default)]
struct GroupCatalog {
    by_name: HashMap<Arc<str>, Arc<GroupEntry>>,
    by_id: HashMap<GroupId, Arc<GroupEntry>>,
    next_id: GroupId,
}

/// A tenant's route index and group catalog.
#[derive(Debug)]
pub struct ObjectIndex {
    routes: Box<[RwLock<HashTable<Arc<ObjectEntry>>>]>,
    groups: Mutex<GroupCatalog>,
}

impl Default for ObjectIndex {
    fn default() -> Self {
        Self {
            routes: (0..SHARDS).map(|_| RwLock::new(HashTable::new())).collect(),
            groups: Mutex::new(GroupCatalog { next_id: 1, ..GroupCatalog::default() }),
        }
    }
}

type Routes = HashTable<Arc<ObjectEntry>>;

/// A route shard's shared lock, counted when contended.
fn read_routes(lock: &RwLock<Routes>) -> RwLockReadGuard<'_, Routes> {
    acquire(LockClass::Route, || lock.try_read(), || lock.read())
}

/// A route shard's exclusive lock, counted when contended.
fn write_routes(lock: &RwLock<Routes>) -> RwLockWriteGuard<'_, Routes> {
    acquire(LockClass::Route, || lock.try_write(), || lock.write())
}

impl ObjectIndex {
    /// The shard of a route hash. Its bits must be ones the shard's table does not use: hashbrown places a
    /// key by the hash's low bits and tags it with the top 7, so a shard picked by the top bits would leave
    /// every key in it with nearly the same tag, and a probe would compare keys at almost every slot
    /// (measured: a third of a batch put's master time in lookups and `memcmp`).
    fn shard(&self, hash: u64) -> &RwLock<HashTable<Arc<ObjectEntry>>> {
        &self.routes[shard_index(hash)]
    }

    /// The entry routed under `key` (any lifecycle; callers check it under the object lock).
    pub fn get(&self, key: &str) -> Option<Arc<ObjectEntry>> {
        let h = route_hash(key);
        read_routes(self.shard(h)).find(h, |e| e.key() == key).cloned()
    }

    /// Publishes `entry` under its key unless a route exists; returns the existing entry then.
    pub fn insert_if_absent(&self, entry: Arc<ObjectEntry>) -> Result<(), Arc<ObjectEntry>> {
        let h = route_hash(entry.key());
        let mut t = write_routes(self.shard(h));
        if let Some(existing) = t.find(h, |e| e.key() == entry.key()) {
            return Err(existing.clone());
        }
        t.insert_unique(h, entry, entry_hash);
        Ok(())
    }

    /// Removes the route of `entry` only if it still names this very entry (matched unlink).
    pub fn unlink_if_match(&self, entry: &Arc<ObjectEntry>) -> bool {
        let h = route_hash(entry.key());
        let mut t = write_routes(self.shard(h));
        match t.find_entry(h, |e| Arc::ptr_eq(e, entry)) {
            Ok(occupied) => {
                let (removed, absent) = occupied.remove();
                let table = absent.into_table();
                // Give memory back once a shard has emptied out (mass removal or eviction).
                if table.capacity() > 64 && table.len() * 4 < table.capacity() {
                    table.shrink_to(table.len() * 2, entry_hash);
                }
                drop(removed);
                true
            }
            Err(_) => false,
        }
    }

    /// Makes room for `additional` more objects, spread over the shards as route hashes spread them (a restore
    /// knows its count: tables sized once are not rehashed again and again while they fill).
    pub fn reserve(&self, additional: usize) {
        let per_shard = additional.div_ceil(SHARDS);
        // Hashes do not split exactly evenly: a little headroom keeps the fullest shard from one last rehash.
        let per_shard = per_shard + per_shard / 32;
        for shard in self.routes.iter() {
            write_routes(shard).reserve(per_shard, entry_hash);
        }
    }

    /// Number of routed objects: the shards' counts, each read under its shared lock. (No counter of its own:
    /// one atomic bumped by every insert and removal was a cache line every writing thread fought over, a
    /// fifth of a parallel restore's time; callers are the census and statistics, never a request's path.)
    pub fn len(&self) -> usize {
        self.routes.iter().map(|shard| read_routes(shard).len()).sum()
    }

    /// Whether no object is routed.
    pub fn is_empty(&self) -> bool {
        self.routes.iter().all(|shard| read_routes(shard).is_empty())
    }

    /// Census: copies handles in chunks of at most `chunk` bucket slots under one shard's shared lock, calling
    /// `f` on each chunk with no lock held. Resumes by bucket index (removals do not move buckets); if a shard
    /// grew meanwhile its scan restarts, so every object routed for the whole census is visited at least once.
    pub fn visit_chunks(&self, chunk: usize, f: impl FnMut(Vec<Arc<ObjectEntry>>)) {
        self.visit_matching(chunk, |_| true, f);
    }

    /// A census of the entries whose key `keep` admits: like [`ObjectIndex::visit_chunks`], but only admitted
    /// handles are copied out of a shard (a listing with a prefix clones only the keys that have it). `keep`
    /// runs under the shard's shared lock: it must be cheap and take no lock.
    pub fn visit_matching(&self, chunk: usize, keep: impl Fn(&str) -> bool, mut f: impl FnMut(Vec<Arc<ObjectEntry>>)) {
        let chunk = chunk.max(1);
        for shard in self.routes.iter() {
            let mut cursor = 0usize;
            let mut buckets = read_routes(shard).num_buckets();
            loop {
                let batch: Vec<Arc<ObjectEntry>> = {
                    let t = read_routes(shard);
                    if t.num_buckets() != buckets {
                        buckets = t.num_buckets();
                        cursor = 0;
                    }
                    let end = (cursor + chunk).min(buckets);
                    let batch =
                        (cursor..end).filter_map(|i| t.get_bucket(i).filter(|e| keep(e.key())).cloned()).collect();
                    cursor = end;
                    batch
                };
                if !batch.is_empty() {
                    f(batch);
                }
                if cursor >= buckets {
                    break;
                }
            }
        }
    }

    /// The live group called `name`, creating it if needed (a removing group is replaced).
    pub fn group_or_create(&self, name: &str) -> Arc<GroupEntry> {
        let mut g = self.groups.lock();
        if let Some(existing) = g.by_name.get(name) {
            return existing.clone();
        }
        let name: Arc<str> = Arc::from(name);
        let id = g.next_id;
        g.next_id += 1;
        let entry = Arc::new(GroupEntry {
            id,
            name: name.clone(),
            members: Mutex::new(GroupMembers::default()),
            dirty: AtomicBool::new(false),
        });
        g.by_name.insert(name, entry.clone());
        g.by_id.insert(id, entry.clone());
        entry
    }

    /// The live group called `name`.
    pub fn group(&self, name: &str) -> Option<Arc<GroupEntry>> {
        self.groups.lock().by_name.get(name).cloned()
    }

    /// The live group with this id.
    pub fn group_by_id(&self, id: GroupId) -> Option<Arc<GroupEntry>> {
        self.groups.lock().by_id.get(&id).cloned()
    }

    /// Forgets `group` if the catalog still names it (called with the group lock held, after its last member
    /// left or the group was erased, and it was marked removing).
    pub fn remove_group_if_match(&self, group: &Arc<GroupEntry>) {
        let mut g = self.groups.lock();
        if g.by_id.get(&group.id()).is_some_and(|e| Arc::ptr_eq(e, group)) {
            g.by_id.remove(&group.id());
            g.by_name.remove(group.name());
        }
    }

    /// Number of live explicit groups.
    pub fn group_count(&self) -> usize {
        self.groups.lock().by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::ObjectState;

    #[test]
    fn groups_are_found_by_name_and_by_id_and_a_recreated_group_is_another() {
        let idx = ObjectIndex::default();
        let a = idx.group_or_create("a");
        let b = idx.group_or_create("b");
        assert_ne!(a.id(), b.id());
        assert!(Arc::ptr_eq(&idx.group_or_create("a"), &a), "the same name is the same group");
        assert!(Arc::ptr_eq(&idx.group_by_id(b.id()).unwrap(), &b));
        a.lock().removing = true;
        idx.remove_group_if_match(&a);
        assert!(idx.group("a").is_none() && idx.group_by_id(a.id()).is_none());
        let again = idx.group_or_create("a");
        assert!(again.id() > b.id(), "ids are never reused");
        assert_eq!(idx.group_count(), 2);
    }

    #[test]
    fn keys_of_one_shard_still_spread_over_the_table_tags() {
        // hashbrown tags each slot with the hash's top 7 bits; if the shard choice fixed those bits, a probe
        // would have to compare keys at nearly every slot of the shard.
        let mut tags = std::collections::HashSet::new();
        for i in 0..20_000 {
            let h = route_hash(&format!("prefix-shared-by-every-key-{i}"));
            if shard_index(h) == 0 {
                tags.insert(h >> 57);
            }
        }
        assert!(tags.len() > 100, "only {} of 128 tags in one shard", tags.len());
    }

    fn entry(key: &str) -> Arc<ObjectEntry> {
        let st = ObjectState::new(1);
        Arc::new(ObjectEntry::new(key, None, st))
    }

    #[test]
    fn matched_unlink_never_removes_a_recreated_key() {
        let d = ObjectIndex::default();
        let old = entry("k");
        d.insert_if_absent(old.clone()).unwrap();
        assert!(d.insert_if_absent(entry("k")).is_err(), "one route per key");
        assert!(d.unlink_if_match(&old));
        let new = entry("k");
        d.insert_if_absent(new.clone()).unwrap();
        // Stale work holding the old handle cannot unlink the new object.
        assert!(!d.unlink_if_match(&old));
        assert!(d.get("k").is_some_and(|e| Arc::ptr_eq(&e, &new) && e.id() != old.id()));
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn census_visits_every_entry_and_tables_shrink_after_mass_removal() {
        let d = ObjectIndex::default();
        let all: Vec<_> = (0..40_000).map(|i| entry(&format!("key-{i}"))).collect();
        for e in &all {
            d.insert_if_absent(e.clone()).unwrap();
        }
        let mut seen = std::collections::HashSet::new();
        d.visit_chunks(100, |chunk| seen.extend(chunk.iter().map(|e| e.key().to_owned())));
        assert_eq!(seen.len(), 40_000);
        let cap_before: usize = d.routes.iter().map(|s| s.read().capacity()).sum();
        for e in &all {
            assert!(d.unlink_if_match(e));
        }
        let cap_after: usize = d.routes.iter().map(|s| s.read().capacity()).sum();
        assert!(cap_after <= SHARDS * 64 && cap_after * 8 < cap_before, "{cap_after} vs {cap_before}");
        assert!(d.is_empty());
    }
}
