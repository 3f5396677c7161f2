//! Following the master view from the reading side: clients and storage nodes resolve the leader of a cluster
//! through it and follow its changes (issue 15 §4; reference §7 "Client discovery").
//!
//! - [`NewestView`]: the rule every follower applies — a view whose version is older than one already seen is
//!   ignored (a stale read or a late watch event never moves a follower back to a deposed leader), and an
//!   observation older than the state it would replace is stale.
//! - [`ViewFollower`] (feature `etcd`): one background task per follower that arms a watch on the view key
//!   *before* reading it (so no change between the read and the watch is missed), re-arms it when the stream
//!   breaks or is cancelled, falls back to polling while a watch cannot be armed, re-reads every `resync` even
//!   when the watch is quiet (a watch on a silently dead connection says nothing), and re-reads at once when
//!   asked ([`ViewFollower::refresh`]: a master refused a request as not the leader, or its connection broke).
//!   etcd being down is a state, not an error: the follower retries with back-off and recovers by itself.
//! - The not-leader refusal: [`not_leader_message`] / [`is_not_leader`], the words a standby or deposed master
//!   puts in its `UNAVAILABLE_IN_CURRENT_STATUS` refusal so a client knows to re-resolve the leader (the same
//!   code has other meanings, e.g. a busy lister, that must not trigger it).

use super::view::MasterView;

/// The marker in a refusal's message that says "this master does not lead: find the leader and ask it".
pub const NOT_LEADER_MARKER: &str = "not the leader";

/// The message a master that does not lead puts in its refusal (`UNAVAILABLE_IN_CURRENT_STATUS`), naming the
/// leader when it knows one.
pub fn not_leader_message(leader: Option<&str>) -> String {
    match leader {
        Some(l) => format!("this master is {NOT_LEADER_MARKER}: the leader is {l}"),
        None => format!("this master is {NOT_LEADER_MARKER}: no leader is known"),
    }
}

/// Whether a refusal's message says the master does not lead: it carries [`NOT_LEADER_MARKER`] (see
/// [`not_leader_message`]), or names a leader or a standby at all — no other `UNAVAILABLE_IN_CURRENT_STATUS`
/// refusal does (a busy lister, an unreachable replica, a segment's status), so a master whose wording differs
/// is still understood.
pub fn is_not_leader(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains(NOT_LEADER_MARKER) || m.contains("leader") || m.contains("standby")
}

/// One observation of a cluster's view key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// The key holds `view` as of etcd revision `revision` (the put's mod revision).
    Present {
        /// The view (its version = the key's create revision).
        view: MasterView,
        /// The etcd revision this observation reflects.
        revision: u64,
    },
    /// The key is absent as of etcd revision `revision` (a delete event's revision, or a read's header
    /// revision): no master leads.
    Absent {
        /// The etcd revision this observation reflects.
        revision: u64,
    },
}

/// The newest view a follower has seen. Views only move forward: a view whose version is lower than the highest
/// seen is ignored, even after the key vanished (a stale watch event or a lagging read names a deposed leader),
/// and an observation reflecting an older etcd revision than the state is stale.
///
/// etcd revisions survive an etcd restart (the data directory keeps them); an etcd whose data was wiped starts
/// them again, and a follower that saw the old ones must be restarted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewestView {
    view: Option<MasterView>,
    seen: u64,
    revision: u64,
}

impl NewestView {
    /// Applies `obs` unless it is older than what was seen; true when the current view changed.
    pub fn offer(&mut self, obs: Observation) -> bool {
        match obs {
            Observation::Present { view, revision } => {
                if view.version < self.seen || revision < self.revision {
                    return false;
                }
                self.seen = view.version;
                self.revision = revision;
                let changed = self.view.as_ref() != Some(&view);
                self.view = Some(view);
                changed
            }
            Observation::Absent { revision } => {
                // A view created after the absence was observed is the newer fact.
                if revision < self.revision || self.view.as_ref().is_some_and(|v| v.version > revision) {
                    return false;
                }
                self.revision = revision;
                self.view.take().is_some()
            }
        }
    }

    /// The current view: the newest leader, `None` when the key is absent (no master leads) or never read.
    pub fn view(&self) -> Option<&MasterView> {
        self.view.as_ref()
    }

    /// The highest view version ever seen (0: none).
    pub fn seen_version(&self) -> u64 {
        self.seen
    }
}

#[cfg(feature = "etcd")]
pub use follower::{FollowError, FollowerConfig, FollowerState, ViewFollower};

#[cfg(feature = "etcd")]
mod follower {
    use super::{NewestView, Observation};
    use crate::leader::view::{MasterView, master_view_key};
    use crate::oplog::codec::ClusterIdError;
    use etcd_client::{Client, ConnectOptions, WatchStream};
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::{Notify, watch};
    use tokio::time::Instant;

    /// How a [`ViewFollower`] talks to etcd.
    #[derive(Debug, Clone)]
    pub struct FollowerConfig {
        /// etcd endpoints (`host:port` or `http://host:port`).
        pub endpoints: Vec<String>,
        /// The cluster whose leader to follow.
        pub cluster: String,
        /// Deadline of one read, of arming a watch, and of connecting.
        pub request_timeout: Duration,
        /// Re-read the key this often even when the watch is quiet (a watch on a dead connection is silent).
        pub resync: Duration,
        /// Poll this often while a watch cannot be armed but reads succeed.
        pub poll: Duration,
        /// The first delay after a failure (doubling up to `resync`).
        pub retry: Duration,
    }

    impl FollowerConfig {
        /// Defaults: 2 s requests, resync every 5 s, poll every 200 ms (the original's fallback), retry from 100 ms.
        pub fn new(endpoints: Vec<String>, cluster: impl Into<String>) -> Self {
            Self {
                endpoints,
                cluster: cluster.into(),
                request_timeout: Duration::from_secs(2),
                resync: Duration::from_secs(5),
                poll: Duration::from_millis(200),
                retry: Duration::from_millis(100),
            }
        }
    }

    /// What a follower knows.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct FollowerState {
        /// The current leader (`None`: no master leads, or etcd was never read).
        pub view: Option<MasterView>,
        /// The highest view version seen.
        pub seen_version: u64,
        /// Whether etcd has been read at least once.
        pub synced: bool,
        /// The last failure (etcd unreachable, a malformed view), until the next successful read.
        pub error: Option<String>,
    }

    /// Why a follower cannot start.
    #[derive(Debug, thiserror::Error)]
    pub enum FollowError {
        /// The cluster id is not a valid namespace.
        #[error(transparent)]
        Cluster(#[from] ClusterIdError),
        /// No etcd endpoint was given.
        #[error("no etcd endpoint given")]
        NoEndpoint,
        /// Not called inside a tokio runtime (the follower's task needs one).
        #[error("the view follower needs a tokio runtime")]
        NoRuntime,
    }

    /// Follows one cluster's master view in a background task (stopped on drop). Cheap to query.
    #[derive(Debug)]
    pub struct ViewFollower {
        state: watch::Receiver<FollowerState>,
        refresh: Arc<Notify>,
        task: tokio::task::JoinHandle<()>,
        cluster: String,
        endpoints: Vec<String>,
    }

    impl ViewFollower {
        /// Starts following (inside a tokio runtime). Never waits for etcd: an unreachable etcd is retried in
        /// the background and reported in [`FollowerState::error`].
        pub fn start(config: FollowerConfig) -> Result<Self, FollowError> {
            let key = master_view_key(&config.cluster)?;
            if config.endpoints.is_empty() {
                return Err(FollowError::NoEndpoint);
            }
            let rt = tokio::runtime::Handle::try_current().map_err(|_| FollowError::NoRuntime)?;
            let (tx, state) = watch::channel(FollowerState::default());
            let refresh = Arc::new(Notify::new());
            let (cluster, endpoints) = (config.cluster.clone(), config.endpoints.clone());
            let task = rt.spawn(run(config, key, tx, refresh.clone()));
            Ok(Self { state, refresh, task, cluster, endpoints })
        }

        /// The cluster followed.
        pub fn cluster(&self) -> &str {
            &self.cluster
        }

        /// The etcd endpoints.
        pub fn endpoints(&self) -> &[String] {
            &self.endpoints
        }

        /// What the follower knows now.
        pub fn state(&self) -> FollowerState {
            self.state.borrow().clone()
        }

        /// Changes of [`ViewFollower::state`].
        pub fn subscribe(&self) -> watch::Receiver<FollowerState> {
            self.state.clone()
        }

        /// Asks for a read of the key now (a master refused a request as not the leader, or its connection
        /// broke): the watch may lag, or its connection may be dead without knowing it.
        pub fn refresh(&self) {
            self.refresh.notify_one();
        }

        /// The leader once one with a version above `version` is known (0: any leader), or `None` at `deadline`.
        pub async fn leader_newer_than(&self, version: u64, deadline: Instant) -> Option<MasterView> {
            let mut rx = self.state.clone();
            loop {
                if let Some(v) = rx.borrow_and_update().view.as_ref().filter(|v| v.version > version) {
                    return Some(v.clone());
                }
                match tokio::time::timeout_at(deadline, rx.changed()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) | Err(_) => return None,
                }
            }
        }
    }

    impl Drop for ViewFollower {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    /// Publishes the state after `newest` or `error` changed (receivers wake only on a real change).
    fn publish(tx: &watch::Sender<FollowerState>, newest: &NewestView, synced: bool, error: Option<String>) {
        let next = FollowerState { view: newest.view().cloned(), seen_version: newest.seen_version(), synced, error };
        tx.send_if_modified(|s| {
            if *s == next {
                return false;
            }
            if s.view != next.view {
                match &next.view {
                    Some(v) => tracing::info!(leader = %v.leader, version = v.version, "master view: new leader"),
                    None => tracing::info!("master view: no leader"),
                }
            }
            *s = next;
            true
        });
    }

    /// The follower's task: sessions (arm a watch, read, follow) until dropped; failures back off.
    async fn run(cfg: FollowerConfig, key: Vec<u8>, tx: watch::Sender<FollowerState>, refresh: Arc<Notify>) {
        let mut f = Follow { newest: NewestView::default(), synced: false, key, tx };
        let mut client: Option<Client> = None;
        let mut delay = cfg.retry;
        loop {
            let err = match &client {
                Some(c) => f.session(c.clone(), &cfg, &refresh, &mut delay).await,
                None => {
                    // The client connects lazily (a balanced channel): this fails only on bad endpoints or a
                    // stalled setup, both retried.
                    let opts = ConnectOptions::new()
                        .with_connect_timeout(cfg.request_timeout)
                        .with_keep_alive(cfg.resync, cfg.request_timeout);
                    match tokio::time::timeout(cfg.request_timeout, Client::connect(&cfg.endpoints, Some(opts))).await {
                        Ok(Ok(c)) => {
                            client = Some(c);
                            continue;
                        }
                        Ok(Err(e)) => format!("connect to etcd at {}: {e}", cfg.endpoints.join(",")),
                        Err(_) => format!("connect to etcd at {}: timed out", cfg.endpoints.join(",")),
                    }
                }
            };
            tracing::debug!(error = %err, retry_in = ?delay, "master view: etcd");
            f.failed(err);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = refresh.notified() => {}
            }
            delay = (delay * 2).min(cfg.resync);
        }
    }

    /// A follower's state across sessions.
    struct Follow {
        newest: NewestView,
        synced: bool,
        key: Vec<u8>,
        tx: watch::Sender<FollowerState>,
    }

    impl Follow {
        fn failed(&mut self, error: String) {
            publish(&self.tx, &self.newest, self.synced, Some(error));
        }

        fn observe(&mut self, obs: Observation) {
            self.newest.offer(obs);
            self.synced = true;
            publish(&self.tx, &self.newest, true, None);
        }

        /// Reads the key and applies what it holds.
        async fn read(&mut self, c: &mut Client, timeout: Duration) -> Result<(), String> {
            let resp = match tokio::time::timeout(timeout, c.get(self.key.clone(), None)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => return Err(format!("read the master view: {e}")),
                Err(_) => return Err("read the master view: timed out".into()),
            };
            let header = resp.header().map_or(0, |h| u64::try_from(h.revision()).unwrap_or(0));
            match resp.kvs().first() {
                None => self.observe(Observation::Absent { revision: header }),
                Some(kv) => {
                    let version = u64::try_from(kv.create_revision()).unwrap_or(0);
                    let revision = u64::try_from(kv.mod_revision()).unwrap_or(0);
                    let view = MasterView::decode(kv.value(), version).map_err(|e| e.to_string())?;
                    self.observe(Observation::Present { view, revision });
                }
            }
            Ok(())
        }

        /// Arms a watch and waits until etcd confirms it, so a read after it misses nothing.
        async fn arm(&self, c: &mut Client, timeout: Duration) -> Result<WatchStream, String> {
            let armed = async {
                let mut stream = c.watch(self.key.clone(), None).await.map_err(|e| e.to_string())?;
                match stream.message().await {
                    Ok(Some(r)) if r.created() && !r.canceled() => Ok(stream),
                    Ok(Some(r)) => Err(format!("not created: {}", r.cancel_reason())),
                    Ok(None) => Err("stream closed".to_owned()),
                    Err(e) => Err(e.to_string()),
                }
            };
            match tokio::time::timeout(timeout, armed).await {
                Ok(r) => r.map_err(|e| format!("watch the master view: {e}")),
                Err(_) => Err("watch the master view: timed out".into()),
            }
        }

        /// One session: arm a watch, read, then follow the watch's events (re-reading every `resync` and on
        /// request) until the stream breaks; a watch that cannot be armed is replaced by polling for a
        /// `resync` period. Returns why it ended.
        async fn session(
            &mut self,
            mut c: Client,
            cfg: &FollowerConfig,
            refresh: &Notify,
            delay: &mut Duration,
        ) -> String {
            let mut stream = match self.arm(&mut c, cfg.request_timeout).await {
                Ok(s) => s,
                Err(why) => {
                    // Poll while the watch cannot be armed (reads may still work), then try arming again.
                    let until = Instant::now() + cfg.resync;
                    while Instant::now() < until {
                        if let Err(e) = self.read(&mut c, cfg.request_timeout).await {
                            return format!("{why}; {e}");
                        }
                        *delay = cfg.retry;
                        tokio::select! {
                            _ = tokio::time::sleep(cfg.poll) => {}
                            _ = refresh.notified() => {}
                        }
                    }
                    return why;
                }
            };
            if let Err(e) = self.read(&mut c, cfg.request_timeout).await {
                return e;
            }
            *delay = cfg.retry;
            let mut resync = tokio::time::interval_at(Instant::now() + cfg.resync, cfg.resync);
            loop {
                tokio::select! {
                    msg = stream.message() => match msg {
                        Ok(Some(r)) if r.canceled() => return format!("watch cancelled: {}", r.cancel_reason()),
                        Ok(Some(r)) => {
                            for e in r.events() {
                                let Some(kv) = e.kv() else { continue };
                                let revision = u64::try_from(kv.mod_revision()).unwrap_or(0);
                                // A put carries the key's create revision; a delete's tombstone has none (this
                                // avoids `event_type`, which panics on a type it does not know).
                                let version = u64::try_from(kv.create_revision()).unwrap_or(0);
                                if version == 0 {
                                    self.observe(Observation::Absent { revision });
                                    continue;
                                }
                                match MasterView::decode(kv.value(), version) {
                                    Ok(view) => self.observe(Observation::Present { view, revision }),
                                    Err(e) => self.failed(e.to_string()),
                                }
                            }
                        }
                        Ok(None) => return "watch stream closed".into(),
                        Err(e) => return format!("watch stream broke: {e}"),
                    },
                    _ = resync.tick() => {
                        if let Err(e) = self.read(&mut c, cfg.request_timeout).await {
                            return e;
                        }
                    }
                    _ = refresh.notified() => {
                        if let Err(e) = self.read(&mut c, cfg.request_timeout).await {
                            return e;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(leader: &str, version: u64) -> MasterView {
        MasterView { leader: leader.into(), admin: None, version }
    }

    fn present(leader: &str, version: u64, revision: u64) -> Observation {
        Observation::Present { view: view(leader, version), revision }
    }

    #[test]
    fn an_older_view_never_replaces_a_newer_one() {
        let mut n = NewestView::default();
        assert!(n.offer(present("a:1", 5, 5)));
        assert!(n.offer(present("b:1", 9, 9)));
        // A stale watch event or a lagging read naming the deposed leader is ignored.
        assert!(!n.offer(present("a:1", 5, 12)));
        assert_eq!(n.view(), Some(&view("b:1", 9)));
        assert_eq!(n.seen_version(), 9);
    }

    #[test]
    fn a_deleted_view_means_no_leader_and_older_views_stay_ignored_after_it() {
        let mut n = NewestView::default();
        assert!(n.offer(present("b:1", 9, 9)));
        assert!(n.offer(Observation::Absent { revision: 10 }));
        assert_eq!(n.view(), None);
        assert!(!n.offer(present("a:1", 5, 11)), "a view older than one seen, after the key vanished");
        assert_eq!(n.view(), None);
        assert!(n.offer(present("c:1", 12, 12)));
        assert_eq!(n.view(), Some(&view("c:1", 12)));
    }

    #[test]
    fn stale_observations_are_ignored() {
        let mut n = NewestView::default();
        assert!(n.offer(present("b:1", 9, 9)));
        // An absence observed before the view was created (a read answered before the watch's put).
        assert!(!n.offer(Observation::Absent { revision: 8 }));
        assert_eq!(n.view(), Some(&view("b:1", 9)));
        // The same view read again later changes nothing.
        assert!(!n.offer(present("b:1", 9, 15)));
        // An absence older than the last observation is stale.
        assert!(!n.offer(Observation::Absent { revision: 14 }));
        assert_eq!(n.view(), Some(&view("b:1", 9)));
    }

    #[test]
    fn the_not_leader_refusal_is_recognised_by_its_marker() {
        assert!(is_not_leader(&not_leader_message(Some("h:1"))));
        assert!(is_not_leader(&not_leader_message(None)));
        assert!(not_leader_message(Some("h:1")).contains("h:1"));
        assert!(is_not_leader("standby: not serving"));
        assert!(is_not_leader("Not leader; the leader is 10.0.0.2:50051"));
        assert!(!is_not_leader("the lister is busy"));
    }
}
