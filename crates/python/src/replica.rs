//! Where an object's replicas are, as the original's `get_replica_desc` reports them: `ReplicaDescriptor`
//! (status and kind), `MemoryDescriptor` → `Descriptor` (`buffer_address`, `size`, `transport_endpoint`), and
//! `DiskDescriptor`. Crescent has no shared-filesystem tier (the original's `DISK` replicas, files under the
//! master's `root_fs_dir`), so no replica is a "disk" replica; a replica on a node's disk tier — what memory
//! eviction keeps on the SSD of the node that held it, as the original's `enable_ssd_offload` keeps it on the
//! client's SSD — is a local disk replica (`LOCAL_DISK`), as is a LocalSSD one. `buffer_address` is the replica's
//! offset inside its segment (Crescent's replicas are named by segment and offset, not by an address in the
//! owner's process); the segment's id is `segment_id`.

use crate::config::ReplicaStatus;
use crescent_proto::{ReplicaDescriptor as Wire, ReplicaLocation, ReplicaStatus as WireStatus};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// A memory (or NoF) replica's range: the original's transfer `Descriptor`.
#[pyclass(module = "crescent.store", name = "Descriptor", frozen)]
#[derive(Clone, Debug)]
pub struct Descriptor {
    /// The replica's offset inside its segment.
    #[pyo3(get)]
    pub buffer_address: u64,
    /// Object bytes stored there.
    #[pyo3(get)]
    pub size: u64,
    /// The owner's transfer endpoint (`host:port`).
    #[pyo3(get)]
    pub transport_endpoint: String,
    /// The segment holding it (a UUID).
    #[pyo3(get)]
    pub segment_id: String,
}

#[pymethods]
impl Descriptor {
    fn __repr__(&self) -> String {
        format!(
            "<Descriptor size={} buffer_address={} transport_endpoint={}>",
            self.size, self.buffer_address, self.transport_endpoint
        )
    }
}

/// A memory replica: its one buffer.
#[pyclass(module = "crescent.store", name = "MemoryDescriptor", frozen)]
#[derive(Clone, Debug)]
pub struct MemoryDescriptor {
    /// The buffer.
    #[pyo3(get)]
    pub buffer_descriptor: Descriptor,
}

/// A disk-tier replica's place: in Crescent a range of a storage node's disk tier, named
/// `crescent-disk://ENDPOINT/SEGMENT@OFFSET` (the original's shared-filesystem file path).
#[pyclass(module = "crescent.store", name = "DiskDescriptor", frozen)]
#[derive(Clone, Debug)]
pub struct DiskDescriptor {
    /// The file.
    #[pyo3(get)]
    pub file_path: String,
    /// Object bytes in it.
    #[pyo3(get)]
    pub object_size: u64,
}

/// One replica of an object.
#[pyclass(module = "crescent.store", name = "ReplicaDescriptor", frozen)]
#[derive(Clone, Debug)]
pub struct ReplicaDescriptor {
    /// The replica's state.
    #[pyo3(get)]
    pub status: ReplicaStatus,
    location: ReplicaLocation,
    /// The object's bytes (a disk replica's range is rounded up to whole blocks).
    object_size: u64,
}

#[pymethods]
impl ReplicaDescriptor {
    /// True for a replica in a memory (or NoF) segment.
    fn is_memory_replica(&self) -> bool {
        matches!(self.location, ReplicaLocation::Memory { .. } | ReplicaLocation::Nof { .. })
    }

    /// Always false: the original's disk replicas are files on a filesystem shared through the master's
    /// `root_fs_dir`, which Crescent does not have.
    fn is_disk_replica(&self) -> bool {
        false
    }

    /// True for a replica on a node's own SSD: its disk tier (an object memory eviction kept there, the
    /// original's offload to `LOCAL_DISK`) or a client's local SSD.
    fn is_local_disk_replica(&self) -> bool {
        matches!(self.location, ReplicaLocation::Disk { .. } | ReplicaLocation::LocalDisk { .. })
    }

    /// The buffer of a memory replica; RuntimeError for any other.
    fn get_memory_descriptor(&self) -> PyResult<MemoryDescriptor> {
        match &self.location {
            ReplicaLocation::Memory { segment_id, offset, length, endpoint }
            | ReplicaLocation::Nof { segment_id, offset, length, endpoint } => Ok(MemoryDescriptor {
                buffer_descriptor: Descriptor {
                    buffer_address: *offset,
                    size: *length,
                    transport_endpoint: endpoint.to_string(),
                    segment_id: segment_id.to_string(),
                },
            }),
            ReplicaLocation::Disk { .. } | ReplicaLocation::LocalDisk { .. } => {
                Err(PyRuntimeError::new_err("Expected MemoryDescriptor"))
            }
        }
    }

    /// Where a disk-tier replica lies (Crescent's addition: the original describes only shared-filesystem
    /// replicas this way); RuntimeError for any other.
    fn get_disk_descriptor(&self) -> PyResult<DiskDescriptor> {
        match &self.location {
            ReplicaLocation::Disk { segment_id, offset, endpoint, .. } => Ok(DiskDescriptor {
                file_path: format!("crescent-disk://{endpoint}/{segment_id}@{offset}"),
                object_size: self.object_size,
            }),
            _ => Err(PyRuntimeError::new_err("Expected DiskDescriptor")),
        }
    }

    fn __repr__(&self) -> String {
        let kind = match self.location {
            ReplicaLocation::Memory { .. } => "memory",
            ReplicaLocation::Nof { .. } => "nof",
            ReplicaLocation::Disk { .. } => "disk",
            ReplicaLocation::LocalDisk { .. } => "local_disk",
        };
        format!("<ReplicaDescriptor {kind} status={:?} size={}>", self.status, self.location.length())
    }
}

impl ReplicaDescriptor {
    /// The descriptor of `d`, a replica of an object of `object_size` bytes.
    pub fn of(d: &Wire, object_size: u64) -> Self {
        let status = match d.status {
            WireStatus::Undefined => ReplicaStatus::UNDEFINED,
            WireStatus::Initialized => ReplicaStatus::INITIALIZED,
            WireStatus::Processing => ReplicaStatus::PROCESSING,
            WireStatus::Complete => ReplicaStatus::COMPLETE,
            WireStatus::Removed => ReplicaStatus::REMOVED,
            WireStatus::Failed => ReplicaStatus::FAILED,
        };
        Self { status, location: d.location.clone(), object_size }
    }
}

/// Registers the classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ReplicaDescriptor>()?;
    m.add_class::<MemoryDescriptor>()?;
    m.add_class::<DiskDescriptor>()?;
    m.add_class::<Descriptor>()?;
    Ok(())
}
