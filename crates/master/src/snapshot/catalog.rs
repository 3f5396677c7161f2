//! Publishing, retaining and finding master snapshots in a [`SnapshotStore`].
//!
//! Layout (keys relative to the store):
//! - `snapshots/<id>/data.csnp`: the codec's payload ([`super::encode`]);
//! - `snapshots/<id>/manifest.json`: `{format, id, batch_id, last_seq, producer_view, data_key, data_size,
//!   data_crc32c, created_ms}`;
//! - `latest`: the id of the newest published snapshot.
//!
//! The id is `<batch id, 20 digits>-<last seq, 20 digits>`, so ids sort by the oplog position they include.
//! Publishing writes the data, reads it back and checks its size and crc32c, writes the manifest and checks it
//! the same way, and only then points `latest` at it; a failure deletes the candidate. Retention then deletes
//! every snapshot but the newest N (manifest first, so a half-deleted snapshot is never taken for a complete
//! one). Loading tries `latest`, then every older listed snapshot, newest first, and takes the first that is
//! whole (manifest, size, checksum, decode): a corrupt or missing newest snapshot falls back to the previous
//! one, and nothing is restored from a snapshot that fails any check. Snapshots newer than `latest` are
//! unpublished leftovers of a failed publish and are never loaded.

use super::store::{SnapshotStore, StoreError};
use super::{MasterSnapshotView, SnapshotError};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// Key of the pointer to the newest published snapshot.
pub const LATEST_KEY: &str = "latest";
/// Prefix of every snapshot's objects.
pub const SNAPSHOTS_PREFIX: &str = "snapshots/";
/// Manifest format this build writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;

/// Why a catalog call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// What was written did not read back the same (size or checksum): the store is not trustworthy.
    #[error("snapshot {id}: read-back of {key} does not match what was written ({detail})")]
    Verify {
        /// The snapshot id.
        id: String,
        /// The object.
        key: String,
        /// What differed.
        detail: String,
    },
    /// A snapshot needs its object directory and oplog position.
    #[error("a published snapshot needs metadata (the object directory and its oplog position)")]
    NoMetadata,
    /// A snapshot failed its checks (manifest, size, checksum, decode, position).
    #[error("snapshot {id} is unusable: {detail}")]
    Unusable {
        /// The snapshot id.
        id: String,
        /// What was wrong.
        detail: String,
    },
}

/// A snapshot's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// The snapshot id.
    pub id: String,
    /// The last oplog batch included.
    pub batch_id: u64,
    /// The last oplog sequence included.
    pub last_seq: u64,
    /// The producer view in force when it was taken.
    pub producer_view: u64,
    /// Key of the payload.
    pub data_key: String,
    /// Payload bytes.
    pub data_size: u64,
    /// crc32c of the payload.
    pub data_crc32c: u32,
    /// Wall-clock time it was written (ms since the Unix epoch).
    pub created_ms: u64,
}

/// The id of a snapshot including everything up to `batch_id` / `last_seq`.
pub fn snapshot_id(batch_id: u64, last_seq: u64) -> String {
    format!("{batch_id:020}-{last_seq:020}")
}

fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (b, s) = id.split_once('-')?;
    if b.len() != 20 || s.len() != 20 {
        return None;
    }
    Some((b.parse().ok()?, s.parse().ok()?))
}

/// The key of snapshot `id`'s payload.
pub fn data_key(id: &str) -> String {
    format!("{SNAPSHOTS_PREFIX}{id}/data.csnp")
}

fn manifest_key(id: &str) -> String {
    format!("{SNAPSHOTS_PREFIX}{id}/manifest.json")
}

/// What a publish did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The manifest written (or found: the same position was already published).
    pub manifest: Manifest,
    /// False when a snapshot of this position already existed and nothing was written.
    pub written: bool,
    /// Ids deleted by retention.
    pub deleted: Vec<String>,
}

/// A snapshot that loaded whole.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// Its manifest.
    pub manifest: Manifest,
    /// What it holds (with metadata).
    pub view: MasterSnapshotView,
    /// Newer candidates that were refused, with why (a corrupt latest, ...).
    pub skipped: Vec<(String, String)>,
}

/// Why a candidate snapshot was refused.
#[derive(Debug, thiserror::Error)]
enum Unhealthy {
    #[error("manifest missing")]
    NoManifest,
    #[error("manifest unreadable: {0}")]
    BadManifest(String),
    #[error("payload missing")]
    NoData,
    #[error("payload is {got} bytes, manifest says {want}")]
    Size { got: u64, want: u64 },
    #[error("payload checksum mismatch")]
    Checksum,
    #[error(transparent)]
    Decode(#[from] SnapshotError),
    #[error("payload position (batch {batch}, seq {seq}) differs from the manifest's")]
    Position { batch: u64, seq: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The checks every snapshot payload passes before it is used: the manifest's size and crc32c, the codec's own
/// checks (magic, version, checksum, records), metadata present at the manifest's position.
async fn check_payload(m: &Manifest, data: Bytes, room: usize) -> Result<MasterSnapshotView, Unhealthy> {
    if data.len() as u64 != m.data_size {
        return Err(Unhealthy::Size { got: data.len() as u64, want: m.data_size });
    }
    // Checking and decoding gigabytes is CPU work: off the async workers. Phase times go to the log: at tens of
    // millions of objects a restart or a promotion waits for this.
    let want = m.data_crc32c;
    let view = tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        if crc32c::crc32c(&data) != want {
            return Err(Unhealthy::Checksum);
        }
        let checked = started.elapsed();
        let view = super::decode_with_room(&data, room)?;
        tracing::info!(
            bytes = data.len(),
            crc_ms = checked.as_millis() as u64,
            decode_ms = (started.elapsed() - checked).as_millis() as u64,
            "snapshot checked and decoded"
        );
        Ok(view)
    })
    .await
    .map_err(|e| Unhealthy::Store(StoreError::Io(format!("decode task: {e}"))))??;
    let Some(meta) = &view.metadata else {
        return Err(Unhealthy::Decode(SnapshotError::Corrupt("no metadata in an HA snapshot".into())));
    };
    if (meta.batch_id, meta.state.last_seq) != (m.batch_id, m.last_seq) {
        return Err(Unhealthy::Position { batch: meta.batch_id, seq: meta.state.last_seq });
    }
    Ok(view)
}

/// A snapshot payload obtained outside a store (a standby fetched it from the leader), checked as a loaded one
/// is against its manifest: size, crc32c, decode, position. Nothing that fails is used. `log_end` as for
/// [`Catalog::load_newest`]: the objects' table is made with room for what the log after it may add.
pub async fn verify_payload(m: &Manifest, data: Bytes, log_end: u64) -> Result<MasterSnapshotView, CatalogError> {
    check_payload(m, data, room_after(m, log_end))
        .await
        .map_err(|e| CatalogError::Unusable { id: m.id.clone(), detail: e.to_string() })
}

/// How many entries the log holds after `m` up to `log_end` (each may add an object).
fn room_after(m: &Manifest, log_end: u64) -> usize {
    usize::try_from(log_end.saturating_sub(m.last_seq)).unwrap_or(usize::MAX)
}

/// The snapshot catalog over one store.
pub struct Catalog<'a> {
    store: &'a dyn SnapshotStore,
}

impl<'a> Catalog<'a> {
    /// The catalog kept in `store`.
    pub fn new(store: &'a dyn SnapshotStore) -> Self {
        Self { store }
    }

    /// The ids of every snapshot with a manifest, oldest first.
    pub async fn list(&self) -> Result<Vec<String>, CatalogError> {
        let mut ids: Vec<String> = self
            .store
            .list(SNAPSHOTS_PREFIX)
            .await?
            .into_iter()
            .filter_map(|k| {
                let id = k.strip_prefix(SNAPSHOTS_PREFIX)?.strip_suffix("/manifest.json")?;
                parse_id(id).map(|_| id.to_owned())
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// The id `latest` points to, if it names a well-formed id.
    pub async fn latest(&self) -> Result<Option<String>, CatalogError> {
        let Some(raw) = self.store.get(LATEST_KEY).await? else { return Ok(None) };
        let id = String::from_utf8_lossy(&raw).trim().to_owned();
        Ok(parse_id(&id).map(|_| id))
    }

    /// Writes the snapshot `payload` (an [`super::encode`] output of a view with metadata at `batch_id` /
    /// `last_seq`), verifies it, points `latest` at it and keeps the newest `retain` (at least 1).
    pub async fn publish(
        &self,
        payload: Bytes,
        batch_id: u64,
        last_seq: u64,
        producer_view: u64,
        retain: usize,
    ) -> Result<Published, CatalogError> {
        let id = snapshot_id(batch_id, last_seq);
        if let Some(existing) = self.read_manifest(&id).await.ok().flatten()
            && self.data_intact(&existing).await?
        {
            // The same position is already published whole (a restart with nothing new): keep it.
            if self.latest().await?.as_deref() != Some(id.as_str()) {
                self.store.put(LATEST_KEY, Bytes::from(id.clone())).await?;
            }
            let deleted = self.retain(retain).await?;
            return Ok(Published { manifest: existing, written: false, deleted });
        }
        let manifest = Manifest {
            format: MANIFEST_FORMAT,
            id: id.clone(),
            batch_id,
            last_seq,
            producer_view,
            data_key: data_key(&id),
            data_size: payload.len() as u64,
            data_crc32c: crc32c::crc32c(&payload),
            created_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        let written = self.write_verified(&id, &manifest, payload).await;
        if let Err(e) = written {
            tracing::warn!(id = %id, error = %e, store = %self.store.describe(), "snapshot publish failed: candidate deleted");
            self.delete_snapshot(&id).await.ok();
            return Err(e);
        }
        self.store.put(LATEST_KEY, Bytes::from(id.clone())).await?;
        let deleted = self.retain(retain).await?;
        tracing::info!(
            id = %id, batch_id, last_seq, bytes = manifest.data_size, deleted = deleted.len(),
            store = %self.store.describe(), "snapshot published"
        );
        Ok(Published { manifest, written: true, deleted })
    }

    /// The payload a manifest names is there with its size and checksum (a corrupt one is rewritten).
    async fn data_intact(&self, m: &Manifest) -> Result<bool, CatalogError> {
        Ok(self
            .store
            .get(&m.data_key)
            .await?
            .is_some_and(|d| d.len() as u64 == m.data_size && crc32c::crc32c(&d) == m.data_crc32c))
    }

    async fn write_verified(&self, id: &str, manifest: &Manifest, payload: Bytes) -> Result<(), CatalogError> {
        self.put_verified(id, &manifest.data_key, payload).await?;
        // Serialising a plain struct of numbers and strings cannot fail.
        let text = serde_json::to_vec_pretty(manifest).unwrap_or_default();
        self.put_verified(id, &manifest_key(id), Bytes::from(text)).await
    }

    async fn put_verified(&self, id: &str, key: &str, bytes: Bytes) -> Result<(), CatalogError> {
        let (size, crc) = (bytes.len(), crc32c::crc32c(&bytes));
        self.store.put(key, bytes).await?;
        let verify = |detail: String| CatalogError::Verify { id: id.to_owned(), key: key.to_owned(), detail };
        let back = self.store.get(key).await?.ok_or_else(|| verify("missing".into()))?;
        if back.len() != size {
            return Err(verify(format!("{} bytes, wrote {size}", back.len())));
        }
        if crc32c::crc32c(&back) != crc {
            return Err(verify("crc32c differs".into()));
        }
        Ok(())
    }

    /// Deletes every snapshot but the newest `retain` (at least 1) that `latest` does not point past; returns
    /// the ids deleted. Leftovers newer than `latest` (a failed publish) are deleted too.
    pub async fn retain(&self, retain: usize) -> Result<Vec<String>, CatalogError> {
        let ids = self.list().await?;
        let latest = self.latest().await?;
        let (published, leftovers): (Vec<String>, Vec<String>) =
            ids.into_iter().partition(|id| latest.as_ref().is_some_and(|l| id <= l));
        let keep_from = published.len().saturating_sub(retain.max(1));
        let mut deleted = Vec::new();
        for id in published[..keep_from].iter().chain(&leftovers) {
            self.delete_snapshot(id).await?;
            deleted.push(id.clone());
        }
        Ok(deleted)
    }

    /// Deletes one snapshot: the manifest first, so a half-deleted snapshot is never taken for a whole one.
    pub async fn delete_snapshot(&self, id: &str) -> Result<(), CatalogError> {
        self.store.delete(&manifest_key(id)).await?;
        self.store.delete(&data_key(id)).await?;
        Ok(())
    }

    async fn read_manifest(&self, id: &str) -> Result<Option<Manifest>, Unhealthy> {
        let Some(raw) = self.store.get(&manifest_key(id)).await? else { return Ok(None) };
        let m: Manifest = serde_json::from_slice(&raw).map_err(|e| Unhealthy::BadManifest(e.to_string()))?;
        if m.format != MANIFEST_FORMAT || m.id != id || parse_id(id) != Some((m.batch_id, m.last_seq)) {
            return Err(Unhealthy::BadManifest(format!("format {} / id {:?} do not match", m.format, m.id)));
        }
        if m.data_key != data_key(id) {
            return Err(Unhealthy::BadManifest(format!("data key {:?}", m.data_key)));
        }
        Ok(Some(m))
    }

    /// The manifest of snapshot `id` (`None`: there is none), checked against its id.
    pub async fn manifest(&self, id: &str) -> Result<Option<Manifest>, CatalogError> {
        self.read_manifest(id).await.map_err(|e| match e {
            Unhealthy::Store(e) => CatalogError::Store(e),
            e => CatalogError::Unusable { id: id.to_owned(), detail: e.to_string() },
        })
    }

    /// The manifest of the snapshot `latest` points to, if any.
    pub async fn newest_manifest(&self) -> Result<Option<Manifest>, CatalogError> {
        match self.latest().await? {
            Some(id) => self.manifest(&id).await,
            None => Ok(None),
        }
    }

    /// Up to `len` bytes of snapshot `m`'s payload from `offset` (fewer at its end; `None`: the payload is
    /// gone, e.g. deleted by retention since the manifest was read).
    pub async fn read_chunk(&self, m: &Manifest, offset: u64, len: usize) -> Result<Option<Bytes>, CatalogError> {
        let len = len.min(usize::try_from(m.data_size.saturating_sub(offset)).unwrap_or(usize::MAX));
        Ok(self.store.get_range(&m.data_key, offset, len).await?)
    }

    async fn load_one(&self, id: &str, log_end: u64) -> Result<(Manifest, MasterSnapshotView), Unhealthy> {
        let m = self.read_manifest(id).await?.ok_or(Unhealthy::NoManifest)?;
        let started = std::time::Instant::now();
        let data = self.store.get(&m.data_key).await?.ok_or(Unhealthy::NoData)?;
        tracing::info!(id, bytes = data.len(), read_ms = started.elapsed().as_millis() as u64, "snapshot read");
        let view = check_payload(&m, data, room_after(&m, log_end)).await?;
        Ok((m, view))
    }

    /// The newest whole snapshot (see the module doc), or `None` when none is. Store failures while listing
    /// are errors (an unreachable store must not look like an empty one); a candidate that fails its own
    /// checks is skipped. `log_end` is the last sequence of the log the caller replays after it (0: none): its
    /// objects' table is made with room for what those entries may add.
    pub async fn load_newest(&self, log_end: u64) -> Result<Option<Loaded>, CatalogError> {
        let latest = self.latest().await?;
        let ids = self.list().await?;
        let mut candidates: Vec<String> = Vec::new();
        if let Some(l) = &latest {
            candidates.push(l.clone());
        }
        for id in ids.into_iter().rev() {
            // Without a `latest` (lost or never written), every listed snapshot is a candidate, newest first.
            if latest.as_ref().is_none_or(|l| &id < l) {
                candidates.push(id);
            }
        }
        let mut skipped = Vec::new();
        for id in candidates {
            match self.load_one(&id, log_end).await {
                Ok((manifest, view)) => {
                    if !skipped.is_empty() {
                        tracing::warn!(id = %id, ?skipped, "newer snapshots were unusable: restoring an older one");
                    }
                    return Ok(Some(Loaded { manifest, view, skipped }));
                }
                Err(Unhealthy::Store(e)) => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(id = %id, error = %e, store = %self.store.describe(), "snapshot unusable: skipped");
                    skipped.push((id, e.to_string()));
                }
            }
        }
        if !skipped.is_empty() {
            tracing::error!(?skipped, "no usable snapshot");
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::ha::{ObjectRecord, ReplayState, ReplicaRecord};
    use crate::snapshot::{MasterSnapshotView, SnapshotMetadata};

    /// A payload of 100 objects at seq 100, with its manifest.
    fn payload() -> (Manifest, Bytes) {
        let mut state = ReplayState { last_seq: 100, ..ReplayState::default() };
        for i in 0..100u64 {
            let object = ObjectRecord {
                size: 10,
                replicas: vec![ReplicaRecord { id: i, segment: [1; 16], offset: i * 10, length: 10, tier: 0 }],
                checksum: None,
                group: None,
                hard_pinned: false,
                soft_pin_ms: 0,
                data_type: 0,
                no_offload: false,
                writer: None,
            };
            state.objects.insert("default", &format!("k{i:03}"), object);
        }
        let meta = SnapshotMetadata { state, batch_id: 1, producer_view: 1 };
        let data = crate::snapshot::encode(&MasterSnapshotView { metadata: Some(meta), ..Default::default() });
        let manifest = Manifest {
            format: MANIFEST_FORMAT,
            id: snapshot_id(1, 100),
            batch_id: 1,
            last_seq: 100,
            producer_view: 1,
            data_key: String::new(),
            data_size: data.len() as u64,
            data_crc32c: crc32c::crc32c(&data),
            created_ms: 0,
        };
        (manifest, Bytes::from(data))
    }

    /// A payload fetched from the leader is decoded with room for the log the standby replays after it.
    #[tokio::test]
    async fn a_fetched_payload_gets_room_for_the_log_after_it() {
        let (manifest, data) = payload();
        let table = |view: MasterSnapshotView| view.metadata.unwrap().state.objects;
        let plain = table(verify_payload(&manifest, data.clone(), 100).await.unwrap());
        let roomy = table(verify_payload(&manifest, data, 160).await.unwrap());
        assert_eq!((plain.len(), roomy.len()), (100, 100));
        assert!(plain.capacity() < 160, "no log after it: no room ({})", plain.capacity());
        assert!(roomy.capacity() >= 160, "room for 60 entries: {}", roomy.capacity());
    }
}
