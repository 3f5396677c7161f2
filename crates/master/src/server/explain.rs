//! Why a request failed, in words: the message of its error reply names the subject (key, tenant, segment)
//! and the limit or cause, so a user reads `OBJECT_NOT_FOUND: key "x" not found` rather than a bare code.
//! Computed only on failure, from the request and (for a few codes) a look at the service's state.

use crate::service::MasterService;
use crescent_proto::human::fmt_bytes;
use crescent_proto::wire::WireKey;
use crescent_proto::{ClientId, ErrorCode, MAX_GROUP_LEN, MAX_KEY_LEN, MasterRequest, ObjectKey, TenantId};

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

/// The tenant a request names, if any.
fn tenant_of(req: &MasterRequest) -> Option<&str> {
    use MasterRequest as R;
    match req {
        R::PutStart { tenant, .. }
        | R::PutEnd { tenant, .. }
        | R::PutRevoke { tenant, .. }
        | R::UpsertStart { tenant, .. }
        | R::GetReplicaList { tenant, .. }
        | R::Stat { tenant, .. }
        | R::ExistKey { tenant, .. }
        | R::Remove { tenant, .. }
        | R::BatchPutStart { tenant, .. }
        | R::RemoveGroup { tenant, .. }
        | R::RemoveByRegex { tenant, .. } => Some(tenant),
        R::RemoveAll { tenant, .. } => tenant.as_deref(),
        _ => None,
    }
}

/// The group a request names, if any.
fn group_of(req: &MasterRequest) -> Option<&str> {
    use MasterRequest as R;
    match req {
        R::PutStart { config, .. } | R::UpsertStart { config, .. } | R::BatchPutStart { config, .. } => {
            config.group_id.as_deref()
        }
        R::RemoveGroup { group, .. } => Some(group),
        _ => None,
    }
}

/// A tenant as the user would type it: none named is `default`.
fn tenant_name(raw: &str) -> &str {
    if raw.is_empty() { TenantId::DEFAULT } else { raw }
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
    if code == ErrorCode::InvalidParams {
        if let Some(why) = tenant_of(req).and_then(|t| TenantId::new(t).err()) {
            return why.to_string();
        }
        if let Some(len) = group_of(req).map(str::len).filter(|&n| n > MAX_GROUP_LEN) {
            return format!("group name is {len} bytes, the limit is {MAX_GROUP_LEN}");
        }
    }
    if code == ErrorCode::PersistentFail {
        let done = match req {
            R::RemoveAll { .. } | R::RemoveByRegex { .. } => {
                "some objects may have been removed before the refusal, the rest were left"
            }
            _ => "nothing was changed",
        };
        return format!(
            "the master's operation log cannot take this change now (its backend is failing, full or unreachable; \
             /health says why): {done}; retry later"
        );
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
                "every replica of {who} is on a node that cannot be reached now (readable again when it comes \
                 back; dropped if it has not within {} s of going silent, or restarted)",
                svc.config().disconnect_grace_ms / 1000
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
            (ErrorCode::TenantNotRegistered, _) => format!("tenant {:?} is not registered", tenant_name(tenant)),
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
        (ErrorCode::ObjectNotFound, R::RemoveGroup { group, .. }) => format!("no group {group:?}"),
        (ErrorCode::ObjectHasLease, R::RemoveGroup { group, .. }) => {
            format!("a member of group {group:?} is leased by a reader; force removes the group anyway")
        }
        (ErrorCode::ReplicaIsNotReady, R::RemoveGroup { group, .. }) => {
            format!("a member of group {group:?} is still being written")
        }
        (
            ErrorCode::TenantNotRegistered,
            R::ListKeys { tenant, .. } | R::ListKeysPage { tenant, .. } | R::RemoveByRegex { tenant, .. },
        ) => {
            format!("tenant {:?} is not registered", tenant_name(tenant))
        }
        (ErrorCode::InvalidParams, R::ListKeysPage { limit: 0, .. }) => "a page holds at least one key: give a \
            limit of 1 or more"
            .into(),
        (ErrorCode::InvalidParams, R::ListKeys { tenant, .. } | R::ListKeysPage { tenant, .. }) => {
            TenantId::new(tenant).err().map_or_else(|| format!("tenant {tenant:?}"), |e| e.to_string())
        }
        (_, R::ListTenants | R::SetTenantQuota { .. } | R::RemoveTenant { .. }) => explain_tenant_admin(svc, req, code),
        (
            _,
            R::RegisterLocalSsd { client, .. }
            | R::UnregisterLocalSsd { client }
            | R::ReportLocalSsd { client, .. }
            | R::SetLocalSsdOffloading { client, .. }
            | R::LocalSsdStatus { client: Some(client) },
        ) => explain_local_ssd(req, *client, code),
        (ErrorCode::PermissionDenied, R::MountSegment { client, .. } | R::RemountSegments { client, .. }) => {
            match svc.mounter(*client) {
                Some(holder) => format!("client {client}'s segments are {holder}'s: another principal mounts none"),
                None => format!("client {client}'s segments are another principal's"),
            }
        }
        (_, R::MountSegment { client, spec }) => mount_refusal(svc, *client, std::slice::from_ref(spec)),
        (_, R::RemountSegments { client, specs }) => mount_refusal(svc, *client, &specs.0),
        _ => String::new(),
    }
}

/// The messages of tenant administration: they name the tenant and, for a refused removal, what it holds.
fn explain_tenant_admin(svc: &MasterService, req: &MasterRequest, code: ErrorCode) -> String {
    use MasterRequest as R;
    if code == ErrorCode::UnavailableInCurrentMode {
        return "the master runs without multi-tenancy: tenants and quotas need a master started with --multi-tenant"
            .into();
    }
    let raw = match req {
        R::SetTenantQuota { tenant, .. } | R::RemoveTenant { tenant } => tenant.as_str(),
        _ => return String::new(),
    };
    let tenant = match TenantId::new(raw) {
        Ok(id) => id,
        Err(e) => return e.to_string(),
    };
    let tenant = tenant.as_str();
    match (code, req) {
        (ErrorCode::InvalidParams, R::SetTenantQuota { bytes: 0, .. }) => {
            format!("a quota of 0 bytes admits nothing: give tenant {tenant:?} at least 1 byte, or remove it")
        }
        (ErrorCode::InvalidParams, R::SetTenantQuota { bytes, .. }) => format!(
            "a quota of {bytes} bytes for tenant {tenant:?} is over the limit of {} bytes",
            crate::metadata::quota::MAX_QUOTA
        ),
        (ErrorCode::ObjectNotFound, R::RemoveTenant { .. }) => {
            format!("tenant {tenant:?} has no quota policy: there is nothing to remove")
        }
        (ErrorCode::TenantNotEmpty, R::RemoveTenant { .. }) => match svc.tenant_quota(tenant) {
            Some(s) if s.objects > 0 => format!(
                "tenant {tenant:?} still holds {} object{} ({} charged); remove them first",
                s.objects,
                if s.objects == 1 { "" } else { "s" },
                fmt_bytes(s.charged_bytes)
            ),
            _ => format!("tenant {tenant:?} has writes in progress; remove it once they have finished"),
        },
        _ => format!("tenant {tenant:?}"),
    }
}

/// The messages of local SSD requests: they name the client.
fn explain_local_ssd(req: &MasterRequest, client: ClientId, code: ErrorCode) -> String {
    match (code, req) {
        (ErrorCode::SegmentAlreadyExists, _) => format!("client {client} already registered a local SSD"),
        (ErrorCode::SegmentNotFound, _) => format!("client {client} has no local SSD registration"),
        (ErrorCode::InvalidParams, MasterRequest::ReportLocalSsd { capacity, .. }) => {
            format!("a local SSD capacity of {capacity} bytes is over the limit of {} bytes", i64::MAX)
        }
        _ => format!("local SSD of client {client}"),
    }
}

/// The words of a refused mount or remount: the pool's reason, found by checking again (it changes nothing).
fn mount_refusal(svc: &MasterService, client: ClientId, specs: &[crescent_proto::SegmentSpec]) -> String {
    svc.pool().mount_refusal(client, specs).map_or_else(String::new, |e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, Timestamp};
    use crate::service::MasterConfig;
    use crescent_proto::wire::Batch;

    /// A refused mount or remount says why, in the pool's words (it used to be a bare `INVALID_PARAMS`).
    #[test]
    fn a_refused_mount_says_why() {
        let svc = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1_000))).unwrap();
        let owner = ClientId::random();
        let mounted = crescent_testkit::segment("a", 1 << 20);
        svc.mount_segment(owner, mounted.clone()).unwrap();
        let why = |req: &MasterRequest, code: ErrorCode| explain(&svc, req, code);

        let mut empty = crescent_testkit::segment("b", 1 << 20);
        empty.size = 0;
        let code = svc.mount_segment(owner, empty.clone()).unwrap_err();
        let req = MasterRequest::MountSegment { client: owner, spec: empty.clone() };
        assert_eq!(why(&req, code), "invalid segment: segment size is 0");

        let other = ClientId::random();
        let code = svc.mount_segment(other, mounted.clone()).unwrap_err();
        let req = MasterRequest::MountSegment { client: other, spec: mounted.clone() };
        assert!(why(&req, code).contains("already mounted with different parameters or by another client"));

        let twice = Batch(vec![empty.clone(), empty.clone()]);
        let code = svc.remount_segments(owner, &twice.0).unwrap_err();
        let req = MasterRequest::RemountSegments { client: owner, specs: twice };
        assert_eq!(why(&req, code), format!("invalid segment: segment {} listed twice", empty.id));

        let fine = crescent_testkit::segment("c", 1 << 20);
        let req = MasterRequest::MountSegment { client: owner, spec: fine };
        assert_eq!(why(&req, ErrorCode::InvalidParams), "", "nothing to say about a mount the pool would accept");
    }
}
