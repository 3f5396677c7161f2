//! What an authenticated principal may ask of the master (one rule, used by the RPC server and the admin HTTP).
//!
//! * `admin`: everything: tenant administration, every tenant's objects, any client's segments, the snapshots a
//!   standby fetches from the leader.
//! * `node`: its own segments and local SSD (mount, remount, unmount, ping, status, unreachable reports); no
//!   object operation.
//! * `tenant:T`: what a node may, plus the objects of tenant `T` alone (an engine's client hosts segments too).
//!
//! A request that names a client (`client: ClientId`) must name the one the connection's hello proved, unless
//! the principal is `admin`: otherwise a tenant could ping, remount or unmount in another client's name. And the
//! id must be this principal's (`server::claims`): a hello naming an id another principal holds proves nothing
//! about it.

use crescent_proto::wire::ErrorFrame;
use crescent_proto::{ClientId, ErrorCode, MasterRequest, Principal, TenantId};

/// Who a connection is, once its hello is done (none on a master without a keyring).
#[derive(Debug, Clone)]
pub struct Caller {
    /// The proven principal.
    pub principal: Principal,
    /// The client id the hello named (bound into its MAC).
    pub client: Option<ClientId>,
    /// The secret its credential derives from (what its tickets are sealed for).
    pub secret: Option<crescent_net::auth::SecretId>,
    /// The hello's client id is held by another principal (`server::claims`): every request in its name is
    /// refused.
    pub disputed: bool,
}

/// `Ok` when `caller` may send `req` to a master that is (`multi_tenant`) or is not multi-tenant; otherwise
/// `PERMISSION_DENIED` saying why. A single-tenant master keeps every object in the default tenant whatever a
/// request names, so there only `tenant:default` reaches objects.
pub fn authorize(caller: &Caller, req: &MasterRequest, multi_tenant: bool) -> Result<(), ErrorFrame> {
    use MasterRequest as R;
    let tenant_of = match &caller.principal {
        Principal::Admin => return Ok(()),
        Principal::Node(_) => None,
        Principal::Tenant(t) => Some(t),
    };
    let objects = |tenant: &str| match tenant_of {
        None => Err(denied(caller, "a storage node's credential is not a client's: no object operations")),
        Some(mine) if !multi_tenant => match mine.as_str() == TenantId::default_tenant().as_str() {
            true => Ok(()),
            false => Err(denied(caller, "this master is not multi-tenant: its objects are tenant default's")),
        },
        Some(mine) => match TenantId::new(tenant) {
            Ok(t) if &t == mine => Ok(()),
            Ok(t) => Err(denied(caller, &format!("tenant {:?} is not this credential's", t.as_str()))),
            Err(_) => Err(denied(caller, &format!("tenant {tenant:?} is not this credential's"))),
        },
    };
    let own = |client: &ClientId| match caller.client.as_ref() == Some(client) {
        true if caller.disputed => Err(denied(caller, &format!("client {client} is held by another principal"))),
        true => Ok(()),
        false => Err(denied(caller, &format!("client {client} is not the one this connection authenticated"))),
    };
    match req {
        R::ClusterInfo | R::SegmentStatus { .. } | R::LocalSsdStatus { .. } | R::DataTicket { .. } => Ok(()),
        R::Ping { client }
        | R::MountSegment { client, .. }
        | R::RemountSegments { client, .. }
        | R::UnmountSegment { client, .. }
        | R::GracefulUnmount { client, .. }
        | R::ReportUnreachable { client, .. }
        | R::RegisterLocalSsd { client, .. }
        | R::UnregisterLocalSsd { client }
        | R::ReportLocalSsd { client, .. }
        | R::SetLocalSsdOffloading { client, .. }
        | R::DiskTasks { client, .. }
        | R::ReplicaTasks { client, .. } => own(client),
        R::CreateCopyTask { tenant, .. } | R::CreateMoveTask { tenant, .. } => objects(tenant),
        // A task id is 128 random bits, known only to whoever created the task.
        R::QueryTask { .. } => Ok(()),
        R::CreateDrain { .. } | R::QueryDrain { .. } | R::CancelDrain { .. } => {
            Err(denied(caller, "draining segments needs the admin credential"))
        }
        R::PutStart { client, tenant, .. }
        | R::PutEnd { client, tenant, .. }
        | R::PutRevoke { client, tenant, .. }
        | R::UpsertStart { client, tenant, .. }
        | R::BatchPutStart { client, tenant, .. }
        | R::BatchPutEnd { client, tenant, .. }
        | R::BatchPutRevoke { client, tenant, .. }
        | R::BatchReplicaClear { client, tenant, .. } => own(client).and_then(|()| objects(tenant)),
        R::GetReplicaList { tenant, .. }
        | R::Stat { tenant, .. }
        | R::ReleaseLeases { tenant, .. }
        | R::BatchGetReplicaList { tenant, .. }
        | R::BatchPrefixLease { tenant, .. }
        | R::ExistKey { tenant, .. }
        | R::BatchExistKey { tenant, .. }
        | R::Remove { tenant, .. }
        | R::BatchRemove { tenant, .. }
        | R::RemoveByRegex { tenant, .. }
        | R::ListKeys { tenant, .. }
        | R::RemoveGroup { tenant, .. }
        | R::ListKeysPage { tenant, .. }
        | R::RemoveAll { tenant: Some(tenant), .. } => objects(tenant),
        R::RemoveAll { tenant: None, .. } => Err(denied(caller, "removing every tenant's objects needs admin")),
        R::ListTenants | R::SetTenantQuota { .. } | R::RemoveTenant { .. } => {
            Err(denied(caller, "tenant administration needs the admin credential"))
        }
        // A snapshot holds every tenant's metadata: only another master (which holds the secret) reads it.
        R::FetchSnapshot { .. } => Err(denied(caller, "fetching a snapshot needs the admin credential")),
    }
}

fn denied(caller: &Caller, why: &str) -> ErrorFrame {
    ErrorFrame {
        code: ErrorCode::PermissionDenied,
        message: format!("permission denied for {}: {why}", caller.principal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crescent_proto::wire::{Batch, WireKey};
    use crescent_proto::{ReplicateConfig, SegmentId};

    fn caller(p: &str, client: ClientId) -> Caller {
        Caller { principal: p.parse().unwrap(), client: Some(client), secret: None, disputed: false }
    }

    fn code(r: Result<(), ErrorFrame>) -> ErrorCode {
        r.map_or_else(|e| e.code, |()| ErrorCode::Ok)
    }

    #[test]
    fn each_principal_gets_its_own_and_nothing_else() {
        let me = ClientId::random();
        let other = ClientId::random();
        let key = || WireKey::Key("k".into());
        let put = |client, tenant: &str| MasterRequest::PutStart {
            client,
            tenant: tenant.into(),
            key: key(),
            size: 1,
            config: ReplicateConfig::default(),
        };
        let get = |tenant: &str| MasterRequest::GetReplicaList { tenant: tenant.into(), key: key() };
        let unmount = |client| MasterRequest::UnmountSegment { client, segment: SegmentId::random() };
        let quota = MasterRequest::SetTenantQuota { tenant: "a".into(), bytes: 1 };
        let wipe = MasterRequest::RemoveAll { tenant: None, force: true };

        let a = caller("tenant:a", me);
        assert_eq!(code(authorize(&a, &put(me, "a"), true)), ErrorCode::Ok);
        assert_eq!(code(authorize(&a, &get("a"), true)), ErrorCode::Ok);
        assert_eq!(code(authorize(&a, &get("b"), true)), ErrorCode::PermissionDenied, "another tenant's object");
        assert_eq!(code(authorize(&a, &put(other, "a"), true)), ErrorCode::PermissionDenied, "in another's name");
        let clear = |client, tenant: &str| MasterRequest::BatchReplicaClear {
            client,
            tenant: tenant.into(),
            keys: Batch(vec![key()]),
            segment: String::new(),
        };
        assert_eq!(code(authorize(&a, &clear(me, "a"), true)), ErrorCode::Ok);
        assert_eq!(code(authorize(&a, &clear(other, "a"), true)), ErrorCode::PermissionDenied, "as another writer");
        assert_eq!(code(authorize(&a, &clear(me, "b"), true)), ErrorCode::PermissionDenied, "another tenant's");
        assert_eq!(code(authorize(&a, &unmount(me), true)), ErrorCode::Ok, "its own segment");
        assert_eq!(code(authorize(&a, &unmount(other), true)), ErrorCode::PermissionDenied);
        assert_eq!(code(authorize(&a, &quota, true)), ErrorCode::PermissionDenied);
        assert_eq!(code(authorize(&a, &wipe, true)), ErrorCode::PermissionDenied);
        let own_wipe = MasterRequest::RemoveAll { tenant: Some("a".into()), force: false };
        assert_eq!(code(authorize(&a, &own_wipe, true)), ErrorCode::Ok);
        let default = caller("tenant:default", me);
        assert_eq!(code(authorize(&default, &get(""), true)), ErrorCode::Ok, "\"\" is the default tenant");

        let node = caller("node", me);
        assert_eq!(code(authorize(&node, &MasterRequest::Ping { client: me }, true)), ErrorCode::Ok);
        assert_eq!(code(authorize(&node, &unmount(me), true)), ErrorCode::Ok);
        assert_eq!(code(authorize(&node, &get("a"), true)), ErrorCode::PermissionDenied, "a node reads no object");
        assert_eq!(code(authorize(&node, &put(me, "a"), true)), ErrorCode::PermissionDenied);
        let batch = MasterRequest::BatchRemove { tenant: "a".into(), keys: Batch(vec![key()]), force: false };
        assert_eq!(code(authorize(&node, &batch, true)), ErrorCode::PermissionDenied);

        let admin = caller("admin", me);
        for r in [put(other, "b"), get("b"), unmount(other), quota, wipe] {
            assert_eq!(code(authorize(&admin, &r, true)), ErrorCode::Ok, "{r:?}");
        }
        let e = authorize(&a, &get("b"), true).unwrap_err();
        assert!(e.message.contains("tenant:a") && e.message.contains("\"b\""), "{}", e.message);

        // A single-tenant master puts every object in the default tenant, whatever a request names: only
        // `tenant:default` (and admin) reach objects there.
        for t in ["a", "b", ""] {
            assert_eq!(code(authorize(&a, &get(t), false)), ErrorCode::PermissionDenied, "{t:?}");
            assert_eq!(code(authorize(&default, &get(t), false)), ErrorCode::Ok, "{t:?}");
        }
        assert_eq!(code(authorize(&a, &unmount(me), false)), ErrorCode::Ok, "segments are not objects");
        assert_eq!(code(authorize(&admin, &get("b"), false)), ErrorCode::Ok);

        // A hello naming an id another principal holds: nothing in that id's name, objects still allowed.
        let squatter = Caller { disputed: true, ..caller("tenant:a", me) };
        let e = authorize(&squatter, &unmount(me), true).unwrap_err();
        assert!(e.code == ErrorCode::PermissionDenied && e.message.contains("held by another principal"), "{e:?}");
        assert_eq!(code(authorize(&squatter, &put(me, "a"), true)), ErrorCode::PermissionDenied);
        assert_eq!(code(authorize(&squatter, &get("a"), true)), ErrorCode::Ok);
    }
}
