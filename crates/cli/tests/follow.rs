//! Clients, storage nodes and CLI commands given `etcd://HOST:PORT/CLUSTER` follow the cluster's leader by
//! themselves (issue 15 §4): real `crescent` processes and a real etcd on loopback. The masters are
//! `crescent master --etcd` candidates: the one that wins the lease publishes the view; when it dies, the next
//! one wins a newer view (a higher create revision) once the lease has expired.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_client::{Client, ClientConfig};
use crescent_ha::testing::EtcdServer;
use crescent_proto::{ErrorCode, ReplicateConfig};
use crescent_testkit::process::{all_durable, health, run};
use crescent_testkit::{Proc, eventually, pattern};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const OBJECTS: usize = 200;
const WAIT: Duration = Duration::from_secs(60);
const CLUSTER: &str = "follow-test";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_crescent"))
}

fn key(i: usize) -> String {
    format!("follow-{i:04}")
}

fn value(i: usize) -> Vec<u8> {
    pattern(100 + (i * 53) % 30_000, i as u64)
}

fn removed(i: usize) -> bool {
    i % 5 == 2
}

/// The view version a candidate reports once it leads (waits for it).
async fn leads(admin: &str) -> u64 {
    let view = || health(admin).filter(|h| h["role"] == "leader").and_then(|h| h["ha"]["view_version"].as_u64());
    assert!(eventually(WAIT, || async { view().is_some() }).await, "{admin} never led: {:?}", health(admin));
    view().unwrap_or_default()
}

fn master(endpoint: &str) -> Proc {
    crescent_testkit::process::candidate(bin(), endpoint, CLUSTER)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_a_client_and_the_cli_follow_a_failover_by_themselves() {
    // A missing etcd binary fails the test: it is never skipped.
    let etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let endpoint = etcd.endpoint().trim_start_matches("http://").to_owned();
    let address = format!("etcd://{endpoint}/{CLUSTER}");

    let mut a = master(&endpoint);
    let admin_a = a.field("admin");
    let va = leads(&admin_a).await;
    let node =
        Proc::start(bin(), &["node", "--master", &address, "--listen", "127.0.0.1:0", "--segment-size", "64MiB"]);
    let client = Client::new(ClientConfig::new(address.clone()).with_request_timeout(Duration::from_secs(15)));
    let cfg = ReplicateConfig::default();
    for i in 0..OBJECTS {
        client.put_from(&key(i), &value(i), &cfg).await.unwrap_or_else(|e| panic!("put {}: {e}", key(i)));
    }
    for i in (0..OBJECTS).filter(|i| removed(*i)) {
        client.remove(&key(i), true).await.unwrap();
    }
    assert_eq!(client.master().leader().map(|v| v.version), Some(va));
    assert!(
        eventually(WAIT, || async { all_durable(&admin_a) }).await,
        "the log never caught up: {:?}",
        health(&admin_a)
    );

    // Idempotent lookups keep going through the failover; every one must succeed. (Until the node remounts at
    // the new leader its objects are not served, so a live key may be answered "absent" then; a removed key must
    // never be answered "present".)
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed, wrong) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = {
        let (client, stop, done) = (client.clone(), stop.clone(), done.clone());
        let (failed, wrong) = (failed.clone(), wrong.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let k = i % OBJECTS;
                match client.is_exist(&key(k)).await {
                    Ok(true) if removed(k) => wrong.fetch_add(1, Ordering::Relaxed),
                    Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        eprintln!("is_exist {}: {e}", key(k));
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
                i += 1;
            }
        })
    };
    assert!(eventually(WAIT, || async { done.load(Ordering::Relaxed) > 10 }).await);

    // Failover: A dies; B, started after, wins the lease once A's expires, and promotes from the same oplog.
    // Nobody tells the node or the client.
    a.kill9();
    let b = master(&endpoint);
    let vb = leads(&b.field("admin")).await;
    assert!(vb > va);
    let before = done.load(Ordering::Relaxed);
    assert!(
        eventually(WAIT, || async { done.load(Ordering::Relaxed) > before + 10 }).await,
        "no lookups after the failover"
    );
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert_eq!(failed.load(Ordering::Relaxed), 0, "a lookup in flight during the failover failed");
    assert_eq!(wrong.load(Ordering::Relaxed), 0, "a removed key was found");
    assert_eq!(client.master().leader().map(|v| (v.leader, v.version)), Some((b.field("master"), vb)));

    // The node remounts at B by itself: its objects read back byte-identical; removed ones stay removed.
    let first = (0..OBJECTS).find(|i| !removed(*i)).unwrap();
    assert!(
        eventually(WAIT, || async { client.get(&key(first)).await.is_ok() }).await,
        "the node never remounted at the new leader"
    );
    for i in 0..OBJECTS {
        match client.get(&key(i)).await {
            Ok(bytes) => {
                assert!(!removed(i), "{} was removed before the failover", key(i));
                assert!(bytes == value(i), "{} differs", key(i));
            }
            Err(e) => {
                assert!(removed(i), "{}: {e}", key(i));
                assert_eq!(e.code(), ErrorCode::ObjectNotFound);
            }
        }
    }
    // New writes go to B and land on the remounted node.
    client.put("after-failover", b"on b").await.unwrap();
    assert_eq!(client.get("after-failover").await.unwrap(), b"on b");

    // A CLI command given the cluster through CRESCENT_MASTER finds B too.
    let out = run(bin(), &address, &["get", &key(first)], b"");
    assert!(out.status.success(), "crescent get: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, value(first));
    drop(node);
}

#[test]
fn a_bad_etcd_address_is_refused_saying_why() {
    for bad in ["etcd://", "etcd://nohost/c", "etcd://127.0.0.1:1/bad id"] {
        let out = run(bin(), bad, &["ls"], b"");
        assert!(!out.status.success(), "{bad}: accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("INVALID_PARAMS"), "{bad}: {err}");
        assert!(err.contains("master address") || err.contains("cluster id"), "{bad}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_before_any_leader_mounts_once_one_leads_and_the_config_file_takes_etcd() {
    let etcd = EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let endpoint = etcd.endpoint().trim_start_matches("http://").to_owned();
    let address = format!("etcd://{endpoint}/{CLUSTER}");
    // The node starts while the view is empty: it waits for a leader (its readiness line comes after its mount;
    // its data plane listens before it mounts, which shows it is up and waiting).
    let listen = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let node = {
        let (address, listen) = (address.clone(), listen.clone());
        tokio::task::spawn_blocking(move || {
            Proc::start(bin(), &["node", "--master", &address, "--listen", &listen, "--segment-size", "16MiB"])
        })
    };
    let up = eventually(WAIT, || async { std::net::TcpStream::connect(&listen).is_ok() }).await;
    assert!(up, "the node never listened");
    assert!(!node.is_finished(), "the node reported ready with no leader to mount at");
    let a = master(&endpoint);
    leads(&a.field("admin")).await;
    let _node = node.await.unwrap();

    // A client command with the address only in its config file (no flag, no CRESCENT_MASTER).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("crescent.toml");
    std::fs::write(&file, format!("master = \"{address}\"\n")).unwrap();
    let cmd = |args: &[&str]| {
        std::process::Command::new(bin())
            .arg("--config")
            .arg(&file)
            .args(args)
            .env_remove("CRESCENT_MASTER")
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    };
    let value = dir.path().join("value");
    std::fs::write(&value, b"hello").unwrap();
    let put = cmd(&["put", "from-config", value.to_str().unwrap()]);
    assert!(put.status.success(), "crescent put: {}", String::from_utf8_lossy(&put.stderr));
    let get = cmd(&["get", "from-config"]);
    assert!(get.status.success(), "crescent get: {}", String::from_utf8_lossy(&get.stderr));
    assert_eq!(get.stdout, b"hello");
}
