//! `SegmentPool`: the single owner of mounted Memory, CXL and NoF segments and of the regions behind them.
//!
//! Layout: a [`SegmentCatalog`] (by id, name, client, status), a
//! [`PlacementIndex`] (allocatable segments with non-owning references to their resources) and a
//! [`RegionDriverRegistry`] (the owners of physical resources), all behind one pool `RwLock`.
//!
//! * Mount is a transaction: driver prepare → validate catalog → driver commit → publish. Every fallible step
//!   precedes the first mutation, so a failed mount changes nothing.
//! * Unmount is two-phase: [`SegmentPool::deactivate`] (instantly unallocatable and every replica unreadable) →
//!   the caller's metadata sweep, with no pool lock held → [`SegmentPool::erase`].
//! * Allocation runs under the *shared* lock ([`PlacementAccess`]) from policy selection through the allocator
//!   call, and deactivation needs the *exclusive* lock: an allocation can never land in a deactivated region.
//!
//! Lock order: pool lock → a region's allocator mutex (CXL: binding set → window). Buffer release takes only the
//! allocator mutex, never the pool lock.

mod adopted;
mod catalog;
mod driver;
mod index;
mod resource;
mod view;

pub use catalog::SegmentCatalog;
pub use driver::{CxlDriver, OwnAllocatorDriver, PreparedRegion, RegionAllocState, RegionDriver, RegionDriverRegistry};
pub use index::PlacementIndex;
pub use resource::{AllocatedBuffer, RegionResource, RegionUsage, WriteHold};
pub use view::{RegionReadView, SegmentPoolSnapshotView};

use crate::alloc::AllocError;
use crate::clock::Timestamp;
use catalog::MountedSegment;
use crescent_proto::{ClientId, ErrorCode, SegmentId, SegmentKind, SegmentSpec, SegmentStatus};
use parking_lot::{RwLock, RwLockReadGuard};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

/// Why a pool operation failed. Each maps to one wire [`ErrorCode`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The segment's shape is invalid for its medium.
    #[error("invalid segment: {0}")]
    InvalidSpec(String),
    /// The id is mounted with different fields or by another client.
    #[error("segment {0} is already mounted with different parameters or by another client")]
    ConflictingMount(SegmentId),
    /// The operation is not allowed in the segment's current status.
    #[error("segment {id} is {status:?}")]
    UnavailableInStatus {
        /// The segment.
        id: SegmentId,
        /// Its status.
        status: SegmentStatus,
    },
    /// No such segment (or the client owns none).
    #[error("segment not found")]
    NotFound,
    /// The client does not own the segment.
    #[error("segment {0} is not owned by this client")]
    NotOwner(SegmentId),
    /// A live NoF segment already serves this endpoint.
    #[error("a NoF segment already serves endpoint {0}")]
    DuplicateEndpoint(String),
    /// CXL segments need a configured device window.
    #[error("CXL is not enabled on this master")]
    CxlDisabled,
    /// Restore needs an empty pool.
    #[error("restore needs an empty pool")]
    NotEmpty,
    /// The snapshot payload is damaged or inconsistent; nothing was adopted.
    #[error("corrupt segment pool snapshot: {0}")]
    CorruptSnapshot(String),
    /// A restored allocation was not found or does not match.
    #[error("no restored allocation at segment {0} offset {1} with that size")]
    NoRestoredAllocation(SegmentId, u64),
    /// The caller's log refused to record the change (see [`PoolLog`]); nothing changed.
    #[error("the operation log refused the change ({0:?})")]
    LogRefused(ErrorCode),
}

/// Records a pool change in the caller's operation log, called under the pool's write lock right before the
/// change is made (the log's order is then the pool's order: an unmount racing a remount can never be logged
/// on the wrong side of it). It must not block or take another lock; an `Err` aborts the change, and nothing
/// changes. `|_| Ok(())` for a pool without a log.
pub type PoolLog<'a> = &'a mut dyn FnMut(PoolChange<'_>) -> Result<(), ErrorCode>;

/// A change [`PoolLog`] is asked to record.
#[derive(Debug, Clone, Copy)]
pub enum PoolChange<'a> {
    /// A segment mounted anew (not re-adopted or reconnected: those are in the log already).
    Mount(&'a SegmentSpec),
    /// A segment deactivated for unmount (it leaves the pool).
    Unmount(SegmentId),
    /// A segment turned gracefully unmounting until the deadline (the grace from now).
    Graceful(SegmentId),
}

impl PoolError {
    /// The wire code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            PoolError::InvalidSpec(_) | PoolError::ConflictingMount(_) | PoolError::NotOwner(_) => {
                ErrorCode::InvalidParams
            }
            PoolError::UnavailableInStatus { .. } | PoolError::NotEmpty => ErrorCode::UnavailableInCurrentStatus,
            PoolError::NotFound => ErrorCode::SegmentNotFound,
            PoolError::DuplicateEndpoint(_) => ErrorCode::SegmentAlreadyExists,
            PoolError::CxlDisabled => ErrorCode::UnavailableInCurrentMode,
            PoolError::CorruptSnapshot(_) => ErrorCode::DeserializeFail,
            PoolError::NoRestoredAllocation(..) => ErrorCode::InvalidReplica,
            PoolError::LogRefused(code) => *code,
        }
    }
}

/// Pool construction options.
#[derive(Debug, Clone, Default)]
pub struct PoolConfig {
    /// Bytes of the CXL device window; `None` disables CXL mounts.
    pub cxl_window: Option<u64>,
    /// Keeps space freed soon after its allocation out of reuse (a master sealing write grants); `None`: freed
    /// space is reusable at once.
    pub write_hold: Option<WriteHold>,
    /// The hold of disk segments, always set by a master (a disk task's destination is held past the task's
    /// deadline, grants or not: a node's late copy must never land in space given to another object).
    pub disk_hold: Option<WriteHold>,
}

impl PoolConfig {
    /// The write hold of a region of `kind`.
    pub(crate) fn hold(&self, kind: SegmentKind) -> Option<&WriteHold> {
        match kind {
            SegmentKind::Disk => self.disk_hold.as_ref().or(self.write_hold.as_ref()),
            _ => self.write_hold.as_ref(),
        }
    }
}

/// What a mount did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountOutcome {
    /// The segment is new and now allocatable.
    Mounted,
    /// The identical segment was already mounted; nothing changed.
    AlreadyMounted,
    /// The segment was on its way out (a graceful unmount pending) and its owner mounted it again: the unmount
    /// is cancelled and the segment is allocatable again, every replica on it kept.
    Reactivated,
}

/// What a remount did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemountReport {
    /// Segments mounted by this call.
    pub mounted: Vec<SegmentId>,
    /// Segments that were already mounted (e.g. restored from a snapshot) and are re-adopted as they are.
    pub readopted: Vec<SegmentId>,
}

/// A segment that has been deactivated and awaits erase: the handle the metadata sweep works with.
#[derive(Debug, Clone)]
pub struct DeactivatedSegment {
    /// The segment's description.
    pub spec: Arc<SegmentSpec>,
    /// Its owner.
    pub client: ClientId,
    /// Accounting frozen at deactivation.
    pub usage: RegionUsage,
    resource: Weak<RegionResource>,
}

impl DeactivatedSegment {
    /// Whether `buf` lies in this region (the sweep drops such buffers).
    pub fn holds(&self, buf: &AllocatedBuffer) -> bool {
        buf.is_in(&self.resource)
    }
}

/// A read-only view of one mounted segment.
#[derive(Debug, Clone)]
pub struct SegmentInfo {
    /// The segment's description.
    pub spec: Arc<SegmentSpec>,
    /// Its owner.
    pub client: ClientId,
    /// Its status.
    pub status: SegmentStatus,
    /// Its space accounting.
    pub usage: RegionUsage,
    /// When a graceful unmount completes, if one is pending.
    pub graceful_deadline: Option<Timestamp>,
}

/// Capacity and use summed over a set of regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolUsage {
    /// Σ capacity.
    pub capacity: u64,
    /// Σ requested bytes of live buffers.
    pub used: u64,
    /// Σ round-up slack.
    pub slack: u64,
    /// Σ bytes freed but held out of reuse (part of `used`; see `WriteHold`).
    pub held: u64,
}

impl PoolUsage {
    /// `(used + slack) / capacity`: the fraction of space that cannot be allocated (eviction watermark input).
    pub fn used_ratio(&self) -> f64 {
        if self.capacity == 0 { 0.0 } else { (self.used + self.slack) as f64 / self.capacity as f64 }
    }
}

pub(crate) struct PoolState {
    catalog: SegmentCatalog,
    placement: PlacementIndex,
    drivers: RegionDriverRegistry,
    /// Restored allocations that the metadata restore has not re-bound yet.
    pending_rebind: HashMap<SegmentId, adopted::Adopted>,
}

impl PoolState {
    fn new(config: &PoolConfig) -> Result<Self, PoolError> {
        Ok(Self {
            catalog: SegmentCatalog::default(),
            placement: PlacementIndex::default(),
            drivers: RegionDriverRegistry::new(config.cxl_window)?,
            pending_rebind: HashMap::new(),
        })
    }

    fn resource(&self, spec: &SegmentSpec) -> Option<&Arc<RegionResource>> {
        self.drivers.driver(spec.kind).ok()?.resource(&spec.id)
    }

    /// A new segment's region, checked (its shape by its driver, then against the catalog and the rest of
    /// `batch`) and prepared with `hold`; nothing shared changes until it is committed.
    fn prepare_new(
        &self,
        spec: &SegmentSpec,
        batch: &[&SegmentSpec],
        hold: Option<&WriteHold>,
    ) -> Result<PreparedRegion, PoolError> {
        let prepared = self.drivers.driver(spec.kind)?.prepare_open(spec)?;
        prepared.resource.hold_writes(hold);
        self.validate_new(spec, batch)?;
        Ok(prepared)
    }

    /// Catalog-level checks for a new segment (the driver has already checked its shape).
    fn validate_new(&self, spec: &SegmentSpec, batch: &[&SegmentSpec]) -> Result<(), PoolError> {
        if spec.kind == SegmentKind::Nof {
            // Retried mounts with a fresh id must not create a second segment over the same target.
            let taken = self.catalog.iter().any(|(_, r)| {
                r.spec.kind == SegmentKind::Nof && r.spec.endpoint == spec.endpoint && r.status.is_allocatable()
            }) || batch.iter().any(|s| s.kind == SegmentKind::Nof && s.endpoint == spec.endpoint);
            if taken {
                return Err(PoolError::DuplicateEndpoint(spec.endpoint.clone()));
            }
        }
        Ok(())
    }

    /// Driver commit + publish: infallible once `prepared` exists and validation passed.
    fn commit_and_publish(
        &mut self,
        client: ClientId,
        spec: SegmentSpec,
        status: SegmentStatus,
        deadline: Option<Timestamp>,
        prepared: PreparedRegion,
    ) -> Result<(), PoolError> {
        self.drivers.driver_mut(spec.kind)?.commit(&prepared);
        if matches!(status, SegmentStatus::Suspect | SegmentStatus::Disconnected) {
            prepared.resource.set_reachable(false);
        }
        if status.is_allocatable() {
            self.placement.add(&prepared.resource, &spec.host_id);
        }
        if !prepared.adopted.is_empty() {
            self.pending_rebind.insert(spec.id, prepared.adopted);
        }
        self.catalog.insert(MountedSegment {
            spec: Arc::new(spec),
            client,
            status,
            graceful_deadline: deadline,
            held: None,
        });
        Ok(())
    }

    fn info(&self, r: &MountedSegment) -> SegmentInfo {
        SegmentInfo {
            spec: r.spec.clone(),
            client: r.client,
            status: r.status,
            usage: self.resource(&r.spec).map(|x| x.usage()).unwrap_or_default(),
            graceful_deadline: r.graceful_deadline,
        }
    }

    /// Its owner proved it is alive: a SUSPECT or DISCONNECTED segment goes back to `Ok` (reachable), or to the
    /// status a drain holds it in, and a graceful unmount is rolled back (the RFC's reactivate). Returns whether
    /// anything changed.
    fn reconnect(&mut self, id: &SegmentId) -> bool {
        let Some(r) = self.catalog.get(id) else { return false };
        match r.status {
            SegmentStatus::Suspect | SegmentStatus::Disconnected => {
                let spec = r.spec.clone();
                if let Some(res) = self.resource(&spec) {
                    res.set_reachable(true);
                }
            }
            SegmentStatus::GracefullyUnmounting => {}
            _ => return false,
        }
        let back = r.held.unwrap_or(SegmentStatus::Ok);
        self.transition(id, back, None);
        true
    }

    /// Moves a segment to `status`, keeping the placement index equal to "status is OK".
    fn transition(&mut self, id: &SegmentId, status: SegmentStatus, deadline: Option<Timestamp>) {
        let Some(r) = self.catalog.get(id) else { return };
        let spec = r.spec.clone();
        let was_allocatable = r.status.is_allocatable();
        if was_allocatable && !status.is_allocatable() {
            self.placement.remove(spec.kind, &spec.name, id);
        } else if !was_allocatable
            && status.is_allocatable()
            && let Some(res) = self.resource(&spec).cloned()
        {
            self.placement.add(&res, &spec.host_id);
        }
        self.catalog.set_status(id, status, deadline);
    }
}

/// The owner of every mounted region. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct SegmentPool {
    config: PoolConfig,
    state: RwLock<PoolState>,
}

impl std::fmt::Debug for SegmentPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentPool").field("segments", &self.state.read().catalog.len()).finish()
    }
}

impl SegmentPool {
    /// An empty pool.
    pub fn new(config: PoolConfig) -> Result<Self, PoolError> {
        let state = PoolState::new(&config)?;
        Ok(Self { config, state: RwLock::new(state) })
    }

    /// Mounts a segment for `client`. Mounting the identical segment again is OK ([`MountOutcome::AlreadyMounted`]);
    /// the same id with other fields or another owner is `INVALID_PARAMS`; an identical id in a non-OK status is
    /// `UNAVAILABLE_IN_CURRENT_STATUS`.
    pub fn mount(&self, client: ClientId, spec: SegmentSpec) -> Result<MountOutcome, PoolError> {
        self.mount_logged(client, spec, &mut |_| Ok(()))
    }

    /// [`SegmentPool::mount`], recording a new segment in `log` under the pool's lock.
    pub fn mount_logged(
        &self,
        client: ClientId,
        spec: SegmentSpec,
        log: PoolLog<'_>,
    ) -> Result<MountOutcome, PoolError> {
        let mut st = self.state.write();
        if let Some(existing) = st.catalog.get(&spec.id) {
            if *existing.spec != spec || existing.client != client {
                return Err(PoolError::ConflictingMount(spec.id));
            }
            let status = existing.status;
            // The RFC's reactivate: a graceful unmount is rolled back before anything was deactivated; a suspect
            // or disconnected segment's owner is back.
            if st.reconnect(&spec.id) {
                return Ok(MountOutcome::Reactivated);
            }
            if !status.is_allocatable() {
                return Err(PoolError::UnavailableInStatus { id: spec.id, status });
            }
            return Ok(MountOutcome::AlreadyMounted);
        }
        let prepared = st.prepare_new(&spec, &[], self.config.hold(spec.kind))?;
        log(PoolChange::Mount(&spec)).map_err(PoolError::LogRefused)?;
        st.commit_and_publish(client, spec, SegmentStatus::Ok, None, prepared)?;
        Ok(MountOutcome::Mounted)
    }

    /// Why mounting `specs` for `client` (one spec: a mount; several: a remount) is refused now, changing nothing:
    /// the same checks `mount` and `remount` make, for the words of an error reply. `None`: it would be accepted.
    pub fn mount_refusal(&self, client: ClientId, specs: &[SegmentSpec]) -> Option<PoolError> {
        let st = self.state.read();
        let mut seen = HashSet::new();
        let mut fresh: Vec<&SegmentSpec> = Vec::new();
        for spec in specs {
            if !seen.insert(spec.id) {
                return Some(PoolError::InvalidSpec(format!("segment {} listed twice", spec.id)));
            }
            match st.catalog.get(&spec.id) {
                Some(existing) if existing.client != client || *existing.spec != *spec => {
                    return Some(PoolError::ConflictingMount(spec.id));
                }
                Some(existing) if existing.status == SegmentStatus::Unmounting => {
                    return Some(PoolError::UnavailableInStatus { id: spec.id, status: existing.status });
                }
                Some(_) => {}
                None => fresh.push(spec),
            }
        }
        (0..fresh.len()).find_map(|i| st.prepare_new(fresh[i], &fresh[..i], None).err())
    }

    /// Re-mounts a client's segments after it was told `NEED_REMOUNT` (e.g. after a master restart). Segments
    /// already mounted must match exactly and belong to `client`; they are re-adopted as they are. The rest are
    /// mounted. All or nothing: any invalid segment fails the whole call and changes nothing.
    pub fn remount(&self, client: ClientId, specs: &[SegmentSpec]) -> Result<RemountReport, PoolError> {
        self.remount_logged(client, specs, &mut |_| Ok(()))
    }

    /// [`SegmentPool::remount`], recording each segment mounted anew in `log` under the pool's lock (all are
    /// recorded before any is committed: a refusal mounts none).
    pub fn remount_logged(
        &self,
        client: ClientId,
        specs: &[SegmentSpec],
        log: PoolLog<'_>,
    ) -> Result<RemountReport, PoolError> {
        let mut st = self.state.write();
        let mut report = RemountReport::default();
        let mut fresh: Vec<&SegmentSpec> = Vec::new();
        let mut reconnect: Vec<SegmentId> = Vec::new();
        let mut seen = HashSet::new();
        for spec in specs {
            if !seen.insert(spec.id) {
                return Err(PoolError::InvalidSpec(format!("segment {} listed twice", spec.id)));
            }
            match st.catalog.get(&spec.id) {
                Some(existing) => {
                    if existing.client != client || *existing.spec != *spec {
                        return Err(PoolError::ConflictingMount(spec.id));
                    }
                    if existing.status == SegmentStatus::Unmounting {
                        return Err(PoolError::UnavailableInStatus { id: spec.id, status: existing.status });
                    }
                    report.readopted.push(spec.id);
                    // Re-adopted as they are, except what was cut off for the owner's liveness.
                    if matches!(existing.status, SegmentStatus::Suspect | SegmentStatus::Disconnected) {
                        reconnect.push(spec.id);
                    }
                }
                None => fresh.push(spec),
            }
        }
        let mut prepared = Vec::with_capacity(fresh.len());
        for (i, spec) in fresh.iter().enumerate() {
            prepared.push(st.prepare_new(spec, &fresh[..i], self.config.hold(spec.kind))?);
        }
        for spec in &fresh {
            log(PoolChange::Mount(spec)).map_err(PoolError::LogRefused)?;
        }
        for (spec, p) in fresh.into_iter().zip(prepared) {
            report.mounted.push(spec.id);
            st.commit_and_publish(client, spec.clone(), SegmentStatus::Ok, None, p)?;
        }
        for id in &reconnect {
            st.reconnect(id);
        }
        Ok(report)
    }

    /// Phase 1 of unmount: the segment leaves the placement index and every buffer on it becomes unreadable, at
    /// once. Unknown id → `Ok(None)`. Already deactivated → `UNAVAILABLE_IN_CURRENT_STATUS`.
    pub fn deactivate(&self, id: SegmentId) -> Result<Option<DeactivatedSegment>, PoolError> {
        self.deactivate_logged(id, &mut |_| Ok(()))
    }

    /// [`SegmentPool::deactivate`], recording the unmount in `log` under the pool's lock.
    pub fn deactivate_logged(&self, id: SegmentId, log: PoolLog<'_>) -> Result<Option<DeactivatedSegment>, PoolError> {
        let mut st = self.state.write();
        let Some(r) = st.catalog.get(&id) else { return Ok(None) };
        if r.status == SegmentStatus::Unmounting {
            return Err(PoolError::UnavailableInStatus { id, status: r.status });
        }
        log(PoolChange::Unmount(id)).map_err(PoolError::LogRefused)?;
        let (spec, client) = (r.spec.clone(), r.client);
        st.transition(&id, SegmentStatus::Unmounting, None);
        let resource = st.resource(&spec).cloned();
        let usage = resource.as_ref().map(|x| x.usage()).unwrap_or_default();
        if let Some(res) = &resource {
            res.deactivate();
        }
        st.pending_rebind.remove(&id);
        let resource = resource.as_ref().map(Arc::downgrade).unwrap_or_default();
        tracing::info!(segment = %id, name = %spec.name, "segment deactivated");
        Ok(Some(DeactivatedSegment { spec, client, usage, resource }))
    }

    /// Phase 3 of unmount: forgets a deactivated segment and drops its resource. Unknown id → OK.
    pub fn erase(&self, id: SegmentId) -> Result<(), PoolError> {
        let dropped = {
            let mut st = self.state.write();
            let Some(r) = st.catalog.get(&id) else { return Ok(()) };
            if r.status != SegmentStatus::Unmounting {
                return Err(PoolError::UnavailableInStatus { id, status: r.status });
            }
            let kind = r.spec.kind;
            st.catalog.remove(&id);
            st.drivers.driver_mut(kind)?.erase(&id)
        };
        // The allocator (possibly large) is freed here, outside the pool lock.
        drop(dropped);
        Ok(())
    }

    /// Full unmount: deactivate → `sweep` (no pool lock held) → erase. Unknown id → `Ok(None)`.
    pub fn unmount(
        &self,
        id: SegmentId,
        sweep: impl FnOnce(&DeactivatedSegment),
    ) -> Result<Option<DeactivatedSegment>, PoolError> {
        let Some(d) = self.deactivate(id)? else { return Ok(None) };
        sweep(&d);
        self.erase(id)?;
        Ok(Some(d))
    }

    /// Graceful unmount: the segment stays readable but unallocatable until `deadline`, when
    /// [`SegmentPool::due_graceful_unmounts`] reports it for a full unmount. Only the owner may ask; asking again is
    /// OK and keeps the first deadline.
    pub fn graceful_unmount(&self, id: SegmentId, client: ClientId, deadline: Timestamp) -> Result<(), PoolError> {
        self.graceful_unmount_logged(id, client, deadline, &mut |_| Ok(()))
    }

    /// [`SegmentPool::graceful_unmount`], recording the change (not a repeat) in `log` under the pool's lock.
    pub fn graceful_unmount_logged(
        &self,
        id: SegmentId,
        client: ClientId,
        deadline: Timestamp,
        log: PoolLog<'_>,
    ) -> Result<(), PoolError> {
        let mut st = self.state.write();
        if st.catalog.ids_for_client(&client).is_empty() {
            return Err(PoolError::NotFound);
        }
        let r = st.catalog.get(&id).ok_or(PoolError::NotFound)?;
        if r.client != client {
            return Err(PoolError::NotOwner(id));
        }
        match r.status {
            SegmentStatus::GracefullyUnmounting => Ok(()),
            SegmentStatus::Ok | SegmentStatus::Draining => {
                log(PoolChange::Graceful(id)).map_err(PoolError::LogRefused)?;
                st.transition(&id, SegmentStatus::GracefullyUnmounting, Some(deadline));
                Ok(())
            }
            status => Err(PoolError::UnavailableInStatus { id, status }),
        }
    }

    /// Segments whose graceful or disconnection deadline has passed, earliest deadline first.
    pub fn due_graceful_unmounts(&self, now: Timestamp) -> Vec<SegmentId> {
        self.state.read().catalog.due_deadlines(now)
    }

    /// The earliest pending graceful deadline (for a scheduler to sleep until).
    pub fn next_graceful_deadline(&self) -> Option<Timestamp> {
        self.state.read().catalog.next_deadline()
    }

    /// Marks an `Ok` segment SUSPECT (a client could not reach its node): it leaves placement and its replicas
    /// are not handed to readers, nothing else changes. Returns whether it was `Ok` (other statuses are left
    /// alone: a segment on its way out or already suspect).
    pub fn suspect(&self, id: SegmentId) -> Result<bool, PoolError> {
        let mut st = self.state.write();
        let r = st.catalog.get(&id).ok_or(PoolError::NotFound)?;
        if r.status != SegmentStatus::Ok {
            return Ok(false);
        }
        let spec = r.spec.clone();
        if let Some(res) = st.resource(&spec) {
            res.set_reachable(false);
        }
        st.transition(&id, SegmentStatus::Suspect, None);
        Ok(true)
    }

    /// Cuts a segment off after its owner missed its client TTL: DISCONNECTED until `deadline` (then
    /// [`SegmentPool::due_graceful_unmounts`] lists it for unmount) unless the owner remounts first. A graceful
    /// unmount keeps the earlier of its deadline and `deadline`. Returns whether it changed (unknown, unmounting
    /// or already disconnected segments are left alone).
    pub fn disconnect(&self, id: SegmentId, deadline: Timestamp) -> bool {
        let mut st = self.state.write();
        let Some(r) = st.catalog.get(&id) else { return false };
        if matches!(r.status, SegmentStatus::Unmounting | SegmentStatus::Disconnected) {
            return false;
        }
        let deadline = r.graceful_deadline.map_or(deadline, |d| d.min(deadline));
        let spec = r.spec.clone();
        if let Some(res) = st.resource(&spec) {
            res.set_reachable(false);
        }
        st.transition(&id, SegmentStatus::Disconnected, Some(deadline));
        true
    }

    /// Returns every SUSPECT segment of `client` to `Ok`, or to the status a drain holds it in (its node just
    /// proved it is alive); how many. Costs a shared-lock look when there are none.
    pub fn clear_suspect(&self, client: ClientId) -> usize {
        let suspects = |st: &PoolState| -> Vec<SegmentId> {
            st.catalog
                .ids_for_client(&client)
                .into_iter()
                .filter(|id| st.catalog.get(id).is_some_and(|r| r.status == SegmentStatus::Suspect))
                .collect()
        };
        if suspects(&self.state.read()).is_empty() {
            return 0;
        }
        let mut st = self.state.write();
        let ids = suspects(&st);
        for id in &ids {
            st.reconnect(id);
        }
        ids.len()
    }

    /// Sets a drain-related status: `Ok`, `Draining` or `Drained`. Leaving `Ok` makes the segment unallocatable
    /// (still readable); returning to `Ok` makes it allocatable again. A drain's status is held: a SUSPECT or
    /// DISCONNECTED segment keeps that status now and takes the held one when its owner is back.
    pub fn set_status(&self, id: SegmentId, status: SegmentStatus) -> Result<(), PoolError> {
        if !matches!(status, SegmentStatus::Ok | SegmentStatus::Draining | SegmentStatus::Drained) {
            return Err(PoolError::InvalidSpec(format!("status {status:?} cannot be set directly")));
        }
        let mut st = self.state.write();
        let now = st.catalog.get(&id).ok_or(PoolError::NotFound)?.status;
        let cut_off = matches!(now, SegmentStatus::Suspect | SegmentStatus::Disconnected);
        if matches!(now, SegmentStatus::Unmounting | SegmentStatus::GracefullyUnmounting) {
            if status == SegmentStatus::Ok {
                // No drain holds it any more: a reactivation brings it back in service.
                st.catalog.set_held(&id, None);
            }
            return Err(PoolError::UnavailableInStatus { id, status: now });
        }
        st.catalog.set_held(&id, (status != SegmentStatus::Ok).then_some(status));
        if !cut_off {
            st.transition(&id, status, None);
        }
        Ok(())
    }

    /// The client that mounted a segment.
    pub fn owner(&self, id: SegmentId) -> Option<ClientId> {
        self.state.read().catalog.get(&id).map(|r| r.client)
    }

    /// One segment.
    pub fn segment(&self, id: SegmentId) -> Option<SegmentInfo> {
        let st = self.state.read();
        st.catalog.get(&id).map(|r| st.info(r))
    }

    /// Where `id`'s live allocations lie: `(capacity, [(offset, bytes occupied)])` in address order; `None` for
    /// an unknown segment or one whose space is not its own (CXL).
    pub fn occupancy(&self, id: SegmentId) -> Option<(u64, Vec<(u64, u64)>)> {
        let res = {
            let st = self.state.read();
            st.catalog.get(&id).and_then(|r| st.resource(&r.spec)).cloned()
        }?;
        Some((res.usage().capacity, res.occupancy()?))
    }

    /// Every mounted segment (any status), ordered by id.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let st = self.state.read();
        let mut v: Vec<SegmentInfo> = st.catalog.iter().map(|(_, r)| st.info(r)).collect();
        v.sort_by_key(|i| i.spec.id);
        v
    }

    /// A client's segments.
    pub fn client_segments(&self, client: ClientId) -> Vec<SegmentId> {
        self.state.read().catalog.ids_for_client(&client)
    }

    /// Clients that own at least one mounted segment.
    pub fn clients(&self) -> Vec<ClientId> {
        self.state.read().catalog.clients()
    }

    /// Segments (any status) with this name.
    pub fn segments_named(&self, name: &str) -> Vec<SegmentId> {
        self.state.read().catalog.ids_for_name(name)
    }

    /// Segments in a status.
    pub fn segments_with_status(&self, status: SegmentStatus) -> Vec<SegmentId> {
        self.state.read().catalog.ids_with_status(status)
    }

    /// Whether the segment is in the placement index (receives new replicas). True exactly for status OK.
    pub fn is_allocatable(&self, id: SegmentId) -> bool {
        let st = self.state.read();
        st.catalog.get(&id).is_some_and(|r| st.placement.contains(r.spec.kind, &r.spec.name, &id))
    }

    /// `client`'s allocatable disk segment (a storage node's disk tier), if it mounted one.
    pub fn disk_of(&self, client: ClientId) -> Option<SegmentId> {
        let st = self.state.read();
        st.catalog.ids_for_client(&client).into_iter().find(|id| {
            st.catalog.get(id).is_some_and(|r| {
                r.spec.kind == SegmentKind::Disk && st.placement.contains(r.spec.kind, &r.spec.name, id)
            })
        })
    }

    /// Whether `size` bytes can be allocated in segment `id` now (false for an unknown or unallocatable one).
    pub fn can_fit(&self, id: SegmentId, size: u64) -> bool {
        let st = self.state.read();
        st.catalog
            .get(&id)
            .filter(|r| st.placement.contains(r.spec.kind, &r.spec.name, &id))
            .and_then(|r| st.resource(&r.spec))
            .is_some_and(|res| res.is_live() && res.can_fit(size))
    }

    /// Allocates `size` bytes in segment `id`, which must be allocatable (status OK), under the pool's shared
    /// lock (a deactivation cannot slip in between the check and the allocation).
    pub fn allocate_in(&self, id: SegmentId, size: u64) -> Result<AllocatedBuffer, AllocError> {
        let st = self.state.read();
        let none = AllocError::NoSpace { requested: size, largest_free: 0 };
        let res = st
            .catalog
            .get(&id)
            .filter(|r| st.placement.contains(r.spec.kind, &r.spec.name, &id))
            .and_then(|r| st.resource(&r.spec))
            .filter(|res| res.is_live())
            .ok_or(none)?;
        res.allocate(size)
    }

    /// Number of mounted segments (any status).
    pub fn len(&self) -> usize {
        self.state.read().catalog.len()
    }

    /// Whether no segment is mounted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Capacity and use of the live (not deactivated) segments of one medium.
    pub fn usage(&self, kind: SegmentKind) -> PoolUsage {
        let st = self.state.read();
        let mut u = PoolUsage::default();
        for (_, r) in st.catalog.iter().filter(|(_, r)| r.spec.kind == kind && r.status.is_readable()) {
            if let Some(res) = st.resource(&r.spec) {
                let x = res.usage();
                u.capacity += x.capacity;
                u.used += x.used;
                u.slack += x.slack;
                u.held += x.held;
            }
        }
        u
    }

    /// Shared access for placement: holds the pool's shared lock until dropped, so no segment can be deactivated
    /// between choosing a target and allocating from it.
    pub fn placement_access(&self) -> PlacementAccess<'_> {
        PlacementAccess { state: self.state.read() }
    }

    /// Takes the allocations a restore adopted out of the pool, to be re-bound to their objects (from several
    /// threads at once: taking one takes no lock, the pool's is not taken again); dropping or
    /// [`RestoredAllocations::finish`]ing the result frees those never re-bound.
    pub fn take_restored(&self) -> RestoredAllocations {
        let mut st = self.state.write();
        let st = &mut *st;
        let mut segments = hashbrown::HashMap::with_capacity(st.pending_rebind.len());
        for (id, open) in st.pending_rebind.drain() {
            let Some(r) = st.catalog.get(&id) else { continue };
            let Some(res) = st.drivers.driver(r.spec.kind).ok().and_then(|d| d.resource(&id)) else { continue };
            segments.insert(id, RestoredSegment { resource: Arc::downgrade(res), open });
        }
        RestoredAllocations { segments }
    }
}

/// Allocations adopted by a restore and not yet re-bound to an object (see [`SegmentPool::take_restored`]).
pub struct RestoredAllocations {
    segments: hashbrown::HashMap<SegmentId, RestoredSegment>,
}

/// One segment's adopted allocations.
struct RestoredSegment {
    /// The region they live in (a buffer's owner).
    resource: Weak<RegionResource>,
    /// Those adopted, each re-bound once (no lock: see [`adopted::Adopted`]).
    open: adopted::Adopted,
}

impl RestoredAllocations {
    /// Re-binds the allocation at `offset` of segment `id` as a buffer. It must have exactly `size` requested
    /// bytes, and each allocation can be re-bound once.
    pub fn rebind(&self, id: SegmentId, offset: u64, size: u64) -> Result<AllocatedBuffer, PoolError> {
        let seg = self.segments.get(&id).ok_or(PoolError::NoRestoredAllocation(id, offset))?;
        let a = seg.open.take(offset, size).ok_or(PoolError::NoRestoredAllocation(id, offset))?;
        Ok(AllocatedBuffer::from_parts(seg.resource.clone(), a))
    }

    /// Ends a restore: the allocations nobody re-bound are freed (their objects did not survive). Returns how
    /// many were freed.
    pub fn finish(mut self) -> usize {
        self.free_open()
    }

    fn free_open(&mut self) -> usize {
        let mut freed = 0;
        for seg in self.segments.values_mut() {
            for a in seg.open.take_rest() {
                drop(AllocatedBuffer::from_parts(seg.resource.clone(), a));
                freed += 1;
            }
        }
        freed
    }
}

impl Drop for RestoredAllocations {
    fn drop(&mut self) {
        self.free_open();
    }
}

/// The pool's shared lock, held for one placement decision (policy selection + allocator calls).
pub struct PlacementAccess<'a> {
    state: RwLockReadGuard<'a, PoolState>,
}

impl PlacementAccess<'_> {
    /// Allocatable names of a segment kind, in index order.
    pub fn names(&self, kind: SegmentKind) -> &[Arc<str>] {
        self.state.placement.kind(kind).names()
    }

    /// Whether `name` is allocatable among segments of `kind`.
    pub fn has_name(&self, kind: SegmentKind, name: &str) -> bool {
        !self.state.placement.kind(kind).targets(name).is_empty()
    }

    /// Allocatable names per host (host → names), for local-first ordering.
    pub fn hosts(&self, kind: SegmentKind) -> impl Iterator<Item = (&Arc<str>, Vec<&Arc<str>>)> {
        self.state.placement.kind(kind).hosts().iter().map(|(h, names)| (h, names.keys().collect()))
    }

    /// Free ratio of a name (Σ free / Σ capacity over its segments).
    pub fn free_ratio(&self, kind: SegmentKind, name: &str) -> f64 {
        let (mut cap, mut free) = (0u64, 0u64);
        for t in self.state.placement.kind(kind).targets(name) {
            if let Some(r) = t.resource.upgrade() {
                let u = r.usage();
                cap += u.capacity;
                free += u.capacity.saturating_sub(u.used + u.slack);
            }
        }
        if cap == 0 { 0.0 } else { free as f64 / cap as f64 }
    }

    /// Allocates `size` bytes from one segment named `name` (segments sharing a name are tried from a random
    /// start, each once).
    pub fn allocate_on(&self, kind: SegmentKind, name: &str, size: u64) -> Result<AllocatedBuffer, AllocError> {
        let targets = self.state.placement.kind(kind).targets(name);
        let n = targets.len();
        let start = if n > 1 { fastrand::usize(..n) } else { 0 };
        let mut last = AllocError::NoSpace { requested: size, largest_free: 0 };
        for i in 0..n {
            let Some(r) = targets[(start + i) % n].resource.upgrade() else { continue };
            if !r.is_live() || !r.can_fit(size) {
                continue;
            }
            match r.allocate(size) {
                Ok(b) => return Ok(b),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The segment id behind a name, when exactly one segment carries it (tests and diagnostics).
    pub fn segment_of(&self, kind: SegmentKind, name: &str) -> Vec<SegmentId> {
        self.state.placement.kind(kind).targets(name).iter().map(|t| t.id).collect()
    }
}
