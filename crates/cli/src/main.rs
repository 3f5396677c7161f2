//! `crescent`: the command-line entry point.
//!
//! Today it runs `demo`, an in-process cluster (segment pool + placement) that exercises the master core; the
//! network subcommands (`up`, `master`, `node`, `put`, `get`, ...) arrive with the network layer.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use crescent_master::placement::{PlacementPolicy, PlacementRequest, ReplicaAllocator, ReplicaPlacement};
use crescent_master::segment_pool::{AllocatedBuffer, PoolConfig, SegmentPool};
use crescent_proto::{ClientId, SegmentId, SegmentKind, SegmentSpec};
use std::collections::VecDeque;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(name = "crescent", version, about = "Crescent: a distributed KV-cache store")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run an in-process cluster: mount segments, place replicas of a KV-cache workload, unmount a node.
    Demo(DemoArgs),
}

#[derive(clap::Args, Debug)]
struct DemoArgs {
    /// Storage hosts to simulate.
    #[arg(long, default_value_t = 3)]
    hosts: usize,
    /// Segments per host.
    #[arg(long, default_value_t = 2)]
    segments_per_host: usize,
    /// Size of each segment (e.g. 256MiB, 4GiB).
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    segment_size: u64,
    /// Objects to write.
    #[arg(long, default_value_t = 20_000)]
    objects: usize,
    /// Object size (e.g. 576KiB).
    #[arg(long, default_value = "576KiB", value_parser = parse_size)]
    value_size: u64,
    /// Replicas per object.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// Placement policy: random, free-ratio-first, local-first.
    #[arg(long, default_value = "random")]
    policy: String,
}

/// Parses `123`, `4KiB`, `16MiB`, `1GiB`, `2TiB` (also KB/MB/GB/TB, 1024-based, case-insensitive).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("invalid size unit in {s:?}")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} overflows"))
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    match Cli::parse().command {
        Command::Demo(a) => demo(a),
    }
}

fn demo(a: DemoArgs) -> Result<()> {
    let policy = match a.policy.as_str() {
        "random" => PlacementPolicy::Random,
        "free-ratio-first" => PlacementPolicy::FreeRatioFirst,
        "local-first" => PlacementPolicy::LocalFirst,
        other => bail!("unknown policy {other:?}"),
    };
    if a.hosts == 0 || a.segments_per_host == 0 || a.replicas == 0 {
        bail!("--hosts, --segments-per-host and --replicas must be positive");
    }
    let pool = SegmentPool::new(PoolConfig::default()).context("creating the pool")?;
    let mut nodes = Vec::new();
    for h in 0..a.hosts {
        let client = ClientId::random();
        for s in 0..a.segments_per_host {
            let spec = SegmentSpec {
                id: SegmentId::random(),
                name: format!("node{h}-seg{s}"),
                base: 0x7f00_0000_0000 + ((h * a.segments_per_host + s) as u64) * a.segment_size,
                size: a.segment_size,
                endpoint: format!("127.0.0.1:{}", 17000 + h),
                kind: SegmentKind::Memory,
                host_id: format!("host{h}"),
            };
            pool.mount(client, spec).context("mounting a segment")?;
        }
        nodes.push(client);
    }
    let allocator = ReplicaAllocator::new(policy);
    let placement = ReplicaPlacement::new(&pool, &allocator);
    // Objects as the metadata layer will hold them: their buffers. FIFO stands in for eviction here.
    let mut objects: VecDeque<Vec<AllocatedBuffer>> = VecDeque::new();
    let (mut evicted, mut partial) = (0u64, 0u64);
    let started = Instant::now();
    for i in 0..a.objects {
        let host = format!("host{}", i % a.hosts);
        let mut req = PlacementRequest::memory(a.value_size, a.replicas);
        req.writer_host = Some(&host);
        req.key_hash = i as u64;
        loop {
            match placement.place(&req) {
                Ok(bufs) => {
                    partial += u64::from(bufs.len() < a.replicas);
                    objects.push_back(bufs);
                    break;
                }
                Err(e) => {
                    if objects.pop_front().is_none() {
                        bail!("object {i} does not fit even in an empty pool: {e}");
                    }
                    evicted += 1;
                }
            }
        }
    }
    let elapsed = started.elapsed();
    println!("{:<14} {:>8} {:>12} {:>12} {:>8}", "segment", "status", "used", "capacity", "util");
    for s in pool.segments() {
        let u = s.usage;
        println!(
            "{:<14} {:>8} {:>12} {:>12} {:>7.1}%",
            s.spec.name,
            format!("{:?}", s.status),
            u.used,
            u.capacity,
            100.0 * (u.used + u.slack) as f64 / u.capacity as f64
        );
    }
    // Take one node away: its replicas become unreadable at once; objects keep their other replicas.
    let victim = nodes[0];
    for id in pool.client_segments(victim) {
        pool.unmount(id, |_| {}).context("unmounting")?;
    }
    let readable = objects.iter().filter(|o| o.iter().any(AllocatedBuffer::is_readable)).count();
    let usage = pool.usage(SegmentKind::Memory);
    let summary = serde_json::json!({
        "objects_written": a.objects,
        "placements_per_s": (a.objects as f64 / elapsed.as_secs_f64()).round(),
        "evicted": evicted,
        "partial_placements": partial,
        "resident_objects": objects.len(),
        "readable_after_node_loss": readable,
        "pool_used_ratio": (usage.used_ratio() * 1000.0).round() / 1000.0,
    });
    println!("{summary}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("576KiB"), Ok(576 << 10));
        assert_eq!(parse_size("4gib"), Ok(4 << 30));
        assert_eq!(parse_size("10"), Ok(10));
        assert!(parse_size("1XB").is_err());
        assert!(parse_size("99999999999TiB").is_err());
        assert!(parse_size("").is_err());
    }
}
