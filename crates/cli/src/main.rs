//! `crescent`: run a master, a storage node or both (`up`), use the store (`put`, `get`, `rm`, `ls`, `stat`),
//! measure it (`bench`), or replay a workload through the master core in-process (`demo`).
//!
//! Every flag can also be set in a TOML file (`--config FILE`); a flag given on the command line wins.
//! `CRESCENT_MASTER` is the default master address. Servers print one JSON line with their endpoints on
//! stdout once ready; logs go to stderr.
//!
//! Modules: `serve` (`up`, `master`, `node`), `ops` (`put`, `get`, `rm`, `ls`, `stat`), `bench`, `demo`,
//! `config` (the TOML file).

mod bench;
mod config;
mod demo;
mod ops;
mod serve;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "crescent", version, about = "Crescent: a distributed KV-cache store")]
struct Cli {
    /// TOML config file; flags given on the command line override it.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Master address (`host:port`).
    #[arg(long, global = true, env = "CRESCENT_MASTER")]
    master: Option<String>,
    /// Tenant for client commands.
    #[arg(long, global = true)]
    tenant: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Master + one storage node in one process (embedded defaults, no etcd).
    Up(serve::UpArgs),
    /// Run a master.
    Master(serve::MasterArgs),
    /// Run a storage node.
    Node(serve::NodeArgs),
    /// Store a file (or stdin) under KEY.
    Put(ops::PutArgs),
    /// Read KEY to stdout or a file.
    Get(ops::GetArgs),
    /// Remove KEY.
    Rm(ops::RmArgs),
    /// List keys.
    Ls(ops::LsArgs),
    /// Show an object's size, checksum and replicas.
    Stat(ops::StatArgs),
    /// Measure throughput and latency against a running cluster.
    Bench(bench::BenchArgs),
    /// Replay a KV-cache workload through the master core in-process.
    Demo(demo::DemoArgs),
}

/// Parses `123`, `4KiB`, `16MiB`, `1GiB`, `2TiB` (also KB/MB/GB/TB, 1024-based, case-insensitive).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("invalid size unit in {s:?}")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} overflows"))
}

/// What a process runs, which decides its runtime's threads and whether it polls while idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Client commands: one thread.
    Client,
    /// `crescent master`: one worker per CPU.
    Master,
    /// `crescent node` and `up` (which hosts a node): half the CPUs (at least one), or `[node] threads`.
    Node,
}

/// The runtime's worker threads for `role` on a host with `cpus` CPUs (`configured`: `[node] threads`);
/// 1 means a single-threaded runtime, 0 tokio's default (one per CPU).
///
/// Client commands drive their requests from one thread: every request is I/O-bound, and on small machines
/// a second worker only adds cross-CPU wake-ups (tokio wakes an idle worker to look for work whenever a reply
/// arrives), which measured about twice as slow per small request on a 2-vCPU VM. A storage node leaves half
/// the CPUs to the processes it serves (inference engines and their clients share its host): its work is
/// copying between sockets and segment memory, and more workers than that only compete with its clients.
/// On the 2-vCPU VM a one-thread node served 4 MiB reads 3889 vs 2937 MiB/s (c=1), 1 MiB reads at c=8 4923 vs
/// 3550 and batches of 32 × 1 MiB 4047 vs 2107, small requests even (`crescent bench`, medians of alternating
/// cluster restarts); `up` likewise (4 MiB reads 5091 vs 4236 MiB/s). The master keeps one worker per CPU
/// (measured no better with one).
fn threads(role: Role, configured: Option<usize>, cpus: usize) -> usize {
    match role {
        Role::Client => 1,
        Role::Master => 0,
        Role::Node => configured.filter(|&n| n > 0).unwrap_or((cpus / 2).max(1)),
    }
}

/// The tokio runtime for a process of `role`; `CRESCENT_THREADS=N` overrides the choice of [`threads`]. A
/// node's runtime polls all of its connections for `[node] poll_us` (default 50 µs) before it sleeps
/// (`crescent_net::poll::idle_park_hook`).
fn runtime(role: Role, file: &config::FileConfig) -> std::io::Result<tokio::runtime::Runtime> {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let threads = match std::env::var("CRESCENT_THREADS").ok().and_then(|v| v.parse::<usize>().ok()) {
        Some(n) if n > 0 => n,
        _ => threads(role, file.node.threads, cpus),
    };
    let mut b = match threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        0 => tokio::runtime::Builder::new_multi_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    if role == Role::Node {
        let poll_window =
            file.node.poll_us.map_or(crescent_net::poll::DEFAULT_POLL_WINDOW, std::time::Duration::from_micros);
        if !poll_window.is_zero() {
            b.on_thread_park(crescent_net::poll::idle_park_hook(poll_window));
        }
    }
    b.enable_all().build()
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    let cli = Cli::parse();
    let file = match config::FileConfig::load(cli.config.as_deref()) {
        Ok(f) => f,
        Err(e) => {
            // A file that is not there is not a bad parameter inside one.
            let missing = e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
            });
            let code = if missing { "FILE_NOT_FOUND" } else { "INVALID_PARAMS" };
            eprintln!("{code}: {e:#}");
            return ExitCode::from(2);
        }
    };
    let global = config::Global::resolve(&cli.master, &cli.tenant, &file);
    if let Command::Demo(a) = cli.command {
        return report(demo::run(a));
    }
    let role = match cli.command {
        Command::Master(_) => Role::Master,
        Command::Up(_) | Command::Node(_) => Role::Node,
        _ => Role::Client,
    };
    let rt = match runtime(role, &file) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("INTERNAL_ERROR: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    rt.block_on(async move {
        match cli.command {
            Command::Up(a) => report(serve::up(a, &file).await),
            Command::Master(a) => report(serve::master(a, &file).await),
            Command::Node(a) => report(serve::node(a, &global, &file).await),
            Command::Put(a) => ops::exit(ops::put(a, &global).await),
            Command::Get(a) => ops::exit(ops::get(a, &global).await),
            Command::Rm(a) => ops::exit(ops::rm(a, &global).await),
            Command::Ls(a) => ops::exit(ops::ls(a, &global).await),
            Command::Stat(a) => ops::exit(ops::stat(a, &global).await),
            Command::Bench(a) => report(bench::run(a, &global, &file).await),
            Command::Demo(_) => ExitCode::SUCCESS,
        }
    })
}

fn report(r: Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Role, parse_size, threads};

    #[test]
    fn nodes_take_half_the_cpus_unless_configured() {
        assert_eq!(threads(Role::Node, None, 2), 1);
        assert_eq!(threads(Role::Node, None, 1), 1);
        assert_eq!(threads(Role::Node, None, 16), 8);
        assert_eq!(threads(Role::Node, Some(3), 16), 3);
        assert_eq!(threads(Role::Node, Some(0), 16), 8, "0 means the default");
        assert_eq!(threads(Role::Client, Some(3), 16), 1, "[node] threads is the node's alone");
        assert_eq!(threads(Role::Master, None, 16), 0);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("576KiB"), Ok(576 << 10));
        assert_eq!(parse_size("4gib"), Ok(4 << 30));
        assert_eq!(parse_size("10"), Ok(10));
        assert!(parse_size("1XB").is_err());
        assert!(parse_size("99999999999TiB").is_err());
        assert!(parse_size("").is_err());
    }
}
