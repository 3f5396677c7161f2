//! The master snapshot codec: the one place that knows how master state is encoded.
//!
//! It consumes the owners' read views ([`SegmentPoolSnapshotView`] from the segment pool, the LocalSSD
//! registrations from [`crate::local_ssd::LocalSsdManager::snapshot`], and the object directory as the oplog
//! folds it: a [`ReplayState`] with the oplog position it includes, [`SnapshotMetadata`]) and decodes them back
//! for the owners' restore transactions. No owner knows this encoding, and the wire records below are the
//! codec's own (objects and segments reuse the oplog's PUT_END and SEGMENT_MOUNT records, themselves a pinned
//! wire format), so an owner's types can change without changing the format silently. NoF regions are left out
//! of the pool part: they re-register on their heartbeat. What is *not* in a snapshot, by design: in-flight
//! writes, read leases and the absolute time of soft pins (a pin is kept as the time it had left) — a restored
//! master starts without them, as a replayed log does.
//!
//! Layout: `b"CSNP"` magic, `u16` format version (LE), `u32` crc32c (LE) of the body, then the postcard body.
//! This build writes version 5 and reads 2 to 5 (version 3's segments name their mounting principal, version 4's
//! objects their writer's "do not keep on disk" switch, version 5's objects the client that wrote them).
//! Decoding checks the envelope and the records' own shape (duplicate LocalSSD clients; segments, tenants and
//! keys strictly ascending, so duplicates are impossible and the bytes are canonical; every object and segment
//! record as the oplog decoder checks them); the pool's restore validates the regions against each other and
//! the configuration.
//!
//! [`store`] is where snapshots are kept (a local directory or S3) and [`catalog`] how they are published,
//! retained and found again.

pub mod catalog;
pub mod store;

use crate::alloc::{AllocatorSnapshot, SnapshotAllocation};
use crate::clock::Timestamp;
use crate::ha::payload::{SegmentRecordV1, check_object};
use crate::ha::{ObjectRecord, ObjectRecordV2, ObjectRecordV3, ReplayState, SegmentRecord};
use crate::local_ssd::LocalSsdRecord;
use crate::segment_pool::{RegionAllocState, RegionReadView, SegmentPoolSnapshotView};
use crescent_proto::{ClientId, ErrorCode, SegmentKind, SegmentSpec, SegmentStatus};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

const MAGIC: &[u8; 4] = b"CSNP";
/// The format version this build writes (and the newest it reads).
/// Version 2 added the object directory and its oplog position ([`SnapshotMetadata`]); version 3 the principal
/// that mounted each segment (SEGMENT_MOUNT's payload version 2); version 4 each object's `no_offload`
/// (PUT_END's payload version 3); version 5 each object's writer (PUT_END's payload version 4).
pub const VERSION: u16 = 5;
/// The oldest format version this build reads.
pub const MIN_VERSION: u16 = 2;
/// Bytes before the body: magic, version, checksum.
pub const HEADER_LEN: usize = 4 + 2 + 4;

/// What a master snapshot holds, as the owners' read views.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MasterSnapshotView {
    /// Mounted Memory/CXL regions and their allocator states.
    pub pool: SegmentPoolSnapshotView,
    /// LocalSSD registrations, by client (usage is runtime state, rebuilt from metadata on restore). With
    /// metadata, its `state.local_ssd` is written here too, and decoded back into it.
    pub local_ssd: Vec<(ClientId, LocalSsdRecord)>,
    /// The object directory, segments and tenant policies at one oplog position (`None`: a pool-only snapshot).
    pub metadata: Option<SnapshotMetadata>,
}

/// The master's metadata as of one oplog position: what a restore starts from before it replays the batches
/// after `batch_id`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotMetadata {
    /// The folded state; its `last_seq` is the last oplog sequence the snapshot includes.
    pub state: ReplayState,
    /// The last oplog batch the snapshot includes (0: none).
    pub batch_id: u64,
    /// The producer view (leader epoch) in force when it was taken (0: unknown).
    pub producer_view: u64,
}

/// Why a payload is not a snapshot this build can restore.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Shorter than the header, or not a snapshot at all.
    #[error("not a master snapshot (bad magic or truncated header)")]
    BadHeader,
    /// Written by a format this build does not read.
    #[error("unsupported master snapshot version {0} (this build reads {MIN_VERSION} to {VERSION})")]
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

/// One object of a tenant: key and record (`O`: the object record of the format version).
type WireObject<'a, O = ObjectRecord> = (std::borrow::Cow<'a, str>, std::borrow::Cow<'a, O>);

/// One tenant's objects, keys ascending.
#[derive(Serialize, Deserialize)]
struct WireTenant<'a, O: Clone = ObjectRecord> {
    #[serde(borrow)]
    tenant: std::borrow::Cow<'a, str>,
    objects: Vec<WireObject<'a, O>>,
}

/// `S` and `O`: the segment and object records of the format version (version 2's [`SegmentRecordV1`], versions
/// 2 and 3's [`ObjectRecordV2`], version 4's [`ObjectRecordV3`]).
#[derive(Serialize, Deserialize)]
struct WireMetadata<'a, S: Clone = SegmentRecord, O: Clone = ObjectRecord> {
    last_seq: u64,
    batch_id: u64,
    producer_view: u64,
    /// Ids ascending.
    segments: Vec<std::borrow::Cow<'a, S>>,
    /// `None`: no tenant policy was ever logged (distinct from an empty set).
    policies: Option<Vec<(String, u64)>>,
    /// Tenants ascending; none empty.
    #[serde(borrow)]
    tenants: Vec<WireTenant<'a, O>>,
}

#[derive(Serialize, Deserialize)]
struct WireSnapshot<'a, S: Clone = SegmentRecord, O: Clone = ObjectRecord> {
    regions: Vec<WireRegion>,
    cxl_window: Option<WireAllocator>,
    local_ssd: Vec<WireLocalSsd>,
    #[serde(borrow)]
    metadata: Option<WireMetadata<'a, S, O>>,
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
    // An HA snapshot's registrations are its metadata's (the folded log's); a pool snapshot's are the view's.
    let mut registrations: Vec<(ClientId, LocalSsdRecord)> = view.local_ssd.clone();
    if let Some(m) = &view.metadata {
        let listed: HashSet<ClientId> = registrations.iter().map(|(c, _)| *c).collect();
        registrations.extend(m.state.local_ssd.iter().filter(|(c, _)| !listed.contains(c)).map(|(c, r)| (*c, *r)));
    }
    let local_ssd = registrations
        .iter()
        .map(|(c, r)| WireLocalSsd {
            client: *c,
            enable_offloading: r.enable_offloading,
            total_capacity: r.total_capacity,
        })
        .collect();
    let metadata = view.metadata.as_ref().map(wire_metadata);
    let wire = WireSnapshot { regions, cxl_window: view.pool.cxl_window.as_ref().map(Into::into), local_ssd, metadata };
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
    if !(MIN_VERSION..=VERSION).contains(&version) {
        return Err(SnapshotError::UnsupportedVersion(version));
    }
    let crc = u32::from_le_bytes([payload[6], payload[7], payload[8], payload[9]]);
    let body = &payload[HEADER_LEN..];
    if crc32c::crc32c(body) != crc {
        return Err(SnapshotError::Checksum);
    }
    match version {
        2 => decode_body::<SegmentRecordV1, ObjectRecordV2>(body),
        3 => decode_body::<SegmentRecord, ObjectRecordV2>(body),
        4 => decode_body::<SegmentRecord, ObjectRecordV3>(body),
        _ => decode_body::<SegmentRecord, ObjectRecord>(body),
    }
}

/// Decodes a body whose segment records are `S`s and object records `O`s.
fn decode_body<'a, S, O>(body: &'a [u8]) -> Result<MasterSnapshotView, SnapshotError>
where
    S: Clone + Into<SegmentRecord> + 'a,
    O: Clone + Into<ObjectRecord> + 'a,
    WireSnapshot<'a, S, O>: Deserialize<'a>,
{
    let (wire, rest): (WireSnapshot<'a, S, O>, _) =
        postcard::take_from_bytes(body).map_err(|e| SnapshotError::Corrupt(format!("decode: {e}")))?;
    if !rest.is_empty() {
        return Err(SnapshotError::Corrupt(format!("{} bytes follow the body", rest.len())));
    }
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
    let mut metadata = wire.metadata.map(metadata_from_wire).transpose()?;
    if let Some(m) = &mut metadata {
        m.state.local_ssd = local_ssd.iter().copied().collect();
    }
    Ok(MasterSnapshotView { pool, local_ssd, metadata })
}

/// The wire form of `m`: everything borrowed, sorted (segments by id, tenants and keys in byte order) so equal
/// states encode to equal bytes.
fn wire_metadata(m: &SnapshotMetadata) -> WireMetadata<'_> {
    use std::borrow::Cow;
    let mut by_tenant: BTreeMap<&str, Vec<WireObject<'_>>> = BTreeMap::new();
    for ((tenant, key), o) in &m.state.objects {
        by_tenant.entry(tenant.as_str()).or_default().push((Cow::Borrowed(key.as_str()), Cow::Borrowed(o)));
    }
    let tenants = by_tenant
        .into_iter()
        .map(|(tenant, mut objects)| {
            objects.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            WireTenant { tenant: Cow::Borrowed(tenant), objects }
        })
        .collect();
    WireMetadata {
        last_seq: m.state.last_seq,
        batch_id: m.batch_id,
        producer_view: m.producer_view,
        // A BTreeMap by id: already ascending.
        segments: m.state.segments.values().map(Cow::Borrowed).collect(),
        policies: m.state.policies.as_ref().map(|p| p.iter().map(|(t, q)| (t.clone(), *q)).collect()),
        tenants,
    }
}

fn corrupt(what: impl std::fmt::Display) -> SnapshotError {
    SnapshotError::Corrupt(what.to_string())
}

/// Checks and folds the wire metadata back into a state; any record the oplog decoder would refuse is refused.
fn metadata_from_wire<S: Clone + Into<SegmentRecord>, O: Clone + Into<ObjectRecord>>(
    w: WireMetadata<'_, S, O>,
) -> Result<SnapshotMetadata, SnapshotError> {
    if (w.batch_id == 0) != (w.last_seq == 0) {
        return Err(corrupt(format!("position batch {} / seq {} is inconsistent", w.batch_id, w.last_seq)));
    }
    let mut segments = BTreeMap::new();
    let mut last_id: Option<crescent_proto::SegmentId> = None;
    for s in w.segments {
        let s: SegmentRecord = s.into_owned().into();
        let spec = s.spec().map_err(|e| corrupt(format!("segment: {e}")))?;
        s.principal().map_err(|e| corrupt(format!("segment {}: {e}", spec.id)))?;
        if last_id.is_some_and(|prev| prev >= spec.id) {
            return Err(corrupt(format!("segment {} is out of order or repeated", spec.id)));
        }
        last_id = Some(spec.id);
        segments.insert(spec.id, s);
    }
    let policies = match w.policies {
        None => None,
        Some(list) => {
            let mut out = BTreeMap::new();
            for (tenant, quota) in list {
                if out.last_key_value().is_some_and(|(prev, _): (&String, _)| *prev >= tenant) {
                    return Err(corrupt(format!("tenant policy {tenant:?} is out of order or repeated")));
                }
                out.insert(tenant, quota);
            }
            Some(out)
        }
    };
    let total: usize = w.tenants.iter().map(|t| t.objects.len()).sum();
    let mut objects = crate::ha::ReplayObjects::with_capacity(total);
    let mut last_tenant: Option<String> = None;
    for t in w.tenants {
        let tenant = t.tenant.into_owned();
        if t.objects.is_empty() {
            return Err(corrupt(format!("tenant {tenant:?} is listed without objects")));
        }
        if last_tenant.as_ref().is_some_and(|prev| *prev >= tenant) {
            return Err(corrupt(format!("tenant {tenant:?} is out of order or repeated")));
        }
        let mut last_key: Option<&str> = None;
        for (key, _) in &t.objects {
            if last_key.is_some_and(|prev| prev >= key.as_ref()) {
                return Err(corrupt(format!("key {key:?} of tenant {tenant:?} is out of order or repeated")));
            }
            last_key = Some(key.as_ref());
        }
        for (key, o) in t.objects {
            let o: ObjectRecord = o.into_owned().into();
            check_object(&o).map_err(|e| corrupt(format!("object {key:?}: {e}")))?;
            objects.insert((tenant.clone(), key.into_owned()), o);
        }
        last_tenant = Some(tenant);
    }
    let state = ReplayState { segments, objects, policies, local_ssd: BTreeMap::new(), last_seq: w.last_seq };
    Ok(SnapshotMetadata { state, batch_id: w.batch_id, producer_view: w.producer_view })
}
