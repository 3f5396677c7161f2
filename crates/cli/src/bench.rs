//! `crescent bench`: throughput and latency against a running cluster, phase by phase.
//!
//! Phases: `write` (put new keys), `read` (get the keys written), `mixed` (half reads, half writes), `dedup`
//! (batch-exists a batch, then put only the missing keys, as inference connectors do) and `metadata` (batch
//! exists only: the master's keys/s). `master-put` (PutStart + PutEnd, no bytes moved) and `master-get`
//! (GetReplicaList of the keys `master-put` made, or of 10 000 keys per worker it makes first) measure the
//! master alone, as the original's `master_bench` does; they use keys of their own, so `read` never meets
//! their unwritten values. Values carry a per-key pattern so `--verify` checks every byte read.
//! `--keys N` sets the key set (writes cycle over it even beyond memory; reads draw from all of it, also keys a
//! `--keep` run with the same `--run` name wrote) and `--zipf S` draws reads Zipf-distributed over it: the disk
//! tier's benchmark (`scripts/bench-ssd.sh`) reads a working set three times memory that way.
//!
//! Latency percentiles count every request, failed and timed-out ones included, and are corrected for
//! coordinated omission: a worker waits for its request before sending the next, so a request that stalls for
//! 30 s would otherwise count once, however many requests a client would have sent meanwhile. While a request
//! takes longer than twice the phase's median, the requests its worker would have sent in that time (one per
//! median) count as well, each waiting from when it would have been sent (`Latencies`). `max` is the longest
//! single request. Phases that move no bytes (`metadata`, `master-put`, `master-get`) allocate no value
//! buffers, and a `--batch` over the protocol's per-request limit is refused before anything is sent.

use crate::config::{FileConfig, Global};
use anyhow::{Result, anyhow, bail};
use bytes::BytesMut;
use crescent_client::{Client, ClientError};
use crescent_proto::ClusterInfo;
use crescent_proto::rpc::{MasterRequest, MasterResponse};
use crescent_proto::wire::{Batch, MAX_BATCH, WireKey};
use indicatif::{ProgressBar, ProgressStyle};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `bench` flags.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Comma-separated phases: write, read, mixed, dedup, metadata, master-put, master-get, prefix, prefix-exist
    /// (a prompt's `--batch` blocks looked up as the longest cached run, read, the rest written: with the leased
    /// prefix lookup, or with batch-exists; `--keys` prompts, `--zipf` their popularity).
    #[arg(long, default_value = "write,read")]
    phases: String,
    /// Bytes per value (e.g. 4KiB, 1MiB).
    #[arg(long, default_value = "1MiB")]
    value_size: String,
    /// Keys per request.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Concurrent requests.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Replicas per value.
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// How long each phase runs (ignored with --count).
    #[arg(long, value_name = "DURATION", value_parser = seconds_or_duration, default_value = "10s",
        help = "How long each phase runs, e.g. 500ms, 10s (a bare number is seconds; ignored with --count)")]
    duration: Duration,
    /// Requests per phase (overrides --duration).
    #[arg(long)]
    count: Option<u64>,
    /// Check every byte read against the written pattern.
    #[arg(long)]
    verify: bool,
    /// Single-key reads use `get` (a new buffer, striped over several cores) instead of `get_into` (the
    /// caller's buffer, zero-copy).
    #[arg(long)]
    owned_reads: bool,
    /// Write one JSON object per phase to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Leave the benchmark's keys in the store when done (by default they are removed).
    #[arg(long)]
    keep: bool,
    /// Key set size: writes cycle over this many keys instead of the ones memory holds below its watermark (so
    /// a working set larger than memory can be written: older values are evicted, or offloaded to a disk
    /// tier), and reads draw from all of them, also in a run that writes none (keys a `--keep` run left).
    #[arg(long)]
    keys: Option<u64>,
    /// Reads draw keys Zipf-distributed with this exponent (e.g. 0.99) instead of uniformly: rank r has weight
    /// 1/(r+1)^S, ranks mapped to keys by a fixed shuffle (seeded), so hot keys are not the first or last written.
    #[arg(long)]
    zipf: Option<f64>,
    /// The run's name in its keys (`bench-NAME-K`); random by default. A later run with the same name and
    /// `--keys` reads the keys a `--keep` run wrote.
    #[arg(long)]
    run: Option<String>,
    /// A put refused for want of memory (NO_AVAILABLE_HANDLE) is tried again every 20 ms, for up to 60 s, instead
    /// of counted as failed (the retries are reported): memory a disk tier is still copying out comes back only
    /// once the copy is done. Single-key writes only (`--batch 1`).
    #[arg(long)]
    retry_full: bool,
}

/// One phase's results.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseResult {
    phase: String,
    value_size: u64,
    batch: usize,
    concurrency: usize,
    requests: u64,
    keys: u64,
    bytes: u64,
    seconds: f64,
    req_per_s: f64,
    keys_per_s: f64,
    mib_per_s: f64,
    p50_us: u64,
    p95_us: u64,
    p99_us: u64,
    /// The longest single request.
    max_us: u64,
    errors: u64,
    /// Puts tried again after NO_AVAILABLE_HANDLE (`--retry-full`).
    retries: u64,
    /// Failed keys by error code (`VERIFY_MISMATCH`: read, but not the bytes written; `MISS_AFTER_LOOKUP`: a
    /// prefix phase's block found by its lookup and gone when read).
    errors_by_code: BTreeMap<&'static str, u64>,
    /// Requests sent to the master per request of the phase (lookups, writes' starts and ends, lease releases).
    master_requests_per_request: f64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Write,
    Read,
    Mixed,
    Dedup,
    Metadata,
    MasterPut,
    MasterGet,
    Prefix,
    PrefixExist,
}

impl Phase {
    fn parse(s: &str) -> Result<Phase> {
        Ok(match s.trim() {
            "write" => Phase::Write,
            "read" => Phase::Read,
            "mixed" => Phase::Mixed,
            "dedup" => Phase::Dedup,
            "metadata" => Phase::Metadata,
            "master-put" => Phase::MasterPut,
            "master-get" => Phase::MasterGet,
            "prefix" => Phase::Prefix,
            "prefix-exist" => Phase::PrefixExist,
            other => bail!("unknown phase {other:?}"),
        })
    }

    /// Whether the phase writes values (and so needs buffers to send from).
    fn writes(self) -> bool {
        matches!(self, Phase::Write | Phase::Mixed | Phase::Dedup | Phase::Prefix | Phase::PrefixExist)
    }

    /// Whether the phase reads values (and so needs buffers to receive into).
    fn reads(self) -> bool {
        matches!(self, Phase::Read | Phase::Mixed | Phase::Prefix | Phase::PrefixExist)
    }

    fn name(self) -> &'static str {
        match self {
            Phase::Write => "write",
            Phase::Read => "read",
            Phase::Mixed => "mixed",
            Phase::Dedup => "dedup",
            Phase::Metadata => "metadata",
            Phase::MasterPut => "master-put",
            Phase::MasterGet => "master-get",
            Phase::Prefix => "prefix",
            Phase::PrefixExist => "prefix-exist",
        }
    }
}

/// The value stored under key number `k`: a shared base pattern whose first 8 bytes are the key number.
/// Turns a buffer holding `base` into key `k`'s value: only the first 8 bytes differ between keys, so a reused
/// buffer is restamped rather than rewritten (an application's KV blocks are already in memory; copying a
/// whole value per request would bill the benchmark's own memcpy to the store).
fn stamp(k: u64, out: &mut [u8]) {
    let n = out.len().min(8);
    out[..n].copy_from_slice(&k.to_le_bytes()[..n]);
}

fn check(base: &[u8], k: u64, got: &[u8]) -> bool {
    let n = got.len().min(8);
    got.len() == base.len() && got[..n] == k.to_le_bytes()[..n] && got[n..] == base[n..]
}

/// Buffers a worker reuses across requests (no allocation or page faults per request).
#[derive(Default)]
struct Worker {
    rng: fastrand::Rng,
    owned: Option<BytesMut>,
    batch: Vec<Vec<u8>>,
    read: Vec<Vec<u8>>,
}

impl Worker {
    /// A worker whose buffers for `phase` are allocated and touched now, before the phase's clock starts
    /// (first-touch page faults of a batch of large values would otherwise dominate a short phase). A phase
    /// that moves no bytes gets none: batch × value size of them is gigabytes at large batches.
    fn prepared(seed: u64, s: &Shared, phase: Phase) -> Self {
        let copies = |n: usize| (0..n).map(|_| s.base.clone()).collect::<Vec<_>>();
        let writes = phase.writes();
        Worker {
            rng: fastrand::Rng::with_seed(seed),
            owned: (writes && s.batch == 1).then(|| BytesMut::from(&s.base[..])),
            batch: if writes && s.batch > 1 { copies(s.batch) } else { Vec::new() },
            read: if phase.reads() { copies(s.batch) } else { Vec::new() },
        }
    }
}

struct Shared {
    client: Client,
    /// The tenant master-only requests name (the client's own).
    tenant: String,
    /// Bytes per value.
    size: u64,
    /// The value pattern (empty when no phase moves bytes).
    base: Vec<u8>,
    run: String,
    batch: usize,
    replicate: crescent_proto::ReplicateConfig,
    verify: bool,
    owned_reads: bool,
    /// Keys written so far (key numbers `0..written`).
    written: AtomicU64,
    next_key: AtomicU64,
    /// Master-only keys made so far (`master-put`'s key numbers `0..meta_written`).
    meta_written: AtomicU64,
    meta_next: AtomicU64,
    requests: AtomicU64,
    errors: AtomicU64,
    /// Puts of the current phase tried again after NO_AVAILABLE_HANDLE.
    retries: AtomicU64,
    /// `--retry-full`.
    retry_full: bool,
    /// Failed keys of the current phase by error code.
    errors_by_code: Mutex<BTreeMap<&'static str, u64>>,
    /// Value keys the cluster can hold at once: writes cycle over this many keys (replacing the values they
    /// wrote before), so reads never meet keys the benchmark's own writes evicted. With `--keys`, that many.
    key_budget: u64,
    /// `--keys` was given: reads draw from the whole key set, written by this run or not.
    fixed_keys: bool,
    /// Zipf-distributed reads over the key set (`--zipf`).
    zipf: Option<Zipf>,
}

impl Shared {
    fn key(&self, k: u64) -> String {
        format!("bench-{}-{}", self.run, k % self.key_budget)
    }

    /// Counts one failed key under its error code.
    fn failed(&self, code: &'static str) {
        *self.errors_by_code.lock().entry(code).or_default() += 1;
    }

    /// Counts the failures among `results`; returns (ok, failed).
    fn tally<T>(&self, results: &[Result<T, ClientError>]) -> (u64, u64) {
        let mut ok = 0;
        for r in results {
            match r {
                Ok(_) => ok += 1,
                Err(e) => self.failed(e.code().name()),
            }
        }
        (ok, results.len() as u64 - ok)
    }

    /// Puts keys `ks` from the worker's reusable buffers; returns (keys ok, errors).
    async fn write(&self, w: &mut Worker, ks: &[u64]) -> (u64, u64) {
        let names: Vec<String> = ks.iter().map(|k| self.key(*k)).collect();
        if ks.len() == 1 {
            // One owned buffer per worker, reused: the value goes out without a copy and comes back.
            let mut buf = w.owned.take().unwrap_or_else(|| BytesMut::from(&self.base[..]));
            stamp(ks[0] % self.key_budget, &mut buf);
            let value = buf.freeze();
            let deadline = Instant::now() + RETRY_FULL_FOR;
            let r = loop {
                let r = self.client.upsert_bytes(&names[0], value.clone(), &self.replicate).await;
                match &r {
                    Err(e)
                        if self.retry_full
                            && e.code() == crescent_proto::ErrorCode::NoAvailableHandle
                            && Instant::now() < deadline =>
                    {
                        self.retries.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(RETRY_FULL_EVERY).await;
                    }
                    _ => break r,
                }
            };
            w.owned = value.try_into_mut().ok();
            return self.tally(&[r]);
        }
        w.batch.resize_with(ks.len(), || self.base.clone());
        for (b, k) in w.batch.iter_mut().zip(ks) {
            stamp(*k % self.key_budget, b);
        }
        let items: Vec<(&str, &[u8])> =
            names.iter().map(String::as_str).zip(w.batch.iter().map(Vec::as_slice)).collect();
        let r = self.client.batch_upsert_from(&items, &self.replicate).await;
        self.tally(&r)
    }

    /// Puts keys `ks` that a lookup found missing, as the engines' connectors do: a plain put, and a key
    /// another writer stored meanwhile (`OBJECT_ALREADY_EXISTS`) is a hit, not an error. (An upsert here
    /// would preempt a concurrent worker's write of the same missing key and fail it.)
    async fn put_missing(&self, w: &mut Worker, ks: &[u64]) -> (u64, u64) {
        let names: Vec<String> = ks.iter().map(|k| self.key(*k)).collect();
        w.batch.resize_with(ks.len(), || self.base.clone());
        for (b, k) in w.batch.iter_mut().zip(ks) {
            stamp(*k % self.key_budget, b);
        }
        let items: Vec<(&str, &[u8])> =
            names.iter().map(String::as_str).zip(w.batch.iter().map(Vec::as_slice)).collect();
        let r: Vec<Result<(), ClientError>> = self
            .client
            .batch_put_from(&items, &self.replicate)
            .await
            .into_iter()
            .map(|r| match r {
                Err(e) if e.code() == crescent_proto::ErrorCode::ObjectAlreadyExists => Ok(()),
                other => other,
            })
            .collect();
        self.tally(&r)
    }

    /// Gets keys `ks` into the worker's reusable buffers; returns (keys ok, errors).
    async fn read(&self, w: &mut Worker, ks: &[u64]) -> (u64, u64) {
        let names: Vec<String> = ks.iter().map(|k| self.key(*k)).collect();
        w.read.resize_with(ks.len(), || vec![0u8; self.base.len()]);
        let bufs = &mut w.read[..ks.len()];
        let results: Vec<Result<(), ClientError>> = if ks.len() == 1 && self.owned_reads {
            vec![self.client.get(&names[0]).await.map(|v| bufs[0] = v)]
        } else if ks.len() == 1 {
            vec![self.client.get_into(&names[0], &mut bufs[0]).await.map(|_| ())]
        } else {
            let mut items: Vec<(&str, &mut [u8])> =
                names.iter().map(String::as_str).zip(bufs.iter_mut().map(Vec::as_mut_slice)).collect();
            self.client.batch_get_into(&mut items).await.into_iter().map(|r| r.map(|_| ())).collect()
        };
        let mut ok = 0;
        for ((r, buf), k) in results.iter().zip(bufs.iter()).zip(ks) {
            match r {
                Err(e) => self.failed(e.code().name()),
                Ok(()) if self.verify && !check(&self.base, *k % self.key_budget, buf) => {
                    self.failed("VERIFY_MISMATCH")
                }
                Ok(()) => ok += 1,
            }
        }
        (ok, ks.len() as u64 - ok)
    }

    fn meta_key(&self, k: u64) -> WireKey {
        WireKey::from(format!("bench-{}-meta-{k}", self.run).as_str())
    }

    /// PutStart + PutEnd of `n` new keys (batch forms for more than one) with no bytes moved: the master's
    /// share of a put; returns (keys ok, errors).
    async fn master_put(&self, n: usize) -> (u64, u64) {
        let start = self.meta_next.fetch_add(n as u64, Ordering::Relaxed);
        let size = self.size;
        let id = self.client.id();
        let master = self.client.master();
        let ok = if n == 1 {
            let (tenant, key) = (self.tenant.clone(), self.meta_key(start));
            let config = self.replicate.clone();
            let started = master.call(&MasterRequest::PutStart { client: id, tenant, key, size, config }).await;
            let (tenant, key) = (self.tenant.clone(), self.meta_key(start));
            let ended = match started {
                Ok(MasterResponse::Replicas(r)) => {
                    let write = crescent_proto::write_id(&r);
                    master.call(&MasterRequest::PutEnd { client: id, tenant, key, checksum: None, write }).await
                }
                Ok(_) => Err(crescent_proto::ErrorCode::InternalError.into()),
                Err(e) => Err(e),
            };
            self.tally(&[ended]).0
        } else {
            let keys: Vec<WireKey> = (start..start + n as u64).map(|k| self.meta_key(k)).collect();
            let req = MasterRequest::BatchPutStart {
                client: id,
                tenant: self.tenant.clone(),
                items: Batch(keys.iter().map(|k| (k.clone(), size)).collect()),
                config: self.replicate.clone(),
                group_ids: None,
                upsert: false,
            };
            // Per key, the write to end (None: not started).
            let started: Vec<Option<u64>> = match master.call(&req).await {
                Ok(MasterResponse::BatchReplicas(r)) => r
                    .items
                    .iter()
                    .map(|x| self.code_ok(x).then(|| x.as_ref().map_or(0, |d| crescent_proto::write_id(d))))
                    .collect(),
                other => {
                    self.failed(reply_code(other));
                    vec![None; keys.len()]
                }
            };
            let items: Vec<(WireKey, Option<u64>, u64)> =
                keys.into_iter().zip(started).filter_map(|(k, w)| Some((k, None, w?))).collect();
            if items.is_empty() {
                0
            } else {
                let req = MasterRequest::BatchPutEnd { client: id, tenant: self.tenant.clone(), items: Batch(items) };
                match master.call(&req).await {
                    Ok(MasterResponse::BatchDone(r)) => r.iter().filter(|x| self.code_ok(x)).count() as u64,
                    other => {
                        self.failed(reply_code(other));
                        0
                    }
                }
            }
        };
        self.meta_written.fetch_max(start + n as u64, Ordering::Relaxed);
        (ok, n as u64 - ok)
    }

    /// The blocks of prompt `p` (`--batch` of them): the first half shared by the four prompts of its family, the
    /// rest its own, so prompts share prefixes as a chat's turns and a system prompt's users do.
    fn prompt_blocks(&self, p: u64) -> Vec<String> {
        let half = self.batch / 2;
        (0..self.batch)
            .map(|i| {
                if i < half {
                    format!("bench-{}-f{}-b{i}", self.run, p / PROMPTS_PER_FAMILY)
                } else {
                    format!("bench-{}-p{p}-b{i}", self.run)
                }
            })
            .collect()
    }

    /// One request of a prefix phase: a prompt (one of `--keys` prompts, Zipf-drawn with `--zipf`), the longest
    /// cached run of its blocks looked up — with the leased prefix lookup (`prefix`: one request, the run's
    /// replica lists kept for the read) or `batch_is_exist` counted as SGLang's `batch_exists` does
    /// (`prefix-exist`) —, that run read, and the rest written. A block the lookup found and the read missed
    /// counts as `MISS_AFTER_LOOKUP`. Returns (blocks read or written, errors).
    async fn prefix_request(&self, w: &mut Worker, leased: bool) -> (u64, u64) {
        let prompt = match &self.zipf {
            Some(z) => z.sample(&mut w.rng),
            None => w.rng.u64(..self.key_budget.max(1)),
        };
        let names = self.prompt_blocks(prompt);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let run = if leased {
            match self.client.batch_prefix_lease(&refs).await {
                Ok(n) => n,
                Err(e) => {
                    self.failed(e.code().name());
                    return (0, names.len() as u64);
                }
            }
        } else {
            self.client.batch_is_exist(&refs).await.iter().take_while(|r| matches!(r, Ok(true))).count()
        };
        let (mut ok, mut errors) = (0, 0);
        if run > 0 {
            w.read.resize_with(run, || vec![0u8; self.base.len()]);
            let mut items: Vec<(&str, &mut [u8])> =
                refs[..run].iter().copied().zip(w.read.iter_mut().map(Vec::as_mut_slice)).collect();
            for r in self.client.batch_get_into(&mut items).await {
                match r {
                    Ok(_) => ok += 1,
                    Err(e) => {
                        errors += 1;
                        let miss = e.code() == crescent_proto::ErrorCode::ObjectNotFound;
                        self.failed(if miss { "MISS_AFTER_LOOKUP" } else { e.code().name() });
                    }
                }
            }
        }
        if run < names.len() {
            w.batch.resize_with(names.len() - run, || self.base.clone());
            let items: Vec<(&str, &[u8])> =
                refs[run..].iter().copied().zip(w.batch.iter().map(Vec::as_slice)).collect();
            let written = self.client.batch_put_from(&items, &self.replicate).await;
            for r in written {
                match r {
                    Ok(()) => ok += 1,
                    // Another request wrote it meanwhile: as good as written.
                    Err(e) if e.code() == crescent_proto::ErrorCode::ObjectAlreadyExists => ok += 1,
                    Err(e) => {
                        errors += 1;
                        self.failed(e.code().name());
                    }
                }
            }
        }
        (ok, errors)
    }

    /// GetReplicaList of `batch` keys `master-put` made (uniformly at random); returns (keys ok, errors).
    async fn master_get(&self, rng: &mut fastrand::Rng) -> (u64, u64) {
        let n = self.meta_written.load(Ordering::Relaxed).max(1);
        let keys: Vec<WireKey> = (0..self.batch).map(|_| self.meta_key(rng.u64(..n))).collect();
        let tenant = self.tenant.clone();
        let req = match <[WireKey; 1]>::try_from(keys) {
            Ok([key]) => MasterRequest::GetReplicaList { tenant, key },
            Err(keys) => MasterRequest::BatchGetReplicaList { tenant, keys: Batch(keys) },
        };
        let ok = match self.client.master().call(&req).await {
            Ok(MasterResponse::ReplicaList(_)) => 1,
            Ok(MasterResponse::BatchReplicaList(r)) => r.items.iter().filter(|x| self.code_ok(x)).count() as u64,
            other => {
                self.failed(reply_code(other));
                0
            }
        };
        (ok, self.batch as u64 - ok)
    }

    /// Whether a per-key master answer succeeded (counting its code if not).
    fn code_ok<T>(&self, r: &Result<T, crescent_proto::ErrorCode>) -> bool {
        match r {
            Ok(_) => true,
            Err(c) => {
                self.failed(c.name());
                false
            }
        }
    }

    fn fresh_keys(&self) -> Vec<u64> {
        let start = self.next_key.fetch_add(self.batch as u64, Ordering::Relaxed);
        (start..start + self.batch as u64).collect()
    }

    fn existing_keys(&self, rng: &mut fastrand::Rng) -> Vec<u64> {
        if let Some(z) = &self.zipf {
            return (0..self.batch).map(|_| z.sample(rng)).collect();
        }
        let n = if self.fixed_keys { self.key_budget } else { self.written.load(Ordering::Relaxed) };
        let n = n.clamp(1, self.key_budget);
        (0..self.batch).map(|_| rng.u64(..n)).collect()
    }
}

/// Runs one request of `phase`; returns (keys done, bytes moved, errors).
async fn request(s: &Shared, phase: Phase, w: &mut Worker) -> (u64, u64, u64) {
    let size = s.size;
    match phase {
        Phase::Write => {
            let (ok, err) = s.write(w, &s.fresh_keys()).await;
            (ok, ok * size, err)
        }
        Phase::Read => {
            let ks = s.existing_keys(&mut w.rng);
            let (ok, err) = s.read(w, &ks).await;
            (ok, ok * size, err)
        }
        Phase::Mixed => {
            if w.rng.bool() {
                let (ok, err) = s.write(w, &s.fresh_keys()).await;
                (ok, ok * size, err)
            } else {
                let ks = s.existing_keys(&mut w.rng);
                let (ok, err) = s.read(w, &ks).await;
                (ok, ok * size, err)
            }
        }
        Phase::MasterPut => {
            let (ok, err) = s.master_put(s.batch).await;
            (ok, 0, err)
        }
        Phase::MasterGet => {
            let (ok, err) = s.master_get(&mut w.rng).await;
            (ok, 0, err)
        }
        Phase::Prefix | Phase::PrefixExist => {
            let (ok, err) = s.prefix_request(w, phase == Phase::Prefix).await;
            (ok, ok * size, err)
        }
        Phase::Dedup | Phase::Metadata => {
            // Half the batch was written before, half is new: the connector pattern.
            let mut ks = s.existing_keys(&mut w.rng);
            let fresh = s.fresh_keys();
            for (i, k) in ks.iter_mut().enumerate() {
                if i % 2 == 1 {
                    *k = fresh[i];
                }
            }
            let names: Vec<String> = ks.iter().map(|k| s.key(*k)).collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let exist = s.client.batch_is_exist(&refs).await;
            let (_, errors) = s.tally(&exist);
            if phase == Phase::Metadata {
                return (ks.len() as u64 - errors, 0, errors);
            }
            let missing: Vec<u64> =
                ks.iter().zip(&exist).filter(|(_, e)| matches!(e, Ok(false))).map(|(k, _)| *k).collect();
            let (ok, err) = if missing.is_empty() { (0, 0) } else { s.put_missing(w, &missing).await };
            (ks.len() as u64 - errors - err, ok * size, errors + err)
        }
    }
}

/// The code of a master reply that was not the batch answer expected.
fn reply_code(r: Result<MasterResponse, ClientError>) -> &'static str {
    match r {
        Ok(_) => crescent_proto::ErrorCode::InternalError.name(),
        Err(e) => e.code().name(),
    }
}

/// What an error code means for a benchmark key.
fn meaning(code: &str) -> &'static str {
    match code {
        "OBJECT_NOT_FOUND" => "evicted or never written",
        "REPLICA_IS_NOT_READY" | "OBJECT_REPLICA_BUSY" | "OBJECT_HAS_LEASE" => "busy: being written or read",
        "NO_AVAILABLE_HANDLE" | "TENANT_QUOTA_EXCEEDED" => "no space",
        "TRANSFER_FAIL" | "RPC_FAIL" | "RPC_TIMEOUT" => "transfer or network",
        "CHECKSUM_MISMATCH" | "VERIFY_MISMATCH" => "wrong bytes",
        "MISS_AFTER_LOOKUP" => "found by the lookup, gone when read",
        _ => "other",
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A phase's request latencies (µs), corrected for coordinated omission as HdrHistogram's
/// `recordValueWithExpectedInterval` does, with the phase's median as the interval `m`: a request of `v ≥ 2m`
/// also stands for the requests its worker would have sent while it waited, `v − m, v − 2m, …` down to `m`.
/// Those are counted, not stored (a 30 s stall at a 100 µs median is 300 000 of them).
struct Latencies {
    /// Every request's latency, sorted.
    sorted: Vec<u64>,
    /// The expected interval between a worker's requests: the median, at least 1 µs.
    interval: u64,
    /// The requests of at least two intervals, sorted (each stands for `v / m - 1` more).
    stalls: Vec<u64>,
    /// Requests and the ones stalls stand for.
    total: u64,
}

impl Latencies {
    fn new(mut raw: Vec<u64>) -> Self {
        raw.sort_unstable();
        let interval = percentile(&raw, 0.5).max(1);
        let stalls: Vec<u64> = raw.iter().copied().filter(|&v| v >= 2 * interval).collect();
        let total = raw.len() as u64 + stalls.iter().map(|&v| v / interval - 1).sum::<u64>();
        Latencies { sorted: raw, interval, stalls, total }
    }

    /// Samples at most `x`, the ones stalls stand for included.
    fn count_le(&self, x: u64) -> u64 {
        let m = self.interval;
        let real = self.sorted.partition_point(|&v| v <= x) as u64;
        let missed: u64 = self
            .stalls
            .iter()
            .map(|&v| {
                // Stands for v − k·m, k = 1..=K with K = v/m − 1; those ≤ x have k ≥ ⌈(v − x)/m⌉.
                let k_max = v / m - 1;
                let k_min = if v <= x { 1 } else { (v - x).div_ceil(m).max(1) };
                (k_max + 1).saturating_sub(k_min)
            })
            .sum();
        real + missed
    }

    /// The `p` quantile (nearest rank), 0 without samples.
    fn percentile(&self, p: f64) -> u64 {
        let Some(&max) = self.sorted.last() else { return 0 };
        let rank = ((self.total - 1) as f64 * p).round() as u64 + 1;
        // The smallest latency with `rank` samples at or below it.
        let (mut lo, mut hi) = (0, max);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.count_le(mid) >= rank { hi = mid } else { lo = mid + 1 }
        }
        lo
    }

    /// The longest single request.
    fn max(&self) -> u64 {
        self.sorted.last().copied().unwrap_or(0)
    }
}

/// Prompts that share their first half of blocks in the prefix phases.
const PROMPTS_PER_FAMILY: u64 = 4;

/// Keys `master-get` makes per concurrent worker when no `master-put` ran before it (the original's
/// `master_bench` prefills 10 000 keys per thread).
const MASTER_GET_KEYS_PER_WORKER: u64 = 10_000;

async fn run_phase(s: &Arc<Shared>, phase: Phase, a: &BenchArgs) -> PhaseResult {
    let deadline = a.duration;
    let bar = match a.count {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new(deadline.as_millis() as u64),
    };
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{prefix:>8} [{bar:40}] {pos}/{len} {msg}") {
        bar.set_style(style);
    }
    bar.set_prefix(phase.name());
    if phase == Phase::MasterGet && s.meta_written.load(Ordering::Relaxed) == 0 {
        // Nothing to look up yet: make a working set first (untimed), as the original's master_bench does.
        let n = MASTER_GET_KEYS_PER_WORKER * a.concurrency.max(1) as u64;
        while s.meta_written.load(Ordering::Relaxed) < n {
            s.master_put(128).await;
        }
    }
    s.requests.store(0, Ordering::Relaxed);
    s.errors.store(0, Ordering::Relaxed);
    s.retries.store(0, Ordering::Relaxed);
    s.errors_by_code.lock().clear();
    let master_requests = s.client.master_requests();
    let workers: Vec<Worker> = (0..a.concurrency.max(1)).map(|w| Worker::prepared(w as u64 + 1, s, phase)).collect();
    let started = Instant::now();
    let (keys, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for mut worker in workers {
        let (s, keys, bytes, bar) = (s.clone(), keys.clone(), bytes.clone(), bar.clone());
        let count = a.count;
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let n = s.requests.fetch_add(1, Ordering::Relaxed);
                match count {
                    Some(c) if n >= c => break,
                    None if started.elapsed() >= deadline => break,
                    _ => {}
                }
                let t = Instant::now();
                let (k, b, e) = request(&s, phase, &mut worker).await;
                // Every request counts, whatever its outcome: a failure after a 30 s stall is a 30 s request.
                lat.push(t.elapsed().as_micros() as u64);
                keys.fetch_add(k, Ordering::Relaxed);
                bytes.fetch_add(b, Ordering::Relaxed);
                s.errors.fetch_add(e, Ordering::Relaxed);
                if phase == Phase::Write || phase == Phase::Mixed || phase == Phase::Dedup {
                    s.written.fetch_max(s.next_key.load(Ordering::Relaxed), Ordering::Relaxed);
                }
                if count.is_some() {
                    bar.inc(1);
                } else {
                    bar.set_position(started.elapsed().as_millis() as u64);
                }
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        if let Ok(l) = t.await {
            lat.extend(l);
        }
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    let requests = lat.len() as u64;
    let lat = Latencies::new(lat);
    let (keys, bytes) = (keys.load(Ordering::Relaxed), bytes.load(Ordering::Relaxed));
    PhaseResult {
        phase: phase.name().to_owned(),
        value_size: s.size,
        batch: a.batch,
        concurrency: a.concurrency,
        requests,
        keys,
        bytes,
        seconds,
        req_per_s: requests as f64 / seconds,
        keys_per_s: keys as f64 / seconds,
        mib_per_s: bytes as f64 / seconds / (1 << 20) as f64,
        p50_us: lat.percentile(0.50),
        p95_us: lat.percentile(0.95),
        p99_us: lat.percentile(0.99),
        max_us: lat.max(),
        errors: s.errors.load(Ordering::Relaxed),
        retries: s.retries.load(Ordering::Relaxed),
        errors_by_code: std::mem::take(&mut *s.errors_by_code.lock()),
        master_requests_per_request: (s.client.master_requests() - master_requests) as f64 / requests.max(1) as f64,
    }
}

/// `crescent bench`.
pub async fn run(a: BenchArgs, g: &Global, _file: &FileConfig) -> Result<()> {
    let phases: Vec<Phase> = a.phases.split(',').map(Phase::parse).collect::<Result<_>>()?;
    let size = crate::parse_size(&a.value_size).map_err(|e| anyhow!(e))?;
    if size == 0 || a.batch == 0 {
        bail!("--value-size and --batch must be positive");
    }
    if a.batch > MAX_BATCH {
        bail!(
            "{}: --batch {} exceeds the protocol's limit of {MAX_BATCH} keys per request",
            crescent_proto::ErrorCode::InvalidParams,
            a.batch
        );
    }
    let mut cfg = g.client_config();
    cfg.master_connections = a.concurrency.clamp(1, 8);
    cfg.replicate.replica_num = a.replicas;
    // Phases that move no bytes need only the size: no value is allocated for them.
    let mut base =
        if phases.iter().any(|p| p.writes() || p.reads()) { vec![0u8; usize::try_from(size)?] } else { Vec::new() };
    fastrand::Rng::with_seed(7).fill(&mut base);
    let client = Client::new(cfg.clone());
    let info = room(&client, size, a.replicas).await?;
    if a.keys == Some(0) {
        bail!("--keys must be positive");
    }
    if a.retry_full && a.batch > 1 {
        bail!("--retry-full retries single-key writes only: it needs --batch 1");
    }
    let key_budget = a.keys.unwrap_or_else(|| key_budget(&info, size, a.replicas));
    let zipf = match a.zipf {
        Some(exponent) => Some(Zipf::new(key_budget, exponent, ZIPF_SEED)?),
        None => None,
    };
    if key_budget == 0 {
        bail!(
            "the cluster cannot hold one {} value with {} replica(s): {} memory segment(s), {} free in the largest, \
             {} used of {}",
            crate::ops::fmt_bytes(size),
            a.replicas,
            info.memory_segments,
            crate::ops::fmt_bytes(info.largest_free),
            crate::ops::fmt_bytes(info.memory_used),
            crate::ops::fmt_bytes(info.memory_capacity)
        );
    }
    eprintln!(
        "key set: {key_budget} keys of {} ({} of memory at the {:.0}% eviction watermark); writes cycle over them{}",
        crate::ops::fmt_bytes(size),
        crate::ops::fmt_bytes(info.memory_capacity),
        info.eviction_high_watermark * 100.0,
        match a.zipf {
            Some(z) => format!("; reads Zipf({z})"),
            None => String::new(),
        }
    );
    let shared = Arc::new(Shared {
        tenant: cfg.tenant.clone(),
        replicate: cfg.replicate.clone(),
        client,
        size,
        base,
        run: a.run.clone().unwrap_or_else(|| format!("{:08x}", fastrand::u32(..))),
        batch: a.batch,
        verify: a.verify,
        owned_reads: a.owned_reads,
        written: AtomicU64::new(0),
        next_key: AtomicU64::new(0),
        meta_written: AtomicU64::new(0),
        meta_next: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        retries: AtomicU64::new(0),
        retry_full: a.retry_full,
        errors_by_code: Mutex::new(BTreeMap::new()),
        key_budget,
        fixed_keys: a.keys.is_some(),
        zipf,
    });
    let mut json = match &a.json {
        Some(p) => Some(std::fs::File::create(p)?),
        None => None,
    };
    println!(
        "{:<9} {:>10} {:>6} {:>5} {:>10} {:>11} {:>10} {:>9} {:>9} {:>9} {:>10} {:>7}",
        "phase",
        "value",
        "batch",
        "conc",
        "req/s",
        "keys/s",
        "MiB/s",
        "p50(us)",
        "p95(us)",
        "p99(us)",
        "max(us)",
        "errors"
    );
    for phase in phases {
        let r = run_phase(&shared, phase, &a).await;
        println!(
            "{:<9} {:>10} {:>6} {:>5} {:>10.0} {:>11.0} {:>10.1} {:>9} {:>9} {:>9} {:>10} {:>7}",
            r.phase,
            r.value_size,
            r.batch,
            r.concurrency,
            r.req_per_s,
            r.keys_per_s,
            r.mib_per_s,
            r.p50_us,
            r.p95_us,
            r.p99_us,
            r.max_us,
            r.errors
        );
        if r.retries > 0 {
            println!("          {} puts tried again after NO_AVAILABLE_HANDLE (--retry-full)", r.retries);
        }
        if matches!(phase, Phase::Prefix | Phase::PrefixExist) {
            println!("          {:.2} master requests per request", r.master_requests_per_request);
        }
        if !r.errors_by_code.is_empty() {
            let by: Vec<String> =
                r.errors_by_code.iter().map(|(code, n)| format!("{n} {code} ({})", meaning(code))).collect();
            println!("          errors: {}", by.join(", "));
        }
        if let Some(f) = json.as_mut() {
            writeln!(f, "{}", serde_json::to_string(&r)?)?;
        }
    }
    if !a.keep {
        let req = MasterRequest::RemoveByRegex {
            tenant: shared.tenant.clone(),
            pattern: format!("^bench-{}-", shared.run),
            force: true,
        };
        match shared.client.master().call(&req).await {
            Ok(MasterResponse::Count(n)) => eprintln!("removed the benchmark's {n} keys (--keep keeps them)"),
            Ok(_) => {}
            Err(e) => eprintln!("could not remove the benchmark's keys: {e}"),
        }
    }
    Ok(())
}

/// How many values of `size` bytes with `replicas` replicas the cluster holds below its eviction watermark,
/// with a margin for allocator slack and other users' data.
/// Longest a run waits for held memory to come back before sizing its key set (the default hold is 12 s).
const HELD_WAIT: Duration = Duration::from_secs(30);

/// The cluster's capacity and use, once its held memory no longer stands between the run and its key set: space
/// a previous run (or any removal) freed stays out of reuse for a while on a master that seals grants (at most
/// its `write_hold_ms`), and sizing the key set without it would leave nothing, or too little, to write into.
/// Only a hold that takes more than half the room is waited for: on a cluster others keep writing to, some space
/// is always held, and a run must not wait out `HELD_WAIT` for it.
async fn room(client: &Client, size: u64, replicas: u32) -> Result<ClusterInfo> {
    let ask = || async {
        client.cluster_info().await.map_err(|e| anyhow!("{}: asking the master its capacity: {e}", e.code()))
    };
    let mut info = ask().await?;
    let started = Instant::now();
    let mut said = false;
    while info.memory_held > 0 && key_budget(&info, size, replicas) < key_budget_released(&info, size, replicas) / 2 {
        if started.elapsed() > HELD_WAIT {
            break;
        }
        if !said {
            eprintln!(
                "waiting for {} of recently freed memory, held out of reuse while grants for it may be live",
                crate::ops::fmt_bytes(info.memory_held)
            );
            said = true;
        }
        // The master publishes no event for it: its use is polled, a few times a second.
        tokio::time::sleep(Duration::from_millis(250)).await;
        info = ask().await?;
    }
    Ok(info)
}

/// [`key_budget`] once the held memory is back in use.
fn key_budget_released(info: &ClusterInfo, size: u64, replicas: u32) -> u64 {
    let released =
        ClusterInfo { memory_used: info.memory_used.saturating_sub(info.memory_held), memory_held: 0, ..info.clone() };
    key_budget(&released, size, replicas)
}

/// How long `--retry-full` tries a put again, and how often.
const RETRY_FULL_FOR: Duration = Duration::from_secs(60);
const RETRY_FULL_EVERY: Duration = Duration::from_millis(20);

/// The seed of `--zipf`'s rank-to-key shuffle: the same keys are hot in every run, so runs compare.
const ZIPF_SEED: u64 = 0x5eed_21bf;

/// Largest key set `--zipf` tabulates (8 bytes a key for the table, 8 for the shuffle).
const ZIPF_MAX_KEYS: u64 = 1 << 26;

/// Zipf-distributed key numbers over `0..n`: rank `r` drawn with probability proportional to `1/(r+1)^s` by
/// inverse CDF over a precomputed table (binary search), then mapped to a key through a seeded shuffle.
struct Zipf {
    /// Cumulative weights of ranks `0..=r`, normalised so the last is 1.
    cdf: Vec<f64>,
    /// The key of each rank.
    keys: Vec<u64>,
}

impl Zipf {
    fn new(n: u64, s: f64, seed: u64) -> Result<Zipf> {
        if n == 0 || n > ZIPF_MAX_KEYS {
            bail!("--zipf needs a key set of 1 to {ZIPF_MAX_KEYS} keys, not {n}");
        }
        if !s.is_finite() || s < 0.0 {
            bail!("--zipf exponent must be a finite number ≥ 0, not {s}");
        }
        let mut cdf = Vec::with_capacity(n as usize);
        let mut sum = 0.0;
        for r in 0..n {
            sum += 1.0 / ((r + 1) as f64).powf(s);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        let mut keys: Vec<u64> = (0..n).collect();
        fastrand::Rng::with_seed(seed).shuffle(&mut keys);
        Ok(Zipf { cdf, keys })
    }

    /// The rank a uniform `u` in [0, 1) falls on.
    fn rank(&self, u: f64) -> usize {
        self.cdf.partition_point(|&c| c <= u).min(self.cdf.len() - 1)
    }

    fn sample(&self, rng: &mut fastrand::Rng) -> u64 {
        self.keys[self.rank(rng.f64())]
    }
}

fn key_budget(info: &ClusterInfo, size: u64, replicas: u32) -> u64 {
    let usable = info.memory_capacity as f64 * info.eviction_high_watermark * 0.8 - info.memory_used as f64;
    let per_key = size.saturating_mul(u64::from(replicas.max(1))) as f64;
    if size > info.largest_free || usable < per_key { 0 } else { (usable / per_key) as u64 }
}

/// `--duration`: `500ms`, `10s`, `1m`, or a bare number of seconds (as the flag took before it took units).
fn seconds_or_duration(s: &str) -> Result<Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(secs) => Duration::try_from_secs_f64(secs).map_err(|_| format!("invalid duration {s:?}")),
        Err(_) => crescent_cli::parse_duration(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_duration_takes_units_or_bare_seconds() {
        assert_eq!(seconds_or_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(seconds_or_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(seconds_or_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(seconds_or_duration("-1").is_err());
        assert!(seconds_or_duration("soon").is_err());
    }

    #[test]
    fn held_memory_counts_as_room_once_released_only() {
        let info = ClusterInfo {
            multi_tenant: false,
            lease_ttl_ms: 5000,
            memory_segments: 1,
            memory_capacity: 1000 << 20,
            memory_used: 700 << 20,
            memory_held: 690 << 20,
            eviction_high_watermark: 0.9,
            largest_free: 300 << 20,
            memories: Vec::new(),
            disks: Vec::new(),
        };
        // 720 MiB usable below 80 % of the watermark: nothing beside 700 MiB used, 710 MiB once 690 come back.
        assert_eq!(key_budget(&info, 1 << 20, 1), 20);
        assert_eq!(key_budget_released(&info, 1 << 20, 1), 710);
        let settled = ClusterInfo { memory_used: 10 << 20, memory_held: 0, ..info };
        assert_eq!(key_budget(&settled, 1 << 20, 1), key_budget_released(&settled, 1 << 20, 1));
    }

    #[test]
    fn patterns_identify_their_key() {
        let base: Vec<u8> = (0..100u8).collect();
        let mut a = base.clone();
        stamp(42, &mut a);
        assert!(check(&base, 42, &a));
        assert!(!check(&base, 43, &a));
        stamp(43, &mut a);
        assert!(check(&base, 43, &a), "a reused buffer is restamped for another key");
        a[50] ^= 1;
        assert!(!check(&base, 43, &a));
        let mut tiny = base[..3].to_vec();
        stamp(5, &mut tiny);
        assert!(check(&base[..3], 5, &tiny));
    }

    #[test]
    fn zipf_draws_ranks_in_proportion_to_their_weight() {
        let n = 1000u64;
        let z = Zipf::new(n, 0.99, 1).unwrap();
        let mut rng = fastrand::Rng::with_seed(3);
        let draws = 400_000;
        let mut by_rank = vec![0u64; n as usize];
        let rank_of: std::collections::HashMap<u64, usize> = z.keys.iter().enumerate().map(|(r, k)| (*k, r)).collect();
        for _ in 0..draws {
            by_rank[rank_of[&z.sample(&mut rng)]] += 1;
        }
        let h: f64 = (1..=n).map(|r| 1.0 / (r as f64).powf(0.99)).sum();
        for r in [0usize, 1, 2, 9, 99] {
            let expect = draws as f64 / ((r + 1) as f64).powf(0.99) / h;
            let got = by_rank[r] as f64;
            assert!((got - expect).abs() < 0.05 * expect + 30.0, "rank {r}: {got} draws, expected {expect:.0}");
        }
        // The top 10 % of ranks take their share of the mass (about 70 % at s = 0.99 over 1000 keys).
        let top: u64 = by_rank[..100].iter().sum();
        let expect: f64 = (1..=100).map(|r| 1.0 / (r as f64).powf(0.99)).sum::<f64>() / h;
        assert!((top as f64 / draws as f64 - expect).abs() < 0.01, "{top} of {draws}, expected {expect:.3}");
        // Hot ranks are spread over the key set, the same keys in every run.
        assert_ne!(z.keys[..10], (0..10).collect::<Vec<u64>>()[..]);
        assert_eq!(z.keys, Zipf::new(n, 0.99, 1).unwrap().keys);
        let mut sorted = z.keys.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<u64>>(), "a permutation of the key set");
        // Ends of the unit interval map inside the table; s = 0 is uniform.
        assert_eq!(z.rank(0.0), 0);
        assert_eq!(z.rank(1.0), n as usize - 1);
        let u = Zipf::new(4, 0.0, 1).unwrap();
        assert_eq!((u.rank(0.1), u.rank(0.3), u.rank(0.6), u.rank(0.9)), (0, 1, 2, 3));
        assert!(Zipf::new(0, 1.0, 1).is_err());
        assert!(Zipf::new(10, f64::NAN, 1).is_err());
        assert!(Zipf::new(10, -1.0, 1).is_err());
        assert!(Zipf::new(ZIPF_MAX_KEYS + 1, 1.0, 1).is_err());
    }

    #[test]
    fn phases_parse() {
        assert_eq!(Phase::parse("dedup").unwrap(), Phase::Dedup);
        assert!(Phase::parse("nope").is_err());
        assert_eq!(percentile(&[1, 2, 3, 4], 0.5), 3);
        assert_eq!(percentile(&[], 0.99), 0);
    }

    /// The samples `Latencies` counts, written out (what HdrHistogram's expected-interval recording stores).
    fn expanded(raw: &[u64]) -> Vec<u64> {
        let mut sorted = raw.to_vec();
        sorted.sort_unstable();
        let m = percentile(&sorted, 0.5).max(1);
        let mut all = sorted.clone();
        for &v in &sorted {
            let mut missing = v.saturating_sub(m);
            while v >= 2 * m && missing >= m {
                all.push(missing);
                missing -= m;
            }
        }
        all.sort_unstable();
        all
    }

    #[test]
    fn a_stalled_request_counts_as_the_requests_it_held_up() {
        // 1000 requests of 100 µs and one of 1 s: uncorrected, p99 would be 100 µs.
        let mut raw = vec![100u64; 1000];
        raw.push(1_000_000);
        let l = Latencies::new(raw.clone());
        assert_eq!(l.total, 1001 + 9999, "the stall stands for the 9 999 requests it held up");
        assert_eq!(l.max(), 1_000_000);
        // The median request is one the stall held up: 10 999 samples, the 5 501st smallest waited 450.1 ms.
        assert_eq!(l.percentile(0.5), 450_100, "half the phase's requests waited on the stall");
        assert!(l.percentile(0.99) > 900_000, "{}", l.percentile(0.99));
        // Counting matches writing the samples out, at every quantile, for assorted shapes.
        let shapes: Vec<Vec<u64>> = vec![
            raw,
            vec![5, 7, 9, 11, 40, 41, 100, 3, 3, 3],
            (1..500u64).map(|i| (i * 37) % 101 + u64::from(i % 50 == 0) * 5000).collect(),
            vec![0, 0, 0, 10],
            vec![42],
        ];
        for raw in shapes {
            let l = Latencies::new(raw.clone());
            let all = expanded(&raw);
            assert_eq!(l.total, all.len() as u64, "{raw:?}");
            for p in [0.0, 0.1, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0] {
                assert_eq!(l.percentile(p), percentile(&all, p), "p{p} of {raw:?}");
            }
        }
        assert_eq!(Latencies::new(Vec::new()).percentile(0.99), 0);
    }
}
