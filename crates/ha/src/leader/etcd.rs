//! The etcd [`LeaderCoordinator`] (reference §7): a lease of `ttl`, and the master-view key created if absent
//! under it, so the key's create revision — the view version — strictly increases across leaders and the key
//! vanishes when its leader's lease does.
//!
//! The leader renews every `ttl / 4`. Each renewal sent at `t` and answered extends the [`LeaseGuard`] to
//! `t + ttl - ttl / 4`: the lease cannot expire in etcd before `t + ttl` (etcd restarts its countdown on
//! receipt, after `t`), so the guard always ends first, by at least a quarter TTL. A renewal etcd answers with
//! TTL 0 (the lease is gone), or a view that names another version, ends the guard at once; renewals that keep
//! failing let it expire. Changes of the view are followed with a [`ViewFollower`] (watch plus resync).

use super::coordinator::{Campaign, CoordError, CoordFuture, LeaderCoordinator, LeaderSession, LeaseGuard, Release};
use super::view::{MasterView, master_view_key};
use super::watch::{FollowError, FollowerConfig, ViewFollower};
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp};
use std::time::Duration;
use tokio::time::Instant;

/// The smallest lease etcd 3.4 grants reliably (its minimum TTL is about 1.5 election timeouts).
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// Settings of an [`EtcdCoordinator`].
#[derive(Debug, Clone)]
pub struct EtcdCoordinatorConfig {
    /// etcd endpoints.
    pub endpoints: Vec<String>,
    /// The cluster whose leader is elected.
    pub cluster: String,
    /// The lease TTL (at least [`MIN_LEASE_TTL`], whole seconds: etcd counts in seconds).
    pub ttl: Duration,
    /// Deadline of one etcd request.
    pub request_timeout: Duration,
}

impl EtcdCoordinatorConfig {
    /// Defaults: a 5 s lease (the original's), 2 s requests.
    pub fn new(endpoints: Vec<String>, cluster: impl Into<String>) -> Self {
        Self {
            endpoints,
            cluster: cluster.into(),
            ttl: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
        }
    }
}

/// Elects one leader per cluster through etcd.
pub struct EtcdCoordinator {
    client: Client,
    key: Vec<u8>,
    ttl_secs: i64,
    request_timeout: Duration,
    follower: ViewFollower,
    endpoints: Vec<String>,
}

impl std::fmt::Debug for EtcdCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCoordinator").field("endpoints", &self.endpoints).field("ttl", &self.ttl_secs).finish()
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> CoordError {
    CoordError::Unavailable(format!("{what}: {e}"))
}

async fn timed<T, E: std::fmt::Display>(
    what: &str,
    limit: Duration,
    f: impl Future<Output = Result<T, E>>,
) -> Result<T, CoordError> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(|e| unavailable(what, e)),
        Err(_) => Err(unavailable(what, format!("no answer within {limit:?}"))),
    }
}

impl EtcdCoordinator {
    /// A coordinator for `config` (inside a tokio runtime). Never waits for etcd: the client connects lazily.
    pub async fn connect(config: EtcdCoordinatorConfig) -> Result<Self, CoordError> {
        let key = master_view_key(&config.cluster).map_err(|e| CoordError::Malformed(e.to_string()))?;
        if config.ttl < MIN_LEASE_TTL {
            return Err(CoordError::Malformed(format!(
                "lease TTL {:?} is below etcd's minimum of {MIN_LEASE_TTL:?}",
                config.ttl
            )));
        }
        let opts = ConnectOptions::new()
            .with_connect_timeout(config.request_timeout)
            .with_timeout(config.request_timeout)
            .with_keep_alive(config.ttl / 4, config.request_timeout);
        let client = timed("connect", config.request_timeout, Client::connect(&config.endpoints, Some(opts))).await?;
        let mut follow = FollowerConfig::new(config.endpoints.clone(), config.cluster.clone());
        follow.request_timeout = config.request_timeout;
        let follower = ViewFollower::start(follow).map_err(|e: FollowError| CoordError::Malformed(e.to_string()))?;
        let ttl_secs = i64::try_from(config.ttl.as_secs()).unwrap_or(i64::MAX);
        Ok(Self {
            client,
            key,
            ttl_secs,
            request_timeout: config.request_timeout,
            follower,
            endpoints: config.endpoints,
        })
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_secs.unsigned_abs())
    }

    async fn read(&self) -> Result<Option<MasterView>, CoordError> {
        let mut c = self.client.clone();
        let resp = timed("read the master view", self.request_timeout, c.get(self.key.clone(), None)).await?;
        match resp.kvs().first() {
            None => Ok(None),
            Some(kv) => {
                let version = u64::try_from(kv.create_revision()).unwrap_or(0);
                MasterView::decode(kv.value(), version).map(Some).map_err(|e| CoordError::Malformed(e.to_string()))
            }
        }
    }

    async fn try_lead(&self, leader: &str, admin: Option<&str>) -> Result<Campaign, CoordError> {
        let mut c = self.client.clone();
        let limit = self.request_timeout;
        let sent = Instant::now();
        let lease = timed("grant a lease", limit, c.lease_grant(self.ttl_secs, None)).await?.id();
        let value = MasterView::encode_value(leader, admin);
        let put = TxnOp::put(self.key.clone(), value, Some(PutOptions::new().with_lease(lease)));
        let txn = Txn::new().when([Compare::create_revision(self.key.clone(), CompareOp::Equal, 0)]).and_then([put]);
        let resp = match timed("create the master view", limit, c.txn(txn)).await {
            Ok(r) => r,
            Err(e) => {
                // The outcome is unknown: give the lease up, which removes the key if it was created.
                let _ = tokio::time::timeout(limit, c.lease_revoke(lease)).await;
                return Err(e);
            }
        };
        if !resp.succeeded() {
            let _ = tokio::time::timeout(limit, c.lease_revoke(lease)).await;
            return Ok(Campaign::Lost(self.read().await.ok().flatten()));
        }
        let version = resp.header().map_or(0, |h| u64::try_from(h.revision()).unwrap_or(0));
        let view = MasterView { leader: leader.to_owned(), admin: admin.map(str::to_owned), version };
        let guard = LeaseGuard::until(valid_after(sent, self.ttl_secs));
        let views = self.follower.subscribe();
        let renewer = tokio::spawn(renew(self.client.clone(), lease, version, self.ttl(), guard.clone(), views));
        let mut revoker = self.client.clone();
        let release: Release = Box::new(move || {
            Box::pin(async move {
                if let Err(e) = tokio::time::timeout(limit, revoker.lease_revoke(lease))
                    .await
                    .unwrap_or_else(|_| Err(etcd_client::Error::InvalidArgs("lease revoke timed out".into())))
                {
                    tracing::warn!(error = %e, "leader lease not revoked: the view goes when it expires");
                }
            })
        });
        tracing::info!(%leader, version, lease, "won the master view");
        Ok(Campaign::Won(LeaderSession::new(view, guard, Some(renewer), Some(release))))
    }
}

/// How long a renewal sent at `sent` and answered with `ttl_secs` lets the leader act: `ttl - ttl / 4` from
/// `sent` (etcd restarts the countdown on receipt, after `sent`).
fn valid_after(sent: Instant, ttl_secs: i64) -> Instant {
    let ttl = Duration::from_secs(ttl_secs.unsigned_abs());
    sent + ttl - ttl / 4
}

/// The renewal loop of the lease behind view `mine`: a keep-alive every `ttl / 4`, each answered one extending
/// `guard`; ends the guard when etcd says the lease is gone, when the followed view is newer than `mine` or
/// gone after it was seen, or when renewals fail until it expires.
async fn renew(
    mut client: Client,
    lease: i64,
    mine: u64,
    ttl: Duration,
    guard: LeaseGuard,
    mut views: tokio::sync::watch::Receiver<super::watch::FollowerState>,
) {
    let every = ttl / 4;
    let mut keeper = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whether the follower has seen this leader's own view (before that it may still show an older one).
    let mut confirmed = false;
    // The follower may have seen this view already, before `views` was subscribed (its watch event can beat
    // the txn's answer here): judge the current state first, or a view seen then removed is never noticed.
    views.mark_changed();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = guard.lost() => break,
            changed = views.changed() => {
                if changed.is_err() {
                    continue;
                }
                // A newer view, or this one gone once seen: the key was replaced or removed (by hand, or
                // with the lease).
                let seen = views.borrow_and_update().view.as_ref().map(|v| v.version);
                match seen {
                    Some(v) if v == mine => confirmed = true,
                    Some(v) if v > mine => {
                        tracing::warn!(mine, now = v, "the master view moved to another leader: stepping down");
                        break;
                    }
                    None if confirmed => {
                        tracing::warn!(mine, "the master view was removed: stepping down");
                        break;
                    }
                    _ => {}
                }
                continue;
            }
        }
        if keeper.is_none() {
            match tokio::time::timeout(every, client.lease_keep_alive(lease)).await {
                Ok(Ok(k)) => keeper = Some(k),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, left = ?guard.left(), "leader lease: cannot open a keep-alive");
                    continue;
                }
                Err(_) => continue,
            }
        }
        let Some((k, stream)) = keeper.as_mut() else { continue };
        let sent = Instant::now();
        let answered = async {
            k.keep_alive().await?;
            stream.message().await
        };
        match tokio::time::timeout(every.max(Duration::from_millis(200)), answered).await {
            Ok(Ok(Some(r))) if r.ttl() > 0 => guard.extend_to(valid_after(sent, r.ttl())),
            Ok(Ok(Some(_))) => {
                tracing::warn!(lease, "leader lease expired in etcd: stepping down");
                break;
            }
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                tracing::warn!(lease, left = ?guard.left(), "leader lease renewal failed; retrying");
                keeper = None;
            }
        }
    }
    guard.end();
}

impl LeaderCoordinator for EtcdCoordinator {
    fn read_view(&self) -> CoordFuture<'_, Option<MasterView>> {
        Box::pin(self.read())
    }

    fn campaign<'a>(&'a self, leader: &'a str, admin: Option<&'a str>) -> CoordFuture<'a, Campaign> {
        Box::pin(self.try_lead(leader, admin))
    }

    fn wait_view_change(&self, known: u64, timeout: Duration) -> CoordFuture<'_, Option<MasterView>> {
        Box::pin(async move {
            let mut rx = self.follower.subscribe();
            let deadline = Instant::now() + timeout;
            loop {
                {
                    let s = rx.borrow_and_update();
                    let version = s.view.as_ref().map_or(0, |v| v.version);
                    if s.synced && version != known {
                        return Ok(s.view.clone());
                    }
                }
                match tokio::time::timeout_at(deadline, rx.changed()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) | Err(_) => return Ok(rx.borrow().view.clone()),
                }
            }
        })
    }

    fn describe(&self) -> String {
        format!("etcd {} (lease {} s)", self.endpoints.join(","), self.ttl_secs)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::leader::watch::FollowerState;
    use crate::testing::EtcdServer;

    fn state(version: Option<u64>) -> FollowerState {
        FollowerState {
            view: version.map(|version| MasterView { leader: "a:1".into(), admin: None, version }),
            seen_version: version.unwrap_or(0),
            synced: true,
            error: None,
        }
    }

    /// The renewer subscribes after the follower already shows this leader's view (the watch event came
    /// before the txn's answer): the view's removal must still end the guard.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_view_seen_before_the_renewer_subscribed_still_counts_as_confirmed() {
        let etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
        let mut client = Client::connect([etcd.endpoint()], None).await.unwrap();
        let lease = client.lease_grant(2, None).await.unwrap().id();
        let mine = 7;
        let (tx, _keep) = tokio::sync::watch::channel(state(Some(mine)));
        let views = tx.subscribe(); // marks the current state (this leader's view) as seen
        let guard = LeaseGuard::until(Instant::now() + Duration::from_secs(60));
        let renewer = tokio::spawn(renew(client, lease, mine, Duration::from_secs(2), guard.clone(), views));
        // Renewals succeed, so only the removal can end the guard.
        assert!(tokio::time::timeout(Duration::from_millis(300), guard.lost()).await.is_err());
        tx.send(state(None)).unwrap();
        tokio::time::timeout(Duration::from_secs(5), guard.lost()).await.expect("a removed view did not end the guard");
        tokio::time::timeout(Duration::from_secs(5), renewer).await.unwrap().unwrap();
    }
}
