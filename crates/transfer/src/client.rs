//! The transfer client: one-sided READ/WRITE against peers' transfer servers, or a memcpy when the target
//! segment lives in this process.
//!
//! Connections are pooled per peer endpoint and persistent: at most `lanes_per_peer` sockets per peer (a
//! semaphore bounds them, so the socket count never grows with load, unlike the original's socket per
//! transfer), each carrying one exchange at a time (or, for batches, one pipelined run: `batch`). A transfer
//! larger than its stripe size (`stripe_size` for reads, `write_stripe_size` for writes) is split into stripes
//! that run concurrently over the lanes (the original serialised its slices, which made throughput RTT-bound):
//! owned writes as tasks, the rest as futures of the caller's task, each on a disjoint piece of the buffer.
//! A lane whose exchange did not complete cleanly (I/O error, timeout, protocol error, cancellation) is
//! dropped rather than returned to the pool; the error goes to the caller, who decides about retries.

mod batch;

pub use batch::{BatchRead, BatchWrite};

use crate::MAX_TRANSFER;
use crate::checksum;
use crate::error::{TransferError, io_error};
use crate::local;
use crate::memory::SegmentMemory;
use crate::net::{self, READ_BUFFER};
use crate::registry::SegmentRegistry;
use crate::vm::{CopyError, RemoteProcess};
use bytes::{Bytes, BytesMut};
use crescent_net::auth::{Credential, Plane};
use crescent_net::conn::{Conn, Stream};
use crescent_net::frame::{self as frames, ShapeError};
use crescent_net::hello::{self, HandshakeError};
use crescent_net::poll::{self, InFlight, InFlightGuard};
use crescent_net::tls::{self, TlsClient};
use crescent_proto::transfer::{Attachment, Grant, GrantUse, MAX_GRANT_SLOTS, TransferRequest, TransferResponse};
use crescent_proto::wire::{ErrorFrame, Head, Limits, MAX_HELLO_FRAME, PeerRole, WireError, caps};
use crescent_proto::{ClientId, ErrorCode, SegmentId};
use futures_util::future::{BoxFuture, join_all};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::task::JoinSet;
use tokio::time::timeout;

/// Client-side data-plane settings.
#[derive(Debug, Clone)]
pub struct TransferConfig {
    /// Most sockets (and concurrent requests) per peer endpoint.
    pub lanes_per_peer: usize,
    /// Reads larger than this are split into stripes of this size fetched in parallel over the lanes (capped
    /// at [`MAX_TRANSFER`]; 0 means the cap): the peer then serves them on several threads, which is where a
    /// read's copy happens. 512 KiB measured best for reads of 1–4 MiB on a 2-vCPU loopback (`crescent
    /// bench`, medians of 6 alternating runs, MiB/s, 512 KiB vs 256 KiB vs 1 MiB stripes: 4 MiB c=1 3497 /
    /// 3470 / 2607, c=8 3954 / 3489 / 3013; 1 MiB c=1 2335 / 2372 / 2001, c=8 3667 / 3166 / 3249).
    pub stripe_size: u64,
    /// The same for writes. 2 MiB measured best with a one-thread storage node (`crescent bench` against
    /// `up`, medians of alternating runs, MiB/s, 2 MiB vs 4 MiB vs 1 MiB stripes: 4 MiB puts c=1 4575 / 2748 /
    /// 3680, c=8 3226 / 3049): two stripes in flight keep the node receiving while the sender sums and sends.
    pub write_stripe_size: u64,
    /// Deadline for connecting to a peer, hello included.
    pub connect_timeout: Duration,
    /// Deadline for one request/response exchange (one stripe) on a lane.
    pub io_timeout: Duration,
    /// How long a request polls for its reply before parking (0 = never): avoids a sleeping CPU's wake-up
    /// on the reply path, which on VMs costs more than a small transfer itself. Reads larger than
    /// 1 MiB never poll (see `POLL_READ_MAX`).
    pub poll_window: Duration,
    /// Where each lane gets the ticket it proves in its hello, for storage nodes that authenticate their peers
    /// (the master issues them; `None`: a cluster without authentication).
    pub tickets: Option<Arc<dyn Tickets>>,
    /// The client id each lane's hello names: the master seals grants for it, and a node honours them only on
    /// a connection that named it.
    pub client_id: Option<ClientId>,
    /// TLS every lane goes through before its hello (storage nodes serving TLS); `None`: plain TCP.
    pub tls: Option<Arc<TlsClient>>,
    /// Whether lanes to a storage node on this host go over its Unix socket when it offers one (never with
    /// `tls`; see `crate::local`).
    pub local_lanes: bool,
}

impl Default for TransferConfig {
    fn default() -> Self {
        Self {
            lanes_per_peer: 4,
            stripe_size: 512 << 10,
            write_stripe_size: 2 << 20,
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(30),
            poll_window: Duration::from_micros(50),
            tickets: None,
            client_id: None,
            tls: None,
            local_lanes: true,
        }
    }
}

/// Where a client's lanes get the data-plane tickets they prove to storage nodes that authenticate: the seam
/// between the data plane and the master, which issues them (`crescent_net::host`).
pub trait Tickets: Send + Sync + std::fmt::Debug {
    /// The ticket for the host serving `segment` at `endpoint` (cached by the implementation until near its
    /// expiry).
    fn ticket<'a>(&'a self, endpoint: &'a str, segment: SegmentId) -> BoxFuture<'a, Result<Credential, TransferError>>;
    /// Drops any cached ticket for `endpoint`: its host refused it (expired, or the host's keys changed).
    fn forget(&self, endpoint: &str);
}

/// What [`TransferClient::attach`] found: the node's attachment, and which of its segments this process mapped.
#[derive(Debug, Clone)]
pub struct Attached {
    /// What the node said (master, name, host, shareable segments).
    pub attachment: Attachment,
    /// The segments mapped into this client (memory copies from now on).
    pub mapped: Vec<SegmentId>,
}

/// Where a transfer goes: a segment, and the master's grant for the range when the cluster authenticates (a
/// bare [`SegmentId`] converts to a place without one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The segment.
    pub segment: SegmentId,
    /// The grant covering the transfer's range (every stripe carries it; the node checks each lies inside).
    pub grant: Option<RangeGrant>,
}

impl Place {
    /// A place in `segment` under `grant`.
    pub fn new(segment: SegmentId, grant: Option<RangeGrant>) -> Self {
        Self { segment, grant }
    }
}

/// The master's grant for one range: the grant (which a batch's ranges on one segment share) and the index of
/// the range in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeGrant {
    /// The grant, shared by the transfers of its ranges.
    pub grant: Arc<Grant>,
    /// Which of its ranges this is.
    pub range: u16,
}

impl RangeGrant {
    /// Range `range` of `grant`.
    pub fn new(grant: Arc<Grant>, range: u16) -> Self {
        Self { grant, range }
    }

    /// A single range's own grant (its range 0).
    pub fn own(grant: Grant) -> Self {
        Self { grant: Arc::new(grant), range: 0 }
    }
}

/// Which grants one run of requests on a lane has carried into which of the connection's slots (see
/// [`GrantUse`]): the first request of a grant carries it, the others name its slot. The node holds what the
/// run's requests put there, in order, so a run never relies on an earlier run's slots.
#[derive(Debug, Default)]
pub(crate) struct GrantSlots {
    /// `(grant's address, slot)`: a run's grants are alive for the whole run, so an address names one.
    carried: Vec<(usize, u8)>,
    next: u8,
}

impl GrantSlots {
    /// How a request of this run shows `grant`.
    pub(crate) fn use_of(&mut self, grant: Option<&RangeGrant>) -> Option<GrantUse> {
        let g = grant?;
        let key = Arc::as_ptr(&g.grant) as usize;
        if let Some(&(_, slot)) = self.carried.iter().find(|(k, _)| *k == key) {
            return Some(GrantUse::Held { slot, range: g.range });
        }
        // More grants than slots in one run: the oldest slot is reused (its grant is carried again if named).
        let slot = self.next;
        self.next = (self.next + 1) % MAX_GRANT_SLOTS as u8;
        self.carried.retain(|(_, s)| *s != slot);
        self.carried.push((key, slot));
        Some(GrantUse::Carried { slot, range: g.range, grant: (*g.grant).clone() })
    }
}

impl From<SegmentId> for Place {
    fn from(segment: SegmentId) -> Self {
        Self { segment, grant: None }
    }
}

/// The data-plane client; cheap to clone (clones share the connection pools).
#[derive(Debug, Clone)]
pub struct TransferClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: TransferConfig,
    local: SegmentRegistry,
    peers: Mutex<HashMap<String, Arc<Peer>>>,
    /// Exchanges in progress on this client (transfers, and master requests when shared with the client's
    /// master connection): a reply is polled for only when its exchange is the only one.
    inflight: Arc<InFlight>,
}

impl TransferClient {
    /// A client; transfers to segments in `local` are served by memcpy without touching a socket.
    pub fn new(config: TransferConfig, local: SegmentRegistry) -> Self {
        Self::with_in_flight(config, local, Arc::default())
    }

    /// Like [`TransferClient::new`], counting its transfers in `inflight`, which the caller shares with its
    /// other exchanges (a client's master requests), so no wait polls while another exchange is under way.
    pub fn with_in_flight(config: TransferConfig, local: SegmentRegistry, inflight: Arc<InFlight>) -> Self {
        Self { inner: Arc::new(Inner { config, local, peers: Mutex::new(HashMap::new()), inflight }) }
    }

    /// The client's settings.
    pub fn config(&self) -> &TransferConfig {
        &self.inner.config
    }

    /// Sockets currently open to `endpoint` (idle or busy); never more than `lanes_per_peer`.
    pub fn open_connections(&self, endpoint: &str) -> usize {
        self.inner.peers.lock().get(endpoint).map_or(0, |p| p.open.load(Ordering::Relaxed))
    }

    /// Closes the idle pooled connections to every peer (busy ones close when their exchange ends).
    pub fn close_idle(&self) {
        let peers: Vec<_> = self.inner.peers.lock().values().cloned().collect();
        for peer in peers {
            peer.idle.lock().clear();
        }
    }

    /// Writes `data` at `offset` of `segment`, hosted at `endpoint`; returns once the bytes are in place. A
    /// striped write is not atomic: if one stripe is refused, stripes inside the segment may still land (the
    /// master only hands out in-range replicas, so only a client bug can cause that).
    pub async fn write(
        &self,
        endpoint: &str,
        place: impl Into<Place>,
        offset: u64,
        data: Bytes,
    ) -> Result<(), TransferError> {
        let place = place.into();
        if let Some(mem) = self.inner.local.get(&place.segment) {
            return mem.write_at(offset, &data);
        }
        offset.checked_add(data.len() as u64).ok_or(TransferError::OutOfRange)?;
        let peer = self.peer(endpoint, Some(place.segment));
        let stripe = self.write_stripe_bytes(&peer);
        let op = self.op();
        if data.len() <= stripe {
            return self.write_stripe(&peer, &op, &place, offset, &data, false).await.map(|_| ());
        }
        // Write stripes run as tasks: on the sending side the kernel does the copy and (over loopback) much of the
        // TCP work, so one task sending every stripe would cap a large write at one core. The `JoinSet` aborts the
        // stripes if this future is dropped (their lanes are then discarded mid-exchange).
        let op = Arc::new(op);
        let mut stripes = JoinSet::new();
        for at in (0..data.len()).step_by(stripe) {
            let chunk = data.slice(at..(at + stripe).min(data.len()));
            let (client, peer, op, place) = (self.clone(), peer.clone(), op.clone(), place.clone());
            let offset = offset + at as u64;
            stripes.spawn(async move { client.write_stripe(&peer, &op, &place, offset, &chunk, false).await });
        }
        let mut result = Ok(());
        while let Some(joined) = stripes.join_next().await {
            let r = joined.unwrap_or_else(|e| Err(TransferError::Io(io::Error::other(e))));
            if result.is_ok() {
                result = r.map(|_| ());
            }
        }
        result
    }

    /// Writes the caller's `data` at `offset` of `segment` without copying it: stripes are sent concurrently
    /// from this task (the borrow of `data` cannot be handed to spawned tasks). [`TransferClient::write`] with
    /// owned `Bytes` spreads stripes over cores instead.
    pub async fn write_from(
        &self,
        endpoint: &str,
        place: impl Into<Place>,
        offset: u64,
        data: &[u8],
    ) -> Result<(), TransferError> {
        self.write_striped(endpoint, place.into(), offset, data, false).await.map(|_| ())
    }

    /// [`TransferClient::write_from`] that also returns the crc32c of `data`, summed piece by piece right after
    /// each piece is handed to the socket (while it is in cache, and while the peer receives it) rather than
    /// in a pass of its own over the buffer.
    pub async fn write_from_checksummed(
        &self,
        endpoint: &str,
        place: impl Into<Place>,
        offset: u64,
        data: &[u8],
    ) -> Result<u32, TransferError> {
        self.write_striped(endpoint, place.into(), offset, data, true).await
    }

    /// Writes `data`, striped over the peer's lanes from this task; returns its crc32c if `checksum` (else 0).
    async fn write_striped(
        &self,
        endpoint: &str,
        place: Place,
        offset: u64,
        data: &[u8],
        checksum: bool,
    ) -> Result<u32, TransferError> {
        if let Some(mem) = self.inner.local.get(&place.segment) {
            let (_inflight, alone) = self.inner.inflight.enter();
            return mem.write_at_summed(offset, data, checksum, alone);
        }
        offset.checked_add(data.len() as u64).ok_or(TransferError::OutOfRange)?;
        let peer = self.peer(endpoint, Some(place.segment));
        let stripe = self.write_stripe_bytes(&peer);
        let op = self.op();
        if data.len() <= stripe {
            return self.write_stripe(&peer, &op, &place, offset, data, checksum).await;
        }
        let stripes = data.chunks(stripe).enumerate().map(|(i, chunk)| {
            let write = self.write_stripe(&peer, &op, &place, offset + (i * stripe) as u64, chunk, checksum);
            async move { write.await.map(|crc| (crc, chunk.len() as u64)) }
        });
        joined_checksum(join_all(stripes).await)
    }

    /// Reads `length` bytes at `offset` of `segment`, hosted at `endpoint`, into a new buffer (striped like
    /// [`TransferClient::read_into`]).
    pub async fn read(
        &self,
        endpoint: &str,
        place: impl Into<Place>,
        offset: u64,
        length: u64,
    ) -> Result<Bytes, TransferError> {
        let mut buf = Self::owned_buffer(offset, length)?;
        self.read_into(endpoint, place, offset, &mut buf).await?;
        Ok(buf.freeze())
    }

    /// Like [`TransferClient::read`], also returning the crc32c of the bytes (see
    /// [`TransferClient::read_into_checksummed`]).
    pub async fn read_checksummed(
        &self,
        endpoint: &str,
        place: impl Into<Place>,
        offset: u64,
        length: u64,
    ) -> Result<(Bytes, u32), TransferError> {
        let mut buf = Self::owned_buffer(offset, length)?;
        let crc = self.read_into_checksummed(endpoint, place, offset, &mut buf).await?;
        Ok((buf.freeze(), crc))
    }

    /// A zeroed buffer for an owned read of `length` bytes at `offset` (checked before anything is allocated).
    fn owned_buffer(offset: u64, length: u64) -> Result<BytesMut, TransferError> {
        offset.checked_add(length).ok_or(TransferError::OutOfRange)?;
        let len = usize::try_from(length).map_err(|_| TransferError::OutOfRange)?;
        Ok(BytesMut::zeroed(len))
    }

    /// Reads `buf.len()` bytes at `offset` of `segment`, hosted at `endpoint`, straight into `buf`.
    pub async fn read_into(
        &self,
        endpoint: &str,
        place: impl Into<Place>,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), TransferError> {
        self.read_striped(endpoint, place.into(), offset, buf, false).await.map(|_| ())
    }

    /// [`TransferClient::read_into`] that also returns the crc32c of the bytes read. Each piece is summed as it
    /// lands from the socket (while it is in cache, and overlapping the wait for the next one) and the stripes'
    /// sums are joined at the end, so the checksum costs no second pass over the buffer.
    pub async fn read_into_checksummed(
        &self,
        endpoint: &str,
        place: impl Into<Place>,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<u32, TransferError> {
        self.read_striped(endpoint, place.into(), offset, buf, true).await
    }

    /// Reads into `buf`, striped over the peer's lanes; returns the crc32c of the bytes if `checksum` (else 0).
    async fn read_striped(
        &self,
        endpoint: &str,
        place: Place,
        offset: u64,
        buf: &mut [u8],
        checksum: bool,
    ) -> Result<u32, TransferError> {
        if let Some(mem) = self.inner.local.get(&place.segment) {
            let (_inflight, alone) = self.inner.inflight.enter();
            return mem.read_at_summed(offset, buf, checksum, alone);
        }
        offset.checked_add(buf.len() as u64).ok_or(TransferError::OutOfRange)?;
        let peer = self.peer(endpoint, Some(place.segment));
        let stripe = self.stripe(&peer);
        let op = self.op().polling_if(polls_for(buf.len()));
        if buf.len() <= stripe {
            return self.read_stripe(&peer, &op, &place, offset, buf, checksum).await;
        }
        // `chunks_mut` splits the buffer into disjoint stripes, each filled by its own concurrent exchange (all
        // polled by this task: no spawning, and the borrows of `buf` stay local).
        let stripes = buf.chunks_mut(stripe).enumerate().map(|(i, chunk)| {
            let len = chunk.len() as u64;
            let read = self.read_stripe(&peer, &op, &place, offset + (i * stripe) as u64, chunk, checksum);
            async move { read.await.map(|crc| (crc, len)) }
        });
        joined_checksum(join_all(stripes).await)
    }

    /// Starts an operation (counted among the client's transfers in flight).
    fn op(&self) -> Op {
        let (inflight, alone) = self.inner.inflight.enter();
        Op { failed: AtomicBool::new(false), alone, _inflight: inflight }
    }

    /// The read stripe size in bytes for `peer`.
    fn stripe(&self, peer: &Peer) -> usize {
        peer.stripe(self.inner.config.stripe_size)
    }

    /// Attaches to the storage node on this host advertising `endpoint` (see [`TransferRequest::Attach`]): asks
    /// it where its master is and maps each memfd-backed segment it shares into this client's own segments, so
    /// transfers to them are memory copies in this process (reads rank them first, as this process's own). A
    /// segment the kernel does not let this process take (another user, a sandbox) is left to local copies over
    /// the lane. `segment`, one of the node's segments, is what the lane's ticket is asked for (with tickets).
    /// Segments the node mounts later are not mapped (they are reached over its lanes); attaching again maps them.
    pub async fn attach(&self, endpoint: &str, segment: Option<SegmentId>) -> Result<Attached, TransferError> {
        let peer = self.peer(endpoint, segment);
        let mut guard = peer.checkout(&self.inner.config).await?;
        let lane = guard.lane()?;
        if lane.remote.is_none() {
            return Err(TransferError::NotLocal(endpoint.to_owned()));
        }
        // Not returned to the pool unless the exchange and its release complete.
        lane.clean = false;
        let attachment =
            timeout(self.inner.config.io_timeout, lane.attach()).await.map_err(|_| TransferError::Timeout)??;
        let mut mapped = Vec::new();
        let remote = lane.remote.as_ref().ok_or_else(|| TransferError::NotLocal(endpoint.to_owned()))?;
        for shared in &attachment.segments {
            let memory = match remote.take_fd(shared.fd, shared.inode) {
                Ok(fd) => SegmentMemory::map_shared(fd, shared.length, remote.try_clone()?)?,
                Err(CopyError::Denied) => {
                    tracing::info!(
                        endpoint,
                        "the kernel does not let this process map the node's memory: local copies"
                    );
                    break;
                }
                Err(CopyError::Failed(e)) => return Err(TransferError::Io(e)),
            };
            self.inner.local.register(shared.segment, Arc::new(memory));
            mapped.push(shared.segment);
        }
        // The node holds the segments it named until this release: their descriptors were taken by number.
        timeout(self.inner.config.io_timeout, lane.release()).await.map_err(|_| TransferError::Timeout)??;
        lane.clean = true;
        Ok(Attached { attachment, mapped })
    }

    /// Forgets segments mapped by [`TransferClient::attach`]: their memory is unmapped once no transfer uses it.
    pub fn detach(&self, attached: &Attached) {
        for segment in &attached.mapped {
            self.inner.local.unregister(segment);
        }
    }

    /// The write stripe size in bytes for `peer`.
    fn write_stripe_bytes(&self, peer: &Peer) -> usize {
        peer.stripe(self.inner.config.write_stripe_size)
    }

    /// The peer at `endpoint`; `segment` (one it hosts) is what its lanes ask the master a ticket for.
    fn peer(&self, endpoint: &str, segment: Option<SegmentId>) -> Arc<Peer> {
        let mut peers = self.inner.peers.lock();
        if let Some(p) = peers.get(endpoint) {
            if let Some(segment) = segment.filter(|_| self.inner.config.tickets.is_some()) {
                *p.segment.lock() = Some(segment);
            }
            return p.clone();
        }
        let lanes = self.inner.config.lanes_per_peer.max(1);
        let peer = Arc::new(Peer {
            endpoint: endpoint.to_owned(),
            lanes: Semaphore::new(lanes),
            idle: Mutex::new(Vec::with_capacity(lanes)),
            open: Arc::new(AtomicUsize::new(0)),
            copies: AtomicBool::new(false),
            copy_denied: Arc::new(AtomicBool::new(false)),
            segment: Mutex::new(segment),
        });
        peers.insert(endpoint.to_owned(), peer.clone());
        peer
    }

    /// One exchange of at most a stripe. Part of a larger transfer, it is skipped (`Ok`) when another stripe
    /// already failed, so a dead peer costs one failed attempt per lane rather than one per stripe; the
    /// transfer's result is then the failing stripe's error.
    async fn write_stripe(
        &self,
        peer: &Peer,
        op: &Op,
        place: &Place,
        offset: u64,
        data: &[u8],
        checksum: bool,
    ) -> Result<u32, TransferError> {
        let Some(mut guard) = self.stripe_lane(peer, op).await? else { return Ok(0) };
        let exchange = guard.lane()?.write(place, offset, data, checksum);
        op.settle(timeout(self.inner.config.io_timeout, exchange).await.unwrap_or(Err(TransferError::Timeout)))
    }

    /// The read counterpart of [`TransferClient::write_stripe`]; returns the stripe's crc32c if `checksum`.
    async fn read_stripe(
        &self,
        peer: &Peer,
        op: &Op,
        place: &Place,
        offset: u64,
        buf: &mut [u8],
        checksum: bool,
    ) -> Result<u32, TransferError> {
        let Some(mut guard) = self.stripe_lane(peer, op).await? else { return Ok(0) };
        let exchange = guard.lane()?.read(place, offset, buf, checksum);
        op.settle(timeout(self.inner.config.io_timeout, exchange).await.unwrap_or(Err(TransferError::Timeout)))
    }

    /// A lane for one stripe of `op`, set to poll if the transfer is alone; `None` when another stripe of the
    /// transfer already failed (the stripe is skipped).
    async fn stripe_lane<'p>(&self, peer: &'p Peer, op: &Op) -> Result<Option<LaneGuard<'p>>, TransferError> {
        let mut guard = peer.checkout(&self.inner.config).await?;
        if op.failed.load(Ordering::Relaxed) {
            return Ok(None);
        }
        guard.lane()?.may_poll = op.alone;
        Ok(Some(guard))
    }
}

/// One transfer (all its stripes), for as long as it runs.
struct Op {
    /// Set by the first failing stripe; the others then skip their exchange.
    failed: AtomicBool,
    /// Whether this is the client's only transfer: its lanes may then poll for replies rather than park (all
    /// its stripes are polled by one task, or are its own spawned tasks, so polling delays no one else).
    alone: bool,
    _inflight: InFlightGuard,
}

impl Op {
    /// Keeps the right to poll only if `allowed` too (a transfer too long to be worth polling for).
    fn polling_if(mut self, allowed: bool) -> Self {
        self.alone &= allowed;
        self
    }

    /// Passes a stripe's result on, marking the transfer failed if it failed (its other stripes then skip).
    fn settle<T>(&self, r: Result<T, TransferError>) -> Result<T, TransferError> {
        if r.is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
        r
    }
}

/// Transfers at least this large go by local copy on a lane that can (`vm`); smaller ones are cheaper carried
/// in the request or reply than in a copy syscall and a `Release` of their own.
const LOCAL_COPY_MIN: usize = 64 << 10;

/// Payload bytes per write call when a write is summed as it is sent: small enough that a piece is still in
/// the CPU's cache when it is summed right after the kernel copied it.
const SUM_PIECE: usize = 256 << 10;

/// Reads up to this many bytes (the whole transfer) poll for their replies when they are the client's only
/// transfer; larger ones park. Measured on the 2-vCPU VM against a two-worker node (`crescent bench`, c=1,
/// medians of 7 alternating runs): 4 MiB reads 3106 MiB/s parking vs 2650 polling; 1 MiB reads 2237 polling
/// vs 2127 parking. Polling through a long transfer keeps the client's CPU busy while the node's workers, woken by the client's own
/// requests, tend to be queued on that CPU, so sending and receiving serialise instead of overlapping.
pub(crate) const POLL_READ_MAX: usize = 1 << 20;

/// Whether a read of `len` bytes may poll for its replies (see [`POLL_READ_MAX`]).
pub(crate) fn polls_for(len: usize) -> bool {
    len <= POLL_READ_MAX
}

/// A stripe size: 0 means the largest transfer.
fn capped(stripe: u64) -> usize {
    (if stripe == 0 { MAX_TRANSFER } else { stripe.min(MAX_TRANSFER) }) as usize
}

/// The crc32c of a striped transfer from its stripes' `(crc, length)` in order, or the first stripe's error.
fn joined_checksum(stripes: Vec<Result<(u32, u64), TransferError>>) -> Result<u32, TransferError> {
    let mut crc = 0;
    for stripe in stripes {
        let (stripe_crc, len) = stripe?;
        crc = checksum::combine(crc, stripe_crc, len);
    }
    Ok(crc)
}

/// The pool of lanes to one peer endpoint.
#[derive(Debug)]
struct Peer {
    endpoint: String,
    /// One permit per lane: a lane (idle or new) is used only while holding a permit, and a new lane is opened
    /// only when no idle one exists, so at most `lanes_per_peer` sockets exist per peer.
    lanes: Semaphore,
    idle: Mutex<Vec<Lane>>,
    open: Arc<AtomicUsize>,
    /// Set once a lane to the peer could copy locally (`vm`): its transfers are then not striped.
    copies: AtomicBool,
    /// Set once the kernel refused this process a local copy to or from the peer (`vm`): its local lanes then
    /// carry the bytes themselves.
    copy_denied: Arc<AtomicBool>,
    /// The segment of the peer's latest transfer: what a new lane names to get its ticket (with tickets only). A
    /// leaf lock, also taken under the client's `peers` lock.
    segment: Mutex<Option<SegmentId>>,
}

impl Peer {
    /// The stripe size for a transfer to this peer, `configured` unless its lanes copy locally: a local copy is
    /// one syscall whatever its length, so a stripe would only add a `Locate` and a `Release` round trip.
    /// Measured (`crescent bench` c=1 against `up`, p50 of three alternating runs each, unstriped vs striped):
    /// 4 MiB puts 316–335 vs 525–564 µs, gets 460–501 vs 439–463 µs; 1 MiB gets 119–121 vs 137–141 µs;
    /// batches of 32 × 4 MiB 20.7–22.7 vs 26.0–30.6 ms (puts), 15.9–16.6 vs 17.7–19.8 ms (gets).
    fn stripe(&self, configured: u64) -> usize {
        if self.copies.load(Ordering::Relaxed) && !self.copy_denied.load(Ordering::Relaxed) {
            capped(0)
        } else {
            capped(configured)
        }
    }

    async fn checkout(&self, config: &TransferConfig) -> Result<LaneGuard<'_>, TransferError> {
        // The semaphore is never closed.
        let permit = self.lanes.acquire().await.map_err(|_| TransferError::Closed)?;
        loop {
            let lane = self.idle.lock().pop();
            match lane {
                Some(mut lane) => {
                    if lane.is_healthy() {
                        return Ok(LaneGuard { peer: self, lane: Some(lane), _permit: permit });
                    }
                    // Closed by the peer while idle: drop it, try the next.
                }
                None => break,
            }
        }
        let lane = timeout(config.connect_timeout, Lane::connect_with_ticket(self, config))
            .await
            .map_err(|_| TransferError::Timeout)??;
        Ok(LaneGuard { peer: self, lane: Some(lane), _permit: permit })
    }
}

/// A checked-out lane; goes back to the pool on drop if its last exchange completed cleanly.
struct LaneGuard<'a> {
    peer: &'a Peer,
    lane: Option<Lane>,
    // Dropped after `Drop::drop` returned the lane, so the next permit holder finds it idle.
    _permit: SemaphorePermit<'a>,
}

impl LaneGuard<'_> {
    fn lane(&mut self) -> Result<&mut Lane, TransferError> {
        // `Some` from construction until `Drop` takes it.
        self.lane.as_mut().ok_or(TransferError::Closed)
    }
}

impl Drop for LaneGuard<'_> {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.take()
            && lane.clean
        {
            self.peer.idle.lock().push(lane);
        }
    }
}

/// Counts a peer's open sockets; decremented when the lane is dropped.
#[derive(Debug)]
struct OpenLane(Arc<AtomicUsize>);

impl Drop for OpenLane {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One persistent connection to a peer's transfer server.
#[derive(Debug)]
struct Lane {
    io: BufReader<Conn>,
    poll_window: Duration,
    /// Whether the current exchange may poll (it is the client's only one).
    may_poll: bool,
    next_id: u64,
    header: Vec<u8>,
    /// The server's frame limit from its hello reply.
    max_frame: usize,
    /// False while an exchange is in progress or after one failed: such a lane is never reused.
    clean: bool,
    /// On a local lane that agreed `caps::LOCAL_COPY`: the node, for this client to copy large transfers'
    /// bytes to and from itself (`vm`).
    remote: Option<RemoteProcess>,
    /// The peer's [`Peer::copy_denied`].
    copy_denied: Arc<AtomicBool>,
    _open: OpenLane,
}

impl Lane {
    /// Connects a lane, proving a ticket when the client has tickets; a refused ticket (expired, or the host's
    /// keys changed) is dropped and a fresh one tried once.
    async fn connect_with_ticket(peer: &Peer, config: &TransferConfig) -> Result<Lane, TransferError> {
        let Some(tickets) = &config.tickets else { return Lane::connect(peer, config, None).await };
        let segment = peer.segment.lock().ok_or(TransferError::Refused(ErrorCode::AuthenticationFailed))?;
        let ticket = tickets.ticket(&peer.endpoint, segment).await?;
        match Lane::connect(peer, config, Some(&ticket)).await {
            Err(TransferError::Refused(ErrorCode::AuthenticationFailed)) => {
                tickets.forget(&peer.endpoint);
                let ticket = tickets.ticket(&peer.endpoint, segment).await?;
                Lane::connect(peer, config, Some(&ticket)).await
            }
            other => other,
        }
    }

    async fn connect(peer: &Peer, config: &TransferConfig, ticket: Option<&Credential>) -> Result<Lane, TransferError> {
        let (endpoint, open) = (peer.endpoint.as_str(), peer.open.clone());
        let poll_window = config.poll_window;
        let local = if config.local_lanes && config.tls.is_none() { local::connect(endpoint)? } else { None };
        let stream = match local {
            Some(local) => Conn::Local(local),
            None => {
                let stream = connect_tcp(endpoint).await?;
                net::tune(&stream)?;
                tls::connect(config.tls.as_deref(), stream, endpoint).await?
            }
        };
        open.fetch_add(1, Ordering::Relaxed);
        let mut lane = Lane {
            io: BufReader::with_capacity(READ_BUFFER, stream),
            poll_window,
            may_poll: false,
            next_id: 1,
            header: Vec::new(),
            max_frame: MAX_HELLO_FRAME,
            clean: false,
            remote: None,
            copy_denied: peer.copy_denied.clone(),
            _open: OpenLane(open),
        };
        match hello::open(&mut lane.io, Plane::Data, PeerRole::Client, config.client_id, ticket).await {
            Ok(ack) => {
                lane.max_frame = ack.limits.max_frame.min(Limits::DATA.max_frame) as usize;
                if let Conn::Local(sock) = lane.io.get_ref()
                    && ack.capabilities & caps::LOCAL_COPY != 0
                {
                    lane.remote = RemoteProcess::peer_of(sock)
                        .inspect_err(|e| tracing::debug!(endpoint, error = %e, "no local copies on this lane"))
                        .ok();
                    peer.copies.fetch_or(lane.remote.is_some(), Ordering::Relaxed);
                }
            }
            Err(HandshakeError::Refused(refusal)) => return Err(TransferError::Refused(refusal.code)),
            Err(HandshakeError::Protocol(e)) => return Err(e.into()),
            Err(HandshakeError::Io(e)) => return Err(io_error(e)),
            Err(HandshakeError::Timeout) => return Err(TransferError::Timeout),
            Err(HandshakeError::Unauthenticated(why)) => return Err(io_error(io::Error::other(why.to_string()))),
        }
        lane.clean = true;
        Ok(lane)
    }

    /// Whether an idle lane still looks usable: nothing buffered and the socket neither at EOF nor holding
    /// unsolicited bytes (best effort; a peer close not yet seen surfaces as an error on the next exchange).
    fn is_healthy(&mut self) -> bool {
        if !self.io.buffer().is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.io.get_mut().try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        id
    }

    /// Whether this lane copies a transfer of `len` bytes itself (`vm`) rather than carrying its bytes.
    fn copies(&self, len: usize) -> bool {
        self.remote.is_some() && len >= LOCAL_COPY_MIN && !self.copy_denied.load(Ordering::Relaxed)
    }

    /// One transfer by local copy (`Lane::locate_and_copy`); `Ok(None)` when the kernel denied the copy (the lane
    /// stays usable, the range released: the caller sends the bytes instead).
    async fn locally(
        &mut self,
        place: &Place,
        offset: u64,
        len: usize,
        write: bool,
        mut copy: impl FnMut(&RemoteProcess, u64) -> Result<u32, CopyError>,
    ) -> Result<Option<u32>, TransferError> {
        let (mut done, denied) =
            self.locate_and_copy(&[(0, place.clone(), offset, len)], write, |_, r, at| copy(r, at)).await;
        if !denied.is_empty() {
            return Ok(None);
        }
        done.pop().map_or(Err(TransferError::Closed), |(_, r)| r.map(Some))
    }

    /// One `Attach` exchange: the node's attachment (its segments still to be taken, then released).
    async fn attach(&mut self) -> Result<Attachment, TransferError> {
        let id = self.next_id();
        let attach = Head::encode(id, &TransferRequest::Attach, 0)?;
        self.send(&mut [IoSlice::new(attach.as_bytes())]).await?;
        match self.response(id).await? {
            (TransferResponse::Attached(attachment), 0) => Ok(attachment),
            (TransferResponse::Error(code), 0) => Err(TransferError::Refused(code)),
            _ => Err(WireError::Malformed("unexpected reply to an attach").into()),
        }
    }

    /// Releases every range this lane located, and waits for that: the caller's next request, on whatever lane,
    /// must find them free (a get right after its put).
    async fn release(&mut self) -> Result<(), TransferError> {
        let id = self.next_id();
        let release = Head::encode(id, &TransferRequest::Release, 0)?;
        self.send(&mut [IoSlice::new(release.as_bytes())]).await?;
        match self.response(id).await? {
            (TransferResponse::Released, 0) => Ok(()),
            _ => Err(WireError::Malformed("unexpected reply to a release").into()),
        }
    }

    /// One WRITE exchange of `data`; returns its crc32c, summed as it is sent, if `checksum`.
    async fn write(&mut self, place: &Place, offset: u64, data: &[u8], checksum: bool) -> Result<u32, TransferError> {
        if self.copies(data.len())
            && let Some(crc) =
                self.locally(place, offset, data.len(), true, |r, at| r.write(at, data, checksum)).await?
        {
            return Ok(crc);
        }
        self.clean = false;
        let id = self.next_id();
        let grant = GrantSlots::default().use_of(place.grant.as_ref());
        let req = TransferRequest::Write { segment: place.segment, offset, grant };
        let head = Head::encode(id, &req, data.len())?;
        self.check_size(head.as_bytes().len() + data.len())?;
        // Header and payload in vectored writes, the payload straight from the caller's buffer.
        let crc = if checksum {
            self.send_summed(head.as_bytes(), data).await?
        } else {
            self.send(&mut [IoSlice::new(head.as_bytes()), IoSlice::new(data)]).await?;
            0
        };
        match self.response(id).await? {
            (TransferResponse::Written, 0) => {
                self.clean = true;
                Ok(crc)
            }
            (TransferResponse::Error(code), 0) => {
                self.clean = true;
                Err(TransferError::Refused(code))
            }
            _ => Err(WireError::Malformed("unexpected reply to a write").into()),
        }
    }

    /// One READ exchange into `buf`; returns the crc32c of the bytes, summed as they land, if `checksum`.
    async fn read(&mut self, place: &Place, offset: u64, buf: &mut [u8], checksum: bool) -> Result<u32, TransferError> {
        if self.copies(buf.len())
            && let Some(crc) = self.locally(place, offset, buf.len(), false, |r, at| r.read(at, buf, checksum)).await?
        {
            return Ok(crc);
        }
        self.clean = false;
        let id = self.next_id();
        let grant = GrantSlots::default().use_of(place.grant.as_ref());
        let req = TransferRequest::Read { segment: place.segment, offset, length: buf.len() as u64, grant };
        let head = Head::encode(id, &req, 0)?;
        self.check_size(head.as_bytes().len() + buf.len())?;
        self.send(&mut [IoSlice::new(head.as_bytes())]).await?;
        match self.response(id).await? {
            (TransferResponse::Data, payload_len) if payload_len == buf.len() => {
                let crc = self.receive_data(buf, checksum).await?;
                self.clean = true;
                Ok(crc)
            }
            (TransferResponse::Error(code), 0) => {
                self.clean = true;
                Err(TransferError::Refused(code))
            }
            _ => Err(WireError::Malformed("unexpected reply to a read").into()),
        }
    }

    /// Receives a DATA reply's payload straight from the socket into `buf`; returns its crc32c, summed piece by
    /// piece as it lands, if `checksum` (else 0).
    async fn receive_data(&mut self, buf: &mut [u8], checksum: bool) -> Result<u32, TransferError> {
        let poll_window = self.payload_poll_window();
        let mut crc = 0;
        let sum = |piece: &[u8]| {
            if checksum {
                crc = crc32c::crc32c_append(crc, piece);
            }
        };
        net::read_payload(&mut self.io, buf, |s| poll::until_readable(s, poll_window), sum).await.map_err(io_error)?;
        Ok(crc)
    }

    fn check_size(&self, wire_len: usize) -> Result<(), TransferError> {
        // The prefix's 4-byte length field is not part of the frame length.
        let len = wire_len - 4;
        if len > self.max_frame {
            return Err(WireError::FrameTooLarge { len, max: self.max_frame }.into());
        }
        Ok(())
    }

    /// Sends a request: `bufs` whole, then a flush (over TLS the last record may wait in rustls until then).
    async fn send(&mut self, bufs: &mut [IoSlice<'_>]) -> Result<(), TransferError> {
        frames::write_all_vectored(self.io.get_mut(), bufs).await.map_err(io_error)?;
        self.io.get_mut().flush().await.map_err(io_error)
    }

    /// Sends `head` then `data` in pieces of at most [`SUM_PIECE`] bytes, summing each piece of `data` right
    /// after the kernel copied it (so it is read from cache, while the peer receives it); returns the crc32c.
    async fn send_summed(&mut self, mut head: &[u8], data: &[u8]) -> Result<u32, TransferError> {
        let (mut crc, mut sent) = (0, 0);
        while !head.is_empty() || sent < data.len() {
            let piece = &data[sent..(sent + SUM_PIECE).min(data.len())];
            let n =
                self.io.get_mut().write_vectored(&[IoSlice::new(head), IoSlice::new(piece)]).await.map_err(io_error)?;
            if n == 0 {
                return Err(io_error(io::ErrorKind::WriteZero.into()));
            }
            let from_head = n.min(head.len());
            head = &head[from_head..];
            let payload = &piece[..n - from_head];
            crc = crc32c::crc32c_append(crc, payload);
            sent += payload.len();
        }
        self.io.get_mut().flush().await.map_err(io_error)?;
        Ok(crc)
    }

    /// How long to poll a dry socket mid-payload: the poll window while this is the client's only exchange, else never.
    fn payload_poll_window(&self) -> Duration {
        if self.may_poll { self.poll_window } else { Duration::ZERO }
    }

    /// Polls (bounded by `poll_window`) until the reply's first bytes are readable, so the task finds them without
    /// parking its thread (see `TransferConfig::poll_window`).
    fn poll_until_readable(&self) {
        if self.may_poll && self.io.buffer().is_empty() {
            poll::until_readable(&self.io.socket(), self.poll_window);
        }
    }

    /// Reads a reply's prefix and header (kept in `self.header`); returns its request id and payload length.
    async fn reply_header(&mut self) -> Result<(u64, usize), TransferError> {
        self.poll_until_readable();
        let shape = match frames::read_shape(&mut self.io, self.max_frame).await {
            Ok(shape) => shape,
            Err(ShapeError::Io(e)) => return Err(io_error(e)),
            Err(ShapeError::Wire(e)) => return Err(e.into()),
        };
        self.header.resize(shape.header_len, 0);
        self.io.read_exact(&mut self.header).await.map_err(io_error)?;
        let (id, _) = postcard::take_from_bytes::<u64>(&self.header).map_err(decode_error)?;
        Ok((id, shape.payload_len))
    }

    /// Decodes the message of the header in `self.header` (what follows the request id).
    fn message<T: DeserializeOwned>(&self) -> Result<T, TransferError> {
        let (_, body) = postcard::take_from_bytes::<u64>(&self.header).map_err(decode_error)?;
        postcard::from_bytes(body).map_err(decode_error)
    }

    /// Reads the reply to request `id`: the response and its payload length (the payload is still unread).
    async fn response(&mut self, id: u64) -> Result<(TransferResponse, usize), TransferError> {
        let (rid, payload_len) = self.reply_header().await?;
        if rid == 0 {
            // An error frame: the server found our request malformed and is closing the connection.
            let frame: ErrorFrame = self.message()?;
            tracing::debug!(code = %frame.code, message = %frame.message, "transfer server closed the lane");
            return Err(TransferError::Refused(frame.code));
        }
        if rid != id {
            return Err(WireError::Malformed("reply for another request").into());
        }
        Ok((self.message()?, payload_len))
    }
}

fn decode_error(e: postcard::Error) -> TransferError {
    TransferError::Protocol(WireError::Decode(e.to_string()))
}

/// A TCP connection to the first of `endpoint`'s addresses that accepts one.
async fn connect_tcp(endpoint: &str) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{endpoint} resolves to no address"));
    for addr in tokio::net::lookup_host(endpoint).await? {
        match connect_addr(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

async fn connect_addr(addr: SocketAddr) -> io::Result<TcpStream> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    net::size_buffers(&socket)?;
    socket.set_nodelay(true)?;
    socket.connect(addr).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::{SegmentMemory, TransferServer};

    /// A node on this host whose memory the kernel will not let the client copy to: the lane carries the bytes
    /// instead, and the peer's lanes do not try again.
    #[tokio::test(flavor = "current_thread")]
    async fn a_denied_local_copy_falls_back_to_the_lane_and_is_not_tried_again() {
        let segments = SegmentRegistry::new();
        let segment = SegmentId::random();
        let mem = Arc::new(SegmentMemory::anonymous(8 << 20).unwrap());
        segments.register(segment, mem.clone());
        let server = TransferServer::bind("127.0.0.1:0".parse().unwrap(), segments).unwrap();
        let endpoint = server.local_addr().to_string();
        let server = server.with_local_lanes(Some(endpoint.clone())).spawn().unwrap();
        let config = TransferConfig { lanes_per_peer: 1, ..TransferConfig::default() };
        let client = TransferClient::new(config, SegmentRegistry::new());
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        crate::vm::DENY.with(|deny| deny.set(true));
        client.write_from(&endpoint, segment, 0, &data).await.unwrap();
        assert_eq!(server.stats().located, 1, "the copy was tried");
        assert!(*mem.lease(0, data.len() as u64).unwrap() == data[..], "the lane carried the bytes, the range free");
        let mut back = vec![0u8; data.len()];
        client.read_into(&endpoint, segment, 0, &mut back).await.unwrap();
        assert!(back == data);
        let stats = server.stats();
        assert_eq!((stats.located, stats.local_accepted), (1, 1), "not tried again, on the same local lane");

        // A batch: every range located in one run, the first copy denied, all of them carried by the lane after
        // their release (else the writes would find their own ranges held).
        let client = TransferClient::new(
            TransferConfig { lanes_per_peer: 1, ..TransferConfig::default() },
            SegmentRegistry::new(),
        );
        let items: Vec<BatchWrite<'_>> =
            (0..3u64).map(|i| BatchWrite { segment, grant: None, offset: i << 20, data: &data[..128 << 10] }).collect();
        assert!(client.write_batch(&endpoint, &items).await.iter().all(Result::is_ok));
        assert_eq!(server.stats().located, 4, "all three located");
        for i in 0..3u64 {
            assert!(*mem.lease(i << 20, 128 << 10).unwrap() == data[..128 << 10], "range {i} written and free");
        }
    }
}
