//! `PlacementIndex`: the allocatable (status OK) segments, by segment kind and name, with stable
//! non-owning references to their resources. The placement executor reads it under the pool's shared lock.

use super::resource::RegionResource;
use crescent_proto::{SegmentId, SegmentKind};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};

/// One allocatable segment under a name.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub id: SegmentId,
    pub resource: Weak<RegionResource>,
    pub host: Arc<str>,
}

#[derive(Debug, Default)]
struct NameSlot {
    pos: usize,
    targets: Vec<Target>,
}

#[derive(Debug, Default)]
pub(crate) struct KindIndex {
    /// Allocatable names in insertion order (removal swaps with the last).
    names: Vec<Arc<str>>,
    by_name: HashMap<Arc<str>, NameSlot>,
    /// host → name → number of allocatable segments with that name on that host.
    hosts: BTreeMap<Arc<str>, BTreeMap<Arc<str>, usize>>,
}

impl KindIndex {
    pub(crate) fn names(&self) -> &[Arc<str>] {
        &self.names
    }

    pub(crate) fn targets(&self, name: &str) -> &[Target] {
        self.by_name.get(name).map(|s| s.targets.as_slice()).unwrap_or(&[])
    }

    pub(crate) fn hosts(&self) -> &BTreeMap<Arc<str>, BTreeMap<Arc<str>, usize>> {
        &self.hosts
    }

    fn add(&mut self, name: Arc<str>, target: Target) {
        if !target.host.is_empty() {
            *self.hosts.entry(target.host.clone()).or_default().entry(name.clone()).or_default() += 1;
        }
        let len = self.names.len();
        let slot = self.by_name.entry(name.clone()).or_insert_with(|| NameSlot { pos: len, targets: Vec::new() });
        if slot.targets.is_empty() {
            slot.pos = len;
            self.names.push(name);
        }
        slot.targets.push(target);
    }

    fn remove(&mut self, name: &str, id: &SegmentId) -> bool {
        let Some(slot) = self.by_name.get_mut(name) else { return false };
        let Some(i) = slot.targets.iter().position(|t| t.id == *id) else { return false };
        let t = slot.targets.swap_remove(i);
        if !t.host.is_empty()
            && let Some(names) = self.hosts.get_mut(&t.host)
        {
            if let Some(n) = names.get_mut(name) {
                *n -= 1;
                if *n == 0 {
                    names.remove(name);
                }
            }
            if names.is_empty() {
                self.hosts.remove(&t.host);
            }
        }
        if slot.targets.is_empty() {
            let pos = slot.pos;
            self.by_name.remove(name);
            self.names.swap_remove(pos);
            if let Some(moved) = self.names.get(pos)
                && let Some(s) = self.by_name.get_mut(moved)
            {
                s.pos = pos;
            }
        }
        true
    }
}

/// The allocatable segments of every segment kind.
#[derive(Debug, Default)]
pub struct PlacementIndex {
    memory: KindIndex,
    cxl: KindIndex,
    nof: KindIndex,
    disk: KindIndex,
}

impl PlacementIndex {
    pub(crate) fn kind(&self, g: SegmentKind) -> &KindIndex {
        match g {
            SegmentKind::Memory => &self.memory,
            SegmentKind::Cxl => &self.cxl,
            SegmentKind::Nof => &self.nof,
            SegmentKind::Disk => &self.disk,
        }
    }

    fn kind_mut(&mut self, g: SegmentKind) -> &mut KindIndex {
        match g {
            SegmentKind::Memory => &mut self.memory,
            SegmentKind::Cxl => &mut self.cxl,
            SegmentKind::Nof => &mut self.nof,
            SegmentKind::Disk => &mut self.disk,
        }
    }

    /// Makes a segment allocatable.
    pub(crate) fn add(&mut self, resource: &Arc<RegionResource>, host: &str) {
        let target = Target { id: resource.segment_id(), resource: Arc::downgrade(resource), host: Arc::from(host) };
        self.kind_mut(resource.kind()).add(resource.name().clone(), target);
    }

    /// Makes a segment unallocatable; false if it was not in the index.
    pub(crate) fn remove(&mut self, kind: SegmentKind, name: &str, id: &SegmentId) -> bool {
        self.kind_mut(kind).remove(name, id)
    }

    /// Whether a segment is allocatable.
    pub(crate) fn contains(&self, kind: SegmentKind, name: &str, id: &SegmentId) -> bool {
        self.kind(kind).targets(name).iter().any(|t| t.id == *id)
    }
}
