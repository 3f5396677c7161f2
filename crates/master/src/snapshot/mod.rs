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
//! This build writes version 6 and reads 2 to 6 (version 3's segments name their mounting principal, version 4's
//! objects their writer's "do not keep on disk" switch, version 5's objects the client that wrote them, version
//! 6's object directory ends with the drain jobs).
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
use crate::ha::{
    DrainRecord, ObjectRecord, ObjectRecordV2, ObjectRecordV3, ReplayObject, ReplayObjects, ReplayState, SegmentRecord,
};
use crate::local_ssd::LocalSsdRecord;
use crate::segment_pool::{RegionAllocState, RegionReadView, SegmentPoolSnapshotView};
use crescent_proto::{ClientId, ErrorCode, SegmentKind, SegmentSpec, SegmentStatus};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::marker::PhantomData;

const MAGIC: &[u8; 4] = b"CSNP";
/// The format version this build writes (and the newest it reads).
/// Version 2 added the object directory and its oplog position ([`SnapshotMetadata`]); version 3 the principal
/// that mounted each segment (SEGMENT_MOUNT's payload version 2); version 4 each object's `no_offload`
/// (PUT_END's payload version 3); version 5 each object's writer (PUT_END's payload version 4); version 6 the
/// drain jobs (DRAIN_SET's records) after the objects.
pub const VERSION: u16 = 6;
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

/// The tenants' objects as the wire holds them: a sequence of tenants (ascending, none empty), each a struct of
/// its name and its objects (keys ascending), each object a `(key, record)` pair (`O`: the object record of the
/// format version). Decoded straight into the table ([`WireTenants`]'s `Deserialize`), every record checked as
/// it is read: a snapshot of tens of millions of objects never exists twice in memory, once as records and once
/// in the table.
struct WireTenants<O>(ReplayObjects, PhantomData<O>);

std::thread_local! {
    /// Why the tenants did not decode, in words (postcard drops a `Deserialize` impl's own message).
    static TENANTS_REFUSED: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    /// The most objects the body being decoded can hold (its length over [`MIN_WIRE_OBJECT`]): how far a tenant's
    /// count, the wire's word, is trusted when room is made for it.
    static OBJECTS_AT_MOST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Objects the caller will add after the decode (see [`decode_with_room`]).
    static ROOM_AFTER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Fewer bytes than any object the decoder accepts takes on the wire (its key's length, and a record with one
/// replica: a 16-byte segment id and a byte or more for each other field).
const MIN_WIRE_OBJECT: usize = 24;

/// Refuses the tenants with `why` (kept for [`decode_body`]'s error).
fn refuse<E: serde::de::Error>(why: String) -> E {
    let e = E::custom(&why);
    TENANTS_REFUSED.with(|r| *r.borrow_mut() = Some(why));
    e
}

impl<'de, O: Deserialize<'de> + Into<ObjectRecord>> Deserialize<'de> for WireTenants<O> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let table = deserializer.deserialize_seq(TenantsVisitor::<O>(PhantomData))?;
        Ok(WireTenants(table, PhantomData))
    }
}

struct TenantsVisitor<O>(PhantomData<O>);

impl<'de, O: Deserialize<'de> + Into<ObjectRecord>> serde::de::Visitor<'de> for TenantsVisitor<O> {
    type Value = ReplayObjects;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a sequence of tenants")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ReplayObjects, A::Error> {
        let mut table = ReplayObjects::default();
        let mut last: Option<&'de str> = None;
        while let Some(tenant) =
            seq.next_element_seed(TenantSeed::<O> { table: &mut table, after: last, kind: PhantomData })?
        {
            last = Some(tenant);
        }
        Ok(table)
    }
}

/// One tenant, read into `table`; gives its name. `after`: the tenant before it.
struct TenantSeed<'t, 'de, O> {
    table: &'t mut ReplayObjects,
    after: Option<&'de str>,
    kind: PhantomData<O>,
}

impl<'de, O: Deserialize<'de> + Into<ObjectRecord>> serde::de::DeserializeSeed<'de> for TenantSeed<'_, 'de, O> {
    type Value = &'de str;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<&'de str, D::Error> {
        deserializer.deserialize_struct("WireTenant", &["tenant", "objects"], self)
    }
}

impl<'de, O: Deserialize<'de> + Into<ObjectRecord>> serde::de::Visitor<'de> for TenantSeed<'_, 'de, O> {
    type Value = &'de str;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a tenant and its objects")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<&'de str, A::Error> {
        use serde::de::Error;
        let tenant: &'de str = seq.next_element()?.ok_or_else(|| A::Error::invalid_length(0, &self))?;
        if self.after.is_some_and(|prev| prev >= tenant) {
            return Err(refuse(format!("tenant {tenant:?} is out of order or repeated")));
        }
        let objects = ObjectsSeed::<O> { table: self.table, tenant, kind: PhantomData };
        let count = seq.next_element_seed(objects)?.ok_or_else(|| A::Error::invalid_length(1, &self))?;
        if count == 0 {
            return Err(refuse(format!("tenant {tenant:?} is listed without objects")));
        }
        Ok(tenant)
    }
}

/// One tenant's objects, read into `table`; gives how many.
struct ObjectsSeed<'t, 'de, O> {
    table: &'t mut ReplayObjects,
    tenant: &'de str,
    kind: PhantomData<O>,
}

impl<'de, O: Deserialize<'de> + Into<ObjectRecord>> serde::de::DeserializeSeed<'de> for ObjectsSeed<'_, 'de, O> {
    type Value = usize;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<usize, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de, O: Deserialize<'de> + Into<ObjectRecord>> serde::de::Visitor<'de> for ObjectsSeed<'_, 'de, O> {
    type Value = usize;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a tenant's objects")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let tenant = self.tenant;
        // Room for them all at once (growing the table by doubling would move every object several times), as
        // far as the body could hold them: the count is the wire's word. Plus the room the caller asked for (at
        // most as much again), so the log replayed next does not double a table of tens of millions; a room the
        // machine cannot give is not taken (the table grows as it would have).
        let n = seq.size_hint().unwrap_or(0).min(OBJECTS_AT_MOST.with(std::cell::Cell::get));
        let room = ROOM_AFTER.with(std::cell::Cell::get).min(n);
        if !self.table.try_reserve(n + room) {
            self.table.reserve(n);
        }
        let mut last: Option<&'de str> = None;
        let mut count = 0;
        while let Some((key, o)) = seq.next_element::<(&'de str, O)>()? {
            if last.is_some_and(|prev| prev >= key) {
                return Err(refuse(format!("key {key:?} of tenant {tenant:?} is out of order or repeated")));
            }
            let o: ObjectRecord = o.into();
            check_object(&o).map_err(|e| refuse(format!("object {key:?}: {e}")))?;
            self.table.insert(tenant, key, o);
            last = Some(key);
            count += 1;
        }
        Ok(count)
    }
}

/// The drain jobs of a format version before 6: none, and no byte read for them.
#[derive(Deserialize)]
struct NoDrains;

impl From<NoDrains> for Vec<DrainRecord> {
    fn from(_: NoDrains) -> Self {
        Vec::new()
    }
}

/// `S`, `O` and `D`: the segment and object records and the drain list of the format version (version 2's
/// [`SegmentRecordV1`], versions 2 and 3's [`ObjectRecordV2`], version 4's [`ObjectRecordV3`], [`NoDrains`]
/// before version 6). Read only: [`WireMetadataOut`] is what is written.
#[derive(Deserialize)]
struct WireMetadata<
    'a,
    S: Clone = SegmentRecord,
    O: Into<ObjectRecord> = ObjectRecord,
    D: Into<Vec<DrainRecord>> = Vec<DrainRecord>,
> {
    last_seq: u64,
    batch_id: u64,
    producer_view: u64,
    /// Ids ascending.
    segments: Vec<std::borrow::Cow<'a, S>>,
    /// `None`: no tenant policy was ever logged (distinct from an empty set).
    policies: Option<Vec<(String, u64)>>,
    /// Tenants ascending; none empty.
    tenants: WireTenants<O>,
    /// Drain jobs, ids ascending.
    drains: D,
}

/// Read only: [`WireSnapshotOut`] is what is written.
#[derive(Deserialize)]
struct WireSnapshot<
    'a,
    S: Clone = SegmentRecord,
    O: Into<ObjectRecord> = ObjectRecord,
    D: Into<Vec<DrainRecord>> = Vec<DrainRecord>,
> {
    regions: Vec<WireRegion>,
    cxl_window: Option<WireAllocator>,
    local_ssd: Vec<WireLocalSsd>,
    #[serde(borrow)]
    metadata: Option<WireMetadata<'a, S, O, D>>,
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
    let wire =
        WireSnapshotOut { regions, cxl_window: view.pool.cxl_window.as_ref().map(Into::into), local_ssd, metadata };
    // The body is written behind room for the header, into a vector sized once for the objects (a larger body
    // grows it once more): growing by doubling, then copying the body behind its header, moved a snapshot of
    // 50 M objects (3 GB) through fresh memory several times. Serialising plain owned data into a Vec cannot
    // fail; an empty body would fail its restore loudly.
    let objects = view.metadata.as_ref().map_or(0, |m| m.state.objects.len());
    let mut out = Vec::new();
    // A room the machine cannot give is not taken: the vector grows as it goes.
    let _ = out.try_reserve(HEADER_LEN + objects.saturating_mul(WIRE_OBJECT_ESTIMATE).saturating_add(1 << 16));
    out.extend_from_slice(&[0; HEADER_LEN]);
    let mut out = postcard::to_extend(&wire, out).unwrap_or_default();
    if out.len() < HEADER_LEN {
        out.resize(HEADER_LEN, 0);
    }
    write_header(&mut out);
    out
}

/// Fills the header (magic, version, checksum of the body behind it) of `payload`, at least [`HEADER_LEN`] long.
fn write_header(payload: &mut [u8]) {
    let (header, body) = payload.split_at_mut(HEADER_LEN);
    header[..4].copy_from_slice(MAGIC);
    header[4..6].copy_from_slice(&VERSION.to_le_bytes());
    header[6..].copy_from_slice(&crc32c::crc32c(body).to_le_bytes());
}

/// Bytes an object usually takes on the wire (a 20–40-byte key, one replica): what [`encode`] sizes its output
/// for before it knows.
const WIRE_OBJECT_ESTIMATE: usize = 80;

/// The payload of `body`: header (magic, version, checksum), then the body.
#[cfg(test)]
fn seal(body: &[u8]) -> Vec<u8> {
    let mut out = vec![0; HEADER_LEN];
    out.extend_from_slice(body);
    write_header(&mut out);
    out
}

/// Decodes a payload written by [`encode`]; nothing is restored here.
pub fn decode(payload: &[u8]) -> Result<MasterSnapshotView, SnapshotError> {
    decode_with_room(payload, 0)
}

/// [`decode`], its objects' table made with room for `room` more (the objects the log after the snapshot may
/// add: a restore replays it next), up to as many again as the snapshot holds.
pub fn decode_with_room(payload: &[u8], room: usize) -> Result<MasterSnapshotView, SnapshotError> {
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
        2 => decode_body::<SegmentRecordV1, ObjectRecordV2, NoDrains>(body, room),
        3 => decode_body::<SegmentRecord, ObjectRecordV2, NoDrains>(body, room),
        4 => decode_body::<SegmentRecord, ObjectRecordV3, NoDrains>(body, room),
        5 => decode_body::<SegmentRecord, ObjectRecord, NoDrains>(body, room),
        _ => decode_body::<SegmentRecord, ObjectRecord, Vec<DrainRecord>>(body, room),
    }
}

/// Decodes a body whose segment records are `S`s, object records `O`s and drain list a `D`.
fn decode_body<'a, S, O, D>(body: &'a [u8], room: usize) -> Result<MasterSnapshotView, SnapshotError>
where
    S: Clone + Into<SegmentRecord> + 'a,
    O: Clone + Into<ObjectRecord> + 'a,
    D: Into<Vec<DrainRecord>>,
    WireSnapshot<'a, S, O, D>: Deserialize<'a>,
{
    TENANTS_REFUSED.with(|r| r.borrow_mut().take());
    OBJECTS_AT_MOST.with(|n| n.set(body.len() / MIN_WIRE_OBJECT));
    ROOM_AFTER.with(|n| n.set(room));
    let (wire, rest): (WireSnapshot<'a, S, O, D>, _) = postcard::take_from_bytes(body).map_err(|e| {
        // A record the tenants' decoder refused says why; anything else is postcard's.
        TENANTS_REFUSED.with(|r| r.borrow_mut().take()).map_or_else(|| corrupt(format!("decode: {e}")), corrupt)
    })?;
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

/// The wire form of `m` as [`encode`] writes it: everything borrowed, sorted (segments by id, tenants and keys in
/// byte order) so equal states encode to equal bytes. Byte for byte what [`WireMetadata`] decodes; each object's
/// record is built only as it is written ([`SortedObjects`]), so encoding never holds a second copy of the table.
fn wire_metadata(m: &SnapshotMetadata) -> WireMetadataOut<'_> {
    let mut by_tenant: BTreeMap<&str, Vec<ReplayObject<'_>>> = BTreeMap::new();
    for o in m.state.objects.iter() {
        by_tenant.entry(o.tenant()).or_default().push(o);
    }
    let tenants = by_tenant
        .into_iter()
        .map(|(tenant, mut objects)| {
            objects.sort_unstable_by(|a, b| a.key().cmp(b.key()));
            WireTenantOut { tenant, objects: SortedObjects(objects) }
        })
        .collect();
    WireMetadataOut {
        last_seq: m.state.last_seq,
        batch_id: m.batch_id,
        producer_view: m.producer_view,
        // A BTreeMap by id: already ascending.
        segments: m.state.segments.values().collect(),
        policies: m.state.policies.as_ref().map(|p| p.iter().map(|(t, q)| (t.as_str(), *q)).collect()),
        tenants,
        // A BTreeMap by id: already ascending.
        drains: m.state.drains.values().collect(),
    }
}

/// [`WireMetadata`] as it is written (the same fields in the same order: postcard writes no names).
#[derive(Serialize)]
struct WireMetadataOut<'a> {
    last_seq: u64,
    batch_id: u64,
    producer_view: u64,
    segments: Vec<&'a SegmentRecord>,
    policies: Option<Vec<(&'a str, u64)>>,
    tenants: Vec<WireTenantOut<'a>>,
    drains: Vec<&'a DrainRecord>,
}

/// A tenant as it is written: its name, then its objects (what `TenantSeed` reads).
#[derive(Serialize)]
struct WireTenantOut<'a> {
    tenant: &'a str,
    objects: SortedObjects<'a>,
}

/// One tenant's objects, keys ascending, each a `(key, record)` pair (what `ObjectsSeed` reads).
struct SortedObjects<'a>(Vec<ReplayObject<'a>>);

impl Serialize for SortedObjects<'_> {
    fn serialize<Ser: serde::Serializer>(&self, serializer: Ser) -> Result<Ser::Ok, Ser::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for o in &self.0 {
            seq.serialize_element(&(o.key(), o))?;
        }
        seq.end()
    }
}

/// [`WireSnapshot`] as it is written.
#[derive(Serialize)]
struct WireSnapshotOut<'a> {
    regions: Vec<WireRegion>,
    cxl_window: Option<WireAllocator>,
    local_ssd: Vec<WireLocalSsd>,
    metadata: Option<WireMetadataOut<'a>>,
}

fn corrupt(what: impl std::fmt::Display) -> SnapshotError {
    SnapshotError::Corrupt(what.to_string())
}

/// Checks and folds the wire metadata back into a state; any record the oplog decoder would refuse is refused.
fn metadata_from_wire<S: Clone + Into<SegmentRecord>, O: Into<ObjectRecord>, D: Into<Vec<DrainRecord>>>(
    w: WireMetadata<'_, S, O, D>,
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
    // Checked as it was read (`WireTenants`).
    let objects = w.tenants.0;
    let mut drains = BTreeMap::new();
    for d in w.drains.into() {
        d.check().map_err(|e| corrupt(format!("drain job {}: {e}", d.job_id())))?;
        if drains.last_key_value().is_some_and(|(prev, _)| *prev >= d.job_id()) {
            return Err(corrupt(format!("drain job {} is out of order or repeated", d.job_id())));
        }
        drains.insert(d.job_id(), d);
    }
    let state = ReplayState { segments, objects, policies, local_ssd: BTreeMap::new(), drains, last_seq: w.last_seq };
    Ok(SnapshotMetadata { state, batch_id: w.batch_id, producer_view: w.producer_view })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ha::ReplicaRecord;

    fn object(size: u64) -> ObjectRecord {
        ObjectRecord {
            size,
            replicas: vec![ReplicaRecord { id: 1, segment: [1; 16], offset: 0, length: 10, tier: 0 }],
            checksum: None,
            group: None,
            hard_pinned: false,
            soft_pin_ms: 0,
            data_type: 0,
            no_offload: false,
            writer: None,
        }
    }

    /// A payload whose tenants are written in the order given (each `(tenant, keys)`), objects of `size` bytes.
    fn payload(tenants: &[(&str, &[&str])], size: u64) -> Vec<u8> {
        let table: ReplayObjects =
            tenants.iter().flat_map(|(t, keys)| keys.iter().map(move |k| (*t, *k, object(size)))).collect();
        let wire_tenants = tenants
            .iter()
            .map(|(t, keys)| {
                let objects = keys.iter().map(|k| table.view(t, k).unwrap()).collect();
                WireTenantOut { tenant: t, objects: SortedObjects(objects) }
            })
            .collect();
        let metadata = WireMetadataOut {
            last_seq: 1,
            batch_id: 1,
            producer_view: 1,
            segments: vec![],
            policies: None,
            tenants: wire_tenants,
            drains: vec![],
        };
        let wire = WireSnapshotOut { regions: vec![], cxl_window: None, local_ssd: vec![], metadata: Some(metadata) };
        seal(&postcard::to_stdvec(&wire).unwrap())
    }

    fn refusal(bytes: &[u8]) -> String {
        match decode(bytes) {
            Err(SnapshotError::Corrupt(why)) => why,
            other => panic!("expected a corrupt snapshot, got {other:?}"),
        }
    }

    #[test]
    fn tenants_read_straight_into_the_table_are_checked_as_they_are_read() {
        let good = decode(&payload(&[("a", &["k1", "k2"]), ("b", &["k1"])], 10)).unwrap();
        let objects = &good.metadata.unwrap().state.objects;
        assert_eq!(objects.len(), 3);
        assert_eq!(objects.get("b", "k1"), Some(object(10)));
        assert_eq!(refusal(&payload(&[("b", &["k"]), ("a", &["k"])], 10)), r#"tenant "a" is out of order or repeated"#);
        assert_eq!(refusal(&payload(&[("a", &["k"]), ("a", &["j"])], 10)), r#"tenant "a" is out of order or repeated"#);
        assert_eq!(
            refusal(&payload(&[("a", &["k2", "k1"])], 10)),
            r#"key "k1" of tenant "a" is out of order or repeated"#
        );
        assert_eq!(
            refusal(&payload(&[("a", &["k", "k"])], 10)),
            r#"key "k" of tenant "a" is out of order or repeated"#
        );
        assert_eq!(refusal(&payload(&[("a", &[])], 10)), r#"tenant "a" is listed without objects"#);
        let malformed = refusal(&payload(&[("a", &["k"])], 11));
        assert!(malformed.starts_with(r#"object "k": "#) && malformed.contains("malformed"), "{malformed}");
        // A refusal does not stay behind for the next payload's error.
        let cut = payload(&[("a", &["k"])], 10);
        let body = &cut[HEADER_LEN..cut.len() - 2];
        assert!(refusal(&seal(body)).starts_with("decode: "));
    }

    /// A payload with no objects and these drain records, in the order given.
    fn with_drains(drains: &[DrainRecord]) -> Vec<u8> {
        let metadata = WireMetadataOut {
            last_seq: 1,
            batch_id: 1,
            producer_view: 1,
            segments: vec![],
            policies: None,
            tenants: vec![],
            drains: drains.iter().collect(),
        };
        let wire = WireSnapshotOut { regions: vec![], cxl_window: None, local_ssd: vec![], metadata: Some(metadata) };
        seal(&postcard::to_stdvec(&wire).unwrap())
    }

    #[test]
    fn drain_records_are_checked_and_kept_in_id_order() {
        let drain = |id: u8, status: u8| DrainRecord {
            id: [id; 16],
            status,
            segments: vec![[9; 16]],
            max_concurrency: 1,
            ..DrainRecord::default()
        };
        let good = decode(&with_drains(&[drain(1, 2), drain(2, 3)])).unwrap().metadata.unwrap().state.drains;
        assert_eq!(good.values().cloned().collect::<Vec<_>>(), [drain(1, 2), drain(2, 3)]);
        assert!(refusal(&with_drains(&[drain(2, 2), drain(1, 2)])).ends_with("is out of order or repeated"));
        assert!(refusal(&with_drains(&[drain(1, 2), drain(1, 3)])).ends_with("is out of order or repeated"));
        assert!(refusal(&with_drains(&[drain(1, 6)])).contains("drain status 6"));
        let no_segments = DrainRecord { segments: vec![], ..drain(1, 2) };
        assert!(refusal(&with_drains(&[no_segments])).contains("a drain needs segments"));
    }

    #[test]
    fn a_decode_makes_the_room_asked_for_up_to_as_many_again() {
        let keys: Vec<String> = (0..100).map(|i| format!("k{i:03}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let bytes = payload(&[("a", &keys)], 10);
        let table = |room| decode_with_room(&bytes, room).unwrap().metadata.unwrap().state.objects;
        let plain = table(0);
        assert_eq!(plain.len(), 100);
        let roomy = table(60);
        assert_eq!(roomy.len(), 100);
        assert!(roomy.capacity() >= 160, "room for the log's objects: {}", roomy.capacity());
        // Room is bounded by what the snapshot holds (a log far ahead of an old snapshot reserves no more than
        // as many again), and a room no machine could give is no failure.
        let capped = table(usize::MAX);
        assert!(capped.capacity() >= 200 && capped.capacity() < 1000, "{}", capped.capacity());
        assert_eq!(capped, plain);
    }
}
