//! Segment descriptions for tests that drive the master directly, without a storage node.

use crescent_proto::{SegmentId, SegmentKind, SegmentSpec};

/// A memory segment named `name` of `size` bytes, on no particular host.
pub fn segment(name: &str, size: u64) -> SegmentSpec {
    segment_on(name, size, "")
}

/// A memory segment named `name` of `size` bytes, as a node on `host` would mount it (a fresh id each call; the
/// endpoint is a placeholder nobody connects to).
pub fn segment_on(name: &str, size: u64, host: &str) -> SegmentSpec {
    SegmentSpec {
        id: SegmentId::random(),
        name: name.to_owned(),
        base: 0x1000_0000,
        size,
        endpoint: format!("127.0.0.1:9{:03}", name.len() % 1000),
        kind: SegmentKind::Memory,
        host_id: host.to_owned(),
    }
}
