//! The `HaKvBackend` contract, run against a real etcd and against the embedded redb store.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::Fixture;
use crescent_ha::kv::{Fault, HaKvBackend, KvCompare, KvError, KvOp, KvPair, KvTxn, TxnOutcome};

fn pair(k: &str, v: &str) -> KvPair {
    KvPair { key: k.as_bytes().to_vec(), value: v.as_bytes().to_vec() }
}

fn absent(k: &str) -> KvCompare {
    KvCompare::KeyAbsent(k.as_bytes().to_vec())
}

fn equals(k: &str, v: &str) -> KvCompare {
    KvCompare::ValueEquals(k.as_bytes().to_vec(), v.as_bytes().to_vec())
}

async fn get(f: &Fixture, k: &str) -> Option<String> {
    f.kv.get(k.as_bytes()).await.unwrap().map(|v| String::from_utf8(v).unwrap())
}

async fn get_put_round_trip(f: Fixture) {
    assert_eq!(get(&f, "a").await, None);
    f.kv.put(b"a", b"1").await.unwrap();
    assert_eq!(get(&f, "a").await.as_deref(), Some("1"));
    f.kv.put(b"a", b"").await.unwrap();
    assert_eq!(get(&f, "a").await.as_deref(), Some(""), "an empty value is a value, not absence");
    f.kv.put(&[0xff, 0], &[0, 1, 2]).await.unwrap();
    assert_eq!(f.kv.get(&[0xff, 0]).await.unwrap(), Some(vec![0, 1, 2]), "keys and values are bytes");
}

async fn txn_compare_semantics(f: Fixture) {
    assert!(f.kv.supports_txn());
    // Key-absent holds on a missing key, and all puts apply together.
    let t = KvTxn { compares: vec![absent("x")], puts: vec![pair("x", "1"), pair("y", "1")] };
    assert_eq!(f.kv.txn(&t).await.unwrap(), TxnOutcome::Succeeded);
    assert_eq!((get(&f, "x").await, get(&f, "y").await), (Some("1".into()), Some("1".into())));
    // Key-absent fails on an existing key (an empty value exists too); nothing is written.
    f.kv.put(b"e", b"").await.unwrap();
    for cmp in [absent("x"), absent("e")] {
        let t = KvTxn { compares: vec![cmp], puts: vec![pair("z", "1")] };
        assert_eq!(f.kv.txn(&t).await.unwrap(), TxnOutcome::CompareFailed);
    }
    assert_eq!(get(&f, "z").await, None);
    // Value-equals: exact bytes only; a missing key never equals anything, not even "".
    let t = KvTxn { compares: vec![equals("x", "1")], puts: vec![pair("x", "2")] };
    assert_eq!(f.kv.txn(&t).await.unwrap(), TxnOutcome::Succeeded);
    for cmp in [equals("x", "1"), equals("x", "2 "), equals("missing", ""), equals("e", "x")] {
        let t = KvTxn { compares: vec![cmp], puts: vec![pair("x", "3")] };
        assert_eq!(f.kv.txn(&t).await.unwrap(), TxnOutcome::CompareFailed);
    }
    assert_eq!(get(&f, "x").await.as_deref(), Some("2"));
    assert_eq!(
        f.kv.txn(&KvTxn { compares: vec![equals("e", "")], puts: vec![] }).await.unwrap(),
        TxnOutcome::Succeeded
    );
    // Every compare must hold: one failing compare among several blocks all puts.
    let t = KvTxn { compares: vec![equals("x", "2"), absent("y")], puts: vec![pair("x", "4"), pair("w", "4")] };
    assert_eq!(f.kv.txn(&t).await.unwrap(), TxnOutcome::CompareFailed);
    assert_eq!((get(&f, "x").await.as_deref(), get(&f, "w").await), (Some("2"), None));
    let t = KvTxn { compares: vec![equals("x", "2"), equals("y", "1")], puts: vec![pair("x", "4"), pair("w", "4")] };
    assert_eq!(f.kv.txn(&t).await.unwrap(), TxnOutcome::Succeeded);
    assert_eq!((get(&f, "x").await.as_deref(), get(&f, "w").await.as_deref()), (Some("4"), Some("4")));
}

async fn range_pages_in_key_order(f: Fixture) {
    for i in (0..25).rev() {
        f.kv.put(format!("r/{i:02}").as_bytes(), i.to_string().as_bytes()).await.unwrap();
    }
    f.kv.put(b"q", b"before").await.unwrap();
    f.kv.put(b"r0", b"after").await.unwrap();
    let keys = |p: &crescent_ha::kv::RangePage| {
        p.kvs.iter().map(|kv| String::from_utf8(kv.key.clone()).unwrap()).collect::<Vec<_>>()
    };
    let p = f.kv.range(b"r/", b"r0", 10).await.unwrap();
    assert_eq!(keys(&p), (0..10).map(|i| format!("r/{i:02}")).collect::<Vec<_>>());
    assert!(p.more);
    assert_eq!(p.kvs[3].value, b"3".to_vec());
    let p = f.kv.range(b"r/20", b"r0", 10).await.unwrap();
    assert_eq!(keys(&p), (20..25).map(|i| format!("r/{i:02}")).collect::<Vec<_>>());
    assert!(!p.more);
    let p = f.kv.range(b"r/20", b"r0", 5).await.unwrap();
    assert_eq!(p.kvs.len(), 5);
    assert!(!p.more, "an exactly full last page has nothing more");
    let all = f.kv.range(b"r/", b"r0", 0).await.unwrap();
    assert_eq!(all.kvs.len(), 25);
    assert!(!all.more);
    let to_end = f.kv.range(b"r/24", b"", 0).await.unwrap();
    assert_eq!(keys(&to_end), vec!["r/24".to_string(), "r0".to_string()]);
    assert!(f.kv.range(b"r0", b"r/", 0).await.unwrap().kvs.is_empty(), "begin after end is empty");
    assert!(f.kv.range(b"s", b"t", 0).await.unwrap().kvs.is_empty());
}

async fn oversized_requests_are_rejected(f: Fixture) {
    let limits = f.kv.limits();
    assert_eq!((limits.max_txn_ops, limits.max_request_bytes), (128, 1_572_864));
    let many = KvTxn { compares: vec![absent("n")], puts: (0..128).map(|i| pair(&format!("n{i}"), "v")).collect() };
    assert!(matches!(f.kv.txn(&many).await, Err(KvError::Rejected(_))));
    let big = KvTxn { compares: vec![], puts: vec![KvPair { key: b"big".to_vec(), value: vec![7; 1_572_864] }] };
    assert!(matches!(f.kv.txn(&big).await, Err(KvError::Rejected(_))));
    assert!(matches!(f.kv.put(b"big", &[7; 1_572_864]).await, Err(KvError::Rejected(_))));
    assert_eq!(get(&f, "n0").await, None);
    assert_eq!(f.kv.get(b"big").await.unwrap(), None);
    // Just under the limits is accepted.
    let max = KvTxn { compares: vec![absent("n")], puts: (0..127).map(|i| pair(&format!("n{i}"), "v")).collect() };
    assert_eq!(f.kv.txn(&max).await.unwrap(), TxnOutcome::Succeeded);
}

async fn applied_then_ambiguous_write_is_applied(f: Fixture) {
    f.kv.inject_next(KvOp::Txn, Fault::ApplyThenAmbiguous);
    let t = KvTxn { compares: vec![absent("a")], puts: vec![pair("a", "1")] };
    let err = f.kv.txn(&t).await.unwrap_err();
    assert!(err.is_ambiguous(), "{err}");
    assert_eq!(get(&f, "a").await.as_deref(), Some("1"), "the write landed although the caller was told 'unknown'");
    // A plain injected failure does not reach the backend.
    f.kv.inject_next(KvOp::Put, Fault::Fail(KvError::Unavailable("down".into())));
    assert!(matches!(f.kv.put(b"b", b"1").await, Err(KvError::Unavailable(_))));
    assert_eq!(get(&f, "b").await, None);
}

async fn delete_range_removes_exactly_the_range(f: Fixture) {
    for i in 0..12 {
        f.kv.put(format!("d/{i:02}").as_bytes(), b"v").await.unwrap();
    }
    f.kv.put(b"c", b"before").await.unwrap();
    f.kv.put(b"d0", b"after").await.unwrap();
    assert_eq!(f.kv.delete_range(b"d/03", b"d/07").await.unwrap(), 4);
    let left = f.kv.range(b"d/", b"d0", 0).await.unwrap();
    let keys: Vec<String> = left.kvs.iter().map(|kv| String::from_utf8(kv.key.clone()).unwrap()).collect();
    let want: Vec<String> = [0, 1, 2, 7, 8, 9, 10, 11].iter().map(|i| format!("d/{i:02}")).collect();
    assert_eq!(keys, want, "the end is exclusive, the begin inclusive");
    assert_eq!(f.kv.delete_range(b"d/03", b"d/07").await.unwrap(), 0, "deleting nothing is not an error");
    assert_eq!(f.kv.delete_range(b"d/09", b"d/01").await.unwrap(), 0, "begin after end deletes nothing");
    assert_eq!(f.kv.delete_range(b"d/10", b"").await.unwrap(), 3, "an empty end runs to the end of the keyspace");
    assert_eq!(get(&f, "d0").await, None);
    assert_eq!(get(&f, "c").await.as_deref(), Some("before"));
    assert_eq!(get(&f, "d/09").await.as_deref(), Some("v"));
}

crate::on_all_backends!(
    delete_range_removes_exactly_the_range,
    get_put_round_trip,
    txn_compare_semantics,
    range_pages_in_key_order,
    oversized_requests_are_rejected,
    applied_then_ambiguous_write_is_applied,
);

/// The server itself enforces its limits (not only the client-side check), and the refusal is `Rejected`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_server_refuses_too_many_txn_ops() {
    use crescent_ha::kv::{EtcdKv, EtcdKvConfig, KvLimits};
    let server = tokio::task::spawn_blocking(crescent_ha::testing::EtcdServer::start).await.unwrap().expect("etcd");
    let mut cfg = EtcdKvConfig::new(vec![server.endpoint()]);
    cfg.limits = KvLimits { max_txn_ops: 10_000, max_request_bytes: 64 << 20 };
    let kv = EtcdKv::connect(cfg).await.unwrap();
    let many = KvTxn { compares: vec![], puts: (0..129).map(|i| pair(&format!("n{i}"), "v")).collect() };
    let err = kv.txn(&many).await.unwrap_err();
    assert!(matches!(err, KvError::Rejected(_)), "{err:?}");
    let big = KvTxn { compares: vec![], puts: vec![KvPair { key: b"big".to_vec(), value: vec![7; 1_600_000] }] };
    let err = kv.txn(&big).await.unwrap_err();
    assert!(matches!(err, KvError::Rejected(_)), "{err:?}");
}

/// A stopped etcd: reads are unavailable, writes ambiguous (they may have been sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_reads_unavailable_writes_ambiguous() {
    use crescent_ha::kv::{EtcdKv, EtcdKvConfig};
    use std::time::Duration;
    let mut server = tokio::task::spawn_blocking(crescent_ha::testing::EtcdServer::start).await.unwrap().expect("etcd");
    let mut cfg = EtcdKvConfig::new(vec![server.endpoint()]);
    cfg.request_timeout = Duration::from_millis(500);
    let kv = EtcdKv::connect(cfg).await.unwrap();
    kv.put(b"a", b"1").await.unwrap();
    server.kill();
    assert!(matches!(kv.get(b"a").await, Err(KvError::Unavailable(_))));
    let err = kv.txn(&KvTxn { compares: vec![], puts: vec![pair("a", "2")] }).await.unwrap_err();
    assert!(err.is_ambiguous(), "{err:?}");
}

/// etcd's history: the revision moves with every write; compacting up to it keeps every current value, and
/// compacting again (or below an earlier compaction) is not an error. The embedded store keeps no history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_history_is_compacted_up_to_a_revision() {
    use crescent_ha::kv::{EmbeddedKv, EtcdKv, EtcdKvConfig};
    let server = tokio::task::spawn_blocking(crescent_ha::testing::EtcdServer::start).await.unwrap().expect("etcd");
    let kv = EtcdKv::connect(EtcdKvConfig::new(vec![server.endpoint()])).await.unwrap();
    let before = kv.revision().await.unwrap();
    for i in 0..5 {
        kv.put(b"k", format!("{i}").as_bytes()).await.unwrap();
    }
    let rev = kv.revision().await.unwrap();
    assert_eq!(rev, before + 5, "each put is a revision");
    kv.compact(rev).await.unwrap();
    assert_eq!(kv.get(b"k").await.unwrap(), Some(b"4".to_vec()), "the current value stays");
    kv.compact(rev).await.unwrap();
    kv.compact(rev - 2).await.unwrap();
    assert!(kv.compact(rev + 100).await.is_err(), "a future revision cannot be compacted");
    let dir = tempfile::tempdir().unwrap();
    let embedded = EmbeddedKv::open(dir.path()).unwrap();
    embedded.put(b"k", b"v").await.unwrap();
    assert_eq!(embedded.revision().await.unwrap(), 0);
    embedded.compact(7).await.unwrap();
}
