//! Admin requests through the RPC dispatch: tenants and local SSDs, their answers and the messages of their
//! refusals (which name the tenant or client and what stands in the way).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::server::dispatch;
use crescent_master::service::MasterConfig;
use crescent_proto::{ClientId, ErrorCode, MasterRequest as R, MasterResponse as A, ReplicateConfig};

fn multi() -> Harness {
    Harness::new(MasterConfig { enable_multi_tenants: true, ..MasterConfig::default() }, 1, 64 * MIB)
}

/// The refusal of `req`: its code and message.
fn refusal(h: &Harness, req: R) -> (ErrorCode, String) {
    let e = dispatch(&h.svc, &req).unwrap_err();
    (e.code, e.message)
}

#[test]
fn tenants_are_set_listed_and_removed_over_rpc_and_refusals_say_why() {
    let h = multi();
    let set = |t: &str, bytes| R::SetTenantQuota { tenant: t.into(), bytes };
    assert_eq!(dispatch(&h.svc, &set("t", 8 * MIB)), Ok(A::Done));
    h.put_in("t", "k", 4096, &ReplicateConfig::default()).unwrap();
    let Ok(A::Tenants(list)) = dispatch(&h.svc, &R::ListTenants) else { panic!("not a tenant list") };
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].tenant.as_str(), list[0].requested_quota, list[0].objects), ("t", 8 * MIB, 1));

    let remove = |t: &str| R::RemoveTenant { tenant: t.into() };
    let (code, msg) = refusal(&h, remove("t"));
    assert_eq!(code, ErrorCode::TenantNotEmpty);
    assert!(msg.starts_with("tenant \"t\" still holds 1 object ("), "{msg}");
    assert!(msg.ends_with(" charged); remove them first"), "{msg}");
    let (code, msg) = refusal(&h, remove("nobody"));
    assert_eq!(
        (code, msg.as_str()),
        (ErrorCode::ObjectNotFound, "tenant \"nobody\" has no quota policy: there is nothing to remove")
    );
    let (code, msg) = refusal(&h, set("t", 0));
    assert_eq!(code, ErrorCode::InvalidParams);
    assert!(msg.contains("0 bytes admits nothing"), "{msg}");
    let (code, msg) = refusal(&h, set("_sys", 1));
    assert_eq!(code, ErrorCode::InvalidParams);
    assert!(msg.contains("reserved prefix"), "{msg}");

    h.svc.remove("t", "k", true).unwrap();
    assert_eq!(dispatch(&h.svc, &remove("t")), Ok(A::Done));
    assert_eq!(dispatch(&h.svc, &R::ListTenants), Ok(A::Tenants(Vec::new())));
    let e = h.put_in("t", "k", 1, &ReplicateConfig::default()).unwrap_err();
    assert_eq!(e, ErrorCode::TenantNotRegistered, "a removed tenant takes no writes");
}

#[test]
fn tenant_administration_on_a_single_tenant_master_is_refused_as_unavailable() {
    let h = Harness::default3();
    for req in
        [R::ListTenants, R::SetTenantQuota { tenant: "t".into(), bytes: 1 }, R::RemoveTenant { tenant: "t".into() }]
    {
        let (code, msg) = refusal(&h, req);
        assert_eq!(code, ErrorCode::UnavailableInCurrentMode);
        assert!(msg.contains("--multi-tenant"), "{msg}");
    }
}

#[test]
fn local_ssds_register_report_and_show_over_rpc() {
    let h = multi();
    let c = ClientId::random();
    let (code, msg) = refusal(&h, R::ReportLocalSsd { client: c, capacity: 10 });
    assert_eq!((code, msg), (ErrorCode::SegmentNotFound, format!("client {c} has no local SSD registration")));
    assert_eq!(dispatch(&h.svc, &R::RegisterLocalSsd { client: c, enable_offloading: true }), Ok(A::Done));
    let (code, msg) = refusal(&h, R::RegisterLocalSsd { client: c, enable_offloading: true });
    assert_eq!((code, msg), (ErrorCode::SegmentAlreadyExists, format!("client {c} already registered a local SSD")));
    assert_eq!(dispatch(&h.svc, &R::ReportLocalSsd { client: c, capacity: 1 << 30 }), Ok(A::Done));
    let (code, msg) = refusal(&h, R::ReportLocalSsd { client: c, capacity: u64::MAX });
    assert_eq!(code, ErrorCode::InvalidParams);
    assert!(msg.contains("over the limit"), "{msg}");
    assert_eq!(dispatch(&h.svc, &R::SetLocalSsdOffloading { client: c, enabled: false }), Ok(A::Done));
    let Ok(A::LocalSsd(all)) = dispatch(&h.svc, &R::LocalSsdStatus { client: None }) else { panic!("not a list") };
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].client, all[0].enable_offloading, all[0].total_capacity), (c, false, 1 << 30));
    assert_eq!(dispatch(&h.svc, &R::LocalSsdStatus { client: Some(c) }), Ok(A::LocalSsd(all)));
    assert_eq!(dispatch(&h.svc, &R::UnregisterLocalSsd { client: c }), Ok(A::Done));
    assert_eq!(dispatch(&h.svc, &R::UnregisterLocalSsd { client: c }), Ok(A::Done), "idempotent");
    let (code, _) = refusal(&h, R::LocalSsdStatus { client: Some(c) });
    assert_eq!(code, ErrorCode::SegmentNotFound);
}
