//! `TenantRegistry` and `TenantState`: the outer ownership boundary of object metadata.
//!
//! The registry is sharded; each shard is an immutable map behind an `ArcSwap`, so a lookup is a lock-free
//! load plus one hash probe, and registering a tenant copies only its shard.

use super::index::ObjectIndex;
use super::object::{ObjectEntry, ObjectState, ReplicaList};
use super::quota::QuotaAccount;
use arc_swap::ArcSwap;
use crescent_proto::TenantId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

const SHARDS: usize = 16;

/// Instance ids of tenant states, unique in this process: a re-created tenant of the same name is another
/// instance, so a handle (or a deferred job) holding the old one can tell.
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

/// Where a tenant is in its teardown (the RFC's lifecycle: close admission, unregister, drain, release).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TenantLifecycle {
    /// Registered and admitting operations.
    Active = 0,
    /// Being removed: new operations are refused while the ones in flight drain.
    Closing = 1,
    /// Unregistered: nothing may act on this instance again.
    Removed = 2,
}

/// One tenant: its quota account and its objects.
#[derive(Debug)]
pub struct TenantState {
    id: TenantId,
    /// This instance (see [`NEXT_INSTANCE`]).
    instance: u64,
    /// A [`TenantLifecycle`].
    lifecycle: AtomicU8,
    /// Operations holding a [`TenantOp`] on this instance: teardown waits for them.
    inflight: AtomicU64,
    quota: QuotaAccount,
    objects: ObjectIndex,
}

/// An operation admitted on a tenant: while it lives, the tenant cannot be torn down (teardown refuses after
/// a bounded wait). Derefs to the tenant.
#[derive(Debug)]
pub struct TenantOp {
    tenant: Arc<TenantState>,
    /// Whether this op is counted in `inflight` (a tenant that can never be removed skips the count).
    counted: bool,
}

impl std::ops::Deref for TenantOp {
    type Target = Arc<TenantState>;
    fn deref(&self) -> &Arc<TenantState> {
        &self.tenant
    }
}

impl Drop for TenantOp {
    fn drop(&mut self) {
        if self.counted {
            self.tenant.inflight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl TenantState {
    /// A tenant with the given account.
    pub fn new(id: TenantId, quota: QuotaAccount) -> Self {
        Self {
            id,
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            lifecycle: AtomicU8::new(TenantLifecycle::Active as u8),
            inflight: AtomicU64::new(0),
            quota,
            objects: ObjectIndex::default(),
        }
    }

    /// The tenant id.
    pub fn id(&self) -> &TenantId {
        &self.id
    }

    /// This instance's id: differs from any earlier or later tenant of the same name.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// Where the tenant is in its lifecycle.
    pub fn lifecycle(&self) -> TenantLifecycle {
        match self.lifecycle.load(Ordering::SeqCst) {
            0 => TenantLifecycle::Active,
            1 => TenantLifecycle::Closing,
            _ => TenantLifecycle::Removed,
        }
    }

    /// Admits one operation, or `None` once teardown has begun. `counted: false` for a tenant that is never
    /// torn down (single-tenant mode's default), which then costs no shared counter.
    pub fn enter(self: &Arc<Self>, counted: bool) -> Option<TenantOp> {
        if counted {
            // SeqCst on both sides (here: count, then check; teardown: close, then read the count): either this
            // op sees the tenant closing, or teardown sees this op.
            self.inflight.fetch_add(1, Ordering::SeqCst);
        }
        let op = TenantOp { tenant: self.clone(), counted };
        (self.lifecycle() == TenantLifecycle::Active).then_some(op)
    }

    /// Operations admitted and not yet finished.
    pub fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::SeqCst)
    }

    /// Teardown step 1: close admission. False if the tenant was not active.
    pub fn close(&self) -> bool {
        self.lifecycle
            .compare_exchange(
                TenantLifecycle::Active as u8,
                TenantLifecycle::Closing as u8,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
    }

    /// Teardown abandoned (the tenant was not empty): admit operations again.
    pub fn reopen(&self) {
        let _ = self.lifecycle.compare_exchange(
            TenantLifecycle::Closing as u8,
            TenantLifecycle::Active as u8,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    /// Teardown's end: this instance is unregistered for good.
    pub fn mark_removed(&self) {
        self.lifecycle.store(TenantLifecycle::Removed as u8, Ordering::SeqCst);
    }

    /// The quota account.
    pub fn quota(&self) -> &QuotaAccount {
        &self.quota
    }

    /// The tenant's objects and groups.
    pub fn objects(&self) -> &ObjectIndex {
        &self.objects
    }

    /// Step 1 of erasing an object, under its lock: mark it `Removing`, take its replicas and return its quota
    /// (settled and pending). The caller drops the replicas and calls [`TenantState::detach`] after unlocking.
    pub fn retire(&self, st: &mut ObjectState) -> ReplicaList {
        let (replicas, quota) = Self::retire_unreleased(st);
        self.release_quota(quota);
        replicas
    }

    /// [`TenantState::retire`] leaving the quota to the caller: returns the replicas and the bytes of quota the
    /// object held, for [`TenantState::release_quota`] once the retirement is durable.
    pub fn retire_unreleased(st: &mut ObjectState) -> (ReplicaList, u64) {
        st.set_lifecycle(super::object::Lifecycle::Removing);
        let pending = st.take_pending().map_or(0, |p| p.pending_charge);
        let quota = st.take_charge() + pending;
        (std::mem::take(&mut st.replicas), quota)
    }

    /// Re-settles an object's charge after replicas were removed from it (under its lock).
    pub fn resettle(&self, st: &mut ObjectState) {
        self.release_quota(Self::resettle_unreleased(st));
    }

    /// [`TenantState::resettle`] leaving the quota to the caller: returns the bytes of charge the object no
    /// longer holds.
    pub fn resettle_unreleased(st: &mut ObjectState) -> u64 {
        let (was, now) = (st.charged(), st.settled());
        if now.bytes < was {
            st.settle(now);
            return was - now.bytes;
        }
        0
    }

    /// Releases quota, logging (never failing) on a bookkeeping mismatch.
    pub fn release_quota(&self, bytes: u64) {
        if bytes != 0
            && let Err(e) = self.quota.release(bytes)
        {
            tracing::error!(tenant = %self.id, bytes, error = %e, "quota release mismatch");
        }
    }

    /// Step 2 of erasing an object, with no object lock held: leave its group (dropping the group when it
    /// empties) and matched-unlink its route.
    pub fn detach(&self, entry: &Arc<ObjectEntry>) {
        if let Some(group) = entry.group() {
            let mut members = group.lock();
            self.detach_locked(entry, group, &mut members);
        } else {
            self.objects.unlink_if_match(entry);
        }
    }

    /// [`TenantState::detach`] for a caller that already holds the group's lock.
    pub fn detach_locked(
        &self,
        entry: &Arc<ObjectEntry>,
        group: &Arc<super::index::GroupEntry>,
        members: &mut super::index::GroupMembers,
    ) {
        if members.remove(entry) {
            group.mark_dirty();
        }
        self.objects.unlink_if_match(entry);
        if members.is_empty() && !members.removing {
            members.removing = true;
            self.objects.remove_group_if_match(group);
        }
    }
}

type Shard = HashMap<TenantId, Arc<TenantState>>;

/// Every known tenant.
#[derive(Debug)]
pub struct TenantRegistry {
    shards: Box<[ArcSwap<Shard>]>,
    writers: Box<[Mutex<()>]>,
    hasher: std::hash::RandomState,
}

impl Default for TenantRegistry {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| ArcSwap::from_pointee(HashMap::new())).collect(),
            writers: (0..SHARDS).map(|_| Mutex::new(())).collect(),
            hasher: std::hash::RandomState::new(),
        }
    }
}

impl TenantRegistry {
    fn shard_of(&self, id: &TenantId) -> usize {
        (self.hasher.hash_one(id) as usize) % SHARDS
    }

    /// The tenant, if registered.
    pub fn get(&self, id: &TenantId) -> Option<Arc<TenantState>> {
        self.shards[self.shard_of(id)].load().get(id).cloned()
    }

    /// The tenant, creating it with `make` if absent (copy-on-write of one shard).
    pub fn get_or_insert_with(&self, id: &TenantId, make: impl FnOnce() -> TenantState) -> Arc<TenantState> {
        let i = self.shard_of(id);
        if let Some(t) = self.shards[i].load().get(id) {
            return t.clone();
        }
        let _w = self.writers[i].lock();
        let cur = self.shards[i].load_full();
        if let Some(t) = cur.get(id) {
            return t.clone();
        }
        let t = Arc::new(make());
        let mut next = (*cur).clone();
        next.insert(id.clone(), t.clone());
        self.shards[i].store(Arc::new(next));
        t
    }

    /// Unregisters the tenant if the registry still holds this very state.
    pub fn remove_if_match(&self, state: &Arc<TenantState>) -> bool {
        let i = self.shard_of(state.id());
        let _w = self.writers[i].lock();
        let cur = self.shards[i].load_full();
        if !cur.get(state.id()).is_some_and(|t| Arc::ptr_eq(t, state)) {
            return false;
        }
        let mut next = (*cur).clone();
        next.remove(state.id());
        self.shards[i].store(Arc::new(next));
        true
    }

    /// Every tenant, ordered by id.
    pub fn all(&self) -> Vec<Arc<TenantState>> {
        let mut v: Vec<Arc<TenantState>> =
            self.shards.iter().flat_map(|s| s.load().values().cloned().collect::<Vec<_>>()).collect();
        v.sort_by(|a, b| a.id().cmp(b.id()));
        v
    }
}
