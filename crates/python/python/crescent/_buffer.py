"""``BufferHandle``: what ``get_buffer`` / ``batch_get_buffer`` return."""

from crescent import _crescent


class BufferHandle(bytes):
    """An object's value: a ``bytes`` subclass, so it has the buffer protocol on every Python version
    (``memoryview(handle)``, ``bytes(handle)``, ``len(handle)``), plus the original's ``ptr()`` and ``size()``."""

    __slots__ = ()

    def ptr(self) -> int:
        """The address of the value's bytes (valid while this handle lives)."""
        return _crescent._bytes_address(self)

    def size(self) -> int:
        """The value's length in bytes."""
        return len(self)

    def __repr__(self) -> str:
        return f"BufferHandle(size={len(self)})"
