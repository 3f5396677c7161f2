//! The log does not grow without bound (issue 34 §4): a real `crescent master --etcd … --data-dir DIR` with no
//! snapshot store configured snapshots into `DIR/snapshots` by default, compacts the oplog's batches below its
//! snapshot and compacts etcd's revision history, so etcd's database stays bounded under a stream of mutations.
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
            let items = keys.iter().map(|k| (WireKey::Key(k.clone()), None)).collect();
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
