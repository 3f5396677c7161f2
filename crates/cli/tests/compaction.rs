//! The log does not grow without bound (issue 34 §4): a real `crescent master --etcd … --data-dir DIR` with no
//! snapshot store configured snapshots into `DIR/snapshots` by default, compacts the oplog's batches below its
//! snapshot and compacts etcd's revision history, so etcd's database stays bounded under a stream of mutations;
//! and a standby with a data directory of its own (nothing shared) bootstraps from the leader's snapshot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_client::master::MasterConnection;
use crescent_ha::oplog::{OpLogBatchStorage, StorageConfig};
use crescent_ha::testing::EtcdServer;
use crescent_proto::wire::{Batch, PeerRole, WireKey};
use crescent_proto::{ClientId, MasterRequest, MasterResponse, ReplicateConfig, SegmentId, SegmentKind, SegmentSpec};
use crescent_testkit::process::{all_durable, health};
use crescent_testkit::{Proc, eventually};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const CLUSTER: &str = "compaction-test";
const WAIT: Duration = Duration::from_secs(60);
/// Rounds of writes, each followed by a snapshot.
const ROUNDS: usize = 8;
/// Puts per round (in batches of [`BATCH`]).
const PUTS: usize = 2000;
const BATCH: usize = 200;
/// Key length: each PUT_END entry carries its key, so a round writes at least `PUTS × KEY_LEN` bytes to etcd.
const KEY_LEN: usize = 1000;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_crescent"))
}

/// etcd's database bytes in use (what compaction frees; the file itself only grows to its high-water mark).
async fn etcd_in_use(endpoint: &str) -> u64 {
    let client = etcd_client::Client::connect([endpoint], None).await.unwrap();
    let status = client.maintenance_client().status().await.unwrap();
    u64::try_from(status.raft_used_db_size()).unwrap()
}

/// The newest snapshot's sequence on `/health` (0: none yet).
fn snapshot_seq(admin: &str) -> u64 {
    health(admin).and_then(|h| h["snapshots"]["last"]["last_seq"].as_u64()).unwrap_or(0)
}

fn durable_seq(admin: &str) -> u64 {
    health(admin).and_then(|h| h["oplog"]["durable_seq"].as_u64()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_master_without_a_store_snapshots_into_its_data_dir_and_keeps_etcd_bounded() {
    let etcd = EtcdServer::start().expect("etcd (install etcd-server or set CRESCENT_ETCD_BIN)");
    let endpoint = etcd.endpoint();
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_str().unwrap();
    let master = Proc::start(
        bin(),
        &[
            "master",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--etcd",
            &endpoint,
            "--cluster-id",
            CLUSTER,
            "--leader-lease-ttl",
            "2",
            "--data-dir",
            dir,
            "--snapshot-interval",
            "1s",
            "--snapshot-retain",
            "1",
        ],
    );
    let (addr, admin) = (master.field("master"), master.field("admin"));
    assert!(eventually(WAIT, || async { health(&admin).is_some_and(|h| h["role"] == "leader") }).await);

    // A segment (the master never touches its memory) and a writer sending batches of puts.
    let node = ClientId::random();
    let conn = MasterConnection::new(&addr, node, PeerRole::Node, 1, Duration::from_secs(20));
    let spec = SegmentSpec {
        id: SegmentId::random(),
        name: "n".into(),
        base: 1 << 40,
        size: 1 << 30,
        endpoint: "127.0.0.1:1".into(),
        kind: SegmentKind::Memory,
        host_id: String::new(),
    };
    assert!(matches!(conn.call(&MasterRequest::MountSegment { client: node, spec }).await, Ok(MasterResponse::Done)));
    let writer_id = ClientId::random();
    let writer = MasterConnection::new(&addr, writer_id, PeerRole::Client, 1, WAIT);

    let baseline = etcd_in_use(&endpoint).await;
    let mut in_use = Vec::new();
    let mut n = 0usize;
    for round in 0..ROUNDS {
        for _ in 0..PUTS / BATCH {
            let keys: Vec<String> = (0..BATCH).map(|i| format!("{:0>width$}", n + i, width = KEY_LEN)).collect();
            n += BATCH;
            let items = keys.iter().map(|k| (WireKey::Key(k.clone()), 4096u64)).collect();
            let start = MasterRequest::BatchPutStart {
                client: writer_id,
                tenant: String::new(),
                items: Batch::new(items),
                config: ReplicateConfig::default(),
                group_ids: None,
                upsert: false,
            };
            let Ok(MasterResponse::BatchReplicas(r)) = writer.call(&start).await else { panic!("batch put start") };
            assert!(r.items.iter().all(Result::is_ok), "round {round}: {:?}", r.items.iter().find(|i| i.is_err()));
            let items = keys.iter().zip(writes(&r)).map(|(k, w)| (WireKey::Key(k.clone()), None, w)).collect();
            let end = MasterRequest::BatchPutEnd { client: writer_id, tenant: String::new(), items: Batch::new(items) };
            let Ok(MasterResponse::BatchDone(r)) = writer.call(&end).await else { panic!("batch put end") };
            assert!(r.iter().all(Result::is_ok));
        }
        assert!(eventually(WAIT, || async { all_durable(&admin) }).await, "round {round} never became durable");
        let seq = durable_seq(&admin);
        assert!(
            eventually(WAIT, || async { snapshot_seq(&admin) >= seq }).await,
            "round {round}: no snapshot of seq {seq}: {:?}",
            health(&admin)
        );
        in_use.push(etcd_in_use(&endpoint).await);
    }

    let round_bytes = (PUTS * KEY_LEN) as u64;
    let grown = in_use.iter().max().unwrap().saturating_sub(baseline);
    eprintln!("etcd in use: baseline {baseline}, per round {in_use:?}; a round writes ≥ {round_bytes}");

    // Snapshots went to the data directory's default place.
    let latest = data.path().join("snapshots").join("latest");
    assert!(latest.is_file(), "no snapshot in {}", latest.display());
    // The log's batches below the snapshot are gone from etcd.
    let storage =
        OpLogBatchStorage::new(Arc::new(etcd.connect().await.unwrap()), CLUSTER, StorageConfig::default()).unwrap();
    let first = storage.first_stored_batch().await.unwrap().unwrap();
    let prefix = storage.read_durable_prefix().await.unwrap().unwrap();
    assert!(first > 1 && first + 2 >= prefix.batch_id, "batches {first}..={} are stored", prefix.batch_id);
    // And so is etcd's history of them: the first revisions are compacted.
    let mut kv = etcd_client::Client::connect([endpoint.as_str()], None).await.unwrap().kv_client();
    let old = kv.get("/", Some(etcd_client::GetOptions::new().with_prefix().with_revision(2))).await;
    let err = old.expect_err("revision 2 is still readable: etcd's history was not compacted").to_string();
    assert!(err.contains("compacted"), "{err}");
    // etcd stays bounded: every round wrote at least PUTS × KEY_LEN bytes to it; what it holds in use grew by
    // far less than all of them (a round's log and history at most, plus what bbolt keeps for its free pages).
    assert!(
        grown < 4 * round_bytes,
        "etcd grew by {grown} bytes over {ROUNDS} rounds of ≥ {round_bytes}: {in_use:?} (baseline {baseline})"
    );
    drop(master);
}

/// Two `crescent master --etcd … --data-dir` processes of a secured cluster, each with its own data directory
/// (so its own default snapshot store, nothing shared): the second, started after the first compacted its log,
/// fetches the leader's snapshot over the master's port, follows, and serves every object after `kill -9` of
/// the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_with_its_own_data_dir_fetches_the_leaders_snapshot_and_takes_over() {
    use crescent_net::auth::Keyring;
    use std::os::unix::fs::PermissionsExt;
    const SECRET: &str = "the secret of the snapshot fetch test";
    let etcd = EtcdServer::start().expect("etcd (install etcd-server or set CRESCENT_ETCD_BIN)");
    let endpoint = etcd.endpoint();
    let files = tempfile::tempdir().unwrap();
    let secret = files.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let admin_cred = Keyring::parse(SECRET).unwrap().credential(crescent_proto::Principal::Admin);
    let candidate = |dir: &Path| {
        let args = [
            "master",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--etcd",
            &endpoint,
            "--cluster-id",
            CLUSTER,
            "--leader-lease-ttl",
            "2",
            "--data-dir",
            dir.to_str().unwrap(),
            "--snapshot-interval",
            "1s",
            "--snapshot-retain",
            "1",
            "--secret-file",
            secret.to_str().unwrap(),
        ];
        Proc::start(bin(), &args)
    };
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = candidate(dir_a.path());
    let (addr_a, admin_a) = (a.field("master"), a.field("admin"));
    assert!(eventually(WAIT, || async { health(&admin_a).is_some_and(|h| h["role"] == "leader") }).await);
    let conn = |addr: &str, id| {
        MasterConnection::new(addr, id, PeerRole::Admin, 1, Duration::from_secs(20))
            .with_credential(Some(admin_cred.clone().into()))
    };
    let node = ClientId::random();
    let spec = SegmentSpec {
        id: SegmentId::random(),
        name: "n".into(),
        base: 1 << 40,
        size: 1 << 30,
        endpoint: "127.0.0.1:1".into(),
        kind: SegmentKind::Memory,
        host_id: String::new(),
    };
    let mount = MasterRequest::MountSegment { client: node, spec: spec.clone() };
    assert!(matches!(conn(&addr_a, node).call(&mount).await, Ok(MasterResponse::Done)));
    let writer_id = ClientId::random();
    let writer = conn(&addr_a, writer_id);
    let storage =
        OpLogBatchStorage::new(Arc::new(etcd.connect().await.unwrap()), CLUSTER, StorageConfig::default()).unwrap();
    let mut keys: Vec<String> = Vec::new();
    // Writes until the leader's snapshot let it compact its log's first batches.
    while storage.first_stored_batch().await.unwrap().is_none_or(|b| b <= 1) {
        let batch: Vec<String> = (keys.len()..keys.len() + BATCH).map(|i| format!("key-{i}")).collect();
        let items = batch.iter().map(|k| (WireKey::Key(k.clone()), 4096u64)).collect();
        let start = MasterRequest::BatchPutStart {
            client: writer_id,
            tenant: String::new(),
            items: Batch::new(items),
            config: ReplicateConfig::default(),
            group_ids: None,
            upsert: false,
        };
        let Ok(MasterResponse::BatchReplicas(r)) = writer.call(&start).await else { panic!("batch put start") };
        let items = batch.iter().zip(writes(&r)).map(|(k, w)| (WireKey::Key(k.clone()), None, w)).collect();
        let end = MasterRequest::BatchPutEnd { client: writer_id, tenant: String::new(), items: Batch::new(items) };
        assert!(matches!(writer.call(&end).await, Ok(MasterResponse::BatchDone(_))));
        keys.extend(batch);
        assert!(keys.len() < 200_000, "the leader never compacted: {:?}", health(&admin_a));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(eventually(WAIT, || async { all_durable(&admin_a) }).await);
    let seq = durable_seq(&admin_a);

    // B has its own, empty data directory: it fetches A's snapshot and follows A's log.
    let b = candidate(dir_b.path());
    let admin_b = b.field("admin");
    let following = eventually(WAIT, || async {
        health(&admin_b)
            .is_some_and(|h| h["ha"]["state"] == "following" && h["ha"]["applied_seq"].as_u64() >= Some(seq))
    })
    .await;
    assert!(following, "b does not follow: {:?}", health(&admin_b));
    assert!(dir_b.path().join("snapshots").join("latest").is_file(), "b keeps the fetched snapshot");

    a.kill9();
    assert!(eventually(WAIT, || async { health(&admin_b).is_some_and(|h| h["role"] == "leader") }).await);
    // The segment's node remounts at the new leader (as a node does by itself): its objects are served again.
    let remount = MasterRequest::RemountSegments { client: node, specs: Batch::new(vec![spec]) };
    assert!(matches!(conn(&b.field("master"), node).call(&remount).await, Ok(MasterResponse::Done)));
    let reader = conn(&b.field("master"), ClientId::random());
    let exist = MasterRequest::BatchExistKey {
        tenant: String::new(),
        keys: Batch::new(keys.iter().map(|k| WireKey::Key(k.clone())).collect()),
    };
    let Ok(MasterResponse::BatchExists(found)) = reader.call(&exist).await else { panic!("exist on b") };
    assert_eq!(found.len(), keys.len());
    let missing = found.iter().filter(|f| **f != Ok(true)).count();
    assert_eq!(missing, 0, "of {} keys, {missing} are not on b", keys.len());
}

/// The write each started item of a batch is (0 for an item that failed to start: its End fails).
fn writes(r: &crescent_proto::rpc::GrantedBatch<Vec<crescent_proto::ReplicaDescriptor>>) -> Vec<u64> {
    r.items.iter().map(|d| d.as_ref().map_or(0, |d| crescent_proto::write_id(d))).collect()
}
