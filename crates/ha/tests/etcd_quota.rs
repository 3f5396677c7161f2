//! A full etcd is weathered, never fatal: with its backend quota exceeded (the NOSPACE alarm on) the oplog
//! writer keeps retrying its stuck batch with back-off and refuses new reservations meanwhile (what a master
//! answers `PERSISTENT_FAIL` for), and it resumes by itself once an operator frees space (compaction to the
//! current revision, defragmentation, alarm disarmed). Against a real etcd started with a small quota.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use crescent_ha::kv::{HaKvBackend, KvError};
use crescent_ha::oplog::{
    OpLogBatchStorage, OpLogEntry, OrderedOpLogWriter, StorageConfig, StorageError, WriterConfig, WriterError,
};
use crescent_ha::testing::{AlarmType, EtcdServer};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The backend quota: small, so a few dozen entries fill it.
const QUOTA: usize = 4 << 20;
const WAIT: Duration = Duration::from_secs(60);

fn big(i: u64) -> OpLogEntry {
    OpLogEntry { op: 1, tenant: "t".into(), key: format!("k{i}"), payload: vec![(i % 251) as u8; 64 << 10] }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_etcd_stalls_the_writer_until_space_is_freed_then_it_resumes() {
    let quota = format!("--quota-backend-bytes={QUOTA}");
    let server = tokio::task::spawn_blocking(move || EtcdServer::start_with(&[&quota]))
        .await
        .unwrap()
        .expect("etcd must start for this test");
    let kv: Arc<dyn HaKvBackend> = Arc::new(server.connect().await.unwrap());
    // History compaction can reclaim: one key overwritten (an operator's etcd holds others' history too).
    for i in 0..8u8 {
        kv.put(b"/ballast", &vec![i; 128 << 10]).await.unwrap();
    }
    let storage = OpLogBatchStorage::new(kv.clone(), "c", StorageConfig::default()).unwrap();
    let prefix = storage.init_durable_prefix().await.unwrap();
    storage.claim_producer_view(1).await.unwrap();
    let config = WriterConfig {
        retry_initial: Duration::from_millis(10),
        retry_max: Duration::from_millis(100),
        ..WriterConfig::default()
    };
    let writer = OrderedOpLogWriter::new(storage.clone(), 1, prefix, config);
    writer.start();
    let called = Arc::new(AtomicU64::new(0));
    let callback = |called: &Arc<AtomicU64>| -> Option<crescent_ha::oplog::DurableCallback> {
        let called = called.clone();
        Some(Box::new(move |seq| {
            called.fetch_max(seq, Ordering::SeqCst);
        }))
    };

    // Fill etcd one entry at a time until a write finds it full.
    let mut stuck = None;
    for i in 1..=200 {
        let seq = writer.commit(writer.reserve().unwrap(), big(i), callback(&called)).unwrap();
        common::eventually("durable or failing", WAIT, || {
            let st = writer.status();
            st.durable.last_seq >= seq || st.last_error.is_some() || st.terminal.is_some()
        })
        .await;
        let st = writer.status();
        assert!(st.terminal.is_none(), "a full etcd must not stop the writer for good: {st:?}");
        if st.last_error.is_some() {
            stuck = Some(seq);
            break;
        }
    }
    let stuck = stuck.expect("etcd never filled up");
    let st = writer.status();
    assert!(
        matches!(&st.last_error, Some(StorageError::Kv(KvError::Exhausted(m))) if m.contains("database space exceeded")),
        "{st:?}"
    );
    assert_eq!(server.alarms().await.unwrap(), vec![AlarmType::Nospace]);

    // While the alarm is on: retried with back-off, never terminal; new mutations are refused; the stuck
    // entry's callback has not run.
    let failed = st.failed_attempts;
    common::eventually("more retries", WAIT, || writer.status().failed_attempts >= failed + 3).await;
    let st = writer.status();
    assert!(st.terminal.is_none() && !st.accepting && st.durable.last_seq == stuck - 1, "{st:?}");
    assert_eq!(writer.reserve().unwrap_err(), WriterError::Unavailable);
    let m = writer.metrics();
    assert!(m.closed_for.is_some() && m.stuck_for.is_some(), "{m:?}");
    assert!(called.load(Ordering::SeqCst) < stuck, "no callback before durability");

    // The operator frees space: the writer resumes on its own and the stuck entry becomes durable.
    let size = server.free_space().await.unwrap();
    assert!(size < QUOTA as i64, "defragmented to {size} bytes");
    assert!(server.alarms().await.unwrap().is_empty());
    writer.wait_durable(stuck, WAIT).await.unwrap();
    common::eventually("the stuck entry's callback", WAIT, || called.load(Ordering::SeqCst) == stuck).await;
    let (st, m) = (writer.status(), writer.metrics());
    assert!(st.accepting && st.last_error.is_none() && m.closed_for.is_none(), "{st:?} {m:?}");
    let next = writer.commit(writer.reserve().unwrap(), big(0), callback(&called)).unwrap();
    writer.wait_durable(next, WAIT).await.unwrap();
    writer.stop().await;

    // Nothing lost, nothing doubled: the stored log is contiguous up to the last entry.
    let batches = storage.read_batches_after(0, 0).await.unwrap();
    let mut want = 1;
    for b in &batches {
        assert_eq!(b.first_seq, want, "contiguous");
        want = b.last_seq + 1;
    }
    assert_eq!(want, next + 1);
}
