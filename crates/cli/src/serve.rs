//! `crescent up | master | node`: long-running processes. Each prints one JSON line with its endpoints once
//! ready, then runs until SIGINT/SIGTERM.

use crate::config::{FileConfig, Global};
use anyhow::{Context, Result, anyhow};
use crescent_master::placement::PlacementPolicy;
use crescent_master::server::MasterServer;
use crescent_master::service::MasterConfig;
use crescent_node::{NodeConfig, StorageNode};
use std::net::SocketAddr;
use std::time::Duration;

/// Master flags (each also settable under `[server]` in the config file).
#[derive(clap::Args, Debug, Default)]
pub struct MasterArgs {
    /// RPC listen address (`127.0.0.1:0` picks a free port).
    #[arg(long)]
    listen: Option<String>,
    /// Admin HTTP listen address.
    #[arg(long)]
    admin: Option<String>,
    /// Read lease in ms.
    #[arg(long)]
    lease_ttl_ms: Option<u64>,
    /// Client liveness TTL in ms.
    #[arg(long)]
    client_ttl_ms: Option<u64>,
    /// Evict above this used ratio.
    #[arg(long)]
    eviction_high_watermark: Option<f64>,
    /// Fraction of objects one eviction round removes.
    #[arg(long)]
    eviction_ratio: Option<f64>,
    /// Namespaces and quotas per tenant.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    multi_tenant: Option<bool>,
    /// Placement policy: random, free-ratio-first, local-first.
    #[arg(long)]
    placement: Option<PlacementPolicy>,
}

/// Node flags (each also settable under `[node]`).
#[derive(clap::Args, Debug, Default)]
pub struct NodeArgs {
    /// Data-plane listen address.
    #[arg(long)]
    listen: Option<String>,
    /// Bytes per segment (e.g. 1GiB).
    #[arg(long)]
    segment_size: Option<String>,
    /// Segments to host.
    #[arg(long)]
    segments: Option<usize>,
    /// Back segments with memfd.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    memfd: Option<bool>,
    /// Back segment memory at start-up (default true; `--prefault false` for segments larger than memory).
    #[arg(long)]
    prefault: Option<bool>,
    /// Host id for local-first placement.
    #[arg(long)]
    host_id: Option<String>,
    /// Keep serving reads this long after SIGTERM before unmounting (ms).
    #[arg(long)]
    shutdown_grace_ms: Option<u64>,
}

/// `up` flags: the master's, plus the embedded node's size.
#[derive(clap::Args, Debug)]
pub struct UpArgs {
    #[command(flatten)]
    master: MasterArgs,
    /// Bytes of the embedded node's segment.
    #[arg(long)]
    segment_size: Option<String>,
    /// Data-plane listen address of the embedded node.
    #[arg(long)]
    node_listen: Option<String>,
}

fn addr(s: &str) -> Result<SocketAddr> {
    s.parse().with_context(|| format!("invalid address {s:?}"))
}

fn master_config(a: &MasterArgs, file: &FileConfig) -> Result<MasterConfig> {
    let mut c = file.server.master.clone();
    if let Some(v) = a.lease_ttl_ms {
        c.lease_ttl_ms = v;
    }
    if let Some(v) = a.client_ttl_ms {
        c.client_ttl_ms = v;
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
    Ok(c)
}

/// How long the master's idle connections poll before parking, unless the config says. `crescent up` runs the
/// master and the node on one runtime, where a polling connection holds a worker the node needs (measured on
/// the 2-vCPU VM, 4 KiB puts/gets against `up` ran ~1.6× faster with it off); there the runtime polls all
/// connections at once instead (`[node] poll_us`). A separate master process runs ~2× faster with it on.
fn default_poll(combined: bool) -> Duration {
    if combined { Duration::ZERO } else { crescent_net::poll::DEFAULT_POLL_WINDOW }
}

async fn start_master(a: &MasterArgs, file: &FileConfig, combined: bool) -> Result<MasterServer> {
    let config = master_config(a, file)?;
    let listen = addr(a.listen.as_deref().or(file.server.listen.as_deref()).unwrap_or(crate::config::DEFAULT_MASTER))?;
    let admin = match a.admin.as_deref().or(file.server.admin.as_deref()) {
        Some(s) => addr(s)?,
        None => SocketAddr::new(listen.ip(), if listen.port() == 0 { 0 } else { 9003 }),
    };
    let poll = file.server.poll_us.map_or(default_poll(combined), Duration::from_micros);
    Ok(MasterServer::builder(config).rpc_addr(listen).admin_addr(Some(admin)).poll_window(poll).start().await?)
}

fn node_config(a: &NodeArgs, master: &str, file: &FileConfig, default_listen: SocketAddr) -> Result<NodeConfig> {
    let n = &file.node;
    let size = a.segment_size.as_deref().or(n.segment_size.as_deref()).unwrap_or("1GiB");
    let mut c = NodeConfig::new(master, crate::parse_size(size).map_err(|e| anyhow!(e))?);
    c.listen = match a.listen.as_deref().or(n.listen.as_deref()) {
        Some(s) => addr(s)?,
        None => default_listen,
    };
    c.segments = a.segments.or(n.segments).unwrap_or(1);
    c.memfd = a.memfd.or(n.memfd).unwrap_or(false);
    c.prefault = a.prefault.or(n.prefault).unwrap_or(true);
    c.host_id = a.host_id.clone().or_else(|| n.host_id.clone());
    // No per-connection polling (see `TransferServer::with_poll_window`): the node's runtime polls all its
    // connections at once before it sleeps (`[node] poll_us`, installed with the runtime).
    c.poll_window = Duration::ZERO;
    Ok(c)
}

async fn wait_for_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}

fn admin_addr(m: &MasterServer) -> Option<String> {
    m.admin_addr().map(|a| a.to_string())
}

fn print_ready(v: serde_json::Value) {
    println!("{v}");
}

/// `crescent master`.
pub async fn master(a: MasterArgs, file: &FileConfig) -> Result<()> {
    let m = start_master(&a, file, false).await?;
    print_ready(serde_json::json!({ "master": m.rpc_addr().to_string(), "admin": admin_addr(&m) }));
    wait_for_signal().await?;
    tracing::info!("master stopping");
    m.shutdown().await;
    Ok(())
}

/// `crescent node`.
pub async fn node(a: NodeArgs, global: &Global, file: &FileConfig) -> Result<()> {
    let config = node_config(&a, &global.master, file, SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let grace = Duration::from_millis(a.shutdown_grace_ms.or(file.node.shutdown_grace_ms).unwrap_or(0));
    let node = StorageNode::start(config).await.map_err(|e| anyhow!("{}: {e}", e.code()))?;
    print_ready(serde_json::json!({ "node": node.endpoint().to_string() }));
    wait_for_signal().await?;
    node.shutdown(grace).await.map_err(|e| anyhow!("{}: {e}", e.code()))?;
    Ok(())
}

/// `crescent up`: a master and one storage node in this process.
pub async fn up(a: UpArgs, file: &FileConfig) -> Result<()> {
    let m = start_master(&a.master, file, true).await?;
    let node_args =
        NodeArgs { listen: a.node_listen.clone(), segment_size: a.segment_size.clone(), ..NodeArgs::default() };
    let config = node_config(&node_args, &m.rpc_addr().to_string(), file, SocketAddr::new(m.rpc_addr().ip(), 0))?;
    let node = StorageNode::start(config).await.map_err(|e| anyhow!("{}: {e}", e.code()))?;
    print_ready(serde_json::json!({
        "master": m.rpc_addr().to_string(),
        "admin": admin_addr(&m),
        "node": node.endpoint().to_string(),
    }));
    wait_for_signal().await?;
    node.shutdown(Duration::ZERO).await.map_err(|e| anyhow!("{}: {e}", e.code()))?;
    m.shutdown().await;
    Ok(())
}
