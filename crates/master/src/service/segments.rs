//! Segments and client liveness: mount / remount / unmount / graceful unmount wired to the pool's two-phase
//! unmount and the metadata sweep; Ping and the client TTL.

use super::events::LateReport;
use super::{MasterService, NofProbe};
use crate::events::object::state_event;
use crate::events::{KvEvent, RemoveCause};
use crate::metadata::{Lifecycle, ReplicaList};
use crate::segment_pool::{DeactivatedSegment, MountOutcome, PoolChange};
use crescent_proto::{
    ClientId, ClientStatus, ClusterInfo, DiskTierInfo, ErrorCode, MemoryTierInfo, Principal, SegmentId, SegmentKind,
    SegmentSpec, SegmentStatus,
};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The pool's log of segments mounted anew: each one's SEGMENT_MOUNT (naming `by`, the mounting principal)
/// committed with one of `slots` under the pool's lock, right before it is published (re-adopted or reconnected
/// segments are in the log already and take none).
fn log_mounts<'a>(
    slots: &'a mut Vec<crate::ha::Slot<'_>>,
    client: ClientId,
    by: Option<&'a Principal>,
) -> impl FnMut(PoolChange<'_>) -> Result<(), ErrorCode> + 'a {
    move |change| match (change, slots.pop()) {
        (PoolChange::Mount(spec), Some(slot)) => {
            let record = crate::ha::SegmentRecord::new(client, spec, by);
            slot.commit(crate::ha::MasterEntry::SegmentMount(record), None).map(drop)
        }
        _ => Ok(()),
    }
}

impl MasterService {
    fn liveness_deadline(&self) -> crate::clock::Timestamp {
        self.clock.now().saturating_add(Duration::from_millis(self.config.client_ttl_ms))
    }

    /// MountSegment on a master that does not authenticate: [`Self::mount_segment_as`] by nobody.
    pub fn mount_segment(&self, client: ClientId, spec: SegmentSpec) -> Result<(), ErrorCode> {
        self.mount_segment_as(client, spec, None)
    }

    /// MountSegment: idempotent for an identical segment. Starts the client's TTL; `Ping` keeps answering
    /// `NEED_REMOUNT` until the client remounts. `by`: the principal the connection proved (an authenticating
    /// master's), logged with the segment; `PERMISSION_DENIED` while another principal's segments are mounted
    /// in `client`'s name.
    pub fn mount_segment_as(
        &self,
        client: ClientId,
        spec: SegmentSpec,
        by: Option<&Principal>,
    ) -> Result<(), ErrorCode> {
        let host = spec.host_id.clone();
        let (id, name, size, endpoint) = (spec.id, spec.name.clone(), spec.size, spec.endpoint.clone());
        self.admit_mounter(client, by)?;
        let mut slots: Vec<_> = self.reserve_oplog()?.into_iter().collect();
        self.clients.touch(client, self.liveness_deadline());
        self.drop_replaced_instances(client, std::slice::from_ref(&spec), by);
        let outcome =
            self.pool.mount_logged(client, spec, &mut log_mounts(&mut slots, client, by)).map_err(|e| e.code())?;
        self.clients.set_host(client, &host);
        if outcome != MountOutcome::AlreadyMounted {
            // Mounted anew or back to OK: its NoF heartbeat (if any) starts fresh.
            self.nof_health.forget(id);
        }
        if outcome == MountOutcome::Mounted {
            tracing::info!(
                segment = %id, %name, %client,
                "segment mounted: {} at {endpoint}", crescent_proto::human::fmt_bytes(size)
            );
            self.recompute_quotas();
        }
        Ok(())
    }

    /// ReMountSegment on a master that does not authenticate: [`Self::remount_segments_as`] by nobody.
    pub fn remount_segments(&self, client: ClientId, specs: &[SegmentSpec]) -> Result<(), ErrorCode> {
        self.remount_segments_as(client, specs, None)
    }

    /// ReMountSegment: re-adopts (or mounts) all of a client's segments after `NEED_REMOUNT`; afterwards
    /// `Ping` answers `OK`. All or nothing. `by` as for [`Self::mount_segment_as`].
    pub fn remount_segments_as(
        &self,
        client: ClientId,
        specs: &[SegmentSpec],
        by: Option<&Principal>,
    ) -> Result<(), ErrorCode> {
        self.admit_mounter(client, by)?;
        // One slot per segment that may be mounted anew (re-adopted ones are in the log already).
        let mut slots = Vec::new();
        if self.oplog.get().is_some() {
            for _ in specs {
                slots.extend(self.reserve_oplog()?);
            }
        }
        self.drop_replaced_instances(client, specs, by);
        let report =
            self.pool.remount_logged(client, specs, &mut log_mounts(&mut slots, client, by)).map_err(|e| e.code())?;
        for id in &report.mounted {
            self.nof_health.forget(*id);
        }
        self.clients.mark_remounted(client, self.liveness_deadline());
        if let Some(host) = specs.iter().map(|s| s.host_id.as_str()).find(|h| !h.is_empty()) {
            self.clients.set_host(client, host);
        }
        if !report.mounted.is_empty() {
            tracing::info!(%client, "remount: {} segments, {} newly mounted", specs.len(), report.mounted.len());
            self.recompute_quotas();
        }
        Ok(())
    }

    /// `by` may mount segments in `client`'s name: no other principal's are mounted in it (`server::claims`
    /// keeps another principal's connections from naming the id at all; this holds after a failover too, from
    /// the log, before the id's owner reconnects).
    fn admit_mounter(&self, client: ClientId, by: Option<&Principal>) -> Result<(), ErrorCode> {
        let Some(by) = by else { return Ok(()) };
        self.mounters.admit(client, by, |c| !self.pool.client_segments(c).is_empty()).map_err(|holder| {
            tracing::warn!(%client, principal = %by, %holder, "mount refused: the client id's segments are another principal's");
            ErrorCode::PermissionDenied
        })
    }

    /// The principal that mounted `client`'s segments, on a master that authenticates (from the log after a
    /// failover or restart): their host, whose keys seal their grants and tickets.
    pub fn mounter(&self, client: ClientId) -> Option<Principal> {
        self.mounters.get(client)
    }

    /// A node instance that mounts at an endpoint proves that the instance which served there before is gone
    /// with its memory (a node's client id is its incarnation: random per process start; one process at a time
    /// listens on an endpoint). That instance's memory and disk segments are unmounted at once, whatever their
    /// status (a restarted node wipes its disk tier: what the old one held there is gone too) —
    /// one killed and restarted within its TTL is still OK here — so their objects are dropped rather than ever
    /// served stale or left listed but unreadable. Not NoF segments: their endpoint is a shared storage target
    /// that several clients mount ranges of. On a master that authenticates, only segments the same principal
    /// mounted: naming another host's endpoint drops nothing of its (a stale segment of another principal left
    /// behind expires with its owner; its grants are sealed for that principal, so the endpoint's new server
    /// refuses them rather than serving its own bytes).
    fn drop_replaced_instances(&self, client: ClientId, specs: &[SegmentSpec], by: Option<&Principal>) {
        let replaced: Vec<_> = self
            .pool
            .segments()
            .into_iter()
            .filter(|s| {
                s.client != client
                    && of_instance(s.spec.kind)
                    && by.is_none_or(|p| self.mounters.get(s.client).as_ref() == Some(p))
                    // A mount of the same segment id is a conflict to refuse, not a restart.
                    && specs.iter().any(|n| n.endpoint == s.spec.endpoint && of_instance(n.kind) && n.id != s.spec.id)
            })
            .collect();
        for s in replaced {
            tracing::warn!(
                segment = %s.spec.id, old = %s.client, new = %client, endpoint = %s.spec.endpoint,
                "a new node instance mounted where a disconnected one served: its objects are dropped"
            );
            if let Err(e) = self.unmount_segment(s.spec.id) {
                tracing::warn!(segment = %s.spec.id, error = %e, "unmount of a replaced instance's segment failed");
            }
        }
    }

    /// UnmountSegment from a client: only the segment's owner may unmount it (`INVALID_PARAMS` otherwise).
    /// Unknown id → OK.
    pub fn unmount_own_segment(&self, client: ClientId, segment: SegmentId) -> Result<(), ErrorCode> {
        match self.pool.segment(segment) {
            None => Ok(()),
            Some(s) if s.client != client => {
                tracing::warn!(%segment, owner = %s.client, %client, "unmount refused: not the segment's owner");
                Err(ErrorCode::InvalidParams)
            }
            Some(_) => self.unmount(segment, RemoveCause::Removed).map(drop),
        }
    }

    /// Unmounts a segment: replicas on it become unreadable at once; objects left with no replica are erased and
    /// their quota released. Unknown id → OK. (The master's own decisions; clients go through
    /// [`MasterService::unmount_own_segment`].)
    pub fn unmount_segment(&self, segment: SegmentId) -> Result<(), ErrorCode> {
        self.unmount(segment, RemoveCause::Expired).map(|_| ())
    }

    /// [`MasterService::unmount_segment`], saying whether this call unmounted it (false: unknown id); objects
    /// it takes away are reported gone for `cause`.
    pub(super) fn unmount(&self, segment: SegmentId, cause: RemoveCause) -> Result<bool, ErrorCode> {
        // Reserved first: an unmount the log cannot take does not happen.
        let mut slot = self.reserve_oplog()?;
        let logged = slot.is_some();
        // What the sweep changes is reported once the UNMOUNT is durable (the sweep runs after it is logged).
        let late = self.events().filter(|_| logged).map(LateReport::new);
        let mut on_durable = late.clone();
        // Logged under the pool's lock as the segment leaves placement: a remount racing this one either comes
        // first (and is logged first) or finds it unmounting and is refused. The segment stays in the catalog,
        // unmounting, until the entry is durable: its owner may remount the same id (same memory) only then, or
        // a failover before it would restore the old objects over bytes given to new ones. Erased by the entry's
        // durable callback (never, if the writer stops for good: the term ends with it).
        let mut log = |change: PoolChange<'_>| match (change, slot.take()) {
            (PoolChange::Unmount(id), Some(slot)) => {
                let entry =
                    crate::ha::MasterEntry::SegmentUnmount(crate::ha::payload::SegmentRef { id: *id.0.as_bytes() });
                let pool = Arc::clone(&self.pool);
                let late = on_durable.take();
                let erase = move |seq| {
                    if let Err(e) = pool.erase(id) {
                        tracing::warn!(segment = %id, error = %e, "erasing an unmounted segment failed");
                    }
                    if let Some(late) = late {
                        late.durable(seq);
                    }
                };
                slot.commit(entry, Some(Box::new(erase))).map(drop)
            }
            _ => Ok(()),
        };
        let Some(deactivated) = self.pool.deactivate_logged(segment, &mut log).map_err(|e| e.code())? else {
            return Ok(false);
        };
        // Its space was the node's: the sweep drops the objects' replicas at once (no other object can be placed
        // there, logged or not, while it is out of placement).
        let events = self.sweep(&deactivated, cause);
        match late {
            Some(late) => late.fill(events),
            None if !events.is_empty() => {
                if let Some(hub) = self.events() {
                    hub.publish_now(events);
                }
            }
            None => {}
        }
        if !logged {
            self.pool.erase(segment).map_err(|e| e.code())?;
        }
        #[cfg(test)]
        crate::test_hooks::after_unmount();
        self.nof_health.forget(segment);
        self.end_disk_tasks_on(segment);
        self.end_tasks_on(segment);
        self.disk.forget(segment);
        tracing::info!(%segment, "segment unmounted");
        self.recompute_quotas();
        Ok(true)
    }

    /// GracefulUnmountSegment: readable but unallocatable for `grace`, then unmounted. Owner only.
    pub fn graceful_unmount_segment(
        &self,
        segment: SegmentId,
        client: ClientId,
        grace: Duration,
    ) -> Result<(), ErrorCode> {
        let deadline = self.clock.now().saturating_add(grace);
        let mut slot = self.reserve_oplog()?;
        let mut log = |change: PoolChange<'_>| match (change, slot.take()) {
            (PoolChange::Graceful(id), Some(slot)) => {
                let update = crate::ha::payload::SegmentUpdate {
                    id: *id.0.as_bytes(),
                    status: SegmentStatus::GracefullyUnmounting as u8,
                    deadline_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
                };
                slot.commit(crate::ha::MasterEntry::SegmentUpdate(update), None).map(drop)
            }
            _ => Ok(()),
        };
        self.pool.graceful_unmount_logged(segment, client, deadline, &mut log).map_err(|e| e.code())
    }

    /// Unmounts segments whose graceful deadline passed; returns how many.
    pub fn step_graceful_unmounts(&self) -> usize {
        let due = self.pool.due_graceful_unmounts(self.clock.now());
        for id in &due {
            // A graceful unmount is the owner's choice: its objects were removed, not lost.
            if let Err(e) = self.unmount(*id, RemoveCause::Removed) {
                tracing::warn!(segment = %id, error = %e, "graceful unmount failed");
            }
        }
        due.len()
    }

    /// The status of a segment.
    pub fn segment_status(&self, segment: SegmentId) -> Result<SegmentStatus, ErrorCode> {
        self.pool.segment(segment).map(|s| s.status).ok_or(ErrorCode::SegmentNotFound)
    }

    /// Ping: refreshes the client's TTL and tells it whether to remount.
    pub fn ping(&self, client: ClientId) -> ClientStatus {
        let back = self.pool.clear_suspect(client);
        if back > 0 {
            tracing::info!(%client, "node reachable again: {back} suspect segment(s) back in service");
        }
        self.clients.touch(client, self.liveness_deadline())
    }

    /// A client could not reach the nodes of `segments` (connection refused, reset, timed out): they take no
    /// new placements and their replicas are not handed to readers until the node's next ping (or its client
    /// TTL unmounts them). Unknown ids are ignored. Returns how many segments became suspect.
    ///
    /// With `verify_unreachable_reports` nothing turns suspect here: the OK segments reported wait for the
    /// master's own probe ([`MasterService::take_unreachable_reports`], [`MasterService::confirm_unreachable`]).
    pub fn report_unreachable(&self, reporter: ClientId, segments: &[SegmentId]) -> usize {
        if self.config.verify_unreachable_reports {
            let ok: Vec<SegmentId> = segments
                .iter()
                .copied()
                .filter(|&id| self.pool.segment(id).is_some_and(|s| s.status == SegmentStatus::Ok))
                .collect();
            if !ok.is_empty() {
                tracing::debug!(%reporter, segments = ok.len(), "unreachable report: probing the segments' nodes");
                self.reported.lock().extend(ok);
            }
            return 0;
        }
        let mut n = 0;
        for &id in segments {
            if let Ok(true) = self.pool.suspect(id) {
                tracing::warn!(segment = %id, %reporter, "segment suspect: a client could not reach its node");
                n += 1;
            }
        }
        n
    }

    /// The reported segments to probe now (each once, however many reports named it), with their endpoints.
    pub fn take_unreachable_reports(&self) -> Vec<NofProbe> {
        let ids = std::mem::take(&mut *self.reported.lock());
        ids.into_iter()
            .filter_map(|id| self.pool.segment(id))
            .filter(|s| s.status == SegmentStatus::Ok)
            .map(|s| NofProbe { segment: s.spec.id, endpoint: s.spec.endpoint.clone() })
            .collect()
    }

    /// The master's probe of a reported segment: one that did not answer turns SUSPECT (until its node's next
    /// ping); one that answered stays as it was. Returns whether it turned suspect.
    pub fn confirm_unreachable(&self, segment: SegmentId, answered: bool) -> bool {
        if answered {
            self.metrics.unreachable_refuted.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%segment, "unreachable report refuted: the node answered the master's probe");
            return false;
        }
        self.metrics.unreachable_confirmed.fetch_add(1, Ordering::Relaxed);
        let suspect = matches!(self.pool.suspect(segment), Ok(true));
        if suspect {
            tracing::warn!(%segment, "segment suspect: reported unreachable and the master's probe failed too");
        }
        suspect
    }

    /// ClusterInfo: the mode clients must respect and how much the memory segments hold.
    pub fn cluster_info(&self) -> ClusterInfo {
        let all = self.pool.segments();
        let memories = all
            .iter()
            .filter(|s| s.spec.kind == SegmentKind::Memory)
            .map(|s| MemoryTierInfo {
                node: s.spec.name.clone(),
                segment: s.spec.id,
                endpoint: s.spec.endpoint.clone(),
                status: s.status,
                capacity: s.usage.capacity,
                used: s.usage.used + s.usage.slack,
            })
            .collect();
        let disks = all
            .iter()
            .filter(|s| s.spec.kind == SegmentKind::Disk)
            .map(|s| {
                let d = self.disk_tier().segment_stats(s.spec.id);
                DiskTierInfo {
                    node: s.spec.name.clone(),
                    segment: s.spec.id,
                    endpoint: s.spec.endpoint.clone(),
                    status: s.status,
                    capacity: s.usage.capacity,
                    used: s.usage.used,
                    objects: d.objects,
                    evictions: d.evictions,
                    reads: d.counters.reads,
                    read_bytes: d.counters.read_bytes,
                    writes: d.counters.writes,
                    write_bytes: d.counters.write_bytes,
                    errors: d.counters.errors,
                }
            })
            .collect();
        let segments: Vec<_> =
            all.into_iter().filter(|s| s.spec.kind == SegmentKind::Memory && s.status.is_readable()).collect();
        ClusterInfo {
            multi_tenant: self.config.enable_multi_tenants,
            lease_ttl_ms: self.config.lease_ttl_ms,
            memory_segments: u32::try_from(segments.len()).unwrap_or(u32::MAX),
            memory_capacity: segments.iter().map(|s| s.usage.capacity).sum(),
            memory_used: segments.iter().map(|s| s.usage.used + s.usage.slack).sum(),
            memory_held: segments.iter().map(|s| s.usage.held).sum(),
            eviction_high_watermark: self.config.eviction_high_watermark,
            largest_free: segments
                .iter()
                .filter(|s| s.status == SegmentStatus::Ok)
                .map(|s| s.usage.largest_free)
                .max()
                .unwrap_or(0),
            memories,
            disks,
        }
    }

    /// Whether the liveness monitor tracks `client` (it pinged or mounted within its TTL).
    pub fn tracks_client(&self, client: ClientId) -> bool {
        self.clients.contains(client)
    }

    /// Number of clients the liveness monitor tracks.
    pub fn active_clients(&self) -> usize {
        self.clients.len()
    }

    /// Expires clients silent for `client_ttl`: their memory segments are disconnected for the grace period
    /// (unmounted at once with no grace; NoF segments are not tied to client liveness: the NoF heartbeat
    /// watches their targets) and their local SSD registration dropped. Returns the expired clients.
    pub fn step_liveness(&self) -> Vec<ClientId> {
        let now = self.clock.now();
        let expired = self.clients.take_expired(now);
        let grace = Duration::from_millis(self.config.disconnect_grace_ms);
        for c in &expired {
            let memory: Vec<_> = self
                .pool
                .client_segments(*c)
                .into_iter()
                .filter(|id| self.pool.segment(*id).is_some_and(|s| s.spec.kind != SegmentKind::Nof))
                .collect();
            if grace.is_zero() {
                tracing::warn!(client = %c, "client expired: silent for {} ms, its segments are unmounted", self.config.client_ttl_ms);
                for id in memory {
                    if let Err(e) = self.unmount_segment(id) {
                        // Never left allocatable: cut off now (not logged: a restart brings every segment back
                        // disconnected anyway), unmounted by a later step once the log takes it.
                        self.pool.disconnect(id, now);
                        tracing::warn!(segment = %id, error = %e, "unmount of an expired client's segment failed: disconnected, retried");
                    }
                }
            } else {
                tracing::warn!(
                    client = %c,
                    "client expired: silent for {} ms; its {} segment(s) are disconnected (objects kept, not served) \
                     for {} s for it to come back",
                    self.config.client_ttl_ms, memory.len(), grace.as_secs()
                );
                let deadline = now.saturating_add(grace);
                for id in memory {
                    self.pool.disconnect(id, deadline);
                }
            }
            self.expire_local_ssd(*c);
            self.metrics.expired_clients.fetch_add(1, Ordering::Relaxed);
        }
        expired
    }

    /// The metadata sweep between deactivate and erase: drops every replica in `region`, erases objects left
    /// with nothing, and re-settles quota. Readers already ignore these replicas; this reclaims metadata.
    /// Returns the events of the objects it changed (none without a stream): those left with nothing are
    /// removed for `cause`.
    pub(super) fn sweep(&self, region: &DeactivatedSegment, cause: RemoveCause) -> Vec<KvEvent> {
        let events = self.sweep_objects(region, cause);
        if region.usage.live_allocations >= crate::memory::TRIM_THRESHOLD {
            crate::memory::release_free_memory();
        }
        events
    }

    fn sweep_objects(&self, region: &DeactivatedSegment, cause: RemoveCause) -> Vec<KvEvent> {
        let reporting = self.events().is_some();
        let mut events = Vec::new();
        for tenant in self.tenants.all() {
            tenant.objects().visit_chunks(self.config.census_chunk, |chunk| {
                for entry in chunk {
                    let mut st = entry.lock();
                    if st.lifecycle() != Lifecycle::Active || !st.replicas.iter().any(|r| region.holds(&r.buffer)) {
                        continue;
                    }
                    let (gone, keep): (ReplicaList, ReplicaList) =
                        std::mem::take(&mut st.replicas).into_iter().partition(|r| region.holds(&r.buffer));
                    st.replicas = keep;
                    tenant.resettle(&mut st);
                    if reporting && gone.iter().any(|r| r.status == crescent_proto::ReplicaStatus::Complete) {
                        events.push(state_event(&tenant, &entry, &st, cause));
                    }
                    if st.replicas.is_empty() {
                        let dead = tenant.retire(&mut st);
                        drop(st);
                        tenant.detach(&entry);
                        drop((gone, dead));
                    } else {
                        drop(st);
                        drop(gone);
                    }
                }
            });
        }
        events
    }
}

/// Whether a segment of `kind` belongs to one node instance (its memory, or its disk tier, which a restarted node
/// wipes), so that another instance mounting at its endpoint proves it gone.
fn of_instance(kind: SegmentKind) -> bool {
    matches!(kind, SegmentKind::Memory | SegmentKind::Disk)
}
