//! The master's oplog vocabulary: what an [`OpLogEntry`]'s `op`, `tenant`, `key` and `payload` mean.
//!
//! A payload is one schema-version byte ([`PAYLOAD_VERSION`]) followed by the postcard encoding of the
//! operation's body; nothing may follow the body. Version 2 added the mounting principal to SEGMENT_MOUNT;
//! version 3 the writer's "do not keep on disk" switch to PUT_END; version 4 the client that wrote the object to
//! PUT_END. This build still reads versions 1 to 3 (the log a leader of an earlier build wrote: a version-1 mount
//! names no principal, a version-1 or 2 object is one eviction may offload, and a version-1 to 3 object's writer
//! is unknown: no client's BatchReplicaClear takes it). Ids are stored as their 16 raw bytes and enums as their wire
//! numbers, so the bytes do not depend on how a Rust type happens to derive serde (the golden vectors below pin
//! them).

use crescent_ha::oplog::OpLogEntry;
use crescent_proto::{ClientId, ObjectDataType, Principal, SegmentId, SegmentKind, SegmentSpec, SegmentStatus};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The payload schema this build writes (and the newest it reads).
pub const PAYLOAD_VERSION: u8 = 4;
/// The oldest payload schema this build reads.
pub const MIN_PAYLOAD_VERSION: u8 = 1;

/// Operation codes (0 is reserved by the oplog: it would hide a zeroed field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum OpCode {
    /// An object became readable: its full post-state. `key` = object key.
    PutEnd = 1,
    /// An object is gone. `key` = object key.
    Remove = 2,
    /// A segment was mounted. `key` = segment id.
    SegmentMount = 3,
    /// A segment was unmounted (its objects' replicas on it are gone). `key` = segment id.
    SegmentUnmount = 4,
    /// A segment's status changed (graceful unmount). `key` = segment id.
    SegmentUpdate = 5,
    /// A tenant's requested quota was set. `tenant` = the tenant, `key` empty.
    TenantQuotaSet = 6,
    /// A tenant was torn down. `tenant` = the tenant, `key` empty.
    TenantRemove = 7,
    /// The whole tenant policy set was replaced (a reload). `key` empty.
    TenantPolicies = 8,
    /// An explicit group was erased with every member. `key` = group name.
    GroupRemove = 9,
    /// A client's local SSD registration was made or changed: its whole record. `key` = client id.
    LocalSsdSet = 10,
    /// A client's local SSD registration was dropped (unregistered, or its client expired). `key` = client id.
    LocalSsdRemove = 11,
    /// A drain job as it now stands (created, scanned, ended or cancelled): its whole record. `key` = job id.
    DrainSet = 12,
}

impl OpCode {
    /// The code of an entry's `op`.
    pub fn from_u16(op: u16) -> Result<Self, PayloadError> {
        Ok(match op {
            1 => Self::PutEnd,
            2 => Self::Remove,
            3 => Self::SegmentMount,
            4 => Self::SegmentUnmount,
            5 => Self::SegmentUpdate,
            6 => Self::TenantQuotaSet,
            7 => Self::TenantRemove,
            8 => Self::TenantPolicies,
            9 => Self::GroupRemove,
            10 => Self::LocalSsdSet,
            11 => Self::LocalSsdRemove,
            12 => Self::DrainSet,
            other => return Err(PayloadError::UnknownOp(other)),
        })
    }
}

/// Why a payload does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// The operation code is not one this build knows.
    #[error("unknown oplog operation {0}")]
    UnknownOp(u16),
    /// The payload has no version byte.
    #[error("empty payload")]
    Empty,
    /// A payload schema this build does not read.
    #[error("unsupported payload version {0} (this build reads {MIN_PAYLOAD_VERSION} to {PAYLOAD_VERSION})")]
    Version(u8),
    /// The body does not decode.
    #[error("payload body does not decode: {0}")]
    Body(String),
    /// Bytes follow the body.
    #[error("{0} bytes follow the payload body")]
    Trailing(usize),
    /// The body decodes but a field is out of range or contradicts the entry.
    #[error("invalid payload: {0}")]
    Invalid(String),
}

/// One replica of an object as the log records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    /// Master-assigned replica id.
    pub id: u64,
    /// The segment (raw UUID bytes).
    pub segment: [u8; 16],
    /// Byte offset in the segment.
    pub offset: u64,
    /// Bytes (the object's size).
    pub length: u64,
    /// 0 = memory/CXL, 1 = NoF, 2 = disk.
    pub tier: u8,
}

impl ReplicaRecord {
    /// The segment id.
    pub fn segment_id(&self) -> SegmentId {
        SegmentId(Uuid::from_bytes(self.segment))
    }
}

/// PUT_END: everything needed to rebuild a readable object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecord {
    /// Object bytes.
    pub size: u64,
    /// Complete replicas, in placement order.
    pub replicas: Vec<ReplicaRecord>,
    /// The writer's crc32c, if given.
    pub checksum: Option<u64>,
    /// Explicit group name, if any.
    pub group: Option<String>,
    /// Never evicted.
    pub hard_pinned: bool,
    /// Soft pin left when the entry was made (ms; 0 = none). Relative: clocks are per process.
    pub soft_pin_ms: u64,
    /// `ObjectDataType` wire number.
    pub data_type: u8,
    /// Dropped rather than kept on a disk tier when memory eviction takes it (the writer's
    /// `ReplicateConfig::offload` off). Without it in the log, a failover would make such objects offloadable.
    pub no_offload: bool,
    /// The client that wrote it (raw UUID bytes; `None`: unknown). BatchReplicaClear clears only the caller's
    /// own objects: without it in the log, a failover would leave its writer unable to clear them.
    pub writer: Option<[u8; 16]>,
}

impl ObjectRecord {
    /// The writer's client id, if known.
    pub fn writer_id(&self) -> Option<ClientId> {
        self.writer.map(|b| ClientId(Uuid::from_bytes(b)))
    }
}

/// A version-3 PUT_END body: [`ObjectRecord`] before it carried `writer`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecordV3 {
    size: u64,
    replicas: Vec<ReplicaRecord>,
    checksum: Option<u64>,
    group: Option<String>,
    hard_pinned: bool,
    soft_pin_ms: u64,
    data_type: u8,
    no_offload: bool,
}

impl From<ObjectRecordV3> for ObjectRecord {
    fn from(r: ObjectRecordV3) -> Self {
        let ObjectRecordV3 { size, replicas, checksum, group, hard_pinned, soft_pin_ms, data_type, no_offload } = r;
        Self { size, replicas, checksum, group, hard_pinned, soft_pin_ms, data_type, no_offload, writer: None }
    }
}

/// A version-1 or 2 PUT_END body: [`ObjectRecord`] before it carried `no_offload`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecordV2 {
    size: u64,
    replicas: Vec<ReplicaRecord>,
    checksum: Option<u64>,
    group: Option<String>,
    hard_pinned: bool,
    soft_pin_ms: u64,
    data_type: u8,
}

impl From<ObjectRecordV2> for ObjectRecord {
    fn from(r: ObjectRecordV2) -> Self {
        let ObjectRecordV2 { size, replicas, checksum, group, hard_pinned, soft_pin_ms, data_type } = r;
        Self { size, replicas, checksum, group, hard_pinned, soft_pin_ms, data_type, no_offload: false, writer: None }
    }
}

/// SEGMENT_MOUNT: the segment and its owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRecord {
    /// The owner's client id (its incarnation).
    pub client: [u8; 16],
    /// Segment id.
    pub id: [u8; 16],
    /// Placement name.
    pub name: String,
    /// Base in the owner's address space.
    pub base: u64,
    /// Bytes.
    pub size: u64,
    /// Transfer endpoint.
    pub endpoint: String,
    /// 0 memory, 1 CXL, 2 NoF.
    pub kind: u8,
    /// Owner's host id.
    pub host: String,
    /// The principal whose connection mounted it (text form; empty on a master that does not authenticate, or
    /// in a version-1 record): the segment's host for grants and tickets, and the principal its owner's client
    /// id belongs to, on whichever master replays the record (`server::hosts`, `server::claims`).
    pub principal: String,
}

/// A version-1 SEGMENT_MOUNT body: [`SegmentRecord`] before it named the principal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRecordV1 {
    client: [u8; 16],
    id: [u8; 16],
    name: String,
    base: u64,
    size: u64,
    endpoint: String,
    kind: u8,
    host: String,
}

impl From<SegmentRecordV1> for SegmentRecord {
    fn from(r: SegmentRecordV1) -> Self {
        let SegmentRecordV1 { client, id, name, base, size, endpoint, kind, host } = r;
        Self { client, id, name, base, size, endpoint, kind, host, principal: String::new() }
    }
}

impl SegmentRecord {
    /// The record of `spec` mounted by `client`, whose connection proved `principal` (if the master
    /// authenticates).
    pub fn new(client: ClientId, spec: &SegmentSpec, principal: Option<&Principal>) -> Self {
        Self {
            client: *client.0.as_bytes(),
            id: *spec.id.0.as_bytes(),
            name: spec.name.clone(),
            base: spec.base,
            size: spec.size,
            endpoint: spec.endpoint.clone(),
            kind: kind_number(spec.kind),
            host: spec.host_id.clone(),
            principal: principal.map(Principal::to_string).unwrap_or_default(),
        }
    }

    /// The mounting principal, if the record names one.
    pub fn principal(&self) -> Result<Option<Principal>, PayloadError> {
        if self.principal.is_empty() {
            return Ok(None);
        }
        let p = self.principal.parse().map_err(|e| PayloadError::Invalid(format!("segment principal: {e}")))?;
        Ok(Some(p))
    }

    /// The owner.
    pub fn client_id(&self) -> ClientId {
        ClientId(Uuid::from_bytes(self.client))
    }

    /// The segment's spec back.
    pub fn spec(&self) -> Result<SegmentSpec, PayloadError> {
        Ok(SegmentSpec {
            id: SegmentId(Uuid::from_bytes(self.id)),
            name: self.name.clone(),
            base: self.base,
            size: self.size,
            endpoint: self.endpoint.clone(),
            kind: kind_from(self.kind)?,
            host_id: self.host.clone(),
        })
    }
}

/// SEGMENT_UNMOUNT.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRef {
    /// Segment id.
    pub id: [u8; 16],
}

/// SEGMENT_UPDATE: a status change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentUpdate {
    /// Segment id.
    pub id: [u8; 16],
    /// `SegmentStatus` wire number.
    pub status: u8,
    /// Time left until the status's deadline (graceful unmount), ms; 0 = none.
    pub deadline_ms: u64,
}

/// TENANT_QUOTA_SET.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantQuota {
    /// Requested quota bytes.
    pub bytes: u64,
}

/// TENANT_POLICIES: the whole policy set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantPolicies {
    /// `(tenant, requested bytes)`, sorted by tenant.
    pub policies: Vec<(String, u64)>,
}

/// LOCAL_SSD_SET: a client's local SSD registration as it now stands (usage is runtime state, never logged).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalSsdEntry {
    /// The client (raw UUID bytes).
    pub client: [u8; 16],
    /// Whether the master may offload objects to it.
    pub enable_offloading: bool,
    /// The capacity it last reported, in bytes.
    pub total_capacity: u64,
}

impl LocalSsdEntry {
    /// The client.
    pub fn client_id(&self) -> ClientId {
        ClientId(Uuid::from_bytes(self.client))
    }
}

/// LOCAL_SSD_REMOVE.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientRef {
    /// The client (raw UUID bytes).
    pub client: [u8; 16],
}

/// DRAIN_SET: a drain job's durable part, so a new leader or a restarted master takes a running drain over
/// (its segments stay out of placement) and still answers for one that ended. What changes per move (tasks
/// under way, the queue) is not logged: a job taken over scans its segments afresh, and the moves themselves
/// are in the log as the objects' new states.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRecord {
    /// The job (raw UUID bytes).
    pub id: [u8; 16],
    /// The master's count of drain changes when this one was logged: orders the jobs' changes across restarts and
    /// failovers (a new leader counts on from the highest it restored), where wall-clock times may tie or go back.
    pub order: u64,
    /// `JobStatus` wire number (0..=5).
    pub status: u8,
    /// Unix ms.
    pub created_at_ms: u64,
    /// Unix ms.
    pub updated_at_ms: u64,
    /// The segments drained (raw UUID bytes, ascending).
    pub segments: Vec<[u8; 16]>,
    /// Their names as asked.
    pub names: Vec<String>,
    /// Where moves may go (empty: wherever placement puts them).
    pub targets: Vec<String>,
    /// Most moves under way at once (≥ 1).
    pub max_concurrency: u32,
    /// Replicas moved off so far.
    pub succeeded: u64,
    /// Replicas that could not be moved.
    pub failed: u64,
    /// Bytes moved.
    pub migrated_bytes: u64,
    /// For a person.
    pub message: String,
}

impl DrainRecord {
    /// The job.
    pub fn job_id(&self) -> crescent_proto::TaskId {
        crescent_proto::TaskId(Uuid::from_bytes(self.id))
    }

    /// The job's status.
    pub fn job_status(&self) -> Result<crescent_proto::JobStatus, PayloadError> {
        use crescent_proto::JobStatus as J;
        Ok(match self.status {
            0 => J::Created,
            1 => J::Planning,
            2 => J::Running,
            3 => J::Succeeded,
            4 => J::Failed,
            5 => J::Canceled,
            n => return Err(PayloadError::Invalid(format!("drain status {n}"))),
        })
    }

    /// The segments drained.
    pub fn segment_ids(&self) -> Vec<SegmentId> {
        self.segments.iter().map(|s| SegmentId(Uuid::from_bytes(*s))).collect()
    }

    /// Checks what decoding alone does not: a known status, some segments in order, a concurrency.
    pub fn check(&self) -> Result<(), PayloadError> {
        self.job_status()?;
        if self.segments.is_empty() || !self.segments.is_sorted_by(|a, b| a < b) || self.max_concurrency == 0 {
            return Err(PayloadError::Invalid("a drain needs segments, ascending, and a concurrency".into()));
        }
        Ok(())
    }
}

/// A decoded entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MasterEntry {
    /// See [`OpCode::PutEnd`].
    PutEnd {
        /// Tenant.
        tenant: String,
        /// Object key.
        key: String,
        /// Post-state.
        object: ObjectRecord,
    },
    /// See [`OpCode::Remove`].
    Remove {
        /// Tenant.
        tenant: String,
        /// Object key.
        key: String,
    },
    /// See [`OpCode::SegmentMount`].
    SegmentMount(SegmentRecord),
    /// See [`OpCode::SegmentUnmount`].
    SegmentUnmount(SegmentRef),
    /// See [`OpCode::SegmentUpdate`].
    SegmentUpdate(SegmentUpdate),
    /// See [`OpCode::TenantQuotaSet`].
    TenantQuotaSet {
        /// Tenant.
        tenant: String,
        /// Quota.
        quota: TenantQuota,
    },
    /// See [`OpCode::TenantRemove`].
    TenantRemove {
        /// Tenant.
        tenant: String,
    },
    /// See [`OpCode::TenantPolicies`].
    TenantPolicies(TenantPolicies),
    /// See [`OpCode::GroupRemove`].
    GroupRemove {
        /// Tenant.
        tenant: String,
        /// Group name.
        group: String,
    },
    /// See [`OpCode::LocalSsdSet`].
    LocalSsdSet(LocalSsdEntry),
    /// See [`OpCode::LocalSsdRemove`].
    LocalSsdRemove(ClientRef),
    /// See [`OpCode::DrainSet`].
    DrainSet(DrainRecord),
}

fn payload<T: Serialize>(body: &T) -> Vec<u8> {
    let out = vec![PAYLOAD_VERSION];
    // Serialising these plain structs into a Vec cannot fail (no maps, no unsized sequences).
    match postcard::to_extend(body, out) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(error = %e, "oplog payload did not serialise");
            vec![PAYLOAD_VERSION]
        }
    }
}

/// The payload's schema version, if this build reads it.
fn version(bytes: &[u8]) -> Result<u8, PayloadError> {
    let &v = bytes.first().ok_or(PayloadError::Empty)?;
    match (MIN_PAYLOAD_VERSION..=PAYLOAD_VERSION).contains(&v) {
        true => Ok(v),
        false => Err(PayloadError::Version(v)),
    }
}

fn body<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, PayloadError> {
    version(bytes)?;
    let rest = &bytes[1..];
    let (value, tail) = postcard::take_from_bytes(rest).map_err(|e| PayloadError::Body(e.to_string()))?;
    if !tail.is_empty() {
        return Err(PayloadError::Trailing(tail.len()));
    }
    Ok(value)
}

fn empty(bytes: &[u8]) -> Result<(), PayloadError> {
    body::<()>(bytes)
}

fn id_key(id: &[u8; 16]) -> String {
    Uuid::from_bytes(*id).to_string()
}

impl MasterEntry {
    /// The oplog entry.
    pub fn encode(&self) -> OpLogEntry {
        let (op, tenant, key, payload) = match self {
            Self::PutEnd { tenant, key, object } => (OpCode::PutEnd, tenant.clone(), key.clone(), payload(object)),
            Self::Remove { tenant, key } => (OpCode::Remove, tenant.clone(), key.clone(), payload(&())),
            Self::SegmentMount(s) => (OpCode::SegmentMount, String::new(), id_key(&s.id), payload(s)),
            Self::SegmentUnmount(s) => (OpCode::SegmentUnmount, String::new(), id_key(&s.id), payload(s)),
            Self::SegmentUpdate(s) => (OpCode::SegmentUpdate, String::new(), id_key(&s.id), payload(s)),
            Self::TenantQuotaSet { tenant, quota } => {
                (OpCode::TenantQuotaSet, tenant.clone(), String::new(), payload(quota))
            }
            Self::TenantRemove { tenant } => (OpCode::TenantRemove, tenant.clone(), String::new(), payload(&())),
            Self::TenantPolicies(p) => (OpCode::TenantPolicies, String::new(), String::new(), payload(p)),
            Self::GroupRemove { tenant, group } => (OpCode::GroupRemove, tenant.clone(), group.clone(), payload(&())),
            Self::LocalSsdSet(r) => (OpCode::LocalSsdSet, String::new(), id_key(&r.client), payload(r)),
            Self::LocalSsdRemove(r) => (OpCode::LocalSsdRemove, String::new(), id_key(&r.client), payload(r)),
            Self::DrainSet(r) => (OpCode::DrainSet, String::new(), id_key(&r.id), payload(r)),
        };
        OpLogEntry { op: op as u16, tenant, key, payload }
    }

    /// Decodes and checks an entry.
    pub fn decode(entry: &OpLogEntry) -> Result<Self, PayloadError> {
        let p = &entry.payload;
        let (tenant, key) = (entry.tenant.clone(), entry.key.clone());
        let e = match OpCode::from_u16(entry.op)? {
            OpCode::PutEnd => {
                let object: ObjectRecord = match version(p)? {
                    1 | 2 => body::<ObjectRecordV2>(p)?.into(),
                    3 => body::<ObjectRecordV3>(p)?.into(),
                    _ => body(p)?,
                };
                check_object(&object)?;
                Self::PutEnd { tenant, key, object }
            }
            OpCode::Remove => {
                empty(p)?;
                Self::Remove { tenant, key }
            }
            OpCode::SegmentMount => {
                let s: SegmentRecord = match version(p)? {
                    1 => body::<SegmentRecordV1>(p)?.into(),
                    _ => body(p)?,
                };
                s.spec()?;
                s.principal()?;
                check_key(&key, &s.id)?;
                Self::SegmentMount(s)
            }
            OpCode::SegmentUnmount => {
                let s: SegmentRef = body(p)?;
                check_key(&key, &s.id)?;
                Self::SegmentUnmount(s)
            }
            OpCode::SegmentUpdate => {
                let s: SegmentUpdate = body(p)?;
                status_from(s.status)?;
                check_key(&key, &s.id)?;
                Self::SegmentUpdate(s)
            }
            OpCode::TenantQuotaSet => Self::TenantQuotaSet { tenant, quota: body(p)? },
            OpCode::TenantRemove => {
                empty(p)?;
                Self::TenantRemove { tenant }
            }
            OpCode::TenantPolicies => Self::TenantPolicies(body(p)?),
            OpCode::GroupRemove => {
                empty(p)?;
                Self::GroupRemove { tenant, group: key }
            }
            OpCode::LocalSsdSet => {
                let r: LocalSsdEntry = body(p)?;
                check_key(&key, &r.client)?;
                Self::LocalSsdSet(r)
            }
            OpCode::LocalSsdRemove => {
                let r: ClientRef = body(p)?;
                check_key(&key, &r.client)?;
                Self::LocalSsdRemove(r)
            }
            OpCode::DrainSet => {
                let r: DrainRecord = body(p)?;
                r.check()?;
                check_key(&key, &r.id)?;
                Self::DrainSet(r)
            }
        };
        Ok(e)
    }
}

fn check_key(key: &str, id: &[u8; 16]) -> Result<(), PayloadError> {
    if key != id_key(id) {
        return Err(PayloadError::Invalid(format!("entry key {key:?} is not the id {}", id_key(id))));
    }
    Ok(())
}

pub(crate) fn check_object(o: &ObjectRecord) -> Result<(), PayloadError> {
    if o.size == 0 || o.replicas.is_empty() {
        return Err(PayloadError::Invalid("an object needs a size and a replica".into()));
    }
    data_type_from(o.data_type)?;
    let block = crescent_proto::DISK_BLOCK;
    for r in &o.replicas {
        // A disk replica takes whole blocks (tier 2); the others exactly the object.
        let shape_ok = match r.tier {
            0 | 1 => r.length == o.size,
            2 => r.length == o.size.div_ceil(block).saturating_mul(block) && r.offset.is_multiple_of(block),
            _ => false,
        };
        if !shape_ok || r.offset.checked_add(r.length).is_none() {
            return Err(PayloadError::Invalid(format!("replica {} is malformed", r.id)));
        }
    }
    Ok(())
}

/// A segment kind's wire number.
pub fn kind_number(kind: SegmentKind) -> u8 {
    match kind {
        SegmentKind::Memory => 0,
        SegmentKind::Cxl => 1,
        SegmentKind::Nof => 2,
        SegmentKind::Disk => 3,
    }
}

fn kind_from(n: u8) -> Result<SegmentKind, PayloadError> {
    Ok(match n {
        0 => SegmentKind::Memory,
        1 => SegmentKind::Cxl,
        2 => SegmentKind::Nof,
        3 => SegmentKind::Disk,
        n => return Err(PayloadError::Invalid(format!("segment kind {n}"))),
    })
}

/// The status of a wire number.
pub fn status_from(n: u8) -> Result<SegmentStatus, PayloadError> {
    Ok(match n {
        1 => SegmentStatus::Ok,
        2 => SegmentStatus::Draining,
        3 => SegmentStatus::Drained,
        4 => SegmentStatus::GracefullyUnmounting,
        n => return Err(PayloadError::Invalid(format!("segment status {n} is not logged"))),
    })
}

/// The data type of a wire number.
pub fn data_type_from(n: u8) -> Result<ObjectDataType, PayloadError> {
    ObjectDataType::from_number(n).ok_or_else(|| PayloadError::Invalid(format!("data type {n}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn object() -> ObjectRecord {
        ObjectRecord {
            size: 300,
            replicas: vec![ReplicaRecord { id: 7, segment: [0xab; 16], offset: 4096, length: 300, tier: 0 }],
            checksum: Some(0xdead_beef),
            group: Some("g".into()),
            hard_pinned: true,
            soft_pin_ms: 0,
            data_type: 1,
            no_offload: true,
            writer: Some([0xcd; 16]),
        }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
    }

    /// The bytes are the format: a change here is a schema change (bump PAYLOAD_VERSION).
    #[test]
    fn golden_payload_bytes() {
        let put = MasterEntry::PutEnd { tenant: "t".into(), key: "k".into(), object: object() }.encode();
        assert_eq!(put.op, 1);
        // version 04; size 300 = ac02; one replica: id 07, segment 16 × ab, offset 4096 = 8020, length ac02,
        // tier 00; checksum Some(0xdeadbeef) = 01 + varint; group Some("g") = 01 01 67; hard pin 01; soft pin 00;
        // data type 01; no offload 01; writer Some(16 × cd).
        let v2_body = format!("ac020107{}8020ac020001effdb6f50d010167010001", "ab".repeat(16));
        assert_eq!(hex(&put.payload), format!("04{v2_body}0101{}", "cd".repeat(16)));
        // A version-3 PUT_END (the previous build's) still decodes: its writer is unknown.
        let mut old = put.clone();
        old.payload = unhex(&format!("03{v2_body}01"));
        let MasterEntry::PutEnd { object: back, .. } = MasterEntry::decode(&old).unwrap() else { panic!("not a put") };
        assert_eq!(back, ObjectRecord { writer: None, ..object() });
        // A version-2 one too: its object may be offloaded.
        old.payload = unhex(&format!("02{v2_body}"));
        let MasterEntry::PutEnd { object: back, .. } = MasterEntry::decode(&old).unwrap() else { panic!("not a put") };
        assert_eq!(back, ObjectRecord { no_offload: false, writer: None, ..object() });
        let rm = MasterEntry::Remove { tenant: "t".into(), key: "k".into() }.encode();
        assert_eq!((rm.op, hex(&rm.payload)), (2, "04".to_owned()));
        let seg = SegmentRecord {
            client: [1; 16],
            id: [2; 16],
            name: "n".into(),
            base: 0,
            size: 1 << 20,
            endpoint: "h:1".into(),
            kind: 0,
            host: String::new(),
            principal: "node:a".into(),
        };
        let mount = MasterEntry::SegmentMount(seg.clone()).encode();
        assert_eq!(mount.key, "02020202-0202-0202-0202-020202020202");
        // ... kind 00, host "" 00, principal "node:a" 06 6e6f64653a61.
        let v1 = format!("{}{}016e00808040{}0000", "01".repeat(16), "02".repeat(16), "03683a31");
        assert_eq!(hex(&mount.payload), format!("04{v1}066e6f64653a61"));
        // A version-1 mount (the previous build's) still decodes: it names no principal.
        let mut old = mount.clone();
        old.payload = unhex(&format!("01{v1}"));
        let MasterEntry::SegmentMount(back) = MasterEntry::decode(&old).unwrap() else { panic!("not a mount") };
        assert_eq!(back, SegmentRecord { principal: String::new(), ..seg });
        let upd = MasterEntry::SegmentUpdate(SegmentUpdate { id: [2; 16], status: 4, deadline_ms: 300 }).encode();
        assert_eq!(hex(&upd.payload), format!("04{}04ac02", "02".repeat(16)));
        let q = MasterEntry::TenantQuotaSet { tenant: "a".into(), quota: TenantQuota { bytes: 1 } }.encode();
        assert_eq!((q.op, q.tenant.as_str(), hex(&q.payload)), (6, "a", "0401".to_owned()));
        // Local SSD registrations (ops 10 and 11, added after the version-2 schema; earlier ops' bytes are
        // unchanged): client 16 × 05, offloading 01, capacity 300 = ac02.
        let ssd =
            MasterEntry::LocalSsdSet(LocalSsdEntry { client: [5; 16], enable_offloading: true, total_capacity: 300 })
                .encode();
        assert_eq!((ssd.op, ssd.key.as_str()), (10, "05050505-0505-0505-0505-050505050505"));
        assert_eq!(hex(&ssd.payload), format!("04{}01ac02", "05".repeat(16)));
        let gone = MasterEntry::LocalSsdRemove(ClientRef { client: [5; 16] }).encode();
        assert_eq!((gone.op, hex(&gone.payload)), (11, format!("04{}", "05".repeat(16))));
        // Drain jobs (op 12, added later; earlier ops' bytes are unchanged): id 16 × 06, order 09, status 02, created 300 =
        // ac02, updated 301 = ad02, one segment 16 × 07, names ["a"], targets [], concurrency 04, succeeded 05,
        // failed 00, bytes 300, message "m".
        let drain = MasterEntry::DrainSet(drain()).encode();
        assert_eq!((drain.op, drain.key.as_str()), (12, "06060606-0606-0606-0606-060606060606"));
        let (id, segment) = ("06".repeat(16), "07".repeat(16));
        assert_eq!(hex(&drain.payload), format!("04{id}0902ac02ad0201{segment}01016100040500ac02016d"));
    }

    fn drain() -> DrainRecord {
        DrainRecord {
            id: [6; 16],
            order: 9,
            status: 2,
            created_at_ms: 300,
            updated_at_ms: 301,
            segments: vec![[7; 16]],
            names: vec!["a".into()],
            targets: vec![],
            max_concurrency: 4,
            succeeded: 5,
            failed: 0,
            migrated_bytes: 300,
            message: "m".into(),
        }
    }

    #[test]
    fn every_entry_round_trips() {
        let entries = [
            MasterEntry::PutEnd { tenant: "t".into(), key: "k".into(), object: object() },
            MasterEntry::Remove { tenant: "t".into(), key: "k".into() },
            MasterEntry::SegmentUnmount(SegmentRef { id: [9; 16] }),
            MasterEntry::SegmentUpdate(SegmentUpdate { id: [9; 16], status: 4, deadline_ms: 5 }),
            MasterEntry::TenantRemove { tenant: "t".into() },
            MasterEntry::TenantPolicies(TenantPolicies { policies: vec![("a".into(), 5)] }),
            MasterEntry::GroupRemove { tenant: "t".into(), group: "g".into() },
            MasterEntry::LocalSsdSet(LocalSsdEntry { client: [1; 16], enable_offloading: false, total_capacity: 0 }),
            MasterEntry::LocalSsdRemove(ClientRef { client: [1; 16] }),
            MasterEntry::DrainSet(drain()),
        ];
        for e in entries {
            assert_eq!(MasterEntry::decode(&e.encode()).unwrap(), e);
        }
    }

    #[test]
    fn bad_payloads_are_typed_errors() {
        let mut e = MasterEntry::Remove { tenant: "t".into(), key: "k".into() }.encode();
        e.op = 99;
        assert_eq!(MasterEntry::decode(&e), Err(PayloadError::UnknownOp(99)));
        e.op = 2;
        e.payload = vec![];
        assert_eq!(MasterEntry::decode(&e), Err(PayloadError::Empty));
        e.payload = vec![PAYLOAD_VERSION + 1];
        assert_eq!(MasterEntry::decode(&e), Err(PayloadError::Version(PAYLOAD_VERSION + 1)));
        e.payload = vec![0];
        assert_eq!(MasterEntry::decode(&e), Err(PayloadError::Version(0)));
        e.payload = vec![1, 0];
        assert_eq!(MasterEntry::decode(&e), Err(PayloadError::Trailing(1)));
        let mut put = MasterEntry::PutEnd { tenant: "t".into(), key: "k".into(), object: object() }.encode();
        put.payload.truncate(10);
        assert!(matches!(MasterEntry::decode(&put), Err(PayloadError::Body(_))));
        let mut bad = object();
        bad.replicas[0].tier = 3;
        let put = MasterEntry::PutEnd { tenant: "t".into(), key: "k".into(), object: bad }.encode();
        assert!(matches!(MasterEntry::decode(&put), Err(PayloadError::Invalid(_))));
        let spec = SegmentSpec {
            id: SegmentId::random(),
            name: "n".into(),
            base: 0,
            size: 1 << 20,
            endpoint: "h:1".into(),
            kind: SegmentKind::Memory,
            host_id: String::new(),
        };
        let mut seg = SegmentRecord::new(ClientId::random(), &spec, None);
        seg.principal = "root".into();
        let mount = MasterEntry::SegmentMount(seg).encode();
        assert!(matches!(MasterEntry::decode(&mount), Err(PayloadError::Invalid(_))), "not a principal");
        let mut unmount = MasterEntry::SegmentUnmount(SegmentRef { id: [9; 16] }).encode();
        unmount.key = "other".into();
        assert!(matches!(MasterEntry::decode(&unmount), Err(PayloadError::Invalid(_))));
        let mut ssd = MasterEntry::LocalSsdRemove(ClientRef { client: [9; 16] }).encode();
        ssd.key = "other".into();
        assert!(matches!(MasterEntry::decode(&ssd), Err(PayloadError::Invalid(_))), "key and client differ");
        for broken in [
            DrainRecord { status: 6, ..drain() },
            DrainRecord { segments: vec![], ..drain() },
            DrainRecord { segments: vec![[8; 16], [7; 16]], ..drain() },
            DrainRecord { max_concurrency: 0, ..drain() },
        ] {
            let e = MasterEntry::DrainSet(broken.clone()).encode();
            assert!(matches!(MasterEntry::decode(&e), Err(PayloadError::Invalid(_))), "{broken:?}");
        }
        let mut other = MasterEntry::DrainSet(drain()).encode();
        other.key = "other".into();
        assert!(matches!(MasterEntry::decode(&other), Err(PayloadError::Invalid(_))), "key and job differ");
        e.op = 13;
        assert_eq!(MasterEntry::decode(&e), Err(PayloadError::UnknownOp(13)));
    }
}
