//! Segment pool snapshots: the catalog plus every allocator's state, in one checksummed payload.
//!
//! Layout: `b"CSPS"` magic, `u16` format version (LE), `u32` crc32c (LE) of the body, then the postcard body.
//! Restore validates everything (magic, version, checksum, decode, every region's shape and allocator payload,
//! duplicate ids, CXL window claims) while building a complete new pool state off to the side, and adopts it in
//! one swap: a corrupt payload changes nothing.

use super::driver::{CxlDriver, RegionAllocState};
use super::{PoolError, PoolState, SegmentPool};
use crate::alloc::AllocatorSnapshot;
use crate::clock::Timestamp;
use crescent_proto::{ClientId, SegmentSpec, SegmentStatus};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

const MAGIC: &[u8; 4] = b"CSPS";
const VERSION: u16 = 1;
const HEADER: usize = 4 + 2 + 4;

#[derive(Serialize, Deserialize)]
struct RegionRecord {
    spec: SegmentSpec,
    client: ClientId,
    status: SegmentStatus,
    graceful_deadline: Option<Timestamp>,
    alloc: RegionAllocState,
}

#[derive(Serialize, Deserialize)]
struct PoolSnapshotBody {
    /// Allocatable regions first, in placement-index order (restore re-adds them in that order), then the rest.
    regions: Vec<RegionRecord>,
    cxl_window: Option<AllocatorSnapshot>,
}

impl SegmentPool {
    /// Serialises the catalog and every allocator's state. Deactivated (unmounting) segments are left out: they
    /// are already gone for every reader.
    pub fn snapshot(&self) -> Vec<u8> {
        let st = self.state.read();
        let mut order: Vec<(u8, usize, crescent_proto::SegmentId)> = Vec::with_capacity(st.catalog.len());
        for (id, r) in st.catalog.iter() {
            if r.status == SegmentStatus::Unmounting {
                continue;
            }
            let index = st.placement.kind(r.spec.kind);
            let pos = index.names().iter().position(|n| **n == *r.spec.name).unwrap_or(usize::MAX);
            order.push((u8::from(!r.status.is_allocatable()), pos, *id));
        }
        order.sort();
        let mut regions = Vec::with_capacity(order.len());
        for (_, _, id) in order {
            let Some(r) = st.catalog.get(&id) else { continue };
            let Some(alloc) = st.drivers.driver(r.spec.kind).ok().and_then(|d| d.snapshot_region(&id)) else {
                continue;
            };
            regions.push(RegionRecord {
                spec: (*r.spec).clone(),
                client: r.client,
                status: r.status,
                graceful_deadline: r.graceful_deadline,
                alloc,
            });
        }
        let body = PoolSnapshotBody { regions, cxl_window: st.drivers.cxl.as_ref().map(CxlDriver::window_snapshot) };
        drop(st);
        // Serialising plain owned data into a Vec cannot fail; fall back to an empty body defensively.
        let body = postcard::to_stdvec(&body).unwrap_or_default();
        let mut out = Vec::with_capacity(HEADER + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Restores a snapshot into this (empty) pool. Restored allocations wait for
    /// [`SegmentPool::rebind_restored`]; [`SegmentPool::finish_restore`] frees those never re-bound.
    pub fn restore(&self, payload: &[u8]) -> Result<usize, PoolError> {
        let body = decode(payload)?;
        let mut next = PoolState::new(&self.config)?;
        match (&body.cxl_window, &mut next.drivers.cxl) {
            (Some(w), Some(d)) => {
                if w.capacity != d.window_capacity() {
                    return Err(PoolError::CorruptSnapshot("cxl window size differs from configuration".into()));
                }
                *d = CxlDriver::restored(w)?;
            }
            (Some(_), None) => return Err(PoolError::CxlDisabled),
            (None, _) => {}
        }
        let mut ids = HashSet::new();
        let n = body.regions.len();
        for rec in body.regions {
            if !ids.insert(rec.spec.id) {
                return Err(PoolError::CorruptSnapshot(format!("segment {} appears twice", rec.spec.id)));
            }
            let deadline_ok = (rec.status == SegmentStatus::GracefullyUnmounting) == rec.graceful_deadline.is_some();
            if !rec.status.is_readable() || !deadline_ok {
                return Err(PoolError::CorruptSnapshot(format!("segment {} has status {:?}", rec.spec.id, rec.status)));
            }
            let prepared = next.drivers.driver_mut(rec.spec.kind)?.prepare_adopt(&rec.spec, &rec.alloc)?;
            next.validate_new(&rec.spec, &[])?;
            next.commit_and_publish(rec.client, rec.spec, rec.status, rec.graceful_deadline, prepared)?;
        }
        if next.drivers.cxl.as_ref().is_some_and(|d| !d.all_claimed()) {
            return Err(PoolError::CorruptSnapshot("cxl window holds allocations no binding claims".into()));
        }
        let mut st = self.state.write();
        if st.catalog.len() != 0 {
            return Err(PoolError::NotEmpty);
        }
        *st = next;
        Ok(n)
    }
}

fn decode(payload: &[u8]) -> Result<PoolSnapshotBody, PoolError> {
    let corrupt = |m: &str| PoolError::CorruptSnapshot(m.to_owned());
    if payload.len() < HEADER || &payload[..4] != MAGIC {
        return Err(corrupt("bad magic or truncated header"));
    }
    let version = u16::from_le_bytes([payload[4], payload[5]]);
    if version != VERSION {
        return Err(PoolError::CorruptSnapshot(format!("unsupported snapshot version {version}")));
    }
    let crc = u32::from_le_bytes([payload[6], payload[7], payload[8], payload[9]]);
    let body = &payload[HEADER..];
    if crc32c::crc32c(body) != crc {
        return Err(corrupt("checksum mismatch"));
    }
    postcard::from_bytes(body).map_err(|e| PoolError::CorruptSnapshot(format!("decode: {e}")))
}
