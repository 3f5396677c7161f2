"""``mooncake.async_store`` on Crescent (the original's module): the same class as
:mod:`crescent.async_store`."""

from crescent.async_store import MooncakeDistributedStoreAsync

__all__ = ["MooncakeDistributedStoreAsync"]
