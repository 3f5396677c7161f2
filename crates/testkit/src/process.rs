//! `crescent` processes: a master and nodes as a user runs them. Every server listens on port 0 and prints
//! one JSON line with its addresses once ready; [`Proc::start`] waits for that line.

use crescent_client::{Client, ClientConfig};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a process may take to report readiness.
const READY: Duration = Duration::from_secs(60);

/// A `crescent` process, killed when dropped.
pub struct Proc {
    child: Child,
    ready: serde_json::Value,
}

impl Proc {
    /// Starts `bin args…` and waits (bounded) for its one-line JSON readiness report.
    pub fn start(bin: &Path, args: &[&str]) -> Proc {
        let mut child = Command::new(bin)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let ready = rx
            .recv_timeout(READY)
            .map_err(|_| "no readiness report".to_owned())
            .and_then(|line| serde_json::from_str(line.trim()).map_err(|e| format!("bad ready line {line:?}: {e}")));
        match ready {
            Ok(ready) => Proc { child, ready },
            Err(why) => {
                // Not left running behind the failed test.
                let _ = child.kill();
                let _ = child.wait();
                panic!("{args:?}: {why}");
            }
        }
    }

    /// A field of the readiness report (e.g. `master`, `admin`, `node`).
    pub fn field(&self, name: &str) -> String {
        self.ready[name].as_str().unwrap_or_else(|| panic!("no {name:?} in {}", self.ready)).to_owned()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (bounded) for the process to exit by itself; `None` if it is still running at the deadline.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if start.elapsed() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Stops process `pid` with SIGSTOP and returns once every one of its threads has stopped. `kill` returns as
/// soon as the signal is queued; the group stop reaches the process's threads only as each is next scheduled, and
/// on a loaded host a thread can run on for milliseconds meanwhile: long enough to answer a request a test
/// sends to the "stopped" process.
pub fn stop(pid: u32) {
    signal(pid, "-STOP");
    let start = Instant::now();
    while !all_threads_stopped(pid) {
        assert!(start.elapsed() < READY, "process {pid} did not stop within {READY:?} of SIGSTOP");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Resumes process `pid` (SIGCONT) after [`stop`].
pub fn resume(pid: u32) {
    signal(pid, "-CONT");
}

/// Sends `sig` (`-STOP`, `-CONT`, …) to process `pid`.
fn signal(pid: u32, sig: &str) {
    let sent = Command::new("kill").args([sig, &pid.to_string()]).status();
    assert!(sent.as_ref().is_ok_and(|s| s.success()), "kill {sig} {pid}: {sent:?}");
}

/// Whether every thread of `pid` is in the stopped state (`T` in `/proc/PID/task/TID/stat`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses and may itself hold any character.
        stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()) == Some('T')
    })
}

/// A `crescent master --etcd` candidate of `cluster` on free loopback ports, with a 2 s leader lease (so a
/// takeover comes quickly in tests).
pub fn candidate(bin: &Path, etcd: &str, cluster: &str) -> Proc {
    let args = ["master", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--etcd", etcd, "--cluster-id"];
    let mut args = args.to_vec();
    args.extend_from_slice(&[cluster, "--leader-lease-ttl", "2"]);
    Proc::start(bin, &args)
}

/// A `crescent master` and `crescent node` processes.
pub struct ProcCluster {
    /// The master process.
    pub master: Proc,
    /// The node processes, in start order.
    pub nodes: Vec<Proc>,
}

impl ProcCluster {
    /// A master (with `master_args` added) and `nodes` nodes of one `segment` segment each (e.g. "64MiB").
    pub fn start(bin: &Path, master_args: &[&str], nodes: usize, segment: &str) -> ProcCluster {
        let mut args = vec!["master", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
        args.extend_from_slice(master_args);
        let master = Proc::start(bin, &args);
        let addr = master.field("master");
        let nodes = (0..nodes).map(|_| Self::node(bin, &addr, segment)).collect();
        ProcCluster { master, nodes }
    }

    /// Starts one more node process for the master at `addr`.
    pub fn node(bin: &Path, addr: &str, segment: &str) -> Proc {
        Proc::start(bin, &["node", "--master", addr, "--listen", "127.0.0.1:0", "--segment-size", segment])
    }

    /// The master's RPC address.
    pub fn addr(&self) -> String {
        self.master.field("master")
    }

    /// A fresh client of this cluster.
    pub fn client(&self) -> Client {
        Client::new(ClientConfig::new(self.addr()))
    }
}

/// Runs `bin args…` to completion against the master at `master` (`CRESCENT_MASTER`), with `stdin` as its
/// input and `RUST_LOG` unset (so its stderr holds only what it says to a user); returns its output.
pub fn run(bin: &Path, master: &str, args: &[&str], stdin: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = spawn(bin, master, args);
    if let Some(mut input) = child.stdin.take() {
        // A command that exits before reading its input closes the pipe: that is its answer, not an error.
        let _ = input.write_all(stdin);
    }
    child.wait_with_output().unwrap_or_else(|e| panic!("wait {}: {e}", bin.display()))
}

/// Starts `bin args…` against the master at `master` (`CRESCENT_MASTER`), `RUST_LOG` unset, with stdin, stdout
/// and stderr piped; the caller feeds, waits and reads.
pub fn spawn(bin: &Path, master: &str, args: &[&str]) -> std::process::Child {
    Command::new(bin)
        .args(args)
        .env("CRESCENT_MASTER", master)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()))
}

/// The body of `GET path` on the admin server at `addr` (HTTP/1.1, one connection); `None` when it fails.
fn admin_get(addr: &str, path: &str) -> Option<String> {
    admin_get_status(addr, path).map(|(_, body)| body)
}

/// The status and body of `GET path` on the admin server at `addr` (one connection, a body of known length);
/// `None` when it fails.
pub fn admin_get_status(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// `/health` of the admin server at `addr`, parsed; `None` while it does not answer with JSON.
pub fn health(addr: &str) -> Option<serde_json::Value> {
    serde_json::from_str(&admin_get(addr, "/health")?).ok()
}

/// The value of the unlabelled series `name` in `/metrics` of the admin server at `addr`.
pub fn metric(addr: &str, name: &str) -> Option<f64> {
    let text = admin_get(addr, "/metrics")?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Whether everything the master whose admin server is at `admin` committed to its oplog is durable.
pub fn all_durable(admin: &str) -> bool {
    health(admin).is_some_and(|h| {
        let o = &h["oplog"];
        o["state"] == "accepting"
            && o["waiting"] == 0
            && o["durable_seq"].as_u64().map(|d| d + 1) == o["next_seq"].as_u64()
    })
}
