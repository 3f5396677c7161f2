//! `crescent-chaos`: the fault campaign's tools (`scripts/chaos.sh` drives them).
//!
//! * `workload`: client tasks on a few hundred keys of self-describing values, writing a history;
//! * `check`: judges the history (and the servers' logs) and prints a summary; exits 1 on any violation;
//! * `etcd-fill` / `etcd-clear`: the NOSPACE fault and its repair;
//! * `free-port`: a free loopback port (for etcd, which cannot pick its own).

mod check;
mod etcd;
mod history;
mod value;
mod workload;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "crescent-chaos", about = "Fault campaign tools: workload with history, history checker, etcd faults")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs the workload and writes its history.
    Workload(workload::WorkloadArgs),
    /// Checks histories and server logs; prints a summary, exits 1 on any violation.
    Check {
        /// History files (JSON lines).
        #[arg(long = "history", required = true)]
        histories: Vec<PathBuf>,
        /// A directory of server logs scanned for panics.
        #[arg(long)]
        logs: Option<PathBuf>,
        /// The campaign's fault log (one fault a line: `SECONDS KIND TARGET`), summarised by kind.
        #[arg(long)]
        faults: Option<PathBuf>,
        /// Writes every violation with its history lines here (the summary shows the first few of each kind).
        #[arg(long)]
        violations: Option<PathBuf>,
    },
    /// Fills etcd with junk until its space quota raises the NOSPACE alarm.
    EtcdFill {
        /// etcd's client URL.
        #[arg(long)]
        endpoint: String,
        /// Gives up after this many bytes.
        #[arg(long, default_value_t = 1 << 30)]
        max_bytes: u64,
    },
    /// Deletes the junk, compacts, defragments and disarms the alarms.
    EtcdClear {
        /// etcd's client URL.
        #[arg(long)]
        endpoint: String,
    },
    /// Prints a free loopback port below the kernel's ephemeral range, so no outgoing connection takes it while
    /// the server that owns it is down (etcd restarts on the ports it had).
    FreePort,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("crescent-chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.cmd {
        Cmd::Workload(args) => {
            let n = workload::run(args)?;
            eprintln!("workload: {n} operations recorded");
        }
        Cmd::Check { histories, logs, faults, violations } => {
            let mut ops = Vec::new();
            for h in &histories {
                ops.extend(history::read(h)?);
            }
            let mut report = check::check(&ops);
            if let Some(dir) = &logs {
                let files = check::scan_logs(dir, &mut report)?;
                println!("server logs scanned for panics: {files}");
            }
            if let Some(f) = &faults {
                println!("{}", fault_summary(&std::fs::read_to_string(f)?));
            }
            print!("{}", report.summary());
            if let Some(path) = &violations {
                let all: Vec<String> = report.violations.iter().map(check::Violation::describe).collect();
                std::fs::write(path, all.join("\n") + "\n")?;
            }
            if !report.violations.is_empty() {
                return Ok(ExitCode::from(1));
            }
        }
        Cmd::EtcdFill { endpoint, max_bytes } => {
            let n = runtime()?.block_on(etcd::fill(&endpoint, max_bytes, Duration::from_secs(120)))?;
            println!("{n}");
        }
        Cmd::EtcdClear { endpoint } => runtime()?.block_on(etcd::clear(&endpoint, Duration::from_secs(60)))?,
        Cmd::FreePort => println!("{}", free_port()?),
    }
    Ok(ExitCode::SUCCESS)
}

/// A free loopback port below the ephemeral range (`ip_local_port_range`), or any free port when that range
/// leaves too little room below it.
fn free_port() -> anyhow::Result<u16> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32768);
    if low > 12_000 {
        let mut rng = fastrand::Rng::new();
        for _ in 0..200 {
            let port = rng.u16(10_000..low);
            if std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

/// `faults: N (kind n, …)` from a fault log of `SECONDS KIND TARGET…` lines.
fn fault_summary(log: &str) -> String {
    let mut by: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for l in log.lines() {
        if let Some(kind) = l.split_whitespace().nth(1) {
            *by.entry(kind).or_default() += 1;
        }
    }
    let total: u64 = by.values().sum();
    let parts: Vec<String> = by.iter().map(|(k, n)| format!("{k} {n}")).collect();
    format!("faults injected: {total} ({})", parts.join(", "))
}
