//! A master with an oplog — here a lone one (`--data-dir` or `up --etcd`), not a candidate — answers a removal
//! only once the log holds it (a restart must not bring back what it said was gone), and an upsert onto a
//! readable object only once its REMOVE is durable (the writer may not overwrite bytes a failover could still
//! serve under the old value), and a removal that finds nothing only once what the log holds is durable
//! (another caller's removal may have hidden the key), a replica clear (all of an object's replicas or one
//! segment's) likewise; a write that removes nothing is answered at once. The backend's next write is held with a fault, so "not answered yet" is a
//! state the test controls, not a timing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_client::master::MasterConnection;
use crescent_ha::kv::{Fault, FaultyKv, HaKvBackend, KvOp, MemoryKv};
use crescent_master::ha::{OpLogOptions, master_writer_config};
use crescent_master::server::MasterServer;
use crescent_master::service::MasterConfig;
use crescent_proto::wire::PeerRole;
use crescent_proto::{ClientId, ErrorCode, MasterRequest, MasterResponse, ReplicateConfig};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

const WAIT: Duration = Duration::from_secs(20);

/// How long a reply that must wait for durability is watched for not arriving (it can only arrive once the
/// test releases the backend, so this bounds the test's patience, not a race).
const NOT_YET: Duration = Duration::from_millis(300);

struct Held {
    entered: Arc<Semaphore>,
    release: Arc<Semaphore>,
}

/// Holds the backend's next txn (the writer's next batch) until released.
async fn hold_next_write(faulty: &FaultyKv<MemoryKv>) -> Held {
    let held = Held { entered: Arc::new(Semaphore::new(0)), release: Arc::new(Semaphore::new(0)) };
    faulty.inject_next(KvOp::Txn, Fault::Block { entered: held.entered.clone(), release: held.release.clone() });
    held
}

fn key(k: &str) -> crescent_proto::wire::WireKey {
    crescent_proto::wire::WireKey::Key(k.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_master_with_a_log_answers_removals_and_upserts_only_once_durable() {
    let faulty = Arc::new(FaultyKv::new(MemoryKv::new()));
    let kv: Arc<dyn HaKvBackend> = faulty.clone();
    let oplog = OpLogOptions { kv, cluster: "held".into(), writer: master_writer_config() };
    let server =
        MasterServer::builder(MasterConfig::default()).background(false).oplog(Some(oplog)).start().await.unwrap();
    let svc = server.service().clone();
    svc.mount_segment(ClientId::random(), crescent_testkit::segment("s", 64 << 20)).unwrap();
    let writer = ClientId::random();
    let conn = Arc::new(MasterConnection::new(&server.rpc_addr().to_string(), writer, PeerRole::Client, 1, WAIT));
    let cfg = ReplicateConfig::with_replicas(1);
    for k in ["gone", "rewritten", "cleared"] {
        svc.put_start(writer, "", k, 4096, &cfg).unwrap();
        svc.put_end(writer, "", k, Some(1)).unwrap();
    }
    // One object on two segments, for a clear of one segment's replica (a PUT_END of what is left).
    svc.mount_segment(ClientId::random(), crescent_testkit::segment("s2", 64 << 20)).unwrap();
    svc.put_start(writer, "", "stripped", 4096, &ReplicateConfig::with_replicas(2)).unwrap();
    svc.put_end(writer, "", "stripped", Some(1)).unwrap();
    let log = svc.oplog().unwrap().clone();
    log.wait_durable(log.last_committed(), WAIT).await.unwrap();

    for (what, req) in [
        ("a removal", MasterRequest::Remove { tenant: String::new(), key: key("gone"), force: false }),
        (
            "an upsert onto a readable object",
            MasterRequest::UpsertStart {
                client: writer,
                tenant: String::new(),
                key: key("rewritten"),
                size: 4096,
                config: cfg.clone(),
            },
        ),
        (
            "a replica clear",
            MasterRequest::BatchReplicaClear {
                client: writer,
                tenant: String::new(),
                keys: crescent_proto::wire::Batch(vec![key("cleared")]),
                segment: String::new(),
            },
        ),
        (
            "a replica clear of one segment's replicas",
            MasterRequest::BatchReplicaClear {
                client: writer,
                tenant: String::new(),
                keys: crescent_proto::wire::Batch(vec![key("stripped")]),
                segment: "s".into(),
            },
        ),
    ] {
        let held = hold_next_write(&faulty).await;
        let c = conn.clone();
        let mut reply = tokio::spawn(async move { c.call(&req).await });
        // The change reached the log's backend, which holds it: the reply must wait.
        tokio::time::timeout(WAIT, held.entered.acquire()).await.unwrap().unwrap().forget();
        assert!(
            tokio::time::timeout(NOT_YET, &mut reply).await.is_err(),
            "{what} was answered before its log entry was durable"
        );
        held.release.add_permits(1);
        let answer = tokio::time::timeout(WAIT, reply).await.unwrap().unwrap().unwrap();
        let cleared = matches!(&answer, MasterResponse::Keys(k) if k.len() == 1);
        assert!(cleared || matches!(answer, MasterResponse::Done | MasterResponse::Replicas(_)), "{what}: {answer:?}");
    }
    // Two removals of one key: the first hides it and its REMOVE is held by the backend; the second finds
    // nothing, and its "not found" says the key is gone just as the first's "done" does, so it waits too (the
    // fault campaign saw it answered at once, then the key back after a failover lost the held REMOVE).
    svc.put_start(writer, "", "twice", 4096, &cfg).unwrap();
    svc.put_end(writer, "", "twice", Some(2)).unwrap();
    log.wait_durable(log.last_committed(), WAIT).await.unwrap();
    let held = hold_next_write(&faulty).await;
    let remove = || MasterRequest::Remove { tenant: String::new(), key: key("twice"), force: false };
    let c = conn.clone();
    let mut first = tokio::spawn(async move { c.call(&remove()).await });
    tokio::time::timeout(WAIT, held.entered.acquire()).await.unwrap().unwrap().forget();
    let other = Arc::new(MasterConnection::new(&server.rpc_addr().to_string(), writer, PeerRole::Client, 1, WAIT));
    let o = other.clone();
    let mut second = tokio::spawn(async move { o.call(&remove()).await });
    assert!(tokio::time::timeout(NOT_YET, &mut second).await.is_err(), "\"not found\" answered before durable");
    assert!(tokio::time::timeout(NOT_YET, &mut first).await.is_err());
    // Other refusals acknowledge nothing: answered at once, even while the backend holds a batch (on a
    // connection of their own: a connection's replies go out in order).
    let conn = Arc::new(MasterConnection::new(&server.rpc_addr().to_string(), writer, PeerRole::Client, 1, WAIT));
    svc.put_start(writer, "", "pending", 4096, &cfg).unwrap();
    let busy = MasterRequest::Remove { tenant: String::new(), key: key("pending"), force: true };
    let answer = tokio::time::timeout(WAIT, conn.call(&busy)).await.expect("a refusal is answered at once");
    assert_eq!(answer.map(drop).map_err(|e| e.code()), Err(ErrorCode::ReplicaIsNotReady), "the refusal itself");
    // A write that removes nothing (an upsert of a new key) does not wait either.
    let fresh = MasterRequest::UpsertStart {
        client: writer,
        tenant: String::new(),
        key: key("fresh"),
        size: 4096,
        config: cfg.clone(),
    };
    let answer = tokio::time::timeout(WAIT, conn.call(&fresh)).await.expect("answered while the backend is held");
    assert!(matches!(answer, Ok(MasterResponse::Replicas(_))), "{answer:?}");
    held.release.add_permits(1);
    let first = tokio::time::timeout(WAIT, first).await.unwrap().unwrap();
    assert!(matches!(first, Ok(MasterResponse::Done)), "{first:?}");
    let second = tokio::time::timeout(WAIT, second).await.unwrap().unwrap();
    assert_eq!(second.map(drop).map_err(|e| e.code()), Err(ErrorCode::ObjectNotFound));
    server.shutdown().await;
}

/// A candidate's replies go out only while the term that made them holds its lease. A leader that stalls (a
/// stopped process, a long pause) between answering and writing would otherwise hand out, once it runs again,
/// space, leases and locations its successor may have given to others meanwhile: the fault campaign saw a read
/// fail its checksum after a failover, the bytes overwritten by a write the stalled leader had placed. Here the
/// replies wait for the log (the backend holds the batch), the term's lease ends meanwhile, and neither the
/// removal's nor the read queued behind it is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_whose_lease_lapsed_sends_none_of_its_queued_replies() {
    use crescent_ha::leader::LeaseGuard;
    use crescent_master::clock::SystemClock;
    use crescent_master::ha::role::HaStatus;
    use crescent_master::server::{Elected, RpcMetrics, RpcServer, Target};
    use crescent_master::service::MasterService;
    let faulty = Arc::new(FaultyKv::new(MemoryKv::new()));
    let kv: Arc<dyn HaKvBackend> = faulty.clone();
    let options = OpLogOptions { kv, cluster: "term".into(), writer: master_writer_config() };
    let svc = Arc::new(MasterService::new(MasterConfig::default(), Arc::new(SystemClock::new())).unwrap());
    let (log_handle, _) = crescent_master::ha::open(&options, &svc).await.unwrap();
    svc.mount_segment(ClientId::random(), crescent_testkit::segment("s", 64 << 20)).unwrap();
    let writer = ClientId::random();
    let cfg = ReplicateConfig::with_replicas(1);
    for k in ["gone", "kept"] {
        svc.put_start(writer, "", k, 4096, &cfg).unwrap();
        svc.put_end(writer, "", k, Some(1)).unwrap();
    }
    let log = svc.oplog().unwrap().clone();
    log.wait_durable(log.last_committed(), WAIT).await.unwrap();
    let elected = Elected::new(HaStatus::new("test".into()));
    let guard = LeaseGuard::until(tokio::time::Instant::now() + Duration::from_secs(600));
    elected.lead(svc.clone(), guard.clone());
    let rpc =
        RpcServer::bind("127.0.0.1:0".parse().unwrap(), Target::Elected(elected), Arc::new(RpcMetrics::default()))
            .await
            .unwrap();
    let addr = rpc.local_addr().unwrap().to_string();
    let server = rpc.spawn().unwrap();
    let conn = Arc::new(MasterConnection::new(&addr, writer, PeerRole::Client, 1, Duration::from_secs(2)));
    let get = || MasterRequest::GetReplicaList { tenant: String::new(), key: key("kept") };
    // While the lease holds, replies go out.
    let first = conn.call(&get()).await;
    assert!(matches!(first, Ok(MasterResponse::ReplicaList(_))), "{first:?}");

    let held = hold_next_write(&faulty).await;
    let c = conn.clone();
    let removal = tokio::spawn(async move {
        c.call(&MasterRequest::Remove { tenant: String::new(), key: key("gone"), force: false }).await
    });
    tokio::time::timeout(WAIT, held.entered.acquire()).await.unwrap().unwrap().forget();
    let c = conn.clone();
    let read = tokio::spawn(async move { c.call(&get()).await });
    // The read is served behind the held removal; then the term's lease ends, then the log takes the batch.
    guard.end();
    held.release.add_permits(1);
    let removal = tokio::time::timeout(WAIT, removal).await.unwrap().unwrap();
    assert!(removal.is_err(), "a removal answered by a term that lost its lease: {removal:?}");
    let read = tokio::time::timeout(WAIT, read).await.unwrap().unwrap();
    assert!(read.is_err(), "a read answered by a term that lost its lease: {read:?}");
    server.shutdown().await;
    log_handle.stop().await;
}
