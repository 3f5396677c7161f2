"""The store API: the original ``mooncake.store`` surface on the Crescent client.

Store failures never raise: calls return ``0`` or a negative error code (or lists of them, ``b""``, ``None``);
only wrong argument types raise ``TypeError``. Every call that talks to the cluster releases the GIL.
"""

from crescent import _crescent
from crescent._buffer import BufferHandle
from crescent._crescent import (
    ACTIVATION,
    GENERAL,
    GRADIENT,
    KVCACHE,
    METADATA,
    OPTIMIZER_STATE,
    SAMPLE,
    TENSOR,
    UNKNOWN,
    WEIGHT,
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    MooncakeHostMemAllocator,
    ObjectDataType,
    ReplicaDescriptor,
    QueryTaskResponse,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    TaskStatus,
    TaskType,
)
from crescent._tensor import ParallelAxis, ReadTarget, TensorCalls, TensorParallelism


class MooncakeDistributedStore(TensorCalls, _crescent.MooncakeDistributedStore):
    """The original's ``MooncakeDistributedStore``: the native store (``crescent._crescent``) with the tensor
    calls (``put_tensor``, ``get_tensor``, their batch, zero-copy, upsert, ``pub`` and ``_with_tp`` forms; see
    :mod:`crescent._tensor`), which return torch tensors when torch is importable and NumPy arrays otherwise."""


from crescent.async_store import MooncakeDistributedStoreAsync  # noqa: E402 (it subclasses the class above)

__all__ = [
    "MooncakeDistributedStore",
    "MooncakeDistributedStoreAsync",
    "MooncakeHostMemAllocator",
    "ReplicateConfig",
    "SoftPinAction",
    "ObjectDataType",
    "ReplicaStatus",
    "TaskStatus",
    "TaskType",
    "QueryTaskResponse",
    "ReplicaDescriptor",
    "MemoryDescriptor",
    "DiskDescriptor",
    "Descriptor",
    "BufferHandle",
    "TensorParallelism",
    "ParallelAxis",
    "ReadTarget",
    "UNKNOWN",
    "KVCACHE",
    "TENSOR",
    "WEIGHT",
    "SAMPLE",
    "ACTIVATION",
    "GRADIENT",
    "OPTIMIZER_STATE",
    "METADATA",
    "GENERAL",
]
