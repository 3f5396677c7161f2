//! The etcd leader coordinator against a real etcd (issue 15 §1): one candidate wins the view, the others see
//! it; the view version is the key's create revision and rises across leaders; a renewed lease holds past its
//! TTL; a released lease removes the view at once; an etcd that goes away, a view removed by hand, or a lease
//! revoked behind the leader's back ends the leader's guard before another can be elected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_ha::leader::{Campaign, EtcdCoordinator, EtcdCoordinatorConfig, LeaderCoordinator, master_view_key};
use crescent_ha::testing::EtcdServer;
use std::time::Duration;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(2);

async fn coordinator(etcd: &EtcdServer, cluster: &str) -> EtcdCoordinator {
    let mut c = EtcdCoordinatorConfig::new(vec![etcd.endpoint()], cluster);
    c.ttl = TTL;
    c.request_timeout = Duration::from_millis(500);
    EtcdCoordinator::connect(c).await.unwrap()
}

async fn win(c: &EtcdCoordinator, leader: &str) -> crescent_ha::leader::LeaderSession {
    match c.campaign(leader, Some("h:9")).await.unwrap() {
        Campaign::Won(s) => s,
        Campaign::Lost(v) => panic!("{leader} lost to {v:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_candidate_wins_and_versions_rise_across_leaders() {
    let etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let (a, b) = (coordinator(&etcd, "elect").await, coordinator(&etcd, "elect").await);
    assert_eq!(a.read_view().await.unwrap(), None);
    let sa = win(&a, "a:1").await;
    assert_eq!(sa.view().leader, "a:1");
    assert_eq!(sa.view().admin.as_deref(), Some("h:9"));
    match b.campaign("b:1", None).await.unwrap() {
        Campaign::Lost(Some(v)) => assert_eq!(&v, sa.view(), "the loser sees the winner's view"),
        other => panic!("{other:?}"),
    }
    // The version is the key's create revision.
    let mut etcd_client = etcd_client::Client::connect([etcd.endpoint()], None).await.unwrap();
    let key = master_view_key("elect").unwrap();
    let kv = etcd_client.get(key.clone(), None).await.unwrap();
    assert_eq!(kv.kvs()[0].create_revision() as u64, sa.view().version);
    // Renewed, the lease outlives several TTLs.
    let guard = sa.guard().clone();
    assert!(tokio::time::timeout(3 * TTL, guard.lost()).await.is_err(), "a renewed lease ended");
    assert!(guard.holds());
    assert_eq!(b.read_view().await.unwrap().as_ref(), Some(sa.view()));
    // Released: the view goes at once, and b's watch sees it.
    let old = sa.view().version;
    sa.release().await;
    assert!(!guard.holds());
    assert_eq!(b.wait_view_change(old, Duration::from_secs(10)).await.unwrap(), None);
    let sb = win(&b, "b:1").await;
    assert!(sb.view().version > old, "a new leader's version is higher: {} vs {old}", sb.view().version);
    // a's watch may see the release (no view, version 0) before b's view, or only b's view.
    let mut seen = a.wait_view_change(old, Duration::from_secs(10)).await.unwrap();
    if seen.is_none() {
        seen = a.wait_view_change(0, Duration::from_secs(10)).await.unwrap();
    }
    assert_eq!(seen.as_ref(), Some(sb.view()));
    sb.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_stops_before_its_lease_can_expire() {
    let mut etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let a = coordinator(&etcd, "stall").await;
    let s = win(&a, "a:1").await;
    let guard = s.guard().clone();
    let killed = Instant::now();
    etcd.kill();
    tokio::time::timeout(2 * TTL, guard.lost()).await.expect("the guard outlived its lease");
    // A renewal sent at t extends the guard to t + 3/4 TTL: it ends before etcd could expire the lease.
    assert!(killed.elapsed() < TTL, "guard ended {:?} after the last chance to renew", killed.elapsed());
    drop(s);
    etcd.restart().unwrap();
    // Once etcd is back and the old lease has expired there, a new leader can win.
    let b = coordinator(&etcd, "stall").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match b.campaign("b:1", None).await {
            Ok(Campaign::Won(s)) => {
                s.release().await;
                break;
            }
            other => {
                assert!(Instant::now() < deadline, "no new leader after etcd came back: {other:?}");
                b.wait_view_change(0, Duration::from_millis(500)).await.ok();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_removed_or_a_lease_revoked_behind_the_leader_ends_its_guard() {
    let etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let mut c = etcd_client::Client::connect([etcd.endpoint()], None).await.unwrap();
    let a = coordinator(&etcd, "gone").await;
    let s = win(&a, "a:1").await;
    // Let the coordinator's follower see the view first (its guard ends only on a change after that).
    assert_eq!(a.wait_view_change(0, Duration::from_secs(10)).await.unwrap().as_ref(), Some(s.view()));
    c.delete(master_view_key("gone").unwrap(), None).await.unwrap();
    tokio::time::timeout(2 * TTL, s.guard().lost()).await.expect("a removed view did not end the guard");
    drop(s);

    let s = win(&a, "a:1").await;
    let leases = c.leases().await.unwrap();
    for l in leases.leases() {
        c.lease_revoke(l.id()).await.unwrap();
    }
    tokio::time::timeout(2 * TTL, s.guard().lost()).await.expect("a revoked lease did not end the guard");
}
