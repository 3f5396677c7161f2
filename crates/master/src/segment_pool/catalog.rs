//! `SegmentCatalog`: what is mounted, by whom, under which name, in which status.

use crate::clock::Timestamp;
use crescent_proto::{ClientId, SegmentId, SegmentSpec, SegmentStatus};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// One catalog record.
#[derive(Debug, Clone)]
pub(crate) struct MountedSegment {
    pub spec: Arc<SegmentSpec>,
    pub client: ClientId,
    pub status: SegmentStatus,
    /// When it is unmounted: a graceful unmount's deadline, or a disconnection's grace deadline.
    pub graceful_deadline: Option<Timestamp>,
    /// The status a drain holds it in (`Draining`, `Drained`): what it returns to from a disconnection or a
    /// remount instead of `Ok`, so a drained node that blinks never takes placements in between.
    pub held: Option<SegmentStatus>,
}

/// The mounted segments and their secondary indexes. Every index is updated by the same methods that change the
/// primary map, so they never disagree.
#[derive(Debug, Default)]
pub struct SegmentCatalog {
    by_id: HashMap<SegmentId, MountedSegment>,
    by_name: HashMap<String, BTreeSet<SegmentId>>,
    by_client: HashMap<ClientId, BTreeSet<SegmentId>>,
    by_status: HashMap<SegmentStatus, BTreeSet<SegmentId>>,
    /// Graceful-unmount deadlines, earliest first.
    deadlines: BTreeSet<(Timestamp, SegmentId)>,
}

fn index_remove<K: std::hash::Hash + Eq>(idx: &mut HashMap<K, BTreeSet<SegmentId>>, k: &K, id: &SegmentId) {
    if let Some(set) = idx.get_mut(k) {
        set.remove(id);
        if set.is_empty() {
            idx.remove(k);
        }
    }
}

impl SegmentCatalog {
    pub(crate) fn get(&self, id: &SegmentId) -> Option<&MountedSegment> {
        self.by_id.get(id)
    }

    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&SegmentId, &MountedSegment)> {
        self.by_id.iter()
    }

    pub(crate) fn insert(&mut self, region: MountedSegment) {
        let id = region.spec.id;
        self.by_name.entry(region.spec.name.clone()).or_default().insert(id);
        self.by_client.entry(region.client).or_default().insert(id);
        self.by_status.entry(region.status).or_default().insert(id);
        if let Some(d) = region.graceful_deadline {
            self.deadlines.insert((d, id));
        }
        self.by_id.insert(id, region);
    }

    pub(crate) fn remove(&mut self, id: &SegmentId) -> Option<MountedSegment> {
        let r = self.by_id.remove(id)?;
        index_remove(&mut self.by_name, &r.spec.name, id);
        index_remove(&mut self.by_client, &r.client, id);
        index_remove(&mut self.by_status, &r.status, id);
        if let Some(d) = r.graceful_deadline {
            self.deadlines.remove(&(d, *id));
        }
        Some(r)
    }

    /// Sets the status a drain holds the segment in (`None`: none).
    pub(crate) fn set_held(&mut self, id: &SegmentId, held: Option<SegmentStatus>) {
        if let Some(r) = self.by_id.get_mut(id) {
            r.held = held;
        }
    }

    /// Changes a status (and the graceful deadline, which only `GracefullyUnmounting` carries).
    pub(crate) fn set_status(&mut self, id: &SegmentId, status: SegmentStatus, deadline: Option<Timestamp>) {
        let Some(r) = self.by_id.get_mut(id) else { return };
        let old = std::mem::replace(&mut r.status, status);
        if let Some(d) = r.graceful_deadline.take() {
            self.deadlines.remove(&(d, *id));
        }
        r.graceful_deadline = deadline;
        if let Some(d) = deadline {
            self.deadlines.insert((d, *id));
        }
        index_remove(&mut self.by_status, &old, id);
        self.by_status.entry(status).or_default().insert(*id);
    }

    pub(crate) fn ids_for_client(&self, client: &ClientId) -> Vec<SegmentId> {
        self.by_client.get(client).map(|s| s.iter().copied().collect()).unwrap_or_default()
    }

    pub(crate) fn ids_for_name(&self, name: &str) -> Vec<SegmentId> {
        self.by_name.get(name).map(|s| s.iter().copied().collect()).unwrap_or_default()
    }

    pub(crate) fn ids_with_status(&self, status: SegmentStatus) -> Vec<SegmentId> {
        self.by_status.get(&status).map(|s| s.iter().copied().collect()).unwrap_or_default()
    }

    pub(crate) fn clients(&self) -> Vec<ClientId> {
        self.by_client.keys().copied().collect()
    }

    /// Segments whose graceful deadline is at or before `now`, earliest first.
    pub(crate) fn due_deadlines(&self, now: Timestamp) -> Vec<SegmentId> {
        self.deadlines.iter().take_while(|(d, _)| *d <= now).map(|(_, id)| *id).collect()
    }

    pub(crate) fn next_deadline(&self) -> Option<Timestamp> {
        self.deadlines.first().map(|(d, _)| *d)
    }
}
