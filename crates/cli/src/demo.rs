//! `crescent demo`: the master core in-process, replaying a prefix-sharing KV-cache workload (synthetic or a
//! Mooncake trace) the way an inference connector would (`crescent_master::sim`).

use anyhow::{Context, Result};
use crescent_master::placement::PlacementPolicy;
use crescent_master::sim::{self, SimConfig};

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
    #[arg(long, default_value_t = PlacementPolicy::Random)]
    policy: PlacementPolicy,
}

pub fn run(a: DemoArgs) -> Result<()> {
    let requests = match &a.trace {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            sim::parse_trace(&text, a.requests)?
        }
        None => sim::synthetic_workload(a.requests),
    };
    let config = SimConfig {
        hosts: a.hosts,
        segments_per_host: a.segments_per_host,
        segment_size: a.segment_size,
        block_size: a.block_size,
        replicas: a.replicas,
        policy: a.policy,
    };
    let report = sim::replay(&config, &requests)?;
    println!("{:<14} {:>8} {:>12} {:>12} {:>8}", "segment", "status", "used", "capacity", "util");
    for s in &report.segments {
        let status = format!("{:?}", s.status);
        println!("{:<14} {status:>8} {:>12} {:>12} {:>7.1}%", s.name, s.used, s.capacity, 100.0 * s.utilisation);
    }
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
