//! The KV event stream: what routers follow to learn which objects are cached where.
//!
//! The master records a `stored` event when an object becomes readable or its replicas change (a write's End, a
//! copy, a move, an offload to disk) and a `removed` event when it stops being readable (a removal, an eviction,
//! its node lost, its memory copy offloaded), with the cause. [`EventHub`] owns the events between the metadata
//! change and the socket: a bounded queue that never blocks the master (when full the oldest event is dropped
//! and counted, and the message sequence skips a number so consumers see the loss), and the counters
//! `/kv_events/status` and `/metrics` show, per subscriber too. The publisher ([`publisher`]) drains it onto
//! ZMQ PUB sockets in the original's wire format ([`wire`]), a subscriber that falls behind losing messages of its
//! own (counted) without holding up the others or growing the master's memory.
//!
//! Every event carries an id: the oplog sequence of the change it reports on a master with an oplog (a change
//! is published only once it is durable, so an id never names a change a failover could lose, and the next
//! leader's ids continue from the log), a counter of this master's run without one. Events of one logged change
//! (a group's removal, a node's loss) share its id.

pub(crate) mod object;
pub mod publisher;
pub mod wire;

use compact_str::CompactString;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Most events one ZMQ message carries (the original's batch size).
pub const MAX_BATCH_EVENTS: usize = 64;

/// Events queued at most by default before the oldest are dropped (the original's `kv_events_queue_capacity`).
pub const DEFAULT_QUEUE_CAPACITY: usize = 65_536;

/// Bytes a subscriber may have waiting for it by default before its messages are skipped.
pub const DEFAULT_SUBSCRIBER_BUFFER: usize = 8 << 20;

/// Subscribers served at once at most; further connections are closed.
pub const MAX_SUBSCRIBERS: usize = 64;

/// What a master's event stream is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventsConfig {
    /// The ZMQ endpoint the PUB socket binds, `tcp://HOST:PORT` (port 0: a free one).
    pub endpoint: String,
    /// Names this cache in every event (`backend_id`): routers tell pools apart by it.
    pub backend_id: String,
    /// Events queued at most before the oldest are dropped (0: unbounded).
    pub queue_capacity: usize,
    /// Bytes of messages a subscriber may have waiting for it (sent by the master, not yet taken by its
    /// connection): past it, its messages are skipped and counted until it has taken half of them. What bounds
    /// the memory a stalled subscriber costs the master.
    pub subscriber_buffer: usize,
}

impl EventsConfig {
    /// Events on `endpoint` with the other settings at their defaults.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            backend_id: String::new(),
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            subscriber_buffer: DEFAULT_SUBSCRIBER_BUFFER,
        }
    }
}

/// Which way an event goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The object is readable, at the locations listed.
    Stored,
    /// The object (or, with `medium`, its copy there) is gone.
    Removed,
}

/// Why an object (or one medium's copy of it) went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoveCause {
    /// A client removed it (or replaced it).
    Removed,
    /// Eviction took it to make room.
    Evicted,
    /// Its node stopped answering and its replicas were given up.
    Expired,
    /// Its memory copy was dropped after it was copied to a disk tier (a `stored` event names the disk copy).
    Offloaded,
}

impl RemoveCause {
    /// Its name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            RemoveCause::Removed => "removed",
            RemoveCause::Evicted => "evicted",
            RemoveCause::Expired => "expired",
            RemoveCause::Offloaded => "offloaded",
        }
    }
}

/// Where one replica of a stored object is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The segment's name (its node's address for a node's own segment).
    pub segment: CompactString,
    /// `memory` or `disk`.
    pub tier: &'static str,
}

/// The locations of a stored object's replicas (two inline).
pub type Replicas = smallvec::SmallVec<[Location; 2]>;

/// The events of one change (one inline: most changes are one object's).
pub type Events = smallvec::SmallVec<[KvEvent; 1]>;

/// One change, as the stream reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEvent {
    /// Stored or removed.
    pub kind: EventKind,
    /// The oplog sequence of the change (see the module), set when it is published.
    pub id: u64,
    /// The tenant the object belongs to (`default` for the default tenant).
    pub tenant: CompactString,
    /// The object's key (inline up to 24 bytes: no allocation for most keys).
    pub key: CompactString,
    /// The object's group, if it is in one.
    pub group: Option<CompactString>,
    /// The original's medium: `cpu` (memory) or `disk`; for a stored event the fastest tier it is on.
    pub medium: &'static str,
    /// Object bytes.
    pub size: u64,
    /// Stored: every readable replica. Removed: empty.
    pub replicas: Replicas,
    /// Removed: why.
    pub cause: Option<RemoveCause>,
}

#[cfg(test)]
impl KvEvent {
    /// A one-byte object's event in the default tenant, in memory, with no replica listed (tests).
    pub(crate) fn for_test(kind: EventKind, key: &str, cause: Option<RemoveCause>) -> Self {
        KvEvent {
            kind,
            id: 0,
            tenant: "default".into(),
            key: key.into(),
            group: None,
            medium: "cpu",
            size: 1,
            replicas: Replicas::new(),
            cause,
        }
    }
}

/// The counters of a master's event stream (`/kv_events/status`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventStats {
    /// ZMQ messages sent.
    pub published_batches: u64,
    /// Events in them.
    pub published_events: u64,
    /// Events dropped because the queue was full (a slow socket, a burst).
    pub dropped_events: u64,
    /// Events not sent to a subscriber because it had fallen behind, summed over every subscriber so far.
    pub subscriber_dropped_events: u64,
    /// Events whose key is not a block hash (decimal or `0x` hex): sent with the key and no `seq_hashes`.
    pub skipped_unparsed_keys: u64,
    /// Events queued now.
    pub queued: u64,
    /// Subscribers connected now.
    pub subscribers: u64,
    /// The id of the last event queued (0: none yet).
    pub last_event_id: u64,
}

/// One subscriber's figures (`/kv_events/status`, `/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriberStat {
    /// Where it connected from.
    pub peer: SocketAddr,
    /// Events sent to it.
    pub sent_events: u64,
    /// Events not sent to it because it had fallen behind (it sees a gap in the message sequence).
    pub dropped_events: u64,
    /// Bytes waiting for its connection to take them now.
    pub buffered_bytes: u64,
}

/// What the publisher and a subscriber's relay share about that subscriber: its counters, and whether it has
/// fallen behind (its messages are skipped) or gone.
#[derive(Debug)]
pub(crate) struct SubscriberState {
    peer: SocketAddr,
    sent_events: AtomicU64,
    dropped_events: AtomicU64,
    buffered_bytes: AtomicU64,
    behind: AtomicBool,
    ended: AtomicBool,
}

impl SubscriberState {
    pub(crate) fn new(peer: SocketAddr) -> Self {
        Self {
            peer,
            sent_events: AtomicU64::new(0),
            dropped_events: AtomicU64::new(0),
            buffered_bytes: AtomicU64::new(0),
            behind: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        }
    }

    /// Records the bytes waiting for it: at `limit` or more it is behind, and stays so until they are half.
    pub(crate) fn set_buffered(&self, bytes: usize, limit: usize) {
        self.buffered_bytes.store(bytes as u64, Ordering::Relaxed);
        if bytes >= limit {
            self.behind.store(true, Ordering::Relaxed);
        } else if bytes <= limit / 2 {
            self.behind.store(false, Ordering::Relaxed);
        }
    }

    /// Where it connected from.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Whether its messages are skipped now.
    pub(crate) fn is_behind(&self) -> bool {
        self.behind.load(Ordering::Relaxed)
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }

    pub(crate) fn count_sent(&self, events: usize) {
        self.sent_events.fetch_add(events as u64, Ordering::Relaxed);
    }

    fn stat(&self) -> SubscriberStat {
        SubscriberStat {
            peer: self.peer,
            sent_events: self.sent_events.load(Ordering::Relaxed),
            dropped_events: self.dropped_events.load(Ordering::Relaxed),
            buffered_bytes: self.buffered_bytes.load(Ordering::Relaxed),
        }
    }
}

/// The owner of the events between a metadata change and the socket (see the module).
#[derive(Debug)]
pub struct EventHub {
    config: EventsConfig,
    queue: Mutex<VecDeque<KvEvent>>,
    /// Wakes the publisher when the queue gains an event.
    ready: tokio::sync::Notify,
    /// The next id on a master without an oplog.
    next_local_id: AtomicU64,
    /// The sequence of the next ZMQ message; a dropped event skips one, so consumers see a gap.
    next_message: AtomicU64,
    last_event_id: AtomicU64,
    published_batches: AtomicU64,
    published_events: AtomicU64,
    dropped_events: AtomicU64,
    skipped_unparsed_keys: AtomicU64,
    /// Subscribers connected now, in the order they came.
    subscribers: Mutex<Vec<Arc<SubscriberState>>>,
    /// Events skipped for subscribers behind, over every subscriber so far (those gone included).
    subscriber_dropped_events: AtomicU64,
    /// The endpoint the publisher bound (the port chosen when 0 was asked for), once it has.
    bound: std::sync::OnceLock<String>,
}

impl EventHub {
    /// A hub with nothing queued yet.
    pub fn new(config: EventsConfig) -> Self {
        Self {
            config,
            queue: Mutex::new(VecDeque::new()),
            ready: tokio::sync::Notify::new(),
            next_local_id: AtomicU64::new(1),
            next_message: AtomicU64::new(1),
            last_event_id: AtomicU64::new(0),
            published_batches: AtomicU64::new(0),
            published_events: AtomicU64::new(0),
            dropped_events: AtomicU64::new(0),
            skipped_unparsed_keys: AtomicU64::new(0),
            subscribers: Mutex::new(Vec::new()),
            subscriber_dropped_events: AtomicU64::new(0),
            bound: std::sync::OnceLock::new(),
        }
    }

    /// The endpoint subscribers connect to, once the publisher has bound it.
    pub fn bound_endpoint(&self) -> Option<String> {
        self.bound.get().cloned()
    }

    pub(crate) fn set_bound(&self, endpoint: String) {
        let _ = self.bound.set(endpoint);
    }

    /// Its configuration.
    pub fn config(&self) -> &EventsConfig {
        &self.config
    }

    /// Queues `events` of one change, made durable under log sequence `id` (never blocks: when the queue is
    /// full the oldest event goes, counted).
    pub fn publish(&self, id: u64, events: impl IntoIterator<Item = KvEvent>) {
        let mut dropped = 0u64;
        let was_empty;
        {
            let mut q = self.queue.lock();
            was_empty = q.is_empty();
            for mut e in events {
                e.id = id;
                if self.config.queue_capacity > 0 && q.len() >= self.config.queue_capacity {
                    q.pop_front();
                    dropped += 1;
                }
                q.push_back(e);
            }
            // Under the queue's lock, so the last id queued never goes backwards.
            self.last_event_id.fetch_max(id, Ordering::Relaxed);
        }
        if dropped > 0 {
            self.dropped_events.fetch_add(dropped, Ordering::Relaxed);
            // One message number per dropped event: a consumer counting messages sees that it missed some.
            self.next_message.fetch_add(dropped, Ordering::Relaxed);
        }
        // The publisher drains the whole queue before it waits again: only the first event after it emptied
        // the queue needs to wake it (one wake-up per batch, not per event).
        if was_empty {
            self.ready.notify_one();
        }
    }

    /// Queues `events` of one change on a master without an oplog, under the next id of this run.
    pub fn publish_now(&self, events: impl IntoIterator<Item = KvEvent>) {
        let id = self.next_local_id.fetch_add(1, Ordering::Relaxed);
        self.publish(id, events);
    }

    /// Moves up to [`MAX_BATCH_EVENTS`] queued events, oldest first, into `batch` (emptied first: the
    /// publisher's, reused from message to message) and returns the message sequence they go under.
    pub(crate) fn take_batch(&self, batch: &mut Vec<KvEvent>) -> Option<u64> {
        batch.clear();
        let mut q = self.queue.lock();
        if q.is_empty() {
            return None;
        }
        let n = q.len().min(MAX_BATCH_EVENTS);
        batch.extend(q.drain(..n));
        Some(self.next_message.fetch_add(1, Ordering::Relaxed))
    }

    /// Events queued now.
    pub(crate) fn queued(&self) -> usize {
        self.queue.lock().len()
    }

    /// Waits until an event may be queued (spurious wake-ups are possible).
    pub(crate) async fn ready(&self) {
        self.ready.notified().await;
    }

    pub(crate) fn count_published(&self, events: usize, unparsed: usize) {
        self.published_batches.fetch_add(1, Ordering::Relaxed);
        self.published_events.fetch_add(events as u64, Ordering::Relaxed);
        self.skipped_unparsed_keys.fetch_add(unparsed as u64, Ordering::Relaxed);
    }

    /// Lists `sub` among the connected, unless it has gone already (its relay ended first).
    pub(crate) fn subscriber_joined(&self, sub: &Arc<SubscriberState>) {
        let mut subs = self.subscribers.lock();
        if !sub.is_ended() {
            subs.push(Arc::clone(sub));
        }
    }

    /// Marks `sub` gone and takes it off the list; under the list's lock, so a join never lists it after.
    pub(crate) fn subscriber_left(&self, sub: &Arc<SubscriberState>) {
        let mut subs = self.subscribers.lock();
        sub.ended.store(true, Ordering::Relaxed);
        subs.retain(|s| !Arc::ptr_eq(s, sub));
    }

    /// Counts `events` not sent to `sub` because it is behind.
    pub(crate) fn count_subscriber_dropped(&self, sub: &SubscriberState, events: usize) {
        sub.dropped_events.fetch_add(events as u64, Ordering::Relaxed);
        self.subscriber_dropped_events.fetch_add(events as u64, Ordering::Relaxed);
    }

    /// The connected subscribers' figures, in the order they came.
    pub fn subscriber_stats(&self) -> Vec<SubscriberStat> {
        self.subscribers.lock().iter().map(|s| s.stat()).collect()
    }

    /// The counters now.
    pub fn stats(&self) -> EventStats {
        EventStats {
            published_batches: self.published_batches.load(Ordering::Relaxed),
            published_events: self.published_events.load(Ordering::Relaxed),
            dropped_events: self.dropped_events.load(Ordering::Relaxed),
            subscriber_dropped_events: self.subscriber_dropped_events.load(Ordering::Relaxed),
            skipped_unparsed_keys: self.skipped_unparsed_keys.load(Ordering::Relaxed),
            queued: self.queue.lock().len() as u64,
            subscribers: self.subscribers.lock().len() as u64,
            last_event_id: self.last_event_id.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(key: &str) -> KvEvent {
        KvEvent::for_test(EventKind::Stored, key, None)
    }

    #[test]
    fn a_subscriber_is_behind_from_a_full_buffer_until_half_has_drained_and_once_gone_is_never_listed() {
        let hub = EventHub::new(EventsConfig::new("tcp://127.0.0.1:0"));
        let sub = Arc::new(SubscriberState::new("127.0.0.1:9".parse().unwrap()));
        hub.subscriber_joined(&sub);
        for (held, behind) in [(0, false), (99, false), (100, true), (75, true), (51, true), (50, false), (99, false)] {
            sub.set_buffered(held, 100);
            assert_eq!(sub.is_behind(), behind, "holding {held} of 100");
        }
        hub.count_subscriber_dropped(&sub, 3);
        sub.count_sent(2);
        let listed = hub.subscriber_stats();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].sent_events, listed[0].dropped_events, listed[0].buffered_bytes), (2, 3, 99));
        hub.subscriber_left(&sub);
        assert!(hub.subscriber_stats().is_empty() && sub.is_ended());
        assert_eq!((hub.stats().subscribers, hub.stats().subscriber_dropped_events), (0, 3), "the total stays");
        // A relay that ended before its subscriber's handshake was done: the late join lists nothing.
        let early = Arc::new(SubscriberState::new("127.0.0.1:10".parse().unwrap()));
        hub.subscriber_left(&early);
        hub.subscriber_joined(&early);
        assert!(hub.subscriber_stats().is_empty());
    }

    #[test]
    fn a_full_queue_drops_the_oldest_and_the_message_sequence_skips_one_per_drop() {
        let hub = EventHub::new(EventsConfig { queue_capacity: 2, ..EventsConfig::new("tcp://127.0.0.1:0") });
        hub.publish(7, [stored("a"), stored("b")]);
        hub.publish_now([stored("c")]);
        let s = hub.stats();
        assert_eq!((s.queued, s.dropped_events, s.last_event_id), (2, 1, 7));
        let mut batch = Vec::new();
        let seq = hub.take_batch(&mut batch).unwrap();
        assert_eq!(seq, 2, "message 1 was given up with the dropped event");
        let keys: Vec<(&str, u64)> = batch.iter().map(|e| (e.key.as_str(), e.id)).collect();
        assert_eq!(keys, [("b", 7), ("c", 1)]);
        assert!(hub.take_batch(&mut batch).is_none());
        let unbounded = EventHub::new(EventsConfig { queue_capacity: 0, ..EventsConfig::new("tcp://127.0.0.1:0") });
        unbounded.publish(1, (0..200).map(|i| stored(&i.to_string())));
        assert_eq!(unbounded.take_batch(&mut batch), Some(1));
        assert_eq!(batch.len(), MAX_BATCH_EVENTS);
        assert_eq!(unbounded.stats().dropped_events, 0);
    }
}
