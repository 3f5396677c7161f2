//! `MooncakeDistributedStore`: the original's Python store class on the Crescent client.
//!
//! Conventions kept from the original: store failures never raise, they return `0`/a negative error code
//! (or lists of them, `b""`, `None`); only wrong argument types raise `TypeError`. Every call that talks to the
//! cluster releases the GIL and runs on the store's own tokio runtime. A store set up with
//! `global_segment_size > 0` hosts that segment in this process like a storage node (its memory reserved, not
//! touched until used) and serves other clients' reads and writes from it; `close()` unmounts it.

use crate::config::{ReplicateConfig, parse_size};
use crate::raw::{FreshBytes, Registered, Span};
use crate::replica::ReplicaDescriptor;
use crescent_client::{Client, ClientConfig, ClientError, MasterAddress, ReadSession, WriteSession};
use crescent_net::auth::{CredentialSource, Keyring};
use crescent_net::host::NodeKeys;
use crescent_net::tls::{Tls, TlsFiles};
use crescent_node::{NodeConfig, Prefault, SegmentControl, StorageNode};
use crescent_proto::wire::{Batch, MAX_BATCH, WireKey};
use crescent_proto::{ErrorCode, MasterRequest, MasterResponse, Principal, SegmentId, TenantId};
use crescent_transfer::{Attached, SegmentMemory, SegmentRegistry, TransferClient, TransferConfig, TransferError};
use futures_util::future::join_all;
use parking_lot::{Mutex, RwLock};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyString, PyTuple};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// `INVALID_PARAMS`: a bad argument value, an unregistered or too-small buffer, mismatched list lengths.
const INVALID: i64 = ErrorCode::InvalidParams as i64;
/// What a call on a store that is not set up (or closed) returns (`INTERNAL_ERROR`).
const NOT_SET_UP: i64 = ErrorCode::InternalError as i64;
/// `TRANSFER_FAIL`, what the original answers a read whose destination does not match the object.
const TRANSFER_FAIL: i64 = ErrorCode::TransferFail as i64;
/// A read of a session whose lease ran out.
const LEASE_EXPIRED: i64 = ErrorCode::LeaseExpired as i64;
/// No room for an object (`NO_AVAILABLE_HANDLE`, the code engines back off on).
const NO_ROOM: i64 = ErrorCode::NoAvailableHandle as i64;

/// The numeric code of a client error.
fn code(e: &ClientError) -> i64 {
    i64::from(e.code().as_i32())
}

/// The code of a failed read into caller memory: a destination smaller than the object is `INVALID_PARAMS`, as
/// the original answers it (its buffers are checked against the object's size before any transfer).
fn read_code(e: &ClientError) -> i64 {
    match e.code() {
        ErrorCode::BufferOverflow => INVALID,
        _ => code(e),
    }
}

/// A write's wire config.
type WireConfig = crescent_proto::ReplicateConfig;

/// `0` or the error's code.
fn status(r: Result<(), ClientError>) -> i64 {
    r.map_or_else(|e| code(&e), |()| 0)
}

/// A set-up store: its runtimes, client and (when it contributes memory) its segment.
struct Live {
    /// Drives the client's calls on the calling threads (`block_on` from each; threads calling at once take turns
    /// driving the sockets), so a reply never waits for a runtime thread to be woken (on a busy machine a
    /// cross-thread wake-up can cost a scheduler time slice per request).
    rt: tokio::runtime::Runtime,
    /// Serves the hosted segments (their data plane and pings) on threads of its own; built at setup for a store
    /// that contributes a segment, else by its first `mount_segment` / `allocate_and_mount_segment`.
    node_rt: OnceLock<tokio::runtime::Runtime>,
    client: Client,
    /// The node hosting the store's segments: started at setup with `global_segment_size > 0`, else by its first
    /// run-time mount.
    node: Mutex<Option<StorageNode>>,
    /// What a node started later needs (a client-only store's first run-time mount).
    seed: NodeSeed,
    /// The segments mounted at run time, by id: mapped from a file (`mount_segment`) or allocated
    /// (`allocate_and_mount_segment`); each unmount call takes only its own kind, as the original's.
    added: Mutex<HashMap<SegmentId, Added>>,
    /// `host:port`, what `get_hostname()` returns.
    hostname: String,
    /// The staging limit of the copying calls.
    local_buffer: u64,
    tenant: String,
    /// For a store attached to a node on its host (`setup_dummy`): the node's segment name, where a write that
    /// names no preferred segment goes first (its copies there are memory copies); full, the cluster's
    /// placement decides.
    prefer: Option<String>,
}

/// How a segment mounted at run time got its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Added {
    /// A file's range mapped by `mount_segment`.
    Mapped,
    /// Memory `allocate_and_mount_segment` allocated.
    Allocated,
}

/// What starting a storage node later takes: the master, where to listen, how to prove itself.
struct NodeSeed {
    master: String,
    ip: IpAddr,
    keys: Option<Arc<NodeKeys>>,
    tls: Tls,
}

/// The original's `Slab::kSize`: `allocate_and_mount_segment` rounds sizes up to a multiple of it.
const SLAB: u64 = 16 << 20;

/// What the run-time segment calls answer for a failure of their own (the original's `-1`).
const FAILED: i64 = -1;

/// The runtime a store's hosted segments are served on. Sized and polling as `crescent node`'s runtime: half
/// the cores (one on 2), and a worker about to sleep polls the process's server connections for 50 µs first, so
/// the next request finds it awake. Two workers on the 2-vCPU VM served 4 MiB reads at 1.15–1.66 GB/s, one at
/// 1.93–2.06 (one receiving client, `bench_store.py`'s topology): the client and the segment's one worker each
/// keep a core.
fn node_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads((cpus / 2).max(1))
        .thread_name("crescent-segment")
        .on_thread_park(crescent_net::poll::idle_park_hook(crescent_net::poll::DEFAULT_POLL_WINDOW))
        .enable_all()
        .build()
}

/// A segment id as the caller gave it: Crescent's form (a UUID, what these calls and replica descriptors
/// answer) or the original's (`HIGH-LOW`, two decimal 64-bit halves).
fn parse_segment_id(s: &str) -> Option<SegmentId> {
    if let Ok(id) = s.parse() {
        return Some(id);
    }
    let (high, low) = s.split_once('-')?;
    Some(SegmentId::from_u64_pair(high.parse().ok()?, low.parse().ok()?))
}

impl Live {
    /// The node's runtime, built now if the store has none yet.
    fn node_runtime(&self) -> Result<&tokio::runtime::Runtime, i64> {
        if let Some(rt) = self.node_rt.get() {
            return Ok(rt);
        }
        let rt = node_runtime().map_err(|e| {
            tracing::error!("no runtime for hosted segments: {e}");
            FAILED
        })?;
        // Two first mounts at once: one runtime is kept, the other dropped unused.
        let _ = self.node_rt.set(rt);
        self.node_rt.get().ok_or(FAILED)
    }

    /// The control of the node hosting the store's segments, starting one (no segment of its own, listening on
    /// the store's `host:port`) for a store that had none. No lock is held while it starts: two first mounts at
    /// once may each start one, and the one not kept is shut down.
    fn segment_control(&self) -> Result<(&tokio::runtime::Runtime, SegmentControl), i64> {
        if let Some(node) = self.node.lock().as_ref() {
            return Ok((self.node_runtime()?, node.control()));
        }
        if self.seed.tls.client.is_some() && self.seed.tls.server.is_none() {
            // As `setup` refuses a hosted segment: its peers would dial it through TLS, as every node.
            tracing::error!("mount: serving a segment in a TLS cluster needs a certificate (tls_cert and tls_key)");
            return Err(FAILED);
        }
        let rt = self.node_runtime()?;
        let (host, port) = split_host(&self.hostname);
        let mut listen = port;
        let mut attempts = 0;
        let node = loop {
            let Some(port) = listen.or_else(|| free_port(self.seed.ip)) else {
                tracing::error!("mount: no free port for {host} in {:?}", port_range());
                return Err(FAILED);
            };
            let mut nc = NodeConfig::new(self.seed.master.clone(), 0);
            nc.segments = 0;
            nc.listen = SocketAddr::new(self.seed.ip, port);
            // Named as the store (`get_hostname()`), as the original names every segment a store mounts; an
            // attached store has no hostname (the master refuses an unnamed segment): named after where it listens.
            let name = if self.hostname.is_empty() { nc.listen.to_string() } else { self.hostname.clone() };
            nc.name = Some(name.clone());
            nc.host_id = Some(name);
            // Its segments are mounted at run time, each backed as `mount` says.
            nc.prefault = Prefault::Off;
            nc.keys = self.seed.keys.clone();
            nc.tls = self.seed.tls.clone();
            match rt.block_on(StorageNode::start(nc)) {
                Ok(node) => break node,
                Err(ClientError::Listen { source, .. })
                    if source.kind() == std::io::ErrorKind::AddrInUse && attempts < 8 =>
                {
                    attempts += 1;
                    listen = None;
                }
                Err(e) => {
                    tracing::error!("mount: cannot start serving segments: {e}");
                    return Err(FAILED);
                }
            }
        };
        let mut slot = self.node.lock();
        if let Some(kept) = slot.as_ref() {
            let control = kept.control();
            drop(slot);
            if let Err(e) = rt.block_on(node.shutdown(Duration::ZERO)) {
                tracing::debug!("mount: a node started twice: {e}");
            }
            return Ok((rt, control));
        }
        let control = node.control();
        *slot = Some(node);
        Ok((rt, control))
    }

    /// Mounts `memory` as one more segment of the store; its id, or `-1`.
    fn mount(&self, memory: SegmentMemory, kind: Added) -> Result<SegmentId, i64> {
        let (rt, control) = self.segment_control()?;
        let prefault = if kind == Added::Allocated { store_prefault() } else { Prefault::Off };
        match rt.block_on(control.mount(Arc::new(memory), prefault)) {
            Ok(spec) => {
                self.added.lock().insert(spec.id, kind);
                Ok(spec.id)
            }
            Err(e) => {
                tracing::error!("mount_segment: the master refused the segment: {e}");
                Err(FAILED)
            }
        }
    }

    /// Unmounts the run-time segments `ids` of `kind`, as the original's `unmountSegment` /
    /// `unmountAndFreeSegment`: 0, or the first failure (`-1` for an id that is not one of them, else the code
    /// the master answered); an id that failed keeps its segment.
    fn unmount(&self, ids: &[String], grace: Duration, kind: Added) -> i64 {
        let mut first = 0;
        let mut fail = |c: i64| {
            if first == 0 {
                first = c;
            }
        };
        let mut todo = Vec::new();
        {
            let added = self.added.lock();
            for text in ids {
                match parse_segment_id(text) {
                    None => {
                        tracing::error!("unmount: invalid segment id {text:?}");
                        fail(FAILED);
                    }
                    Some(id) if added.get(&id) == Some(&kind) => todo.push(id),
                    Some(_) => {
                        tracing::error!("unmount: segment {text} was not mounted by this call's counterpart");
                        fail(FAILED);
                    }
                }
            }
        }
        if todo.is_empty() {
            return first;
        }
        let control = match self.node.lock().as_ref() {
            Some(node) => node.control(),
            None => return FAILED,
        };
        let Some(rt) = self.node_rt.get() else { return FAILED };
        for id in todo {
            match rt.block_on(control.unmount(id, grace)) {
                Ok(_) => {
                    self.added.lock().remove(&id);
                }
                Err(e) => {
                    tracing::error!("unmount of segment {id} failed: {e}");
                    fail(code(&e));
                }
            }
        }
        first
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// The wire configs of a batch of `n` keys, each with the keys (indices) it applies to: one config for all,
    /// or, when `group_ids` names one group per key, one config per distinct group. `None` if `cfg` is invalid
    /// (a `group_ids` of several ids but not one per key, among others).
    fn wire_batch(&self, cfg: Option<&ReplicateConfig>, n: usize) -> Option<Vec<(WireConfig, Vec<usize>)>> {
        match cfg.and_then(|c| c.group_ids.as_ref().map(|g| (c, g))) {
            Some((c, ids)) if ids.len() > 1 => {
                if ids.len() != n {
                    return None;
                }
                let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
                for (i, id) in ids.iter().enumerate() {
                    match groups.iter_mut().find(|(g, _)| *g == id.as_str()) {
                        Some((_, idx)) => idx.push(i),
                        None => groups.push((id.as_str(), vec![i])),
                    }
                }
                groups.into_iter().map(|(g, idx)| c.to_proto(Some(g)).map(|w| (self.placed(w), idx))).collect()
            }
            _ => self.wire(cfg).map(|w| vec![(w, (0..n).collect())]),
        }
    }

    /// The wire config for `cfg` (default when `None`); `None` if `cfg` is invalid.
    fn wire(&self, cfg: Option<&ReplicateConfig>) -> Option<crescent_proto::ReplicateConfig> {
        match cfg {
            Some(c) => c.to_proto(None),
            None => ReplicateConfig::default().to_proto(None),
        }
        .map(|w| self.placed(w))
    }

    /// `w` with the attached node's segment preferred when it prefers none (see [`Live::prefer`]).
    fn placed(&self, mut w: WireConfig) -> WireConfig {
        if let Some(name) = &self.prefer
            && w.preferred_segments.is_empty()
        {
            w.preferred_segments.push(name.clone());
        }
        w
    }
}

/// The arguments of `setup`, in either form (default: none given, as for `setup_dummy`).
#[derive(Debug, Default)]
struct SetupArgs {
    local_hostname: String,
    global_segment_size: u64,
    local_buffer_size: u64,
    protocol: String,
    master_server_addr: String,
    tenant_id: String,
    /// `PRINCIPAL:KEYHEX` from `setup`'s extras (else the environment's, see [`auth`]).
    credential: Option<String>,
    /// The credential a hosted segment is served with, when not `credential` (see [`auth`]).
    host_credential: Option<String>,
    /// TLS files from `setup`'s extras, each over its `CRESCENT_TLS_*` variable (see [`tls`]).
    tls: TlsExtras,
    /// The original's `enable_ssd_offload`, `ssd_offload_path` and the extra `ssd_offload_size` (see
    /// [`disk_tier`]).
    offload: OffloadArgs,
}

/// `setup`'s SSD offload arguments, as given.
#[derive(Debug, Default)]
struct OffloadArgs {
    enabled: bool,
    path: String,
    size: Option<u64>,
}

/// How a store backs the memory it hosts ahead of the writes: `spare` (the default: as far as the host can spare,
/// see [`Prefault::Spare`]), `whole` (all of it, as a storage node) or `off` (as it is first written).
pub const PREFAULT_ENV: &str = "CRESCENT_STORE_PREFAULT";

/// The backing [`PREFAULT_ENV`] asks for.
fn store_prefault() -> Prefault {
    prefault_named(std::env::var(PREFAULT_ENV).ok().as_deref())
}

/// The backing a [`PREFAULT_ENV`] value names (none or empty: the default; an unknown one is said and the
/// default kept).
fn prefault_named(value: Option<&str>) -> Prefault {
    match value.map(str::trim) {
        None | Some("" | "spare") => Prefault::Spare,
        Some("whole") => Prefault::Whole,
        Some("off") => Prefault::Off,
        Some(other) => {
            tracing::warn!("{PREFAULT_ENV}={other:?} is not spare, whole or off: spare");
            Prefault::Spare
        }
    }
}

/// The original's variable for the offload directory, when `ssd_offload_path` is empty.
const OFFLOAD_PATH_ENV: &str = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH";
/// The original's variable for the offload size, when `ssd_offload_size` is not given.
const OFFLOAD_SIZE_ENV: &str = "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES";

/// The hosted segment's disk tier from `setup`'s offload arguments: with `enable_ssd_offload`, in
/// `ssd_offload_path` (else `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`), of `ssd_offload_size` bytes (else
/// `MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES`, else 4 × `global_segment_size`), rounded down to whole 4 KiB blocks.
/// `None` without the flag or without a segment to offload from (both warned about); `INVALID` when enabled with
/// no directory or no usable size.
fn disk_tier(args: &SetupArgs) -> Result<Option<crescent_node::DiskSettings>, i64> {
    let o = &args.offload;
    if !o.enabled {
        if !o.path.is_empty() || o.size.is_some() {
            tracing::warn!(
                "setup: ssd_offload_path/ssd_offload_size without enable_ssd_offload=True: no disk tier (the flag \
                 turns offload on)"
            );
        }
        return Ok(None);
    }
    if args.global_segment_size == 0 {
        tracing::warn!(
            "setup: enable_ssd_offload with global_segment_size 0: this store hosts no memory to offload from; no \
             disk tier"
        );
        return Ok(None);
    }
    let env = |k: &str| std::env::var(k).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    let dir = if o.path.trim().is_empty() { env(OFFLOAD_PATH_ENV) } else { Some(o.path.trim().to_owned()) };
    let Some(dir) = dir else {
        tracing::error!(
            "setup: enable_ssd_offload=True needs a directory on the SSD: ssd_offload_path, or {OFFLOAD_PATH_ENV}"
        );
        return Err(INVALID);
    };
    let size = match (o.size, env(OFFLOAD_SIZE_ENV)) {
        (Some(size), _) => size,
        (None, Some(text)) => match parse_size(&text) {
            Some(size) => size,
            None => {
                tracing::error!("setup: {OFFLOAD_SIZE_ENV}={text:?} is not a size");
                return Err(INVALID);
            }
        },
        (None, None) => args.global_segment_size.saturating_mul(4),
    };
    let block = crescent_proto::DISK_BLOCK;
    let size = size / block * block;
    if size == 0 {
        tracing::error!("setup: the SSD offload size must be at least one {block}-byte block");
        return Err(INVALID);
    }
    Ok(Some(crescent_node::DiskSettings { dir: dir.into(), size }))
}

/// `setup`'s TLS extras (`tls_cert`, `tls_key`, `tls_ca`, `tls_client_ca`, `tls_server_name`), as
/// [`crescent_net::tls::TlsFiles`] names them.
#[derive(Debug, Default)]
struct TlsExtras {
    cert: Option<String>,
    key: Option<String>,
    ca: Option<String>,
    client_ca: Option<String>,
    server_name: Option<String>,
}

impl TlsExtras {
    /// The environment's files with each extra given in place of its variable.
    fn over_env(&self) -> TlsFiles {
        let mut f = TlsFiles::from_env();
        let path = |v: &Option<String>| v.as_ref().filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
        f.cert = path(&self.cert).or(f.cert);
        f.key = path(&self.key).or(f.key);
        f.ca = path(&self.ca).or(f.ca);
        f.client_ca = path(&self.client_ca).or(f.client_ca);
        f.server_name = self.server_name.clone().filter(|v| !v.is_empty()).or(f.server_name);
        f
    }
}

/// A bytes-like value from Python: borrowed when it is `bytes` (immutable), copied otherwise.
enum Value<'py> {
    Bytes(Bound<'py, PyBytes>),
    Owned(Vec<u8>),
}

impl<'py> Value<'py> {
    /// `value` as bytes: `bytes` borrowed, `bytearray` copied, any other buffer (memoryview, array, numpy...)
    /// through `bytes(value)`; an int, a str or a non-buffer is a `TypeError`.
    fn from_py(value: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(b) = value.cast::<PyBytes>() {
            return Ok(Value::Bytes(b.clone()));
        }
        if let Ok(b) = value.cast::<PyByteArray>() {
            return Ok(Value::Owned(b.to_vec()));
        }
        if value.is_instance_of::<pyo3::types::PyInt>() || value.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(format!(
                "a bytes-like object is required, not {}",
                value.get_type().name()?
            )));
        }
        let bytes = value.py().get_type::<PyBytes>().call1((value,))?;
        Ok(Value::Bytes(bytes.cast_into::<PyBytes>()?))
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Value::Bytes(b) => b.as_bytes(),
            Value::Owned(v) => v,
        }
    }
}

/// The class `BufferHandle` (a `bytes` subclass with `ptr()` and `size()`, defined in Python so it has the
/// buffer protocol on every Python version).
fn buffer_handle(data: Bound<'_, PyBytes>) -> PyResult<Bound<'_, PyAny>> {
    let class = data.py().import("crescent._buffer")?.getattr("BufferHandle")?;
    class.call1((data,))
}

/// Values at least this large are read straight into a new `bytes` (taking the GIL mid-call to make it); smaller
/// ones land in a staging vector copied into a `bytes` afterwards, which costs less than a second GIL hand-off.
const DIRECT_BYTES_MIN: u64 = 64 << 10;

/// A value read by a copying call, on its way to becoming a Python `bytes`.
enum Fetched {
    /// A small value, staged.
    Staged(Vec<u8>),
    /// A large value, read in place.
    Direct(FreshBytes),
}

impl Fetched {
    /// A buffer for a value of `size` bytes, or `BufferTooSmall` past the store's staging limit.
    fn for_size(size: u64, limit: u64) -> Result<Self, ClientError> {
        let too_big = || ClientError::BufferTooSmall { need: size, have: usize::try_from(limit).unwrap_or(usize::MAX) };
        let len = usize::try_from(size).map_err(|_| too_big())?;
        if size > limit {
            Err(too_big())
        } else if size < DIRECT_BYTES_MIN {
            Ok(Fetched::Staged(vec![0; len]))
        } else {
            FreshBytes::new(len).map(Fetched::Direct).map_err(|e| {
                tracing::warn!("no bytes object of {len} bytes: {e}");
                ClientError::Code(ErrorCode::InternalError)
            })
        }
    }

    fn into_bytes(self, py: Python<'_>) -> Bound<'_, PyBytes> {
        match self {
            Fetched::Staged(v) => PyBytes::new(py, &v),
            Fetched::Direct(b) => b.into_bytes(py),
        }
    }
}

impl AsMut<[u8]> for Fetched {
    fn as_mut(&mut self) -> &mut [u8] {
        match self {
            Fetched::Staged(v) => v,
            Fetched::Direct(b) => b.as_mut(),
        }
    }
}

/// The address of a `bytes` object's data (for `BufferHandle.ptr()`).
#[pyfunction]
pub fn _bytes_address(b: &Bound<'_, PyBytes>) -> usize {
    b.as_bytes().as_ptr() as usize
}

/// The original's `MooncakeDistributedStore` on the Crescent client.
// `subclass`: `crescent.store.MooncakeDistributedStore` adds the tensor calls (written in Python) to this class.
#[pyclass(module = "crescent.store", name = "MooncakeDistributedStore", subclass)]
pub struct Store {
    live: RwLock<Option<Arc<Live>>>,
    registered: Registered,
    sessions: Mutex<Sessions>,
}

/// A store's open get and put sessions, by key (as the original keeps them, one per key per store).
#[derive(Default)]
struct Sessions {
    get: HashMap<String, Arc<ReadSession>>,
    put: HashMap<String, Arc<PutSession>>,
}

/// A put session: the client's reservation and the object's bytes as the caller's ranges fill them.
struct PutSession {
    session: WriteSession,
    staged: Mutex<Staged>,
}

/// A put session's bytes; once `sealed` (its end or revoke began) no range is taken any more.
struct Staged {
    bytes: Vec<u8>,
    sealed: bool,
}

/// A get session and the checked ranges one call reads of it: `(offset in the object, destination)`.
type SessionRanges = (Arc<ReadSession>, Vec<(u64, Span)>);

/// A put session's reservation and its staging buffer (`None`: no memory for it).
type Reserved = (Option<Vec<u8>>, WriteSession);

/// A zeroed staging buffer of `size` bytes, or `None` when that memory cannot be had (never an abort).
fn staging(size: usize) -> Option<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(size).ok()?;
    v.resize(size, 0);
    Some(v)
}

impl Store {
    fn live(&self) -> Option<Arc<Live>> {
        self.live.read().clone()
    }
}

impl Drop for Store {
    /// A store dropped without `close()` closes itself, as the original's destructor does: its segment is
    /// unmounted at once rather than when the master stops hearing its pings.
    fn drop(&mut self) {
        if let Some(live) = self.live.get_mut().take() {
            stop(live);
        }
    }
}

/// A required positional argument of `setup`'s first form.
fn required<T>(v: Option<T>, name: &str) -> PyResult<T> {
    v.ok_or_else(|| PyTypeError::new_err(format!("setup(): missing required argument {name:?}")))
}

/// A byte count from Python: a non-negative int, else `TypeError` (as the original's binding raises).
fn size_arg(v: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    v.extract::<u64>().map_err(|_| PyTypeError::new_err(format!("{name} must be an int in [0, 2**64), not {v}")))
}

/// The arguments of `setup(dict)`: every value `str()`-converted, sizes parsed; `None` when a required key is
/// missing or a size does not parse.
fn dict_args(d: &Bound<'_, PyDict>) -> PyResult<Option<SetupArgs>> {
    let get = |k: &str| -> PyResult<Option<String>> {
        match d.get_item(k)? {
            Some(v) => Ok(Some(v.str()?.to_string())),
            None => Ok(None),
        }
    };
    let (Some(local_hostname), Some(_metadata)) = (get("local_hostname")?, get("metadata_server")?) else {
        tracing::error!("setup(dict): local_hostname and metadata_server are required");
        return Ok(None);
    };
    let size = |k: &str| -> PyResult<Option<u64>> {
        Ok(match get(k)? {
            None => Some(16 << 20),
            Some(s) => {
                let parsed = parse_size(&s);
                if parsed.is_none() {
                    tracing::error!("setup(dict): {k} {s:?} is not a size");
                }
                parsed
            }
        })
    };
    let (Some(global_segment_size), Some(local_buffer_size)) =
        (size("global_segment_size")?, size("local_buffer_size")?)
    else {
        return Ok(None);
    };
    Ok(Some(SetupArgs {
        local_hostname,
        global_segment_size,
        local_buffer_size,
        protocol: get("protocol")?.unwrap_or_else(|| "tcp".into()),
        master_server_addr: get("master_server_addr")?.unwrap_or_else(|| "127.0.0.1:50051".into()),
        tenant_id: "default".into(),
        credential: get("credential")?,
        host_credential: get("host_credential")?,
        tls: TlsExtras {
            cert: get("tls_cert")?,
            key: get("tls_key")?,
            ca: get("tls_ca")?,
            client_ca: get("tls_client_ca")?,
            server_name: get("tls_server_name")?,
        },
        offload: OffloadArgs {
            enabled: get("enable_ssd_offload")?.is_some_and(|v| flag(&v)),
            path: get("ssd_offload_path")?.unwrap_or_default(),
            size: match get("ssd_offload_size")? {
                None => None,
                Some(s) => match parse_size(&s) {
                    Some(size) => Some(size),
                    None => {
                        tracing::error!("setup(dict): ssd_offload_size {s:?} is not a size");
                        return Ok(None);
                    }
                },
            },
        },
    }))
}

/// A dict value's truth (`str()` of a bool or a number, or a word).
fn flag(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "on")
}

/// A size given as an int or a string (`"64MiB"`).
fn size_or_text(v: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    if let Ok(text) = v.extract::<String>() {
        return parse_size(&text).ok_or_else(|| PyTypeError::new_err(format!("{name} {text:?} is not a size")));
    }
    size_arg(v, name)
}

/// The port range a host name without a port gets a free port from (`MC_STORE_CLIENT_MIN_PORT` /
/// `MC_STORE_CLIENT_MAX_PORT`, default 12300..=14300).
fn port_range() -> (u16, u16) {
    let env = |k: &str, d: u16| std::env::var(k).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(d);
    let (lo, hi) = (env("MC_STORE_CLIENT_MIN_PORT", 12300), env("MC_STORE_CLIENT_MAX_PORT", 14300));
    if lo <= hi { (lo, hi) } else { (hi, lo) }
}

/// A port of the range free on `ip` (probed by binding it), starting at a random place so stores set up at
/// once spread out.
fn free_port(ip: IpAddr) -> Option<u16> {
    let (lo, hi) = port_range();
    let span = u32::from(hi - lo) + 1;
    let start = std::process::id().wrapping_mul(7919).wrapping_add(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos()),
    ) % span;
    (0..span).map(|i| lo + ((start + i) % span) as u16).find(|&p| TcpListener::bind((ip, p)).is_ok())
}

/// `host` or `host:port`.
fn split_host(s: &str) -> (String, Option<u16>) {
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => match p.parse() {
            Ok(port) => (h.to_owned(), Some(port)),
            Err(_) => (s.to_owned(), None),
        },
        _ => (s.to_owned(), None),
    }
}

/// The master address the client and the hosted segment use. An `etcd://` address follows the cluster's
/// leader; the original's form `etcd://h1:p;h2:p` names no cluster, which then comes from `CRESCENT_CLUSTER_ID`,
/// else the original's `MC_STORE_CLUSTER_ID`, else the default. A bad address is `INVALID_PARAMS`.
fn master_address(s: &str) -> Result<String, i64> {
    if !s.trim_start().starts_with("etcd://") {
        return Ok(s.to_owned());
    }
    let env = std::env::var(crescent_client::CLUSTER_ID_ENV).or_else(|_| std::env::var("MC_STORE_CLUSTER_ID")).ok();
    match MasterAddress::parse_with(s, env.as_deref()) {
        Ok(MasterAddress::Etcd { endpoints, cluster }) => Ok(format!("etcd://{}/{cluster}", endpoints.join(","))),
        Ok(MasterAddress::Direct(_)) => Ok(s.to_owned()),
        Err(e) => {
            tracing::error!("setup: {e}");
            Err(INVALID)
        }
    }
}

/// What the store proves to an authenticating cluster, and the keys its hosted segment admits peers and checks
/// grants with (`crescent_net::host`: the store needs no cluster secret). The client's: the credential from
/// `setup` (`credential="PRINCIPAL:KEYHEX"`), else `CRESCENT_CREDENTIAL_FILE` / `CRESCENT_CREDENTIAL`, else
/// `tenant:<tenant_id>` derived from a cluster secret in `CRESCENT_SECRET_FILE` / `CRESCENT_SECRET`. The hosted
/// segment's: `host_credential` from `setup`, else `CRESCENT_HOST_CREDENTIAL_FILE` / `CRESCENT_HOST_CREDENTIAL`,
/// else the client's — a `node:NAME` of its own keeps the stores of one tenant from sharing the keys their
/// segments check grants and tickets with (its segment is mounted by its own connection, under that principal).
fn auth(args: &SetupArgs, tenant: &str) -> Result<(Option<CredentialSource>, Option<Arc<NodeKeys>>), i64> {
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        tracing::error!("setup: {what}: {e}");
        INVALID
    };
    let given = match &args.credential {
        Some(text) => Some(NodeKeys::parse(text).map_err(|e| bad("credential", &e))?),
        None => NodeKeys::from_env().map_err(|e| bad("the credential from the environment", &e))?,
    };
    let keys = match given {
        Some(keys) => Some(keys),
        None => match Keyring::from_env().map_err(|e| bad("the cluster secret", &e))? {
            Some(ring) => {
                let tenant = TenantId::new(tenant).map_err(|e| bad("tenant", &e))?;
                Some(NodeKeys::derived(Arc::new(ring), Principal::Tenant(tenant)))
            }
            None => None,
        },
    }
    .map(Arc::new);
    let host = match &args.host_credential {
        Some(text) => Some(NodeKeys::parse(text).map_err(|e| bad("host_credential", &e))?),
        None => NodeKeys::host_from_env().map_err(|e| bad("the host credential from the environment", &e))?,
    };
    let host = host.map(Arc::new).or_else(|| keys.clone());
    Ok((keys.map(CredentialSource::Host), host))
}

/// The store's TLS, from `setup`'s `tls_*` extras or else `CRESCENT_TLS_CA` (dial the master and nodes through
/// TLS, verifying them), `CRESCENT_TLS_CERT` / `CRESCENT_TLS_KEY` (the client certificate, and what a hosted
/// segment serves) and `CRESCENT_TLS_CLIENT_CA` (a hosted segment requires client certificates). A store that dials through TLS and
/// hosts a segment must serve TLS too: its peers dial it as they dial every node.
fn tls(args: &SetupArgs) -> Result<Tls, i64> {
    let tls = Tls::load(&args.tls.over_env()).map_err(|e| {
        tracing::error!("setup: TLS: {e}");
        INVALID
    })?;
    if tls.client.is_some() && tls.server.is_none() && args.global_segment_size > 0 {
        tracing::error!(
            "setup: hosting a segment (global_segment_size > 0) in a TLS cluster needs a certificate to serve it \
             with (tls_cert and tls_key, or CRESCENT_TLS_CERT and CRESCENT_TLS_KEY)"
        );
        return Err(INVALID);
    }
    Ok(tls)
}

/// Sets a store up: its runtime, its segment (hosted like a storage node's) and its client.
fn start(args: &SetupArgs) -> Result<Live, i64> {
    match args.protocol.to_ascii_lowercase().as_str() {
        "tcp" => {}
        "rdma" => tracing::warn!("protocol \"rdma\" is not supported by Crescent; using TCP"),
        other => {
            tracing::error!("setup: unknown protocol {other:?}");
            return Err(INVALID);
        }
    }
    let master = master_address(&args.master_server_addr)?;
    let tenant = if args.tenant_id == "default" { String::new() } else { args.tenant_id.clone() };
    let (credential, keys) = auth(args, &tenant)?;
    let tls = tls(args)?;
    let (host, port) = split_host(args.local_hostname.trim());
    let ip = (host.as_str(), 0).to_socket_addrs().ok().and_then(|mut a| a.next()).map(|a| a.ip());
    let Some(ip) = ip else {
        tracing::error!("setup: local_hostname {host:?} does not resolve");
        return Err(INVALID);
    };
    let no_runtime = |e: std::io::Error| {
        tracing::error!("setup: no runtime: {e}");
        i64::from(ErrorCode::InternalError.as_i32())
    };
    let disk = disk_tier(args)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(no_runtime)?;
    let node_rt = OnceLock::new();
    if args.global_segment_size > 0 {
        let _ = node_rt.set(node_runtime().map_err(no_runtime)?);
    }
    let registry = SegmentRegistry::default();
    // A port picked here may be taken by another process before the segment's server binds it: pick again.
    let mut attempts = 0;
    // A port given but in use (by another store of this process set up with the same name, say): as the
    // original's (whose transfer engine listens on a free port whatever the name says), the store keeps the name
    // it was given and listens on a free port.
    let taken = port.filter(|&p| args.global_segment_size > 0 && TcpListener::bind((ip, p)).is_err());
    if let Some(p) = taken {
        tracing::warn!("setup: port {p} of {host} is in use; the segment named {host}:{p} listens on a free port");
    }
    let given = port.filter(|_| taken.is_none());
    let (hostname, node) = loop {
        let Some(port) = given.or_else(|| free_port(ip)) else {
            tracing::error!("setup: no free port for {host} in {:?}", port_range());
            return Err(INVALID);
        };
        let hostname = format!("{host}:{}", taken.unwrap_or(port));
        if args.global_segment_size == 0 {
            break (hostname, None);
        }
        let mut nc = NodeConfig::new(master.clone(), args.global_segment_size);
        nc.listen = SocketAddr::new(ip, port);
        // Named as the original names a store's segment, `local_hostname:port` (what get_hostname() returns:
        // engines pass it back as a preferred segment and look for it in the master's listings).
        nc.name = Some(hostname.clone());
        // Backed ahead of the writes as far as the host can spare, without taking what the engine beside it needs
        // (cold writes into pages faulted one by one ran at half the speed).
        nc.prefault = store_prefault();
        nc.host_id = Some(hostname.clone());
        nc.keys = keys.clone();
        nc.tls = tls.clone();
        nc.disk = disk.clone();
        let Some(node_rt) = node_rt.get() else { return Err(NOT_SET_UP) };
        match node_rt.block_on(StorageNode::start_with(nc, registry.clone())) {
            Ok(node) => break (hostname, Some(node)),
            Err(ClientError::Listen { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse && given.is_none() && attempts < 8 =>
            {
                attempts += 1;
            }
            Err(e) => {
                tracing::error!("setup: cannot host a segment of {} bytes: {e}", args.global_segment_size);
                return Err(code(&e));
            }
        }
    };
    let mut config = ClientConfig::new(master.clone()).with_credential(credential).with_tls(tls.client.clone());
    config.tenant = tenant.clone();
    config.host_id = Some(hostname.clone());
    let client = Client::with_local_segments(config, registry);
    if node.is_none() {
        // A client that contributes nothing: check the master answers, as the original's setup does.
        rt.block_on(client.cluster_info()).map_err(|e| {
            tracing::error!("setup: {e}");
            code(&e)
        })?;
    }
    let seed = NodeSeed { master, ip, keys, tls: tls.clone() };
    Ok(Live {
        rt,
        node_rt,
        client,
        node: Mutex::new(node),
        seed,
        added: Mutex::default(),
        hostname,
        local_buffer: args.local_buffer_size,
        tenant,
        prefer: None,
    })
}

/// Attaches a store to the storage node on this host at `server_address` (`setup_dummy`): a `crescent node`, or
/// another process's store that hosts a segment. The node says where its master is, and shares its memfd-backed
/// segments (`crescent node --memfd`), which this process maps: puts and gets of objects there are memory copies
/// in this process, no socket and no other process on the data path; the node's anonymous segments are reached
/// by local copies over its lanes. The store contributes no memory and talks to the master itself. In a cluster
/// that authenticates, the node's lanes admit it only with a ticket, so the master comes from `MOONCAKE_MASTER`
/// (or `CRESCENT_MASTER`) and the credential from the environment, as for `setup`.
fn attach(local_buffer_size: u64, server_address: &str) -> Result<Live, i64> {
    let no_runtime = |e: std::io::Error| {
        tracing::error!("setup_dummy: no runtime: {e}");
        i64::from(ErrorCode::InternalError.as_i32())
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(no_runtime)?;
    let registry = SegmentRegistry::default();
    let endpoints = attach_endpoints(server_address);
    if endpoints.is_empty() {
        tracing::error!("setup_dummy: server_address {server_address:?} is not host:port");
        return Err(INVALID);
    }
    // Unauthenticated clusters: the node says where the master is; an authenticating node refuses a lane without a
    // ticket, which needs the master first.
    let probe = TransferClient::new(TransferConfig::default(), registry.clone());
    let mut found = None;
    let mut refused = false;
    for endpoint in &endpoints {
        match rt.block_on(probe.attach(endpoint, None)) {
            Ok(attached) => {
                found = Some((endpoint.clone(), attached));
                break;
            }
            Err(TransferError::NotLocal(_)) => continue,
            Err(TransferError::Refused(ErrorCode::AuthenticationFailed | ErrorCode::PermissionDenied)) => {
                refused = true;
                break;
            }
            Err(e) => {
                tracing::error!("setup_dummy: attaching to the node at {endpoint}: {e}");
                return Err(i64::from(e.code().as_i32()));
            }
        }
    }
    drop(probe);
    let (credential, keys) = auth(&SetupArgs::default(), "")?;
    // `setup_dummy` names no tenant: a tenant's credential says which one the store acts in (the master refuses
    // its calls in any other).
    let tenant = match credential.as_ref().map(|c| c.current().principal().clone()) {
        Some(Principal::Tenant(t)) if !t.is_default() => t.as_str().to_owned(),
        _ => String::new(),
    };
    let (master, attached, client) = match found {
        Some((_, attached)) => {
            let master = attached.attachment.master.clone();
            let client = attached_client(master.clone(), credential, &tenant, &attached.attachment.host_id, registry)?;
            (master, attached, client)
        }
        None if refused && credential.is_some() => {
            let Some(master) = ["MOONCAKE_MASTER", "CRESCENT_MASTER"].iter().find_map(|v| std::env::var(v).ok()) else {
                tracing::error!(
                    "setup_dummy: the node at {server_address} authenticates its peers; set MOONCAKE_MASTER (or \
                     CRESCENT_MASTER) to the master's address (the lanes' tickets come from it)"
                );
                return Err(i64::from(ErrorCode::AuthenticationFailed.as_i32()));
            };
            let master = master_address(&master)?;
            // The host is not known before attaching: reads rank the mapped segments first regardless.
            let client = attached_client(master.clone(), credential, &tenant, "", registry)?;
            let attached = rt.block_on(attach_with_ticket(&client, &endpoints)).map_err(|e| {
                tracing::error!("setup_dummy: attaching to the node at {server_address}: {e}");
                code(&e)
            })?;
            (master, attached, client)
        }
        None if refused => {
            tracing::error!(
                "setup_dummy: the node at {server_address} authenticates its peers and no credential is set \
                 (CRESCENT_CREDENTIAL_FILE / CRESCENT_CREDENTIAL, or the secret in CRESCENT_SECRET_FILE)"
            );
            return Err(i64::from(ErrorCode::AuthenticationFailed.as_i32()));
        }
        None => {
            tracing::error!(
                "setup_dummy: no storage node on this host answers at {server_address} (start one with `crescent \
                 node --listen {server_address} --memfd`, or a store with a segment there)"
            );
            return Err(INVALID);
        }
    };
    // As the original's setup, the master must answer.
    rt.block_on(client.cluster_info()).map_err(|e| {
        tracing::error!("setup_dummy: the master {master}: {e}");
        code(&e)
    })?;
    let shared: u64 =
        attached.attachment.segments.iter().filter(|s| attached.mapped.contains(&s.segment)).map(|s| s.length).sum();
    tracing::info!(
        "setup_dummy: attached to node {} (master {master}): {} segment(s), {} mapped",
        attached.attachment.name,
        attached.mapped.len(),
        crescent_proto::human::fmt_bytes(shared)
    );
    Ok(Live {
        rt,
        node_rt: std::sync::OnceLock::new(),
        client,
        node: Mutex::new(None),
        // Segments it mounts at run time are served by a node of its own, as a client-only store's.
        // Their node proves the store's credential, as a client-only store's does.
        seed: NodeSeed { master, ip: IpAddr::from([127, 0, 0, 1]), keys, tls: Tls::default() },
        added: Mutex::default(),
        // The original's attached store has no hostname of its own.
        hostname: String::new(),
        local_buffer: local_buffer_size,
        tenant,
        prefer: Some(attached.attachment.name),
    })
}

/// The endpoints a node at `server_address` may advertise: the address as given, and for a loopback or
/// `localhost` address the host's primary address on the same port (a node bound to all interfaces advertises
/// that, and its local lanes are named after what it advertises).
fn attach_endpoints(server_address: &str) -> Vec<String> {
    let (host, Some(port)) = split_host(server_address.trim()) else { return Vec::new() };
    let mut out = vec![format!("{host}:{port}")];
    let loopback =
        host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified());
    if loopback {
        for ip in [crescent_net::advertise::primary_ip(false), IpAddr::from([127, 0, 0, 1])] {
            let e = SocketAddr::new(ip, port).to_string();
            if !out.contains(&e) {
                out.push(e);
            }
        }
    }
    out
}

/// The client of an attached store, acting in `tenant`: no memory of its own, the node's mapped segments as its own.
fn attached_client(
    master: String,
    credential: Option<CredentialSource>,
    tenant: &str,
    host: &str,
    registry: SegmentRegistry,
) -> Result<Client, i64> {
    let mut config = ClientConfig::new(master).with_credential(credential);
    config.tenant = tenant.to_owned();
    config.host_id = Some(host.to_owned()).filter(|h| !h.is_empty());
    Ok(Client::with_local_segments(config, registry))
}

/// Attaches `client`'s data plane to the node at the first of `endpoints` that is one, proving the ticket the
/// master issues for the host of one of its segments.
async fn attach_with_ticket(client: &Client, endpoints: &[String]) -> Result<Attached, ClientError> {
    let info = client.cluster_info().await?;
    for endpoint in endpoints {
        let Some(segment) = info.memories.iter().find(|m| &m.endpoint == endpoint).map(|m| m.segment) else {
            continue;
        };
        return client.transfer().attach(endpoint, Some(segment)).await.map_err(ClientError::from);
    }
    Err(ClientError::from(TransferError::NotLocal(endpoints.join(" or "))))
}

/// Ends a store: unmounts its segment (objects held only there are gone), flushes deferred lease releases and
/// stops its runtime.
fn stop(live: Arc<Live>) {
    let node = live.node.lock().take();
    if let (Some(node), Some(node_rt)) = (node, live.node_rt.get())
        && let Err(e) = node_rt.block_on(node.shutdown(Duration::ZERO))
    {
        tracing::warn!("close: unmount failed: {e}");
    }
    if let Err(e) = live.block_on(live.client.flush()) {
        tracing::debug!("close: flush failed: {e}");
    }
    // The runtimes stop when the last call in flight lets go of the store.
    if let Ok(live) = Arc::try_unwrap(live) {
        live.rt.shutdown_timeout(Duration::from_secs(1));
        if let Some(node_rt) = live.node_rt.into_inner() {
            node_rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// What a file offset `mount_segment` maps must be a multiple of: the original refuses offsets off a page
/// boundary; 4 KiB is the page on x86-64 (on a host of larger pages the mapping itself still starts at the
/// page below the offset, so a 4 KiB-aligned offset maps correctly there too).
const PAGE: u64 = 4096;

/// The original's answer to a run-time mount: `{"ret", "segment_ids"}` (and `"allocated_size"` when given).
fn segment_result<'py>(
    py: Python<'py>,
    outcome: Result<Vec<SegmentId>, i64>,
    allocated: Option<u64>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let (ret, ids) = match outcome {
        Ok(ids) => (0, ids.iter().map(ToString::to_string).collect()),
        Err(c) => (c, Vec::new()),
    };
    d.set_item("ret", ret)?;
    d.set_item("segment_ids", PyList::new(py, ids)?)?;
    if let Some(n) = allocated {
        d.set_item("allocated_size", n)?;
    }
    Ok(d)
}

/// One item of a zero-copy batch: its key and checked range, or the code it fails with at once.
type Checked<'a> = Result<(&'a str, Span), i64>;

/// Keys with their ranges checked as caller memory (registered, or clear of every registration: `caller_span`).
fn check_all<'a>(reg: &Registered, keys: &'a [String], ptrs: &[usize], sizes: &[usize]) -> Vec<Checked<'a>> {
    keys.iter()
        .zip(ptrs.iter().zip(sizes))
        .map(|(k, (&p, &n))| reg.caller_span(p, n).map(|s| (k.as_str(), s)).ok_or(INVALID))
        .collect()
}

/// Puts the items that passed their checks (put-if-absent or upsert), one batch per config of `parts`; per item
/// 0 or a code, in input order.
fn put_items(
    live: &Live,
    items: &[Result<(&str, &[u8]), i64>],
    parts: &[(WireConfig, Vec<usize>)],
    upsert: bool,
) -> Vec<i64> {
    let mut out: Vec<i64> = items.iter().map(|i| i.as_ref().err().copied().unwrap_or(NOT_SET_UP)).collect();
    for (cfg, idx) in parts {
        let ok: Vec<usize> = idx.iter().copied().filter(|&i| items.get(i).is_some_and(Result::is_ok)).collect();
        let batch: Vec<(&str, &[u8])> = ok.iter().filter_map(|&i| items[i].as_ref().ok().copied()).collect();
        if batch.is_empty() {
            continue;
        }
        let results = if upsert {
            live.block_on(live.client.batch_upsert_from(&batch, cfg))
        } else {
            live.block_on(live.client.batch_put_from(&batch, cfg))
        };
        for (i, r) in ok.into_iter().zip(results) {
            out[i] = status(r);
        }
    }
    out
}

/// Reads the checked items into their ranges; bytes read or a code, in input order.
fn get_checked(live: &Live, items: &[Checked<'_>]) -> Vec<i64> {
    let mut ok: Vec<(&str, &mut [u8])> =
        items.iter().filter_map(|i| i.as_ref().ok()).map(|(k, s)| (*k, s.bytes_mut())).collect();
    let mut done =
        if ok.is_empty() { Vec::new() } else { live.block_on(live.client.batch_get_into(&mut ok)) }.into_iter();
    items
        .iter()
        .map(|i| match i {
            Err(c) => *c,
            Ok(_) => match done.next() {
                Some(Ok(n)) => n as i64,
                Some(Err(e)) => read_code(&e),
                None => NOT_SET_UP,
            },
        })
        .collect()
}

/// Whether an upsert's config is refused: a soft-pin TTL with an action other than ENABLE.
fn upsert_refused(cfg: Option<&ReplicateConfig>) -> bool {
    cfg.is_some_and(|c| c.soft_pin_ttl_ms.is_some() && c.soft_pin_action != crate::config::SoftPinAction::ENABLE)
}

#[pymethods]
impl Store {
    #[new]
    fn new() -> Self {
        Store { live: RwLock::new(None), registered: Registered::default(), sessions: Mutex::default() }
    }

    /// Sets the store up. `setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
    /// protocol, rdma_devices, master_server_addr, engine=None, **extras)` or `setup(config: dict)`. 0 on
    /// success, a negative code otherwise.
    #[pyo3(signature = (local_hostname, metadata_server=None, global_segment_size=None, local_buffer_size=None,
        protocol=None, rdma_devices=None, master_server_addr=None, engine=None, enable_ssd_offload=false,
        ssd_offload_path=String::new(), tenant_id=String::from("default"), enable_client_http_server=false,
        client_http_port=9300, credential=None, tls_cert=None, tls_key=None, tls_ca=None, tls_client_ca=None,
        tls_server_name=None, host_credential=None, ssd_offload_size=None))]
    #[allow(clippy::too_many_arguments)]
    fn setup(
        &self,
        py: Python<'_>,
        local_hostname: &Bound<'_, PyAny>,
        metadata_server: Option<String>,
        global_segment_size: Option<&Bound<'_, PyAny>>,
        local_buffer_size: Option<&Bound<'_, PyAny>>,
        protocol: Option<String>,
        rdma_devices: Option<String>,
        master_server_addr: Option<String>,
        engine: Option<&Bound<'_, PyAny>>,
        enable_ssd_offload: bool,
        ssd_offload_path: String,
        tenant_id: String,
        enable_client_http_server: bool,
        client_http_port: u16,
        credential: Option<String>,
        tls_cert: Option<String>,
        tls_key: Option<String>,
        tls_ca: Option<String>,
        tls_client_ca: Option<String>,
        tls_server_name: Option<String>,
        host_credential: Option<String>,
        ssd_offload_size: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i64> {
        let args = if let Ok(d) = local_hostname.cast::<PyDict>() {
            match dict_args(d)? {
                Some(a) => a,
                None => return Ok(INVALID),
            }
        } else {
            let local_hostname: String = local_hostname.extract()?;
            let _metadata = required(metadata_server, "metadata_server")?;
            let global = size_arg(required(global_segment_size, "global_segment_size")?, "global_segment_size")?;
            let local = size_arg(required(local_buffer_size, "local_buffer_size")?, "local_buffer_size")?;
            let protocol = required(protocol, "protocol")?;
            let _devices = required(rdma_devices, "rdma_devices")?;
            let master = required(master_server_addr, "master_server_addr")?;
            SetupArgs {
                local_hostname,
                global_segment_size: global,
                local_buffer_size: local,
                protocol,
                master_server_addr: master,
                tenant_id,
                credential,
                host_credential,
                tls: TlsExtras {
                    cert: tls_cert,
                    key: tls_key,
                    ca: tls_ca,
                    client_ca: tls_client_ca,
                    server_name: tls_server_name,
                },
                offload: OffloadArgs {
                    enabled: enable_ssd_offload,
                    path: ssd_offload_path,
                    size: ssd_offload_size
                        .filter(|v| !v.is_none())
                        .map(|v| size_or_text(v, "ssd_offload_size"))
                        .transpose()?,
                },
            }
        };
        if engine.is_some_and(|e| !e.is_none()) {
            tracing::info!("setup: the engine argument is accepted and not used (Crescent moves bytes itself)");
        }
        if enable_client_http_server {
            tracing::warn!("setup: the client HTTP server (port {client_http_port}) is not supported; ignored");
        }
        if self.live.read().is_some() {
            tracing::error!("setup: this store is set up already (close() it first)");
            return Ok(INVALID);
        }
        match py.detach(|| start(&args)) {
            Ok(live) => {
                let mut slot = self.live.write();
                if slot.is_some() {
                    drop(slot);
                    py.detach(|| stop(Arc::new(live)));
                    return Ok(INVALID);
                }
                *slot = Some(Arc::new(live));
                Ok(0)
            }
            Err(c) => Ok(c),
        }
    }

    /// Attaches to the storage node on this host at `server_address` (`host:port`, what it listens on) instead of
    /// joining the cluster with memory of its own: the original's standalone mode, whose "real client" process is
    /// a `crescent node` here (or another store hosting a segment). The node's memfd-backed segments
    /// (`crescent node --memfd`) are mapped into this process, so puts and gets of objects there are memory copies
    /// (writes go there first unless their config prefers other segments); other replicas are read as any
    /// client reads them. `mem_pool_size` is accepted and unused (buffers need not be shared: this process moves
    /// the bytes); `local_buffer_size` bounds the copying calls as in `setup`. 0, or a negative code.
    #[pyo3(signature = (mem_pool_size, local_buffer_size, server_address))]
    fn setup_dummy(&self, py: Python<'_>, mem_pool_size: u64, local_buffer_size: u64, server_address: String) -> i64 {
        let _ = mem_pool_size;
        if self.live.read().is_some() {
            tracing::error!("setup_dummy: this store is set up already (close() it first)");
            return INVALID;
        }
        match py.detach(|| attach(local_buffer_size, &server_address)) {
            Ok(live) => {
                let mut slot = self.live.write();
                if slot.is_some() {
                    drop(slot);
                    py.detach(|| stop(Arc::new(live)));
                    return INVALID;
                }
                *slot = Some(Arc::new(live));
                0
            }
            Err(c) => c,
        }
    }

    /// `size` bytes of prefaulted host memory for buffers to register (the original allocates them from the
    /// memory it shares with its real client; see `host_mem`); its address, or 0 when it cannot be had. Free it
    /// with `MooncakeHostMemAllocator().free`.
    fn alloc_from_mem_pool(&self, py: Python<'_>, size: usize) -> usize {
        py.detach(|| crate::host_mem::alloc(size)).unwrap_or_else(|e| {
            tracing::error!("alloc_from_mem_pool: {size} bytes: {e}");
            0
        })
    }

    /// Closes the store: unmounts its segment (objects stored only there are gone). 0, also when it was never
    /// set up; it can be set up again afterwards.
    #[pyo3(signature = (/))]
    fn close(&self, py: Python<'_>) -> i64 {
        let live = self.live.write().take();
        // Sessions belong to the client being closed (their leases and reservations lapse at the master).
        *self.sessions.lock() = Sessions::default();
        if let Some(live) = live {
            py.detach(|| stop(live));
        }
        0
    }

    /// 0 when set up and the master answers, 1 when not set up (or closed), 2 when the master does not answer.
    fn health_check(&self, py: Python<'_>) -> i64 {
        match self.live() {
            None => 1,
            Some(live) => match py.detach(|| live.block_on(live.client.cluster_info())) {
                Ok(_) => 0,
                Err(_) => 2,
            },
        }
    }

    /// `host:port` of this store (`""` before setup).
    #[pyo3(signature = (/))]
    fn get_hostname(&self) -> String {
        self.live().map(|l| l.hostname.clone()).unwrap_or_default()
    }

    /// How many objects this store has read from a disk-tier replica (`0` before setup): the original's count
    /// of reads served from `LOCAL_DISK` through the offload RPC. A read a memory replica serves leaves it as it
    /// was.
    #[pyo3(signature = (/))]
    fn get_offload_rpc_read_count(&self) -> u64 {
        self.live().map_or(0, |l| l.client.disk_reads())
    }

    // ---- segments mounted at run time ----

    /// Maps `size` bytes of the file or shared-memory object at `path` from `offset` (a multiple of 4 KiB) and mounts them as one more segment of this store, named as its others (`get_hostname()`); the
    /// file is mapped shared, so its bytes are the objects'. A store set up without a segment of its own starts
    /// serving segments now. `{"ret": 0 or -1, "segment_ids": [...]}` (one id; none for `size == 0`), as the
    /// original: `-1` when the file cannot be opened, the range passes its end, `offset` is not page-aligned, or
    /// the master refuses the segment. `protocol` and `location` are accepted and not used (Crescent moves bytes
    /// over TCP).
    #[pyo3(signature = (path, size, offset=0, protocol=String::from("tcp"), location=String::new()))]
    fn mount_segment<'py>(
        &self,
        py: Python<'py>,
        path: String,
        size: u64,
        offset: u64,
        protocol: String,
        location: String,
    ) -> PyResult<Bound<'py, PyDict>> {
        let _ = (protocol, location);
        let live = self.live();
        let outcome = py.detach(|| {
            let live = live.ok_or(FAILED)?;
            let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).map_err(|e| {
                tracing::error!("mount_segment: cannot open {path}: {e}");
                FAILED
            })?;
            let len = file.metadata().map(|m| m.len()).map_err(|e| {
                tracing::error!("mount_segment: cannot stat {path}: {e}");
                FAILED
            })?;
            if offset > len || size > len - offset {
                tracing::error!("mount_segment: [{offset}, +{size}) passes the end of {path} ({len} bytes)");
                return Err(FAILED);
            }
            if !offset.is_multiple_of(PAGE) {
                tracing::error!("mount_segment: offset {offset} is not a multiple of {PAGE}");
                return Err(FAILED);
            }
            if size == 0 {
                return Ok(Vec::new());
            }
            let memory = SegmentMemory::file(&file, offset, size).map_err(|e| {
                tracing::error!("mount_segment: cannot map {path}: {e}");
                FAILED
            })?;
            live.mount(memory, Added::Mapped).map(|id| vec![id])
        });
        segment_result(py, outcome, None)
    }

    /// Unmounts segments `mount_segment` mounted, by id, through the master's unmount path: with
    /// `grace_period_seconds == 0` the objects stored there are gone when it answers, and the file is unmapped;
    /// with a grace period the segment stays readable (taking no new objects) for it, then the master unmounts it
    /// and the mapping goes. 0, or the first failure: `-1` for an id that is not one of this store's
    /// `mount_segment` segments, else the master's code.
    #[pyo3(signature = (segment_ids, grace_period_seconds=0))]
    fn unmount_segment(&self, py: Python<'_>, segment_ids: Vec<String>, grace_period_seconds: u64) -> i64 {
        let Some(live) = self.live() else { return FAILED };
        py.detach(|| live.unmount(&segment_ids, Duration::from_secs(grace_period_seconds), Added::Mapped))
    }

    /// Allocates `size` bytes, rounded up to a multiple of 16 MiB (the original's slab), and mounts them as one
    /// more segment of this store (its pages faulted in on a thread of their own). A store set up without a
    /// segment of its own starts serving segments now. `{"ret": 0 or -1, "segment_ids": [...],
    /// "allocated_size": bytes}`; `-1` for `size == 0`, no memory, or a refusal by the master.
    #[pyo3(signature = (size, protocol=String::from("tcp"), location=String::new()))]
    fn allocate_and_mount_segment<'py>(
        &self,
        py: Python<'py>,
        size: u64,
        protocol: String,
        location: String,
    ) -> PyResult<Bound<'py, PyDict>> {
        let _ = (protocol, location);
        let live = self.live();
        let aligned = size.checked_next_multiple_of(SLAB);
        let outcome = py.detach(|| {
            let live = live.ok_or(FAILED)?;
            let aligned = match aligned {
                Some(n) if size > 0 => n,
                _ => {
                    tracing::error!("allocate_and_mount_segment: size {size} is 0 or too large");
                    return Err(FAILED);
                }
            };
            let memory = SegmentMemory::anonymous(aligned).map_err(|e| {
                tracing::error!("allocate_and_mount_segment: no memory for {aligned} bytes: {e}");
                FAILED
            })?;
            live.mount(memory, Added::Allocated).map(|id| vec![id])
        });
        let allocated = if outcome.is_ok() { aligned } else { None };
        segment_result(py, outcome, Some(allocated.unwrap_or(0)))
    }

    /// Unmounts segments `allocate_and_mount_segment` mounted, by id, and frees their memory (after the grace
    /// period, if any: see `unmount_segment`). 0, or the first failure: `-1` for an id that is not one of this
    /// store's allocated segments, else the master's code.
    #[pyo3(signature = (segment_ids, grace_period_seconds=0))]
    fn unmount_and_free_segment(&self, py: Python<'_>, segment_ids: Vec<String>, grace_period_seconds: u64) -> i64 {
        let Some(live) = self.live() else { return FAILED };
        py.detach(|| live.unmount(&segment_ids, Duration::from_secs(grace_period_seconds), Added::Allocated))
    }

    /// Unmounts this store's disk tier at the master (objects kept only there are gone, no more offloads land
    /// there), keeps serving its reads for `grace_period_seconds`, then stops: the original's drain before a
    /// planned shutdown. 0 (also without a disk tier); `-1` when the master refuses.
    #[pyo3(signature = (grace_period_seconds=0))]
    fn unmount_local_disk_segment(&self, py: Python<'_>, grace_period_seconds: u64) -> i64 {
        let Some(live) = self.live() else { return FAILED };
        let control = live.node.lock().as_ref().map(StorageNode::control);
        let (Some(control), Some(rt)) = (control, live.node_rt.get()) else {
            tracing::warn!("unmount_local_disk_segment: no disk tier (ssd offload is not enabled)");
            return 0;
        };
        match py.detach(|| rt.block_on(control.drain_disk(Duration::from_secs(grace_period_seconds)))) {
            Ok(true) => 0,
            Ok(false) => {
                tracing::warn!("unmount_local_disk_segment: no disk tier (ssd offload is not enabled)");
                0
            }
            Err(e) => {
                tracing::error!("unmount_local_disk_segment: {e}");
                FAILED
            }
        }
    }

    // ---- copying calls ----

    /// Stores `value` (any bytes-like) under `key`; 0, or a negative code. An existing key is kept (0).
    #[pyo3(signature = (key, value, config=None))]
    fn put(
        &self,
        py: Python<'_>,
        key: String,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i64> {
        let value = Value::from_py(value)?;
        Ok(self.put_one(py, &key, value.as_slice(), config.as_deref(), false))
    }

    /// Like `put`, replacing an existing value.
    #[pyo3(signature = (key, value, config=None))]
    fn upsert(
        &self,
        py: Python<'_>,
        key: String,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i64> {
        let value = Value::from_py(value)?;
        Ok(self.put_one(py, &key, value.as_slice(), config.as_deref(), true))
    }

    /// Stores the concatenation of `parts` (1-D bytes-likes) under `key`.
    #[pyo3(signature = (key, *parts, config=None))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: String,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i64> {
        let value = concat_parts(parts)?;
        Ok(self.put_one(py, &key, &value, config.as_deref(), false))
    }

    /// Like `put_parts`, replacing an existing value.
    #[pyo3(signature = (key, *parts, config=None))]
    fn upsert_parts(
        &self,
        py: Python<'_>,
        key: String,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i64> {
        let value = concat_parts(parts)?;
        Ok(self.put_one(py, &key, &value, config.as_deref(), true))
    }

    /// Stores `values[i]` under `keys[i]`; 0, or the first error's code.
    #[pyo3(signature = (keys, values, config=None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: &Bound<'_, PyList>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i64> {
        self.put_many(py, keys, values, config.as_deref(), false)
    }

    /// Like `put_batch`, replacing existing values.
    #[pyo3(signature = (keys, values, config=None))]
    fn upsert_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: &Bound<'_, PyList>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i64> {
        self.put_many(py, keys, values, config.as_deref(), true)
    }

    /// The value of `key`; `b""` on a miss or any error.
    #[pyo3(signature = (key, /))]
    fn get<'py>(&self, py: Python<'py>, key: String) -> Bound<'py, PyBytes> {
        let got = self.fetch(py, vec![key]).pop().flatten();
        got.map_or_else(|| PyBytes::new(py, b""), |v| v.into_bytes(py))
    }

    /// The values of `keys` (`b""` for each miss or error).
    #[pyo3(signature = (keys, /))]
    fn get_batch<'py>(&self, py: Python<'py>, keys: Vec<String>) -> Vec<Bound<'py, PyBytes>> {
        let got = self.fetch(py, keys);
        got.into_iter().map(|v| v.map_or_else(|| PyBytes::new(py, b""), |v| v.into_bytes(py))).collect()
    }

    /// The value of `key` as a `BufferHandle` (buffer protocol, `ptr()`, `size()`), or `None`.
    #[pyo3(signature = (key, /))]
    fn get_buffer<'py>(&self, py: Python<'py>, key: String) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.fetch(py, vec![key]).pop().flatten() {
            Some(v) => Ok(Some(buffer_handle(v.into_bytes(py))?)),
            None => Ok(None),
        }
    }

    /// `get_buffer` of each key.
    #[pyo3(signature = (keys, /))]
    fn batch_get_buffer<'py>(&self, py: Python<'py>, keys: Vec<String>) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        self.fetch(py, keys).into_iter().map(|v| v.map(|v| buffer_handle(v.into_bytes(py))).transpose()).collect()
    }

    // ---- zero-copy calls ----

    /// Registers `size` bytes at `buffer_ptr` for the zero-copy calls; 0, or `INVALID_PARAMS` for a null or
    /// empty buffer or one overlapping another registered buffer.
    #[pyo3(signature = (buffer_ptr, size))]
    fn register_buffer(&self, buffer_ptr: usize, size: usize) -> i64 {
        if self.registered.register(buffer_ptr, size) { 0 } else { INVALID }
    }

    /// Forgets the buffer registered at `buffer_ptr`; 0, or `INVALID_PARAMS` if none was.
    #[pyo3(signature = (buffer_ptr,))]
    fn unregister_buffer(&self, buffer_ptr: usize) -> i64 {
        if self.registered.unregister(buffer_ptr) { 0 } else { INVALID }
    }

    /// Stores `size` bytes of registered memory at `buffer_ptr` under `key`; 0 or a negative code.
    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: usize,
        size: usize,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i64 {
        self.put_from_one(py, &key, buffer_ptr, size, config.as_deref(), false)
    }

    /// Stores `metadata_size` bytes at `metadata_buffer_ptr` followed by `size` bytes at `buffer_ptr` (both in
    /// registered memory) as one object: the metadata first, then the data, as the original lays it out. 0 or
    /// a negative code; `size` 0 stores nothing and answers 0, and `prefer_alloc_in_same_node` is refused with
    /// −1, as the original. (The original answers its put failures with the code's sign flipped, e.g. +600
    /// for an empty key; this answers them negative, as every other call.)
    #[pyo3(signature = (key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, config=None))]
    #[allow(clippy::too_many_arguments)] // the original's signature
    fn put_from_with_metadata(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: usize,
        metadata_buffer_ptr: usize,
        size: usize,
        metadata_size: usize,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i64 {
        let cfg = config.as_deref();
        if cfg.is_some_and(|c| c.prefer_alloc_in_same_node) {
            // The original's answer: a bare -1 (not a store error code).
            return -1;
        }
        let Some(live) = self.live() else { return NOT_SET_UP };
        if size == 0 {
            return 0;
        }
        let (Some(meta), Some(data)) =
            (self.registered.span(metadata_buffer_ptr, metadata_size), self.registered.span(buffer_ptr, size))
        else {
            return INVALID;
        };
        let Some(wire) = live.wire(cfg) else { return INVALID };
        py.detach(|| {
            let mut value = Vec::with_capacity(metadata_size + size);
            value.extend_from_slice(meta.bytes());
            value.extend_from_slice(data.bytes());
            status(live.block_on(live.client.put_from(&key, &value, &wire)))
        })
    }

    /// Like `put_from`, replacing an existing value.
    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn upsert_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: usize,
        size: usize,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i64 {
        self.put_from_one(py, &key, buffer_ptr, size, config.as_deref(), true)
    }

    /// Reads `key` into registered memory at `buffer_ptr` (`size` bytes); bytes read, or a negative code (also
    /// when `size` is smaller than the object).
    #[pyo3(signature = (key, buffer_ptr, size))]
    fn get_into(&self, py: Python<'_>, key: String, buffer_ptr: usize, size: usize) -> i64 {
        let Some(live) = self.live() else { return NOT_SET_UP };
        let Some(span) = self.registered.caller_span(buffer_ptr, size) else { return INVALID };
        py.detach(|| match live.block_on(live.client.get_into(&key, span.bytes_mut())) {
            Ok(n) => n as i64,
            Err(e) => read_code(&e),
        })
    }

    /// `put_from` of each key; 0 or a negative code per key (`len(keys)` codes when the lists' lengths differ).
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<usize>,
        sizes: Vec<usize>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i64> {
        self.batch_put_from_all(py, keys, buffer_ptrs, sizes, config.as_deref(), false)
    }

    /// Like `batch_put_from`, replacing existing values.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
    fn batch_upsert_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<usize>,
        sizes: Vec<usize>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i64> {
        self.batch_put_from_all(py, keys, buffer_ptrs, sizes, config.as_deref(), true)
    }

    /// `get_into` of each key; bytes read or a negative code per key.
    #[pyo3(signature = (keys, buffer_ptrs, sizes))]
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<usize>,
        sizes: Vec<usize>,
    ) -> Vec<i64> {
        let n = keys.len();
        if buffer_ptrs.len() != n || sizes.len() != n {
            return vec![INVALID; n];
        }
        let Some(live) = self.live() else { return vec![NOT_SET_UP; n] };
        let items = check_all(&self.registered, &keys, &buffer_ptrs, &sizes);
        py.detach(|| get_checked(&live, &items))
    }

    /// Stores, per key, the concatenation of its pieces (`all_buffer_ptrs[i][j]`, `all_sizes[i][j]`, each in
    /// registered memory); 0 or a negative code per key.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config=None))]
    fn batch_put_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i64> {
        let n = keys.len();
        if all_buffer_ptrs.len() != n || all_sizes.len() != n {
            return vec![INVALID; n];
        }
        let Some(live) = self.live() else { return vec![NOT_SET_UP; n] };
        let Some(parts) = live.wire_batch(config.as_deref(), n) else { return vec![INVALID; n] };
        let reg = &self.registered;
        py.detach(|| {
            // One piece: sent from the caller's memory; several: gathered into one buffer first.
            let gathered: Vec<Result<Vec<Span>, i64>> =
                all_buffer_ptrs.iter().zip(&all_sizes).map(|(p, s)| pieces(reg, p, s)).collect();
            let joined: Vec<Option<Vec<u8>>> = gathered
                .iter()
                .map(|g| match g {
                    Ok(spans) if spans.len() != 1 => Some(spans.iter().flat_map(|s| s.bytes()).copied().collect()),
                    _ => None,
                })
                .collect();
            let items: Vec<Result<(&str, &[u8]), i64>> = keys
                .iter()
                .zip(gathered.iter().zip(&joined))
                .map(|(k, (g, j))| match (g, j) {
                    (Err(c), _) => Err(*c),
                    (Ok(_), Some(j)) => Ok((k.as_str(), j.as_slice())),
                    (Ok(spans), None) => Ok((k.as_str(), spans.first().map_or(&[][..], |s| s.bytes()))),
                })
                .collect();
            put_items(&live, &items, &parts, false)
        })
    }

    /// Reads each key into its pieces, in order (the object is the concatenation of its pieces); bytes read or
    /// a negative code per key: the pieces must be the object's layout, as the original requires —
    /// `INVALID_PARAMS` when they are smaller than the object, `TRANSFER_FAIL` when larger.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node=false))]
    fn batch_get_into_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        prefer_alloc_in_same_node: bool,
    ) -> Vec<i64> {
        let _ = prefer_alloc_in_same_node;
        let n = keys.len();
        if all_buffer_ptrs.len() != n || all_sizes.len() != n {
            return vec![INVALID; n];
        }
        let Some(live) = self.live() else { return vec![NOT_SET_UP; n] };
        let reg = &self.registered;
        py.detach(|| {
            let gathered: Vec<Result<Vec<Span>, i64>> =
                all_buffer_ptrs.iter().zip(&all_sizes).map(|(p, s)| pieces(reg, p, s)).collect();
            // One piece: read straight into it; several: into one buffer, then scattered.
            let mut staging: Vec<Vec<u8>> = gathered
                .iter()
                .map(|g| match g {
                    Ok(spans) if spans.len() != 1 => vec![0; spans.iter().map(Span::len).sum()],
                    _ => Vec::new(),
                })
                .collect();
            let mut ok: Vec<(&str, &mut [u8])> = Vec::new();
            for ((k, g), st) in keys.iter().zip(&gathered).zip(staging.iter_mut()) {
                match g {
                    Ok(spans) if spans.len() == 1 => ok.push((k.as_str(), spans[0].bytes_mut())),
                    Ok(_) => ok.push((k.as_str(), st.as_mut_slice())),
                    Err(_) => {}
                }
            }
            let mut done =
                if ok.is_empty() { Vec::new() } else { live.block_on(live.client.batch_get_into(&mut ok)) }.into_iter();
            drop(ok);
            gathered
                .iter()
                .zip(&staging)
                .map(|(g, st)| match g {
                    Err(c) => *c,
                    Ok(spans) => match done.next() {
                        // Pieces larger than the object: the layout the caller expects is not this object's. The
                        // original's transfer fails then (TRANSFER_FAIL), and vLLM counts the block as a load error.
                        Some(Ok(read)) if read < spans.iter().map(Span::len).sum() => TRANSFER_FAIL,
                        Some(Ok(read)) => {
                            if spans.len() != 1 {
                                scatter(&st[..read], spans);
                            }
                            read as i64
                        }
                        Some(Err(e)) => read_code(&e),
                        None => NOT_SET_UP,
                    },
                })
                .collect()
        })
    }

    /// Partial reads: for each buffer `i`, for each of its keys `j`, copies the ranges
    /// `[src_offsets[i][j][k], + sizes[i][j][k])` of the object to `buffer_ptrs[i] + dst_offsets[i][j][k]`
    /// (registered memory). Per range: bytes copied, or a negative code (`INVALID_PARAMS` for a range past the
    /// object's end or past the registered buffer, as the original);
    /// malformed (mismatched) lists give `INVALID_PARAMS` at the level they are malformed.
    #[pyo3(signature = (buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes))]
    fn get_into_ranges(
        &self,
        py: Python<'_>,
        buffer_ptrs: Vec<usize>,
        all_keys: Vec<Vec<String>>,
        all_dst_offsets: Vec<Vec<Vec<usize>>>,
        all_src_offsets: Vec<Vec<Vec<usize>>>,
        all_sizes: Vec<Vec<Vec<usize>>>,
    ) -> Vec<Vec<Vec<i64>>> {
        let invalid = |keys: &[String]| keys.iter().map(|_| vec![INVALID]).collect::<Vec<_>>();
        let n = all_keys.len();
        if buffer_ptrs.len() != n || all_dst_offsets.len() != n || all_src_offsets.len() != n || all_sizes.len() != n {
            return all_keys.iter().map(|k| invalid(k)).collect();
        }
        let Some(live) = self.live() else {
            return all_keys.iter().map(|k| k.iter().map(|_| vec![NOT_SET_UP]).collect()).collect();
        };
        let mut unique: Vec<&str> = all_keys.iter().flatten().map(String::as_str).collect();
        unique.sort_unstable();
        unique.dedup();
        let reg = &self.registered;
        py.detach(|| {
            // Each object is read once, whole, then its ranges are copied out.
            let values = live.block_on(join_all(unique.iter().map(|k| live.client.get(k))));
            let value = |k: &str| unique.binary_search(&k).ok().and_then(|i| values.get(i));
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                let (keys, dst, src, sizes) = (&all_keys[i], &all_dst_offsets[i], &all_src_offsets[i], &all_sizes[i]);
                if dst.len() != keys.len() || src.len() != keys.len() || sizes.len() != keys.len() {
                    out.push(invalid(keys));
                    continue;
                }
                let mut per_key = Vec::with_capacity(keys.len());
                for (j, key) in keys.iter().enumerate() {
                    let (dst, src, sizes) = (&dst[j], &src[j], &sizes[j]);
                    if dst.len() != sizes.len() || src.len() != sizes.len() {
                        per_key.push(vec![INVALID]);
                        continue;
                    }
                    let ranges = (0..sizes.len()).map(|k| match value(key) {
                        None => NOT_SET_UP,
                        Some(Err(e)) => code(e),
                        Some(Ok(v)) => copy_range(reg, v, buffer_ptrs[i], dst[k], src[k], sizes[k]),
                    });
                    per_key.push(ranges.collect());
                }
                out.push(per_key);
            }
            out
        })
    }

    // ---- helpers of the Python-level calls (crescent/_tensor.py) ----

    /// `put_batch` (or `upsert_batch`) answering per key: 0 or a negative code each, in input order. Unlike
    /// `put_batch`, values are not bounded by `local_buffer_size`: the original sends a tensor from the tensor's
    /// own memory, not through its staging buffer (a 32 MiB `put_tensor` with a 16 MiB local buffer succeeds).
    #[pyo3(signature = (keys, values, config=None, upsert=false))]
    fn _batch_put_values(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: &Bound<'_, PyList>,
        config: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<Vec<i64>> {
        let n = keys.len();
        let values: Vec<Value<'_>> = values.iter().map(|v| Value::from_py(&v)).collect::<PyResult<_>>()?;
        let cfg = config.as_deref();
        let Some(live) = self.live() else { return Ok(vec![NOT_SET_UP; n]) };
        if values.len() != n || (upsert && upsert_refused(cfg)) {
            return Ok(vec![INVALID; n]);
        }
        let Some(parts) = live.wire_batch(cfg, n) else { return Ok(vec![INVALID; n]) };
        let items: Vec<Result<(&str, &[u8]), i64>> =
            keys.iter().zip(&values).map(|(k, v)| Ok((k.as_str(), v.as_slice()))).collect();
        Ok(py.detach(|| put_items(&live, &items, &parts, upsert)))
    }

    /// Whether `[ptr, ptr + size)` lies inside one registered buffer (so Python code may read it safely).
    #[pyo3(signature = (ptr, size))]
    fn _registered(&self, ptr: usize, size: usize) -> bool {
        self.registered.span(ptr, size).is_some()
    }

    // ---- sessions (the original's layer-by-layer transfers: SGLang's layer_first MLA path) ----

    /// Starts a get session per key: the object is looked up once (granting a read lease, held until
    /// `batch_get_session_end` or its expiry) so `batch_get_into_multi_buffer_ranges` reads its ranges with no
    /// further master request. Per key 0 or a negative code (`OBJECT_NOT_FOUND` when absent, also for `""` as
    /// the original); a key's earlier session is replaced.
    #[pyo3(signature = (keys,))]
    fn batch_get_session_start(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        let Some(live) = self.live() else { return vec![NOT_SET_UP; keys.len()] };
        if keys.is_empty() {
            return Vec::new();
        }
        let looked_up: Vec<Result<ReadSession, ClientError>> = py.detach(|| {
            let client = &live.client;
            let chunks = keys.chunks(MAX_BATCH).map(|chunk| {
                let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
                async move { client.read_sessions(&refs).await }
            });
            live.block_on(join_all(chunks)).into_iter().flatten().collect()
        });
        // A session replaced or dropped here (a key started again, or named twice) lets its own lease go: each
        // lookup leased the object once.
        let mut replaced: Vec<String> = Vec::new();
        let out = {
            let mut sessions = self.sessions.lock();
            keys.iter()
                .zip(looked_up)
                .map(|(k, r)| {
                    let (old, rc) = match r {
                        Ok(s) => (sessions.get.insert(k.clone(), Arc::new(s)), 0),
                        // The original's master answers an empty key "not found"; Crescent's client refuses it
                        // as invalid before sending it.
                        Err(_) if k.is_empty() => {
                            (sessions.get.remove(k), i64::from(ErrorCode::ObjectNotFound.as_i32()))
                        }
                        Err(e) => (sessions.get.remove(k), code(&e)),
                    };
                    if old.is_some() {
                        replaced.push(k.clone());
                    }
                    rc
                })
                .collect()
        };
        if !replaced.is_empty() {
            let refs: Vec<&str> = replaced.iter().map(String::as_str).collect();
            py.detach(|| live.block_on(live.client.end_read_sessions(&refs)));
        }
        out
    }

    /// Reads ranges of objects with a get session into registered memory: for key `i`, range `j` is
    /// `[all_src_offsets[i][j], + all_sizes[i][j])` of the object, read to `all_buffer_ptrs[i][j]`. Per key the
    /// bytes read, or a negative code: `INVALID_PARAMS` without a session, with mismatched lists, a range past
    /// the object's end or outside every registered buffer (nothing is read for that key); `LEASE_EXPIRED` once
    /// the session's lease ran out (the session is dropped, as the original).
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, all_src_offsets))]
    fn batch_get_into_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        all_src_offsets: Vec<Vec<usize>>,
    ) -> Vec<i64> {
        let n = keys.len();
        if all_buffer_ptrs.len() != n || all_sizes.len() != n || all_src_offsets.len() != n {
            return vec![INVALID; n];
        }
        let Some(live) = self.live() else { return vec![NOT_SET_UP; n] };
        let checked: Vec<Result<SessionRanges, i64>> = {
            let sessions = self.sessions.lock();
            (0..n)
                .map(|i| {
                    let (ptrs, sizes, offsets) = (&all_buffer_ptrs[i], &all_sizes[i], &all_src_offsets[i]);
                    if ptrs.len() != sizes.len() || ptrs.len() != offsets.len() {
                        return Err(INVALID);
                    }
                    let s = sessions.get.get(&keys[i]).ok_or(INVALID)?;
                    let ranges = ptrs
                        .iter()
                        .zip(sizes)
                        .zip(offsets)
                        .map(|((&p, &len), &off)| self.registered.span(p, len).map(|s| (off as u64, s)).ok_or(INVALID))
                        .collect::<Result<Vec<_>, i64>>()?;
                    Ok((s.clone(), ranges))
                })
                .collect()
        };
        let results: Vec<Result<u64, i64>> = py.detach(|| {
            live.block_on(join_all(checked.iter().map(|c| async {
                let (s, ranges) = c.as_ref().map_err(|&e| e)?;
                let mut ranges: Vec<(u64, &mut [u8])> = ranges.iter().map(|(o, span)| (*o, span.bytes_mut())).collect();
                live.client.read_session_ranges(s, &mut ranges).await.map_err(|e| code(&e))
            })))
        });
        let mut sessions = self.sessions.lock();
        results
            .into_iter()
            .zip(&checked)
            .zip(&keys)
            .map(|((r, c), k)| match r {
                Ok(bytes) => i64::try_from(bytes).unwrap_or(i64::MAX),
                Err(e) => {
                    // An expired session is dropped (unless a new one replaced it meanwhile).
                    if let (LEASE_EXPIRED, Ok((s, _))) = (e, c)
                        && sessions.get.get(k).is_some_and(|cur| Arc::ptr_eq(cur, s))
                    {
                        sessions.get.remove(k);
                    }
                    e
                }
            })
            .collect()
    }

    /// Ends the get sessions of `keys` (keys without one are skipped) and releases their leases; 0.
    #[pyo3(signature = (keys,))]
    fn batch_get_session_end(&self, py: Python<'_>, keys: Vec<String>) -> i64 {
        let Some(live) = self.live() else { return NOT_SET_UP };
        let ended: Vec<String> = {
            let mut sessions = self.sessions.lock();
            keys.into_iter().filter(|k| sessions.get.remove(k).is_some()).collect()
        };
        if !ended.is_empty() {
            let refs: Vec<&str> = ended.iter().map(String::as_str).collect();
            py.detach(|| live.block_on(live.client.end_read_sessions(&refs)));
        }
        0
    }

    /// Starts a put session per key: an object of `sizes[i]` bytes is reserved (its replicas placed, the key
    /// taken; nothing readable yet) and `batch_put_from_multi_buffer_ranges` fills it until
    /// `batch_put_session_end` makes it readable or `batch_put_session_revoke` gives it up. Per key 0 or a
    /// negative code: `INVALID_PARAMS` for a size of 0, a key with a session already, mismatched lists or a
    /// `group_ids` not one per key; `OBJECT_ALREADY_EXISTS` for a key holding a value; `NO_AVAILABLE_HANDLE`
    /// when there is no room. The ranges are staged in this process until the end, which writes the object
    /// whole (and checksummed).
    #[pyo3(signature = (keys, sizes, config=None))]
    fn batch_put_session_start(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        sizes: Vec<usize>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i64> {
        let n = keys.len();
        let Some(live) = self.live() else { return vec![NOT_SET_UP; n] };
        let cfg = config.as_deref();
        let groups_ok = cfg.and_then(|c| c.group_ids.as_ref()).is_none_or(|g| g.len() == n);
        if sizes.len() != n || !groups_ok {
            return vec![INVALID; n];
        }
        let Some(parts) = live.wire_batch(cfg, n) else { return vec![INVALID; n] };
        let mut out: Vec<i64> = {
            let sessions = self.sessions.lock();
            keys.iter()
                .zip(&sizes)
                .map(|(k, &size)| if size == 0 || sessions.put.contains_key(k) { INVALID } else { 0 })
                .collect()
        };
        // One batched reservation per config (per group) and per `MAX_BATCH` keys.
        let batches: Vec<(&WireConfig, Vec<usize>)> = parts
            .iter()
            .flat_map(|(w, idx)| {
                let todo: Vec<usize> = idx.iter().copied().filter(|&i| out[i] == 0).collect();
                todo.chunks(MAX_BATCH).map(|c| (w, c.to_vec())).collect::<Vec<_>>()
            })
            .collect();
        // Each reservation's staging buffer is made outside the sessions' lock (zeroing it takes a while).
        let started: Vec<(usize, Result<Reserved, ClientError>)> = py.detach(|| {
            let client = &live.client;
            let starts = batches.iter().map(|(w, idx)| {
                let items: Vec<(&str, u64)> = idx.iter().map(|&i| (keys[i].as_str(), sizes[i] as u64)).collect();
                async move { client.write_sessions_start(&items, w).await }
            });
            let starts = live.block_on(join_all(starts));
            let idx = batches.iter().flat_map(|(_, idx)| idx.iter().copied());
            idx.zip(starts.into_iter().flatten()).map(|(i, r)| (i, r.map(|s| (staging(sizes[i]), s)))).collect()
        });
        let mut failed = Vec::new();
        {
            let mut sessions = self.sessions.lock();
            for (i, r) in started {
                match r {
                    Ok((Some(bytes), session)) => {
                        let staged = Mutex::new(Staged { bytes, sealed: false });
                        sessions.put.insert(keys[i].clone(), Arc::new(PutSession { session, staged }));
                    }
                    Ok((None, session)) => {
                        tracing::warn!(key = keys[i], size = sizes[i], "no memory to stage a put session");
                        failed.push(session);
                        out[i] = NO_ROOM;
                    }
                    Err(e) => out[i] = code(&e),
                }
            }
        }
        if !failed.is_empty() {
            py.detach(|| {
                for r in live.block_on(join_all(failed.iter().map(|s| live.client.write_session_revoke(s)))) {
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "revoking an unstaged put session failed");
                    }
                }
            });
        }
        out
    }

    /// Fills ranges of objects with a put session from registered memory: for key `i`, range `j` is
    /// `[all_dst_offsets[i][j], + all_sizes[i][j])` of the object, taken from `all_buffer_ptrs[i][j]` (the
    /// buffer may be reused once this returns). Per key the bytes taken, or `INVALID_PARAMS` (no session, or
    /// one being ended; mismatched lists; a range past the reserved size or outside every registered buffer:
    /// nothing is taken for that key).
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, all_dst_offsets))]
    fn batch_put_from_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        all_dst_offsets: Vec<Vec<usize>>,
    ) -> Vec<i64> {
        let n = keys.len();
        if all_buffer_ptrs.len() != n || all_sizes.len() != n || all_dst_offsets.len() != n {
            return vec![INVALID; n];
        }
        if self.live().is_none() {
            return vec![NOT_SET_UP; n];
        }
        let reg = &self.registered;
        py.detach(|| {
            (0..n)
                .map(|i| {
                    let (ptrs, sizes, offsets) = (&all_buffer_ptrs[i], &all_sizes[i], &all_dst_offsets[i]);
                    if ptrs.len() != sizes.len() || ptrs.len() != offsets.len() {
                        return INVALID;
                    }
                    let Some(s) = self.sessions.lock().put.get(&keys[i]).cloned() else { return INVALID };
                    let Some(ranges) = ptrs
                        .iter()
                        .zip(sizes)
                        .zip(offsets)
                        .map(|((&p, &len), &off)| reg.span(p, len).map(|span| (off, span)))
                        .collect::<Option<Vec<_>>>()
                    else {
                        return INVALID;
                    };
                    let mut staged = s.staged.lock();
                    if staged.sealed {
                        return INVALID;
                    }
                    let size = staged.bytes.len();
                    if ranges.iter().any(|(off, span)| off.checked_add(span.len()).is_none_or(|end| end > size)) {
                        return INVALID;
                    }
                    let mut total = 0i64;
                    for (off, span) in ranges {
                        staged.bytes[off..off + span.len()].copy_from_slice(span.bytes());
                        total += span.len() as i64;
                    }
                    total
                })
                .collect()
        })
    }

    /// Ends put sessions: each object is written whole (what its ranges filled; bytes never filled are zero)
    /// and made readable. Per key 0 or a negative code: `INVALID_PARAMS` without a session; on a failed write
    /// or end the session is kept, sealed (no more ranges), to be ended again or revoked, as the original.
    #[pyo3(signature = (keys,))]
    fn batch_put_session_end(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        let Some(live) = self.live() else { return vec![NOT_SET_UP; keys.len()] };
        let taken = self.take_put_sessions(&keys);
        // Every session's bytes written, then one BatchPutEnd for the batch.
        let items: Vec<(&WriteSession, &[u8])> =
            taken.iter().flatten().map(|(s, bytes)| (&s.session, bytes.as_slice())).collect();
        let mut done = py.detach(|| live.block_on(live.client.write_sessions_end(&items))).into_iter();
        drop(items);
        let ended: Vec<Option<Result<(), ClientError>>> =
            taken.iter().map(|t| t.as_ref().and_then(|_| done.next())).collect();
        self.settle_put_sessions(&keys, taken, ended, false)
    }

    /// Revokes put sessions: the reservations are given up (the keys are free again, nothing stored). Per key
    /// 0 or a negative code (`INVALID_PARAMS` without a session; a failed revoke keeps the session, sealed).
    #[pyo3(signature = (keys,))]
    fn batch_put_session_revoke(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        let Some(live) = self.live() else { return vec![NOT_SET_UP; keys.len()] };
        let taken = self.take_put_sessions(&keys);
        let revoked = py.detach(|| {
            live.block_on(join_all(taken.iter().map(|t| async {
                let (s, _) = t.as_ref()?;
                Some(live.client.write_session_revoke(&s.session).await)
            })))
        });
        // Nothing left at the master (OBJECT_NOT_FOUND): the session is gone either way.
        self.settle_put_sessions(&keys, taken, revoked, true)
    }

    // ---- metadata ----

    /// 1 if `key` exists, 0 if not, a negative code on error.
    #[pyo3(signature = (key, /))]
    fn is_exist(&self, py: Python<'_>, key: String) -> i64 {
        let Some(live) = self.live() else { return NOT_SET_UP };
        py.detach(|| match live.block_on(live.client.is_exist(&key)) {
            Ok(b) => i64::from(b),
            Err(e) => code(&e),
        })
    }

    /// `is_exist` of each key.
    #[pyo3(signature = (keys,))]
    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        let Some(live) = self.live() else { return vec![NOT_SET_UP; keys.len()] };
        if keys.is_empty() {
            return Vec::new();
        }
        py.detach(|| {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            live.block_on(live.client.batch_is_exist(&refs))
                .into_iter()
                .map(|r| r.map_or_else(|e| code(&e), i64::from))
                .collect()
        })
    }

    /// How many of `keys`, from the first, are cached and readable now (SGLang's `batch_exists`: the length of
    /// the consecutive existing prefix), or a negative code. The master leases exactly that run in the same
    /// step, so a `batch_get_into` of those keys that follows within the lease finds them, and reads them with
    /// no lookup of its own.
    #[pyo3(signature = (keys,))]
    fn batch_is_exist_prefix(&self, py: Python<'_>, keys: Vec<String>) -> i64 {
        let Some(live) = self.live() else { return NOT_SET_UP };
        py.detach(|| {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            match live.block_on(live.client.batch_prefix_lease(&refs)) {
                Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
                Err(e) => code(&e),
            }
        })
    }

    /// The size of `key`'s value, or a negative code (`OBJECT_NOT_FOUND` when absent).
    #[pyo3(signature = (key, /))]
    fn get_size(&self, py: Python<'_>, key: String) -> i64 {
        let Some(live) = self.live() else { return NOT_SET_UP };
        py.detach(|| match live.block_on(live.client.get_size(&key)) {
            Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
            Err(e) => code(&e),
        })
    }

    /// Where `key`'s replicas are (`[]` when absent or on any error). Like a read, it leases the object.
    #[pyo3(signature = (key, /))]
    fn get_replica_desc(&self, py: Python<'_>, key: String) -> Vec<ReplicaDescriptor> {
        let Some(live) = self.live() else { return Vec::new() };
        py.detach(|| {
            let req = MasterRequest::GetReplicaList { tenant: live.tenant.clone(), key: WireKey::from(key.as_str()) };
            let pick = |r| if let MasterResponse::ReplicaList(l) = r { Some(l) } else { None };
            match live.block_on(live.client.master().call_expect(&req, pick)) {
                Ok(list) => list.replicas.iter().map(|d| ReplicaDescriptor::of(d, list.size)).collect(),
                Err(e) => {
                    tracing::debug!(key, error = %e, "get_replica_desc failed");
                    Vec::new()
                }
            }
        })
    }

    /// `get_replica_desc` of each key, as a dict holding only the keys found.
    #[pyo3(signature = (keys, /))]
    fn batch_get_replica_desc(&self, py: Python<'_>, keys: Vec<String>) -> HashMap<String, Vec<ReplicaDescriptor>> {
        let Some(live) = self.live() else { return HashMap::new() };
        if keys.is_empty() {
            return HashMap::new();
        }
        py.detach(|| {
            let mut out = HashMap::with_capacity(keys.len());
            for chunk in keys.chunks(MAX_BATCH) {
                let wire = chunk.iter().map(|k| WireKey::from(k.as_str())).collect();
                let req = MasterRequest::BatchGetReplicaList { tenant: live.tenant.clone(), keys: Batch(wire) };
                let pick = |r| if let MasterResponse::BatchReplicaList(l) = r { Some(l) } else { None };
                match live.block_on(live.client.master().call_expect(&req, pick)) {
                    Ok(lists) => {
                        for (key, list) in chunk.iter().zip(lists.items) {
                            if let Ok(list) = list {
                                let descs = list.replicas.iter().map(|d| ReplicaDescriptor::of(d, list.size)).collect();
                                out.insert(key.clone(), descs);
                            }
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "batch_get_replica_desc failed"),
                }
            }
            out
        })
    }

    /// Removes `key` (`force` ignores read leases); 0 or a negative code.
    #[pyo3(signature = (key, force=false))]
    fn remove(&self, py: Python<'_>, key: String, force: bool) -> i64 {
        let Some(live) = self.live() else { return NOT_SET_UP };
        py.detach(|| status(live.block_on(live.client.remove(&key, force))))
    }

    /// Removes every key matching `pattern` (a regex, search semantics); how many, or a negative code.
    #[pyo3(signature = (pattern, force=false))]
    fn remove_by_regex(&self, py: Python<'_>, pattern: String, force: bool) -> i64 {
        let Some(live) = self.live() else { return NOT_SET_UP };
        py.detach(|| {
            let req = MasterRequest::RemoveByRegex { tenant: live.tenant.clone(), pattern, force };
            let pick = |r| if let MasterResponse::Count(n) = r { Some(n) } else { None };
            match live.block_on(live.client.master().call_expect(&req, pick)) {
                Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
                Err(e) => code(&e),
            }
        })
    }

    /// Removes every object; how many, or a negative code.
    #[pyo3(signature = (force=false))]
    fn remove_all(&self, py: Python<'_>, force: bool) -> i64 {
        let Some(live) = self.live() else { return NOT_SET_UP };
        py.detach(|| match live.block_on(live.client.remove_all(force)) {
            Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
            Err(e) => code(&e),
        })
    }

    /// `remove` of each key.
    #[pyo3(signature = (keys, force=false))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: bool) -> Vec<i64> {
        let Some(live) = self.live() else { return vec![NOT_SET_UP; keys.len()] };
        if keys.is_empty() {
            return Vec::new();
        }
        py.detach(|| {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            live.block_on(live.client.batch_remove(&refs, force)).into_iter().map(status).collect()
        })
    }

    /// Drops the replicas of this store's own objects (those it wrote) whose read lease has expired: every
    /// replica (the object goes), or with `segment_name` only those on that segment (the object goes with its
    /// last one). The keys cleared; a key another client wrote, leased or absent is skipped; `[]` on any error,
    /// as the original answers.
    #[pyo3(signature = (keys, segment_name=String::new()))]
    fn batch_replica_clear(&self, py: Python<'_>, keys: Vec<String>, segment_name: String) -> Vec<String> {
        let Some(live) = self.live() else { return Vec::new() };
        if keys.is_empty() {
            return Vec::new();
        }
        py.detach(|| {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            match live.block_on(live.client.batch_replica_clear(&refs, &segment_name)) {
                Ok(cleared) => cleared,
                Err(e) => {
                    tracing::error!(error = %e, "batch_replica_clear failed");
                    Vec::new()
                }
            }
        })
    }

    /// Queues a copy of `key` to every segment named in `targets`, made in the background by the storage node
    /// holding one of its replicas: `(task id, 0)`, or `((0, 0), code)`.
    fn create_copy_task(&self, py: Python<'_>, key: String, targets: Vec<String>) -> ((u64, u64), i64) {
        let Some(live) = self.live() else { return ((0, 0), NOT_SET_UP) };
        py.detach(|| task_id(live.block_on(live.client.create_copy_task(&key, &targets))))
    }

    /// Queues a move of `key`'s replica on segment `source` to segment `target`, made by `source`'s node:
    /// `(task id, 0)`, or `((0, 0), code)`.
    fn create_move_task(&self, py: Python<'_>, key: String, source: String, target: String) -> ((u64, u64), i64) {
        let Some(live) = self.live() else { return ((0, 0), NOT_SET_UP) };
        py.detach(|| task_id(live.block_on(live.client.create_move_task(&key, &source, &target))))
    }

    /// Where a copy or move task stands: `(QueryTaskResponse, 0)`, or `(None, code)` (`TASK_NOT_FOUND`, -1400,
    /// for an id the master does not know or no longer keeps).
    fn query_task(&self, py: Python<'_>, task_id: (u64, u64)) -> (Option<crate::config::QueryTaskResponse>, i64) {
        let Some(live) = self.live() else { return (None, NOT_SET_UP) };
        let id = crescent_proto::TaskId::from_u64_pair(task_id.0, task_id.1);
        py.detach(|| match live.block_on(live.client.query_task(id)) {
            Ok(info) => (Some(info.into()), 0),
            Err(e) => (None, code(&e)),
        })
    }
}

/// A task id as the original's Python answers it: `((high, low), 0)` or `((0, 0), code)`.
fn task_id(r: Result<crescent_proto::TaskId, ClientError>) -> ((u64, u64), i64) {
    match r {
        Ok(id) => (id.as_u64_pair(), 0),
        Err(e) => ((0, 0), code(&e)),
    }
}

/// The concatenation of `put_parts`' parts; a part that is not bytes-like is a `RuntimeError` (as the
/// original raises).
fn concat_parts(parts: &Bound<'_, PyTuple>) -> PyResult<Vec<u8>> {
    let mut out = Vec::new();
    for p in parts.iter() {
        let v = Value::from_py(&p).map_err(|e| PyRuntimeError::new_err(format!("put_parts: {e}")))?;
        out.extend_from_slice(v.as_slice());
    }
    Ok(out)
}

/// Copies `value[src..src + size]` (cut short at the value's end) to registered memory at `base + dst`; bytes
/// copied, or `INVALID_PARAMS` (a range outside the value or outside every registered buffer).
/// One range of `get_into_ranges`: as the original, a range that runs past the object's end or past the
/// registered destination fails whole with `INVALID_PARAMS` (never a short copy).
fn copy_range(reg: &Registered, value: &[u8], base: usize, dst: usize, src: usize, size: usize) -> i64 {
    let Some(from) = src.checked_add(size).and_then(|end| value.get(src..end)) else { return INVALID };
    let Some(to) = base.checked_add(dst).and_then(|p| reg.span(p, size)) else { return INVALID };
    to.bytes_mut().copy_from_slice(from);
    size as i64
}

/// The checked pieces of one multi-buffer object.
fn pieces(reg: &Registered, ptrs: &[usize], sizes: &[usize]) -> Result<Vec<Span>, i64> {
    if ptrs.len() != sizes.len() || ptrs.is_empty() {
        return Err(INVALID);
    }
    ptrs.iter().zip(sizes).map(|(&p, &n)| reg.span(p, n).ok_or(INVALID)).collect()
}

/// Copies `data` over `spans` in order.
fn scatter(mut data: &[u8], spans: &[Span]) {
    for s in spans {
        let n = s.len().min(data.len());
        s.bytes_mut()[..n].copy_from_slice(&data[..n]);
        data = &data[n..];
    }
}

impl Store {
    /// Per key of a put session's end or revoke, 0 or a code: a session whose step failed is kept, sealed, with
    /// its staged bytes, to be ended or revoked again; `gone_is_done` counts "nothing at the master" as done.
    fn settle_put_sessions(
        &self,
        keys: &[String],
        taken: Vec<Option<(Arc<PutSession>, Vec<u8>)>>,
        results: Vec<Option<Result<(), ClientError>>>,
        gone_is_done: bool,
    ) -> Vec<i64> {
        let mut sessions = self.sessions.lock();
        keys.iter()
            .zip(taken)
            .zip(results)
            .map(|((k, t), r)| match (t, r) {
                (Some(_), Some(Ok(()))) => 0,
                (Some(_), Some(Err(e))) if gone_is_done && e.code() == ErrorCode::ObjectNotFound => 0,
                (Some((s, bytes)), Some(Err(e))) => {
                    s.staged.lock().bytes = bytes;
                    sessions.put.insert(k.clone(), s);
                    code(&e)
                }
                _ => INVALID,
            })
            .collect()
    }

    /// Takes the put sessions of `keys` out of the map and seals them: per key its session and staged bytes,
    /// `None` without one (also for a key repeated in `keys`).
    fn take_put_sessions(&self, keys: &[String]) -> Vec<Option<(Arc<PutSession>, Vec<u8>)>> {
        let mut sessions = self.sessions.lock();
        keys.iter()
            .map(|k| {
                let s = sessions.put.remove(k)?;
                let bytes = {
                    let mut staged = s.staged.lock();
                    staged.sealed = true;
                    std::mem::take(&mut staged.bytes)
                };
                Some((s, bytes))
            })
            .collect()
    }

    /// One copying put (or upsert) of `value`, through the staging limit.
    fn put_one(&self, py: Python<'_>, key: &str, value: &[u8], cfg: Option<&ReplicateConfig>, upsert: bool) -> i64 {
        let Some(live) = self.live() else { return NOT_SET_UP };
        if value.len() as u64 > live.local_buffer || (upsert && upsert_refused(cfg)) {
            return INVALID;
        }
        let Some(wire) = live.wire(cfg) else { return INVALID };
        py.detach(|| {
            let r = if upsert {
                live.block_on(live.client.upsert_from(key, value, &wire))
            } else {
                live.block_on(live.client.put_from(key, value, &wire))
            };
            status(r)
        })
    }

    fn put_many(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: &Bound<'_, PyList>,
        cfg: Option<&ReplicateConfig>,
        upsert: bool,
    ) -> PyResult<i64> {
        let values: Vec<Value<'_>> = values.iter().map(|v| Value::from_py(&v)).collect::<PyResult<_>>()?;
        let Some(live) = self.live() else { return Ok(NOT_SET_UP) };
        if keys.len() != values.len() || (upsert && upsert_refused(cfg)) {
            return Ok(INVALID);
        }
        if values.iter().any(|v| v.as_slice().len() as u64 > live.local_buffer) {
            return Ok(INVALID);
        }
        let Some(parts) = live.wire_batch(cfg, keys.len()) else { return Ok(INVALID) };
        let items: Vec<Result<(&str, &[u8]), i64>> =
            keys.iter().map(String::as_str).zip(values.iter().map(Value::as_slice)).map(Ok).collect();
        Ok(py.detach(|| put_items(&live, &items, &parts, upsert).into_iter().find(|&c| c != 0).unwrap_or(0)))
    }

    /// The values of `keys` (copying calls: each within the staging limit), `None` for a miss or an error.
    fn fetch(&self, py: Python<'_>, keys: Vec<String>) -> Vec<Option<Fetched>> {
        let Some(live) = self.live() else { return keys.iter().map(|_| None).collect() };
        let limit = live.local_buffer;
        py.detach(|| {
            let gets = keys.iter().map(|k| live.client.get_with(k, |size| Fetched::for_size(size, limit)));
            live.block_on(join_all(gets)).into_iter().map(|r| r.ok().map(|(v, _)| v)).collect()
        })
    }

    fn put_from_one(
        &self,
        py: Python<'_>,
        key: &str,
        ptr: usize,
        size: usize,
        cfg: Option<&ReplicateConfig>,
        upsert: bool,
    ) -> i64 {
        let Some(live) = self.live() else { return NOT_SET_UP };
        if upsert && upsert_refused(cfg) {
            return INVALID;
        }
        let Some(span) = self.registered.caller_span(ptr, size) else { return INVALID };
        let Some(wire) = live.wire(cfg) else { return INVALID };
        py.detach(|| {
            let r = if upsert {
                live.block_on(live.client.upsert_from(key, span.bytes(), &wire))
            } else {
                live.block_on(live.client.put_from(key, span.bytes(), &wire))
            };
            status(r)
        })
    }

    fn batch_put_from_all(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<usize>,
        sizes: Vec<usize>,
        cfg: Option<&ReplicateConfig>,
        upsert: bool,
    ) -> Vec<i64> {
        let n = keys.len();
        if ptrs.len() != n || sizes.len() != n || (upsert && upsert_refused(cfg)) {
            return vec![INVALID; n];
        }
        let Some(live) = self.live() else { return vec![NOT_SET_UP; n] };
        let Some(parts) = live.wire_batch(cfg, n) else { return vec![INVALID; n] };
        let items = check_all(&self.registered, &keys, &ptrs, &sizes);
        py.detach(|| {
            let items: Vec<Result<(&str, &[u8]), i64>> = items.iter().map(|i| i.map(|(k, s)| (k, s.bytes()))).collect();
            put_items(&live, &items, &parts, upsert)
        })
    }
}
