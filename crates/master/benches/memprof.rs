//! Where the master's bytes per object go: loads N objects (metadata only, one thread) and prints the live heap
//! it grew by, split by allocation size, beside the RSS it grew by.
//!
//! `cargo bench -p crescent-master --bench memprof -- [OBJECTS]` (default 2 000 000). The `master` bench's
//! `--only memory` gives the total; this one says which allocations make it up (one entry per object, the
//! allocator nodes and route tables as a few large vectors, and what their doubling left behind).
// A counting wrapper around the global allocator is the one way to see this; it forwards every call unchanged.
#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_master::clock::SystemClock;
use crescent_master::service::{MasterConfig, MasterService};
use crescent_proto::{ClientId, ReplicateConfig};
use std::alloc::{GlobalAlloc, Layout};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

/// Allocations up to this size are counted per 8-byte class; larger ones only in bytes.
const SMALL: usize = 1024;
/// Number of 8-byte classes up to `SMALL`.
const CLASSES: usize = SMALL / 8 + 1;

/// Live small allocations per 8-byte size class.
static LIVE: [AtomicI64; CLASSES] = [const { AtomicI64::new(0) }; CLASSES];
/// Live bytes in allocations above `SMALL`.
static BIG_LIVE: AtomicI64 = AtomicI64::new(0);
/// Bytes ever allocated above `SMALL` (a doubling vector counts each size it passed through).
static BIG_EVER: AtomicI64 = AtomicI64::new(0);
/// Allocations ever made above `SMALL`.
static BIG_COUNT: AtomicI64 = AtomicI64::new(0);

/// The allocator `crescent` runs on, wrapped so every call is counted.
struct Counting(mimalloc::MiMalloc);

fn record(size: usize, delta: i64) {
    if size <= SMALL {
        LIVE[size.div_ceil(8)].fetch_add(delta, Relaxed);
    } else {
        BIG_LIVE.fetch_add(delta * size as i64, Relaxed);
        if delta > 0 {
            BIG_EVER.fetch_add(size as i64, Relaxed);
            BIG_COUNT.fetch_add(1, Relaxed);
        }
    }
}

// SAFETY: every method forwards to mimalloc with the caller's arguments; counting touches only atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size(), 1);
        // SAFETY: forwarded unchanged.
        unsafe { self.0.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        record(layout.size(), -1);
        // SAFETY: forwarded unchanged.
        unsafe { self.0.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(layout.size(), -1);
        record(new_size, 1);
        // SAFETY: forwarded unchanged.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting(mimalloc::MiMalloc);

/// Resident set size of this process in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    statm.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096
}

/// Live allocation counts per class, then live big bytes.
fn live() -> Vec<i64> {
    LIVE.iter().map(|a| a.load(Relaxed)).chain([BIG_LIVE.load(Relaxed)]).collect()
}

fn main() {
    let n: u64 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2_000_000);
    let master = MasterService::new(MasterConfig::default(), Arc::new(SystemClock::new())).unwrap();
    for i in 0..4 {
        let spec = crescent_testkit::segment_on(&format!("node{i}"), 256 << 30, &format!("host{i}"));
        master.mount_segment(ClientId::random(), spec).unwrap();
    }
    let writer = ClientId::random();
    let config = ReplicateConfig::default();
    let (rss_before, before) = (rss(), live());
    for i in 0..n {
        let key = format!("k{i:019}");
        master.put_start(writer, "", &key, 4096, &config).unwrap();
        master.put_end(writer, "", &key, None).unwrap();
    }
    let (rss_after, after) = (rss(), live());
    let per = |bytes: f64| bytes / n as f64;
    println!("{n} objects, 20-byte keys, 4 KiB each, 4 segments");
    println!("RSS grew {:.1} B per object", per((rss_after - rss_before) as f64));
    let mut small = 0.0;
    for class in 0..CLASSES {
        let grown = after[class] - before[class];
        if grown.unsigned_abs() > n / 100 {
            let bytes = grown as f64 * (class * 8) as f64;
            println!(
                "  {:+.3} allocations of <= {:4} B per object = {:.1} B",
                grown as f64 / n as f64,
                class * 8,
                per(bytes)
            );
            small += bytes;
        }
    }
    let big = (after[CLASSES] - before[CLASSES]) as f64;
    println!("  allocations > {SMALL} B live: {:.1} B per object", per(big));
    println!("live heap grew {:.1} B per object", per(small + big));
    println!(
        "allocations > {SMALL} B made: {} totalling {:.1} B per object (a vector's doublings count each size)",
        BIG_COUNT.load(Relaxed),
        per(BIG_EVER.load(Relaxed) as f64)
    );
}
