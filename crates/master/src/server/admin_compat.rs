//! The original Mooncake master's admin HTTP API, served on the admin port beside Crescent's own routes, so
//! tools written for the original (SGLang reads `/get_all_segments`) work unchanged: `/get_all_segments`,
//! `/get_segments_detail`, `/query_key?key=K`, `/batch_query_keys?keys=K1,K2,...` and `/get_all_keys`. Status
//! codes, content types and bodies are the original's (0.3.13.post1, recorded in
//! `crates/cli/tests/original_http.rs`), with these differences, each because the original's answer is unsafe
//! or wrong:
//!
//! - `/get_all_keys` answers one page, never the whole index: `limit` (default 10 000, at most 1 000 000 —
//!   more is clamped, as `/keys` does; 0 or a non-number is a 400) and `cursor` (keys strictly after it). When
//!   more keys remain, the `x-next-cursor` header carries the cursor of the next page, percent-encoded, to be
//!   passed as `?cursor=` verbatim; the body stays the original's (one key and `\n` per key), so a consumer that
//!   reads one answer gets the first page. Keys come in byte order, on the listing thread (`server::lister`),
//!   like `/keys`: 503 with `Retry-After` when other listings keep it busy.
//! - `/query_key` without a `key`, or with an empty or over-long one, is a 400 (the original looked the empty
//!   key up and answered 404); its `key` is percent-decoded (the original did not, so a key with a reserved
//!   character could not be queried there, while `/batch_query_keys` decoded).
//! - A look takes no lease, counts nothing and promotes nothing (`MasterService::peek_replicas`): the
//!   original's handlers leased every object they showed.
//!
//! Reads are the default tenant's, or `?tenant=` as on `/keys` (an invalid tenant is a 400). Like `/keys`,
//! these routes are reads and stay open to scrapers (the admin port binds loopback by default); with a TLS
//! server side they are HTTPS like the rest of the port. Replicas are shown as the original shows them: a
//! memory range as `{size_, buffer_address_, protocol_, transport_endpoint_}` with the segment's base plus the
//! offset as its address, a node's disk tier and a client's local SSD under `local_disk_values`. Ids are
//! printed in the original's `HIGH-LOW` form (the UUID's two 64-bit halves in decimal).
//!
//! The original's routes that act (drain jobs, `remove_all`) and look at one segment are
//! [`super::admin_compat_ops`]'s.

use super::admin::AdminState;
use crate::service::MasterService;
use crate::service::listing::LIST_REPLY_BYTES;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use crescent_proto::key::MAX_KEY_LEN;
use crescent_proto::wire::{ErrorFrame, MAX_BATCH};
use crescent_proto::{ErrorCode, ObjectKey, ReplicaDescriptor, ReplicaLocation, SegmentKind, SegmentStatus};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The content type of the original's plain-text answers (`/get_all_keys`, `/get_all_segments`).
pub const TEXT: &str = "text/plain; version=0.0.4";
/// The content type of the original's JSON answers.
pub const JSON: &str = "application/json; charset=utf-8";
/// The header that carries the cursor of `/get_all_keys`'s next page.
pub const NEXT_CURSOR: &str = "x-next-cursor";
/// `/get_all_keys`'s page size when no `limit` is given.
pub const DEFAULT_KEYS_LIMIT: usize = 10_000;
/// The largest `/get_all_keys` page (a larger `limit` is clamped to it).
pub const MAX_KEYS_LIMIT: usize = 1_000_000;

/// The original's routes, merged into the admin router.
pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .route("/get_all_segments", get(get_all_segments))
        .route("/get_segments_detail", get(get_segments_detail))
        .route("/query_key", get(query_key))
        .route("/batch_query_keys", get(batch_query_keys))
        .route("/get_all_keys", get(get_all_keys))
        .route("/kv_events/status", get(kv_events_status))
}

/// A query string's pairs, percent-decoded, in order.
pub(super) type Params = Vec<(String, String)>;

/// The first value given for `name` (the original reads the first of repeated parameters).
pub(super) fn param<'a>(q: &'a Params, name: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// The query's pairs, or a 400 for a query string that does not decode.
pub(super) fn params(q: Result<Query<Params>, QueryRejection>) -> Result<Params, Refused> {
    q.map(|Query(q)| q)
        .map_err(|e| error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, format!("bad query string: {e}")))
}

/// The tenant a read names (`?tenant=`, as on `/keys`); none means the default tenant.
fn tenant(q: &Params) -> &str {
    param(q, "tenant").unwrap_or("")
}

/// A refused request's answer (boxed: a `Response` is large to carry through every `Result`).
pub(super) struct Refused(Box<Response>);

impl From<Response> for Refused {
    fn from(r: Response) -> Self {
        Self(Box::new(r))
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        *self.0
    }
}

/// The original's error body, `{"success":false,"error_code":N,"error_message":"..."}`, as JSON.
pub(super) fn error(status: StatusCode, code: ErrorCode, message: String) -> Refused {
    #[derive(Serialize)]
    struct Failure {
        success: bool,
        error_code: i32,
        error_message: String,
    }
    json(status, &Failure { success: false, error_code: code as i32, error_message: message }).into()
}

/// `body` as JSON under the original's JSON content type.
pub(super) fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, JSON)], bytes).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("serialising the answer failed: {e}")).into_response(),
    }
}

/// The service to answer from, or the original's answer while it has none (a standby): 503, code
/// `UNAVAILABLE_IN_CURRENT_MODE`.
pub(super) fn service(s: &AdminState) -> Result<Arc<MasterService>, Refused> {
    s.svc().map_err(|e: ErrorFrame| {
        let message = format!("service plane is not active: {}", e.message);
        error(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::UnavailableInCurrentMode, message)
    })
}

/// A 400 for an invalid tenant name; `Ok` for any valid one (present or not).
fn check_tenant(svc: &MasterService, tenant: &str) -> Result<(), Refused> {
    svc.check_read_tenant(tenant)
        .map_err(|code| error(StatusCode::BAD_REQUEST, code, format!("{}: invalid tenant {tenant:?}", code.name())))
}

/// An id in the original's `HIGH-LOW` form.
pub(super) fn original_id((high, low): (u64, u64)) -> String {
    format!("{high}-{low}")
}

/// The segments the original lists: memory (and CXL) ones; a NoF target or a disk tier is no segment there.
fn memory_segments(svc: &MasterService) -> Vec<crate::segment_pool::SegmentInfo> {
    let mut all: Vec<_> = svc
        .pool()
        .segments()
        .into_iter()
        .filter(|s| matches!(s.spec.kind, SegmentKind::Memory | SegmentKind::Cxl))
        .collect();
    all.sort_by(|a, b| (&a.spec.name, a.spec.id).cmp(&(&b.spec.name, b.spec.id)));
    all
}

/// `GET /get_all_segments`: each segment name once, a line each, sorted.
async fn get_all_segments(State(s): State<AdminState>) -> Result<Response, Refused> {
    let svc = service(&s)?;
    let names: BTreeSet<String> = memory_segments(&svc).into_iter().map(|x| x.spec.name.clone()).collect();
    let mut body = String::new();
    for n in names {
        body.push_str(&n);
        body.push('\n');
    }
    Ok(([(header::CONTENT_TYPE, TEXT)], body).into_response())
}

/// The KV event stream's counters, in the original's shape (`enabled`, `published_batches`, `published_events`,
/// `dropped_events`, `skipped_unparsed_keys`) with Crescent's after them: the endpoint, events queued,
/// subscribers connected, the id of the last event queued, events skipped for subscribers behind, and each
/// connected subscriber's figures.
async fn kv_events_status(State(s): State<AdminState>) -> Result<Response, Refused> {
    #[derive(Serialize)]
    struct Status {
        enabled: bool,
        published_batches: u64,
        published_events: u64,
        dropped_events: u64,
        skipped_unparsed_keys: u64,
        endpoint: Option<String>,
        queued: u64,
        subscribers: u64,
        last_event_id: u64,
        subscriber_dropped_events: u64,
        subscriber_stats: Vec<Subscriber>,
    }
    #[derive(Serialize)]
    struct Subscriber {
        peer: String,
        sent_events: u64,
        dropped_events: u64,
        buffered_bytes: u64,
    }
    let svc = service(&s)?;
    let hub = svc.events();
    let st = hub.map(|h| h.stats()).unwrap_or_default();
    let body = Status {
        enabled: hub.is_some(),
        published_batches: st.published_batches,
        published_events: st.published_events,
        dropped_events: st.dropped_events,
        skipped_unparsed_keys: st.skipped_unparsed_keys,
        endpoint: hub.and_then(|h| h.bound_endpoint()),
        queued: st.queued,
        subscribers: st.subscribers,
        last_event_id: st.last_event_id,
        subscriber_dropped_events: st.subscriber_dropped_events,
        subscriber_stats: hub
            .map(|h| h.subscriber_stats())
            .unwrap_or_default()
            .into_iter()
            .map(|s| Subscriber {
                peer: s.peer.to_string(),
                sent_events: s.sent_events,
                dropped_events: s.dropped_events,
                buffered_bytes: s.buffered_bytes,
            })
            .collect(),
    };
    Ok(json(StatusCode::OK, &body))
}

/// A segment status by the original's enumerator names (Crescent's own states beyond them by the same rule).
pub(super) fn status_name(s: SegmentStatus) -> &'static str {
    match s {
        SegmentStatus::Undefined => "UNDEFINED",
        SegmentStatus::Ok => "OK",
        SegmentStatus::Draining => "DRAINING",
        SegmentStatus::Drained => "DRAINED",
        SegmentStatus::GracefullyUnmounting => "GRACEFULLY_UNMOUNTING",
        SegmentStatus::Unmounting => "UNMOUNTING",
        SegmentStatus::Suspect => "SUSPECT",
        SegmentStatus::Disconnected => "DISCONNECTED",
    }
}

/// A size in GiB as the original prints it (`std::ostream`'s default: `%g`, six significant digits).
fn gib(bytes: u64) -> String {
    format!("{} GiB", format_g(bytes as f64 / (1u64 << 30) as f64))
}

/// `printf("%g")`: six significant digits, trailing zeros dropped, scientific below 1e-4 and from 1e6.
fn format_g(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return if x == 0.0 { "0".into() } else { x.to_string() };
    }
    let sci = format!("{x:.5e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_owned() } else { s.to_owned() }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.unsigned_abs())
    } else {
        let decimals = usize::try_from(5 - exp).unwrap_or(0);
        trim(&format!("{x:.decimals$}"))
    }
}

/// One segment of `/get_segments_detail`, fields in the original's order.
#[derive(Serialize)]
struct SegmentDetail {
    segment_name: String,
    segment_id: String,
    client_id: String,
    base_address: String,
    size_bytes: u64,
    size_human: String,
    te_endpoint: String,
    protocol: &'static str,
    status: &'static str,
    allocator_used_bytes: u64,
    allocator_capacity_bytes: u64,
    allocator_usage_percent: f64,
}

/// `GET /get_segments_detail`: `{"total_segments": N, "segments": [...]}`.
async fn get_segments_detail(State(s): State<AdminState>) -> Result<Response, Refused> {
    #[derive(Serialize)]
    struct Detail {
        total_segments: u64,
        segments: Vec<SegmentDetail>,
    }
    let svc = service(&s)?;
    let segments: Vec<SegmentDetail> = memory_segments(&svc)
        .into_iter()
        .map(|x| SegmentDetail {
            segment_name: x.spec.name.clone(),
            segment_id: original_id(x.spec.id.as_u64_pair()),
            client_id: original_id(x.client.as_u64_pair()),
            base_address: format!("{:#x}", x.spec.base),
            size_bytes: x.spec.size,
            size_human: gib(x.spec.size),
            te_endpoint: x.spec.endpoint.clone(),
            protocol: "tcp",
            status: status_name(x.status),
            allocator_used_bytes: x.usage.used,
            allocator_capacity_bytes: x.usage.capacity,
            allocator_usage_percent: if x.usage.capacity > 0 {
                x.usage.used as f64 / x.usage.capacity as f64 * 100.0
            } else {
                0.0
            },
        })
        .collect();
    Ok(json(StatusCode::OK, &Detail { total_segments: segments.len() as u64, segments }))
}

/// A memory (or NoF) range as the original's `AllocatedBuffer::Descriptor`.
#[derive(Serialize)]
struct BufferDescriptor {
    size_: u64,
    buffer_address_: u64,
    protocol_: &'static str,
    transport_endpoint_: String,
}

/// A replica on a disk read through its holder's endpoint (`HttpLocalDiskReplicaInfo`).
#[derive(Serialize)]
struct LocalDiskInfo {
    client_id: String,
    object_size: u64,
    transport_endpoint: String,
}

/// One key of `/batch_query_keys` (`HttpBatchQueryKeyResult`): absent lists are `null`.
#[derive(Serialize, Default)]
struct KeyResult {
    ok: bool,
    error: Option<&'static str>,
    values: Option<Vec<BufferDescriptor>>,
    /// The original's file-backed replicas (`{file_path, object_size}`): Crescent has none, always `null`.
    disk_values: Option<Vec<serde_json::Value>>,
    local_disk_values: Option<Vec<LocalDiskInfo>>,
    nof_values: Option<Vec<BufferDescriptor>>,
}

/// A range of segment `id` at `offset`: its address is the segment's base plus the offset. `None` when the
/// segment went meanwhile (nothing to show).
fn range(
    svc: &MasterService,
    id: crescent_proto::SegmentId,
    offset: u64,
    length: u64,
    endpoint: &str,
) -> Option<BufferDescriptor> {
    let seg = svc.pool().segment(id)?;
    Some(BufferDescriptor {
        size_: length,
        buffer_address_: seg.spec.base.wrapping_add(offset),
        protocol_: "tcp",
        transport_endpoint_: endpoint.to_owned(),
    })
}

/// The replicas as the original's batch answer sorts them: memory, NoF, disk.
fn key_result(svc: &MasterService, replicas: &[ReplicaDescriptor]) -> KeyResult {
    let mut r = KeyResult { ok: true, values: Some(Vec::new()), ..KeyResult::default() };
    for d in replicas {
        match &d.location {
            ReplicaLocation::Memory { segment_id, offset, length, endpoint } => {
                r.values.get_or_insert_with(Vec::new).extend(range(svc, *segment_id, *offset, *length, endpoint));
            }
            ReplicaLocation::Nof { segment_id, offset, length, endpoint } => {
                r.nof_values.get_or_insert_with(Vec::new).extend(range(svc, *segment_id, *offset, *length, endpoint));
            }
            // A node's disk tier is a disk local to that node, read through its endpoint.
            ReplicaLocation::Disk { segment_id, length, endpoint, .. } => {
                if let Some(owner) = svc.pool().owner(*segment_id) {
                    r.local_disk_values.get_or_insert_with(Vec::new).push(LocalDiskInfo {
                        client_id: original_id(owner.as_u64_pair()),
                        object_size: *length,
                        transport_endpoint: endpoint.to_string(),
                    });
                }
            }
            ReplicaLocation::LocalDisk { client_id, length, endpoint } => {
                r.local_disk_values.get_or_insert_with(Vec::new).push(LocalDiskInfo {
                    client_id: original_id(client_id.as_u64_pair()),
                    object_size: *length,
                    transport_endpoint: endpoint.to_string(),
                });
            }
        }
    }
    r
}

/// `GET /query_key?key=K[&tenant=T]`: `{"success":true,"data":[descriptor...]}` (memory replicas only), or
/// 404 with the original's error body naming why it cannot be read.
async fn query_key(State(s): State<AdminState>, q: Result<Query<Params>, QueryRejection>) -> Result<Response, Refused> {
    #[derive(Serialize)]
    struct Found {
        success: bool,
        data: Vec<BufferDescriptor>,
    }
    let q = params(q)?;
    let Some(key) = param(&q, "key") else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidParams,
            "no key given: use /query_key?key=KEY".into(),
        ));
    };
    ObjectKey::check(key).map_err(|e| error(StatusCode::BAD_REQUEST, e.code(), e.to_string()))?;
    let svc = service(&s)?;
    check_tenant(&svc, tenant(&q))?;
    match svc.peek_replicas(tenant(&q), key) {
        Ok(replicas) => {
            let data = key_result(&svc, &replicas).values.unwrap_or_default();
            Ok(json(StatusCode::OK, &Found { success: true, data }))
        }
        Err(code) => Err(error(StatusCode::NOT_FOUND, code, code.name().to_owned())),
    }
}

/// The original's 400 of `/batch_query_keys`: `{"success":false,"error":"..."}`.
fn batch_refused(message: String) -> Refused {
    #[derive(Serialize)]
    struct Failure {
        success: bool,
        error: String,
    }
    json(StatusCode::BAD_REQUEST, &Failure { success: false, error: message }).into()
}

/// `GET /batch_query_keys?keys=K1,K2,...[&tenant=T]`: `{"success":true,"data":{KEY: result}}`, one entry per
/// distinct key in key order; a key that cannot be read has `ok: false` and its error's name. At most
/// [`MAX_BATCH`] keys; none, or an over-long one, is a 400.
async fn batch_query_keys(
    State(s): State<AdminState>,
    q: Result<Query<Params>, QueryRejection>,
) -> Result<Response, Refused> {
    #[derive(Serialize)]
    struct Answer {
        success: bool,
        data: BTreeMap<String, KeyResult>,
    }
    let q = params(q)?;
    let keys: Vec<String> = match param(&q, "keys") {
        None | Some("") => return Err(batch_refused("No keys provided. Use ?keys=key1,key2,...".into())),
        Some(list) => list.split(',').map(str::to_owned).collect(),
    };
    if keys.len() > MAX_BATCH {
        return Err(batch_refused(format!("{} keys given; at most {MAX_BATCH} per request", keys.len())));
    }
    if let Some(long) = keys.iter().find(|k| k.len() > MAX_KEY_LEN) {
        return Err(batch_refused(format!(
            "a key is {} bytes, the limit is {MAX_KEY_LEN}: {}...",
            long.len(),
            long.chars().take(32).collect::<String>()
        )));
    }
    let svc = service(&s)?;
    let tenant = tenant(&q).to_owned();
    check_tenant(&svc, &tenant)?;
    // Up to MAX_BATCH lookups: off the request workers, as a batch RPC of that size would be.
    let data = tokio::task::spawn_blocking(move || {
        let mut data = BTreeMap::new();
        for key in keys {
            // An empty key names nothing (the original answers it so, too).
            let item = match svc.peek_replicas(&tenant, &key) {
                Ok(replicas) => key_result(&svc, &replicas),
                Err(code) => KeyResult { error: Some(code.name()), ..KeyResult::default() },
            };
            data.insert(key, item);
        }
        data
    })
    .await
    .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::InternalError, e.to_string()))?;
    Ok(json(StatusCode::OK, &Answer { success: true, data }))
}

/// `limit` of `/get_all_keys`: absent → the default; 0 or not a number → `Err`; above the maximum → clamped.
fn keys_limit(q: &Params) -> Result<usize, String> {
    let Some(raw) = param(q, "limit") else { return Ok(DEFAULT_KEYS_LIMIT) };
    match raw.parse::<u64>() {
        Ok(0) => Err("limit must be at least 1".into()),
        Ok(n) => Ok(usize::try_from(n).unwrap_or(MAX_KEYS_LIMIT).min(MAX_KEYS_LIMIT)),
        Err(_) => Err(format!("limit must be a whole number from 1 to {MAX_KEYS_LIMIT}, not {raw:?}")),
    }
}

/// `GET /get_all_keys[?limit=N][&cursor=C][&tenant=T]`: one page of keys, a line each, in byte order; with
/// `x-next-cursor` when more remain.
async fn get_all_keys(
    State(s): State<AdminState>,
    q: Result<Query<Params>, QueryRejection>,
) -> Result<Response, Refused> {
    let q = params(q)?;
    let bad = |m: String| error(StatusCode::BAD_REQUEST, ErrorCode::InvalidParams, m);
    let limit = keys_limit(&q).map_err(bad)?;
    let cursor = match param(&q, "cursor") {
        None => None,
        Some(c) => {
            ObjectKey::check(c).map_err(|e| bad(format!("bad cursor: {e} (pass the x-next-cursor header's value)")))?;
            Some(c.to_owned())
        }
    };
    let svc = service(&s)?;
    let tenant = tenant(&q).to_owned();
    check_tenant(&svc, &tenant)?;
    let page =
        super::lister::run(move || svc.list_keys_page(&tenant, "", cursor.as_deref(), limit, LIST_REPLY_BYTES)).await;
    let page = match page {
        Ok(Ok(page)) => page,
        Err(ErrorCode::UnavailableInCurrentStatus) => {
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::UnavailableInCurrentStatus,
                super::lister::busy_message(),
            );
            r.0.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Err(r);
        }
        Ok(Err(ErrorCode::InvalidParams)) => return Err(bad("invalid listing request".into())),
        // The original's answer to a failed listing.
        Ok(Err(_)) | Err(_) => {
            return Err((StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, TEXT)], "Failed to get all keys")
                .into_response()
                .into());
        }
    };
    let mut r =
        ([(header::CONTENT_TYPE, TEXT)], Body::from_stream(futures_util::stream::iter(KeyLines::new(page.keys))))
            .into_response();
    if let Some(next) = page.next {
        // Percent-encoded: a key may hold bytes a header cannot (and the value pastes into `?cursor=` as is).
        match HeaderValue::from_str(&percent_encode(&next)) {
            Ok(v) => {
                r.headers_mut().insert(NEXT_CURSOR, v);
            }
            Err(e) => {
                return Err(error(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::InternalError, e.to_string()));
            }
        }
    }
    Ok(r)
}

/// `s` percent-encoded for a query component: every byte but the unreserved ones (RFC 3986) as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A page of keys as the original's body, a key and `\n` each, about [`KeyLines::CHUNK`] bytes at a time as
/// the body is sent (a page may hold up to 8 MiB of keys).
struct KeyLines {
    keys: std::vec::IntoIter<String>,
}

impl KeyLines {
    const CHUNK: usize = 64 << 10;

    fn new(keys: Vec<String>) -> Self {
        Self { keys: keys.into_iter() }
    }
}

impl Iterator for KeyLines {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut buf = Vec::new();
        while buf.len() < Self::CHUNK {
            let Some(k) = self.keys.next() else { break };
            buf.extend_from_slice(k.as_bytes());
            buf.push(b'\n');
        }
        (!buf.is_empty()).then(|| Ok(Bytes::from(buf)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, Timestamp};
    use crate::service::MasterConfig;
    use crescent_proto::{ClientId, SegmentId};

    /// One HTTP/1.0 GET on a fresh connection (the body whole, never chunked): the status and the body.
    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        (head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0), body.to_owned())
    }

    /// An admin server on a free loopback port answering for `target`.
    async fn admin(target: super::super::Target) -> super::super::AdminServer {
        super::super::AdminServer::start(
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            target,
            Arc::new(super::super::RpcMetrics::default()),
            super::super::SnapshotSlot::default(),
            None,
            None,
        )
        .await
        .unwrap()
    }

    /// A candidate that does not lead answers every one of the original's routes as the original's standby
    /// does: 503, `UNAVAILABLE_IN_CURRENT_MODE`, saying where the leader is.
    #[tokio::test]
    async fn a_standby_answers_the_originals_unavailable_body() {
        let standby = super::super::target::Elected::new(crate::ha::HaStatus::new("test".into()));
        let admin = admin(super::super::Target::Elected(standby)).await;
        for path in [
            "/get_all_segments",
            "/get_segments_detail",
            "/query_key?key=k",
            "/batch_query_keys?keys=k",
            "/get_all_keys",
            "/api/v1/segments/status?segment=a",
            "/api/v1/drain_jobs/query?job_id=1-2",
            "/query_segment?segment=a",
        ] {
            let (status, body) = get(admin.local_addr(), path).await;
            assert_eq!(status, 503, "{path}: {body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["success"], false, "{path}");
            assert_eq!(v["error_code"], ErrorCode::UnavailableInCurrentMode as i32, "{path}");
            let message = v["error_message"].as_str().unwrap();
            assert!(message.starts_with("service plane is not active: this master is not the leader"), "{message}");
        }
    }

    /// The original lists memory segments only: a NoF target or a node's disk tier is no segment there. A name
    /// is listed once however many segments carry it.
    #[tokio::test]
    async fn only_memory_segments_are_listed_each_name_once() {
        let svc = Arc::new(MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1_000))).unwrap());
        let node = ClientId::random();
        let mut nof = crescent_testkit::segment("nof", 1 << 20);
        nof.kind = SegmentKind::Nof;
        let mut disk = crescent_testkit::segment("b", 1 << 20);
        disk.kind = SegmentKind::Disk;
        for spec in [crescent_testkit::segment("b", 1 << 20), crescent_testkit::segment("b", 2 << 20), disk] {
            svc.mount_segment(node, spec).unwrap();
        }
        svc.mount_segment(ClientId::random(), nof).unwrap();
        svc.mount_segment(ClientId::random(), crescent_testkit::segment("a", 1 << 30)).unwrap();
        let admin = admin(super::super::Target::Fixed(svc)).await;
        assert_eq!(get(admin.local_addr(), "/get_all_segments").await, (200, "a\nb\n".to_owned()));
        let (status, body) = get(admin.local_addr(), "/get_segments_detail").await;
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["total_segments"], 3, "{body}");
        let listed: Vec<(&str, &str)> = v["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["segment_name"].as_str().unwrap(), s["size_human"].as_str().unwrap()))
            .collect();
        assert_eq!(listed[0], ("a", "1 GiB"));
        assert_eq!(listed[1..].iter().map(|(n, _)| *n).collect::<Vec<_>>(), ["b", "b"]);
    }

    /// Each kind of replica where the original's batch answer puts it; a range whose segment went is left out.
    #[test]
    fn replicas_show_as_the_original_shows_them() {
        let svc = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1_000))).unwrap();
        let (node, target, local) = (ClientId::random(), ClientId::random(), ClientId::random());
        let mem = crescent_testkit::segment("mem", 1 << 20);
        let mut nof = crescent_testkit::segment("nof", 1 << 20);
        (nof.kind, nof.base) = (SegmentKind::Nof, 0);
        let mut disk = crescent_testkit::segment("mem", 1 << 20);
        (disk.id, disk.kind) = (SegmentId::random(), SegmentKind::Disk);
        svc.mount_segment(node, mem.clone()).unwrap();
        svc.mount_segment(node, disk.clone()).unwrap();
        svc.mount_segment(target, nof.clone()).unwrap();
        let at = |location| ReplicaDescriptor { id: 1, location, status: Default::default(), grant: None };
        let ep = |e: &str| -> Arc<str> { e.into() };
        let replicas = [
            at(ReplicaLocation::Memory { segment_id: mem.id, offset: 16, length: 5, endpoint: ep(&mem.endpoint) }),
            at(ReplicaLocation::Memory { segment_id: SegmentId::random(), offset: 0, length: 5, endpoint: ep("gone") }),
            at(ReplicaLocation::Nof { segment_id: nof.id, offset: 4096, length: 7, endpoint: ep(&nof.endpoint) }),
            at(ReplicaLocation::Disk { segment_id: disk.id, offset: 0, length: 5, endpoint: ep(&disk.endpoint) }),
            at(ReplicaLocation::LocalDisk { client_id: local, length: 9, endpoint: ep("10.0.0.9:7") }),
        ];
        let id = |c: ClientId| original_id(c.as_u64_pair());
        let got = serde_json::to_value(key_result(&svc, &replicas)).unwrap();
        let want = serde_json::json!({
            "ok": true,
            "error": null,
            "values": [{ "size_": 5, "buffer_address_": 0x1000_0010u64, "protocol_": "tcp", "transport_endpoint_": mem.endpoint }],
            "disk_values": null,
            "local_disk_values": [
                { "client_id": id(node), "object_size": 5, "transport_endpoint": disk.endpoint },
                { "client_id": id(local), "object_size": 9, "transport_endpoint": "10.0.0.9:7" },
            ],
            "nof_values": [{ "size_": 7, "buffer_address_": 4096, "protocol_": "tcp", "transport_endpoint_": nof.endpoint }],
        });
        assert_eq!(got, want);
        // Nothing at all: the original's `values` is an empty list, the rest `null`.
        let none = serde_json::to_value(key_result(&svc, &[])).unwrap();
        assert_eq!(
            none,
            serde_json::json!({ "ok": true, "error": null, "values": [], "disk_values": null, "local_disk_values": null, "nof_values": null })
        );
    }

    #[test]
    fn sizes_print_as_the_originals_ostream_does() {
        for (bytes, text) in [
            (1u64 << 30, "1 GiB"),
            (64 << 20, "0.0625 GiB"),
            (100 << 20, "0.0976562 GiB"),
            (4 << 20, "0.00390625 GiB"),
            (4 << 10, "3.8147e-06 GiB"),
            (0, "0 GiB"),
            (3 << 40, "3072 GiB"),
            (1 << 60, "1.07374e+09 GiB"),
        ] {
            assert_eq!(gib(bytes), text, "{bytes}");
        }
    }

    #[test]
    fn a_cursor_is_percent_encoded_to_paste_into_a_query() {
        assert_eq!(percent_encode("k-1.a_b~"), "k-1.a_b~");
        assert_eq!(percent_encode("sp ace&x=y,é\n"), "sp%20ace%26x%3Dy%2C%C3%A9%0A");
    }

    #[test]
    fn limits_default_clamp_and_refuse_zero() {
        let q = |v: &str| vec![("limit".to_owned(), v.to_owned())];
        assert_eq!(keys_limit(&Vec::new()), Ok(DEFAULT_KEYS_LIMIT));
        assert_eq!(keys_limit(&q("7")), Ok(7));
        assert_eq!(keys_limit(&q("99999999999999999")), Ok(MAX_KEYS_LIMIT));
        assert!(keys_limit(&q("0")).is_err());
        assert!(keys_limit(&q("-1")).unwrap_err().contains("whole number"));
        assert!(keys_limit(&q("ten")).is_err());
    }

    #[test]
    fn key_lines_are_one_per_key_in_chunks() {
        let keys: Vec<String> = (0..20_000).map(|i| format!("key-{i:06}")).collect();
        let body: Vec<u8> =
            KeyLines::new(keys.clone()).flat_map(|c| c.map(|b| b.to_vec()).unwrap_or_default()).collect();
        let want: String = keys.iter().map(|k| format!("{k}\n")).collect();
        assert_eq!(body, want.as_bytes());
        assert_eq!(KeyLines::new(Vec::new()).count(), 0, "an empty page is an empty body");
    }
}
