//! The original Mooncake master's admin routes that act or look at one segment, beside the reads of
//! [`super::admin_compat`], so operator tooling written for the original (a drain before scaling a node down)
//! works unchanged: `POST /api/v1/drain_jobs` (body `{"segments": [...], "target_segments": [...],
//! "max_concurrency": 4}`), `GET /api/v1/drain_jobs/query?job_id=`, `POST /api/v1/drain_jobs/cancel?job_id=`,
//! `GET /api/v1/segments/status?segment=`, `GET /query_segment?segment=`, `POST
//! /api/v1/remove_all?force=true&tenant_id=` and `GET|PUT|DELETE /api/v1/tenant_quotas[?tenant_id=]`.
//!
//! Status codes, error codes and bodies are the original's, recorded from `mooncake_master` 0.3.13.post1 (two
//! `MooncakeDistributedStore`s of 64 MiB, 20 keys of 10 000 B, 2026-12-07); `(status) | body`:
//!
//! ```text
//! GET  /api/v1/segments/status?segment=S   200 | {"success":true,"segment":"S","status":1,"status_name":"OK","error_code":0,"error_message":""}
//! GET  /api/v1/segments/status?segment=nope 404 | {"success":false,"error_code":-101,"error_message":"SEGMENT_NOT_FOUND"}
//! GET  /api/v1/segments/status             400 | {"success":false,"error_code":-600,"error_message":"Missing segment query parameter"}
//! POST /api/v1/drain_jobs {}                400 | {"success":false,"error_code":-600,"error_message":"INVALID_PARAMS"}
//! POST /api/v1/drain_jobs not json          400 | {"success":false,"error_code":-600,"error_message":"Invalid JSON body: ..."}
//! POST /api/v1/drain_jobs {"segments":["nope"]} 404 | {"success":false,"error_code":-101,"error_message":"SEGMENT_NOT_FOUND"}
//! POST /api/v1/drain_jobs {..., "max_concurrency":0} or a target among the segments: 400, INVALID_PARAMS
//! POST /api/v1/drain_jobs {"segments":["S"]} 200 | {"success":true,"job_id":"308246854071756671-744072196531123384","status":"CREATED","error_code":0,"error_message":""}
//!   the same again                          409 | {"success":false,"error_code":-1010,"error_message":"UNAVAILABLE_IN_CURRENT_STATUS"}
//! GET  /api/v1/drain_jobs/query?job_id=J    200 | {"success":true,"job_id":"J","type":0,"type_name":"DRAIN","status":3,"status_name":"SUCCEEDED",
//!        "created_at_ms_epoch":…,"last_updated_at_ms_epoch":…,"segments":["S"],"succeeded_units":8,"failed_units":0,
//!        "blocked_units":0,"active_units":0,"migrated_bytes":80000,"message":"Drain job finished successfully","error_code":0,"error_message":""}
//! GET  /api/v1/drain_jobs/query?job_id=<unknown, either id form> 404, JOB_NOT_FOUND (-1402)
//! GET  /api/v1/drain_jobs/query[?job_id=bad] 400 | {"success":false,"error_code":-600,"error_message":"Missing or invalid job_id"}
//! POST /api/v1/drain_jobs/cancel?job_id=J (J ended) 409, UNAVAILABLE_IN_CURRENT_STATUS; a running one: 200
//!        {"success":true,"job_id":"J","status":"CANCELED","error_code":0,"error_message":""}
//! POST /api/v1/remove_all                   200 | {"success":true,"removed_count":20}
//! --- with --enable_multi_tenants (without: every tenant_quotas route is 409, UNAVAILABLE_IN_CURRENT_MODE)
//! GET    /api/v1/tenant_quotas              200 | {"success":true,"data":[]}
//! GET    /api/v1/tenant_quotas?tenant_id=t1 404 | {"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}
//! PUT    /api/v1/tenant_quotas?tenant_id=t1 {"requested_quota_bytes":1048576}
//!                                           200 | {"success":true,"data":{"tenant_id":"t1","requested_quota_bytes":1048576,
//!        "effective_quota_bytes":0,"charged_bytes":0,"admission_closed":false,"over_quota":false,"has_explicit_policy":true}}
//! PUT    ... {"requested_quota_bytes":0}    400 | {..."error_code":-600,"error_message":"Tenant quota must be in [1, 2^63 - 1] bytes"}
//! PUT    ... bad                            400 | {..."error_code":-600,"error_message":"Invalid JSON body: ..."}
//! PUT or DELETE without tenant_id           400 | {..."error_code":-600,"error_message":"Missing or invalid tenant_id"}
//! GET    /api/v1/tenant_quotas              200 | {"success":true,"data":[{...},{...}]} (by tenant)
//! DELETE /api/v1/tenant_quotas?tenant_id=t1 200 | {"success":true,"data":null}; again: 404, OBJECT_NOT_FOUND
//! ```
//!
//! Where Crescent differs, on purpose: a tenant name Crescent refuses (the original took `bad name`) is a 400; a route
//! that changes state needs the admin credential as a bearer token when the master has a keyring (401, as Crescent's
//! own `/tenants/{t}`), and is answered once its change is durable in the log (a failover keeps what it was told); the
//! job's `message` is Crescent's words. Job ids are printed in the original's `HIGH-LOW` form and read in that form or
//! as a UUID. A standby answers 503 as on the original's other routes.

use super::admin::AdminState;
use super::admin_compat::{Refused, error, json, original_id, param, params, service};
use crate::service::MasterService;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use crescent_proto::{DrainInfo, ErrorCode, SegmentKind, TaskId};
use serde::{Deserialize, Serialize};

/// The routes, merged into the admin router.
pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .route("/api/v1/drain_jobs", post(create_drain_job))
        .route("/api/v1/drain_jobs/query", get(query_drain_job))
        .route("/api/v1/drain_jobs/cancel", post(cancel_drain_job))
        .route("/api/v1/segments/status", get(segment_status))
        .route("/query_segment", get(query_segment))
        .route("/api/v1/remove_all", post(remove_all))
        .route("/api/v1/tenant_quotas", get(tenant_quotas).put(set_tenant_quota).delete(delete_tenant_quota))
}

/// The original's answer to a service error: its HTTP status for the code, the code's name as the message.
fn refusal(code: ErrorCode) -> Refused {
    let status = match code {
        ErrorCode::InvalidParams => StatusCode::BAD_REQUEST,
        ErrorCode::JobNotFound
        | ErrorCode::SegmentNotFound
        | ErrorCode::ObjectNotFound
        | ErrorCode::TenantNotRegistered => StatusCode::NOT_FOUND,
        ErrorCode::UnavailableInCurrentMode | ErrorCode::UnavailableInCurrentStatus | ErrorCode::TenantNotEmpty => {
            StatusCode::CONFLICT
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, code, code.name().to_owned())
}

/// Runs a change off the async workers (a bulk removal takes a while) and answers once it is durable.
async fn apply<T: Send + 'static>(
    s: &AdminState,
    headers: &HeaderMap,
    change: impl FnOnce(&MasterService) -> Result<T, ErrorCode> + Send + 'static,
) -> Result<T, Refused> {
    s.require_admin(headers).map_err(|u| Refused::from(Response::from(u)))?;
    let answer = super::admin::durably(service(s)?, change)
        .await
        .map_err(|f| error(StatusCode::INTERNAL_SERVER_ERROR, f.code, f.message))?;
    answer.map_err(refusal)
}

/// A job id in the original's `HIGH-LOW` form or as a UUID; anything else (or none) is the original's 400.
fn job_id(q: Result<Query<super::admin_compat::Params>, QueryRejection>) -> Result<TaskId, Refused> {
    let q = params(q)?;
    param(&q, "job_id")
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, "Missing or invalid job_id".into()))
}

/// The original's `CreateDrainJobRequest`.
#[derive(Deserialize)]
struct CreateDrainJob {
    #[serde(default)]
    segments: Vec<String>,
    #[serde(default)]
    target_segments: Vec<String>,
    #[serde(default = "default_concurrency")]
    max_concurrency: u32,
}

/// The original's default `max_concurrency`.
fn default_concurrency() -> u32 {
    4
}

/// The original's answer to a created or cancelled job.
#[derive(Serialize)]
struct JobAnswer {
    success: bool,
    job_id: String,
    status: &'static str,
    error_code: i32,
    error_message: String,
}

impl JobAnswer {
    fn new(id: TaskId, status: &'static str) -> Self {
        Self {
            success: true,
            job_id: original_id(id.as_u64_pair()),
            status,
            error_code: 0,
            error_message: String::new(),
        }
    }
}

/// `POST /api/v1/drain_jobs`: starts draining the named segments (refused while a job drains them).
async fn create_drain_job(State(s): State<AdminState>, headers: HeaderMap, body: Bytes) -> Result<Response, Refused> {
    let req: CreateDrainJob = serde_json::from_slice(&body)
        .map_err(|e| error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, format!("Invalid JSON body: {e}")))?;
    let id = apply(&s, &headers, move |svc| {
        svc.create_drain_exclusive(&req.segments, &req.target_segments, req.max_concurrency)
    })
    .await?;
    Ok(json(StatusCode::OK, &JobAnswer::new(id, "CREATED")))
}

/// The original's `HttpQueryDrainJobResponse`.
#[derive(Serialize)]
struct JobStatusAnswer {
    success: bool,
    job_id: String,
    /// The job type (0: DRAIN, the only one).
    #[serde(rename = "type")]
    kind: i32,
    type_name: &'static str,
    status: i32,
    status_name: &'static str,
    created_at_ms_epoch: u64,
    last_updated_at_ms_epoch: u64,
    segments: Vec<String>,
    succeeded_units: u64,
    failed_units: u64,
    blocked_units: u64,
    active_units: u64,
    migrated_bytes: u64,
    message: String,
    error_code: i32,
    error_message: String,
}

impl From<DrainInfo> for JobStatusAnswer {
    fn from(d: DrainInfo) -> Self {
        Self {
            success: true,
            job_id: original_id(d.id.as_u64_pair()),
            kind: 0,
            type_name: "DRAIN",
            status: d.status as i32,
            status_name: d.status.name(),
            created_at_ms_epoch: d.created_at_ms,
            last_updated_at_ms_epoch: d.updated_at_ms,
            segments: d.segments,
            succeeded_units: d.succeeded,
            failed_units: d.failed,
            blocked_units: d.blocked,
            active_units: d.active,
            migrated_bytes: d.migrated_bytes,
            message: d.message,
            error_code: 0,
            error_message: String::new(),
        }
    }
}

/// `GET /api/v1/drain_jobs/query?job_id=`: where a drain job stands.
async fn query_drain_job(
    State(s): State<AdminState>,
    q: Result<Query<super::admin_compat::Params>, QueryRejection>,
) -> Result<Response, Refused> {
    let id = job_id(q)?;
    let info = service(&s)?.query_drain(id).map_err(refusal)?;
    Ok(json(StatusCode::OK, &JobStatusAnswer::from(info)))
}

/// `POST /api/v1/drain_jobs/cancel?job_id=`: stops a running drain job; its segments take placements again.
async fn cancel_drain_job(
    State(s): State<AdminState>,
    headers: HeaderMap,
    q: Result<Query<super::admin_compat::Params>, QueryRejection>,
) -> Result<Response, Refused> {
    let id = job_id(q)?;
    apply(&s, &headers, move |svc| svc.cancel_running_drain(id)).await?;
    Ok(json(StatusCode::OK, &JobAnswer::new(id, "CANCELED")))
}

/// The memory segments carrying `name` (the original's segments are memory ones), or the original's answers
/// for a missing name (400) and an unknown one (404).
fn named(
    svc: &MasterService,
    q: Result<Query<super::admin_compat::Params>, QueryRejection>,
) -> Result<(String, Vec<crate::segment_pool::SegmentInfo>), Refused> {
    let q = params(q)?;
    let name = param(&q, "segment").unwrap_or("").to_owned();
    if name.is_empty() {
        return Err(error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, "Missing segment query parameter".into()));
    }
    let mut found: Vec<_> = svc
        .pool()
        .segments_named(&name)
        .into_iter()
        .filter_map(|id| svc.pool().segment(id))
        .filter(|s| matches!(s.spec.kind, SegmentKind::Memory | SegmentKind::Cxl))
        .collect();
    if found.is_empty() {
        return Err(refusal(ErrorCode::SegmentNotFound));
    }
    found.sort_by_key(|s| s.spec.id);
    Ok((name, found))
}

/// The original's `HttpSegmentStatusResponse`.
#[derive(Serialize)]
struct SegmentStatusAnswer {
    success: bool,
    segment: String,
    status: i32,
    status_name: &'static str,
    error_code: i32,
    error_message: String,
}

/// `GET /api/v1/segments/status?segment=`: a segment's status (of several under one name, the first by id).
async fn segment_status(
    State(s): State<AdminState>,
    q: Result<Query<super::admin_compat::Params>, QueryRejection>,
) -> Result<Response, Refused> {
    let svc = service(&s)?;
    let (segment, found) = named(&svc, q)?;
    let status = found[0].status;
    let answer = SegmentStatusAnswer {
        success: true,
        segment,
        status: status as i32,
        status_name: super::admin_compat::status_name(status),
        error_code: 0,
        error_message: String::new(),
    };
    Ok(json(StatusCode::OK, &answer))
}

/// `GET /query_segment?segment=`: the original's text, `NAME\nUsed(bytes): U\nCapacity(bytes) : C\n`, over
/// every segment of that name; 500 with its text when there is none.
async fn query_segment(
    State(s): State<AdminState>,
    q: Result<Query<super::admin_compat::Params>, QueryRejection>,
) -> Result<Response, Refused> {
    let svc = service(&s)?;
    let text = |status, body: String| (status, [(header::CONTENT_TYPE, super::admin_compat::TEXT)], body);
    let Ok((name, found)) = named(&svc, q) else {
        return Ok(text(StatusCode::INTERNAL_SERVER_ERROR, "Failed to query segment".into()).into_response());
    };
    let (used, capacity) = found.iter().fold((0u64, 0u64), |(u, c), s| (u + s.usage.used, c + s.usage.capacity));
    Ok(text(StatusCode::OK, format!("{name}\nUsed(bytes): {used}\nCapacity(bytes) : {capacity}\n")).into_response())
}

/// `POST /api/v1/remove_all?force=true|1&tenant_id=`: removes every object (of one tenant, or of all); leased
/// or pinned ones stay unless forced.
async fn remove_all(
    State(s): State<AdminState>,
    headers: HeaderMap,
    q: Result<Query<super::admin_compat::Params>, QueryRejection>,
) -> Result<Response, Refused> {
    #[derive(Serialize)]
    struct Removed {
        success: bool,
        removed_count: u64,
    }
    let q = params(q)?;
    let force = matches!(param(&q, "force"), Some("true" | "1"));
    let tenant = param(&q, "tenant_id").filter(|t| !t.is_empty()).map(str::to_owned);
    let removed = apply(&s, &headers, move |svc| svc.remove_all(tenant.as_deref(), force)).await?;
    Ok(json(StatusCode::OK, &Removed { success: true, removed_count: removed }))
}

/// The original's tenant quota snapshot (`tenant_quotas`' `data`).
#[derive(Serialize)]
struct TenantQuota {
    tenant_id: String,
    requested_quota_bytes: u64,
    effective_quota_bytes: u64,
    charged_bytes: u64,
    admission_closed: bool,
    over_quota: bool,
    has_explicit_policy: bool,
}

impl From<crate::service::TenantQuotaSnapshot> for TenantQuota {
    fn from(t: crate::service::TenantQuotaSnapshot) -> Self {
        Self {
            tenant_id: t.tenant_id,
            requested_quota_bytes: t.requested_quota_bytes,
            effective_quota_bytes: t.effective_quota_bytes,
            charged_bytes: t.charged_bytes,
            admission_closed: t.admission_closed,
            over_quota: t.over_quota,
            has_explicit_policy: t.has_explicit_policy,
        }
    }
}

/// `{"success":true,"data":...}`.
fn data<T: Serialize>(data: T) -> Response {
    #[derive(Serialize)]
    struct Data<T> {
        success: bool,
        data: T,
    }
    json(StatusCode::OK, &Data { success: true, data })
}

/// One tenant's quota snapshot, `OBJECT_NOT_FOUND` without a policy or objects (as the original).
fn quota_of(svc: &MasterService, tenant: &str) -> Result<TenantQuota, ErrorCode> {
    svc.tenant_quota(tenant).map(TenantQuota::from).ok_or(ErrorCode::ObjectNotFound)
}

/// The `tenant_id` a change names, or the original's 400.
fn tenant_named(q: Result<Query<super::admin_compat::Params>, QueryRejection>) -> Result<String, Refused> {
    let q = params(q)?;
    match param(&q, "tenant_id") {
        Some(t) if !t.is_empty() => Ok(t.to_owned()),
        _ => Err(error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, "Missing or invalid tenant_id".into())),
    }
}

/// `GET /api/v1/tenant_quotas[?tenant_id=]`: every tenant's quota (by tenant), or one.
async fn tenant_quotas(
    State(s): State<AdminState>,
    q: Result<Query<super::admin_compat::Params>, QueryRejection>,
) -> Result<Response, Refused> {
    let q = params(q)?;
    let svc = service(&s)?;
    let mut all = svc.tenant_quotas().ok_or_else(|| refusal(ErrorCode::UnavailableInCurrentMode))?;
    match param(&q, "tenant_id").filter(|t| !t.is_empty()) {
        Some(tenant) => Ok(data(quota_of(&svc, tenant).map_err(refusal)?)),
        None => {
            all.sort_by(|a, b| a.tenant_id.cmp(&b.tenant_id));
            Ok(data(all.into_iter().map(TenantQuota::from).collect::<Vec<_>>()))
        }
    }
}

/// `PUT /api/v1/tenant_quotas?tenant_id=` with `{"requested_quota_bytes": N}` (1 ..= 2^63 − 1): sets a
/// tenant's requested quota; answers its snapshot after.
async fn set_tenant_quota(
    State(s): State<AdminState>,
    headers: HeaderMap,
    q: Result<Query<super::admin_compat::Params>, QueryRejection>,
    body: Bytes,
) -> Result<Response, Refused> {
    #[derive(Deserialize)]
    struct Quota {
        requested_quota_bytes: u64,
    }
    let tenant = tenant_named(q)?;
    let quota: Quota = serde_json::from_slice(&body)
        .map_err(|e| error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, format!("Invalid JSON body: {e}")))?;
    if !(1..=i64::MAX as u64).contains(&quota.requested_quota_bytes) {
        let message = "Tenant quota must be in [1, 2^63 - 1] bytes".to_owned();
        return Err(error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, message));
    }
    let bytes = quota.requested_quota_bytes;
    let after = apply(&s, &headers, move |svc| {
        svc.upsert_tenant_quota(&tenant, bytes)?;
        quota_of(svc, &tenant)
    })
    .await?;
    Ok(data(after))
}

/// `DELETE /api/v1/tenant_quotas?tenant_id=`: drops a tenant's policy (refused while it holds objects).
async fn delete_tenant_quota(
    State(s): State<AdminState>,
    headers: HeaderMap,
    q: Result<Query<super::admin_compat::Params>, QueryRejection>,
) -> Result<Response, Refused> {
    let tenant = tenant_named(q)?;
    apply(&s, &headers, move |svc| svc.delete_tenant_quota(&tenant)).await?;
    Ok(data(()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::clock::{ManualClock, Timestamp};
    use crate::service::MasterConfig;
    use crescent_net::auth::Keyring;
    use crescent_proto::{ClientId, Principal, ReplicateConfig};
    use serde_json::Value;
    use std::sync::Arc;

    /// One HTTP/1.0 request on a fresh connection: the status and the body.
    async fn call(
        addr: std::net::SocketAddr,
        method: &str,
        path: &str,
        bearer: Option<&str>,
        body: &str,
    ) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let auth = bearer.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let head = format!("{method} {path} HTTP/1.0\r\nHost: x\r\n{auth}Content-Length: {}\r\n\r\n", body.len());
        s.write_all(format!("{head}{body}").as_bytes()).await.unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        (head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0), body.to_owned())
    }

    async fn admin(svc: Arc<MasterService>, keyring: Option<Arc<Keyring>>) -> super::super::AdminServer {
        super::super::AdminServer::start(
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            super::super::Target::Fixed(svc),
            Arc::new(super::super::RpcMetrics::default()),
            super::super::SnapshotSlot::default(),
            keyring,
            None,
        )
        .await
        .unwrap()
    }

    /// A master with segments `a` and `b` (one node each) and ten objects on `a`.
    fn master() -> Arc<MasterService> {
        let svc = Arc::new(MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1_000))).unwrap());
        for name in ["a", "b"] {
            svc.mount_segment(ClientId::random(), crescent_testkit::segment_on(name, 16 << 20, name)).unwrap();
        }
        let writer = ClientId::random();
        let on_a = ReplicateConfig { preferred_segments: vec!["a".into()], ..ReplicateConfig::default() };
        for i in 0..10 {
            svc.put_start(writer, "", &format!("k{i}"), 10_000, &on_a).unwrap();
            svc.put_end(writer, "", &format!("k{i}"), None).unwrap();
        }
        svc
    }

    fn parsed(answer: &(u16, String)) -> Value {
        serde_json::from_str(&answer.1).unwrap_or_else(|e| panic!("{answer:?}: {e}"))
    }

    /// A refusal: the status, and the original's body with this code and message.
    fn refused(answer: (u16, String), status: u16, code: ErrorCode, message: &str) {
        assert_eq!(answer.0, status, "{answer:?}");
        let v = parsed(&answer);
        assert_eq!((v["success"].as_bool(), v["error_code"].as_i64()), (Some(false), Some(code as i64)), "{answer:?}");
        assert!(v["error_message"].as_str().unwrap().starts_with(message), "{answer:?}");
    }

    /// The drain routes answer as the original's do: a job created, refused while it runs, queried, cancelled
    /// (then refused, as ended), its segment's status along the way, and every refusal's code.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drain_jobs_answer_as_the_originals_routes() {
        let svc = master();
        let server = admin(svc.clone(), None).await;
        let addr = server.local_addr();
        let status_of = |v: Value| (v["status"].as_i64().unwrap(), v["status_name"].as_str().unwrap().to_owned());

        let seg = parsed(&call(addr, "GET", "/api/v1/segments/status?segment=a", None, "").await);
        assert_eq!((seg["success"].as_bool(), seg["segment"].as_str()), (Some(true), Some("a")));
        assert_eq!(status_of(seg), (1, "OK".into()));
        let bad = ErrorCode::InvalidParams;
        refused(
            call(addr, "GET", "/api/v1/segments/status?segment=nope", None, "").await,
            404,
            ErrorCode::SegmentNotFound,
            "SEGMENT_NOT_FOUND",
        );
        refused(
            call(addr, "GET", "/api/v1/segments/status", None, "").await,
            400,
            bad,
            "Missing segment query parameter",
        );
        refused(call(addr, "POST", "/api/v1/drain_jobs", None, "{}").await, 400, bad, "INVALID_PARAMS");
        refused(call(addr, "POST", "/api/v1/drain_jobs", None, "not json").await, 400, bad, "Invalid JSON body: ");
        refused(
            call(addr, "POST", "/api/v1/drain_jobs", None, r#"{"segments":["nope"]}"#).await,
            404,
            ErrorCode::SegmentNotFound,
            "SEGMENT_NOT_FOUND",
        );
        refused(
            call(addr, "POST", "/api/v1/drain_jobs", None, r#"{"segments":["a"],"max_concurrency":0}"#).await,
            400,
            bad,
            "INVALID_PARAMS",
        );
        refused(
            call(addr, "POST", "/api/v1/drain_jobs", None, r#"{"segments":["a"],"target_segments":["a"]}"#).await,
            400,
            bad,
            "INVALID_PARAMS",
        );

        let created = parsed(&call(addr, "POST", "/api/v1/drain_jobs", None, r#"{"segments":["a"]}"#).await);
        assert_eq!(
            (created["success"].as_bool(), created["status"].as_str()),
            (Some(true), Some("CREATED")),
            "{created}"
        );
        let job = created["job_id"].as_str().unwrap().to_owned();
        let (high, low) = job.split_once('-').unwrap();
        let id = TaskId::from_u64_pair(high.parse().unwrap(), low.parse().unwrap());
        assert_eq!(svc.query_drain(id).unwrap().segments, ["a"], "the id is the HIGH-LOW form of the job's");
        refused(
            call(addr, "POST", "/api/v1/drain_jobs", None, r#"{"segments":["a"]}"#).await,
            409,
            ErrorCode::UnavailableInCurrentStatus,
            "UNAVAILABLE_IN_CURRENT_STATUS",
        );
        let seg = parsed(&call(addr, "GET", "/api/v1/segments/status?segment=a", None, "").await);
        assert_eq!(status_of(seg), (2, "DRAINING".into()));

        let fields = [
            "success",
            "job_id",
            "type",
            "type_name",
            "status",
            "status_name",
            "created_at_ms_epoch",
            "last_updated_at_ms_epoch",
            "segments",
            "succeeded_units",
            "failed_units",
            "blocked_units",
            "active_units",
            "migrated_bytes",
            "message",
            "error_code",
            "error_message",
        ];
        for form in [job.clone(), id.to_string()] {
            let answer = call(addr, "GET", &format!("/api/v1/drain_jobs/query?job_id={form}"), None, "").await;
            let at: Vec<usize> = fields.iter().map(|f| answer.1.find(&format!("\"{f}\":")).unwrap()).collect();
            assert!(at.is_sorted(), "the original's fields in its order: {}", answer.1);
            let q = parsed(&answer);
            assert_eq!(q.as_object().unwrap().len(), fields.len(), "{}", answer.1);
            assert_eq!(
                (q["job_id"].as_str(), q["type_name"].as_str(), q["segments"][0].as_str()),
                (Some(&job[..]), Some("DRAIN"), Some("a"))
            );
            assert_eq!(status_of(q), (0, "CREATED".into()));
        }
        let unknown = TaskId::random();
        refused(
            call(addr, "GET", &format!("/api/v1/drain_jobs/query?job_id={unknown}"), None, "").await,
            404,
            ErrorCode::JobNotFound,
            "JOB_NOT_FOUND",
        );
        for bad_id in
            ["/api/v1/drain_jobs/query?job_id=bad", "/api/v1/drain_jobs/query", "/api/v1/drain_jobs/query?job_id=1-x"]
        {
            refused(call(addr, "GET", bad_id, None, "").await, 400, bad, "Missing or invalid job_id");
        }
        refused(
            call(addr, "POST", "/api/v1/drain_jobs/cancel?job_id=bad", None, "").await,
            400,
            bad,
            "Missing or invalid job_id",
        );

        let cancelled = parsed(&call(addr, "POST", &format!("/api/v1/drain_jobs/cancel?job_id={job}"), None, "").await);
        assert_eq!((cancelled["job_id"].as_str(), cancelled["status"].as_str()), (Some(&job[..]), Some("CANCELED")));
        refused(
            call(addr, "POST", &format!("/api/v1/drain_jobs/cancel?job_id={job}"), None, "").await,
            409,
            ErrorCode::UnavailableInCurrentStatus,
            "UNAVAILABLE_IN_CURRENT_STATUS",
        );
        let seg = parsed(&call(addr, "GET", "/api/v1/segments/status?segment=a", None, "").await);
        assert_eq!(status_of(seg), (1, "OK".into()), "back in service");
        let q = parsed(&call(addr, "GET", &format!("/api/v1/drain_jobs/query?job_id={job}"), None, "").await);
        assert_eq!(status_of(q), (5, "CANCELED".into()));
    }

    /// `/query_segment` is the original's text; `/api/v1/remove_all` removes and counts (unleased objects
    /// without `force`, as the original).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_segments_usage_and_remove_all_answer_as_the_originals() {
        let svc = master();
        let server = admin(svc.clone(), None).await;
        let addr = server.local_addr();
        let used = svc
            .pool()
            .segments_named("a")
            .into_iter()
            .filter_map(|id| svc.pool().segment(id))
            .map(|s| s.usage.used)
            .sum::<u64>();
        assert!(used >= 100_000);
        let text = call(addr, "GET", "/query_segment?segment=a", None, "").await;
        assert_eq!(text, (200, format!("a\nUsed(bytes): {used}\nCapacity(bytes) : {}\n", 16 << 20)));
        assert_eq!(
            call(addr, "GET", "/query_segment?segment=nope", None, "").await,
            (500, "Failed to query segment".to_owned())
        );
        let removed = parsed(&call(addr, "POST", "/api/v1/remove_all", None, "").await);
        assert_eq!((removed["success"].as_bool(), removed["removed_count"].as_u64()), (Some(true), Some(10)));
        assert_eq!(svc.stat("", "k0").unwrap_err(), ErrorCode::ObjectNotFound);
        let again = parsed(&call(addr, "POST", "/api/v1/remove_all?force=true", None, "").await);
        assert_eq!(again["removed_count"].as_u64(), Some(0));
    }

    /// The tenant quota routes answer as the original's: refused without multi-tenancy, then a policy set,
    /// read (alone and in the list), refused out of range, dropped, and gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tenant_quotas_answer_as_the_originals_routes() {
        let single = master();
        let server = admin(single, None).await;
        let mode = ErrorCode::UnavailableInCurrentMode;
        refused(
            call(server.local_addr(), "GET", "/api/v1/tenant_quotas", None, "").await,
            409,
            mode,
            "UNAVAILABLE_IN_CURRENT_MODE",
        );
        let config = MasterConfig { enable_multi_tenants: true, ..MasterConfig::default() };
        let svc = Arc::new(MasterService::new(config, ManualClock::new(Timestamp(1_000))).unwrap());
        let server = admin(svc.clone(), None).await;
        let addr = server.local_addr();
        assert_eq!(
            call(addr, "GET", "/api/v1/tenant_quotas", None, "").await,
            (200, r#"{"success":true,"data":[]}"#.into())
        );
        let missing = ErrorCode::ObjectNotFound;
        refused(
            call(addr, "GET", "/api/v1/tenant_quotas?tenant_id=t1", None, "").await,
            404,
            missing,
            "OBJECT_NOT_FOUND",
        );
        let set =
            call(addr, "PUT", "/api/v1/tenant_quotas?tenant_id=t1", None, r#"{"requested_quota_bytes":1048576}"#).await;
        let want = r#"{"success":true,"data":{"tenant_id":"t1","requested_quota_bytes":1048576,"effective_quota_bytes":0,"charged_bytes":0,"admission_closed":false,"over_quota":false,"has_explicit_policy":true}}"#;
        assert_eq!(set, (200, want.to_owned()), "the original's bytes (no capacity mounted: effective 0)");
        assert_eq!(call(addr, "GET", "/api/v1/tenant_quotas?tenant_id=t1", None, "").await, set);
        call(addr, "PUT", "/api/v1/tenant_quotas?tenant_id=a0", None, r#"{"requested_quota_bytes":5}"#).await;
        let list = parsed(&call(addr, "GET", "/api/v1/tenant_quotas", None, "").await);
        let names: Vec<&str> =
            list["data"].as_array().unwrap().iter().map(|t| t["tenant_id"].as_str().unwrap()).collect();
        assert_eq!(names, ["a0", "t1"]);
        let bad = ErrorCode::InvalidParams;
        for (body, why) in [
            (r#"{"requested_quota_bytes":0}"#, "Tenant quota must be in [1, 2^63 - 1] bytes"),
            (r#"{"requested_quota_bytes":9223372036854775808}"#, "Tenant quota must be in [1, 2^63 - 1] bytes"),
            ("bad", "Invalid JSON body: "),
        ] {
            refused(call(addr, "PUT", "/api/v1/tenant_quotas?tenant_id=t2", None, body).await, 400, bad, why);
        }
        refused(
            call(addr, "PUT", "/api/v1/tenant_quotas", None, r#"{"requested_quota_bytes":5}"#).await,
            400,
            bad,
            "Missing or invalid tenant_id",
        );
        refused(
            call(addr, "DELETE", "/api/v1/tenant_quotas", None, "").await,
            400,
            bad,
            "Missing or invalid tenant_id",
        );
        assert_eq!(svc.tenant_quota("t2").map(|t| t.requested_quota_bytes), None, "nothing set by a refusal");
        assert_eq!(
            call(addr, "DELETE", "/api/v1/tenant_quotas?tenant_id=t1", None, "").await,
            (200, r#"{"success":true,"data":null}"#.into())
        );
        refused(
            call(addr, "DELETE", "/api/v1/tenant_quotas?tenant_id=t1", None, "").await,
            404,
            missing,
            "OBJECT_NOT_FOUND",
        );
        assert_eq!(svc.tenant_quota("t1").map(|t| t.requested_quota_bytes), None);
    }

    /// With a keyring the routes that act need the admin credential; the reads stay open.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn acting_routes_need_the_admin_credential() {
        let ring = Arc::new(Keyring::parse("0123456789abcdef-admin-compat").unwrap());
        let token = ring.credential(Principal::Admin).token();
        let svc = master();
        let server = admin(svc.clone(), Some(ring)).await;
        let addr = server.local_addr();
        let drain = r#"{"segments":["a"]}"#;
        let quota = r#"{"requested_quota_bytes":5}"#;
        for (method, path, body) in [
            ("POST", "/api/v1/drain_jobs", drain),
            ("POST", "/api/v1/remove_all", ""),
            ("PUT", "/api/v1/tenant_quotas?tenant_id=t", quota),
            ("DELETE", "/api/v1/tenant_quotas?tenant_id=t", ""),
        ] {
            assert_eq!(call(addr, method, path, None, body).await.0, 401, "{path}");
            assert_eq!(call(addr, method, path, Some("00"), body).await.0, 401, "{path}");
        }
        let id = TaskId::random();
        assert_eq!(call(addr, "POST", &format!("/api/v1/drain_jobs/cancel?job_id={id}"), None, "").await.0, 401);
        assert_eq!(svc.stat("", "k0").map(|_| ()), Ok(()), "nothing removed");
        assert_eq!(call(addr, "GET", "/api/v1/segments/status?segment=a", None, "").await.0, 200);
        let created = call(addr, "POST", "/api/v1/drain_jobs", Some(&token), drain).await;
        assert_eq!(created.0, 200, "{created:?}");
    }
}
