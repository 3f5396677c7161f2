//! Batched transfers to one peer: many small ranges pipelined over a few lanes.
//!
//! A batch of small objects (KV blocks of a few KiB) sent one exchange at a time costs a round trip each, and on
//! small machines every round trip is a wake-up. Here each lane carries a *run* of requests written in one
//! vectored write; the server answers them in order and the client reads the replies back to back, so a run
//! costs one round trip however many ranges it holds. Ranges larger than a stripe keep the striped path.
//!
//! Results are per range, in input order. A refused range (`Refused`) leaves its lane usable for the rest of the
//! run; an I/O or protocol failure fails the range it hit and, with `Closed`, every later range of that run
//! (the lane is then dropped, as in single transfers).

use super::{GrantSlots, Lane, LaneGuard, Peer, Place, RangeGrant, TransferClient};
use crate::copy;
use crate::error::TransferError;
use crate::memory::SegmentMemory;
use crate::vm::{CopyError, RemoteProcess};
use crescent_proto::transfer::{TransferRequest, TransferResponse};
use crescent_proto::wire::{Head, WireError};
use crescent_proto::{ErrorCode, SegmentId};
use futures_util::future::join_all;
use std::io::IoSlice;
use std::sync::Arc;
use tokio::time::timeout;

/// Most requests in one pipelined run (bounds the bytes a run parks in socket buffers).
const MAX_RUN: usize = 128;

/// One range of a batched read: `buf.len()` bytes at `offset` of `segment`.
#[derive(Debug)]
pub struct BatchRead<'a> {
    /// The segment holding the range.
    pub segment: SegmentId,
    /// The master's read grant covering the range (see [`Place`]).
    pub grant: Option<RangeGrant>,
    /// Where the range starts in the segment.
    pub offset: u64,
    /// Receives the bytes.
    pub buf: &'a mut [u8],
}

/// One range of a batched write: `data` to `offset` of `segment`.
#[derive(Debug, Clone)]
pub struct BatchWrite<'a> {
    /// The destination segment.
    pub segment: SegmentId,
    /// The master's write grant covering the range (see [`Place`]).
    pub grant: Option<RangeGrant>,
    /// Where the range starts in the segment.
    pub offset: u64,
    /// The bytes to write.
    pub data: &'a [u8],
}

impl TransferClient {
    /// Reads many ranges hosted at `endpoint` into their buffers and returns each range's crc32c (summed as it
    /// lands), in input order. Ranges in segments of this process are copied first, all together
    /// (`read_local`); of the others, small ranges are pipelined over the peer's lanes and
    /// larger ones striped.
    pub async fn read_batch_checksummed(
        &self,
        endpoint: &str,
        items: &mut [BatchRead<'_>],
    ) -> Vec<Result<u32, TransferError>> {
        let mut out: Vec<Option<Result<u32, TransferError>>> = Vec::new();
        out.resize_with(items.len(), || None);
        // The whole batch is one transfer: its runs may poll, and its local copies use both cores, when it is the
        // client's only one.
        let (_inflight, alone) = self.inner.inflight.enter();
        let mut local = Vec::new();
        let mut rest = Vec::new();
        for (i, item) in items.iter_mut().enumerate() {
            match self.inner.local.get(&item.segment) {
                Some(mem) => local.push((i, mem, item)),
                None => rest.push((i, item)),
            }
        }
        for (i, r) in read_local(local, alone) {
            out[i] = Some(r);
        }
        if !rest.is_empty() {
            let peer = self.peer(endpoint, rest.first().map(|(_, item)| item.segment));
            let stripe = self.stripe(&peer);
            let (runs, singles): (Vec<_>, Vec<_>) = rest.into_iter().partition(|(_, item)| item.buf.len() <= stripe);
            let lanes = self.inner.config.lanes_per_peer.max(1);
            let bytes = runs.iter().map(|(_, r)| r.buf.len()).sum();
            let pipelined =
                split_runs(runs, bytes, stripe, lanes).into_iter().map(|run| self.read_run(&peer, run, alone));
            let striped = singles.into_iter().map(|(i, item)| async move {
                let place = Place::new(item.segment, item.grant.clone());
                vec![(i, self.read_into_checksummed(endpoint, place, item.offset, item.buf).await)]
            });
            let (pipelined, striped) = tokio::join!(join_all(pipelined), join_all(striped));
            for (i, r) in pipelined.into_iter().chain(striped).flatten() {
                out[i] = Some(r);
            }
        }
        out.into_iter().map(|r| r.unwrap_or(Err(TransferError::Closed))).collect()
    }

    /// Writes many ranges hosted at `endpoint`; each is acknowledged only once its bytes are in the segment.
    /// Results in input order. Ranges in segments of this process are copied first, all together; of the
    /// others, small ranges are pipelined over the peer's lanes and larger ones striped.
    pub async fn write_batch(&self, endpoint: &str, items: &[BatchWrite<'_>]) -> Vec<Result<(), TransferError>> {
        self.write_batch_summed(endpoint, items).await.into_iter().map(|r| r.map(|_| ())).collect()
    }

    /// [`TransferClient::write_batch`] that also returns the crc32c of the ranges it copied within this process
    /// (summed as they were copied: `Some`); `None` for ranges sent to the node, whose bytes it does not sum.
    pub async fn write_batch_summed(
        &self,
        endpoint: &str,
        items: &[BatchWrite<'_>],
    ) -> Vec<Result<Option<u32>, TransferError>> {
        let mut out: Vec<Option<Result<Option<u32>, TransferError>>> = Vec::new();
        out.resize_with(items.len(), || None);
        let (_inflight, alone) = self.inner.inflight.enter();
        let mut local = Vec::new();
        let mut rest = Vec::new();
        for (i, w) in items.iter().enumerate() {
            match self.inner.local.get(&w.segment) {
                Some(mem) => local.push((i, mem, w)),
                None => rest.push((i, w)),
            }
        }
        for (i, r) in write_local(local, alone) {
            out[i] = Some(r.map(Some));
        }
        if !rest.is_empty() {
            let peer = self.peer(endpoint, rest.first().map(|(_, w)| w.segment));
            let stripe = self.write_stripe_bytes(&peer);
            let (runs, singles): (Vec<_>, Vec<_>) = rest.into_iter().partition(|(_, w)| w.data.len() <= stripe);
            let lanes = self.inner.config.lanes_per_peer.max(1);
            let bytes = runs.iter().map(|(_, w)| w.data.len()).sum();
            let pipelined =
                split_runs(runs, bytes, stripe, lanes).into_iter().map(|run| self.write_run(&peer, run, alone));
            let striped = singles.into_iter().map(|(i, w)| async move {
                vec![(i, self.write_from(endpoint, Place::new(w.segment, w.grant.clone()), w.offset, w.data).await)]
            });
            let (pipelined, striped) = tokio::join!(join_all(pipelined), join_all(striped));
            for (i, r) in pipelined.into_iter().chain(striped).flatten() {
                out[i] = Some(r.map(|()| None));
            }
        }
        out.into_iter().map(|r| r.unwrap_or(Err(TransferError::Closed))).collect()
    }

    /// One lane's share of a batched read, in runs of at most [`MAX_RUN`].
    async fn read_run<'b>(
        &self,
        peer: &Peer,
        mut run: Vec<(usize, &mut BatchRead<'b>)>,
        alone: bool,
    ) -> Vec<(usize, Result<u32, TransferError>)> {
        let mut out = Vec::with_capacity(run.len());
        let mut guard = match peer.checkout(&self.inner.config).await {
            Ok(g) => g,
            Err(e) => return fail_all(run.iter().map(|(i, _)| *i), e),
        };
        for part in run.chunks_mut(MAX_RUN) {
            let Some(lane) = usable(&mut guard, part.iter().map(|(i, _)| *i), &mut out) else { continue };
            lane.may_poll = alone && part.iter().all(|(_, item)| super::polls_for(item.buf.len()));
            match timeout(self.inner.config.io_timeout, lane.read_many(part)).await {
                Ok(results) => out.extend(results),
                Err(_) => out.extend(fail_all(part.iter().map(|(i, _)| *i), TransferError::Timeout)),
            }
        }
        out
    }

    /// One lane's share of a batched write, in runs of at most [`MAX_RUN`].
    async fn write_run(
        &self,
        peer: &Peer,
        run: Vec<(usize, &BatchWrite<'_>)>,
        alone: bool,
    ) -> Vec<(usize, Result<(), TransferError>)> {
        let mut out = Vec::with_capacity(run.len());
        let mut guard = match peer.checkout(&self.inner.config).await {
            Ok(g) => g,
            Err(e) => return fail_all(run.iter().map(|(i, _)| *i), e),
        };
        for part in run.chunks(MAX_RUN) {
            let Some(lane) = usable(&mut guard, part.iter().map(|(i, _)| *i), &mut out) else { continue };
            lane.may_poll = alone;
            match timeout(self.inner.config.io_timeout, lane.write_many(part)).await {
                Ok(results) => out.extend(results),
                Err(_) => out.extend(fail_all(part.iter().map(|(i, _)| *i), TransferError::Timeout)),
            }
        }
        out
    }
}

/// The lane for the next part of a run; `None`, with the part's ranges failed in `out`, when there is none or an
/// earlier part broke it (the rest of the run was then never sent).
fn usable<'g, R>(
    guard: &'g mut LaneGuard<'_>,
    part: impl Iterator<Item = usize>,
    out: &mut Vec<(usize, Result<R, TransferError>)>,
) -> Option<&'g mut Lane> {
    match guard.lane() {
        Ok(lane) if lane.clean => Some(lane),
        Ok(_) => {
            out.extend(part.map(|i| (i, Err(TransferError::Closed))));
            None
        }
        Err(e) => {
            out.extend(fail_all(part, e));
            None
        }
    }
}

/// Deals `items` (carrying `bytes` in all) into contiguous runs of nearly equal length: one run per stripe's
/// worth of bytes, at most `lanes`. A run waits for its replies by polling only when it is the client's sole
/// exchange, so splitting a small batch over several lanes would trade one polled round trip for several
/// parked ones (measured: 32 × 4 KiB reads on one lane ~1.6× the keys/s of four lanes).
fn split_runs<T>(items: Vec<T>, bytes: usize, stripe: usize, lanes: usize) -> Vec<Vec<T>> {
    if items.is_empty() {
        return Vec::new();
    }
    let runs = bytes.div_ceil(stripe.max(1)).clamp(1, lanes.max(1));
    let per = items.len().div_ceil(runs);
    let mut runs = Vec::with_capacity(lanes);
    let mut rest = items.into_iter().peekable();
    while rest.peek().is_some() {
        runs.push(rest.by_ref().take(per).collect());
    }
    runs
}

/// Reads the ranges of a batch that lie in segments of this process (`(index, memory, range)`), all in one
/// [`copy::copy_all`]: summed as they are copied, over two threads when the batch is `alone` (the client's only
/// transfer, so the other core is likely idle) and long enough. A range whose lease is refused fails alone.
fn read_local(
    local: Vec<(usize, Arc<SegmentMemory>, &mut BatchRead<'_>)>,
    alone: bool,
) -> Vec<(usize, Result<u32, TransferError>)> {
    let mut out = Vec::with_capacity(local.len());
    let (mems, mut reads): (Vec<_>, Vec<_>) = local.into_iter().map(|(i, mem, item)| ((i, mem), item)).unzip();
    let mut leased = Vec::with_capacity(mems.len());
    for ((i, mem), item) in mems.iter().zip(reads.iter_mut()) {
        match mem.lease(item.offset, item.buf.len() as u64) {
            Ok(src) => leased.push((*i, src, &mut *item.buf)),
            Err(e) => out.push((*i, Err(e))),
        }
    }
    let pairs = leased.iter_mut().map(|(_, src, buf)| (&mut **buf, &**src)).collect();
    let crcs = copy::copy_all(pairs, true, alone);
    out.extend(leased.iter().map(|(i, _, _)| *i).zip(crcs).map(|(i, crc)| (i, Ok(crc))));
    out
}

/// Writes the ranges of a batch that lie in segments of this process, as [`read_local`] reads them; returns
/// each one's crc32c.
fn write_local(
    local: Vec<(usize, Arc<SegmentMemory>, &BatchWrite<'_>)>,
    alone: bool,
) -> Vec<(usize, Result<u32, TransferError>)> {
    let mut out = Vec::with_capacity(local.len());
    let mut leased = Vec::with_capacity(local.len());
    for (i, mem, w) in &local {
        match mem.lease_mut(w.offset, w.data.len() as u64) {
            Ok(dst) => leased.push((*i, dst, w.data)),
            Err(e) => out.push((*i, Err(e))),
        }
    }
    let pairs = leased.iter_mut().map(|(_, dst, data)| (&mut **dst, *data)).collect();
    let crcs = copy::copy_all(pairs, true, alone);
    out.extend(leased.iter().map(|(i, _, _)| *i).zip(crcs).map(|(i, crc)| (i, Ok(crc))));
    out
}

/// The first range gets `e`; the others `Closed` (an error is not cloneable, and they were never attempted).
fn fail_all<R>(indices: impl Iterator<Item = usize>, e: TransferError) -> Vec<(usize, Result<R, TransferError>)> {
    let mut e = Some(e);
    indices.map(|i| (i, Err(e.take().unwrap_or(TransferError::Closed)))).collect()
}

/// Records range `i`'s result in `out`. Any failure but the server refusing that one range leaves the lane
/// unusable, so the ranges after it (`rest`) fail with `Closed`; returns whether the run goes on.
fn settle<R>(
    out: &mut Vec<(usize, Result<R, TransferError>)>,
    i: usize,
    r: Result<R, TransferError>,
    rest: impl Iterator<Item = usize>,
) -> bool {
    let broken = matches!(&r, Err(e) if !matches!(e, TransferError::Refused(_)));
    out.push((i, r));
    if broken {
        out.extend(rest.map(|i| (i, Err(TransferError::Closed))));
    }
    !broken
}

impl Lane {
    /// Reads the ranges of `run`: those this lane copies itself (`Lane::copies`) by local copies, then the others
    /// pipelined over the socket ([`Lane::read_sent`]).
    async fn read_many(&mut self, run: &mut [(usize, &mut BatchRead<'_>)]) -> Vec<(usize, Result<u32, TransferError>)> {
        let mut out = Vec::with_capacity(run.len());
        let (mut copied, mut sent): (Vec<_>, Vec<_>) =
            run.iter_mut().map(|(i, item)| (*i, &mut **item)).partition(|(_, item)| self.copies(item.buf.len()));
        if !copied.is_empty() {
            let ranges: Vec<_> = copied
                .iter()
                .map(|(i, r)| (*i, Place::new(r.segment, r.grant.clone()), r.offset, r.buf.len()))
                .collect();
            let (done, denied) =
                self.locate_and_copy(&ranges, false, |k, remote, at| remote.read(at, copied[k].1.buf, true)).await;
            out.extend(done);
            sent.extend(copied.into_iter().enumerate().filter(|(k, _)| denied.contains(k)).map(|(_, item)| item));
        }
        if !sent.is_empty() && self.clean {
            out.extend(self.read_sent(&mut sent).await);
        } else {
            out.extend(sent.iter().map(|(i, _)| (*i, Err(TransferError::Closed))));
        }
        out
    }

    /// Sends every read request of `run` in one write, then reads the replies in order, each straight into its
    /// buffer. A lane-level failure marks the lane unclean (it is dropped) and fails the rest of the run.
    async fn read_sent(&mut self, run: &mut [(usize, &mut BatchRead<'_>)]) -> Vec<(usize, Result<u32, TransferError>)> {
        self.clean = false;
        let first = self.next_id;
        let mut requests = Vec::with_capacity(run.len() * 48);
        let mut slots = GrantSlots::default();
        for (_, item) in run.iter() {
            let id = self.next_id();
            let read = TransferRequest::Read {
                segment: item.segment,
                offset: item.offset,
                length: item.buf.len() as u64,
                grant: slots.use_of(item.grant.as_ref()),
            };
            let head = match Head::encode(id, &read, 0) {
                Ok(h) => h,
                Err(e) => return fail_all(run.iter().map(|(i, _)| *i), e.into()),
            };
            if let Err(e) = self.check_size(head.as_bytes().len() + item.buf.len()) {
                return fail_all(run.iter().map(|(i, _)| *i), e);
            }
            requests.extend_from_slice(head.as_bytes());
        }
        if let Err(e) = self.send(&mut [IoSlice::new(&requests)]).await {
            return fail_all(run.iter().map(|(i, _)| *i), e);
        }
        let mut out = Vec::with_capacity(run.len());
        let mut id = first;
        for k in 0..run.len() {
            let (i, item) = &mut run[k];
            let r = match self.response(id).await {
                Ok((TransferResponse::Data, n)) if n == item.buf.len() => self.receive_data(item.buf, true).await,
                Ok((TransferResponse::Error(code), 0)) => Err(TransferError::Refused(code)),
                Ok(_) => Err(WireError::Malformed("unexpected reply to a read").into()),
                Err(e) => Err(e),
            };
            if !settle(&mut out, *i, r, run[k + 1..].iter().map(|(i, _)| *i)) {
                return out;
            }
            id = id.wrapping_add(1).max(1);
        }
        self.clean = true;
        out
    }

    /// Writes the ranges of `run`: those this lane copies itself (`Lane::copies`) by local copies, then the others
    /// pipelined over the socket ([`Lane::write_sent`]).
    async fn write_many(&mut self, run: &[(usize, &BatchWrite<'_>)]) -> Vec<(usize, Result<(), TransferError>)> {
        let (copied, mut sent): (Vec<_>, Vec<_>) = run.iter().partition(|(_, w)| self.copies(w.data.len()));
        let mut out = Vec::with_capacity(run.len());
        if !copied.is_empty() {
            let ranges: Vec<_> = copied
                .iter()
                .map(|(i, w)| (*i, Place::new(w.segment, w.grant.clone()), w.offset, w.data.len()))
                .collect();
            let (done, denied) = self
                .locate_and_copy(&ranges, true, |k, remote, at| remote.write(at, copied[k].1.data, false).map(|_| ()))
                .await;
            out.extend(done);
            sent.extend(denied.into_iter().map(|k| copied[k]));
        }
        if !sent.is_empty() && self.clean {
            out.extend(self.write_sent(&sent).await);
        } else {
            out.extend(sent.iter().map(|(i, _)| (*i, Err(TransferError::Closed))));
        }
        out
    }

    /// Sends every write of `run` (headers and payloads) in one vectored write, then reads the acknowledgements
    /// in order. A lane-level failure marks the lane unclean and fails the rest of the run.
    async fn write_sent(&mut self, run: &[(usize, &BatchWrite<'_>)]) -> Vec<(usize, Result<(), TransferError>)> {
        self.clean = false;
        let first = self.next_id;
        let mut heads = Vec::with_capacity(run.len());
        let mut slots = GrantSlots::default();
        for (_, w) in run {
            let id = self.next_id();
            let grant = slots.use_of(w.grant.as_ref());
            let head = match Head::encode(
                id,
                &TransferRequest::Write { segment: w.segment, offset: w.offset, grant },
                w.data.len(),
            ) {
                Ok(h) => h,
                Err(e) => return fail_all(run.iter().map(|(i, _)| *i), e.into()),
            };
            if let Err(e) = self.check_size(head.as_bytes().len() + w.data.len()) {
                return fail_all(run.iter().map(|(i, _)| *i), e);
            }
            heads.push(head);
        }
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(run.len() * 2);
        for (head, (_, w)) in heads.iter().zip(run) {
            slices.push(IoSlice::new(head.as_bytes()));
            slices.push(IoSlice::new(w.data));
        }
        if let Err(e) = self.send(&mut slices).await {
            return fail_all(run.iter().map(|(i, _)| *i), e);
        }
        let mut out = Vec::with_capacity(run.len());
        let mut id = first;
        for (k, (i, _)) in run.iter().enumerate() {
            let r = match self.response(id).await {
                Ok((TransferResponse::Written, 0)) => Ok(()),
                Ok((TransferResponse::Error(code), 0)) => Err(TransferError::Refused(code)),
                Ok(_) => Err(WireError::Malformed("unexpected reply to a write").into()),
                Err(e) => Err(e),
            };
            if !settle(&mut out, *i, r, run[k + 1..].iter().map(|(i, _)| *i)) {
                return out;
            }
            id = id.wrapping_add(1).max(1);
        }
        self.clean = true;
        out
    }
}

impl Lane {
    /// A run by local copies: every range's `Locate` in one write; as each answer comes, `copy(k, node,
    /// address)` for the run's `k`-th range; then one `Release` for them all, awaited (so the ranges are free
    /// when this returns). `ranges` are `(index, place, offset, length)`. Returns the results, and the run
    /// positions to be carried by the lane instead (released too): those the kernel denied the copy of, and
    /// those the node would hold no more of until the Release (`NO_AVAILABLE_HANDLE`: too many ranges, or too
    /// many disk bytes staged, for one run). A lane-level
    /// failure fails the rest of the run — and a failed `Release` every range, which may still be held — and
    /// leaves the lane unclean (its close releases whatever it held).
    pub(super) async fn locate_and_copy<T>(
        &mut self,
        ranges: &[(usize, Place, u64, usize)],
        write: bool,
        mut copy: impl FnMut(usize, &RemoteProcess, u64) -> Result<T, CopyError>,
    ) -> (Vec<(usize, Result<T, TransferError>)>, Vec<usize>) {
        self.clean = false;
        let all = || ranges.iter().map(|(i, ..)| *i);
        let first = self.next_id;
        let mut requests = Vec::with_capacity(ranges.len() * 64);
        let mut slots = GrantSlots::default();
        for (_, place, offset, len) in ranges {
            let id = self.next_id();
            let locate = TransferRequest::Locate {
                segment: place.segment,
                offset: *offset,
                length: *len as u64,
                write,
                grant: slots.use_of(place.grant.as_ref()),
            };
            match Head::encode(id, &locate, 0) {
                Ok(head) => requests.extend_from_slice(head.as_bytes()),
                Err(e) => return (fail_all(all(), e.into()), Vec::new()),
            }
        }
        if let Err(e) = self.send(&mut [IoSlice::new(&requests)]).await {
            return (fail_all(all(), e), Vec::new());
        }
        let (mut out, mut denied) = (Vec::with_capacity(ranges.len()), Vec::new());
        // The lane failed: the ranges set aside for it fail too.
        let broken = |mut out: Vec<_>, denied: Vec<usize>| {
            out.extend(denied.into_iter().map(|k| (ranges[k].0, Err(TransferError::Closed))));
            (out, Vec::new())
        };
        let mut id = first;
        for (k, &(i, ..)) in ranges.iter().enumerate() {
            let answer = self.response(id).await;
            id = id.wrapping_add(1).max(1);
            let r = match answer {
                Ok((TransferResponse::Located(at), 0)) => {
                    let copied = match &self.remote {
                        // Denied already: every later range goes over the lane too.
                        Some(_) if !denied.is_empty() => Err(CopyError::Denied),
                        Some(remote) => copy(k, remote, at),
                        None => Err(CopyError::Failed(std::io::Error::other("no local copies on this lane"))),
                    };
                    match copied {
                        Ok(v) => Ok(v),
                        Err(CopyError::Denied) => {
                            if !self.copy_denied.swap(true, std::sync::atomic::Ordering::Relaxed) {
                                tracing::debug!(
                                    "the kernel denies local copies to this storage node: its lanes carry the bytes"
                                );
                            }
                            denied.push(k);
                            continue;
                        }
                        Err(CopyError::Failed(e)) => Err(TransferError::Io(e)),
                    }
                }
                Ok((TransferResponse::Error(ErrorCode::NoAvailableHandle), 0)) => {
                    denied.push(k);
                    continue;
                }
                Ok((TransferResponse::Error(code), 0)) => Err(TransferError::Refused(code)),
                Ok(_) => Err(WireError::Malformed("unexpected reply to a locate").into()),
                Err(e) => Err(e),
            };
            if !settle(&mut out, i, r, ranges[k + 1..].iter().map(|(i, ..)| *i)) {
                return broken(out, denied);
            }
        }
        if let Err(e) = self.release().await {
            // Copied, but perhaps still held: none counts as done.
            let mut e = Some(e);
            for (_, r) in out.iter_mut().filter(|(_, r)| r.is_ok()) {
                *r = Err(e.take().unwrap_or(TransferError::Closed));
            }
            return broken(out, denied);
        }
        self.clean = true;
        (out, denied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_contiguous_and_balanced() {
        // Ten ranges of 100 KiB with 256 KiB stripes: four stripes' worth, four lanes.
        let runs = split_runs((0..10).collect(), 1000 << 10, 256 << 10, 4);
        assert_eq!(runs, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8], vec![9]]);
        // Plenty of bytes, few ranges: never more runs than ranges or lanes.
        assert_eq!(split_runs((0..3).collect(), 3 << 20, 256 << 10, 8), vec![vec![0], vec![1], vec![2]]);
        assert_eq!(split_runs((0..10).collect(), 100 << 20, 256 << 10, 2).len(), 2);
        // A small batch stays on one lane.
        assert_eq!(split_runs((0..32).collect(), 128 << 10, 256 << 10, 4).len(), 1);
        assert!(split_runs(Vec::<u8>::new(), 0, 256 << 10, 4).is_empty());
    }
}
