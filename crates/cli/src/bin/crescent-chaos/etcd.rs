//! etcd faults the campaign injects: filling the store with junk until its space quota raises the NOSPACE alarm,
//! and taking it back (junk deleted, history compacted, backend defragmented, alarm disarmed).

use anyhow::Context;
use etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client, CompactionOptions, DeleteOptions};
use std::time::{Duration, Instant};

/// Where the junk goes (nothing of Crescent's lives under it).
const JUNK: &str = "/crescent-chaos-junk/";
/// One junk value (etcd refuses requests over 1.5 MiB).
const CHUNK: usize = 1 << 20;

async fn connect(endpoint: &str) -> anyhow::Result<Client> {
    let opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(10));
    Client::connect([endpoint], Some(opts)).await.with_context(|| format!("connecting to etcd at {endpoint}"))
}

fn is_nospace(e: &etcd_client::Error) -> bool {
    e.to_string().contains("database space exceeded")
}

/// Puts junk until etcd answers "database space exceeded" (bounded by `max_bytes` and `timeout`); returns the
/// bytes written.
pub async fn fill(endpoint: &str, max_bytes: u64, timeout: Duration) -> anyhow::Result<u64> {
    let mut c = connect(endpoint).await?;
    let deadline = Instant::now() + timeout;
    let mut rng = fastrand::Rng::new();
    let mut junk = vec![0u8; CHUNK];
    let mut written = 0u64;
    for i in 0u64.. {
        anyhow::ensure!(Instant::now() < deadline, "no NOSPACE after {written} bytes and {timeout:?}");
        anyhow::ensure!(written < max_bytes, "no NOSPACE after {written} bytes");
        rng.fill(&mut junk);
        match c.put(format!("{JUNK}{i:08}"), junk.clone(), None).await {
            Ok(_) => written += CHUNK as u64,
            Err(e) if is_nospace(&e) => return Ok(written),
            Err(e) => return Err(e).context("putting junk"),
        }
    }
    Ok(written)
}

/// Deletes the junk, compacts the history, defragments the backend and disarms every alarm; retried within
/// `timeout` (etcd may be slow to answer right after the alarm).
pub async fn clear(endpoint: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        match clear_once(endpoint).await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                eprintln!("etcd clear: {e:#}; again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn clear_once(endpoint: &str) -> anyhow::Result<()> {
    let mut c = connect(endpoint).await?;
    let del = c.delete(JUNK, Some(DeleteOptions::new().with_prefix())).await.context("deleting junk")?;
    let rev = del.header().map(|h| h.revision()).context("no revision in the delete's header")?;
    match c.compact(rev, Some(CompactionOptions::new().with_physical())).await {
        Ok(_) => {}
        // Compacted at or past this revision already (a compaction of another pass): nothing to do.
        Err(e) if e.to_string().contains("compacted") => {}
        Err(e) => return Err(e).context("compacting"),
    }
    c.defragment().await.context("defragmenting")?;
    let alarms = c.alarm(AlarmAction::Get, AlarmType::None, None).await.context("listing alarms")?;
    for a in alarms.alarms() {
        let mut opts = AlarmOptions::new();
        opts.with_member(a.member_id());
        c.alarm(AlarmAction::Deactivate, a.alarm(), Some(opts)).await.context("disarming")?;
    }
    let left = c.alarm(AlarmAction::Get, AlarmType::None, None).await.context("listing alarms")?;
    anyhow::ensure!(left.alarms().is_empty(), "alarms still raised: {}", left.alarms().len());
    Ok(())
}
