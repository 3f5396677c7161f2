"""The original's tensor calls (``put_tensor``, ``get_tensor``, their batch, zero-copy, upsert, ``pub``,
``_with_tp`` and ``_with_parallelism`` forms) over the store's byte calls, without torch as a dependency.

On the store a tensor is one object: the original's 304-byte ``TensorMetadata`` header (magic ``MOON``, version,
dtype code, ndim, layout kind FULL or SHARD, data offset and length, global and local shape, up to four layout
axes), then the tensor's bytes, C-contiguous. It is written byte for byte as the original writes it, so objects
are interchangeable between the original's client and this one.

A tensor argument is anything with the torch tensor interface (``data_ptr()``, ``numel()``, ``element_size()``,
``dtype``, ``shape``; ``is_contiguous()`` / ``contiguous()`` when it has them, ``cpu()`` for one whose ``device``
is not the CPU) or a NumPy array. A tensor read
back is a ``torch.Tensor`` when torch is importable (as the original returns), else a NumPy array: bfloat16 and
the float8 types, which NumPy lacks, come back as their raw ``uint16`` / ``uint8`` storage.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from typing import Any, Optional, Sequence

try:
    import numpy as np
except ImportError:  # only the tensor calls need NumPy (they raise ImportError without it)
    np = None

INVALID_PARAMS = -600

MAGIC = 0x4D4F4F4E
VERSION = 1
HEADER_SIZE = 304
MAX_DIMS = 8
MAX_AXES = 4
LAYOUT_FULL = 0
LAYOUT_SHARD = 1
AXIS_TP = 1
# The original's other axis kinds (`ParallelAxisKind`), as its headers number them.
AXIS_DP, AXIS_EP, AXIS_PP = 0, 2, 3

# The original's dtype codes, by torch name, and the NumPy dtype holding each one's bytes.
DTYPE_CODES = {
    "float32": 0,
    "float64": 1,
    "int8": 2,
    "uint8": 3,
    "int16": 4,
    "uint16": 5,
    "int32": 6,
    "uint32": 7,
    "int64": 8,
    "uint64": 9,
    "bool": 10,
    "float16": 11,
    "bfloat16": 12,
    "float8_e4m3fn": 13,
    "float8_e5m2": 14,
}
DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}
STORAGE = {
    0: "<f4", 1: "<f8", 2: "i1", 3: "u1", 4: "<i2", 5: "<u2", 6: "<i4", 7: "<u4", 8: "<i8", 9: "<u8",
    10: "?", 11: "<f2", 12: "<u2", 13: "u1", 14: "u1",
}
ITEMSIZE = {0: 4, 1: 8, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 4, 8: 8, 9: 8, 10: 1, 11: 2, 12: 2, 13: 1, 14: 1}
# NumPy dtypes that are one of the codes (bfloat16 and float8 have no NumPy dtype).
NUMPY_CODES = [(np.dtype(STORAGE[c]), c) for c in range(12)] if np is not None else []


def _require_numpy() -> None:
    """Raises ImportError when NumPy, which the tensor calls need, is missing."""
    if np is None:
        raise ImportError("the tensor calls need NumPy (pip install numpy)")

_HEAD = struct.Struct("<IHHiiIIQQ")  # magic, version, header_size, dtype, ndim, layout_kind, flags, offset, bytes
_SHAPE = struct.Struct("<8q")
_AXES = struct.Struct("<II")  # axis_count, reserved
_AXIS = struct.Struct("<iiiiiiq")  # kind, axis_index, shard_rank, shard_count, split_dim, reserved0, reserved1


def header(code: int, global_shape: Sequence[int], local_shape: Sequence[int], data_bytes: int,
           axes: Sequence[tuple] = ()) -> bytes:
    """The original's ``TensorMetadata`` for a tensor of dtype ``code``: FULL when ``axes`` is empty, else SHARD
    with those ``(kind, rank, count, split_dim, local_split_extent)`` axes."""

    def dims(shape):
        return _SHAPE.pack(*(list(shape) + [-1] * (MAX_DIMS - len(shape))))

    kind = LAYOUT_SHARD if axes else LAYOUT_FULL
    out = _HEAD.pack(MAGIC, VERSION, HEADER_SIZE, code, len(global_shape), kind, 0, HEADER_SIZE, data_bytes)
    out += dims(global_shape) + dims(local_shape) + _AXES.pack(len(axes), 0)
    for i in range(MAX_AXES):
        if i < len(axes):
            # (kind, rank, count, split_dim, extent[, expert or stage id])
            k, rank, count, split_dim, extent = axes[i][:5]
            ident = axes[i][5] if len(axes[i]) > 5 else 0
            out += _AXIS.pack(k, i, rank, count, split_dim, ident, extent)
        else:
            out += bytes(_AXIS.size)
    return out


class Parsed:
    """A parsed header: dtype code, local shape, layout and where the bytes are."""

    __slots__ = ("code", "shape", "global_shape", "layout", "axes", "data_offset", "data_bytes")


def parse(head: bytes, total: int) -> Optional[Parsed]:
    """The header at the start of an object of ``total`` bytes, validated as the original validates it
    (``ValidateTensorMetadata``); ``None`` if it is not a tensor object."""
    if total < HEADER_SIZE or len(head) < HEADER_SIZE:
        return None
    magic, version, size, code, ndim, layout, _, offset, nbytes = _HEAD.unpack_from(head, 0)
    if magic != MAGIC or version != VERSION or size != HEADER_SIZE:
        return None
    if not 0 <= code < len(DTYPE_CODES) or not 0 <= ndim <= MAX_DIMS or layout > LAYOUT_SHARD:
        return None
    global_dims = _SHAPE.unpack_from(head, 40)
    local_dims = _SHAPE.unpack_from(head, 104)
    axis_count, _ = _AXES.unpack_from(head, 168)
    if axis_count > MAX_AXES or offset < HEADER_SIZE or offset > total or nbytes != total - offset:
        return None
    if any(d < 0 for d in global_dims[:ndim] + local_dims[:ndim]):
        return None
    if any(d != -1 for d in global_dims[ndim:] + local_dims[ndim:]):
        return None
    expected = ITEMSIZE[code]
    for d in local_dims[:ndim]:
        expected *= d
    if nbytes != expected:
        return None
    axes = []
    for i in range(axis_count):
        kind, _, rank, count, split_dim, _, _ = _AXIS.unpack_from(head, 176 + i * _AXIS.size)
        if not 0 <= kind <= 4 or count <= 0 or not 0 <= rank < count or not -1 <= split_dim < ndim:
            return None
        axes.append((kind, rank, count, split_dim))
    p = Parsed()
    p.code, p.shape, p.global_shape = code, tuple(local_dims[:ndim]), tuple(global_dims[:ndim])
    p.layout, p.axes, p.data_offset, p.data_bytes = layout, axes, offset, nbytes
    return p


# ---- tensors in, tensors out ----

_NO_TORCH = False


def _torch():
    """The ``torch`` module if importable (looked up in ``sys.modules`` first; a failed import is not retried)."""
    global _NO_TORCH
    torch = sys.modules.get("torch")
    if torch is not None or _NO_TORCH:
        return torch
    try:
        import torch  # noqa: F811 (an optional dependency)
    except ImportError:
        _NO_TORCH = True
        return None
    return torch


def dtype_code(dtype: Any) -> Optional[int]:
    """The original's code of a torch dtype (``torch.bfloat16``, or anything whose ``str()`` is ``torch.NAME``), a
    NumPy dtype or a name; ``None`` if it has none."""
    if not isinstance(dtype, np.dtype) and not (isinstance(dtype, type) and issubclass(dtype, np.generic)):
        text = str(dtype)
        name = text[len("torch."):] if text.startswith("torch.") else getattr(dtype, "name", text)
        if name in DTYPE_CODES:
            return DTYPE_CODES[name]
    try:
        d = np.dtype(dtype)
    except TypeError:
        return None
    return next((code for dt, code in NUMPY_CODES if dt == d), None)


if np is not None:

    class _KeepAlive(np.ndarray):
        """A NumPy view of a tensor's memory, holding the tensor (``_owner``) so the memory outlives the view."""

        _owner: Any = None


def as_array(tensor: Any) -> Optional[tuple]:
    """``(code, array)``: the tensor's dtype code and a C-contiguous NumPy view of its bytes (its storage dtype,
    its shape); ``None`` for anything that is not a tensor of a supported dtype (at most 8 dimensions)."""
    _require_numpy()
    if tensor is None:
        return None
    if isinstance(tensor, np.ndarray):
        if not tensor.dtype.isnative:
            tensor = tensor.astype(tensor.dtype.newbyteorder("="))
        code = dtype_code(tensor.dtype)
        if code is None or tensor.ndim > MAX_DIMS:
            return None
        return code, np.ascontiguousarray(tensor)
    try:
        # A tensor in device memory (a GPU's) is copied to the host first: its data_ptr() is no host address.
        device = getattr(tensor, "device", None)
        if device is not None and getattr(device, "type", str(device)) != "cpu" and hasattr(tensor, "cpu"):
            tensor = tensor.cpu()
        if hasattr(tensor, "is_contiguous") and not tensor.is_contiguous():
            tensor = tensor.contiguous()
        code = dtype_code(tensor.dtype)
        shape = tuple(int(d) for d in tensor.shape)
        if code is None or len(shape) > MAX_DIMS:
            return None
        numel, itemsize = int(tensor.numel()), int(tensor.element_size())
        storage = np.dtype(STORAGE[code])
        if itemsize != storage.itemsize or numel != int(np.prod(shape, dtype=np.int64)):
            return None
        if numel == 0:
            return code, np.empty(shape, storage)
        ptr = int(tensor.data_ptr())
        if ptr == 0:
            return None
        raw = (ctypes.c_char * (numel * itemsize)).from_address(ptr)
        array = np.frombuffer(raw, dtype=storage).reshape(shape).view(_KeepAlive)
        array._owner = tensor
        return code, array
    except (AttributeError, TypeError, ValueError):
        return None


def to_result(code: int, array: np.ndarray) -> Any:
    """A read tensor as the caller gets it: a torch tensor when torch is importable, else the NumPy array."""
    torch = _torch()
    if torch is None:
        return array
    tensor = torch.from_numpy(array)
    name = DTYPE_NAMES[code]
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        tensor = tensor.view(getattr(torch, name))
    return tensor


def _raw(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array (no copy; also for an empty one)."""
    return memoryview(array.reshape(-1).view(np.uint8))


def encode(code: int, array: np.ndarray) -> list:
    """The object of a FULL tensor: its header and its bytes (two parts, not yet joined)."""
    return [header(code, array.shape, array.shape, array.nbytes), _raw(array)]


def rank_slice(array: np.ndarray, rank: int, size: int, split_dim: int) -> Optional[np.ndarray]:
    """Rank ``rank``'s of ``size`` equal slices of ``array`` along ``split_dim`` (contiguous); ``None`` when it
    does not split evenly or ``split_dim`` is out of range (the original's ``validate_uniform_shard_request``)."""
    shape = array.shape
    if size <= 0 or not 0 <= rank < size or not 0 <= split_dim < len(shape) or shape[split_dim] % size != 0:
        return None
    width = shape[split_dim] // size
    index = [slice(None)] * len(shape)
    index[split_dim] = slice(rank * width, (rank + 1) * width)
    return np.ascontiguousarray(array[tuple(index)])


def shard_object(code: int, array: np.ndarray, rank: int, size: int, split_dim: int) -> Optional[list]:
    """The object of rank ``rank``'s TP shard of ``array`` (a SHARD of the whole: header and bytes, not yet
    joined), or ``None`` (see ``rank_slice``)."""
    part = rank_slice(array, rank, size, split_dim)
    if part is None:
        return None
    axis = (AXIS_TP, rank, size, split_dim, part.shape[split_dim])
    return [header(code, array.shape, part.shape, part.nbytes, [axis]), _raw(part)]


def shards(code: int, array: np.ndarray, tp_size: int, split_dim: int) -> Optional[list]:
    """The objects of a tensor split into ``tp_size`` equal shards along ``split_dim`` (the original's
    ``build_tp_shard_infos``), rank by rank; ``None`` when it does not split evenly or ``split_dim`` is out of
    range."""
    out = [shard_object(code, array, rank, tp_size, split_dim) for rank in range(max(tp_size, 1))]
    return None if any(o is None for o in out) else out


def decode_array(data: Any) -> Optional[tuple]:
    """``(dtype code, storage array)`` of the tensor an object holds (a copy, writable), or ``None`` if it is not
    a tensor object."""
    _require_numpy()
    if data is None:
        return None
    view = memoryview(data).cast("B")
    p = parse(bytes(view[:HEADER_SIZE]), len(view))
    if p is None:
        return None
    storage = np.dtype(STORAGE[p.code])
    count = p.data_bytes // storage.itemsize
    return p.code, np.frombuffer(view, dtype=storage, count=count, offset=p.data_offset).reshape(p.shape).copy()


def decode(data: Any) -> Any:
    """The tensor an object holds (a copy, writable), or ``None`` if it is not a tensor object."""
    found = decode_array(data)
    return to_result(*found) if found is not None else None


def decode_at(ptr: int, length: int) -> Any:
    """The tensor an object read into memory at ``ptr`` (``length`` bytes) holds, as a view of that memory (no
    copy, as the original's ``get_tensor_into``); ``None`` if it is not a tensor object."""
    _require_numpy()
    if length < HEADER_SIZE:
        return None
    p = parse(ctypes.string_at(ptr, HEADER_SIZE), length)
    if p is None:
        return None
    return to_result(p.code, _view(p, ptr))


def tp_key(key: str, rank: int) -> str:
    """The key of rank ``rank``'s shard of ``key`` (the original's ``get_tp_key_name``)."""
    return f"{key}_tp_{rank}"


def writer_key(key: str, rank: int, size: int, split_dim: int) -> str:
    """The key of a writer partition's shard (the original's ``get_writer_shard_key_name``)."""
    return f"{key}__writer_{rank}of{size}_sd{split_dim}"


def writer_manifest_key(key: str) -> str:
    """Where the original keeps the manifest of a tensor written by writer partitions."""
    return f"{key}__writer_manifest"


def _writer_spec(partition: Any) -> Optional[tuple]:
    """``(rank, size, split_dim)`` of a writer partition (any object with those attributes), checked as the
    original checks it (``size > 0``, ``0 <= rank < size``, ``split_dim >= 0``); ``None`` when it fails."""
    try:
        rank, size, split_dim = int(partition.rank), int(partition.size), int(partition.split_dim)
    except (AttributeError, TypeError, ValueError):
        return None
    if size <= 0 or not 0 <= rank < size or split_dim < 0:
        return None
    return rank, size, split_dim


# ---- the store's calls ----

_CONFIG_FIELDS = (
    "replica_num", "nof_replica_num", "dfs_replica_num", "soft_pin_action", "soft_pin_ttl_ms", "with_hard_pin",
    "preferred_segments", "preferred_segment", "preferred_nof_segments", "prefer_alloc_in_same_node", "data_type",
    "offload",
)


def _group_ids(config: Any) -> Optional[list]:
    """The config's ``group_ids`` (``None`` without a config or without ids)."""
    ids = getattr(config, "group_ids", None) if config is not None else None
    return list(ids) if ids is not None else None


def _with_groups(config: Any, ids: list) -> Any:
    """A copy of ``config`` with ``group_ids`` set to ``ids``."""
    copy = type(config)()
    for field in _CONFIG_FIELDS:
        setattr(copy, field, getattr(config, field))
    copy.group_ids = ids
    return copy


def _config_refused(config: Any) -> bool:
    """The original's ``validate_replicate_config`` (the ``pub`` calls): ``preferred_segments``, when given,
    must name one segment per replica."""
    if config is None:
        return False
    segments = list(config.preferred_segments)
    return bool(segments) and len(segments) != config.replica_num


class TensorCalls:
    """The original's tensor calls, mixed into ``MooncakeDistributedStore`` (over its byte calls).

    Return conventions are the original's: puts answer 0 or a negative code (−600 for an argument that is not a
    tensor of a supported dtype, a shard split that is not even, mismatched lists); gets answer the tensor or
    ``None``. Tensors read back are torch tensors when torch is importable, else NumPy arrays (see the module).
    """

    # -- puts of tensor objects --

    def _put_objects(self, keys: list, objects: list, config: Any, upsert: bool) -> list:
        """Stores each object (its parts joined) under its key; per key 0 or a negative code."""
        values = [b"".join(parts) for parts in objects]
        return self._batch_put_values(keys, values, config, upsert)

    def _put_tensors(self, keys: Sequence[str], tensors: Any, config: Any, upsert: bool) -> list:
        keys = list(keys)
        if len(keys) != len(tensors) or not keys:
            return [INVALID_PARAMS] * len(keys)
        out = [INVALID_PARAMS] * len(keys)
        todo = [(i, found) for i, found in enumerate(as_array(t) for t in tensors) if found is not None]
        if not todo:
            return out
        ids = _group_ids(config)
        if ids is not None and len(ids) == len(keys) and len(todo) != len(keys):
            # One group per key: the ids of the keys that are written (the original's MakeIndexedConfig).
            config = _with_groups(config, [ids[i] for i, _ in todo])
        done = self._put_objects([keys[i] for i, _ in todo], [encode(*found) for _, found in todo], config, upsert)
        for (i, _), rc in zip(todo, done):
            out[i] = rc
        return out

    def put_tensor(self, key: str, tensor: Any) -> int:
        """Stores ``tensor`` (header, then its bytes) under ``key``; 0 or a negative code."""
        return self._put_tensors([key], [tensor], None, False)[0]

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        """Like ``put_tensor``, replacing an existing value."""
        return self._put_tensors([key], [tensor], None, True)[0]

    def pub_tensor(self, key: str, tensor: Any, config: Any = None) -> int:
        """``put_tensor`` with a ``ReplicateConfig`` (−600 when ``preferred_segments`` is given but not one per
        replica)."""
        if _config_refused(config):
            return INVALID_PARAMS
        return self._put_tensors([key], [tensor], config, False)[0]

    def upsert_pub_tensor(self, key: str, tensor: Any, config: Any = None) -> int:
        """Like ``pub_tensor``, replacing an existing value."""
        if _config_refused(config):
            return INVALID_PARAMS
        return self._put_tensors([key], [tensor], config, True)[0]

    def batch_put_tensor(self, keys: list, tensors_list: list) -> list:
        """``put_tensor`` of each key; ``[-600] * len(keys)`` when the lists' lengths differ."""
        return self._put_tensors(keys, tensors_list, None, False)

    def batch_upsert_tensor(self, keys: list, tensors_list: list) -> list:
        """``upsert_tensor`` of each key."""
        return self._put_tensors(keys, tensors_list, None, True)

    def batch_pub_tensor(self, keys: list, tensors_list: list, config: Any = None) -> list:
        """``pub_tensor`` of each key."""
        if _config_refused(config) and keys:
            return [INVALID_PARAMS] * len(keys)
        return self._put_tensors(keys, tensors_list, config, False)

    def batch_upsert_pub_tensor(self, keys: list, tensors_list: list, config: Any = None) -> list:
        """``upsert_pub_tensor`` of each key."""
        if _config_refused(config) and keys:
            return [INVALID_PARAMS] * len(keys)
        return self._put_tensors(keys, tensors_list, config, True)

    # -- gets of tensor objects --

    def get_tensor(self, key: str) -> Any:
        """The tensor stored under ``key`` (a copy), or ``None`` (missing, not a tensor object, any error)."""
        return decode(self.get_buffer(key))

    def batch_get_tensor(self, keys: list) -> list:
        """``get_tensor`` of each key."""
        return [decode(b) for b in self.batch_get_buffer(list(keys))]

    # -- zero-copy forms: objects laid out in registered memory --

    def _checked_object(self, ptr: int, size: int) -> bool:
        """Whether registered memory at ``ptr`` holds a tensor object of ``size`` bytes (header checked)."""
        if ptr == 0 or size < HEADER_SIZE or not self._registered(ptr, size):
            return False
        return parse(ctypes.string_at(ptr, HEADER_SIZE), size) is not None

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Stores the tensor object (header, then bytes: what ``get_tensor_into`` reads) of ``size`` bytes at
        ``buffer_ptr`` in registered memory; −600 if it is not one."""
        if not self._checked_object(buffer_ptr, size):
            return INVALID_PARAMS
        return self.put_from(key, buffer_ptr, size)

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Like ``put_tensor_from``, replacing an existing value."""
        if not self._checked_object(buffer_ptr, size):
            return INVALID_PARAMS
        return self.upsert_from(key, buffer_ptr, size)

    def _batch_from(self, keys: list, buffer_ptrs: list, sizes: list, upsert: bool, config: Any = None) -> list:
        n = len(keys)
        if n == 0:
            return []
        if len(buffer_ptrs) != n or len(sizes) != n:
            return [INVALID_PARAMS] * n
        # As the original: one bad object fails the whole batch.
        if not all(self._checked_object(p, s) for p, s in zip(buffer_ptrs, sizes)):
            return [INVALID_PARAMS] * n
        call = self.batch_upsert_from if upsert else self.batch_put_from
        return call(list(keys), list(buffer_ptrs), list(sizes), config)

    def batch_put_tensor_from(self, keys: list, buffer_ptrs: list, sizes: list) -> list:
        """``put_tensor_from`` of each key; every key −600 when any object is not a tensor object."""
        return self._batch_from(keys, buffer_ptrs, sizes, False)

    def batch_upsert_tensor_from(self, keys: list, buffer_ptrs: list, sizes: list) -> list:
        """``upsert_tensor_from`` of each key."""
        return self._batch_from(keys, buffer_ptrs, sizes, True)

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Reads ``key``'s object into registered memory at ``buffer_ptr`` (``size`` bytes) and returns the tensor
        as a view of that memory (its bytes start ``HEADER_SIZE`` bytes in), or ``None``."""
        if buffer_ptr == 0:
            return None
        n = self.get_into(key, buffer_ptr, size)
        return decode_at(buffer_ptr, n) if n >= 0 else None

    def batch_get_tensor_into(self, keys: list, buffer_ptrs: list, sizes: list) -> list:
        """``get_tensor_into`` of each key; ``[-600] * len(keys)`` for mismatched lists or a null pointer."""
        n = len(keys)
        if len(buffer_ptrs) != n or len(sizes) != n or any(p == 0 for p in buffer_ptrs):
            return [INVALID_PARAMS] * n
        lengths = self.batch_get_into(list(keys), list(buffer_ptrs), list(sizes))
        return [decode_at(p, m) if m >= 0 else None for p, m in zip(buffer_ptrs, lengths)]

    # -- tensor parallelism: one object per rank, `KEY_tp_RANK` --

    def _put_tensors_tp(self, keys: list, tensors: list, config: Any, tp_size: int, split_dim: int) -> list:
        n = len(keys)
        ids = _group_ids(config)
        if ids is not None and len(ids) != n:
            # The original's ValidateGroupIdsForBatchConfig: one group per key, or none.
            return [INVALID_PARAMS] * n
        out = [INVALID_PARAMS] * n
        todo, all_keys, objects = [], [], []
        for i, t in enumerate(tensors):
            found = as_array(t)
            parts = shards(found[0], found[1], tp_size, split_dim) if found is not None else None
            if parts is None:
                continue
            todo.append(i)
            all_keys.extend(tp_key(keys[i], r) for r in range(tp_size))
            objects.extend(parts)
        if not todo:
            return out
        if ids is not None:
            # Every shard of a key joins the key's group (the original's MakeRepeatedIndexedConfig).
            config = _with_groups(config, [ids[i] for i in todo for _ in range(tp_size)])
        done = self._put_objects(all_keys, objects, config, False)
        for j, i in enumerate(todo):
            ranks = done[j * tp_size:(j + 1) * tp_size]
            out[i] = next((rc for rc in ranks if rc != 0), 0)
        return out

    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> int:
        """Stores ``tensor`` split evenly along ``split_dim`` into ``tp_size`` shards, every rank's shard as
        ``{key}_tp_{rank}`` (a SHARD-layout object; ``tp_rank`` is not used, as in the original); with
        ``tp_size <= 1`` it is ``put_tensor``. 0, the first shard's error, or −600 when it does not split evenly."""
        if tp_size <= 1:
            return self.put_tensor(key, tensor)
        return self._put_tensors_tp([key], [tensor], None, tp_size, split_dim)[0]

    def pub_tensor_with_tp(self, key: str, tensor: Any, config: Any = None, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> int:
        """``put_tensor_with_tp`` with a ``ReplicateConfig`` (checked as ``pub_tensor`` checks it)."""
        if _config_refused(config):
            return INVALID_PARAMS
        if tp_size <= 1:
            return self.pub_tensor(key, tensor, config)
        return self._put_tensors_tp([key], [tensor], config, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp(self, base_keys: list, tensors_list: list, tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> list:
        """``put_tensor_with_tp`` of each key (all shards in one batch)."""
        if tp_size <= 1:
            return self.batch_put_tensor(base_keys, tensors_list)
        if len(base_keys) != len(tensors_list) or not base_keys:
            return [INVALID_PARAMS] * len(base_keys)
        return self._put_tensors_tp(list(base_keys), list(tensors_list), None, tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys: list, tensors_list: list, config: Any = None, tp_rank: int = 0,
                                 tp_size: int = 1, split_dim: int = 0) -> list:
        """``pub_tensor_with_tp`` of each key."""
        if tp_size <= 1:
            return self.batch_pub_tensor(base_keys, tensors_list, config)
        if len(base_keys) != len(tensors_list) or not base_keys or _config_refused(config):
            return [INVALID_PARAMS] * len(base_keys)
        return self._put_tensors_tp(list(base_keys), list(tensors_list), config, tp_size, split_dim)

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> Any:
        """Rank ``tp_rank``'s shard (``{key}_tp_{tp_rank}``); with ``tp_size <= 1``, ``get_tensor(key)``."""
        return self.get_tensor(key if tp_size <= 1 else tp_key(key, tp_rank))

    def batch_get_tensor_with_tp(self, base_keys: list, tp_rank: int = 0, tp_size: int = 1) -> list:
        """``get_tensor_with_tp`` of each key."""
        keys = list(base_keys) if tp_size <= 1 else [tp_key(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor(keys)

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0) -> int:
        """``put_tensor_with_tp`` of the tensor object at ``buffer_ptr`` (registered memory); with
        ``tp_size <= 1``, ``put_tensor_from``."""
        if buffer_ptr == 0 or size < HEADER_SIZE:
            return INVALID_PARAMS
        if tp_size <= 1:
            return self.put_tensor_from(key, buffer_ptr, size)
        found = self._object_array(buffer_ptr, size)
        if found is None:
            return INVALID_PARAMS
        return self._put_tensors_tp([key], [found], None, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp_from(self, base_keys: list, buffer_ptrs: list, sizes: list, tp_rank: int = 0,
                                      tp_size: int = 1, split_dim: int = 0) -> list:
        """``put_tensor_with_tp_from`` of each key."""
        if tp_size <= 1:
            return self.batch_put_tensor_from(base_keys, buffer_ptrs, sizes)
        n = len(base_keys)
        if len(buffer_ptrs) != n or len(sizes) != n or n == 0:
            return [INVALID_PARAMS] * n
        arrays = [self._object_array(p, s) if p != 0 and s >= HEADER_SIZE else None for p, s in zip(buffer_ptrs, sizes)]
        return self._put_tensors_tp(list(base_keys), arrays, None, tp_size, split_dim)

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0) -> Any:
        """``get_tensor_into`` of rank ``tp_rank``'s shard (of ``key`` itself with ``tp_size <= 1``)."""
        return self.get_tensor_into(key if tp_size <= 1 else tp_key(key, tp_rank), buffer_ptr, size)

    def batch_get_tensor_with_tp_into(self, base_keys: list, buffer_ptrs: list, sizes: list, tp_rank: int = 0,
                                      tp_size: int = 1) -> list:
        """``get_tensor_with_tp_into`` of each key."""
        keys = list(base_keys) if tp_size <= 1 else [tp_key(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    # -- the unified `_with_parallelism` family --
    #
    # The original routes each call by its request. No `parallelism` and no `writer_partition` is a full object
    # under the key itself (its DIRECT_FULL_OBJECT route, the same object `put_tensor` writes); a read target of
    # None or mode "as_stored" without axes reads the key as stored (`get_tensor`). A `parallelism` of one TP axis
    # (its TP_SHARDED_PARALLELISM route with one axis) stores the caller's tensor as that rank's shard: a SHARD
    # object under `{key}_tp_{rank}` (global shape = the shard's, times `size` along `split_dim`), then the
    # parallelism manifest under `{key}__parallelism_manifest`; a "shard" target of one TP axis reads that rank's
    # object back (see `_shard_key`). Any other valid parallelism (DP, EP, PP axes, several axes with at most one
    # of each kind) takes the original's planned route (`_axes_write`): the caller's tensor is the whole one, a
    # TP axis among them cuts this rank's slice, and the shard is stored under `_axes_key`; a "shard" target with
    # the same axes (in any order) reads it. Those routes are these calls, byte for byte (checked against the
    # 0.3.13 wheel). A ``writer_partition`` (any object with ``rank``, ``size``, ``split_dim``; never with a
    # ``parallelism``) takes the full tensor and stores that rank's even slice as a SHARD of one TP axis under
    # ``{key}__writer_{rank}of{size}_sd{split_dim}``, then the manifest under ``{key}__writer_manifest``
    # (`_writer_write`); a "shard" target of one TP axis reads it when ``{key}_tp_{rank}`` is missing, as the
    # original's second read route does (`_shard_read`). A "shard" target of one TP axis
    # with another shard count re-shards from the whole, as the original does; "full" targets answer None, as
    # the original's (0.3.13) do.

    def _direct_write(self, parallelism: Any, writer_partition: Any, config: Any) -> int:
        """0 when a request takes the full-object route; else −600 (shard requests, a refused config)."""
        if parallelism is not None or writer_partition is not None:
            return INVALID_PARAMS
        return INVALID_PARAMS if _config_refused(config) else 0

    def _shard_write(self, key: str, tensor: Any, parallelism: Any, writer_partition: Any, config: Any,
                     upsert: bool) -> Optional[int]:
        """The shard routes (see above): 0 or a code; ``None`` when the request is for the full object."""
        if writer_partition is not None:
            spec = _writer_spec(writer_partition)
            if parallelism is not None or spec is None:
                return INVALID_PARAMS
            return self._writer_write(key, tensor, spec, config, upsert)
        if parallelism is None:
            return None
        axes = _axes(parallelism)
        if axes is not None and not (len(axes) == 1 and axes[0][0] == AXIS_TP):
            return self._axes_write(key, tensor, axes, config, upsert)
        axis = _single_tp_axis(parallelism)
        if axis is None:
            return INVALID_PARAMS
        rank, size, split_dim = axis
        found = as_array(tensor)
        if found is None or not 0 <= split_dim < found[1].ndim:
            return INVALID_PARAMS
        code, array = found
        global_shape = list(array.shape)
        global_shape[split_dim] *= size
        obj = [header(code, global_shape, array.shape, array.nbytes,
                      [(AXIS_TP, rank, size, split_dim, array.shape[split_dim])]), _raw(array)]
        return self._put_with_manifest(tp_key(key, rank), obj, manifest_key(key),
                                       manifest_bytes(code, global_shape, split_dim, size), config, upsert)

    def _put_with_manifest(self, key: str, obj: list, manifest_at: str, manifest: bytes, config: Any,
                           upsert: bool) -> int:
        """Stores a shard object, then (once it is stored) the manifest of its split."""
        rc = self._put_objects([key], [obj], config, upsert)[0]
        return rc if rc != 0 else self._batch_put_values([manifest_at], [manifest], config, upsert)[0]

    def _writer_write(self, key: str, tensor: Any, spec: tuple, config: Any, upsert: bool) -> int:
        """The writer-partition route: rank's even slice of the caller's full tensor (−600 when it does not split
        evenly) and the writer manifest (see above)."""
        found = as_array(tensor)
        if found is None:
            return INVALID_PARAMS
        code, array = found
        rank, size, split_dim = spec
        obj = shard_object(code, array, rank, size, split_dim)
        if obj is None:
            return INVALID_PARAMS
        return self._put_with_manifest(writer_key(key, rank, size, split_dim), obj, writer_manifest_key(key),
                                       manifest_bytes(code, array.shape, split_dim, size), config, upsert)

    def _axes_write(self, key: str, tensor: Any, axes: list, config: Any, upsert: bool) -> int:
        """Any other valid parallelism (the original's planned route): the caller's tensor is the whole one; with
        a TP axis this rank's slice along its ``split_dim`` is stored (an even split, or −600) and the manifest
        written after it, else the whole tensor; a SHARD object whose header lists the axes in the caller's
        order, under ``_axes_key``."""
        found = as_array(tensor)
        if found is None:
            return INVALID_PARAMS
        code, array = found
        local = array
        tp = next((a for a in axes if a[0] == AXIS_TP), None)
        if tp is not None:
            _, rank, size, split_dim, _ = tp
            local = rank_slice(array, rank, size, split_dim)
            if local is None:
                return INVALID_PARAMS
        fields = [(kind, rank, size, split_dim, local.shape[split_dim] if kind == AXIS_TP else 0, ident)
                  for kind, rank, size, split_dim, ident in axes]
        obj = [header(code, array.shape, local.shape, local.nbytes, fields), _raw(local)]
        if tp is None:
            return self._put_objects([_axes_key(key, axes)], [obj], config, upsert)[0]
        return self._put_with_manifest(_axes_key(key, axes), obj, manifest_key(key),
                                       manifest_bytes(code, array.shape, tp[3], tp[2]), config, upsert)

    def _batch_direct_write(self, n: int, parallelisms: Any, writer_partitions: Any, config: Any,
                            values: int) -> int:
        """As ``_direct_write`` for a batch of ``n`` keys and ``values`` values, with the original's checks of
        the batch's ``group_ids`` (one per key, or none) and lengths first."""
        ids = _group_ids(config)
        if (ids is not None and len(ids) != n) or values != n:
            return INVALID_PARAMS
        return self._direct_write(parallelisms, writer_partitions, config)

    def put_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None, config: Any = None,
                                    writer_partition: Any = None) -> int:
        """Without ``parallelism`` or ``writer_partition``: ``pub_tensor(key, tensor, config)`` (the full tensor
        under ``key``); with one, the shard routes (see above)."""
        shard = self._shard_write(key, tensor, parallelism, writer_partition, config, False)
        if shard is not None:
            return shard
        rc = self._direct_write(parallelism, writer_partition, config)
        return rc if rc else self._put_tensors([key], [tensor], config, False)[0]

    def upsert_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None, config: Any = None,
                                       writer_partition: Any = None) -> int:
        """Like ``put_tensor_with_parallelism``, replacing an existing value."""
        shard = self._shard_write(key, tensor, parallelism, writer_partition, config, True)
        if shard is not None:
            return shard
        rc = self._direct_write(parallelism, writer_partition, config)
        return rc if rc else self._put_tensors([key], [tensor], config, True)[0]

    def batch_put_tensor_with_parallelism(self, keys: list, tensors_list: list, parallelisms: Any = None,
                                          config: Any = None, writer_partitions: Any = None) -> list:
        """``put_tensor_with_parallelism`` of each key (``[-600] * len(keys)`` for mismatched lists)."""
        return self._batch_tensors(keys, tensors_list, parallelisms, writer_partitions, config, False)

    def batch_upsert_tensor_with_parallelism(self, keys: list, tensors_list: list, parallelisms: Any = None,
                                             config: Any = None, writer_partitions: Any = None) -> list:
        """``upsert_tensor_with_parallelism`` of each key."""
        return self._batch_tensors(keys, tensors_list, parallelisms, writer_partitions, config, True)

    def _batch_tensors(self, keys: list, tensors_list: list, parallelisms: Any, writer_partitions: Any,
                       config: Any, upsert: bool) -> list:
        """The batch puts: all full objects in one batch, or (``parallelisms``: one per key) key by key, each with
        its own group id when the config has one per key (the original's ``ForSingleKey``)."""
        n = len(keys)
        if parallelisms is None and writer_partitions is None:
            rc = self._batch_direct_write(n, parallelisms, writer_partitions, config, len(tensors_list))
            return [rc] * n if rc else self._put_tensors(keys, tensors_list, config, upsert)
        requests = _per_key_requests(n, parallelisms, writer_partitions, config, len(tensors_list))
        if requests is None:
            return [INVALID_PARAMS] * n
        put = self.upsert_tensor_with_parallelism if upsert else self.put_tensor_with_parallelism
        return [put(k, t, p, cfg, w) for k, t, (p, w, cfg) in zip(keys, tensors_list, requests)]

    def _tensor_from(self, key: str, buffer_ptr: int, size: int, parallelism: Any, writer_partition: Any,
                     config: Any, upsert: bool) -> int:
        """The ``_with_parallelism_from`` writes: the tensor object at ``buffer_ptr`` (checked) stored as it is,
        or (a writer partition) rank's slice of it; other shard requests −600."""
        if writer_partition is not None and parallelism is None:
            found = self._object_array(buffer_ptr, size)
            if found is None:
                return INVALID_PARAMS
            rc = self._shard_write(key, found, None, writer_partition, config, upsert)
            return INVALID_PARAMS if rc is None else rc
        rc = self._direct_write(parallelism, writer_partition, config)
        if rc or not self._checked_object(buffer_ptr, size):
            return rc or INVALID_PARAMS
        return (self.upsert_from if upsert else self.put_from)(key, buffer_ptr, size, config)

    def put_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
                                         config: Any = None, writer_partition: Any = None) -> int:
        """Without a shard request: ``put_tensor_from`` with ``config`` (the tensor object at ``buffer_ptr``,
        checked); with a ``writer_partition``, rank's slice of it (the writer route). Other shard requests: −600."""
        return self._tensor_from(key, buffer_ptr, size, parallelism, writer_partition, config, False)

    def upsert_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
                                            config: Any = None, writer_partition: Any = None) -> int:
        """Like ``put_tensor_with_parallelism_from``, replacing an existing value."""
        return self._tensor_from(key, buffer_ptr, size, parallelism, writer_partition, config, True)

    def batch_put_tensor_with_parallelism_from(self, keys: list, buffer_ptrs: list, sizes: list,
                                               parallelisms: Any = None, config: Any = None,
                                               writer_partitions: Any = None) -> list:
        """``put_tensor_with_parallelism_from`` of each key (every key −600 when any object is not a tensor)."""
        return self._batch_tensors_from(keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, False)

    def batch_upsert_tensor_with_parallelism_from(self, keys: list, buffer_ptrs: list, sizes: list,
                                                  parallelisms: Any = None, config: Any = None,
                                                  writer_partitions: Any = None) -> list:
        """``upsert_tensor_with_parallelism_from`` of each key."""
        return self._batch_tensors_from(keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, True)

    def _batch_tensors_from(self, keys: list, buffer_ptrs: list, sizes: list, parallelisms: Any, config: Any,
                            writer_partitions: Any, upsert: bool) -> list:
        n = len(keys)
        if writer_partitions is None:
            rc = self._batch_direct_write(n, parallelisms, writer_partitions, config, len(buffer_ptrs))
            return [rc] * n if rc else self._batch_from(keys, buffer_ptrs, sizes, upsert, config)
        requests = _per_key_requests(n, parallelisms, writer_partitions, config, len(buffer_ptrs))
        if requests is None or len(sizes) != n:
            return [INVALID_PARAMS] * n
        return [self._tensor_from(k, ptr, size, p, w, cfg, upsert)
                for k, ptr, size, (p, w, cfg) in zip(keys, buffer_ptrs, sizes, requests)]

    def _resharded(self, key: str, target: Any) -> Optional[tuple]:
        """For a "shard" target of one TP axis whose size differs from the stored shard count, along the split
        the manifest names and dividing it evenly: ``(code, array, axis)``, the requested slice of the whole
        (the stored shards joined, as the original reassembles them); ``None`` when the request reads a stored
        shard instead (or a shard is missing: the original's legacy fallback reads the rank's own)."""
        if getattr(target, "mode", None) != "shard":
            return None
        axis = _single_tp_axis(getattr(target, "parallelism", None))
        manifest = parse_manifest(self.get_buffer(manifest_key(key))) if axis is not None else None
        if axis is None or manifest is None:
            return None
        rank, size, split_dim = axis
        code, global_shape, stored_dim, count = manifest
        if size == count or split_dim != stored_dim or global_shape[split_dim] % size != 0:
            return None
        parts = [decode_array(b) for b in self.batch_get_buffer([tp_key(key, i) for i in range(count)])]
        if any(p is None or p[0] != code for p in parts):
            return None
        whole = np.concatenate([p[1] for p in parts], axis=split_dim)
        if list(whole.shape) != list(global_shape):
            return None
        part = rank_slice(whole, rank, size, split_dim)
        return None if part is None else (code, part, (AXIS_TP, rank, size, split_dim, part.shape[split_dim]))

    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        """With no target (or mode "as_stored" and no axes): ``get_tensor(key)``. A "shard" target of one TP
        axis: that rank's stored shard (``{key}_tp_{rank}``) when the sizes match (or the split differs, as the
        original's fallback), else the slice of the whole it names (re-sharded from every stored shard). Other
        targets ("full", several or non-TP axes): None, as the original answers them."""
        if _as_stored(target):
            return self.get_tensor(key)
        resharded = self._resharded(key, target)
        if resharded is not None:
            return to_result(resharded[0], resharded[1])
        return self._shard_read(key, target, self.get_tensor)

    def batch_get_tensor_with_parallelism(self, keys: list, targets: Any = None) -> list:
        """``get_tensor_with_parallelism`` of each key (``targets``: None, or one per key; else all None)."""
        if targets is None:
            return self.batch_get_tensor(keys)
        if not isinstance(targets, list) or len(targets) != len(keys):
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(keys, targets)]

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: int, size: int, target: Any = None) -> Any:
        """``get_tensor_into`` for the targets ``get_tensor_with_parallelism`` reads; other targets: None."""
        if _as_stored(target):
            return self.get_tensor_into(key, buffer_ptr, size)
        resharded = self._resharded(key, target)
        if resharded is not None:
            # The re-sharded slice laid out as a shard object in the caller's registered memory.
            code, part, axis = resharded
            global_shape = list(part.shape)
            global_shape[axis[3]] *= axis[2]
            obj = header(code, global_shape, part.shape, part.nbytes, [axis]) + bytes(_raw(part))
            if buffer_ptr == 0 or len(obj) > size or not self._registered(buffer_ptr, len(obj)):
                return None
            ctypes.memmove(buffer_ptr, obj, len(obj))
            return decode_at(buffer_ptr, len(obj))
        return self._shard_read(key, target, lambda k: self.get_tensor_into(k, buffer_ptr, size))

    def _shard_read(self, key: str, target: Any, read: Any) -> Any:
        """``read`` of the stored shard a "shard" target names (``_shard_key``); for one TP axis, when that is
        missing, of the writer partition's shard of the same rank, size and split (the original's second route)."""
        shard = _shard_key(key, target)
        got = read(shard) if shard is not None else None
        axis = _single_tp_axis(getattr(target, "parallelism", None)) if got is None and shard is not None else None
        return read(writer_key(key, *axis)) if axis is not None else got

    def batch_get_tensor_with_parallelism_into(self, keys: list, buffer_ptrs: list, sizes: list,
                                               targets: Any = None) -> list:
        """``get_tensor_with_parallelism_into`` of each key."""
        if targets is None:
            return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)
        if not isinstance(targets, list) or len(targets) != len(keys):
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism_into(k, p, n, t)
                for k, p, n, t in zip(keys, buffer_ptrs, sizes, targets)]

    def _object_array(self, ptr: int, size: int) -> Any:
        """The tensor of the object in registered memory at ``ptr`` (a view with the tensor interface), or
        ``None`` if it is not a tensor object."""
        if not self._checked_object(ptr, size):
            return None
        p = parse(ctypes.string_at(ptr, HEADER_SIZE), size)
        return _Coded(p, ptr) if p is not None else None


class ParallelAxis:
    """The original's ``ParallelAxis``: one axis of a shard's identity, ``kind`` (``"tp"``, ``"dp"``, ``"ep"``,
    ``"pp"``), ``rank`` of ``size``, and ``split_dim`` / ``expert_id`` / ``stage_id`` where the kind has one."""

    def __init__(self) -> None:
        self.kind = ""
        self.rank = 0
        self.size = 1
        self.split_dim: Optional[int] = None
        self.expert_id: Optional[int] = None
        self.stage_id: Optional[int] = None


class TensorParallelism:
    """The original's ``TensorParallelism``: a shard's identity as a list of axes (``axes``)."""

    def __init__(self) -> None:
        self.axes: list = []


class ReadTarget:
    """The original's ``ReadTarget``: what a read wants, ``mode`` ``"as_stored"`` (default), ``"shard"`` or
    ``"full"``, and for a shard its ``parallelism``."""

    _MODES = ("as_stored", "shard", "full")

    def __init__(self) -> None:
        self._mode = "as_stored"
        self.parallelism: Any = None

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        normalized = str(mode).lower()
        if normalized not in self._MODES:
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = normalized


MANIFEST_MAGIC = 0x574D414E  # "WMAN"
# magic, version, header_size, dtype, ndim, split_dim, shard_count, reserved0, then 4 bytes of padding (the
# global shape that follows is 8-byte aligned).
_MANIFEST = struct.Struct("<IHHiiiii4x")
MANIFEST_SIZE = _MANIFEST.size + _SHAPE.size


def manifest_key(key: str) -> str:
    """Where the original keeps a sharded tensor's parallelism manifest."""
    return f"{key}__parallelism_manifest"


def manifest_bytes(code: int, global_shape: Sequence[int], split_dim: int, shard_count: int) -> bytes:
    """The original's ``ParallelismManifest`` (96 bytes): the full tensor's dtype and shape and how it is split."""
    dims = _SHAPE.pack(*(list(global_shape) + [-1] * (MAX_DIMS - len(global_shape))))
    return _MANIFEST.pack(MANIFEST_MAGIC, VERSION, MANIFEST_SIZE, code, len(global_shape), split_dim, shard_count,
                          0) + dims


def parse_manifest(data: Any) -> Optional[tuple]:
    """``(dtype code, global shape, split_dim, shard_count)`` of a parallelism manifest, or ``None``."""
    if data is None:
        return None
    raw = bytes(memoryview(data).cast("B"))
    if len(raw) < MANIFEST_SIZE:
        return None
    magic, version, size, code, ndim, split_dim, count, _ = _MANIFEST.unpack_from(raw, 0)
    if magic != MANIFEST_MAGIC or version != VERSION or size != MANIFEST_SIZE or not 0 <= ndim <= MAX_DIMS:
        return None
    shape = _SHAPE.unpack_from(raw, _MANIFEST.size)[:ndim]
    if not 0 <= code < len(DTYPE_CODES) or not 0 <= split_dim < ndim or count <= 0 or any(d < 0 for d in shape):
        return None
    return code, tuple(shape), split_dim, count


def _single_tp_axis(parallelism: Any) -> Optional[tuple]:
    """``(rank, size, split_dim)`` of a parallelism of exactly one valid TP axis (the original's checks: a
    known kind, ``0 <= rank < size``, a ``split_dim``); ``None`` otherwise."""
    axes = list(getattr(parallelism, "axes", None) or [])
    if len(axes) != 1:
        return None
    axis = axes[0]
    try:
        kind, rank, size = str(axis.kind).upper(), int(axis.rank), int(axis.size)
        split_dim = getattr(axis, "split_dim", None)
    except (AttributeError, TypeError, ValueError):
        return None
    if kind != "TP" or size <= 0 or not 0 <= rank < size or split_dim is None:
        return None
    return rank, size, int(split_dim)


_KINDS = {"DP": AXIS_DP, "TP": AXIS_TP, "EP": AXIS_EP, "PP": AXIS_PP}


def _axes(parallelism: Any) -> Optional[list]:
    """The axes of a parallelism as ``(kind, rank, size, split_dim, id)`` (``split_dim`` −1 and ``id`` 0 where
    the kind has none), in the caller's order, checked as the original checks them: a known kind at most once,
    ``0 <= rank < size``, a ``split_dim`` for TP and none for the others, an ``expert_id`` for EP and a
    ``stage_id`` for PP; ``None`` when one fails (or there is no axis)."""
    axes = list(getattr(parallelism, "axes", None) or [])
    out = []
    for axis in axes:
        try:
            kind, rank, size = _KINDS.get(str(axis.kind).upper()), int(axis.rank), int(axis.size)
            split_dim = getattr(axis, "split_dim", None)
            expert, stage = getattr(axis, "expert_id", None), getattr(axis, "stage_id", None)
        except (AttributeError, TypeError, ValueError):
            return None
        if kind is None or size <= 0 or not 0 <= rank < size or (split_dim is None) == (kind == AXIS_TP):
            return None
        ident = {AXIS_EP: expert, AXIS_PP: stage}.get(kind, 0)
        if ident is None:
            return None
        out.append((kind, rank, size, -1 if split_dim is None else int(split_dim), int(ident)))
    if not out or len({a[0] for a in out}) != len(out):
        return None
    return out


def _axes_key(key: str, axes: list) -> str:
    """The original's key of a shard named by ``axes`` (other than a lone TP axis, which is ``{key}_tp_{rank}``):
    one ``__`` part per axis in kind order — ``dp_{r}of{n}``, ``tp_{r}of{n}_sd{split_dim}``,
    ``ep_{r}of{n}_eid{expert}``, ``pp_{r}of{n}_sid{stage}``."""
    parts = []
    for kind, rank, size, split_dim, ident in sorted(axes):
        if kind == AXIS_DP:
            parts.append(f"dp_{rank}of{size}")
        elif kind == AXIS_TP:
            parts.append(f"tp_{rank}of{size}_sd{split_dim}")
        elif kind == AXIS_EP:
            parts.append(f"ep_{rank}of{size}_eid{ident}")
        else:
            parts.append(f"pp_{rank}of{size}_sid{ident}")
    return key + "".join("__" + p for p in parts)


def _shard_key(key: str, target: Any) -> Optional[str]:
    """For a "shard" read target of one TP axis: the key of that rank's object. The original reads it as stored
    when its layout names the same axis, and (its legacy fallback) also when it does not and the other ranks'
    shards are missing; with all of them stored it would cut the requested shard out of the whole, which
    Crescent does not do yet."""
    if getattr(target, "mode", None) != "shard":
        return None
    parallelism = getattr(target, "parallelism", None)
    axis = _single_tp_axis(parallelism)
    if axis is not None:
        return tp_key(key, axis[0])
    axes = _axes(parallelism)
    return _axes_key(key, axes) if axes is not None else None


def _per_key_requests(n: int, parallelisms: Any, writer_partitions: Any, config: Any,
                      values: int) -> Optional[list]:
    """The batch shard writes as ``(parallelism, writer_partition, config)`` per key (each key with its own group
    id when the config has one per key, the original's ``ForSingleKey``); ``None`` when the original refuses the
    batch: ``values`` or the request lists not one per key, or both lists given."""
    ids = _group_ids(config)
    if values != n or (ids is not None and len(ids) != n) or (parallelisms is None) == (writer_partitions is None):
        return None
    requests = parallelisms if parallelisms is not None else writer_partitions
    if not isinstance(requests, list) or len(requests) != n:
        return None
    configs = [_with_groups(config, [ids[i]]) if ids is not None else config for i in range(n)]
    if parallelisms is not None:
        return [(p, None, c) for p, c in zip(parallelisms, configs)]
    return [(None, w, c) for w, c in zip(writer_partitions, configs)]


def _as_stored(target: Any) -> bool:
    """Whether a read target asks for the object as stored under the key: None, or mode "as_stored" without
    axes."""
    if target is None:
        return True
    parallelism = getattr(target, "parallelism", None)
    return getattr(target, "mode", None) == "as_stored" and (parallelism is None or not parallelism.axes)


def _view(p: Parsed, ptr: int) -> np.ndarray:
    """A view of the bytes of the parsed object at ``ptr``, with its storage dtype and shape."""
    _require_numpy()
    storage = np.dtype(STORAGE[p.code])
    if p.data_bytes == 0:
        return np.empty(p.shape, storage)
    raw = (ctypes.c_char * p.data_bytes).from_address(ptr + p.data_offset)
    return np.frombuffer(raw, dtype=storage).reshape(p.shape)


class _Coded:
    """A tensor object's tensor as a view of its memory, with the tensor interface (its dtype by name, so
    bfloat16 and float8, which NumPy lacks, keep theirs)."""

    def __init__(self, p: Parsed, ptr: int):
        self._array = _view(p, ptr)
        self.dtype = f"torch.{DTYPE_NAMES[p.code]}"
        self.shape = p.shape

    def data_ptr(self) -> int:
        return self._array.ctypes.data if self._array.size else 0

    def numel(self) -> int:
        return int(self._array.size)

    def element_size(self) -> int:
        return self._array.itemsize
