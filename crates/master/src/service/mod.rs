//! `MasterService`: request orchestration over the segment pool, object metadata and eviction.
//!
//! This is the in-process form of every master RPC; the network server exposes it 1:1. Errors are wire
//! [`ErrorCode`]s because every failure here is reported to a client as one.
//!
//! Lock order (outermost first): group members lock → object lock → (pool shared lock → allocator mutex) only
//! for placement, which runs with no metadata lock held. Route shard locks are leaf locks. The client table,
//! the discard queue and the quota-policy mutex are never held while taking any other lock; the mounters' table
//! only the pool's shared lock (its sweep).

mod clients;
mod discard;
pub mod disk;
mod events;
pub use events::EventsSnapshotPage;
pub(crate) mod ha;
pub mod listing;
mod mounters;
mod nof_health;
mod read;
mod remove;
mod segments;
mod ssd;
pub mod tasks;
mod tenants;
mod write;

#[cfg(test)]
mod ha_safety_tests;

pub use crescent_proto::{ClientStatus, GetReplicaListResponse};
pub use nof_health::NofProbe;
pub use tenants::TenantQuotaSnapshot;
pub use write::WriteRef;

use crate::clock::{Clock, Timestamp};
use crate::eviction::{EvictionReport, EvictionScope, EvictionTarget};
use crate::local_ssd::LocalSsdManager;
use crate::metadata::{QuotaAccount, QuotaPolicies, TenantOp, TenantRegistry, TenantState, Tier};
use crate::placement::{PlacementPolicy, Placer};
use crate::segment_pool::{PoolConfig, SegmentPool, WriteHold};
use crescent_proto::{ErrorCode, SegmentKind, TenantId};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// What replicas are handed out for: it decides how long a transfer to them may still come.
#[derive(Debug, Clone, Copy)]
enum Handout {
    /// A put's (or an upsert's) ranges, written under a write grant.
    Write,
    /// A get's ranges, read under the lease.
    Read,
}

/// Longest a write waits for the room its eviction round freed to become durable (a backend that takes longer
/// is failing: the write then fails for want of room, and admission is closing anyway).
pub const EVICTION_DURABLE_WAIT: Duration = Duration::from_secs(2);

/// Master behaviour knobs; defaults are the original Mooncake master's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MasterConfig {
    /// Read lease granted by Get/Exist (ms).
    pub lease_ttl_ms: u64,
    /// A client silent this long is expired: its memory segments are disconnected (ms).
    pub client_ttl_ms: u64,
    /// A disconnected segment's objects are kept this long for its node to come back (ms); 0 drops them at the
    /// client TTL.
    pub disconnect_grace_ms: u64,
    /// An unfinished write may be preempted by a new PutStart after this long (ms).
    pub put_start_discard_timeout_ms: u64,
    /// Buffers of a preempted write are freed this long after its start (ms): a zombie writer may still write.
    pub put_start_release_timeout_ms: u64,
    /// Soft-pin TTL when a write enables soft pin without a TTL (ms).
    pub default_soft_pin_ttl_ms: u64,
    /// Largest soft-pin TTL accepted (ms).
    pub max_soft_pin_ttl_ms: u64,
    /// Whether eviction may take soft-pinned objects (after all others).
    pub allow_evict_soft_pinned: bool,
    /// Evict when used/capacity exceeds this.
    pub eviction_high_watermark: f64,
    /// Fraction of evictable objects one eviction round removes.
    pub eviction_ratio: f64,
    /// Namespaces and quotas per tenant; off = every request in `default`.
    pub enable_multi_tenants: bool,
    /// Replica placement policy.
    pub placement_policy: PlacementPolicy,
    /// CXL device window in bytes (enables CXL segments).
    pub cxl_window: Option<u64>,
    /// Handles copied per route-lock hold during a census.
    pub census_chunk: usize,
    /// Each OK NoF segment's target is probed this often (ms; first probes staggered over it).
    pub nof_heartbeat_interval_ms: u64,
    /// A NoF probe not answered within this counts as failed (ms).
    pub nof_probe_timeout_ms: u64,
    /// A NoF segment is unmounted after this many consecutive failed probes.
    pub nof_heartbeat_failures: u32,
    /// How long a put's data-plane write grants live (ms), when the master seals grants (an authenticating
    /// cluster): a put's transfers must start within it.
    pub grant_write_window_ms: u64,
    /// Space freed within this long of its allocation is kept out of reuse until then (ms; 0 = off). Set, to the
    /// write-grant window plus clock slack, by a master that seals grants (see `segment_pool::WriteHold`).
    pub write_hold_ms: u64,
    /// Memory evictions keep objects on the disk tier of the node that held them, where it has one (off: they
    /// are dropped, as on a node without a disk).
    pub disk_offload: bool,
    /// A node must start a disk copy within this long of its task (ms); the master ends the task as failed after
    /// twice that, and holds its disk range out of reuse for three times that.
    pub disk_task_timeout_ms: u64,
    /// A read of an object found only on a disk tier brings it back to memory in the background, when its node's
    /// memory has room below the eviction watermark (the disk copy stays).
    pub disk_promotion: bool,
    /// A node must start a copy or move task within this long of taking it (ms); the master ends the task as
    /// failed after twice that, and keeps its target ranges out of reuse for a third.
    pub replica_task_timeout_ms: u64,
    /// A copy or move task no node took within this long ends as failed (ms; 0 = never).
    pub pending_task_timeout_ms: u64,
    /// Copy and move tasks queued at most (more are refused with `TASK_PENDING_LIMIT_EXCEEDED`).
    pub max_pending_tasks: usize,
    /// Ended tasks kept for `QueryTask`.
    pub max_finished_tasks: usize,
    /// Times a task that found no room on its target is tried again before it fails.
    pub task_retry_attempts: u32,
    /// A client's report that it could not reach a node is checked by the master's own probe before the
    /// segment turns SUSPECT (set by a master that authenticates: there a report is a tenant's word, and a
    /// tenant must not be able to take every segment out of placement). Off: reports are believed at once.
    pub verify_unreachable_reports: bool,
}

impl Default for MasterConfig {
    fn default() -> Self {
        Self {
            lease_ttl_ms: 10_000,
            client_ttl_ms: 10_000,
            disconnect_grace_ms: 5 * 60 * 1000,
            put_start_discard_timeout_ms: 30_000,
            put_start_release_timeout_ms: 600_000,
            default_soft_pin_ttl_ms: 30 * 60 * 1000,
            max_soft_pin_ttl_ms: 24 * 3600 * 1000,
            allow_evict_soft_pinned: true,
            eviction_high_watermark: 0.90,
            eviction_ratio: 0.05,
            enable_multi_tenants: false,
            placement_policy: PlacementPolicy::Random,
            cxl_window: None,
            census_chunk: 1024,
            nof_heartbeat_interval_ms: 10_000,
            nof_probe_timeout_ms: 1_000,
            nof_heartbeat_failures: 3,
            grant_write_window_ms: 10_000,
            write_hold_ms: 0,
            disk_offload: true,
            disk_task_timeout_ms: 10_000,
            disk_promotion: true,
            replica_task_timeout_ms: 30_000,
            pending_task_timeout_ms: 300_000,
            max_pending_tasks: 10_000,
            max_finished_tasks: 10_000,
            task_retry_attempts: 10,
            verify_unreachable_reports: false,
        }
    }
}

/// Monotonic counters (read with [`MasterService::metrics`]).
#[derive(Debug, Default)]
pub struct Metrics {
    /// PutStart calls and failures, per key (so are the other operations': a batch counts each of its keys).
    pub put_start: OpCounter,
    /// PutEnd.
    pub put_end: OpCounter,
    /// PutRevoke.
    pub put_revoke: OpCounter,
    /// UpsertStart.
    pub upsert_start: OpCounter,
    /// GetReplicaList.
    pub get_replica_list: OpCounter,
    /// ExistKey.
    pub exist_key: OpCounter,
    /// Remove.
    pub remove: OpCounter,
    /// PutStarts that placed fewer replicas than asked.
    pub partial_placements: AtomicU64,
    /// Writes refused for quota after eviction retries.
    pub tenant_quota_rejects: AtomicU64,
    /// Eviction rounds run.
    pub eviction_runs: AtomicU64,
    /// Writes that found no room and took the answer of a round that had just found none, instead of running
    /// their own.
    pub room_rounds_spared: AtomicU64,
    /// Objects evicted.
    pub evicted_objects: AtomicU64,
    /// Bytes of replicas evicted.
    pub evicted_bytes: AtomicU64,
    /// Of the objects evicted, those whose NoF replicas were taken.
    pub evicted_nof_objects: AtomicU64,
    /// Of the bytes evicted, NoF replica bytes.
    pub evicted_nof_bytes: AtomicU64,
    /// Clients expired by the liveness monitor.
    pub expired_clients: AtomicU64,
    /// Background loop iterations (liveness of the loop itself).
    pub background_ticks: AtomicU64,
    /// NoF segments unmounted because their target failed its heartbeat probes.
    pub nof_unmounted_segments: AtomicU64,
    /// Unreachable reports the master's own probe confirmed (the segment turned SUSPECT).
    pub unreachable_confirmed: AtomicU64,
    /// Unreachable reports the master's own probe refuted (the node answered).
    pub unreachable_refuted: AtomicU64,
    /// Keys asked for by prefix lookups (BatchPrefixLease), and of those the keys in the runs found.
    pub prefix_lookups: PrefixCounter,
}

/// Prefix lookups' keys asked and found: the cache's prefix hit ratio as the engines see it.
#[derive(Debug, Default)]
pub struct PrefixCounter {
    /// Keys asked for.
    pub keys: AtomicU64,
    /// Keys in the runs found (and leased).
    pub hits: AtomicU64,
}

impl PrefixCounter {
    fn record(&self, asked: usize, found: usize) {
        self.keys.fetch_add(asked as u64, Ordering::Relaxed);
        self.hits.fetch_add(found as u64, Ordering::Relaxed);
    }
}

impl Metrics {
    /// The per-key counters by operation name (a batch counts each of its keys).
    pub fn per_key(&self) -> [(&'static str, &OpCounter); 7] {
        [
            ("put_start", &self.put_start),
            ("put_end", &self.put_end),
            ("put_revoke", &self.put_revoke),
            ("upsert_start", &self.upsert_start),
            ("get_replica_list", &self.get_replica_list),
            ("exist_key", &self.exist_key),
            ("remove", &self.remove),
        ]
    }
}

/// Requests and failures of one operation.
#[derive(Debug, Default)]
pub struct OpCounter {
    /// Calls.
    pub requests: AtomicU64,
    /// Calls that returned an error.
    pub failures: AtomicU64,
}

impl OpCounter {
    fn record<T>(&self, r: &Result<T, ErrorCode>) {
        self.record_all(std::slice::from_ref(r));
    }

    /// Records a batch's results with one update per counter (the counters are shared by every worker, so
    /// an update per key would bounce their cache line between CPUs for the whole batch).
    fn record_all<T>(&self, rs: &[Result<T, ErrorCode>]) {
        self.requests.fetch_add(rs.len() as u64, Ordering::Relaxed);
        let failed = rs.iter().filter(|r| r.is_err()).count() as u64;
        if failed > 0 {
            self.failures.fetch_add(failed, Ordering::Relaxed);
        }
    }
}

/// The master core.
pub struct MasterService {
    config: MasterConfig,
    clock: Arc<dyn Clock>,
    /// When this service (one master term: a lone master's run, or one leader term) began, in wall-clock Unix
    /// ms: the term its data-plane grants name (`crescent_net::grant`), so nodes refuse an earlier term's.
    epoch_ms: u64,
    pool: Arc<SegmentPool>,
    placement: Placer,
    local_ssd: LocalSsdManager,
    tenants: TenantRegistry,
    /// Requested quotas (multi-tenant mode); recomputation serialises on this lock.
    policies: Mutex<QuotaPolicies>,
    clients: clients::ClientTable,
    /// The principal that mounted each client id's segments (an authenticating master's; logged with them).
    mounters: mounters::Mounters,
    discards: discard::DiscardQueue,
    /// Segments reported unreachable, waiting for the master's probe (`verify_unreachable_reports`).
    reported: Mutex<std::collections::BTreeSet<crescent_proto::SegmentId>>,
    nof_health: nof_health::NofHealth,
    /// Set by a failed allocation (which evicts for itself); a hint that writes may evict until the next step.
    need_eviction: AtomicBool,
    /// Memory use was above the high watermark at the last eviction step: writes may evict inline until the
    /// next step says otherwise (a hint for the RPC layer, which runs such writes off its async workers).
    above_watermark: AtomicBool,
    /// The memory capacity the last eviction step saw (a hint for the watermark check of each write).
    seen_capacity: AtomicU64,
    /// Serialises allocation-failure eviction so concurrent writers do not each run a census, and remembers the
    /// last round that found no room: the writers queued behind it take its answer instead of scanning again.
    eviction_gate: Mutex<write::RoomRounds>,
    /// Allocation-failure rounds started so far: a writer reads it when its allocation fails, before it waits
    /// for the gate, so it knows which rounds looked at the pool after its own attempt.
    room_rounds_started: AtomicU64,
    /// Evictions logged but not yet durable (their space and quota still held), and offloads under way (their
    /// memory is freed when the copy is done).
    eviction_frees: Arc<crate::eviction::PendingFrees>,
    /// Disk evictions logged but not yet durable (their disk space still held).
    disk_frees: Arc<crate::eviction::PendingFrees>,
    /// The disk tier: offload tasks, disks' eviction order and counters.
    disk: disk::DiskTier,
    /// Copy and move tasks, and drain jobs.
    tasks: tasks::TaskBoard,
    next_replica_id: AtomicU64,
    metrics: Metrics,
    /// The oplog every mutation logs through, once attached (empty: no oplog, nothing logged).
    oplog: std::sync::OnceLock<Arc<crate::ha::OpLog>>,
    /// The KV event stream every object change is reported to, once attached (empty: none, nothing built).
    events: std::sync::OnceLock<Arc<crate::events::EventHub>>,
}

impl std::fmt::Debug for MasterService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterService").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The result of one eviction step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EvictionStep {
    /// Whether a round ran.
    pub ran: bool,
    /// Used ratio before the round.
    pub used_ratio: f64,
    /// What the round evicted.
    pub report: EvictionReport,
}

impl MasterService {
    /// A master with the given config and clock.
    pub fn new(config: MasterConfig, clock: Arc<dyn Clock>) -> Result<Self, ErrorCode> {
        let write_hold = (config.write_hold_ms > 0)
            .then(|| WriteHold { clock: clock.clone(), window: Duration::from_millis(config.write_hold_ms) });
        // Disk regions always hold: a disk task's range stays out of reuse past the task's deadline.
        let disk_hold = Some(WriteHold { clock: clock.clone(), window: Duration::from_millis(config.write_hold_ms) });
        let pool = Arc::new(
            SegmentPool::new(PoolConfig { cxl_window: config.cxl_window, write_hold, disk_hold })
                .map_err(|e| e.code())?,
        );
        let nof_health = nof_health::NofHealth::new(&config)?;
        let svc = Self {
            epoch_ms: crescent_net::grant::unix_ms(),
            placement: Placer::new(config.placement_policy),
            config,
            clock,
            pool,
            local_ssd: LocalSsdManager::new(),
            tenants: TenantRegistry::default(),
            policies: Mutex::new(QuotaPolicies::default()),
            clients: clients::ClientTable::default(),
            mounters: mounters::Mounters::default(),
            discards: discard::DiscardQueue::default(),
            reported: Mutex::default(),
            nof_health,
            need_eviction: AtomicBool::new(false),
            above_watermark: AtomicBool::new(false),
            seen_capacity: AtomicU64::new(0),
            eviction_gate: Mutex::new(write::RoomRounds::default()),
            room_rounds_started: AtomicU64::new(0),
            eviction_frees: Arc::default(),
            disk_frees: Arc::default(),
            disk: disk::DiskTier::default(),
            tasks: tasks::TaskBoard::default(),
            next_replica_id: AtomicU64::new(1),
            metrics: Metrics::default(),
            oplog: std::sync::OnceLock::new(),
            events: std::sync::OnceLock::new(),
        };
        if !svc.config.enable_multi_tenants {
            svc.tenants.get_or_insert_with(&TenantId::default_tenant(), || {
                TenantState::new(TenantId::default_tenant(), QuotaAccount::unlimited())
            });
        }
        Ok(svc)
    }

    /// A registered tenant's state (unit tests reach into metadata through this).
    #[cfg(test)]
    pub(crate) fn tenant_for_tests(&self, id: &TenantId) -> Arc<TenantState> {
        self.tenants.get(id).unwrap_or_else(|| panic!("tenant {id} is not registered"))
    }

    /// The config in force.
    pub fn config(&self) -> &MasterConfig {
        &self.config
    }

    /// When this master term began (wall-clock Unix ms): the term its grants name.
    pub fn epoch_ms(&self) -> u64 {
        self.epoch_ms
    }

    /// The segment pool (read-only use: queries, snapshots).
    pub fn pool(&self) -> &SegmentPool {
        &self.pool
    }

    /// The local SSD registry.
    pub fn local_ssd(&self) -> &LocalSsdManager {
        &self.local_ssd
    }

    /// Counters.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The current time on the master's clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.config.lease_ttl_ms)
    }

    /// How long a range handed out for `purpose` may still be transferred on any node's clock: the life of the
    /// data-plane grant an authenticating master's edge seals for it (the write window, or the lease) plus the
    /// clock slack. On a master with a write hold, that range's space stays out of reuse at least this long.
    fn handout_life(&self, purpose: Handout) -> Duration {
        let ms = match purpose {
            Handout::Write => self.config.grant_write_window_ms,
            Handout::Read => self.config.lease_ttl_ms,
        };
        Duration::from_millis(ms.saturating_add(crescent_net::grant::SKEW_MS))
    }

    /// The descriptors of `replicas` handed out for `purpose`, each buffer's space held for the handout's life
    /// (see [`AllocatedBuffer::hold_for`](crate::segment_pool::AllocatedBuffer::hold_for)). Called under the
    /// object's lock.
    fn hand_out<'a>(
        &self,
        replicas: impl IntoIterator<Item = &'a crate::metadata::Replica>,
        purpose: Handout,
    ) -> Vec<crescent_proto::ReplicaDescriptor> {
        let life = self.handout_life(purpose);
        replicas
            .into_iter()
            .filter_map(|r| {
                let d = r.descriptor()?;
                r.buffer.hold_for(life);
                Some(d)
            })
            .collect()
    }

    /// Whether `tenant` may name the tenant of a read: `INVALID_PARAMS` for a malformed id on a multi-tenant
    /// master (a single-tenant master reads the default tenant whatever is named, as its reads do). A valid
    /// tenant with nothing stored is fine (its reads find nothing).
    pub fn check_read_tenant(&self, tenant: &str) -> Result<(), ErrorCode> {
        self.read_tenant(tenant).map(|_| ())
    }

    /// Resolves the tenant of a read-type request. `Ok(None)`: a valid tenant with no state (nothing to find).
    fn read_tenant(&self, tenant: &str) -> Result<Option<Arc<TenantState>>, ErrorCode> {
        if !self.config.enable_multi_tenants {
            return Ok(self.tenants.get(&TenantId::default_tenant()));
        }
        let id = TenantId::new(tenant).map_err(|_| ErrorCode::InvalidParams)?;
        Ok(self.tenants.get(&id))
    }

    /// Resolves the tenant of a write: it must exist, be open for admission and not be in teardown. The
    /// returned op holds the tenant until the write has charged and published (teardown waits for it).
    fn write_tenant(&self, tenant: &str) -> Result<TenantOp, ErrorCode> {
        if !self.config.enable_multi_tenants {
            // The default tenant of single-tenant mode is never torn down: no shared counter to bump.
            let t = self.tenants.get(&TenantId::default_tenant()).ok_or(ErrorCode::InternalError)?;
            return t.enter(false).ok_or(ErrorCode::InternalError);
        }
        // An id that could never be registered (too long, reserved) is a bad request, not a missing tenant; no
        // tenant at all means `default`, as everywhere.
        let id = TenantId::new(tenant).map_err(|_| ErrorCode::InvalidParams)?;
        let op = self.tenants.get(&id).and_then(|t| t.enter(true)).ok_or(ErrorCode::TenantNotRegistered)?;
        op.quota().admit().map_err(|e| e.code())?;
        Ok(op)
    }

    fn next_replica_id(&self) -> u64 {
        self.next_replica_id.fetch_add(1, Ordering::Relaxed)
    }

    /// One eviction step: runs a round in each tier (memory, NoF) whose use is above the high watermark; returns
    /// the memory tier's. The background loop calls this every 10 ms; tests call it directly.
    pub fn step_eviction(&self) -> EvictionStep {
        // A failed allocation freed its own room when it failed; only the watermark starts a round here.
        self.need_eviction.store(false, Ordering::Release);
        let memory = self.step_eviction_in(Tier::Memory);
        self.above_watermark.store(memory.used_ratio > self.config.eviction_high_watermark, Ordering::Relaxed);
        self.step_eviction_in(Tier::Nof);
        memory
    }

    /// One tier's eviction step (the same watermark and ratio for every tier).
    fn step_eviction_in(&self, tier: Tier) -> EvictionStep {
        let kind = match tier {
            Tier::Memory => SegmentKind::Memory,
            Tier::Nof => SegmentKind::Nof,
            // A disk is evicted only to make room for an offload (oldest first), never on a watermark.
            Tier::Disk => return EvictionStep::default(),
        };
        let usage = self.pool.usage(kind);
        if tier == Tier::Memory {
            self.seen_capacity.store(usage.capacity, Ordering::Relaxed);
        }
        let used = usage.used_ratio();
        let hw = self.config.eviction_high_watermark;
        // While logged evictions wait for durability the usage does not show them: another round now would
        // evict twice for the same excess.
        if used <= hw || self.eviction_frees.any() {
            return EvictionStep { ran: false, used_ratio: used, report: EvictionReport::default() };
        }
        let ratio = self.config.eviction_ratio;
        let target = ratio.max(used - hw + ratio);
        let lower = (target * 0.5).max(used - hw);
        let report = self.evict_in(tier, EvictionScope::All, EvictionTarget::Fraction { target, lower });
        EvictionStep { ran: true, used_ratio: used, report }
    }

    /// Whether a new write may have to evict before it is placed: memory use was above the high watermark at
    /// the last eviction step, or an allocation has failed since. Cheap (two atomics); a hint, not a promise.
    pub fn under_memory_pressure(&self) -> bool {
        self.above_watermark.load(Ordering::Relaxed) || self.need_eviction.load(Ordering::Relaxed)
    }

    /// Runs one eviction round of memory replicas over `scope`.
    pub fn evict(&self, scope: EvictionScope, target: EvictionTarget) -> EvictionReport {
        self.evict_in(Tier::Memory, scope, target)
    }

    /// Runs one eviction round of `tier`'s replicas over `scope`.
    pub fn evict_in(&self, tier: Tier, scope: EvictionScope, target: EvictionTarget) -> EvictionReport {
        let tenants = match &scope {
            EvictionScope::All => self.tenants.all(),
            EvictionScope::Tenant(t) => self.tenants.get(t).into_iter().collect(),
        };
        let offloader = self.offloader().filter(|_| tier == Tier::Memory);
        let report = crate::eviction::run(
            &tenants,
            tier,
            target,
            self.clock.now(),
            self.config.allow_evict_soft_pinned,
            self.config.census_chunk,
            crate::eviction::Outlets {
                oplog: self.eviction_log(),
                offload: offloader.as_ref().map(|o| o as &dyn crate::eviction::Offload),
                events: self.events(),
            },
        );
        self.record_eviction(tier, &report);
        report
    }

    /// The oplog evictions log to, with the count of their frees still waiting for durability.
    pub(super) fn eviction_log(&self) -> Option<(&crate::ha::OpLog, &Arc<crate::eviction::PendingFrees>)> {
        self.oplog.get().map(|l| (&**l, &self.eviction_frees))
    }

    /// Whether logged evictions still hold space and quota until they are durable.
    pub(super) fn eviction_frees_pending(&self) -> bool {
        self.eviction_frees.any()
    }

    /// Waits (bounded by [`EVICTION_DURABLE_WAIT`]) for the space and quota of logged evictions to come back,
    /// where waiting is safe: off any runtime, or on a multi-threaded one (as `block_in_place`, so the
    /// writer's tasks keep running). On a single-threaded runtime the writer runs on this very thread, so it
    /// does not wait: the write fails for want of room and the next one finds it. Nor while the oplog writer
    /// is not accepting.
    pub(super) fn await_eviction_frees(&self) -> bool {
        self.await_frees(&self.eviction_frees)
    }

    /// [`MasterService::await_eviction_frees`] for any count of frees.
    fn await_frees(&self, frees: &crate::eviction::PendingFrees) -> bool {
        if !frees.any() {
            return true;
        }
        // A writer not accepting is retrying a failing backend (etcd down or full) or has stopped: the frees wait
        // for that write, which is seconds or an operator away, so holding a worker for the wait on every
        // mutation would only pile them up.
        if self.oplog.get().is_some_and(|l| !l.status().accepting) {
            return false;
        }
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Err(_) => frees.wait_settled(EVICTION_DURABLE_WAIT),
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                tokio::task::block_in_place(|| frees.wait_settled(EVICTION_DURABLE_WAIT))
            }
            Ok(_) => false,
        }
    }

    /// Counts a round in the metrics; returns memory to the OS after a large one.
    fn record_eviction(&self, tier: Tier, report: &EvictionReport) {
        self.metrics.eviction_runs.fetch_add(1, Ordering::Relaxed);
        self.metrics.evicted_objects.fetch_add(report.objects, Ordering::Relaxed);
        self.metrics.evicted_bytes.fetch_add(report.bytes, Ordering::Relaxed);
        if tier == Tier::Nof {
            self.metrics.evicted_nof_objects.fetch_add(report.objects, Ordering::Relaxed);
            self.metrics.evicted_nof_bytes.fetch_add(report.bytes, Ordering::Relaxed);
        }
        if report.objects >= crate::memory::TRIM_THRESHOLD {
            crate::memory::release_free_memory();
        }
    }

    /// Frees discarded buffers whose release time has come; returns how many were freed.
    pub fn step_discards(&self) -> usize {
        self.discards.release_due(self.clock.now(), self.durable_seq())
    }

    /// The oplog's durable sequence (`u64::MAX` without an oplog: nothing to wait for).
    fn durable_seq(&self) -> u64 {
        self.oplog.get().map_or(u64::MAX, |l| l.status().durable.last_seq)
    }

    /// Erases writes abandoned for longer than `put_start_release_timeout` that no new write preempted: their
    /// buffers are freed (no writer can still be writing) and the object goes unless something readable is
    /// left. The background loop runs this every minute. Returns how many writes were reclaimed.
    pub fn step_stale_writes(&self) -> u64 {
        let now = self.clock.now();
        let timeout = Duration::from_millis(self.config.put_start_release_timeout_ms);
        let mut n = 0;
        for t in self.tenants.all() {
            t.objects().visit_chunks(self.config.census_chunk, |chunk| {
                for e in chunk {
                    let mut st = e.lock();
                    let stale = st.lifecycle() == crate::metadata::Lifecycle::Active
                        && st.pending().is_some_and(|p| p.started.saturating_add(timeout) <= now);
                    if !stale {
                        continue;
                    }
                    n += 1;
                    let discarded = self.take_pending(&t, &mut st);
                    if st.has_readable() {
                        drop(st);
                        self.discard(discarded);
                        continue;
                    }
                    let dead = t.retire(&mut st);
                    drop(st);
                    self.discard(discarded);
                    t.detach(&e);
                    drop(dead);
                }
            });
        }
        // Their release time has passed: free them now rather than at the next discard step.
        self.discards.release_due(now, self.durable_seq());
        n
    }

    /// Bytes held by discarded buffers awaiting release.
    pub fn discarded_bytes(&self) -> u64 {
        self.discards.bytes()
    }

    /// Starts the background loop (eviction every 10 ms; liveness, graceful unmounts and discards every
    /// second). It stops when the returned handle is dropped.
    pub fn spawn_background(self: &Arc<Self>) -> std::io::Result<BackgroundLoop> {
        let stop = Arc::new(AtomicBool::new(false));
        let (svc, flag) = (Arc::clone(self), Arc::clone(&stop));
        let thread = std::thread::Builder::new().name("crescent-master-bg".into()).spawn(move || {
            let mut ticks = 0u64;
            // Rounds run every 10 ms under pressure, and writes run their own: they are logged as one summary
            // a second, not each.
            let mut evicted = EvictionSummary::default();
            while !flag.load(Ordering::Acquire) {
                evicted.add(&svc.step_eviction());
                if ticks.is_multiple_of(100) {
                    evicted.log_and_reset(svc.metrics());
                    svc.step_liveness();
                    svc.step_graceful_unmounts();
                    svc.step_discards();
                    svc.step_disk_tasks();
                    svc.step_replica_tasks();
                }
                if ticks.is_multiple_of(6000) {
                    svc.step_stale_writes();
                }
                ticks += 1;
                svc.metrics.background_ticks.fetch_add(1, Ordering::Relaxed);
                std::thread::park_timeout(Duration::from_millis(10));
            }
        })?;
        Ok(BackgroundLoop { stop, thread: Some(thread) })
    }
}

/// Eviction since the last log line: every round (the background loop's and the writes'), from the metrics.
#[derive(Debug, Default)]
struct EvictionSummary {
    /// `(rounds, objects, bytes)` of the metrics at the last line.
    logged: (u64, u64, u64),
    /// Used ratio the first background round since then saw (`None`: no background round ran).
    used_before: Option<f64>,
}

impl EvictionSummary {
    fn add(&mut self, step: &EvictionStep) {
        if step.ran && self.used_before.is_none() {
            self.used_before = Some(step.used_ratio);
        }
    }

    /// One info line if anything was evicted since the last (rounds that found nothing to take are debug).
    fn log_and_reset(&mut self, m: &Metrics) {
        let now = (
            m.eviction_runs.load(Ordering::Relaxed),
            m.evicted_objects.load(Ordering::Relaxed),
            m.evicted_bytes.load(Ordering::Relaxed),
        );
        let (rounds, objects, bytes) = (now.0 - self.logged.0, now.1 - self.logged.1, now.2 - self.logged.2);
        let plural = |n: u64| if n == 1 { "" } else { "s" };
        if objects > 0 {
            let before = self.used_before.map_or(String::new(), |u| format!("; memory {:.1} % used before", u * 100.0));
            tracing::info!(
                "eviction: {objects} object{}, {} in {rounds} round{}{before}",
                plural(objects),
                crescent_proto::human::fmt_bytes(bytes),
                plural(rounds),
            );
        } else if rounds > 0 {
            tracing::debug!(rounds, "eviction rounds found nothing evictable");
        }
        *self = Self { logged: now, used_before: None };
    }
}

/// A consistency report over all metadata (see [`MasterService::audit`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audit {
    /// Routed objects (any state).
    pub objects: u64,
    /// Σ bytes of replicas on live segments.
    pub replica_bytes: u64,
    /// Keys routed more than once in one tenant (must be 0).
    pub duplicate_keys: u64,
    /// Objects routed while not `Active` (must be 0 when no operation is in flight).
    pub not_active: u64,
    /// Tenants whose account disagrees with Σ of their objects' charges: (tenant, account, objects).
    pub quota_mismatches: Vec<(String, u64, u64)>,
    /// Pairs of replicas (of any objects) whose byte ranges overlap in one segment (must be 0: a reader's
    /// bytes belong to the object it asked for).
    pub overlapping_replicas: u64,
}

impl MasterService {
    /// Walks every object and cross-checks the accounting owners: replica bytes (to compare with the pool),
    /// per-tenant quota (account vs Σ settled + pending charges), uniqueness of routes. Meant for quiescent
    /// moments (tests, admin diagnostics): concurrent operations make the sums approximate.
    pub fn audit(&self) -> Audit {
        let mut a = Audit::default();
        let mut ranges: Vec<(crescent_proto::SegmentId, u64, u64)> = Vec::new();
        for t in self.tenants.all() {
            let mut keys = std::collections::HashSet::new();
            let mut charged = 0u64;
            t.objects().visit_chunks(self.config.census_chunk, |chunk| {
                for e in chunk {
                    a.objects += 1;
                    if !keys.insert(e.key().to_owned()) {
                        a.duplicate_keys += 1;
                    }
                    let st = e.lock();
                    if st.lifecycle() != crate::metadata::Lifecycle::Active {
                        a.not_active += 1;
                    }
                    a.replica_bytes +=
                        st.replicas.iter().filter(|r| r.is_valid()).map(|r| r.buffer.size()).sum::<u64>();
                    ranges.extend(
                        st.replicas
                            .iter()
                            .filter_map(|r| Some((r.buffer.segment_id()?, r.buffer.offset(), r.buffer.size()))),
                    );
                    charged += st.charged() + st.pending().map_or(0, |p| p.pending_charge);
                }
            });
            if t.quota().charged() != charged {
                a.quota_mismatches.push((t.id().to_string(), t.quota().charged(), charged));
            }
        }
        ranges.sort_unstable();
        a.overlapping_replicas =
            ranges.windows(2).filter(|w| w[0].0 == w[1].0 && w[0].1 + w[0].2 > w[1].1).count() as u64;
        a
    }
}

/// Handle of the background loop; dropping it stops the loop and joins the thread.
#[derive(Debug)]
pub struct BackgroundLoop {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for BackgroundLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod refcount_tests {
    //! Master-side replica pins (refcounts) are set by copy/move/offload work, which arrives in a later
    //! issue; these tests pin a replica directly to check the rules that already depend on it.
    use super::*;
    use crate::clock::ManualClock;
    use crate::eviction::{EvictionScope, EvictionTarget};
    use crescent_proto::{ClientId, ReplicateConfig};

    fn pinned_master() -> (MasterService, ClientId) {
        let svc = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1))).unwrap();
        svc.mount_segment(ClientId::random(), crescent_testkit::segment("s", 1 << 24)).unwrap();
        let w = ClientId::random();
        svc.put_start(w, "", "k", 100, &ReplicateConfig::default()).unwrap();
        svc.put_end(w, "", "k", None).unwrap();
        let t = svc.tenants.get(&TenantId::default_tenant()).unwrap();
        t.objects().get("k").unwrap().lock().replicas[0].refcnt = 1;
        (svc, w)
    }

    #[test]
    fn a_pinned_replica_blocks_upsert_removal_and_eviction() {
        let (svc, w) = pinned_master();
        assert_eq!(svc.upsert_start(w, "", "k", 100, &ReplicateConfig::default()), Err(ErrorCode::ObjectReplicaBusy));
        assert_eq!(svc.remove("", "k", true), Err(ErrorCode::ObjectHasReplicationTask));
        let r = svc.evict(EvictionScope::All, EvictionTarget::Fraction { target: 1.0, lower: 1.0 });
        assert_eq!((r.base, r.objects), (0, 0), "a refcount-pinned replica is not evictable");
        assert!(svc.get_replica_list("", "k").is_ok());
        let t = svc.tenants.get(&TenantId::default_tenant()).unwrap();
        t.objects().get("k").unwrap().lock().replicas[0].refcnt = 0;
        svc.remove("", "k", true).unwrap();
    }
}
