//! The master snapshot codec: the one place that knows how master state is encoded.
//!
//! It consumes the owners' read views ([`SegmentPoolSnapshotView`] from the segment pool, the LocalSSD
//! registrations from [`crate::local_ssd::LocalSsdManager::snapshot`]; the object directory joins with the HA
//! snapshots) and decodes them back for the owners' restore transactions. No owner knows this encoding, and the
//! wire records below are the codec's own, so an owner's types can change without changing the format silently.
//! NoF regions are left out: they re-register on their heartbeat.
//!
//! Layout: `b"CSNP"` magic, `u16` format version (LE), `u32` crc32c (LE) of the body, then the postcard body.
//! Decoding checks the envelope and the records' own shape (duplicate LocalSSD clients); the pool's restore
//! validates the regions against each other and the configuration.

use crate::alloc::{AllocatorSnapshot, SnapshotAllocation};
use crate::clock::Timestamp;
use crate::local_ssd::LocalSsdRecord;
use crate::segment_pool::{RegionAllocState, RegionReadView, SegmentPoolSnapshotView};
use crescent_proto::{ClientId, ErrorCode, SegmentKind, SegmentSpec, SegmentStatus};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

const MAGIC: &[u8; 4] = b"CSNP";
/// The format version this build writes and reads.
pub const VERSION: u16 = 1;
/// Bytes before the body: magic, version, checksum.
pub const HEADER_LEN: usize = 4 + 2 + 4;

/// What a master snapshot holds, as the owners' read views.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MasterSnapshotView {
    /// Mounted Memory/CXL regions and their allocator states.
    pub pool: SegmentPoolSnapshotView,
    /// LocalSSD registrations, by client (usage is runtime state, rebuilt from metadata on restore).
    pub local_ssd: Vec<(ClientId, LocalSsdRecord)>,
}

/// Why a payload is not a snapshot this build can restore.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Shorter than the header, or not a snapshot at all.
    #[error("not a master snapshot (bad magic or truncated header)")]
    BadHeader,
    /// Written by a format this build does not read.
    #[error("unsupported master snapshot version {0} (this build reads {VERSION})")]
    UnsupportedVersion(u16),
    /// The body does not match its checksum.
    #[error("master snapshot checksum mismatch")]
    Checksum,
    /// The body does not decode, or its records contradict each other.
    #[error("corrupt master snapshot: {0}")]
    Corrupt(String),
}

impl SnapshotError {
    /// The wire code for this error.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::DeserializeFail
    }
}

#[derive(Serialize, Deserialize)]
struct WireAllocation {
    offset: u64,
    consumed: u64,
    requested: u64,
}

#[derive(Serialize, Deserialize)]
struct WireAllocator {
    capacity: u64,
    allocations: Vec<WireAllocation>,
}

#[derive(Serialize, Deserialize)]
enum WireRegionAlloc {
    Own(WireAllocator),
    CxlBinding(Vec<u64>),
}

#[derive(Serialize, Deserialize)]
struct WireRegion {
    spec: SegmentSpec,
    client: ClientId,
    status: SegmentStatus,
    graceful_deadline: Option<u64>,
    alloc: WireRegionAlloc,
}

#[derive(Serialize, Deserialize)]
struct WireLocalSsd {
    client: ClientId,
    enable_offloading: bool,
    total_capacity: u64,
}

#[derive(Serialize, Deserialize)]
struct WireSnapshot {
    regions: Vec<WireRegion>,
    cxl_window: Option<WireAllocator>,
    local_ssd: Vec<WireLocalSsd>,
}

impl From<&AllocatorSnapshot> for WireAllocator {
    fn from(a: &AllocatorSnapshot) -> Self {
        let allocations = a
            .allocations
            .iter()
            .map(|x| WireAllocation { offset: x.offset, consumed: x.consumed, requested: x.requested })
            .collect();
        WireAllocator { capacity: a.capacity, allocations }
    }
}

impl From<WireAllocator> for AllocatorSnapshot {
    fn from(a: WireAllocator) -> Self {
        let allocations = a
            .allocations
            .into_iter()
            .map(|x| SnapshotAllocation { offset: x.offset, consumed: x.consumed, requested: x.requested })
            .collect();
        AllocatorSnapshot { capacity: a.capacity, allocations }
    }
}

/// Encodes the views into one checksummed payload.
pub fn encode(view: &MasterSnapshotView) -> Vec<u8> {
    let regions = view
        .pool
        .regions
        .iter()
        // NoF targets re-register on their heartbeat; their allocations are not the master's to persist.
        .filter(|r| r.spec.kind != SegmentKind::Nof)
        .map(|r| WireRegion {
            spec: r.spec.clone(),
            client: r.client,
            status: r.status,
            graceful_deadline: r.graceful_deadline.map(|t| t.0),
            alloc: match &r.alloc {
                RegionAllocState::Own(a) => WireRegionAlloc::Own(a.into()),
                RegionAllocState::CxlBinding(offsets) => WireRegionAlloc::CxlBinding(offsets.clone()),
            },
        })
        .collect();
    let local_ssd = view
        .local_ssd
        .iter()
        .map(|(c, r)| WireLocalSsd {
            client: *c,
            enable_offloading: r.enable_offloading,
            total_capacity: r.total_capacity,
        })
        .collect();
    let wire = WireSnapshot { regions, cxl_window: view.pool.cxl_window.as_ref().map(Into::into), local_ssd };
    // Serialising plain owned data into a Vec cannot fail; an empty body would fail its restore loudly.
    let body = postcard::to_stdvec(&wire).unwrap_or_default();
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Decodes a payload written by [`encode`]; nothing is restored here.
pub fn decode(payload: &[u8]) -> Result<MasterSnapshotView, SnapshotError> {
    if payload.len() < HEADER_LEN || &payload[..4] != MAGIC {
        return Err(SnapshotError::BadHeader);
    }
    let version = u16::from_le_bytes([payload[4], payload[5]]);
    if version != VERSION {
        return Err(SnapshotError::UnsupportedVersion(version));
    }
    let crc = u32::from_le_bytes([payload[6], payload[7], payload[8], payload[9]]);
    let body = &payload[HEADER_LEN..];
    if crc32c::crc32c(body) != crc {
        return Err(SnapshotError::Checksum);
    }
    let wire: WireSnapshot = postcard::from_bytes(body).map_err(|e| SnapshotError::Corrupt(format!("decode: {e}")))?;
    let mut clients = HashSet::with_capacity(wire.local_ssd.len());
    let mut local_ssd = Vec::with_capacity(wire.local_ssd.len());
    for r in wire.local_ssd {
        if !clients.insert(r.client) {
            return Err(SnapshotError::Corrupt(format!("local SSD client {} appears twice", r.client)));
        }
        let record =
            LocalSsdRecord { enable_offloading: r.enable_offloading, total_capacity: r.total_capacity, used: 0 };
        local_ssd.push((r.client, record));
    }
    let regions = wire
        .regions
        .into_iter()
        .map(|r| RegionReadView {
            spec: r.spec,
            client: r.client,
            status: r.status,
            graceful_deadline: r.graceful_deadline.map(Timestamp),
            alloc: match r.alloc {
                WireRegionAlloc::Own(a) => RegionAllocState::Own(a.into()),
                WireRegionAlloc::CxlBinding(offsets) => RegionAllocState::CxlBinding(offsets),
            },
        })
        .collect();
    let pool = SegmentPoolSnapshotView { regions, cxl_window: wire.cxl_window.map(Into::into) };
    Ok(MasterSnapshotView { pool, local_ssd })
}
