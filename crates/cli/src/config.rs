//! The TOML config file. Every flag has a key here; the command line wins over the file, the file over
//! built-in defaults.

use anyhow::{Context, Result};
use crescent_master::service::MasterConfig;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A file that sets a key in every section (tests and the config fuzzer's seed corpus start from it).
pub const EXAMPLE: &str = r#"
master = "10.0.0.1:1"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:9003"
advertise = "10.0.0.2"
lease_ttl_ms = 5000
nof_heartbeat_interval_ms = 2000
nof_probe_timeout_ms = 300
nof_heartbeat_failures = 5
enable_multi_tenants = true
placement_policy = "local-first"
replica_task_timeout_ms = 20000
max_pending_tasks = 500
poll_us = 0
max_connections = 2000
frame_timeout_ms = 5000
frame_budget = "64MiB"
etcd = "10.0.0.5:2379,10.0.0.6:2379,10.0.0.7:2379"
cluster_id = "prod-1"
leader_lease_ttl = 3
data_dir = "/var/lib/crescent"
snapshot_dir = "/var/lib/crescent/snapshots"
snapshot_s3 = "s3://crescent-snapshots/prod-1"
snapshot_s3_endpoint = "http://10.0.0.9:9000"
snapshot_s3_region = "us-east-1"
snapshot_interval = "10m"
snapshot_retain = 3
kv_events = "tcp://127.0.0.1:5557"
kv_events_backend_id = "pool-a"
kv_events_queue_capacity = 1024
kv_events_subscriber_buffer = "8MiB"
cxl_window = 68719476736
[node]
listen = "0.0.0.0:0"
host_id = "rack-1-host-7"
segment_size = "64MiB"
advertise = "node-1.example"
segments = 2
prefault = false
poll_us = 20
threads = 3
max_connections = 1000
frame_timeout_ms = 20000
local_lanes = false
ssd_dir = "/mnt/nvme0/crescent"
ssd_size = "100GiB"
[client]
replicas = 2
stripe_size = "1MiB"
write_stripe_size = "8MiB"
poll_us = 7
request_timeout = "750ms"
local_lanes = false
"#;

/// The default master address (and `crescent master`'s listen address).
pub const DEFAULT_MASTER: &str = "127.0.0.1:50051";
/// The master's admin HTTP port when its RPC port is fixed.
pub const DEFAULT_ADMIN_PORT: u16 = 9003;
/// `crescent node`'s default data-plane listen address.
pub const DEFAULT_NODE_LISTEN: &str = "127.0.0.1:0";
/// Bytes per segment by default.
pub const DEFAULT_SEGMENT_SIZE: &str = "1GiB";
/// Segments a node hosts by default.
pub const DEFAULT_SEGMENTS: usize = 1;
/// Whether segments are memfd-backed by default.
pub const DEFAULT_MEMFD: bool = false;
/// Whether segment memory is backed at start-up by default.
pub const DEFAULT_PREFAULT: bool = true;
/// Milliseconds a node keeps serving reads after SIGTERM by default.
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 0;

/// Settings of `crescent master` / `up`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct ServerSection {
    /// RPC listen address.
    pub listen: Option<String>,
    /// Admin HTTP listen address.
    pub admin: Option<String>,
    /// Host (IP or name) the master is reached at (default: the listen IP, or this host's primary address).
    pub advertise: Option<String>,
    /// Microseconds an idle RPC connection polls for its next request before parking (0 = never).
    pub poll_us: Option<u64>,
    /// Most RPC connections served at once (default 4096, lowered to fit the open-file limit).
    pub max_connections: Option<usize>,
    /// Milliseconds a peer may take over its hello, the rest of a frame it started, or taking a reply
    /// (default 10000).
    pub frame_timeout_ms: Option<u64>,
    /// Bytes of large frames (over 16 KiB) all RPC connections may hold at once, e.g. "32MiB" (the default; at
    /// least one 16 MiB frame).
    pub frame_budget: Option<String>,
    /// etcd endpoints of the oplog, `host:port` separated by commas (with `cluster_id`).
    pub etcd: Option<String>,
    /// Leader lease TTL in seconds of a `crescent master` candidate (with `etcd`).
    pub leader_lease_ttl: Option<u64>,
    /// The oplog's namespace.
    pub cluster_id: Option<String>,
    /// Directory of the embedded oplog store.
    pub data_dir: Option<String>,
    /// Directory of the master's snapshots.
    pub snapshot_dir: Option<String>,
    /// `s3://bucket[/prefix]` of the master's snapshots.
    pub snapshot_s3: Option<String>,
    /// S3-compatible endpoint for `snapshot_s3`.
    pub snapshot_s3_endpoint: Option<String>,
    /// S3 region for `snapshot_s3`.
    pub snapshot_s3_region: Option<String>,
    /// Time between snapshots (e.g. "10m").
    pub snapshot_interval: Option<String>,
    /// Snapshots kept.
    pub snapshot_retain: Option<usize>,
    /// Where the KV event stream is published (`tcp://HOST:PORT`; none: off).
    pub kv_events: Option<String>,
    /// The `backend_id` every KV event carries.
    pub kv_events_backend_id: Option<String>,
    /// KV events queued at most before the oldest are dropped (0: unbounded).
    pub kv_events_queue_capacity: Option<usize>,
    /// Bytes of KV event messages a subscriber may have waiting before its messages are skipped.
    pub kv_events_subscriber_buffer: Option<String>,
    /// Master behaviour (lease, TTLs, eviction, tenants, placement).
    #[serde(flatten)]
    pub master: MasterConfig,
    /// Keys neither above nor in the master's settings (refused at load: serde cannot deny unknown fields
    /// next to a flattened struct, so they are collected here).
    #[serde(flatten)]
    pub unknown: std::collections::BTreeMap<String, toml::Value>,
}

/// Settings of `crescent node` (and the node inside `up`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeSection {
    /// Data-plane listen address.
    pub listen: Option<String>,
    /// Host (IP or name) other hosts reach this node at (default: the listen IP, or this host's primary address).
    pub advertise: Option<String>,
    /// Bytes per segment (e.g. "1GiB").
    pub segment_size: Option<String>,
    /// Segments to host.
    pub segments: Option<usize>,
    /// memfd-backed segments.
    pub memfd: Option<bool>,
    /// Back segments with memory at start-up (default true; false leaves pages to fault on first write, for
    /// segments larger than the host's memory, e.g. a metadata-only benchmark).
    pub prefault: Option<bool>,
    /// Host id for local-first placement.
    pub host_id: Option<String>,
    /// Milliseconds to keep serving reads after SIGTERM before unmounting.
    pub shutdown_grace_ms: Option<u64>,
    /// Microseconds the node's runtime polls all its connections before it sleeps (default 50; 0 = never).
    pub poll_us: Option<u64>,
    /// Runtime threads of `crescent node` and `up` (default: half the CPUs, at least one; 1 = single-threaded).
    pub threads: Option<usize>,
    /// Most data-plane connections served at once (default 4096, lowered to fit the open-file limit).
    pub max_connections: Option<usize>,
    /// Milliseconds a peer may take over its hello, the rest of a frame it started, or taking a reply
    /// (default 30000).
    pub frame_timeout_ms: Option<u64>,
    /// Serve clients on this host over a Unix socket too, their payloads spared the TCP stack (default true;
    /// never beside TLS).
    pub local_lanes: Option<bool>,
    /// The disk tier's directory (on the node's SSD); with `ssd_size`. Default: no disk tier.
    pub ssd_dir: Option<std::path::PathBuf>,
    /// Bytes of the disk tier (e.g. "100GiB").
    pub ssd_size: Option<String>,
}

/// Settings of client commands.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientSection {
    /// Replicas per object.
    pub replicas: Option<u32>,
    /// Data-plane lanes per peer.
    pub lanes: Option<usize>,
    /// Reads larger than this are striped over several lanes (e.g. "512KiB").
    pub stripe_size: Option<String>,
    /// Writes larger than this are striped over several lanes (e.g. "2MiB").
    pub write_stripe_size: Option<String>,
    /// Microseconds a request polls for its reply before parking (0 = never).
    pub poll_us: Option<u64>,
    /// How long a master request (per master address) or a storage-node exchange may take (e.g. "500ms",
    /// "5s"; default 5s).
    pub request_timeout: Option<String>,
    /// Reach storage nodes on this host over their Unix socket when they offer one (default true).
    pub local_lanes: Option<bool>,
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    /// Master address for client commands and nodes.
    pub master: Option<String>,
    /// Tenant for client commands.
    pub tenant: Option<String>,
    /// `[server]`.
    pub server: ServerSection,
    /// `[node]`.
    pub node: NodeSection,
    /// `[client]`.
    pub client: ClientSection,
}

impl FileConfig {
    /// Reads the file (or the empty config when none is given).
    pub fn load(path: Option<&Path>) -> Result<Self> {
        let Some(path) = path else { return Ok(Self::default()) };
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// Parses and checks a config file's text: unknown keys and sizes that do not parse are refused.
    pub fn parse(text: &str) -> Result<Self> {
        let file: Self = toml::from_str(text)?;
        if let Some(key) = file.server.unknown.keys().next() {
            anyhow::bail!("unknown key `{key}` in [server]");
        }
        for (name, size) in [
            ("[client] stripe_size", &file.client.stripe_size),
            ("[client] write_stripe_size", &file.client.write_stripe_size),
            ("[server] frame_budget", &file.server.frame_budget),
            ("[server] kv_events_subscriber_buffer", &file.server.kv_events_subscriber_buffer),
        ] {
            if let Some(s) = size {
                crate::parse_size(s).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            }
        }
        if let Some(t) = &file.client.request_timeout {
            crate::parse_duration(t).map_err(|e| anyhow::anyhow!("[client] request_timeout: {e}"))?;
        }
        if let Some(t) = &file.server.snapshot_interval {
            crate::parse_duration(t).map_err(|e| anyhow::anyhow!("[server] snapshot_interval: {e}"))?;
        }
        Ok(file)
    }
}

/// Settings shared by client commands.
#[derive(Debug, Clone)]
pub struct Global {
    /// Master address.
    pub master: String,
    /// Tenant.
    pub tenant: String,
    /// `[client]` section.
    pub client: ClientSection,
    /// `--request-timeout`, else `[client] request_timeout`, else the client's default.
    pub request_timeout: Option<std::time::Duration>,
    /// What the client proves to an authenticating cluster (from the environment; see the binary's `auth`).
    pub credential: Option<crescent_net::auth::CredentialSource>,
    /// TLS to a cluster that serves it (from the `CRESCENT_TLS_*` environment; see the binary's `auth`).
    pub tls: Option<std::sync::Arc<crescent_net::tls::TlsClient>>,
}

impl Global {
    /// Flags over file over defaults.
    pub fn resolve(master: &Option<String>, tenant: &Option<String>, file: &FileConfig) -> Self {
        Self {
            master: master.clone().or_else(|| file.master.clone()).unwrap_or_else(|| DEFAULT_MASTER.to_owned()),
            tenant: tenant.clone().or_else(|| file.tenant.clone()).unwrap_or_default(),
            client: file.client.clone(),
            request_timeout: file.client.request_timeout.as_deref().and_then(|t| crate::parse_duration(t).ok()),
            credential: None,
            tls: None,
        }
    }

    /// A client config for these settings.
    pub fn client_config(&self) -> crescent_client::ClientConfig {
        let mut c = crescent_client::ClientConfig::new(self.master.clone());
        c.tenant = self.tenant.clone();
        if let Some(r) = self.client.replicas {
            c.replicate.replica_num = r;
        }
        if let Some(l) = self.client.lanes {
            c.transfer.lanes_per_peer = l;
        }
        if let Some(s) = self.client.stripe_size.as_deref().and_then(|s| crate::parse_size(s).ok()) {
            c.transfer.stripe_size = s;
        }
        if let Some(s) = self.client.write_stripe_size.as_deref().and_then(|s| crate::parse_size(s).ok()) {
            c.transfer.write_stripe_size = s;
        }
        if let Some(local) = self.client.local_lanes {
            c.transfer.local_lanes = local;
        }
        if let Some(us) = self.client.poll_us {
            c.poll_window = std::time::Duration::from_micros(us);
            c.transfer.poll_window = c.poll_window;
        }
        if let Some(t) = self.request_timeout {
            c = c.with_request_timeout(t);
        }
        c.with_credential(self.credential.clone()).with_tls(self.tls.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn file_sections_parse_and_unknown_keys_are_refused() {
        let f: FileConfig = toml::from_str(super::EXAMPLE).unwrap();
        assert_eq!(f.server.master.lease_ttl_ms, 5000);
        assert_eq!((f.server.master.replica_task_timeout_ms, f.server.master.max_pending_tasks), (20000, 500));
        assert!(f.server.unknown.is_empty(), "{:?}", f.server.unknown);
        assert_eq!(
            (f.server.advertise.as_deref(), f.node.advertise.as_deref()),
            (Some("10.0.0.2"), Some("node-1.example"))
        );
        assert!(f.server.master.enable_multi_tenants);
        assert_eq!(f.server.master.client_ttl_ms, MasterConfig::default().client_ttl_ms);
        let m = &f.server.master;
        assert_eq!((m.nof_heartbeat_interval_ms, m.nof_probe_timeout_ms, m.nof_heartbeat_failures), (2000, 300, 5));
        assert_eq!((f.node.segments, f.node.threads, f.node.prefault), (Some(2), Some(3), Some(false)));
        let g = Global::resolve(&None, &None, &f);
        assert_eq!(g.master, "10.0.0.1:1");
        assert_eq!(g.client_config().replicate.replica_num, 2);
        assert_eq!((f.server.poll_us, f.node.poll_us), (Some(0), Some(20)));
        assert_eq!((f.server.max_connections, f.server.frame_timeout_ms), (Some(2000), Some(5000)));
        assert_eq!((f.node.max_connections, f.node.frame_timeout_ms), (Some(1000), Some(20000)));
        assert_eq!(f.server.frame_budget.as_deref(), Some("64MiB"));
        assert!(FileConfig::parse("[server]\nframe_budget = \"lots\"\n").is_err());
        let c = g.client_config();
        assert_eq!((c.transfer.stripe_size, c.transfer.write_stripe_size), (1 << 20, 8 << 20));
        assert_eq!((c.poll_window, c.transfer.poll_window), (Duration::from_micros(7), Duration::from_micros(7)));
        assert_eq!((f.node.local_lanes, c.transfer.local_lanes), (Some(false), false));
        let t = Duration::from_millis(750);
        assert_eq!((c.request_timeout, c.transfer.io_timeout, c.transfer.connect_timeout), (t, t, t));
        let default = Global::resolve(&None, &None, &FileConfig::default()).client_config();
        assert_eq!(default.request_timeout, crescent_client::client::DEFAULT_REQUEST_TIMEOUT);
        let g = Global::resolve(&Some("x:1".into()), &None, &f);
        assert_eq!(g.master, "x:1", "the flag wins");
        assert!(toml::from_str::<FileConfig>("nonsense = 1").is_err());
    }

    #[test]
    fn a_misspelt_key_in_any_section_is_named() {
        let dir = std::env::temp_dir().join(format!("crescent-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (text, named) in [
            ("[node]\nsegment_sise = \"1GiB\"\n", "segment_sise"),
            ("[client]\nlanse = 2\n", "lanse"),
            ("[server]\nlistn = \"127.0.0.1:1\"\n", "listn"),
            ("[client]\nrequest_timeout = \"5\"\n", "request_timeout"),
        ] {
            let path = dir.join("c.toml");
            std::fs::write(&path, text).unwrap();
            let err = format!("{:#}", FileConfig::load(Some(&path)).unwrap_err());
            assert!(err.contains(named), "{err}");
        }
        let path = dir.join("ok.toml");
        std::fs::write(&path, "[server]\nlease_ttl_ms = 5\nlisten = \"127.0.0.1:0\"\n").unwrap();
        assert_eq!(FileConfig::load(Some(&path)).unwrap().server.master.lease_ttl_ms, 5);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
