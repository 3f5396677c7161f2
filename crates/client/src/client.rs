//! `Client`: put/get and their batch and zero-copy forms over the master connection and the data plane.
//!
//! put  = PutStart (the master places replicas) → write every replica (in parallel) → PutEnd with the crc32c
//!        of the object; any failed replica write → PutRevoke and an error (never a partially visible object).
//! get  = GetReplicaList (grants a lease) → best replica (this process > same host > remote) → read →
//!        verify the crc32c and the lease. A replica whose node fails or does not answer within the request
//!        timeout gives way to the next (that node is not tried again by the same read, and is reported to the
//!        master); a read that outlived its lease fetches the replica list once more and reads again, and only
//!        then fails with `LEASE_EXPIRED`.
//!
//! Every master request is bounded by the request timeout per master address (see [`crate::master`]); a batch
//! over the protocol's `MAX_BATCH` items is refused before anything is sent.

mod prefix;
mod session;

pub use session::{ReadSession, WriteSession};

use crate::error::ClientError;
use crate::master::MasterConnection;
use bytes::Bytes;
use crescent_net::auth::CredentialSource;
use crescent_net::poll::InFlight;
use crescent_net::tls::TlsClient;
use crescent_proto::batch;
use crescent_proto::rpc::GrantedBatch;
use crescent_proto::transfer::{Grant, GrantRef};
use crescent_proto::wire::{Batch, ErrorFrame, MAX_BATCH, PeerRole, WireKey};
use crescent_proto::{
    ClientId, ClusterInfo, DrainInfo, ErrorCode, GetReplicaListResponse, KeyPage, LocalSsdInfo, MasterRequest,
    MasterResponse, ObjectStat, RemoveAllReport, ReplicaDescriptor, ReplicaLocation, ReplicateConfig, SegmentId,
    TaskId, TaskInfo, TenantInfo,
};
use crescent_transfer::{
    BatchRead, BatchWrite, Place, RangeGrant, SegmentRegistry, Tickets, TransferClient, TransferConfig,
};
use futures_util::future::join_all;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Keys a listing asks for per page (the master also bounds a page by its bytes).
const LIST_PAGE_KEYS: u32 = 16_384;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Master address: `host:port` (several separated by commas, tried in turn), or
    /// `etcd://HOST:PORT[,HOST:PORT…]/CLUSTER` (also `etcd://h1:p;h2:p`, the cluster from `CRESCENT_CLUSTER_ID`)
    /// to follow the cluster's leader (see [`crate::master`]).
    pub master: String,
    /// Tenant of every request (`""` = default).
    pub tenant: String,
    /// Replication for `put` when no config is given.
    pub replicate: ReplicateConfig,
    /// Sockets to the master.
    pub master_connections: usize,
    /// How long one master request may take at one master address, dialling included; a request that
    /// times out tries the next address of `master`. [`ClientConfig::with_request_timeout`] also bounds the
    /// data plane's exchanges by it.
    pub request_timeout: Duration,
    /// Data-plane settings (`io_timeout`: one exchange with a storage node, after which a read moves to the
    /// next replica).
    pub transfer: TransferConfig,
    /// This client's host (for replica choice and local-first placement).
    pub host_id: Option<String>,
    /// How long a request polls for its master reply before parking its thread (0 = never). A short poll
    /// avoids a sleeping CPU's wake-up on the reply path (tens of µs on VMs) at the cost of that CPU time.
    pub poll_window: Duration,
    /// What the client proves to the master in a cluster that authenticates (to storage nodes its lanes prove
    /// tickets the master seals for it).
    pub credential: Option<CredentialSource>,
    /// TLS to the master (and, through `transfer.tls`, to storage nodes) in a cluster serving TLS; set both
    /// with [`ClientConfig::with_tls`].
    pub tls: Option<Arc<TlsClient>>,
}

impl ClientConfig {
    /// Defaults for a master at `master`.
    pub fn new(master: impl Into<String>) -> Self {
        Self {
            master: master.into(),
            tenant: String::new(),
            replicate: ReplicateConfig::default(),
            master_connections: 2,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            transfer: TransferConfig {
                io_timeout: DEFAULT_REQUEST_TIMEOUT,
                connect_timeout: DEFAULT_REQUEST_TIMEOUT,
                ..TransferConfig::default()
            },
            host_id: None,
            poll_window: Duration::from_micros(50),
            credential: None,
            tls: None,
        }
    }

    /// Dials the master and storage nodes through TLS verified by `tls` (`None`: plain TCP).
    pub fn with_tls(mut self, tls: Option<Arc<TlsClient>>) -> Self {
        self.transfer.tls = tls.clone();
        self.tls = tls;
        self
    }

    /// Proves `credential` to the master, and tickets the master seals for it to storage nodes (`None`: a
    /// cluster without authentication).
    pub fn with_credential(mut self, credential: Option<CredentialSource>) -> Self {
        self.credential = credential;
        self
    }

    /// Bounds every master request (per master address tried) and every data-plane exchange (connecting to
    /// a storage node, and one request/reply with it) by `timeout`.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self.transfer.io_timeout = timeout;
        self.transfer.connect_timeout = timeout;
        self
    }
}

/// The default [`ClientConfig::request_timeout`]: a stopped master or a stalled storage node costs a request
/// this long, not the 30 s an unbounded TCP exchange might.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

struct Inner {
    /// Reads refused because the bytes did not match the stored checksum.
    checksum_mismatches: std::sync::atomic::AtomicU64,
    /// Objects read from a disk-tier replica (rather than from memory).
    disk_reads: std::sync::atomic::AtomicU64,
    id: ClientId,
    config: ClientConfig,
    master: Arc<MasterConnection>,
    transfer: TransferClient,
    local: SegmentRegistry,
    /// Prefix lookups' replica lists, kept for the reads that follow them.
    prefix: prefix::KeptLookups,
}

/// An asynchronous Crescent client. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("id", &self.inner.id).field("master", &self.inner.config.master).finish()
    }
}

/// Validates a key before it is sent (same rules as the master: empty → `INVALID_PARAMS`, longer than 4096
/// bytes → `INVALID_KEY`), so an invalid key costs no round trip and never inflates a request.
fn check_key(key: &str) -> Result<(), ClientError> {
    crescent_proto::ObjectKey::check(key).map_err(ClientError::from)
}

/// Runs a batch call on the items whose keys are valid (`key` names an item's key) and puts each answer back in
/// its input slot; an invalid key gets its own error and never reaches the master.
async fn per_key<I, T, F, Fut>(
    items: impl IntoIterator<Item = I>,
    key: impl Fn(&I) -> &str,
    call: F,
) -> Vec<Result<T, ClientError>>
where
    F: FnOnce(Vec<I>) -> Fut,
    Fut: std::future::Future<Output = Vec<Result<T, ClientError>>>,
{
    let items: Vec<I> = items.into_iter().collect();
    if let Err(e) = crate::master::check_batch(items.len()) {
        // The whole request would be refused: every item says why, and nothing is sent.
        let n = items.len();
        tracing::debug!(error = %e, "batch refused");
        return (0..n).map(|_| Err(ClientError::BatchTooLarge { items: n, limit: MAX_BATCH })).collect();
    }
    let (slots, valid) = batch::split(items.into_iter().map(|item| check_key(key(&item)).map(|()| item)));
    let answers = if valid.is_empty() { Vec::new() } else { call(valid).await };
    slots.fill(answers, || ClientError::Code(ErrorCode::InternalError))
}

/// How a put treats a key that already holds a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMode {
    /// Keep the existing value (put-if-absent).
    IfAbsent,
    /// Replace it (insert or update).
    Upsert,
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The value is stored on this many replicas (fewer than asked when fewer nodes had room).
    Stored {
        /// Replicas placed and written.
        replicas: usize,
    },
    /// Put-if-absent found the key holding a value, which is kept.
    Existed,
}

/// What became of one object's bytes in a batch put.
#[derive(Debug)]
enum Written {
    /// The master refused to start it: nothing was written.
    NotStarted,
    /// Every replica has its bytes; with the crc32c of the value when a copy summed it on the way (a copy
    /// within this process), so it need not be summed again.
    Done(Option<u32>),
    /// A replica's write failed (the first failure is kept); the object is revoked.
    Failed(ClientError),
}

impl Written {
    /// Records a replica's failure; the first one is the one reported.
    fn fail(&mut self, e: ClientError) {
        if matches!(self, Written::Done(_)) {
            *self = Written::Failed(e);
        }
    }
}

/// `n` copies of one error (a batch call that failed as a whole).
fn all_failed<T>(n: usize, code: ErrorCode) -> Vec<Result<T, ClientError>> {
    (0..n).map(|_| Err(ClientError::Code(code))).collect()
}

/// Whether an End refused with `code` left its write pending at the master (the log would not take it: etcd
/// full or unreachable, no leader): unrevoked, the key would stay half-written — unreadable, refusing puts —
/// until the master reclaims abandoned writes, minutes later. Refusals that say the write is gone are not.
fn left_pending(code: ErrorCode) -> bool {
    !matches!(code, ErrorCode::ObjectNotFound | ErrorCode::IllegalClient | ErrorCode::InvalidWrite)
}

fn checksum(data: &[u8]) -> u64 {
    u64::from(crc32c::crc32c(data))
}

/// Values at least this large have their checksum computed on a blocking thread, overlapping the transfer.
const OFFLOAD_CHECKSUM: usize = 256 << 10;

/// An object's bytes: the caller's borrowed buffer or an owned, shareable one.
enum Value<'a> {
    Borrowed(&'a [u8]),
    Owned(Bytes),
}

impl Value<'_> {
    fn len(&self) -> usize {
        match self {
            Value::Borrowed(s) => s.len(),
            Value::Owned(b) => b.len(),
        }
    }

    /// The crc32c of an owned value (large ones summed on a blocking thread while the writes run); `None` for a
    /// borrowed one, which its first replica's write sums as it sends it.
    async fn owned_checksum(&self) -> Option<u64> {
        match self {
            Value::Owned(b) if b.len() >= OFFLOAD_CHECKSUM => {
                let shared = b.clone();
                Some(tokio::task::spawn_blocking(move || checksum(&shared)).await.unwrap_or_else(|_| checksum(b)))
            }
            Value::Owned(b) => Some(checksum(b)),
            Value::Borrowed(_) => None,
        }
    }

    /// The value's bytes.
    fn bytes(&self) -> &[u8] {
        match self {
            Value::Borrowed(s) => s,
            Value::Owned(b) => b,
        }
    }
}

/// Whether a failed transfer means its node could not be reached at all (refused, reset, closed, timed out):
/// worth telling the master, which then stops placing there until the node pings.
fn node_unreachable(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Transfer(
            crescent_transfer::TransferError::Io(_)
                | crescent_transfer::TransferError::Timeout
                | crescent_transfer::TransferError::Closed
        )
    )
}

/// A storage node a read could not reach, and how it failed.
struct NodeFailure {
    endpoint: String,
    segment: SegmentId,
    code: ErrorCode,
    message: String,
}

/// What one read learned about storage nodes it could not reach: such a node is not tried again by the same
/// read (a stalled node costs the read one timeout, not one per key or per retry), and its segments are
/// reported to the master once.
#[derive(Default)]
struct Unreached {
    /// Every failure, and how many of them were reported already.
    seen: parking_lot::Mutex<(Vec<NodeFailure>, usize)>,
}

impl Unreached {
    /// Records that `endpoint` (hosting `segment`) failed with `e`, if `e` means it cannot be reached.
    fn note(&self, endpoint: &str, segment: SegmentId, e: &ClientError) {
        if node_unreachable(e) {
            let failure =
                NodeFailure { endpoint: endpoint.to_owned(), segment, code: e.code(), message: e.to_string() };
            self.seen.lock().0.push(failure);
        }
    }

    /// Why `endpoint` is skipped, if it failed earlier in this read.
    fn skip(&self, endpoint: &str) -> Option<ClientError> {
        let seen = self.seen.lock();
        let f = seen.0.iter().find(|f| f.endpoint == endpoint)?;
        let message = format!("storage node {endpoint}: {}", f.message);
        Some(ClientError::Refused(ErrorFrame { code: f.code, message }))
    }

    /// The segments noted since the last call.
    fn unreported(&self) -> Vec<SegmentId> {
        let mut seen = self.seen.lock();
        let (all, reported) = &mut *seen;
        let fresh = all[*reported..].iter().map(|f| f.segment).collect();
        *reported = all.len();
        fresh
    }
}

/// Whether a read failed only because what the master gave it ran out: it outlived its lease (it waited on a
/// stalled node, say), or a node refused its grant as expired (clocks apart, or the node has honoured a newer
/// master term's grants: a failover since the list was fetched). The current master's list carries fresh ones.
fn outlived<T>(read: &Result<T, ClientError>) -> bool {
    match read {
        Err(ClientError::LeaseExpired { .. }) => true,
        Err(e) => e.code() == ErrorCode::GrantExpired,
        Ok(_) => false,
    }
}

/// A single read's outcome, or `None` for one more try: a read that [`outlived`] what it was given fetches the
/// replica list again, once.
fn once_more_on_expiry<T>(
    key: &str,
    read: Result<T, ClientError>,
    refetched: &mut bool,
) -> Option<Result<T, ClientError>> {
    if outlived(&read) && !*refetched {
        if let Err(e) = &read {
            tracing::debug!(key, error = %e, "the read outlived its lease or grant; fetching the replica list again");
        }
        *refetched = true;
        return None;
    }
    Some(read)
}

/// The error of a read that outlived the lease `list` granted.
fn lease_expired(key: &str, list: &GetReplicaListResponse) -> ClientError {
    ClientError::LeaseExpired { key: key.to_owned(), lease_ms: list.lease_ttl_ms }
}

/// The first `list.size` bytes of `buf`, or why the object does not fit.
fn fit<'b>(list: &GetReplicaListResponse, buf: &'b mut [u8]) -> Result<&'b mut [u8], ClientError> {
    match usize::try_from(list.size) {
        Err(_) => Err(ClientError::Code(ErrorCode::BufferOverflow)),
        Ok(n) if n > buf.len() => Err(ClientError::BufferTooSmall { need: list.size, have: buf.len() }),
        Ok(n) => Ok(&mut buf[..n]),
    }
}

/// Replica location for the data plane: `(endpoint, segment, offset, length, place)`, the place carrying the
/// master's grant for the range (its own, or one of `grants`, the grants of the batch reply `d` came in).
pub fn address<'a>(
    d: &'a ReplicaDescriptor,
    grants: &[Arc<Grant>],
) -> Option<(&'a str, crescent_proto::SegmentId, u64, u64, Place)> {
    match &d.location {
        // A disk replica is read like a memory one: its node reads the range off its disk for the transfer.
        ReplicaLocation::Memory { segment_id, offset, length, endpoint }
        | ReplicaLocation::Nof { segment_id, offset, length, endpoint }
        | ReplicaLocation::Disk { segment_id, offset, length, endpoint } => {
            let grant = match &d.grant {
                None => None,
                Some(GrantRef::Own(g)) => Some(RangeGrant::own(g.clone())),
                // A range index past `u16` is no range of a grant (a node would refuse it): sent without one.
                Some(GrantRef::Shared { grant, range }) => grants
                    .get(*grant as usize)
                    .zip(u16::try_from(*range).ok())
                    .map(|(g, range)| RangeGrant::new(g.clone(), range)),
            };
            Some((endpoint, *segment_id, *offset, *length, Place::new(*segment_id, grant)))
        }
        ReplicaLocation::LocalDisk { .. } => None,
    }
}

impl Client {
    /// A client talking to `config.master` (connections are dialled lazily).
    pub fn new(config: ClientConfig) -> Self {
        Self::with_local_segments(config, SegmentRegistry::default())
    }

    /// A client that also hosts `local` segments (embedded mode): replicas there are read and written by
    /// memcpy.
    pub fn with_local_segments(config: ClientConfig, local: SegmentRegistry) -> Self {
        let id = ClientId::random();
        // One count of exchanges in flight over both planes: a wait polls only while it is the client's only one.
        let inflight = Arc::new(InFlight::default());
        let master = MasterConnection::new(
            &config.master,
            id,
            PeerRole::Client,
            config.master_connections,
            config.request_timeout,
        )
        .with_poll_window(config.poll_window)
        .with_credential(config.credential.clone())
        .with_tls(config.tls.clone())
        .with_in_flight(inflight.clone());
        let master = Arc::new(master);
        let tickets = config.credential.clone().map(|credential| {
            Arc::new(crate::tickets::MasterTickets::new(master.clone(), credential, id)) as Arc<dyn Tickets>
        });
        // The data plane's hello names this client: the master seals its grants and tickets for it.
        let transfer_config = TransferConfig { client_id: Some(id), tickets, ..config.transfer.clone() };
        let transfer = TransferClient::with_in_flight(transfer_config, local.clone(), inflight);
        let checksum_mismatches = std::sync::atomic::AtomicU64::new(0);
        let disk_reads = std::sync::atomic::AtomicU64::new(0);
        let prefix = prefix::KeptLookups::default();
        Self { inner: Arc::new(Inner { checksum_mismatches, disk_reads, id, config, master, transfer, local, prefix }) }
    }

    /// Requests this client has sent its master so far (lookups, writes' starts and ends, lease releases).
    pub fn master_requests(&self) -> u64 {
        self.inner.master.requests_sent()
    }

    /// This client's id.
    pub fn id(&self) -> ClientId {
        self.inner.id
    }

    /// Reads refused so far because their bytes did not match the stored checksum.
    pub fn checksum_mismatches(&self) -> u64 {
        self.inner.checksum_mismatches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Objects read so far from a disk-tier replica: a read a memory replica could serve never counts, so a
    /// count that stays put across a read shows the read was served from memory.
    pub fn disk_reads(&self) -> u64 {
        self.inner.disk_reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts a verified read of `d` when it is a disk replica.
    fn count_read(&self, d: &ReplicaDescriptor) {
        if d.location.is_disk() {
            self.inner.disk_reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The data-plane client (diagnostics: open connections per peer).
    pub fn transfer(&self) -> &TransferClient {
        &self.inner.transfer
    }

    /// The master connection (for admin-style calls).
    pub fn master(&self) -> &MasterConnection {
        &self.inner.master
    }

    fn tenant(&self) -> String {
        self.inner.config.tenant.clone()
    }

    fn with_host(&self, cfg: &ReplicateConfig) -> ReplicateConfig {
        let mut c = cfg.clone();
        if c.host_id.is_none() {
            c.host_id = self.inner.config.host_id.clone();
        }
        c
    }

    /// Stores `value` under `key` with the default replication. An existing key is left as it is and reported
    /// as success (put-if-absent).
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<(), ClientError> {
        let cfg = self.inner.config.replicate.clone();
        self.put_from(key, value, &cfg).await
    }

    /// Sends a batch request and returns its per-item answers, exactly `n` of them; a failed call or a reply of
    /// another shape is that one error (the caller spreads it over every item).
    async fn batch_call<T>(
        &self,
        req: &MasterRequest,
        n: usize,
        pick: impl FnOnce(MasterResponse) -> Option<Vec<Result<T, ErrorCode>>>,
    ) -> Result<Vec<Result<T, ErrorCode>>, ErrorCode> {
        match self.inner.master.call(req).await {
            Ok(r) => pick(r).filter(|v| v.len() == n).ok_or(ErrorCode::InternalError),
            Err(e) => Err(e.code()),
        }
    }

    /// [`Client::batch_call`] for a batch reply with data-plane grants: its items and its grants.
    async fn granted_call<T>(
        &self,
        req: &MasterRequest,
        n: usize,
        pick: impl FnOnce(MasterResponse) -> Option<GrantedBatch<T>>,
    ) -> Result<(Vec<Result<T, ErrorCode>>, Vec<Arc<Grant>>), ErrorCode> {
        match self.inner.master.call(req).await {
            Ok(r) => pick(r)
                .filter(|b| b.items.len() == n)
                .map(|b| (b.items, b.grants.into_iter().map(Arc::new).collect()))
                .ok_or(ErrorCode::InternalError),
            Err(e) => Err(e.code()),
        }
    }

    /// Stores `value` (the caller's buffer, sent without copying) under `key` if the key is free; an existing
    /// key keeps its value and this reports success (put-if-absent, the original's semantics).
    pub async fn put_from(&self, key: &str, value: &[u8], cfg: &ReplicateConfig) -> Result<(), ClientError> {
        self.put_with(key, value, cfg, PutMode::IfAbsent).await.map(|_| ())
    }

    /// Stores an owned `value` under `key` (put-if-absent) without copying it; large values are striped from
    /// several tasks and their checksum is computed while the bytes are in flight.
    pub async fn put_bytes(&self, key: &str, value: Bytes, cfg: &ReplicateConfig) -> Result<(), ClientError> {
        self.put_value(key, Value::Owned(value), cfg, PutMode::IfAbsent).await.map(|_| ())
    }

    /// Stores an owned `value` under `key`, replacing any value it held, without copying it.
    pub async fn upsert_bytes(&self, key: &str, value: Bytes, cfg: &ReplicateConfig) -> Result<(), ClientError> {
        self.put_value(key, Value::Owned(value), cfg, PutMode::Upsert).await.map(|_| ())
    }

    /// Stores `value` under `key`, replacing any value it held (insert or update).
    pub async fn upsert_from(&self, key: &str, value: &[u8], cfg: &ReplicateConfig) -> Result<(), ClientError> {
        self.put_with(key, value, cfg, PutMode::Upsert).await.map(|_| ())
    }

    /// Stores `value` under `key` as `mode` says, and tells what happened (how many replicas were placed,
    /// or that the key already existed).
    pub async fn put_with(
        &self,
        key: &str,
        value: &[u8],
        cfg: &ReplicateConfig,
        mode: PutMode,
    ) -> Result<PutOutcome, ClientError> {
        self.put_value(key, Value::Borrowed(value), cfg, mode).await
    }

    async fn put_value(
        &self,
        key: &str,
        value: Value<'_>,
        cfg: &ReplicateConfig,
        mode: PutMode,
    ) -> Result<PutOutcome, ClientError> {
        check_key(key)?;
        let (tenant, key_w, size, config) =
            (self.tenant(), WireKey::from(key), value.len() as u64, self.with_host(cfg));
        let req = match mode {
            PutMode::IfAbsent => MasterRequest::PutStart { client: self.inner.id, tenant, key: key_w, size, config },
            PutMode::Upsert => MasterRequest::UpsertStart { client: self.inner.id, tenant, key: key_w, size, config },
        };
        let replicas = match self.inner.master.call(&req).await {
            Ok(MasterResponse::Replicas(r)) => r,
            Ok(_) => return Err(ErrorCode::InternalError.into()),
            Err(e) if e.code() == ErrorCode::ObjectAlreadyExists => return Ok(PutOutcome::Existed),
            Err(e) => return Err(e),
        };
        let write = crescent_proto::write_id(&replicas);
        let (written, owned_crc) = tokio::join!(self.write_replicas(&value, &replicas, &[]), value.owned_checksum());
        let sent_crc = match written {
            Ok(crc) => crc,
            Err((err, unreachable)) => {
                self.revoke(key, write).await;
                self.report_unreachable(unreachable).await;
                return Err(err);
            }
        };
        let crc = owned_crc.or(sent_crc.map(u64::from)).unwrap_or_else(|| checksum(value.bytes()));
        let end = MasterRequest::PutEnd {
            client: self.inner.id,
            tenant: self.tenant(),
            key: WireKey::from(key),
            checksum: Some(crc),
            write,
        };
        if let Err(e) = self.inner.master.call(&end).await {
            if left_pending(e.code()) {
                self.revoke(key, write).await;
            }
            return Err(e);
        }
        Ok(PutOutcome::Stored { replicas: replicas.len() })
    }

    /// Gives up write `write` of `key` (best effort: a failure is logged).
    async fn revoke(&self, key: &str, write: u64) {
        let revoke =
            MasterRequest::PutRevoke { client: self.inner.id, tenant: self.tenant(), key: WireKey::from(key), write };
        if let Err(e) = self.inner.master.call(&revoke).await {
            tracing::warn!(%key, error = %e, "revoking an unfinished write failed");
        }
    }

    /// Writes `value` to every replica concurrently (`grants`: those of the batch reply the replicas came in,
    /// which their descriptors may name); the first failure is returned, with the segments whose nodes could
    /// not be reached. For a borrowed value, also returns its crc32c as summed by the first
    /// replica's write while sending it.
    async fn write_replicas(
        &self,
        value: &Value<'_>,
        replicas: &[ReplicaDescriptor],
        grants: &[Arc<Grant>],
    ) -> Result<Option<u32>, (ClientError, Vec<crescent_proto::SegmentId>)> {
        let writes = replicas.iter().enumerate().map(|(i, d)| async move {
            let Some((endpoint, segment, offset, _, place)) = address(d, grants) else {
                return Err((ClientError::Code(ErrorCode::InvalidReplica), None));
            };
            let t = &self.inner.transfer;
            match value {
                Value::Owned(b) => t.write(endpoint, place, offset, b.clone()).await.map(|()| None),
                Value::Borrowed(s) if i == 0 => t.write_from_checksummed(endpoint, place, offset, s).await.map(Some),
                Value::Borrowed(s) => t.write_from(endpoint, place, offset, s).await.map(|()| None),
            }
            .map_err(|e| (ClientError::from(e), Some(segment)))
        });
        let (mut crc, mut failed, mut unreachable) = (None, None, Vec::new());
        for written in join_all(writes).await {
            match written {
                Ok(c) => crc = crc.or(c),
                Err((e, segment)) => {
                    if let Some(seg) = segment.filter(|_| node_unreachable(&e)) {
                        unreachable.push(seg);
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            None => Ok(crc),
            Some(e) => Err((e, unreachable)),
        }
    }

    /// Tells the master which segments' nodes this client could not reach (best effort: a failure is logged).
    async fn report_unreachable(&self, mut segments: Vec<crescent_proto::SegmentId>) {
        if segments.is_empty() {
            return;
        }
        segments.sort_unstable();
        segments.dedup();
        let req = MasterRequest::ReportUnreachable { client: self.inner.id, segments: Batch(segments) };
        if let Err(e) = self.inner.master.call(&req).await {
            tracing::warn!(error = %e, "could not report unreachable nodes to the master");
        }
    }

    /// Stores many objects: one batched PutStart, parallel writes, one batched PutEnd. Results per key, in
    /// input order; one bad key never fails the others. Existing keys keep their values (put-if-absent).
    pub async fn batch_put_from(&self, items: &[(&str, &[u8])], cfg: &ReplicateConfig) -> Vec<Result<(), ClientError>> {
        self.batch_put_with(items, cfg, PutMode::IfAbsent).await
    }

    /// Like [`Client::batch_put_from`], replacing the values of existing keys (insert or update).
    pub async fn batch_upsert_from(
        &self,
        items: &[(&str, &[u8])],
        cfg: &ReplicateConfig,
    ) -> Vec<Result<(), ClientError>> {
        self.batch_put_with(items, cfg, PutMode::Upsert).await
    }

    async fn batch_put_with(
        &self,
        items: &[(&str, &[u8])],
        cfg: &ReplicateConfig,
        mode: PutMode,
    ) -> Vec<Result<(), ClientError>> {
        per_key(items.iter().copied(), |(k, _)| k, |valid| async move { self.batch_put_valid(&valid, cfg, mode).await })
            .await
    }

    async fn batch_put_valid(
        &self,
        items: &[(&str, &[u8])],
        cfg: &ReplicateConfig,
        mode: PutMode,
    ) -> Vec<Result<(), ClientError>> {
        let req = MasterRequest::BatchPutStart {
            client: self.inner.id,
            tenant: self.tenant(),
            items: Batch(items.iter().map(|(k, v)| (WireKey::from(*k), v.len() as u64)).collect()),
            config: self.with_host(cfg),
            group_ids: None,
            upsert: mode == PutMode::Upsert,
        };
        let pick = |r| if let MasterResponse::BatchReplicas(v) = r { Some(v) } else { None };
        let (starts, grants) = match self.granted_call(&req, items.len(), pick).await {
            Ok(v) => v,
            Err(code) => return all_failed(items.len(), code),
        };
        let (written, unreachable) = self.write_batch_replicas(items, &starts, &grants).await;
        let mut out: Vec<Result<(), ClientError>> = Vec::with_capacity(items.len());
        let mut to_end = Vec::new();
        let mut to_revoke = Vec::new();
        for (i, (start, w)) in starts.into_iter().zip(written).enumerate() {
            match (start, w) {
                (Err(ErrorCode::ObjectAlreadyExists), _) => out.push(Ok(())),
                (Err(c), _) => out.push(Err(c.into())),
                (Ok(d), Written::Done(crc)) => {
                    to_end.push((i, crescent_proto::write_id(&d), crc));
                    out.push(Ok(()));
                }
                (Ok(d), Written::Failed(e)) => {
                    to_revoke.push((i, crescent_proto::write_id(&d)));
                    out.push(Err(e));
                }
                (Ok(_), Written::NotStarted) => out.push(Err(ErrorCode::InternalError.into())),
            }
        }
        if !to_revoke.is_empty() {
            let keys = Batch(to_revoke.iter().map(|&(i, write)| (WireKey::from(items[i].0), write)).collect());
            let req = MasterRequest::BatchPutRevoke { client: self.inner.id, tenant: self.tenant(), keys };
            if let Err(e) = self.inner.master.call(&req).await {
                tracing::warn!(error = %e, "batch revoke failed");
            }
        }
        self.report_unreachable(unreachable).await;
        if !to_end.is_empty() {
            let ends = Batch(
                to_end
                    .iter()
                    .map(|&(i, write, crc)| {
                        let crc = crc.map_or_else(|| checksum(items[i].1), u64::from);
                        (WireKey::from(items[i].0), Some(crc), write)
                    })
                    .collect(),
            );
            let req = MasterRequest::BatchPutEnd { client: self.inner.id, tenant: self.tenant(), items: ends };
            let pick = |r| if let MasterResponse::BatchDone(v) = r { Some(v) } else { None };
            let ends: Vec<Result<(), ErrorCode>> = match self.batch_call(&req, to_end.len(), pick).await {
                Ok(v) => v,
                Err(code) => vec![Err(code); to_end.len()],
            };
            let mut pending = Vec::new();
            for (&(i, write, _), r) in to_end.iter().zip(ends) {
                if let Err(c) = r {
                    if left_pending(c) {
                        pending.push((WireKey::from(items[i].0), write));
                    }
                    out[i] = Err(c.into());
                }
            }
            if !pending.is_empty() {
                let req = MasterRequest::BatchPutRevoke {
                    client: self.inner.id,
                    tenant: self.tenant(),
                    keys: Batch(pending),
                };
                if let Err(e) = self.inner.master.call(&req).await {
                    tracing::warn!(error = %e, "revoking unfinished writes failed");
                }
            }
        }
        out
    }

    /// Writes the replicas of every started object of a batch: the writes to each storage node are pipelined
    /// over its lanes (`TransferClient::write_batch`), nodes in parallel. Per object, what became of its bytes.
    async fn write_batch_replicas(
        &self,
        items: &[(&str, &[u8])],
        starts: &[Result<Vec<ReplicaDescriptor>, ErrorCode>],
        grants: &[Arc<Grant>],
    ) -> (Vec<Written>, Vec<crescent_proto::SegmentId>) {
        let mut written: Vec<Written> =
            starts.iter().map(|s| if s.is_ok() { Written::Done(None) } else { Written::NotStarted }).collect();
        let mut by_peer: HashMap<&str, (Vec<usize>, Vec<BatchWrite<'_>>)> = HashMap::new();
        for (i, ((_, data), start)) in items.iter().zip(starts).enumerate() {
            for d in start.iter().flatten() {
                match address(d, grants) {
                    Some((endpoint, segment, offset, _, place)) => {
                        let (idx, writes) = by_peer.entry(endpoint).or_default();
                        idx.push(i);
                        writes.push(BatchWrite { segment, grant: place.grant, offset, data });
                    }
                    None => written[i].fail(ErrorCode::InvalidReplica.into()),
                }
            }
        }
        let t = &self.inner.transfer;
        let per_peer = by_peer.iter().map(|(endpoint, (idx, writes))| async move {
            idx.iter().copied().zip(writes).zip(t.write_batch_summed(endpoint, writes).await).collect::<Vec<_>>()
        });
        let mut unreachable = Vec::new();
        for ((i, w), r) in join_all(per_peer).await.into_iter().flatten() {
            let Some(slot) = written.get_mut(i) else { continue };
            match r {
                // Any replica's sum is the value's (the same bytes); the first one kept.
                Ok(Some(crc)) => {
                    if let Written::Done(sum @ None) = slot {
                        *sum = Some(crc);
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    let e = ClientError::from(e);
                    if node_unreachable(&e) {
                        unreachable.push(w.segment);
                    }
                    slot.fail(e);
                }
            }
        }
        (written, unreachable)
    }

    /// The replica list of an object, and a read lease on it that the caller must release
    /// ([`Client::release_leases`]) once it has the bytes.
    async fn replica_list(&self, key: &str) -> Result<GetReplicaListResponse, ClientError> {
        check_key(key)?;
        let req = MasterRequest::GetReplicaList { tenant: self.tenant(), key: WireKey::from(key) };
        self.inner
            .master
            .call_expect(&req, |r| if let MasterResponse::ReplicaList(l) = r { Some(l) } else { None })
            .await
    }

    /// An object's size, checksum, replicas, lease and pins, without leasing it.
    pub async fn stat(&self, key: &str) -> Result<ObjectStat, ClientError> {
        check_key(key)?;
        let req = MasterRequest::Stat { tenant: self.tenant(), key: WireKey::from(key) };
        self.inner.master.call_expect(&req, |r| if let MasterResponse::Stat(s) = r { Some(s) } else { None }).await
    }

    /// The object's size.
    pub async fn get_size(&self, key: &str) -> Result<u64, ClientError> {
        Ok(self.stat(key).await?.size)
    }

    /// Tells the master this client is done reading `keys`, so their read leases end rather than run to their
    /// deadline (an object nobody reads any more can be removed or evicted at once). The release rides with
    /// this client's next master request (or leaves on its own within milliseconds; [`Client::flush`] sends it
    /// at once); nobody waits for its answer: a lost release only leaves a lease to run out.
    pub async fn release_leases(&self, keys: &[&str]) {
        if keys.is_empty() {
            return;
        }
        let keys = Batch(keys.iter().map(|k| WireKey::from(*k)).collect());
        let req = MasterRequest::ReleaseLeases { tenant: self.tenant(), keys };
        if let Err(e) = self.inner.master.send_deferred(&req).await {
            tracing::debug!(error = %e, "lease release not sent");
        }
    }

    /// Sends what this client deferred (lease releases) now, e.g. before the process exits.
    pub async fn flush(&self) -> Result<(), ClientError> {
        self.inner.master.flush().await
    }

    /// Reads an object into a new buffer (striped over the node's lanes, checksummed as stripes land).
    ///
    /// A replica whose node fails or does not answer within the request timeout gives way to the next one; a
    /// read that outlives its lease (it waited on a stalled node, say), or whose grant a node refuses as expired
    /// (a master failover since), fetches the replica list once more and reads again rather than failing with
    /// `LEASE_EXPIRED` or `GRANT_EXPIRED`.
    pub async fn get(&self, key: &str) -> Result<Vec<u8>, ClientError> {
        let unreached = Unreached::default();
        let mut refetched = false;
        loop {
            let started = Instant::now();
            let list = self.replica_list(key).await?;
            let read = self.read_owned(key, &list, started, &unreached).await;
            if let Some(r) = self.settle_read(key, read, &unreached, &mut refetched).await {
                return r;
            }
        }
    }

    /// Reads the best readable replica into a new buffer (falling back to the next on a transfer error).
    async fn read_owned(
        &self,
        key: &str,
        list: &GetReplicaListResponse,
        started: Instant,
        unreached: &Unreached,
    ) -> Result<Vec<u8>, ClientError> {
        let mut last = ClientError::Code(ErrorCode::ObjectNotFound);
        for d in self.ranked(list) {
            let Some((endpoint, segment, offset, _, place)) = address(d, &[]) else { continue };
            if let Some(e) = unreached.skip(endpoint) {
                last = e;
                continue;
            }
            if started.elapsed() > Duration::from_millis(list.lease_ttl_ms) {
                return Err(lease_expired(key, list));
            }
            match self.inner.transfer.read_checksummed(endpoint, place, offset, list.size).await {
                Ok((bytes, crc)) => {
                    self.verify(key, list, started, u64::from(crc))?;
                    self.count_read(d);
                    return Ok(Vec::from(bytes));
                }
                Err(e) => {
                    last = e.into();
                    unreached.note(endpoint, segment, &last);
                }
            }
        }
        Err(last)
    }

    /// A finished read is good only within its lease and with the stored checksum.
    fn verify(&self, key: &str, list: &GetReplicaListResponse, started: Instant, crc: u64) -> Result<(), ClientError> {
        if started.elapsed() > Duration::from_millis(list.lease_ttl_ms) {
            return Err(lease_expired(key, list));
        }
        if list.checksum.is_some_and(|c| c != crc) {
            self.inner.checksum_mismatches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(ClientError::ChecksumMismatch { key: key.to_owned() });
        }
        Ok(())
    }

    /// Reads an object into the caller's buffer; returns its size. Replicas and leases as [`Client::get`].
    pub async fn get_into(&self, key: &str, buf: &mut [u8]) -> Result<usize, ClientError> {
        let unreached = Unreached::default();
        let mut refetched = false;
        loop {
            let started = Instant::now();
            let list = self.replica_list(key).await?;
            let read = self.read_fitted(key, &list, buf, started, &unreached).await;
            if let Some(r) = self.settle_read(key, read, &unreached, &mut refetched).await {
                return r;
            }
        }
    }

    /// Reads an object into a buffer `alloc` makes once the object's size is known (`alloc(size)`, again if the
    /// read is retried under a new lease), so a caller that owns its own kind of buffer (a Python `bytes`, say)
    /// gets the bytes landed in it with no copy. Returns the buffer and the object's size; an error of `alloc`
    /// is the read's. Replicas and leases as [`Client::get`].
    pub async fn get_with<B: AsMut<[u8]>>(
        &self,
        key: &str,
        mut alloc: impl FnMut(u64) -> Result<B, ClientError>,
    ) -> Result<(B, usize), ClientError> {
        let unreached = Unreached::default();
        let mut refetched = false;
        loop {
            let started = Instant::now();
            let list = self.replica_list(key).await?;
            let read = match alloc(list.size) {
                Ok(mut buf) => self.read_fitted(key, &list, buf.as_mut(), started, &unreached).await.map(|n| (buf, n)),
                Err(e) => Err(e),
            };
            if let Some(r) = self.settle_read(key, read, &unreached, &mut refetched).await {
                return r;
            }
        }
    }

    /// Ends one attempt of a single-key read: its lease released, the nodes it could not reach reported; then
    /// its result, or `None` to look the key up and read once more (the read outlived its lease, the first time).
    async fn settle_read<T>(
        &self,
        key: &str,
        read: Result<T, ClientError>,
        unreached: &Unreached,
        refetched: &mut bool,
    ) -> Option<Result<T, ClientError>> {
        self.release_leases(&[key]).await;
        self.report_unreachable(unreached.unreported()).await;
        once_more_on_expiry(key, read, refetched)
    }

    /// Reads the object `list` describes into the start of `buf` (which must hold it); returns its size.
    async fn read_fitted(
        &self,
        key: &str,
        list: &GetReplicaListResponse,
        buf: &mut [u8],
        started: Instant,
        unreached: &Unreached,
    ) -> Result<usize, ClientError> {
        let buf = fit(list, buf)?;
        let n = buf.len();
        self.read_replica(key, list, &[], buf, started, unreached).await.map(|()| n)
    }

    /// Orders replicas: this process's segments, then the same host, then remote; disk replicas after every
    /// memory one (a disk read costs the node an SSD read first).
    fn ranked<'a>(&self, list: &'a GetReplicaListResponse) -> Vec<&'a ReplicaDescriptor> {
        let host = self.inner.config.host_id.as_deref();
        let mut v: Vec<(u8, &ReplicaDescriptor)> = list
            .replicas
            .iter()
            .filter_map(|d| {
                let (endpoint, segment, _, _, _) = address(d, &[])?;
                let rank = if d.location.is_disk() {
                    3
                } else if self.inner.local.get(&segment).is_some() {
                    0
                } else if host.is_some_and(|h| endpoint.rsplit_once(':').is_some_and(|(ip, _)| ip == h)) {
                    1
                } else {
                    2
                };
                Some((rank, d))
            })
            .collect();
        v.sort_by_key(|(r, _)| *r);
        v.into_iter().map(|(_, d)| d).collect()
    }

    /// Reads the best readable replica (falling back to the next on a transfer error, skipping nodes this
    /// read could not reach before) and verifies it. `grants` are those of the batch reply `list` came in.
    #[allow(clippy::too_many_arguments)] // a read's object, its grants, its buffer and the read's state
    async fn read_replica(
        &self,
        key: &str,
        list: &GetReplicaListResponse,
        grants: &[Arc<Grant>],
        buf: &mut [u8],
        started: Instant,
        unreached: &Unreached,
    ) -> Result<(), ClientError> {
        let mut last = ClientError::Code(ErrorCode::ObjectNotFound);
        for d in self.ranked(list) {
            let Some((endpoint, segment, offset, _, place)) = address(d, grants) else { continue };
            if let Some(e) = unreached.skip(endpoint) {
                last = e;
                continue;
            }
            // A lease already over: reading would only be refused at the end.
            if started.elapsed() > Duration::from_millis(list.lease_ttl_ms) {
                return Err(lease_expired(key, list));
            }
            match self.inner.transfer.read_into_checksummed(endpoint, place, offset, buf).await {
                Ok(crc) => {
                    let verified = self.verify(key, list, started, u64::from(crc));
                    if verified.is_ok() {
                        self.count_read(d);
                    }
                    return verified;
                }
                Err(e) => {
                    last = e.into();
                    unreached.note(endpoint, segment, &last);
                }
            }
        }
        Err(last)
    }

    /// Reads many objects into the caller's buffers; results per key (object size), in input order. Replicas
    /// and leases as [`Client::get`]: the keys whose reads outlived their leases are looked up again in one
    /// batch and read once more.
    pub async fn batch_get_into(&self, items: &mut [(&str, &mut [u8])]) -> Vec<Result<usize, ClientError>> {
        let items = items.iter_mut().map(|(k, buf)| (*k, &mut **buf));
        per_key(items, |(k, _)| k, |mut valid| async move { self.batch_get_valid(&mut valid).await }).await
    }

    async fn batch_get_valid(&self, items: &mut [(&str, &mut [u8])]) -> Vec<Result<usize, ClientError>> {
        let unreached = Unreached::default();
        let mut out = self.batch_read_once(items, &unreached).await;
        // As for a single read (`once_more_on_expiry`): the reads that outlived their leases or grants are looked
        // up again, once.
        let expired: Vec<usize> = (0..out.len()).filter(|&i| outlived(&out[i])).collect();
        if !expired.is_empty() {
            tracing::debug!(
                keys = expired.len(),
                "reads outlived their leases or grants; fetching their replica lists again"
            );
            let mut chosen: Vec<(&str, &mut [u8])> = Vec::with_capacity(expired.len());
            let mut want = expired.iter().copied().peekable();
            for (i, (key, buf)) in items.iter_mut().enumerate() {
                if want.next_if_eq(&i).is_some() {
                    chosen.push((*key, &mut **buf));
                }
            }
            let again = self.batch_read_once(&mut chosen, &unreached).await;
            for (i, r) in expired.into_iter().zip(again) {
                out[i] = r;
            }
        }
        self.report_unreachable(unreached.unreported()).await;
        out
    }

    /// One pass of a batch read: one batched replica-list request (none when a prefix lookup kept the lists of
    /// every key), the reads, one batched lease release.
    async fn batch_read_once(
        &self,
        items: &mut [(&str, &mut [u8])],
        unreached: &Unreached,
    ) -> Vec<Result<usize, ClientError>> {
        let items_keys: Vec<&str> = items.iter().map(|(k, _)| *k).collect();
        let items_keys = &items_keys;
        let (started, lists, grants) = match self.inner.prefix.take(items_keys) {
            // Leases run from the lookup's request: reads judge expiry against it.
            Some(kept) => (kept.sent, kept.lists, kept.grants),
            None => {
                let started = Instant::now();
                let keys = Batch(items.iter().map(|(k, _)| WireKey::from(*k)).collect());
                let req = MasterRequest::BatchGetReplicaList { tenant: self.tenant(), keys };
                let pick = |r| if let MasterResponse::BatchReplicaList(v) = r { Some(v) } else { None };
                match self.granted_call(&req, items.len(), pick).await {
                    Ok((lists, grants)) => (started, lists, grants),
                    Err(code) => return all_failed(items.len(), code),
                }
            }
        };
        // Each object's first-choice replica, read per storage node in one batch (`read_batch_checksummed`: the
        // ranges in this process's segments copied together, over both cores, the others in pipelined runs);
        // an object whose batched read failed, or with no replica to try first, goes through `read_replica`,
        // which also falls back to the other replicas.
        let mut out: Vec<Option<Result<usize, ClientError>>> = Vec::new();
        out.resize_with(items.len(), || None);
        let mut by_peer: HashMap<&str, Vec<(usize, BatchRead<'_>)>> = HashMap::new();
        // Whether an object's pipelined read is of a disk replica (counted once verified).
        let mut from_disk = vec![false; items.len()];
        let mut single = Vec::new();
        for (i, ((key, buf), list)) in items.iter_mut().zip(lists.iter()).enumerate() {
            let list = match list {
                Ok(list) => list,
                Err(c) => {
                    out[i] = Some(Err(ClientError::Code(*c)));
                    continue;
                }
            };
            let buf = match fit(list, buf) {
                Ok(buf) => buf,
                Err(e) => {
                    out[i] = Some(Err(e));
                    continue;
                }
            };
            let first = self
                .ranked(list)
                .into_iter()
                .filter_map(|d| address(d, &grants).map(|a| (d.location.is_disk(), a)))
                .find(|(_, a)| unreached.skip(a.0).is_none());
            match first {
                Some((disk, (endpoint, segment, offset, _, place))) => {
                    from_disk[i] = disk;
                    let read = BatchRead { segment, grant: place.grant, offset, buf };
                    by_peer.entry(endpoint).or_default().push((i, read));
                }
                None => single.push((i, *key, list, buf)),
            }
        }
        let (t, lists, grants, from_disk) = (&self.inner.transfer, &lists, &grants, &from_disk);
        let pipelined = by_peer.into_iter().map(|(endpoint, group)| async move {
            let (idx, mut reads): (Vec<usize>, Vec<BatchRead<'_>>) = group.into_iter().unzip();
            let crcs = t.read_batch_checksummed(endpoint, &mut reads).await;
            let mut done = Vec::with_capacity(idx.len());
            for ((i, read), crc) in idx.into_iter().zip(reads).zip(crcs) {
                let (key, Ok(list)) = (items_keys[i], &lists[i]) else { continue };
                let n = read.buf.len();
                let r = match crc {
                    Ok(crc) => {
                        let verified = self.verify(key, list, started, u64::from(crc));
                        if verified.is_ok() && from_disk[i] {
                            self.inner.disk_reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        verified
                    }
                    Err(e) => {
                        tracing::debug!(key, error = %e, "batched read failed; retrying the object alone");
                        // An unreachable node is noted first, so this object's retry (and every other
                        // object's of this run) skips it rather than waiting on it again.
                        unreached.note(endpoint, read.segment, &ClientError::from(e));
                        self.read_replica(key, list, grants, read.buf, started, unreached).await
                    }
                };
                done.push((i, r.map(|()| n)));
            }
            done
        });
        let singles = single.into_iter().map(|(i, key, list, buf)| async move {
            let n = buf.len();
            vec![(i, self.read_replica(key, list, grants, buf, started, unreached).await.map(|()| n))]
        });
        let (pipelined, singles) = tokio::join!(join_all(pipelined), join_all(singles));
        for (i, r) in pipelined.into_iter().chain(singles).flatten() {
            out[i] = Some(r);
        }
        // Every lease this pass was granted ends with one release.
        let leased: Vec<&str> = lists.iter().zip(items_keys).filter(|(l, _)| l.is_ok()).map(|(_, k)| *k).collect();
        self.release_leases(&leased).await;
        out.into_iter().map(|r| r.unwrap_or(Err(ClientError::Code(ErrorCode::InternalError)))).collect()
    }

    /// The cluster's mode (multi-tenancy, lease) and how much its memory segments hold.
    pub async fn cluster_info(&self) -> Result<ClusterInfo, ClientError> {
        let req = MasterRequest::ClusterInfo;
        self.inner
            .master
            .call_expect(&req, |r| if let MasterResponse::ClusterInfo(i) = r { Some(i) } else { None })
            .await
    }

    /// Whether an object is readable (grants a lease if so).
    pub async fn is_exist(&self, key: &str) -> Result<bool, ClientError> {
        check_key(key)?;
        let req = MasterRequest::ExistKey { tenant: self.tenant(), key: WireKey::from(key) };
        self.inner.master.call_expect(&req, |r| if let MasterResponse::Exists(b) = r { Some(b) } else { None }).await
    }

    /// Existence of many keys, per key in input order.
    pub async fn batch_is_exist(&self, keys: &[&str]) -> Vec<Result<bool, ClientError>> {
        per_key(keys.iter().copied(), |k| k, |valid| async move { self.batch_exist_valid(&valid).await }).await
    }

    async fn batch_exist_valid(&self, keys: &[&str]) -> Vec<Result<bool, ClientError>> {
        let req = MasterRequest::BatchExistKey {
            tenant: self.tenant(),
            keys: Batch(keys.iter().map(|k| WireKey::from(*k)).collect()),
        };
        let pick = |r| if let MasterResponse::BatchExists(v) = r { Some(v) } else { None };
        match self.batch_call(&req, keys.len(), pick).await {
            Ok(v) => v.into_iter().map(|r| r.map_err(ClientError::Code)).collect(),
            Err(code) => all_failed(keys.len(), code),
        }
    }

    /// Removes one object (`force` ignores read leases).
    pub async fn remove(&self, key: &str, force: bool) -> Result<(), ClientError> {
        check_key(key)?;
        let req = MasterRequest::Remove { tenant: self.tenant(), key: WireKey::from(key), force };
        self.inner.master.call(&req).await.map(|_| ())
    }

    /// Erases an explicit group whole: every member, or none if one may not go (leased without `force`, being
    /// written); returns how many members were removed.
    pub async fn remove_group(&self, group: &str, force: bool) -> Result<u64, ClientError> {
        let req = MasterRequest::RemoveGroup { tenant: self.tenant(), group: group.to_owned(), force };
        self.inner.master.call_expect(&req, |r| if let MasterResponse::Count(n) = r { Some(n) } else { None }).await
    }

    /// Removes many objects, per key in input order.
    pub async fn batch_remove(&self, keys: &[&str], force: bool) -> Vec<Result<(), ClientError>> {
        per_key(keys.iter().copied(), |k| k, |valid| async move { self.batch_remove_valid(&valid, force).await }).await
    }

    async fn batch_remove_valid(&self, keys: &[&str], force: bool) -> Vec<Result<(), ClientError>> {
        let req = MasterRequest::BatchRemove {
            tenant: self.tenant(),
            keys: Batch(keys.iter().map(|k| WireKey::from(*k)).collect()),
            force,
        };
        let pick = |r| if let MasterResponse::BatchDone(v) = r { Some(v) } else { None };
        match self.batch_call(&req, keys.len(), pick).await {
            Ok(v) => v.into_iter().map(|r| r.map_err(ClientError::Code)).collect(),
            Err(code) => all_failed(keys.len(), code),
        }
    }

    /// Drops the replicas of this client's own objects (those it wrote) whose read lease has expired, as the
    /// original's `BatchReplicaClear`: with `segment` empty every replica (the object is removed), else only
    /// those on segments named `segment` (the object goes with its last one). Returns the keys cleared, in input
    /// order; a key another client wrote, leased, being written, unknown or invalid is skipped. More keys than a
    /// batch carries go in several requests, one after the other.
    pub async fn batch_replica_clear(&self, keys: &[&str], segment: &str) -> Result<Vec<String>, ClientError> {
        let valid: Vec<&str> = keys.iter().copied().filter(|k| check_key(k).is_ok()).collect();
        let mut cleared = Vec::new();
        for chunk in valid.chunks(MAX_BATCH) {
            let req = MasterRequest::BatchReplicaClear {
                client: self.inner.id,
                tenant: self.tenant(),
                keys: Batch(chunk.iter().map(|k| WireKey::from(*k)).collect()),
                segment: segment.to_owned(),
            };
            let pick = |r| if let MasterResponse::Keys(v) = r { Some(v) } else { None };
            cleared.extend(self.inner.master.call_expect(&req, pick).await?);
        }
        Ok(cleared)
    }

    /// Queues a copy of `key` to every segment named in `targets` (the original's `CreateCopyTask`): the node
    /// holding one of its replicas makes it in the background; follow it with [`Client::query_task`].
    pub async fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<TaskId, ClientError> {
        check_key(key)?;
        let req =
            MasterRequest::CreateCopyTask { tenant: self.tenant(), key: WireKey::from(key), targets: targets.to_vec() };
        self.task_id(&req).await
    }

    /// Queues a move of `key`'s replica on segment `source` to segment `target` (the original's
    /// `CreateMoveTask`), made by `source`'s node.
    pub async fn create_move_task(&self, key: &str, source: &str, target: &str) -> Result<TaskId, ClientError> {
        check_key(key)?;
        let req = MasterRequest::CreateMoveTask {
            tenant: self.tenant(),
            key: WireKey::from(key),
            source: source.to_owned(),
            target: target.to_owned(),
        };
        self.task_id(&req).await
    }

    async fn task_id(&self, req: &MasterRequest) -> Result<TaskId, ClientError> {
        self.inner.master.call_expect(req, |r| if let MasterResponse::TaskId(id) = r { Some(id) } else { None }).await
    }

    /// Where a copy or move task stands (`TASK_NOT_FOUND` once the master dropped it from its history).
    pub async fn query_task(&self, id: TaskId) -> Result<TaskInfo, ClientError> {
        let req = MasterRequest::QueryTask { id };
        self.inner.master.call_expect(&req, |r| if let MasterResponse::Task(t) = r { Some(t) } else { None }).await
    }

    /// Starts draining the segments named in `segments` (admin credential): see `MasterRequest::CreateDrain`.
    pub async fn create_drain(
        &self,
        segments: &[String],
        targets: &[String],
        max_concurrency: u32,
    ) -> Result<TaskId, ClientError> {
        let req =
            MasterRequest::CreateDrain { segments: segments.to_vec(), targets: targets.to_vec(), max_concurrency };
        self.task_id(&req).await
    }

    /// A drain job's progress.
    pub async fn query_drain(&self, id: TaskId) -> Result<DrainInfo, ClientError> {
        let pick = |r| if let MasterResponse::Drain(d) = r { Some(d) } else { None };
        self.inner.master.call_expect(&MasterRequest::QueryDrain { id }, pick).await
    }

    /// Cancels a drain job (its segments take placements again).
    pub async fn cancel_drain(&self, id: TaskId) -> Result<DrainInfo, ClientError> {
        let pick = |r| if let MasterResponse::Drain(d) = r { Some(d) } else { None };
        self.inner.master.call_expect(&MasterRequest::CancelDrain { id }, pick).await
    }

    /// Removes every object of this client's tenant; returns how many.
    pub async fn remove_all(&self, force: bool) -> Result<u64, ClientError> {
        Ok(self.remove_all_report(force).await?.removed)
    }

    /// Removes every object of this client's tenant; says how many it removed and, of those it left, why.
    pub async fn remove_all_report(&self, force: bool) -> Result<RemoveAllReport, ClientError> {
        let req = MasterRequest::RemoveAll { tenant: Some(self.tenant()), force };
        let pick = |r| match r {
            MasterResponse::RemovedAll(report) => Some(report),
            // A master from before the report: a bare count.
            MasterResponse::Count(removed) => Some(RemoveAllReport { removed, ..RemoveAllReport::default() }),
            _ => None,
        };
        self.inner.master.call_expect(&req, pick).await
    }

    /// Readable keys starting with `prefix` (sorted, at most `limit`), page by page ([`Client::list_keys_page`]),
    /// so a listing of any size never needs a reply larger than a frame.
    pub async fn list_keys(&self, prefix: &str, limit: u32) -> Result<Vec<String>, ClientError> {
        let mut keys = Vec::new();
        let mut after: Option<String> = None;
        while keys.len() < limit as usize {
            let want = (limit - keys.len() as u32).min(LIST_PAGE_KEYS);
            let page = self.list_keys_page(prefix, after.as_deref(), want).await?;
            keys.extend(page.keys);
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        keys.truncate(limit as usize);
        Ok(keys)
    }

    /// One page of readable keys starting with `prefix`, sorted, strictly after `after` (`None`: from the
    /// first), at most `limit` and at most what one reply carries; its `next` is the `after` of the following
    /// page (`None`: no more). A key present for the whole listing is on exactly one page.
    pub async fn list_keys_page(&self, prefix: &str, after: Option<&str>, limit: u32) -> Result<KeyPage, ClientError> {
        let req = MasterRequest::ListKeysPage {
            tenant: self.tenant(),
            prefix: prefix.to_owned(),
            after: after.map(str::to_owned),
            limit,
        };
        self.inner.master.call_expect(&req, |r| if let MasterResponse::KeyPage(p) = r { Some(p) } else { None }).await
    }

    /// Every tenant with a quota policy or objects, sorted by id (a multi-tenant master only:
    /// `UNAVAILABLE_IN_CURRENT_MODE` otherwise).
    pub async fn list_tenants(&self) -> Result<Vec<TenantInfo>, ClientError> {
        let pick = |r| if let MasterResponse::Tenants(t) = r { Some(t) } else { None };
        self.inner.master.call_expect(&MasterRequest::ListTenants, pick).await
    }

    /// Sets `tenant`'s requested quota to `bytes`, registering it (its writes are admitted from then on).
    pub async fn set_tenant_quota(&self, tenant: &str, bytes: u64) -> Result<(), ClientError> {
        let req = MasterRequest::SetTenantQuota { tenant: tenant.to_owned(), bytes };
        self.inner.master.call(&req).await.map(|_| ())
    }

    /// Removes an empty tenant: `OBJECT_NOT_FOUND` if it has no policy, `TENANT_NOT_EMPTY` while it holds
    /// objects.
    pub async fn remove_tenant(&self, tenant: &str) -> Result<(), ClientError> {
        let req = MasterRequest::RemoveTenant { tenant: tenant.to_owned() };
        self.inner.master.call(&req).await.map(|_| ())
    }

    /// Registers this client's local SSD, offloading to it enabled or not.
    pub async fn local_ssd_register(&self, enable_offloading: bool) -> Result<(), ClientError> {
        let req = MasterRequest::RegisterLocalSsd { client: self.inner.id, enable_offloading };
        self.inner.master.call(&req).await.map(|_| ())
    }

    /// Drops this client's local SSD registration (none: OK).
    pub async fn local_ssd_unregister(&self) -> Result<(), ClientError> {
        let req = MasterRequest::UnregisterLocalSsd { client: self.inner.id };
        self.inner.master.call(&req).await.map(|_| ())
    }

    /// Reports the capacity of this client's registered local SSD, in bytes.
    pub async fn local_ssd_report(&self, capacity: u64) -> Result<(), ClientError> {
        let req = MasterRequest::ReportLocalSsd { client: self.inner.id, capacity };
        self.inner.master.call(&req).await.map(|_| ())
    }

    /// Enables or disables offloading to this client's registered local SSD.
    pub async fn local_ssd_set_offloading(&self, enabled: bool) -> Result<(), ClientError> {
        let req = MasterRequest::SetLocalSsdOffloading { client: self.inner.id, enabled };
        self.inner.master.call(&req).await.map(|_| ())
    }

    /// One client's local SSD registration, or every one (`None`), sorted by client id.
    pub async fn local_ssd_status(&self, client: Option<ClientId>) -> Result<Vec<LocalSsdInfo>, ClientError> {
        let pick = |r| if let MasterResponse::LocalSsd(v) = r { Some(v) } else { None };
        self.inner.master.call_expect(&MasterRequest::LocalSsdStatus { client }, pick).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_tried_once_more_when_its_lease_or_grant_expired_and_never_twice() {
        let expired_grant = || -> Result<(), ClientError> {
            Err(ClientError::Refused(ErrorFrame { code: ErrorCode::GrantExpired, message: "expired".into() }))
        };
        let lease = || -> Result<(), ClientError> { Err(ClientError::LeaseExpired { key: "k".into(), lease_ms: 5 }) };
        for first in [expired_grant(), lease()] {
            let mut refetched = false;
            assert!(once_more_on_expiry("k", first, &mut refetched).is_none(), "tried once more");
            let again = once_more_on_expiry("k", expired_grant(), &mut refetched);
            assert_eq!(again.and_then(Result::err).map(|e| e.code()), Some(ErrorCode::GrantExpired), "not twice");
        }
        let mut refetched = false;
        let denied = Err::<(), _>(ClientError::Code(ErrorCode::PermissionDenied));
        assert!(once_more_on_expiry("k", denied, &mut refetched).is_some(), "other refusals are final");
        assert!(matches!(once_more_on_expiry("k", Ok(()), &mut refetched), Some(Ok(()))));
        // The batch read's test of which keys to look up again is the same.
        assert!(outlived(&expired_grant()) && outlived(&lease()));
        assert!(!outlived(&Err::<(), _>(ClientError::Code(ErrorCode::PermissionDenied))) && !outlived(&Ok(())));
    }
}
