//! The service's side of the oplog: attaching a writer, the entries mutations commit, the logged erase (hidden
//! at once, freed once durable), and restoring a replayed log into a fresh service.

use super::MasterService;
use crate::alloc::{AllocatorSnapshot, OffsetAllocator, SnapshotAllocation};
use crate::clock::Timestamp;
use crate::ha::payload::data_type_from;
use crate::ha::{MasterEntry, ObjectRecord, OpLog, ReplayObject, ReplayState, ReplicaRecord, Slot};
use crate::local_ssd::LocalSsdRecord;
use crate::metadata::{
    Lifecycle, ObjectEntry, ObjectGuard, ObjectState, QuotaAccount, Replica, ReplicaList, TenantState, Tier,
};
use crate::segment_pool::{RegionAllocState, RegionReadView, RestoredAllocations, SegmentPoolSnapshotView};
use crescent_proto::{ErrorCode, ReplicaStatus, SegmentId, SegmentKind, SegmentStatus, TenantId};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Below this many objects a restore publishes them on the calling thread (threads cost more than they save).
const PARALLEL_RESTORE_MIN: usize = 1 << 16;
/// At most this many restore threads (the work is memory-bound beyond a few).
const MAX_RESTORE_THREADS: usize = 8;
/// Consecutive table entries one restore thread takes at a time (neighbouring entries share cache lines).
const RESTORE_BLOCK: usize = 4096;

impl MasterService {
    /// Makes every later mutation log through `log` (once; a second call is refused and logged). Attach after
    /// replay and before serving.
    pub fn attach_oplog(&self, log: Arc<OpLog>) {
        if self.oplog.set(log).is_err() {
            tracing::error!("an oplog is already attached: the second one is ignored");
        }
    }

    /// The attached oplog, if any.
    pub fn oplog(&self) -> Option<&Arc<OpLog>> {
        self.oplog.get()
    }

    /// [`MasterService::reserve_oplog`] for bulk removals, which run off the async workers: waits up to a second
    /// while admission is merely full.
    pub(super) fn reserve_oplog_bulk(&self) -> Result<Option<Slot<'_>>, ErrorCode> {
        match self.oplog.get() {
            None => Ok(None),
            Some(log) => log.reserve_within(Duration::from_secs(1)).map(Some),
        }
    }

    /// A slot for one entry, `None` without an oplog (one atomic load: no entry, no lock). Take it before the
    /// metadata locks; a refusal changes nothing.
    #[inline]
    pub(super) fn reserve_oplog(&self) -> Result<Option<Slot<'_>>, ErrorCode> {
        match self.oplog.get() {
            None => Ok(None),
            Some(log) => log.reserve().map(Some),
        }
    }
}

/// The eviction kernel logs through the service's oplog: each evicted object's post-state (PUT_END of what is
/// left, or REMOVE), committed under the object's lock.
impl crate::eviction::EvictionLog for OpLog {
    type Slot<'a> = Slot<'a>;

    fn reserve(&self) -> Option<Slot<'_>> {
        OpLog::reserve(self).ok()
    }

    fn try_reserve(&self) -> Option<Slot<'_>> {
        OpLog::try_reserve(self).ok()
    }

    fn record(
        &self,
        slot: Slot<'_>,
        tenant: &TenantState,
        entry: &ObjectEntry,
        st: &ObjectState,
        now: Timestamp,
        on_durable: Box<dyn FnOnce(u64) + Send>,
    ) -> bool {
        slot.commit(post_state_entry(tenant, entry, st, now), Some(on_durable)).is_ok()
    }
}

fn tier_number(t: Tier) -> u8 {
    match t {
        Tier::Memory => 0,
        Tier::Nof => 1,
        Tier::Disk => 2,
    }
}

/// An object's readable post-state as PUT_END records it (replicas whose segment is gone or unmounting are left
/// out: an UNMOUNT may already be logged for it).
pub(crate) fn object_record(entry: &ObjectEntry, st: &ObjectState, now: Timestamp) -> ObjectRecord {
    let replicas = st
        .replicas
        .iter()
        .filter(|r| r.status == ReplicaStatus::Complete && r.buffer.is_live())
        .filter_map(|r| {
            Some(ReplicaRecord {
                id: r.id,
                segment: *r.buffer.segment_id()?.0.as_bytes(),
                offset: r.buffer.offset(),
                length: r.buffer.size(),
                tier: tier_number(r.tier),
            })
        })
        .collect();
    ObjectRecord {
        size: st.size,
        replicas,
        checksum: st.flags.has_checksum().then_some(u64::from(st.checksum)),
        group: entry.group().map(|g| g.name().to_string()),
        hard_pinned: st.hard_pinned(),
        soft_pin_ms: if st.soft_pinned(now) { st.soft_pin().0 - now.0 } else { 0 },
        data_type: st.data_type() as u8,
        no_offload: st.flags.no_offload(),
        writer: crate::metadata::writers::client(st.writer()).map(|c| *c.0.as_bytes()),
    }
}

/// PUT_END of `entry` in `tenant`; a REMOVE when nothing complete is left to record.
pub(crate) fn post_state_entry(
    tenant: &TenantState,
    entry: &ObjectEntry,
    st: &ObjectState,
    now: Timestamp,
) -> MasterEntry {
    let object = object_record(entry, st, now);
    if object.replicas.is_empty() {
        return remove_entry(tenant, entry);
    }
    MasterEntry::PutEnd { tenant: tenant.id().to_string(), key: entry.key().to_owned(), object }
}

/// REMOVE of `entry` in `tenant`.
pub(crate) fn remove_entry(tenant: &TenantState, entry: &ObjectEntry) -> MasterEntry {
    MasterEntry::Remove { tenant: tenant.id().to_string(), key: entry.key().to_owned() }
}

/// The logged erase of an object whose removal was checked under `st` (RFC §13): the REMOVE entry committed,
/// every replica REMOVED and the object `Removing` (unreadable at once), the route unlinked (the key may be
/// written again at once, as a new object). Space, quota and group membership are released only by the durable
/// callback, which re-locks this very entry and acts only if it is still the removal it was given. The entry is
/// committed first, still under the lock: a log that refuses it (`PERSISTENT_FAIL`) leaves the object as it was.
/// `report` (the removal's events) is published once the REMOVE is durable.
pub(super) fn erase_logged(
    tenant: &Arc<TenantState>,
    entry: &Arc<ObjectEntry>,
    mut st: ObjectGuard<'_>,
    slot: Slot<'_>,
    report: super::events::Report<'_>,
) -> Result<(), ErrorCode> {
    let ids: SmallVec<[u64; 2]> = st.replicas.iter().map(|r| r.id).collect();
    let (t, e) = (Arc::clone(tenant), Arc::clone(entry));
    let finalize = move |_seq| finalize_removal(&t, &e, &ids);
    slot.commit(remove_entry(tenant, entry), report.on_durable(Some(Box::new(finalize))))?;
    for r in st.replicas.iter_mut() {
        r.status = ReplicaStatus::Removed;
    }
    st.set_lifecycle(Lifecycle::Removing);
    drop(st);
    tenant.objects().unlink_if_match(entry);
    Ok(())
}

/// The durable half of a logged erase.
pub(crate) fn finalize_removal(tenant: &TenantState, entry: &Arc<ObjectEntry>, ids: &[u64]) {
    let mut st = entry.lock();
    let same = st.lifecycle() == Lifecycle::Removing
        && st.replicas.len() == ids.len()
        && st.replicas.iter().zip(ids).all(|(r, id)| r.id == *id && r.status == ReplicaStatus::Removed);
    if !same {
        tracing::warn!(key = entry.key(), "durable removal found the object changed: left alone");
        return;
    }
    let dead = tenant.retire(&mut st);
    drop(st);
    tenant.detach(entry);
    drop(dead);
}

/// Bytes a replayed allocation of `length` occupies (what the allocator's normal path would have consumed).
fn consumed_for(length: u64) -> u64 {
    OffsetAllocator::normalized_size(length).unwrap_or(length).max(length)
}

/// The allocations of replayed replica ranges `(offset, length, owner)` in one allocator of `capacity` bytes (a
/// segment's own, or the CXL window all CXL segments share), ascending, each with its owner; a range that
/// overlaps the one before it or runs past the end is dropped (logged, naming `segment(owner)`), so its object is
/// not restored on it. Equal ranges count once.
fn fit_ranges<T: Copy + Ord>(
    mut ranges: Vec<(u64, u64, T)>,
    capacity: u64,
    segment: impl Fn(T) -> SegmentId,
    mut keep: impl FnMut(SnapshotAllocation, T),
) {
    ranges.sort_unstable();
    ranges.dedup_by_key(|r| (r.0, r.1));
    let mut end_prev = 0;
    for (i, &(offset, length, owner)) in ranges.iter().enumerate() {
        let limit = ranges.get(i + 1).map_or(capacity, |n| n.0.min(capacity));
        let fits = offset >= end_prev && offset.checked_add(length).is_some_and(|e| e <= limit);
        if !fits {
            let segment = segment(owner);
            tracing::error!(%segment, offset, length, "replayed replica overlaps another or its region's end: dropped");
            continue;
        }
        let consumed = consumed_for(length).min(limit - offset);
        end_prev = offset + consumed;
        keep(SnapshotAllocation { offset, consumed, requested: length }, owner);
    }
}

impl MasterService {
    /// Rebuilds a fresh service (no segment mounted, nothing written) from a replayed log: tenant policies,
    /// every segment DISCONNECTED until its owner remounts it (for `disconnect_grace_ms`, or one client TTL
    /// when there is no grace), every object readable once its segment is back, and the local SSD
    /// registrations. Returns `(objects, segments)` restored. CXL segments come back as bindings in the
    /// configured CXL window holding their replicas' ranges (dropped, logged, on a master without one); replicas
    /// that do not fit their segment (or the window) are dropped (logged).
    ///
    /// A restored local SSD registration is its client's declaration as last logged; the client is given the
    /// same time as a segment's owner (from now) to ping this master, and is then tracked as any client: one
    /// that never does is expired and its registration dropped, as on the master that had it.
    pub fn restore_replayed(&self, state: &ReplayState) -> Result<(usize, usize), ErrorCode> {
        if let Some(p) = &state.policies
            && self.config.enable_multi_tenants
        {
            self.apply_tenant_policies(p)?;
        }
        let now = self.clock.now();
        let grace_ms = if self.config.disconnect_grace_ms > 0 {
            self.config.disconnect_grace_ms
        } else {
            self.config.client_ttl_ms
        };
        let deadline = now.saturating_add(Duration::from_millis(grace_ms));
        // Phase times go to the log: at tens of millions of objects a restart or a promotion waits for this.
        let started = std::time::Instant::now();
        // Every replica's range per segment, and how many objects each tenant gets.
        let mut ranges = state.objects.ranges_by_segment();
        let per_tenant = state.objects.per_tenant();
        let mut specs = Vec::with_capacity(state.segments.len());
        for (id, rec) in &state.segments {
            let spec = rec.spec().map_err(|e| {
                tracing::error!(segment = %id, error = %e, "replayed segment is malformed");
                ErrorCode::InternalError
            })?;
            if spec.kind == SegmentKind::Cxl && self.config.cxl_window.is_none() {
                tracing::warn!(segment = %id, "replayed CXL segment dropped: this master has no CXL window");
                continue;
            }
            specs.push((spec, rec));
        }
        // CXL segments are bindings in one shared window: their replicas' ranges are fitted in it together.
        let mut cxl: HashMap<SegmentId, Vec<u64>> = HashMap::new();
        let cxl_window = self.config.cxl_window.map(|capacity| {
            let all = specs
                .iter()
                .filter(|(s, _)| s.kind == SegmentKind::Cxl)
                .flat_map(|(s, _)| ranges.remove(&s.id).unwrap_or_default().into_iter().map(|(o, l)| (o, l, s.id)))
                .collect();
            let mut allocations = Vec::new();
            fit_ranges(
                all,
                capacity,
                |s| s,
                |a, segment| {
                    cxl.entry(segment).or_default().push(a.offset);
                    allocations.push(a);
                },
            );
            AllocatorSnapshot { capacity, allocations }
        });
        // Each segment's ranges are sorted and fitted on their own: spread over the cores.
        let own: Vec<_> = specs
            .iter()
            .filter(|(spec, _)| spec.kind != SegmentKind::Cxl)
            .map(|(spec, _)| (spec.id, spec.size, ranges.remove(&spec.id).unwrap_or_default()))
            .collect();
        let threads = crate::parallel::restore_threads(state.objects.len(), PARALLEL_RESTORE_MIN, MAX_RESTORE_THREADS);
        let mut fitted = crate::parallel::map(own, threads, |(id, size, mine)| {
            // `(offset, length)` → `(offset, length, ())` keeps the vector's allocation (same layout).
            let mine: Vec<(u64, u64, ())> = mine.into_iter().map(|(o, l)| (o, l, ())).collect();
            let mut allocations = Vec::with_capacity(mine.len());
            fit_ranges(mine, size, |()| id, |a, ()| allocations.push(a));
            AllocatorSnapshot { capacity: size, allocations }
        })
        .into_iter();
        let mut regions = Vec::with_capacity(specs.len());
        for (spec, rec) in specs {
            let alloc = match spec.kind {
                SegmentKind::Cxl => RegionAllocState::CxlBinding(cxl.remove(&spec.id).unwrap_or_default()),
                // One fitted per segment of its own, in the same order.
                _ => RegionAllocState::Own(
                    fitted.next().unwrap_or_else(|| AllocatorSnapshot { capacity: spec.size, allocations: Vec::new() }),
                ),
            };
            // Checked when decoded (log and snapshot); an unreadable one names nobody.
            if let Ok(Some(p)) = rec.principal() {
                self.mounters.restore(rec.client_id(), p);
            }
            regions.push(RegionReadView {
                alloc,
                spec,
                client: rec.client_id(),
                status: SegmentStatus::Disconnected,
                graceful_deadline: Some(deadline),
            });
        }
        let segments = regions.len();
        self.local_ssd.restore(state.local_ssd.iter().map(|(c, r)| (*c, *r)).collect());
        for client in state.local_ssd.keys() {
            self.clients.touch(*client, deadline);
        }
        self.pool.restore(SegmentPoolSnapshotView { regions, cxl_window }).map_err(|e| {
            tracing::error!(error = %e, "restoring the replayed segments failed");
            e.code()
        })?;
        // After the segments (a running drain holds its own out of placement), before anything is served.
        self.restore_drains(&state.drains);
        let regions_took = started.elapsed();
        for (tenant, n) in per_tenant {
            if let Some(t) = self.replay_tenant(tenant) {
                t.objects().reserve(n);
            }
        }
        // Objects are re-bound and published from several threads (a standby's promotion and a restart wait for
        // this): each thread takes every `threads`-th block of the table, so none copies the table to split it.
        let restored = self.pool.take_restored();
        let threads = crate::parallel::restore_threads(state.objects.len(), PARALLEL_RESTORE_MIN, MAX_RESTORE_THREADS);
        let (objects, max_replica) = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let restored = &restored;
                    s.spawn(move || {
                        let mine = state
                            .objects
                            .iter()
                            .enumerate()
                            .filter(move |(i, _)| (i / RESTORE_BLOCK) % threads == t)
                            .map(|(_, o)| o);
                        self.restore_objects(mine, restored, now)
                    })
                })
                .collect();
            workers.into_iter().fold((0, 0), |(n, max), w| match w.join() {
                Ok((wn, wmax)) => (n + wn, max.max(wmax)),
                Err(panic) => std::panic::resume_unwind(panic),
            })
        });
        self.next_replica_id.fetch_max(max_replica.saturating_add(1), Ordering::Relaxed);
        let orphans = restored.finish();
        if orphans > 0 {
            tracing::warn!(orphans, "replayed allocations no object claimed were freed");
        }
        self.recompute_quotas();
        tracing::info!(
            objects,
            segments,
            threads,
            regions_ms = regions_took.as_millis() as u64,
            objects_ms = (started.elapsed() - regions_took).as_millis() as u64,
            "replayed state restored"
        );
        Ok((objects, segments))
    }

    /// Re-binds and publishes replayed objects; returns how many were published and the highest replica id
    /// seen.
    fn restore_objects<'a>(
        &self,
        objects: impl Iterator<Item = ReplayObject<'a>>,
        restored: &RestoredAllocations,
        now: Timestamp,
    ) -> (usize, u64) {
        let mut published_count = 0;
        let mut max_replica = 0u64;
        // Most masters hold one tenant or a few large ones: the last one looked up is usually the next one. Its
        // quota is charged once per run of its objects (`owed`), not per object: every restoring thread bumping
        // one shared counter per object made them fight over its cache line.
        let mut last_tenant: Option<(&str, Arc<TenantState>)> = None;
        let mut owed = 0u64;
        for o in objects {
            let (tenant, key) = (o.tenant(), o.key());
            let t = match &last_tenant {
                Some((name, t)) if *name == tenant => t.clone(),
                _ => {
                    if let Some((_, t)) = &last_tenant {
                        t.quota().force_charge(std::mem::take(&mut owed));
                    }
                    let Some(t) = self.replay_tenant(tenant) else {
                        last_tenant = None;
                        tracing::error!(tenant, key, "replayed object of an invalid tenant dropped");
                        continue;
                    };
                    last_tenant = Some((tenant, t.clone()));
                    t
                }
            };
            let mut replicas = ReplicaList::new();
            let writer = o.writer_id().map_or(crate::metadata::writers::UNKNOWN, crate::metadata::writers::number);
            for r in o.replicas() {
                max_replica = max_replica.max(r.id);
                match restored.rebind(r.segment_id(), r.offset, r.length) {
                    Ok(buffer) => replicas.push(Replica {
                        id: r.id,
                        buffer,
                        status: ReplicaStatus::Complete,
                        refcnt: 0,
                        tier: match r.tier {
                            1 => Tier::Nof,
                            2 => Tier::Disk,
                            _ => Tier::Memory,
                        },
                        writer,
                    }),
                    Err(e) => tracing::warn!(key, replica = r.id, error = %e, "replayed replica not restored"),
                }
            }
            if replicas.is_empty() {
                continue;
            }
            let mut st = ObjectState::new(o.size());
            // A logged checksum wider than a crc32c was never written by a master: kept as none.
            let checksum = o.checksum().and_then(|c| u32::try_from(c).ok());
            st.checksum = checksum.unwrap_or(0);
            st.replicas = replicas;
            st.set_hard_pinned(o.hard_pinned());
            st.set_data_type(data_type_from(o.data_type()).unwrap_or_default());
            if o.soft_pin_ms() > 0 {
                st.set_soft_pin(now.saturating_add(Duration::from_millis(o.soft_pin_ms())));
            }
            st.flags.set_checksum(checksum.is_some());
            st.flags.set_no_offload(o.no_offload());
            let settled = st.settled();
            st.settle(settled);
            owed += settled.bytes;
            let published = match o.group().filter(|g| !g.is_empty()) {
                None => {
                    let entry = Arc::new(ObjectEntry::new(key, None, st));
                    t.objects().insert_if_absent(entry.clone()).map_err(|_| entry)
                }
                Some(g) => super::write::publish_member(&t, g, key, st),
            };
            match published {
                Ok(()) => published_count += 1,
                Err(loser) => {
                    // Retiring it releases its charge: what is owed is charged first.
                    t.quota().force_charge(std::mem::take(&mut owed));
                    let mut st = loser.lock();
                    let dead = t.retire(&mut st);
                    drop(st);
                    drop(dead);
                    tracing::error!(key, charged = settled.bytes, "replayed object published twice: dropped");
                }
            }
        }
        if let Some((_, t)) = &last_tenant {
            t.quota().force_charge(owed);
        }
        (published_count, max_replica)
    }

    /// The live metadata in the oplog's terms: every segment mounted (as SEGMENT_MOUNT records it), every
    /// readable object (its PUT_END post-state), the local SSD registrations, the drain jobs as last logged,
    /// `last_seq` 0 and no policies. A read view for comparing a
    /// master with a restored or standby one (what a log or a snapshot rebuilds); it takes each object's lock
    /// briefly, one at a time, so it is not one atomic cut of a master under load.
    pub fn metadata_view(&self) -> ReplayState {
        let now = self.clock.now();
        let local_ssd = self.local_ssd.snapshot().into_iter().map(|(c, r)| (c, LocalSsdRecord { used: 0, ..r }));
        let mut state =
            ReplayState { local_ssd: local_ssd.collect(), drains: self.drain_records(), ..ReplayState::default() };
        for r in self.pool.snapshot_view().regions {
            let record = crate::ha::SegmentRecord::new(r.client, &r.spec, self.mounters.get(r.client).as_ref());
            state.segments.insert(r.spec.id, record);
        }
        for t in self.tenants.all() {
            let tenant = t.id().to_string();
            t.objects().visit_chunks(self.config.census_chunk, |chunk| {
                for e in chunk {
                    let st = e.lock();
                    if st.lifecycle() != Lifecycle::Active {
                        continue;
                    }
                    let o = object_record(&e, &st, now);
                    drop(st);
                    if !o.replicas.is_empty() {
                        state.objects.insert(&tenant, e.key(), o);
                    }
                }
            });
        }
        state
    }

    /// The tenant a replayed object belongs in (registered, with a closed account if it has no policy).
    fn replay_tenant(&self, tenant: &str) -> Option<Arc<TenantState>> {
        if !self.config.enable_multi_tenants {
            return self.tenants.get(&TenantId::default_tenant());
        }
        let id = TenantId::new(tenant).ok()?;
        Some(self.tenants.get_or_insert_with(&id, || TenantState::new(id.clone(), QuotaAccount::closed())))
    }
}

#[cfg(test)]
mod tests {
    //! The read path's classification (RFC §13) over replica statuses, set directly.
    use super::*;
    use crate::clock::ManualClock;
    use crate::service::MasterConfig;
    use crescent_proto::{ClientId, ReplicateConfig};

    fn two_replicas() -> (MasterService, Arc<ObjectEntry>) {
        let svc = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1))).unwrap();
        for i in 0..2 {
            svc.mount_segment(ClientId::random(), crescent_testkit::segment(&format!("s{i}"), 1 << 24)).unwrap();
        }
        let w = ClientId::random();
        svc.put_start(w, "", "k", 100, &ReplicateConfig::with_replicas(2)).unwrap();
        svc.put_end(w, "", "k", None).unwrap();
        let e = svc.tenant_for_tests(&TenantId::default_tenant()).objects().get("k").unwrap();
        (svc, e)
    }

    fn set(e: &ObjectEntry, statuses: [ReplicaStatus; 2]) {
        let mut st = e.lock();
        for (r, s) in st.replicas.iter_mut().zip(statuses) {
            r.status = s;
        }
    }

    #[test]
    fn reads_classify_complete_removed_and_in_flight_replicas() {
        use ReplicaStatus::{Complete, Processing, Removed};
        let (svc, e) = two_replicas();
        set(&e, [Removed, Complete]);
        let got = svc.get_replica_list("", "k").unwrap();
        assert_eq!(got.replicas.len(), 1, "only the COMPLETE replica is handed out");
        assert_eq!(got.replicas[0].status, Complete);
        assert_eq!(svc.exist_key("", "k"), Ok(true));
        set(&e, [Removed, Removed]);
        assert_eq!(svc.get_replica_list("", "k").unwrap_err(), ErrorCode::ObjectNotFound, "all REMOVED");
        assert_eq!(svc.exist_key("", "k"), Ok(false));
        set(&e, [Removed, Processing]);
        assert_eq!(svc.get_replica_list("", "k").unwrap_err(), ErrorCode::ReplicaIsNotReady, "only in flight");
    }

    #[test]
    fn a_restore_large_enough_for_threads_rebinds_every_object_once() {
        // Past PARALLEL_RESTORE_MIN the objects are re-bound and published from several threads.
        let n = PARALLEL_RESTORE_MIN + 1_000;
        let a = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1))).unwrap();
        for i in 0..2 {
            a.mount_segment(ClientId::random(), crescent_testkit::segment(&format!("s{i}"), 1 << 30)).unwrap();
        }
        let w = ClientId::random();
        for i in 0..n {
            let (k, replicas) = (format!("k{i}"), if i % 7 == 0 { 2 } else { 1 });
            a.put_start(w, "", &k, 64 + (i as u64 % 3), &ReplicateConfig::with_replicas(replicas)).unwrap();
            a.put_end(w, "", &k, Some(i as u64)).unwrap();
        }
        let state = a.metadata_view();
        assert_eq!(state.objects.len(), n);
        let b = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1))).unwrap();
        assert_eq!(b.restore_replayed(&state).unwrap(), (n, 2), "every object, both segments");
        let restored = b.metadata_view();
        assert_eq!(restored.objects, state.objects, "the same replicas at the same offsets, ids, checksums");
        // Restored segments wait for their owner (DISCONNECTED), so compare each segment's allocator.
        let usage =
            |svc: &MasterService| svc.pool().segments().into_iter().map(|s| (s.spec.id, s.usage)).collect::<Vec<_>>();
        assert_eq!(usage(&b), usage(&a), "no space lost or leaked");
        // Replica ids go on past every restored one.
        let max_id = state.objects.iter().flat_map(|o| o.replicas().map(|r| r.id)).max().unwrap();
        assert!(b.next_replica_id() > max_id);
    }
}
