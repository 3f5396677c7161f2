//! Master core benchmarks (issue 3): throughput on distinct keys at 1 and 2 threads (also with the write hold a
//! master sealing data-plane grants runs, issue 17), resident memory per object, and GetReplicaList latency
//! while a million-object eviction runs.
//!
//! `cargo bench -p crescent-master --bench master [-- --objects N] [--only throughput|memory|eviction|events]`.
//! Prints one line per measurement. `events`: what encoding the KV event stream's messages costs per event.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

/// The allocator the `crescent` binary runs the master with: memory and time are measured as a user meets them.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use crescent_master::clock::SystemClock;
use crescent_master::eviction::{EvictionScope, EvictionTarget};
use crescent_master::service::{MasterConfig, MasterService};
use crescent_proto::{ClientId, ReplicateConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

fn service(segments: usize) -> MasterService {
    service_with(MasterConfig::default(), segments)
}

fn service_with(config: MasterConfig, segments: usize) -> MasterService {
    let svc = MasterService::new(config, Arc::new(SystemClock::new())).unwrap();
    for i in 0..segments {
        let spec = crescent_testkit::segment_on(&format!("node{i}"), 256 * GIB, &format!("host{i}"));
        svc.mount_segment(ClientId::random(), spec).unwrap();
    }
    svc
}

/// A 20-byte key.
fn key(i: u64) -> String {
    format!("k{i:019}")
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    pages * 4096
}

fn parallel(threads: u64, per_thread: u64, f: impl Fn(u64) + Sync) -> f64 {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let f = &f;
            s.spawn(move || {
                for i in 0..per_thread {
                    f(t * per_thread + i);
                }
            });
        }
    });
    (threads * per_thread) as f64 / start.elapsed().as_secs_f64()
}

fn throughput(per_thread: u64) {
    // `hold=on`: freed space held 12 s after its allocation and every range handed out held for its grant's life,
    // as on a master with a cluster secret (`server::grants::hold_for_grants`).
    let held = MasterConfig { write_hold_ms: 12_000, ..MasterConfig::default() };
    for (hold, config, threads) in [
        ("off", MasterConfig::default(), 1u64),
        ("on", held.clone(), 1),
        ("off", MasterConfig::default(), 2),
        ("on", held, 2),
    ] {
        let svc = service_with(config, 4);
        let writer = ClientId::random();
        let cfg = ReplicateConfig::default();
        let put = parallel(threads, per_thread, |i| {
            let k = key(i);
            svc.put_start(writer, "", &k, 4096, &cfg).unwrap();
            svc.put_end(writer, "", &k, Some(1)).unwrap();
        });
        let get = parallel(threads, per_thread, |i| {
            svc.get_replica_list("", &key(i)).unwrap();
        });
        let exist = parallel(threads, per_thread, |i| {
            assert!(svc.exist_key("", &key(i)).unwrap());
        });
        println!(
            "throughput threads={threads} hold={hold} put_start+put_end={put:.0}/s get_replica_list={get:.0}/s \
             exist_key={exist:.0}/s"
        );
    }
}

fn memory(n: u64) {
    let svc = service(4);
    let writer = ClientId::random();
    let cfg = ReplicateConfig::default();
    let before = rss_bytes();
    for i in 0..n {
        let k = key(i);
        svc.put_start(writer, "", &k, 4096, &cfg).unwrap();
        svc.put_end(writer, "", &k, None).unwrap();
    }
    let full = rss_bytes();
    assert_eq!(svc.remove_all(None, true), Ok(n));
    let after = rss_bytes();
    let grown = full.saturating_sub(before);
    println!(
        "memory objects={n} rss_growth={:.1}MiB per_object={:.1}B after_remove_all_returned={:.1}%",
        grown as f64 / (1 << 20) as f64,
        grown as f64 / n as f64,
        100.0 * full.saturating_sub(after) as f64 / grown.max(1) as f64
    );
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    sorted[((sorted.len() as f64 - 1.0) * p) as usize]
}

/// GetReplicaList latency on a hot key set, alone and while another thread evicts `n` objects.
fn eviction_latency(n: u64) {
    let svc = service(4);
    let writer = ClientId::random();
    let cfg = ReplicateConfig::default();
    for i in 0..n {
        let k = key(i);
        svc.put_start(writer, "", &k, 4096, &cfg).unwrap();
        svc.put_end(writer, "", &k, None).unwrap();
    }
    let hot: Vec<String> = (0..10_000).map(|i| format!("hot{i:017}")).collect();
    for k in &hot {
        svc.put_start(writer, "", k, 4096, &cfg).unwrap();
        svc.put_end(writer, "", k, None).unwrap();
    }
    let measure = |svc: &MasterService, stop: &AtomicBool, limit: usize| -> (f64, u32, u32, usize) {
        let mut lat = Vec::with_capacity(limit.min(1 << 22));
        let start = Instant::now();
        let mut i = 0usize;
        while lat.len() < limit && !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            svc.get_replica_list("", &hot[i % hot.len()]).unwrap();
            lat.push(t.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32);
            i += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        let ops = lat.len();
        lat.sort_unstable();
        (ops as f64 / secs, percentile(&lat, 0.50), percentile(&lat, 0.99), ops)
    };
    let never = AtomicBool::new(false);
    let (idle_rate, idle_p50, idle_p99, _) = measure(&svc, &never, 2_000_000);
    let done = AtomicBool::new(false);
    let (evict_report, evict_secs, busy) = std::thread::scope(|s| {
        let evictor = s.spawn(|| {
            let t = Instant::now();
            let r = svc.evict(EvictionScope::All, EvictionTarget::Fraction { target: 1.0, lower: 1.0 });
            done.store(true, Ordering::Relaxed);
            (r, t.elapsed())
        });
        let busy = measure(&svc, &done, usize::MAX);
        let (r, d) = evictor.join().unwrap();
        (r, d, busy)
    });
    let (busy_rate, busy_p50, busy_p99, busy_ops) = busy;
    println!(
        "eviction evicted={} in {:.2}s; get_replica_list idle: {idle_rate:.0}/s p50={idle_p50}ns p99={idle_p99}ns; \
         during eviction ({busy_ops} ops): {busy_rate:.0}/s p50={busy_p50}ns p99={busy_p99}ns; p99 ratio={:.2}",
        evict_report.objects,
        evict_secs.as_secs_f64(),
        busy_p99 as f64 / idle_p99.max(1) as f64
    );
    let _ = Duration::ZERO;
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let objects: u64 = args
        .iter()
        .position(|a| a == "--objects")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let only = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned();
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if run("throughput") {
        throughput(objects / 4);
    }
    if run("memory") {
        memory(objects);
    }
    if run("eviction") {
        eviction_latency(objects + objects / 5);
    }
    if run("events") {
        event_encoding(objects);
    }
}

/// Encodes `n` events (half stored with two replicas, half removed; block-hash keys) in messages of 64, as the
/// publisher does, and prints the time per event and the bytes per event.
fn event_encoding(n: u64) {
    use crescent_master::events::{EventKind, KvEvent, Location, RemoveCause, Replicas, wire};
    let batch: Vec<KvEvent> = (0..64u64)
        .map(|i| {
            let stored = i % 2 == 0;
            KvEvent {
                kind: if stored { EventKind::Stored } else { EventKind::Removed },
                id: 1_000_000 + i,
                tenant: "default".into(),
                key: format!("{}", 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1)).into(),
                group: None,
                medium: "cpu",
                size: 1 << 20,
                replicas: if stored {
                    ["10.0.0.1:7000", "10.0.0.2:7000"]
                        .iter()
                        .map(|s| Location { segment: (*s).into(), tier: "memory" })
                        .collect()
                } else {
                    Replicas::new()
                },
                cause: (!stored).then_some(RemoveCause::Evicted),
            }
        })
        .collect();
    let messages = n.div_ceil(64).max(1);
    let mut out = bytes::BytesMut::new();
    let mut bytes = 0usize;
    let start = Instant::now();
    for m in 0..messages {
        out.reserve(64 + batch.len() * 512);
        wire::encode_payload_into(&mut out, &batch, "pool-a", 1_700_000_000_000 + m as i64);
        bytes += out.len();
        out.clear();
    }
    let took = start.elapsed();
    let events = messages * 64;
    println!(
        "events: encoded {events} events in messages of 64: {:.1} ns per event, {} bytes per event",
        took.as_nanos() as f64 / events as f64,
        bytes / events as usize
    );
}
