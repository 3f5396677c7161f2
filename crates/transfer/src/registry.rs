//! The segments this process hosts, shared by its transfer server and its client's same-process fast path.

use crate::memory::SegmentMemory;
use crescent_proto::SegmentId;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;

/// The segments hosted by this process; cheap to clone (all clones share one table).
///
/// Transfers hold an `Arc` to the segment they touch, so unregistering never unmaps memory under an
/// in-flight transfer: the mapping goes away when the last transfer finishes.
#[derive(Debug, Clone, Default)]
pub struct SegmentRegistry {
    inner: Arc<RwLock<HashMap<SegmentId, Arc<SegmentMemory>>>>,
}

impl SegmentRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Hosts `memory` as `id`, returning the segment it replaces, if any.
    pub fn register(&self, id: SegmentId, memory: Arc<SegmentMemory>) -> Option<Arc<SegmentMemory>> {
        self.inner.write().insert(id, memory)
    }

    /// Stops hosting `id`, returning its memory, if it was hosted.
    pub fn unregister(&self, id: &SegmentId) -> Option<Arc<SegmentMemory>> {
        self.inner.write().remove(id)
    }

    /// The memory of segment `id`, if hosted here.
    pub fn get(&self, id: &SegmentId) -> Option<Arc<SegmentMemory>> {
        self.inner.read().get(id).cloned()
    }

    /// Whether segment `id` is hosted here.
    pub fn contains(&self, id: &SegmentId) -> bool {
        self.inner.read().contains_key(id)
    }

    /// Number of hosted segments.
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
}
