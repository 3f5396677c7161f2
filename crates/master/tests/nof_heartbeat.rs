//! The NoF heartbeat over real sockets: a running master probes its NoF segments' targets (real transfer
//! servers on loopback) with data-plane reads, keeps a segment whose target answers and unmounts one whose
//! target stops. Waits are bounded polls of the master's state, never fixed sleeps.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_master::server::{MasterServer, NofProber, TransferProber};
use crescent_master::service::{MasterConfig, MasterService};
use crescent_proto::{ClientId, ErrorCode, ReplicateConfig, SegmentId, SegmentKind, SegmentSpec, SegmentStatus};
use crescent_testkit::eventually;
use crescent_transfer::{SegmentMemory, SegmentRegistry, TransferServer, TransferServerHandle};
use futures_util::future::BoxFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const INTERVAL_MS: u64 = 150;
const FAILURES: u32 = 3;
const PROBE_TIMEOUT_MS: u64 = 1_000;
/// A bound on conditions that hold within a few intervals; generous for a loaded 2-core host.
const DEADLINE: Duration = Duration::from_secs(20);
/// How soon a dead target's segment must be gone: its failed probes (each refused at once, at worst timing
/// out) one interval apart, plus slack for a loaded host.
const UNMOUNT_DEADLINE: Duration = Duration::from_millis(FAILURES as u64 * INTERVAL_MS + PROBE_TIMEOUT_MS + 5_000);

fn config() -> MasterConfig {
    MasterConfig {
        nof_heartbeat_interval_ms: INTERVAL_MS,
        nof_probe_timeout_ms: PROBE_TIMEOUT_MS,
        nof_heartbeat_failures: FAILURES,
        ..MasterConfig::default()
    }
}

/// A transfer server on a free loopback port hosting one 1 MiB segment `id`.
fn target(id: SegmentId) -> TransferServerHandle {
    let segments = SegmentRegistry::new();
    segments.register(id, Arc::new(SegmentMemory::anonymous(1 << 20).unwrap()));
    TransferServer::bind("127.0.0.1:0".parse().unwrap(), segments).unwrap().spawn().unwrap()
}

fn nof_spec(id: SegmentId, endpoint: SocketAddr) -> SegmentSpec {
    SegmentSpec {
        id,
        name: "nof0".into(),
        base: 0,
        size: 1 << 20,
        endpoint: endpoint.to_string(),
        kind: SegmentKind::Nof,
        host_id: String::new(),
    }
}

/// The real prober, counting what its probes found.
#[derive(Default)]
struct Counting {
    inner: Option<TransferProber>,
    answered: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl NofProber for Counting {
    fn probe(&self, endpoint: &str, segment: SegmentId) -> BoxFuture<'static, bool> {
        let probe = self.inner.as_ref().expect("a prober").probe(endpoint, segment);
        let (answered, failed) = (self.answered.clone(), self.failed.clone());
        Box::pin(async move {
            let mut unresolved = Unresolved(Some(failed.clone()));
            let ok = probe.await;
            unresolved.0 = None;
            if ok { &answered } else { &failed }.fetch_add(1, Ordering::Relaxed);
            ok
        })
    }
}

/// Counts a probe dropped before it resolved (the heartbeat's timeout cut it off) as a failure.
struct Unresolved(Option<Arc<AtomicU64>>);

impl Drop for Unresolved {
    fn drop(&mut self) {
        if let Some(failed) = &self.0 {
            failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn gone(svc: &MasterService, id: SegmentId) -> bool {
    eventually(UNMOUNT_DEADLINE, || async { svc.segment_status(id) == Err(ErrorCode::SegmentNotFound) }).await
}

async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nof_segment_stays_while_its_target_answers_and_is_unmounted_once_it_stops() {
    let prober = Arc::new(Counting {
        inner: Some(TransferProber::new(Duration::from_millis(PROBE_TIMEOUT_MS), None, None)),
        ..Counting::default()
    });
    let admin = SocketAddr::from(([127, 0, 0, 1], 0));
    let master =
        MasterServer::builder(config()).admin_addr(Some(admin)).nof_prober(prober.clone()).start().await.unwrap();
    let svc = master.service().clone();
    let id = SegmentId::random();
    let node = target(id);
    svc.mount_segment(ClientId::random(), nof_spec(id, node.local_addr())).unwrap();
    let writer = ClientId::random();
    let nof_only = ReplicateConfig { replica_num: 0, nof_replica_num: 1, ..ReplicateConfig::default() };
    svc.put_start(writer, "", "on-nof", 100, &nof_only).unwrap();
    svc.put_end(writer, "", "on-nof", None).unwrap();

    // Several intervals' worth of answered probes, the segment mounted throughout.
    let answered = || prober.answered.load(Ordering::Relaxed);
    assert!(eventually(DEADLINE, || async { answered() >= 5 }).await, "probes answered: {}", answered());
    assert_eq!(prober.failed.load(Ordering::Relaxed), 0);
    assert_eq!(svc.segment_status(id), Ok(SegmentStatus::Ok));
    assert!(svc.get_replica_list("", "on-nof").is_ok());
    assert!(node.stats().accepted >= 1, "the probes reached the target");

    // The target goes away: the segment goes after `FAILURES` probes in a row, not at the first (no probe
    // follows the unmount, so the count of failures is final once it is gone).
    node.shutdown().await;
    let stopped = Instant::now();
    assert!(gone(&svc, id).await, "the segment of a dead target is still mounted after {:?}", stopped.elapsed());
    assert_eq!(prober.failed.load(Ordering::Relaxed), u64::from(FAILURES));
    assert_eq!(svc.get_replica_list("", "on-nof").unwrap_err(), ErrorCode::ObjectNotFound);
    assert_eq!(svc.metrics().nof_unmounted_segments.load(Ordering::Relaxed), 1);
    let metrics = http_get(master.admin_addr().unwrap(), "/metrics").await;
    assert!(metrics.lines().any(|l| l == "crescent_master_nof_unmounted_segments_total 1"), "{metrics}");
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_does_not_host_the_segment_fails_the_default_probe() {
    let master = MasterServer::builder(config()).start().await.unwrap();
    let svc = master.service().clone();
    // A live transfer server, but hosting another segment: the probe's read is refused (SEGMENT_NOT_FOUND).
    let node = target(SegmentId::random());
    let id = SegmentId::random();
    svc.mount_segment(ClientId::random(), nof_spec(id, node.local_addr())).unwrap();
    assert!(gone(&svc, id).await, "a segment its target does not serve is still mounted");
    assert!(node.stats().accepted >= 1, "the probes reached the target");
    master.shutdown().await;
}
