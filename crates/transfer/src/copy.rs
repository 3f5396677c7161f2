//! Copies inside this process (segments it hosts or mapped from a node on its host: `TransferClient::attach`),
//! summed as they go and spread over two threads.
//!
//! A checksummed copy reads every byte twice (the copy, then crc32c), and the second pass is cheap only while
//! the bytes are still in cache: so each piece of [`SUM_PIECE`] bytes is summed right after it is copied (its
//! destination, so the sum is of the bytes as they landed). And one thread is well short of what the memory
//! can take, so a long copy (a batch's ranges taken together, or one large range) is cut in two at a byte
//! boundary, the second half done on a helper thread while this one does the first, and the halves' sums of a
//! range cut in two are joined ([`checksum::combine`]).

use crate::checksum;

/// Bytes copied then summed at a time (at least; the last piece of a range takes the rest, up to twice this),
/// so a piece is summed while it is still in cache (L2, or the shared L3). Not less: glibc copies pieces below
/// its `rep_movsb_stop_threshold` (the L2 size per core on AMD: 512 KiB here, 1 MiB on Zen 4) with `rep movsb`,
/// which on AMD runs at a quarter of the speed when the destination is not at the source's offset within a
/// cache line (measured on the 2-vCPU VM, 4 MiB: 128 KiB pieces to dst+16 2.6 GB/s, 1 MiB pieces 6.8 GB/s,
/// aligned either 6.5 GB/s) — and callers' buffers (Python bytes, NumPy arrays) are often 16-byte aligned.
pub(crate) const SUM_PIECE: usize = 1 << 20;

/// Copies at least this long (in all) are split over two threads: below it the helper thread's start costs
/// more than half the copy saves (measured on the 2-vCPU VM: a scoped thread spawned and joined ~60 µs; copy
/// and sum in one thread ~8 GB/s, so 1 MiB took 133 µs alone and 167 µs split, 2 MiB 257 / 252 µs, 4 MiB
/// 529 / 387 µs; a batch of 32 ranges of 1 MiB 4.1 / 2.3 ms).
pub(crate) const PARALLEL_MIN: usize = 2 << 20;

/// Runs `helper` on a scoped thread of its own while `here` runs on this thread, and returns both results.
/// When no thread can be had, or the helper thread has not started by the time `here` is done (a busy
/// machine), `helper` runs on this thread after `here`: never slower than running both here, bar the spawn.
pub(crate) fn join<H, RH, F, RF>(helper: H, here: F) -> (RH, RF)
where
    H: FnOnce() -> RH + Send,
    RH: Send,
    F: FnOnce() -> RF,
{
    // Whoever takes the work first runs it: the helper thread, or this one once `here` is done.
    let slot = parking_lot::Mutex::new(Some(helper));
    let take = || slot.lock().take();
    std::thread::scope(|scope| {
        let spawned =
            std::thread::Builder::new().name("crescent-copy".into()).spawn_scoped(scope, || take().map(|h| h()));
        let mine = here();
        let theirs = match take() {
            Some(h) => h(),
            // The helper thread took the work: its result (a panic there is one here, as if it had run here).
            None => match spawned.map(|t| t.join()) {
                Ok(Ok(Some(theirs))) => theirs,
                Ok(Err(panic)) => std::panic::resume_unwind(panic),
                // Only a spawned thread can have taken the work, and it returns what it ran.
                Ok(Ok(None)) | Err(_) => unreachable!("the helper's work was taken and not run"),
            },
        };
        (theirs, mine)
    })
}

/// Copies `src` into `dst` (of the same length), summing each piece right after it is copied if `checksum`;
/// returns the crc32c of the bytes (0 if not `checksum`).
pub(crate) fn copy_summed(dst: &mut [u8], src: &[u8], checksum: bool) -> u32 {
    debug_assert_eq!(dst.len(), src.len());
    if !checksum {
        dst.copy_from_slice(src);
        return 0;
    }
    let mut crc = 0;
    let (mut dst, mut src) = (dst, src);
    while !dst.is_empty() {
        // A piece of SUM_PIECE, or the whole rest when less than two pieces are left.
        let n = if dst.len() >= 2 * SUM_PIECE { SUM_PIECE } else { dst.len() };
        let (d, dst_rest) = dst.split_at_mut(n);
        let (s, src_rest) = src.split_at(n);
        d.copy_from_slice(s);
        crc = crc32c::crc32c_append(crc, d);
        (dst, src) = (dst_rest, src_rest);
    }
    crc
}

/// One range of a copy: `src` into `dst`, of the same length.
pub(crate) type Pair<'a> = (&'a mut [u8], &'a [u8]);

/// Copies every pair (each `src` into its `dst`, lengths equal) and returns each pair's crc32c in order (0s if
/// not `checksum`). With `parallel`, a copy of at least [`PARALLEL_MIN`] bytes in all is cut in two halves of
/// the bytes, the second done on a helper thread ([`join`]).
pub(crate) fn copy_all(pairs: Vec<Pair<'_>>, checksum: bool, parallel: bool) -> Vec<u32> {
    let total: usize = pairs.iter().map(|(d, _)| d.len()).sum();
    let n = pairs.len();
    if !parallel || total < PARALLEL_MIN {
        return pairs.into_iter().map(|(d, s)| copy_summed(d, s, checksum)).collect();
    }
    let (first, second) = halves(pairs, total / 2);
    let run = |part: Vec<(usize, Pair<'_>)>| {
        part.into_iter().map(|(i, (d, s))| (i, d.len() as u64, copy_summed(d, s, checksum))).collect::<Vec<_>>()
    };
    let (second, first) = join(|| run(second), || run(first));
    // The first half's pieces come before the second's, and a pair cut in two has one piece in each: joined in
    // that order, every pair's sum is that of its bytes (the sum of nothing, 0, joins as nothing).
    let mut crcs = vec![0; n];
    for (i, len, crc) in first.into_iter().chain(second) {
        crcs[i] = checksum::combine(crcs[i], crc, len);
    }
    crcs
}

/// Cuts `pairs` into the first `at` bytes and the rest, each piece tagged with its pair's index (a pair that
/// straddles `at` gives a piece to each half).
#[allow(clippy::type_complexity)] // two lists of (index, pair)
fn halves(pairs: Vec<Pair<'_>>, at: usize) -> (Vec<(usize, Pair<'_>)>, Vec<(usize, Pair<'_>)>) {
    let (mut first, mut second) = (Vec::new(), Vec::new());
    let mut left = at;
    for (i, (d, s)) in pairs.into_iter().enumerate() {
        if left >= d.len() {
            left -= d.len();
            first.push((i, (d, s)));
        } else if left == 0 {
            second.push((i, (d, s)));
        } else {
            let (d1, d2) = d.split_at_mut(left);
            let (s1, s2) = s.split_at(left);
            first.push((i, (d1, s1)));
            second.push((i, (d2, s2)));
            left = 0;
        }
    }
    (first, second)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u64) -> Vec<u8> {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..len).map(|_| rng.u8(..)).collect()
    }

    /// Copies `lens`-long ranges with [`copy_all`] and checks every destination and every sum against a plain
    /// copy and a one-pass crc32c.
    fn check(lens: &[usize], parallel: bool) {
        let srcs: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &l)| data(l, i as u64 + 1)).collect();
        let mut dsts: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0; l]).collect();
        let pairs = dsts.iter_mut().zip(&srcs).map(|(d, s)| (d.as_mut_slice(), s.as_slice())).collect();
        let crcs = copy_all(pairs, true, parallel);
        assert_eq!(crcs.len(), lens.len());
        for (i, (d, s)) in dsts.iter().zip(&srcs).enumerate() {
            assert!(d == s, "range {i} of {lens:?} copied");
            assert_eq!(crcs[i], crc32c::crc32c(s), "range {i} of {lens:?} (parallel {parallel})");
        }
    }

    #[test]
    fn fused_sums_equal_one_pass_sums_for_odd_sizes_and_piece_boundaries() {
        for len in
            [0, 1, 7, SUM_PIECE - 1, SUM_PIECE, SUM_PIECE + 1, 2 * SUM_PIECE - 1, 2 * SUM_PIECE, 3 * SUM_PIECE + 5]
        {
            let src = data(len, len as u64);
            let mut dst = vec![0; len];
            assert_eq!(copy_summed(&mut dst, &src, true), crc32c::crc32c(&src), "len {len}");
            assert_eq!(dst, src);
            let mut dst = vec![0; len];
            assert_eq!(copy_summed(&mut dst, &src, false), 0, "no sum asked");
            assert_eq!(dst, src);
        }
    }

    #[test]
    fn split_copies_sum_each_range_as_a_sequential_copy_does() {
        let p = PARALLEL_MIN;
        let cases: &[&[usize]] = &[
            &[],
            &[0],
            &[p],                        // one range cut in the middle
            &[p + 1],                    // odd length: unequal halves
            &[2 * p + 3, 1],             // the cut inside the first range, a 1-byte range after it
            &[p / 2, p / 2],             // the cut exactly between two ranges
            &[p / 2, 0, p / 2, 0],       // empty ranges on either side of the cut
            &[1, 2, 3, p, 5, 6, 7],      // the cut inside a middle range
            &[SUM_PIECE + 1; 17],        // many ranges not a multiple of a piece
            &[(p / 2) + 1, (p / 2) - 1], // the cut one byte before the end of the first range
            &[(p / 2) - 1, (p / 2) + 1], // the cut one byte into the second range
        ];
        for lens in cases {
            check(lens, true);
            check(lens, false);
        }
    }

    #[test]
    fn halves_cut_at_the_byte_asked_and_keep_order() {
        let srcs: Vec<Vec<u8>> = [3usize, 4, 5].iter().map(|&l| vec![1; l]).collect();
        let mut dsts: Vec<Vec<u8>> = [3usize, 4, 5].iter().map(|&l| vec![0; l]).collect();
        let pairs = dsts.iter_mut().zip(&srcs).map(|(d, s)| (d.as_mut_slice(), s.as_slice())).collect();
        let (first, second) = halves(pairs, 5);
        let shape = |h: &[(usize, Pair<'_>)]| h.iter().map(|(i, (d, _))| (*i, d.len())).collect::<Vec<_>>();
        assert_eq!(shape(&first), [(0, 3), (1, 2)]);
        assert_eq!(shape(&second), [(1, 2), (2, 5)]);
    }

    #[test]
    fn join_returns_both_results_whichever_thread_ran_the_helper() {
        for _ in 0..50 {
            let (a, b) = join(|| 1 + 1, || "here");
            assert_eq!((a, b), (2, "here"));
        }
        // A helper borrowing this thread's data, as the copies do.
        let mut v = vec![0u8; 10];
        let (left, right) = v.split_at_mut(5);
        join(|| left.fill(1), || right.fill(2));
        assert_eq!(v, [1, 1, 1, 1, 1, 2, 2, 2, 2, 2]);
    }
}
