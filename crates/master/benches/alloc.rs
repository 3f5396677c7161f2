#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Allocator throughput and utilisation: Crescent's 64-bit `OffsetAllocator` against the `offset-allocator`
//! crate (u32 offsets, so it manages the same region in 256-byte units; every workload size is a multiple of
//! 256 B, so both see identical requests).
//!
//! Throughput: a steady state with the region ~90% full; one iteration frees the oldest allocation and
//! allocates a new one (one alloc+free pair). Utilisation is printed as `utilisation <workload> ...` lines:
//! `fresh` fills an empty region until the first failure; `churned` first runs 200k steps that free a random
//! live allocation and allocate a new one at ~90% fill (random frees fragment the region), then fills.

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Duration;

use crescent_master::alloc::{Allocation, OffsetAllocator};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;
/// Unit of the u32 crate: 64 GiB / 256 B = 2^28 units fits a u32.
const UNIT: u64 = 256;
/// Steady-state fill level.
const FILL: f64 = 0.90;
/// Steps of churn before the `churned` utilisation fill.
const CHURN_STEPS: usize = 200_000;

/// Tiny xorshift64 so the workload is reproducible without extra dependencies.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// A request-size distribution over a region.
#[derive(Clone, Copy)]
struct Workload {
    name: &'static str,
    region: u64,
    kind: Sizes,
}

#[derive(Clone, Copy)]
enum Sizes {
    /// Uniform choice from a fixed list.
    Choice(&'static [u64]),
    /// Uniform in [lo, hi], rounded to a multiple of `UNIT`.
    Range(u64, u64),
}

impl Workload {
    fn sizes(&self, seed: u64) -> impl FnMut() -> u64 + use<> {
        let mut rng = XorShift(seed);
        let kind = self.kind;
        move || match kind {
            Sizes::Choice(list) => list[(rng.next() % list.len() as u64) as usize],
            Sizes::Range(lo, hi) => (lo + rng.next() % (hi - lo + 1)) / UNIT * UNIT,
        }
    }
}

const KV_MIX: &[u64] = &[576 * KIB, 2 * MIB, 4608 * KIB, 16 * MIB];

const WORKLOADS: &[Workload] = &[
    // Region sized so each uniform workload keeps ~60k allocations live.
    Workload { name: "uniform-4KiB", region: 256 * MIB, kind: Sizes::Choice(&[4 * KIB]) },
    Workload { name: "uniform-1MiB", region: 64 * GIB, kind: Sizes::Choice(&[MIB]) },
    Workload { name: "kv-mix", region: 64 * GIB, kind: Sizes::Choice(KV_MIX) },
    // Not a KV shape: shows the cost of rounding to bin sizes (up to 12.5% slack) on arbitrary sizes.
    Workload { name: "random-256B..16MiB", region: 64 * GIB, kind: Sizes::Range(UNIT, 16 * MIB) },
];

/// The two allocators behind one interface; sizes in bytes.
trait Subject {
    type Handle: Copy;
    fn new(region: u64) -> Self;
    fn alloc(&mut self, size: u64) -> Option<Self::Handle>;
    fn free(&mut self, h: Self::Handle);
}

impl Subject for OffsetAllocator {
    type Handle = Allocation;
    fn new(region: u64) -> Self {
        OffsetAllocator::new(region).unwrap()
    }
    fn alloc(&mut self, size: u64) -> Option<Allocation> {
        self.allocate(size).ok()
    }
    fn free(&mut self, h: Allocation) {
        OffsetAllocator::free(self, &h).unwrap();
    }
}

/// `offset-allocator` 0.2 in 256-byte units.
struct Crate(offset_allocator::Allocator<u32>);

impl Subject for Crate {
    type Handle = offset_allocator::Allocation<u32>;
    fn new(region: u64) -> Self {
        Crate(offset_allocator::Allocator::with_max_allocs(u32::try_from(region / UNIT).unwrap(), 1 << 21))
    }
    fn alloc(&mut self, size: u64) -> Option<Self::Handle> {
        self.0.allocate(u32::try_from(size / UNIT).unwrap())
    }
    fn free(&mut self, h: Self::Handle) {
        self.0.free(h);
    }
}

/// Live allocations in age order plus their requested bytes.
struct Steady<S: Subject> {
    subject: S,
    live: VecDeque<(S::Handle, u64)>,
    used: u64,
    region: u64,
}

impl<S: Subject> Steady<S> {
    /// Fills a fresh region to `FILL` with the workload's sizes.
    fn new(w: &Workload, next: &mut impl FnMut() -> u64) -> Self {
        let mut s = Steady { subject: S::new(w.region), live: VecDeque::new(), used: 0, region: w.region };
        while (s.used as f64) < FILL * w.region as f64 {
            let size = next();
            let Some(h) = s.subject.alloc(size) else { break };
            s.live.push_back((h, size));
            s.used += size;
        }
        s
    }

    /// One steady-state step: free the oldest, allocate a new one (freeing more if it does not fit).
    fn step(&mut self, size: u64) {
        self.step_with_victim(0, size);
    }

    /// Frees `live[victim % len]`, then allocates `size` (freeing the oldest until it fits).
    fn step_with_victim(&mut self, victim: usize, size: u64) {
        if !self.live.is_empty() {
            let (h, sz) = self.live.swap_remove_front(victim % self.live.len()).expect("index in range");
            self.subject.free(h);
            self.used -= sz;
        }
        loop {
            if let Some(h) = self.subject.alloc(size) {
                self.live.push_back((black_box(h), size));
                self.used += size;
                return;
            }
            let (h, sz) = self.live.pop_front().expect("an empty region fits any workload size");
            self.subject.free(h);
            self.used -= sz;
        }
    }

    /// Allocates until the first failure; returns requested bytes / region.
    fn fill_until_failure(&mut self, next: &mut impl FnMut() -> u64) -> f64 {
        loop {
            let size = next();
            match self.subject.alloc(size) {
                Some(h) => {
                    self.live.push_back((h, size));
                    self.used += size;
                }
                None => return self.used as f64 / self.region as f64,
            }
        }
    }
}

/// Fresh and churned utilisation for one allocator.
fn utilisation<S: Subject>(w: &Workload) -> (f64, f64) {
    let mut next = w.sizes(0xC0FFEE);
    let fresh = Steady::<S> { subject: S::new(w.region), live: VecDeque::new(), used: 0, region: w.region }
        .fill_until_failure(&mut next);
    let mut next = w.sizes(0xBEEF);
    let mut s = Steady::<S>::new(w, &mut next);
    let mut victims = XorShift(0x5EED);
    for _ in 0..CHURN_STEPS {
        let size = next();
        s.step_with_victim(victims.next() as usize, size);
    }
    (fresh, s.fill_until_failure(&mut next))
}

fn bench_steady<S: Subject>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    w: &Workload,
) {
    let mut next = w.sizes(42);
    let mut state = Steady::<S>::new(w, &mut next);
    c.bench_function(name, |b| {
        b.iter(|| {
            let size = next();
            state.step(size);
        })
    });
}

fn benches(c: &mut Criterion) {
    for w in WORKLOADS {
        let (ours_fresh, ours_churned) = utilisation::<OffsetAllocator>(w);
        let (crate_fresh, crate_churned) = utilisation::<Crate>(w);
        println!("utilisation {} fresh crescent={ours_fresh:.4} offset-allocator={crate_fresh:.4}", w.name);
        println!("utilisation {} churned crescent={ours_churned:.4} offset-allocator={crate_churned:.4}", w.name);

        let mut group = c.benchmark_group(format!("alloc_free_pair/{}", w.name));
        group.throughput(Throughput::Elements(1));
        bench_steady::<OffsetAllocator>(&mut group, "crescent", w);
        bench_steady::<Crate>(&mut group, "offset-allocator", w);
        group.finish();
    }
}

criterion_group! {
    name = alloc;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = benches
}
criterion_main!(alloc);
