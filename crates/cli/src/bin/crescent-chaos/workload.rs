//! The workload: client tasks doing puts, upserts, gets, removes and rm-alls on a few hundred keys of
//! self-describing values, each operation recorded in the history with its times and outcome; then, once the
//! campaign says every fault is healed, a final sweep reading every key.

use crate::history::{Kind, Op, Outcome};
use crate::value;
use crescent_client::{Client, ClientConfig, ClientError, PutMode, PutOutcome};
use crescent_net::auth::{CredentialSource, Keyring};
use crescent_proto::{ErrorCode, ReplicateConfig};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The workload's settings.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkloadArgs {
    /// The master address (`etcd://HOST:PORT/CLUSTER` to follow the leader).
    #[arg(long)]
    pub master: String,
    /// The history file written (JSON lines).
    #[arg(long)]
    pub history: PathBuf,
    /// How long the load runs, in seconds.
    #[arg(long)]
    pub seconds: u64,
    /// Keys written (`k000`…).
    #[arg(long, default_value_t = 300)]
    pub keys: usize,
    /// Concurrent client tasks.
    #[arg(long, default_value_t = 8)]
    pub clients: u32,
    /// Seed of the operation mix.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Smallest payload, bytes.
    #[arg(long, default_value_t = 1024)]
    pub min_size: usize,
    /// Largest payload, bytes.
    #[arg(long, default_value_t = 256 * 1024)]
    pub max_size: usize,
    /// Mean seconds between two rm-alls.
    #[arg(long, default_value_t = 15.0)]
    pub rm_all_every: f64,
    /// After the load: wait (bounded by --heal-timeout) until this file exists before the final sweep (the
    /// campaign creates it once every fault is healed).
    #[arg(long)]
    pub healed: Option<PathBuf>,
    /// Seconds to wait for --healed and then for the cluster to answer.
    #[arg(long, default_value_t = 180)]
    pub heal_timeout: u64,
}

/// The shared clock and the history's writer.
struct Recorder {
    start: Instant,
    tx: std::sync::mpsc::Sender<Op>,
}

impl Recorder {
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Completes `op` now with what `result` says and records it.
    fn done<T>(&self, mut op: Op, result: &Result<T, ClientError>) {
        op.t1 = self.now();
        if let Err(e) = result {
            let code = e.code();
            op.code = Some(code.name().to_owned());
            op.outcome = match code {
                ErrorCode::ObjectNotFound if matches!(op.kind, Kind::Get | Kind::Remove) => Outcome::Missing,
                // The request may have reached a master that died or stalled: it may have been applied.
                ErrorCode::RpcFail | ErrorCode::RpcTimeout if op.kind != Kind::Get => Outcome::Unknown,
                _ => Outcome::Failed,
            };
            if op.outcome == Outcome::Missing {
                op.code = None;
            }
        }
        // The writer thread outlives every task; a send fails only once it is gone (then nothing is recorded).
        let _ = self.tx.send(op);
    }
}

/// What one task shares with the others.
struct Shared {
    rec: Recorder,
    args: WorkloadArgs,
    wids: AtomicU64,
    ops: AtomicU64,
    deadline: Instant,
    /// The cluster's read lease (ms), as it said at the start.
    lease_ms: Option<u64>,
}

fn key_name(i: usize) -> String {
    format!("k{i:04}")
}

/// Runs the workload; returns the number of operations recorded.
pub fn run(args: WorkloadArgs) -> anyhow::Result<u64> {
    let file = std::fs::File::create(&args.history)?;
    let (tx, rx) = std::sync::mpsc::channel::<Op>();
    let writer = std::thread::spawn(move || -> std::io::Result<u64> {
        let mut out = std::io::BufWriter::new(file);
        let mut n = 0;
        for op in rx {
            serde_json::to_writer(&mut out, &op)?;
            out.write_all(b"\n")?;
            n += 1;
        }
        out.flush()?;
        Ok(n)
    });
    // Times in the history count from here; this line maps them to the servers' log timestamps.
    let epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    eprintln!("workload: history time 0 = unix {:.3} s", epoch.as_secs_f64());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let lease_ms = rt.block_on(lease_ms(&args.master));
    let shared = Arc::new(Shared {
        rec: Recorder { start: Instant::now(), tx },
        deadline: Instant::now() + Duration::from_secs(args.seconds),
        args,
        wids: AtomicU64::new(1),
        ops: AtomicU64::new(0),
        lease_ms,
    });
    rt.block_on(async {
        // A few clients (each its own master connections), the tasks spread over them.
        let clients: Vec<Client> = (0..4).map(|_| Client::new(client_config(&shared.args.master))).collect();
        let tasks: Vec<_> = (0..shared.args.clients)
            .map(|i| {
                let (client, shared) = (clients[i as usize % clients.len()].clone(), shared.clone());
                tokio::spawn(async move { load(i, client, shared).await })
            })
            .collect();
        let progress = {
            let shared = shared.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    eprintln!(
                        "workload: {} operations, {:.0} s",
                        shared.ops.load(Ordering::Relaxed),
                        shared.rec.start.elapsed().as_secs_f64()
                    );
                }
            })
        };
        for t in tasks {
            t.await?;
        }
        progress.abort();
        sweep(&clients[0], &shared).await;
        anyhow::Ok(())
    })?;
    let total = shared.ops.load(Ordering::Relaxed);
    drop(shared);
    drop(rt);
    let written = writer.join().map_err(|_| anyhow::anyhow!("history writer panicked"))??;
    anyhow::ensure!(written == total, "recorded {written} of {total} operations");
    Ok(total)
}

/// A client of `master`; with a cluster secret in the environment (`CRESCENT_SECRET_FILE`, the campaign's
/// `CHAOS_AUTH=1`) it proves the admin credential, as the CLI does, so the data plane runs on sealed grants.
fn client_config(master: &str) -> ClientConfig {
    let ring = match Keyring::from_env() {
        Ok(ring) => ring,
        Err(e) => {
            eprintln!("workload: the cluster secret in the environment is unusable ({e}); running unauthenticated");
            None
        }
    };
    ClientConfig::new(master)
        .with_credential(ring.map(|r| CredentialSource::Derived(Arc::new(r), crescent_proto::Principal::Admin)))
}

/// The read lease the cluster grants (asked for 30 s at most; `None` if it never answered).
async fn lease_ms(master: &str) -> Option<u64> {
    let client = Client::new(client_config(master));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.cluster_info().await {
            Ok(info) => return Some(info.lease_ttl_ms),
            Err(e) if Instant::now() > deadline => {
                eprintln!("workload: no cluster info ({e}): rm-alls that leave leased objects fence no key");
                return None;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// One client task: random operations until the deadline.
async fn load(id: u32, client: Client, s: Arc<Shared>) {
    let a = &s.args;
    let mut rng = fastrand::Rng::with_seed(a.seed.wrapping_mul(1_000_003).wrapping_add(u64::from(id)));
    let hot = a.keys.min(16);
    let mut next_rm_all = next_after(&mut rng, a.rm_all_every, Instant::now());
    while Instant::now() < s.deadline {
        // Task 0 also removes everything now and then.
        if id == 0 && Instant::now() >= next_rm_all {
            next_rm_all = next_after(&mut rng, a.rm_all_every, Instant::now());
            let mut op = Op::new(id, Kind::RmAll, None, s.rec.now());
            op.force = rng.bool();
            let r = client.remove_all_report(op.force).await;
            if let Ok(rep) = &r {
                op.left = Some(rep.skipped_leased + rep.skipped_writing + rep.skipped_pinned);
                op.leased = Some(rep.skipped_leased + rep.skipped_pinned);
                op.lease_ms = s.lease_ms;
            }
            s.rec.done(op, &r);
            s.ops.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let k = if rng.u8(0..100) < 30 { rng.usize(0..hot) } else { rng.usize(0..a.keys) };
        let key = key_name(k);
        match rng.u8(0..100) {
            0..40 => {
                get(&client, &s, id, &key, false).await;
            }
            40..55 => write(&client, &s, &mut rng, id, &key, PutMode::IfAbsent).await,
            55..82 => write(&client, &s, &mut rng, id, &key, PutMode::Upsert).await,
            _ => {
                let mut op = Op::new(id, Kind::Remove, Some(&key), s.rec.now());
                op.force = rng.bool();
                let r = client.remove(&key, op.force).await;
                s.rec.done(op, &r);
            }
        }
        s.ops.fetch_add(1, Ordering::Relaxed);
    }
}

fn next_after(rng: &mut fastrand::Rng, mean_s: f64, now: Instant) -> Instant {
    now + Duration::from_secs_f64(mean_s * (0.5 + rng.f64()))
}

/// Reads of one key the final sweep makes at most while the cluster settles.
const SWEEP_TRIES: usize = 25;

/// Reads `key` and records it; returns the outcome and the error code of a failure.
async fn get(client: &Client, s: &Shared, id: u32, key: &str, sweep: bool) -> (Outcome, Option<ErrorCode>) {
    let mut op = Op::new(id, Kind::Get, Some(key), s.rec.now());
    op.sweep = sweep;
    let r = client.get(key).await;
    if let Ok(bytes) = &r {
        match value::decode(key, bytes) {
            Ok(wid) => op.got = Some(wid),
            Err(why) => op.torn = Some(why.to_string()),
        }
    }
    let outcome = match &r {
        Ok(_) => (Outcome::Ok, None),
        Err(e) if e.code() == ErrorCode::ObjectNotFound => (Outcome::Missing, None),
        Err(e) => (Outcome::Failed, Some(e.code())),
    };
    s.rec.done(op, &r);
    outcome
}

async fn write(client: &Client, s: &Shared, rng: &mut fastrand::Rng, id: u32, key: &str, mode: PutMode) {
    let a = &s.args;
    let wid = s.wids.fetch_add(1, Ordering::Relaxed);
    // Payload sizes spread evenly on a log scale between the bounds.
    let (lo, hi) = (a.min_size.max(1) as f64, a.max_size.max(a.min_size).max(1) as f64);
    let len = (lo * (hi / lo).powf(rng.f64())) as usize;
    let v = value::encode(key, wid, len);
    let kind = if mode == PutMode::Upsert { Kind::Upsert } else { Kind::Put };
    let mut op = Op::new(id, kind, Some(key), s.rec.now());
    op.wid = Some(wid);
    let r = client.put_with(key, &v, &ReplicateConfig::default(), mode).await;
    if let Ok(PutOutcome::Existed) = r {
        op.outcome = Outcome::Existed;
    }
    s.rec.done(op, &r);
}

/// After the load: once the campaign says the faults are healed, reads every key (retrying a key whose read
/// failed, within the heal timeout), each read recorded as part of the sweep.
async fn sweep(client: &Client, s: &Shared) {
    let a = &s.args;
    let deadline = Instant::now() + Duration::from_secs(a.heal_timeout);
    if let Some(healed) = &a.healed {
        while !healed.exists() {
            if Instant::now() > deadline {
                eprintln!("workload: {} never appeared; sweeping anyway", healed.display());
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut swept = 0;
    for k in 0..a.keys {
        let key = key_name(k);
        // A read refused while the cluster settles (no leader yet, a node not yet remounted) is tried again, a
        // few times; any other answer is the key's answer.
        for _ in 0..SWEEP_TRIES {
            let (outcome, code) = get(client, s, u32::MAX, &key, true).await;
            s.ops.fetch_add(1, Ordering::Relaxed);
            let settling = matches!(
                code,
                Some(
                    ErrorCode::UnavailableInCurrentStatus
                        | ErrorCode::RpcFail
                        | ErrorCode::RpcTimeout
                        | ErrorCode::ReplicaIsNotReady
                )
            );
            if outcome != Outcome::Failed || !settling || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        swept += 1;
    }
    eprintln!("workload: final sweep read {swept} keys");
}
