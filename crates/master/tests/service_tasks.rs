//! Copy and move tasks and drain jobs, master side: what a node is handed, what its report does (new replicas
//! readable only once the bytes are in and match; a move's source dropped only after, and not under a lease),
//! what a removal, a wrong sum or a silent node does to a task, submission errors as the original's, and a drain
//! from start to `DRAINED` (and to `FAILED` when its node leaves).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{MIB, spec_on};
use crescent_master::clock::{ManualClock, Timestamp};
use crescent_master::service::{MasterConfig, MasterService};
use crescent_proto::{
    ClientId, ErrorCode, JobStatus, ReplicaLocation, ReplicaStatus, ReplicaTask, ReplicaTaskResult, ReplicateConfig,
    SegmentId, SegmentSpec, SegmentStatus, TaskId, TaskKind, TaskStatus,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A master with three nodes `a`, `b`, `c` (one memory segment each).
struct Cluster {
    svc: Arc<MasterService>,
    clock: Arc<ManualClock>,
    nodes: HashMap<&'static str, (ClientId, SegmentSpec)>,
    writer: ClientId,
}

fn crc_of(key: &str) -> u32 {
    crc32c::crc32c(key.as_bytes())
}

fn cluster(config: MasterConfig) -> Cluster {
    let clock = ManualClock::new(Timestamp(1_000_000));
    let svc = Arc::new(MasterService::new(config, clock.clone()).unwrap());
    mounted(svc, clock)
}

/// The three nodes mounted on `svc` (a master that may already have its oplog).
fn mounted(svc: Arc<MasterService>, clock: Arc<ManualClock>) -> Cluster {
    let mut nodes = HashMap::new();
    for name in ["a", "b", "c"] {
        let node = ClientId::random();
        let spec = spec_on(name, 64 * MIB, &format!("host-{name}"));
        svc.mount_segment(node, spec.clone()).unwrap();
        nodes.insert(name, (node, spec));
    }
    Cluster { svc, clock, nodes, writer: ClientId::random() }
}

impl Cluster {
    fn node(&self, name: &str) -> ClientId {
        self.nodes[name].0
    }

    fn segment(&self, name: &str) -> SegmentId {
        self.nodes[name].1.id
    }

    /// Writes `key` (its checksum: the crc of the key's bytes) on node `on`.
    fn put_on(&self, key: &str, size: u64, on: &str) {
        let config = ReplicateConfig { preferred_segments: vec![on.into()], ..ReplicateConfig::default() };
        self.svc.put_start(self.writer, "", key, size, &config).unwrap();
        self.svc.put_end(self.writer, "", key, Some(u64::from(crc_of(key)))).unwrap();
    }

    /// The names of the segments holding a readable replica of `key`, looked at without leasing it.
    fn holders(&self, key: &str) -> Vec<String> {
        let stat = self.svc.stat("", key).unwrap();
        let mut names: Vec<String> = stat
            .replicas
            .iter()
            .filter(|d| d.status == ReplicaStatus::Complete)
            .map(|d| match &d.location {
                ReplicaLocation::Memory { segment_id, .. } => {
                    let (name, _) = self.nodes.iter().find(|(_, (_, s))| s.id == *segment_id).unwrap();
                    (*name).to_owned()
                }
                other => panic!("unexpected location {other:?}"),
            })
            .collect();
        names.sort();
        names
    }

    fn poll(&self, node: &str, done: Vec<ReplicaTaskResult>) -> Vec<ReplicaTask> {
        self.svc.replica_tasks(self.node(node), &done)
    }

    fn status(&self, id: TaskId) -> TaskStatus {
        self.svc.query_task(id).unwrap().status
    }

    fn used(&self, name: &str) -> u64 {
        self.svc.pool().segment(self.segment(name)).unwrap().usage.used
    }
}

fn ok(t: &ReplicaTask, key: &str) -> ReplicaTaskResult {
    ReplicaTaskResult { id: t.id, outcome: Ok(crc_of(key)) }
}

#[test]
fn a_copy_is_handed_to_the_source_node_and_counts_only_once_its_bytes_are_in() {
    let c = cluster(MasterConfig::default());
    c.put_on("k", 100_000, "a");
    let id = c.svc.create_copy_task("", "k", &["b".into(), "c".into()]).unwrap();
    let info = c.svc.query_task(id).unwrap();
    assert_eq!((info.kind, info.status, info.assigned_client), (TaskKind::Copy, TaskStatus::Pending, c.node("a")));
    assert!(info.message.is_empty());

    assert!(c.poll("b", vec![]).is_empty(), "a task goes to the node holding the source only");
    let tasks = c.poll("a", vec![]);
    assert_eq!(tasks.len(), 1);
    let t = &tasks[0];
    assert_eq!((t.id, t.src, t.length), (id, c.segment("a"), 100_000));
    let targets: Vec<SegmentId> = t
        .targets
        .iter()
        .map(|d| match d.location {
            ReplicaLocation::Memory { segment_id, length, .. } => {
                assert_eq!(length, 100_000);
                segment_id
            }
            ref other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(targets, [c.segment("b"), c.segment("c")]);
    assert_eq!(c.status(id), TaskStatus::Processing);
    assert!(c.used("b") >= 100_000, "the target range is allocated");
    assert_eq!(c.holders("k"), ["a"], "nothing readable on the targets before the node reports");
    assert!(c.poll("a", vec![]).is_empty(), "handed out once");

    assert!(c.poll("a", vec![ok(t, "k")]).is_empty());
    let info = c.svc.query_task(id).unwrap();
    assert_eq!((info.status, info.message.as_str()), (TaskStatus::Success, "Task completed successfully"));
    assert_eq!(c.holders("k"), ["a", "b", "c"]);
    let read = c.svc.get_replica_list("", "k").unwrap();
    assert_eq!(read.replicas.len(), 3, "readers are handed every copy");
    assert_eq!(c.svc.tasks().metrics().copied_bytes.load(std::sync::atomic::Ordering::Relaxed), 200_000);

    // A copy to where the object already is allocates nothing and succeeds.
    let again = c.svc.create_copy_task("", "k", &["b".into()]).unwrap();
    let node = c.svc.query_task(again).unwrap().assigned_client;
    let tasks = c.svc.replica_tasks(node, &[]);
    assert!(tasks[0].targets.is_empty());
    c.svc.replica_tasks(node, &[ok(&tasks[0], "k")]);
    assert_eq!(c.status(again), TaskStatus::Success);
    assert_eq!(c.holders("k"), ["a", "b", "c"]);
}

#[test]
fn a_move_drops_its_source_only_after_the_copy_and_never_under_a_readers_lease() {
    let c = cluster(MasterConfig::default());
    c.put_on("k", 4096, "a");
    let used_a = c.used("a");
    let id = c.svc.create_move_task("", "k", "a", "b").unwrap();
    assert_eq!(c.svc.query_task(id).unwrap().kind, TaskKind::Move);
    let t = c.poll("a", vec![]).remove(0);
    // A reader leases the object while the node copies.
    c.svc.get_replica_list("", "k").unwrap();
    c.poll("a", vec![ok(&t, "k")]);
    assert_eq!(c.status(id), TaskStatus::Processing, "the source stays while a reader may read it");
    assert_eq!(c.holders("k"), ["a"]);

    c.clock.advance(Duration::from_millis(MasterConfig::default().lease_ttl_ms + 1));
    c.svc.step_replica_tasks();
    assert_eq!(c.status(id), TaskStatus::Success);
    assert_eq!(c.holders("k"), ["b"]);
    assert!(c.used("a") < used_a, "the source's space is freed (no oplog: at once)");
}

#[test]
fn a_copy_of_an_object_removed_or_rewritten_meanwhile_or_with_wrong_bytes_fails_and_frees_its_targets() {
    let c = cluster(MasterConfig::default());
    c.put_on("gone", 8192, "a");
    c.put_on("bad", 8192, "a");
    let gone = c.svc.create_copy_task("", "gone", &["b".into()]).unwrap();
    let bad = c.svc.create_copy_task("", "bad", &["b".into()]).unwrap();
    let tasks = c.poll("a", vec![]);
    assert_eq!(tasks.len(), 2);
    assert!(c.used("b") >= 16384);
    c.svc.remove("", "gone", false).unwrap();
    let gone_t = tasks.iter().find(|t| t.id == gone).unwrap();
    let bad_t = tasks.iter().find(|t| t.id == bad).unwrap();
    c.poll("a", vec![ok(gone_t, "gone"), ReplicaTaskResult { id: bad_t.id, outcome: Ok(crc_of("bad") ^ 1) }]);

    let info = c.svc.query_task(gone).unwrap();
    assert_eq!(info.status, TaskStatus::Failed);
    assert!(info.message.starts_with("OBJECT_NOT_FOUND"), "{}", info.message);
    let info = c.svc.query_task(bad).unwrap();
    assert_eq!(info.status, TaskStatus::Failed);
    assert!(info.message.starts_with("CHECKSUM_MISMATCH"), "{}", info.message);
    assert_eq!(c.holders("bad"), ["a"]);
    assert_eq!(c.used("b"), 0, "the targets are freed once the node says it is done with them");

    // A node that reports a failure ends its task too.
    let t = c.svc.create_copy_task("", "bad", &["c".into()]).unwrap();
    let task = c.poll("a", vec![]).remove(0);
    c.poll("a", vec![ReplicaTaskResult { id: task.id, outcome: Err(ErrorCode::TransferFail) }]);
    let info = c.svc.query_task(t).unwrap();
    assert_eq!(info.status, TaskStatus::Failed);
    assert!(info.message.starts_with("TRANSFER_FAIL"), "{}", info.message);
    // A target that left the cluster meanwhile fails the copy: no replica on a segment that is gone.
    let t = c.svc.create_copy_task("", "bad", &["c".into()]).unwrap();
    let task = c.poll("a", vec![]).remove(0);
    c.svc.unmount_segment(c.segment("c")).unwrap();
    c.poll("a", vec![ok(&task, "bad")]);
    let info = c.svc.query_task(t).unwrap();
    assert!(info.message.starts_with("SEGMENT_NOT_FOUND"), "{}", info.message);
    assert_eq!(c.holders("bad"), ["a"]);
    // Another node cannot end a task that is not its own.
    let t = c.svc.create_copy_task("", "bad", &["b".into()]).unwrap();
    let task = c.poll("a", vec![]).remove(0);
    c.poll("b", vec![ok(&task, "bad")]);
    assert_eq!(c.status(t), TaskStatus::Processing);
}

#[test]
fn a_task_whose_node_never_reports_fails_and_its_ranges_wait_one_more_timeout() {
    let config = MasterConfig { replica_task_timeout_ms: 1000, ..MasterConfig::default() };
    let c = cluster(config);
    c.put_on("k", 8192, "a");
    let id = c.svc.create_copy_task("", "k", &["b".into()]).unwrap();
    let _ = c.poll("a", vec![]);
    c.clock.advance(Duration::from_millis(1999));
    c.svc.step_replica_tasks();
    assert_eq!(c.status(id), TaskStatus::Processing);
    c.clock.advance(Duration::from_millis(2));
    assert_eq!(c.svc.step_replica_tasks(), 1);
    let info = c.svc.query_task(id).unwrap();
    assert_eq!(info.status, TaskStatus::Failed);
    assert!(info.message.contains("did not report in time"), "{}", info.message);
    c.svc.step_discards();
    assert!(c.used("b") >= 8192, "a late copy may still land there: held");
    c.clock.advance(Duration::from_millis(1001));
    c.svc.step_discards();
    assert_eq!(c.used("b"), 0);
    // A late report changes nothing.
    c.poll("a", vec![ReplicaTaskResult { id, outcome: Ok(crc_of("k")) }]);
    assert_eq!(c.holders("k"), ["a"]);

    // A task no node takes ends after the pending timeout.
    let config = MasterConfig { pending_task_timeout_ms: 5000, ..MasterConfig::default() };
    let c = cluster(config);
    c.put_on("k", 8192, "a");
    let id = c.svc.create_copy_task("", "k", &["b".into()]).unwrap();
    c.clock.advance(Duration::from_millis(5001));
    c.svc.step_replica_tasks();
    assert_eq!(c.status(id), TaskStatus::Failed);
    assert!(c.poll("a", vec![]).is_empty(), "an ended task is not handed out");
}

#[test]
fn submissions_fail_as_the_originals_do() {
    let c = cluster(MasterConfig { max_pending_tasks: 2, ..MasterConfig::default() });
    c.put_on("k", 4096, "a");
    let code = |r: Result<TaskId, ErrorCode>| r.unwrap_err();
    assert_eq!(code(c.svc.create_copy_task("", "k", &[])), ErrorCode::InvalidParams, "no target");
    assert_eq!(code(c.svc.create_copy_task("", "nokey", &["b".into()])), ErrorCode::ObjectNotFound);
    assert_eq!(code(c.svc.create_copy_task("", "k", &["nope".into()])), ErrorCode::InvalidParams, "unknown target");
    assert_eq!(code(c.svc.create_move_task("", "k", "b", "b")), ErrorCode::InvalidParams, "same segment");
    assert_eq!(code(c.svc.create_move_task("", "k", "b", "c")), ErrorCode::InvalidParams, "no replica on b");
    assert_eq!(code(c.svc.create_move_task("", "nokey", "a", "b")), ErrorCode::ObjectNotFound);
    assert_eq!(c.svc.query_task(TaskId::random()).unwrap_err(), ErrorCode::TaskNotFound);
    c.svc.create_drain(&["c".into()], &[], 1).unwrap();
    assert_eq!(code(c.svc.create_copy_task("", "k", &["c".into()])), ErrorCode::UnavailableInCurrentStatus);

    c.svc.create_copy_task("", "k", &["b".into()]).unwrap();
    c.svc.create_move_task("", "k", "a", "b").unwrap();
    assert_eq!(code(c.svc.create_copy_task("", "k", &["b".into()])), ErrorCode::TaskPendingLimitExceeded);
}

/// Runs node `a`'s tasks until the drain ends, reporting each copy good with the poll that takes the next ones;
/// returns the job's end state.
fn run_drain(c: &Cluster, job: TaskId, keys: &HashMap<u64, String>, max: usize) -> crescent_proto::DrainInfo {
    let mut done = Vec::new();
    for _ in 0..10_000 {
        c.svc.step_replica_tasks();
        let info = c.svc.query_drain(job).unwrap();
        if info.status.is_final() {
            return info;
        }
        let tasks = c.poll("a", std::mem::take(&mut done));
        assert!(tasks.len() <= max, "at most max_concurrency moves at a time: {}", tasks.len());
        done = tasks.iter().map(|t| ok(t, &keys[&t.src_offset])).collect();
    }
    panic!("the drain never ended");
}

/// Offsets on node `a` of the keys written there (what a move task names as its source).
fn offsets(c: &Cluster, keys: &[String]) -> HashMap<u64, String> {
    keys.iter()
        .map(|k| {
            let stat = c.svc.stat("", k).unwrap();
            let off = stat
                .replicas
                .iter()
                .find_map(|d| match d.location {
                    ReplicaLocation::Memory { segment_id, offset, .. } if segment_id == c.segment("a") => Some(offset),
                    _ => None,
                })
                .unwrap();
            (off, k.clone())
        })
        .collect()
}

#[test]
fn a_drain_moves_every_replica_off_its_segments_and_leaves_them_drained() {
    let c = cluster(MasterConfig::default());
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    for k in &keys {
        c.put_on(k, 10_000, "a");
    }
    c.put_on("elsewhere", 10_000, "b");
    let by_offset = offsets(&c, &keys);
    let job = c.svc.create_drain(&["a".into()], &[], 4).unwrap();
    assert_eq!(c.svc.create_drain(&["a".into()], &[], 4).unwrap(), job, "draining the same segments again follows it");
    assert_eq!(c.svc.segment_status(c.segment("a")), Ok(SegmentStatus::Draining));
    // No new write lands on a draining segment.
    for i in 0..20 {
        let d = c.svc.put_start(c.writer, "", &format!("new{i}"), 1000, &ReplicateConfig::default()).unwrap();
        assert!(d.iter().all(
            |d| !matches!(d.location, ReplicaLocation::Memory { segment_id, .. } if segment_id == c.segment("a"))
        ));
    }

    let info = run_drain(&c, job, &by_offset, 4);
    assert_eq!(info.status, JobStatus::Succeeded, "{info:?}");
    assert_eq!((info.succeeded, info.failed, info.remaining), (40, 0, 0));
    assert_eq!(info.migrated_bytes, 400_000);
    assert_eq!(info.segments, ["a"]);
    assert_eq!(c.svc.segment_status(c.segment("a")), Ok(SegmentStatus::Drained));
    for k in &keys {
        let holders = c.holders(k);
        assert_eq!(holders.len(), 1);
        assert_ne!(holders[0], "a", "{k} still on the drained segment");
    }
    assert_eq!(c.holders("elsewhere"), ["b"]);
    assert_eq!(c.used("a"), 0, "nothing left on it");

    // Cancelling afterwards puts the segment back in service.
    c.svc.cancel_drain(job).unwrap();
    assert_eq!(c.svc.segment_status(c.segment("a")), Ok(SegmentStatus::Ok));
    assert_eq!(c.svc.query_drain(TaskId::random()).unwrap_err(), ErrorCode::JobNotFound);
}

#[test]
fn a_drain_whose_node_leaves_midway_fails_saying_what_was_not_moved() {
    let c = cluster(MasterConfig::default());
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    for k in &keys {
        c.put_on(k, 10_000, "a");
    }
    let by_offset = offsets(&c, &keys);
    let job = c.svc.create_drain(&["a".into()], &["b".into()], 2).unwrap();
    c.svc.step_replica_tasks();
    let tasks = c.poll("a", vec![]);
    assert_eq!(tasks.len(), 2);
    // The report's poll takes the next two: a move that ends starts the next at once.
    let more = c.poll("a", tasks.iter().map(|t| ok(t, &by_offset[&t.src_offset])).collect());
    assert_eq!(more.len(), 2, "two more under way when the node goes");

    c.svc.unmount_segment(c.segment("a")).unwrap();
    c.svc.step_replica_tasks();
    let info = c.svc.query_drain(job).unwrap();
    assert_eq!(info.status, JobStatus::Failed, "{info:?}");
    assert_eq!(info.succeeded, 2);
    assert!(info.message.contains("left the cluster"), "{}", info.message);
    assert_eq!(info.failed, 8, "the two under way and the six queued: {info:?}");
    // What was moved is whole on its target; the rest went with the node.
    let moved: Vec<&String> = keys.iter().filter(|k| c.svc.stat("", k).is_ok()).collect();
    assert_eq!(moved.len(), 2);
    for k in moved {
        assert_eq!(c.holders(k), ["b"]);
    }
    for t in &more {
        assert_eq!(c.status(t.id), TaskStatus::Failed);
    }
}

#[test]
fn a_drain_waits_while_its_node_is_unreachable_and_keeps_it_out_of_placement_when_it_is_back() {
    let c = cluster(MasterConfig::default());
    let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    for k in &keys {
        c.put_on(k, 10_000, "a");
    }
    let by_offset = offsets(&c, &keys);
    let job = c.svc.create_drain(&["a".into()], &[], 2).unwrap();
    // Node a misses its TTL while b and c ping: its segment is cut off (kept for it to come back).
    c.clock.advance(Duration::from_millis(MasterConfig::default().client_ttl_ms + 1));
    c.svc.ping(c.node("b"));
    c.svc.ping(c.node("c"));
    c.svc.step_liveness();
    assert_eq!(c.svc.segment_status(c.segment("a")), Ok(SegmentStatus::Disconnected));
    c.svc.step_replica_tasks();
    assert!(c.poll("a", vec![]).is_empty(), "no move from a node nobody can reach");
    let info = c.svc.query_drain(job).unwrap();
    assert_eq!(info.status, JobStatus::Created);
    assert!(info.message.contains("unreachable"), "{}", info.message);

    // Its remount brings it back still out of placement (the drain holds it), and the drain goes on.
    c.svc.remount_segments(c.node("a"), std::slice::from_ref(&c.nodes["a"].1)).unwrap();
    assert_eq!(c.svc.segment_status(c.segment("a")), Ok(SegmentStatus::Draining));
    let info = run_drain(&c, job, &by_offset, 2);
    assert_eq!((info.status, info.succeeded), (JobStatus::Succeeded, 6), "{info:?}");
    assert_eq!(c.svc.segment_status(c.segment("a")), Ok(SegmentStatus::Drained));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logged_move_frees_its_source_once_durable_and_a_stopped_log_fails_the_task() {
    use crescent_ha::kv::{HaKvBackend, MemoryKv};
    use crescent_ha::oplog::WriterConfig;
    use crescent_master::ha::OpLogOptions;

    let clock = ManualClock::new(Timestamp(1_000_000));
    let svc = Arc::new(MasterService::new(MasterConfig::default(), clock.clone()).unwrap());
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let options = OpLogOptions { kv, cluster: "tasks".into(), writer: WriterConfig::default() };
    let (log, _) = crescent_master::ha::open(&options, &svc).await.unwrap();
    let c = mounted(svc, clock);
    c.put_on("k", 8192, "a");
    c.put_on("j", 8192, "a");
    let id = c.svc.create_move_task("", "k", "a", "b").unwrap();
    let t = c.poll("a", vec![]).remove(0);
    c.poll("a", vec![ok(&t, "k")]);
    assert_eq!(c.status(id), TaskStatus::Success);
    assert_eq!(c.holders("k"), ["b"]);
    // The source's space comes back once the PUT_END of what is left is durable.
    assert!(crescent_testkit::eventually(Duration::from_secs(20), || async { c.used("a") < 2 * 8192 }).await);

    // A log that takes no more entries: the copy lands nowhere, and the task says why.
    let id = c.svc.create_copy_task("", "j", &["c".into()]).unwrap();
    let t = c.poll("a", vec![]).remove(0);
    log.stop().await;
    c.poll("a", vec![ok(&t, "j")]);
    let info = c.svc.query_task(id).unwrap();
    assert_eq!(info.status, TaskStatus::Failed);
    assert!(info.message.contains("the log"), "{}", info.message);
    assert_eq!(c.holders("j"), ["a"]);
}

/// A log in memory, for masters restarted on it.
fn memory_log() -> crescent_master::ha::OpLogOptions {
    let kv: Arc<dyn crescent_ha::kv::HaKvBackend> = Arc::new(crescent_ha::kv::MemoryKv::new());
    let writer = crescent_ha::oplog::WriterConfig::default();
    crescent_master::ha::OpLogOptions { kv, cluster: "drains".into(), writer }
}

/// A master on `options`' log (replaying what it holds) with `nodes` (mounted on the first, remounted by their
/// owners after a restart).
async fn on_log(
    options: &crescent_master::ha::OpLogOptions,
    nodes: Option<&HashMap<&'static str, (ClientId, SegmentSpec)>>,
) -> (Cluster, Arc<crescent_master::ha::OpLog>) {
    let clock = ManualClock::new(Timestamp(1_000_000));
    let svc = Arc::new(MasterService::new(MasterConfig::default(), clock.clone()).unwrap());
    let (log, _) = crescent_master::ha::open(options, &svc).await.unwrap();
    let c = match nodes {
        None => mounted(svc, clock),
        Some(nodes) => Cluster { svc, clock, nodes: nodes.clone(), writer: ClientId::random() },
    };
    (c, log)
}

/// A drain is in the log: a master restarted midway takes it over (its segment comes back out of placement,
/// held through the remount), finishes it, and a master restarted after that still answers for it, as it does
/// for a cancelled one, whose segment is back in service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_master_takes_a_running_drain_over_and_answers_for_ended_ones() {
    let options = memory_log();
    let (a, log) = on_log(&options, None).await;
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    for k in &keys {
        a.put_on(k, 10_000, "a");
    }
    let by_offset = offsets(&a, &keys);
    let cancelled = a.svc.create_drain(&["c".into()], &[], 1).unwrap();
    a.svc.cancel_drain(cancelled).unwrap();
    let job = a.svc.create_drain(&["a".into()], &["b".into()], 2).unwrap();
    a.svc.step_replica_tasks();
    // Two moves done, two more handed to the node when the master stops.
    let first = a.poll("a", vec![]);
    let in_flight = a.poll("a", first.iter().map(|t| ok(t, &by_offset[&t.src_offset])).collect());
    assert_eq!(in_flight.len(), 2);
    a.svc.step_replica_tasks();
    let before = a.svc.query_drain(job).unwrap();
    assert_eq!((before.status, before.succeeded), (JobStatus::Running, 2), "{before:?}");
    log.stop().await;

    let (b, log) = on_log(&options, Some(&a.nodes)).await;
    let taken = b.svc.query_drain(job).unwrap();
    assert_eq!((taken.status, taken.segments.as_slice()), (JobStatus::Running, &["a".to_owned()][..]));
    assert!(taken.message.contains("taken over"), "{}", taken.message);
    assert_eq!(b.svc.query_drain(cancelled).unwrap().status, JobStatus::Canceled);
    for name in ["a", "b", "c"] {
        assert_eq!(b.svc.segment_status(b.segment(name)), Ok(SegmentStatus::Disconnected), "{name}");
        b.svc.remount_segments(b.node(name), std::slice::from_ref(&b.nodes[name].1)).unwrap();
    }
    assert_eq!(b.svc.segment_status(b.segment("a")), Ok(SegmentStatus::Draining), "held through the remount");
    assert_eq!(b.svc.segment_status(b.segment("c")), Ok(SegmentStatus::Ok), "its drain was cancelled");
    for i in 0..10 {
        let d = b.svc.put_start(b.writer, "", &format!("new{i}"), 1000, &ReplicateConfig::default()).unwrap();
        assert!(d.iter().all(
            |d| !matches!(d.location, ReplicaLocation::Memory { segment_id, .. } if segment_id == b.segment("a"))
        ));
    }
    // The old master's moves are unknown here: their reports change nothing.
    assert!(b.poll("a", in_flight.iter().map(|t| ok(t, &by_offset[&t.src_offset])).collect()).is_empty());
    // The new master's offsets on `a` are the old one's (replayed): the same keys.
    let info = run_drain(&b, job, &by_offset, 2);
    assert_eq!(info.status, JobStatus::Succeeded, "{info:?}");
    assert_eq!(info.succeeded, 12, "the logged 2 and the 10 left: {info:?}");
    for k in &keys {
        assert_eq!(b.holders(k), ["b"], "{k}");
    }
    assert_eq!(b.svc.segment_status(b.segment("a")), Ok(SegmentStatus::Drained));
    let logged = b.svc.metadata_view().drains;
    assert_eq!(logged.len(), 2);
    log.stop().await;

    let (c, log) = on_log(&options, Some(&a.nodes)).await;
    let again = c.svc.query_drain(job).unwrap();
    assert_eq!((again.status, again.succeeded, again.migrated_bytes), (JobStatus::Succeeded, 12, 120_000));
    assert_eq!(c.svc.metadata_view().drains, logged, "the replay holds what the master logged");
    c.svc.remount_segments(c.node("a"), std::slice::from_ref(&c.nodes["a"].1)).unwrap();
    assert_eq!(c.svc.segment_status(c.segment("a")), Ok(SegmentStatus::Drained), "still awaiting its unmount");
    log.stop().await;
}

/// Segment statuses after a restart are those the last drain naming each segment left, as on the leader: a
/// succeeded then cancelled job's segment drained again by a newer job is held Draining (not Drained), and a job
/// failed by a segment that left puts its other segment back in service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_leaves_each_segment_as_the_last_drain_naming_it_did() {
    let options = memory_log();
    let (a, log) = on_log(&options, None).await;
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    for k in &keys {
        a.put_on(k, 10_000, "a");
    }
    let by_offset = offsets(&a, &keys);
    let first = a.svc.create_drain(&["a".into()], &[], 2).unwrap();
    assert_eq!(run_drain(&a, first, &by_offset, 2).status, JobStatus::Succeeded);
    a.svc.cancel_drain(first).unwrap();
    let second = a.svc.create_drain(&["a".into()], &[], 2).unwrap();
    let failed = a.svc.create_drain(&["b".into(), "c".into()], &[], 1).unwrap();
    a.svc.unmount_segment(a.segment("c")).unwrap();
    // Gone once its unmount is durable.
    let gone = || async { a.svc.segment_status(a.segment("c")) == Err(ErrorCode::SegmentNotFound) };
    assert!(crescent_testkit::eventually(Duration::from_secs(20), gone).await, "c never left");
    a.svc.step_replica_tasks();
    let live = |c: &Cluster| {
        let jobs = [first, second, failed].map(|j| c.svc.query_drain(j).unwrap().status);
        let segments = ["a", "b"].map(|s| c.svc.segment_status(c.segment(s)).unwrap());
        (jobs, segments)
    };
    let want =
        ([JobStatus::Canceled, JobStatus::Running, JobStatus::Failed], [SegmentStatus::Draining, SegmentStatus::Ok]);
    let (jobs, segments) = live(&a);
    assert_eq!(jobs[0], want.0[0]);
    assert!(matches!(jobs[1], JobStatus::Created | JobStatus::Running), "{jobs:?}");
    assert_eq!((jobs[2], segments), (want.0[2], want.1), "the failed job's other segment is back in service");
    log.stop().await;

    let (b, log) = on_log(&options, Some(&a.nodes)).await;
    for name in ["a", "b"] {
        b.svc.remount_segments(b.node(name), std::slice::from_ref(&b.nodes[name].1)).unwrap();
    }
    let (jobs, segments) = live(&b);
    assert_eq!((jobs[0], jobs[2], segments), (want.0[0], want.0[2], want.1), "as the leader left them");
    assert!(matches!(jobs[1], JobStatus::Created | JobStatus::Running), "{jobs:?}");
    log.stop().await;
}

/// A drain the log cannot take is neither started nor cancelled: the caller is told (`PERSISTENT_FAIL`) and
/// nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_change_the_log_refuses_changes_nothing() {
    let options = memory_log();
    let (a, log) = on_log(&options, None).await;
    let job = a.svc.create_drain(&["a".into()], &[], 1).unwrap();
    log.stop().await;
    assert_eq!(a.svc.cancel_drain(job).unwrap_err(), ErrorCode::PersistentFail);
    assert_eq!(a.svc.query_drain(job).unwrap().status, JobStatus::Created);
    assert_eq!(a.svc.segment_status(a.segment("a")), Ok(SegmentStatus::Draining));
    assert_eq!(a.svc.create_drain(&["b".into()], &[], 1).unwrap_err(), ErrorCode::PersistentFail);
    assert_eq!(a.svc.segment_status(a.segment("b")), Ok(SegmentStatus::Ok));
}
