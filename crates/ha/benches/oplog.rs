//! The ordered oplog writer against a real backend: entries per second and commit→durable latency (p50, p99,
//! max) with 1, 8 and 64 producer threads, and backend keys written per 10 000 entries, in batch mode (one
//! batch record + durable prefix per txn) and per-entry mode (the legacy layout: a key per entry + `/latest`).
//!
//!   cargo bench -p crescent-ha --bench oplog -- [--backend etcd|embedded|memory] [--producers 1,8,64]
//!       [--entries N] [--per-entry-entries N] [--payload BYTES] [--modes batch,per-entry]
//!
//! etcd is a real `etcd` started on free loopback ports (the `etcd-server` package; `CRESCENT_ETCD_BIN`
//! overrides the path), one fresh server per run so no run inherits another's history. Each producer thread
//! loops reserve → commit (as a master's mutation would, minus the mutation), retrying a full admission queue
//! at once; the run ends when the last entry is durable. Latency is from `commit` to its durable callback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use crescent_ha::kv::{EmbeddedKv, HaKvBackend, MemoryKv, prefix_end};
use crescent_ha::oplog::{
    OpLogBatchStorage, OpLogEntry, OrderedOpLogWriter, StorageConfig, WriterConfig, WriterError, WriterMode,
};
use crescent_ha::testing::EtcdServer;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

struct Args {
    backend: String,
    producers: Vec<usize>,
    /// Entries per batch-mode run.
    entries: usize,
    /// Entries per per-entry-mode run (a txn each: far slower, so fewer keep the run short).
    per_entry_entries: usize,
    payload: usize,
    modes: Vec<WriterMode>,
}

fn args() -> Args {
    let mut a = Args {
        backend: "etcd".into(),
        producers: vec![1, 8, 64],
        entries: 100_000,
        per_entry_entries: 5_000,
        payload: 200,
        modes: vec![WriterMode::Batch, WriterMode::LegacyPerEntry],
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--backend" => a.backend = value,
            "--producers" => a.producers = value.split(',').map(|p| p.trim().parse().unwrap()).collect(),
            "--entries" => a.entries = value.parse().unwrap(),
            "--per-entry-entries" => a.per_entry_entries = value.parse().unwrap(),
            "--modes" => {
                a.modes = value
                    .split(',')
                    .map(|m| match m.trim() {
                        "batch" => WriterMode::Batch,
                        "per-entry" => WriterMode::LegacyPerEntry,
                        other => panic!("unknown mode {other} (batch, per-entry)"),
                    })
                    .collect()
            }
            "--payload" => a.payload = value.parse().unwrap(),
            // cargo bench passes `--bench`; anything else unknown is a mistake worth saying.
            "--bench" => {
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

/// One run's figures.
struct Figures {
    entries_per_sec: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    keys: usize,
    batches: u64,
}

/// What keeps a backend alive for a run (the etcd process, the embedded store's directory): held, never read.
#[allow(dead_code)]
enum Held {
    Etcd(EtcdServer),
    Dir(tempfile::TempDir),
    Nothing,
}

async fn backend(kind: &str) -> (Arc<dyn HaKvBackend>, Held) {
    match kind {
        "etcd" => {
            let server = EtcdServer::start().expect("etcd (apt install etcd-server, or set CRESCENT_ETCD_BIN)");
            let kv = server.connect().await.expect("connect to etcd");
            (Arc::new(kv), Held::Etcd(server))
        }
        "embedded" => {
            let dir = tempfile::tempdir().unwrap();
            (Arc::new(EmbeddedKv::open(dir.path()).unwrap()), Held::Dir(dir))
        }
        "memory" => (Arc::new(MemoryKv::default()), Held::Nothing),
        other => panic!("unknown backend {other} (etcd, embedded, memory)"),
    }
}

fn percentile(sorted: &[u64], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Duration::from_nanos(sorted.get(i).copied().unwrap_or(0))
}

async fn run(kind: &str, mode: WriterMode, producers: usize, entries: usize, payload: usize) -> Figures {
    let (kv, _held) = backend(kind).await;
    let cluster = "bench";
    let storage = OpLogBatchStorage::new(kv.clone(), cluster, StorageConfig::default()).unwrap();
    let prefix = match mode {
        WriterMode::Batch => storage.init_durable_prefix().await.unwrap(),
        WriterMode::LegacyPerEntry => storage.init_legacy().await.unwrap(),
    };
    storage.claim_producer_view(1).await.unwrap();
    let config = WriterConfig { mode, ..WriterConfig::default() };
    let writer = Arc::new(OrderedOpLogWriter::new(storage, 1, prefix, config));
    writer.start();

    let per = entries / producers;
    let total = (per * producers) as u64;
    let durable = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(parking_lot::Mutex::new(Vec::with_capacity(total as usize)));
    let started = Instant::now();
    let threads: Vec<_> = (0..producers)
        .map(|p| {
            let (writer, durable, latencies) = (writer.clone(), durable.clone(), latencies.clone());
            std::thread::spawn(move || {
                for i in 0..per {
                    let reservation = loop {
                        match writer.reserve() {
                            Ok(r) => break r,
                            Err(WriterError::QueueFull(_)) => std::thread::yield_now(),
                            Err(e) => panic!("reserve: {e}"),
                        }
                    };
                    let entry = OpLogEntry {
                        op: 1,
                        tenant: "default".into(),
                        key: format!("producer-{p}/key-{i:08}"),
                        payload: vec![0x5a; payload],
                    };
                    let (durable, latencies) = (durable.clone(), latencies.clone());
                    let committed = Instant::now();
                    writer
                        .commit(
                            reservation,
                            entry,
                            Some(Box::new(move |_seq| {
                                latencies.lock().push(committed.elapsed().as_nanos() as u64);
                                durable.fetch_add(1, Ordering::Release);
                            })),
                        )
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // The run ends with its last durable callback.
    while durable.load(Ordering::Acquire) < total {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let elapsed = started.elapsed();
    let status = writer.status();
    writer.stop().await;
    let mut keys = 0;
    let prefix = format!("/oplog/{cluster}/").into_bytes();
    let end = prefix_end(&prefix);
    let mut begin = prefix.clone();
    loop {
        let page = kv.range(&begin, &end, 1000).await.unwrap();
        keys += page.kvs.len();
        match page.kvs.last() {
            Some(last) if page.more => {
                begin = last.key.clone();
                begin.push(0);
            }
            _ => break,
        }
    }
    let mut l = std::mem::take(&mut *latencies.lock());
    l.sort_unstable();
    Figures {
        entries_per_sec: total as f64 / elapsed.as_secs_f64(),
        p50: percentile(&l, 0.50),
        p99: percentile(&l, 0.99),
        max: percentile(&l, 1.0),
        keys,
        // Per-entry mode writes one entry per txn.
        batches: match mode {
            WriterMode::Batch => status.durable.batch_id,
            WriterMode::LegacyPerEntry => status.durable.last_seq,
        },
    }
}

fn main() {
    let a = args();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    println!(
        "backend {} · {} entries per batch-mode run, {} per per-entry run · payload {} B · release: {}",
        a.backend,
        a.entries,
        a.per_entry_entries,
        a.payload,
        !cfg!(debug_assertions)
    );
    println!(
        "{:>9} {:>9} {:>12} {:>11} {:>11} {:>11} {:>9} {:>10} {:>14}",
        "mode", "producers", "entries/s", "p50", "p99", "max", "txns", "entries/tx", "keys/10k ops"
    );
    for &mode in &a.modes {
        for &producers in &a.producers {
            let entries = if mode == WriterMode::Batch { a.entries } else { a.per_entry_entries };
            let f = rt.block_on(run(&a.backend, mode, producers, entries, a.payload));
            let total = (entries / producers * producers) as f64;
            println!(
                "{:>9} {:>9} {:>12.0} {:>11.2?} {:>11.2?} {:>11.2?} {:>9} {:>10.1} {:>14.1}",
                if mode == WriterMode::Batch { "batch" } else { "per-entry" },
                producers,
                f.entries_per_sec,
                f.p50,
                f.p99,
                f.max,
                f.batches,
                total / f.batches.max(1) as f64,
                f.keys as f64 * 10_000.0 / total,
            );
        }
    }
}
