//! A full etcd is weathered by a leading candidate (issue 34 §3): once etcd's backend quota is exceeded (its
//! NOSPACE alarm on) the leader keeps its lease and keeps leading, refuses mutations with `PERSISTENT_FAIL`,
//! reports `degraded` on `/health` with the reason and for how long on `/metrics`; once an operator frees space
//! (compaction, defragmentation, alarm disarmed) it resumes by itself, with no step-down and no new promotion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_ha::kv::{EtcdKv, EtcdKvConfig, HaKvBackend};
use crescent_ha::leader::{EtcdCoordinator, EtcdCoordinatorConfig};
use crescent_ha::testing::{AlarmType, EtcdServer};
use crescent_master::ha::{HaStatus, OpLogOptions, master_writer_config};
use crescent_master::server::{CandidateOptions, MasterServer};
use crescent_master::service::MasterConfig;
use crescent_proto::{ClientId, ErrorCode, ReplicateConfig};
use crescent_testkit::process::{health, metric};
use std::sync::Arc;
use std::time::Duration;

/// The backend quota: small, so the test fills it in a moment.
const QUOTA: i64 = 8 << 20;
const WAIT: Duration = Duration::from_secs(30);
const CLUSTER: &str = "full";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_weathers_a_full_etcd_and_resumes_once_space_is_freed() {
    let quota = format!("--quota-backend-bytes={QUOTA}");
    let server = tokio::task::spawn_blocking(move || EtcdServer::start_with(&[&quota]))
        .await
        .unwrap()
        .expect("etcd must start for this test");
    let kv = EtcdKv::connect(EtcdKvConfig::new(vec![server.endpoint()])).await.unwrap();
    // History compaction can reclaim (one key overwritten; an operator's etcd holds others' history too): more
    // than one batch record, so the stuck batch fits once it is freed.
    for i in 0..8u8 {
        kv.put(b"/ballast", &vec![i; 384 << 10]).await.unwrap();
    }
    let kv: Arc<dyn HaKvBackend> = Arc::new(kv);
    let mut coord = EtcdCoordinatorConfig::new(vec![server.endpoint()], CLUSTER);
    coord.ttl = Duration::from_secs(2);
    let coordinator = Arc::new(EtcdCoordinator::connect(coord).await.unwrap());
    let mut options = CandidateOptions::new(coordinator);
    options.retry = Duration::from_millis(100);
    let oplog = OpLogOptions { kv, cluster: CLUSTER.into(), writer: master_writer_config() };
    let c = MasterServer::builder(MasterConfig::default())
        .background(false)
        .oplog(Some(oplog))
        .admin_addr(Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))))
        .start_candidate(options)
        .await
        .unwrap();
    let mut rx = c.subscribe();
    let led = tokio::time::timeout(WAIT, rx.wait_for(HaStatus::is_leader)).await.is_ok();
    assert!(
        led,
        "never led: {:?}; etcd {} bytes, alarms {:?}",
        c.status(),
        server.db_size().await.unwrap(),
        server.alarms().await.unwrap()
    );
    let admin = c.admin_addr().unwrap().to_string();
    let svc = c.service().unwrap();
    let node = ClientId::random();
    svc.mount_segment(node, crescent_testkit::segment_on("seg", 1 << 30, "host")).unwrap();
    let writer = ClientId::random();
    let put = |key: &str| {
        svc.put_start(writer, "", key, 64, &ReplicateConfig::with_replicas(1))?;
        svc.put_end(writer, "", key, Some(64))
    };

    // Writes until etcd is full: the writer's stuck batch makes admission close, and mutations are refused.
    let mut refused = None;
    for n in 0..200_000 {
        match put(&format!("k{n}")) {
            Ok(()) => {}
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
        if n % 256 == 0 {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(refused, Some(ErrorCode::PersistentFail), "etcd never filled up");
    assert_eq!(server.alarms().await.unwrap(), vec![AlarmType::Nospace]);
    let ok = crescent_testkit::eventually(WAIT, || {
        let admin = admin.clone();
        async move { metric(&admin, "crescent_master_degraded_milliseconds").is_some_and(|ms| ms >= 500.0) }
    })
    .await;
    assert!(ok, "/metrics says for how long it has been degraded");
    let h = health(&admin).unwrap();
    assert_eq!((h["status"].as_str(), h["role"].as_str()), (Some("degraded"), Some("leader")), "{h}");
    let reason = h["reason"].as_str().unwrap();
    assert!(reason.contains("retrying") && reason.contains("database space exceeded"), "{reason}");
    assert!(h["degraded_seconds"].as_f64().unwrap() > 0.0, "{h}");
    // Still the leader several lease TTLs later: the lease is renewed, the writer retries, nothing steps down.
    let ttls = crescent_testkit::eventually(WAIT, || {
        let st = c.status();
        let admin = admin.clone();
        async move {
            assert!(st.is_leader() && st.step_downs == 0, "stepped down on a full etcd: {st:?}");
            metric(&admin, "crescent_master_degraded_milliseconds").is_some_and(|ms| ms >= 5000.0)
        }
    })
    .await;
    assert!(ttls);
    assert_eq!(put("refused"), Err(ErrorCode::PersistentFail));
    // The refused End left the write pending (the key unreadable, refusing puts): its writer revokes it (as the
    // client does after such a refusal), which needs no log, and the key is a plain miss again.
    assert_eq!(svc.get_replica_list("", "refused").unwrap_err(), ErrorCode::ReplicaIsNotReady);
    svc.put_revoke(writer, "", "refused").unwrap();
    assert_eq!(svc.get_replica_list("", "refused").unwrap_err(), ErrorCode::ObjectNotFound);

    // The operator frees space: the writer resumes on its own, under the same term.
    server.free_space().await.unwrap();
    let recovered = crescent_testkit::eventually(WAIT, || {
        let admin = admin.clone();
        async move { health(&admin).is_some_and(|h| h["status"] == "ok") }
    })
    .await;
    assert!(recovered, "not ok after space was freed: {:?}", health(&admin));
    assert_eq!(metric(&admin, "crescent_master_degraded_milliseconds"), Some(0.0));
    put("after").unwrap();
    let st = c.status();
    assert!(st.is_leader() && st.promotions == 1 && st.step_downs == 0, "{st:?}");
    drop(svc);
    c.shutdown().await;
}
