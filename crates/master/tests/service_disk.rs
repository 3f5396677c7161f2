//! The disk tier, master side: memory evictions kept on the disk of the node that held them, the copy tasks
//! that makes for each node, the disk's own eviction (oldest first), faults, removals racing a copy, and disk
//! replicas across a restart from the log.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{MIB, spec_on};
use crescent_master::clock::{ManualClock, Timestamp};
use crescent_master::eviction::{EvictionScope, EvictionTarget};
use crescent_master::service::{MasterConfig, MasterService};
use crescent_proto::{
    ClientId, DiskFault, DiskTask, DiskTaskKind, DiskTaskResult, ErrorCode, ReplicaLocation, ReplicaStatus,
    ReplicateConfig, SegmentId, SegmentKind, SegmentSpec,
};
use std::sync::Arc;
use std::time::Duration;

const BLOCK: u64 = crescent_proto::DISK_BLOCK;

/// A master with one node: a memory segment and a disk segment of its own.
struct Node {
    svc: Arc<MasterService>,
    clock: Arc<ManualClock>,
    node: ClientId,
    memory: SegmentSpec,
    disk: SegmentSpec,
    writer: ClientId,
    /// Each object's key by the offset of its memory replica (what an offload task names).
    keys: std::cell::RefCell<std::collections::HashMap<u64, String>>,
}

fn node(config: MasterConfig, memory: u64, disk: u64) -> Node {
    let clock = ManualClock::new(Timestamp(1_000_000));
    let svc = Arc::new(MasterService::new(config, clock.clone()).unwrap());
    node_of(svc, clock, memory, disk)
}

/// [`node`] on a given master.
fn node_of(svc: Arc<MasterService>, clock: Arc<ManualClock>, memory: u64, disk: u64) -> Node {
    let node = ClientId::random();
    let memory = spec_on("node0", memory, "host0");
    let disk = SegmentSpec { id: SegmentId::random(), base: 0, size: disk, kind: SegmentKind::Disk, ..memory.clone() };
    svc.mount_segment(node, memory.clone()).unwrap();
    svc.mount_segment(node, disk.clone()).unwrap();
    Node { svc, clock, node, memory, disk, writer: ClientId::random(), keys: Default::default() }
}

/// The checksum a test object is written with.
fn crc_of(key: &str) -> u32 {
    crc32c::crc32c(key.as_bytes())
}

impl Node {
    fn put_with(&self, key: &str, size: u64, config: &ReplicateConfig) {
        let d = self.svc.put_start(self.writer, "", key, size, config).unwrap();
        if let ReplicaLocation::Memory { offset, .. } = d[0].location {
            self.keys.borrow_mut().insert(offset, key.to_owned());
        }
        self.svc.put_end(self.writer, "", key, Some(u64::from(crc_of(key)))).unwrap();
    }

    fn put(&self, key: &str, size: u64) {
        self.put_with(key, size, &ReplicateConfig::default());
    }

    /// Evicts every memory object (offloads where it can).
    fn evict_all(&self) -> crescent_master::eviction::EvictionReport {
        self.svc.evict(EvictionScope::All, EvictionTarget::Fraction { target: 1.0, lower: 1.0 })
    }

    fn poll(&self, done: Vec<DiskTaskResult>) -> Vec<DiskTask> {
        self.svc.disk_tasks(self.node, &done, &[], &[]).unwrap()
    }

    /// The key of the object a task copies.
    fn key_of(&self, t: &DiskTask) -> String {
        self.keys.borrow()[&t.src_offset].clone()
    }

    /// Reports every task done with the bytes its object was written with.
    fn finish(&self, tasks: &[DiskTask]) {
        let done = tasks.iter().map(|t| DiskTaskResult { id: t.id, outcome: Ok(crc_of(&self.key_of(t))) }).collect();
        assert!(self.poll(done).is_empty());
    }

    /// Where the object is readable, looked at without leasing it.
    fn locations(&self, key: &str) -> Result<Vec<ReplicaLocation>, ErrorCode> {
        let stat = self.svc.stat("", key)?;
        Ok(stat.replicas.into_iter().filter(|d| d.status == ReplicaStatus::Complete).map(|d| d.location).collect())
    }

    /// A reader's lookup (leases the object).
    fn read(&self, key: &str) -> Result<Vec<ReplicaLocation>, ErrorCode> {
        self.svc.get_replica_list("", key).map(|r| r.replicas.into_iter().map(|d| d.location).collect())
    }

    fn used(&self, kind: SegmentKind) -> u64 {
        self.svc.pool().usage(kind).used
    }
}

fn on_disk(locations: &[ReplicaLocation]) -> bool {
    matches!(locations, [ReplicaLocation::Disk { .. }])
}

#[test]
fn an_evicted_object_is_copied_to_its_nodes_disk_then_served_from_there() {
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    n.put("k", 10_000);
    let report = n.evict_all();
    assert_eq!((report.offloading, report.objects), (1, 0), "kept, not dropped");
    // Until the copy is done the object stays in memory, readable there.
    assert!(matches!(n.locations("k").unwrap()[..], [ReplicaLocation::Memory { .. }]));
    let tasks = n.poll(vec![]);
    assert_eq!(tasks.len(), 1, "one copy for the node");
    let t = &tasks[0];
    assert_eq!((t.kind, t.src, t.dst, t.length), (DiskTaskKind::Offload, n.memory.id, n.disk.id, 10_000));
    assert_eq!(t.dst_offset % BLOCK, 0, "disk ranges are whole blocks");
    assert!(t.deadline_unix_ms > crescent_net::grant::unix_ms());
    assert!(n.poll(vec![]).is_empty(), "a task is handed out once");
    n.finish(&tasks);
    let locs = n.locations("k").unwrap();
    assert!(on_disk(&locs), "{locs:?}");
    assert_eq!(n.used(SegmentKind::Memory), 0, "the memory replica went");
    assert_eq!(n.used(SegmentKind::Disk), 12_288, "three blocks");
    let stat = n.svc.stat("", "k").unwrap();
    assert_eq!((stat.size, stat.checksum), (10_000, Some(u64::from(crc_of("k")))));
    let m = n.svc.disk_tier().metrics();
    assert_eq!(m.offloads_done.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(n.svc.disk_tier().segment_stats(n.disk.id).objects, 1);
    // A repeated report (a retried poll) changes nothing.
    assert!(n.poll(vec![DiskTaskResult { id: t.id, outcome: Ok(crc_of("k")) }]).is_empty());
    assert!(on_disk(&n.locations("k").unwrap()));
}

#[test]
fn only_the_node_given_a_task_may_end_it() {
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    n.put("k", 4096);
    n.evict_all();
    let tasks = n.poll(vec![]);
    let stranger = ClientId::random();
    let forged = [DiskTaskResult { id: tasks[0].id, outcome: Ok(crc_of("k")) }];
    assert!(n.svc.disk_tasks(stranger, &forged, &[], &[]).unwrap().is_empty());
    assert!(matches!(n.locations("k").unwrap()[..], [ReplicaLocation::Memory { .. }]), "still in memory");
    n.finish(&tasks);
    assert!(on_disk(&n.locations("k").unwrap()));
}

#[test]
fn a_copy_that_failed_or_does_not_match_leaves_the_object_in_memory() {
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    n.put("a", 8192);
    n.put("b", 8192);
    n.evict_all();
    let tasks = n.poll(vec![]);
    assert_eq!(tasks.len(), 2);
    let done = vec![
        DiskTaskResult { id: tasks[0].id, outcome: Err(ErrorCode::TransferFail) },
        DiskTaskResult { id: tasks[1].id, outcome: Ok(0xBAD) },
    ];
    assert!(n.poll(done).is_empty());
    for k in ["a", "b"] {
        assert!(matches!(n.locations(k).unwrap()[..], [ReplicaLocation::Memory { .. }]), "{k} stays in memory");
    }
    let m = n.svc.disk_tier().metrics();
    assert_eq!(m.offloads_failed.load(std::sync::atomic::Ordering::Relaxed), 2);
    // Two failures are not a failing disk: the next eviction tries again; a third in a row is.
    let report = n.evict_all();
    assert_eq!((report.offloading, report.objects), (2, 0));
    let tasks = n.poll(vec![]);
    let failed = tasks.iter().map(|t| DiskTaskResult { id: t.id, outcome: Err(ErrorCode::FileWriteFail) }).collect();
    assert!(n.poll(failed).is_empty());
    // A failing disk is avoided for a while: the next eviction drops the objects.
    let report = n.evict_all();
    assert_eq!((report.offloading, report.objects), (0, 2));
    assert_eq!(n.locations("a").unwrap_err(), ErrorCode::ObjectNotFound);
}

#[test]
fn a_full_disk_evicts_its_oldest_replicas_first() {
    // Room for three 3-block objects.
    let n = node(MasterConfig::default(), 64 * MIB, 9 * BLOCK);
    for k in ["a", "b", "c", "d"] {
        n.put(k, 10_000);
        n.evict_all();
        n.finish(&n.poll(vec![]));
        n.clock.advance(Duration::from_millis(1));
    }
    assert_eq!(n.locations("a").unwrap_err(), ErrorCode::ObjectNotFound, "the oldest went to make room");
    for k in ["b", "c", "d"] {
        assert!(on_disk(&n.locations(k).unwrap()), "{k} is kept");
    }
    assert_eq!(n.svc.disk_tier().segment_stats(n.disk.id).evictions, 1);
    assert_eq!(n.used(SegmentKind::Disk), 9 * BLOCK);
}

#[test]
fn a_disk_replica_being_read_is_not_evicted_for_room() {
    // (A read would also bring `a` back to memory: not here.)
    let n = node(MasterConfig { disk_promotion: false, ..MasterConfig::default() }, 64 * MIB, 6 * BLOCK);
    for k in ["a", "b"] {
        n.put(k, 10_000);
        n.evict_all();
        n.finish(&n.poll(vec![]));
    }
    // A reader leases `a` (the oldest): `b` goes instead.
    assert!(on_disk(&n.read("a").unwrap()));
    n.put("c", 10_000);
    n.evict_all();
    n.finish(&n.poll(vec![]));
    assert!(on_disk(&n.locations("a").unwrap()), "leased: kept");
    assert_eq!(n.locations("b").unwrap_err(), ErrorCode::ObjectNotFound);
    assert!(on_disk(&n.locations("c").unwrap()));
}

#[test]
fn an_object_too_large_for_the_disk_is_dropped_as_before() {
    let n = node(MasterConfig::default(), 64 * MIB, 4 * BLOCK);
    n.put("big", 5 * BLOCK);
    let report = n.evict_all();
    assert_eq!((report.offloading, report.objects), (0, 1));
    assert!(n.poll(vec![]).is_empty());
    assert_eq!(n.locations("big").unwrap_err(), ErrorCode::ObjectNotFound);
}

#[test]
fn an_object_marked_not_worth_keeping_is_dropped() {
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    n.put_with("scratch", 4096, &ReplicateConfig { offload: false, ..ReplicateConfig::default() });
    n.put("keep", 4096);
    let report = n.evict_all();
    assert_eq!((report.offloading, report.objects), (1, 1));
    assert_eq!(n.locations("scratch").unwrap_err(), ErrorCode::ObjectNotFound);
    n.finish(&n.poll(vec![]));
    assert!(on_disk(&n.locations("keep").unwrap()));
}

#[test]
fn a_master_without_the_tier_drops_evicted_objects() {
    let n = node(MasterConfig { disk_offload: false, ..MasterConfig::default() }, 64 * MIB, 64 * MIB);
    n.put("k", 4096);
    assert_eq!(n.evict_all().offloading, 0);
    assert_eq!(n.locations("k").unwrap_err(), ErrorCode::ObjectNotFound);
}

#[test]
fn a_removal_racing_a_copy_wins_and_the_range_stays_held_past_the_task() {
    let config = MasterConfig::default();
    let ttl = Duration::from_millis(config.disk_task_timeout_ms);
    let n = node(config, 64 * MIB, 64 * MIB);
    n.put("k", 4096);
    n.evict_all();
    let tasks = n.poll(vec![]);
    n.svc.remove("", "k", true).unwrap();
    assert_eq!(n.locations("k").unwrap_err(), ErrorCode::ObjectNotFound);
    // The late report changes nothing: the object stays removed.
    n.finish(&tasks);
    assert_eq!(n.locations("k").unwrap_err(), ErrorCode::ObjectNotFound);
    // The node may still be copying into that range until the task's deadline: it is not reused before.
    assert_eq!(n.used(SegmentKind::Disk), BLOCK, "held");
    n.clock.advance(ttl * 3);
    n.put("fresh", 4096);
    n.evict_all();
    let next = n.poll(vec![]);
    assert_eq!(next.len(), 1);
    assert_eq!(n.used(SegmentKind::Disk), BLOCK, "the held range came back once the hold ended");
}

#[test]
fn a_node_that_never_reports_has_its_tasks_expire_and_the_object_stays() {
    let config = MasterConfig::default();
    let ttl = Duration::from_millis(config.disk_task_timeout_ms);
    let n = node(config, 64 * MIB, 64 * MIB);
    n.put("k", 4096);
    n.evict_all();
    assert_eq!(n.poll(vec![]).len(), 1);
    assert_eq!(n.svc.step_disk_tasks(), 0, "not yet");
    n.clock.advance(ttl * 2);
    assert_eq!(n.svc.step_disk_tasks(), 1);
    assert!(matches!(n.locations("k").unwrap()[..], [ReplicaLocation::Memory { .. }]));
    assert_eq!(n.svc.disk_tier().tasks_in_flight(), 0);
}

#[test]
fn an_unreadable_disk_range_drops_its_replica() {
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    n.put("k", 4096);
    n.put("other", 4096);
    n.evict_all();
    let tasks = n.poll(vec![]);
    let keys: Vec<String> = tasks.iter().map(|t| n.key_of(t)).collect();
    n.finish(&tasks);
    let fault = DiskFault { segment: n.disk.id, offset: tasks[0].dst_offset, length: 4096 };
    // Another node cannot report faults on this disk.
    n.svc.disk_tasks(ClientId::random(), &[], &[fault], &[]).unwrap();
    assert!(on_disk(&n.locations(&keys[0]).unwrap()));
    // A reader holds a lease now; the replica goes anyway: its bytes cannot be read.
    assert!(on_disk(&n.read(&keys[0]).unwrap()));
    n.svc.disk_tasks(n.node, &[], &[fault], &[]).unwrap();
    assert_eq!(n.locations(&keys[0]).unwrap_err(), ErrorCode::ObjectNotFound);
    assert!(on_disk(&n.locations(&keys[1]).unwrap()), "the rest of the disk serves on");
    let m = n.svc.disk_tier().metrics();
    assert_eq!(m.disk_faults.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn an_upsert_of_an_object_on_disk_writes_new_memory_buffers() {
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    n.put("k", 4096);
    n.evict_all();
    n.finish(&n.poll(vec![]));
    let d = n.svc.upsert_start(n.writer, "", "k", 4096, &ReplicateConfig::default()).unwrap();
    assert!(d.iter().all(|r| matches!(r.location, ReplicaLocation::Memory { .. })), "{d:?}");
    n.svc.put_end(n.writer, "", "k", Some(7)).unwrap();
    assert!(matches!(n.locations("k").unwrap()[..], [ReplicaLocation::Memory { .. }]));
}

#[test]
fn the_nodes_counters_are_kept_per_disk() {
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    let c = crescent_proto::DiskCounters {
        segment: n.disk.id,
        reads: 5,
        read_bytes: 5 * 4096,
        writes: 2,
        write_bytes: 8192,
        errors: 1,
    };
    n.svc.disk_tasks(n.node, &[], &[], &[c]).unwrap();
    assert_eq!(n.svc.disk_tier().segment_stats(n.disk.id).counters, c);
    // Not another node's disk.
    let other = crescent_proto::DiskCounters { reads: 99, ..c };
    n.svc.disk_tasks(ClientId::random(), &[], &[], &[other]).unwrap();
    assert_eq!(n.svc.disk_tier().segment_stats(n.disk.id).counters, c);
}

#[test]
fn a_disk_segment_must_be_whole_blocks() {
    let clock = ManualClock::new(Timestamp(1));
    let svc = MasterService::new(MasterConfig::default(), clock).unwrap();
    let s = SegmentSpec { kind: SegmentKind::Disk, base: 0, ..spec_on("n", BLOCK + 1, "h") };
    assert_eq!(svc.mount_segment(ClientId::random(), s).unwrap_err(), ErrorCode::InvalidParams);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_replicas_are_logged_and_restored_by_the_next_master() {
    use crescent_ha::kv::{HaKvBackend, MemoryKv};
    use crescent_ha::oplog::WriterConfig;
    use crescent_master::ha::OpLogOptions;
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let options = OpLogOptions { kv, cluster: "disk".into(), writer: WriterConfig::default() };
    let clock = ManualClock::new(Timestamp(1_000_000));
    let svc = Arc::new(MasterService::new(MasterConfig::default(), clock.clone()).unwrap());
    let (log, _) = crescent_master::ha::open(&options, &svc).await.unwrap();
    let n = node_of(svc, clock, 64 * MIB, 64 * MIB);
    n.put("a", 10_000);
    n.put("b", 10_000);
    // One of the two goes to disk, the other stays in memory.
    assert_eq!(n.svc.evict(EvictionScope::All, EvictionTarget::Bytes(1)).offloading, 1);
    n.finish(&n.poll(vec![]));
    let before = [n.locations("a").unwrap(), n.locations("b").unwrap()];
    assert_eq!(before.iter().filter(|l| on_disk(l)).count(), 1, "{before:?}");
    log.stop().await;

    let clock = ManualClock::new(Timestamp(5_000_000));
    let b = Arc::new(MasterService::new(MasterConfig::default(), clock).unwrap());
    let (log_b, report) = crescent_master::ha::open(&options, &b).await.unwrap();
    assert_eq!((report.segments, report.objects), (2, 2));
    // The node comes back (the same instance): its disk replica is served where it was.
    b.remount_segments(n.node, &[n.memory.clone(), n.disk.clone()]).unwrap();
    for (key, before) in ["a", "b"].into_iter().zip(&before) {
        let after: Vec<ReplicaLocation> =
            b.get_replica_list("", key).unwrap().replicas.into_iter().map(|d| d.location).collect();
        assert_eq!(&after, before, "{key}");
        assert_eq!(b.stat("", key).unwrap().checksum, Some(u64::from(crc_of(key))));
    }
    // The restored disk accounts for the range: a new offload lands beside it.
    assert_eq!(b.pool().usage(SegmentKind::Disk).used, 12_288);
    log_b.stop().await;
}

#[test]
fn a_read_of_a_disk_only_object_brings_it_back_to_memory() {
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    n.put("k", 10_000);
    n.evict_all();
    n.finish(&n.poll(vec![]));
    assert!(on_disk(&n.read("k").unwrap()), "served from the disk meanwhile");
    assert!(on_disk(&n.read("k").unwrap()), "one promotion at a time");
    let tasks = n.poll(vec![]);
    assert_eq!(tasks.len(), 1);
    let t = &tasks[0];
    assert_eq!((t.kind, t.src, t.dst, t.length), (DiskTaskKind::Promote, n.disk.id, n.memory.id, 10_000));
    assert_eq!(n.used(SegmentKind::Memory), 10_000, "the range is taken while the node copies");
    assert!(n.poll(vec![DiskTaskResult { id: t.id, outcome: Ok(crc_of("k")) }]).is_empty());
    let locs = n.locations("k").unwrap();
    assert!(matches!(locs[..], [ReplicaLocation::Disk { .. }, ReplicaLocation::Memory { .. }]), "{locs:?}");
    let m = n.svc.disk_tier().metrics();
    assert_eq!(m.promotions_done.load(std::sync::atomic::Ordering::Relaxed), 1);
    // Readers now get the memory replica too; a later eviction only drops it (the disk copy is there).
    n.clock.advance(Duration::from_secs(60));
    let report = n.evict_all();
    assert_eq!((report.objects, report.offloading), (1, 0));
    assert!(on_disk(&n.locations("k").unwrap()));
    assert_eq!(n.used(SegmentKind::Memory), 0);
}

#[test]
fn a_promotion_that_fails_or_finds_the_object_removed_frees_its_range() {
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    for k in ["bad", "gone"] {
        n.put(k, 4096);
    }
    n.evict_all();
    n.finish(&n.poll(vec![]));
    n.read("bad").unwrap();
    n.read("gone").unwrap();
    let tasks = n.poll(vec![]);
    assert_eq!(tasks.len(), 2);
    assert_eq!(n.used(SegmentKind::Memory), 8192);
    n.svc.remove("", "gone", true).unwrap();
    let done = tasks.iter().map(|t| DiskTaskResult { id: t.id, outcome: Ok(0xBAD) }).collect();
    assert!(n.poll(done).is_empty());
    assert_eq!(n.used(SegmentKind::Memory), 0, "both ranges freed");
    assert!(on_disk(&n.locations("bad").unwrap()), "still served from the disk");
    assert_eq!(n.locations("gone").unwrap_err(), ErrorCode::ObjectNotFound);
    let m = n.svc.disk_tier().metrics();
    assert_eq!(m.promotions_failed.load(std::sync::atomic::Ordering::Relaxed), 2);
}

#[test]
fn promotion_is_off_by_the_knob_and_when_memory_is_nearly_full() {
    let n = node(MasterConfig { disk_promotion: false, ..MasterConfig::default() }, 64 * MIB, 64 * MIB);
    n.put("k", 4096);
    n.evict_all();
    n.finish(&n.poll(vec![]));
    n.read("k").unwrap();
    assert!(n.poll(vec![]).is_empty(), "off");
    // Below the eviction watermark (0.875 of memory used, the watermark 0.9) a read promotes, as the original
    // does; once memory is at or above it (here after that promotion), none.
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    n.put("k", 4 * MIB);
    n.put("j", 4096);
    n.evict_all();
    n.finish(&n.poll(vec![]));
    n.put("filler", 56 * MIB);
    n.read("k").unwrap();
    let tasks = n.poll(vec![]);
    assert_eq!(tasks.len(), 1, "0.875 used: promoted");
    assert!(n.poll(vec![DiskTaskResult { id: tasks[0].id, outcome: Ok(crc_of("k")) }]).is_empty());
    assert_eq!(n.used(SegmentKind::Memory), 60 * MIB, "0.94 used now");
    n.read("j").unwrap();
    assert!(n.poll(vec![]).is_empty(), "above the watermark: no promotion");
}

#[test]
fn disk_replicas_survive_a_snapshot_round_trip() {
    use crescent_master::snapshot::{self, MasterSnapshotView, SnapshotMetadata};
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    n.put("k", 10_000);
    n.evict_all();
    n.finish(&n.poll(vec![]));
    let before = n.locations("k").unwrap();
    assert!(on_disk(&before));
    // A snapshot's position names a batch and the last sequence in it (here a made-up one: no log).
    let mut state = n.svc.metadata_view();
    state.last_seq = 1;
    let meta = SnapshotMetadata { state, batch_id: 1, producer_view: 1 };
    let bytes = snapshot::encode(&MasterSnapshotView { metadata: Some(meta), ..MasterSnapshotView::default() });
    let decoded = snapshot::decode(&bytes).unwrap();
    let state = decoded.metadata.unwrap().state;
    let b = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(9_000_000))).unwrap();
    assert_eq!(b.restore_replayed(&state).unwrap(), (1, 2), "the object, both segments");
    b.remount_segments(n.node, &[n.memory.clone(), n.disk.clone()]).unwrap();
    let after: Vec<ReplicaLocation> =
        b.get_replica_list("", "k").unwrap().replicas.into_iter().map(|d| d.location).collect();
    assert_eq!(after, before);
    assert_eq!(b.pool().usage(SegmentKind::Disk).used, 12_288);
}

#[test]
fn unmounting_a_disk_ends_its_copies_at_once() {
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    n.put("k", 4096);
    n.evict_all();
    assert_eq!(n.svc.disk_tier().tasks_in_flight(), 1);
    n.svc.unmount_segment(n.disk.id).unwrap();
    // Not left to expire (its pending free would hold the watermark loop back meanwhile).
    assert_eq!(n.svc.disk_tier().tasks_in_flight(), 0);
    assert!(n.poll(vec![]).is_empty(), "nothing left to hand out");
    assert!(matches!(n.locations("k").unwrap()[..], [ReplicaLocation::Memory { .. }]), "still in memory");
    assert_eq!(n.evict_all().objects, 1, "a round evicts it again, and drops it: no disk left");
}

fn grouped(g: &str) -> ReplicateConfig {
    ReplicateConfig { group_id: Some(g.to_owned()), ..ReplicateConfig::default() }
}

fn not_kept() -> ReplicateConfig {
    ReplicateConfig { offload: false, ..ReplicateConfig::default() }
}

#[test]
fn the_members_of_an_evicted_group_go_to_disk_too() {
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    for k in ["g1", "g2", "g3"] {
        n.put_with(k, 10_000, &grouped("G"));
    }
    let report = n.evict_all();
    assert_eq!((report.offloading, report.objects), (3, 0), "kept, not dropped");
    let tasks = n.poll(vec![]);
    assert_eq!(tasks.len(), 3, "one copy per member");
    n.finish(&tasks);
    for k in ["g1", "g2", "g3"] {
        assert!(on_disk(&n.locations(k).unwrap()), "{k}");
    }
    assert_eq!(n.used(SegmentKind::Memory), 0);
    // Still one group: removing it takes every member off the disk.
    assert_eq!(n.svc.remove_group("", "G", false).unwrap(), 3);
    assert_eq!(n.used(SegmentKind::Disk), 0);
}

#[test]
fn a_group_makes_room_on_the_disk_for_all_of_its_members_at_once() {
    // Room for three 3-block objects, all taken.
    let n = node(MasterConfig::default(), 64 * MIB, 9 * BLOCK);
    for k in ["a", "b", "c"] {
        n.put(k, 10_000);
        n.evict_all();
        n.finish(&n.poll(vec![]));
        n.clock.advance(Duration::from_millis(1));
    }
    n.put_with("g1", 10_000, &grouped("G"));
    n.put_with("g2", 10_000, &grouped("G"));
    // Both members need room: the two oldest go (made member by member, the second would have found none).
    let report = n.evict_all();
    assert_eq!((report.offloading, report.objects), (2, 0));
    n.finish(&n.poll(vec![]));
    for k in ["a", "b"] {
        assert_eq!(n.locations(k).unwrap_err(), ErrorCode::ObjectNotFound, "{k}");
    }
    for k in ["c", "g1", "g2"] {
        assert!(on_disk(&n.locations(k).unwrap()), "{k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_marked_not_worth_keeping_is_still_dropped_after_a_failover() {
    use crescent_ha::kv::{HaKvBackend, MemoryKv};
    use crescent_ha::oplog::WriterConfig;
    use crescent_master::ha::OpLogOptions;
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let options = OpLogOptions { kv, cluster: "no-offload".into(), writer: WriterConfig::default() };
    let clock = ManualClock::new(Timestamp(1_000_000));
    let svc = Arc::new(MasterService::new(MasterConfig::default(), clock.clone()).unwrap());
    let (log, _) = crescent_master::ha::open(&options, &svc).await.unwrap();
    let n = node_of(svc, clock, 64 * MIB, 64 * MIB);
    n.put_with("scratch", 4096, &not_kept());
    n.put("keep", 4096);
    log.stop().await;

    // The next master learns both from the log, the switch included.
    let b = Arc::new(MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(5_000_000))).unwrap());
    let (log_b, report) = crescent_master::ha::open(&options, &b).await.unwrap();
    assert_eq!(report.objects, 2);
    b.remount_segments(n.node, &[n.memory.clone(), n.disk.clone()]).unwrap();
    let report = b.evict(EvictionScope::All, EvictionTarget::Fraction { target: 1.0, lower: 1.0 });
    assert_eq!((report.offloading, report.objects), (1, 1), "keep is copied, scratch dropped");
    assert_eq!(b.stat("", "scratch").unwrap_err(), ErrorCode::ObjectNotFound);
    log_b.stop().await;
}

#[test]
fn an_object_marked_not_worth_keeping_is_still_dropped_after_a_snapshot_restore() {
    use crescent_master::snapshot::{self, MasterSnapshotView, SnapshotMetadata};
    let n = node(MasterConfig::default(), 64 * MIB, 64 * MIB);
    n.put_with("scratch", 4096, &not_kept());
    n.put("keep", 4096);
    let mut state = n.svc.metadata_view();
    state.last_seq = 1;
    let meta = SnapshotMetadata { state, batch_id: 1, producer_view: 1 };
    let bytes = snapshot::encode(&MasterSnapshotView { metadata: Some(meta), ..MasterSnapshotView::default() });
    let state = snapshot::decode(&bytes).unwrap().metadata.unwrap().state;
    let b = MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(9_000_000))).unwrap();
    assert_eq!(b.restore_replayed(&state).unwrap(), (2, 2));
    b.remount_segments(n.node, &[n.memory.clone(), n.disk.clone()]).unwrap();
    let report = b.evict(EvictionScope::All, EvictionTarget::Fraction { target: 1.0, lower: 1.0 });
    assert_eq!((report.offloading, report.objects), (1, 1), "keep is copied, scratch dropped");
    assert_eq!(b.stat("", "scratch").unwrap_err(), ErrorCode::ObjectNotFound);
}
