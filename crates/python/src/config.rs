//! `ReplicateConfig`, the module's enums, and the size strings of `setup(dict)`.

use crescent_proto as proto;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

/// What a write does to the object's soft pin (`SoftPinAction` of the original).
#[pyclass(module = "crescent.store", eq, eq_int, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum SoftPinAction {
    /// Keep the existing deadline (none for a new object).
    PRESERVE = 0,
    /// Set the deadline to commit time + `soft_pin_ttl_ms`.
    ENABLE = 1,
    /// Clear the deadline.
    DISABLE = 2,
}

/// What kind of data an object holds (`ObjectDataType` of the original; stored with the object).
#[pyclass(module = "crescent.store", eq, eq_int, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms, missing_docs)]
pub enum ObjectDataType {
    UNKNOWN = 0,
    KVCACHE = 1,
    TENSOR = 2,
    WEIGHT = 3,
    SAMPLE = 4,
    ACTIVATION = 5,
    GRADIENT = 6,
    OPTIMIZER_STATE = 7,
    METADATA = 8,
    GENERAL = 9,
}

impl ObjectDataType {
    /// Every value with its name (exported at module level too, as the original does).
    pub const ALL: [(&'static str, ObjectDataType); 10] = [
        ("UNKNOWN", ObjectDataType::UNKNOWN),
        ("KVCACHE", ObjectDataType::KVCACHE),
        ("TENSOR", ObjectDataType::TENSOR),
        ("WEIGHT", ObjectDataType::WEIGHT),
        ("SAMPLE", ObjectDataType::SAMPLE),
        ("ACTIVATION", ObjectDataType::ACTIVATION),
        ("GRADIENT", ObjectDataType::GRADIENT),
        ("OPTIMIZER_STATE", ObjectDataType::OPTIMIZER_STATE),
        ("METADATA", ObjectDataType::METADATA),
        ("GENERAL", ObjectDataType::GENERAL),
    ];

    fn to_proto(self) -> proto::ObjectDataType {
        use proto::ObjectDataType as P;
        match self {
            ObjectDataType::UNKNOWN => P::Unknown,
            ObjectDataType::KVCACHE => P::KvCache,
            ObjectDataType::TENSOR => P::Tensor,
            ObjectDataType::WEIGHT => P::Weight,
            ObjectDataType::SAMPLE => P::Sample,
            ObjectDataType::ACTIVATION => P::Activation,
            ObjectDataType::GRADIENT => P::Gradient,
            ObjectDataType::OPTIMIZER_STATE => P::OptimizerState,
            ObjectDataType::METADATA => P::Metadata,
            ObjectDataType::GENERAL => P::General,
        }
    }
}

/// A replica's state (`ReplicaStatus` of the original).
#[pyclass(module = "crescent.store", eq, eq_int, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms, missing_docs)]
pub enum ReplicaStatus {
    UNDEFINED = 0,
    INITIALIZED = 1,
    PROCESSING = 2,
    COMPLETE = 3,
    REMOVED = 4,
    FAILED = 5,
}

/// What a copy or move task does (`TaskType` of the original).
#[pyclass(module = "crescent.store", eq, eq_int, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms, missing_docs)]
pub enum TaskType {
    REPLICA_COPY = 0,
    REPLICA_MOVE = 1,
}

/// Where a copy or move task stands (`TaskStatus` of the original).
#[pyclass(module = "crescent.store", eq, eq_int, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms, missing_docs)]
pub enum TaskStatus {
    PENDING = 0,
    PROCESSING = 1,
    FAILED = 2,
    SUCCESS = 3,
}

/// A task as `query_task` answers it (`QueryTaskResponse` of the original; ids are `(high, low)` pairs).
#[pyclass(module = "crescent.store", frozen, get_all)]
#[derive(Clone, Debug)]
pub struct QueryTaskResponse {
    /// The task.
    pub id: (u64, u64),
    /// Copy or move.
    pub r#type: TaskType,
    /// Where it stands.
    pub status: TaskStatus,
    /// Creation time, Unix ms.
    pub created_at_ms_epoch: i64,
    /// Last status change, Unix ms.
    pub last_updated_at_ms_epoch: i64,
    /// The storage node making the copy.
    pub assigned_client: (u64, u64),
    /// Empty while under way; the outcome once ended.
    pub message: String,
}

impl From<proto::TaskInfo> for QueryTaskResponse {
    fn from(t: proto::TaskInfo) -> Self {
        Self {
            id: t.id.as_u64_pair(),
            r#type: match t.kind {
                proto::TaskKind::Copy => TaskType::REPLICA_COPY,
                proto::TaskKind::Move => TaskType::REPLICA_MOVE,
            },
            status: match t.status {
                proto::TaskStatus::Pending => TaskStatus::PENDING,
                proto::TaskStatus::Processing => TaskStatus::PROCESSING,
                proto::TaskStatus::Failed => TaskStatus::FAILED,
                proto::TaskStatus::Success => TaskStatus::SUCCESS,
            },
            created_at_ms_epoch: i64::try_from(t.created_at_ms).unwrap_or(i64::MAX),
            last_updated_at_ms_epoch: i64::try_from(t.updated_at_ms).unwrap_or(i64::MAX),
            assigned_client: t.assigned_client.as_u64_pair(),
            message: t.message,
        }
    }
}

#[pymethods]
impl QueryTaskResponse {
    fn __repr__(&self) -> String {
        format!(
            "QueryTaskResponse(id={:?}, type={:?}, status={:?}, message={:?})",
            self.id, self.r#type, self.status, self.message
        )
    }
}

/// How a write wants its replicas placed and its object retained: the original's `ReplicateConfig`, every
/// attribute read-write.
#[pyclass(module = "crescent.store", from_py_object)]
#[derive(Clone, Debug)]
pub struct ReplicateConfig {
    /// Memory replicas wanted (best effort, each on a distinct segment; at least 1).
    #[pyo3(get, set)]
    pub replica_num: u64,
    /// NoF replicas wanted.
    #[pyo3(get, set)]
    pub nof_replica_num: u64,
    /// DFS replicas wanted (accepted; Crescent places none).
    #[pyo3(get, set)]
    pub dfs_replica_num: u64,
    /// What the write does to the soft pin.
    #[pyo3(get, set)]
    pub soft_pin_action: SoftPinAction,
    /// The soft-pin TTL (`None`: the master's default).
    #[pyo3(get)]
    pub soft_pin_ttl_ms: Option<u64>,
    /// Never evict the object.
    #[pyo3(get, set)]
    pub with_hard_pin: bool,
    /// Segments tried first, in order.
    #[pyo3(get, set)]
    pub preferred_segments: Vec<String>,
    /// One segment tried first (before `preferred_segments`).
    #[pyo3(get, set)]
    pub preferred_segment: String,
    /// NoF segments tried first.
    #[pyo3(get, set)]
    pub preferred_nof_segments: Vec<String>,
    /// Place the replica on the writer's host when it has room.
    #[pyo3(get, set)]
    pub prefer_alloc_in_same_node: bool,
    /// Stored with the object.
    #[pyo3(get, set)]
    pub data_type: ObjectDataType,
    /// Explicit groups: one id for every key of the call, or one per key of a batch (any other count is refused).
    #[pyo3(get, set)]
    pub group_ids: Option<Vec<String>>,
    /// When memory eviction takes the object, keep it on the disk tier of the node that held it (default);
    /// false drops it (a Crescent extension).
    #[pyo3(get, set)]
    pub offload: bool,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        Self {
            replica_num: 1,
            nof_replica_num: 0,
            dfs_replica_num: 0,
            soft_pin_action: SoftPinAction::PRESERVE,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segments: Vec::new(),
            preferred_segment: String::new(),
            preferred_nof_segments: Vec::new(),
            prefer_alloc_in_same_node: false,
            data_type: ObjectDataType::UNKNOWN,
            group_ids: None,
            offload: true,
        }
    }
}

/// A soft-pin TTL from Python: `None` or an int in `0..2^64`; anything else is a `TypeError` (as the
/// original's binding raises), never an `OverflowError`.
fn ttl_from(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    match value {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => v.extract::<u64>().map(Some).map_err(|_| {
            PyTypeError::new_err(format!("soft_pin_ttl_ms must be None or an int in [0, 2**64), not {v}"))
        }),
    }
}

#[pymethods]
impl ReplicateConfig {
    #[new]
    #[pyo3(signature = (*, replica_num=1, nof_replica_num=0, dfs_replica_num=0, soft_pin_action=SoftPinAction::PRESERVE,
        soft_pin_ttl_ms=None, with_hard_pin=false, preferred_segments=Vec::new(), preferred_segment=String::new(),
        preferred_nof_segments=Vec::new(), prefer_alloc_in_same_node=false, data_type=ObjectDataType::UNKNOWN,
        group_ids=None, offload=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        replica_num: u64,
        nof_replica_num: u64,
        dfs_replica_num: u64,
        soft_pin_action: SoftPinAction,
        soft_pin_ttl_ms: Option<&Bound<'_, PyAny>>,
        with_hard_pin: bool,
        preferred_segments: Vec<String>,
        preferred_segment: String,
        preferred_nof_segments: Vec<String>,
        prefer_alloc_in_same_node: bool,
        data_type: ObjectDataType,
        group_ids: Option<Vec<String>>,
        offload: bool,
    ) -> PyResult<Self> {
        Ok(Self {
            replica_num,
            nof_replica_num,
            dfs_replica_num,
            soft_pin_action,
            soft_pin_ttl_ms: ttl_from(soft_pin_ttl_ms)?,
            with_hard_pin,
            preferred_segments,
            preferred_segment,
            preferred_nof_segments,
            prefer_alloc_in_same_node,
            data_type,
            group_ids,
            offload,
        })
    }

    #[setter]
    fn set_soft_pin_ttl_ms(&mut self, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.soft_pin_ttl_ms = ttl_from(value)?;
        Ok(())
    }

    fn __str__(&self) -> String {
        let ttl = self.soft_pin_ttl_ms.map_or("None".to_owned(), |t| t.to_string());
        let groups = self.group_ids.as_ref().map_or("None".to_owned(), |g| format!("{g:?}"));
        format!(
            "ReplicateConfig: {{ replica_num: {}, nof_replica_num: {}, dfs_replica_num: {}, soft_pin_action: {:?}, \
             soft_pin_ttl_ms: {ttl}, with_hard_pin: {}, preferred_segments: {:?}, preferred_segment: {:?}, \
             preferred_nof_segments: {:?}, prefer_alloc_in_same_node: {}, data_type: {:?}, group_ids: {groups}, \
             offload: {} }}",
            self.replica_num,
            self.nof_replica_num,
            self.dfs_replica_num,
            self.soft_pin_action,
            self.with_hard_pin,
            self.preferred_segments,
            self.preferred_segment,
            self.preferred_nof_segments,
            self.prefer_alloc_in_same_node,
            self.data_type,
            self.offload,
        )
    }

    fn __repr__(&self) -> String {
        self.__str__()
    }
}

impl ReplicateConfig {
    /// The wire config for a write of `group` (`None`: the config's single group id, if it has exactly one).
    /// `None` if the config is invalid
    /// (`replica_num` 0 or beyond `u32`, or several `group_ids` for a single key; upsert-style soft-pin misuse is
    /// checked by the caller).
    pub fn to_proto(&self, group: Option<&str>) -> Option<proto::ReplicateConfig> {
        let replica_num = u32::try_from(self.replica_num).ok().filter(|&n| n >= 1)?;
        let nof_replica_num = u32::try_from(self.nof_replica_num).ok()?;
        // Segment names as the master knows them: a store's own is `get_hostname()`, as the original names it.
        let mut preferred: Vec<String> = Vec::new();
        if !self.preferred_segment.is_empty() {
            preferred.push(self.preferred_segment.clone());
        }
        preferred.extend(self.preferred_segments.iter().cloned());
        let group_id = match group {
            Some(g) => Some(g.to_owned()),
            None => match self.group_ids.as_deref() {
                Some([g]) => Some(g.clone()),
                None | Some([]) => None,
                // Several ids name one group per key: only a batch can use them (`wire_batch`).
                Some(_) => return None,
            },
        };
        Some(proto::ReplicateConfig {
            replica_num,
            nof_replica_num,
            soft_pin_action: match self.soft_pin_action {
                SoftPinAction::PRESERVE => proto::SoftPinAction::Preserve,
                SoftPinAction::ENABLE => proto::SoftPinAction::Enable,
                SoftPinAction::DISABLE => proto::SoftPinAction::Disable,
            },
            soft_pin_ttl_ms: self.soft_pin_ttl_ms,
            with_hard_pin: self.with_hard_pin,
            preferred_segments: preferred,
            preferred_nof_segments: self.preferred_nof_segments.clone(),
            prefer_same_node: self.prefer_alloc_in_same_node,
            host_id: None,
            group_id,
            data_type: self.data_type.to_proto(),
            offload: self.offload,
        })
    }
}

/// A size of `setup(dict)`: a number (a fraction allowed), optional spaces, an optional case-insensitive unit
/// (`B`, `K`/`KB`, `M`/`MB`, `G`/`GB`, `T`/`TB`, powers of 1024), or `infinite`. `None` for anything else.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("infinite") {
        return Some(u64::MAX);
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    if number.is_empty() || number == "." {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    let shift = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" => 10,
        "m" | "mb" => 20,
        "g" | "gb" => 30,
        "t" | "tb" => 40,
        _ => return None,
    };
    let bytes = value * f64::from(1u32 << 10).powi(shift / 10);
    // `as` saturates; a size past u64 is as good as infinite.
    (bytes.is_finite() && bytes >= 0.0).then_some(bytes as u64)
}
