//! BatchReplicaClear (the original's): a client drops the replicas of its own objects whose read lease has
//! expired — all of them, or one segment's — and learns which keys it cleared; with an oplog the space is freed
//! only once the entry is durable, and the writer an object records survives a replay and a snapshot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_ha::kv::{HaKvBackend, MemoryKv};
use crescent_ha::oplog::WriterConfig;
use crescent_master::clock::{ManualClock, Timestamp};
use crescent_master::ha::OpLogOptions;
use crescent_master::service::{MasterConfig, MasterService};
use crescent_proto::{ClientId, ErrorCode, ReplicaLocation, ReplicateConfig, SegmentId, SegmentKind, SegmentSpec};
use crescent_testkit::eventually;
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(20);
/// The service's read lease (its default).
const LEASE: Duration = Duration::from_millis(10_000);

fn spec(i: usize) -> SegmentSpec {
    let mut s = crescent_testkit::segment_on(&format!("seg{i}"), 64 * MIB, &format!("host{i}"));
    s.endpoint = format!("127.0.0.1:{}", 9200 + i);
    s
}

struct Master {
    svc: Arc<MasterService>,
    clock: Arc<ManualClock>,
    segments: Vec<(ClientId, SegmentSpec)>,
}

fn master(config: MasterConfig) -> Master {
    let clock = ManualClock::new(Timestamp(1_000_000));
    let svc = Arc::new(MasterService::new(config, clock.clone()).unwrap());
    Master { svc, clock, segments: Vec::new() }
}

impl Master {
    fn mount(&mut self, n: usize) {
        for i in 0..n {
            let (c, s) = (ClientId::random(), spec(i));
            self.svc.mount_segment(c, s.clone()).unwrap();
            self.segments.push((c, s));
        }
    }

    fn put(&self, writer: ClientId, key: &str, replicas: u32) {
        self.svc.put_start(writer, "", key, MIB, &ReplicateConfig::with_replicas(replicas)).unwrap();
        self.svc.put_end(writer, "", key, None).unwrap();
    }

    /// Reads `key` (taking its lease).
    fn read(&self, key: &str) -> Vec<SegmentId> {
        let list = self.svc.get_replica_list("", key).unwrap();
        list.replicas.iter().map(|d| segment_of(&d.location)).collect()
    }

    fn clear(&self, client: ClientId, keys: &[&str], segment: &str) -> Vec<String> {
        self.svc.batch_replica_clear(client, "", keys, segment).unwrap()
    }

    fn used(&self) -> u64 {
        self.svc.pool().usage(SegmentKind::Memory).used
    }
}

fn segment_of(l: &ReplicaLocation) -> SegmentId {
    match l {
        ReplicaLocation::Memory { segment_id, .. } => *segment_id,
        other => panic!("not a memory replica: {other:?}"),
    }
}

#[test]
fn only_the_callers_objects_whose_lease_expired_are_cleared() {
    let mut m = master(MasterConfig::default());
    m.mount(2);
    let (me, other) = (ClientId::random(), ClientId::random());
    for k in ["old", "leased", "mine2"] {
        m.put(me, k, 2);
    }
    m.put(other, "theirs", 1);
    // A put grants no lease (as the original's): only a read does.
    m.read("leased");
    let all = ["old", "leased", "theirs", "missing", "mine2"];
    assert_eq!(m.clear(me, &all, ""), ["old", "mine2"], "input order; leased, another's and unknown skipped");
    assert_eq!(m.svc.get_replica_list("", "old").unwrap_err(), ErrorCode::ObjectNotFound, "removed");
    assert_eq!(m.read("theirs").len(), 1, "another client's object is untouched");
    assert_eq!(m.used(), 2 * MIB + MIB, "the leased object and the other's are left");
    assert!(m.clear(me, &["leased"], "").is_empty(), "still leased");
    m.clock.advance(LEASE);
    assert_eq!(m.clear(me, &["leased", "theirs"], ""), ["leased"], "expired now; the other's still not mine");
    assert!(m.clear(other, &["leased"], "").is_empty(), "gone");
    m.clock.advance(LEASE);
    assert_eq!(m.clear(other, &["theirs"], ""), ["theirs"]);
    assert_eq!(m.used(), 0);
    // A client that never wrote owns nothing; an empty batch clears nothing.
    m.put(me, "k", 1);
    assert!(m.clear(ClientId::random(), &["k"], "").is_empty());
    assert!(m.clear(me, &[], "").is_empty());
    assert_eq!(m.svc.audit().quota_mismatches, Vec::new());
}

#[test]
fn a_segment_name_clears_only_the_replicas_there_and_the_object_goes_with_its_last() {
    let mut m = master(MasterConfig::default());
    m.mount(2);
    let me = ClientId::random();
    m.put(me, "k", 2);
    let (seg0, seg1) = (m.segments[0].1.id, m.segments[1].1.id);
    assert!(m.clear(me, &["k"], "no-such-segment").is_empty(), "no replica there: nothing cleared");
    assert_eq!(m.used(), 2 * MIB);
    assert_eq!(m.clear(me, &["k"], "seg0"), ["k"]);
    assert_eq!(m.used(), MIB, "seg0's replica freed");
    assert_eq!(m.read("k"), [seg1], "seg1's replica still serves it");
    assert!(m.clear(me, &["k"], "seg0").is_empty(), "nothing left on seg0");
    m.clock.advance(LEASE);
    assert_eq!(m.clear(me, &["k"], "seg1"), ["k"]);
    assert_eq!(m.svc.get_replica_list("", "k").unwrap_err(), ErrorCode::ObjectNotFound, "its last replica went");
    assert_eq!(m.used(), 0);
    assert_ne!(seg0, seg1);
    assert_eq!(m.svc.audit().quota_mismatches, Vec::new());
}

#[test]
fn a_write_in_flight_is_skipped_and_bad_input_clears_nothing() {
    let mut m = master(MasterConfig { enable_multi_tenants: true, ..MasterConfig::default() });
    m.mount(1);
    m.svc.upsert_tenant_quota("t", 64 * MIB).unwrap();
    let me = ClientId::random();
    m.svc.put_start(me, "t", "done", MIB, &ReplicateConfig::with_replicas(1)).unwrap();
    m.svc.put_end(me, "t", "done", None).unwrap();
    m.svc.put_start(me, "t", "writing", MIB, &ReplicateConfig::with_replicas(1)).unwrap();
    assert!(m.svc.batch_replica_clear(me, "t", &["writing"], "").unwrap().is_empty(), "being written");
    assert!(m.svc.batch_replica_clear(me, "t", &["writing"], "seg0").unwrap().is_empty());
    assert_eq!(m.svc.batch_replica_clear(me, "_bad", &["done"], ""), Err(ErrorCode::InvalidParams), "bad tenant");
    assert_eq!(m.svc.batch_replica_clear(me, "nobody", &["done"], ""), Ok(vec![]), "unknown tenant");
    assert_eq!(m.svc.batch_replica_clear(me, "t", &["", "done"], ""), Ok(vec!["done".to_owned()]));
}

#[test]
fn the_layout_did_not_grow_for_the_writer() {
    // The writer's number lives in the replica's former padding (Replica 48 B before and after; the entry and
    // its state shrank since: the charge kept as a count, the soft pin out of line, the small fields packed, the
    // replica list's tag and the group folded into bytes the entry had anyway).
    use crescent_master::metadata::{ObjectEntry, ObjectState, Replica};
    let sizes =
        (std::mem::size_of::<ObjectEntry>(), std::mem::size_of::<ObjectState>(), std::mem::size_of::<Replica>());
    eprintln!("ObjectEntry {} B, ObjectState {} B, Replica {} B", sizes.0, sizes.1, sizes.2);
    assert_eq!(sizes, (112, 80, 48));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logged_clear_frees_once_durable_and_the_writer_survives_a_replay() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let options = OpLogOptions { kv, cluster: "clear".into(), writer: WriterConfig::default() };
    let mut a = master(MasterConfig::default());
    let (log, _) = crescent_master::ha::open(&options, &a.svc).await.unwrap();
    a.mount(2);
    let (me, other) = (ClientId::random(), ClientId::random());
    a.put(me, "whole", 1);
    a.put(me, "half", 2);
    a.put(other, "theirs", 1);
    assert_eq!(a.clear(me, &["whole"], ""), ["whole"]);
    assert_eq!(a.clear(me, &["half"], "seg0"), ["half"]);
    assert_eq!(a.svc.get_replica_list("", "whole").unwrap_err(), ErrorCode::ObjectNotFound, "hidden at once");
    assert_eq!(a.read("half"), [a.segments[1].1.id]);
    // Freed once its entry is durable (REMOVE of one, PUT_END of what is left of the other).
    assert!(eventually(WAIT, || async { a.used() == 2 * MIB }).await);
    log.stop().await;

    let b = master(MasterConfig::default());
    let (log_b, report) = crescent_master::ha::open(&options, &b.svc).await.unwrap();
    assert_eq!(report.objects, 2, "half (one replica) and theirs");
    for (c, s) in &a.segments {
        b.svc.remount_segments(*c, std::slice::from_ref(s)).unwrap();
    }
    assert_eq!(b.read("half"), [a.segments[1].1.id]);
    b.clock.advance(LEASE);
    // The replayed objects still know their writers.
    assert_eq!(b.clear(me, &["half", "theirs"], ""), ["half"]);
    let at = b.read("theirs")[0];
    let name = &a.segments.iter().find(|(_, s)| s.id == at).unwrap().1.name;
    b.clock.advance(LEASE);
    assert_eq!(b.clear(other, &["theirs"], name), ["theirs"], "by the name of the segment holding it");
    log_b.stop().await;
}

#[test]
fn the_writer_survives_a_snapshot_round_trip() {
    use crescent_master::snapshot::{self, MasterSnapshotView, SnapshotMetadata};
    let mut m = master(MasterConfig::default());
    m.mount(1);
    let (me, other) = (ClientId::random(), ClientId::random());
    m.put(me, "mine", 1);
    m.put(other, "theirs", 1);
    let mut state = m.svc.metadata_view();
    state.last_seq = 1;
    let meta = SnapshotMetadata { state, batch_id: 1, producer_view: 1 };
    let bytes = snapshot::encode(&MasterSnapshotView { metadata: Some(meta), ..MasterSnapshotView::default() });
    let state = snapshot::decode(&bytes).unwrap().metadata.unwrap().state;
    let b = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(9_000_000))).unwrap();
    assert_eq!(b.restore_replayed(&state).unwrap(), (2, 1));
    let (c, s) = &m.segments[0];
    b.remount_segments(*c, std::slice::from_ref(s)).unwrap();
    assert_eq!(b.batch_replica_clear(me, "", &["mine", "theirs"], "").unwrap(), ["mine"]);
    assert_eq!(b.batch_replica_clear(other, "", &["theirs"], "").unwrap(), ["theirs"]);
}
