//! Per-write placement and retention options.

use serde::{Deserialize, Serialize};

/// What a write does to the object's soft pin (a deadline that makes eviction take the object last).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[repr(u8)]
pub enum SoftPinAction {
    /// Keep the existing deadline (none for a new object).
    #[default]
    Preserve = 0,
    /// Set the deadline to commit time + TTL.
    Enable = 1,
    /// Clear the deadline.
    Disable = 2,
}

/// What kind of data an object holds; stored and reported, no policy depends on it yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum ObjectDataType {
    #[default]
    Unknown = 0,
    KvCache = 1,
    Tensor = 2,
    Weight = 3,
    Sample = 4,
    Activation = 5,
    Gradient = 6,
    OptimizerState = 7,
    Metadata = 8,
    General = 9,
}

impl ObjectDataType {
    /// The type of its number (`self as u8`), `None` for a number no type has.
    pub fn from_number(n: u8) -> Option<Self> {
        use ObjectDataType as T;
        Some(match n {
            0 => T::Unknown,
            1 => T::KvCache,
            2 => T::Tensor,
            3 => T::Weight,
            4 => T::Sample,
            5 => T::Activation,
            6 => T::Gradient,
            7 => T::OptimizerState,
            8 => T::Metadata,
            9 => T::General,
            _ => return None,
        })
    }
}

/// Longest group name in bytes: a group's removal names it in the operation log where a key goes, so it shares the
/// key's limit; a longer name is refused before anything changes.
pub const MAX_GROUP_LEN: usize = crate::key::MAX_KEY_LEN;

/// How a write wants its replicas placed and its object retained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicateConfig {
    /// Memory replicas wanted; best effort (at least one must be placed), each on a distinct segment name.
    pub replica_num: u32,
    /// NoF (NVMe-over-Fabrics) replicas wanted.
    pub nof_replica_num: u32,
    /// Soft-pin change this write commits at its first PutEnd.
    pub soft_pin_action: SoftPinAction,
    /// Soft-pin TTL; only meaningful with [`SoftPinAction::Enable`] (master default when `None`).
    pub soft_pin_ttl_ms: Option<u64>,
    /// Never evict this object (still removable).
    pub with_hard_pin: bool,
    /// Segment names tried first, in order, before the placement policy's own choice.
    pub preferred_segments: Vec<String>,
    /// NoF segment names tried first, in order.
    pub preferred_nof_segments: Vec<String>,
    /// Place a single replica on the writer's host if it has room (local-first for this write).
    pub prefer_same_node: bool,
    /// The writer's host; the master uses the client's registered host when `None`.
    pub host_id: Option<String>,
    /// Explicit group: `None` = ungrouped (an upsert keeps the existing group), `Some("")` = explicitly
    /// ungrouped, `Some(g)` = member of group `g` (membership is immutable once created).
    pub group_id: Option<String>,
    /// Stored with the object.
    pub data_type: ObjectDataType,
    /// When memory eviction takes the object, keep its bytes on the disk tier of the node that held them
    /// (default); `false` marks it not worth keeping: it is dropped.
    pub offload: bool,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        Self {
            replica_num: 1,
            nof_replica_num: 0,
            soft_pin_action: SoftPinAction::Preserve,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segments: Vec::new(),
            preferred_nof_segments: Vec::new(),
            prefer_same_node: false,
            host_id: None,
            group_id: None,
            data_type: ObjectDataType::Unknown,
            offload: true,
        }
    }
}

impl ReplicateConfig {
    /// A config asking for `n` memory replicas and nothing else.
    pub fn with_replicas(n: u32) -> Self {
        Self { replica_num: n, ..Self::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_references() {
        let c = ReplicateConfig::default();
        assert_eq!(c.replica_num, 1);
        assert_eq!(c.soft_pin_action, SoftPinAction::Preserve);
        assert!(!c.with_hard_pin && !c.prefer_same_node && c.group_id.is_none());
        assert_eq!(ReplicateConfig::with_replicas(3).replica_num, 3);
    }

    #[test]
    fn config_round_trips() {
        let c = ReplicateConfig {
            soft_pin_action: SoftPinAction::Enable,
            soft_pin_ttl_ms: Some(5),
            group_id: Some(String::new()),
            data_type: ObjectDataType::KvCache,
            preferred_segments: vec!["a".into(), "b".into()],
            ..ReplicateConfig::with_replicas(2)
        };
        let bytes = postcard::to_stdvec(&c).unwrap();
        assert_eq!(postcard::from_bytes::<ReplicateConfig>(&bytes).unwrap(), c);
    }
}
