//! The write path: PutStart / PutEnd / PutRevoke, UpsertStart / End / Revoke, and their batch forms.

use super::{Handout, MasterService, OpCounter};
use crate::clock::Timestamp;
use crate::events::RemoveCause;
use crate::eviction::{EvictionScope, EvictionTarget, RoomRequest, SegmentMap};
use crate::metadata::{
    GroupEntry, Lifecycle, ObjectEntry, ObjectFlags, ObjectState, PendingWrite, QuotaError, Replica, ReplicaList,
    SoftPinRequest, TenantState, Tier, route_hash,
};
use crate::placement::{PlacementError, PlacementRequest, ReplicaPlacement};
use crate::segment_pool::AllocatedBuffer;
use crescent_proto::{
    ClientId, ErrorCode, MAX_GROUP_LEN, ObjectKey, ReplicaDescriptor, ReplicaStatus, ReplicateConfig, SegmentKind,
    SegmentStatus, SoftPinAction,
};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Quota-triggered eviction rounds before a write gives up (two, as in the original).
const QUOTA_EVICTION_RETRIES: usize = 2;
/// Allocation-failure eviction rounds for one write before it gives up.
const ROOM_ROUNDS: usize = 3;

/// What the allocation-failure rounds (run one at a time behind the service's eviction gate) remember.
#[derive(Debug, Default)]
pub(super) struct RoomRounds {
    /// The last round run.
    last: Option<LastRound>,
}

/// What one `make_room` round found.
#[derive(Debug, Clone, Copy)]
struct LastRound {
    kind: SegmentKind,
    /// The buffer it made room for.
    size: u64,
    /// Its number in `room_rounds_started`.
    round: u64,
    found_hole: bool,
    /// It took every candidate its census found.
    exhausted: bool,
}

impl LastRound {
    /// Whether another round now, for a buffer of `size`, would find nothing this one did not leave: it took
    /// every candidate it saw, or it found no hole for a buffer no larger.
    fn spent_for(&self, size: u64) -> bool {
        self.exhausted || (!self.found_hole && self.size <= size)
    }
}

/// Re-lookups when a write races an erase of the same key.
const RACE_RETRIES: usize = 16;

/// A validated write request.
struct WriteSpec<'a> {
    key: &'a str,
    size: u64,
    config: &'a ReplicateConfig,
    soft_pin: SoftPinRequest,
    /// `None`: not given (upsert keeps the existing group); `Some("")`: ungrouped; `Some(g)`: group `g`.
    group: Option<&'a str>,
}

/// Buffers taken from an object under its lock, to be queued for release after the lock is dropped.
#[derive(Default)]
#[must_use = "queue it with MasterService::discard once the object lock is released"]
pub(super) struct Discard {
    release_at: Timestamp,
    buffers: Vec<AllocatedBuffer>,
}

/// What resolving an existing object left to do.
enum Next {
    /// The key is free: create a new object.
    Create,
    /// The write was satisfied in place (upsert of the same size): these are the descriptors.
    Done(Vec<ReplicaDescriptor>),
    /// Upsert of a different size: allocate, then swap into this entry.
    Replace { entry: Arc<ObjectEntry>, hard_pinned: bool },
}

/// Which write an End or Revoke finishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteRef {
    /// The writer (only it may finish the write).
    pub client: ClientId,
    /// The write: the id of the first replica descriptor its Start returned. Always given over the wire;
    /// `None` (from a bare `ClientId`) means the client's current write of the key, whichever it is: for
    /// in-process callers that never overlap their writes of one key.
    pub write: Option<u64>,
}

impl WriteRef {
    /// The write `write` of `client`.
    pub fn new(client: ClientId, write: u64) -> Self {
        Self { client, write: Some(write) }
    }

    /// Whether `pending` is this write: the writer's own, and (when named) the very write.
    fn owns(&self, pending: &PendingWrite) -> Result<(), ErrorCode> {
        if pending.writer != self.client {
            return Err(ErrorCode::IllegalClient);
        }
        match self.write {
            // A newer write of the same client replaced this one: it has no write in progress any more.
            Some(w) if w != pending.write => Err(ErrorCode::ObjectNotFound),
            _ => Ok(()),
        }
    }
}

impl From<ClientId> for WriteRef {
    fn from(client: ClientId) -> Self {
        Self { client, write: None }
    }
}

/// The id naming a write whose replicas are `replicas` (its first replica's).
fn write_id(replicas: &[Replica]) -> u64 {
    replicas.first().map_or(0, |r| r.id)
}

impl MasterService {
    fn validate_write<'a>(
        &self,
        key: &'a str,
        size: u64,
        config: &'a ReplicateConfig,
    ) -> Result<WriteSpec<'a>, ErrorCode> {
        ObjectKey::check(key).map_err(|e| e.code())?;
        if config.group_id.as_ref().is_some_and(|g| g.len() > MAX_GROUP_LEN) {
            return Err(ErrorCode::InvalidParams);
        }
        if size == 0 || (config.replica_num == 0 && config.nof_replica_num == 0) {
            return Err(ErrorCode::InvalidParams);
        }
        if config.prefer_same_node && config.nof_replica_num > 0 {
            return Err(ErrorCode::InvalidParams);
        }
        let ttl_ms = match (config.soft_pin_action, config.soft_pin_ttl_ms) {
            (SoftPinAction::Preserve | SoftPinAction::Disable, Some(_)) => return Err(ErrorCode::InvalidParams),
            (SoftPinAction::Enable, ttl) => {
                let ttl = ttl.unwrap_or(self.config.default_soft_pin_ttl_ms);
                if ttl > self.config.max_soft_pin_ttl_ms {
                    return Err(ErrorCode::InvalidParams);
                }
                ttl
            }
            _ => 0,
        };
        Ok(WriteSpec {
            key,
            size,
            config,
            soft_pin: SoftPinRequest { action: config.soft_pin_action, ttl_ms },
            group: config.group_id.as_deref(),
        })
    }

    /// PutStart: reserves space for a new object and returns where to write it (all replicas `Processing`).
    /// Put-if-absent: an existing readable object or a recent unfinished write → `OBJECT_ALREADY_EXISTS`.
    pub fn put_start(
        &self,
        client: ClientId,
        tenant: &str,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
    ) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        self.start_write(client, tenant, key, size, config, false)
    }

    /// UpsertStart: insert or update. Same size, with no read lease in force, reuses the buffers in place (the
    /// key is unreadable until End); a different size or a leased object gets new buffers (the old ones are
    /// freed when the lease ends); an unfinished write is preempted at once.
    pub fn upsert_start(
        &self,
        client: ClientId,
        tenant: &str,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
    ) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        self.start_write(client, tenant, key, size, config, true)
    }

    /// BatchPutStart: per key, in input order. `group_ids`, when given, must have one entry per key.
    pub fn batch_put_start(
        &self,
        client: ClientId,
        tenant: &str,
        items: &[(&str, u64)],
        config: &ReplicateConfig,
        group_ids: Option<&[String]>,
    ) -> Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>> {
        self.batch_start(client, tenant, items, config, group_ids, false)
    }

    /// BatchUpsertStart: per key, in input order.
    pub fn batch_upsert_start(
        &self,
        client: ClientId,
        tenant: &str,
        items: &[(&str, u64)],
        config: &ReplicateConfig,
        group_ids: Option<&[String]>,
    ) -> Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>> {
        self.batch_start(client, tenant, items, config, group_ids, true)
    }

    fn batch_start(
        &self,
        client: ClientId,
        tenant: &str,
        items: &[(&str, u64)],
        config: &ReplicateConfig,
        group_ids: Option<&[String]>,
        upsert: bool,
    ) -> Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>> {
        if group_ids.is_some_and(|g| g.len() != items.len()) {
            return vec![Err(ErrorCode::InvalidParams); items.len()];
        }
        let rs: Vec<_> = items
            .iter()
            .enumerate()
            .map(|(i, (key, size))| match group_ids {
                Some(g) => {
                    let cfg = ReplicateConfig { group_id: Some(g[i].clone()), ..config.clone() };
                    self.start_write_inner(client, tenant, key, *size, &cfg, upsert)
                }
                None => self.start_write_inner(client, tenant, key, *size, config, upsert),
            })
            .collect();
        self.start_counter(upsert).record_all(&rs);
        rs
    }

    /// One PutStart (or UpsertStart), counted in that operation's metrics.
    fn start_write(
        &self,
        client: ClientId,
        tenant: &str,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        let r = self.start_write_inner(client, tenant, key, size, config, upsert);
        self.start_counter(upsert).record(&r);
        r
    }

    /// The metrics of PutStart or UpsertStart.
    fn start_counter(&self, upsert: bool) -> &OpCounter {
        if upsert { &self.metrics.upsert_start } else { &self.metrics.put_start }
    }

    fn start_write_inner(
        &self,
        client: ClientId,
        tenant: &str,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        let spec = self.validate_write(key, size, config)?;
        let tenant = self.write_tenant(tenant)?;
        #[cfg(test)]
        crate::test_hooks::after_write_tenant();
        for _ in 0..RACE_RETRIES {
            let next = match tenant.objects().get(key) {
                None => Next::Create,
                Some(entry) => self.resolve_existing(&tenant, entry, client, &spec, upsert)?,
            };
            let result = match next {
                Next::Done(d) => return Ok(d),
                Next::Create => self.create(&tenant, client, &spec),
                Next::Replace { entry, hard_pinned } => self.replace(&tenant, client, &spec, &entry, hard_pinned),
            };
            match result {
                Err(ErrorCode::ObjectAlreadyExists) if upsert => continue,
                Err(ErrorCode::ObjectAlreadyExists) => {
                    // Lost a creation race; if the winner is an erase in progress, look again.
                    match tenant.objects().get(key) {
                        Some(e) if e.lock().lifecycle() == Lifecycle::Active => {
                            return Err(ErrorCode::ObjectAlreadyExists);
                        }
                        _ => std::thread::yield_now(),
                    }
                }
                other => return other,
            }
        }
        Err(ErrorCode::ObjectAlreadyExists)
    }

    /// Decides what a write does about an object already routed under its key.
    fn resolve_existing(
        &self,
        tenant: &Arc<TenantState>,
        entry: Arc<ObjectEntry>,
        client: ClientId,
        spec: &WriteSpec<'_>,
        upsert: bool,
    ) -> Result<Next, ErrorCode> {
        // Preempting or rewriting a logged object makes it unreadable: a removal-type change (§13).
        let slot = self.reserve_oplog()?;
        let now = self.clock.now();
        let mut st = entry.lock();
        if st.lifecycle() != Lifecycle::Active {
            return Ok(Next::Create);
        }
        // Replicas whose segment vanished are dead weight: drop them now.
        let stale: ReplicaList = drain_invalid(&mut st);
        tenant.resettle(&mut st);
        let readable = st.has_readable();
        if !upsert {
            let young = st.pending().is_some_and(|p| {
                now.saturating_since(p.started) < Duration::from_millis(self.config.put_start_discard_timeout_ms)
            });
            if readable || young {
                drop(st);
                drop(stale);
                return Err(ErrorCode::ObjectAlreadyExists);
            }
            // A stale unfinished write (or an object with nothing left): preempt it and start afresh.
            let discarded = self.take_pending(tenant, &mut st);
            if let Some(slot) = slot {
                let erased = super::ha::erase_logged(tenant, &entry, st, slot, super::events::Report::none());
                self.discard(discarded);
                drop(stale);
                return erased.map(|()| Next::Create);
            }
            let dead = tenant.retire(&mut st);
            drop(st);
            self.discard(discarded);
            tenant.detach(&entry);
            drop((stale, dead));
            return Ok(Next::Create);
        }
        // Upsert: group membership is immutable.
        let existing_group = entry.group().map(|g| &**g.name());
        let refusal = match (spec.group, existing_group) {
            (None, _) | (Some(""), None) => None,
            (Some(g), Some(e)) if g == e => None,
            _ => Some(ErrorCode::InvalidParams),
        }
        .or_else(|| st.replicas.iter().any(|r| r.refcnt > 0).then_some(ErrorCode::ObjectReplicaBusy));
        if let Some(e) = refusal {
            // Stale buffers are freed only after the object lock is released.
            drop(st);
            drop(stale);
            return Err(e);
        }
        let discarded = self.take_pending(tenant, &mut st);
        if !st.has_readable() {
            if let Some(slot) = slot {
                let erased = super::ha::erase_logged(tenant, &entry, st, slot, super::events::Report::none());
                self.discard(discarded);
                drop(stale);
                return erased.map(|()| Next::Create);
            }
            let dead = tenant.retire(&mut st);
            drop(st);
            self.discard(discarded);
            tenant.detach(&entry);
            drop((stale, dead));
            return Ok(Next::Create);
        }
        // Another size, or a reader still holding a lease (it may be reading these very buffers): write into
        // new buffers; the old ones are kept until the lease ends.
        // A disk replica (or a copy to one under way) is never written by a client: new buffers too.
        if st.size != spec.size || st.leased(now) || st.replicas.iter().any(|r| r.tier == Tier::Disk) {
            let hard_pinned = st.hard_pinned();
            drop(st);
            self.discard(discarded);
            drop(stale);
            return Ok(Next::Replace { entry, hard_pinned });
        }
        // Same size: rewrite in place. The settled charge becomes the write's pending charge. The log forgets
        // the object until its End (its bytes are being overwritten; the buffers stay the object's own). The
        // RPC server holds this reply until the REMOVE is durable (it logged a removal: `ha::take_hid_objects`):
        // the writer must not overwrite bytes a failover could still serve under the old value.
        let report = self.report_removed(tenant, &entry, &st, RemoveCause::Removed);
        if let Err(e) = report.commit(slot, || super::ha::remove_entry(tenant, &entry), None) {
            drop(st);
            self.discard(discarded);
            drop(stale);
            return Err(e);
        }
        // Fresh replica ids: they name this write (`WriteRef`), not the one that last wrote these buffers.
        for r in st.replicas.iter_mut() {
            r.status = ReplicaStatus::Processing;
            r.id = self.next_replica_id();
        }
        let pending_charge = st.take_charge();
        let write = write_id(&st.replicas);
        st.set_pending(PendingWrite { writer: client, write, started: now, soft_pin: spec.soft_pin, pending_charge });
        let d = self.hand_out(&st.replicas, Handout::Write);
        drop(st);
        self.discard(discarded);
        drop(stale);
        Ok(Next::Done(d))
    }

    /// Takes an unfinished write's `Processing` replicas out of the object (its writer may still be writing
    /// into them) and refunds its pending charge, under the object's lock. The caller hands the result to
    /// [`MasterService::discard`] after releasing that lock: no timer index is touched under an object lock.
    pub(super) fn take_pending(&self, tenant: &TenantState, st: &mut ObjectState) -> Discard {
        let Some(p) = st.take_pending() else { return Discard::default() };
        tenant.release_quota(p.pending_charge);
        let (processing, keep): (ReplicaList, ReplicaList) =
            std::mem::take(&mut st.replicas).into_iter().partition(|r| r.status == ReplicaStatus::Processing);
        st.replicas = keep;
        let release_at = p.started.saturating_add(Duration::from_millis(self.config.put_start_release_timeout_ms));
        Discard { release_at, buffers: processing.into_iter().map(|r| r.buffer).collect() }
    }

    /// Queues buffers taken from an object until their release time (called with no object lock held), and,
    /// with an oplog, until everything committed so far is durable: the change that took them from their object
    /// was committed before this, and space a failover could still show under that object is never reused.
    pub(super) fn discard(&self, d: Discard) {
        let after = self.oplog.get().map_or(0, |l| l.last_committed());
        if after == 0 && d.release_at <= self.clock.now() {
            return drop(d.buffers);
        }
        self.discards.push(d.release_at, after, d.buffers);
    }

    /// Charges a new write's quota, evicting the tenant's own objects up to twice when it is over quota.
    fn charge_write(&self, tenant: &TenantState, bytes: u64) -> Result<(), ErrorCode> {
        for attempt in 0..=QUOTA_EVICTION_RETRIES {
            match tenant.quota().try_charge(bytes) {
                Ok(()) => return Ok(()),
                Err(QuotaError::Exceeded { deficit }) if attempt < QUOTA_EVICTION_RETRIES => {
                    self.evict(EvictionScope::Tenant(tenant.id().clone()), EvictionTarget::Bytes(deficit));
                    // Logged evictions give their quota back once durable.
                    self.await_eviction_frees();
                }
                Err(QuotaError::Exceeded { .. }) => {
                    self.metrics.tenant_quota_rejects.fetch_add(1, Ordering::Relaxed);
                    return Err(ErrorCode::TenantQuotaExceeded);
                }
                Err(e) => return Err(e.code()),
            }
        }
        Err(ErrorCode::TenantQuotaExceeded)
    }

    fn charge_for(spec: &WriteSpec<'_>) -> u64 {
        spec.size.saturating_mul(u64::from(spec.config.replica_num))
    }

    /// Places the replicas of one write (memory best effort, then NoF), evicting once on allocation failure.
    fn place_write(&self, client: ClientId, spec: &WriteSpec<'_>) -> Result<Vec<Replica>, ErrorCode> {
        let host = spec.config.host_id.clone().or_else(|| self.clients.host(client));
        let kind = if self.config.cxl_window.is_some() { SegmentKind::Cxl } else { SegmentKind::Memory };
        let mut req = PlacementRequest {
            kind,
            size: spec.size,
            replica_num: spec.config.replica_num as usize,
            preferred: &spec.config.preferred_segments,
            excluded: &[],
            writer_host: host.as_deref(),
            prefer_same_node: spec.config.prefer_same_node,
            key_hash: route_hash(spec.key),
        };
        let placement = ReplicaPlacement::new(&self.pool, &self.placement);
        let mut buffers: Vec<AllocatedBuffer> = Vec::new();
        // Whether the write found no room and had to evict for it.
        let mut needed_room = false;
        // A buffer the watermark would evict as soon as it is written is refused before anything is evicted.
        if spec.config.replica_num > 0 && self.fits_under_watermark(kind, spec.size) {
            match placement.place(&req) {
                Ok(b) => buffers = b,
                Err(PlacementError::NoAvailableHandle { eligible_names }) if eligible_names > 0 => {
                    // Allocation failure: free room for it (one round at a time across writers), if any can be.
                    self.need_eviction.store(true, Ordering::Release);
                    needed_room = true;
                    buffers = self.place_with_room(&placement, &req).unwrap_or_default();
                }
                Err(PlacementError::NoAvailableHandle { .. }) => {}
                Err(e) => return Err(e.code()),
            }
            if !buffers.is_empty() && buffers.len() < spec.config.replica_num as usize {
                self.metrics.partial_placements.fetch_add(1, Ordering::Relaxed);
            }
        }
        if spec.config.nof_replica_num > 0 {
            req.kind = SegmentKind::Nof;
            req.replica_num = spec.config.nof_replica_num as usize;
            req.preferred = &spec.config.preferred_nof_segments;
            req.writer_host = None;
            if self.fits_under_watermark(SegmentKind::Nof, spec.size) {
                match placement.place(&req) {
                    Ok(b) => buffers.extend(b),
                    // NoF space is evicted for a failed allocation the same way as memory.
                    Err(PlacementError::NoAvailableHandle { eligible_names }) if eligible_names > 0 => {
                        needed_room = true;
                        buffers.extend(self.place_with_room(&placement, &req).unwrap_or_default());
                    }
                    Err(_) => {}
                }
            }
        }
        if buffers.is_empty() {
            // Room an eviction would make cannot come while the log takes nothing (its entries could not be
            // logged, or are stuck): say so, rather than that the cluster is full.
            if needed_room && self.oplog.get().is_some_and(|l| !l.status().accepting) {
                return Err(ErrorCode::PersistentFail);
            }
            return Err(ErrorCode::NoAvailableHandle);
        }
        Ok(buffers.into_iter().map(|b| Replica::processing(self.next_replica_id(), b)).collect())
    }

    /// Whether one `size`-byte buffer on `kind` segments can stay under the eviction high watermark: an object
    /// larger than that share of the whole pool would be evicted by the first round after its write.
    pub(crate) fn fits_under_watermark(&self, kind: SegmentKind, size: u64) -> bool {
        let hw = self.config.eviction_high_watermark;
        // The capacity the last eviction step saw answers almost every write with one load; only an object near
        // the limit (or one before the first step) sums the segments.
        let fits = |capacity: u64| size as f64 <= hw * capacity as f64;
        hw >= 1.0
            || (kind == SegmentKind::Memory && fits(self.seen_capacity.load(Ordering::Relaxed)))
            || fits(self.pool.usage(kind).capacity)
    }

    /// Why a `size`-byte write found no room, in words (the detail of its `NO_AVAILABLE_HANDLE`).
    pub fn no_space_detail(&self, size: u64) -> String {
        use crescent_proto::human::fmt_bytes;
        let kind = if self.config.cxl_window.is_some() { SegmentKind::Cxl } else { SegmentKind::Memory };
        let segments: Vec<_> =
            self.pool.segments().into_iter().filter(|s| s.spec.kind == kind && s.status.is_readable()).collect();
        if segments.is_empty() {
            return "no storage node has a segment mounted".into();
        }
        let capacity: u64 = segments.iter().map(|s| s.usage.capacity).sum();
        if !self.fits_under_watermark(kind, size) {
            let hw = self.config.eviction_high_watermark;
            return format!(
                "an object of {} cannot stay under the eviction watermark: {:.0}% of the cluster's {} is {}",
                fmt_bytes(size),
                hw * 100.0,
                fmt_bytes(capacity),
                fmt_bytes((hw * capacity as f64) as u64)
            );
        }
        let largest_segment = segments.iter().map(|s| s.usage.capacity).max().unwrap_or(0);
        if size > largest_segment {
            return format!(
                "an object of {} does not fit in any segment: the largest holds {}",
                fmt_bytes(size),
                fmt_bytes(largest_segment)
            );
        }
        let largest_free =
            segments.iter().filter(|s| s.status == SegmentStatus::Ok).map(|s| s.usage.largest_free).max().unwrap_or(0);
        format!(
            "no segment has a free block of {}: the largest is {}, and evicting the objects no reader holds cannot \
             join one that large",
            fmt_bytes(size),
            fmt_bytes(largest_free)
        )
    }

    /// Places `req` after an allocation-failure eviction round that opens a hole for it on one segment (at
    /// most [`ROOM_ROUNDS`] rounds: a concurrent write may take the hole first). `None` when no round could
    /// make room; such a round evicts nothing.
    fn place_with_room(
        &self,
        placement: &ReplicaPlacement<'_>,
        req: &PlacementRequest<'_>,
    ) -> Option<Vec<AllocatedBuffer>> {
        // Read before waiting for the gate: rounds numbered above it looked at the pool after this write's
        // allocation failed.
        let ticket = self.room_rounds_started.load(Ordering::Acquire);
        #[cfg(test)]
        crate::test_hooks::before_room_gate();
        let mut gate = self.eviction_gate.lock();
        for _ in 0..ROOM_ROUNDS {
            if let Ok(b) = placement.place(req) {
                return Some(b);
            }
            // Room an earlier round freed is still coming (its entries are not durable yet): wait for it
            // rather than evict more for the same want.
            if self.eviction_frees_pending() {
                if !self.await_eviction_frees() {
                    break;
                }
                continue;
            }
            // The last round began after this write failed (it saw everything evictable then) and left nothing
            // for another: one now would scan every object to find only what became evictable since. Answer as
            // it did (the placement above already took any room it made).
            if gate.last.is_some_and(|l| l.kind == req.kind && l.round > ticket && l.spent_for(req.size)) {
                self.metrics.room_rounds_spared.fetch_add(1, Ordering::Relaxed);
                break;
            }
            let round_no = self.room_rounds_started.fetch_add(1, Ordering::AcqRel) + 1;
            let room = self.room_for(req);
            let tier = Tier::of(req.kind);
            let offloader = self.offloader().filter(|_| tier == Tier::Memory);
            let round = crate::eviction::make_room(
                &self.tenants.all(),
                tier,
                &room,
                self.clock.now(),
                self.config.allow_evict_soft_pinned,
                self.config.census_chunk,
                crate::eviction::Outlets {
                    oplog: self.eviction_log(),
                    offload: offloader.as_ref().map(|o| o as &dyn crate::eviction::Offload),
                    events: self.events(),
                },
            );
            self.record_eviction(tier, &round.report);
            gate.last = Some(LastRound {
                kind: req.kind,
                size: req.size,
                round: round_no,
                found_hole: round.segment.is_some(),
                exhausted: round.exhausted,
            });
            // No hole anywhere: give up. A hole whose objects another round evicted first (the watermark loop
            // runs beside this one) is still a hole: try the placement again.
            round.segment?;
            // A logged round's room comes back once its entries are durable: wait for it rather than evict
            // again (a refusal to wait ends the attempt: another round would evict for the same room).
            if !self.await_eviction_frees() {
                break;
            }
        }
        placement.place(req).ok()
    }

    /// What one more buffer of `req.size` needs: the space maps of the allocatable segments that could ever
    /// hold it, and what brings the pool back under the watermark (less one eviction ratio) once it is in.
    fn room_for(&self, req: &PlacementRequest<'_>) -> RoomRequest {
        let size = req.size;
        let segments = self
            .pool
            .segments()
            .into_iter()
            .filter(|s| {
                s.spec.kind == req.kind
                    && s.status == SegmentStatus::Ok
                    && s.usage.capacity >= size
                    && !req.excluded.iter().any(|n| n.as_str() == &*s.spec.name)
            })
            .filter_map(|s| {
                let (capacity, occupied) = self.pool.occupancy(s.spec.id)?;
                Some(SegmentMap { id: s.spec.id, capacity, occupied })
            })
            .collect();
        // Down to the watermark less one eviction ratio, as a watermark round does: the writes that follow find
        // room without a census each (one round per ~5 % of the pool, not per write).
        let usage = self.pool.usage(req.kind);
        let low = self.config.eviction_high_watermark - self.config.eviction_ratio.max(0.0);
        let after = (usage.used + usage.slack + size) as f64;
        // At most one ratio of the pool beyond the buffer itself: when readers hold the pool above its target,
        // one write must not take every unleased object (the next write would find none to evict).
        let cap = (size as f64 + self.config.eviction_ratio.max(0.0) * usage.capacity as f64).max(0.0);
        let total = if self.config.eviction_high_watermark >= 1.0 {
            0
        } else {
            (after - low * usage.capacity as f64).clamp(0.0, cap) as u64
        };
        RoomRequest { size, segments, total }
    }

    /// Case A: a brand-new object.
    fn create(
        &self,
        tenant: &Arc<TenantState>,
        client: ClientId,
        spec: &WriteSpec<'_>,
    ) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        let charge = Self::charge_for(spec);
        self.charge_write(tenant, charge)?;
        let replicas = match self.place_write(client, spec) {
            Ok(r) => r,
            Err(e) => {
                tenant.release_quota(charge);
                return Err(e);
            }
        };
        let mut flags = ObjectFlags::default();
        flags.set_no_offload(!spec.config.offload);
        let write = write_id(&replicas);
        let mut state = ObjectState::new(spec.size);
        state.flags = flags;
        state.replicas = replicas.into_iter().collect();
        state.set_hard_pinned(spec.config.with_hard_pin);
        state.set_data_type(spec.config.data_type);
        state.set_pending(PendingWrite {
            writer: client,
            write,
            started: self.clock.now(),
            soft_pin: spec.soft_pin,
            pending_charge: charge,
        });
        let descs = self.hand_out(&state.replicas, Handout::Write);
        let key = spec.key;
        let published = match spec.group.filter(|g| !g.is_empty()) {
            None => {
                let entry = Arc::new(ObjectEntry::new(key, None, state));
                tenant.objects().insert_if_absent(entry.clone()).map_err(|_| entry)
            }
            Some(name) => publish_member(tenant, name, key, state),
        };
        match published {
            Ok(()) => Ok(descs),
            Err(loser) => {
                // Someone else created the key first: undo ours (buffers are freed with no lock held).
                let mut st = loser.lock();
                let dead = tenant.retire(&mut st);
                drop(st);
                drop(dead);
                Err(ErrorCode::ObjectAlreadyExists)
            }
        }
    }

    /// Case C: an upsert of a different size — allocate, then swap the new replicas into the same entry.
    fn replace(
        &self,
        tenant: &Arc<TenantState>,
        client: ClientId,
        spec: &WriteSpec<'_>,
        entry: &Arc<ObjectEntry>,
        hard_pinned: bool,
    ) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        let charge = Self::charge_for(spec);
        self.charge_write(tenant, charge)?;
        let replicas = match self.place_write(client, spec) {
            Ok(r) => r,
            Err(e) => {
                tenant.release_quota(charge);
                return Err(e);
            }
        };
        let slot = match self.reserve_oplog() {
            Ok(s) => s,
            Err(e) => {
                tenant.release_quota(charge);
                return Err(e);
            }
        };
        let now = self.clock.now();
        let mut st = entry.lock();
        // Revalidate: the object may have changed while we allocated.
        if st.lifecycle() != Lifecycle::Active || st.pending().is_some() || st.replicas.iter().any(|r| r.refcnt > 0) {
            drop(st);
            tenant.release_quota(charge);
            drop(replicas);
            return Err(ErrorCode::ObjectAlreadyExists); // retried by start_write
        }
        // The old replicas stop being readable here (freed when their lease ends and the REMOVE is durable): the
        // log forgets the object until the new write's End. Their quota comes back once the REMOVE is durable
        // too (at once without a log).
        let old_charge = st.take_charge();
        let report = self.report_removed(tenant, entry, &st, RemoveCause::Removed);
        match slot {
            Some(slot) => {
                let t = Arc::clone(tenant);
                let release = move |_seq| t.release_quota(old_charge);
                let logged =
                    slot.commit(super::ha::remove_entry(tenant, entry), report.on_durable(Some(Box::new(release))));
                if let Err(e) = logged {
                    st.restore_charge(old_charge);
                    drop(st);
                    tenant.release_quota(charge);
                    drop(replicas);
                    return Err(e);
                }
            }
            None => {
                report.send();
                tenant.release_quota(old_charge);
            }
        }
        let old = std::mem::take(&mut st.replicas);
        // Readers may still be reading the old bytes under their lease.
        let release_at = st.lease().max(now);
        st.replicas = replicas.into_iter().collect();
        st.size = spec.size;
        st.set_hard_pinned(hard_pinned || spec.config.with_hard_pin);
        st.flags.set_no_offload(!spec.config.offload);
        st.flags.set_checksum(false);
        let write = write_id(&st.replicas);
        st.set_pending(PendingWrite {
            writer: client,
            write,
            started: now,
            soft_pin: spec.soft_pin,
            pending_charge: charge,
        });
        let d = self.hand_out(&st.replicas, Handout::Write);
        drop(st);
        self.discard(Discard { release_at, buffers: old.into_iter().map(|r| r.buffer).collect() });
        Ok(d)
    }

    /// PutEnd: the writer finished writing every replica; the object becomes readable. Idempotent.
    pub fn put_end(
        &self,
        writer: impl Into<WriteRef>,
        tenant: &str,
        key: &str,
        checksum: Option<u64>,
    ) -> Result<(), ErrorCode> {
        let r = self.end_write(writer.into(), tenant, key, checksum);
        self.metrics.put_end.record(&r);
        r
    }

    /// UpsertEnd (same as PutEnd).
    pub fn upsert_end(
        &self,
        writer: impl Into<WriteRef>,
        tenant: &str,
        key: &str,
        checksum: Option<u64>,
    ) -> Result<(), ErrorCode> {
        self.put_end(writer, tenant, key, checksum)
    }

    /// BatchPutEnd: per (key, checksum, write), in input order (`write` as in [`WriteRef`]).
    pub fn batch_put_end(
        &self,
        client: ClientId,
        tenant: &str,
        items: &[(&str, Option<u64>, Option<u64>)],
    ) -> Vec<Result<(), ErrorCode>> {
        let rs: Vec<_> =
            items.iter().map(|&(k, c, write)| self.end_write(WriteRef { client, write }, tenant, k, c)).collect();
        self.metrics.put_end.record_all(&rs);
        rs
    }

    fn end_write(&self, writer: WriteRef, tenant: &str, key: &str, checksum: Option<u64>) -> Result<(), ErrorCode> {
        // The checksum is a crc32c: a wider value is not one (the object keeps 32 bits of it).
        let checksum = checksum.map(u32::try_from).transpose().map_err(|_| ErrorCode::InvalidParams)?;
        let tenant = self.read_tenant(tenant)?.ok_or(ErrorCode::ObjectNotFound)?;
        let entry = tenant.objects().get(key).ok_or(ErrorCode::ObjectNotFound)?;
        // Taken before the lock; committed after the mutation (PutEnd is visible before it is durable, §13).
        let slot = self.reserve_oplog()?;
        let now = self.clock.now();
        let mut st = entry.lock();
        if st.lifecycle() != Lifecycle::Active {
            return Err(ErrorCode::ObjectNotFound);
        }
        let Some(pending) = st.pending() else {
            return if st.replicas.iter().all(|r| r.status == ReplicaStatus::Complete) {
                Ok(())
            } else {
                Err(ErrorCode::InvalidWrite)
            };
        };
        writer.owns(pending)?;
        let stale = drain_invalid(&mut st);
        let Some(pending) = st.take_pending() else {
            drop(st);
            drop(stale);
            return Err(ErrorCode::InvalidWrite);
        };
        if st.replicas.is_empty() {
            // Every segment of this write vanished while it was in flight.
            st.set_pending(pending);
            let dead = tenant.retire(&mut st);
            drop(st);
            tenant.detach(&entry);
            drop((stale, dead));
            return Err(ErrorCode::ObjectNotFound);
        }
        // The writer is recorded for BatchReplicaClear, which clears only the caller's own objects.
        let writer = crate::metadata::writers::number(pending.writer);
        for r in st.replicas.iter_mut() {
            r.status = ReplicaStatus::Complete;
            r.writer = writer;
        }
        match pending.soft_pin.action {
            SoftPinAction::Enable if pending.soft_pin.ttl_ms > 0 => {
                st.set_soft_pin(now.saturating_add(Duration::from_millis(pending.soft_pin.ttl_ms)));
            }
            SoftPinAction::Enable | SoftPinAction::Disable => st.set_soft_pin(Timestamp(0)),
            SoftPinAction::Preserve => {}
        }
        st.flags.set_checksum(checksum.is_some());
        st.checksum = checksum.unwrap_or(0);
        // Settle: the charge becomes size × completed memory replicas; partial placements are refunded here.
        let settled = st.settled();
        let held = pending.pending_charge + st.charged();
        if settled.bytes <= held {
            tenant.release_quota(held - settled.bytes);
        } else {
            tenant.quota().force_charge(settled.bytes - held);
        }
        st.settle(settled);
        st.version = st.version.wrapping_add(1);
        st.extend_lease(now);
        // A refusal (the writer stopped for good) fails the request: the log will never hold this object.
        let report = self.report_state(&tenant, &entry, &st, RemoveCause::Removed);
        let logged = report.commit(slot, || super::ha::post_state_entry(&tenant, &entry, &st, now), None);
        drop(st);
        drop(stale);
        logged.map(|_| ())
    }

    /// PutRevoke: the writer gives up; its `Processing` replicas are freed, and the object with them if nothing
    /// readable remains.
    pub fn put_revoke(&self, writer: impl Into<WriteRef>, tenant: &str, key: &str) -> Result<(), ErrorCode> {
        let r = self.revoke_write(writer.into(), tenant, key);
        self.metrics.put_revoke.record(&r);
        r
    }

    /// UpsertRevoke (same as PutRevoke).
    pub fn upsert_revoke(&self, writer: impl Into<WriteRef>, tenant: &str, key: &str) -> Result<(), ErrorCode> {
        self.put_revoke(writer, tenant, key)
    }

    /// BatchUpsertEnd: per key, in input order.
    pub fn batch_upsert_end(
        &self,
        client: ClientId,
        tenant: &str,
        items: &[(&str, Option<u64>, Option<u64>)],
    ) -> Vec<Result<(), ErrorCode>> {
        self.batch_put_end(client, tenant, items)
    }

    /// BatchUpsertRevoke: per key, in input order.
    pub fn batch_upsert_revoke(
        &self,
        client: ClientId,
        tenant: &str,
        keys: &[(&str, Option<u64>)],
    ) -> Vec<Result<(), ErrorCode>> {
        self.batch_put_revoke(client, tenant, keys)
    }

    /// BatchPutRevoke: per (key, write), in input order (`write` as in [`WriteRef`]).
    pub fn batch_put_revoke(
        &self,
        client: ClientId,
        tenant: &str,
        keys: &[(&str, Option<u64>)],
    ) -> Vec<Result<(), ErrorCode>> {
        let rs: Vec<_> =
            keys.iter().map(|&(k, write)| self.revoke_write(WriteRef { client, write }, tenant, k)).collect();
        self.metrics.put_revoke.record_all(&rs);
        rs
    }

    fn revoke_write(&self, writer: WriteRef, tenant: &str, key: &str) -> Result<(), ErrorCode> {
        let tenant = self.read_tenant(tenant)?.ok_or(ErrorCode::ObjectNotFound)?;
        let entry = tenant.objects().get(key).ok_or(ErrorCode::ObjectNotFound)?;
        let mut st = entry.lock();
        if st.lifecycle() != Lifecycle::Active {
            return Err(ErrorCode::ObjectNotFound);
        }
        match st.pending() {
            None => return Err(ErrorCode::InvalidWrite),
            Some(p) => writer.owns(p)?,
        }
        let pending = st.take_pending().map_or(0, |p| p.pending_charge);
        tenant.release_quota(pending);
        let (revoked, keep): (ReplicaList, ReplicaList) =
            std::mem::take(&mut st.replicas).into_iter().partition(|r| r.status == ReplicaStatus::Processing);
        st.replicas = keep;
        // The revoked buffers may be an in-place upsert's: space the log held under the old value until the
        // upsert's REMOVE, so they are freed only once that is durable (at once without an oplog).
        let revoked =
            Discard { release_at: self.clock.now(), buffers: revoked.into_iter().map(|r| r.buffer).collect() };
        if st.has_readable() {
            drop(st);
            self.discard(revoked);
            return Ok(());
        }
        let dead = tenant.retire(&mut st);
        drop(st);
        tenant.detach(&entry);
        self.discard(revoked);
        drop(dead);
        Ok(())
    }
}

/// Takes out replicas whose segment is gone.
pub(super) fn drain_invalid(st: &mut ObjectState) -> ReplicaList {
    if st.replicas.iter().all(Replica::is_valid) {
        return ReplicaList::new();
    }
    let (keep, gone): (ReplicaList, ReplicaList) =
        std::mem::take(&mut st.replicas).into_iter().partition(Replica::is_valid);
    st.replicas = keep;
    gone
}

/// Creates a member of group `name` and publishes its route, under the group lock (group → route order).
pub(super) fn publish_member(
    tenant: &TenantState,
    name: &str,
    key: &str,
    state: ObjectState,
) -> Result<(), Arc<ObjectEntry>> {
    loop {
        let group: Arc<GroupEntry> = tenant.objects().group_or_create(name);
        let mut members = group.lock();
        if members.removing {
            // The group emptied and left the catalog between our lookup and lock: take the new one.
            continue;
        }
        let entry = Arc::new(ObjectEntry::new(key, Some(group.clone()), state));
        let result = tenant.objects().insert_if_absent(entry.clone());
        if result.is_ok() {
            members.add(&entry);
            group.mark_dirty();
            return Ok(());
        }
        if members.is_empty() {
            members.removing = true;
            tenant.objects().remove_group_if_match(&group);
        }
        return Err(entry);
    }
}

#[cfg(test)]
mod room_tests {
    #![allow(clippy::unwrap_used)]
    use crate::clock::{ManualClock, Timestamp};
    use crate::service::{MasterConfig, MasterService};
    use crate::test_hooks;
    use crescent_proto::{ClientId, ErrorCode, ReplicateConfig};
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    const KIB: u64 = 1 << 10;

    /// A master whose one 4 MiB segment is held by writes still in flight: nothing in it can be evicted.
    fn held_full() -> (Arc<MasterService>, ClientId) {
        let svc =
            Arc::new(MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1_000_000))).unwrap());
        svc.mount_segment(ClientId::random(), crescent_testkit::segment("mem", 4 * KIB * KIB)).unwrap();
        let w = ClientId::random();
        let mut n = 0;
        while put(&svc, w, &format!("held-{n}"), 64 * KIB).is_ok() {
            n += 1;
        }
        assert!(n > 10, "the segment took {n} writes");
        (svc, w)
    }

    /// A write of `size` bytes to `key` by `w`.
    fn put(svc: &MasterService, w: ClientId, key: &str, size: u64) -> Result<(), ErrorCode> {
        svc.put_start(w, "", key, size, &ReplicateConfig::default()).map(drop)
    }

    fn rounds(svc: &MasterService) -> (u64, u64) {
        let m = svc.metrics();
        (m.eviction_runs.load(Ordering::Relaxed), m.room_rounds_spared.load(Ordering::Relaxed))
    }

    /// Puts that found no room while another put was about to look for it take that look's answer: with the
    /// pool held by writes in flight, a queue of them used to scan every object once each, in turn.
    #[test]
    fn a_write_queued_behind_a_round_that_found_no_room_takes_its_answer() {
        let (svc, w) = held_full();
        let before = rounds(&svc);
        let other = Arc::clone(&svc);
        // Once "first" has failed to allocate (and before it waits for the gate), "second" fails, gets the gate
        // and runs a round that finds no room.
        test_hooks::set_before_room_gate(move || {
            let second = put(&other, w, "second", 64 * KIB);
            assert_eq!(second.unwrap_err(), ErrorCode::NoAvailableHandle);
        });
        let first = put(&svc, w, "first", 64 * KIB);
        assert_eq!(first.unwrap_err(), ErrorCode::NoAvailableHandle);
        let after = rounds(&svc);
        assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1), "one round for both, the queued one spared");

        // A write that fails after that round began looks for itself.
        let third = put(&svc, w, "third", 64 * KIB);
        assert_eq!(third.unwrap_err(), ErrorCode::NoAvailableHandle);
        assert_eq!(rounds(&svc), (after.0 + 1, after.1));
    }

    /// A round that found room but took every object it could (the rest of the pool is held by writes in
    /// flight) answers the writes queued behind it once the room it made is taken: a round of their own would
    /// find only what became evictable since.
    #[test]
    fn a_write_queued_behind_a_round_that_took_every_candidate_takes_its_answer() {
        let (svc, w) = held_full();
        // One write ends: its object is the only one eviction may take.
        svc.put_end(w, "", "held-0", None).unwrap();
        let before = rounds(&svc);
        let other = Arc::clone(&svc);
        test_hooks::set_before_room_gate(move || {
            // "second" evicts "held-0" and takes its space.
            put(&other, w, "second", 64 * KIB).unwrap();
        });
        let first = put(&svc, w, "first", 64 * KIB);
        assert_eq!(first.unwrap_err(), ErrorCode::NoAvailableHandle);
        assert!(!svc.exist_key("", "held-0").unwrap());
        let after = rounds(&svc);
        assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1), "one round for both, the queued one spared");
    }

    /// No room for a larger buffer says nothing about a smaller one: the smaller write runs its own round.
    #[test]
    fn a_round_for_a_larger_buffer_does_not_answer_a_smaller_write() {
        let (svc, w) = held_full();
        let before = rounds(&svc);
        let other = Arc::clone(&svc);
        test_hooks::set_before_room_gate(move || {
            let large = put(&other, w, "large", 256 * KIB);
            assert_eq!(large.unwrap_err(), ErrorCode::NoAvailableHandle);
        });
        let small = put(&svc, w, "small", 64 * KIB);
        assert_eq!(small.unwrap_err(), ErrorCode::NoAvailableHandle);
        assert_eq!(rounds(&svc), (before.0 + 2, before.1));
    }

    /// Space freed after the round that found none is still found: a queued write tries the placement itself
    /// before it takes a round's answer.
    #[test]
    fn a_queued_write_still_takes_room_freed_after_the_round_that_found_none() {
        let (svc, w) = held_full();
        let other = Arc::clone(&svc);
        test_hooks::set_before_room_gate(move || {
            let second = put(&other, w, "second", 64 * KIB);
            assert_eq!(second.unwrap_err(), ErrorCode::NoAvailableHandle);
            // Then a write in flight is given up: its space comes back.
            other.put_revoke(w, "", "held-0").unwrap();
        });
        put(&svc, w, "first", 64 * KIB).unwrap();
    }
}
