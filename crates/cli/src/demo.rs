//! `crescent demo`: the master core in-process, replaying a prefix-sharing KV-cache workload (synthetic or a
//! Mooncake trace) the way an inference connector would.

use anyhow::{Context, Result, anyhow, bail};
use crescent_master::clock::SystemClock;
use crescent_master::service::{MasterConfig, MasterService, PlacementPolicySetting};
use crescent_proto::{ClientId, ErrorCode, ReplicateConfig, SegmentId, SegmentKind, SegmentSpec};
use std::sync::Arc;
use std::time::Instant;

use crate::parse_size;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Storage hosts to simulate.
    #[arg(long, default_value_t = 3)]
    hosts: usize,
    /// Segments per host.
    #[arg(long, default_value_t = 2)]
    segments_per_host: usize,
    /// Size of each segment (e.g. 256MiB, 4GiB).
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    segment_size: u64,
    /// KV-cache block size (512 tokens × bytes per token of the simulated model).
    #[arg(long, default_value = "576KiB", value_parser = parse_size)]
    block_size: u64,
    /// Replicas per block.
    #[arg(long, default_value_t = 2)]
    replicas: u32,
    /// Requests to replay (synthetic workload) or the first N of `--trace`.
    #[arg(long, default_value_t = 4000)]
    requests: usize,
    /// A Mooncake trace (JSON lines with `hash_ids`); a synthetic prefix-sharing workload is used otherwise.
    #[arg(long)]
    trace: Option<std::path::PathBuf>,
    /// Placement policy: random, free-ratio-first, local-first.
    #[arg(long, default_value = "random")]
    policy: String,
}

/// The prefix blocks of each request: from a trace file, or synthetic (conversations that grow, Zipf-like
/// popularity, so prefixes are shared the way inference traffic shares them).
fn workload(a: &DemoArgs) -> Result<Vec<Vec<u64>>> {
    if let Some(path) = &a.trace {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut out = Vec::new();
        for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).take(a.requests).enumerate() {
            let v: serde_json::Value = serde_json::from_str(line).with_context(|| format!("trace line {}", i + 1))?;
            let ids = v["hash_ids"].as_array().with_context(|| format!("trace line {}: no hash_ids", i + 1))?;
            out.push(ids.iter().filter_map(serde_json::Value::as_u64).collect());
        }
        return Ok(out);
    }
    let mut rng = fastrand::Rng::with_seed(42);
    let conversations = 200u64;
    let mut turns = vec![0u64; conversations as usize];
    let mut next_unique = 1u64 << 40;
    Ok((0..a.requests)
        .map(|_| {
            // Popular conversations come back more often.
            let c = (rng.f64().powi(3) * conversations as f64) as u64;
            turns[c as usize] += 1;
            let shared = (4 + 2 * turns[c as usize]).min(64);
            let mut ids: Vec<u64> = (0..shared).map(|b| (c << 20) | b).collect();
            ids.extend((0..1 + rng.u64(..4)).map(|_| {
                next_unique += 1;
                next_unique
            }));
            ids
        })
        .collect())
}

pub fn run(a: DemoArgs) -> Result<()> {
    let policy = match a.policy.as_str() {
        "random" => PlacementPolicySetting::Random,
        "free-ratio-first" => PlacementPolicySetting::FreeRatioFirst,
        "local-first" => PlacementPolicySetting::LocalFirst,
        other => bail!("unknown policy {other:?}"),
    };
    if a.hosts == 0 || a.segments_per_host == 0 || a.replicas == 0 || a.block_size == 0 {
        bail!("--hosts, --segments-per-host, --replicas and --block-size must be positive");
    }
    let requests = workload(&a)?;
    let config = MasterConfig { placement_policy: policy, ..MasterConfig::default() };
    let master = Arc::new(MasterService::new(config, Arc::new(SystemClock::new())).map_err(|e| anyhow!("{e}"))?);
    let background = master.spawn_background().context("starting the master's background loop")?;
    let mut nodes = Vec::new();
    for h in 0..a.hosts {
        let client = ClientId::random();
        let segments: Vec<SegmentSpec> = (0..a.segments_per_host)
            .map(|s| SegmentSpec {
                id: SegmentId::random(),
                name: format!("node{h}-seg{s}"),
                base: 0x7f00_0000_0000 + ((h * a.segments_per_host + s) as u64) * a.segment_size,
                size: a.segment_size,
                endpoint: format!("127.0.0.1:{}", 17000 + h),
                kind: SegmentKind::Memory,
                host_id: format!("host{h}"),
            })
            .collect();
        for s in &segments {
            master.mount_segment(client, s.clone()).map_err(|e| anyhow!("mount: {e}"))?;
        }
        master.remount_segments(client, &segments).map_err(|e| anyhow!("remount: {e}"))?;
        nodes.push(client);
    }
    // Replay like an inference connector: batch-exist the prefix, reuse the leading hits, write the rest.
    let writer = ClientId::random();
    let cfg = ReplicateConfig::with_replicas(a.replicas);
    let (mut blocks, mut hits, mut written, mut failed) = (0u64, 0u64, 0u64, 0u64);
    let started = Instant::now();
    for ids in &requests {
        let keys: Vec<String> = ids.iter().map(|id| format!("block-{id:016x}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let exists = master.batch_exist_key("", &refs);
        let prefix = exists.iter().take_while(|e| matches!(e, Ok(true))).count();
        blocks += keys.len() as u64;
        hits += prefix as u64;
        for k in &refs[prefix..] {
            match master.put_start(writer, "", k, a.block_size, &cfg) {
                Ok(_) => {
                    master.put_end(writer, "", k, None).map_err(|e| anyhow!("put_end {k}: {e}"))?;
                    written += 1;
                }
                Err(ErrorCode::ObjectAlreadyExists) => {}
                Err(_) => failed += 1,
            }
        }
    }
    let elapsed = started.elapsed();
    println!("{:<14} {:>8} {:>12} {:>12} {:>8}", "segment", "status", "used", "capacity", "util");
    for s in master.pool().segments() {
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
    // Take one node away: its replicas vanish at once; blocks with a replica elsewhere stay readable.
    let before = master.key_count(None);
    for id in master.pool().client_segments(nodes[0]) {
        master.unmount_segment(id).map_err(|e| anyhow!("unmount: {e}"))?;
    }
    let after = master.key_count(None);
    drop(background);
    let m = master.metrics();
    let summary = serde_json::json!({
        "requests": requests.len(),
        "blocks": blocks,
        "prefix_hit_ratio": (hits as f64 / blocks.max(1) as f64 * 1000.0).round() / 1000.0,
        "blocks_written": written,
        "write_failures": failed,
        "evicted": m.evicted_objects.load(std::sync::atomic::Ordering::Relaxed),
        "master_ops_per_s": ((blocks + written * 2) as f64 / elapsed.as_secs_f64()).round(),
        "objects_before_node_loss": before,
        "objects_after_node_loss": after,
        "pool_used_ratio": (master.pool().usage(SegmentKind::Memory).used_ratio() * 1000.0).round() / 1000.0,
    });
    println!("{summary}");
    Ok(())
}
