//! Region drivers: the owners of physical resources, one per medium.
//!
//! A driver validates a segment's shape, builds its resource without touching any shared state (`prepare_*`),
//! and takes ownership of it only in the infallible `commit`. That split is what makes a pool mount a
//! transaction: everything that can fail happens before anything is published.

use super::PoolError;
use super::adopted::Adopted;
use super::resource::{AllocationTarget, RegionResource};
use crate::alloc::{Allocation, AllocatorSnapshot, OffsetAllocator};
use crescent_proto::{SegmentId, SegmentKind, SegmentSpec};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// A resource built by `prepare_*`, not yet owned by anyone; dropping it undoes the preparation.
pub struct PreparedRegion {
    pub(crate) resource: Arc<RegionResource>,
    /// Live allocations adopted from a snapshot (restore only).
    pub(crate) adopted: Adopted,
}

/// A region's allocator state, as a snapshot view carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionAllocState {
    /// Memory/NoF: the region's own allocator.
    Own(AllocatorSnapshot),
    /// CXL: the offsets (in the shared window) this binding holds.
    CxlBinding(Vec<u64>),
}

/// The owner of one medium's physical resources.
pub trait RegionDriver: Send + Sync {
    /// The medium this driver serves.
    fn kind(&self) -> SegmentKind;
    /// Checks the segment's shape (base/size rules of the medium).
    fn validate(&self, spec: &SegmentSpec) -> Result<(), PoolError>;
    /// Builds a fresh, empty resource for `spec`; no shared state changes.
    fn prepare_open(&self, spec: &SegmentSpec) -> Result<PreparedRegion, PoolError>;
    /// Builds a resource holding the allocations of a snapshot; no shared state changes.
    fn prepare_adopt(&mut self, spec: &SegmentSpec, state: &RegionAllocState) -> Result<PreparedRegion, PoolError>;
    /// Takes ownership of a prepared resource. Infallible by contract.
    fn commit(&mut self, prepared: &PreparedRegion);
    /// The resource of a committed segment.
    fn resource(&self, id: &SegmentId) -> Option<&Arc<RegionResource>>;
    /// Drops ownership of a segment's resource (after deactivation), returning its space where it is shared.
    fn erase(&mut self, id: &SegmentId) -> Option<Arc<RegionResource>>;
    /// The allocator state of a committed segment, for snapshots.
    fn snapshot_region(&self, id: &SegmentId) -> Option<RegionAllocState>;
}

fn validate_common(spec: &SegmentSpec) -> Result<(), PoolError> {
    if spec.name.is_empty() {
        return Err(PoolError::InvalidSpec("segment name is empty".into()));
    }
    if spec.size == 0 {
        return Err(PoolError::InvalidSpec("segment size is 0".into()));
    }
    if spec.base.checked_add(spec.size).is_none() {
        return Err(PoolError::InvalidSpec("segment base + size overflows".into()));
    }
    Ok(())
}

fn new_resource(spec: &SegmentSpec, target: AllocationTarget) -> Arc<RegionResource> {
    Arc::new(RegionResource::new(
        spec.id,
        spec.kind,
        Arc::from(spec.name.as_str()),
        Arc::from(spec.endpoint.as_str()),
        spec.size,
        target,
    ))
}

/// Memory and NoF regions: one allocator per region over `[0, size)`.
#[derive(Debug)]
pub struct OwnAllocatorDriver {
    kind: SegmentKind,
    regions: HashMap<SegmentId, Arc<RegionResource>>,
}

impl OwnAllocatorDriver {
    /// The memory driver: base 0 is invalid (it would be a null mapping).
    pub fn memory() -> Self {
        Self { kind: SegmentKind::Memory, regions: HashMap::new() }
    }

    /// The NoF driver: base is a namespace offset, 0 is valid.
    pub fn nof() -> Self {
        Self { kind: SegmentKind::Nof, regions: HashMap::new() }
    }

    /// The disk driver: base is a file offset, 0 is valid; the size must be whole 4 KiB blocks (the node's
    /// direct I/O needs aligned ranges, and the service rounds every disk allocation up to blocks).
    pub fn disk() -> Self {
        Self { kind: SegmentKind::Disk, regions: HashMap::new() }
    }

    /// [`RegionDriver::prepare_adopt`], which changes nothing of the driver's: a restore prepares many regions
    /// at once, on several threads.
    pub(crate) fn adopt(&self, spec: &SegmentSpec, state: &RegionAllocState) -> Result<PreparedRegion, PoolError> {
        self.validate(spec)?;
        let RegionAllocState::Own(snap) = state else {
            return Err(PoolError::CorruptSnapshot(format!("segment {} has a CXL binding state", spec.id)));
        };
        if snap.capacity != spec.size {
            return Err(PoolError::CorruptSnapshot(format!("segment {} allocator capacity != size", spec.id)));
        }
        let (alloc, handles) = OffsetAllocator::restore(snap)
            .map_err(|e| PoolError::CorruptSnapshot(format!("segment {}: {e}", spec.id)))?;
        let resource = new_resource(spec, AllocationTarget::Own(Mutex::new(alloc)));
        Ok(PreparedRegion { resource, adopted: Adopted::new(handles) })
    }
}

impl RegionDriver for OwnAllocatorDriver {
    fn kind(&self) -> SegmentKind {
        self.kind
    }

    fn validate(&self, spec: &SegmentSpec) -> Result<(), PoolError> {
        validate_common(spec)?;
        if self.kind == SegmentKind::Memory && spec.base == 0 {
            return Err(PoolError::InvalidSpec("memory segment base is 0".into()));
        }
        if self.kind == SegmentKind::Disk && !spec.size.is_multiple_of(crescent_proto::DISK_BLOCK) {
            return Err(PoolError::InvalidSpec(format!(
                "a disk segment's size must be a multiple of {} bytes, not {}",
                crescent_proto::DISK_BLOCK,
                spec.size
            )));
        }
        Ok(())
    }

    fn prepare_open(&self, spec: &SegmentSpec) -> Result<PreparedRegion, PoolError> {
        self.validate(spec)?;
        let alloc = OffsetAllocator::new(spec.size).map_err(|e| PoolError::InvalidSpec(e.to_string()))?;
        let resource = new_resource(spec, AllocationTarget::Own(Mutex::new(alloc)));
        Ok(PreparedRegion { resource, adopted: Adopted::new(Vec::new()) })
    }

    fn prepare_adopt(&mut self, spec: &SegmentSpec, state: &RegionAllocState) -> Result<PreparedRegion, PoolError> {
        self.adopt(spec, state)
    }

    fn commit(&mut self, prepared: &PreparedRegion) {
        self.regions.insert(prepared.resource.segment_id(), prepared.resource.clone());
    }

    fn resource(&self, id: &SegmentId) -> Option<&Arc<RegionResource>> {
        self.regions.get(id)
    }

    fn erase(&mut self, id: &SegmentId) -> Option<Arc<RegionResource>> {
        self.regions.remove(id)
    }

    fn snapshot_region(&self, id: &SegmentId) -> Option<RegionAllocState> {
        match self.regions.get(id)?.target() {
            AllocationTarget::Own(a) => Some(RegionAllocState::Own(a.lock().snapshot())),
            AllocationTarget::CxlBinding { .. } => None,
        }
    }
}

/// CXL: one allocator over the whole device window, shared by logical bindings (one per mounted CXL segment).
/// Objects on CXL get a single replica; the window outlives every binding.
#[derive(Debug)]
pub struct CxlDriver {
    window: Arc<Mutex<OffsetAllocator>>,
    bindings: HashMap<SegmentId, Arc<RegionResource>>,
    /// Window allocations restored from a snapshot and not yet claimed by a binding (restore only).
    unclaimed: HashMap<u64, Allocation>,
}

impl CxlDriver {
    /// A driver over a device window of `window_size` bytes.
    pub fn new(window_size: u64) -> Result<Self, PoolError> {
        let window = OffsetAllocator::new(window_size).map_err(|e| PoolError::InvalidSpec(e.to_string()))?;
        Ok(Self { window: Arc::new(Mutex::new(window)), bindings: HashMap::new(), unclaimed: HashMap::new() })
    }

    /// A driver whose window is restored from a snapshot; bindings then claim their allocations.
    pub fn restored(snap: &AllocatorSnapshot) -> Result<Self, PoolError> {
        let (window, handles) =
            OffsetAllocator::restore(snap).map_err(|e| PoolError::CorruptSnapshot(format!("cxl window: {e}")))?;
        Ok(Self {
            window: Arc::new(Mutex::new(window)),
            bindings: HashMap::new(),
            unclaimed: handles.into_iter().map(|a| (a.offset(), a)).collect(),
        })
    }

    /// The shared window's allocator state.
    pub fn window_snapshot(&self) -> AllocatorSnapshot {
        self.window.lock().snapshot()
    }

    /// Whether every restored window allocation was claimed by some binding.
    pub(crate) fn all_claimed(&self) -> bool {
        self.unclaimed.is_empty()
    }

    /// Bytes of the shared window.
    pub fn window_capacity(&self) -> u64 {
        self.window.lock().capacity()
    }
}

impl RegionDriver for CxlDriver {
    fn kind(&self) -> SegmentKind {
        SegmentKind::Cxl
    }

    fn validate(&self, spec: &SegmentSpec) -> Result<(), PoolError> {
        validate_common(spec)
    }

    fn prepare_open(&self, spec: &SegmentSpec) -> Result<PreparedRegion, PoolError> {
        self.validate(spec)?;
        let target = AllocationTarget::CxlBinding { window: self.window.clone(), live: Mutex::new(HashMap::new()) };
        Ok(PreparedRegion { resource: new_resource(spec, target), adopted: Adopted::new(Vec::new()) })
    }

    fn prepare_adopt(&mut self, spec: &SegmentSpec, state: &RegionAllocState) -> Result<PreparedRegion, PoolError> {
        self.validate(spec)?;
        let RegionAllocState::CxlBinding(offsets) = state else {
            return Err(PoolError::CorruptSnapshot(format!("cxl segment {} has an own-allocator state", spec.id)));
        };
        let mut live = HashMap::with_capacity(offsets.len());
        for off in offsets {
            // Claiming only in a driver that is itself being restored off to the side: a failure discards it.
            let a = self.unclaimed.remove(off).ok_or_else(|| {
                PoolError::CorruptSnapshot(format!("cxl segment {} claims unknown window offset {off}", spec.id))
            })?;
            live.insert(*off, a);
        }
        let adopted = Adopted::new(live.values().copied().collect());
        let target = AllocationTarget::CxlBinding { window: self.window.clone(), live: Mutex::new(live) };
        Ok(PreparedRegion { resource: new_resource(spec, target), adopted })
    }

    fn commit(&mut self, prepared: &PreparedRegion) {
        self.bindings.insert(prepared.resource.segment_id(), prepared.resource.clone());
    }

    fn resource(&self, id: &SegmentId) -> Option<&Arc<RegionResource>> {
        self.bindings.get(id)
    }

    fn erase(&mut self, id: &SegmentId) -> Option<Arc<RegionResource>> {
        let r = self.bindings.remove(id)?;
        r.release_all_bindings();
        Some(r)
    }

    fn snapshot_region(&self, id: &SegmentId) -> Option<RegionAllocState> {
        match self.bindings.get(id)?.target() {
            AllocationTarget::CxlBinding { live, .. } => {
                let mut offsets: Vec<u64> = live.lock().keys().copied().collect();
                offsets.sort_unstable();
                Some(RegionAllocState::CxlBinding(offsets))
            }
            AllocationTarget::Own(_) => None,
        }
    }
}

/// The drivers of one pool, by medium. CXL is present only when the master is configured with a device window.
#[derive(Debug)]
pub struct RegionDriverRegistry {
    pub(crate) memory: OwnAllocatorDriver,
    pub(crate) nof: OwnAllocatorDriver,
    pub(crate) disk: OwnAllocatorDriver,
    pub(crate) cxl: Option<CxlDriver>,
}

impl RegionDriverRegistry {
    /// Memory and NoF drivers, plus CXL over `cxl_window` bytes when given.
    pub fn new(cxl_window: Option<u64>) -> Result<Self, PoolError> {
        Ok(Self {
            memory: OwnAllocatorDriver::memory(),
            nof: OwnAllocatorDriver::nof(),
            disk: OwnAllocatorDriver::disk(),
            cxl: cxl_window.map(CxlDriver::new).transpose()?,
        })
    }

    /// The driver for a medium (`UNAVAILABLE_IN_CURRENT_MODE` for CXL when not configured).
    pub fn driver(&self, kind: SegmentKind) -> Result<&dyn RegionDriver, PoolError> {
        match kind {
            SegmentKind::Memory => Ok(&self.memory),
            SegmentKind::Nof => Ok(&self.nof),
            SegmentKind::Disk => Ok(&self.disk),
            SegmentKind::Cxl => self.cxl.as_ref().map(|d| d as &dyn RegionDriver).ok_or(PoolError::CxlDisabled),
        }
    }

    /// The driver of a kind whose regions have allocators of their own (not CXL's bindings).
    pub(crate) fn own(&self, kind: SegmentKind) -> Option<&OwnAllocatorDriver> {
        match kind {
            SegmentKind::Memory => Some(&self.memory),
            SegmentKind::Nof => Some(&self.nof),
            SegmentKind::Disk => Some(&self.disk),
            SegmentKind::Cxl => None,
        }
    }

    /// The driver for a medium, mutably.
    pub fn driver_mut(&mut self, kind: SegmentKind) -> Result<&mut dyn RegionDriver, PoolError> {
        match kind {
            SegmentKind::Memory => Ok(&mut self.memory),
            SegmentKind::Nof => Ok(&mut self.nof),
            SegmentKind::Disk => Ok(&mut self.disk),
            SegmentKind::Cxl => self.cxl.as_mut().map(|d| d as &mut dyn RegionDriver).ok_or(PoolError::CxlDisabled),
        }
    }
}
