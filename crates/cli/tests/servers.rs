//! Servers as an operator meets them: the address a node advertises, a node started before its master, the
//! logs servers write, and the CLI's help, version and completions. Each test runs the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_testkit::{Proc, wait_for};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_crescent"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A `crescent` process whose stdout lines and stderr are both captured (as they come), killed when dropped.
struct Spawned {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl Spawned {
    fn start(args: &[&str]) -> Spawned {
        Self::start_env(args, None)
    }

    /// Starts `crescent args…` with `RUST_LOG` set to `rust_log` (unset when `None`).
    fn start_env(args: &[&str], rust_log: Option<&str>) -> Spawned {
        let mut cmd = Command::new(bin());
        match rust_log {
            Some(v) => cmd.env("RUST_LOG", v),
            None => cmd.env_remove("RUST_LOG"),
        };
        let mut child = cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let (tx, stdout) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let (err, sink) = (child.stderr.take().unwrap(), stderr.clone());
        let stderr_reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Spawned { child, stdout, stderr, stderr_reader: Some(stderr_reader) }
    }

    /// The readiness line (JSON), waited for.
    fn ready(&self) -> serde_json::Value {
        let line = self.stdout.recv_timeout(DEADLINE).unwrap_or_else(|_| panic!("not ready: {}", self.stderr()));
        serde_json::from_str(&line).unwrap()
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until stderr contains `needle`.
    fn await_stderr(&self, needle: &str) -> String {
        assert!(wait_for(DEADLINE, || self.stderr().contains(needle)), "no {needle:?} in: {}", self.stderr());
        self.stderr()
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());
    }

    /// Waits (bounded) for the process to exit and for its stderr to be read to the end.
    fn wait_exit(&mut self) -> (std::process::ExitStatus, String) {
        let mut status = None;
        assert!(
            wait_for(DEADLINE, || {
                status = self.child.try_wait().unwrap();
                status.is_some()
            }),
            "still running: {}",
            self.stderr()
        );
        if let Some(t) = self.stderr_reader.take() {
            t.join().unwrap();
        }
        (status.unwrap(), self.stderr())
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn crescent(master: &str, args: &[&str], stdin: &[u8]) -> Output {
    crescent_testkit::process::run(bin(), master, args, stdin)
}

fn master() -> Proc {
    Proc::start(bin(), &["master", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
}

/// Puts a value through the cluster and reads it back; returns where `stat` says its replica lives.
fn round_trip(master: &str, key: &str) -> String {
    let put = crescent(master, &["put", key, "-"], b"value");
    assert!(put.status.success(), "{}", text(&put.stderr));
    assert_eq!(text(&crescent(master, &["get", key], b"").stdout), "value");
    let stat: serde_json::Value =
        serde_json::from_slice(&crescent(master, &["stat", "--json", key], b"").stdout).unwrap();
    stat["replicas"][0]["endpoint"].as_str().unwrap().to_owned()
}

fn node_args<'a>(master: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["node", "--master", master, "--segment-size", "16MiB", "--prefault", "false"];
    args.extend_from_slice(extra);
    args
}

#[test]
fn a_node_on_an_unspecified_address_advertises_one_others_can_reach() {
    let m = master();
    let addr = m.field("master");
    let node = Proc::start(bin(), &node_args(&addr, &["--listen", "0.0.0.0:0", "--insecure"]));
    let endpoint: SocketAddr = node.field("node").parse().unwrap();
    assert!(!endpoint.ip().is_unspecified() && endpoint.port() != 0, "{endpoint}");
    assert_eq!(round_trip(&addr, "k"), endpoint.to_string(), "the master knows the node by its advertised address");

    // A master of its own: the killed node's segment stays registered until its TTL runs out.
    let m = master();
    let addr = m.field("master");
    let node =
        Proc::start(bin(), &node_args(&addr, &["--listen", "0.0.0.0:0", "--advertise", "127.0.0.1", "--insecure"]));
    let endpoint: SocketAddr = node.field("node").parse().unwrap();
    assert_eq!(endpoint.ip().to_string(), "127.0.0.1");
    assert_ne!(endpoint.port(), 0);
    assert_eq!(round_trip(&addr, "k2"), endpoint.to_string());
}

#[test]
fn a_master_on_an_unspecified_address_advertises_a_concrete_one() {
    let m = Proc::start(
        bin(),
        &["master", "--listen", "0.0.0.0:0", "--admin", "127.0.0.1:0", "--advertise", "127.0.0.1", "--insecure"],
    );
    let addr: SocketAddr = m.field("master").parse().unwrap();
    assert_eq!(addr.ip().to_string(), "127.0.0.1");
    let m = Proc::start(bin(), &["master", "--listen", "0.0.0.0:0", "--admin", "127.0.0.1:0", "--insecure"]);
    let addr: SocketAddr = m.field("master").parse().unwrap();
    assert!(!addr.ip().is_unspecified(), "{addr}");
}

/// A port nothing listens on (the OS picked it for a socket just closed).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn a_node_started_before_its_master_waits_for_it() {
    let addr = format!("127.0.0.1:{}", free_port());
    let node = Spawned::start(&node_args(&addr, &[]));
    let err = node.await_stderr(&format!("master {addr} not reachable ("));
    assert!(err.contains("retrying in 100ms"), "{err}");
    assert!(err.contains(" WARN "), "said at warn level: {err}");
    let _m = Proc::start(bin(), &["master", "--listen", &addr, "--admin", "127.0.0.1:0"]);
    let endpoint = node.ready()["node"].as_str().unwrap().to_owned();
    assert_eq!(round_trip(&addr, "k"), endpoint);
}

#[test]
fn a_signal_ends_a_node_waiting_for_its_master_cleanly() {
    let addr = format!("127.0.0.1:{}", free_port());
    for sig in ["-TERM", "-INT"] {
        let mut node = Spawned::start(&node_args(&addr, &[]));
        node.await_stderr("not reachable");
        node.signal(sig);
        let (status, err) = node.wait_exit();
        assert!(status.success(), "{sig}: {status:?} {err}");
        assert!(err.contains("node stopping before it mounted"), "{err}");
    }
}

#[test]
fn servers_log_their_config_and_lifecycle_at_info_and_json_logs_parse() {
    let mut m = Spawned::start(&["master", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]);
    let addr = m.ready()["master"].as_str().unwrap().to_owned();
    let err = m.await_stderr("master listening on ");
    assert!(err.contains("lease_ttl_ms: 10000") && err.contains("placement_policy: Random"), "{err}");
    let node = Proc::start(bin(), &node_args(&addr, &[]));
    m.await_stderr("client joined");
    m.await_stderr(&format!("segment mounted: 16.0 MiB at {}", node.field("node")));
    // A client command's stderr stays clean at its default level.
    let put = crescent(&addr, &["put", "k", "-"], b"v");
    assert!(put.status.success() && put.stderr.is_empty(), "{}", text(&put.stderr));
    drop(node);
    m.signal("-TERM");
    let (status, err) = m.wait_exit();
    assert!(status.success() && err.contains("master stopped"), "{err}");

    let mut m =
        Spawned::start(&["master", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--log-format", "json"]);
    m.ready();
    m.signal("-TERM");
    let (_, err) = m.wait_exit();
    let lines: Vec<serde_json::Value> = err.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.iter().any(|l| l["level"] == "INFO"
        && l["fields"]["message"].as_str().is_some_and(|m| m.starts_with("master listening on "))));

    // The flag wins over RUST_LOG: at warn, none of the info lines.
    let mut m = Spawned::start_env(
        &["master", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--log-level", "warn"],
        Some("info"),
    );
    m.ready();
    m.signal("-TERM");
    let (_, err) = m.wait_exit();
    assert!(!err.contains("master listening"), "{err}");
}

#[test]
fn eviction_rounds_are_logged_as_a_summary() {
    let up = Spawned::start(&[
        "up",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--segment-size",
        "16MiB",
        "--prefault",
        "false",
        "--eviction-high-watermark",
        "0.1",
    ]);
    let addr = up.ready()["master"].as_str().unwrap().to_owned();
    // Two 1 MiB objects hold 12.5 % of the segment, over the 10 % watermark: the older goes.
    for key in ["older", "newer"] {
        let put = crescent(&addr, &["put", key, "-"], &vec![1u8; 1 << 20]);
        assert!(put.status.success(), "{}", text(&put.stderr));
    }
    let err = up.await_stderr("eviction: 1 object, 1.0 MiB in ");
    assert!(err.contains("; memory 12.5 % used before"), "{err}");
}

#[test]
fn help_shows_defaults_and_only_the_flags_a_command_uses() {
    let help = |args: &[&str]| text(&Command::new(bin()).args(args).output().unwrap().stdout);
    let master = help(&["master", "--help"]);
    for default in
        ["[default: 127.0.0.1:50051]", "[default: 10000]", "[default: 0.9]", "[default: 0.05]", "[default: random]"]
    {
        assert!(master.contains(default), "no {default} in {master}");
    }
    for flag in ["--nof-heartbeat-interval-ms", "--nof-probe-timeout-ms", "--nof-heartbeat-failures"] {
        assert!(master.contains(flag), "no {flag} in {master}");
    }
    assert!(!master.contains("--master") && !master.contains("--tenant"), "{master}");
    let node = help(&["node", "--help"]);
    for shown in ["--master", "[default: 1GiB]", "[default: 127.0.0.1:0]", "--advertise", "[default: true]"] {
        assert!(node.contains(shown), "no {shown} in {node}");
    }
    assert!(!node.contains("--tenant"), "{node}");
    let up = help(&["up", "--help"]);
    for flag in ["--prefault", "--memfd", "--segments", "--host-id", "--segment-size"] {
        assert!(up.contains(flag), "no {flag} in {up}");
    }
    assert!(!up.contains("--master ") && !up.contains("--tenant"), "{up}");
    for cmd in ["put", "get", "rm", "ls", "stat", "bench"] {
        let h = help(&[cmd, "--help"]);
        assert!(h.contains("--master") && h.contains("--tenant") && h.contains("--log-level"), "{cmd}: {h}");
    }
}

#[test]
fn version_names_the_commit_and_profile() {
    let version = text(&Command::new(bin()).arg("--version").output().unwrap().stdout);
    assert!(version.starts_with(&format!("crescent {} (commit ", env!("CARGO_PKG_VERSION"))), "{version}");
    let head = Command::new("git").args(["rev-parse", "--short=7", "HEAD"]).output().unwrap();
    if head.status.success() {
        let head = text(&head.stdout);
        assert!(version.contains(&format!("commit {}, ", head.trim())), "{version} is not HEAD {head}");
    }
    let profile = if cfg!(debug_assertions) { "debug)" } else { "release)" };
    assert!(version.trim_end().ends_with(profile), "{version}");
}

#[test]
fn completions_are_printed_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(bin()).args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(script.contains("crescent") && script.contains("put") && script.contains("segment-size"), "{shell}");
    }
    assert!(!Command::new(bin()).args(["completions", "cmd.exe"]).output().unwrap().status.success());
}
