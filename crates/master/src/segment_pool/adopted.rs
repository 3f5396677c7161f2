//! One region's allocations adopted from a snapshot and not yet re-bound to their objects.
//!
//! A restore of tens of millions of objects adopts as many allocations, then looks each up once by its offset
//! (from several threads) as its object is rebuilt. A hash map per region cost most of a restore's regions phase
//! to build (one random insert per allocation) and a lock per lookup. The allocator hands its allocations over in
//! offset order, so they are kept as they come: a sorted vector, a directory of offset buckets (about one
//! allocation per bucket) to land next to the right one, and one bit per allocation, set once, for "re-bound".

use crate::alloc::Allocation;
use std::sync::atomic::{AtomicU64, Ordering};

/// Adopted allocations of one region, each re-bound at most once (see the module doc).
pub(crate) struct Adopted {
    /// Ascending offsets, no two alike.
    allocations: Vec<Allocation>,
    /// `starts[b]`: the first allocation whose offset is at least bucket `b`'s first offset (`b << shift`); one
    /// more entry than buckets, the last being `allocations.len()`.
    starts: Vec<u32>,
    /// Bucket of an offset: `offset >> shift`.
    shift: u32,
    /// Bit `i`: allocation `i` was re-bound.
    taken: Vec<AtomicU64>,
}

impl Adopted {
    /// Keeps `allocations` (sorted here if they are not already; offsets are unique in one region).
    pub(crate) fn new(mut allocations: Vec<Allocation>) -> Self {
        if !allocations.is_sorted_by_key(Allocation::offset) {
            allocations.sort_unstable_by_key(Allocation::offset);
        }
        let n = allocations.len() as u64;
        let span = allocations.last().map_or(0, |a| a.offset() + 1);
        // Buckets about as many as allocations (never more than twice as many): offsets spread evenly over the
        // region land one or two to a bucket; clustered ones fall back to a binary search inside theirs.
        let shift = (span / n.max(1)).max(1).ilog2();
        let buckets = usize::try_from(span.div_ceil(1 << shift)).unwrap_or(0);
        let mut starts = Vec::with_capacity(buckets + 1);
        let mut i = 0usize;
        for b in 0..buckets as u64 {
            while i < allocations.len() && allocations[i].offset() >> shift < b {
                i += 1;
            }
            starts.push(i as u32);
        }
        starts.push(allocations.len() as u32);
        let taken = (0..allocations.len().div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Self { allocations, starts, shift, taken }
    }

    /// Whether none were.
    pub(crate) fn is_empty(&self) -> bool {
        self.allocations.is_empty()
    }

    /// Takes the allocation at `offset` if it has exactly `size` requested bytes and was not taken before.
    pub(crate) fn take(&self, offset: u64, size: u64) -> Option<Allocation> {
        let b = usize::try_from(offset >> self.shift).ok()?;
        let (from, to) = (*self.starts.get(b)? as usize, *self.starts.get(b + 1)? as usize);
        let bucket = self.allocations.get(from..to)?;
        let i = from + bucket.binary_search_by_key(&offset, Allocation::offset).ok()?;
        let a = self.allocations[i];
        if a.size() != size {
            return None;
        }
        let bit = 1u64 << (i % 64);
        let before = self.taken[i / 64].fetch_or(bit, Ordering::AcqRel);
        (before & bit == 0).then_some(a)
    }

    /// The allocations never taken (every one is yielded once: the taker's bits are set as they go).
    pub(crate) fn take_rest(&mut self) -> impl Iterator<Item = Allocation> + '_ {
        let taken = &mut self.taken;
        self.allocations.iter().enumerate().filter_map(move |(i, a)| {
            let word = taken[i / 64].get_mut();
            let bit = 1u64 << (i % 64);
            let open = *word & bit == 0;
            *word |= bit;
            open.then_some(*a)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::alloc::{AllocatorSnapshot, OffsetAllocator, SnapshotAllocation};

    /// Allocations at `offsets` (each `size` bytes) as a restored allocator hands them over.
    fn adopted(offsets: &[u64], size: u64) -> Vec<Allocation> {
        let mut sorted = offsets.to_vec();
        sorted.sort_unstable();
        let allocations =
            sorted.iter().map(|&offset| SnapshotAllocation { offset, requested: size, consumed: size }).collect();
        let capacity = sorted.last().map_or(1 << 20, |o| (o + size).next_power_of_two());
        let (_, handles) = OffsetAllocator::restore(&AllocatorSnapshot { capacity, allocations }).unwrap();
        // Handed over out of order: they are sorted on the way in.
        let mut by_offset: Vec<Allocation> = handles;
        by_offset.reverse();
        by_offset
    }

    #[test]
    fn each_allocation_is_found_by_its_offset_and_size_once() {
        // Evenly spread, clustered at the start, one far out, and offset 0.
        let mut offsets: Vec<u64> = (0..1000).map(|i| i * 4096).collect();
        offsets.extend((0..200).map(|i| 10_000_000 + i * 64));
        offsets.push(1 << 33);
        let a = Adopted::new(adopted(&offsets, 64));
        for &o in &offsets {
            assert_eq!(a.take(o, 100), None, "the size must match");
            let got = a.take(o, 64).unwrap();
            assert_eq!((got.offset(), got.size()), (o, 64));
            assert_eq!(a.take(o, 64), None, "taken twice");
        }
        for o in [1, 4095, 10_000_000 + 63, (1 << 33) + 1, u64::MAX] {
            assert_eq!(a.take(o, 64), None, "no allocation at {o}");
        }
    }

    #[test]
    fn the_rest_is_what_nobody_took_and_comes_out_once() {
        let offsets: Vec<u64> = (0..300).map(|i| i * 128).collect();
        let mut a = Adopted::new(adopted(&offsets, 100));
        for &o in offsets.iter().step_by(3) {
            a.take(o, 100).unwrap();
        }
        let rest: Vec<u64> = a.take_rest().map(|x| x.offset()).collect();
        let want: Vec<u64> = offsets.iter().copied().filter(|o| (o / 128) % 3 != 0).collect();
        assert_eq!(rest, want);
        assert_eq!(a.take_rest().count(), 0);
        assert_eq!(a.take(128, 100), None, "what came out is gone");
    }

    #[test]
    fn none_adopted_finds_nothing() {
        let a = Adopted::new(Vec::new());
        assert!(a.is_empty());
        assert_eq!(a.take(0, 1), None);
    }

    #[test]
    fn takers_on_several_threads_each_get_a_distinct_share() {
        let offsets: Vec<u64> = (0..20_000).map(|i| i * 256).collect();
        let a = Adopted::new(adopted(&offsets, 200));
        let got: usize = std::thread::scope(|s| {
            let workers: Vec<_> =
                (0..4).map(|_| s.spawn(|| offsets.iter().filter(|&&o| a.take(o, 200).is_some()).count())).collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(got, offsets.len(), "each taken exactly once across the threads");
    }
}
