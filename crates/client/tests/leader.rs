//! A client given `etcd://HOST:PORT/CLUSTER` follows the cluster's leader through its master view in a real
//! etcd: it finds the leader, follows a new view, sends a request refused as "not the leader" to the new
//! leader, repeats only requests safe to repeat when their leader breaks, waits (bounded) when no master
//! leads, and keeps working across an etcd restart. The leader side is simulated: the tests write the view
//! key as a leader would (create-if-absent under a lease; a failover deletes it and creates it anew).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use crescent_client::{Client, ClientConfig, ClientError};
use crescent_ha::leader::master_view_key;
use crescent_ha::leader::view::MasterView;
use crescent_ha::leader::watch::not_leader_message;
use crescent_ha::testing::EtcdServer;
use crescent_proto::wire::{ErrorFrame, Frame, FrameCodec, Head, HelloReply, Limits};
use crescent_proto::{ErrorCode, MasterReply};
use crescent_testkit::{LocalCluster, eventually};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use futures_util::{SinkExt, StreamExt};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::Framed;

const WAIT: Duration = Duration::from_secs(20);

/// A handle on the test's etcd that writes views as leaders do.
#[derive(Clone)]
struct Views {
    etcd: etcd_client::Client,
    cluster: &'static str,
}

impl Views {
    async fn new(etcd: &EtcdServer, cluster: &'static str) -> Self {
        Self { etcd: etcd_client::Client::connect([etcd.endpoint()], None).await.unwrap(), cluster }
    }

    /// Makes `leader` the leader: the old view key goes (as when its leader's lease ends) and a new one is
    /// created if absent under a lease; returns its version (create revision).
    async fn lead(&self, leader: &str) -> u64 {
        let mut c = self.etcd.clone();
        let key = master_view_key(self.cluster).unwrap();
        c.delete(key.clone(), None).await.unwrap();
        let lease = c.lease_grant(60, None).await.unwrap().id();
        let put =
            TxnOp::put(key.clone(), MasterView::encode_value(leader, None), Some(PutOptions::new().with_lease(lease)));
        let txn = Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([put]);
        let r = c.txn(txn).await.unwrap();
        assert!(r.succeeded());
        u64::try_from(r.header().unwrap().revision()).unwrap()
    }

    /// The `etcd://` address of this cluster.
    fn address(etcd: &EtcdServer, cluster: &str) -> String {
        format!("etcd://{}/{cluster}", etcd.endpoint().trim_start_matches("http://"))
    }
}

/// What a fake master does with each request it reads.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Refuses it as not the leader, after making `next` the leader.
    RefuseAsNotLeader,
    /// Closes the connection without answering, after making `next` the leader.
    BreakConnection,
    /// Refuses the connection's hello as not the leader, after making `next` the leader.
    RefuseHello,
}

/// A master that completes the handshake and then misbehaves (see [`Behaviour`]); counts the requests it read.
async fn fake_master(behaviour: Behaviour, views: Views, next: String) -> (String, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else { return };
            let (views, next, counter) = (views.clone(), next.clone(), counter.clone());
            tokio::spawn(async move {
                if let Behaviour::RefuseHello = behaviour {
                    let mut hello = [0u8; 512];
                    let _ = s.read(&mut hello).await;
                    counter.fetch_add(1, Ordering::SeqCst);
                    views.lead(&next).await;
                    let reply: HelloReply = Err(ErrorFrame {
                        code: ErrorCode::UnavailableInCurrentStatus,
                        message: not_leader_message(Some(&next)),
                    });
                    let _ = s.write_all(Head::encode(0, &reply, 0).unwrap().as_bytes()).await;
                    return;
                }
                if !matches!(
                    crescent_net::hello::answer(
                        &mut s,
                        crescent_net::auth::Plane::Control,
                        Limits::CONTROL,
                        Duration::from_secs(5),
                        None
                    )
                    .await,
                    Ok(Some(_))
                ) {
                    return;
                }
                let mut framed = Framed::new(s, FrameCodec::new(Limits::CONTROL));
                while let Some(Ok(frame)) = framed.next().await {
                    counter.fetch_add(1, Ordering::SeqCst);
                    // The leader changes before this master answers, as in a real failover.
                    views.lead(&next).await;
                    match behaviour {
                        Behaviour::BreakConnection | Behaviour::RefuseHello => return,
                        Behaviour::RefuseAsNotLeader => {
                            let reply: MasterReply = Err(ErrorFrame {
                                code: ErrorCode::UnavailableInCurrentStatus,
                                message: not_leader_message(Some(&next)),
                            });
                            let id = frame.request_id().unwrap_or(0);
                            let _ = framed.send(Frame::encode(id, &reply, Bytes::new()).unwrap()).await;
                        }
                    }
                }
            });
        }
    });
    (addr, seen)
}

fn client(address: &str, timeout: Duration) -> Client {
    Client::new(ClientConfig::new(address).with_request_timeout(timeout))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_finds_the_leader_and_follows_a_new_view() {
    let etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let views = Views::new(&etcd, "follow").await;
    let (a, b) = (LocalCluster::start(1, 16 << 20).await, LocalCluster::start(0, 0).await);
    let va = views.lead(&a.addr()).await;
    let c = client(&Views::address(&etcd, "follow"), Duration::from_secs(5));
    c.put("k", b"on a").await.unwrap();
    assert_eq!(c.get("k").await.unwrap(), b"on a");
    assert_eq!(c.master().leader().map(|v| (v.leader, v.version)), Some((a.addr(), va)));

    let vb = views.lead(&b.addr()).await;
    // B knows nothing of `k`: an answer without it proves the request went to B.
    let followed = eventually(WAIT, || async { !c.is_exist("k").await.unwrap() }).await;
    assert!(followed, "the client never followed the view to B");
    assert_eq!(c.master().leader().map(|v| (v.leader, v.version)), Some((b.addr(), vb)));
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_as_not_the_leader_goes_to_the_new_leader_even_when_not_idempotent() {
    let etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let views = Views::new(&etcd, "refuse").await;
    let real = LocalCluster::start(0, 0).await;
    let (fake, seen) = fake_master(Behaviour::RefuseAsNotLeader, views.clone(), real.addr()).await;
    views.lead(&fake).await;
    let c = client(&Views::address(&etcd, "refuse"), Duration::from_secs(5));
    // A refusal means the master did nothing: the remove is sent again, to the real leader, which answers it.
    let e = c.remove("k", false).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::ObjectNotFound, "{e}");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    assert_eq!(c.master().leader().map(|v| v.leader), Some(real.addr()));
    real.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_refused_as_not_the_leader_at_its_hello_goes_to_the_new_leader() {
    let etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let views = Views::new(&etcd, "hello").await;
    let real = LocalCluster::start(0, 0).await;
    let (fake, seen) = fake_master(Behaviour::RefuseHello, views.clone(), real.addr()).await;
    views.lead(&fake).await;
    let c = client(&Views::address(&etcd, "hello"), Duration::from_secs(5));
    let e = c.remove("k", false).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::ObjectNotFound, "{e}");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    real.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_leader_repeats_only_requests_safe_to_repeat() {
    let etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let views = Views::new(&etcd, "break").await;
    let real = LocalCluster::start(0, 0).await;
    let address = Views::address(&etcd, "break");

    // A lookup whose leader broke the connection is asked again of the new leader.
    let (fake, seen) = fake_master(Behaviour::BreakConnection, views.clone(), real.addr()).await;
    views.lead(&fake).await;
    assert!(!client(&address, Duration::from_secs(5)).is_exist("k").await.unwrap());
    assert_eq!(seen.load(Ordering::SeqCst), 1);

    // A remove that may have reached the broken leader is not repeated: its outcome is unknown.
    let (fake, seen) = fake_master(Behaviour::BreakConnection, views.clone(), real.addr()).await;
    views.lead(&fake).await;
    let e = client(&address, Duration::from_secs(5)).remove("k", false).await.unwrap_err();
    assert!(matches!(e, ClientError::OutcomeUnknown { op: "remove", .. }), "{e:?}");
    assert_eq!(e.code(), ErrorCode::RpcFail);
    assert!(e.to_string().contains(&fake) && e.to_string().contains("outcome is unknown"), "{e}");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    real.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_leader_a_request_waits_its_timeout_then_fails_clearly() {
    let etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let c = client(&Views::address(&etcd, "empty"), Duration::from_millis(400));
    let started = Instant::now();
    let e = c.is_exist("k").await.unwrap_err();
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(3), "{took:?}");
    assert_eq!(e.code(), ErrorCode::UnavailableInCurrentStatus);
    assert!(e.to_string().starts_with("no leader for cluster empty"), "{e}");

    // A leader appearing while a request waits is used at once.
    let views = Views::new(&etcd, "late").await;
    let master = LocalCluster::start(0, 0).await;
    let c = client(&Views::address(&etcd, "late"), Duration::from_secs(10));
    let (addr, v) = (master.addr(), views.clone());
    let lead = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        v.lead(&addr).await
    });
    assert!(!c.is_exist("k").await.unwrap());
    lead.await.unwrap();
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_recovers_by_itself_after_etcd_restarts() {
    let mut etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let (a, b) = (LocalCluster::start(0, 0).await, LocalCluster::start(0, 0).await);
    Views::new(&etcd, "outage").await.lead(&a.addr()).await;
    let c = client(&Views::address(&etcd, "outage"), Duration::from_secs(5));
    assert!(!c.is_exist("k").await.unwrap());

    // etcd down: the leader known last still serves the client.
    etcd.stop();
    assert!(!c.is_exist("k").await.unwrap());
    etcd.restart().unwrap();
    // etcd back and a failover to B: the client finds B by itself.
    let vb = Views::new(&etcd, "outage").await.lead(&b.addr()).await;
    let seen = eventually(WAIT, || async { c.master().leader().map(|v| v.version) == Some(vb) }).await;
    assert!(seen, "the client never saw the view after etcd came back");
    assert!(!c.is_exist("k").await.unwrap());
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_bad_etcd_address_is_refused_saying_why() {
    for bad in ["etcd://", "etcd://nohost/c", "etcd://h:1/bad id"] {
        let e = client(bad, Duration::from_secs(1)).is_exist("k").await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidParams, "{bad}: {e}");
        assert!(e.to_string().contains("master address") || e.to_string().contains("cluster"), "{bad}: {e}");
    }
}
