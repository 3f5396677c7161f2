"""``MooncakeDistributedStoreAsync``: the store with every call awaitable, as the original's
``mooncake.async_store`` has it.

``await store.async_NAME(...)`` runs ``store.NAME(...)`` in the event loop's default thread executor, so the loop
keeps running while the call waits on the cluster (the store's calls release the GIL while they wait). Results
and error codes are those of ``NAME``.
"""

import asyncio
import functools

from crescent.store import MooncakeDistributedStore

__all__ = ["MooncakeDistributedStoreAsync"]


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    """``MooncakeDistributedStore`` whose every method ``NAME`` also has an awaitable ``async_NAME``."""

    def __getattr__(self, name: str):
        # Only names that are not attributes reach here: `async_NAME` is made on first use and kept on the instance.
        if not name.startswith("async_"):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        sync_name = name[len("async_"):]
        if not hasattr(self, sync_name):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}' (nor '{sync_name}')")
        sync_method = getattr(self, sync_name)
        if not callable(sync_method):
            raise AttributeError(f"'{sync_name}' is not callable")
        async_method = self._make_async_wrapper(sync_method)
        setattr(self, name, async_method)
        return async_method

    def _make_async_wrapper(self, sync_method):
        """An awaitable running ``sync_method`` in the running loop's default executor."""

        @functools.wraps(sync_method)
        async def wrapper(*args, **kwargs):
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, functools.partial(sync_method, *args, **kwargs))

        return wrapper
