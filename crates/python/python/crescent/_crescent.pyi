"""Type stubs of Crescent's native module (re-exported by ``crescent.store`` and ``mooncake.store``).

Store failures never raise: calls return ``0`` / a count / bytes read, or a negative error code (−600
INVALID_PARAMS, −704 OBJECT_NOT_FOUND, −706 OBJECT_HAS_LEASE, −200 NO_AVAILABLE_HANDLE, −800 TRANSFER_FAIL,
−900 RPC_FAIL, −1 when the store is not set up). Only wrong argument types raise ``TypeError``.
"""

from typing import Any, Optional, Union

from crescent._buffer import BufferHandle

__version__: str

_BytesLike = Union[bytes, bytearray, memoryview, Any]

class SoftPinAction:
    """What a write does to the object's soft pin."""

    PRESERVE: "SoftPinAction"
    ENABLE: "SoftPinAction"
    DISABLE: "SoftPinAction"
    def __int__(self) -> int: ...

class ObjectDataType:
    """What kind of data an object holds (stored with it)."""

    UNKNOWN: "ObjectDataType"
    KVCACHE: "ObjectDataType"
    TENSOR: "ObjectDataType"
    WEIGHT: "ObjectDataType"
    SAMPLE: "ObjectDataType"
    ACTIVATION: "ObjectDataType"
    GRADIENT: "ObjectDataType"
    OPTIMIZER_STATE: "ObjectDataType"
    METADATA: "ObjectDataType"
    GENERAL: "ObjectDataType"
    def __int__(self) -> int: ...

UNKNOWN: ObjectDataType
KVCACHE: ObjectDataType
TENSOR: ObjectDataType
WEIGHT: ObjectDataType
SAMPLE: ObjectDataType
ACTIVATION: ObjectDataType
GRADIENT: ObjectDataType
OPTIMIZER_STATE: ObjectDataType
METADATA: ObjectDataType
GENERAL: ObjectDataType

class Descriptor:
    """A memory replica's range: ``buffer_address`` is its offset inside segment ``segment_id``."""

    @property
    def buffer_address(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def transport_endpoint(self) -> str: ...
    @property
    def segment_id(self) -> str: ...

class MemoryDescriptor:
    """A memory replica: its one buffer."""

    @property
    def buffer_descriptor(self) -> Descriptor: ...

class DiskDescriptor:
    """A disk-tier replica (an object memory eviction kept on its node's SSD): ``file_path`` names it as
    ``crescent-disk://ENDPOINT/SEGMENT@OFFSET`` (not a path to open), ``object_size`` is the object's bytes."""

    @property
    def file_path(self) -> str: ...
    @property
    def object_size(self) -> int: ...

class ReplicaDescriptor:
    """One replica of an object."""

    @property
    def status(self) -> ReplicaStatus: ...
    def is_memory_replica(self) -> bool: ...
    def is_disk_replica(self) -> bool:
        """Always False: Crescent has no shared-filesystem tier (the original's ``DISK``, under ``root_fs_dir``)."""
    def is_local_disk_replica(self) -> bool:
        """True for a replica on a node's own SSD: its disk tier (what memory eviction kept there, the original's
        ``LOCAL_DISK`` offload) or a client's local SSD."""
    def get_memory_descriptor(self) -> MemoryDescriptor:
        """The buffer; RuntimeError for a replica that is not in memory."""
    def get_disk_descriptor(self) -> DiskDescriptor:
        """The disk-tier replica's descriptor; RuntimeError for a replica that is not on a disk tier."""

class ReplicaStatus:
    """A replica's state."""

    UNDEFINED: "ReplicaStatus"
    INITIALIZED: "ReplicaStatus"
    PROCESSING: "ReplicaStatus"
    COMPLETE: "ReplicaStatus"
    REMOVED: "ReplicaStatus"
    FAILED: "ReplicaStatus"
    def __int__(self) -> int: ...

class TaskType:
    """What a copy or move task does."""

    REPLICA_COPY: "TaskType"
    REPLICA_MOVE: "TaskType"
    def __int__(self) -> int: ...

class TaskStatus:
    """Where a copy or move task stands."""

    PENDING: "TaskStatus"
    PROCESSING: "TaskStatus"
    FAILED: "TaskStatus"
    SUCCESS: "TaskStatus"
    def __int__(self) -> int: ...

class QueryTaskResponse:
    """A copy or move task as ``query_task`` answers it."""

    id: tuple[int, int]
    type: TaskType
    status: TaskStatus
    created_at_ms_epoch: int
    last_updated_at_ms_epoch: int
    assigned_client: tuple[int, int]
    """The storage node making the copy (the one holding the source replica)."""
    message: str
    """Empty while under way; ``"Task completed successfully"`` or why it failed once ended."""

class ReplicateConfig:
    """How a write places its replicas and retains its object. Every attribute is read-write."""

    replica_num: int
    """Memory replicas wanted (best effort, each on a distinct segment; 0 makes a write fail with −600)."""
    nof_replica_num: int
    dfs_replica_num: int
    """Accepted; Crescent places no DFS replicas."""
    soft_pin_action: SoftPinAction
    soft_pin_ttl_ms: Optional[int]
    """None or an int in [0, 2**64); anything else raises TypeError."""
    with_hard_pin: bool
    preferred_segments: list[str]
    preferred_segment: str
    """A segment tried first; a store's ``get_hostname()`` names its own segment."""
    preferred_nof_segments: list[str]
    prefer_alloc_in_same_node: bool
    data_type: ObjectDataType
    group_ids: Optional[list[str]]
    """One id: every key of the call joins that group; one id per key of a batch: each key its own; else −600."""
    offload: bool
    """When memory eviction takes the object, keep it on the disk tier of the node that held it (default True);
    False drops it instead (a Crescent extension)."""
    def __init__(
        self,
        *,
        replica_num: int = 1,
        nof_replica_num: int = 0,
        dfs_replica_num: int = 0,
        soft_pin_action: SoftPinAction = ...,
        soft_pin_ttl_ms: Optional[int] = None,
        with_hard_pin: bool = False,
        preferred_segments: list[str] = ...,
        preferred_segment: str = "",
        preferred_nof_segments: list[str] = ...,
        prefer_alloc_in_same_node: bool = False,
        data_type: ObjectDataType = ...,
        group_ids: Optional[list[str]] = None,
        offload: bool = True,
    ) -> None: ...

class MooncakeHostMemAllocator:
    """Host memory for buffers an engine registers with its store (SGLang's standalone host pool)."""

    def __init__(self) -> None: ...
    def alloc(self, size: int) -> int:
        """``size`` bytes of prefaulted memory; its address (``RuntimeError`` when it cannot be had)."""
    def free(self, ptr: int) -> int:
        """Frees what ``alloc`` returned: 0, or -1 for any other address."""

class MooncakeDistributedStore:
    """A client of a Crescent cluster with the original ``mooncake.store`` API.

    With ``global_segment_size > 0`` the store hosts that much memory in this process (reserved, not touched until
    used) and serves other clients' reads and writes from it; ``close()`` unmounts it. ``crescent.store`` (and
    ``mooncake.store``) export a subclass that adds the tensor calls (``crescent._tensor.TensorCalls``).
    """

    def __init__(self) -> None: ...
    def setup(
        self,
        local_hostname: Union[str, dict[str, Any]],
        metadata_server: Optional[str] = None,
        global_segment_size: Optional[int] = None,
        local_buffer_size: Optional[int] = None,
        protocol: Optional[str] = None,
        rdma_devices: Optional[str] = None,
        master_server_addr: Optional[str] = None,
        engine: Any = None,
        enable_ssd_offload: bool = False,
        ssd_offload_path: str = "",
        tenant_id: str = "default",
        enable_client_http_server: bool = False,
        client_http_port: int = 9300,
        credential: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        tls_ca: Optional[str] = None,
        tls_client_ca: Optional[str] = None,
        tls_server_name: Optional[str] = None,
        host_credential: Optional[str] = None,
        ssd_offload_size: Union[int, str, None] = None,
    ) -> int:
        """Positional form (the first 7 required; ``metadata_server`` accepted and not needed; ``protocol``
        ``"rdma"`` falls back to TCP with a warning) or ``setup(config: dict)`` (sizes like ``"16MB"``).
        ``master_server_addr`` is ``host:port`` or ``etcd://HOST:PORT[,…]/CLUSTER`` (also the original's
        ``etcd://h1:p;h2:p``, cluster from ``CRESCENT_CLUSTER_ID`` or ``MC_STORE_CLUSTER_ID``): the store then
        follows the cluster's leader. In a cluster with a secret, ``credential`` (``"PRINCIPAL:KEYHEX"``, as
        ``crescent credential`` prints it; also a ``"credential"`` key of the dict form) is what the store
        proves, else ``CRESCENT_CREDENTIAL_FILE`` / ``CRESCENT_CREDENTIAL``, else ``tenant:<tenant_id>`` derived
        from ``CRESCENT_SECRET_FILE`` / ``CRESCENT_SECRET``; a store hosting a segment derives the keys it checks
        its peers' tickets and grants with from that same credential (no secret needed), or from
        ``host_credential`` (else ``CRESCENT_HOST_CREDENTIAL_FILE`` / ``CRESCENT_HOST_CREDENTIAL``) when given: a
        ``node:NAME`` of its own, so the stores of one tenant do not share those keys. In a TLS
        cluster, ``tls_ca`` (the CA servers' certificates chain to), ``tls_cert`` / ``tls_key`` (the client
        certificate, and what a hosted segment serves), ``tls_client_ca`` (a hosted segment then requires client
        certificates) and ``tls_server_name`` (PEM file paths, and the name certificates are checked for; also
        keys of the dict form) each take the place of their ``CRESCENT_TLS_*`` variable. With
        ``enable_ssd_offload=True`` a store hosting a segment also hosts a disk tier: the objects memory eviction
        takes are kept in one file (wiped at setup) in ``ssd_offload_path`` (else
        ``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH``; neither: −600), of ``ssd_offload_size`` bytes (an int or a size
        like ``"64GB"``; else ``MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES``, else 4 × ``global_segment_size``; rounded
        down to 4 KiB)
        and read back from there; a path without the flag is ignored with a warning, as is the flag with
        ``global_segment_size`` 0. The dict form takes the same three keys. 0 or a negative code."""
    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Attaches to the storage node on this host listening at ``server_address`` (a ``crescent node``, or a
        store hosting a segment) instead of contributing memory: the master is the node's, and the node's
        memfd-backed segments (``crescent node --memfd``) are mapped into this process, so puts and gets of the
        objects there are memory copies. Writes go to the node first unless their config prefers other segments.
        ``mem_pool_size`` is accepted and unused (buffers need not be shared). 0 or a negative code."""
    def alloc_from_mem_pool(self, size: int) -> int:
        """``size`` bytes of prefaulted host memory to register as a buffer; its address, or 0. Free it with
        ``MooncakeHostMemAllocator().free``."""
    def close(self, /) -> int:
        """Unmounts this store's segment (objects held only there are gone); 0, also when never set up."""
    def health_check(self) -> int:
        """0 healthy, 1 not set up, 2 the master does not answer."""
    def get_hostname(self, /) -> str:
        """``host:port`` (a port from [12300, 14300] when ``local_hostname`` had none); ``""`` before setup."""
    def get_offload_rpc_read_count(self, /) -> int:
        """Objects this store has read from a disk-tier replica (``LOCAL_DISK``); ``0`` before setup."""
    def mount_segment(
        self, path: str, size: int, offset: int = 0, protocol: str = "tcp", location: str = ""
    ) -> dict[str, Any]:
        """Maps ``size`` bytes of the file (or ``/dev/shm`` object) at ``path`` from ``offset`` (4 KiB-aligned)
        shared and mounts them as one more segment of this store, named ``get_hostname()`` (a store without a
        segment of its own starts serving segments now). ``{"ret": 0 | -1, "segment_ids": [id]}`` (no id for
        ``size == 0``); ``protocol`` and ``location`` are not used."""
    def unmount_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        """Unmounts ``mount_segment`` segments by id: with no grace period their objects are gone when it answers;
        with one they stay readable (no new objects) until it ends. 0, or the first failure (``-1`` for an id that
        is not one of them, else the master's code)."""
    def allocate_and_mount_segment(self, size: int, protocol: str = "tcp", location: str = "") -> dict[str, Any]:
        """Allocates ``size`` bytes rounded up to 16 MiB and mounts them as one more segment of this store.
        ``{"ret": 0 | -1, "segment_ids": [id], "allocated_size": bytes}`` (``-1`` for ``size == 0``)."""
    def unmount_and_free_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        """``unmount_segment`` for ``allocate_and_mount_segment`` segments; their memory is freed."""
    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        """Unmounts this store's disk tier at the master at once, serves its reads for the grace period, then stops
        serving it. 0 (also without a disk tier), ``-1`` on a refusal."""
    def put(self, key: str, value: _BytesLike, config: Optional[ReplicateConfig] = None) -> int: ...
    def upsert(self, key: str, value: _BytesLike, config: Optional[ReplicateConfig] = None) -> int: ...
    def put_parts(self, key: str, *parts: _BytesLike, config: Optional[ReplicateConfig] = None) -> int: ...
    def upsert_parts(self, key: str, *parts: _BytesLike, config: Optional[ReplicateConfig] = None) -> int: ...
    def put_batch(self, keys: list[str], values: list[_BytesLike], config: Optional[ReplicateConfig] = None) -> int:
        """0, or the first error's code."""
    def upsert_batch(
        self, keys: list[str], values: list[_BytesLike], config: Optional[ReplicateConfig] = None
    ) -> int: ...
    def get(self, key: str, /) -> bytes:
        """The value; ``b""`` on a miss or any error (also a value larger than ``local_buffer_size``)."""
    def get_batch(self, keys: list[str], /) -> list[bytes]: ...
    def get_buffer(self, key: str, /) -> Optional[BufferHandle]: ...
    def batch_get_buffer(self, keys: list[str], /) -> list[Optional[BufferHandle]]: ...
    def register_buffer(self, buffer_ptr: int, size: int) -> int: ...
    def unregister_buffer(self, buffer_ptr: int) -> int: ...
    def put_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int:
        """From the caller's memory: a registered buffer, or memory clear of every registration (the caller
        vouches for it, as with the original over TCP); −600 for a null address or a range straddling a
        registered buffer's bounds."""
    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int: ...
    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read, or negative (−600 for a null address, a range straddling a registered buffer's bounds or a
        buffer smaller than the object; −704 missing). Memory as for ``put_from``."""
    def batch_put_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], config: Optional[ReplicateConfig] = None
    ) -> list[int]: ...
    def batch_upsert_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], config: Optional[ReplicateConfig] = None
    ) -> list[int]: ...
    def batch_get_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]: ...
    def batch_put_from_multi_buffers(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        config: Optional[ReplicateConfig] = None,
    ) -> list[int]: ...
    def batch_get_into_multi_buffers(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]: ...
    def get_into_ranges(
        self,
        buffer_ptrs: list[int],
        all_keys: list[list[str]],
        all_dst_offsets: list[list[list[int]]],
        all_src_offsets: list[list[list[int]]],
        all_sizes: list[list[list[int]]],
    ) -> list[list[list[int]]]:
        """Partial reads into registered buffers; per range bytes copied, or negative (-600 past the object's end or the buffer)."""
    def batch_get_session_start(self, keys: list[str]) -> list[int]:
        """Per key 0 or negative (−704 absent): the object is looked up once, its read lease held until
        ``batch_get_session_end`` or its expiry."""
    def batch_get_into_multi_buffer_ranges(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_src_offsets: list[list[int]],
    ) -> list[int]:
        """Ranges of session objects into registered memory; per key bytes read, or negative (−600 without a
        session, for mismatched lists or a range past the object or the buffer; −707 once the lease ran out)."""
    def batch_get_session_end(self, keys: list[str]) -> int:
        """Ends the keys' get sessions (releasing their leases); 0."""
    def batch_put_session_start(
        self, keys: list[str], sizes: list[int], config: Optional[ReplicateConfig] = None
    ) -> list[int]:
        """Per key 0 or negative (−600 size 0 or a session already, −705 a key holding a value, −200 no room):
        the object is reserved, not readable until ``batch_put_session_end``."""
    def batch_put_from_multi_buffer_ranges(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_dst_offsets: list[list[int]],
    ) -> list[int]:
        """Fills ranges of put-session objects from registered memory; per key bytes taken, or −600."""
    def batch_put_session_end(self, keys: list[str]) -> list[int]:
        """Writes each session's object whole and makes it readable; per key 0 or negative (−600 no session)."""
    def batch_put_session_revoke(self, keys: list[str]) -> list[int]:
        """Gives the sessions' reservations up; per key 0 or negative (−600 no session)."""
    def put_from_with_metadata(
        self,
        key: str,
        buffer_ptr: int,
        metadata_buffer_ptr: int,
        size: int,
        metadata_size: int,
        config: Optional[ReplicateConfig] = None,
    ) -> int:
        """One object: ``metadata_size`` bytes at ``metadata_buffer_ptr``, then ``size`` bytes at ``buffer_ptr``
        (registered memory). 0 or negative; ``size`` 0 stores nothing (0); ``prefer_alloc_in_same_node`` is −1."""
    def _batch_put_values(
        self,
        keys: list[str],
        values: list[_BytesLike],
        config: Optional[ReplicateConfig] = None,
        upsert: bool = False,
    ) -> list[int]:
        """``put_batch`` / ``upsert_batch`` answering per key (for the tensor calls)."""
    def _registered(self, ptr: int, size: int) -> bool:
        """Whether the range lies in one registered buffer."""
    def is_exist(self, key: str, /) -> int:
        """1 present, 0 absent, negative on error."""
    def batch_is_exist(self, keys: list[str]) -> list[int]: ...
    def batch_is_exist_prefix(self, keys: list[str]) -> int:
        """How many of ``keys``, from the first, are cached (negative on error); leases exactly those for the
        ``batch_get_into`` that follows (Crescent's; the original has no such call)."""
    def get_size(self, key: str, /) -> int: ...
    def remove(self, key: str, force: bool = False) -> int: ...
    def remove_by_regex(self, pattern: str, force: bool = False) -> int: ...
    def remove_all(self, force: bool = False) -> int: ...
    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]: ...
    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]:
        """Drops the replicas of this store's own objects whose read lease has expired: all of them (the object
        goes), or only those on the segment named ``segment_name`` (the object goes with its last one). The keys
        cleared; others (written by another client, leased, absent) are skipped; ``[]`` on any error."""
    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        """Queues a copy of ``key`` to every segment named in ``targets``, made in the background by the storage
        node holding one of its replicas: ``(task id, 0)`` or ``((0, 0), code)`` (−600 for no or an unknown
        target, −704 for no such key, −1401 when the master's queue is full)."""
    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]:
        """Queues a move of ``key``'s replica on segment ``source`` to segment ``target``: ``(task id, 0)`` or
        ``((0, 0), code)`` (−600 when they are the same, ``target`` is unknown or ``source`` holds no replica)."""
    def query_task(self, task_id: tuple[int, int]) -> tuple[QueryTaskResponse | None, int]:
        """``(QueryTaskResponse, 0)``, or ``(None, −1400)`` for a task the master does not know (or no longer
        keeps: it keeps the last 10 000 ended ones)."""
    def get_replica_desc(self, key: str, /) -> list[ReplicaDescriptor]:
        """Where ``key``'s replicas are (``[]`` when absent or on any error); leases the object like a read."""
    def batch_get_replica_desc(self, keys: list[str], /) -> dict[str, list[ReplicaDescriptor]]:
        """``get_replica_desc`` of each key; only the keys found are in the dict."""

def _parse_size(text: str) -> Optional[int]: ...
def _bytes_address(b: bytes) -> int: ...
