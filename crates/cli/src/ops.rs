//! Client commands: `put`, `get`, `rm`, `ls`, `stat`. Exit 0 on success; on failure a non-zero exit and the
//! error code's name on stderr (e.g. `OBJECT_NOT_FOUND`).

use crate::config::Global;
use crescent_client::{Client, ClientError, PutMode, PutOutcome};
use crescent_proto::{ErrorCode, ReplicaLocation};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// `put` flags.
#[derive(clap::Args, Debug)]
pub struct PutArgs {
    /// The key.
    key: String,
    /// File to store (`-` or absent: stdin).
    file: Option<PathBuf>,
    /// Replicas.
    #[arg(long, help = "Replicas to store, each on another node [default: 1]")]
    replicas: Option<u32>,
    /// Keep the value an existing key holds (put-if-absent) instead of replacing it; says when it existed.
    #[arg(long)]
    if_absent: bool,
    /// Make the object a member of this group (read, leased, evicted and removed together; fixed once set).
    #[arg(long, value_name = "GROUP")]
    group: Option<String>,
}

/// `get` flags.
#[derive(clap::Args, Debug)]
pub struct GetArgs {
    /// The key.
    key: String,
    /// Output file (default stdout).
    #[arg(short, long)]
    output: Option<PathBuf>,
}

/// `rm` flags.
#[derive(clap::Args, Debug)]
pub struct RmArgs {
    /// The key (omit with `--all` or `--group`).
    #[arg(required_unless_present_any = ["all", "group"])]
    key: Option<String>,
    /// Remove every object of the tenant (leased ones only with `--force`).
    #[arg(long, conflicts_with_all = ["key", "group"])]
    all: bool,
    /// Remove a whole group: every member, or none if one is leased (without `--force`) or being written.
    #[arg(long, value_name = "GROUP", conflicts_with = "key")]
    group: Option<String>,
    /// Remove even while a reader holds a lease.
    #[arg(long)]
    force: bool,
}

/// `ls` flags.
#[derive(clap::Args, Debug)]
pub struct LsArgs {
    /// Only keys starting with this.
    #[arg(long, default_value = "")]
    prefix: String,
    /// At most this many keys.
    #[arg(long, default_value_t = 10_000)]
    limit: u32,
    /// Print JSON (`{"keys": [...], "truncated": bool}`).
    #[arg(long)]
    json: bool,
}

/// `stat` flags.
#[derive(clap::Args, Debug)]
pub struct StatArgs {
    /// The key; without one, the cluster's storage tiers per node.
    key: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// A command failure: the wire code and a message.
#[derive(Debug)]
pub struct Failure(pub(crate) ErrorCode, pub(crate) String);

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Failure(e.code(), e.to_string())
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure(ErrorCode::FileReadFail, e.to_string())
    }
}

/// Exit status for a command result (prints the error code name on failure).
pub fn exit(r: Result<(), Failure>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        // Messages that already lead with their code (the master's and the client's refusals) print as they are.
        Err(Failure(code, msg))
            if msg.strip_prefix(code.name()).is_some_and(|r| r.is_empty() || r.starts_with(':')) =>
        {
            eprintln!("{msg}");
            ExitCode::from(1)
        }
        Err(Failure(code, msg)) => {
            eprintln!("{}: {msg}", code.name());
            ExitCode::from(1)
        }
    }
}

/// `crescent put`: replaces the key's value (upsert) unless `--if-absent`.
pub async fn put(a: PutArgs, g: &Global) -> Result<(), Failure> {
    let data = match a.file.as_deref() {
        None => read_stdin()?,
        Some(p) if p.as_os_str() == "-" => read_stdin()?,
        Some(p) => std::fs::read(p).map_err(|e| Failure(ErrorCode::FileReadFail, format!("{}: {e}", p.display())))?,
    };
    let mut cfg = g.client_config();
    if let Some(r) = a.replicas {
        cfg.replicate.replica_num = r;
    }
    cfg.replicate.group_id = a.group.clone();
    let replicate = cfg.replicate.clone();
    let client = client(g).await?;
    let mode = if a.if_absent { PutMode::IfAbsent } else { PutMode::Upsert };
    match client.put_with(&a.key, &data, &replicate, mode).await? {
        PutOutcome::Existed => eprintln!("key {:?} already exists; its value was kept (--if-absent)", a.key),
        PutOutcome::Stored { replicas } if replicas < replicate.replica_num as usize => eprintln!(
            "stored {replicas} replica{} of the {} asked: only {replicas} node{} had room",
            plural(replicas),
            replicate.replica_num,
            plural(replicas)
        ),
        PutOutcome::Stored { .. } => {}
    }
    Ok(())
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// A client for `g`, refusing a tenant the master would ignore (a master without multi-tenancy puts every
/// request in the default tenant, so `--tenant bob` would silently read and write everyone's keys).
async fn client(g: &Global) -> Result<Client, Failure> {
    let client = Client::new(g.client_config());
    let default = crescent_proto::TenantId::default_tenant();
    if !g.tenant.is_empty() && g.tenant != default.as_str() && !client.cluster_info().await?.multi_tenant {
        return Err(Failure(
            ErrorCode::UnavailableInCurrentMode,
            format!(
                "the master at {} runs without multi-tenancy, so --tenant {:?} would be ignored (start it with \
                 --multi-tenant)",
                g.master, g.tenant
            ),
        ));
    }
    Ok(client)
}

fn read_stdin() -> Result<Vec<u8>, Failure> {
    let mut v = Vec::new();
    std::io::stdin().read_to_end(&mut v)?;
    Ok(v)
}

/// `crescent get`.
pub async fn get(a: GetArgs, g: &Global) -> Result<(), Failure> {
    let client = client(g).await?;
    let data = client.get(&a.key).await?;
    // The read's lease release leaves now, before this process does.
    client.flush().await?;
    match a.output {
        Some(p) => std::fs::write(&p, &data).map_err(|e| Failure(ErrorCode::FileWriteFail, e.to_string()))?,
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(&data)
                .and_then(|()| out.flush())
                .map_err(|e| Failure(ErrorCode::FileWriteFail, e.to_string()))?;
        }
    }
    Ok(())
}

/// `crescent rm`. A key a reader still holds a lease on is not removed without `--force`; the error says for
/// how long and by how many readers.
pub async fn rm(a: RmArgs, g: &Global) -> Result<(), Failure> {
    let client = client(g).await?;
    if let Some(group) = &a.group {
        let n = client.remove_group(group, a.force).await?;
        println!("removed group {group:?}: {n} member{}", plural(n as usize));
        return Ok(());
    }
    let Some(key) = a.key else {
        println!("{}", removed_all(&client.remove_all_report(a.force).await?));
        return Ok(());
    };
    match client.remove(&key, a.force).await {
        Err(e) if e.code() == ErrorCode::ObjectHasLease => {
            let held = match client.stat(&key).await {
                Ok(s) if s.lease_remaining_ms > 0 => format!(
                    " for another {} by {} reader{} that ha{} not released it",
                    fmt_ms(s.lease_remaining_ms),
                    s.lease_readers,
                    plural(s.lease_readers as usize),
                    if s.lease_readers == 1 { "s" } else { "ve" }
                ),
                _ => String::new(),
            };
            Err(Failure(
                ErrorCode::ObjectHasLease,
                format!("key {key:?} is leased{held}; `crescent rm --force {key}` removes it anyway"),
            ))
        }
        r => Ok(r?),
    }
}

/// What `rm --all` did, in a sentence: "removed 10 objects; skipped 2 leased by readers (--force removes them)
/// and 1 being written".
fn removed_all(r: &crescent_proto::RemoveAllReport) -> String {
    let objects = |n: u64| format!("{n} object{}", plural(n as usize));
    let mut skipped = Vec::new();
    if r.skipped_leased > 0 {
        skipped.push(format!("{} leased by readers (--force removes them)", r.skipped_leased));
    }
    if r.skipped_writing > 0 {
        skipped.push(format!("{} being written", r.skipped_writing));
    }
    if r.skipped_pinned > 0 {
        skipped.push(format!("{} pinned by a replication task", r.skipped_pinned));
    }
    match skipped.len() {
        0 => format!("removed {}", objects(r.removed)),
        n => {
            let last = skipped.pop().unwrap_or_default();
            let list = if n == 1 { last } else { format!("{} and {last}", skipped.join(", ")) };
            format!("removed {}; skipped {list}", objects(r.removed))
        }
    }
}

/// `crescent ls`: keys, one per line; says on stderr when `--limit` cut the list short.
pub async fn ls(a: LsArgs, g: &Global) -> Result<(), Failure> {
    let mut keys = client(g).await?.list_keys(&a.prefix, a.limit.saturating_add(1)).await?;
    let truncated = keys.len() > a.limit as usize;
    keys.truncate(a.limit as usize);
    if a.json {
        println!("{}", serde_json::json!({ "keys": keys, "truncated": truncated }));
    } else {
        for k in &keys {
            println!("{k}");
        }
    }
    if truncated {
        eprintln!("(the first {} keys; more match: raise --limit)", a.limit);
    }
    Ok(())
}

/// `crescent wait` flags.
#[derive(clap::Args, Debug)]
pub struct WaitArgs {
    /// Storage nodes that must serve memory.
    #[arg(
        long,
        default_value_t = 0,
        help = "Also wait until at least this many storage nodes have memory \
        segments in service"
    )]
    nodes: usize,
    /// How long to wait.
    #[arg(long, value_name = "DURATION", value_parser = crescent_cli::parse_duration, default_value = "30s",
        help = "Give up after this long (exit 1, saying what was missing)")]
    timeout: std::time::Duration,
}

/// `crescent wait`: until the master answers (and `--nodes` nodes serve memory), for scripts that start a
/// cluster and then use it. Polls every 100 ms; says what it last saw when it gives up.
pub async fn wait(a: WaitArgs, g: &Global) -> Result<(), Failure> {
    let deadline = tokio::time::Instant::now() + a.timeout;
    let client = Client::new(g.client_config());
    loop {
        let missing = match client.cluster_info().await {
            Ok(info) => {
                let mut nodes: Vec<&str> = info
                    .memories
                    .iter()
                    .filter(|m| m.status == crescent_proto::SegmentStatus::Ok)
                    .map(|m| m.node.as_str())
                    .collect();
                nodes.sort_unstable();
                nodes.dedup();
                if nodes.len() >= a.nodes {
                    return Ok(());
                }
                Failure(
                    ErrorCode::UnavailableInCurrentStatus,
                    format!("{} storage nodes serve memory; waited for {}", nodes.len(), a.nodes),
                )
            }
            Err(e) => Failure::from(e),
        };
        if tokio::time::Instant::now() >= deadline {
            let Failure(code, msg) = missing;
            return Err(Failure(code, format!("gave up after {}: {msg}", fmt_ms(a.timeout.as_millis() as u64))));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// `crescent stat KEY`: size, checksum, lease, pins and where each replica lives, without leasing the object.
/// Without a key: the cluster's tiers per node ([`stat_tiers`]).
pub async fn stat(a: StatArgs, g: &Global) -> Result<(), Failure> {
    let Some(key) = a.key else { return stat_tiers(a.json, g).await };
    let s = client(g).await?.stat(&key).await?;
    if a.json {
        let replicas: Vec<serde_json::Value> = s.replicas.iter().map(replica_json).collect();
        println!(
            "{}",
            serde_json::json!({
                "key": key, "size": s.size, "checksum": s.checksum,
                "lease_remaining_ms": s.lease_remaining_ms, "lease_readers": s.lease_readers,
                "soft_pin_remaining_ms": s.soft_pin_remaining_ms, "hard_pinned": s.hard_pinned,
                "writing": s.writing, "replicas": replicas,
            })
        );
        return Ok(());
    }
    let lease = match s.lease_remaining_ms {
        0 => "none".to_owned(),
        ms => format!("{} left, {} reader{}", fmt_ms(ms), s.lease_readers, plural(s.lease_readers as usize)),
    };
    println!("key       {key:?}");
    println!("size      {}", fmt_bytes(s.size));
    println!("checksum  {}", s.checksum.map_or("none".to_owned(), |c| format!("{c:#010x} (crc32c)")));
    println!("lease     {lease}");
    println!(
        "soft pin  {}",
        if s.soft_pin_remaining_ms == 0 { "none".into() } else { fmt_ms(s.soft_pin_remaining_ms) }
    );
    println!("hard pin  {}", if s.hard_pinned { "yes" } else { "no" });
    if s.writing {
        println!("writing   a write is in flight");
    }
    println!("replicas  {}", s.replicas.len());
    for d in &s.replicas {
        let (where_, length) = match &d.location {
            ReplicaLocation::Memory { segment_id, offset, length, endpoint } => {
                (format!("memory on {endpoint}, segment {segment_id}, offset {offset}"), *length)
            }
            ReplicaLocation::Nof { segment_id, offset, length, endpoint } => {
                (format!("NoF on {endpoint}, segment {segment_id}, offset {offset}"), *length)
            }
            ReplicaLocation::Disk { segment_id, offset, length, endpoint } => {
                (format!("disk tier of {endpoint}, segment {segment_id}, offset {offset}"), *length)
            }
            ReplicaLocation::LocalDisk { client_id, length, endpoint } => {
                (format!("local disk of client {client_id} at {endpoint}"), *length)
            }
        };
        println!("  #{} {:?}: {}, {where_}", d.id, d.status, fmt_bytes(length));
    }
    Ok(())
}

/// `crescent stat` without a key: every node's memory segment (capacity, used) and disk tier (capacity, used,
/// objects, reads, writes, evictions, errors), as the master's `ClusterInfo` reports them.
async fn stat_tiers(json: bool, g: &Global) -> Result<(), Failure> {
    let info = client(g).await?.cluster_info().await?;
    if json {
        let memory: Vec<serde_json::Value> = info
            .memories
            .iter()
            .map(|m| {
                serde_json::json!({
                    "node": m.node, "segment": m.segment.to_string(), "endpoint": m.endpoint,
                    "status": format!("{:?}", m.status), "capacity": m.capacity, "used": m.used,
                })
            })
            .collect();
        let disk: Vec<serde_json::Value> = info
            .disks
            .iter()
            .map(|d| {
                serde_json::json!({
                    "node": d.node, "segment": d.segment.to_string(), "endpoint": d.endpoint,
                    "status": format!("{:?}", d.status), "capacity": d.capacity, "used": d.used,
                    "objects": d.objects, "evictions": d.evictions, "reads": d.reads, "read_bytes": d.read_bytes,
                    "writes": d.writes, "write_bytes": d.write_bytes, "errors": d.errors,
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "memory": memory, "disk": disk }));
        return Ok(());
    }
    print!("{}", tiers_table(&info));
    Ok(())
}

/// The tiers table: one row per segment, grouped by node, memory before disk.
fn tiers_table(info: &crescent_proto::ClusterInfo) -> String {
    const HEAD: [&str; 11] =
        ["NODE", "TIER", "STATUS", "CAPACITY", "USED", "OBJECTS", "READS", "WRITES", "EVICTIONS", "ERRORS", "ENDPOINT"];
    let mut rows: Vec<(String, u8, [String; 11])> = Vec::new();
    for m in &info.memories {
        let dash = || "-".to_owned();
        rows.push((
            m.node.clone(),
            0,
            [
                m.node.clone(),
                "memory".into(),
                format!("{:?}", m.status),
                fmt_bytes(m.capacity),
                fmt_bytes(m.used),
                dash(),
                dash(),
                dash(),
                dash(),
                dash(),
                m.endpoint.clone(),
            ],
        ));
    }
    for d in &info.disks {
        rows.push((
            d.node.clone(),
            1,
            [
                d.node.clone(),
                "disk".into(),
                format!("{:?}", d.status),
                fmt_bytes(d.capacity),
                fmt_bytes(d.used),
                d.objects.to_string(),
                format!("{} ({})", d.reads, fmt_bytes(d.read_bytes)),
                format!("{} ({})", d.writes, fmt_bytes(d.write_bytes)),
                d.evictions.to_string(),
                d.errors.to_string(),
                d.endpoint.clone(),
            ],
        ));
    }
    rows.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    let mut width = HEAD.map(str::len);
    for (_, _, cells) in &rows {
        for (w, c) in width.iter_mut().zip(cells) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: &[&str]| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(width).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  "));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(&HEAD);
    for (_, _, cells) in &rows {
        out.push_str(&line(&cells.each_ref().map(String::as_str)));
    }
    if rows.is_empty() {
        out.push_str("(no segments mounted)\n");
    }
    out
}

fn replica_json(d: &crescent_proto::ReplicaDescriptor) -> serde_json::Value {
    match &d.location {
        ReplicaLocation::Memory { segment_id, offset, length, endpoint }
        | ReplicaLocation::Nof { segment_id, offset, length, endpoint }
        | ReplicaLocation::Disk { segment_id, offset, length, endpoint } => serde_json::json!({
            "id": d.id, "tier": tier_name(&d.location), "segment": segment_id.to_string(), "offset": offset,
            "length": length, "endpoint": endpoint.as_ref(), "status": format!("{:?}", d.status),
        }),
        ReplicaLocation::LocalDisk { client_id, length, endpoint } => serde_json::json!({
            "id": d.id, "client": client_id.to_string(), "length": length, "endpoint": endpoint.as_ref(),
            "status": format!("{:?}", d.status),
        }),
    }
}

/// The tier a replica is in, as listings name it.
fn tier_name(l: &ReplicaLocation) -> &'static str {
    match l {
        ReplicaLocation::Memory { .. } => "memory",
        ReplicaLocation::Nof { .. } => "nof",
        ReplicaLocation::Disk { .. } => "disk",
        ReplicaLocation::LocalDisk { .. } => "local_disk",
    }
}

pub(crate) use crescent_proto::human::fmt_bytes;

/// Milliseconds as a person reads them: `850 ms`, `8.7 s`, `29 min`.
fn fmt_ms(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms} ms"),
        1000..120_000 => format!("{:.1} s", ms as f64 / 1000.0),
        _ => format!("{} min", ms / 60_000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rm_all_says_what_it_skipped_and_why() {
        let r = |removed, skipped_leased, skipped_writing, skipped_pinned| crescent_proto::RemoveAllReport {
            removed,
            skipped_leased,
            skipped_writing,
            skipped_pinned,
        };
        assert_eq!(removed_all(&r(1, 0, 0, 0)), "removed 1 object");
        assert_eq!(
            removed_all(&r(0, 2, 0, 0)),
            "removed 0 objects; skipped 2 leased by readers (--force removes them)"
        );
        assert_eq!(
            removed_all(&r(10, 2, 1, 0)),
            "removed 10 objects; skipped 2 leased by readers (--force removes them) and 1 being written"
        );
        assert_eq!(
            removed_all(&r(3, 1, 1, 1)),
            "removed 3 objects; skipped 1 leased by readers (--force removes them), 1 being written and 1 pinned by a \
             replication task"
        );
    }

    #[test]
    fn sizes_and_durations_read_like_a_person_writes_them() {
        assert_eq!(fmt_bytes(6), "6 B");
        assert_eq!(fmt_bytes(4096), "4.0 KiB");
        assert_eq!(fmt_bytes(1_572_864), "1.5 MiB");
        assert_eq!(fmt_bytes(u64::MAX), "16384.0 PiB");
        assert_eq!(fmt_ms(850), "850 ms");
        assert_eq!(fmt_ms(8_700), "8.7 s");
        assert_eq!(fmt_ms(29 * 60_000 + 5), "29 min");
    }
}
