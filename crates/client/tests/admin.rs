//! Administration through the client library against a multi-tenant master server in this process: tenants
//! (quota, listing, removal and its refusals) and this client's local SSD registration.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_client::{Client, ClientConfig};
use crescent_master::service::MasterConfig;
use crescent_proto::{ErrorCode, ReplicateConfig};
use crescent_testkit::LocalCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_administered_through_the_client() {
    let config = MasterConfig { enable_multi_tenants: true, ..MasterConfig::default() };
    let cluster = LocalCluster::with_config(config, 1, 16 << 20).await;
    let admin = cluster.client();
    admin.set_tenant_quota("t", 8 << 20).await.unwrap();
    let mut in_t = ClientConfig::new(cluster.addr());
    in_t.tenant = "t".into();
    let user = Client::new(in_t);
    user.put_from("k", b"value", &ReplicateConfig::default()).await.unwrap();

    let list = admin.list_tenants().await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].tenant.as_str(), list[0].requested_quota, list[0].objects), ("t", 8 << 20, 1));
    assert!(list[0].charged >= 5 && list[0].has_policy && !list[0].admission_closed, "{:?}", list[0]);

    let e = admin.remove_tenant("t").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::TenantNotEmpty);
    assert!(e.to_string().starts_with("tenant \"t\" still holds 1 object"), "{e}");
    assert_eq!(user.remove_all(false).await.unwrap(), 1);
    admin.remove_tenant("t").await.unwrap();
    assert!(admin.list_tenants().await.unwrap().is_empty());
    let e = admin.remove_tenant("t").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::ObjectNotFound);
    let e = user.put_from("k", b"value", &ReplicateConfig::default()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::TenantNotRegistered, "a removed tenant takes no writes");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_registers_reports_and_drops_its_local_ssd() {
    let cluster = LocalCluster::start(0, 0).await;
    let c = cluster.client();
    assert_eq!(c.local_ssd_report(1).await.unwrap_err().code(), ErrorCode::SegmentNotFound);
    c.local_ssd_register(false).await.unwrap();
    c.local_ssd_report(1 << 30).await.unwrap();
    c.local_ssd_set_offloading(true).await.unwrap();
    let mine = c.local_ssd_status(Some(c.id())).await.unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!((mine[0].client, mine[0].enable_offloading, mine[0].total_capacity), (c.id(), true, 1 << 30));
    assert_eq!(c.local_ssd_status(None).await.unwrap(), mine);
    c.local_ssd_unregister().await.unwrap();
    assert_eq!(c.local_ssd_status(Some(c.id())).await.unwrap_err().code(), ErrorCode::SegmentNotFound);
    // Tenant administration needs a multi-tenant master.
    assert_eq!(c.list_tenants().await.unwrap_err().code(), ErrorCode::UnavailableInCurrentMode);
    cluster.shutdown().await;
}
