"""A stand-in for the few parts of ``torch`` the tensor calls touch (tests only; torch is not a test dependency).

``Tensor`` wraps a NumPy array and has the tensor interface the calls read (``data_ptr()``, ``numel()``,
``element_size()``, ``dtype``, ``shape``, ``is_contiguous()``, ``contiguous()``, ``narrow()``, ``view(dtype)``);
the module has the dtypes and ``from_numpy`` / ``empty``. Put on ``sys.path`` (or in ``sys.modules``) it lets
the original wheel's tensor calls run without torch, and stands for torch when testing Crescent's torch path.
"""

import numpy as np


class dtype:
    """A dtype: its name, element size and the NumPy dtype holding its bytes."""

    def __init__(self, name, storage):
        self.name = name
        self.storage = np.dtype(storage)
        self.itemsize = self.storage.itemsize

    def __repr__(self):
        return f"torch.{self.name}"

    def __eq__(self, other):
        return isinstance(other, dtype) and other.name == self.name

    def __hash__(self):
        return hash(self.name)


float32 = dtype("float32", "<f4")
float64 = dtype("float64", "<f8")
int8 = dtype("int8", "i1")
uint8 = dtype("uint8", "u1")
int16 = dtype("int16", "<i2")
uint16 = dtype("uint16", "<u2")
int32 = dtype("int32", "<i4")
uint32 = dtype("uint32", "<u4")
int64 = dtype("int64", "<i8")
uint64 = dtype("uint64", "<u8")
bool = dtype("bool", "?")  # noqa: A001 (torch's name)
float16 = dtype("float16", "<f2")
bfloat16 = dtype("bfloat16", "<u2")
float8_e4m3fn = dtype("float8_e4m3fn", "u1")
float8_e5m2 = dtype("float8_e5m2", "u1")
_ALL = [float32, float64, int8, uint8, int16, uint16, int32, uint32, int64, uint64, bool, float16, bfloat16,
        float8_e4m3fn, float8_e5m2]


def _of_numpy(d):
    d = np.dtype(d)
    for t in _ALL:
        if t.storage == d and t.name not in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            return t
    raise TypeError(f"no dtype for {d}")


class Tensor:
    """A tensor over a NumPy array (its bytes are the array's)."""

    def __init__(self, array, dt=None):
        self._a = array
        self.dtype = dt if dt is not None else _of_numpy(array.dtype)

    @property
    def shape(self):
        return tuple(self._a.shape)

    def data_ptr(self):
        return self._a.ctypes.data

    def numel(self):
        return int(self._a.size)

    def element_size(self):
        return self.dtype.itemsize

    def is_contiguous(self):
        return self._a.flags["C_CONTIGUOUS"]

    def contiguous(self):
        return self if self.is_contiguous() else Tensor(np.ascontiguousarray(self._a), self.dtype)

    def narrow(self, dim, start, length):
        index = [slice(None)] * self._a.ndim
        index[dim] = slice(start, start + length)
        return Tensor(self._a[tuple(index)], self.dtype)

    def view(self, dt):
        return Tensor(self._a.view(dt.storage), dt)

    def numpy(self):
        return self._a

    def __repr__(self):
        return f"Tensor({self._a!r}, dtype={self.dtype!r})"


def from_numpy(array):
    return Tensor(array)


def empty(shape, dtype=float32):
    return Tensor(np.empty(tuple(shape), dtype.storage), dtype)
