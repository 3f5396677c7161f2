//! Sessions: an object looked up once and then read range by range, and an object reserved once, filled by the
//! caller, then made readable (the original's `batch_get_session_*` / `batch_put_session_*`, which inference
//! engines use to move one layer's slice of many objects at a time).
//!
//! A read session holds the replica list and the read lease of its object: its ranges are read from the
//! replicas with no further master request, and only while the lease lasts (after it, `LEASE_EXPIRED`, as the
//! original answers). A range read checks no checksum: the stored crc32c is of the whole object.
//!
//! A write session holds a reservation (PutStart): the object's replicas are placed and the key is taken, but
//! nothing is readable until [`Client::write_session_end`] writes the bytes and ends the write with their
//! checksum. The caller assembles the bytes (the Python layer stages the ranges it is given), so a write
//! session's object is checksummed like any other.

use super::{Client, Unreached, Value, address, all_failed, check_key, lease_expired, per_key};
use crate::error::ClientError;
use crescent_proto::transfer::Grant;
use crescent_proto::wire::{Batch, WireKey};
use crescent_proto::{
    ErrorCode, GetReplicaListResponse, MasterRequest, MasterResponse, ReplicaDescriptor, ReplicateConfig,
};
use futures_util::future::join_all;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An object looked up for range reads: its replicas and the read lease the lookup granted.
#[derive(Debug)]
pub struct ReadSession {
    key: String,
    list: GetReplicaListResponse,
    /// The grants of the batch reply the list came in (its descriptors may name them).
    grants: Vec<Arc<Grant>>,
    started: Instant,
}

impl ReadSession {
    /// The object's size in bytes.
    pub fn size(&self) -> u64 {
        self.list.size
    }

    /// The object's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether the lease the lookup granted has run out (its ranges can no longer be read).
    pub fn expired(&self) -> bool {
        self.started.elapsed() >= Duration::from_millis(self.list.lease_ttl_ms)
    }
}

/// An object reserved for writing: the replicas the master placed for it and the write's id.
#[derive(Debug)]
pub struct WriteSession {
    key: String,
    size: u64,
    replicas: Vec<ReplicaDescriptor>,
    /// The grants of the batch reply the replicas came in (their descriptors may name them).
    grants: Vec<Arc<Grant>>,
    write: u64,
}

impl WriteSession {
    /// The object's size in bytes, as reserved.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The object's key.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl Client {
    /// Looks `key` up for range reads (granting a read lease, held until [`Client::end_read_sessions`] or its
    /// expiry).
    pub async fn read_session(&self, key: &str) -> Result<ReadSession, ClientError> {
        let started = Instant::now();
        let list = self.replica_list(key).await?;
        Ok(ReadSession { key: key.to_owned(), list, grants: Vec::new(), started })
    }

    /// [`Client::read_session`] of each key, in one batched lookup; per key, in input order (an invalid key
    /// fails alone; more than the protocol's `MAX_BATCH` keys fail all, nothing sent).
    pub async fn read_sessions(&self, keys: &[&str]) -> Vec<Result<ReadSession, ClientError>> {
        per_key(keys.iter().copied(), |k| k, |valid| async move { self.read_sessions_valid(&valid).await }).await
    }

    async fn read_sessions_valid(&self, keys: &[&str]) -> Vec<Result<ReadSession, ClientError>> {
        let started = Instant::now();
        let req = MasterRequest::BatchGetReplicaList {
            tenant: self.tenant(),
            keys: Batch(keys.iter().map(|k| WireKey::from(*k)).collect()),
        };
        let pick = |r| if let MasterResponse::BatchReplicaList(v) = r { Some(v) } else { None };
        match self.granted_call(&req, keys.len(), pick).await {
            Ok((lists, grants)) => keys
                .iter()
                .zip(lists)
                .map(|(k, list)| {
                    let list = list.map_err(ClientError::Code)?;
                    Ok(ReadSession { key: (*k).to_owned(), list, grants: grants.clone(), started })
                })
                .collect(),
            Err(code) => all_failed(keys.len(), code),
        }
    }

    /// Reads each `(offset, buf)` range of the session's object into its buffer; returns the bytes read. A range
    /// past the object's end is `INVALID_PARAMS` (nothing is read); a session whose lease ran out, before or
    /// during the reads, is `LEASE_EXPIRED`. A replica that fails gives way to the next.
    pub async fn read_session_ranges(
        &self,
        s: &ReadSession,
        ranges: &mut [(u64, &mut [u8])],
    ) -> Result<u64, ClientError> {
        let mut total = 0u64;
        for (offset, buf) in ranges.iter() {
            let end = offset.checked_add(buf.len() as u64);
            if end.is_none_or(|end| end > s.list.size) {
                return Err(ErrorCode::InvalidParams.into());
            }
            total += buf.len() as u64;
        }
        if s.expired() {
            return Err(lease_expired(&s.key, &s.list));
        }
        if total == 0 {
            return Ok(0);
        }
        let unreached = Unreached::default();
        let mut last = ClientError::Code(ErrorCode::ObjectNotFound);
        let mut done = false;
        for d in self.ranked(&s.list) {
            let Some((endpoint, segment, base, _, place)) = address(d, &s.grants) else { continue };
            if let Some(e) = unreached.skip(endpoint) {
                last = e;
                continue;
            }
            let t = &self.inner.transfer;
            let reads = ranges.iter_mut().filter(|(_, b)| !b.is_empty()).map(|(offset, buf)| {
                let place = place.clone();
                async move { t.read_into(endpoint, place, base + *offset, buf).await }
            });
            match join_all(reads).await.into_iter().find_map(Result::err) {
                None => {
                    done = true;
                    break;
                }
                Some(e) => {
                    last = e.into();
                    unreached.note(endpoint, segment, &last);
                }
            }
        }
        self.report_unreachable(unreached.unreported()).await;
        if !done {
            return Err(last);
        }
        if s.expired() {
            return Err(lease_expired(&s.key, &s.list));
        }
        Ok(total)
    }

    /// Ends the read sessions of `keys`: their leases are released, one per key named (each lookup leased the
    /// object once: a key with two sessions is named twice).
    pub async fn end_read_sessions(&self, keys: &[&str]) {
        self.release_leases(keys).await;
    }

    /// Reserves `key` for an object of `size` bytes placed as `cfg` says: the key is taken (a key holding a
    /// value is `OBJECT_ALREADY_EXISTS`), nothing is readable until [`Client::write_session_end`].
    pub async fn write_session_start(
        &self,
        key: &str,
        size: u64,
        cfg: &ReplicateConfig,
    ) -> Result<WriteSession, ClientError> {
        check_key(key)?;
        let req = MasterRequest::PutStart {
            client: self.inner.id,
            tenant: self.tenant(),
            key: WireKey::from(key),
            size,
            config: self.with_host(cfg),
        };
        match self.inner.master.call(&req).await? {
            MasterResponse::Replicas(replicas) => {
                let write = crescent_proto::write_id(&replicas);
                Ok(WriteSession { key: key.to_owned(), size, replicas, grants: Vec::new(), write })
            }
            _ => Err(ErrorCode::InternalError.into()),
        }
    }

    /// [`Client::write_session_start`] of each `(key, size)`, in one batched reservation; per key, in input
    /// order (an invalid key fails alone; more than the protocol's `MAX_BATCH` keys fail all, nothing sent).
    pub async fn write_sessions_start(
        &self,
        items: &[(&str, u64)],
        cfg: &ReplicateConfig,
    ) -> Vec<Result<WriteSession, ClientError>> {
        per_key(items.iter().copied(), |(k, _)| k, |valid| async move { self.write_sessions_valid(&valid, cfg).await })
            .await
    }

    async fn write_sessions_valid(
        &self,
        items: &[(&str, u64)],
        cfg: &ReplicateConfig,
    ) -> Vec<Result<WriteSession, ClientError>> {
        let req = MasterRequest::BatchPutStart {
            client: self.inner.id,
            tenant: self.tenant(),
            items: Batch(items.iter().map(|&(k, size)| (WireKey::from(k), size)).collect()),
            config: self.with_host(cfg),
            group_ids: None,
            upsert: false,
        };
        let pick = |r| if let MasterResponse::BatchReplicas(v) = r { Some(v) } else { None };
        match self.granted_call(&req, items.len(), pick).await {
            Ok((starts, grants)) => items
                .iter()
                .zip(starts)
                .map(|(&(key, size), start)| {
                    let replicas = start.map_err(ClientError::Code)?;
                    let write = crescent_proto::write_id(&replicas);
                    Ok(WriteSession { key: key.to_owned(), size, replicas, grants: grants.clone(), write })
                })
                .collect(),
            Err(code) => all_failed(items.len(), code),
        }
    }

    /// Writes `value` (exactly the reserved size, else `INVALID_PARAMS`) to every replica of the session and
    /// ends the write with its checksum: the object is readable. On a failure the reservation is kept (nothing
    /// is revoked), so the caller may end it again or revoke it.
    pub async fn write_session_end(&self, s: &WriteSession, value: &[u8]) -> Result<(), ClientError> {
        if value.len() as u64 != s.size {
            return Err(ErrorCode::InvalidParams.into());
        }
        let crc = match self.write_replicas(&Value::Borrowed(value), &s.replicas, &s.grants).await {
            Ok(crc) => crc.map_or_else(|| super::checksum(value), u64::from),
            Err((e, unreachable)) => {
                self.report_unreachable(unreachable).await;
                return Err(e);
            }
        };
        let end = MasterRequest::PutEnd {
            client: self.inner.id,
            tenant: self.tenant(),
            key: WireKey::from(s.key.as_str()),
            checksum: Some(crc),
            write: s.write,
        };
        self.inner.master.call(&end).await.map(|_| ())
    }

    /// [`Client::write_session_end`] of several sessions: every value written to its replicas concurrently, then
    /// one BatchPutEnd for those written. Per session, in order; a failed session keeps its reservation.
    pub async fn write_sessions_end(&self, items: &[(&WriteSession, &[u8])]) -> Vec<Result<(), ClientError>> {
        let written = join_all(items.iter().map(|&(s, value)| async move {
            if value.len() as u64 != s.size {
                return Err(ClientError::from(ErrorCode::InvalidParams));
            }
            match self.write_replicas(&Value::Borrowed(value), &s.replicas, &s.grants).await {
                Ok(crc) => Ok(crc.map_or_else(|| super::checksum(value), u64::from)),
                Err((e, unreachable)) => {
                    self.report_unreachable(unreachable).await;
                    Err(e)
                }
            }
        }))
        .await;
        // The sessions written, with their checksums; the others answer their write's failure.
        let mut to_end: Vec<(usize, u64)> = Vec::new();
        let mut out: Vec<Result<(), ClientError>> = Vec::with_capacity(items.len());
        for (i, w) in written.into_iter().enumerate() {
            match w {
                Ok(crc) => {
                    to_end.push((i, crc));
                    out.push(Ok(()));
                }
                Err(e) => out.push(Err(e)),
            }
        }
        if to_end.is_empty() {
            return out;
        }
        let ends = Batch(
            to_end
                .iter()
                .map(|&(i, crc)| (WireKey::from(items[i].0.key.as_str()), Some(crc), items[i].0.write))
                .collect(),
        );
        let req = MasterRequest::BatchPutEnd { client: self.inner.id, tenant: self.tenant(), items: ends };
        let pick = |r| if let MasterResponse::BatchDone(v) = r { Some(v) } else { None };
        let ends = self.batch_call(&req, to_end.len(), pick).await.unwrap_or_else(|code| vec![Err(code); to_end.len()]);
        for (&(i, _), r) in to_end.iter().zip(ends) {
            out[i] = r.map_err(ClientError::from);
        }
        out
    }

    /// Gives the session's reservation up: the key is free again and nothing was stored.
    pub async fn write_session_revoke(&self, s: &WriteSession) -> Result<(), ClientError> {
        let req = MasterRequest::PutRevoke {
            client: self.inner.id,
            tenant: self.tenant(),
            key: WireKey::from(s.key.as_str()),
            write: s.write,
        };
        self.inner.master.call(&req).await.map(|_| ())
    }
}
