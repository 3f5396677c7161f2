//! Client commands: `put`, `get`, `rm`, `ls`, `stat`. Exit 0 on success; on failure a non-zero exit and the
//! error code's name on stderr (e.g. `OBJECT_NOT_FOUND`).

use crate::config::Global;
use crescent_client::{Client, ClientError};
use crescent_proto::{ErrorCode, ReplicaLocation};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// `put` flags.
#[derive(clap::Args, Debug)]
pub struct PutArgs {
    /// The key.
    key: String,
    /// File to store (`-` or absent: stdin).
    file: Option<PathBuf>,
    /// Replicas.
    #[arg(long)]
    replicas: Option<u32>,
}

/// `get` flags.
#[derive(clap::Args, Debug)]
pub struct GetArgs {
    /// The key.
    key: String,
    /// Output file (default stdout).
    #[arg(short, long)]
    output: Option<PathBuf>,
}

/// `rm` flags.
#[derive(clap::Args, Debug)]
pub struct RmArgs {
    /// The key (omit with `--all`).
    #[arg(required_unless_present = "all")]
    key: Option<String>,
    /// Remove every object of the tenant (leased ones only with `--force`).
    #[arg(long, conflicts_with = "key")]
    all: bool,
    /// Remove even while a reader holds a lease.
    #[arg(long)]
    force: bool,
}

/// `ls` flags.
#[derive(clap::Args, Debug)]
pub struct LsArgs {
    /// Only keys starting with this.
    #[arg(long, default_value = "")]
    prefix: String,
    /// At most this many keys.
    #[arg(long, default_value_t = 10_000)]
    limit: u32,
}

/// `stat` flags.
#[derive(clap::Args, Debug)]
pub struct StatArgs {
    /// The key.
    key: String,
}

/// A command failure: the wire code and a message.
#[derive(Debug)]
pub struct Failure(ErrorCode, String);

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Failure(e.code(), e.to_string())
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure(ErrorCode::FileReadFail, e.to_string())
    }
}

/// Exit status for a command result (prints the error code name on failure).
pub fn exit(r: Result<(), Failure>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, msg)) if msg == code.name() => {
            eprintln!("{msg}");
            ExitCode::from(1)
        }
        Err(Failure(code, msg)) => {
            eprintln!("{}: {msg}", code.name());
            ExitCode::from(1)
        }
    }
}

/// `crescent put`.
pub async fn put(a: PutArgs, g: &Global) -> Result<(), Failure> {
    let data = match a.file.as_deref() {
        None => read_stdin()?,
        Some(p) if p.as_os_str() == "-" => read_stdin()?,
        Some(p) => std::fs::read(p).map_err(|e| Failure(ErrorCode::FileReadFail, format!("{}: {e}", p.display())))?,
    };
    let mut cfg = g.client_config();
    if let Some(r) = a.replicas {
        cfg.replicate.replica_num = r;
    }
    let replicate = cfg.replicate.clone();
    let client = Client::new(cfg);
    client.put_from(&a.key, &data, &replicate).await?;
    Ok(())
}

fn read_stdin() -> Result<Vec<u8>, Failure> {
    let mut v = Vec::new();
    std::io::stdin().read_to_end(&mut v)?;
    Ok(v)
}

/// `crescent get`.
pub async fn get(a: GetArgs, g: &Global) -> Result<(), Failure> {
    let client = Client::new(g.client_config());
    let data = client.get(&a.key).await?;
    match a.output {
        Some(p) => std::fs::write(&p, &data).map_err(|e| Failure(ErrorCode::FileWriteFail, e.to_string()))?,
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(&data)
                .and_then(|()| out.flush())
                .map_err(|e| Failure(ErrorCode::FileWriteFail, e.to_string()))?;
        }
    }
    Ok(())
}

/// `crescent rm`.
pub async fn rm(a: RmArgs, g: &Global) -> Result<(), Failure> {
    let client = Client::new(g.client_config());
    match a.key {
        Some(key) => client.remove(&key, a.force).await?,
        None => println!("{}", client.remove_all(a.force).await?),
    }
    Ok(())
}

/// `crescent ls`.
pub async fn ls(a: LsArgs, g: &Global) -> Result<(), Failure> {
    for k in Client::new(g.client_config()).list_keys(&a.prefix, a.limit).await? {
        println!("{k}");
    }
    Ok(())
}

/// `crescent stat`: JSON with size, checksum and where each replica lives.
pub async fn stat(a: StatArgs, g: &Global) -> Result<(), Failure> {
    let s = Client::new(g.client_config()).stat(&a.key).await?;
    let replicas: Vec<serde_json::Value> = s
        .replicas
        .iter()
        .map(|d| match &d.location {
            ReplicaLocation::Memory { segment_id, offset, length, endpoint }
            | ReplicaLocation::Nof { segment_id, offset, length, endpoint } => serde_json::json!({
                "id": d.id, "segment": segment_id.to_string(), "offset": offset, "length": length,
                "endpoint": endpoint.as_ref(), "status": format!("{:?}", d.status),
            }),
            ReplicaLocation::LocalDisk { client_id, length, endpoint } => serde_json::json!({
                "id": d.id, "client": client_id.to_string(), "length": length, "endpoint": endpoint.as_ref(),
                "status": format!("{:?}", d.status),
            }),
        })
        .collect();
    println!(
        "{}",
        serde_json::json!({ "key": a.key, "size": s.size, "checksum": s.checksum, "lease_ttl_ms": s.lease_ttl_ms, "replicas": replicas })
    );
    Ok(())
}
