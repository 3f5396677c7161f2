//! The pool's snapshot seam: a consistent read view of the catalog and every region's allocator state, and the
//! restore transaction that adopts one.
//!
//! The pool knows nothing of any encoding (the snapshot codec, [`crate::snapshot`], owns that): it copies its
//! state out under one shared lock, so encoding runs on the copy with no pool lock held, and it takes a decoded
//! view back through one transaction. Restore validates everything (every region's shape, status and allocator
//! state, duplicate ids, CXL window claims) while building a complete new pool state off to the side, and adopts
//! it in one swap: an inconsistent view changes nothing.

use super::driver::{CxlDriver, RegionAllocState};
use super::{PoolError, PoolState, SegmentPool};
use crate::alloc::AllocatorSnapshot;
use crate::clock::Timestamp;
use crescent_proto::{ClientId, SegmentId, SegmentSpec, SegmentStatus};
use std::collections::HashSet;

/// Below this many adopted allocations a restore prepares its regions on the calling thread.
const PARALLEL_FROM: usize = 1 << 16;
/// At most this many threads prepare regions (the work is memory-bound beyond a few).
const MAX_THREADS: usize = 8;

/// One mounted region as a snapshot sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionReadView {
    /// The segment's shape.
    pub spec: SegmentSpec,
    /// The client that mounted it.
    pub client: ClientId,
    /// Its status (never `Unmounting`: deactivated segments are already gone for every reader).
    pub status: SegmentStatus,
    /// When a graceful unmount ends (`GracefullyUnmounting` only).
    pub graceful_deadline: Option<Timestamp>,
    /// Its allocator state.
    pub alloc: RegionAllocState,
}

/// A consistent copy of the pool's state: every region and the CXL window, taken under one shared lock.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SegmentPoolSnapshotView {
    /// Allocatable regions first, in placement-index order (restore re-adds them in that order), then the rest.
    pub regions: Vec<RegionReadView>,
    /// The shared CXL window's allocator state, when CXL is configured.
    pub cxl_window: Option<AllocatorSnapshot>,
}

impl SegmentPool {
    /// Copies the catalog and every allocator's state. Deactivated (unmounting) segments are left out.
    pub fn snapshot_view(&self) -> SegmentPoolSnapshotView {
        let st = self.state.read();
        let mut order: Vec<(u8, usize, SegmentId)> = Vec::with_capacity(st.catalog.len());
        for (id, r) in st.catalog.iter() {
            if r.status == SegmentStatus::Unmounting {
                continue;
            }
            let index = st.placement.kind(r.spec.kind);
            let pos = index.names().iter().position(|n| **n == *r.spec.name).unwrap_or(usize::MAX);
            order.push((u8::from(!r.status.is_allocatable()), pos, *id));
        }
        order.sort();
        let mut regions = Vec::with_capacity(order.len());
        for (_, _, id) in order {
            let Some(r) = st.catalog.get(&id) else { continue };
            let Some(alloc) = st.drivers.driver(r.spec.kind).ok().and_then(|d| d.snapshot_region(&id)) else {
                continue;
            };
            regions.push(RegionReadView {
                spec: (*r.spec).clone(),
                client: r.client,
                status: r.status,
                graceful_deadline: r.graceful_deadline,
                alloc,
            });
        }
        SegmentPoolSnapshotView { regions, cxl_window: st.drivers.cxl.as_ref().map(CxlDriver::window_snapshot) }
    }

    /// Restores a view into this (empty) pool; returns the number of regions. Restored allocations wait for
    /// [`SegmentPool::take_restored`], which re-binds them and frees those never re-bound.
    pub fn restore(&self, view: SegmentPoolSnapshotView) -> Result<usize, PoolError> {
        let mut next = PoolState::new(&self.config)?;
        match (&view.cxl_window, &mut next.drivers.cxl) {
            (Some(w), Some(d)) => {
                if w.capacity != d.window_capacity() {
                    return Err(PoolError::CorruptSnapshot("cxl window size differs from configuration".into()));
                }
                *d = CxlDriver::restored(w)?;
            }
            (Some(_), None) => return Err(PoolError::CxlDisabled),
            (None, _) => {}
        }
        // Building a region's allocator from its allocations is most of a large restore's pool work, and regions
        // are independent: those with allocators of their own are prepared on several threads first (nothing
        // shared changes), then checked and committed in order as before.
        let allocations: usize = view
            .regions
            .iter()
            .map(|r| match &r.alloc {
                RegionAllocState::Own(a) => a.allocations.len(),
                RegionAllocState::CxlBinding(b) => b.len(),
            })
            .sum();
        let threads = crate::parallel::restore_threads(allocations, PARALLEL_FROM, MAX_THREADS);
        let drivers = &next.drivers;
        let mut prepared = crate::parallel::map(view.regions.iter().collect(), threads, |rec: &RegionReadView| {
            drivers.own(rec.spec.kind).map(|d| d.adopt(&rec.spec, &rec.alloc))
        })
        .into_iter();
        let mut ids = HashSet::new();
        let n = view.regions.len();
        for rec in view.regions {
            let ready = prepared.next().flatten();
            if !ids.insert(rec.spec.id) {
                return Err(PoolError::CorruptSnapshot(format!("segment {} appears twice", rec.spec.id)));
            }
            // SUSPECT and DISCONNECTED are restorable as they are: their owner's return clears them.
            let status_ok =
                rec.status.is_readable() || matches!(rec.status, SegmentStatus::Suspect | SegmentStatus::Disconnected);
            let has_deadline = matches!(rec.status, SegmentStatus::GracefullyUnmounting | SegmentStatus::Disconnected);
            let deadline_ok = has_deadline == rec.graceful_deadline.is_some();
            if !status_ok || !deadline_ok {
                return Err(PoolError::CorruptSnapshot(format!("segment {} has status {:?}", rec.spec.id, rec.status)));
            }
            let prepared = match ready {
                Some(ready) => ready?,
                None => next.drivers.driver_mut(rec.spec.kind)?.prepare_adopt(&rec.spec, &rec.alloc)?,
            };
            prepared.resource.hold_writes(self.config.hold(rec.spec.kind));
            next.validate_new(&rec.spec, &[])?;
            next.commit_and_publish(rec.client, rec.spec, rec.status, rec.graceful_deadline, prepared)?;
        }
        if next.drivers.cxl.as_ref().is_some_and(|d| !d.all_claimed()) {
            return Err(PoolError::CorruptSnapshot("cxl window holds allocations no binding claims".into()));
        }
        let mut st = self.state.write();
        if st.catalog.len() != 0 {
            return Err(PoolError::NotEmpty);
        }
        *st = next;
        Ok(n)
    }
}
