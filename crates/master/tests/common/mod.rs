//! Shared test helpers (included with `mod common;`).
#![allow(dead_code)]

use crescent_master::segment_pool::{PoolConfig, SegmentPool};
use crescent_proto::{ClientId, SegmentId, SegmentKind, SegmentSpec};

pub const MIB: u64 = 1 << 20;

pub fn spec(name: &str, size: u64) -> SegmentSpec {
    spec_on(name, size, "")
}

pub fn spec_on(name: &str, size: u64, host: &str) -> SegmentSpec {
    SegmentSpec {
        id: SegmentId::random(),
        name: name.to_owned(),
        base: 0x1000_0000,
        size,
        endpoint: format!("127.0.0.1:9{:03}", name.len()),
        kind: SegmentKind::Memory,
        host_id: host.to_owned(),
    }
}

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
