//! The segments this process hosts, shared by its transfer server and its client's same-process fast path:
//! memory segments and disk segments, in one table (a segment id names one or the other).

use crate::disk::DiskSegment;
use crate::memory::SegmentMemory;
use crescent_proto::SegmentId;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;

/// The segments hosted by this process; cheap to clone (all clones share one table).
///
/// Transfers hold an `Arc` to the segment they touch, so unregistering never unmaps memory under an
/// in-flight transfer: the mapping goes away when the last transfer finishes.
///
/// A disk segment is looked up only with [`SegmentRegistry::disk`]: [`SegmentRegistry::get`] answers `None` for
/// it, so nothing that takes a hosted segment for memory (the client's same-process memcpy) ever reaches one.
#[derive(Debug, Clone, Default)]
pub struct SegmentRegistry {
    inner: Arc<RwLock<HashMap<SegmentId, Hosted>>>,
}

/// One hosted segment.
#[derive(Debug, Clone)]
enum Hosted {
    Memory(Arc<SegmentMemory>),
    Disk(Arc<DiskSegment>),
}

impl Hosted {
    fn memory(self) -> Option<Arc<SegmentMemory>> {
        match self {
            Hosted::Memory(m) => Some(m),
            Hosted::Disk(_) => None,
        }
    }

    fn disk(self) -> Option<Arc<DiskSegment>> {
        match self {
            Hosted::Disk(d) => Some(d),
            Hosted::Memory(_) => None,
        }
    }
}

impl SegmentRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Hosts `memory` as `id`, returning the memory segment it replaces, if any (a disk segment of that id is
    /// replaced too).
    pub fn register(&self, id: SegmentId, memory: Arc<SegmentMemory>) -> Option<Arc<SegmentMemory>> {
        self.inner.write().insert(id, Hosted::Memory(memory)).and_then(Hosted::memory)
    }

    /// Stops hosting memory segment `id`, returning its memory, if it was hosted (a disk segment of that id
    /// stays).
    pub fn unregister(&self, id: &SegmentId) -> Option<Arc<SegmentMemory>> {
        let mut inner = self.inner.write();
        let memory = inner.get(id).cloned().and_then(Hosted::memory)?;
        inner.remove(id);
        Some(memory)
    }

    /// The memory of segment `id`, if hosted here as memory (`None` for a disk segment).
    pub fn get(&self, id: &SegmentId) -> Option<Arc<SegmentMemory>> {
        self.inner.read().get(id).cloned().and_then(Hosted::memory)
    }

    /// Hosts `disk` as `id`, returning the disk segment it replaces, if any (a memory segment of that id is
    /// replaced too).
    pub fn register_disk(&self, id: SegmentId, disk: Arc<DiskSegment>) -> Option<Arc<DiskSegment>> {
        self.inner.write().insert(id, Hosted::Disk(disk)).and_then(Hosted::disk)
    }

    /// Stops hosting disk segment `id`, returning it, if it was hosted (a memory segment of that id stays).
    /// In-flight transfers keep it (and its I/O threads) alive until they finish.
    pub fn unregister_disk(&self, id: &SegmentId) -> Option<Arc<DiskSegment>> {
        let mut inner = self.inner.write();
        let disk = inner.get(id).cloned().and_then(Hosted::disk)?;
        inner.remove(id);
        Some(disk)
    }

    /// Disk segment `id`, if hosted here as a disk segment (`None` for a memory segment).
    pub fn disk(&self, id: &SegmentId) -> Option<Arc<DiskSegment>> {
        self.inner.read().get(id).cloned().and_then(Hosted::disk)
    }

    /// Every memory segment hosted here.
    pub fn memories(&self) -> Vec<(SegmentId, Arc<SegmentMemory>)> {
        self.inner.read().iter().filter_map(|(id, h)| Some((*id, h.clone().memory()?))).collect()
    }

    /// Whether segment `id` (memory or disk) is hosted here.
    pub fn contains(&self, id: &SegmentId) -> bool {
        self.inner.read().contains_key(id)
    }

    /// Number of hosted segments (memory and disk).
    pub fn len(&self) -> usize {
        self.inner.read().len()
    }

    /// Whether no segment is hosted.
    pub fn is_empty(&self) -> bool {
        self.inner.read().is_empty()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn clones_share_one_table() {
        let a = SegmentRegistry::new();
        let b = a.clone();
        let id = SegmentId::random();
        let mem = Arc::new(SegmentMemory::anonymous(64).unwrap());
        assert!(a.register(id, mem.clone()).is_none());
        assert!(b.contains(&id));
        assert_eq!(b.len(), 1);
        assert!(Arc::ptr_eq(&b.get(&id).unwrap(), &mem));
        assert!(b.unregister(&id).is_some());
        assert!(a.get(&id).is_none());
        assert!(a.is_empty());
        assert!(a.unregister(&id).is_none());
    }

    #[test]
    fn a_disk_segment_is_never_taken_for_memory() {
        use crate::disk::{DiskConfig, MemoryDevice};
        let a = SegmentRegistry::new();
        let (disk_id, mem_id) = (SegmentId::random(), SegmentId::random());
        let device = Arc::new(MemoryDevice::new(1 << 20).unwrap());
        let disk = Arc::new(DiskSegment::new(device, DiskConfig::default()).unwrap());
        assert!(a.register_disk(disk_id, disk.clone()).is_none());
        a.register(mem_id, Arc::new(SegmentMemory::anonymous(64).unwrap()));
        assert!(a.get(&disk_id).is_none(), "a disk segment looked up as memory");
        assert!(a.disk(&mem_id).is_none(), "a memory segment looked up as a disk");
        assert!(Arc::ptr_eq(&a.disk(&disk_id).unwrap(), &disk));
        assert!(a.contains(&disk_id) && a.len() == 2);
        // Each kind is removed only by its own call.
        assert!(a.unregister(&disk_id).is_none() && a.unregister_disk(&mem_id).is_none());
        assert_eq!(a.len(), 2);
        assert!(Arc::ptr_eq(&a.unregister_disk(&disk_id).unwrap(), &disk));
        assert!(a.disk(&disk_id).is_none() && a.len() == 1);
    }
}
