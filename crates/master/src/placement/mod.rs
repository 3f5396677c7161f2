//! Stateless replica placement.
//!
//! [`Placer`] owns only policy configuration; [`ReplicaPlacement`] binds it to a [`SegmentPool`] and
//! runs one decision under the pool's shared lock ([`PlacementAccess`]), so the segments it chooses cannot be
//! deactivated before the allocator calls complete. Guarantees: replicas of one object land on distinct segment
//! *names*; preferred names are tried first, in order; exclusions always win; the result is best effort (fewer
//! replicas than asked when fewer names fit) and fails with `NO_AVAILABLE_HANDLE` only when none fits.

use crate::segment_pool::{AllocatedBuffer, PlacementAccess, SegmentPool};
use crescent_proto::ErrorCode;
use crescent_proto::SegmentKind;
use std::collections::HashSet;
use std::sync::Arc;

/// How replicas are spread when no preference decides. Written `random`, `free-ratio-first` or `local-first`
/// in config files and on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementPolicy {
    /// Uniformly random start, then consecutive names.
    #[default]
    Random,
    /// Sample a few names and prefer the emptiest (keeps utilisation balanced on uneven segments).
    FreeRatioFirst,
    /// Single-replica writes go to the writer's host first, then the next hosts in lexicographic order.
    LocalFirst,
}

impl PlacementPolicy {
    /// Every policy, in the order help texts list them.
    pub const ALL: [PlacementPolicy; 3] =
        [PlacementPolicy::Random, PlacementPolicy::FreeRatioFirst, PlacementPolicy::LocalFirst];

    /// The policy's name in config files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            PlacementPolicy::Random => "random",
            PlacementPolicy::FreeRatioFirst => "free-ratio-first",
            PlacementPolicy::LocalFirst => "local-first",
        }
    }
}

impl std::fmt::Display for PlacementPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PlacementPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|p| p.name()).collect();
            format!("unknown placement policy {s:?} (one of: {})", names.join(", "))
        })
    }
}

/// One placement request.
#[derive(Debug, Clone)]
pub struct PlacementRequest<'a> {
    /// Which family of segments to use.
    pub kind: SegmentKind,
    /// Bytes per replica.
    pub size: u64,
    /// Replicas wanted.
    pub replica_num: usize,
    /// Names tried first, in order.
    pub preferred: &'a [String],
    /// Names never used.
    pub excluded: &'a [String],
    /// The writer's host (for local-first).
    pub writer_host: Option<&'a str>,
    /// Ask for local-first for this request even if the policy is not [`PlacementPolicy::LocalFirst`].
    pub prefer_same_node: bool,
    /// Hash of the object key; rotates the order of a host's segments so keys spread over them.
    pub key_hash: u64,
}

impl<'a> PlacementRequest<'a> {
    /// A plain request: `replica_num` replicas of `size` bytes in host memory.
    pub fn memory(size: u64, replica_num: usize) -> Self {
        Self {
            kind: SegmentKind::Memory,
            size,
            replica_num,
            preferred: &[],
            excluded: &[],
            writer_host: None,
            prefer_same_node: false,
            key_hash: 0,
        }
    }
}

/// Why placement failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// Size or replica count is zero.
    #[error("invalid placement request: {0}")]
    InvalidParams(&'static str),
    /// No replica fits. `eligible_names` is how many names were candidates (0 = nothing mounted/allowed; more =
    /// everything full, which is what triggers allocation-failure eviction).
    #[error("no segment can hold the object ({eligible_names} candidate names)")]
    NoAvailableHandle {
        /// Candidate names considered.
        eligible_names: usize,
    },
}

impl PlacementError {
    /// The wire code.
    pub fn code(&self) -> ErrorCode {
        match self {
            PlacementError::InvalidParams(_) => ErrorCode::InvalidParams,
            PlacementError::NoAvailableHandle { .. } => ErrorCode::NoAvailableHandle,
        }
    }
}

/// The policy executor: configuration and per-call scratch only, no resources.
#[derive(Debug, Clone)]
pub struct Placer {
    policy: PlacementPolicy,
    /// Free-ratio-first samples `factor × remaining` names per decision.
    sample_factor: usize,
}

impl Placer {
    /// An executor for `policy`.
    pub fn new(policy: PlacementPolicy) -> Self {
        Self { policy, sample_factor: 6 }
    }

    /// The configured policy.
    pub fn policy(&self) -> PlacementPolicy {
        self.policy
    }

    /// Places up to `req.replica_num` replicas using the locked view `access`.
    pub fn allocate(
        &self,
        access: &PlacementAccess<'_>,
        req: &PlacementRequest<'_>,
    ) -> Result<Vec<AllocatedBuffer>, PlacementError> {
        if req.size == 0 {
            return Err(PlacementError::InvalidParams("size is 0"));
        }
        if req.replica_num == 0 {
            return Err(PlacementError::InvalidParams("replica_num is 0"));
        }
        // CXL objects live once in the shared device window.
        let want = if req.kind == SegmentKind::Cxl { 1 } else { req.replica_num };
        let names = access.names(req.kind);
        let excluded: HashSet<&str> = req.excluded.iter().map(String::as_str).collect();
        let mut used: HashSet<Arc<str>> = HashSet::new();
        let mut out = Vec::with_capacity(want);

        let mut preferred: Vec<Arc<str>> = req.preferred.iter().map(|s| Arc::from(s.as_str())).collect();
        let local_first = self.policy == PlacementPolicy::LocalFirst || req.prefer_same_node;
        if local_first
            && want == 1
            && let Some(host) = req.writer_host.filter(|h| !h.is_empty())
        {
            for n in host_ordered_names(access, req.kind, host, req.key_hash) {
                if !preferred.contains(&n) {
                    preferred.push(n);
                }
            }
        }
        let mut try_name = |name: &Arc<str>, out: &mut Vec<AllocatedBuffer>| {
            if out.len() >= want || excluded.contains(&**name) || used.contains(name) {
                return;
            }
            if let Ok(b) = access.allocate_on(req.kind, name, req.size) {
                used.insert(name.clone());
                out.push(b);
            }
        };
        for name in &preferred {
            try_name(name, &mut out);
        }
        if out.len() < want && !names.is_empty() {
            let start = fastrand::usize(..names.len());
            if self.policy == PlacementPolicy::FreeRatioFirst {
                let remaining = want - out.len();
                let sample = (self.sample_factor * remaining).min(names.len());
                let mut scored: Vec<(f64, &Arc<str>)> = (0..names.len())
                    .map(|i| &names[(start + i) % names.len()])
                    .filter(|n| !excluded.contains(&***n))
                    .take(sample)
                    .map(|n| (access.free_ratio(req.kind, n), n))
                    .collect();
                scored.sort_by(|a, b| b.0.total_cmp(&a.0));
                for (_, n) in scored {
                    try_name(n, &mut out);
                }
            }
            for i in 0..names.len() {
                if out.len() >= want {
                    break;
                }
                try_name(&names[(start + i) % names.len()], &mut out);
            }
        }
        if out.is_empty() {
            let eligible = names.iter().filter(|n| !excluded.contains(&***n)).count();
            return Err(PlacementError::NoAvailableHandle { eligible_names: eligible });
        }
        Ok(out)
    }
}

/// The local-first order: the writer's host (or the next host in lexicographic order if it has no segment),
/// then every other host cyclically; within a host, names sorted and rotated by `key_hash`.
pub fn host_ordered_names(
    access: &PlacementAccess<'_>,
    kind: SegmentKind,
    writer_host: &str,
    key_hash: u64,
) -> Vec<Arc<str>> {
    let hosts: Vec<(&Arc<str>, Vec<&Arc<str>>)> = access.hosts(kind).collect();
    if hosts.is_empty() || writer_host.is_empty() {
        return Vec::new();
    }
    let start = hosts.iter().position(|(h, _)| &***h >= writer_host).unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..hosts.len() {
        let (_, names) = &hosts[(start + i) % hosts.len()];
        if names.is_empty() {
            continue;
        }
        let rot = (key_hash % names.len() as u64) as usize;
        out.extend((0..names.len()).map(|j| Arc::clone(names[(rot + j) % names.len()])));
    }
    out
}

/// Replica placement bound to one pool: a static pairing of executor and source, owning neither.
#[derive(Debug, Clone, Copy)]
pub struct ReplicaPlacement<'a> {
    pool: &'a SegmentPool,
    allocator: &'a Placer,
}

impl<'a> ReplicaPlacement<'a> {
    /// Binds `allocator` to `pool`.
    pub fn new(pool: &'a SegmentPool, allocator: &'a Placer) -> Self {
        Self { pool, allocator }
    }

    /// Places replicas for one object (best effort, distinct names).
    pub fn place(&self, req: &PlacementRequest<'_>) -> Result<Vec<AllocatedBuffer>, PlacementError> {
        let access = self.pool.placement_access();
        self.allocator.allocate(&access, req)
    }

    /// Allocates one buffer from the segment(s) named `name` (copy/move targets).
    pub fn allocate_from(&self, kind: SegmentKind, name: &str, size: u64) -> Result<AllocatedBuffer, PlacementError> {
        if size == 0 {
            return Err(PlacementError::InvalidParams("size is 0"));
        }
        let access = self.pool.placement_access();
        let eligible = usize::from(access.has_name(kind, name));
        access.allocate_on(kind, name, size).map_err(|_| PlacementError::NoAvailableHandle { eligible_names: eligible })
    }
}
