//! `crescent`: run a master, a storage node or both (`up`), use the store (`put`, `get`, `rm`, `ls`, `stat`),
//! administer it (`tenant`, `ssd`), measure it (`bench`), or replay a workload through the master core
//! in-process (`demo`).
//!
//! Every flag can also be set in a TOML file (`--config FILE`); a flag given on the command line wins.
//! `CRESCENT_MASTER` is the default master address. Every master address (`--master`, `CRESCENT_MASTER`, the
//! file's `master`) is `host:port[,…]` or `etcd://HOST:PORT[,…]/CLUSTER`, which follows an HA cluster's leader
//! (`crescent_client::master`). Servers print one JSON line with their endpoints on stdout once ready; logs go to stderr (info for servers, warn for client commands; `--log-level`,
//! `RUST_LOG`, `--log-format json`).
//!
//! Modules: `serve` (`up`, `master`, `node`), `ops` (`put`, `get`, `rm`, `ls`, `stat`), `admin` (`tenant`,
//! `ssd`), `auth` (the cluster secret, credentials, `credential`, `secret`, the loopback rule), `bench`, `demo`, and, from the library part, `config` (the TOML file).

mod admin;
mod auth;
mod bench;
mod demo;
mod events;
mod ops;
mod reference;
mod serve;
mod snapshots;

/// The master's metadata work is allocation-heavy (entries, routes, oplog records, per-request buffers); under
/// glibc malloc a bulk removal spent over half its CPU in `malloc`/`free` bookkeeping (`perf`, 650 k removals).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};
use crescent_cli::{config, parse_size};
use std::path::PathBuf;
use std::process::ExitCode;

/// `crescent --version`: the package version, the commit it was built from and the build profile (from
/// `build.rs`).
const VERSION: &str =
    concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CRESCENT_COMMIT"), ", ", env!("CRESCENT_PROFILE"), ")");

#[derive(Parser, Debug)]
#[command(name = "crescent", version = VERSION, about = "Crescent: a distributed KV-cache store")]
struct Cli {
    /// TOML config file; flags given on the command line override it.
    #[arg(long, global = true, help_heading = GLOBAL)]
    config: Option<PathBuf>,
    /// Log filter: a level (error, warn, info, debug, trace) or `RUST_LOG`-style directives; wins over
    /// `RUST_LOG`.
    #[arg(long, global = true, value_name = "LEVEL", help = LOG_LEVEL_HELP, help_heading = GLOBAL)]
    log_level: Option<String>,
    /// Log format on stderr (json: one object per line).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, help_heading = GLOBAL)]
    log_format: LogFormat,
    /// Before the subcommand, as earlier versions took it (`crescent --master A put …`); hidden, the
    /// subcommand's own `--master` is the documented form.
    #[arg(long, hide = true)]
    master: Option<String>,
    /// Likewise for `--tenant`.
    #[arg(long, hide = true)]
    tenant: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// The help heading of the flags every subcommand takes, listed after its own.
const GLOBAL: &str = "Global options";

const LOG_LEVEL_HELP: &str = "Log filter: a level (error, warn, info, debug, trace) or RUST_LOG-style directives; \
                              wins over RUST_LOG [default: info for up, master and node; warn for the others]";

/// How log lines are written.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

/// `--master`, for the commands that talk to a master.
#[derive(clap::Args, Debug)]
struct MasterFlag {
    /// Master address (`host:port`, or several separated by commas), or `etcd://HOST:PORT[,…]/CLUSTER` to
    /// follow a cluster's leader.
    #[arg(long, help = format!(
        "Master address (host:port, or several separated by commas, tried in turn; or etcd://HOST:PORT[,HOST:PORT…]/CLUSTER \
         to follow the leader of an HA cluster, also etcd://h1:p;h2:p with the cluster from CRESCENT_CLUSTER_ID; also \
         the CRESCENT_MASTER environment variable) [default: {}]",
        config::DEFAULT_MASTER
    ))]
    master: Option<String>,
}

/// `--master` and `--tenant`, for client commands.
#[derive(clap::Args, Debug)]
struct ClientFlags {
    #[command(flatten)]
    master: MasterFlag,
    /// Tenant (the master must run with --multi-tenant for any but `default`).
    #[arg(long, help = "Tenant (any but `default` needs a master started with --multi-tenant) [default: default]")]
    tenant: Option<String>,
    /// How long a master request (at each master address) or a storage-node exchange may take.
    #[arg(long, value_name = "DURATION", value_parser = crescent_cli::parse_duration, help = "How long a master \
        request (at each address of --master) or an exchange with a storage node may take before it fails or moves \
        on to the next master or replica (e.g. 500ms, 5s) [default: 5s]")]
    request_timeout: Option<std::time::Duration>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Master + one storage node in one process (embedded defaults, no etcd).
    Up(serve::UpArgs),
    /// Run a master.
    Master(serve::MasterArgs),
    /// Run a storage node.
    Node {
        #[command(flatten)]
        args: serve::NodeArgs,
        #[command(flatten)]
        to: MasterFlag,
    },
    /// Store a file (or stdin) under KEY.
    Put {
        #[command(flatten)]
        args: ops::PutArgs,
        #[command(flatten)]
        to: ClientFlags,
    },
    /// Read KEY to stdout or a file.
    Get {
        #[command(flatten)]
        args: ops::GetArgs,
        #[command(flatten)]
        to: ClientFlags,
    },
    /// Remove KEY (or everything, with --all).
    Rm {
        #[command(flatten)]
        args: ops::RmArgs,
        #[command(flatten)]
        to: ClientFlags,
    },
    /// List keys.
    Ls {
        #[command(flatten)]
        args: ops::LsArgs,
        #[command(flatten)]
        to: ClientFlags,
    },
    /// Show an object's size, checksum and replicas; without a key, every node's memory and disk tier.
    Stat {
        #[command(flatten)]
        args: ops::StatArgs,
        #[command(flatten)]
        to: ClientFlags,
    },
    /// Wait until the master answers (and `--nodes N` storage nodes serve memory): for scripts that start a cluster.
    Wait {
        #[command(flatten)]
        args: ops::WaitArgs,
        #[command(flatten)]
        to: ClientFlags,
    },
    /// Measure throughput and latency against a running cluster.
    Bench {
        #[command(flatten)]
        args: bench::BenchArgs,
        #[command(flatten)]
        to: ClientFlags,
    },
    /// Administer a multi-tenant master's tenants: list them, set quotas, remove empty ones.
    #[command(subcommand)]
    Tenant(admin::TenantCommand),
    /// Client-local SSD registrations.
    #[command(subcommand)]
    Ssd(admin::SsdCommand),
    /// Move every object off storage nodes before taking them down (admin), with progress; resumable.
    Drain(admin::DrainArgs),
    /// Follow a master's KV event stream (`crescent master --kv-events`): what is stored and removed, as it happens.
    #[command(subcommand)]
    Events(events::EventsCommand),
    /// Print the credential of a principal (admin, node, node:NAME, tenant:NAME), derived from the cluster secret.
    Credential(auth::CredentialArgs),
    /// Print a new random cluster secret (save it to a file of mode 600 for --secret-file).
    Secret,
    /// Write a self-signed cluster CA and a certificate for every process (for --tls-* and CRESCENT_TLS_*).
    Certs(auth::CertsArgs),
    /// Replay a KV-cache workload through the master core in-process.
    Demo(demo::DemoArgs),
    /// Print a config file with every key at its default (`--defaults`), or the configuration guide's tables.
    Config(reference::ConfigArgs),
    /// Print a shell completion script to stdout (e.g. `crescent completions bash > /etc/bash_completion.d/crescent`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

impl Command {
    /// The `--master` and `--tenant` given to this subcommand, if it takes them.
    fn target(&self) -> (Option<&str>, Option<&str>) {
        fn client(c: &ClientFlags) -> (Option<&str>, Option<&str>) {
            (c.master.master.as_deref(), c.tenant.as_deref())
        }
        match self {
            Command::Node { to, .. } => (to.master.as_deref(), None),
            Command::Put { to, .. }
            | Command::Get { to, .. }
            | Command::Rm { to, .. }
            | Command::Ls { to, .. }
            | Command::Stat { to, .. }
            | Command::Wait { to, .. }
            | Command::Bench { to, .. } => client(to),
            Command::Tenant(t) => (t.master(), None),
            Command::Ssd(s) => (s.master(), None),
            Command::Drain(d) => (d.to.master.as_deref(), None),
            Command::Up(_)
            | Command::Master(_)
            | Command::Events(_)
            | Command::Demo(_)
            | Command::Completions { .. }
            | Command::Config(_)
            | Command::Credential(_)
            | Command::Secret
            | Command::Certs(_) => (None, None),
        }
    }

    /// The `--request-timeout` given to this subcommand, if it takes one.
    fn request_timeout(&self) -> Option<std::time::Duration> {
        match self {
            Command::Put { to, .. }
            | Command::Get { to, .. }
            | Command::Rm { to, .. }
            | Command::Ls { to, .. }
            | Command::Stat { to, .. }
            | Command::Wait { to, .. }
            | Command::Bench { to, .. } => to.request_timeout,
            _ => None,
        }
    }
}

/// The log filter: `--log-level` wins over `RUST_LOG`, which wins over the role's default (servers say what
/// they do at info; client commands keep stderr for their own messages).
fn log_filter(flag: Option<&str>, env: Option<&str>, role: Role) -> Result<tracing_subscriber::EnvFilter, String> {
    let default = if role == Role::Client { "warn" } else { "info" };
    match (flag, env.filter(|e| !e.trim().is_empty())) {
        (Some(f), _) => tracing_subscriber::EnvFilter::try_new(f).map_err(|e| format!("--log-level {f:?}: {e}")),
        (None, Some(e)) => tracing_subscriber::EnvFilter::try_new(e).map_err(|err| format!("RUST_LOG={e:?}: {err}")),
        (None, None) => Ok(tracing_subscriber::EnvFilter::new(default)),
    }
}

/// Installs the stderr logger.
fn init_logs(filter: tracing_subscriber::EnvFilter, format: LogFormat) {
    use std::io::IsTerminal;
    let b = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter);
    match format {
        LogFormat::Text => b.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => b.json().with_ansi(false).init(),
    }
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
/// `min_two`: the process hosts a master whose writes may wait on other tasks of the process — the oplog
/// writer's, or its node's copies to its disk tier (a single-threaded runtime would then wait on itself).
fn runtime(role: Role, file: &config::FileConfig, min_two: bool) -> std::io::Result<tokio::runtime::Runtime> {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let mut threads = match std::env::var("CRESCENT_THREADS").ok().and_then(|v| v.parse::<usize>().ok()) {
        Some(n) if n > 0 => n,
        _ => threads(role, file.node.threads, cpus),
    };
    if min_two && threads == 1 {
        threads = 2;
    }
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
    let cli = Cli::parse();
    let role = match cli.command {
        Command::Master(_) => Role::Master,
        Command::Up(_) | Command::Node { .. } => Role::Node,
        _ => Role::Client,
    };
    match log_filter(cli.log_level.as_deref(), std::env::var("RUST_LOG").ok().as_deref(), role) {
        Ok(filter) => init_logs(filter, cli.log_format),
        Err(e) => {
            eprintln!("INVALID_PARAMS: {e}");
            return ExitCode::from(2);
        }
    }
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
    let (master, tenant) = cli.command.target();
    let master = master.or(cli.master.as_deref()).map(str::to_owned).or_else(|| std::env::var("CRESCENT_MASTER").ok());
    let tenant = tenant.or(cli.tenant.as_deref()).map(str::to_owned);
    let mut global = config::Global::resolve(&master, &tenant, &file);
    if let Some(t) = cli.command.request_timeout() {
        global.request_timeout = Some(t);
    }
    // Commands that dial a cluster take its credential and TLS from the environment.
    let offline = matches!(
        cli.command,
        Command::Demo(_)
            | Command::Completions { .. }
            | Command::Config(_)
            | Command::Credential(_)
            | Command::Secret
            | Command::Certs(_)
    );
    if role == Role::Client && !offline {
        match auth::client_credential().and_then(|c| Ok((c, auth::client_tls()?))) {
            Ok((c, tls)) => (global.credential, global.tls) = (c, tls),
            Err(e) => {
                eprintln!("INVALID_PARAMS: {e:#}");
                return ExitCode::from(2);
            }
        }
    }
    match cli.command {
        Command::Demo(a) => return report(demo::run(a)),
        Command::Credential(a) => return report(auth::credential(&a)),
        Command::Secret => return report(auth::secret()),
        Command::Certs(a) => return report(auth::certs(&a)),
        Command::Config(a) => {
            reference::run(&a, &cli_command());
            return ExitCode::SUCCESS;
        }
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "crescent", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    let waits_up = matches!(&cli.command, Command::Up(a) if a.keeps_oplog(&file) || a.has_disk_tier(&file));
    let rt = match runtime(role, &file, waits_up) {
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
            Command::Node { args, .. } => report(serve::node(args, &global.master, &file).await),
            Command::Put { args, .. } => ops::exit(ops::put(args, &global).await),
            Command::Get { args, .. } => ops::exit(ops::get(args, &global).await),
            Command::Rm { args, .. } => ops::exit(ops::rm(args, &global).await),
            Command::Ls { args, .. } => ops::exit(ops::ls(args, &global).await),
            Command::Stat { args, .. } => ops::exit(ops::stat(args, &global).await),
            Command::Wait { args, .. } => ops::exit(ops::wait(args, &global).await),
            Command::Bench { args, .. } => report(bench::run(args, &global, &file).await),
            Command::Tenant(cmd) => ops::exit(admin::tenant(cmd, &global).await),
            Command::Ssd(cmd) => ops::exit(admin::ssd(cmd, &global).await),
            Command::Drain(args) => ops::exit(admin::drain(args, &global).await),
            Command::Events(cmd) => report(events::run(cmd).await),
            Command::Demo(_)
            | Command::Completions { .. }
            | Command::Config(_)
            | Command::Credential(_)
            | Command::Secret
            | Command::Certs(_) => ExitCode::SUCCESS,
        }
    })
}

/// The command line's definition, built (defaults and value counts filled in) for [`mod@reference`] to read.
fn cli_command() -> clap::Command {
    let mut cmd = Cli::command();
    cmd.build();
    cmd
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
    use super::{Role, log_filter, threads};

    #[test]
    fn the_log_level_flag_wins_over_rust_log_which_wins_over_the_role_default() {
        let f = |flag, env, role| log_filter(flag, env, role).map(|f| f.to_string());
        assert_eq!(f(None, None, Role::Master).unwrap(), "info");
        assert_eq!(f(None, None, Role::Node).unwrap(), "info");
        assert_eq!(f(None, None, Role::Client).unwrap(), "warn");
        assert_eq!(f(None, Some("debug"), Role::Client).unwrap(), "debug");
        assert_eq!(f(None, Some(" "), Role::Client).unwrap(), "warn", "an empty RUST_LOG is no setting");
        assert_eq!(f(Some("error"), Some("debug"), Role::Master).unwrap(), "error");
        assert!(f(Some("crescent=notalevel"), None, Role::Master).unwrap_err().starts_with("--log-level"));
    }

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
}
