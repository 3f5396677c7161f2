//! Why a request failed, in words: the message of its error reply names the subject (key, tenant, segment)
//! and the limit or cause, so a user reads `OBJECT_NOT_FOUND: key "x" not found` rather than a bare code.
//! Computed only on failure, from the request and (for a few codes) a look at the service's state.

use crate::service::MasterService;
use crescent_proto::human::fmt_bytes;
use crescent_proto::wire::WireKey;
use crescent_proto::{ErrorCode, MAX_KEY_LEN, MasterRequest, ObjectKey};

/// The key a single-key request names, if it has one.
fn key_of(req: &MasterRequest) -> Option<(&str, &WireKey)> {
    use MasterRequest as R;
    match req {
        R::PutStart { tenant, key, .. }
        | R::PutEnd { tenant, key, .. }
        | R::PutRevoke { tenant, key, .. }
        | R::UpsertStart { tenant, key, .. }
        | R::GetReplicaList { tenant, key }
        | R::Stat { tenant, key }
        | R::ExistKey { tenant, key }
        | R::Remove { tenant, key, .. } => Some((tenant, key)),
        _ => None,
    }
}

/// `key "x"`, with its tenant when one was named and the master keeps tenants apart.
fn subject(svc: &MasterService, tenant: &str, key: &str) -> String {
    if svc.config().enable_multi_tenants && !tenant.is_empty() {
        format!("key {key:?} in tenant {tenant:?}")
    } else {
        format!("key {key:?}")
    }
}

/// The message for `code` answering `req`.
pub(super) fn explain(svc: &MasterService, req: &MasterRequest, code: ErrorCode) -> String {
    use MasterRequest as R;
    if let Some((_, WireKey::TooLong(len))) = key_of(req) {
        return format!("key is {len} bytes, the limit is {MAX_KEY_LEN}");
    }
    if let Some((tenant, WireKey::Key(key))) = key_of(req) {
        if let Err(e) = ObjectKey::check(key) {
            return e.to_string();
        }
        let who = subject(svc, tenant, key);
        return match (code, req) {
            (ErrorCode::ObjectNotFound, R::PutEnd { .. }) => {
                format!("{who} has no write in progress (it was removed, or another write replaced this one)")
            }
            (ErrorCode::ObjectNotFound, _) => format!("{who} not found"),
            (ErrorCode::ObjectAlreadyExists, _) => format!("{who} already exists"),
            (ErrorCode::ReplicaIsNotReady, _) => format!("{who} is still being written"),
            (ErrorCode::UnavailableInCurrentStatus, R::GetReplicaList { .. }) => format!(
                "every replica of {who} is on a node that cannot be reached now (readable again when it answers, \
                 gone if it does not within the client TTL)"
            ),
            (ErrorCode::ObjectHasLease, _) => match svc.stat(tenant, key) {
                Ok(s) if s.lease_remaining_ms > 0 => format!(
                    "{who} is leased by {} reader(s) for another {} ms; force removes it anyway",
                    s.lease_readers, s.lease_remaining_ms
                ),
                _ => format!("{who} is leased by a reader; force removes it anyway"),
            },
            (ErrorCode::NoAvailableHandle, R::PutStart { size, .. } | R::UpsertStart { size, .. }) => {
                format!("no room for {who}: {}", svc.no_space_detail(*size))
            }
            (ErrorCode::TenantQuotaExceeded, R::PutStart { size, .. } | R::UpsertStart { size, .. }) => {
                format!(
                    "{who} ({}) is over tenant {tenant:?}'s quota, even after evicting its objects",
                    fmt_bytes(*size)
                )
            }
            (ErrorCode::TenantNotRegistered, _) => format!("tenant {tenant:?} is not registered"),
            (ErrorCode::InvalidParams, R::PutStart { size: 0, .. } | R::UpsertStart { size: 0, .. }) => {
                format!("{who}: an object holds at least one byte")
            }
            (ErrorCode::IllegalClient, _) => format!("{who} is being written by another client"),
            (ErrorCode::InvalidWrite, _) => format!("{who} has no write of this client in progress"),
            _ => who,
        };
    }
    match (code, req) {
        (ErrorCode::SegmentNotFound, R::GracefulUnmount { segment, .. } | R::SegmentStatus { segment }) => {
            format!("segment {segment} is not mounted")
        }
        (ErrorCode::InvalidParams, R::RemoveByRegex { pattern, .. }) => format!("invalid pattern {pattern:?}"),
        (ErrorCode::TenantNotRegistered, R::ListKeys { tenant, .. } | R::RemoveByRegex { tenant, .. }) => {
            format!("tenant {tenant:?} is not registered")
        }
        _ => String::new(),
    }
}
