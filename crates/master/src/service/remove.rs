//! Removal: Remove, BatchRemove, RemoveAll, RemoveByRegex, BatchReplicaClear; key counts.

use super::MasterService;
use crate::events::RemoveCause;
use crate::events::object::removed_event;
use crate::metadata::{Lifecycle, ObjectEntry, Replica, ReplicaList, TenantState, Tier, writers};
use crescent_proto::{ClientId, ErrorCode, RemoveAllReport, ReplicaStatus, TenantId};
use smallvec::SmallVec;
use std::sync::Arc;

/// Why a removal was refused (mapped to a wire code by single-key calls; bulk calls just skip).
fn removal_check(
    st: &crate::metadata::ObjectState,
    force: bool,
    now: crate::clock::Timestamp,
) -> Result<(), ErrorCode> {
    if st.lifecycle() != Lifecycle::Active {
        return Err(ErrorCode::ObjectNotFound);
    }
    if !force && st.leased(now) {
        return Err(ErrorCode::ObjectHasLease);
    }
    // A copy to a disk tier under way does not block: the removal wins, the copy's late report finds nothing,
    // and its range stays held past the copy's deadline.
    if st.pending().is_some()
        || st.replicas.iter().any(|r| r.status == ReplicaStatus::Processing && r.tier != Tier::Disk)
    {
        return Err(ErrorCode::ReplicaIsNotReady);
    }
    if st.replicas.iter().any(|r| r.refcnt > 0) {
        return Err(ErrorCode::ObjectHasReplicationTask);
    }
    Ok(())
}

impl MasterService {
    /// Remove: erases the object. A read lease blocks it unless `force`; an unfinished write always does.
    pub fn remove(&self, tenant: &str, key: &str, force: bool) -> Result<(), ErrorCode> {
        let r = self.remove_one(tenant, key, force);
        self.metrics.remove.record(&r);
        r
    }

    fn remove_one(&self, tenant: &str, key: &str, force: bool) -> Result<(), ErrorCode> {
        let t = self.read_tenant(tenant)?.ok_or(ErrorCode::ObjectNotFound)?;
        let e = t.objects().get(key).ok_or(ErrorCode::ObjectNotFound)?;
        self.remove_entry(&t, &e, force, false)
    }

    /// BatchRemove: per key, in input order.
    pub fn batch_remove(&self, tenant: &str, keys: &[&str], force: bool) -> Vec<Result<(), ErrorCode>> {
        let rs: Vec<_> = keys.iter().map(|k| self.remove_one(tenant, k, force)).collect();
        self.metrics.remove.record_all(&rs);
        rs
    }

    /// BatchReplicaClear (the original's): per key, in input order, drops the replicas of an object `client`
    /// wrote whose read lease has expired — every one with `segment` empty (the object is removed), else its
    /// complete replicas on segments named `segment` (the object goes with its last one) — and returns the keys
    /// cleared. A key is skipped (as the original skips it) when it is unknown, written by another client (or by
    /// one a log from before writers were recorded does not name), leased, being written or copied to a disk
    /// tier, pinned by a replication task, holds no complete replica on `segment`, or the oplog refuses it. With
    /// an oplog each clear is logged under the object's lock (REMOVE, or PUT_END of what is left) and its space
    /// freed once that is durable. An invalid tenant is `INVALID_PARAMS`; an unknown one clears nothing.
    pub fn batch_replica_clear(
        &self,
        client: ClientId,
        tenant: &str,
        keys: &[&str],
        segment: &str,
    ) -> Result<Vec<String>, ErrorCode> {
        let Some(t) = self.read_tenant(tenant)? else { return Ok(Vec::new()) };
        // A client that never ended a write owns nothing.
        let Some(writer) = writers::lookup(client) else { return Ok(Vec::new()) };
        Ok(keys.iter().filter(|k| self.clear_one(&t, k, writer, segment)).map(|k| (*k).to_owned()).collect())
    }

    /// One key of [`MasterService::batch_replica_clear`]: whether it was cleared.
    fn clear_one(&self, tenant: &Arc<TenantState>, key: &str, writer: u32, segment: &str) -> bool {
        let Some(entry) = tenant.objects().get(key) else { return false };
        // Taken before the lock, as a removal's: a refusal skips the key and changes nothing.
        let Ok(slot) = self.reserve_oplog() else { return false };
        let now = self.clock.now();
        let mut st = entry.lock();
        if st.writer() != writer || removal_check(&st, false, now).is_err() {
            return false;
        }
        if segment.is_empty() {
            let report = self.report_removed(tenant, &entry, &st, RemoveCause::Removed);
            return match slot {
                Some(slot) => super::ha::erase_logged(tenant, &entry, st, slot, report).is_ok(),
                None => {
                    report.send();
                    let dead = tenant.retire(&mut st);
                    drop(st);
                    tenant.detach(&entry);
                    drop(dead);
                    true
                }
            };
        }
        let on_segment = |r: &Replica| {
            r.status == ReplicaStatus::Complete && r.buffer.region().is_some_and(|g| &**g.name() == segment)
        };
        // A copy to disk under way reads a memory replica this could take.
        if st.offloading() || !st.replicas.iter().any(on_segment) {
            return false;
        }
        let (taken, keep): (ReplicaList, ReplicaList) =
            std::mem::take(&mut st.replicas).into_iter().partition(|r| on_segment(r));
        st.replicas = keep;
        // As an eviction strips: the charge re-settled, and the object retired once nothing valid is left.
        let mut quota = TenantState::resettle_unreleased(&mut st);
        let retired = !st.replicas.iter().any(Replica::is_valid);
        let mut freed = taken;
        if retired {
            let (rest, q) = TenantState::retire_unreleased(&mut st);
            freed.extend(rest);
            quota += q;
        }
        let free = crate::eviction::DeferredFree::new(freed, Arc::clone(tenant), quota);
        // Logged inside the object's lock, as an eviction's strip is: the space is freed once the entry (PUT_END
        // of what is left, or REMOVE) is durable. A refusal (the writer stopped for good, its term ending with it)
        // leaves the change on this primary unacknowledged, its space out of reuse.
        let report = self.report_state(tenant, &entry, &st, RemoveCause::Removed);
        let (logged, free_now) = match slot {
            Some(slot) => {
                let post = super::ha::post_state_entry(tenant, &entry, &st, now);
                let release: crescent_ha::oplog::DurableCallback = Box::new(move |_seq| free.release());
                (slot.commit(post, report.on_durable(Some(release))).is_ok(), None)
            }
            None => {
                report.send();
                (true, Some(free))
            }
        };
        drop(st);
        if retired {
            tenant.detach(&entry);
        }
        // Buffers are freed with no object lock held.
        if let Some(free) = free_now {
            free.release();
        }
        logged
    }

    /// Removes one entry if the removal rules allow it. With an oplog: the slot is taken first (a refusal
    /// changes nothing), the object is hidden at once and freed when its REMOVE is durable (`erase_logged`).
    fn remove_entry(
        &self,
        tenant: &Arc<TenantState>,
        entry: &Arc<ObjectEntry>,
        force: bool,
        bulk: bool,
    ) -> Result<(), ErrorCode> {
        let slot = if bulk { self.reserve_oplog_bulk()? } else { self.reserve_oplog()? };
        let now = self.clock.now();
        let mut st = entry.lock();
        removal_check(&st, force, now)?;
        let report = self.report_removed(tenant, entry, &st, RemoveCause::Removed);
        if let Some(slot) = slot {
            return super::ha::erase_logged(tenant, entry, st, slot, report);
        }
        report.send();
        let dead = tenant.retire(&mut st);
        drop(st);
        tenant.detach(entry);
        drop(dead);
        Ok(())
    }

    /// RemoveGroup: erases an explicit group whole, as the RFC orders it: under the group lock, every member
    /// (locked in key order) is checked — one that may not go (leased without `force`, being written, pinned
    /// by a task) refuses the whole erase with its reason — then marked removing, the group marked removing,
    /// every member's route matched-unlinked, and the group dropped from the catalog; buffers and quota are
    /// released after the locks. Returns the number of members removed; `OBJECT_NOT_FOUND` for no such group.
    pub fn remove_group(&self, tenant: &str, group: &str, force: bool) -> Result<u64, ErrorCode> {
        if group.len() > crescent_proto::MAX_GROUP_LEN {
            return Err(ErrorCode::InvalidParams);
        }
        let t = self.read_tenant(tenant)?.ok_or(ErrorCode::ObjectNotFound)?;
        let g = t.objects().group(group).ok_or(ErrorCode::ObjectNotFound)?;
        let slot = self.reserve_oplog()?;
        let logged = slot.is_some();
        let now = self.clock.now();
        let mut members = g.lock();
        if members.removing {
            return Err(ErrorCode::ObjectNotFound);
        }
        // Members whose logged removal is not durable yet are already gone for every caller.
        let live: Vec<_> =
            members.live_sorted().into_iter().filter(|m| m.lock().lifecycle() == Lifecycle::Active).collect();
        let mut freed = Vec::with_capacity(live.len());
        {
            let mut guards: Vec<_> = live.iter().map(|m| m.lock()).collect();
            if let Some(e) = guards.iter().find_map(|st| removal_check(st, force, now).err()) {
                return Err(e);
            }
            let mut report = self.report();
            for (m, st) in live.iter().zip(guards.iter()) {
                report.push(self.events().map(|_| removed_event(&t, m, st, RemoveCause::Removed)));
            }
            match slot {
                None => {
                    report.send();
                    for st in guards.iter_mut() {
                        freed.push(t.retire(st));
                    }
                }
                // Logged (RFC §13): every member hidden now (REMOVED, Removing), freed member by member by the
                // durable callback, which re-locks each and leaves alone any that changed.
                Some(slot) => {
                    let pending: Vec<_> = live
                        .iter()
                        .zip(guards.iter())
                        .map(|(m, st)| {
                            (Arc::clone(m), st.replicas.iter().map(|r| r.id).collect::<SmallVec<[u64; 2]>>())
                        })
                        .collect();
                    let tenant = Arc::clone(&t);
                    let finalize = move |_seq: u64| {
                        for (m, ids) in &pending {
                            super::ha::finalize_removal(&tenant, m, ids);
                        }
                    };
                    // Committed first, under every lock: a refusal leaves the group as it was.
                    slot.commit(
                        crate::ha::MasterEntry::GroupRemove { tenant: t.id().to_string(), group: group.to_owned() },
                        report.on_durable(Some(Box::new(finalize))),
                    )?;
                    for st in guards.iter_mut() {
                        for r in st.replicas.iter_mut() {
                            r.status = ReplicaStatus::Removed;
                        }
                        st.set_lifecycle(Lifecycle::Removing);
                    }
                }
            }
        }
        members.removing = true;
        for m in &live {
            if logged {
                // Only the route now: membership goes with the space, in the durable callback.
                t.objects().unlink_if_match(m);
            } else {
                t.detach_locked(m, &g, &mut members);
            }
        }
        t.objects().remove_group_if_match(&g);
        drop(members);
        drop(freed);
        Ok(live.len() as u64)
    }

    /// The keys of an explicit group's members, sorted (`OBJECT_NOT_FOUND` for no such group).
    pub fn group_members(&self, tenant: &str, group: &str) -> Result<Vec<String>, ErrorCode> {
        let t = self.read_tenant(tenant)?.ok_or(ErrorCode::ObjectNotFound)?;
        let g = t.objects().group(group).ok_or(ErrorCode::ObjectNotFound)?;
        let members = g.lock();
        Ok(members.live_sorted().iter().map(|m| m.key().to_owned()).collect())
    }

    fn tenants_for_bulk(&self, tenant: Option<&str>) -> Result<Vec<Arc<TenantState>>, ErrorCode> {
        match tenant {
            None => Ok(self.tenants.all()),
            Some(t) => Ok(self.read_tenant(t)?.into_iter().collect()),
        }
    }

    /// RemoveAll: removes every complete, unleased (unless `force`) object of one tenant (`Some`) or of every
    /// tenant (`None`); returns how many were removed. An invalid tenant removes nothing. A removal the oplog
    /// refuses stops the scan and fails the whole call with `PERSISTENT_FAIL` (what was removed before it
    /// stays removed): it is never counted as an object someone else was already removing.
    pub fn remove_all(&self, tenant: Option<&str>, force: bool) -> Result<u64, ErrorCode> {
        self.remove_all_report(tenant, force).map(|r| r.removed)
    }

    /// [`MasterService::remove_all`], also counting the objects it left and why (what `crescent rm --all`
    /// tells its user).
    pub fn remove_all_report(&self, tenant: Option<&str>, force: bool) -> Result<RemoveAllReport, ErrorCode> {
        let mut report = RemoveAllReport::default();
        let Ok(tenants) = self.tenants_for_bulk(tenant) else { return Ok(report) };
        let mut refused = None;
        for t in tenants {
            t.objects().visit_chunks(self.config.census_chunk, |chunk| {
                for e in chunk {
                    if refused.is_some() {
                        return;
                    }
                    match self.remove_entry(&t, &e, force, true) {
                        Ok(()) => report.removed += 1,
                        Err(ErrorCode::ObjectHasLease) => report.skipped_leased += 1,
                        Err(ErrorCode::ReplicaIsNotReady) => report.skipped_writing += 1,
                        Err(ErrorCode::ObjectHasReplicationTask) => report.skipped_pinned += 1,
                        // Already being removed by someone else.
                        Err(ErrorCode::ObjectNotFound) => {}
                        Err(code) => refused = Some(code),
                    }
                }
            });
            if refused.is_some() {
                break;
            }
        }
        if report.removed >= crate::memory::TRIM_THRESHOLD {
            crate::memory::release_free_memory();
        }
        match refused {
            Some(code) => {
                tracing::warn!(removed = report.removed, error = %code, "remove-all stopped: a removal was refused");
                Err(code)
            }
            None => Ok(report),
        }
    }

    /// RemoveByRegex: removes the tenant's removable objects whose key *contains* a match of `pattern`. A
    /// removal the oplog refuses stops it with that error, as for [`MasterService::remove_all`].
    pub fn remove_by_regex(&self, tenant: &str, pattern: &str, force: bool) -> Result<u64, ErrorCode> {
        let re = regex::Regex::new(pattern).map_err(|_| ErrorCode::InvalidParams)?;
        let tenants = self.tenants_for_bulk(Some(tenant))?;
        let mut n = 0;
        let mut refused = None;
        for t in tenants {
            t.objects().visit_chunks(self.config.census_chunk, |chunk| {
                for e in chunk.iter().filter(|e| re.is_match(e.key())) {
                    if refused.is_some() {
                        return;
                    }
                    match self.remove_entry(&t, e, force, true) {
                        Ok(()) => n += 1,
                        Err(
                            ErrorCode::ObjectNotFound
                            | ErrorCode::ObjectHasLease
                            | ErrorCode::ReplicaIsNotReady
                            | ErrorCode::ObjectHasReplicationTask,
                        ) => {}
                        Err(code) => refused = Some(code),
                    }
                }
            });
        }
        match refused {
            Some(code) => Err(code),
            None => Ok(n),
        }
    }

    /// Number of objects routed in a tenant (`None`: all tenants), any state.
    pub fn key_count(&self, tenant: Option<&TenantId>) -> usize {
        match tenant {
            Some(t) => self.tenants.get(t).map_or(0, |t| t.objects().len()),
            None => self.tenants.all().iter().map(|t| t.objects().len()).sum(),
        }
    }
}
