//! Master RPC messages (control plane). One [`MasterRequest`] per frame header; the reply is a
//! [`MasterReply`] under the same request id. Batch replies are per item, in input order.

use crate::config::ReplicateConfig;
use crate::error::ErrorCode;
use crate::ids::{ClientId, SegmentId};
use crate::replica::ReplicaDescriptor;
use crate::segment::{SegmentSpec, SegmentStatus};
use crate::wire::{Batch, ErrorFrame, WireKey};
use serde::{Deserialize, Serialize};

/// What `Ping` tells a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[repr(u8)]
pub enum ClientStatus {
    /// The master knows the client's segments.
    Ok = 1,
    /// The master lost (or never had) the client's state: call remount with every segment.
    NeedRemount = 2,
}

/// What a reader needs to fetch an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetReplicaListResponse {
    /// Readable replicas, in placement order.
    pub replicas: Vec<ReplicaDescriptor>,
    /// The lease granted: the reader must finish within this many ms of the request.
    pub lease_ttl_ms: u64,
    /// The checksum the writer stored at PutEnd.
    pub checksum: Option<u64>,
    /// Object bytes.
    pub size: u64,
}

/// A batch reply whose items lead to transfers: per item, in input order, and the data-plane grants their
/// descriptors share ([`GrantRef::Shared`](crate::transfer::GrantRef) indexes `grants`; empty on a cluster
/// without a secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantedBatch<T> {
    /// Per item, in input order.
    pub items: Vec<Result<T, ErrorCode>>,
    /// One grant per segment and operation (per [`MAX_GRANT_RANGES`](crate::transfer::MAX_GRANT_RANGES) ranges).
    pub grants: Vec<crate::transfer::Grant>,
}

impl<T> GrantedBatch<T> {
    /// A batch of `items` with no grants (what the service answers; the network edge seals them).
    pub fn new(items: Vec<Result<T, ErrorCode>>) -> Self {
        Self { items, grants: Vec::new() }
    }
}

/// An object as it stands, looked at without leasing it (what `crescent stat` shows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectStat {
    /// Object bytes.
    pub size: u64,
    /// The checksum the writer stored at PutEnd.
    pub checksum: Option<u64>,
    /// Every replica, readable or not, in placement order.
    pub replicas: Vec<ReplicaDescriptor>,
    /// How much longer a read lease holds the object (0 = none): it cannot be removed without force, nor
    /// evicted, until then.
    pub lease_remaining_ms: u64,
    /// Readers holding that lease that have not released it (a reader that vanished holds it to its end).
    pub lease_readers: u32,
    /// How much longer the soft pin lasts (0 = not soft-pinned).
    pub soft_pin_remaining_ms: u64,
    /// Never evicted.
    pub hard_pinned: bool,
    /// A write (PutStart without PutEnd yet) is in flight.
    pub writing: bool,
}

/// What RemoveAll did: how many objects it removed and, of those it left, why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveAllReport {
    /// Objects removed.
    pub removed: u64,
    /// Left because a reader holds a lease (`force` removes them).
    pub skipped_leased: u64,
    /// Left because a write to them is unfinished.
    pub skipped_writing: u64,
    /// Left because a replica is pinned by a replication task.
    pub skipped_pinned: u64,
}

/// What a client may want to know about the cluster before it acts: its mode and how much it can hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterInfo {
    /// Tenants are namespaces with quotas; off, every request is in the default tenant whatever it names.
    pub multi_tenant: bool,
    /// The read lease a reader is granted, in ms.
    pub lease_ttl_ms: u64,
    /// Memory segments mounted (readable).
    pub memory_segments: u32,
    /// Bytes those segments offer.
    pub memory_capacity: u64,
    /// Bytes held by replicas (allocator slack included), and space held out of reuse (`memory_held`).
    pub memory_used: u64,
    /// Of `memory_used`, space already freed but kept out of reuse while a data-plane grant for it may still be
    /// live (a master that seals grants: the write window after an allocation, a grant's life after a
    /// handout); free again within that, at most `write_hold_ms` (12 s by default).
    pub memory_held: u64,
    /// Eviction starts above this share of the capacity.
    pub eviction_high_watermark: f64,
    /// The largest value one segment can hold now: a put at most this large fits without evicting.
    pub largest_free: u64,
    /// Every memory segment mounted, per node (any status), by segment id.
    pub memories: Vec<MemoryTierInfo>,
    /// Every disk-tier segment mounted, per node (any status), by segment id.
    pub disks: Vec<DiskTierInfo>,
}

/// One node's memory segment as `ClusterInfo` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryTierInfo {
    /// The node's placement name.
    pub node: String,
    /// The segment.
    pub segment: SegmentId,
    /// Where the node's transfer server listens.
    pub endpoint: String,
    /// The segment's status.
    pub status: SegmentStatus,
    /// Bytes offered.
    pub capacity: u64,
    /// Bytes held by replicas (allocator slack and held-out space included).
    pub used: u64,
}

/// One node's disk tier as `ClusterInfo` reports it: space from the master's allocator, objects and evictions
/// from its metadata, I/O counters as the node last reported them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskTierInfo {
    /// The node's placement name.
    pub node: String,
    /// The disk segment.
    pub segment: SegmentId,
    /// Where the node's transfer server listens.
    pub endpoint: String,
    /// The segment's status.
    pub status: SegmentStatus,
    /// Bytes the disk offers.
    pub capacity: u64,
    /// Bytes held by disk replicas.
    pub used: u64,
    /// Replicas on the disk.
    pub objects: u64,
    /// Replicas evicted from the disk for room.
    pub evictions: u64,
    /// Reads the node counted.
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Writes (offload copies) the node counted.
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// I/O errors the node counted.
    pub errors: u64,
}

/// One tenant as an administrator sees it (`ListTenants`, multi-tenant mode).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantInfo {
    /// The tenant id.
    pub tenant: String,
    /// The quota its policy asks for, in bytes (0: no policy).
    pub requested_quota: u64,
    /// The quota it gets once policies are scaled to the mounted capacity, in bytes.
    pub effective_quota: u64,
    /// Bytes charged to it (its objects' replicas and the writes in progress).
    pub charged: u64,
    /// Objects it holds.
    pub objects: u64,
    /// Writes are refused (no policy: an orphan, readable and removable only).
    pub admission_closed: bool,
    /// Charged beyond its effective quota (after capacity shrank or its quota was lowered).
    pub over_quota: bool,
    /// It has a quota policy (`SetTenantQuota`); without one it is listed only while it holds objects.
    pub has_policy: bool,
}

/// One client's local SSD registration (`LocalSsdStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalSsdInfo {
    /// The client that registered it.
    pub client: ClientId,
    /// Whether the master may offload objects to it.
    pub enable_offloading: bool,
    /// The capacity the client last reported, in bytes.
    pub total_capacity: u64,
    /// Bytes held by the local-disk replicas the master knows of.
    pub used: u64,
}

/// One page of a key listing (`ListKeysPage`): keys in byte order, and where the next page starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyPage {
    /// Readable keys after the request's `after`, in byte order.
    pub keys: Vec<String>,
    /// The cursor of the next page (the last key here): pass it as `after`. `None`: the listing is complete.
    pub next: Option<String>,
}

/// A master request. Fields mean the same everywhere: `client` is the caller's id, `tenant` the raw tenant
/// string (resolved by the master: `""` = default), `key` a user key, `force` bypasses read leases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum MasterRequest {
    /// Liveness; answers [`MasterResponse::Pong`].
    Ping { client: ClientId },
    /// The cluster's mode and capacity ([`ClusterInfo`]).
    ClusterInfo,
    /// Mount one segment.
    MountSegment { client: ClientId, spec: SegmentSpec },
    /// Re-adopt all of a client's segments after `NEED_REMOUNT`.
    RemountSegments { client: ClientId, specs: Batch<SegmentSpec> },
    /// Unmount a segment (unknown id → OK).
    UnmountSegment { client: ClientId, segment: SegmentId },
    /// Unmount after a grace period; owner only.
    GracefulUnmount { client: ClientId, segment: SegmentId, grace_ms: u64 },
    /// A segment's status.
    SegmentStatus { segment: SegmentId },
    /// Start writing an object.
    PutStart { client: ClientId, tenant: String, key: WireKey, size: u64, config: ReplicateConfig },
    /// Finish a write. `write` names it: the `id` of the first replica descriptor its Start returned, so one
    /// client's overlapping writes of a key never end (or revoke) each other's.
    PutEnd { client: ClientId, tenant: String, key: WireKey, checksum: Option<u64>, write: u64 },
    /// Abandon a write (`write` as in `PutEnd`).
    PutRevoke { client: ClientId, tenant: String, key: WireKey, write: u64 },
    /// Insert or update.
    UpsertStart { client: ClientId, tenant: String, key: WireKey, size: u64, config: ReplicateConfig },
    /// Batch PutStart (`upsert` selects UpsertStart semantics).
    BatchPutStart {
        client: ClientId,
        tenant: String,
        items: Batch<(WireKey, u64)>,
        config: ReplicateConfig,
        group_ids: Option<Batch<String>>,
        upsert: bool,
    },
    /// Batch PutEnd: (key, checksum, write) per item.
    BatchPutEnd { client: ClientId, tenant: String, items: Batch<(WireKey, Option<u64>, u64)> },
    /// Batch PutRevoke: (key, write) per item.
    BatchPutRevoke { client: ClientId, tenant: String, keys: Batch<(WireKey, u64)> },
    /// Readable replicas + lease.
    GetReplicaList { tenant: String, key: WireKey },
    /// An object's state without taking a lease.
    Stat { tenant: String, key: WireKey },
    /// The caller is done reading these objects: its leases on them end (the last reader's release ends the
    /// lease at once, so the object may be removed or evicted). Unknown keys are ignored.
    ReleaseLeases { tenant: String, keys: Batch<WireKey> },
    /// Batch GetReplicaList.
    BatchGetReplicaList { tenant: String, keys: Batch<WireKey> },
    /// Whether an object is readable (grants a lease if so).
    ExistKey { tenant: String, key: WireKey },
    /// Batch ExistKey.
    BatchExistKey { tenant: String, keys: Batch<WireKey> },
    /// Remove one object.
    Remove { tenant: String, key: WireKey, force: bool },
    /// Batch Remove.
    BatchRemove { tenant: String, keys: Batch<WireKey>, force: bool },
    /// Remove everything of a tenant (`None`: every tenant).
    RemoveAll { tenant: Option<String>, force: bool },
    /// Remove keys matching a regex (search semantics).
    RemoveByRegex { tenant: String, pattern: String, force: bool },
    /// List readable keys with a prefix.
    ListKeys { tenant: String, prefix: String, limit: u32 },
    /// The caller could not reach these segments' nodes (connection refused, reset, timed out): the master
    /// stops placing on them and handing out their replicas until their node pings again.
    ReportUnreachable { client: ClientId, segments: Batch<SegmentId> },
    /// Every tenant with a policy or objects ([`MasterResponse::Tenants`]); multi-tenant mode only. (Admin
    /// requests from here on are appended: variants are numbered in order on the wire.)
    ListTenants,
    /// Sets a tenant's requested quota in bytes, registering the tenant (writes to it are admitted).
    SetTenantQuota { tenant: String, bytes: u64 },
    /// Removes an empty tenant's policy and registration: `OBJECT_NOT_FOUND` without a policy,
    /// `TENANT_NOT_EMPTY` while it holds objects.
    RemoveTenant { tenant: String },
    /// Registers the caller's local SSD (`SEGMENT_ALREADY_EXISTS` if it has one).
    RegisterLocalSsd { client: ClientId, enable_offloading: bool },
    /// Drops a client's local SSD registration (none → OK).
    UnregisterLocalSsd { client: ClientId },
    /// Reports a registered local SSD's capacity in bytes (`SEGMENT_NOT_FOUND` without a registration).
    ReportLocalSsd { client: ClientId, capacity: u64 },
    /// Enables or disables offloading to a registered local SSD.
    SetLocalSsdOffloading { client: ClientId, enabled: bool },
    /// One client's local SSD registration, or every one (`None`) ([`MasterResponse::LocalSsd`]).
    LocalSsdStatus { client: Option<ClientId> },
    /// Erases an explicit group whole (every member, or none if one may not go); answers `Count`.
    RemoveGroup { tenant: String, group: String, force: bool },
    /// One page of the readable keys with a prefix, in byte order, strictly after `after` (`None`: from the
    /// start), at most `limit` and at most what one reply frame carries ([`MasterResponse::KeyPage`]).
    ListKeysPage { tenant: String, prefix: String, after: Option<String>, limit: u32 },
    /// A data-plane ticket for the host of `segment` (a cluster that authenticates): what the caller's lanes to
    /// that host prove in their hello ([`MasterResponse::Ticket`]).
    DataTicket { segment: SegmentId },
    /// A piece of the leader's newest published snapshot, for a standby whose own snapshot store has none that
    /// reaches the log (admin only): `id` `None` asks for the newest one's first piece, then the standby names
    /// the id it was given and the `offset` it has reached. Answers [`MasterResponse::SnapshotChunk`], the bytes
    /// in the frame's payload (at most [`SNAPSHOT_CHUNK`] of them).
    FetchSnapshot { id: Option<String>, offset: u64 },
    /// A storage node's disk tier asks for work and reports what it did: the outcomes of the copies it was
    /// given (`done`), the ranges of its disks it could not read (`faults`), its disks' counters; answered with
    /// the next copies, waiting up to `wait_ms` (at most [`DISK_TASK_WAIT_MAX_MS`]) for one to arrive
    /// ([`MasterResponse::DiskTasks`]). Sent on a connection of its own, so the wait delays no other request.
    DiskTasks {
        client: ClientId,
        done: Vec<DiskTaskResult>,
        faults: Vec<DiskFault>,
        counters: Vec<DiskCounters>,
        wait_ms: u32,
    },
    /// Drops the replicas of the caller's own objects (those `client` wrote) whose read lease has expired, as the
    /// original's BatchReplicaClear: with `segment` empty every replica (the object is removed), else only the
    /// complete replicas on segments named `segment` (the object goes with its last replica). A key the caller
    /// did not write, leased, being written, unknown or malformed is skipped. Answers the keys cleared, in input
    /// order ([`MasterResponse::Keys`]).
    BatchReplicaClear { client: ClientId, tenant: String, keys: Batch<WireKey>, segment: String },
    /// CreateCopyTask (the original's): queues a copy of the object to every segment named in `targets` for the
    /// node holding one of its replicas; answers the task's id ([`MasterResponse::TaskId`]).
    CreateCopyTask { tenant: String, key: WireKey, targets: Vec<String> },
    /// CreateMoveTask (the original's): queues a move of the object's replica on segment `source` to segment
    /// `target`, for the node holding `source`; answers the task's id.
    CreateMoveTask { tenant: String, key: WireKey, source: String, target: String },
    /// QueryTask: a task's status ([`MasterResponse::Task`]); `TASK_NOT_FOUND` once pruned or never known.
    QueryTask { id: crate::ids::TaskId },
    /// A storage node's task poll: reports the outcomes of the copies it made and takes the ones queued for it
    /// ([`MasterResponse::ReplicaTasks`]), waiting up to `wait_ms` for one when none is. On a connection of its own.
    ReplicaTasks { client: ClientId, done: Vec<crate::task::ReplicaTaskResult>, wait_ms: u32 },
    /// Starts draining the segments named in `segments` (admin): they take no placements, and every replica on
    /// them is moved elsewhere (to segments named in `targets`, or where placement puts it when empty), at most
    /// `max_concurrency` moves at a time. A job already draining exactly those segments is answered instead of a
    /// new one. Answers the job's id ([`MasterResponse::TaskId`]).
    CreateDrain { segments: Vec<String>, targets: Vec<String>, max_concurrency: u32 },
    /// A drain job's progress ([`MasterResponse::Drain`]).
    QueryDrain { id: crate::ids::TaskId },
    /// Cancels a drain job: moves under way finish, no new ones start, the segments take placements again.
    CancelDrain { id: crate::ids::TaskId },
    /// A prompt's prefix lookup: the longest run of `keys`, from the first, whose objects are readable now, each
    /// leased as GetReplicaList leases it, in one step; the first key that is not (absent, being written, on
    /// unreachable nodes, malformed) ends the run, and nothing after it is looked at or leased. Answers
    /// [`MasterResponse::BatchReplicaList`] with one item per key of the run (all `Ok`), so a read that follows
    /// within the lease needs no second lookup and cannot miss them.
    BatchPrefixLease { tenant: String, keys: Batch<WireKey> },
}

/// Longest a [`MasterRequest::DiskTasks`] waits for work before answering with none.
pub const DISK_TASK_WAIT_MAX_MS: u32 = 1000;

/// Which way a disk task copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DiskTaskKind {
    /// Memory → disk: an object memory eviction chose, kept on the node's disk instead of dropped.
    Offload,
    /// Disk → memory: an object read from disk, brought back to memory.
    Promote,
}

/// A copy between two segments of one storage node, which the master asks of the node that hosts both (no
/// network hop): `length` bytes from `src` at `src_offset` to `dst` at `dst_offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskTask {
    /// The master's id for it (the node reports its outcome under it).
    pub id: u64,
    /// Direction.
    pub kind: DiskTaskKind,
    /// Source segment.
    pub src: SegmentId,
    /// Byte offset in the source.
    pub src_offset: u64,
    /// Destination segment.
    pub dst: SegmentId,
    /// Byte offset in the destination.
    pub dst_offset: u64,
    /// Bytes to copy.
    pub length: u64,
    /// Unix ms after which the node must not start the copy: the master holds the destination's space for the
    /// task until then (and a margin), so a late copy can never land in space given to another object.
    pub deadline_unix_ms: u64,
}

/// What became of a [`DiskTask`]: the crc32c of the bytes copied, or why it failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskTaskResult {
    /// The task's id.
    pub id: u64,
    /// crc32c of the bytes written, or the failure.
    pub outcome: Result<u32, ErrorCode>,
}

/// A range of a disk segment its node failed to read (a disk error): the master drops the replica there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskFault {
    /// The disk segment.
    pub segment: SegmentId,
    /// Start of the unreadable range.
    pub offset: u64,
    /// Its length.
    pub length: u64,
}

/// A disk segment's activity as its node counts it (cumulative since the node started).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskCounters {
    /// The disk segment.
    pub segment: SegmentId,
    /// Reads served (readers' and promotions').
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Writes (offloads).
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// I/O errors.
    pub errors: u64,
}

/// Most snapshot bytes one [`MasterResponse::SnapshotChunk`] carries (well inside a control frame).
pub const SNAPSHOT_CHUNK: usize = 4 << 20;

/// What a [`MasterRequest::FetchSnapshot`] reply says of the snapshot and of the bytes in its frame's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotChunk {
    /// The snapshot's id (name it in the next request).
    pub id: String,
    /// The last oplog batch it includes.
    pub batch_id: u64,
    /// The last oplog sequence it includes.
    pub last_seq: u64,
    /// The producer view in force when it was taken.
    pub producer_view: u64,
    /// Its whole size in bytes.
    pub size: u64,
    /// crc32c of the whole snapshot (check it before use).
    pub crc32c: u32,
    /// Where the payload's bytes start in it.
    pub offset: u64,
}

/// Declares [`MasterOp`], one per [`MasterRequest`] variant of the same name, with its metric name, and
/// [`MasterRequest::op`] mapping each request to it: the list of operations is written once.
macro_rules! master_ops {
    ($($variant:ident => $name:literal,)+) => {
        /// What a [`MasterRequest`] asks for, without its arguments: names it in metrics and logs.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum MasterOp {
            $(
                #[doc = concat!("`", $name, "`")]
                $variant,
            )+
        }

        impl MasterOp {
            /// Every operation, in declaration order ([`MasterOp::index`] is the position here).
            pub const ALL: &'static [MasterOp] = &[$(MasterOp::$variant),+];

            /// The operation's name in metrics (`put_start`, `batch_exist_key`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $(MasterOp::$variant => $name,)+
                }
            }
        }

        impl MasterRequest {
            /// The operation this request asks for.
            pub fn op(&self) -> MasterOp {
                match self {
                    $(MasterRequest::$variant { .. } => MasterOp::$variant,)+
                }
            }
        }
    };
}

master_ops! {
    Ping => "ping",
    ClusterInfo => "cluster_info",
    MountSegment => "mount_segment",
    RemountSegments => "remount_segments",
    UnmountSegment => "unmount_segment",
    GracefulUnmount => "graceful_unmount",
    SegmentStatus => "segment_status",
    PutStart => "put_start",
    PutEnd => "put_end",
    PutRevoke => "put_revoke",
    UpsertStart => "upsert_start",
    BatchPutStart => "batch_put_start",
    BatchPutEnd => "batch_put_end",
    BatchPutRevoke => "batch_put_revoke",
    GetReplicaList => "get_replica_list",
    Stat => "stat",
    ReleaseLeases => "release_leases",
    BatchGetReplicaList => "batch_get_replica_list",
    ExistKey => "exist_key",
    BatchExistKey => "batch_exist_key",
    Remove => "remove",
    BatchRemove => "batch_remove",
    RemoveAll => "remove_all",
    RemoveByRegex => "remove_by_regex",
    ListKeys => "list_keys",
    ReportUnreachable => "report_unreachable",
    ListTenants => "list_tenants",
    SetTenantQuota => "set_tenant_quota",
    RemoveTenant => "remove_tenant",
    RegisterLocalSsd => "register_local_ssd",
    UnregisterLocalSsd => "unregister_local_ssd",
    ReportLocalSsd => "report_local_ssd",
    SetLocalSsdOffloading => "set_local_ssd_offloading",
    LocalSsdStatus => "local_ssd_status",
    RemoveGroup => "remove_group",
    ListKeysPage => "list_keys_page",
    DataTicket => "data_ticket",
    FetchSnapshot => "fetch_snapshot",
    DiskTasks => "disk_tasks",
    BatchReplicaClear => "batch_replica_clear",
    CreateCopyTask => "create_copy_task",
    CreateMoveTask => "create_move_task",
    QueryTask => "query_task",
    ReplicaTasks => "replica_tasks",
    CreateDrain => "create_drain",
    QueryDrain => "query_drain",
    CancelDrain => "cancel_drain",
    BatchPrefixLease => "batch_prefix_lease",
}

impl MasterOp {
    /// The operation's position in [`MasterOp::ALL`] (for per-operation counter arrays).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether this is a batch form (one request for many keys, which keeps the master busy longer).
    pub fn is_batch(self) -> bool {
        matches!(
            self,
            MasterOp::BatchPutStart
                | MasterOp::BatchPutEnd
                | MasterOp::BatchPutRevoke
                | MasterOp::BatchGetReplicaList
                | MasterOp::BatchExistKey
                | MasterOp::BatchRemove
                | MasterOp::BatchReplicaClear
                | MasterOp::BatchPrefixLease
        )
    }
}

/// A successful master reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MasterResponse {
    /// Ping answer (`view_version` is the leader's view; 0 without HA).
    #[allow(missing_docs)]
    Pong { status: ClientStatus, view_version: u64 },
    /// Success with no value.
    Done,
    /// Replica descriptors (PutStart / UpsertStart).
    Replicas(Vec<ReplicaDescriptor>),
    /// GetReplicaList.
    ReplicaList(GetReplicaListResponse),
    /// Stat.
    Stat(ObjectStat),
    /// ClusterInfo.
    ClusterInfo(ClusterInfo),
    /// ExistKey.
    Exists(bool),
    /// A count (RemoveByRegex).
    Count(u64),
    /// Keys (ListKeys; BatchReplicaClear: the keys cleared).
    Keys(Vec<String>),
    /// A segment's status.
    Status(SegmentStatus),
    /// Batch of descriptor lists.
    BatchReplicas(GrantedBatch<Vec<ReplicaDescriptor>>),
    /// Batch of unit results.
    BatchDone(Vec<Result<(), ErrorCode>>),
    /// Batch of replica lists.
    BatchReplicaList(GrantedBatch<GetReplicaListResponse>),
    /// Batch of existence answers.
    BatchExists(Vec<Result<bool, ErrorCode>>),
    /// RemoveAll: removed and skipped objects (appended last: variants are numbered in order on the wire).
    RemovedAll(RemoveAllReport),
    /// ListTenants, sorted by tenant id.
    Tenants(Vec<TenantInfo>),
    /// LocalSsdStatus, sorted by client id.
    LocalSsd(Vec<LocalSsdInfo>),
    /// ListKeysPage.
    KeyPage(KeyPage),
    /// A data-plane ticket (DataTicket).
    Ticket(crate::auth::SealedTicket),
    /// A piece of a snapshot (FetchSnapshot); its bytes are the frame's payload.
    SnapshotChunk(SnapshotChunk),
    /// The copies a storage node is to make (DiskTasks).
    DiskTasks(Vec<DiskTask>),
    /// A task's or a drain job's id (CreateCopyTask, CreateMoveTask, CreateDrain).
    TaskId(crate::ids::TaskId),
    /// QueryTask.
    Task(crate::task::TaskInfo),
    /// The copies and moves a storage node is to make (ReplicaTasks).
    ReplicaTasks(Vec<crate::task::ReplicaTask>),
    /// QueryDrain, CancelDrain.
    Drain(crate::task::DrainInfo),
}

/// The reply to one request.
pub type MasterReply = Result<MasterResponse, ErrorFrame>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Frame;
    use bytes::Bytes;

    #[test]
    fn requests_and_replies_round_trip_through_frames() {
        let req = MasterRequest::BatchPutStart {
            client: ClientId::random(),
            tenant: "t".into(),
            items: Batch(vec![("a".into(), 1), ("b".into(), 2)]),
            config: ReplicateConfig::with_replicas(2),
            group_ids: None,
            upsert: false,
        };
        let f = Frame::encode(9, &req, Bytes::new()).unwrap();
        assert_eq!(f.decode::<MasterRequest>().unwrap().body, req);
        let reply: MasterReply = Ok(MasterResponse::BatchDone(vec![Ok(()), Err(ErrorCode::ObjectNotFound)]));
        let f = Frame::encode(9, &reply, Bytes::new()).unwrap();
        assert_eq!(f.decode::<MasterReply>().unwrap().body, reply);
        let reply: MasterReply =
            Err(ErrorFrame { code: ErrorCode::ObjectNotFound, message: "key \"x\" not found".into() });
        let f = Frame::encode(9, &reply, Bytes::new()).unwrap();
        assert_eq!(f.decode::<MasterReply>().unwrap().body, reply);
    }

    #[test]
    fn admin_requests_are_appended_so_earlier_encodings_keep_their_numbers() {
        // postcard numbers enum variants by position: the variant index is the first byte of the encoding.
        let tag = |r: &MasterRequest| postcard::to_allocvec(r).unwrap()[0];
        let list = MasterRequest::ListKeys { tenant: String::new(), prefix: String::new(), limit: 1 };
        assert_eq!(tag(&list), 24, "ListKeys keeps its number");
        let report = MasterRequest::ReportUnreachable { client: ClientId::random(), segments: Batch(vec![]) };
        assert_eq!(tag(&report), 25);
        assert_eq!(tag(&MasterRequest::ListTenants), 26);
        assert_eq!(tag(&MasterRequest::LocalSsdStatus { client: None }), 33);
        let page = MasterRequest::ListKeysPage { tenant: String::new(), prefix: String::new(), after: None, limit: 1 };
        assert_eq!(tag(&page), 35);
        let ticket = MasterRequest::DataTicket { segment: crate::SegmentId::random() };
        assert_eq!(tag(&ticket), 36);
        let fetch = MasterRequest::FetchSnapshot { id: None, offset: 0 };
        assert_eq!(tag(&fetch), 37);
        let disk = MasterRequest::DiskTasks {
            client: ClientId::random(),
            done: vec![],
            faults: vec![],
            counters: vec![],
            wait_ms: 0,
        };
        assert_eq!(tag(&disk), 38);
        let clear = MasterRequest::BatchReplicaClear {
            client: ClientId::random(),
            tenant: String::new(),
            keys: Batch(vec![]),
            segment: String::new(),
        };
        assert_eq!(tag(&clear), 39);
        let copy =
            MasterRequest::CreateCopyTask { tenant: String::new(), key: WireKey::Key("k".into()), targets: vec![] };
        assert_eq!(tag(&copy), 40);
        assert_eq!(tag(&MasterRequest::CancelDrain { id: crate::TaskId::random() }), 46);
        assert_eq!(tag(&MasterRequest::BatchPrefixLease { tenant: String::new(), keys: Batch(vec![]) }), 47);
        assert_eq!(MasterOp::ALL.len(), 48, "one operation per request");
        let removed: MasterReply = Ok(MasterResponse::RemovedAll(RemoveAllReport::default()));
        assert_eq!(postcard::to_allocvec(&removed).unwrap()[..2], [0, 14], "Ok, then RemovedAll keeps 14");
        let reply: MasterReply = Ok(MasterResponse::Tenants(vec![TenantInfo {
            tenant: "t".into(),
            requested_quota: 10,
            effective_quota: 8,
            charged: 4,
            objects: 1,
            admission_closed: false,
            over_quota: false,
            has_policy: true,
        }]));
        let f = Frame::encode(2, &reply, Bytes::new()).unwrap();
        assert_eq!(f.decode::<MasterReply>().unwrap().body, reply);
        let reply: MasterReply = Ok(MasterResponse::LocalSsd(vec![LocalSsdInfo {
            client: ClientId::random(),
            enable_offloading: true,
            total_capacity: 1 << 30,
            used: 5,
        }]));
        let f = Frame::encode(3, &reply, Bytes::new()).unwrap();
        assert_eq!(f.decode::<MasterReply>().unwrap().body, reply);
        let reply: MasterReply =
            Ok(MasterResponse::KeyPage(KeyPage { keys: vec!["a".into()], next: Some("a".into()) }));
        assert_eq!(postcard::to_allocvec(&reply).unwrap()[..2], [0, 17], "KeyPage is appended after LocalSsd");
        let f = Frame::encode(4, &reply, Bytes::new()).unwrap();
        assert_eq!(f.decode::<MasterReply>().unwrap().body, reply);
    }
}

#[cfg(test)]
mod long_key_tests {
    use super::*;
    use crate::wire::Frame;
    use bytes::Bytes;

    #[test]
    fn an_oversized_key_decodes_as_too_long() {
        let req = MasterRequest::PutStart {
            client: ClientId::random(),
            tenant: String::new(),
            key: WireKey::Key("x".repeat(5_000)),
            size: 1,
            config: ReplicateConfig::default(),
        };
        let f = Frame::encode(3, &req, Bytes::new()).unwrap();
        let back = f.decode::<MasterRequest>().unwrap().body;
        match back {
            MasterRequest::PutStart { key, size, .. } => {
                assert_eq!(key, WireKey::TooLong(5_000));
                assert_eq!(size, 1, "the fields after the key still decode");
            }
            other => panic!("{other:?}"),
        }
    }
}
