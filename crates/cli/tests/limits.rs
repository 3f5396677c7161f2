//! No connection can pin a server's memory, descriptors or threads: a master and storage nodes run as real
//! `crescent` processes (some under a 1 024 open-file limit), attacked over loopback TCP the way an
//! unauthenticated peer can: large frames announced and stalled, connection floods, idle connections holding
//! descriptors, hellos and requests that break the protocol. Each test measures the real process
//! (`/proc/PID/status` VmRSS, `/proc/PID/stat` CPU time, its log lines).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_client::{Client, ClientConfig};
use crescent_proto::ErrorCode;
use crescent_proto::wire::{Envelope, ErrorFrame, Frame, Head, Hello, HelloReply, PeerRole};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_crescent"))
}

/// A `crescent` server process (killed when dropped) whose stderr lines are counted as they come.
struct Server {
    child: Child,
    ready: serde_json::Value,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `crescent args…`, under an open-file limit of `nofile` if given, and waits for its readiness line.
    fn start(args: &[&str], nofile: Option<u64>) -> Server {
        let mut cmd = match nofile {
            // The limit is the child's alone: the shell sets it, then becomes the server.
            Some(n) => {
                let mut c = Command::new("sh");
                c.arg("-c").arg(format!("ulimit -n {n} && exec \"$0\" \"$@\"")).arg(bin());
                c
            }
            None => Command::new(bin()),
        };
        let mut child =
            cmd.args(args).env("RUST_LOG", "info").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (err, sink) = (child.stderr.take().unwrap(), stderr.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let ready = serde_json::from_str(line.trim())
            .unwrap_or_else(|_| panic!("{args:?} not ready: {:?}", stderr.lock().unwrap()));
        Server { child, ready, stderr }
    }

    fn field(&self, name: &str) -> String {
        self.ready[name].as_str().unwrap().to_owned()
    }

    fn status_field(&self, name: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Resident memory in MiB.
    fn rss_mib(&self) -> u64 {
        self.status_field("VmRSS:") / 1024
    }

    /// User + system CPU time so far (`/proc/PID/stat` counts in USER_HZ, 100 per second on Linux).
    fn cpu(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        Duration::from_millis(ticks * 10)
    }

    fn log_lines(&self) -> usize {
        self.stderr.lock().unwrap().len()
    }

    fn log_since(&self, from: usize) -> Vec<String> {
        self.stderr.lock().unwrap()[from..].to_vec()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A master on a free loopback port, under an open-file limit of `nofile` if given.
fn master(extra: &[&str], nofile: Option<u64>) -> Server {
    let mut args = vec!["master", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    Server::start(&args, nofile)
}

/// A storage node of the master at `addr`, under an open-file limit of `nofile` if given.
fn node(addr: &str, extra: &[&str], nofile: Option<u64>) -> Server {
    let mut args = vec!["node", "--master", addr, "--listen", "127.0.0.1:0", "--segment-size", "16MiB"];
    args.extend_from_slice(&["--prefault", "false"]);
    args.extend_from_slice(extra);
    Server::start(&args, nofile)
}

/// Raises this test process's own open-file limit to its hard limit; fails the test loudly when that cannot
/// hold `need` (a test that cannot run its scenario must not pass silently).
fn fds_for(need: u64) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    let _ = setrlimit(Resource::Nofile, rustix::process::Rlimit { current: Some(hard.min(1 << 20)), ..limit });
    let ok = getrlimit(Resource::Nofile).current.is_none_or(|n| n >= need);
    assert!(ok, "this test needs {need} open files and the hard limit is {hard}: raise it (ulimit -Hn)");
}

/// A connection to `addr` with a small send buffer (so a stalled peer's bytes queue in the server's socket,
/// or in the server, rather than in this process's kernel buffers).
async fn connect(addr: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_send_buffer_size(256 << 10).unwrap();
    socket.connect(addr.parse().unwrap()).await.unwrap()
}

/// `id` and `body` as a frame's bytes, with `payload` bytes of payload.
fn frame_bytes<T: serde::Serialize>(id: u64, body: &T, payload: &[u8]) -> Vec<u8> {
    let mut out = Head::encode(id, body, payload.len()).unwrap().as_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// Reads one frame's header as `T` (bounded in time); `what` names the server in a failure.
async fn read_frame<T: serde::de::DeserializeOwned>(s: &mut TcpStream, what: &str) -> Envelope<T> {
    let frame = tokio::time::timeout(Duration::from_secs(10), async {
        let mut prefix = [0u8; 8];
        s.read_exact(&mut prefix).await.unwrap();
        let len = u32::from_be_bytes(prefix[..4].try_into().unwrap()) as usize;
        let mut rest = vec![0u8; len - 4];
        s.read_exact(&mut rest).await.unwrap();
        let header_len = u32::from_be_bytes(prefix[4..].try_into().unwrap()) as usize;
        Frame { header: rest[..header_len].to_vec().into(), payload: Default::default() }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: no frame within 10 s"));
    frame.decode().unwrap_or_else(|e| {
        panic!("{what} answered with another message than expected ({e}), under id {:?}", frame.request_id())
    })
}

/// Whether the peer closed `s` (end of stream or reset) within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut sink = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// The issue's first scenario: 64 connections say hello, announce a 16 MiB frame (the control plane's
/// limit), send all of it but the last byte and stall. Before: the master buffered every one of them
/// (RSS 10 MB → 1.06 GB, ~590 MB still held after they closed) and never closed them. Now a connection
/// holds at most a small allowance of its own, larger frames only within a shared budget (32 MiB), read
/// into memory unmapped with the frame, and every started frame must finish within the frame deadline
/// (10 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_large_frames_cannot_pin_the_masters_memory() {
    const CONNECTIONS: usize = 64;
    const FRAME: usize = 16 << 20;
    const DEADLINE: Duration = Duration::from_secs(10);
    let m = master(&[], None);
    let addr = m.field("master");
    let before = m.rss_mib();
    // The prefix announces a frame of exactly the limit; the body stops one byte short.
    let mut stalled = (FRAME as u32).to_be_bytes().to_vec();
    stalled.extend_from_slice(&8u32.to_be_bytes());
    stalled.resize(4 + FRAME - 1, 1);
    let stalled = Arc::new(stalled);
    let mut attackers = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut s = connect(&addr).await;
        crescent_net::hello::open(&mut s, crescent_net::auth::Plane::Control, PeerRole::Client, None, None)
            .await
            .unwrap();
        let bytes = stalled.clone();
        attackers.push(tokio::spawn(async move {
            let started = Instant::now();
            // The write ends when the server has read it all, or fails when the server closes.
            let _ = s.write_all(&bytes).await;
            assert!(closed_within(&mut s, Duration::from_secs(60)).await, "never closed");
            started.elapsed()
        }));
    }
    // RSS sampled until every stalled connection is closed (or it passes the bound: no need to wait then).
    let mut peak = m.rss_mib();
    let start = Instant::now();
    while attackers.iter().any(|a| !a.is_finished()) && peak < 100 && start.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        peak = peak.max(m.rss_mib());
    }
    assert!(peak < 100, "master RSS reached {peak} MiB (from {before} MiB) under {CONNECTIONS} stalled 16 MiB frames");
    let mut lived = Vec::new();
    for a in attackers {
        lived.push(a.await.unwrap());
    }
    let (first, last) = (lived.iter().min().unwrap(), lived.iter().max().unwrap());
    assert!(*first >= DEADLINE - Duration::from_millis(500), "a connection was closed before the deadline: {first:?}");
    assert!(*last < DEADLINE + Duration::from_secs(8), "a stalled connection lived {last:?}");
    let after = m.rss_mib();
    assert!(after < 100, "master RSS {after} MiB after the connections closed");
    // A normal request is served.
    let client = Client::new(ClientConfig::new(addr.clone()));
    assert!(!client.is_exist("k").await.unwrap());
    eprintln!(
        "{CONNECTIONS} stalled 16 MiB frames: master RSS {before} MiB before, peak {peak} MiB, {after} MiB after; \
         closed after {first:?}..{last:?}"
    );
}

/// The issue's second scenario, the master under a 1 024 open-file limit and a flood of 2 000 connections
/// that say hello and then idle. Before: accepts failed with EMFILE, the loop warned ~100 times a second
/// for as long as the flood held (and spun at ~107 % CPU writing millions of lines before its back-off), and
/// a put waited for the flood to end (11 s; 30 s and a failure when the flood said hello). Now the cap fits
/// under the limit (896), a newcomer closes the longest-idle connection to get in, each warning is said at
/// most once a second, and requests are served during the flood and at once after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_under_a_low_fd_limit_neither_spins_nor_shuts_out_requests() {
    const FLOOD: usize = 2000;
    fds_for(FLOOD as u64 + 200);
    let m = master(&[], Some(1024));
    let addr = m.field("master");
    let _node = node(&addr, &[], None);
    let client = Client::new(ClientConfig::new(addr.clone()));
    client.put("warm", b"v").await.unwrap();
    let (cpu0, logs0, t0) = (m.cpu(), m.log_lines(), Instant::now());
    // The flood: every connection at once (a connect the server leaves in its backlog may wait long).
    let hello = frame_bytes(0, &Hello::new(PeerRole::Client, None), &[]);
    let connected = Arc::new(AtomicUsize::new(0));
    let mut flood = Vec::new();
    for _ in 0..FLOOD {
        let (addr, hello, connected) = (addr.clone(), hello.clone(), connected.clone());
        flood.push(tokio::spawn(async move {
            let mut s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(&addr)).await.ok()?.ok()?;
            connected.fetch_add(1, Ordering::Relaxed);
            s.write_all(&hello).await.ok()?;
            Some(s)
        }));
    }
    let mut flood_streams = Vec::new();
    for f in flood {
        flood_streams.push(f.await.unwrap());
    }
    // Puts while the flood holds its connections: from a client already connected, and from a fresh one
    // (new connections, like a `crescent put` process).
    let during = tokio::time::timeout(Duration::from_secs(10), client.put("during", b"v")).await;
    assert!(matches!(during, Ok(Ok(()))), "put from a connected client during the flood: {during:?}");
    let t = Instant::now();
    let fresh = Client::new(ClientConfig::new(addr.clone()));
    let during = tokio::time::timeout(Duration::from_secs(10), fresh.put("during-fresh", b"v")).await;
    let during_latency = t.elapsed();
    assert!(
        matches!(during, Ok(Ok(()))),
        "put from a new client during the flood: {during:?} after {during_latency:?}"
    );
    // Hold the flood a while longer, then measure.
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(t0.elapsed())).await;
    let (cpu, held) = (m.cpu() - cpu0, t0.elapsed());
    let lines = m.log_since(logs0);
    drop(flood_streams);
    // A fresh client (new connections) right after the flood ends.
    let t = Instant::now();
    let after = Client::new(ClientConfig::new(addr.clone()));
    let put = tokio::time::timeout(Duration::from_secs(10), after.put("after", b"v")).await;
    let after_latency = t.elapsed();
    assert!(matches!(put, Ok(Ok(()))), "put after the flood: {put:?}");
    let cpu_share = cpu.as_secs_f64() / held.as_secs_f64();
    eprintln!(
        "flood of {FLOOD} ({} connected) for {held:?}: master CPU {:.0} %, {} log lines, put during {during_latency:?}, \
         after {after_latency:?}",
        connected.load(Ordering::Relaxed),
        cpu_share * 100.0,
        lines.len()
    );
    assert!(cpu_share < 0.5, "master CPU {:.0} % during the flood", cpu_share * 100.0);
    // Rate-limited: a few lines a second at most (the cap warning, once a second with a count).
    assert!(
        lines.len() <= 3 * held.as_secs() as usize + 4,
        "{} log lines in {held:?}: {:#?}",
        lines.len(),
        &lines[..lines.len().min(20)]
    );
    assert!(after_latency < Duration::from_secs(1), "put after the flood took {after_latency:?}");
    assert!(during_latency < Duration::from_secs(2), "put during the flood took {during_latency:?}");
}

/// The issue's node scenario: a storage node under a 1 024 open-file limit with 1 100 connections that said
/// hello and idle (as pooled lanes do). Before: the node could accept nothing more and a put timed out after
/// 5 s. Now the newcomer closes the longest-idle connection and the put is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serves_transfers_while_idle_connections_hold_its_descriptors() {
    const IDLE: usize = 1100;
    fds_for(IDLE as u64 + 200);
    let m = master(&[], None);
    let addr = m.field("master");
    let n = node(&addr, &[], Some(1024));
    let endpoint = n.field("node");
    let client = Client::new(ClientConfig::new(addr.clone()));
    client.put("warm", b"v").await.unwrap();
    let mut idle = Vec::new();
    for _ in 0..IDLE {
        let endpoint = endpoint.clone();
        idle.push(tokio::spawn(async move {
            let mut s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(&endpoint)).await.ok()?.ok()?;
            tokio::time::timeout(
                Duration::from_secs(5),
                crescent_net::hello::open(&mut s, crescent_net::auth::Plane::Control, PeerRole::Client, None, None),
            )
            .await
            .ok()?
            .ok()?;
            Some(s)
        }));
    }
    let mut held = Vec::new();
    for i in idle {
        held.push(i.await.unwrap());
    }
    let established = held.iter().filter(|s| s.is_some()).count();
    // A fresh client: its lane to the node is a new connection.
    let fresh = Client::new(ClientConfig::new(addr.clone()));
    let t = Instant::now();
    let put = tokio::time::timeout(Duration::from_secs(10), fresh.put("k", &vec![7u8; 1 << 20])).await;
    let latency = t.elapsed();
    assert!(
        matches!(put, Ok(Ok(()))),
        "put with {established} idle connections on the node: {put:?} after {latency:?}"
    );
    assert_eq!(fresh.get("k").await.unwrap(), vec![7u8; 1 << 20]);
    eprintln!("{IDLE} idle connections ({established} said hello): put served in {latency:?}");
    assert!(latency < Duration::from_secs(2), "put took {latency:?}");
    drop(held);
}

/// The issue's third item: a hello that carries a payload, and a request under the hello's reserved id 0,
/// are refused by the master as they are by a storage node: an error frame under id 0 saying why, then the
/// connection closes. Before: the master answered a request under id 0 like any other and kept the
/// connection (a reply under id 0 reads as a connection error to a client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_refuses_a_hello_with_a_payload_and_requests_under_id_0_like_a_node() {
    let m = master(&[], None);
    let n = node(&m.field("master"), &[], None);
    for (server, addr) in [("master", m.field("master")), ("node", n.field("node"))] {
        // A hello with a payload.
        let mut s = connect(&addr).await;
        s.write_all(&frame_bytes(0, &Hello::new(PeerRole::Client, None), b"extra")).await.unwrap();
        let reply = read_frame::<HelloReply>(&mut s, server).await;
        let refusal = reply.body.unwrap_err();
        assert_eq!((reply.id, refusal.code), (0, ErrorCode::InvalidParams), "{server}");
        assert!(refusal.message.contains("hello carries a payload"), "{server}: {}", refusal.message);
        assert!(closed_within(&mut s, Duration::from_secs(5)).await, "{server} kept the connection");

        // A request under id 0 after a good hello.
        let mut s = connect(&addr).await;
        crescent_net::hello::open(&mut s, crescent_net::auth::Plane::Control, PeerRole::Client, None, None)
            .await
            .unwrap();
        let request = if server == "master" {
            frame_bytes(0, &crescent_proto::MasterRequest::ClusterInfo, &[])
        } else {
            let read = crescent_proto::transfer::TransferRequest::Read {
                segment: crescent_proto::SegmentId::random(),
                offset: 0,
                length: 1,
                grant: None,
            };
            frame_bytes(0, &read, &[])
        };
        s.write_all(&request).await.unwrap();
        let reply = read_frame::<ErrorFrame>(&mut s, server).await;
        assert_eq!((reply.id, reply.body.code), (0, ErrorCode::InvalidParams), "{server}: {:?}", reply.body);
        assert!(reply.body.message.contains("request id 0 is reserved"), "{server}: {}", reply.body.message);
        assert!(closed_within(&mut s, Duration::from_secs(5)).await, "{server} kept the connection");
    }
}

/// The cap's two answers, on a master capped at 2 connections: idle connections make room for a newcomer
/// (the longest-idle is closed); connections that are all busy (each mid-frame) get a newcomer refused with
/// `UNAVAILABLE_IN_CURRENT_STATUS` and the cap in words, and once the deadline cuts them, requests are
/// served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_idle_connections_make_room_and_busy_ones_get_a_clear_refusal() {
    // The frame deadline leaves the busy phase below time to make its checks on a loaded machine (at 1.5 s the
    // deadline once cut a busy connection before the newcomer's request, under the whole suite on 2 CPUs).
    let m = master(&["--max-connections", "2", "--frame-timeout-ms", "4000"], None);
    let addr = m.field("master");
    // Two idle connections: a newcomer gets in, and one of them goes for it (the older one, unless the
    // server has not yet marked the newer one as past its hello: one that owes its hello goes first).
    let mut older = connect(&addr).await;
    crescent_net::hello::open(&mut older, crescent_net::auth::Plane::Control, PeerRole::Client, None, None)
        .await
        .unwrap();
    let mut newer = connect(&addr).await;
    crescent_net::hello::open(&mut newer, crescent_net::auth::Plane::Control, PeerRole::Client, None, None)
        .await
        .unwrap();
    let client = Client::new(ClientConfig::new(addr.clone()));
    // Retried only while a connection is between its hello reply and its first wait (marked busy then).
    let started = Instant::now();
    while let Err(e) = client.is_exist("k").await {
        assert!(started.elapsed() < Duration::from_secs(5), "the newcomer was not served: {e}");
    }
    tokio::select! {
        _ = closed_within(&mut older, Duration::from_secs(5)) => {}
        _ = closed_within(&mut newer, Duration::from_secs(5)) => {}
    }
    let (older_open, newer_open) = (
        !closed_within(&mut older, Duration::from_millis(50)).await,
        !closed_within(&mut newer, Duration::from_millis(50)).await,
    );
    assert!(older_open != newer_open, "one idle connection made room (older open {older_open}, newer {newer_open})");
    drop(client);
    drop((older, newer));

    // Two busy connections: each has started a frame and stalls.
    let mut busy = Vec::new();
    for _ in 0..2 {
        // The server may still be closing the idle connections above, and refuse a hello meanwhile.
        let started = Instant::now();
        let mut s = loop {
            let mut s = connect(&addr).await;
            match crescent_net::hello::open(&mut s, crescent_net::auth::Plane::Control, PeerRole::Client, None, None)
                .await
            {
                Ok(_) => break s,
                Err(crescent_net::hello::HandshakeError::Refused(_)) if started.elapsed() < Duration::from_secs(5) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => panic!("busy connection's hello: {e:?}"),
            }
        };
        s.write_all(&[0, 0, 1, 0, 0]).await.unwrap();
        busy.push(s);
    }
    // The server may still be closing the idle connections above: the refusal comes once both busy ones
    // are all it serves.
    let started = Instant::now();
    let refusal = loop {
        let mut s = connect(&addr).await;
        match crescent_net::hello::open(&mut s, crescent_net::auth::Plane::Control, PeerRole::Client, None, None).await
        {
            Err(crescent_net::hello::HandshakeError::Refused(r)) => break r,
            other => assert!(started.elapsed() < Duration::from_secs(1), "not refused: {other:?}"),
        }
    };
    assert_eq!(refusal.code, ErrorCode::UnavailableInCurrentStatus);
    assert!(refusal.message.contains("cap of 2 connections"), "{}", refusal.message);
    let err = Client::new(ClientConfig::new(addr.clone())).is_exist("k").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::UnavailableInCurrentStatus, "{err}");
    // The stalled frames are cut at the deadline; then requests are served.
    for mut s in busy {
        assert!(closed_within(&mut s, Duration::from_secs(8)).await, "a stalled frame outlived the deadline");
    }
    let client = Client::new(ClientConfig::new(addr.clone()));
    assert!(!client.is_exist("k").await.unwrap());
}

/// `GET path` on its own connection (`Connection: close`): the status and the body, within 10 s.
async fn http_get(addr: &str, path: &str) -> (u16, String) {
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        (status, body)
    })
    .await
    .unwrap_or_else(|_| panic!("GET {path}: no answer within 10 s"))
}

/// The value of the metric line starting with `series` (name and labels) in a Prometheus text page.
fn metric(page: &str, series: &str) -> u64 {
    let line = page.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("no {series} in:\n{page}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// The admin HTTP port takes at most 64 connections: a flood of 300 idle connections and a client sending a
/// request's head a byte at a time (slowloris) neither take the master's descriptors nor lock operators out.
/// At the cap a newcomer closes the oldest connection; a head that has not arrived within 10 s is cut. Both
/// accept loops (`rpc`, `admin`) show on `/metrics`. Before: the admin port served every connection for as
/// long as the peer liked, with no cap and no deadline (`axum::serve`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_caps_its_connections_and_cuts_stalled_heads() {
    const FLOOD: usize = 300;
    fds_for(FLOOD as u64 + 256);
    let m = master(&[], None);
    let admin = m.field("admin");
    let mut flood = Vec::new();
    for _ in 0..FLOOD {
        flood.push(TcpStream::connect(&admin).await.unwrap());
    }
    let mut slow = TcpStream::connect(&admin).await.unwrap();
    let slow_since = Instant::now();
    slow.write_all(b"GET /health HTTP/1.1\r\nHo").await.unwrap();
    let started = Instant::now();
    let (status, page) = http_get(&admin, "/metrics").await;
    assert_eq!(status, 200, "{page}");
    assert!(started.elapsed() < Duration::from_secs(1), "/metrics took {:?} behind the flood", started.elapsed());
    assert_eq!(metric(&page, r#"crescent_master_connection_cap{server="admin"}"#), 64);
    // Connections told to make room close as their tasks get to run: open falls to the cap.
    let settled = crescent_testkit::eventually(Duration::from_secs(5), || async {
        metric(&http_get(&admin, "/metrics").await.1, r#"crescent_master_connections_open{server="admin"}"#) <= 64
    })
    .await;
    assert!(settled, "more than 64 admin connections stayed open");
    let shed = metric(&page, r#"crescent_master_connections_shed_total{server="admin"}"#);
    assert!(shed >= (FLOOD + 2 - 64) as u64, "{shed} connections closed to make room");
    assert!(metric(&page, r#"crescent_master_connection_cap{server="rpc"}"#) > 0);
    // The oldest connections were closed to make room; the newest idle ones are still open.
    assert!(closed_within(&mut flood[0], Duration::from_secs(5)).await, "the oldest connection is still open");
    // The stalled head is cut at its deadline (10 s), well before the test's patience.
    assert!(closed_within(&mut slow, Duration::from_secs(20)).await, "a stalled request head held its connection");
    assert!(slow_since.elapsed() >= Duration::from_secs(9), "cut before its deadline: {:?}", slow_since.elapsed());
    let (status, body) = http_get(&admin, "/health").await;
    assert_eq!(status, 200, "{body}");
}
