"""Crescent's Python client. The store API is in :mod:`crescent.store` (also importable as ``mooncake.store``)."""

from crescent._crescent import __version__

__all__ = ["__version__"]
