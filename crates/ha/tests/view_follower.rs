//! The master-view follower against a real etcd: it reads the view, follows a new leader through its watch,
//! reports "no leader" when the key vanishes, and recovers by itself after etcd is restarted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_ha::leader::master_view_key;
use crescent_ha::leader::view::MasterView;
use crescent_ha::leader::watch::{FollowError, FollowerConfig, FollowerState, ViewFollower};
use crescent_ha::testing::EtcdServer;
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use std::time::Duration;
use tokio::time::Instant;

const WAIT: Duration = Duration::from_secs(20);

/// Creates the view key if absent, under a fresh lease, as a leader would; returns its create revision.
async fn lead(c: &mut Client, cluster: &str, leader: &str) -> u64 {
    let key = master_view_key(cluster).unwrap();
    let lease = c.lease_grant(10, None).await.unwrap().id();
    let txn = Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
        key,
        MasterView::encode_value(leader, None),
        Some(PutOptions::new().with_lease(lease)),
    )]);
    let r = c.txn(txn).await.unwrap();
    assert!(r.succeeded(), "the view key was not absent");
    u64::try_from(r.header().unwrap().revision()).unwrap()
}

fn config(etcd: &EtcdServer, cluster: &str) -> FollowerConfig {
    let mut cfg = FollowerConfig::new(vec![etcd.endpoint()], cluster);
    cfg.request_timeout = Duration::from_millis(500);
    cfg.resync = Duration::from_secs(1);
    cfg.retry = Duration::from_millis(20);
    cfg
}

/// Waits until the follower's state satisfies `ok`.
async fn until(f: &ViewFollower, what: &str, ok: impl Fn(&FollowerState) -> bool) -> FollowerState {
    let mut rx = f.subscribe();
    let deadline = Instant::now() + WAIT;
    loop {
        let s = rx.borrow_and_update().clone();
        if ok(&s) {
            return s;
        }
        if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
            panic!("{what}: never happened; state {s:?}");
        }
    }
}

#[tokio::test]
async fn the_follower_reads_the_view_and_follows_a_new_leader() {
    let etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let mut c = Client::connect([etcd.endpoint()], None).await.unwrap();
    let f = ViewFollower::start(config(&etcd, "follow")).unwrap();
    let s = until(&f, "first read", |s| s.synced).await;
    assert_eq!(s.view, None, "no master leads yet");
    assert!(f.leader_newer_than(0, Instant::now() + Duration::from_millis(50)).await.is_none());

    let v1 = lead(&mut c, "follow", "10.0.0.1:1").await;
    let got = f.leader_newer_than(0, Instant::now() + WAIT).await.expect("the first leader");
    assert_eq!((got.leader.as_str(), got.version), ("10.0.0.1:1", v1));

    // Failover: the old key goes (its lease, here a delete), a new leader creates it anew at a higher version.
    c.delete(master_view_key("follow").unwrap(), None).await.unwrap();
    until(&f, "the key vanished", |s| s.view.is_none()).await;
    let v2 = lead(&mut c, "follow", "10.0.0.2:2").await;
    assert!(v2 > v1);
    let got = f.leader_newer_than(v1, Instant::now() + WAIT).await.expect("the new leader");
    assert_eq!((got.leader.as_str(), got.version), ("10.0.0.2:2", v2));
    assert_eq!(f.state().seen_version, v2);
}

#[tokio::test]
async fn the_follower_recovers_by_itself_after_etcd_restarts() {
    let mut etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let mut c = Client::connect([etcd.endpoint()], None).await.unwrap();
    let v1 = lead(&mut c, "restart", "10.0.0.1:1").await;
    let f = ViewFollower::start(config(&etcd, "restart")).unwrap();
    until(&f, "first leader", |s| s.view.as_ref().is_some_and(|v| v.version == v1)).await;

    etcd.stop();
    f.refresh();
    let s = until(&f, "etcd down reported", |s| s.error.is_some()).await;
    // The last known leader is kept while etcd cannot be read (it may well still serve).
    assert_eq!(s.view.as_ref().map(|v| v.version), Some(v1));

    etcd.restart().unwrap();
    let mut c = Client::connect([etcd.endpoint()], None).await.unwrap();
    c.delete(master_view_key("restart").unwrap(), None).await.unwrap();
    let v2 = lead(&mut c, "restart", "10.0.0.2:2").await;
    let got = f.leader_newer_than(v1, Instant::now() + WAIT).await.expect("the leader after etcd came back");
    assert_eq!((got.leader.as_str(), got.version), ("10.0.0.2:2", v2));
    until(&f, "error cleared", |s| s.error.is_none()).await;
}

#[tokio::test]
async fn a_bad_cluster_id_is_refused_at_start() {
    let e = ViewFollower::start(FollowerConfig::new(vec!["127.0.0.1:1".into()], "bad id")).unwrap_err();
    assert!(matches!(e, FollowError::Cluster(_)), "{e}");
    let e = ViewFollower::start(FollowerConfig::new(vec![], "ok")).unwrap_err();
    assert!(matches!(e, FollowError::NoEndpoint), "{e}");
}
