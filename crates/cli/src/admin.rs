//! Administration commands: `tenant ls|set-quota|rm` (a multi-tenant master's tenants and quotas), `ssd ls`
//! (client-local SSD registrations) and `drain` (move everything off storage nodes before they stop). Failures print as `CODE: message`, like every client command.

use crate::MasterFlag;
use crate::config::Global;
use crate::ops::Failure;
use crescent_client::Client;
use crescent_proto::human::fmt_bytes;
use crescent_proto::{DrainInfo, ErrorCode, JobStatus, LocalSsdInfo, TenantInfo};

/// `crescent tenant …`.
#[derive(clap::Subcommand, Debug)]
pub enum TenantCommand {
    /// List tenants: quota requested and effective, bytes charged, objects, state.
    Ls {
        /// Print JSON (`{"tenants": [...]}`, sizes in bytes).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        to: MasterFlag,
    },
    /// Set a tenant's quota, registering it (writes to it are admitted from then on).
    SetQuota {
        /// The tenant.
        tenant: String,
        /// The quota (e.g. 512MiB, 10GiB).
        #[arg(value_parser = crate::parse_size)]
        size: u64,
        #[command(flatten)]
        to: MasterFlag,
    },
    /// Remove an empty tenant (its quota policy and registration).
    Rm {
        /// The tenant.
        tenant: String,
        #[command(flatten)]
        to: MasterFlag,
    },
}

impl TenantCommand {
    /// The `--master` given.
    pub fn master(&self) -> Option<&str> {
        match self {
            TenantCommand::Ls { to, .. } | TenantCommand::SetQuota { to, .. } | TenantCommand::Rm { to, .. } => {
                to.master.as_deref()
            }
        }
    }
}

/// `crescent ssd …`.
#[derive(clap::Subcommand, Debug)]
pub enum SsdCommand {
    /// List client-local SSD registrations: offloading, capacity reported, bytes used.
    Ls {
        /// Print JSON (`{"local_ssd": [...]}`, sizes in bytes).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        to: MasterFlag,
    },
}

impl SsdCommand {
    /// The `--master` given.
    pub fn master(&self) -> Option<&str> {
        match self {
            SsdCommand::Ls { to, .. } => to.master.as_deref(),
        }
    }
}

/// `crescent drain`.
#[derive(clap::Args, Debug)]
pub struct DrainArgs {
    /// The storage nodes to drain, by segment name (a node's name: its advertised `host:port` unless it was
    /// given `--name`; `crescent stat` lists them).
    #[arg(required_unless_present = "cancel")]
    pub nodes: Vec<String>,
    /// Move replicas only to these nodes (repeatable); by default wherever placement puts them.
    #[arg(long = "to", value_name = "NODE")]
    pub targets: Vec<String>,
    /// Moves under way at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: u32,
    /// Start the drain and return (the master carries it on); by default it is followed to its end.
    #[arg(long)]
    pub no_wait: bool,
    /// Stop the drain job JOB (printed when it started): no new moves, and its nodes take new objects again.
    #[arg(long, value_name = "JOB", conflicts_with = "nodes")]
    pub cancel: Option<crescent_proto::TaskId>,
    #[command(flatten)]
    pub to: MasterFlag,
}

/// One line of a drain's progress.
fn drain_line(d: &DrainInfo) -> String {
    let done = d.succeeded + d.failed;
    format!(
        "{}: moved {} of {} replicas ({}), {} failed, {} waiting for room, {} under way",
        d.status.name(),
        d.succeeded,
        done + d.remaining,
        fmt_bytes(d.migrated_bytes),
        d.failed,
        d.blocked,
        d.active
    )
}

/// `crescent drain NODE…`: marks the nodes' segments unallocatable and has the master move every replica on
/// them elsewhere, printing progress until nothing is left. A job is in the master's log (a new leader takes it
/// over); a master that lost it (one restarted without a log) is asked again: what was moved is no longer there,
/// so the new job moves only the rest.
pub async fn drain(args: DrainArgs, g: &Global) -> Result<(), Failure> {
    let c = client(g);
    if let Some(job) = args.cancel {
        let d = c.cancel_drain(job).await?;
        println!(
            "drain {job} of {}: cancelled; the nodes take new objects again ({})",
            d.segments.join(", "),
            drain_line(&d)
        );
        return Ok(());
    }
    let start = || c.create_drain(&args.nodes, &args.targets, args.concurrency);
    let mut job = start().await?;
    eprintln!(
        "draining {} (job {job}): it goes on if this command stops; `crescent drain --cancel {job}` stops it",
        args.nodes.join(", ")
    );
    if args.no_wait {
        println!("{job}");
        return Ok(());
    }
    let mut last = String::new();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    // While the master restarts or a standby takes over, the job goes on there (it is in the log): wait for it.
    let mut answered = std::time::Instant::now();
    let mut unreachable = false;
    loop {
        tick.tick().await;
        let d = match c.query_drain(job).await {
            Err(e) if e.code() == ErrorCode::JobNotFound => {
                eprintln!("the master no longer knows job {job} (restarted without a log?): draining the rest again");
                job = start().await?;
                continue;
            }
            Err(e) if master_away(e.code()) && answered.elapsed() < MASTER_PATIENCE => {
                if !unreachable {
                    eprintln!("{e}: waiting up to {}s for the master to answer again", MASTER_PATIENCE.as_secs());
                    unreachable = true;
                }
                continue;
            }
            r => r?,
        };
        (answered, unreachable) = (std::time::Instant::now(), false);
        let line = drain_line(&d);
        // Nothing to say before the master has listed what the nodes hold.
        let line = if d.message.is_empty() { line } else { format!("{line} ({})", d.message) };
        if line != last && !matches!(d.status, JobStatus::Created | JobStatus::Planning) {
            eprintln!("{line}");
            last = line;
        }
        match d.status {
            JobStatus::Succeeded => {
                println!(
                    "{} drained: {} replicas moved ({}); they take no new objects — the node may stop now",
                    args.nodes.join(", "),
                    d.succeeded,
                    fmt_bytes(d.migrated_bytes)
                );
                return Ok(());
            }
            s if s.is_final() => return Err(Failure(ErrorCode::UnavailableInCurrentStatus, d.message)),
            _ => {}
        }
    }
}

/// How long `crescent drain` waits for a master that stopped answering (a restart, a failover) before it gives up.
const MASTER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// Whether `code` says the master is away for now (down, restarting, not the leader yet) rather than refusing.
fn master_away(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::RpcFail
            | ErrorCode::RpcTimeout
            | ErrorCode::UnavailableInCurrentStatus
            | ErrorCode::UnavailableInCurrentMode
    )
}

fn client(g: &Global) -> Client {
    Client::new(g.client_config())
}

/// `tenant` as the master lists it (`""` is `default`), looked up in a fresh listing.
async fn find(c: &Client, tenant: &str) -> Option<TenantInfo> {
    let id = crescent_proto::TenantId::new(tenant).ok()?;
    c.list_tenants().await.ok()?.into_iter().find(|t| t.tenant == id.as_str())
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `crescent tenant …`.
pub async fn tenant(cmd: TenantCommand, g: &Global) -> Result<(), Failure> {
    let c = client(g);
    match cmd {
        TenantCommand::Ls { json, .. } => {
            let tenants = c.list_tenants().await?;
            if json {
                // Through a struct, so each tenant's fields keep their declared order.
                #[derive(serde::Serialize)]
                struct Listing<'a> {
                    tenants: &'a [TenantInfo],
                }
                let out = serde_json::to_string(&Listing { tenants: &tenants })
                    .map_err(|e| Failure(ErrorCode::InternalError, e.to_string()))?;
                println!("{out}");
            } else if tenants.is_empty() {
                eprintln!("no tenants (`crescent tenant set-quota TENANT SIZE` registers one)");
            } else {
                print!("{}", tenant_table(&tenants));
            }
            Ok(())
        }
        TenantCommand::SetQuota { tenant, size, .. } => {
            c.set_tenant_quota(&tenant, size).await?;
            match find(&c, &tenant).await.map(|t| t.effective_quota) {
                Some(e) if e != size => println!(
                    "tenant {tenant:?}: quota {} requested, {} effective (quotas are scaled to the mounted memory)",
                    fmt_bytes(size),
                    fmt_bytes(e)
                ),
                _ => println!("tenant {tenant:?}: quota {}", fmt_bytes(size)),
            }
            Ok(())
        }
        TenantCommand::Rm { tenant, .. } => match c.remove_tenant(&tenant).await {
            Err(e) if e.code() == ErrorCode::TenantNotEmpty => {
                let msg = match find(&c, &tenant).await.filter(|t| t.objects > 0) {
                    Some(t) => format!(
                        "tenant {tenant:?} still holds {} object{} ({}); `crescent rm --all --tenant {tenant}` empties it",
                        t.objects,
                        plural(t.objects),
                        fmt_bytes(t.charged)
                    ),
                    None => format!("tenant {tenant:?} has writes in progress; remove it once they have finished"),
                };
                Err(Failure(ErrorCode::TenantNotEmpty, msg))
            }
            r => Ok(r?),
        },
    }
}

/// What a tenant's row says of it: whether it takes writes, and why not.
fn state(t: &TenantInfo) -> &'static str {
    if !t.has_policy {
        "orphan (no quota: read and remove only)"
    } else if t.over_quota {
        "over quota"
    } else if t.admission_closed {
        "closed"
    } else {
        "open"
    }
}

/// The `tenant ls` table: one row per tenant, sizes with units, columns aligned.
fn tenant_table(tenants: &[TenantInfo]) -> String {
    let quota = |t: &TenantInfo, b: u64| if t.has_policy { fmt_bytes(b) } else { "-".to_owned() };
    let rows: Vec<[String; 6]> = tenants
        .iter()
        .map(|t| {
            [
                t.tenant.clone(),
                quota(t, t.requested_quota),
                quota(t, t.effective_quota),
                fmt_bytes(t.charged),
                t.objects.to_string(),
                state(t).to_owned(),
            ]
        })
        .collect();
    table(["TENANT", "QUOTA", "EFFECTIVE", "CHARGED", "OBJECTS", "STATE"], &rows)
}

/// Left-aligned columns two spaces apart; the last column is not padded.
fn table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// `crescent ssd …`.
pub async fn ssd(cmd: SsdCommand, g: &Global) -> Result<(), Failure> {
    let SsdCommand::Ls { json, .. } = cmd;
    let all = client(g).local_ssd_status(None).await?;
    if json {
        let list: Vec<serde_json::Value> = all.iter().map(ssd_json).collect();
        println!("{}", serde_json::json!({ "local_ssd": list }));
    } else if all.is_empty() {
        eprintln!("no client has registered a local SSD");
    } else {
        let rows: Vec<[String; 4]> = all
            .iter()
            .map(|s| {
                [
                    s.client.to_string(),
                    if s.enable_offloading { "on" } else { "off" }.to_owned(),
                    fmt_bytes(s.total_capacity),
                    fmt_bytes(s.used),
                ]
            })
            .collect();
        print!("{}", table(["CLIENT", "OFFLOADING", "CAPACITY", "USED"], &rows));
    }
    Ok(())
}

/// A registration as JSON (the client id as a string).
pub(crate) fn ssd_json(s: &LocalSsdInfo) -> serde_json::Value {
    serde_json::json!({
        "client": s.client.to_string(),
        "enable_offloading": s.enable_offloading,
        "total_capacity": s.total_capacity,
        "used": s.used,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(tenant: &str, has_policy: bool, over_quota: bool) -> TenantInfo {
        TenantInfo {
            tenant: tenant.into(),
            requested_quota: if has_policy { 10 << 30 } else { 0 },
            effective_quota: if has_policy { 64 << 20 } else { 0 },
            charged: 4096,
            objects: 1,
            admission_closed: !has_policy,
            over_quota,
            has_policy,
        }
    }

    #[test]
    fn the_tenant_table_aligns_columns_and_says_each_state() {
        let t = tenant_table(&[info("alpha", true, false), info("b", false, false), info("c", true, true)]);
        assert_eq!(
            t,
            "TENANT  QUOTA     EFFECTIVE  CHARGED  OBJECTS  STATE\n\
             alpha   10.0 GiB  64.0 MiB   4.0 KiB  1        open\n\
             b       -         -          4.0 KiB  1        orphan (no quota: read and remove only)\n\
             c       10.0 GiB  64.0 MiB   4.0 KiB  1        over quota\n"
        );
    }
}
