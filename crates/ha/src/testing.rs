//! Test support (feature `testing`): a real single-member etcd server per test, on free loopback ports with a fresh
//! data directory, stopped and removed on drop. A missing `etcd` binary is an error, never a skip.

use crate::kv::{EtcdKv, EtcdKvConfig, KvError};
pub use etcd_client::AlarmType;
use etcd_client::{AlarmAction, AlarmOptions, CompactionOptions};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the etcd binary is looked for when `CRESCENT_ETCD_BIN` is unset (Debian's `etcd-server`).
pub const DEFAULT_ETCD_BIN: &str = "/usr/bin/etcd";
/// How long a started server gets to report healthy.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Start attempts (a free port can be taken by someone else between probing and etcd binding it).
const START_ATTEMPTS: usize = 3;

/// Why an etcd server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum EtcdStartError {
    /// No etcd binary where expected.
    #[error("etcd binary {0} not found: install Debian's etcd-server or set CRESCENT_ETCD_BIN")]
    MissingBinary(PathBuf),
    /// Spawning or probing failed.
    #[error("etcd: {0}")]
    Io(#[from] std::io::Error),
    /// The server exited or never became healthy.
    #[error("etcd did not become healthy: {0}")]
    NotReady(String),
}

/// A running etcd server, killed and its data directory deleted on drop. [`EtcdServer::stop`] and
/// [`EtcdServer::restart`] take it down and bring it back on the same data directory and ports (an outage).
#[derive(Debug)]
pub struct EtcdServer {
    child: Child,
    client: SocketAddr,
    peer_port: u16,
    bin: PathBuf,
    /// Extra flags, passed again on a restart.
    flags: Vec<String>,
    running: bool,
    _dir: tempfile::TempDir,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

fn etcd_bin() -> PathBuf {
    std::env::var_os("CRESCENT_ETCD_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_ETCD_BIN))
}

/// True when `GET /health` on `addr` answers `{"health":"true"}`.
fn healthy(addr: SocketAddr) -> bool {
    let probe = || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        write!(s, "GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok(body)
    };
    probe().map(|b| b.contains("\"health\":\"true\"")).unwrap_or(false)
}

/// Spawns etcd on `dir/data` with a log at `dir/etcd.log` (appended, so a restart keeps the earlier run's).
fn spawn(
    bin: &PathBuf,
    dir: &std::path::Path,
    client_port: u16,
    peer_port: u16,
    flags: &[String],
) -> std::io::Result<Child> {
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("etcd.log"))?;
    Command::new(bin)
        .arg("--name=test")
        .arg(format!("--data-dir={}", dir.join("data").display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=test={peer_url}"))
        .arg("--initial-cluster-state=new")
        .args(flags)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
}

impl EtcdServer {
    /// Starts a server and waits until it reports healthy.
    pub fn start() -> Result<Self, EtcdStartError> {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line `flags` (kept for restarts), e.g.
    /// `--quota-backend-bytes=4194304`, and waits until it reports healthy.
    pub fn start_with(flags: &[&str]) -> Result<Self, EtcdStartError> {
        let flags: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
        let bin = etcd_bin();
        if !bin.is_file() {
            return Err(EtcdStartError::MissingBinary(bin));
        }
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            match Self::start_once(&bin, &flags)? {
                Ok(server) => return Ok(server),
                Err(why) => last = why,
            }
        }
        Err(EtcdStartError::NotReady(last))
    }

    /// One attempt: `Ok(Err(why))` when this attempt's server died or stalled (retry with new ports).
    fn start_once(bin: &PathBuf, flags: &[String]) -> Result<Result<Self, String>, EtcdStartError> {
        let dir = tempfile::Builder::new().prefix("crescent-etcd-").tempdir()?;
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let child = spawn(bin, dir.path(), client_port, peer_port, flags)?;
        let mut server = Self {
            child,
            client: SocketAddr::from((Ipv4Addr::LOCALHOST, client_port)),
            peer_port,
            bin: bin.clone(),
            flags: flags.to_vec(),
            running: true,
            _dir: dir,
        };
        Ok(server.await_healthy().map(|()| server))
    }

    /// Waits until the server reports healthy; `Ok(Err(why))` when it exited or stalled.
    fn await_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if healthy(self.client) {
                return Ok(());
            }
            match self.child.try_wait() {
                Ok(Some(status)) => return Err(format!("exited with {status}: {}", self.log_tail())),
                Ok(None) => {}
                Err(e) => return Err(format!("wait: {e}")),
            }
            if Instant::now() > deadline {
                return Err(format!("not healthy after {READY_TIMEOUT:?}: {}", self.log_tail()));
            }
            // Polling a readiness probe, not synchronising on time: the loop ends on health or exit.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Takes the server down (SIGKILL, as a crash or a lost host would), keeping its data directory and ports
    /// for [`EtcdServer::restart`].
    pub fn stop(&mut self) {
        self.kill();
    }

    /// Brings a stopped server back on the same data directory and ports and waits until it is healthy (what
    /// was committed before [`EtcdServer::stop`] is still there). Does nothing if it is running.
    pub fn restart(&mut self) -> Result<(), EtcdStartError> {
        if self.running {
            return Ok(());
        }
        self.child = spawn(&self.bin, self._dir.path(), self.client.port(), self.peer_port, &self.flags)?;
        self.running = true;
        self.await_healthy().map_err(EtcdStartError::NotReady)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self._dir.path().join("etcd.log")).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        text.get(start..).unwrap_or_default().to_owned()
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.client)
    }

    /// A backend connected to this server with default settings.
    pub async fn connect(&self) -> Result<EtcdKv, KvError> {
        EtcdKv::connect(EtcdKvConfig::new(vec![self.endpoint()])).await
    }

    /// A maintenance client (alarms, compaction, defragmentation, status).
    pub async fn client(&self) -> Result<etcd_client::Client, etcd_client::Error> {
        etcd_client::Client::connect([self.endpoint()], None).await
    }

    /// The alarms raised now (`Nospace` once a write found the backend quota exceeded).
    pub async fn alarms(&self) -> Result<Vec<AlarmType>, etcd_client::Error> {
        let resp = self.client().await?.alarm(AlarmAction::Get, AlarmType::None, None).await?;
        Ok(resp.alarms().iter().map(|a| a.alarm()).collect())
    }

    /// The backend database's size in bytes (what the quota is checked against).
    pub async fn db_size(&self) -> Result<i64, etcd_client::Error> {
        Ok(self.client().await?.status().await?.db_size())
    }

    /// What an operator does for a full etcd: compact the history up to the current revision (waiting until it
    /// is physically applied), defragment (which gives the freed pages back, shrinking the database), then
    /// disarm every alarm. Returns the database size after defragmentation.
    pub async fn free_space(&self) -> Result<i64, etcd_client::Error> {
        let mut c = self.client().await?;
        // Any read's header names the current revision (reads work under the NOSPACE alarm).
        let revision = c.get("/", None).await?.header().map_or(0, |h| h.revision());
        if revision > 0 {
            match c.compact(revision, Some(CompactionOptions::new().with_physical())).await {
                Ok(_) => {}
                // Compacting again to a revision already compacted is refused ("required revision has been
                // compacted"): nothing more to reclaim from the history.
                Err(etcd_client::Error::GRpcStatus(s)) if s.message().contains("compacted") => {}
                Err(e) => return Err(e),
            }
        }
        c.defragment().await?;
        let size = c.status().await?.db_size();
        for alarm in c.alarm(AlarmAction::Get, AlarmType::None, None).await?.alarms().to_vec() {
            let mut member = AlarmOptions::new();
            member.with_member(alarm.member_id());
            c.alarm(AlarmAction::Deactivate, alarm.alarm(), Some(member)).await?;
        }
        Ok(size)
    }

    /// Stops the server at once (SIGKILL), as a crash would; the data directory stays until drop.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.running = false;
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}
