//! Clients fail fast and honestly: a stopped master costs a request its timeout (and the next master address
//! is tried), a read that outlived its lease reads again, a stalled storage node gives way to another replica,
//! the bench's latency figures count stalled requests, and its metadata phases neither allocate values nor
//! send a batch the protocol refuses. Each test runs real `crescent` processes and stops some with SIGSTOP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_client::Client;
use crescent_proto::{ReplicaDescriptor, ReplicateConfig};
use crescent_testkit::process::{resume, stop};
use crescent_testkit::{Proc, ProcCluster, pattern};
use std::io::Read;
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_crescent"))
}

/// How long a step may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(20);

/// Re-checks `condition` every 10 ms until it holds or `deadline` passes. Sleeps between checks rather than
/// spinning: the processes under test need the CPUs, and their timing is what is measured.
fn poll_until(deadline: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if start.elapsed() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Output read from a pipe so far.
type Captured = Arc<Mutex<Vec<u8>>>;

/// Reads `pipe` into `sink` until it closes, on a thread of its own.
fn capture(mut pipe: impl Read + Send + 'static, sink: Captured) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = pipe.read(&mut buf) {
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    })
}

/// A `crescent` client command run in the background with its output captured, killed when dropped.
struct Running {
    child: Child,
    started: Instant,
    stdout: Captured,
    stderr: Captured,
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// What a finished command did, and how long it took.
struct Finished {
    status: ExitStatus,
    elapsed: Duration,
    stdout: Vec<u8>,
    stderr: String,
}

impl Running {
    /// Starts `crescent args…` against the master at `master`, with `stdin` as its input.
    fn start(master: &str, args: &[&str], stdin: &[u8]) -> Running {
        let mut child = crescent_testkit::process::spawn(bin(), master, args);
        let started = Instant::now();
        {
            use std::io::Write;
            let mut input = child.stdin.take().unwrap();
            let _ = input.write_all(stdin);
        }
        let (stdout, stderr) = (Captured::default(), Captured::default());
        let readers = vec![
            capture(child.stdout.take().unwrap(), stdout.clone()),
            capture(child.stderr.take().unwrap(), stderr.clone()),
        ];
        Running { child, started, stdout, stderr, readers }
    }

    fn stderr(&self) -> String {
        text(&self.stderr.lock().unwrap())
    }

    /// Waits up to `deadline` for the command to exit; `None` (and the command killed) if it did not.
    fn finish(mut self, deadline: Duration) -> Option<Finished> {
        let mut status = None;
        let exited = poll_until(deadline, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        let elapsed = self.started.elapsed();
        if !exited {
            return None;
        }
        for r in self.readers.drain(..) {
            r.join().unwrap();
        }
        Some(Finished {
            status: status.unwrap(),
            elapsed,
            stdout: self.stdout.lock().unwrap().clone(),
            stderr: text(&self.stderr.lock().unwrap()),
        })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `crescent args…` to completion within `deadline`; panics naming the command if it takes longer.
fn run(master: &str, args: &[&str], stdin: &[u8], deadline: Duration) -> Finished {
    Running::start(master, args, stdin)
        .finish(deadline)
        .unwrap_or_else(|| panic!("`crescent {}` still running after {deadline:?}", args.join(" ")))
}

/// The object's state as `crescent stat --json` reports it.
fn stat(master: &str, key: &str) -> serde_json::Value {
    let out = run(master, &["stat", "--json", key], b"", Duration::from_secs(20));
    assert!(out.status.success(), "{}", out.stderr);
    serde_json::from_slice(&out.stdout).unwrap()
}

fn put(master: &str, args: &[&str], value: &[u8]) {
    let mut all = vec!["put"];
    all.extend_from_slice(args);
    let out = run(master, &all, value, Duration::from_secs(20));
    assert!(out.status.success(), "{}", out.stderr);
}

#[test]
fn a_get_against_a_stopped_master_fails_within_the_request_timeout_and_tries_the_next_address() {
    let a = ProcCluster::start(bin(), &[], 1, "16MiB");
    let b = ProcCluster::start(bin(), &[], 1, "16MiB");
    let (stopped, live) = (a.addr(), b.addr());
    put(&stopped, &["k", "-"], b"from-a");
    put(&live, &["k", "-"], b"from-b");
    stop(a.master.pid());

    // The default timeout: 5 s, not the 30 s a get used to wait. The error names the master and the wait.
    let out = run(&stopped, &["get", "k"], b"", Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(out.stderr, format!("RPC_TIMEOUT: cannot reach the master at {stopped}: no answer within 5 s\n"));
    assert!(out.elapsed >= Duration::from_millis(4500) && out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);

    // A timeout of the caller's choosing.
    let out = run(&stopped, &["get", "k", "--request-timeout", "500ms"], b"", Duration::from_secs(20));
    assert_eq!(out.stderr, format!("RPC_TIMEOUT: cannot reach the master at {stopped}: no answer within 500 ms\n"));
    assert!(out.elapsed < Duration::from_secs(3), "{:?}", out.elapsed);

    // Several addresses: the stopped one costs one timeout, then the next answers.
    let both = format!("{stopped},{live}");
    let out = run(&both, &["get", "k", "--request-timeout", "500ms"], b"", Duration::from_secs(20));
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout, b"from-b");
    assert!(out.elapsed < Duration::from_secs(3), "{:?}", out.elapsed);

    // None answers: every address is named with what it did.
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let out = run(&format!("{stopped},{refused}"), &["get", "k", "--request-timeout", "500ms"], b"", DEADLINE);
    assert_eq!(
        out.stderr,
        format!(
            "RPC_TIMEOUT: cannot reach the master at {stopped}, {refused}: {stopped}: no answer within 500 ms; \
             {refused}: connection refused\n"
        )
    );
    // The setting also comes from the config file.
    let dir = std::env::temp_dir().join(format!("crescent-fail-fast-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("c.toml");
    std::fs::write(&config, "[client]\nrequest_timeout = \"300ms\"\n").unwrap();
    let out = run(&stopped, &["get", "k", "--config", config.to_str().unwrap()], b"", DEADLINE);
    assert_eq!(out.stderr, format!("RPC_TIMEOUT: cannot reach the master at {stopped}: no answer within 300 ms\n"));
    std::fs::remove_dir_all(&dir).unwrap();
    resume(a.master.pid());
}

#[test]
fn a_read_that_outlives_its_lease_fetches_the_replica_list_again_instead_of_failing() {
    let c = ProcCluster::start(bin(), &["--lease-ttl-ms", "300"], 1, "16MiB");
    let addr = c.addr();
    let value = pattern(64 << 10, 3);
    put(&addr, &["k", "-"], &value);
    // The node stalls while a reader holds a lease: its read waits past the lease's end.
    stop(c.nodes[0].pid());
    let dir = std::env::temp_dir().join(format!("crescent-lease-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("k.out");
    let get = Running::start(&addr, &["get", "k", "-o", file.to_str().unwrap()], b"");
    assert!(poll_until(DEADLINE, || stat(&addr, "k")["lease_readers"].as_u64() >= Some(1)), "the get took a lease");
    assert!(poll_until(DEADLINE, || stat(&addr, "k")["lease_remaining_ms"] == 0), "the lease ran out");
    resume(c.nodes[0].pid());
    // The late bytes are not trusted: the reader looks the object up again and reads it within a fresh lease.
    let out = get.finish(DEADLINE).expect("the get finishes");
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(std::fs::read(&file).unwrap(), value);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A cluster of two node processes holding `keys` keys of 64 KiB with a replica on each, and a client (default
/// settings) whose lanes to both nodes are open: it has read every key, singly and in a batch.
async fn two_replicas(keys: usize) -> (ProcCluster, Client) {
    let c = ProcCluster::start(bin(), &[], 2, "16MiB");
    let client = c.client();
    for i in 0..keys {
        let value = pattern(64 << 10, i as u64);
        client.put_from(&format!("k{i}"), &value, &ReplicateConfig::with_replicas(2)).await.unwrap();
        assert_eq!(client.get(&format!("k{i}")).await.unwrap(), value);
    }
    let mut bufs = vec![vec![0u8; 64 << 10]; keys];
    let names: Vec<String> = (0..keys).map(|i| format!("k{i}")).collect();
    let mut items: Vec<(&str, &mut [u8])> =
        names.iter().map(String::as_str).zip(bufs.iter_mut().map(|b| &mut b[..])).collect();
    assert!(client.batch_get_into(&mut items).await.iter().all(Result::is_ok));
    (c, client)
}

/// Where a replica lives.
fn endpoint(d: &ReplicaDescriptor) -> String {
    d.location.endpoint().to_owned()
}

/// The node process serving `endpoint`.
fn node_at<'a>(c: &'a ProcCluster, endpoint: &str) -> &'a Proc {
    c.nodes.iter().find(|n| n.field("node") == endpoint).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_from_a_stalled_node_moves_to_another_replica() {
    let (c, client) = two_replicas(1).await;
    // The replica a reader tries first is the first listed: stop its node, with the reader's lane to it open.
    let first = endpoint(&client.stat("k0").await.unwrap().replicas[0]);
    let stalled = node_at(&c, &first);
    stop(stalled.pid());
    let started = Instant::now();
    let got = tokio::time::timeout(DEADLINE, client.get("k0")).await.expect("the read still waits on the stalled node");
    assert_eq!(got.unwrap(), pattern(64 << 10, 0));
    assert!(started.elapsed() < Duration::from_secs(10), "one request timeout (5 s): {:?}", started.elapsed());
    // The reader told the master, which no longer hands the stalled replica out: the next read is quick.
    let started = Instant::now();
    assert_eq!(client.get("k0").await.unwrap(), pattern(64 << 10, 0));
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    resume(stalled.pid());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_read_from_a_stalled_node_moves_every_key_to_another_replica_at_the_cost_of_one_timeout() {
    let keys = 16;
    let (c, client) = two_replicas(keys).await;
    let first = endpoint(&client.stat("k0").await.unwrap().replicas[0]);
    let stalled = node_at(&c, &first);
    stop(stalled.pid());
    let mut bufs = vec![vec![0u8; 64 << 10]; keys];
    let names: Vec<String> = (0..keys).map(|i| format!("k{i}")).collect();
    let mut items: Vec<(&str, &mut [u8])> =
        names.iter().map(String::as_str).zip(bufs.iter_mut().map(|b| &mut b[..])).collect();
    let started = Instant::now();
    let got = tokio::time::timeout(DEADLINE, client.batch_get_into(&mut items))
        .await
        .expect("the batch still waits on the stalled node");
    // Keys whose first replica is on the stalled node wait for its one timeout together, then read the other
    // replica; none waits on the stalled node a second time.
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.as_ref().map_err(ToString::to_string), Ok(&(64 << 10)), "k{i}");
    }
    for (i, b) in bufs.iter().enumerate() {
        assert_eq!(b, &pattern(64 << 10, i as u64), "k{i}");
    }
    resume(stalled.pid());
}

#[test]
fn bench_latencies_count_a_stalled_request_as_the_requests_it_held_up() {
    let c = ProcCluster::start(bin(), &[], 1, "16MiB");
    let addr = c.addr();
    let dir = std::env::temp_dir().join(format!("crescent-bench-stall-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("bench.json");
    let args = ["bench", "--phases", "metadata", "--value-size", "4KiB", "--duration", "3"];
    let mut args = args.to_vec();
    args.extend(["--json", json.to_str().unwrap()]);
    let bench = Running::start(&addr, &args, b"");
    // The phase starts right after the key-set line; a second of it the master does not answer.
    assert!(poll_until(DEADLINE, || bench.stderr().contains("key set:")), "{}", bench.stderr());
    std::thread::sleep(Duration::from_millis(500));
    stop(c.master.pid());
    std::thread::sleep(Duration::from_secs(1));
    resume(c.master.pid());
    let out = bench.finish(Duration::from_secs(30)).expect("the bench finishes");
    assert!(out.status.success(), "{}", out.stderr);
    let r: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&json).unwrap().trim()).unwrap();
    // A third of the phase went by in one request: the requests a client would have sent meanwhile waited
    // up to a second, and they are more than 1 % of the phase's.
    assert!(r["p99_us"].as_u64().unwrap() >= 300_000, "{r}");
    assert!(r["max_us"].as_u64().unwrap() >= 900_000, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The peak resident set of a running process, in KiB (0 once it has exited).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap_or("VmHWM: 0 kB");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[test]
fn a_metadata_bench_allocates_no_values_and_a_batch_over_the_protocol_limit_is_refused_up_front() {
    let c = ProcCluster::start(bin(), &[], 1, "16MiB");
    let addr = c.addr();
    let out = run(&addr, &["bench", "--phases", "metadata", "--batch", "100000", "--count", "1"], b"", DEADLINE);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert_eq!(
        out.stderr,
        "error: INVALID_PARAMS: --batch 100000 exceeds the protocol's limit of 65536 keys per request\n"
    );
    // The largest batch allowed, with values the phase never sends: no batch × value-size buffers (they
    // would be 2 × 65 536 × 4 KiB = 512 MiB).
    let args = ["bench", "--phases", "metadata", "--batch", "65536", "--value-size", "4KiB", "--count", "3"];
    let mut bench = Running::start(&addr, &args, b"");
    let pid = bench.child.id();
    let mut peak = 0;
    // Sampled until it exits (the peak, VmHWM, only grows; it is gone once the process is).
    assert!(poll_until(Duration::from_secs(60), || {
        peak = peak.max(peak_rss_kib(pid));
        bench.child.try_wait().unwrap().is_some()
    }));
    let out = bench.finish(DEADLINE).unwrap();
    assert!(out.status.success(), "{}", out.stderr);
    assert!(!text(&out.stdout).contains("errors:"), "{}", text(&out.stdout));
    assert!(peak > 0 && peak < 200 << 10, "peak RSS {peak} KiB");
    // The library says the same to its callers, for every key, without sending anything.
    let client = crescent_client::BlockingClient::new(crescent_client::ClientConfig::new(addr)).unwrap();
    let keys: Vec<String> = (0..65_537).map(|i| format!("k{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let answers = client.batch_is_exist(&refs);
    assert_eq!(answers.len(), refs.len());
    for a in [&answers[0], &answers[65_536]] {
        let e = a.as_ref().unwrap_err();
        assert_eq!(e.code(), crescent_proto::ErrorCode::InvalidParams);
        assert_eq!(e.to_string(), "a batch of 65537 items exceeds the protocol's limit of 65536 per request");
    }
}
