//! `crescent master`'s snapshot options: `--snapshot-dir DIR` or `--snapshot-s3 s3://bucket/prefix` (endpoint
//! and credentials from flags or the usual AWS environment variables), `--snapshot-interval`,
//! `--snapshot-retain`; the same under `[server]` as `snapshot_dir`, `snapshot_s3`, `snapshot_s3_endpoint`,
//! `snapshot_interval`, `snapshot_retain`. Flags over the file. Without a store, a master with a data directory
//! snapshots into `DIR/snapshots`.

use crate::config::FileConfig;
use anyhow::{Context, Result, anyhow};
use crescent_master::ha::SnapshotOptions;
use crescent_master::snapshot::store::{LocalDirStore, S3Options, S3Store, SnapshotStore};
use std::sync::Arc;

/// Snapshot flags of `crescent master`.
#[derive(clap::Args, Debug, Default)]
pub struct SnapshotArgs {
    /// Keep snapshots in this local directory.
    #[arg(
        long,
        value_name = "DIR",
        help = "Snapshot the master's metadata into DIR (needs an oplog: --data-dir or --etcd); a restart restores the newest usable snapshot plus the log after it, and the log is compacted below the snapshots kept"
    )]
    pub snapshot_dir: Option<std::path::PathBuf>,
    /// Keep snapshots in S3.
    #[arg(
        long,
        value_name = "s3://BUCKET[/PREFIX]",
        help = "Snapshot into an S3 bucket (credentials and region from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, or the flags)"
    )]
    pub snapshot_s3: Option<String>,
    /// S3-compatible endpoint.
    #[arg(
        long,
        value_name = "URL",
        help = "S3-compatible endpoint for --snapshot-s3, e.g. http://127.0.0.1:9000 (default: AWS, or AWS_ENDPOINT)"
    )]
    pub snapshot_s3_endpoint: Option<String>,
    /// S3 region.
    #[arg(long, value_name = "REGION", help = "S3 region for --snapshot-s3 (default: AWS_DEFAULT_REGION)")]
    pub snapshot_s3_region: Option<String>,
    /// Time between snapshots.
    #[arg(long, value_name = "DURATION", value_parser = crescent_cli::parse_duration, help = format!("Time between snapshots, e.g. 30s, 10m (one is written only when the log moved) [default: {}m]", crescent_master::ha::snapshots::DEFAULT_SNAPSHOT_INTERVAL.as_secs() / 60))]
    pub snapshot_interval: Option<std::time::Duration>,
    /// Snapshots kept.
    #[arg(long, value_name = "N", help = format!("Snapshots kept (at least 1) [default: {}]", crescent_master::ha::snapshots::DEFAULT_SNAPSHOT_RETAIN))]
    pub snapshot_retain: Option<usize>,
}

/// Where a master with a data directory `DIR` and no snapshot store configured keeps its snapshots:
/// `DIR/snapshots`.
pub const DEFAULT_SNAPSHOT_SUBDIR: &str = "snapshots";

/// The snapshot options of `a` and `[server]` (`None`: no snapshots). Snapshots need an oplog (`has_oplog`).
/// Without a store configured, a master with an oplog and a data directory snapshots into
/// `DIR/`[`DEFAULT_SNAPSHOT_SUBDIR`] (nothing would compact its log otherwise); one without a data directory
/// (`--etcd` alone) says at start-up that its log will grow until etcd refuses writes.
pub fn snapshot_options(
    a: &SnapshotArgs,
    file: &FileConfig,
    has_oplog: bool,
    data_dir: Option<&std::path::Path>,
) -> Result<Option<SnapshotOptions>> {
    let f = &file.server;
    let from_flags = a.snapshot_dir.is_some() || a.snapshot_s3.is_some();
    let (dir, s3) = if from_flags {
        (a.snapshot_dir.clone(), a.snapshot_s3.clone())
    } else {
        (f.snapshot_dir.clone().map(std::path::PathBuf::from), f.snapshot_s3.clone())
    };
    let store: Arc<dyn SnapshotStore> = match (dir, s3) {
        (Some(_), Some(_)) => {
            anyhow::bail!("--snapshot-dir and --snapshot-s3 are two places for one snapshot set: give one")
        }
        (None, None) => match data_dir.filter(|_| has_oplog) {
            Some(data) => {
                let dir = data.join(DEFAULT_SNAPSHOT_SUBDIR);
                let store =
                    LocalDirStore::new(&dir).with_context(|| format!("snapshot directory {}", dir.display()))?;
                tracing::info!(
                    "snapshots go to {} (the data directory's default: no --snapshot-dir or --snapshot-s3); the \
                     oplog is compacted below the snapshots kept",
                    dir.display()
                );
                Arc::new(store)
            }
            None => {
                if a.snapshot_interval.is_some() || a.snapshot_retain.is_some() {
                    anyhow::bail!(
                        "--snapshot-interval/--snapshot-retain need a snapshot store: --snapshot-dir, --snapshot-s3 \
                         or a --data-dir (snapshots in DIR/snapshots)"
                    );
                }
                if has_oplog {
                    tracing::warn!(
                        "NO SNAPSHOTS: no --snapshot-dir, --snapshot-s3 or --data-dir, so nothing compacts the oplog: \
                         it grows in etcd until etcd refuses every write (NOSPACE) and the cluster stops. Give \
                         --data-dir DIR (snapshots in DIR/snapshots), --snapshot-dir or --snapshot-s3"
                    );
                }
                return Ok(None);
            }
        },
        (Some(dir), None) => {
            Arc::new(LocalDirStore::new(&dir).with_context(|| format!("snapshot directory {}", dir.display()))?)
        }
        (None, Some(url)) => {
            let o = S3Options {
                url: url.clone(),
                endpoint: a.snapshot_s3_endpoint.clone().or_else(|| f.snapshot_s3_endpoint.clone()),
                region: a.snapshot_s3_region.clone().or_else(|| f.snapshot_s3_region.clone()),
                ..S3Options::default()
            };
            Arc::new(S3Store::new(&o).with_context(|| format!("snapshot store {url}"))?)
        }
    };
    if !has_oplog {
        anyhow::bail!("snapshots need an oplog (--data-dir or --etcd): a snapshot is a position in it");
    }
    let mut o = SnapshotOptions::new(store);
    if let Some(i) = a.snapshot_interval {
        o.interval = i;
    } else if let Some(i) = &f.snapshot_interval {
        o.interval = crescent_cli::parse_duration(i).map_err(|e| anyhow!("[server] snapshot_interval: {e}"))?;
    }
    if let Some(n) = a.snapshot_retain.or(f.snapshot_retain) {
        if n == 0 {
            anyhow::bail!("--snapshot-retain must be at least 1");
        }
        o.retain = n;
    }
    Ok(Some(o))
}
