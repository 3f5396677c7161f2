//! A KV-cache workload replayed through the master core in-process, the way an inference connector drives it
//! (batch-exist a request's prefix blocks, reuse the leading hits, write the rest), on simulated storage hosts.
//! `crescent demo` runs it; it needs no network and no storage node.

use crate::clock::{Clock, SystemClock};
use crate::placement::PlacementPolicy;
use crate::service::{MasterConfig, MasterService};
use crescent_proto::{ClientId, ErrorCode, ReplicateConfig, SegmentId, SegmentKind, SegmentSpec, SegmentStatus};
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The simulated cluster and workload.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Storage hosts.
    pub hosts: usize,
    /// Segments each host mounts.
    pub segments_per_host: usize,
    /// Bytes per segment.
    pub segment_size: u64,
    /// Bytes per KV-cache block (tokens per block × bytes per token of the simulated model).
    pub block_size: u64,
    /// Replicas per block.
    pub replicas: u32,
    /// Replica placement policy.
    pub policy: PlacementPolicy,
}

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A count or size is zero.
    #[error("hosts, segments per host, replicas and block size must be positive")]
    Empty,
    /// A trace line is not a JSON object with `hash_ids`.
    #[error("trace line {line}: {why}")]
    Trace {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// The master's background thread could not start.
    #[error("cannot start the master's background loop: {0}")]
    Background(std::io::Error),
    /// The master refused an operation the simulation needs.
    #[error("{op}: {code}")]
    Master {
        /// The operation.
        op: &'static str,
        /// The master's answer.
        code: ErrorCode,
    },
}

/// One segment after the replay.
#[derive(Debug, Clone, Serialize)]
pub struct SegmentRow {
    /// The segment's placement name.
    pub name: String,
    /// Its status.
    pub status: SegmentStatus,
    /// Bytes held by replicas.
    pub used: u64,
    /// Bytes offered.
    pub capacity: u64,
    /// Share of the capacity in use, allocator slack included.
    pub utilisation: f64,
}

/// What a replay measured.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// Requests replayed.
    pub requests: usize,
    /// Prefix blocks looked up.
    pub blocks: u64,
    /// Share of looked-up blocks found as leading hits (rounded to 3 places).
    pub prefix_hit_ratio: f64,
    /// Blocks written.
    pub blocks_written: u64,
    /// Writes the master refused (nothing evictable made room).
    pub write_failures: u64,
    /// Objects evicted to make room.
    pub evicted: u64,
    /// Master operations per second over the replay.
    pub master_ops_per_s: f64,
    /// Objects before the first host was taken away.
    pub objects_before_node_loss: usize,
    /// Objects left after: those with a replica on another host.
    pub objects_after_node_loss: usize,
    /// Share of the memory pool in use at the end (rounded to 3 places).
    pub pool_used_ratio: f64,
    /// Every segment after the replay, before the host loss.
    #[serde(skip)]
    pub segments: Vec<SegmentRow>,
}

/// Reads a Mooncake trace: JSON lines whose `hash_ids` are a request's prefix blocks; at most `limit` requests.
pub fn parse_trace(text: &str, limit: usize) -> Result<Vec<Vec<u64>>, SimError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).take(limit).enumerate() {
        let bad = |why: String| SimError::Trace { line: i + 1, why };
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        let ids = v["hash_ids"].as_array().ok_or_else(|| bad("no hash_ids array".into()))?;
        out.push(ids.iter().filter_map(serde_json::Value::as_u64).collect());
    }
    Ok(out)
}

/// A synthetic prefix-sharing workload of `requests` requests: conversations that grow turn by turn with
/// Zipf-like popularity, so prefixes are shared the way inference traffic shares them. Deterministic.
pub fn synthetic_workload(requests: usize) -> Vec<Vec<u64>> {
    let mut rng = fastrand::Rng::with_seed(42);
    let conversations = 200u64;
    let mut turns = vec![0u64; conversations as usize];
    let mut next_unique = 1u64 << 40;
    (0..requests)
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
        .collect()
}

fn master_err(op: &'static str) -> impl Fn(ErrorCode) -> SimError {
    move |code| SimError::Master { op, code }
}

/// Replays `requests` (each a list of prefix block ids) against a fresh master with `config`'s hosts, then
/// takes the first host away and counts what survived.
pub fn replay(config: &SimConfig, requests: &[Vec<u64>]) -> Result<SimReport, SimError> {
    replay_on(config, requests, Arc::new(SystemClock::new()), |_, _| {})
}

/// [`replay`] on `clock`, calling `tick(i, master)` before request `i` (a test advances a manual clock and runs
/// the master's liveness step there).
fn replay_on(
    config: &SimConfig,
    requests: &[Vec<u64>],
    clock: Arc<dyn Clock>,
    mut tick: impl FnMut(usize, &MasterService),
) -> Result<SimReport, SimError> {
    if config.hosts == 0 || config.segments_per_host == 0 || config.replicas == 0 || config.block_size == 0 {
        return Err(SimError::Empty);
    }
    let master_config = MasterConfig { placement_policy: config.policy, ..MasterConfig::default() };
    let master = Arc::new(MasterService::new(master_config, clock.clone()).map_err(master_err("start"))?);
    let background = master.spawn_background().map_err(SimError::Background)?;
    let mut hosts = Vec::new();
    for h in 0..config.hosts {
        let client = ClientId::random();
        let segments: Vec<SegmentSpec> = (0..config.segments_per_host)
            .map(|s| SegmentSpec {
                id: SegmentId::random(),
                name: format!("node{h}-seg{s}"),
                base: 0x7f00_0000_0000 + ((h * config.segments_per_host + s) as u64) * config.segment_size,
                size: config.segment_size,
                endpoint: format!("127.0.0.1:{}", 17000 + h),
                kind: SegmentKind::Memory,
                host_id: format!("host{h}"),
            })
            .collect();
        for s in &segments {
            master.mount_segment(client, s.clone()).map_err(master_err("mount"))?;
        }
        master.remount_segments(client, &segments).map_err(master_err("remount"))?;
        hosts.push(client);
    }
    let writer = ClientId::random();
    let cfg = ReplicateConfig::with_replicas(config.replicas);
    let (mut blocks, mut hits, mut written, mut failed) = (0u64, 0u64, 0u64, 0u64);
    let started = Instant::now();
    let mut pinged = clock.now();
    for (i, ids) in requests.iter().enumerate() {
        tick(i, &master);
        // The simulated nodes are alive: they ping every second as real nodes do (a slow replay must not
        // expire them).
        if clock.now() >= pinged.saturating_add(Duration::from_secs(1)) {
            for h in &hosts {
                master.ping(*h);
            }
            pinged = clock.now();
        }
        let keys: Vec<String> = ids.iter().map(|id| format!("block-{id:016x}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let exists = master.batch_exist_key("", &refs);
        let prefix = exists.iter().take_while(|e| matches!(e, Ok(true))).count();
        blocks += keys.len() as u64;
        hits += prefix as u64;
        for k in &refs[prefix..] {
            match master.put_start(writer, "", k, config.block_size, &cfg) {
                Ok(_) => {
                    master.put_end(writer, "", k, None).map_err(master_err("put_end"))?;
                    written += 1;
                }
                Err(ErrorCode::ObjectAlreadyExists) => {}
                Err(_) => failed += 1,
            }
        }
    }
    let elapsed = started.elapsed();
    let segments = master
        .pool()
        .segments()
        .into_iter()
        .map(|s| SegmentRow {
            name: s.spec.name.clone(),
            status: s.status,
            used: s.usage.used,
            capacity: s.usage.capacity,
            utilisation: (s.usage.used + s.usage.slack) as f64 / s.usage.capacity as f64,
        })
        .collect();
    // Take one host away: its replicas vanish at once; blocks with a replica elsewhere stay readable.
    let before = master.key_count(None);
    for id in master.pool().client_segments(hosts[0]) {
        master.unmount_segment(id).map_err(master_err("unmount"))?;
    }
    let after = master.key_count(None);
    drop(background);
    let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
    Ok(SimReport {
        requests: requests.len(),
        blocks,
        prefix_hit_ratio: round3(hits as f64 / blocks.max(1) as f64),
        blocks_written: written,
        write_failures: failed,
        evicted: master.metrics().evicted_objects.load(Ordering::Relaxed),
        master_ops_per_s: ((blocks + written * 2) as f64 / elapsed.as_secs_f64()).round(),
        objects_before_node_loss: before,
        objects_after_node_loss: after,
        pool_used_ratio: round3(master.pool().usage(SegmentKind::Memory).used_ratio()),
        segments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_are_read_line_by_line_and_bad_lines_named() {
        let text = "{\"hash_ids\":[1,2,3]}\n\n{\"hash_ids\":[1,2,4]}\n{\"hash_ids\":[9]}\n";
        assert_eq!(parse_trace(text, 2).unwrap(), vec![vec![1, 2, 3], vec![1, 2, 4]]);
        assert!(matches!(parse_trace("{\"x\":1}", 5), Err(SimError::Trace { line: 1, .. })));
        assert!(matches!(parse_trace("{\"hash_ids\":[1]}\nnot json", 5), Err(SimError::Trace { line: 2, .. })));
    }

    /// A replay slower than the client TTL (a loaded machine) keeps its nodes alive: no write fails for want of
    /// a segment.
    #[test]
    fn a_slow_replay_keeps_its_nodes_alive() {
        let config = SimConfig {
            hosts: 3,
            segments_per_host: 2,
            segment_size: 64 << 20,
            block_size: 576 << 10,
            replicas: 2,
            policy: PlacementPolicy::Random,
        };
        let clock = crate::clock::ManualClock::new(crate::clock::Timestamp(1));
        let c = clock.clone();
        // 200 ms of master time per request, 40 s in all: four client TTLs.
        let report = replay_on(&config, &synthetic_workload(200), clock, move |_, master| {
            c.advance(Duration::from_millis(200));
            master.step_liveness();
        })
        .unwrap();
        assert_eq!(report.write_failures, 0, "{report:?}");
    }

    #[test]
    fn the_synthetic_workload_is_deterministic_and_shares_prefixes() {
        let a = synthetic_workload(300);
        assert_eq!(a, synthetic_workload(300));
        let firsts: std::collections::HashSet<u64> = a.iter().map(|r| r[0]).collect();
        assert!(firsts.len() < a.len() / 2, "conversations come back");
    }
}
