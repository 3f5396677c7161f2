//! `crescent`: run a master, a storage node or both (`up`), use the store (`put`, `get`, `rm`, `ls`, `stat`),
//! measure it (`bench`), or replay a workload through the master core in-process (`demo`).
//!
//! Every flag can also be set in a TOML file (`--config FILE`); a flag given on the command line wins.
//! `CRESCENT_MASTER` is the default master address. Servers print one JSON line with their endpoints on
//! stdout once ready; logs go to stderr.

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

/// The tokio runtime for a command. Servers use a multi-threaded runtime (one worker per CPU) to serve many
/// connections. Client commands drive their requests from one thread: every request is I/O-bound, and on
/// small machines a second worker only adds cross-CPU wake-ups (tokio wakes an idle worker to look for work
/// whenever a reply arrives), which measured about twice as slow per small request on a 2-vCPU VM.
/// `CRESCENT_THREADS=N` overrides either (1 = a single-threaded runtime).
fn runtime(serves: bool) -> std::io::Result<tokio::runtime::Runtime> {
    let threads = match std::env::var("CRESCENT_THREADS").ok().and_then(|v| v.parse::<usize>().ok()) {
        Some(n) if n > 0 => n,
        _ if serves => 0,
        _ => 1,
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
            eprintln!("INVALID_PARAMS: {e:#}");
            return ExitCode::from(2);
        }
    };
    let global = config::Global::resolve(&cli.master, &cli.tenant, &file);
    if let Command::Demo(a) = cli.command {
        return report(demo::run(a));
    }
    let serves = matches!(cli.command, Command::Up(_) | Command::Master(_) | Command::Node(_));
    let rt = match runtime(serves) {
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
    use super::parse_size;

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
