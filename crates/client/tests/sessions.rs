//! Read and write sessions: an object looked up once and read range by range under its lease, and an object
//! reserved, written whole at the end and only then readable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_master::service::MasterConfig;
use crescent_proto::{ErrorCode, ReplicateConfig};
use crescent_testkit::{LocalCluster, pattern};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_session_reads_ranges_and_refuses_ranges_past_the_object() {
    let cluster = LocalCluster::start(1, 16 << 20).await;
    let c = cluster.client();
    let value = pattern(10_000, 7);
    c.put("obj", &value).await.unwrap();
    let s = c.read_session("obj").await.unwrap();
    assert_eq!((s.size(), s.key()), (10_000, "obj"));
    let (mut a, mut b) = (vec![0u8; 100], vec![0u8; 2000]);
    let mut ranges: Vec<(u64, &mut [u8])> = vec![(5, &mut a), (8000, &mut b)];
    assert_eq!(c.read_session_ranges(&s, &mut ranges).await.unwrap(), 2100);
    assert_eq!((&a[..], &b[..]), (&value[5..105], &value[8000..10_000]));
    let mut past = vec![0u8; 2001];
    let mut ranges: Vec<(u64, &mut [u8])> = vec![(8000, &mut past)];
    assert_eq!(c.read_session_ranges(&s, &mut ranges).await.unwrap_err().code(), ErrorCode::InvalidParams);
    assert!(past.iter().all(|&b| b == 0), "nothing read for a refused range");
    assert_eq!(c.read_session("missing").await.unwrap_err().code(), ErrorCode::ObjectNotFound);
    // The batched lookup: per key, an invalid key failing alone.
    let batch = c.read_sessions(&["obj", "missing", ""]).await;
    let (first, codes) = (&batch[0], batch.iter().skip(1).map(|r| r.as_ref().map(|_| ()).unwrap_err().code()));
    assert_eq!(codes.collect::<Vec<_>>(), [ErrorCode::ObjectNotFound, ErrorCode::InvalidParams]);
    let mut tail = vec![0u8; 10];
    let mut ranges: Vec<(u64, &mut [u8])> = vec![(9990, &mut tail)];
    assert_eq!(c.read_session_ranges(first.as_ref().unwrap(), &mut ranges).await.unwrap(), 10);
    assert_eq!(&tail[..], &value[9990..]);
    // Two sessions of "obj" (two lookups): each holds a lease of its own, and each end releases one.
    c.end_read_sessions(&["obj"]).await;
    c.flush().await.unwrap();
    assert_eq!(c.remove("obj", false).await.unwrap_err().code(), ErrorCode::ObjectHasLease);
    c.end_read_sessions(&["obj"]).await;
    c.flush().await.unwrap();
    // Both sessions' leases are released: the object can be removed at once.
    c.remove("obj", false).await.unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_session_past_its_lease_is_lease_expired() {
    let config = MasterConfig { lease_ttl_ms: 200, ..MasterConfig::default() };
    let cluster = LocalCluster::with_config(config, 1, 16 << 20).await;
    let c = cluster.client();
    c.put("obj", &pattern(1000, 1)).await.unwrap();
    let s = c.read_session("obj").await.unwrap();
    // The lease's expiry is what is tested: waiting it out is the point, not a synchronisation.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(s.expired());
    let mut buf = vec![0u8; 10];
    let mut ranges: Vec<(u64, &mut [u8])> = vec![(0, &mut buf)];
    assert_eq!(c.read_session_ranges(&s, &mut ranges).await.unwrap_err().code(), ErrorCode::LeaseExpired);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_session_is_readable_only_after_its_end_and_revoke_frees_the_key() {
    let cluster = LocalCluster::start(1, 16 << 20).await;
    let c = cluster.client();
    let cfg = ReplicateConfig::default();
    let s = c.write_session_start("w", 5000, &cfg).await.unwrap();
    assert_eq!((s.size(), s.key()), (5000, "w"));
    assert!(!c.is_exist("w").await.unwrap(), "a reserved object is not readable");
    let err = c.write_session_start("w", 10, &cfg).await.unwrap_err();
    assert_ne!(err.code(), ErrorCode::Ok, "a reserved key cannot be reserved again");
    assert_eq!(c.write_session_end(&s, &[0u8; 10]).await.unwrap_err().code(), ErrorCode::InvalidParams);
    let value = pattern(5000, 3);
    c.write_session_end(&s, &value).await.unwrap();
    assert_eq!(c.get("w").await.unwrap(), value);
    let exists = c.write_session_start("w", 10, &cfg).await.unwrap_err();
    assert_eq!(exists.code(), ErrorCode::ObjectAlreadyExists);

    let r = c.write_session_start("r", 100, &cfg).await.unwrap();
    c.write_session_revoke(&r).await.unwrap();
    assert!(!c.is_exist("r").await.unwrap());
    let again = c.write_session_start("r", 100, &cfg).await.unwrap();
    c.write_session_end(&again, &pattern(100, 9)).await.unwrap();
    assert_eq!(c.get("r").await.unwrap(), pattern(100, 9));

    // The batched reservation: per key, an invalid or taken key failing alone.
    let batch = c.write_sessions_start(&[("b1", 300), ("w", 10), ("", 10), ("b2", 400)], &cfg).await;
    let codes: Vec<ErrorCode> = batch.iter().map(|r| r.as_ref().map_or_else(|e| e.code(), |_| ErrorCode::Ok)).collect();
    assert_eq!(codes, [ErrorCode::Ok, ErrorCode::ObjectAlreadyExists, ErrorCode::InvalidParams, ErrorCode::Ok]);
    let (b1, b2) = (batch[0].as_ref().unwrap(), batch[3].as_ref().unwrap());
    assert_eq!((b1.size(), b2.key()), (300, "b2"));
    c.write_session_end(b1, &pattern(300, 1)).await.unwrap();
    c.write_session_revoke(b2).await.unwrap();
    assert_eq!(c.get("b1").await.unwrap(), pattern(300, 1));
    assert!(!c.is_exist("b2").await.unwrap());

    // Ended together (one BatchPutEnd): per session, a value of the wrong size failing alone and its
    // reservation kept, to be ended again.
    let batch = c.write_sessions_start(&[("e1", 100), ("e2", 200), ("e3", 300)], &cfg).await;
    let s: Vec<_> = batch.iter().map(|r| r.as_ref().unwrap()).collect();
    let (v1, v3) = (pattern(100, 11), pattern(300, 13));
    let ended = c.write_sessions_end(&[(s[0], &v1), (s[1], &[0u8; 5]), (s[2], &v3)]).await;
    let codes: Vec<ErrorCode> =
        ended.iter().map(|r| r.as_ref().map_or_else(|e| e.code(), |()| ErrorCode::Ok)).collect();
    assert_eq!(codes, [ErrorCode::Ok, ErrorCode::InvalidParams, ErrorCode::Ok]);
    assert_eq!((c.get("e1").await.unwrap(), c.get("e3").await.unwrap()), (v1, v3));
    assert_eq!(c.get("e2").await.unwrap_err().code(), ErrorCode::ReplicaIsNotReady, "still reserved");
    let v2 = pattern(200, 12);
    assert!(c.write_sessions_end(&[(s[1], &v2)]).await[0].is_ok());
    assert_eq!(c.get("e2").await.unwrap(), v2);
    cluster.shutdown().await;
}
