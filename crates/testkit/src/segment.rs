//! Segment descriptions for tests that drive the master directly, without a storage node.

use crescent_proto::{SegmentId, SegmentKind, SegmentSpec};

/// A memory segment named `name` of `size` bytes, on no particular host.
pub fn segment(name: &str, size: u64) -> SegmentSpec {
    segment_on(name, size, "")
}

/// A memory segment named `name` of `size` bytes, as a node on `host` would mount it (a fresh id each call; the
/// endpoint is a placeholder nobody connects to, one per name: the master takes a mount by another client at
/// the same endpoint for a restarted node and drops the older instance's segments there).
pub fn segment_on(name: &str, size: u64, host: &str) -> SegmentSpec {
    SegmentSpec {
        id: SegmentId::random(),
        name: name.to_owned(),
        base: 0x1000_0000,
        size,
        endpoint: format!("127.0.0.1:{}", placeholder_port(name)),
        kind: SegmentKind::Memory,
        host_id: host.to_owned(),
    }
}

/// A port in 10000..60000 that depends only on `name` (FNV-1a), so distinct names get distinct endpoints.
fn placeholder_port(name: &str) -> u16 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    10_000 + (hash % 50_000) as u16
}
