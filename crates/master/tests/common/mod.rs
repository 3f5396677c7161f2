//! Shared test helpers (included with `mod common;`).
#![allow(dead_code)]

use crescent_master::segment_pool::{PoolConfig, SegmentPool};
use crescent_proto::{ClientId, SegmentId, SegmentKind};

pub const MIB: u64 = 1 << 20;

pub use crescent_testkit::{segment as spec, segment_on as spec_on};

pub fn pool() -> SegmentPool {
    SegmentPool::new(PoolConfig::default()).unwrap()
}

/// Mounts `n` segments `seg0..seg{n-1}` of `size` bytes, one client each; returns (client, id) pairs.
pub fn mount_n(pool: &SegmentPool, n: usize, size: u64) -> Vec<(ClientId, SegmentId)> {
    (0..n)
        .map(|i| {
            let c = ClientId::random();
            let s = spec(&format!("seg{i}"), size);
            let id = s.id;
            pool.mount(c, s).unwrap();
            (c, id)
        })
        .collect()
}

use crescent_master::clock::{ManualClock, Timestamp};
use crescent_master::service::{MasterConfig, MasterService};
use crescent_proto::{ErrorCode, ReplicaDescriptor, ReplicateConfig};
use std::sync::Arc;
use std::time::Duration;

/// A master on a manual clock with `n` memory segments of `size` bytes (one client each).
pub struct Harness {
    pub svc: MasterService,
    pub clock: Arc<ManualClock>,
    pub writer: ClientId,
    pub segments: Vec<(ClientId, SegmentId)>,
}

impl Harness {
    pub fn new(config: MasterConfig, n: usize, size: u64) -> Self {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let svc = MasterService::new(config, clock.clone()).unwrap();
        let segments = (0..n)
            .map(|i| {
                let c = ClientId::random();
                let s = spec_on(&format!("seg{i}"), size, &format!("host{i}"));
                let id = s.id;
                svc.mount_segment(c, s).unwrap();
                (c, id)
            })
            .collect();
        Self { svc, clock, writer: ClientId::random(), segments }
    }

    pub fn default3() -> Self {
        Self::new(MasterConfig::default(), 3, 64 * MIB)
    }

    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    pub fn put_in(
        &self,
        tenant: &str,
        key: &str,
        size: u64,
        cfg: &ReplicateConfig,
    ) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        let d = self.svc.put_start(self.writer, tenant, key, size, cfg)?;
        self.svc.put_end(self.writer, tenant, key, Some(0xC0FFEE))?;
        Ok(d)
    }

    pub fn put(&self, key: &str, size: u64) -> Vec<ReplicaDescriptor> {
        self.put_in("", key, size, &ReplicateConfig::default()).unwrap()
    }

    pub fn get(&self, key: &str) -> Result<crescent_master::service::GetReplicaListResponse, ErrorCode> {
        self.svc.get_replica_list("", key)
    }

    pub fn used(&self) -> u64 {
        self.svc.pool().usage(SegmentKind::Memory).used
    }
}

use crescent_master::ha::{HaStatus, ReplayState};
use crescent_master::server::CandidateServer;

/// How long the HA tests wait for a candidate's state or the log's durability.
pub const HA_WAIT: Duration = Duration::from_secs(30);

/// Waits until `c`'s status satisfies `f`.
pub async fn until(c: &CandidateServer, what: &str, f: impl Fn(&HaStatus) -> bool) -> HaStatus {
    let mut rx = c.subscribe();
    match tokio::time::timeout(HA_WAIT, rx.wait_for(|s| f(s))).await {
        Ok(Ok(s)) => s.clone(),
        _ => panic!("{what}: not reached within {HA_WAIT:?}; status {:?}", c.status()),
    }
}

/// Waits until everything `svc` committed is durable; returns the last sequence.
pub async fn durable(svc: &MasterService) -> u64 {
    let log = svc.oplog().unwrap();
    let seq = log.last_committed();
    log.wait_durable(seq, HA_WAIT).await.unwrap();
    seq
}

/// `s` without what two masters holding the same metadata may differ in: soft-pin remainders, the last sequence.
pub fn without_pins(mut s: ReplayState) -> ReplayState {
    s.objects.clear_soft_pins();
    s.last_seq = 0;
    s
}
