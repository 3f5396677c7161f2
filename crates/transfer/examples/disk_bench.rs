//! Sequential 1 MiB reads through a `DiskSegment` at several queue depths, `O_DIRECT` and buffered.
//!
//! `cargo run --release -p crescent-transfer --example disk_bench -- DIR [SIZE_MIB] [--keep]`
//!
//! Fills `DIR/crescent-ssd.data` (SIZE_MIB, default 2048) with 1 MiB writes, then reads it all back in 1 MiB
//! reads at queue depths 1, 4 and 16 (with 2 I/O threads, the default, and with as many threads as the depth),
//! buffered first, then with `O_DIRECT` (the page cache dropped before each pass when this process may write
//! `/proc/sys/vm/drop_caches`). With `--keep` the file is left (filled, by the `O_DIRECT` pass's writes last)
//! for a `dd` comparison; otherwise it is removed.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use crescent_transfer::disk::{AlignedBuf, BlockDevice, DiskConfig, DiskSegment, FileDevice};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const MIB: u64 = 1 << 20;

fn drop_caches() -> bool {
    // Dirty pages written back first, so that dropping leaves none of the file cached.
    let synced = std::process::Command::new("sync").status().map(|s| s.success()).unwrap_or(false);
    synced && std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// `depth` tasks each taking the next 1 MiB until `size` is read; returns MB/s.
async fn read_all(disk: Arc<DiskSegment>, size: u64, depth: usize) -> f64 {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..depth)
        .map(|_| {
            let (disk, next) = (disk.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let at = next.fetch_add(MIB, Ordering::Relaxed);
                    if at >= size {
                        return;
                    }
                    let bytes = disk.read(at, MIB as usize).await.unwrap();
                    assert_eq!(bytes[0], (at / MIB) as u8, "block at {at}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    size as f64 / start.elapsed().as_secs_f64() / 1e6
}

async fn fill(disk: &Arc<DiskSegment>, size: u64) -> f64 {
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (disk, next) = (disk.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let at = next.fetch_add(MIB, Ordering::Relaxed);
                    if at >= size {
                        return;
                    }
                    let mut buf = AlignedBuf::zeroed(MIB as usize).unwrap();
                    buf.as_mut_slice().fill((at / MIB) as u8);
                    disk.write(at, buf).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    size as f64 / start.elapsed().as_secs_f64() / 1e6
}

async fn pass(dir: &Path, size: u64, direct: bool) {
    let device = if direct { FileDevice::create(dir, size) } else { FileDevice::create_buffered(dir, size) };
    let device = Arc::new(device.unwrap());
    let what = device.describe();
    let writer = Arc::new(DiskSegment::new(device.clone(), DiskConfig { io_threads: 4, queue_depth: 8 }).unwrap());
    let written = fill(&writer, size).await;
    drop(writer);
    println!("{what}: filled {} MiB with 1 MiB writes (4 threads, depth 8): {written:.0} MB/s", size / MIB);
    for fresh in [false, true] {
        // The device alone, on this thread, one read at a time: a reused buffer (as `dd` does) or a new one each.
        drop_caches();
        let start = Instant::now();
        let mut buf = AlignedBuf::zeroed(MIB as usize).unwrap();
        for at in (0..size).step_by(MIB as usize) {
            if fresh {
                buf = AlignedBuf::zeroed(MIB as usize).unwrap();
            }
            device.read_at(buf.padded_mut(), at).unwrap();
        }
        let mbs = size as f64 / start.elapsed().as_secs_f64() / 1e6;
        let how = if fresh { "a new buffer each" } else { "one reused buffer" };
        println!("  device.read_at 1 MiB x {}, {how}: {mbs:>6.0} MB/s", size / MIB);
    }
    for depth in [1, 4, 16] {
        for threads in [2, depth] {
            if threads > depth && depth != 1 {
                continue;
            }
            let dropped = drop_caches();
            let disk = Arc::new(
                DiskSegment::new(device.clone(), DiskConfig { io_threads: threads, queue_depth: depth }).unwrap(),
            );
            let mbs = read_all(disk.clone(), size, depth).await;
            let stats = disk.stats();
            println!(
                "  read 1 MiB x {}: depth {depth:>2}, {threads:>2} threads: {mbs:>6.0} MB/s (max in flight {}, caches dropped: {dropped})",
                size / MIB,
                stats.max_in_flight
            );
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = PathBuf::from(args.first().expect("usage: disk_bench DIR [SIZE_MIB] [--keep]"));
    let size = args.get(1).and_then(|s| s.parse::<u64>().ok()).unwrap_or(2048) * MIB;
    let keep = args.iter().any(|a| a == "--keep");
    pass(&dir, size, false).await;
    pass(&dir, size, true).await;
    if !keep {
        std::fs::remove_file(dir.join(crescent_transfer::disk::DATA_FILE)).unwrap();
    }
}
