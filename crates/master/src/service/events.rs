//! What the service reports to the KV event stream ([`crate::events`]): the events of an object's change, built
//! under its lock only when a stream is attached, and published once the change is durable (with an oplog: from
//! the entry's durable callback, in log order, under the entry's sequence) or at once (without one).

use super::MasterService;
use crate::events::object::{removed_event, state_event};
use crate::events::{EventHub, Events, KvEvent, RemoveCause};
use crate::ha::Slot;
use crate::metadata::{ObjectEntry, ObjectState, TenantState};
use crescent_ha::oplog::DurableCallback;
use crescent_proto::ErrorCode;
use std::sync::Arc;

/// The events of one change, on their way to the stream (empty when no stream is attached).
#[must_use = "send the report with the change's commit (`Report::commit`) or at once (`Report::send`)"]
pub(super) struct Report<'a> {
    /// The hub, borrowed (an `Arc` is taken only for a durable callback: a clone per change would bounce the
    /// count's cache line between the request workers).
    to: Option<(&'a Arc<EventHub>, Events)>,
}

impl Report<'_> {
    /// No events (no stream, or nothing to say).
    pub(super) fn none() -> Self {
        Self { to: None }
    }

    /// Adds an event (kept only when a stream is attached).
    pub(super) fn push(&mut self, e: Option<KvEvent>) {
        if let (Some((_, events)), Some(e)) = (self.to.as_mut(), e) {
            events.push(e);
        }
    }

    /// `callback` followed by the publication of these events under the entry's sequence: what a logged change
    /// hands its commit.
    pub(super) fn on_durable(self, callback: Option<DurableCallback>) -> Option<DurableCallback> {
        match self.to {
            Some((hub, events)) if !events.is_empty() => {
                let hub = Arc::clone(hub);
                Some(Box::new(move |seq| {
                    if let Some(cb) = callback {
                        cb(seq);
                    }
                    hub.publish(seq, events);
                }))
            }
            _ => callback,
        }
    }

    /// Commits `entry` with `callback` through `slot` when there is a log (the events published once it is
    /// durable), else publishes the events now; the entry's sequence (0 without a log).
    pub(super) fn commit(
        self,
        slot: Option<Slot<'_>>,
        entry: impl FnOnce() -> crate::ha::MasterEntry,
        callback: Option<DurableCallback>,
    ) -> Result<u64, ErrorCode> {
        match slot {
            Some(slot) => slot.commit(entry(), self.on_durable(callback)),
            None => {
                self.send();
                Ok(0)
            }
        }
    }

    /// Publishes the events now (a change made without a log).
    pub(super) fn send(self) {
        if let Some((hub, events)) = self.to
            && !events.is_empty()
        {
            hub.publish_now(events);
        }
    }
}

impl MasterService {
    /// Attaches the KV event stream: from now on every change to an object is reported to `hub`. Once only.
    pub fn attach_events(&self, hub: Arc<EventHub>) -> Result<(), ErrorCode> {
        self.events.set(hub).map_err(|_| ErrorCode::InvalidParams)
    }

    /// The attached event stream, if any.
    pub fn events(&self) -> Option<&Arc<EventHub>> {
        self.events.get()
    }

    /// One page of what `tenant` stores, for a KV event consumer that resyncs (it missed messages, or starts
    /// late): the stored event of each readable object whose key sorts after `after` (byte order, at most
    /// `limit`), where the next page starts, and `as_of`, the id of the last event queued when the page was
    /// begun — every change up to it is in the page; applying the stream's events with larger ids (stored:
    /// set, removed: drop) over the pages brings the consumer up to date. It visits the whole index (callers
    /// run it off the request path); `limit` 0 is `INVALID_PARAMS`.
    pub fn events_snapshot_page(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<EventsSnapshotPage, ErrorCode> {
        // Read first: a change reported after this is applied over the page again, harmlessly.
        let as_of = self.events().map_or(0, |h| h.stats().last_event_id);
        let page = self.list_keys_page(tenant, "", after, limit, super::listing::LIST_REPLY_BYTES)?;
        let Some(t) = self.read_tenant(tenant)? else {
            return Ok(EventsSnapshotPage { as_of, objects: Vec::new(), next: None });
        };
        let objects = page
            .keys
            .iter()
            .filter_map(|k| {
                let entry = t.objects().get(k)?;
                let st = entry.lock();
                let e = state_event(&t, &entry, &st, RemoveCause::Removed);
                (st.lifecycle() == crate::metadata::Lifecycle::Active && e.kind == crate::events::EventKind::Stored)
                    .then_some(e)
            })
            .collect();
        Ok(EventsSnapshotPage { as_of, objects, next: page.next })
    }

    /// An empty report for a change about to be made (one atomic load when no stream is attached).
    #[inline]
    pub(super) fn report(&self) -> Report<'_> {
        Report { to: self.events.get().map(|hub| (hub, Events::new())) }
    }

    /// A report of `entry` as `st` holds it now: stored (its readable replicas) or, with none left, removed
    /// for `cause`.
    pub(super) fn report_state(
        &self,
        tenant: &TenantState,
        entry: &ObjectEntry,
        st: &ObjectState,
        cause: RemoveCause,
    ) -> Report<'_> {
        self.report_one(|| state_event(tenant, entry, st, cause))
    }

    /// A report of `entry`'s removal for `cause` (`st` as it was before).
    pub(super) fn report_removed(
        &self,
        tenant: &TenantState,
        entry: &ObjectEntry,
        st: &ObjectState,
        cause: RemoveCause,
    ) -> Report<'_> {
        self.report_one(|| removed_event(tenant, entry, st, cause))
    }

    /// A report of the one event `event` builds, built only when a stream is attached.
    fn report_one(&self, event: impl FnOnce() -> KvEvent) -> Report<'_> {
        let mut r = self.report();
        if r.to.is_some() {
            r.push(Some(event()));
        }
        r
    }
}

/// A page of [`MasterService::events_snapshot_page`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventsSnapshotPage {
    /// The id of the last event queued when the page was begun: apply the stream's events after it.
    pub as_of: u64,
    /// The stored event of each object on the page, in key order.
    pub objects: Vec<KvEvent>,
    /// The key the next page starts after (`None`: this was the last).
    pub next: Option<String>,
}

/// Events known only after their change was committed (a segment's sweep runs after its UNMOUNT is logged):
/// published under the entry's sequence when both the events are in and the entry is durable, whichever comes
/// last.
#[derive(Clone)]
pub(super) struct LateReport {
    hub: Arc<EventHub>,
    state: Arc<parking_lot::Mutex<Late>>,
}

/// What a [`LateReport`] has of its two halves so far.
#[derive(Default)]
struct Late {
    /// The entry's sequence, once durable.
    seq: Option<u64>,
    /// The events, once the sweep made them (taken when published).
    events: Option<Vec<KvEvent>>,
}

impl LateReport {
    pub(super) fn new(hub: &Arc<EventHub>) -> Self {
        Self { hub: Arc::clone(hub), state: Arc::default() }
    }

    /// The entry is durable under `seq`.
    pub(super) fn durable(&self, seq: u64) {
        self.complete(|l| l.seq = Some(seq));
    }

    /// The events are in.
    pub(super) fn fill(&self, events: Vec<KvEvent>) {
        self.complete(|l| l.events = Some(events));
    }

    /// Records one half; publishes (outside the lock) once both are in.
    fn complete(&self, set: impl FnOnce(&mut Late)) {
        let ready = {
            let mut l = self.state.lock();
            set(&mut l);
            match l.seq {
                Some(seq) => l.events.take().map(|events| (seq, events)),
                None => None,
            }
        };
        if let Some((seq, events)) = ready {
            self.hub.publish(seq, events);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventKind, EventsConfig};

    fn removed(key: &str) -> KvEvent {
        KvEvent::for_test(EventKind::Removed, key, Some(RemoveCause::Expired))
    }

    #[test]
    fn a_late_report_publishes_once_both_halves_are_in_whichever_comes_first() {
        let hub = Arc::new(EventHub::new(EventsConfig::new("tcp://127.0.0.1:0")));
        let (a, b) = (LateReport::new(&hub), LateReport::new(&hub));
        a.durable(7);
        assert_eq!(hub.stats().queued, 0, "durable, but the sweep's events are not in yet");
        a.fill(vec![removed("x"), removed("y")]);
        b.fill(vec![removed("z")]);
        assert_eq!(hub.stats().queued, 2, "b's entry is not durable yet");
        b.durable(9);
        let s = hub.stats();
        assert_eq!((s.queued, s.last_event_id), (3, 9));
        a.durable(7);
        assert_eq!(hub.stats().queued, 3, "published once");
    }
}
