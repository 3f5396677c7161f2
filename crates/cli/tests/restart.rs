//! A master with an oplog survives `kill -9` (issue 14 §3): real `crescent` processes on loopback TCP, the
//! oplog in an embedded data directory or in a real etcd. After the restart on the same ports, the node
//! remounts by itself and every object reads back byte-identical; removed ones stay removed. With snapshots
//! (issue 15 §3) the log is compacted below them, so the restart must restore snapshot + the log after it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_client::{Client, ClientConfig};
use crescent_proto::{ErrorCode, ReplicateConfig};
use crescent_testkit::process::{all_durable, health};
use crescent_testkit::{Proc, ProcCluster, eventually, pattern};

use std::path::Path;
use std::time::Duration;

const OBJECTS: usize = 1000;
const WAIT: Duration = Duration::from_secs(60);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_crescent"))
}

fn key(i: usize) -> String {
    format!("restart-{i:04}")
}

fn value(i: usize) -> Vec<u8> {
    pattern(100 + (i * 37) % 20_000, i as u64)
}

fn removed(i: usize) -> bool {
    i % 7 == 3
}

/// Snapshot ids (`<batch>-<seq>`) in a `--snapshot-dir`, oldest first.
fn snapshots_in(dir: &Path) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(dir.join("snapshots"))
        .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    ids.retain(|id| dir.join("snapshots").join(id).join("manifest.json").exists());
    ids.sort();
    ids
}

/// Puts, removes, waits until the log holds it all, kills the master with SIGKILL, restarts it on the same
/// ports with the same `oplog` flags, and checks every object. With `snapshots`, the removals come after two
/// snapshots were published (the first batches are then compacted away), so the restart needs snapshot + log.
async fn survives_kill9(oplog: &[&str]) {
    survives_kill9_with(oplog, None).await
}

async fn survives_kill9_with(oplog: &[&str], snapshots: Option<&Path>) {
    let mut args = vec!["master", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
    args.extend_from_slice(oplog);
    let mut master = Proc::start(bin(), &args);
    let (addr, admin) = (master.field("master"), master.field("admin"));
    let _node = ProcCluster::node(bin(), &addr, "64MiB");
    let client = Client::new(ClientConfig::new(addr.clone()));
    let cfg = ReplicateConfig::default();
    for i in 0..OBJECTS {
        client.put_from(&key(i), &value(i), &cfg).await.unwrap_or_else(|e| panic!("put {}: {e}", key(i)));
    }
    if let Some(dir) = snapshots {
        // A snapshot's files land before the snapshotter counts it published: wait for the count.
        let written = || health(&admin).and_then(|h| h["snapshots"]["written"].as_u64()).unwrap_or(0);
        let two = eventually(WAIT, || async { written() >= 2 }).await;
        assert!(two, "/health never showed two snapshots: {:?}", health(&admin));
        assert!(snapshots_in(dir).len() >= 2, "two snapshots in the store: {:?}", snapshots_in(dir));
    }
    for i in (0..OBJECTS).filter(|i| removed(*i)) {
        client.remove(&key(i), true).await.unwrap();
    }
    assert!(eventually(WAIT, || async { all_durable(&admin) }).await, "the log never caught up: {:?}", health(&admin));
    drop(client);
    master.kill9();

    let mut args = vec!["master", "--listen", &addr, "--admin", &admin];
    args.extend_from_slice(oplog);
    let _master = Proc::start(bin(), &args);
    let client = Client::new(ClientConfig::new(addr.clone()));
    // The node finds the master back, is told to remount, and its segment (and objects) come back.
    let first = (0..OBJECTS).find(|i| !removed(*i)).unwrap();
    assert!(
        eventually(WAIT, || async { client.get(&key(first)).await.is_ok() }).await,
        "the node never remounted: {:?}",
        health(&admin)
    );
    for i in 0..OBJECTS {
        let got = client.get(&key(i)).await;
        if removed(i) {
            assert_eq!(got.map(|v| v.len()).unwrap_err().code(), ErrorCode::ObjectNotFound, "{} was removed", key(i));
        } else {
            assert!(got.as_deref().is_ok_and(|v| v == value(i)), "{} differs after the restart", key(i));
        }
    }
    // The restarted master writes on (beside the replayed objects, never over them).
    for i in 0..50 {
        let k = format!("after-{i}");
        client.put_from(&k, &value(i), &cfg).await.unwrap();
        assert_eq!(client.get(&k).await.unwrap(), value(i));
    }
    let h = health(&admin).unwrap();
    // With an oplog a master is a candidate (the only one of an in-process coordinator with --data-dir).
    assert_eq!(h["role"], "leader", "{h}");
    assert_eq!(h["ha"]["promotions"], 1, "{h}");
    assert_eq!(h["keys"].as_u64(), Some((OBJECTS - (0..OBJECTS).filter(|i| removed(*i)).count() + 50) as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_on_a_data_dir_survives_kill9_with_every_object() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().to_str().unwrap().to_owned();
    survives_kill9(&["--data-dir", &dir]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_with_snapshots_survives_kill9_from_snapshot_plus_log() {
    let dir = tempfile::tempdir().unwrap();
    let (data, snaps) = (dir.path().join("data"), dir.path().join("snapshots"));
    let (data, snaps_arg) = (data.to_str().unwrap().to_owned(), snaps.to_str().unwrap().to_owned());
    let flags =
        ["--data-dir", &data, "--snapshot-dir", &snaps_arg, "--snapshot-interval", "300ms", "--snapshot-retain", "2"];
    survives_kill9_with(&flags, Some(&snaps)).await;
    assert!(snapshots_in(&snaps).len() <= 2, "retention keeps 2: {:?}", snapshots_in(&snaps));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_on_etcd_survives_kill9_with_every_object() {
    // A missing etcd binary fails the test: it is never skipped.
    let etcd = crescent_ha::testing::EtcdServer::start().unwrap_or_else(|e| panic!("etcd: {e}"));
    let endpoint = etcd.endpoint();
    let endpoint = endpoint.trim_start_matches("http://").to_owned();
    survives_kill9(&["--etcd", &endpoint, "--cluster-id", "restart-test", "--leader-lease-ttl", "2"]).await;
}

/// The used bytes `/query_segment` reports for `segment` (the original's text), `None` while it cannot say.
fn used_on(admin: &str, segment: &str) -> Option<u64> {
    let (status, body) =
        crescent_testkit::process::admin_get_status(admin, &format!("/query_segment?segment={segment}"))?;
    if status != 200 {
        return None;
    }
    body.lines().find_map(|l| l.strip_prefix("Used(bytes): ")).and_then(|n| n.trim().parse().ok())
}

/// `crescent drain` waited on while its master is killed with SIGKILL midway: the restarted master (same data
/// directory) takes the job over from its log, keeps the node out of placement, and moves the rest; the command
/// waits through the outage (if it asks during it) and reports the end of that same job; every object reads back
/// and nothing is left on the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_waited_on_goes_on_across_a_master_kill9() {
    const N: usize = 6000;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let mut master =
        Proc::start(bin(), &["master", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir", &data]);
    let (addr, admin) = (master.field("master"), master.field("admin"));
    let _nodes = [ProcCluster::node(bin(), &addr, "64MiB"), ProcCluster::node(bin(), &addr, "64MiB")];
    let listed = || {
        crescent_testkit::process::admin_get_status(&admin, "/get_all_segments")
            .map(|(_, body)| body.lines().map(str::to_owned).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert!(eventually(WAIT, || async { listed().len() == 2 }).await, "two nodes: {:?}", listed());
    let drained = listed()[0].clone();
    let client = Client::new(ClientConfig::new(addr.clone()));
    let on = ReplicateConfig { preferred_segments: vec![drained.clone()], ..ReplicateConfig::default() };
    for i in 0..N {
        client.put_from(&key(i), &pattern(1024, i as u64), &on).await.unwrap_or_else(|e| panic!("put {}: {e}", key(i)));
    }
    let full = used_on(&admin, &drained).unwrap();
    assert!(full >= (N * 1024) as u64, "{full}");

    let drain = crescent_testkit::process::spawn(bin(), &addr, &["drain", &drained, "--concurrency", "1"]);
    // Killed once the moves have begun, with more than half of them still to make.
    let begun =
        eventually(WAIT, || async { used_on(&admin, &drained).is_some_and(|u| u < full && u > full / 2) }).await;
    assert!(begun, "the drain never seen between its start and its half: {:?}", used_on(&admin, &drained));
    master.kill9();
    let _master = Proc::start(bin(), &["master", "--listen", &addr, "--admin", &admin, "--data-dir", &data]);
    let out = tokio::task::spawn_blocking(move || drain.wait_with_output().unwrap()).await.unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Whether the command saw the master gone depends on when it asked; the job it follows is the first one.
    assert!(!stderr.contains("no longer knows job"), "the restarted master took the same job over: {stderr}");
    let job = stderr.split("(job ").nth(1).and_then(|s| s.split(')').next()).unwrap();
    let (_, answer) =
        crescent_testkit::process::admin_get_status(&admin, &format!("/api/v1/drain_jobs/query?job_id={job}")).unwrap();
    assert!(answer.contains("\"status_name\":\"SUCCEEDED\""), "{answer}");
    assert!(stdout.contains("drained"), "{stdout}");
    assert_eq!(used_on(&admin, &drained), Some(0), "nothing left on the drained node");
    let status =
        crescent_testkit::process::admin_get_status(&admin, &format!("/api/v1/segments/status?segment={drained}"));
    assert!(status.as_ref().is_some_and(|(_, b)| b.contains("\"DRAINED\"")), "{status:?}");
    for i in 0..N {
        let got = client.get(&key(i)).await.unwrap_or_else(|e| panic!("{}: {e}", key(i)));
        assert!(crescent_testkit::check(&got, 1024, i as u64).is_ok(), "{} differs", key(i));
    }
}
