//! One client's overlapping writes of one key: each write ends only itself, so the object always holds the
//! bytes of one acknowledged write, under that write's checksum (before writes were named, a preempted write's
//! End published the newer write's half-written bytes under the older checksum: a persistent
//! CHECKSUM_MISMATCH).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_proto::ReplicateConfig;
use crescent_testkit::{LocalCluster, pattern};

const WRITERS: u8 = 6;
const SIZE: usize = 256 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_upserts_through_one_client_leave_one_acknowledged_value() {
    let cluster = LocalCluster::start(1, 64 << 20).await;
    let client = cluster.client();
    let cfg = ReplicateConfig::default();
    for round in 0..40u8 {
        let writes = (0..WRITERS).map(|w| {
            let (client, cfg) = (client.clone(), cfg.clone());
            let seed = u64::from(round) * u64::from(WRITERS) + u64::from(w);
            tokio::spawn(async move {
                let value = pattern(SIZE, seed);
                if round % 2 == 0 {
                    client.upsert_from("k", &value, &cfg).await.map(|()| value)
                } else {
                    let mut r = client.batch_upsert_from(&[("k", &value[..])], &cfg).await;
                    r.remove(0).map(|()| value)
                }
            })
        });
        let mut acknowledged = Vec::new();
        for w in futures_util::future::join_all(writes).await {
            if let Ok(v) = w.unwrap() {
                acknowledged.push(v);
            }
        }
        assert!(!acknowledged.is_empty(), "round {round}: the last write to start is never preempted");
        let got = client.get("k").await.unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(acknowledged.contains(&got), "round {round}: the object holds bytes no acknowledged write wrote");
    }
    cluster.shutdown().await;
}
