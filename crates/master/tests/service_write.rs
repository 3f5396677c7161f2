//! Write/read/remove behaviours of the master: put-if-absent, upsert, leases, revokes, preempted writers,
//! batch forms, removal and its guards.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use crescent_master::service::{MasterConfig, WriteRef};
use crescent_proto::{
    ClientId, ErrorCode, MAX_KEY_LEN, ReplicaLocation, ReplicaStatus, ReplicateConfig, SoftPinAction, write_id,
};
use std::collections::HashSet;
use std::time::Duration;

fn cfg(n: u32) -> ReplicateConfig {
    ReplicateConfig::with_replicas(n)
}

fn segment_of(d: &crescent_proto::ReplicaDescriptor) -> crescent_proto::SegmentId {
    d.location.segment_id().unwrap()
}

#[test]
fn put_start_rejects_invalid_requests() {
    let h = Harness::default3();
    let w = h.writer;
    let bad = |k: &str, size: u64, c: &ReplicateConfig| h.svc.put_start(w, "", k, size, c).unwrap_err();
    assert_eq!(bad("k", 10, &ReplicateConfig { replica_num: 0, ..cfg(1) }), ErrorCode::InvalidParams);
    assert_eq!(bad("", 10, &cfg(1)), ErrorCode::InvalidParams);
    assert_eq!(bad("k", 0, &cfg(1)), ErrorCode::InvalidParams);
    assert_eq!(bad(&"k".repeat(MAX_KEY_LEN + 1), 10, &cfg(1)), ErrorCode::InvalidKey);
    let ttl_without_enable = ReplicateConfig { soft_pin_ttl_ms: Some(5), ..cfg(1) };
    assert_eq!(bad("k", 10, &ttl_without_enable), ErrorCode::InvalidParams);
    let disable_with_ttl =
        ReplicateConfig { soft_pin_action: SoftPinAction::Disable, soft_pin_ttl_ms: Some(5), ..cfg(1) };
    assert_eq!(bad("k", 10, &disable_with_ttl), ErrorCode::InvalidParams);
    let too_long = ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(h.svc.config().max_soft_pin_ttl_ms + 1),
        ..cfg(1)
    };
    assert_eq!(bad("k", 10, &too_long), ErrorCode::InvalidParams);
    let same_node_nof = ReplicateConfig { prefer_same_node: true, nof_replica_num: 1, ..cfg(1) };
    assert_eq!(bad("k", 10, &same_node_nof), ErrorCode::InvalidParams);
    assert_eq!(h.svc.key_count(None), 0, "nothing was created");
    assert_eq!(h.used(), 0);
}

#[test]
fn put_start_is_best_effort_on_distinct_segments() {
    let h = Harness::default3();
    let d = h.svc.put_start(h.writer, "", "two", 4096, &cfg(2)).unwrap();
    assert_eq!(d.len(), 2);
    assert!(d.iter().all(|r| r.status == ReplicaStatus::Processing));
    assert_ne!(segment_of(&d[0]), segment_of(&d[1]));
    let d = h.svc.put_start(h.writer, "", "five", 4096, &cfg(5)).unwrap();
    let segs: HashSet<_> = d.iter().map(segment_of).collect();
    assert_eq!((d.len(), segs.len()), (3, 3));
    assert_eq!(h.svc.metrics().partial_placements.load(std::sync::atomic::Ordering::Relaxed), 1);
    let empty = Harness::new(MasterConfig::default(), 0, 0);
    assert_eq!(empty.svc.put_start(h.writer, "", "k", 1, &cfg(1)).unwrap_err(), ErrorCode::NoAvailableHandle);
    let small = Harness::new(MasterConfig::default(), 1, MIB);
    assert_eq!(small.svc.put_start(h.writer, "", "k", 2 * MIB, &cfg(1)).unwrap_err(), ErrorCode::NoAvailableHandle);
}

#[test]
fn put_if_absent_and_preemption_of_stale_writes() {
    let h = Harness::default3();
    h.put("done", 100);
    assert_eq!(h.svc.put_start(h.writer, "", "done", 100, &cfg(1)).unwrap_err(), ErrorCode::ObjectAlreadyExists);

    let zombie = ClientId::random();
    let first = h.svc.put_start(zombie, "", "k", MIB, &cfg(1)).unwrap();
    h.advance(Duration::from_secs(29));
    assert_eq!(h.svc.put_start(h.writer, "", "k", MIB, &cfg(1)).unwrap_err(), ErrorCode::ObjectAlreadyExists);
    h.advance(Duration::from_secs(1));
    let second = h.svc.put_start(h.writer, "", "k", MIB, &cfg(1)).unwrap();
    assert_ne!(first[0].location, second[0].location, "fresh buffers");
    // The zombie's buffer stays allocated (it may still be writing) until put_start + 600 s.
    assert_eq!(h.used(), 100 + 2 * MIB);
    assert_eq!(h.svc.discarded_bytes(), MIB);
    assert_eq!(h.svc.put_end(zombie, "", "k", None).unwrap_err(), ErrorCode::IllegalClient);
    h.advance(Duration::from_secs(569));
    assert_eq!(h.svc.step_discards(), 0);
    h.advance(Duration::from_secs(1));
    assert_eq!(h.svc.step_discards(), 1);
    assert_eq!(h.used(), 100 + MIB);
    h.svc.put_end(h.writer, "", "k", None).unwrap();
}

#[test]
fn a_put_end_whose_checksum_is_wider_than_a_crc32c_is_refused_and_changes_nothing() {
    let h = Harness::default3();
    h.svc.put_start(h.writer, "", "k", 4096, &cfg(1)).unwrap();
    assert_eq!(h.svc.put_end(h.writer, "", "k", Some(1 << 32)), Err(ErrorCode::InvalidParams));
    assert_eq!(h.get("k").unwrap_err(), ErrorCode::ReplicaIsNotReady, "the write is still open");
    h.svc.put_end(h.writer, "", "k", Some(u64::from(u32::MAX))).unwrap();
    assert_eq!(h.get("k").unwrap().checksum, Some(u64::from(u32::MAX)), "every 32-bit value is kept whole");
}

#[test]
fn objects_are_invisible_until_put_end_and_reads_return_complete_replicas() {
    let h = Harness::default3();
    h.svc.put_start(h.writer, "", "k", 4096, &cfg(2)).unwrap();
    assert_eq!(h.get("k").unwrap_err(), ErrorCode::ReplicaIsNotReady);
    assert_eq!(h.svc.exist_key("", "k"), Ok(false));
    h.svc.put_end(h.writer, "", "k", Some(42)).unwrap();
    let r = h.get("k").unwrap();
    assert_eq!(r.replicas.len(), 2);
    assert!(r.replicas.iter().all(|d| d.status == ReplicaStatus::Complete));
    assert_eq!((r.lease_ttl_ms, r.checksum, r.size), (10_000, Some(42), 4096));
    assert!(matches!(&r.replicas[0].location, ReplicaLocation::Memory { length: 4096, .. }));
    assert_eq!(h.svc.exist_key("", "k"), Ok(true));
    assert_eq!(h.get("absent").unwrap_err(), ErrorCode::ObjectNotFound);
    assert_eq!(h.svc.exist_key("", "absent"), Ok(false));
}

#[test]
fn end_and_revoke_are_writer_only_idempotent_and_revoke_frees() {
    let h = Harness::default3();
    let other = ClientId::random();
    assert_eq!(h.svc.put_end(h.writer, "", "nope", None).unwrap_err(), ErrorCode::ObjectNotFound);
    assert_eq!(h.svc.put_revoke(h.writer, "", "nope").unwrap_err(), ErrorCode::ObjectNotFound);
    h.svc.put_start(h.writer, "", "k", MIB, &cfg(2)).unwrap();
    assert_eq!(h.svc.put_end(other, "", "k", None).unwrap_err(), ErrorCode::IllegalClient);
    assert_eq!(h.svc.put_revoke(other, "", "k").unwrap_err(), ErrorCode::IllegalClient);
    assert_eq!(h.used(), 2 * MIB);
    h.svc.put_revoke(h.writer, "", "k").unwrap();
    assert_eq!(h.get("k").unwrap_err(), ErrorCode::ObjectNotFound);
    assert_eq!(h.used(), 0, "revoke frees the bytes");
    h.put("done", 10);
    h.svc.put_end(h.writer, "", "done", None).unwrap();
    h.svc.put_end(other, "", "done", None).unwrap();
    assert_eq!(h.svc.put_revoke(h.writer, "", "done").unwrap_err(), ErrorCode::InvalidWrite);
}

#[test]
fn read_leases_block_non_forced_removal() {
    let h = Harness::default3();
    h.put("fresh", 10);
    h.svc.remove("", "fresh", false).unwrap();
    h.put("read", 10);
    h.get("read").unwrap();
    assert_eq!(h.svc.remove("", "read", false).unwrap_err(), ErrorCode::ObjectHasLease);
    h.advance(Duration::from_millis(9_999));
    assert_eq!(h.svc.remove("", "read", false).unwrap_err(), ErrorCode::ObjectHasLease);
    h.advance(Duration::from_millis(1));
    h.svc.remove("", "read", false).unwrap();
    h.put("exist", 10);
    assert_eq!(h.svc.exist_key("", "exist"), Ok(true));
    assert_eq!(h.svc.remove("", "exist", false).unwrap_err(), ErrorCode::ObjectHasLease);
    h.svc.remove("", "exist", true).unwrap();
    assert_eq!(h.svc.remove("", "exist", true).unwrap_err(), ErrorCode::ObjectNotFound);
}

#[test]
fn leases_extend_but_never_shrink() {
    let h = Harness::default3();
    h.put("k", 10);
    h.get("k").unwrap();
    h.advance(Duration::from_secs(6));
    h.get("k").unwrap(); // lease now ends at +16 s
    h.advance(Duration::from_secs(9));
    assert_eq!(h.svc.remove("", "k", false).unwrap_err(), ErrorCode::ObjectHasLease);
    h.advance(Duration::from_secs(1));
    h.svc.remove("", "k", false).unwrap();
}

#[test]
fn the_last_reader_to_release_ends_the_lease_at_once() {
    let h = Harness::default3();
    h.put("k", 10);
    h.get("k").unwrap(); // reader A
    h.advance(Duration::from_secs(1));
    h.get("k").unwrap(); // reader B
    assert_eq!(h.svc.stat("", "k").unwrap().lease_readers, 2);
    h.svc.release_leases("", &["k"]).unwrap(); // A is done
    assert_eq!(h.svc.remove("", "k", false).unwrap_err(), ErrorCode::ObjectHasLease, "B still reads");
    let s = h.svc.stat("", "k").unwrap();
    assert_eq!((s.lease_readers, s.lease_remaining_ms), (1, 10_000));
    h.svc.release_leases("", &["k"]).unwrap(); // B is done
    assert_eq!(h.svc.stat("", "k").unwrap().lease_remaining_ms, 0);
    h.svc.remove("", "k", false).unwrap();
}

#[test]
fn a_reader_that_never_releases_holds_the_lease_to_its_deadline_only() {
    let h = Harness::default3();
    h.put("k", 10);
    h.get("k").unwrap(); // gone without releasing
    h.get("k").unwrap();
    h.svc.release_leases("", &["k"]).unwrap();
    h.advance(Duration::from_millis(9_999));
    assert_eq!(h.svc.remove("", "k", false).unwrap_err(), ErrorCode::ObjectHasLease);
    h.advance(Duration::from_millis(1));
    // Expired: a late release changes nothing, and the next reader's lease counts from one.
    h.svc.release_leases("", &["k"]).unwrap();
    h.get("k").unwrap();
    assert_eq!(h.svc.stat("", "k").unwrap().lease_readers, 1);
    h.svc.release_leases("", &["k"]).unwrap();
    h.svc.remove("", "k", false).unwrap();
    // Releasing what does not exist (or never was leased) is harmless.
    h.put("never-read", 10);
    h.svc.release_leases("", &["never-read", "missing", "k"]).unwrap();
    h.svc.remove("", "never-read", false).unwrap();
}

#[test]
fn stat_looks_without_leasing_and_existence_checks_hold_a_lease() {
    let h = Harness::default3();
    h.put("k", 123);
    let s = h.svc.stat("", "k").unwrap();
    assert_eq!((s.size, s.checksum, s.lease_remaining_ms, s.lease_readers), (123, Some(0xC0FFEE), 0, 0));
    assert_eq!((s.replicas.len(), s.hard_pinned, s.writing, s.soft_pin_remaining_ms), (1, false, false, 0));
    h.svc.remove("", "k", false).unwrap();
    assert_eq!(h.svc.stat("", "k").unwrap_err(), ErrorCode::ObjectNotFound);
    // An unfinished write shows its replicas and that it is being written.
    h.svc.put_start(h.writer, "", "w", 10, &cfg(1)).unwrap();
    let s = h.svc.stat("", "w").unwrap();
    assert!(s.writing && s.replicas[0].status == ReplicaStatus::Processing);
    // ExistKey leases like a read (the checker may read next) and counts as a reader.
    h.put("e", 10);
    assert_eq!(h.svc.exist_key("", "e"), Ok(true));
    assert_eq!(h.svc.stat("", "e").unwrap().lease_readers, 1);
    h.svc.release_leases("", &["e"]).unwrap();
    h.svc.remove("", "e", false).unwrap();
}

#[test]
fn a_prefix_lookup_leases_exactly_the_run_it_finds() {
    let h = Harness::default3();
    for k in ["p0", "p1", "p3", "p4"] {
        h.put(k, 10);
    }
    h.svc.put_start(h.writer, "", "w", 10, &cfg(1)).unwrap();
    let leased = |k: &str| h.svc.stat("", k).unwrap().lease_readers;
    // p2 is absent: the run is p0, p1; p3 and p4 are neither looked at nor leased.
    let run = h.svc.batch_prefix_lease("", &["p0", "p1", "p2", "p3", "p4"]).unwrap();
    assert_eq!(run.len(), 2);
    assert!(run.iter().all(|r| r.size == 10 && r.replicas.len() == 1 && r.lease_ttl_ms == 10_000));
    assert_eq!([leased("p0"), leased("p1"), leased("p3"), leased("p4")], [1, 1, 0, 0]);
    // The run is held against removal (and eviction) for the lease, as a read's lookup is.
    assert_eq!(h.svc.remove("", "p1", false).unwrap_err(), ErrorCode::ObjectHasLease);
    h.svc.remove("", "p3", false).unwrap();
    // A key being written ends a run as an absent one does; so does the first key.
    assert_eq!(h.svc.batch_prefix_lease("", &["p4", "w", "p0"]).unwrap().len(), 1);
    assert_eq!(h.svc.batch_prefix_lease("", &["p2", "p0"]).unwrap().len(), 0);
    assert!(h.svc.batch_prefix_lease("", &[]).unwrap().is_empty());
    h.advance(Duration::from_secs(10));
    h.svc.remove("", "p1", false).unwrap();
    let m = &h.svc.metrics().prefix_lookups;
    let counts = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!((counts(&m.keys), counts(&m.hits)), (10, 3));
}

#[test]
fn unfinished_writes_cannot_be_removed_even_by_force() {
    let h = Harness::default3();
    h.svc.put_start(h.writer, "", "k", 10, &cfg(1)).unwrap();
    assert_eq!(h.svc.remove("", "k", true).unwrap_err(), ErrorCode::ReplicaIsNotReady);
    assert_eq!(h.svc.remove("", "k", false).unwrap_err(), ErrorCode::ReplicaIsNotReady);
}

#[test]
fn remove_all_and_remove_by_regex() {
    let h = Harness::default3();
    for i in 0..10 {
        h.put(&format!("prefix/{i}"), 10);
    }
    h.put("other/a", 10);
    h.svc.put_start(h.writer, "", "pending", 10, &cfg(1)).unwrap();
    h.get("prefix/0").unwrap();
    assert_eq!(h.svc.remove_by_regex("", "(", false).unwrap_err(), ErrorCode::InvalidParams);
    assert_eq!(h.svc.remove_by_regex("", "fix/[1-3]", false), Ok(3), "search, not full match");
    assert_eq!(h.svc.remove_all(None, false), Ok(7), "complete, unleased objects only");
    assert_eq!(h.svc.key_count(None), 2);
    assert_eq!(h.svc.remove_all(None, true), Ok(1), "force takes the leased one, never the pending write");
    assert_eq!(h.svc.list_keys("", "", 100).unwrap(), Vec::<String>::new());
}

#[test]
fn remove_all_reports_what_it_skipped_and_why() {
    let h = Harness::default3();
    for k in ["a", "b", "c"] {
        h.put(k, 10);
    }
    h.get("a").unwrap();
    h.svc.put_start(h.writer, "", "pending", 10, &cfg(1)).unwrap();
    let r = h.svc.remove_all_report(None, false).unwrap();
    assert_eq!((r.removed, r.skipped_leased, r.skipped_writing, r.skipped_pinned), (2, 1, 1, 0));
    let r = h.svc.remove_all_report(Some(""), true).unwrap();
    assert_eq!((r.removed, r.skipped_leased, r.skipped_writing), (1, 0, 1), "force takes the leased one only");
}

#[test]
fn batch_calls_answer_per_key_in_order() {
    let h = Harness::default3();
    let items = [("a", 10u64), ("", 10), ("b", 0), ("c", 10)];
    let r = h.svc.batch_put_start(h.writer, "", &items, &cfg(1), None);
    assert!(r[0].is_ok() && r[3].is_ok());
    assert_eq!(
        (r[1].clone().unwrap_err(), r[2].clone().unwrap_err()),
        (ErrorCode::InvalidParams, ErrorCode::InvalidParams)
    );
    let ends = h.svc.batch_put_end(h.writer, "", &[("a", None, None), ("missing", None, None), ("c", Some(1), None)]);
    assert_eq!(ends, vec![Ok(()), Err(ErrorCode::ObjectNotFound), Ok(())]);
    assert_eq!(h.svc.batch_exist_key("", &["c", "zz", "a"]), vec![Ok(true), Ok(false), Ok(true)]);
    let gets = h.svc.batch_get_replica_list("", &["a", "zz"]);
    assert!(gets[0].is_ok());
    assert_eq!(gets[1].clone().unwrap_err(), ErrorCode::ObjectNotFound);
    let groups = vec!["g".to_string()];
    let mismatch = h.svc.batch_put_start(h.writer, "", &[("x", 1), ("y", 1)], &cfg(1), Some(&groups));
    assert!(mismatch.iter().all(|r| r.clone().unwrap_err() == ErrorCode::InvalidParams));
    h.advance(Duration::from_secs(11));
    assert_eq!(h.svc.batch_remove("", &["a", "zz"], false), vec![Ok(()), Err(ErrorCode::ObjectNotFound)]);
    assert_eq!(h.svc.batch_put_revoke(h.writer, "", &[("c", None)]), vec![Err(ErrorCode::InvalidWrite)]);
}

#[test]
fn upsert_same_size_reuses_buffers_and_hides_the_key_until_end() {
    let h = Harness::default3();
    let first = h.put("k", 4096);
    let again = h.svc.upsert_start(h.writer, "", "k", 4096, &cfg(1)).unwrap();
    assert_eq!(
        first.iter().map(|d| &d.location).collect::<Vec<_>>(),
        again.iter().map(|d| &d.location).collect::<Vec<_>>()
    );
    assert_eq!(h.get("k").unwrap_err(), ErrorCode::ReplicaIsNotReady);
    assert_eq!(h.svc.exist_key("", "k"), Ok(false));
    h.svc.upsert_end(h.writer, "", "k", Some(7)).unwrap();
    assert_eq!(h.get("k").unwrap().checksum, Some(7));
    assert_eq!(h.used(), 4096);
}

#[test]
fn upsert_of_another_size_allocates_anew_and_frees_the_old_after_the_lease() {
    let h = Harness::default3();
    let first = h.put("k", 4096);
    h.get("k").unwrap(); // a reader holds a lease on the old bytes
    let next = h.svc.upsert_start(h.writer, "", "k", 8192, &cfg(1)).unwrap();
    assert_ne!(first[0].location, next[0].location);
    assert_eq!(h.used(), 4096 + 8192, "old bytes wait for the reader's lease");
    h.svc.upsert_end(h.writer, "", "k", None).unwrap();
    assert_eq!(h.get("k").unwrap().size, 8192);
    h.advance(Duration::from_secs(10));
    h.svc.step_discards();
    assert_eq!(h.used(), 8192);
}

#[test]
fn upsert_of_the_same_size_never_rewrites_bytes_a_reader_holds() {
    let h = Harness::default3();
    let first = h.put("k", 4096);
    h.get("k").unwrap(); // a reader is reading `first`
    let next = h.svc.upsert_start(h.writer, "", "k", 4096, &cfg(1)).unwrap();
    assert_ne!(first[0].location, next[0].location, "new buffers, not the ones being read");
    assert_eq!(h.used(), 2 * 4096);
    h.svc.upsert_end(h.writer, "", "k", None).unwrap();
    assert_eq!(h.get("k").unwrap().replicas[0].location, next[0].location);
    // The old bytes are freed when the lease they were read under runs out.
    h.svc.release_leases("", &["k", "k"]).unwrap();
    h.advance(Duration::from_secs(10));
    h.svc.step_discards();
    assert_eq!(h.used(), 4096);
    // Unleased, the same size is rewritten in place again.
    let again = h.svc.upsert_start(h.writer, "", "k", 4096, &cfg(1)).unwrap();
    assert_eq!(again[0].location, next[0].location);
}

#[test]
fn upsert_preempts_an_unfinished_write_at_once_and_creates_when_absent() {
    let h = Harness::default3();
    let zombie = ClientId::random();
    h.svc.put_start(zombie, "", "k", 100, &cfg(1)).unwrap();
    h.svc.upsert_start(h.writer, "", "k", 100, &cfg(1)).unwrap();
    assert_eq!(h.svc.put_end(zombie, "", "k", None).unwrap_err(), ErrorCode::IllegalClient);
    h.svc.upsert_end(h.writer, "", "k", None).unwrap();
    assert!(h.get("k").is_ok());
    h.svc.upsert_start(h.writer, "", "new", 5, &cfg(1)).unwrap();
    h.svc.upsert_revoke(h.writer, "", "new").unwrap();
    assert_eq!(h.get("new").unwrap_err(), ErrorCode::ObjectNotFound);
    // Revoking an in-place upsert loses the object (its buffers were being rewritten).
    h.svc.upsert_start(h.writer, "", "k", 100, &cfg(1)).unwrap();
    h.svc.upsert_revoke(h.writer, "", "k").unwrap();
    assert_eq!(h.get("k").unwrap_err(), ErrorCode::ObjectNotFound);
}

#[test]
fn one_clients_overlapping_upserts_of_a_key_never_end_each_other() {
    let h = Harness::default3();
    let (w, write) = (h.writer, |d: &[crescent_proto::ReplicaDescriptor]| WriteRef::new(h.writer, write_id(d)));
    h.put("k", 4096);
    // Two tasks of one client upsert k at once: the first rewrites in place, the second preempts it.
    let first = h.svc.upsert_start(w, "", "k", 4096, &cfg(1)).unwrap();
    let second = h.svc.upsert_start(w, "", "k", 4096, &cfg(1)).unwrap();
    assert_ne!(write_id(&first), write_id(&second), "each write has its own id");
    // The first finishes first: it may neither publish the second's half-written bytes under its checksum...
    assert_eq!(h.svc.upsert_end(write(&first), "", "k", Some(1)).unwrap_err(), ErrorCode::ObjectNotFound);
    assert_eq!(h.get("k").unwrap_err(), ErrorCode::ReplicaIsNotReady, "still the second's write");
    // ...nor revoke the second's write.
    assert_eq!(h.svc.upsert_revoke(write(&first), "", "k").unwrap_err(), ErrorCode::ObjectNotFound);
    h.svc.upsert_end(write(&second), "", "k", Some(2)).unwrap();
    assert_eq!(h.get("k").unwrap().checksum, Some(2), "the object carries the checksum of the bytes it holds");
    // An in-place upsert (no reader holds k) gets fresh ids: the write before it cannot name it.
    h.svc.release_leases("", &["k"]).unwrap();
    let third = h.svc.upsert_start(w, "", "k", 4096, &cfg(1)).unwrap();
    assert_eq!(third[0].location, second[0].location, "rewritten in place");
    assert_ne!(write_id(&third), write_id(&second));
    assert_eq!(h.svc.upsert_end(write(&second), "", "k", Some(2)).unwrap_err(), ErrorCode::ObjectNotFound);
    // The batch forms name writes too.
    let ends =
        h.svc.batch_put_end(w, "", &[("k", Some(3), Some(write_id(&second))), ("k", Some(3), Some(write_id(&third)))]);
    assert_eq!(ends, vec![Err(ErrorCode::ObjectNotFound), Ok(())]);
    assert_eq!(h.get("k").unwrap().checksum, Some(3));
    let fourth = h.svc.upsert_start(w, "", "k", 4096, &cfg(1)).unwrap();
    let revokes = h.svc.batch_put_revoke(w, "", &[("k", Some(write_id(&third))), ("k", Some(write_id(&fourth)))]);
    assert_eq!(revokes, vec![Err(ErrorCode::ObjectNotFound), Ok(())]);
    assert_eq!(h.get("k").unwrap_err(), ErrorCode::ObjectNotFound, "a revoked in-place upsert loses the object");
}

#[test]
fn soft_pin_commits_at_put_end_and_hard_pin_is_kept() {
    let h = Harness::default3();
    let c = ReplicateConfig { soft_pin_action: SoftPinAction::Enable, soft_pin_ttl_ms: Some(1000), ..cfg(1) };
    h.put_in("", "soft", 10, &c).unwrap();
    // Remove ignores soft pins.
    h.svc.remove("", "soft", false).unwrap();
    let hard = ReplicateConfig { with_hard_pin: true, ..cfg(1) };
    h.put_in("", "hard", 10, &hard).unwrap();
    h.svc.remove("", "hard", false).unwrap();
}

#[test]
fn abandoned_writes_are_reclaimed_after_the_release_timeout() {
    let h = Harness::default3();
    let zombie = ClientId::random();
    h.svc.put_start(zombie, "", "abandoned", MIB, &cfg(2)).unwrap();
    h.put("done", 10);
    h.advance(Duration::from_secs(599));
    assert_eq!(h.svc.step_stale_writes(), 0);
    assert_eq!(h.used(), 2 * MIB + 10);
    h.advance(Duration::from_secs(1));
    assert_eq!(h.svc.step_stale_writes(), 1);
    assert_eq!(h.used(), 10);
    assert_eq!(h.get("abandoned").unwrap_err(), ErrorCode::ObjectNotFound);
    assert_eq!(h.svc.put_end(zombie, "", "abandoned", None).unwrap_err(), ErrorCode::ObjectNotFound);
    assert!(h.get("done").is_ok());
    // An abandoned in-place upsert keeps nothing readable either (its buffers were being rewritten).
    h.svc.upsert_start(zombie, "", "done", 10, &cfg(1)).unwrap();
    h.advance(Duration::from_secs(600));
    assert_eq!(h.svc.step_stale_writes(), 1);
    assert_eq!(h.used(), 0);
    assert_eq!(h.svc.audit().quota_mismatches, Vec::new());
}

#[test]
fn batch_calls_count_every_key_and_every_failure_in_the_metrics() {
    use std::sync::atomic::Ordering::Relaxed;
    let h = Harness::default3();
    let m = h.svc.metrics();
    let counts = |c: &crescent_master::service::OpCounter| (c.requests.load(Relaxed), c.failures.load(Relaxed));
    let bad = "k".repeat(MAX_KEY_LEN + 1);
    let starts = h.svc.batch_put_start(h.writer, "", &[("a", 10), (bad.as_str(), 10), ("b", 10)], &cfg(1), None);
    assert_eq!(starts.iter().filter(|r| r.is_err()).count(), 1);
    assert_eq!(counts(&m.put_start), (3, 1));
    let ends =
        h.svc.batch_put_end(h.writer, "", &[("a", None, None), ("b", None, None), ("never-started", None, None)]);
    assert_eq!(ends.iter().filter(|r| r.is_err()).count(), 1);
    assert_eq!(counts(&m.put_end), (3, 1));
    h.svc.batch_get_replica_list("", &["a", "missing", "b", "gone"]);
    assert_eq!(counts(&m.get_replica_list), (4, 2));
    h.svc.batch_exist_key("", &["a", "missing"]);
    assert_eq!(counts(&m.exist_key), (2, 0), "absence is an answer, not a failure");
    h.svc.batch_remove("", &["a", "b", "missing"], true);
    assert_eq!(counts(&m.remove), (3, 1));
    assert_eq!(h.svc.batch_put_revoke(h.writer, "", &[("a", None)]).len(), 1);
    assert_eq!(counts(&m.put_revoke), (1, 1));
}

/// On a master with a write hold (one whose edge seals data-plane grants), every range handed out keeps its space,
/// once freed, out of reuse until a grant for it can no longer be honoured: the lease plus the clock slack for a
/// read, the write window plus the slack for a write. The hold is taken as the ranges are handed out, under the
/// object's lock, so a forced removal right after a get (before the edge has even sealed the read grant) cannot
/// free the space for another object the reader could then read through its grant.
#[test]
fn ranges_handed_out_stay_held_for_their_grants_life_even_when_removed_at_once() {
    let config = MasterConfig {
        write_hold_ms: 12_000,
        grant_write_window_ms: 10_000,
        lease_ttl_ms: 5_000,
        ..Default::default()
    };
    let h = Harness::new(config, 1, 64 * MIB);
    let held = |h: &Harness| h.svc.pool().usage(crescent_proto::SegmentKind::Memory).held;

    h.put("read", 8 * MIB);
    h.advance(Duration::from_secs(60)); // its allocation's own hold is long over
    let list = h.get("read").unwrap();
    assert_eq!(list.replicas.len(), 1);
    h.svc.remove("", "read", true).unwrap();
    assert_eq!(held(&h), 8 * MIB, "the range a reader was just handed is held");
    h.advance(Duration::from_millis(5_999)); // lease 5 s + 1 s slack, less 1 ms
    assert_eq!(held(&h), 8 * MIB);
    h.advance(Duration::from_millis(1));
    assert_eq!(held(&h), 0, "free once no read grant for it can be honoured");

    // An upsert of the same size rewrites the object's own buffers: handed out again, for writing.
    h.put("write", 8 * MIB);
    h.advance(Duration::from_secs(60));
    let again = h.svc.upsert_start(h.writer, "", "write", 8 * MIB, &ReplicateConfig::default()).unwrap();
    assert_eq!(again.len(), 1);
    h.svc.upsert_revoke(h.writer, "", "write").unwrap();
    assert!(h.get("write").is_err(), "a revoked rewrite leaves no readable object");
    assert_eq!(held(&h), 8 * MIB, "the rewritten range is held");
    h.advance(Duration::from_millis(10_999)); // write window 10 s + 1 s slack, less 1 ms
    assert_eq!(held(&h), 8 * MIB);
    h.advance(Duration::from_millis(1));
    assert_eq!(held(&h), 0);

    // Without a write hold (no grants sealed), nothing is held.
    let h = Harness::default3();
    h.put("plain", 8 * MIB);
    h.get("plain").unwrap();
    h.svc.remove("", "plain", true).unwrap();
    assert_eq!((held(&h), h.used()), (0, 0));
}
