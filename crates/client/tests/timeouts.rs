//! Master requests are bounded: a master that accepts connections but never answers (stopped, hung) costs a
//! request one request timeout per address, the next address is tried, and the error names every address and
//! what it did.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_client::{Client, ClientConfig};
use crescent_proto::ErrorCode;
use crescent_testkit::LocalCluster;
use std::time::{Duration, Instant};

/// A listener nobody accepts from: the kernel completes connections to it, and nothing ever answers.
fn silent_master() -> (std::net::TcpListener, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (l, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_master_costs_one_request_timeout_and_the_next_address_answers() {
    let cluster = LocalCluster::start(0, 0).await;
    let (_held, silent) = silent_master();
    let timeout = Duration::from_millis(300);
    let config = |addr: &str| ClientConfig::new(addr).with_request_timeout(timeout);

    let alone = Client::new(config(&silent));
    let started = Instant::now();
    let e = alone.is_exist("k").await.unwrap_err();
    let took = started.elapsed();
    assert!(took >= timeout && took < Duration::from_secs(2), "{took:?}");
    assert_eq!(e.code(), ErrorCode::RpcTimeout);
    assert_eq!(e.to_string(), format!("cannot reach the master at {silent}: no answer within 300 ms"));

    let live = cluster.addr();
    let both = Client::new(config(&format!("{silent}, {live}")));
    let started = Instant::now();
    assert!(!both.is_exist("k").await.unwrap());
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    // The master that answered is asked first from then on: no more timeouts.
    let started = Instant::now();
    for _ in 0..5 {
        assert!(!both.is_exist("k").await.unwrap());
    }
    assert!(started.elapsed() < timeout, "{:?}", started.elapsed());
    cluster.shutdown().await;
}

/// A connection the master closed while it sat idle (shed at the master's connection cap here; a restarted
/// master does the same to all of them) is not reused: the next request dials afresh and is answered. Before,
/// the request was written to the dead socket and failed with "connection closed" though the master was up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_master_closed_while_idle_is_dialled_afresh() {
    use crescent_master::server::{MasterServer, RpcLimits};
    let limits = RpcLimits { max_connections: 1, ..RpcLimits::default() };
    let master =
        MasterServer::builder(crescent_master::service::MasterConfig::default()).limits(limits).start().await.unwrap();
    let addr = master.rpc_addr().to_string();
    let first = Client::new(ClientConfig::new(addr.clone()));
    assert!(!first.is_exist("k").await.unwrap());
    // A second client takes the only connection: the master closes the first client's idle one for it.
    let second = Client::new(ClientConfig::new(addr.clone()));
    // Refused (cap reached, all busy) only while the first connection is still busy finishing its request.
    let started = std::time::Instant::now();
    loop {
        match second.is_exist("k").await {
            Ok(found) => break assert!(!found),
            Err(e)
                if e.code() == ErrorCode::UnavailableInCurrentStatus && started.elapsed() < Duration::from_secs(5) =>
            {
                tokio::task::yield_now().await
            }
            Err(e) => panic!("second client: {e}"),
        }
    }
    assert!(
        crescent_testkit::eventually(Duration::from_secs(5), || async { master.rpc_stats().shed == 1 }).await,
        "the master did not close the idle connection"
    );
    // The second client leaves; the master then serves no connection at all.
    drop(second);
    assert!(crescent_testkit::eventually(Duration::from_secs(5), || async { master.rpc_stats().open == 0 }).await);
    // Past the quiet spell after which a reused connection is checked first.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let again = first.is_exist("k").await;
    assert!(matches!(again, Ok(false)), "the first client's next request: {again:?}");
    assert_eq!(master.rpc_stats().accepted, 3, "the first client dialled afresh");
}
