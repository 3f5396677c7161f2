//! Restores spread independent pieces of work (a segment's allocator, a block of objects) over the machine's
//! cores: a restart or a promotion of tens of millions of objects waits for them.

/// How many threads a restore uses for `items` pieces of work: one below `min` of them (a thread costs more than
/// it saves), else the available cores, at most `max` (the work is memory-bound beyond a few).
pub(crate) fn restore_threads(items: usize, min: usize, max: usize) -> usize {
    if items < min { 1 } else { std::thread::available_parallelism().map_or(1, |n| n.get()).min(max).min(items) }
}

/// `f` applied to every item on `threads` scoped threads (thread `t` takes items `t`, `t + threads`, …), the
/// results in the items' order. A panic in `f` is raised here.
pub(crate) fn map<T: Send, R: Send>(items: Vec<T>, threads: usize, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let n = items.len();
    if threads <= 1 || n <= 1 {
        return items.into_iter().map(f).collect();
    }
    let mut shares: Vec<Vec<(usize, T)>> = (0..threads).map(|_| Vec::with_capacity(n / threads + 1)).collect();
    for (i, item) in items.into_iter().enumerate() {
        shares[i % threads].push((i, item));
    }
    let f = &f;
    let mut done: Vec<(usize, R)> = std::thread::scope(|s| {
        let workers: Vec<_> = shares
            .into_iter()
            .map(|share| s.spawn(move || share.into_iter().map(|(i, item)| (i, f(item))).collect::<Vec<_>>()))
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    done.sort_unstable_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_the_items_order_whatever_the_threads() {
        let items: Vec<u64> = (0..1000).collect();
        for threads in [1, 2, 3, 8] {
            let got = map(items.clone(), threads, |x| x * x);
            assert_eq!(got, items.iter().map(|x| x * x).collect::<Vec<_>>(), "{threads} threads");
        }
        assert!(map(Vec::<u8>::new(), 4, |x| x).is_empty());
    }

    #[test]
    fn few_items_stay_on_one_thread() {
        assert_eq!(restore_threads(10, 64, 8), 1);
        assert!((1..=8).contains(&restore_threads(1000, 64, 8)));
        assert!(restore_threads(2, 1, 8) <= 2);
    }
}
