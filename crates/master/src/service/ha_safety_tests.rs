//! The log never disagrees with the primary: interleavings that once logged a change on the wrong side of
//! another, replayed deterministically through test hooks, and a master reopened on the log must hold exactly
//! the primary's metadata.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::clock::{ManualClock, Timestamp};
use crate::eviction::{EvictionScope, EvictionTarget};
use crate::ha::{OpLog, OpLogOptions, ReplayState};
use crate::metadata::Tier;
use crate::service::{MasterConfig, MasterService};
use crate::test_hooks;
use crescent_ha::kv::{HaKvBackend, MemoryKv};
use crescent_ha::oplog::WriterConfig;
use crescent_proto::{ClientId, ErrorCode, ReplicateConfig, SegmentKind, SegmentSpec};
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn options(kv: &Arc<dyn HaKvBackend>) -> OpLogOptions {
    OpLogOptions { kv: Arc::clone(kv), cluster: "safety".into(), writer: WriterConfig::default() }
}

fn fresh() -> Arc<MasterService> {
    Arc::new(MasterService::new(MasterConfig::default(), ManualClock::new(Timestamp(1_000_000))).unwrap())
}

/// A master with an oplog over `kv`.
async fn logged(kv: &Arc<dyn HaKvBackend>) -> (Arc<MasterService>, Arc<OpLog>) {
    let svc = fresh();
    let (log, _) = crate::ha::open(&options(kv), &svc).await.unwrap();
    (svc, log)
}

/// What a master reopened on `kv`'s log holds (the primary's log drained first).
async fn replayed(kv: &Arc<dyn HaKvBackend>, log: &OpLog) -> ReplayState {
    let seq = log.last_committed();
    log.wait_durable(seq, Duration::from_secs(20)).await.unwrap();
    log.stop().await;
    let b = fresh();
    let (log_b, _) = crate::ha::open(&options(kv), &b).await.unwrap();
    log_b.stop().await;
    comparable(b.metadata_view())
}

fn comparable(mut s: ReplayState) -> ReplayState {
    s.objects.clear_soft_pins();
    s.last_seq = 0;
    s
}

fn nof(name: &str) -> SegmentSpec {
    let mut s = crescent_testkit::segment_on(name, 16 * MIB, "nof-host");
    s.kind = SegmentKind::Nof;
    s.endpoint = "127.0.0.1:9999".into();
    s
}

/// An eviction strips an object's memory replica and logs what is left (its NoF replica); a removal that takes
/// the object's lock the moment the eviction lets go of it must be logged after the eviction, or the log ends
/// with the object alive (pointing at space the primary freed) while the primary removed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_right_after_an_eviction_is_logged_after_it() {
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let (svc, log) = logged(&kv).await;
    svc.mount_segment(ClientId::random(), crescent_testkit::segment("mem", 16 * MIB)).unwrap();
    svc.mount_segment(ClientId::random(), nof("nof")).unwrap();
    let w = ClientId::random();
    let both = ReplicateConfig { nof_replica_num: 1, ..ReplicateConfig::default() };
    svc.put_start(w, "", "k", 4096, &both).unwrap();
    svc.put_end(w, "", "k", Some(7)).unwrap();
    let remover = Arc::clone(&svc);
    let removed = Arc::new(parking_lot::Mutex::new(None));
    let seen = Arc::clone(&removed);
    test_hooks::set_after_eviction_unlock(move || *seen.lock() = Some(remover.remove("", "k", true)));
    let report = svc.evict_in(Tier::Memory, EvictionScope::All, EvictionTarget::Fraction { target: 1.0, lower: 1.0 });
    assert_eq!(report.objects, 1, "the memory replica was evicted");
    assert_eq!(*removed.lock(), Some(Ok(())), "the removal ran inside the eviction's window");
    assert_eq!(svc.get_replica_list("", "k").unwrap_err(), ErrorCode::ObjectNotFound);
    let primary = comparable(svc.metadata_view());
    assert!(primary.objects.is_empty());
    assert_eq!(replayed(&kv, &log).await.objects, primary.objects, "the log ends with the object removed");
}

/// An unmount takes the segment out of the pool; its owner (alive, its memory intact) remounting the same segment
/// id must wait until the UNMOUNT is durable: remounted at once, the segment's space went to new objects while a
/// failover before the UNMOUNT would restore the old ones over their bytes (same segment, same offsets). And a
/// remount that comes after is logged after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_is_remounted_only_once_its_unmount_is_durable() {
    use crescent_ha::kv::{Fault, FaultyKv, KvOp};
    use tokio::sync::Semaphore;
    let faulty = Arc::new(FaultyKv::new(MemoryKv::new()));
    let kv: Arc<dyn HaKvBackend> = faulty.clone();
    let (svc, log) = logged(&kv).await;
    let (owner, spec) = (ClientId::random(), crescent_testkit::segment("seg", 16 * MIB));
    svc.mount_segment(owner, spec.clone()).unwrap();
    let w = ClientId::random();
    let one = ReplicateConfig::with_replicas(1);
    svc.put_start(w, "", "old", 4096, &one).unwrap();
    svc.put_end(w, "", "old", Some(1)).unwrap();
    log.wait_durable(log.last_committed(), Duration::from_secs(20)).await.unwrap();
    // The backend holds the next batch: the UNMOUNT is committed, not durable.
    let (entered, release) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    faulty.inject_next(KvOp::Txn, Fault::Block { entered: entered.clone(), release: release.clone() });
    let again = Arc::clone(&svc);
    let early = Arc::new(parking_lot::Mutex::new(None));
    let seen = Arc::clone(&early);
    let s = spec.clone();
    test_hooks::set_after_unmount(move || *seen.lock() = Some(again.remount_segments(owner, std::slice::from_ref(&s))));
    svc.unmount_segment(spec.id).unwrap();
    entered.acquire().await.unwrap().forget();
    assert_eq!(*early.lock(), Some(Err(ErrorCode::UnavailableInCurrentStatus)), "refused inside the unmount's window");
    assert_eq!(
        svc.remount_segments(owner, std::slice::from_ref(&spec)),
        Err(ErrorCode::UnavailableInCurrentStatus),
        "refused while the UNMOUNT is not durable"
    );
    assert!(svc.put_start(w, "", "new", 4096, &one).is_err(), "nothing placed on it meanwhile");
    release.add_permits(1);
    let remounted = crescent_testkit::eventually(Duration::from_secs(20), || async {
        svc.remount_segments(owner, std::slice::from_ref(&spec)).is_ok()
    });
    assert!(remounted.await, "remounted once the UNMOUNT is durable");
    svc.put_start(w, "", "new", 4096, &one).unwrap();
    svc.put_end(w, "", "new", Some(2)).unwrap();
    assert_eq!(svc.get_replica_list("", "old").unwrap_err(), ErrorCode::ObjectNotFound);
    let primary = comparable(svc.metadata_view());
    let replica = replayed(&kv, &log).await;
    assert_eq!(replica.segments.keys().collect::<Vec<_>>(), primary.segments.keys().collect::<Vec<_>>());
    assert_eq!(replica.objects, primary.objects, "the log holds the new object, not the old one");
}

/// A write's End (or an eviction's post-state) can be logged just after the UNMOUNT of a segment it names (the
/// unmount orders itself by the pool's lock, the End by the object's). Replay drops that replica, so a later
/// MOUNT of the same segment does not bring it back over space given to another object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_end_naming_an_unmounted_segment_is_not_revived_by_its_remount() {
    use crate::ha::payload::SegmentRef;
    use crate::ha::{MasterEntry, ObjectRecord, ReplicaRecord, SegmentRecord};
    let kv: Arc<dyn HaKvBackend> = Arc::new(MemoryKv::new());
    let (svc, log) = logged(&kv).await;
    drop(svc);
    let (owner, spec) = (ClientId::random(), crescent_testkit::segment("seg", 16 * MIB));
    let seg = *spec.id.0.as_bytes();
    let object = |id, checksum| ObjectRecord {
        size: 4096,
        replicas: vec![ReplicaRecord { id, segment: seg, offset: 0, length: 4096, tier: 0 }],
        checksum: Some(checksum),
        group: None,
        hard_pinned: false,
        soft_pin_ms: 0,
        data_type: 0,
        no_offload: false,
        writer: None,
    };
    let commit = |e: MasterEntry| log.reserve().unwrap().commit(e, None).unwrap();
    commit(MasterEntry::SegmentMount(SegmentRecord::new(owner, &spec, None)));
    commit(MasterEntry::SegmentUnmount(SegmentRef { id: seg }));
    commit(MasterEntry::PutEnd { tenant: "default".into(), key: "stale".into(), object: object(1, 1) });
    commit(MasterEntry::SegmentMount(SegmentRecord::new(owner, &spec, None)));
    commit(MasterEntry::PutEnd { tenant: "default".into(), key: "real".into(), object: object(2, 2) });
    let state = replayed(&kv, &log).await;
    let keys: Vec<_> = state.objects.iter().map(|o| o.key()).collect();
    assert_eq!(keys, ["real"], "the replica logged after its segment's unmount is gone");
}

/// An upsert of another size frees the old replicas' space; until its REMOVE is durable a failover could still
/// serve the old object from that space, so no other object may be given it before then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upsert_frees_the_old_range_only_once_its_removal_is_durable() {
    use crescent_ha::kv::{Fault, FaultyKv, KvOp};
    use tokio::sync::Semaphore;
    let faulty = Arc::new(FaultyKv::new(MemoryKv::new()));
    let kv: Arc<dyn HaKvBackend> = faulty.clone();
    let (svc, log) = logged(&kv).await;
    svc.mount_segment(ClientId::random(), crescent_testkit::segment("seg", 16 * MIB)).unwrap();
    let w = ClientId::random();
    let one = ReplicateConfig::with_replicas(1);
    svc.put_start(w, "", "k", 64 * 1024, &one).unwrap();
    svc.put_end(w, "", "k", Some(1)).unwrap();
    log.wait_durable(log.last_committed(), Duration::from_secs(20)).await.unwrap();
    let used = || svc.pool().usage(SegmentKind::Memory).used;
    let before = used();
    // The backend holds the next write: the upsert's REMOVE stays committed, not durable.
    let (entered, release) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    faulty.inject_next(KvOp::Txn, Fault::Block { entered: entered.clone(), release: release.clone() });
    svc.upsert_start(w, "", "k", 128 * 1024, &one).unwrap();
    entered.acquire().await.unwrap().forget();
    assert_eq!(svc.step_discards(), 0, "the old range is not released before the REMOVE is durable");
    assert_eq!(used(), before + 128 * 1024, "old and new ranges both held");
    // A revoked in-place rewrite's buffers wait the same way.
    svc.put_start(w, "", "j", 4096, &one).unwrap();
    svc.put_end(w, "", "j", Some(2)).unwrap();
    svc.upsert_start(w, "", "j", 4096, &one).unwrap();
    svc.upsert_revoke(w, "", "j").unwrap();
    assert_eq!(svc.step_discards(), 0, "a revoked rewrite's range waits for its REMOVE too");
    assert_eq!(used(), before + 128 * 1024 + 4096);
    let tenant = svc.tenant_for_tests(&crescent_proto::TenantId::default_tenant());
    assert_eq!(tenant.quota().charged(), (64 + 128) * 1024, "the old value's quota is held with its space");
    release.add_permits(1);
    log.wait_durable(log.last_committed(), Duration::from_secs(20)).await.unwrap();
    assert_eq!(svc.step_discards(), 2, "both released once durable");
    assert_eq!(used(), 128 * 1024);
    assert!(
        crescent_testkit::eventually(Duration::from_secs(20), || async { tenant.quota().charged() == 128 * 1024 })
            .await,
        "and given back once durable"
    );
    log.stop().await;
}

/// An eviction whose record the log refuses after its slot was taken (the writer stopped for good in between)
/// keeps the evicted space out of reuse: the log may still name the object there, so a new object written into
/// that space would be served under the old key after a failover. Leaking it is the safe side.
#[test]
fn an_eviction_the_log_refuses_to_record_frees_nothing() {
    use crate::clock::Timestamp as Ts;
    use crate::eviction::{EvictionLog, PendingFrees};
    use crate::metadata::{ObjectEntry, ObjectState, TenantState};
    struct Refusing;
    impl EvictionLog for Refusing {
        type Slot<'a> = ();
        fn reserve(&self) -> Option<()> {
            Some(())
        }
        fn try_reserve(&self) -> Option<()> {
            Some(())
        }
        fn record(
            &self,
            _slot: (),
            _tenant: &TenantState,
            _entry: &ObjectEntry,
            _st: &ObjectState,
            _now: Ts,
            on_durable: Box<dyn FnOnce(u64) + Send>,
        ) -> bool {
            drop(on_durable);
            false
        }
    }
    let svc = fresh();
    svc.mount_segment(ClientId::random(), crescent_testkit::segment("mem", 16 * MIB)).unwrap();
    let w = ClientId::random();
    svc.put_start(w, "", "k", 4096, &ReplicateConfig::with_replicas(1)).unwrap();
    svc.put_end(w, "", "k", None).unwrap();
    let used = svc.pool().usage(SegmentKind::Memory).used;
    let tenant = svc.tenant_for_tests(&crescent_proto::TenantId::default_tenant());
    let pending = Arc::new(PendingFrees::default());
    let report = crate::eviction::run(
        &[tenant],
        Tier::Memory,
        EvictionTarget::Fraction { target: 1.0, lower: 1.0 },
        Ts(u64::MAX / 2),
        false,
        1024,
        crate::eviction::Outlets { oplog: Some((&Refusing, &pending)), offload: None, events: None },
    );
    assert_eq!(report.objects, 1);
    assert!(!pending.any(), "nothing left waiting");
    assert_eq!(svc.pool().usage(SegmentKind::Memory).used, used, "the evicted space is not given back");
}
