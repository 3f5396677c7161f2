#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Model-based property tests for `OffsetAllocator`: random allocate / free / snapshot-restore sequences are
//! mirrored in a `BTreeMap` model and every structural and accounting invariant is checked after each step.

use std::collections::BTreeMap;

use crescent_master::alloc::{AllocError, Allocation, OffsetAllocator};
use proptest::prelude::*;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;
/// KV-cache block sizes seen in practice (per-layer and per-block slabs).
const KV_SIZES: [u64; 4] = [576 * KIB, 2 * MIB, 4608 * KIB, 16 * MIB];

/// How a request size is drawn; resolved against the capacity so every region sees useful sizes.
#[derive(Debug, Clone)]
enum SizeSpec {
    /// 0..64 bytes (0 exercises the ZeroSize error).
    Tiny(u64),
    /// One of the KV block sizes.
    Kv(usize),
    /// `capacity * n / 4096`, at least 1: spans small to whole-region requests.
    Fraction(u64),
    /// Uniform in 1..=capacity * 9 / 8 (a few exceed the capacity).
    Random(u64),
}

impl SizeSpec {
    fn resolve(&self, capacity: u64) -> u64 {
        match *self {
            SizeSpec::Tiny(n) => n,
            SizeSpec::Kv(i) => KV_SIZES[i % KV_SIZES.len()],
            SizeSpec::Fraction(n) => ((u128::from(capacity) * u128::from(n) / 4096) as u64).max(1),
            SizeSpec::Random(r) => {
                let bound = u128::from(capacity) + u128::from(capacity) / 8;
                (1 + u128::from(r) % bound).min(u128::from(u64::MAX)) as u64
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(SizeSpec),
    /// Free `live[pick % len]`, re-allocate the same size at once, and keep or release the re-allocation.
    Free {
        pick: usize,
        keep: bool,
    },
    /// Free a stale (already freed) handle: must be rejected with no change.
    Stale(usize),
    /// Snapshot, serialise, restore, and continue on the restored allocator with the restored handles.
    SnapshotRestore,
}

fn size_spec() -> impl Strategy<Value = SizeSpec> {
    prop_oneof![
        3 => (0u64..64).prop_map(SizeSpec::Tiny),
        4 => (0usize..4).prop_map(SizeSpec::Kv),
        2 => (1u64..=4096).prop_map(SizeSpec::Fraction),
        // Mostly small fractions so regions hold many allocations.
        3 => (1u64..=64).prop_map(SizeSpec::Fraction),
        2 => any::<u64>().prop_map(SizeSpec::Random),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => size_spec().prop_map(Op::Alloc),
        6 => (any::<usize>(), any::<bool>()).prop_map(|(pick, keep)| Op::Free { pick, keep }),
        1 => any::<usize>().prop_map(Op::Stale),
        1 => Just(Op::SnapshotRestore),
    ]
}

fn capacity() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(4 * KIB),
        Just(4 * KIB + 1000),
        Just(MIB),
        Just(40 * MIB + 7),
        Just(6 * GIB),
        Just(64 * GIB),
        Just(u64::MAX),
        1u64..=(1 << 40),
    ]
}

/// The system under test plus its model.
struct Harness {
    alloc: OffsetAllocator,
    live: Vec<Allocation>,
    /// offset -> (consumed, requested)
    model: BTreeMap<u64, (u64, u64)>,
    /// Handles already freed on the current allocator instance.
    stale: Vec<Allocation>,
}

impl Harness {
    fn new(capacity: u64) -> Self {
        Harness {
            alloc: OffsetAllocator::new(capacity).unwrap(),
            live: Vec::new(),
            model: BTreeMap::new(),
            stale: Vec::new(),
        }
    }

    /// Records a successful allocation in the model after checking it against the request.
    fn record(&mut self, h: Allocation, size: u64) {
        assert_eq!(h.size(), size);
        let consumed = self.alloc.consumed(&h).expect("live handle has a consumed size");
        assert!(consumed >= size, "consumed {consumed} < requested {size}");
        // The fallback path consumes less than the rounded size, never more.
        if let Some(normal) = OffsetAllocator::normalized_size(size) {
            assert!(consumed <= normal, "consumed {consumed} > normalized {normal}");
        }
        assert!(self.model.insert(h.offset(), (consumed, size)).is_none(), "offset {} handed out twice", h.offset());
        self.live.push(h);
    }

    fn allocate(&mut self, size: u64) -> Result<Allocation, AllocError> {
        let capacity = self.alloc.capacity();
        let largest = self.alloc.largest_free_extent();
        let can_fit = self.alloc.can_fit(size);
        let total = self.alloc.allocations_total();
        let result = self.alloc.allocate(size);
        match &result {
            Ok(h) => {
                assert_eq!(self.alloc.allocations_total(), total + 1);
                self.record(*h, size);
            }
            Err(e) => {
                assert_eq!(self.alloc.allocations_total(), total);
                assert!(!can_fit, "can_fit({size}) was true but allocate failed: {e}");
                match *e {
                    AllocError::ZeroSize => assert_eq!(size, 0),
                    AllocError::TooLarge { requested, capacity: c } => {
                        assert_eq!((requested, c), (size, capacity));
                        assert!(size > capacity);
                    }
                    AllocError::NoSpace { requested, largest_free } => {
                        assert_eq!(requested, size);
                        assert_eq!(largest_free, largest);
                        assert!(size <= capacity && size > 0);
                        // Any extent of the rounded size would have been found by the main path.
                        if let Some(normal) = OffsetAllocator::normalized_size(size) {
                            assert!(largest < normal, "largest free {largest} >= normalized {normal} yet NoSpace");
                        }
                    }
                    ref other => panic!("unexpected error {other:?}"),
                }
            }
        }
        result
    }

    fn free_at(&mut self, index: usize) -> Allocation {
        let h = self.live.swap_remove(index);
        self.alloc.free(&h).unwrap();
        assert!(self.model.remove(&h.offset()).is_some());
        self.stale.push(h);
        h
    }

    fn apply(&mut self, op: &Op) {
        let capacity = self.alloc.capacity();
        match op {
            Op::Alloc(spec) => {
                let _ = self.allocate(spec.resolve(capacity));
            }
            Op::Free { pick, keep } => {
                if self.live.is_empty() {
                    return;
                }
                let h = self.free_at(pick % self.live.len());
                self.check();
                // Freeing an allocation of size s guarantees room for s again.
                let again =
                    self.allocate(h.size()).unwrap_or_else(|e| panic!("re-allocate {} after free: {e}", h.size()));
                if !keep {
                    let last = self.live.len() - 1;
                    assert_eq!(self.live[last], again);
                    self.free_at(last);
                }
            }
            Op::Stale(pick) => {
                if self.stale.is_empty() {
                    return;
                }
                let h = self.stale[pick % self.stale.len()];
                let before = self.alloc.snapshot();
                let stats = self.stats();
                assert_eq!(self.alloc.free(&h), Err(AllocError::InvalidHandle));
                assert_eq!(self.alloc.consumed(&h), None);
                assert_eq!(self.alloc.snapshot(), before);
                assert_eq!(self.stats(), stats);
            }
            Op::SnapshotRestore => {
                let snap = self.alloc.snapshot();
                let (restored, handles) = OffsetAllocator::restore(&snap).unwrap();
                assert_eq!(restored.snapshot(), snap);
                assert_eq!(handles.len(), snap.allocations.len());
                for (h, a) in handles.iter().zip(&snap.allocations) {
                    assert_eq!((h.offset(), h.size()), (a.offset, a.requested));
                }
                self.alloc = restored;
                self.live = handles;
                // Handles of the old instance mean nothing to the new one.
                self.stale.clear();
            }
        }
        self.check();
    }

    fn stats(&self) -> (u64, u64, u64, u64, u64) {
        let a = &self.alloc;
        (a.used_bytes(), a.consumed_bytes(), a.live_allocations(), a.largest_free_extent(), a.allocations_total())
    }

    /// Compares the allocator against the model and checks every invariant.
    fn check(&self) {
        let a = &self.alloc;
        let capacity = a.capacity();
        a.check_invariants().unwrap();
        let mut end = 0u64;
        let mut largest_gap = 0u64;
        let (mut used, mut consumed) = (0u64, 0u64);
        for (&offset, &(c, r)) in &self.model {
            assert!(offset >= end, "allocation at {offset} overlaps the previous one ending at {end}");
            largest_gap = largest_gap.max(offset - end);
            end = offset.checked_add(c).expect("allocation end overflows");
            assert!(end <= capacity, "allocation [{offset}, {end}) beyond capacity {capacity}");
            used += r;
            consumed += c;
        }
        largest_gap = largest_gap.max(capacity - end);
        assert_eq!(a.used_bytes(), used);
        assert_eq!(a.consumed_bytes(), consumed);
        assert_eq!(a.used_bytes() + a.slack_bytes() + a.free_bytes(), capacity);
        assert_eq!(a.live_allocations(), self.model.len() as u64);
        assert_eq!(a.largest_free_extent(), largest_gap);
        let snap = a.snapshot();
        assert_eq!(snap.capacity, capacity);
        let from_model: Vec<_> = self.model.iter().map(|(&o, &(c, r))| (o, c, r)).collect();
        let from_alloc: Vec<_> = snap.allocations.iter().map(|s| (s.offset, s.consumed, s.requested)).collect();
        assert_eq!(from_alloc, from_model);
    }

    /// Frees everything and checks the region is whole again.
    fn drain(&mut self) {
        while !self.live.is_empty() {
            self.free_at(self.live.len() / 2);
        }
        self.check();
        let capacity = self.alloc.capacity();
        assert_eq!(self.alloc.largest_free_extent(), capacity);
        assert!(self.alloc.can_fit(capacity));
        let all = self.alloc.allocate(capacity).unwrap();
        assert_eq!(self.alloc.consumed(&all), Some(capacity));
        assert_eq!(self.alloc.free_bytes(), 0);
        self.alloc.free(&all).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn alloc_matches_model(capacity in capacity(), ops in prop::collection::vec(op(), 1..150)) {
        let mut h = Harness::new(capacity);
        h.check();
        for op in &ops {
            h.apply(op);
        }
        h.drain();
    }

    /// Uniform-size workloads never fragment: after any frees the region refills to exactly the same count.
    #[test]
    fn alloc_uniform_refills_completely(
        base in prop_oneof![(0usize..4).prop_map(|i| KV_SIZES[i]), 1u64..=(1 << 20), 1u64..=64],
        count in 1u64..200,
        tail_frac in 0u64..1000,
        frees in prop::collection::vec(any::<usize>(), 0..100),
    ) {
        let size = OffsetAllocator::normalized_size(base).unwrap();
        let capacity = size * count + size * tail_frac / 1000;
        let mut h = Harness::new(capacity);
        while h.allocate(size).is_ok() {}
        prop_assert_eq!(h.live.len() as u64, count);
        let mut freed = 0u64;
        for pick in frees {
            if h.live.is_empty() {
                break;
            }
            h.free_at(pick % h.live.len());
            freed += 1;
        }
        let mut refilled = 0u64;
        while h.allocate(size).is_ok() {
            refilled += 1;
        }
        prop_assert_eq!(refilled, freed);
        prop_assert_eq!(h.alloc.slack_bytes(), 0);
        h.check();
        h.drain();
    }

    /// Corrupting one field of a valid snapshot is rejected as a whole, or yields a consistent allocator.
    #[test]
    fn alloc_restore_validates(
        capacity in capacity(),
        sizes in prop::collection::vec(size_spec(), 1..40),
        victim in any::<usize>(),
        field in 0u8..3,
        delta in any::<u64>(),
    ) {
        let mut h = Harness::new(capacity);
        for s in &sizes {
            let _ = h.allocate(s.resolve(capacity));
        }
        let mut snap = h.alloc.snapshot();
        if snap.allocations.is_empty() {
            return Ok(());
        }
        let i = victim % snap.allocations.len();
        let a = &mut snap.allocations[i];
        match field {
            0 => a.offset = a.offset.wrapping_add(delta),
            1 => a.consumed = a.consumed.wrapping_add(delta),
            _ => a.requested = a.requested.wrapping_add(delta),
        }
        match OffsetAllocator::restore(&snap) {
            Ok((restored, handles)) => {
                restored.check_invariants().unwrap();
                prop_assert_eq!(restored.snapshot(), snap.clone());
                let mut restored = restored;
                for handle in &handles {
                    restored.free(handle).unwrap();
                }
                prop_assert_eq!(restored.largest_free_extent(), capacity);
            }
            Err(AllocError::CorruptSnapshot(_)) => {}
            Err(e) => prop_assert!(false, "unexpected error {e:?}"),
        }
    }
}
