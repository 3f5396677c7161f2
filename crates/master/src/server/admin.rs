//! Admin HTTP (axum): `/metrics` (Prometheus text), `/health`, `/segments`, `/keys?tenant=&prefix=&limit=`.

use super::rpc::RpcMetrics;
use crate::metadata::{LockClass, lock_stats};
use crate::service::MasterService;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use crescent_proto::SegmentKind;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Clone)]
struct AdminState {
    svc: Arc<MasterService>,
    rpc: Arc<RpcMetrics>,
}

/// The admin routes.
pub fn admin_router(svc: Arc<MasterService>, rpc: Arc<RpcMetrics>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/segments", get(segments))
        .route("/keys", get(keys))
        .with_state(AdminState { svc, rpc })
}

/// How long a stopping admin server lets requests in progress finish.
const ADMIN_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// A running admin server; dropping it stops it at once, [`AdminServer::shutdown`] lets requests finish.
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl AdminServer {
    /// Binds and serves the admin routes on the current runtime.
    pub async fn start(addr: SocketAddr, svc: Arc<MasterService>, rpc: Arc<RpcMetrics>) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let app = admin_router(svc, rpc);
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stopped).await {
                tracing::error!(error = %e, "admin server stopped");
            }
        });
        Ok(Self { addr, stop, task })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and lets requests in progress finish for up to a second (a scraper that stalls
    /// mid-request, or reads a large answer slowly, cannot hold the process up), then ends the rest.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if tokio::time::timeout(ADMIN_DRAIN, &mut self.task).await.is_err() {
            tracing::debug!("admin requests still in progress at shutdown were cut off");
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.task.abort();
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

/// Renders the Prometheus text exposition of the service and server counters.
pub fn render_metrics(svc: &MasterService, rpc: &RpcMetrics) -> String {
    let mut r = Registry::with_prefix("crescent_master");
    per_op(
        &mut r,
        ["requests", "failures"],
        ["RPC requests per operation", "RPC requests that failed, per operation"],
        rpc.snapshot(),
    );
    let m = svc.metrics();
    let per_key =
        m.per_key().map(|(op, c)| (op, c.requests.load(Ordering::Relaxed), c.failures.load(Ordering::Relaxed)));
    per_op(
        &mut r,
        ["key_operations", "key_failures"],
        ["Keys handled per operation (a batch counts each key)", "Keys that failed, per operation"],
        per_key,
    );
    counter(&mut r, "malformed_frames", "Frames refused as malformed", rpc.malformed_frames.load(Ordering::Relaxed));
    counter(&mut r, "connections", "RPC connections accepted", rpc.connections.load(Ordering::Relaxed));
    counter(&mut r, "evicted_objects", "Objects evicted", m.evicted_objects.load(Ordering::Relaxed));
    counter(&mut r, "evicted_bytes", "Replica bytes evicted", m.evicted_bytes.load(Ordering::Relaxed));
    counter(&mut r, "eviction_runs", "Eviction rounds", m.eviction_runs.load(Ordering::Relaxed));
    counter(
        &mut r,
        "partial_placements",
        "Writes placed on fewer replicas than asked",
        m.partial_placements.load(Ordering::Relaxed),
    );
    counter(&mut r, "tenant_quota_rejects", "Writes refused for quota", m.tenant_quota_rejects.load(Ordering::Relaxed));
    counter(
        &mut r,
        "expired_clients",
        "Clients expired by the liveness monitor",
        m.expired_clients.load(Ordering::Relaxed),
    );
    counter(&mut r, "background_ticks", "Background loop iterations", m.background_ticks.load(Ordering::Relaxed));
    gauge(&mut r, "keys", "Objects stored", svc.key_count(None) as u64);
    gauge(&mut r, "active_clients", "Clients tracked by the liveness monitor", svc.active_clients() as u64);
    let usage = svc.pool().usage(SegmentKind::Memory);
    gauge(&mut r, "memory_capacity_bytes", "Mounted memory capacity", usage.capacity);
    gauge(&mut r, "memory_used_bytes", "Memory used by replicas", usage.used);
    let cap = Family::<Labels, Gauge<u64, AtomicU64>>::default();
    let used = Family::<Labels, Gauge<u64, AtomicU64>>::default();
    for s in svc.pool().segments() {
        let l = vec![("segment".to_string(), s.spec.name.clone()), ("id".to_string(), s.spec.id.to_string())];
        cap.get_or_create(&l).set(s.usage.capacity);
        used.get_or_create(&l).set(s.usage.used);
    }
    r.register("segment_capacity_bytes", "Capacity per segment", cap);
    r.register("segment_used_bytes", "Used bytes per segment", used);
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
    let mut out = String::new();
    if encode(&mut out, &r).is_err() {
        out.clear();
    }
    out
}

async fn metrics(State(s): State<AdminState>) -> Response {
    let body = render_metrics(&s.svc, &s.rpc);
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body).into_response()
}

async fn health(State(s): State<AdminState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "status": "ok",
        "role": "master",
        "segments": s.svc.pool().len(),
        "keys": s.svc.key_count(None),
        "active_clients": s.svc.active_clients(),
    }))
}

async fn segments(State(s): State<AdminState>) -> Json<serde_json::Value> {
    let list: Vec<serde_json::Value> = s
        .svc
        .pool()
        .segments()
        .into_iter()
        .map(|x| {
            serde_json::json!({
                "segment_id": x.spec.id.to_string(),
                "name": x.spec.name,
                "client_id": x.client.to_string(),
                "kind": format!("{:?}", x.spec.kind),
                "status": format!("{:?}", x.status),
                "endpoint": x.spec.endpoint,
                "host": x.spec.host_id,
                "capacity_bytes": x.usage.capacity,
                "used_bytes": x.usage.used,
            })
        })
        .collect();
    Json(serde_json::json!({ "segments": list }))
}

#[derive(Deserialize)]
struct KeysQuery {
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    prefix: String,
    limit: Option<usize>,
}

async fn keys(State(s): State<AdminState>, Query(q): Query<KeysQuery>) -> Response {
    let limit = q.limit.unwrap_or(10_000).min(1_000_000);
    match s.svc.list_keys(&q.tenant, &q.prefix, limit) {
        Ok(keys) => Json(serde_json::json!({ "keys": keys })).into_response(),
        Err(code) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({ "success": false, "error_code": code.as_i32(), "error": code.name() })),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, Timestamp};
    use crate::service::MasterConfig;
    use crescent_proto::{ClientId, MasterOp, ReplicateConfig};

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
        let text = render_metrics(&svc, &rpc);
        for line in [
            r#"crescent_master_requests_total{op="put_start"} 1"#,
            r#"crescent_master_failures_total{op="get_replica_list"} 1"#,
            r#"crescent_master_key_operations_total{op="exist_key"} 2"#,
            r#"crescent_master_key_operations_total{op="put_end"} 1"#,
            r#"crescent_master_key_failures_total{op="get_replica_list"} 1"#,
            "crescent_master_keys 1",
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
}
