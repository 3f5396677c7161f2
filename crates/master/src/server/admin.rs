//! Admin HTTP (axum): `/metrics` (Prometheus text), `/health`, `/segments`,
//! `/keys?tenant=&prefix=&limit=&cursor=` (one page of keys, streamed; on the listing thread, one at a time),
//! tenant administration (`GET /tenants`, `PUT /tenants/{tenant}` with `?quota=10GiB` or a JSON body
//! `{"quota_bytes": N}`, `DELETE /tenants/{tenant}`) and `GET /local-ssd`. The tenant and local SSD routes run
//! the same requests as the RPCs (so they answer the same messages); a refusal is a JSON `{code, message}`
//! under a status saying what kind it is (400 bad input, 404 no such tenant, 409 not empty or single-tenant).
//! With a keyring, the mutating routes need the admin credential as a bearer token (401 otherwise, counted as a
//! failed authentication); the others stay open to scrapers, so the server binds loopback by default. With a
//! TLS server side the port speaks HTTPS (the same certificate as the RPC port; client certificates required
//! when the RPC requires them).

use super::rpc::RpcMetrics;
use super::target::Target;
use crate::ha::{HaStatus, SnapshotterStatus};
use crate::metadata::{LockClass, lock_stats};
use crate::service::MasterService;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use crescent_net::auth::{AuthFailure, Keyring};
use crescent_net::conn::Conn;
use crescent_net::tls::{self, TlsServer};
use crescent_proto::wire::ErrorFrame;
use crescent_proto::{ErrorCode, MasterReply, MasterRequest, MasterResponse, Principal, SegmentKind};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What every admin route shares (the original's routes, in `admin_compat`, too).
#[derive(Clone)]
pub(super) struct AdminState {
    target: Target,
    rpc: Arc<RpcMetrics>,
    snapshots: SnapshotSlot,
    /// With a keyring, mutating routes need `Authorization: Bearer <admin credential's key>`.
    keyring: Option<Arc<Keyring>>,
}

/// Where `/health` and `/metrics` find the snapshotter's status: set by whoever runs one (a master for its
/// life, a candidate for each term it leads), empty otherwise. A leaf lock, held only to clone the receiver.
#[derive(Clone, Default)]
pub struct SnapshotSlot(Arc<parking_lot::Mutex<Option<tokio::sync::watch::Receiver<SnapshotterStatus>>>>);

impl SnapshotSlot {
    /// Shows `status` (or nothing).
    pub fn set(&self, status: Option<tokio::sync::watch::Receiver<SnapshotterStatus>>) {
        *self.0.lock() = status;
    }

    /// The snapshotter's status now, if one runs.
    pub fn status(&self) -> Option<SnapshotterStatus> {
        let rx = self.0.lock().clone()?;
        let status = rx.borrow().clone();
        Some(status)
    }
}

/// A mutating request without the admin credential (answered 401 with a JSON body saying what is needed).
pub(super) struct Unauthorized;

impl From<Unauthorized> for Response {
    fn from(_: Unauthorized) -> Response {
        let body = serde_json::json!({
            "code": ErrorCode::AuthenticationFailed.name(),
            "message": "this endpoint needs the admin credential: Authorization: Bearer <key> (`crescent credential admin` prints it)",
        });
        (StatusCode::UNAUTHORIZED, Json(body)).into_response()
    }
}

impl AdminState {
    /// `Ok` when the request may change state: no keyring, or the admin credential as its bearer token.
    pub(super) fn require_admin(&self, headers: &HeaderMap) -> Result<(), Unauthorized> {
        let Some(ring) = &self.keyring else { return Ok(()) };
        let token =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if token.is_some_and(|t| ring.verify_token(&Principal::Admin, t)) {
            return Ok(());
        }
        let why = if token.is_some() { AuthFailure::BadProof(Principal::Admin) } else { AuthFailure::Missing };
        self.rpc.auth_failures.record("admin http", None, &why);
        Err(Unauthorized)
    }

    /// The service to answer from, or (a standby) the not-leader refusal (a 503 through [`refused`]).
    pub(super) fn svc(&self) -> Result<Arc<MasterService>, ErrorFrame> {
        self.target.route().map(|s| Arc::clone(&s))
    }
}

/// The admin routes.
pub fn admin_router(
    target: Target,
    rpc: Arc<RpcMetrics>,
    snapshots: SnapshotSlot,
    keyring: Option<Arc<Keyring>>,
) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/segments", get(segments))
        .route("/keys", get(keys))
        .route("/tenants", get(list_tenants))
        .route("/tenants/{tenant}", axum::routing::put(set_tenant_quota).delete(remove_tenant))
        .route("/local-ssd", get(local_ssd))
        .route("/kv_events/snapshot", get(kv_events_snapshot))
        .merge(super::admin_compat::routes())
        .merge(super::admin_compat_ops::routes())
        .with_state(AdminState { target, rpc, snapshots, keyring })
}

/// The admin port's connection cap: scrapers and operators, a few at a time. At the cap a newcomer closes the
/// oldest connection (the shared accept loop's rule), so a flood of idle or stalled connections can neither
/// take the process's descriptors nor lock the operators out.
pub const ADMIN_MAX_CONNECTIONS: usize = 64;

/// How long a request's head may take to arrive. Past it the connection is closed: a client sending a byte
/// now and then (slowloris) cannot hold a connection, and an idle keep-alive connection lasts this long.
pub const ADMIN_HEADER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a connection closed to make room may take to finish the response in hand.
const ADMIN_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// A running admin server; dropping it stops it at once, [`AdminServer::shutdown`] lets requests finish.
#[derive(Debug)]
pub struct AdminServer(crescent_net::ServerHandle);

impl AdminServer {
    /// Binds and serves the admin routes on the current runtime, on the accept loop every server runs (see
    /// `crescent_net::accept`), at most [`ADMIN_MAX_CONNECTIONS`] connections at once.
    pub async fn start(
        addr: SocketAddr,
        target: Target,
        rpc: Arc<RpcMetrics>,
        snapshots: SnapshotSlot,
        keyring: Option<Arc<Keyring>>,
        tls: Option<Arc<TlsServer>>,
    ) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let app = admin_router(target, rpc.clone(), snapshots, keyring);
        let metrics = rpc.clone();
        let handle = crescent_net::accept::spawn(
            "admin http",
            listener,
            ADMIN_MAX_CONNECTIONS,
            move |stream, peer, stop| {
                let (app, tls, metrics) = (app.clone(), tls.clone(), metrics.clone());
                async move {
                    // The handshake is bounded like a request's head.
                    let conn = tokio::select! {
                        conn = tls::accept_counted(tls.as_deref(), stream, ADMIN_HEADER_DEADLINE, &metrics.auth_failures, "admin http", peer) => conn,
                        () = stop.clone().stopping() => return,
                    };
                    match conn {
                        Ok(conn) => serve_http(conn, app, stop).await,
                        Err(e) => tracing::debug!(%peer, "admin connection closed: {e}"),
                    }
                }
            },
        )?;
        rpc.attach_server("admin", handle.counters());
        Ok(Self(handle))
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.0.local_addr()
    }

    /// The accept loop's counts.
    pub fn stats(&self) -> crescent_net::AcceptStats {
        self.0.stats()
    }

    /// Stops accepting and lets requests in progress finish for up to a second (a scraper that stalls
    /// mid-request, or reads a large answer slowly, cannot hold the process up), then ends the rest.
    pub async fn shutdown(self) {
        self.0.shutdown().await;
    }
}

/// Serves one HTTP/1 connection until the peer closes it, its next request's head is late
/// ([`ADMIN_HEADER_DEADLINE`]), or the accept loop tells it to stop (then the response in hand may finish
/// within [`ADMIN_DRAIN`]).
async fn serve_http(stream: Conn, app: Router, stop: crescent_net::Shutdown) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(ADMIN_HEADER_DEADLINE);
    let service = hyper_util::service::TowerToHyperService::new(app);
    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        done = conn.as_mut() => {
            if let Err(e) = done {
                tracing::debug!(error = %e, "admin connection closed");
            }
            return;
        }
        () = stop.stopping() => {}
    }
    conn.as_mut().graceful_shutdown();
    if tokio::time::timeout(ADMIN_DRAIN, conn).await.is_err() {
        tracing::debug!("an admin response still in progress was cut off");
    }
}

type Labels = Vec<(String, String)>;

fn counter(registry: &mut Registry, name: &str, help: &str, v: u64) {
    let c: Counter = Counter::default();
    c.inc_by(v);
    registry.register(name, help, c);
}

fn gauge(registry: &mut Registry, name: &str, help: &str, v: u64) {
    let g: Gauge<u64, AtomicU64> = Gauge::default();
    g.set(v);
    registry.register(name, help, g);
}

/// The accept loops' figures, labelled by server (`rpc`, `admin`): the connection cap in force, connections
/// open, closed to make room, refused, and failed accepts.
fn accept_loops(registry: &mut Registry, servers: &[(&'static str, crescent_net::AcceptStats)]) {
    let cap = Family::<Labels, Gauge<u64, AtomicU64>>::default();
    let open = Family::<Labels, Gauge<u64, AtomicU64>>::default();
    let [shed, refused, errors] = [(); 3].map(|()| Family::<Labels, Counter>::default());
    for (name, s) in servers {
        let l = vec![("server".to_string(), name.to_string())];
        cap.get_or_create(&l).set(s.max_connections as u64);
        open.get_or_create(&l).set(s.open);
        shed.get_or_create(&l).inc_by(s.shed);
        refused.get_or_create(&l).inc_by(s.refused);
        errors.get_or_create(&l).inc_by(s.accept_errors);
    }
    registry.register("connection_cap", "Connections a server takes at once (lowered to fit the open-file limit)", cap);
    registry.register("connections_open", "Connections a server serves now", open);
    registry.register("connections_shed", "Idle connections closed to make room for a newcomer at the cap", shed);
    registry.register("connections_refused", "Newcomers refused at the cap: every connection was busy", refused);
    registry.register("accept_errors", "Failed accepts (e.g. out of file descriptors)", errors);
}

/// Registers two counter families labelled by operation: calls (`names[0]`) and failures (`names[1]`).
fn per_op(
    registry: &mut Registry,
    names: [&str; 2],
    help: [&str; 2],
    ops: impl IntoIterator<Item = (&'static str, u64, u64)>,
) {
    let calls = Family::<Labels, Counter>::default();
    let failures = Family::<Labels, Counter>::default();
    for (op, n, failed) in ops {
        let l = vec![("op".to_string(), op.to_string())];
        calls.get_or_create(&l).inc_by(n);
        failures.get_or_create(&l).inc_by(failed);
    }
    registry.register(names[0], help[0], calls);
    registry.register(names[1], help[1], failures);
}

/// The KV event stream's figures (a master that publishes one), and each connected subscriber's, labelled by
/// where it connected from.
fn event_figures(r: &mut Registry, hub: &crate::events::EventHub) {
    let s = hub.stats();
    counter(r, "kv_events_published_batches", "KV event messages sent", s.published_batches);
    counter(r, "kv_events_published_events", "KV events sent", s.published_events);
    let dropped = "KV events dropped because the queue was full (subscribers see a gap in the message sequence)";
    counter(r, "kv_events_dropped_events", dropped, s.dropped_events);
    let behind = "KV events not sent to a subscriber because it had fallen behind, over every subscriber so far";
    counter(r, "kv_events_subscriber_dropped_events", behind, s.subscriber_dropped_events);
    counter(r, "kv_events_unparsed_keys", "KV events whose key is not a block hash", s.skipped_unparsed_keys);
    gauge(r, "kv_events_queued", "KV events waiting to be sent", s.queued);
    gauge(r, "kv_events_subscribers", "Subscribers connected to the KV event stream", s.subscribers);
    gauge(r, "kv_events_last_event_id", "The id (log sequence) of the last KV event queued", s.last_event_id);
    let sent = Family::<Labels, Counter>::default();
    let dropped = Family::<Labels, Counter>::default();
    let buffered = Family::<Labels, Gauge<u64, AtomicU64>>::default();
    for sub in hub.subscriber_stats() {
        let l = vec![("peer".to_string(), sub.peer.to_string())];
        sent.get_or_create(&l).inc_by(sub.sent_events);
        dropped.get_or_create(&l).inc_by(sub.dropped_events);
        buffered.get_or_create(&l).set(sub.buffered_bytes);
    }
    r.register("kv_events_peer_sent_events", "KV events sent to a connected subscriber", sent);
    let help = "KV events not sent to a connected subscriber because it had fallen behind (it sees a gap)";
    r.register("kv_events_peer_dropped_events", help, dropped);
    r.register("kv_events_peer_buffered_bytes", "Bytes waiting for a connected subscriber to take them", buffered);
}

/// The exposition of what there is: the servers' counters always, the service's while it serves, a
/// candidate's HA status.
fn render(
    svc: Option<&MasterService>,
    rpc: &RpcMetrics,
    ha: Option<&HaStatus>,
    snapshots: Option<&SnapshotterStatus>,
) -> String {
    let mut r = Registry::with_prefix("crescent_master");
    per_op(
        &mut r,
        ["requests", "failures"],
        ["RPC requests per operation", "RPC requests that failed, per operation"],
        rpc.snapshot(),
    );
    counter(&mut r, "malformed_frames", "Frames refused as malformed", rpc.malformed_frames.load(Ordering::Relaxed));
    counter(&mut r, "auth_failures", "Peers refused for failing authentication", rpc.auth_failures.total());
    counter(
        &mut r,
        "permission_denied",
        "Requests refused beyond their principal's scope",
        rpc.denied.load(Ordering::Relaxed),
    );
    counter(&mut r, "connections", "RPC connections accepted", rpc.connections.load(Ordering::Relaxed));
    accept_loops(&mut r, &rpc.servers());
    if let Some(ha) = ha {
        ha_figures(&mut r, ha);
    }
    if let Some(st) = snapshots {
        snapshot_figures(&mut r, st);
    }
    if let Some(svc) = svc {
        service_figures(&mut r, svc);
        if let Some(hub) = svc.events() {
            event_figures(&mut r, hub);
        }
    }
    let mut out = String::new();
    if encode(&mut out, &r).is_err() {
        out.clear();
    }
    out
}

/// A candidate's HA status as `crescent_master_ha_*` series.
fn ha_figures(r: &mut Registry, ha: &HaStatus) {
    gauge(r, "ha_leader", "1 while this master leads, 0 as a standby", u64::from(ha.is_leader()));
    gauge(
        r,
        "ha_state",
        "HA state: 0 bootstrapping, 1 following, 2 retrying, 3 promoting, 4 leading, 5 failed, 6 stopped",
        ha.state.code(),
    );
    gauge(r, "ha_applied_seq", "Last oplog sequence applied (standby) or durable (leader)", ha.applied_seq);
    gauge(r, "ha_durable_seq", "Last durable oplog sequence seen", ha.durable_seq);
    gauge(r, "ha_lag_entries", "Durable oplog entries not applied yet", ha.lag);
    gauge(r, "ha_view_version", "View version of the current leader", ha.view_version);
    counter(r, "ha_promotions", "Times this master became the leader", ha.promotions);
    counter(r, "ha_failed_promotions", "Promotions that did not complete", ha.failed_promotions);
    counter(r, "ha_step_downs", "Times this master stopped leading", ha.step_downs);
}

/// The snapshotter's status as `crescent_master_snapshot*` series.
fn snapshot_figures(r: &mut Registry, st: &SnapshotterStatus) {
    counter(r, "snapshots_written", "Snapshots published", st.written);
    counter(r, "snapshot_failures", "Snapshot attempts that failed", st.failures);
    counter(r, "snapshot_compacted_batches", "Oplog batches deleted below the retained snapshots", st.compacted);
    let last = st.last.as_ref();
    gauge(r, "snapshot_last_seq", "Last oplog sequence the newest snapshot includes", last.map_or(0, |m| m.last_seq));
    gauge(r, "snapshot_last_bytes", "Size of the newest snapshot", last.map_or(0, |m| m.data_size));
    gauge(
        r,
        "snapshot_last_created_ms",
        "When the newest snapshot was written (ms since the Unix epoch)",
        last.map_or(0, |m| m.created_ms),
    );
}

/// `/health`'s `snapshots` object.
fn snapshot_health(st: &SnapshotterStatus) -> serde_json::Value {
    serde_json::json!({
        "written": st.written,
        "failures": st.failures,
        "last_error": st.last_error,
        "compacted_batches": st.compacted,
        "last": st.last.as_ref().map(|m| serde_json::json!({
            "id": m.id,
            "batch_id": m.batch_id,
            "last_seq": m.last_seq,
            "bytes": m.data_size,
            "created_ms": m.created_ms,
        })),
    })
}

/// Copy/move tasks' counters, and the disk tier's series: the master's own counters, and per disk (labelled by
/// node and segment id) its capacity, use, objects and evictions, and what its node reported of its reads, writes
/// and errors.
fn disk_figures(r: &mut Registry, svc: &MasterService) {
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let t = svc.tasks().metrics();
    counter(r, "replica_tasks_created", "Copy and move tasks created (a drain's moves included)", load(&t.created));
    counter(r, "replica_tasks_succeeded", "Copy and move tasks whose replicas are in place", load(&t.succeeded));
    counter(r, "replica_tasks_failed", "Copy and move tasks that ended without effect", load(&t.failed));
    counter(r, "replica_task_bytes", "Bytes copied by copy and move tasks that succeeded", load(&t.copied_bytes));
    gauge(r, "replica_tasks_in_flight", "Copy and move tasks not yet ended", svc.tasks().in_flight() as u64);
    let m = svc.disk_tier().metrics();
    counter(r, "disk_offloads_started", "Memory evictions being copied to a node's disk", load(&m.offloads_started));
    counter(r, "disk_offloads_done", "Objects kept on a node's disk instead of dropped", load(&m.offloads_done));
    counter(r, "disk_offloads_failed", "Copies to disk that failed or expired", load(&m.offloads_failed));
    counter(r, "disk_offloads_refused", "Memory evictions dropped: no room on the disk", load(&m.offloads_refused));
    counter(r, "disk_evictions", "Disk replicas evicted for room, oldest first", load(&m.disk_evictions));
    counter(r, "disk_faults", "Disk replicas dropped because their node could not read them", load(&m.disk_faults));
    counter(r, "disk_promotions_done", "Disk-only objects a read brought back to memory", load(&m.promotions_done));
    counter(
        r,
        "disk_promotions_failed",
        "Promotions that failed, expired or found the object gone",
        load(&m.promotions_failed),
    );
    let usage = svc.pool().usage(SegmentKind::Disk);
    gauge(r, "disk_capacity_bytes", "Mounted disk tier capacity", usage.capacity);
    gauge(r, "disk_used_bytes", "Disk tier bytes used by replicas", usage.used);
    let families: [(&str, &str); 9] = [
        ("disk_segment_capacity_bytes", "Capacity per disk"),
        ("disk_segment_used_bytes", "Used bytes per disk"),
        ("disk_segment_objects", "Replicas per disk"),
        ("disk_segment_evictions", "Replicas evicted per disk"),
        ("disk_segment_reads", "Reads per disk, as its node counts them"),
        ("disk_segment_read_bytes", "Bytes read per disk"),
        ("disk_segment_writes", "Writes per disk"),
        ("disk_segment_write_bytes", "Bytes written per disk"),
        ("disk_segment_errors", "I/O errors per disk"),
    ];
    let gauges: Vec<Family<Labels, Gauge<u64, AtomicU64>>> = families.iter().map(|_| Family::default()).collect();
    for s in svc.pool().segments().into_iter().filter(|s| s.spec.kind == SegmentKind::Disk) {
        let d = svc.disk_tier().segment_stats(s.spec.id);
        let c = d.counters;
        let values = [
            s.usage.capacity,
            s.usage.used,
            d.objects,
            d.evictions,
            c.reads,
            c.read_bytes,
            c.writes,
            c.write_bytes,
            c.errors,
        ];
        let l = vec![("node".to_string(), s.spec.name.clone()), ("id".to_string(), s.spec.id.to_string())];
        for (g, v) in gauges.iter().zip(values) {
            g.get_or_create(&l).set(v);
        }
    }
    for ((name, help), g) in families.into_iter().zip(gauges) {
        r.register(name, help, g);
    }
}

/// The service's series.
fn service_figures(r: &mut Registry, svc: &MasterService) {
    let m = svc.metrics();
    let per_key =
        m.per_key().map(|(op, c)| (op, c.requests.load(Ordering::Relaxed), c.failures.load(Ordering::Relaxed)));
    per_op(
        r,
        ["key_operations", "key_failures"],
        ["Keys handled per operation (a batch counts each key)", "Keys that failed, per operation"],
        per_key,
    );
    counter(r, "evicted_objects", "Objects evicted", m.evicted_objects.load(Ordering::Relaxed));
    counter(r, "evicted_bytes", "Replica bytes evicted", m.evicted_bytes.load(Ordering::Relaxed));
    counter(
        r,
        "evicted_nof_objects",
        "Objects evicted from NoF segments",
        m.evicted_nof_objects.load(Ordering::Relaxed),
    );
    counter(r, "evicted_nof_bytes", "NoF replica bytes evicted", m.evicted_nof_bytes.load(Ordering::Relaxed));
    counter(r, "eviction_runs", "Eviction rounds", m.eviction_runs.load(Ordering::Relaxed));
    counter(
        r,
        "room_rounds_spared",
        "Writes without room that took the answer of a round that had just found none instead of running one",
        m.room_rounds_spared.load(Ordering::Relaxed),
    );
    counter(
        r,
        "partial_placements",
        "Writes placed on fewer replicas than asked",
        m.partial_placements.load(Ordering::Relaxed),
    );
    counter(r, "tenant_quota_rejects", "Writes refused for quota", m.tenant_quota_rejects.load(Ordering::Relaxed));
    counter(r, "expired_clients", "Clients expired by the liveness monitor", m.expired_clients.load(Ordering::Relaxed));
    counter(r, "background_ticks", "Background loop iterations", m.background_ticks.load(Ordering::Relaxed));
    counter(
        r,
        "nof_unmounted_segments",
        "NoF segments unmounted after their target failed its heartbeat probes",
        m.nof_unmounted_segments.load(Ordering::Relaxed),
    );
    counter(
        r,
        "unreachable_confirmed",
        "Unreachable reports the master's own probe confirmed",
        m.unreachable_confirmed.load(Ordering::Relaxed),
    );
    counter(
        r,
        "unreachable_refuted",
        "Unreachable reports the master's own probe refuted (the node answered)",
        m.unreachable_refuted.load(Ordering::Relaxed),
    );
    counter(r, "prefix_lookup_keys", "Keys asked for by prefix lookups", m.prefix_lookups.keys.load(Ordering::Relaxed));
    counter(
        r,
        "prefix_lookup_hits",
        "Of the keys asked for by prefix lookups, those in the runs found (and leased)",
        m.prefix_lookups.hits.load(Ordering::Relaxed),
    );
    gauge(r, "keys", "Objects stored", svc.key_count(None) as u64);
    gauge(r, "active_clients", "Clients tracked by the liveness monitor", svc.active_clients() as u64);
    let (listing, waiting) = super::lister::load();
    gauge(r, "key_listings_running", "Key listings scanning the index now (they take turns)", listing as u64);
    gauge(r, "key_listings_waiting", "Key listings waiting their turn", waiting as u64);
    let usage = svc.pool().usage(SegmentKind::Memory);
    gauge(r, "memory_capacity_bytes", "Mounted memory capacity", usage.capacity);
    gauge(r, "memory_used_bytes", "Memory used by replicas", usage.used);
    let held = "Of the memory used, bytes freed but held out of reuse while a write grant may still cover them";
    gauge(r, "memory_held_bytes", held, usage.held);
    let cap = Family::<Labels, Gauge<u64, AtomicU64>>::default();
    let used = Family::<Labels, Gauge<u64, AtomicU64>>::default();
    for s in svc.pool().segments() {
        let l = vec![("segment".to_string(), s.spec.name.clone()), ("id".to_string(), s.spec.id.to_string())];
        cap.get_or_create(&l).set(s.usage.capacity);
        used.get_or_create(&l).set(s.usage.used);
    }
    r.register("segment_capacity_bytes", "Capacity per segment", cap);
    r.register("segment_used_bytes", "Used bytes per segment", used);
    disk_figures(r, svc);
    let contended = Family::<Labels, Counter>::default();
    let waited = Family::<Labels, Counter>::default();
    for class in LockClass::ALL {
        let (n, ns) = lock_stats(class);
        let l = vec![("lock".to_string(), class.name().to_string())];
        contended.get_or_create(&l).inc_by(n);
        waited.get_or_create(&l).inc_by(ns);
    }
    r.register("lock_contended", "Lock acquisitions that found the lock held, per lock class", contended);
    r.register("lock_wait_nanoseconds", "Time contended acquisitions waited, per lock class", waited);
    if let Some(log) = svc.oplog() {
        let st = log.status();
        gauge(
            r,
            "oplog_state",
            "Oplog writer: 0 accepting, 1 retrying, 2 stopped, fenced or terminal",
            oplog_state(&st).1,
        );
        gauge(r, "oplog_durable_seq", "Last durable oplog sequence number", st.durable.last_seq);
        gauge(r, "oplog_durable_batch", "Batch id of the durable prefix", st.durable.batch_id);
        gauge(r, "oplog_next_seq", "Sequence number the next entry gets", st.next_seq);
        gauge(r, "oplog_waiting_entries", "Oplog entries reserved or waiting to be sealed", st.waiting as u64);
        counter(r, "oplog_failed_writes", "Oplog batch writes that failed (and were retried)", st.failed_attempts);
        counter(
            r,
            "oplog_admission_failures",
            "Mutations refused because the oplog was not accepting",
            log.admission_failures(),
        );
        let metrics = log.metrics();
        gauge(
            r,
            "degraded_milliseconds",
            "How long /health has said degraded: the oplog writer retrying, fenced or stopped (0: ok)",
            degraded(&st, &metrics).map_or(0, |(_, d)| d.as_millis() as u64),
        );
        writer_figures(r, &metrics);
    }
}

async fn metrics(State(s): State<AdminState>) -> Response {
    let ha = s.target.elected().map(|e| e.status());
    let body = render(s.svc().ok().as_deref(), &s.rpc, ha.as_ref(), s.snapshots.status().as_ref());
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body).into_response()
}

/// The oplog writer's figures (RFC Phase 5): durable writes, commit→durable and callback latency over the last
/// samples, entries and bytes per write (cumulative `le` buckets, with `_sum`/`_count`), retries, the age of a
/// batch in flight and how long one has been stuck, queue depths, refusals by cause.
fn writer_figures(r: &mut Registry, m: &crescent_ha::oplog::WriterMetrics) {
    counter(r, "oplog_durable_writes", "Oplog writes (batches) made durable", m.durable_writes);
    counter(r, "oplog_durable_entries", "Oplog entries made durable", m.durable_entries);
    counter(r, "oplog_retries", "Oplog write attempts retried after a backend failure", m.retries);
    for (name, help, l) in [
        ("oplog_commit_to_durable_microseconds", "Commit to durable, over the last samples", &m.commit_to_durable),
        (
            "oplog_callback_latency_microseconds",
            "Durable to its callback run, over the last samples",
            &m.callback_latency,
        ),
    ] {
        let family = Family::<Labels, Gauge<u64, AtomicU64>>::default();
        for (q, d) in [("0.5", l.p50), ("0.99", l.p99), ("1", l.max)] {
            family.get_or_create(&vec![("quantile".to_string(), q.to_string())]).set(d.as_micros() as u64);
        }
        r.register(name, help, family);
    }
    let ms = |d: Option<std::time::Duration>| d.map_or(0, |d| d.as_millis() as u64);
    gauge(r, "oplog_in_flight_age_milliseconds", "Age of the batch being written (0: none)", ms(m.in_flight_age));
    gauge(
        r,
        "oplog_stuck_milliseconds",
        "How long the batch in flight has been failing (0: not stuck)",
        ms(m.stuck_for),
    );
    gauge(r, "oplog_committed_not_durable", "Entries committed, not durable yet", m.committed_not_durable as u64);
    gauge(r, "oplog_callback_queue", "Durable callbacks waiting to run", m.callback_queue as u64);
    counter(
        r,
        "oplog_callback_panics",
        "Durable callbacks that panicked (caught; the next ones ran)",
        m.callback_panics,
    );
    let refused = Family::<Labels, Counter>::default();
    let a = &m.admission_failures;
    for (cause, n) in [
        ("unavailable", a.unavailable),
        ("queue_full", a.queue_full),
        ("terminal", a.terminal),
        ("invalid_entry", a.invalid_entry),
    ] {
        refused.get_or_create(&vec![("cause".to_string(), cause.to_string())]).inc_by(n);
    }
    r.register("oplog_refused", "Oplog reservations and commits refused, by cause", refused);
    for (name, help, h) in [
        ("oplog_write_entries", "Entries per durable oplog write", &m.batch_entries),
        ("oplog_write_bytes", "Bytes (upper bound) per durable oplog write", &m.batch_bytes),
    ] {
        // Gauges holding the writer's own counts (a counter's name would gain `_total`).
        let buckets = Family::<Labels, Gauge<u64, AtomicU64>>::default();
        let mut cumulative = 0;
        let bounds = h.bounds.iter().map(|b| b.to_string()).chain(std::iter::once("+Inf".to_string()));
        for (le, n) in bounds.zip(&h.counts) {
            cumulative += n;
            buckets.get_or_create(&vec![("le".to_string(), le)]).set(cumulative);
        }
        r.register(format!("{name}_bucket"), help, buckets);
        gauge(r, &format!("{name}_sum"), help, h.sum);
        gauge(r, &format!("{name}_count"), help, h.total);
    }
}

/// The writer's state as `/health` and `/metrics` name it: `(name, number)`.
fn oplog_state(st: &crescent_ha::oplog::WriterStatus) -> (&'static str, u64) {
    match (&st.terminal, st.accepting) {
        (Some(crescent_ha::oplog::StorageError::Fenced { .. }), _) => ("fenced", 2),
        (Some(_), _) => ("terminal", 2),
        (None, true) => ("accepting", 0),
        (None, false) if st.last_error.is_some() => ("retrying", 1),
        (None, false) => ("stopped", 2),
    }
}

/// Why a master with an oplog is degraded, and for how long: its writer is not taking mutations (retrying a
/// failing backend — etcd down, or full under its NOSPACE alarm —, fenced by a newer leader, stopped for good,
/// or stopping). `None` while it accepts.
fn degraded(
    st: &crescent_ha::oplog::WriterStatus,
    m: &crescent_ha::oplog::WriterMetrics,
) -> Option<(String, std::time::Duration)> {
    let (state, _) = oplog_state(st);
    if state == "accepting" {
        return None;
    }
    let why = match (&st.terminal, &st.last_error) {
        (Some(e), _) | (None, Some(e)) => e.to_string(),
        (None, None) => "the writer is stopping".to_owned(),
    };
    Some((format!("oplog {state}: {why}"), m.closed_for.unwrap_or_default()))
}

async fn health(State(s): State<AdminState>) -> Json<serde_json::Value> {
    let ha = s.target.elected().map(|e| e.status());
    let role = ha.as_ref().map_or("master", HaStatus::role);
    let mut body = serde_json::json!({ "status": "ok", "role": role });
    if let Some(ha) = &ha {
        body["ha"] = serde_json::to_value(ha).unwrap_or_default();
    }
    if let Some(st) = s.snapshots.status() {
        body["snapshots"] = snapshot_health(&st);
    }
    let Ok(svc) = s.svc() else { return Json(body) };
    let oplog = svc.oplog().map(|log| {
        let st = log.status();
        if let Some((reason, since)) = degraded(&st, &log.metrics()) {
            body["status"] = "degraded".into();
            body["reason"] = reason.into();
            body["degraded_seconds"] = since.as_secs_f64().into();
        }
        serde_json::json!({
            "state": oplog_state(&st).0,
            "durable_seq": st.durable.last_seq,
            "durable_batch": st.durable.batch_id,
            "next_seq": st.next_seq,
            "waiting": st.waiting,
            "in_flight": st.in_flight,
            "failed_writes": st.failed_attempts,
            "last_error": st.last_error.as_ref().map(ToString::to_string),
            "terminal": st.terminal.as_ref().map(ToString::to_string),
            "admission_failures": log.admission_failures(),
        })
    });
    body["segments"] = svc.pool().len().into();
    body["keys"] = svc.key_count(None).into();
    body["active_clients"] = svc.active_clients().into();
    body["oplog"] = oplog.unwrap_or(serde_json::Value::Null);
    Json(body)
}

async fn segments(State(s): State<AdminState>) -> Result<Json<serde_json::Value>, Response> {
    let svc = s.svc().map_err(refused)?;
    let list: Vec<serde_json::Value> = svc
        .pool()
        .segments()
        .into_iter()
        .map(|x| {
            let mut v = serde_json::json!({
                "segment_id": x.spec.id.to_string(),
                "name": x.spec.name,
                "client_id": x.client.to_string(),
                "kind": format!("{:?}", x.spec.kind),
                "status": format!("{:?}", x.status),
                "endpoint": x.spec.endpoint,
                "host": x.spec.host_id,
                "capacity_bytes": x.usage.capacity,
                "used_bytes": x.usage.used,
            });
            if x.spec.kind == SegmentKind::Disk {
                let d = svc.disk_tier().segment_stats(x.spec.id);
                v["disk"] = serde_json::json!({
                    "objects": d.objects,
                    "evictions": d.evictions,
                    "reads": d.counters.reads,
                    "read_bytes": d.counters.read_bytes,
                    "writes": d.counters.writes,
                    "write_bytes": d.counters.write_bytes,
                    "errors": d.counters.errors,
                });
            }
            v
        })
        .collect();
    Ok(Json(serde_json::json!({ "segments": list })))
}

#[derive(Deserialize)]
struct KeysQuery {
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    prefix: String,
    limit: Option<usize>,
    /// Keys strictly after this one: the `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// `GET /keys`: `{"keys": [...], "next_cursor": KEY | null}`, one page (`limit`, default 10 000, at most
/// 1 000 000, and at most what an RPC reply carries); `next_cursor` passed as `cursor` gives the next page.
/// The listing runs on the listing thread, one at a time (a request that waited its turn 10 s, or finds 64
/// waiting, is answered 503); the body is serialised a chunk at a time as it is sent.
async fn keys(State(s): State<AdminState>, Query(q): Query<KeysQuery>) -> Result<Response, Response> {
    let limit = q.limit.unwrap_or(10_000).min(1_000_000) as u32;
    let req = MasterRequest::ListKeysPage { tenant: q.tenant, prefix: q.prefix, after: q.cursor, limit };
    let svc = s.svc().map_err(refused)?;
    let reply = match super::lister::run(move || super::rpc::dispatch(&svc, &req)).await {
        Ok(reply) => reply,
        Err(ErrorCode::UnavailableInCurrentStatus) => return Err(busy()),
        Err(code) => Err(ErrorFrame { code, message: "the key listing failed".into() }),
    };
    match reply.map_err(refused)? {
        MasterResponse::KeyPage(page) => Ok((
            [(header::CONTENT_TYPE, "application/json")],
            Body::from_stream(futures_util::stream::iter(KeysJson::new(page))),
        )
            .into_response()),
        other => Err(unexpected(&other)),
    }
}

/// `/kv_events/snapshot`'s query: a tenant (default: the default tenant), the previous page's `next_cursor`, and
/// how many objects a page holds (default 1 000, at most 100 000).
#[derive(serde::Deserialize)]
struct SnapshotQuery {
    #[serde(default)]
    tenant: String,
    cursor: Option<String>,
    limit: Option<usize>,
}

/// `GET /kv_events/snapshot`: one page of what a tenant stores, for a KV event consumer that resyncs:
/// `{"event_id": S, "objects": [{object_key, tenant_id, group_id, medium, size, replicas, seq_hashes}, ...],
/// "next_cursor": KEY | null}`, objects in key order. Apply the stream's events with ids above the first page's
/// `event_id` over the pages. Runs as `/keys` does (off the request workers, one listing at a time; 503 when
/// busy).
async fn kv_events_snapshot(State(s): State<AdminState>, Query(q): Query<SnapshotQuery>) -> Result<Response, Response> {
    #[derive(serde::Serialize)]
    struct Replica<'a> {
        segment: &'a str,
        tier: &'a str,
    }
    #[derive(serde::Serialize)]
    struct Object<'a> {
        object_key: &'a str,
        tenant_id: &'a str,
        group_id: Option<&'a str>,
        medium: &'a str,
        size: u64,
        replicas: Vec<Replica<'a>>,
        seq_hashes: Vec<u64>,
    }
    #[derive(serde::Serialize)]
    struct Page<'a> {
        event_id: u64,
        objects: Vec<Object<'a>>,
        next_cursor: Option<&'a str>,
    }
    let limit = q.limit.unwrap_or(1_000).min(100_000);
    let svc = s.svc().map_err(refused)?;
    let page = match super::lister::run(move || svc.events_snapshot_page(&q.tenant, q.cursor.as_deref(), limit)).await {
        Ok(Ok(page)) => page,
        Ok(Err(code)) => {
            return Err(refused(ErrorFrame { code, message: format!("{}: snapshot refused", code.name()) }));
        }
        Err(ErrorCode::UnavailableInCurrentStatus) => return Err(busy()),
        Err(code) => return Err(refused(ErrorFrame { code, message: "the snapshot failed".into() })),
    };
    let objects = page
        .objects
        .iter()
        .map(|e| Object {
            object_key: &e.key,
            tenant_id: &e.tenant,
            group_id: e.group.as_deref(),
            medium: e.medium,
            size: e.size,
            replicas: e.replicas.iter().map(|r| Replica { segment: &r.segment, tier: r.tier }).collect(),
            seq_hashes: crate::events::wire::parse_seq_hash(&e.key).into_iter().collect(),
        })
        .collect();
    Ok(Json(Page { event_id: page.as_of, objects, next_cursor: page.next.as_deref() }).into_response())
}

/// 503: other listings kept the master busy.
fn busy() -> Response {
    let mut r =
        refused(ErrorFrame { code: ErrorCode::UnavailableInCurrentStatus, message: super::lister::busy_message() });
    r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    r
}

/// A `/keys` page as JSON, serialised about [`KeysJson::CHUNK`] bytes at a time as the body is sent.
struct KeysJson {
    keys: std::vec::IntoIter<String>,
    /// The cursor of the next page, until the closing part of the body is written.
    next: Option<Option<String>>,
    opened: bool,
    first: bool,
}

impl KeysJson {
    const CHUNK: usize = 64 << 10;

    fn new(page: crescent_proto::KeyPage) -> Self {
        Self { keys: page.keys.into_iter(), next: Some(page.next), opened: false, first: true }
    }
}

impl Iterator for KeysJson {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.next.as_ref()?;
        let mut buf = Vec::with_capacity(Self::CHUNK + (8 << 10));
        if !std::mem::replace(&mut self.opened, true) {
            buf.extend_from_slice(b"{\"keys\":[");
        }
        // Serialising a string into a Vec cannot fail.
        while buf.len() < Self::CHUNK {
            match self.keys.next() {
                Some(k) => {
                    if !std::mem::replace(&mut self.first, false) {
                        buf.push(b',');
                    }
                    let _ = serde_json::to_writer(&mut buf, &k);
                }
                None => {
                    buf.extend_from_slice(b"],\"next_cursor\":");
                    let _ = serde_json::to_writer(&mut buf, next);
                    buf.push(b'}');
                    self.next = None;
                    break;
                }
            }
        }
        Some(Ok(Bytes::from(buf)))
    }
}

/// A refused admin request: `{code, message}` under the HTTP status of its kind.
fn refused(e: ErrorFrame) -> Response {
    let status = match e.code {
        ErrorCode::InvalidParams => StatusCode::BAD_REQUEST,
        ErrorCode::ObjectNotFound | ErrorCode::TenantNotRegistered | ErrorCode::SegmentNotFound => {
            StatusCode::NOT_FOUND
        }
        ErrorCode::TenantNotEmpty | ErrorCode::UnavailableInCurrentMode => StatusCode::CONFLICT,
        ErrorCode::UnavailableInCurrentStatus => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, Json(serde_json::json!({ "code": e.code.name(), "message": e.message }))).into_response()
}

fn bad_request(message: String) -> Response {
    refused(ErrorFrame { code: ErrorCode::InvalidParams, message })
}

/// Runs `req` as its RPC would run, off the async workers (a tenant removal may wait briefly for the writes
/// it drains); a candidate answers once what the answer depends on is durable, as its RPCs do.
async fn run(s: &AdminState, req: MasterRequest) -> Result<MasterResponse, Response> {
    let svc = s.svc().map_err(refused)?;
    let reply: MasterReply = durably(svc, move |svc| super::rpc::dispatch(svc, &req)).await.map_err(refused)?;
    reply.map_err(refused)
}

/// Runs `change` on `svc` off the async workers and, when it succeeded, waits until everything the log holds so
/// far is durable (a refusal acknowledges nothing: answered at once). Its answer; `Err` when the change may not be
/// durable (`PERSISTENT_FAIL`) or the task died.
pub(super) async fn durably<T: Send + 'static, E: Send + 'static>(
    svc: Arc<MasterService>,
    change: impl FnOnce(&MasterService) -> Result<T, E> + Send + 'static,
) -> Result<Result<T, E>, ErrorFrame> {
    let log = svc.oplog().cloned();
    let answer = tokio::task::spawn_blocking(move || change(&svc))
        .await
        .map_err(|e| ErrorFrame { code: ErrorCode::InternalError, message: e.to_string() })?;
    if let Some(log) = log.filter(|_| answer.is_ok())
        && let Err(e) = log.wait_durable(log.last_committed(), std::time::Duration::from_secs(10)).await
    {
        return Err(ErrorFrame {
            code: ErrorCode::PersistentFail,
            message: format!("the change may not be durable: {e}"),
        });
    }
    Ok(answer)
}

/// An answer of a kind the request never gets.
fn unexpected(r: &MasterResponse) -> Response {
    refused(ErrorFrame { code: ErrorCode::InternalError, message: format!("unexpected answer {r:?}") })
}

async fn list_tenants(State(s): State<AdminState>) -> Result<Response, Response> {
    match run(&s, MasterRequest::ListTenants).await? {
        // Through a struct, so each tenant's fields keep their declared order.
        MasterResponse::Tenants(tenants) => Ok(Json(TenantListing { tenants }).into_response()),
        other => Err(unexpected(&other)),
    }
}

/// `GET /tenants`.
#[derive(serde::Serialize)]
struct TenantListing {
    tenants: Vec<crescent_proto::TenantInfo>,
}

#[derive(Deserialize)]
struct QuotaBody {
    quota_bytes: u64,
}

/// `PUT /tenants/{tenant}`: the quota from `?quota=SIZE` or a JSON body `{"quota_bytes": N}` (one of them);
/// answers the tenant as `GET /tenants` lists it.
async fn set_tenant_quota(
    State(s): State<AdminState>,
    Path(tenant): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Response> {
    s.require_admin(&headers)?;
    let body = body.trim_ascii();
    let bytes = match (q.get("quota"), body.is_empty()) {
        (Some(size), true) => crescent_proto::human::parse_bytes(size).map_err(bad_request)?,
        (None, false) => {
            serde_json::from_slice::<QuotaBody>(body)
                .map_err(|e| bad_request(format!("the body must be {{\"quota_bytes\": N}}: {e}")))?
                .quota_bytes
        }
        (Some(_), false) => return Err(bad_request("give the quota once: ?quota=SIZE or a JSON body".into())),
        (None, true) => {
            return Err(bad_request("no quota: give ?quota=SIZE (e.g. 10GiB) or a body {\"quota_bytes\": N}".into()));
        }
    };
    run(&s, MasterRequest::SetTenantQuota { tenant: tenant.clone(), bytes }).await?;
    let id = crescent_proto::TenantId::new(&tenant).map_err(|e| bad_request(e.to_string()))?;
    match run(&s, MasterRequest::ListTenants).await? {
        MasterResponse::Tenants(all) => match all.into_iter().find(|t| t.tenant == id.as_str()) {
            Some(t) => Ok(Json(t).into_response()),
            // Removed again in between.
            None => Err(refused(ErrorFrame {
                code: ErrorCode::ObjectNotFound,
                message: format!("tenant {tenant:?} was removed meanwhile"),
            })),
        },
        other => Err(unexpected(&other)),
    }
}

/// `DELETE /tenants/{tenant}`: 204 once removed.
async fn remove_tenant(
    State(s): State<AdminState>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Response> {
    s.require_admin(&headers)?;
    run(&s, MasterRequest::RemoveTenant { tenant }).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn local_ssd(State(s): State<AdminState>) -> Result<Response, Response> {
    match run(&s, MasterRequest::LocalSsdStatus { client: None }).await? {
        MasterResponse::LocalSsd(all) => {
            let list: Vec<serde_json::Value> = all
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "client": r.client.to_string(),
                        "enable_offloading": r.enable_offloading,
                        "total_capacity": r.total_capacity,
                        "used": r.used,
                    })
                })
                .collect();
            Ok(Json(serde_json::json!({ "local_ssd": list })).into_response())
        }
        other => Err(unexpected(&other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, Timestamp};
    use crate::service::MasterConfig;
    use crescent_proto::{ClientId, MasterOp, ReplicateConfig};
    use std::time::Duration;

    #[tokio::test]
    async fn metrics_show_the_oplog_writer_only_when_there_is_one() {
        use crescent_ha::oplog::{OpLogBatchStorage, OrderedOpLogWriter, StorageConfig, WriterConfig};
        let svc = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1_000))).unwrap();
        let rpc = RpcMetrics::default();
        assert!(!render(Some(&svc), &rpc, None, None).contains("oplog"), "no oplog, no series");
        let kv = std::sync::Arc::new(crescent_ha::kv::MemoryKv::new());
        let storage = OpLogBatchStorage::new(kv, "t", StorageConfig::default()).unwrap();
        let prefix = storage.init_durable_prefix().await.unwrap();
        storage.claim_producer_view(1).await.unwrap();
        let log = std::sync::Arc::new(crate::ha::OpLog::new(OrderedOpLogWriter::new(
            storage,
            1,
            prefix,
            WriterConfig::default(),
        )));
        svc.attach_oplog(log.clone());
        svc.mount_segment(ClientId::random(), crescent_testkit::segment("seg", 1 << 20)).unwrap();
        let text = render(Some(&svc), &rpc, None, None);
        for line in [
            "crescent_master_oplog_state 0",
            "crescent_master_oplog_durable_seq 0",
            "crescent_master_oplog_next_seq 2",
            "crescent_master_oplog_waiting_entries 1",
            "crescent_master_oplog_admission_failures_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // Written: the writer's figures follow.
        log.start();
        let durable = crescent_testkit::eventually(std::time::Duration::from_secs(10), || async {
            log.status().durable.last_seq == 1
        })
        .await;
        assert!(durable, "the mount's entry became durable");
        let text = render(Some(&svc), &rpc, None, None);
        for line in [
            "crescent_master_oplog_durable_writes_total 1",
            "crescent_master_oplog_durable_entries_total 1",
            "crescent_master_oplog_write_entries_count 1",
            "crescent_master_oplog_write_entries_bucket{le=\"+Inf\"} 1",
            "crescent_master_oplog_committed_not_durable 0",
            "crescent_master_oplog_refused_total{cause=\"queue_full\"} 0",
            "crescent_master_oplog_callback_panics_total 0",
            "crescent_master_degraded_milliseconds 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(text.contains("crescent_master_oplog_commit_to_durable_microseconds{quantile=\"0.99\"}"), "{text}");
        assert_eq!(degraded(&log.status(), &log.metrics()), None, "accepting: healthy");
        log.stop().await;
        assert!(render(Some(&svc), &rpc, None, None).lines().any(|l| l == "crescent_master_oplog_state 2"), "stopped");
        let (reason, _) = degraded(&log.status(), &log.metrics()).expect("a stopped writer degrades the master");
        assert_eq!(reason, "oplog stopped: the writer is stopping");
    }

    #[test]
    fn metrics_export_every_operation_and_the_per_key_counters() {
        let svc = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1_000))).unwrap();
        svc.mount_segment(ClientId::random(), crescent_testkit::segment("seg", 1 << 20)).unwrap();
        let w = ClientId::random();
        svc.put_start(w, "", "a", 100, &ReplicateConfig::default()).unwrap();
        svc.put_end(w, "", "a", None).unwrap();
        let _ = svc.batch_exist_key("", &["a", "b"]);
        assert!(svc.get_replica_list("", "missing").is_err());
        let rpc = RpcMetrics::default();
        rpc.record(MasterOp::PutStart, false);
        rpc.record(MasterOp::GetReplicaList, true);
        let text = render(Some(&svc), &rpc, None, None);
        for line in [
            r#"crescent_master_requests_total{op="put_start"} 1"#,
            r#"crescent_master_failures_total{op="get_replica_list"} 1"#,
            r#"crescent_master_key_operations_total{op="exist_key"} 2"#,
            r#"crescent_master_key_operations_total{op="put_end"} 1"#,
            r#"crescent_master_key_failures_total{op="get_replica_list"} 1"#,
            "crescent_master_keys 1",
            "crescent_master_nof_unmounted_segments_total 0",
            "crescent_master_key_listings_running 0",
            "crescent_master_key_listings_waiting 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        for op in MasterOp::ALL {
            assert!(text.contains(&format!("op=\"{}\"", op.name())), "{} not exported", op.name());
        }
        for class in ["route", "object", "group"] {
            for name in ["lock_contended_total", "lock_wait_nanoseconds_total"] {
                let series = format!("crescent_master_{name}{{lock=\"{class}\"}} ");
                assert!(text.lines().any(|l| l.starts_with(&series)), "missing {series:?} in\n{text}");
            }
        }
    }

    #[test]
    fn nof_segments_the_heartbeat_unmounts_are_counted() {
        let config = MasterConfig { nof_heartbeat_failures: 1, ..MasterConfig::default() };
        let clock = ManualClock::new(Timestamp(1_000));
        let svc = MasterService::new(config, clock.clone()).unwrap();
        let mut nof = crescent_testkit::segment("nof", 1 << 20);
        nof.kind = SegmentKind::Nof;
        svc.mount_segment(ClientId::random(), nof.clone()).unwrap();
        let mut due = svc.due_nof_probes();
        for _ in 0..100 {
            if !due.is_empty() {
                break;
            }
            clock.advance(std::time::Duration::from_millis(100));
            due = svc.due_nof_probes();
        }
        assert_eq!(due.len(), 1, "probed within an interval");
        assert!(svc.record_nof_probe(nof.id, false));
        let text = render(Some(&svc), &RpcMetrics::default(), None, None);
        let line = "crescent_master_nof_unmounted_segments_total 1";
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }

    /// One HTTP/1.1 GET on a fresh connection: the status and the body (as sent: possibly chunked).
    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        (head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0), body.to_owned())
    }

    /// The admin server and this test share one thread (a current-thread runtime): if a listing, or its wait
    /// for its turn, ran on a request worker, nothing else could be answered until it ended. Waiting listings
    /// take no thread at all: they wait for the listing thread asleep, in order.
    #[tokio::test]
    async fn a_listing_waiting_its_turn_holds_no_request_worker() {
        let svc = Arc::new(MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1_000))).unwrap());
        svc.mount_segment(ClientId::random(), crescent_testkit::segment("seg", 1 << 20)).unwrap();
        let w = ClientId::random();
        for k in ["a", "b", "b&c=d é", "c"] {
            svc.put_start(w, "", k, 1, &ReplicateConfig::default()).unwrap();
            svc.put_end(w, "", k, None).unwrap();
        }
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let admin = AdminServer::start(
            any,
            Target::Fixed(svc.clone()),
            Arc::new(RpcMetrics::default()),
            SnapshotSlot::default(),
            None,
            None,
        )
        .await
        .unwrap();
        let addr = admin.local_addr();
        let _turn = super::super::lister::TEST_TURNS.lock().await;
        // Another listing holds the listing thread.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let blocker = tokio::spawn(super::super::lister::run(move || held.recv().is_ok()));
        let load = super::super::lister::load;
        assert!(crescent_testkit::eventually(Duration::from_secs(10), || async { load() == (1, 0) }).await);
        let waiting: Vec<_> = (0..4).map(|_| tokio::spawn(get(addr, "/keys?limit=2"))).collect();
        assert!(crescent_testkit::eventually(Duration::from_secs(10), || async { load() == (1, 4) }).await);
        let health = tokio::time::timeout(Duration::from_secs(5), get(addr, "/health")).await;
        assert_eq!(health.map(|(status, _)| status).ok(), Some(200), "answered while the listings wait");
        release.send(()).unwrap();
        assert_eq!(blocker.await.unwrap(), Ok(true));
        for w in waiting {
            let (status, body) = w.await.unwrap();
            assert_eq!(status, 200, "{body}");
            assert!(body.contains(r#"{"keys":["a","b"],"next_cursor":"b"}"#), "{body}");
        }
        // The cursor is the last key, URL-encoded.
        let (status, body) = get(addr, "/keys?cursor=b&limit=1").await;
        assert!(status == 200 && body.contains(r#"{"keys":["b&c=d é"],"next_cursor":"b&c=d é"}"#), "{body}");
        let (status, body) = get(addr, "/keys?cursor=b%26c%3Dd%20%C3%A9").await;
        assert!(status == 200 && body.contains(r#"{"keys":["c"],"next_cursor":null}"#), "{body}");
        let (status, body) = get(addr, "/keys?limit=0").await;
        assert!(status == 400 && body.contains("INVALID_PARAMS"), "{body}");
        assert_eq!(load(), (0, 0));
    }
}
