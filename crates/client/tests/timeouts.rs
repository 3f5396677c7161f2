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
