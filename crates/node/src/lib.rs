//! The storage-node runtime: hosts segments, serves the data plane, mounts at the master, pings every
//! second, remounts by itself when the master answers `NEED_REMOUNT` (e.g. after a master restart, or after a
//! failover: with an `etcd://` master address the node's master connection follows the cluster's leader, and
//! the new leader, which has not heard from the node, answers its next ping `NEED_REMOUNT`), and unmounts on
//! shutdown. With a disk tier (`NodeConfig::disk`) it also hosts a disk segment and makes the copies the master
//! asks for (module `disk`).

mod disk;
mod poll;
mod tasks;

pub use disk::{DiskDevice, DiskSettings};

use crescent_client::ClientError;
use crescent_client::master::MasterConnection;
use crescent_net::auth::CredentialSource;
use crescent_net::host::NodeKeys;
use crescent_net::tls::Tls;
use crescent_proto::human::fmt_bytes;
use crescent_proto::transfer::Attachment;
use crescent_proto::wire::{Batch, ErrorFrame, PeerRole};
use crescent_proto::{
    ClientId, ClientStatus, ErrorCode, MasterRequest, MasterResponse, SegmentId, SegmentKind, SegmentSpec,
};
use crescent_transfer::{SegmentMemory, SegmentRegistry, TransferServer, TransferServerHandle};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};

/// Storage-node settings.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Master address (`host:port[,…]`, or `etcd://HOST:PORT[,…]/CLUSTER` to follow the cluster's leader).
    pub master: String,
    /// Where the transfer server listens (port 0 picks one).
    pub listen: SocketAddr,
    /// The host (IP or name) other hosts reach this node at; `None`: the listen IP, or this host's primary
    /// address when listening on an unspecified one (`0.0.0.0`), which no other host can reach.
    pub advertise: Option<String>,
    /// The name the master places by and lists the node's segments under (preferred segments, replica
    /// descriptors, listings); `None`: the advertised endpoint. A Python store names its segment as the original
    /// does, `local_hostname:port`.
    pub name: Option<String>,
    /// Bytes per segment.
    pub segment_size: u64,
    /// Segments to host.
    pub segments: usize,
    /// Back segments with memfd instead of anonymous memory.
    pub memfd: bool,
    /// This node's host (for local-first placement); defaults to the advertised IP.
    pub host_id: Option<String>,
    /// Liveness ping period.
    pub ping_interval: Duration,
    /// Master request timeout.
    pub rpc_timeout: Duration,
    /// How the segments' memory is backed ahead of the writes (no page-fault stalls on first writes).
    pub prefault: Prefault,
    /// How long an idle data-plane connection polls for its next request before parking (default 0 = never;
    /// see `TransferServer::with_poll_window` for why). Polling all connections at once is a runtime hook
    /// instead: `crescent_net::poll::idle_park_hook`, which `crescent node` installs.
    pub poll_window: Duration,
    /// Retry the first mount while the master cannot be reached (it may start after the node, as under
    /// systemd or Kubernetes); `None` fails at once.
    pub master_retry: Option<Backoff>,
    /// Most data-plane connections served at once (lowered to fit the open-file limit); at the cap the
    /// longest-idle connection is closed to make room (see `TransferServer::with_max_connections`).
    pub max_connections: usize,
    /// How long a peer may take over its hello, over the rest of a frame it started, and to take a reply.
    pub frame_timeout: Duration,
    /// The node's own keys (`crescent_net::host`, from its credential: never the cluster secret): it proves
    /// their credential to the master, admits on its data port only peers proving a ticket the master issued
    /// for it, and moves bytes only under grants sealed for it. `None`: a cluster without authentication.
    pub keys: Option<Arc<NodeKeys>>,
    /// TLS: its server side is what the data port serves (every connection through the handshake before its
    /// hello), its client side what the node dials the master with. Default: none, plain TCP.
    pub tls: Tls,
    /// Serve clients on this host over a Unix socket too (`TransferServer::with_local_lanes`; not with TLS).
    /// Default: on.
    pub local_lanes: bool,
    /// A disk tier on the node's local SSD (evicted objects kept there); `None`: memory only.
    pub disk: Option<DiskSettings>,
    /// The disk tier's device when not the file in `disk.dir` (tests: an in-memory or fault-injecting device).
    pub disk_device: Option<DiskDevice>,
}

/// How a node backs its segments' memory ahead of the writes, on a thread of its own after the mount (the
/// node is ready at once; a write meanwhile faults its own pages, and backing never changes a byte written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefault {
    /// Pages are backed as they are first written.
    Off,
    /// All of it, with transparent huge pages asked for: a storage node, whose host is there to hold it.
    Whole,
    /// What the host can spare — until the memory it calls available falls to an eighth of its total —, with
    /// no huge pages asked for, and only while the segment is hosted: a process contributing memory beside its
    /// own work (a Python store in an inference engine), where backing all of a large segment could take memory
    /// the work needs, and where asking for huge pages makes the kernel compact memory at the faults of the
    /// writes running beside it.
    Spare,
}

impl std::fmt::Display for Prefault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Prefault::Off => "off",
            Prefault::Whole => "whole",
            Prefault::Spare => "what the host spares",
        })
    }
}

/// Delays between attempts: `initial`, doubling up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay.
    pub initial: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Default for Backoff {
    /// 100 ms doubling to 5 s.
    fn default() -> Self {
        Self { initial: Duration::from_millis(100), max: Duration::from_secs(5) }
    }
}

impl NodeConfig {
    /// One segment of `segment_size` bytes, listening on an ephemeral loopback port.
    pub fn new(master: impl Into<String>, segment_size: u64) -> Self {
        Self {
            master: master.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise: None,
            name: None,
            segment_size,
            segments: 1,
            memfd: false,
            host_id: None,
            ping_interval: Duration::from_secs(1),
            rpc_timeout: Duration::from_secs(10),
            prefault: Prefault::Whole,
            poll_window: Duration::ZERO,
            master_retry: None,
            max_connections: crescent_net::accept::DEFAULT_MAX_CONNECTIONS,
            frame_timeout: crescent_transfer::DEFAULT_SERVER_IO_TIMEOUT,
            keys: None,
            tls: Tls::default(),
            local_lanes: true,
            disk: None,
            disk_device: None,
        }
    }
}

/// The segments a node has mounted, in mount order: what it remounts on `NEED_REMOUNT` and unmounts at
/// shutdown. Changed only by the node's pinger task (see [`Change`]); the lock is a leaf, never held across an
/// await.
type Mounted = Arc<Mutex<Vec<SegmentSpec>>>;

/// A change of the node's mounted segments at run time, carried out by its pinger task: the one task that
/// tells the master about the node's segments, so a remount never interleaves with a mount or an unmount (a
/// remount sent with a list read before an unmount, arriving after it, would mount the segment again).
enum Change {
    /// Mount `spec` (its memory is registered already) and add it to the mounted list.
    Mount { spec: SegmentSpec, done: oneshot::Sender<Result<(), ClientError>> },
    /// Unmount segment `id` (gracefully when `grace_ms > 0`) and take it off the mounted list; answers its spec.
    Unmount { id: SegmentId, grace_ms: u64, done: oneshot::Sender<Result<SegmentSpec, ClientError>> },
}

/// Carries out one [`Change`] at the master, updating `mounted` once the master accepted it.
async fn apply(master: &MasterConnection, id: ClientId, mounted: &Mounted, change: Change) {
    match change {
        Change::Mount { spec, done } => {
            let r = master.call(&MasterRequest::MountSegment { client: id, spec: spec.clone() }).await.map(|_| ());
            if r.is_ok() {
                mounted.lock().push(spec);
            }
            let _ = done.send(r);
        }
        Change::Unmount { id: segment, grace_ms, done } => {
            let spec = mounted.lock().iter().find(|s| s.id == segment).cloned();
            let r = match spec {
                None => Err(unknown_segment(segment)),
                Some(spec) => {
                    let req = if grace_ms > 0 {
                        MasterRequest::GracefulUnmount { client: id, segment, grace_ms }
                    } else {
                        MasterRequest::UnmountSegment { client: id, segment }
                    };
                    // Off the list once the master accepted it: a later remount must not bring it back (a
                    // gracefully unmounting segment is unmounted by the master itself when its grace ends).
                    master.call(&req).await.map(|_| {
                        mounted.lock().retain(|s| s.id != segment);
                        spec
                    })
                }
            };
            let _ = done.send(r);
        }
    }
}

/// The refusal of an unmount of a segment the node has not mounted (`INVALID_PARAMS`, as the original's client).
fn unknown_segment(segment: SegmentId) -> ClientError {
    ClientError::Refused(ErrorFrame {
        code: ErrorCode::InvalidParams,
        message: format!("segment {segment} is not mounted by this node"),
    })
}

/// Mounts and unmounts segments of a running [`StorageNode`] (cheap to clone; usable while the node is shared).
/// The changes are made by the node's pinger task, so they wait for a ping in flight to finish.
#[derive(Clone)]
pub struct SegmentControl {
    id: ClientId,
    changes: mpsc::Sender<Change>,
    registry: SegmentRegistry,
    master: Arc<MasterConnection>,
    name: String,
    endpoint: SocketAddr,
    host: String,
    mounted: Mounted,
    stopped: watch::Receiver<bool>,
}

impl std::fmt::Debug for SegmentControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentControl").field("id", &self.id).field("endpoint", &self.endpoint).finish()
    }
}

/// How often a gracefully unmounted segment's status is asked once its grace ended, and how many times, before
/// its memory is given up on (kept registered) with a warning.
const GRACEFUL_POLL: Duration = Duration::from_secs(1);
const GRACEFUL_POLLS: u32 = 30;

impl SegmentControl {
    /// Hands `change` to the pinger task and waits for its answer.
    async fn send<T>(
        &self,
        change: impl FnOnce(oneshot::Sender<Result<T, ClientError>>) -> Change,
    ) -> Result<T, ClientError> {
        let stopping = || setup(ErrorCode::UnavailableInCurrentStatus, "storage node", "it is stopping");
        let (done, answer) = oneshot::channel();
        self.changes.send(change(done)).await.map_err(|_| stopping())?;
        answer.await.map_err(|_| stopping())?
    }

    /// Hosts `memory` as one more memory segment of the node (named and placed like its others) and mounts it at
    /// the master; from then on it is part of what the node remounts on `NEED_REMOUNT`; its pages are backed
    /// after the mount as `prefault` says. Returns its spec. On a refusal the memory is no longer hosted.
    pub async fn mount(&self, memory: Arc<SegmentMemory>, prefault: Prefault) -> Result<SegmentSpec, ClientError> {
        let spec = SegmentSpec {
            id: SegmentId::random(),
            name: self.name.clone(),
            base: memory.base_addr(),
            size: memory.len(),
            endpoint: self.endpoint.to_string(),
            kind: SegmentKind::Memory,
            host_id: self.host.clone(),
        };
        // Hosted before the master hears of it: a write placed there the moment the mount is accepted finds it.
        self.registry.register(spec.id, memory.clone());
        if let Err(e) = self.send(|done| Change::Mount { spec: spec.clone(), done }).await {
            self.registry.unregister(&spec.id);
            return Err(e);
        }
        tracing::info!(segment = %spec.id, "mounted a segment of {} at run time", fmt_bytes(spec.size));
        prefault_in_background(vec![memory], prefault);
        Ok(spec)
    }

    /// Unmounts memory segment `id` at the master (refused `INVALID_PARAMS` if the node has not mounted it) and
    /// stops hosting it. With a zero `grace` the master's unmount path drops the objects held there before it
    /// answers (once its log entry is durable), and the memory goes at once (in-flight transfers keep it until
    /// they end). With a positive `grace` the segment stays readable but takes no new objects for `grace`, then the
    /// master unmounts it; the node keeps serving it until the master no longer knows it (asked every second
    /// after the grace, 30 times at most: past that the memory stays hosted, with a warning).
    pub async fn unmount(&self, id: SegmentId, grace: Duration) -> Result<SegmentSpec, ClientError> {
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        let spec = self.send(|done| Change::Unmount { id, grace_ms, done }).await?;
        if grace_ms == 0 {
            self.unhost(&spec);
            tracing::info!(segment = %id, "unmounted a segment of {}", fmt_bytes(spec.size));
            return Ok(spec);
        }
        let this = self.clone();
        let kept = spec.clone();
        tokio::spawn(async move {
            let mut stopped = this.stopped.clone();
            let wait = async {
                tokio::time::sleep(grace).await;
                for _ in 0..GRACEFUL_POLLS {
                    match this.master.call(&MasterRequest::SegmentStatus { segment: id }).await {
                        Err(e) if e.code() == ErrorCode::SegmentNotFound => return true,
                        Ok(_) | Err(_) => tokio::time::sleep(GRACEFUL_POLL).await,
                    }
                }
                false
            };
            tokio::select! {
                _ = stopped.changed() => {}
                gone = wait => {
                    if gone {
                        this.unhost(&kept);
                        tracing::info!(segment = %id, "gracefully unmounted a segment of {}", fmt_bytes(kept.size));
                    } else {
                        tracing::warn!(segment = %id, "the master still knows a gracefully unmounted segment: kept");
                    }
                }
            }
        });
        Ok(spec)
    }

    /// Unmounts the node's disk tier at the master at once (objects kept only there are gone; it takes no more
    /// offloads), keeps serving reads of it for `grace` (readers that had its ranges already), then stops hosting
    /// it: the original's `DrainLocalDiskSegment`, for a planned shutdown. `false` when the node has no disk
    /// tier mounted.
    pub async fn drain_disk(&self, grace: Duration) -> Result<bool, ClientError> {
        let disk = self.mounted.lock().iter().find(|s| s.kind == SegmentKind::Disk).map(|s| s.id);
        let Some(id) = disk else { return Ok(false) };
        self.send(|done| Change::Unmount { id, grace_ms: 0, done }).await?;
        tracing::info!(segment = %id, "disk tier unmounted; serving its reads for {grace:?} more");
        tokio::time::sleep(grace).await;
        self.registry.unregister_disk(&id);
        Ok(true)
    }

    /// The segments the node has mounted now (memory and disk), in mount order.
    pub fn segments(&self) -> Vec<SegmentSpec> {
        self.mounted.lock().clone()
    }

    /// Stops hosting `spec`'s memory or disk.
    fn unhost(&self, spec: &SegmentSpec) {
        match spec.kind {
            SegmentKind::Disk => drop(self.registry.unregister_disk(&spec.id)),
            _ => drop(self.registry.unregister(&spec.id)),
        }
    }
}

/// A running storage node.
pub struct StorageNode {
    id: ClientId,
    endpoint: SocketAddr,
    specs: Mounted,
    registry: SegmentRegistry,
    master: Arc<MasterConnection>,
    control: SegmentControl,
    server: Option<TransferServerHandle>,
    stop: watch::Sender<bool>,
    pinger: Option<tokio::task::JoinHandle<()>>,
    /// The disk tier's task worker, when the node has a disk.
    disk_worker: Option<tokio::task::JoinHandle<()>>,
    /// Makes the copies of copy/move tasks and drains (`tasks`).
    task_worker: Option<tokio::task::JoinHandle<()>>,
    remounts: Arc<AtomicU64>,
}

impl std::fmt::Debug for StorageNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageNode").field("id", &self.id).field("endpoint", &self.endpoint).finish()
    }
}

async fn remount(master: &MasterConnection, id: ClientId, specs: &[SegmentSpec]) -> Result<(), ClientError> {
    let req = MasterRequest::RemountSegments { client: id, specs: Batch(specs.to_vec()) };
    master.call(&req).await.map(|_| ())
}

/// Mounts every segment, then remounts them all (which makes the master's pings answer OK).
async fn mount_all(master: &MasterConnection, id: ClientId, specs: &[SegmentSpec]) -> Result<(), ClientError> {
    for spec in specs {
        master.call(&MasterRequest::MountSegment { client: id, spec: spec.clone() }).await?;
    }
    remount(master, id, specs).await
}

/// Whether a failed mount should be tried again: no master could be reached, or (`etcd://` addresses) none leads
/// yet, or the one asked had just stopped leading (leadership moving while the node starts).
fn waits_for_master(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Unreachable { .. } | ClientError::Wire(_) | ClientError::Timeout | ClientError::NoLeader { .. }
    ) || e.is_not_leader()
}

/// [`mount_all`], retried with `retry`'s backoff while the master cannot be reached or (`etcd://` addresses)
/// no master leads yet, or a master that no longer leads refused it (each attempt said at warn level); any other
/// answer from the master (even a refusal) ends the retries.
async fn mount_retrying(
    master: &MasterConnection,
    addr: &str,
    id: ClientId,
    specs: &[SegmentSpec],
    retry: Option<Backoff>,
) -> Result<(), ClientError> {
    let mut delay = retry.map(|r| r.initial);
    loop {
        match mount_all(master, id, specs).await {
            Err(e)
                if waits_for_master(&e)
                    && let Some(d) = delay =>
            {
                let why = match &e {
                    ClientError::Unreachable { reason, .. } => reason.clone(),
                    e => e.to_string(),
                };
                tracing::warn!("master {addr} not reachable ({why}): retrying in {d:?}");
                tokio::time::sleep(d).await;
                delay = retry.map(|r| (d * 2).min(r.max));
            }
            r => return r,
        }
    }
}

/// Prefaults the segments on a thread of their own, after they are mounted: the node is ready at once
/// whatever its size (an 8 GiB segment takes ~30 s to back), writes that arrive meanwhile fault their own
/// pages as they would without prefaulting, and `MADV_POPULATE_WRITE` never changes a byte already written.
fn prefault_in_background(memories: Vec<Arc<SegmentMemory>>, how: Prefault) {
    if how == Prefault::Off || memories.is_empty() {
        return;
    }
    let count = memories.len();
    // Held weakly: the thread never keeps a segment the node let go of (its memory goes then).
    let held: Vec<_> = memories.iter().map(Arc::downgrade).collect();
    drop(memories);
    let spawned = std::thread::Builder::new().name("crescent-prefault".into()).spawn(move || match how {
        Prefault::Whole => {
            for (i, mem) in held.into_iter().enumerate() {
                prefault(mem, i, count);
            }
        }
        _ => {
            let spare = || host_memory().is_some_and(|(available, total)| available > total / 8);
            for mem in held {
                if !prefault_spare(mem, spare).1 {
                    break;
                }
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no thread to prefault segment memory; pages fault on first use");
    }
}

/// Prefaults `mem` (segment `i` of `count`) with huge pages asked for, while it is hosted, saying how far it got
/// every second so a slow prefault shows progress. Returns the bytes backed.
fn prefault(mem: std::sync::Weak<SegmentMemory>, i: usize, count: usize) -> u64 {
    let Some(held) = mem.upgrade() else { return 0 };
    let start = std::time::Instant::now();
    let mut last = start;
    held.advise_huge_pages();
    let r = held.prefault_while(|done, total| {
        if last.elapsed() >= Duration::from_secs(1) {
            last = std::time::Instant::now();
            tracing::info!("prefaulting segment {}/{count}: {} of {}", i + 1, fmt_bytes(done), fmt_bytes(total));
        }
        // Hosted no more: only this thread still holds it.
        Arc::strong_count(&held) > 1
    });
    match r {
        Err(e) => {
            tracing::warn!(error = %e, "segment memory could not be prefaulted; pages fault on first use");
            0
        }
        Ok(n) if last != start => {
            tracing::info!(
                "prefaulted segment {}/{count} ({} of {}) in {:.1?}",
                i + 1,
                fmt_bytes(n),
                fmt_bytes(held.len()),
                start.elapsed()
            );
            n
        }
        Ok(n) => n,
    }
}

/// Backs `mem` from its start while `spare()` says the host can spare memory (asked before the first step and
/// every 64 steps, 128 MiB) and the segment is still hosted. Returns the bytes backed and whether the host could
/// spare all of it (the next segment is worth a try).
fn prefault_spare(mem: std::sync::Weak<SegmentMemory>, spare: impl Fn() -> bool) -> (u64, bool) {
    const STEPS_PER_LOOK: u64 = 64;
    let Some(held) = mem.upgrade() else { return (0, true) };
    if !spare() {
        return (0, false);
    }
    let mut steps = 0u64;
    let mut room = true;
    let backed = held.prefault_while(|_, _| {
        steps += 1;
        // Hosted no more: only this thread still holds it.
        if Arc::strong_count(&held) == 1 {
            return false;
        }
        if steps.is_multiple_of(STEPS_PER_LOOK) && !spare() {
            room = false;
            return false;
        }
        true
    });
    match backed {
        Err(e) => {
            tracing::warn!(error = %e, "segment memory could not be prefaulted; pages fault on first use");
            (0, room)
        }
        Ok(n) => {
            if n < held.len() && !room {
                tracing::info!(
                    "prefaulted {} of a {} segment: the host has no more to spare; the rest is backed as it is written",
                    fmt_bytes(n),
                    fmt_bytes(held.len())
                );
            }
            (n, room)
        }
    }
}

/// The memory this process may still take and its ceiling, in bytes: the host's (`MemAvailable`, `MemTotal` of
/// `/proc/meminfo`), lowered to what its cgroup and every ancestor allow (cgroup v2 `memory.max` less
/// `memory.current`, and `memory.max`): in a container `/proc/meminfo` describes the host, and backing memory past
/// the container's limit would have the engine beside the store killed. `None` when `/proc/meminfo` cannot be read.
fn host_memory() -> Option<(u64, u64)> {
    let host = meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)?;
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok();
    Some(match cgroup.as_deref().and_then(cgroup_v2_path) {
        Some(path) => within_cgroups(std::path::Path::new("/sys/fs/cgroup"), path, host),
        None => host,
    })
}

/// `(MemAvailable, MemTotal)` of a `/proc/meminfo` text, in bytes.
fn meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let rest = text.lines().find_map(|l| l.strip_prefix(name))?;
        let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        kib.checked_mul(1024)
    };
    Some((field("MemAvailable:")?, field("MemTotal:")?))
}

/// The cgroup v2 path of a `/proc/self/cgroup` text (its `0::PATH` line).
fn cgroup_v2_path(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::")).map(str::trim)
}

/// `(available, total)` lowered to the limits of the cgroup at `path` under `root` and of its ancestors.
fn within_cgroups(root: &std::path::Path, path: &str, (mut available, mut total): (u64, u64)) -> (u64, u64) {
    let read = |dir: &std::path::Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
    let mut dir = root.join(path.trim_start_matches('/'));
    loop {
        let max = read(&dir, "memory.max").and_then(|t| t.trim().parse::<u64>().ok());
        let current = read(&dir, "memory.current").and_then(|t| t.trim().parse::<u64>().ok());
        if let (Some(max), Some(current)) = (max, current) {
            available = available.min(max.saturating_sub(current));
            total = total.min(max);
        }
        if dir.as_path() == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    (available, total)
}

/// A node's own start-up failure (memory, disk, socket: nothing the master said), with what it was setting up.
fn setup(code: ErrorCode, what: impl std::fmt::Display, e: impl std::fmt::Display) -> ClientError {
    ClientError::Refused(ErrorFrame { code, message: format!("{what}: {e}") })
}

impl StorageNode {
    /// Allocates the segments, starts the transfer server and mounts everything at the master.
    pub async fn start(config: NodeConfig) -> Result<StorageNode, ClientError> {
        Self::start_with(config, SegmentRegistry::default()).await
    }

    /// Like [`StorageNode::start`], hosting the segments in `registry` (shared with an embedding client so its
    /// own replicas are reached by memcpy).
    pub async fn start_with(config: NodeConfig, registry: SegmentRegistry) -> Result<StorageNode, ClientError> {
        let server = TransferServer::bind(config.listen, registry.clone())
            .map_err(|source| ClientError::Listen { addr: config.listen, source })?
            .with_poll_window(config.poll_window)
            .with_max_connections(config.max_connections)
            .with_io_timeout(config.frame_timeout)
            .with_keys(config.keys.clone())
            .with_tls(config.tls.server.clone());
        let endpoint = crescent_net::advertise::advertised(server.local_addr(), config.advertise.as_deref())
            .map_err(|e| setup(ErrorCode::InvalidParams, "no address to advertise", e))?;
        let server = server.with_local_lanes(config.local_lanes.then(|| endpoint.to_string()));
        let host = config.host_id.clone().unwrap_or_else(|| endpoint.ip().to_string());
        let name = config.name.clone().unwrap_or_else(|| endpoint.to_string());
        // A process on this host may attach to the node as its store (the Python package's `setup_dummy`).
        let server = server.with_attach(Some(Attachment {
            master: config.master.clone(),
            name: name.clone(),
            host_id: host.clone(),
            segments: Vec::new(),
        }));
        let mut specs = Vec::with_capacity(config.segments);
        let mut memories = Vec::with_capacity(config.segments);
        for i in 0..config.segments {
            let mem = if config.memfd {
                SegmentMemory::memfd(&format!("crescent-{}-{i}", endpoint.port()), config.segment_size)
            } else {
                SegmentMemory::anonymous(config.segment_size)
            }
            .map_err(|e| {
                setup(ErrorCode::InternalError, format!("segment memory ({})", fmt_bytes(config.segment_size)), e)
            })?;
            let id = SegmentId::random();
            specs.push(SegmentSpec {
                id,
                // One name per node: replicas of one object land on distinct nodes.
                name: name.clone(),
                base: mem.base_addr(),
                size: config.segment_size,
                endpoint: endpoint.to_string(),
                kind: SegmentKind::Memory,
                host_id: host.clone(),
            });
            let mem = Arc::new(mem);
            registry.register(id, mem.clone());
            memories.push(mem);
        }
        let device: Option<Arc<dyn crescent_transfer::disk::BlockDevice>> = match (&config.disk_device, &config.disk) {
            (Some(device), _) => Some(device.0.clone()),
            (None, None) => None,
            (None, Some(d)) => Some(Arc::new(
                crescent_transfer::disk::FileDevice::create(&d.dir, d.size)
                    .map_err(|e| setup(ErrorCode::FileOpenFail, "disk tier", e))?,
            )),
        };
        let disk = match device {
            None => None,
            Some(device) => {
                let disk =
                    crescent_transfer::disk::DiskSegment::new(device, crescent_transfer::disk::DiskConfig::default())
                        .map_err(|e| setup(ErrorCode::FileOpenFail, "disk tier I/O threads", e))?;
                tracing::info!("disk tier: {} ({})", fmt_bytes(disk.size()), disk.describe());
                let disk = Arc::new(disk);
                let id = SegmentId::random();
                specs.push(SegmentSpec {
                    id,
                    name: name.clone(),
                    base: 0,
                    size: disk.size(),
                    endpoint: endpoint.to_string(),
                    kind: SegmentKind::Disk,
                    host_id: host.clone(),
                });
                registry.register_disk(id, disk.clone());
                Some((id, disk))
            }
        };
        let server = server.spawn().map_err(|e| setup(ErrorCode::InternalError, "transfer server", e))?;
        let id = ClientId::random();
        let credential = config.keys.clone().map(CredentialSource::Host);
        let master = Arc::new(
            MasterConnection::new(&config.master, id, PeerRole::Node, 1, config.rpc_timeout)
                .with_credential(credential)
                .with_tls(config.tls.client.clone()),
        );
        mount_retrying(&master, &config.master, id, &specs, config.master_retry).await?;
        tracing::info!(
            "mounted {} segment{} of {} at master {} as {endpoint} (host {host})",
            config.segments,
            if config.segments == 1 { "" } else { "s" },
            fmt_bytes(config.segment_size),
            config.master
        );
        prefault_in_background(memories, config.prefault);
        let specs: Mounted = Arc::new(Mutex::new(specs));
        let (stop, mut stopped) = watch::channel(false);
        let disk_worker = disk.map(|(disk_id, disk)| {
            // A connection of its own: a poll waits for work, and must not hold the pings back.
            let conn = Arc::new(
                MasterConnection::new(&config.master, id, PeerRole::Node, 1, config.rpc_timeout)
                    .with_credential(config.keys.clone().map(CredentialSource::Host))
                    .with_tls(config.tls.client.clone()),
            );
            disk::spawn_worker(conn, id, registry.clone(), disk_id, disk, stopped.clone())
        });
        let task_worker = {
            // A connection of its own, as the disk worker's; the data-plane tickets of its copies come over it
            // too (fetched while the worker runs a batch, never while it polls).
            let conn = Arc::new(
                MasterConnection::new(&config.master, id, PeerRole::Node, 1, config.rpc_timeout)
                    .with_credential(config.keys.clone().map(CredentialSource::Host))
                    .with_tls(config.tls.client.clone()),
            );
            let tickets = config.keys.clone().map(|keys| {
                let tickets =
                    crescent_client::tickets::MasterTickets::new(conn.clone(), CredentialSource::Host(keys), id);
                Arc::new(tickets) as Arc<dyn crescent_transfer::Tickets>
            });
            let transfer_config = crescent_transfer::TransferConfig {
                client_id: Some(id),
                tickets,
                tls: config.tls.client.clone(),
                ..Default::default()
            };
            let transfer = crescent_transfer::TransferClient::new(transfer_config, registry.clone());
            tasks::spawn_worker(conn, id, registry.clone(), transfer, stopped.clone())
        };
        let (changes, mut changed) = mpsc::channel(16);
        let control = SegmentControl {
            id,
            changes,
            registry: registry.clone(),
            master: master.clone(),
            name,
            endpoint,
            host,
            mounted: specs.clone(),
            stopped: stopped.clone(),
        };
        let remounts = Arc::new(AtomicU64::new(0));
        let (m, s, r, every) = (master.clone(), specs.clone(), remounts.clone(), config.ping_interval);
        let pinger = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    Some(change) = changed.recv() => {
                        apply(&m, id, &s, change).await;
                        continue;
                    }
                    _ = tick.tick() => {}
                }
                match m.call(&MasterRequest::Ping { client: id }).await {
                    Ok(MasterResponse::Pong { status: ClientStatus::NeedRemount, .. }) => {
                        // The list as it is now: only this task changes it, so it cannot change under the remount.
                        let list = s.lock().clone();
                        match remount(&m, id, &list).await {
                            Ok(()) => {
                                r.fetch_add(1, Ordering::Relaxed);
                                tracing::info!("master asked for a remount: remounted {} segments", list.len());
                            }
                            Err(e) => tracing::warn!(error = %e, "remount failed"),
                        }
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "ping failed"),
                }
            }
        });
        Ok(StorageNode {
            id,
            endpoint,
            specs,
            registry,
            master,
            control,
            server: Some(server),
            stop,
            pinger: Some(pinger),
            disk_worker,
            task_worker: Some(task_worker),
            remounts,
        })
    }

    /// The node's client id.
    pub fn id(&self) -> ClientId {
        self.id
    }

    /// The data-plane endpoint.
    pub fn endpoint(&self) -> SocketAddr {
        self.endpoint
    }

    /// The mounted segments (memory and disk), in mount order: those of start-up, then those mounted since.
    pub fn segments(&self) -> Vec<SegmentSpec> {
        self.specs.lock().clone()
    }

    /// A handle that mounts and unmounts segments of this node while it runs.
    pub fn control(&self) -> SegmentControl {
        self.control.clone()
    }

    /// The hosted segments' memory.
    pub fn registry(&self) -> &SegmentRegistry {
        &self.registry
    }

    /// How many times the node remounted after `NEED_REMOUNT`.
    pub fn remounts(&self) -> u64 {
        self.remounts.load(Ordering::Relaxed)
    }

    /// Graceful shutdown: segments stay readable (not allocatable) for `grace`, then are unmounted; then the
    /// data plane stops.
    pub async fn shutdown(mut self, grace: Duration) -> Result<(), ClientError> {
        let _ = self.stop.send(true);
        if let Some(p) = self.pinger.take() {
            let _ = p.await;
        }
        if let Some(w) = self.disk_worker.take() {
            let _ = w.await;
        }
        if let Some(w) = self.task_worker.take() {
            let _ = w.await;
        }
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        let specs = self.specs.lock().clone();
        if grace_ms > 0 {
            for spec in &specs {
                let req = MasterRequest::GracefulUnmount { client: self.id, segment: spec.id, grace_ms };
                self.master.call(&req).await?;
            }
            tokio::time::sleep(grace).await;
        }
        for spec in &specs {
            self.master.call(&MasterRequest::UnmountSegment { client: self.id, segment: spec.id }).await?;
        }
        tracing::info!("unmounted {} segment{}", specs.len(), if specs.len() == 1 { "" } else { "s" });
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
        Ok(())
    }
}

impl Drop for StorageNode {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(p) = self.pinger.take() {
            p.abort();
        }
        if let Some(w) = self.disk_worker.take() {
            w.abort();
        }
        if let Some(w) = self.task_worker.take() {
            w.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{
        Arc, Ordering, SegmentMemory, cgroup_v2_path, host_memory, meminfo, prefault, prefault_spare, within_cgroups,
    };

    /// A node's whole prefault backs all of a hosted segment and nothing of one let go.
    #[test]
    fn a_whole_prefault_backs_a_hosted_segment_and_not_one_let_go() {
        let mem = Arc::new(SegmentMemory::anonymous(64 << 20).unwrap());
        assert_eq!(prefault(Arc::downgrade(&mem), 0, 1), 64 << 20);
        let weak = Arc::downgrade(&mem);
        drop(mem);
        assert_eq!(prefault(weak, 0, 1), 0);
    }

    /// Backing for what the host spares: stops once the host has none left (looked at every 64 steps), and once
    /// nothing but the prefault holds the segment.
    #[test]
    fn a_spare_prefault_stops_when_the_host_has_none_left_or_the_segment_is_let_go() {
        use std::sync::atomic::AtomicUsize;
        let mem = Arc::new(SegmentMemory::anonymous(512 << 20).unwrap());
        let looks = AtomicUsize::new(0);
        // Room at the first two looks (before the first step, after 64 steps), none at the third (after 128).
        let (backed, room) = prefault_spare(Arc::downgrade(&mem), || looks.fetch_add(1, Ordering::Relaxed) < 2);
        assert_eq!((backed, room), (256 << 20, false));
        assert_eq!(prefault_spare(Arc::downgrade(&mem), || false), (0, false), "none to spare: nothing backed");
        assert_eq!(prefault_spare(Arc::downgrade(&mem), || true), (512 << 20, true), "all of it");
        let weak = Arc::downgrade(&mem);
        drop(mem);
        assert_eq!(prefault_spare(weak, || true), (0, true), "a segment let go is not backed");
    }

    #[test]
    fn host_memory_reads_meminfo() {
        let (available, total) = host_memory().unwrap();
        assert!(available > 0 && available <= total, "{available} of {total}");
        let text = "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo(text), Some((20_000_000 * 1024, 24_000_000 * 1024)));
        assert_eq!(meminfo("MemTotal: 5 kB\n"), None);
        assert_eq!(cgroup_v2_path("0::/user.slice/app.scope\n"), Some("/user.slice/app.scope"));
        assert_eq!(cgroup_v2_path("1:memory:/x\n"), None, "v1 only: no v2 limits read");
    }

    /// In a container the cgroup's limit, and any ancestor's, lowers what the host looks like it can spare.
    #[test]
    fn a_cgroup_limit_lowers_the_memory_there_is_to_spare() {
        let root = tempfile::tempdir().unwrap();
        let leaf = root.path().join("pod/app");
        std::fs::create_dir_all(&leaf).unwrap();
        let write = |dir: &std::path::Path, max: &str, current: &str| {
            std::fs::write(dir.join("memory.max"), max).unwrap();
            std::fs::write(dir.join("memory.current"), current).unwrap();
        };
        let host = (20 << 30, 24 << 30);
        write(&leaf, "max\n", "1000\n");
        assert_eq!(within_cgroups(root.path(), "/pod/app", host), host, "no limit of its own, none above");
        write(&root.path().join("pod"), "4294967296\n", "1073741824\n");
        assert_eq!(within_cgroups(root.path(), "/pod/app", host), (3 << 30, 4 << 30), "the pod's limit");
        write(&leaf, "2147483648\n", "2147483648\n");
        assert_eq!(within_cgroups(root.path(), "/pod/app", host), (0, 2 << 30), "its own, full");
        assert_eq!(within_cgroups(root.path(), "/", host), host, "the root has no limit files");
    }

    use super::waits_for_master;
    use crescent_client::ClientError;
    use crescent_proto::ErrorCode;
    use crescent_proto::wire::ErrorFrame;

    /// A node started while leadership moves keeps trying to mount: a master that stopped leading refuses it as
    /// not the leader (once made a node started mid-failover exit); other refusals end the retries.
    #[test]
    fn a_not_the_leader_refusal_is_waited_out_other_refusals_are_not() {
        let refused = |code, message: &str| ClientError::Refused(ErrorFrame { code, message: message.into() });
        let standby = refused(
            ErrorCode::UnavailableInCurrentStatus,
            "this master is not the leader: the leader is 127.0.0.1:4000 (view 7)",
        );
        assert!(waits_for_master(&standby));
        assert!(waits_for_master(&ClientError::Timeout));
        assert!(!waits_for_master(&refused(ErrorCode::InvalidParams, "segment is already mounted")));
        assert!(!waits_for_master(&refused(ErrorCode::UnavailableInCurrentStatus, "segment s is Unmounting")));
        assert!(!waits_for_master(&ClientError::Code(ErrorCode::PermissionDenied)));
    }
}
