//! `crescent up | master | node`: long-running processes. Each prints one JSON line with its endpoints once
//! ready, then runs until SIGINT/SIGTERM.

use crate::config::{
    DEFAULT_ADMIN_PORT, DEFAULT_MASTER, DEFAULT_MEMFD, DEFAULT_NODE_LISTEN, DEFAULT_PREFAULT, DEFAULT_SEGMENT_SIZE,
    DEFAULT_SEGMENTS, DEFAULT_SHUTDOWN_GRACE_MS, FileConfig,
};
use anyhow::{Context, Result, anyhow, bail};
use crescent_master::events::EventsConfig;
use crescent_master::placement::PlacementPolicy;
use crescent_master::server::{MasterServer, RpcLimits};
use crescent_master::service::MasterConfig;
use crescent_net::auth::Keyring;
use crescent_net::host::NodeKeys;
use crescent_node::{Backoff, NodeConfig, StorageNode};
use crescent_proto::Principal;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Master flags (each also settable under `[server]` in the config file). The defaults in the help come from
/// the constants the code uses, not `default_value`: a flag left out must stay `None` so the file can set it.
#[derive(clap::Args, Debug, Default)]
pub struct MasterArgs {
    /// RPC listen address (`127.0.0.1:0` picks a free port).
    #[arg(long, help = dflt("RPC listen address (`127.0.0.1:0` picks a free port)", DEFAULT_MASTER))]
    listen: Option<String>,
    /// Host (IP or name) the master is reached at.
    #[arg(long, value_name = "HOST", help = dflt(
        "Host (IP or name) others reach this server at",
        "the listen IP; for 0.0.0.0 this host's primary address",
    ))]
    advertise: Option<String>,
    /// Admin HTTP listen address.
    #[arg(long, help = dflt("Admin HTTP listen address", format!("127.0.0.1, port {DEFAULT_ADMIN_PORT} (0 with --listen port 0)")))]
    admin: Option<String>,
    /// Read lease in ms.
    #[arg(long, help = dflt("Read lease in ms", MasterConfig::default().lease_ttl_ms))]
    lease_ttl_ms: Option<u64>,
    /// Client liveness TTL in ms.
    #[arg(long, help = dflt("Client liveness TTL in ms", MasterConfig::default().client_ttl_ms))]
    client_ttl_ms: Option<u64>,
    /// How long a silent node's objects are kept for it to come back, in ms.
    #[arg(long, help = dflt(
        "How long a silent node's objects are kept (not served) for it to come back, in ms; 0 drops them at the \
         client TTL",
        MasterConfig::default().disconnect_grace_ms
    ))]
    disconnect_grace_ms: Option<u64>,
    /// How often each NoF target is probed, in ms.
    #[arg(long, help = dflt("How often each NoF target is probed, in ms", MasterConfig::default().nof_heartbeat_interval_ms))]
    nof_heartbeat_interval_ms: Option<u64>,
    /// A NoF probe unanswered this long fails, in ms.
    #[arg(long, help = dflt("A NoF probe unanswered this long fails, in ms", MasterConfig::default().nof_probe_timeout_ms))]
    nof_probe_timeout_ms: Option<u64>,
    /// Consecutive failed probes that unmount a NoF segment.
    #[arg(long, help = dflt("Consecutive failed probes that unmount a NoF segment", MasterConfig::default().nof_heartbeat_failures))]
    nof_heartbeat_failures: Option<u32>,
    /// Evict above this used ratio.
    #[arg(long, help = dflt("Evict above this used ratio", MasterConfig::default().eviction_high_watermark))]
    eviction_high_watermark: Option<f64>,
    /// Fraction of objects one eviction round removes.
    #[arg(long, help = dflt("Fraction of objects one eviction round removes", MasterConfig::default().eviction_ratio))]
    eviction_ratio: Option<f64>,
    /// Namespaces and quotas per tenant.
    #[arg(long, num_args = 0..=1, default_missing_value = "true",
        help = dflt("Namespaces and quotas per tenant", MasterConfig::default().enable_multi_tenants))]
    multi_tenant: Option<bool>,
    /// Placement policy.
    #[arg(long, help = dflt(
        &format!("Placement policy: {}", PlacementPolicy::ALL.map(|p| p.name()).join(", ")),
        MasterConfig::default().placement_policy,
    ))]
    placement: Option<PlacementPolicy>,
    /// How long a node has to start a copy/move task it took, in ms.
    #[arg(long, help = dflt(
        "A node must start a copy or move task within this long of taking it, in ms; the master fails the task \
         after twice that",
        MasterConfig::default().replica_task_timeout_ms
    ))]
    replica_task_timeout_ms: Option<u64>,
    /// A copy/move task no node took this long fails, in ms.
    #[arg(long, help = dflt("A copy or move task no node took within this long fails, in ms; 0 never",
        MasterConfig::default().pending_task_timeout_ms))]
    pending_task_timeout_ms: Option<u64>,
    /// Copy/move tasks queued at most.
    #[arg(long, help = dflt("Copy or move tasks queued at most (more are refused with TASK_PENDING_LIMIT_EXCEEDED)",
        MasterConfig::default().max_pending_tasks))]
    max_pending_tasks: Option<usize>,
    /// Ended tasks kept for `query_task`.
    #[arg(long, help = dflt("Ended tasks kept for query_task",
        MasterConfig::default().max_finished_tasks))]
    max_finished_tasks: Option<usize>,
    /// Times a task that found no room on its target is tried again.
    #[arg(long, help = dflt("Times a task that found no room on its target is tried again before it fails",
        MasterConfig::default().task_retry_attempts))]
    task_retry_attempts: Option<u32>,
    /// Where the KV event stream is published.
    #[arg(long, value_name = "tcp://HOST:PORT", help = dflt(
        "Publish the KV event stream (stored/removed events in the original's ZMQ format, for routers) on a PUB \
         socket bound here (port 0: a free one; /kv_events/status shows it)",
        "off",
    ))]
    kv_events: Option<String>,
    /// The `backend_id` stamped on every event.
    #[arg(long, value_name = "ID", help = dflt("The backend_id every KV event carries (names this cache to routers)",
        "empty"))]
    kv_events_backend_id: Option<String>,
    /// Events queued at most before the oldest are dropped.
    #[arg(long, value_name = "N", help = dflt(
        "KV events queued at most before the oldest are dropped (counted; 0 unbounded)",
        crescent_master::events::DEFAULT_QUEUE_CAPACITY,
    ))]
    kv_events_queue_capacity: Option<usize>,
    /// Bytes a subscriber may have waiting before its messages are skipped.
    #[arg(long, value_name = "SIZE", value_parser = crate::parse_size, help = dflt(
        "Bytes of KV event messages a subscriber may have waiting for it; past that its messages are skipped \
         (counted per subscriber on /metrics) until half has drained, so a stalled subscriber costs the master \
         no more memory",
        "8MiB",
    ))]
    kv_events_subscriber_buffer: Option<u64>,
    #[command(flatten)]
    limits: LimitArgs,
    /// etcd endpoints of the oplog and of leader election (with --cluster-id).
    #[arg(long, value_name = "HOST:PORT[,HOST:PORT…]", help = dflt(
        "Run as one of the cluster's master candidates, with the oplog in etcd (endpoints separated by commas; \
         needs --cluster-id): the candidate holding the leader lease serves, the others follow the log as hot \
         standbys and take over when it goes. `crescent up` only keeps its oplog there",
        "no oplog",
    ))]
    etcd: Option<String>,
    /// Leader lease TTL in seconds (with --etcd).
    #[arg(long, value_name = "SECONDS", help = dflt(
        "Leader lease TTL in seconds (with --etcd; at least 2): a leader that cannot renew stops serving within \
         it, and a standby takes over after it",
        DEFAULT_LEADER_LEASE_TTL,
    ))]
    leader_lease_ttl: Option<u64>,
    /// The oplog's namespace in etcd.
    #[arg(long, value_name = "ID", help = dflt(
        "The cluster's oplog namespace (`[A-Za-z0-9_.-]`, up to 128 bytes)",
        crescent_master::ha::replay::DEFAULT_CLUSTER_ID,
    ))]
    cluster_id: Option<String>,
    /// The master's local data directory: its embedded oplog (without --etcd) and its snapshots.
    #[arg(long, value_name = "DIR", help = dflt(
        "The master's local directory, created if absent. Without --etcd the oplog is kept there in an embedded \
         store (one file): a master restarted on the same DIR replays it before it serves. With --etcd the oplog \
         stays in etcd and DIR is only local. Either way snapshots go to DIR/snapshots unless --snapshot-dir or \
         --snapshot-s3 says otherwise, so the log is compacted",
        "no oplog; with --etcd, no snapshots",
    ))]
    data_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    snapshots: crate::snapshots::SnapshotArgs,
    #[command(flatten)]
    auth: crate::auth::SecretArgs,
}

/// `--etcd` and `--data-dir` (flags over `[server]` keys; a flag replaces the file's choice of both as a whole).
fn backend(a: &MasterArgs, file: &FileConfig) -> (Option<String>, Option<std::path::PathBuf>) {
    let f = &file.server;
    if a.etcd.is_some() || a.data_dir.is_some() {
        (a.etcd.clone(), a.data_dir.clone())
    } else {
        (f.etcd.clone(), f.data_dir.clone().map(std::path::PathBuf::from))
    }
}

/// The master's local data directory (`--data-dir`): its embedded oplog without `--etcd`, and with or without
/// it where its snapshots go by default (`DIR/snapshots`).
fn data_dir(a: &MasterArgs, file: &FileConfig) -> Option<std::path::PathBuf> {
    backend(a, file).1
}

/// Where the master's oplog lives: `--etcd` (with `--cluster-id`; a `--data-dir` beside it is only the master's
/// local directory), `--data-dir` alone (the embedded store), or neither (none); flags over `[server]` keys. A
/// flag replaces the file's backend choice as a whole.
async fn oplog_options(a: &MasterArgs, file: &FileConfig) -> Result<Option<crescent_master::ha::OpLogOptions>> {
    use crescent_master::ha::OpLogOptions;
    let f = &file.server;
    let (etcd, data_dir) = backend(a, file);
    let cluster = a.cluster_id.clone().or_else(|| f.cluster_id.clone());
    match (etcd, data_dir) {
        (Some(endpoints), _) => {
            let cluster =
                cluster.ok_or_else(|| anyhow!("--etcd needs --cluster-id (the oplog's namespace in etcd)"))?;
            let endpoints: Vec<String> =
                endpoints.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect();
            if endpoints.is_empty() {
                anyhow::bail!("--etcd: no endpoint given");
            }
            let o = OpLogOptions::etcd(endpoints.clone(), &cluster)
                .await
                .with_context(|| format!("connecting to etcd at {}", endpoints.join(",")))?;
            Ok(Some(o))
        }
        (None, Some(dir)) => {
            let cluster = cluster.as_deref().unwrap_or(crescent_master::ha::replay::DEFAULT_CLUSTER_ID);
            let o = OpLogOptions::embedded(&dir, cluster)
                .with_context(|| format!("opening the oplog in {}", dir.display()))?;
            Ok(Some(o))
        }
        (None, None) if cluster.is_some() => {
            anyhow::bail!("--cluster-id names an oplog namespace: it needs --etcd or --data-dir")
        }
        (None, None) => Ok(None),
    }
}

/// Connection limits of a server (`master`, `node`; also `max_connections` and `frame_timeout_ms` under
/// `[server]` and `[node]`).
#[derive(clap::Args, Debug, Default)]
pub struct LimitArgs {
    /// Most connections served at once.
    #[arg(long, help = dflt(
        "Most connections served at once (lowered to fit `ulimit -n`); at the cap the longest-idle one is closed \
         to make room, or a newcomer refused when all are busy",
        crescent_net::accept::DEFAULT_MAX_CONNECTIONS,
    ))]
    max_connections: Option<usize>,
    /// Milliseconds a peer may take over its hello, the rest of a frame it started, or taking a reply.
    #[arg(long, help = dflt(
        "Milliseconds a peer may take over its hello, the rest of a frame it started, or taking a reply",
        "10000 for the master, 30000 for a node",
    ))]
    frame_timeout_ms: Option<u64>,
}

/// A node's segments (`node`, and the node inside `up`; each also settable under `[node]`).
#[derive(clap::Args, Debug, Default)]
pub struct SegmentArgs {
    /// Bytes per segment (e.g. 1GiB).
    #[arg(long, help = dflt("Bytes per segment (e.g. 16MiB, 8GiB)", DEFAULT_SEGMENT_SIZE))]
    segment_size: Option<String>,
    /// Segments to host.
    #[arg(long, help = dflt("Segments to host", DEFAULT_SEGMENTS))]
    segments: Option<usize>,
    /// Back segments with memfd.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", help = dflt("Back segments with memfd", DEFAULT_MEMFD))]
    memfd: Option<bool>,
    /// Back segment memory at start-up.
    #[arg(long, help = dflt("Back segment memory at start-up (`--prefault false` for segments larger than memory)", DEFAULT_PREFAULT))]
    prefault: Option<bool>,
    /// Host id for local-first placement.
    #[arg(long, help = dflt("Host id for local-first placement", "the advertised IP"))]
    host_id: Option<String>,
    /// A disk tier on this directory (its SSD): memory evictions are kept there.
    #[arg(
        long,
        value_name = "DIR",
        help = "Keep evicted objects on this directory's disk (a disk tier: one file, crescent-ssd.data, wiped at \
                start, read and written with direct I/O); needs --ssd-size. Default: no disk tier"
    )]
    ssd_dir: Option<std::path::PathBuf>,
    /// Bytes of the disk tier.
    #[arg(long, value_name = "SIZE", help = "Bytes of the disk tier (e.g. 100GiB; whole 4 KiB blocks)")]
    ssd_size: Option<String>,
}

/// Node flags (each also settable under `[node]`).
#[derive(clap::Args, Debug, Default)]
pub struct NodeArgs {
    /// Data-plane listen address.
    #[arg(long, help = dflt("Data-plane listen address (`0.0.0.0:0` on every interface)", DEFAULT_NODE_LISTEN))]
    listen: Option<String>,
    /// Host (IP or name) other hosts reach this node at.
    #[arg(long, value_name = "HOST", help = dflt(
        "Host (IP or name) other hosts reach this node at",
        "the listen IP; for 0.0.0.0 this host's primary address",
    ))]
    advertise: Option<String>,
    #[command(flatten)]
    segments: SegmentArgs,
    /// Keep serving reads this long after SIGTERM before unmounting (ms).
    #[arg(long, help = dflt("Keep serving reads this long after SIGTERM before unmounting (ms)", DEFAULT_SHUTDOWN_GRACE_MS))]
    shutdown_grace_ms: Option<u64>,
    #[command(flatten)]
    limits: LimitArgs,
    /// The node's own credential (what it proves to the master and derives its keys from).
    #[arg(
        long,
        value_name = "FILE",
        help = "File (mode 600) holding this node's credential (`crescent credential node` or `node:NAME` prints one; two lines during a rotation, the first current; also CRESCENT_CREDENTIAL_FILE or CRESCENT_CREDENTIAL). A node needs no cluster secret"
    )]
    credential_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    auth: crate::auth::SecretArgs,
}

/// `up` flags: the master's, plus the embedded node's segments.
#[derive(clap::Args, Debug)]
pub struct UpArgs {
    #[command(flatten)]
    master: MasterArgs,
    #[command(flatten)]
    segments: SegmentArgs,
    /// Data-plane listen address of the embedded node.
    #[arg(long, help = dflt("Data-plane listen address of the embedded node", "the master's IP, port 0"))]
    node_listen: Option<String>,
}

impl UpArgs {
    /// Whether this `up` keeps an oplog (flag or `[server]` key): its master then waits on the writer at times
    /// (a write whose eviction must be durable first), so the process needs a second worker thread.
    pub fn keeps_oplog(&self, file: &FileConfig) -> bool {
        let m = &self.master;
        m.etcd.is_some() || m.data_dir.is_some() || file.server.etcd.is_some() || file.server.data_dir.is_some()
    }

    /// Whether this `up`'s node has a disk tier: a write that finds memory full then waits for the copies to disk
    /// its eviction started (the node makes them on the same runtime), so the process needs a second worker
    /// thread; on one, the write could not wait and would be refused `NO_AVAILABLE_HANDLE`.
    pub fn has_disk_tier(&self, file: &FileConfig) -> bool {
        self.segments.ssd_dir.is_some() || file.node.ssd_dir.is_some()
    }
}

/// The leader lease TTL of a candidate, in seconds (the original's).
const DEFAULT_LEADER_LEASE_TTL: u64 = 5;

/// A flag's help line with its default, e.g. `Segments to host [default: 1]`.
fn dflt(help: &str, default: impl std::fmt::Display) -> String {
    format!("{help} [default: {default}]")
}

fn addr(s: &str) -> Result<SocketAddr> {
    s.parse().with_context(|| format!("invalid address {s:?}"))
}

/// The master RPC server's connection limits: flags over `[server]` over defaults.
fn rpc_limits(a: &LimitArgs, file: &FileConfig) -> Result<RpcLimits> {
    let f = &file.server;
    let mut limits = RpcLimits::default();
    if let Some(n) = a.max_connections.or(f.max_connections) {
        limits.max_connections = n;
    }
    if let Some(ms) = a.frame_timeout_ms.or(f.frame_timeout_ms) {
        limits.frame_timeout = Duration::from_millis(ms);
    }
    if let Some(size) = f.frame_budget.as_deref() {
        limits.frame_budget =
            usize::try_from(crate::parse_size(size).map_err(|e| anyhow!("[server] frame_budget: {e}"))?)?;
    }
    Ok(limits)
}

fn master_config(a: &MasterArgs, file: &FileConfig) -> Result<MasterConfig> {
    let mut c = file.server.master.clone();
    if let Some(v) = a.lease_ttl_ms {
        c.lease_ttl_ms = v;
    }
    if let Some(v) = a.client_ttl_ms {
        c.client_ttl_ms = v;
    }
    if let Some(v) = a.disconnect_grace_ms {
        c.disconnect_grace_ms = v;
    }
    if let Some(v) = a.nof_heartbeat_interval_ms {
        c.nof_heartbeat_interval_ms = v;
    }
    if let Some(v) = a.nof_probe_timeout_ms {
        c.nof_probe_timeout_ms = v;
    }
    if let Some(v) = a.nof_heartbeat_failures {
        c.nof_heartbeat_failures = v;
    }
    if let Some(v) = a.eviction_high_watermark {
        c.eviction_high_watermark = v;
    }
    if let Some(v) = a.eviction_ratio {
        c.eviction_ratio = v;
    }
    if let Some(v) = a.multi_tenant {
        c.enable_multi_tenants = v;
    }
    if let Some(p) = a.placement {
        c.placement_policy = p;
    }
    if let Some(v) = a.replica_task_timeout_ms {
        c.replica_task_timeout_ms = v;
    }
    if let Some(v) = a.pending_task_timeout_ms {
        c.pending_task_timeout_ms = v;
    }
    if let Some(v) = a.max_pending_tasks {
        c.max_pending_tasks = v;
    }
    if let Some(v) = a.max_finished_tasks {
        c.max_finished_tasks = v;
    }
    if let Some(v) = a.task_retry_attempts {
        c.task_retry_attempts = v;
    }
    Ok(c)
}

/// How long the master's idle connections poll before parking, unless the config says. `crescent up` runs the
/// master and the node on one runtime, where a polling connection holds a worker the node needs (measured on
/// the 2-vCPU VM, 4 KiB puts/gets against `up` ran ~1.6× faster with it off); there the runtime polls all
/// connections at once instead (`[node] poll_us`). A separate master process runs ~2× faster with it on.
fn default_poll(combined: bool) -> Duration {
    if combined { Duration::ZERO } else { crescent_net::poll::DEFAULT_POLL_WINDOW }
}

/// A started master and the address it tells others to reach it at.
struct Started {
    server: MasterServer,
    advertised: SocketAddr,
    admin: Option<SocketAddr>,
    /// The cluster secret(s) it authenticates with (an embedded node's keys derive from them).
    keyring: Option<Arc<Keyring>>,
}

/// A master's settings: flags over `[server]` over defaults.
struct Settings {
    config: MasterConfig,
    listen: SocketAddr,
    admin: SocketAddr,
    poll: Duration,
    limits: RpcLimits,
    /// The cluster secret(s), if the cluster authenticates.
    keyring: Option<Arc<Keyring>>,
    /// TLS, if the master serves it (and dials nodes through it).
    tls: crescent_net::tls::Tls,
    /// The KV event stream, if published.
    events: Option<EventsConfig>,
}

/// The KV event stream's settings: flags over `[server]` keys; `None` when no endpoint is given.
fn events_config(a: &MasterArgs, file: &FileConfig) -> Option<EventsConfig> {
    let f = &file.server;
    let endpoint = a.kv_events.clone().or_else(|| f.kv_events.clone())?;
    let mut c = EventsConfig::new(endpoint);
    if let Some(id) = a.kv_events_backend_id.clone().or_else(|| f.kv_events_backend_id.clone()) {
        c.backend_id = id;
    }
    if let Some(n) = a.kv_events_queue_capacity.or(f.kv_events_queue_capacity) {
        c.queue_capacity = n;
    }
    // The file's size was checked when the file was read.
    let from_file = f.kv_events_subscriber_buffer.as_deref().and_then(|s| crate::parse_size(s).ok());
    if let Some(n) = a.kv_events_subscriber_buffer.or(from_file) {
        c.subscriber_buffer = usize::try_from(n).unwrap_or(usize::MAX);
    }
    Some(c)
}

fn master_settings(a: &MasterArgs, file: &FileConfig, combined: bool) -> Result<Settings> {
    let config = master_config(a, file)?;
    let listen = addr(a.listen.as_deref().or(file.server.listen.as_deref()).unwrap_or(DEFAULT_MASTER))?;
    let admin = match a.admin.as_deref().or(file.server.admin.as_deref()) {
        Some(s) => addr(s)?,
        // Loopback unless asked: its read routes are open to scrapers (issue 17).
        None => SocketAddr::from(([127, 0, 0, 1], if listen.port() == 0 { 0 } else { DEFAULT_ADMIN_PORT })),
    };
    let poll = file.server.poll_us.map_or(default_poll(combined), Duration::from_micros);
    let mut limits = rpc_limits(&a.limits, file)?;
    if combined {
        limits.max_connections = limits.max_connections.min(up_share(crescent_net::accept::fitting_cap(usize::MAX)));
    }
    let keyring = a.auth.keyring()?;
    let tls = a.auth.tls()?;
    a.auth.guard(keyring.is_some(), &tls, &[("rpc", listen), ("admin", admin)])?;
    crate::auth::reload_on_hangup(keyring.clone(), None, tls.clone(), "master")?;
    let events = events_config(a, file);
    Ok(Settings { config, listen, admin, poll, limits, keyring, tls, events })
}

async fn start_master(a: &MasterArgs, file: &FileConfig, combined: bool) -> Result<Started> {
    let Settings { config, listen, admin, poll, limits, keyring, tls, events } = master_settings(a, file, combined)?;
    let advertise = a.advertise.as_deref().or(file.server.advertise.as_deref());
    let oplog = oplog_options(a, file).await?;
    let snapshots =
        crate::snapshots::snapshot_options(&a.snapshots, file, oplog.is_some(), data_dir(a, file).as_deref())?;
    let server = MasterServer::builder(config.clone())
        .rpc_addr(listen)
        .admin_addr(Some(admin))
        .poll_window(poll)
        .limits(limits)
        .oplog(oplog)
        .snapshots(snapshots)
        .keyring(keyring.clone())
        .tls(tls)
        .events(events)
        .start()
        .await?;
    let advertised = crescent_net::advertise::advertised(server.rpc_addr(), advertise)
        .with_context(|| format!("advertised host {advertise:?}"))?;
    let admin = match server.admin_addr() {
        Some(a) => Some(crescent_net::advertise::advertised(a, advertise)?),
        None => None,
    };
    tracing::info!(
        "master listening on {} (advertised as {advertised}), admin {}, poll {poll:?}, at most {} connections, \
         frame timeout {:?}, large-frame budget {}; {config:?}",
        server.rpc_addr(),
        admin.map_or("off".to_owned(), |a| a.to_string()),
        server.rpc_stats().max_connections,
        limits.frame_timeout,
        crate::ops::fmt_bytes(limits.frame_budget as u64),
    );
    Ok(Started { server, advertised, admin, keyring })
}

/// `embedded`: the keyring of the master sharing the process (`up`), which the node's keys derive from.
fn node_config(
    a: &NodeArgs,
    master: &str,
    file: &FileConfig,
    default_listen: SocketAddr,
    embedded: Option<&Arc<Keyring>>,
) -> Result<NodeConfig> {
    let (n, g) = (&file.node, &a.segments);
    let size = g.segment_size.as_deref().or(n.segment_size.as_deref()).unwrap_or(DEFAULT_SEGMENT_SIZE);
    let mut c = NodeConfig::new(master, crate::parse_size(size).map_err(|e| anyhow!(e))?);
    c.listen = match a.listen.as_deref().or(n.listen.as_deref()) {
        Some(s) => addr(s)?,
        None => default_listen,
    };
    c.advertise = a.advertise.clone().or_else(|| n.advertise.clone());
    c.segments = g.segments.or(n.segments).unwrap_or(DEFAULT_SEGMENTS);
    c.memfd = g.memfd.or(n.memfd).unwrap_or(DEFAULT_MEMFD);
    c.prefault = match g.prefault.or(n.prefault).unwrap_or(DEFAULT_PREFAULT) {
        true => crescent_node::Prefault::Whole,
        false => crescent_node::Prefault::Off,
    };
    c.host_id = g.host_id.clone().or_else(|| n.host_id.clone());
    c.disk = disk_settings(g, n)?;
    c.local_lanes = n.local_lanes.unwrap_or(true);
    // No per-connection polling (see `TransferServer::with_poll_window`): the node's runtime polls all its
    // connections at once before it sleeps (`[node] poll_us`, installed with the runtime).
    c.poll_window = Duration::ZERO;
    // A master that is not up yet (started after the node, or restarting) is waited for.
    c.master_retry = Some(Backoff::default());
    if let Some(max) = a.limits.max_connections.or(n.max_connections) {
        c.max_connections = max;
    }
    if let Some(ms) = a.limits.frame_timeout_ms.or(n.frame_timeout_ms) {
        c.frame_timeout = Duration::from_millis(ms);
    }
    c.keys = match embedded {
        Some(ring) => Some(Arc::new(NodeKeys::derived(ring.clone(), Principal::Node(None)))),
        None => crate::auth::node_keys(a.credential_file.as_deref(), &a.auth)?,
    };
    c.tls = a.auth.tls()?;
    a.auth.guard(c.keys.is_some(), &c.tls, &[("data plane", c.listen)])?;
    if embedded.is_none() {
        crate::auth::reload_on_hangup(None, c.keys.clone(), c.tls.clone(), "node")?;
    }
    Ok(c)
}

/// The disk tier of `--ssd-dir`/`--ssd-size` (or `[node] ssd_dir`/`ssd_size`): both or neither.
fn disk_settings(g: &SegmentArgs, n: &crate::config::NodeSection) -> Result<Option<crescent_node::DiskSettings>> {
    let dir = g.ssd_dir.clone().or_else(|| n.ssd_dir.clone());
    let size = g.ssd_size.as_deref().or(n.ssd_size.as_deref());
    match (dir, size) {
        (None, None) => Ok(None),
        (Some(_), None) => bail!("--ssd-dir needs --ssd-size (the bytes the disk tier may take, e.g. 100GiB)"),
        (None, Some(_)) => bail!("--ssd-size needs --ssd-dir (the directory on the SSD that holds the tier)"),
        (Some(dir), Some(size)) => {
            let bytes = crate::parse_size(size).map_err(|e| anyhow!(e))?;
            let block = crescent_proto::DISK_BLOCK;
            if bytes < block {
                bail!("--ssd-size {size} is less than one {block}-byte block");
            }
            Ok(Some(crescent_node::DiskSettings { dir, size: bytes / block * block }))
        }
    }
}

/// One start-up line with a node's effective settings.
fn log_node_config(c: &NodeConfig) {
    tracing::info!(
        "node starting: master {}, listen {}, advertise {}, {} × {} segment{}, memfd {}, prefault {}, host {}, \
         at most {} connections, frame timeout {:?}, disk tier {}",
        c.master,
        c.listen,
        c.advertise.as_deref().unwrap_or("(auto)"),
        c.segments,
        crate::ops::fmt_bytes(c.segment_size),
        if c.segments == 1 { "" } else { "s" },
        c.memfd,
        c.prefault,
        c.host_id.as_deref().unwrap_or("(advertised IP)"),
        crescent_net::accept::fitting_cap(c.max_connections),
        c.frame_timeout,
        c.disk.as_ref().map_or("none".to_owned(), |d| format!(
            "{} in {}",
            crate::ops::fmt_bytes(d.size),
            d.dir.display()
        )),
    );
}

/// Resolves once SIGINT or SIGTERM arrives; the handlers are installed when this is called, so a signal
/// that comes before the future is first polled is not lost (nor kills the process).
fn signal() -> Result<impl std::future::Future<Output = ()>> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}

fn print_ready(v: serde_json::Value) {
    println!("{v}");
}

/// `crescent master`: with an oplog a candidate — one of the cluster's with etcd, the only one (an in-process
/// coordinator) with a data directory —, without one a lone master.
pub async fn master(a: MasterArgs, file: &FileConfig) -> Result<()> {
    let stop = signal()?;
    if let Some(oplog) = oplog_options(&a, file).await? {
        return candidate(a, file, oplog, stop).await;
    }
    let m = start_master(&a, file, false).await?;
    print_ready(serde_json::json!({ "master": m.advertised.to_string(), "admin": m.admin.map(|a| a.to_string()) }));
    stop.await;
    tracing::info!("master stopping");
    m.server.shutdown().await;
    tracing::info!("master stopped");
    Ok(())
}

/// How long `crescent master --etcd` waits for its first role before it reports itself ready as a standby.
const FIRST_ROLE_WAIT: Duration = Duration::from_secs(10);

/// `crescent master --etcd …`: a candidate. Ready once it leads or knows another leader.
async fn candidate(
    a: MasterArgs,
    file: &FileConfig,
    oplog: crescent_master::ha::OpLogOptions,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    use crescent_ha::leader::{EtcdCoordinator, EtcdCoordinatorConfig, LeaderCoordinator, LocalCoordinator};
    use crescent_master::server::CandidateOptions;
    // The flags choose the backend as a whole (see `oplog_options`): the file's etcd only without --data-dir.
    let etcd = a.etcd.clone().or_else(|| a.data_dir.is_none().then(|| file.server.etcd.clone()).flatten());
    let ttl = a.leader_lease_ttl.or(file.server.leader_lease_ttl).unwrap_or(DEFAULT_LEADER_LEASE_TTL);
    let coordinator: std::sync::Arc<dyn LeaderCoordinator> = match etcd {
        Some(endpoints) => {
            let endpoints: Vec<String> =
                endpoints.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect();
            let mut coord = EtcdCoordinatorConfig::new(endpoints.clone(), oplog.cluster.clone());
            coord.ttl = Duration::from_secs(ttl);
            let c = EtcdCoordinator::connect(coord)
                .await
                .with_context(|| format!("leader election in etcd at {}", endpoints.join(",")))?;
            std::sync::Arc::new(c)
        }
        // The embedded mode: this master is the only candidate; its views count on from the log's producer view.
        None => {
            let storage = crescent_master::ha::master_storage(&oplog)?;
            let after = storage.read_producer_view().await.context("reading the oplog's producer view")?;
            std::sync::Arc::new(LocalCoordinator::new(after.unwrap_or(0)))
        }
    };
    let mut options = CandidateOptions::new(coordinator);
    options.advertise = a.advertise.clone().or_else(|| file.server.advertise.clone());
    let snapshots = crate::snapshots::snapshot_options(&a.snapshots, file, true, data_dir(&a, file).as_deref())?;
    let s = master_settings(&a, file, false)?;
    let cluster = oplog.cluster.clone();
    let server = MasterServer::builder(s.config.clone())
        .rpc_addr(s.listen)
        .admin_addr(Some(s.admin))
        .poll_window(s.poll)
        .limits(s.limits)
        .oplog(Some(oplog))
        .snapshots(snapshots)
        .keyring(s.keyring)
        .tls(s.tls)
        .events(s.events)
        .start_candidate(options)
        .await?;
    tracing::info!(
        "master candidate of cluster {cluster} listening on {} (advertised as {}), admin {}, leadership {}; {:?}",
        server.rpc_addr(),
        server.advertised(),
        server.admin_addr().map_or("off".to_owned(), |a| a.to_string()),
        server.status().coordinator,
        s.config,
    );
    let mut status = server.subscribe();
    let _ = tokio::time::timeout(
        FIRST_ROLE_WAIT,
        status.wait_for(|st| st.is_leader() || (st.leader.is_some() && st.view_version > 0)),
    )
    .await;
    let role = server.status().role();
    print_ready(serde_json::json!({
        "master": server.advertised().to_string(),
        "admin": server.admin_advertised().map(|a| a.to_string()),
        "role": role,
        "cluster": cluster,
    }));
    stop.await;
    tracing::info!("master candidate stopping");
    server.shutdown().await;
    tracing::info!("master candidate stopped");
    Ok(())
}

/// `crescent node`. A master that cannot be reached yet is retried (see [`NodeConfig::master_retry`]) until
/// it answers or a signal ends the wait.
pub async fn node(a: NodeArgs, master: &str, file: &FileConfig) -> Result<()> {
    let stop = signal()?;
    let config = node_config(&a, master, file, DEFAULT_NODE_LISTEN.parse()?, None)?;
    log_node_config(&config);
    let grace =
        Duration::from_millis(a.shutdown_grace_ms.or(file.node.shutdown_grace_ms).unwrap_or(DEFAULT_SHUTDOWN_GRACE_MS));
    tokio::pin!(stop);
    let node = tokio::select! {
        n = StorageNode::start(config) => n.map_err(|e| anyhow!("{}: {e}", e.code()))?,
        () = &mut stop => {
            tracing::info!("node stopping before it mounted");
            return Ok(());
        }
    };
    print_ready(serde_json::json!({ "node": node.endpoint().to_string() }));
    stop.await;
    tracing::info!("node stopping");
    node.shutdown(grace).await.map_err(|e| anyhow!("{}: {e}", e.code()))?;
    tracing::info!("node stopped");
    Ok(())
}

/// The connections each of `crescent up`'s two servers (master RPC, storage node) may take when `fits` fit
/// under the process's open-file limit: half of what the admin port's cap leaves. Sized apart, each server
/// would fit its cap to the whole limit, and together they could take the descriptors the other needs.
fn up_share(fits: usize) -> usize {
    (fits.saturating_sub(crescent_master::server::ADMIN_MAX_CONNECTIONS) / 2).max(1)
}

/// `crescent up`: a master and one storage node in this process.
pub async fn up(a: UpArgs, file: &FileConfig) -> Result<()> {
    let stop = signal()?;
    let tls = a.master.auth.tls()?;
    if tls.server.is_some() && tls.client.is_none() {
        bail!("TLS on `up` needs --tls-ca too: its storage node dials its master through TLS");
    }
    let m = start_master(&a.master, file, true).await?;
    let node_args = NodeArgs {
        listen: a.node_listen.clone(),
        advertise: a.master.advertise.clone(),
        segments: a.segments,
        shutdown_grace_ms: None,
        limits: LimitArgs::default(),
        credential_file: None,
        auth: a.master.auth.clone(),
    };
    let listen = SocketAddr::new(m.server.rpc_addr().ip(), 0);
    let mut config = node_config(&node_args, &m.advertised.to_string(), file, listen, m.keyring.as_ref())?;
    config.max_connections = config.max_connections.min(up_share(crescent_net::accept::fitting_cap(usize::MAX)));
    log_node_config(&config);
    let node = StorageNode::start(config).await.map_err(|e| anyhow!("{}: {e}", e.code()))?;
    print_ready(serde_json::json!({
        "master": m.advertised.to_string(),
        "admin": m.admin.map(|a| a.to_string()),
        "node": node.endpoint().to_string(),
    }));
    stop.await;
    tracing::info!("stopping");
    node.shutdown(Duration::ZERO).await.map_err(|e| anyhow!("{}: {e}", e.code()))?;
    m.server.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_splits_the_descriptors_between_its_servers() {
        // Under `ulimit -n 1024` (896 connections fit beside the headroom): 416 each, plus 64 for the admin port.
        assert_eq!(up_share(896), 416);
        assert_eq!(2 * up_share(896) + crescent_master::server::ADMIN_MAX_CONNECTIONS, 896);
        assert_eq!(up_share(10), 1, "each server takes at least one connection");
        assert_eq!(up_share(usize::MAX), (usize::MAX - 64) / 2);
    }

    #[test]
    fn nof_heartbeat_settings_come_from_the_flag_then_the_file_then_the_default() {
        let file = FileConfig::parse("[server]\nnof_heartbeat_interval_ms = 2000\nnof_heartbeat_failures = 4\n")
            .unwrap_or_else(|e| panic!("{e:#}"));
        let flags = MasterArgs { nof_heartbeat_failures: Some(7), ..MasterArgs::default() };
        let c = master_config(&flags, &file).unwrap_or_else(|e| panic!("{e:#}"));
        let default = MasterConfig::default();
        assert_eq!(
            (c.nof_heartbeat_interval_ms, c.nof_probe_timeout_ms, c.nof_heartbeat_failures),
            (2000, default.nof_probe_timeout_ms, 7)
        );
        let flags = MasterArgs { nof_probe_timeout_ms: Some(250), ..MasterArgs::default() };
        assert_eq!(master_config(&flags, &FileConfig::default()).map(|c| c.nof_probe_timeout_ms).ok(), Some(250));
    }

    #[test]
    fn task_settings_come_from_the_flag_then_the_file_then_the_default() {
        let file = FileConfig::parse("[server]\nreplica_task_timeout_ms = 2000\nmax_pending_tasks = 4\n")
            .unwrap_or_else(|e| panic!("{e:#}"));
        let flags = MasterArgs { max_pending_tasks: Some(7), task_retry_attempts: Some(1), ..MasterArgs::default() };
        let c = master_config(&flags, &file).unwrap_or_else(|e| panic!("{e:#}"));
        let d = MasterConfig::default();
        assert_eq!(
            (c.replica_task_timeout_ms, c.pending_task_timeout_ms, c.max_pending_tasks, c.max_finished_tasks),
            (2000, d.pending_task_timeout_ms, 7, d.max_finished_tasks)
        );
        assert_eq!(c.task_retry_attempts, 1);
    }

    #[test]
    fn the_event_stream_comes_from_the_flags_then_the_file() {
        let none = FileConfig::default();
        assert!(events_config(&MasterArgs::default(), &none).is_none(), "off unless an endpoint is given");
        let file = FileConfig::parse(
            "[server]\nkv_events = \"tcp://127.0.0.1:1\"\nkv_events_backend_id = \"f\"\nkv_events_subscriber_buffer = \"1MiB\"\n",
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        let c = events_config(&MasterArgs::default(), &file).unwrap_or_else(|| panic!("on"));
        assert_eq!((c.endpoint.as_str(), c.backend_id.as_str()), ("tcp://127.0.0.1:1", "f"));
        assert_eq!(c.queue_capacity, crescent_master::events::DEFAULT_QUEUE_CAPACITY);
        assert_eq!(c.subscriber_buffer, 1 << 20);
        assert!(FileConfig::parse("[server]\nkv_events_subscriber_buffer = \"lots\"\n").is_err());
        let flags = MasterArgs {
            kv_events: Some("tcp://0.0.0.0:2".into()),
            kv_events_queue_capacity: Some(5),
            kv_events_subscriber_buffer: Some(4096),
            ..MasterArgs::default()
        };
        let c = events_config(&flags, &file).unwrap_or_else(|| panic!("on"));
        assert_eq!((c.endpoint.as_str(), c.backend_id.as_str(), c.queue_capacity), ("tcp://0.0.0.0:2", "f", 5));
        assert_eq!(c.subscriber_buffer, 4096);
    }

    async fn err(a: MasterArgs, f: &FileConfig) -> String {
        format!("{:#}", oplog_options(&a, f).await.err().unwrap_or_else(|| panic!("accepted")))
    }

    #[tokio::test]
    async fn a_bad_oplog_combination_is_refused_with_its_reason() {
        let none = FileConfig::default();
        // Beside --etcd, --data-dir is the master's local directory: the oplog stays in etcd (here unreachable).
        let both =
            MasterArgs { etcd: Some("127.0.0.1:1".into()), data_dir: Some("/tmp/x".into()), ..Default::default() };
        assert!(err(both, &none).await.contains("--cluster-id"), "the etcd oplog, not a refusal of the pair");
        let no_cluster = MasterArgs { etcd: Some("127.0.0.1:1".into()), ..Default::default() };
        assert!(err(no_cluster, &none).await.contains("--cluster-id"));
        let lone = MasterArgs { cluster_id: Some("c".into()), ..Default::default() };
        assert!(err(lone, &none).await.contains("needs --etcd or --data-dir"));
        let file = FileConfig::parse("[server]\netcd = \"127.0.0.1:1\"\ndata_dir = \"/tmp/x\"\n")
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert!(err(MasterArgs::default(), &file).await.contains("--cluster-id"));
        assert_eq!(data_dir(&MasterArgs::default(), &file), Some("/tmp/x".into()));
        assert!(oplog_options(&MasterArgs::default(), &none).await.is_ok_and(|o| o.is_none()), "neither: no oplog");
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = FileConfig::parse(&format!("[server]\ndata_dir = {:?}\n", dir.path().display().to_string()))
            .unwrap_or_else(|e| panic!("{e:#}"));
        let o = oplog_options(&MasterArgs::default(), &file).await.unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(o.map(|o| o.cluster), Some("crescent".to_owned()), "the file's data_dir, default cluster id");
    }
}
