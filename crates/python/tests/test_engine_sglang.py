"""SGLang's Mooncake storage (HiCache L3 and the direct linker), replayed call by call against a real master.

Upstream: sgl-project/sglang at commit 00fe477f32b3878f64d44cc36895e1de4a113afe:
  - python/sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py (`MooncakeStore`): check_server (the
    master's HTTP /get_all_segments), setup with keyword extras and its TypeError retry, warmup (put, is_exist,
    get), register_mem_pool_host (register_buffer), batch_exists (batch_is_exist prefix scan), batch_set_v1
    (batch_is_exist, then batch_put_from, or batch_put_from_multi_buffers for a layer_first MLA host pool, with a
    ReplicateConfig carrying group_ids under enable_group_semantics), batch_get_v1 (batch_get_into or
    batch_get_into_multi_buffers), clear (remove_all()), close (nothing). With `standalone_storage` on:
    MooncakeHostTensorAllocator.allocate (the host pool's memory from MooncakeHostMemAllocator().alloc),
    _standalone_required_bytes, and __init__'s setup_dummy(required_bytes, DEFAULT_LOCAL_BUFFER_SIZE,
    client_server_address) in place of setup, then the same warmup and calls.
  - python/sglang/srt/mem_cache/storage/mooncake_store/mooncake_direct_linker.py (`MooncakeDirectLinker`):
    register_buffers, offload (batch_set_v2 -> batch_is_exist + batch_put_from_multi_buffers), lookup
    (batch_exists_v2 -> batch_is_exist), load_layer_wise (batch_get_session_start, one
    batch_get_into_multi_buffer_ranges per layer, batch_get_session_end) and _load_page_wise (one
    batch_get_into_multi_buffer_ranges over all layers).
The classes below keep the engine's method names and make the same store calls, in the same order, with the same
arguments. Host (and device) KV pools are numpy arrays laid out as SGLang's: MHA page_first (2, tokens,
layers * token_bytes) and MLA layer_first (layers, tokens, token_bytes). No torch.

Run against the original with ENGINE_REPLAY_TARGET=original (see engine_target.py).
"""

import ctypes
import os
import pathlib
import socket
import time

import numpy as np
import pytest
import requests

# engine_master and engine_trace are fixtures (engine_trace autouse).
from conftest import master_count
from engine_target import (  # noqa: F401
    ORIGINAL, MiB, engine_master, engine_trace, pattern, start_master,
)

DEFAULT_LOCAL_BUFFER_SIZE = 16 * MiB  # mooncake_store.py: SGLANG_MOONCAKE_LOCAL_BUFFER_SIZE default
DEFAULT_TENANT_ID = "default"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HostPool:
    """SGLang host KV pool stand-in: `kv_buffer`, `page_size`, and `get_page_buffer_meta(indices)` as
    MHATokenToKVPoolHost (page_first) or MLATokenToKVPoolHost (layer_first) compute them."""

    def __init__(self, *, mla: bool, num_tokens: int, page_size: int, layer_num: int, token_bytes: int, seed=None,
                 allocator=None):
        self.mla, self.page_size, self.layer_num, self.token_bytes = mla, page_size, layer_num, token_bytes
        self.size = num_tokens
        shape = (layer_num, num_tokens, token_bytes) if mla else (2, num_tokens, layer_num * token_bytes)
        n = int(np.prod(shape))
        content = pattern(n, seed) if seed is not None else np.zeros(n, dtype=np.uint8)
        # HostKVCache allocates kv_buffer through its allocator (HostTensorAllocator: plain host memory by default).
        self.allocator = allocator
        if allocator is None:
            self.kv_buffer = content.reshape(shape)
        else:
            self.kv_buffer = allocator.allocate(shape)
            self.kv_buffer.reshape(-1)[:] = content

    def get_ksize_per_token(self):
        return self.layer_num * self.token_bytes

    def get_page_buffer_meta(self, indices):
        base = self.kv_buffer.ctypes.data
        ptrs, sizes = [], []
        for index in indices[:: self.page_size]:
            if self.mla:  # layer_first: one piece per layer
                for layer in range(self.layer_num):
                    ptrs.append(base + layer * self.size * self.token_bytes + index * self.token_bytes)
                    sizes.append(self.page_size * self.token_bytes)
            else:  # page_first: a page's K (all layers), then its V
                row = self.layer_num * self.token_bytes
                ptrs.append(base + index * row)
                ptrs.append(base + self.size * row + index * row)
                sizes += [self.page_size * row] * 2
        return ptrs, sizes

    def page(self, index):
        """The bytes a page at token `index` holds, as the engine's objects carry them (K then V, or by layer)."""
        p = self.page_size
        if self.mla:
            return np.concatenate([self.kv_buffer[layer, index:index + p].ravel() for layer in range(self.layer_num)])
        return np.concatenate([self.kv_buffer[0, index:index + p].ravel(), self.kv_buffer[1, index:index + p].ravel()])


class StorageConfig:
    """HiCacheStorageConfig's fields the store reads."""

    def __init__(self, *, is_mla_model=False, model_name="Qwen/Qwen3-8B", extra_config=None,
                 enable_storage_metrics=False):
        self.tp_rank, self.tp_size, self.pp_rank, self.pp_size = 0, 1, 0, 1
        self.attn_cp_rank, self.attn_cp_size = 0, 1
        self.is_mla_model = is_mla_model
        self.model_name = model_name
        self.extra_config = extra_config
        self.enable_storage_metrics = enable_storage_metrics
        self.should_split_heads = False
        self.dp_rank = None


class MooncakeStore:
    """mooncake_store.py MooncakeStore (non-standalone, no shared transfer engine)."""

    def __init__(self, storage_config: StorageConfig, master_addr: str, master_metrics_port: int,
                 global_segment_size=64 * MiB, check_server=False):
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig

        self._replicate_config_cls = ReplicateConfig
        self._supports_group_ids = hasattr(ReplicateConfig, "group_ids")
        self.store = MooncakeDistributedStore()
        extra = storage_config.extra_config or {}
        self.master_server_address = master_addr
        self.master_metrics_port = master_metrics_port
        self.enable_group_semantics = bool(extra.get("enable_group_semantics", False))
        self._use_group_semantics = self.enable_group_semantics and self._supports_group_ids
        rank_scale_factor = storage_config.tp_size * storage_config.pp_size
        per_rank_global_segment_size = global_segment_size // rank_scale_factor
        parts = []
        if extra.get("extra_backend_tag") is not None:
            parts.append(str(extra["extra_backend_tag"]))
        if storage_config.model_name:
            parts.append("-".join(storage_config.model_name.split("/")))
        self.config_prefix = "_".join(parts) if parts else None
        if check_server:
            self.check_server()

        setup_kwargs = {}
        if storage_config.enable_storage_metrics:  # _get_mooncake_client_http_setup_kwargs
            setup_kwargs = {"enable_client_http_server": True, "client_http_port": _free_port()}
        tenant_id = extra.get("tenant_id", DEFAULT_TENANT_ID)
        if tenant_id != DEFAULT_TENANT_ID:
            setup_kwargs["tenant_id"] = tenant_id
        setup_kwargs.update(extra.get("_extra_setup_kwargs", {}))  # kwargs of a newer SGLang, for the retry
        self.dropped_setup_kwargs = []
        while True:
            try:
                ret_code = self.store.setup(
                    "localhost",
                    "P2PHANDSHAKE",
                    per_rank_global_segment_size,
                    DEFAULT_LOCAL_BUFFER_SIZE,
                    "tcp",
                    "",
                    master_addr,
                    None,  # transfer_engine
                    **setup_kwargs,
                )
                break
            except TypeError as e:
                unsupported = [k for k in list(setup_kwargs) if k in str(e)]
                if not unsupported:
                    raise
                if "tenant_id" in unsupported:
                    raise RuntimeError("tenant_id unsupported") from e
                for k in unsupported:
                    setup_kwargs.pop(k, None)
                self.dropped_setup_kwargs += unsupported
        self.setup_kwargs = setup_kwargs
        if ret_code:
            raise RuntimeError(f"Failed to setup Mooncake store, error code: {ret_code}")
        self.local_rank = storage_config.tp_rank
        self.warmup()
        self.is_mla_backend = storage_config.is_mla_model
        self.mha_suffix = f"{self.local_rank}"
        self.mla_suffix = ""
        self.registered_pools = {}

    def check_server(self, timeout=5.0):
        """The engine polls every 3 s for up to 600 s while the text is empty or the request fails."""
        url = f"http://{self.master_server_address.split(':')[0]}:{self.master_metrics_port}/get_all_segments"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                resp = requests.get(url, timeout=3)
            except Exception:
                time.sleep(0.2)  # the engine's 3 s poll, shortened
                continue
            if resp.text == "":
                time.sleep(0.2)
                continue
            self.check_server_response = resp
            return
        raise ValueError("Launch mooncake store server timeout")

    def warmup(self):
        import uuid

        warmup_key = "sglang_mooncake_store_warmup_key" + uuid.uuid4().hex
        warmup_value = bytes(4 * 1024)
        for _attempt in range(10):
            if self.store.put(warmup_key, warmup_value) == 0:
                break
            time.sleep(1.0)
        else:
            raise RuntimeError("Warmup put failed after 10 attempts")
        assert self.store.is_exist(warmup_key) == 1
        assert self.store.get(warmup_key) == warmup_value

    def register_buffer(self, buffer: np.ndarray):
        ret_code = self.store.register_buffer(buffer.ctypes.data, buffer.nbytes)
        if ret_code != 0:
            raise RuntimeError(f"Failed to register buffer to Mooncake Store, error code: {ret_code}")

    def register_mem_pool_host(self, mem_pool_host: HostPool):
        self.mem_pool_host = mem_pool_host
        self.register_buffer(mem_pool_host.kv_buffer)

    def _tag_keys(self, keys):
        if self.config_prefix is None:
            return keys
        return [f"{self.config_prefix}_{key}" for key in keys]

    def _expand_group_ids(self, logical_keys, key_multiplier):
        out = []
        for key in logical_keys:
            out.extend([f"sglang-hicache:{key}"] * key_multiplier)
        return out

    @staticmethod
    def _pack_multi_buffer_meta(key_strs, ptr_list, element_size_list):
        if len(ptr_list) == len(key_strs):
            return ptr_list, element_size_list
        nbuf = len(ptr_list) // len(key_strs)
        return ([ptr_list[i:i + nbuf] for i in range(0, len(ptr_list), nbuf)],
                [element_size_list[i:i + nbuf] for i in range(0, len(element_size_list), nbuf)])

    def _batch_preprocess(self, keys, host_indices):
        ptr_list, size_list = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if self.is_mla_backend:
            key_list = [f"{k}_{self.mla_suffix}_k" for k in keys]
            ptr_list, size_list = self._pack_multi_buffer_meta(key_list, ptr_list, size_list)
        else:
            key_list = []
            for k in keys:
                key_list += [f"{k}_{self.mha_suffix}_k", f"{k}_{self.mha_suffix}_v"]
        assert len(key_list) == len(ptr_list)
        return key_list, ptr_list, size_list

    def _batch_postprocess(self, results, is_set_operate=False, key_multiplier=None):
        if key_multiplier is None:
            key_multiplier = 1 if self.is_mla_backend else 2
        groups = [results[i:i + key_multiplier] for i in range(0, len(results), key_multiplier)]
        return [all(r == 0 for r in g) if is_set_operate else all(r > 0 for r in g) for g in groups]

    def batch_get_v1(self, keys, host_indices):
        keys = self._tag_keys(keys)
        key_strs, ptrs, sizes = self._batch_preprocess(keys, host_indices)
        self.last_get_results = self._get_batch_zero_copy_impl(key_strs, ptrs, sizes)
        return self._batch_postprocess(self.last_get_results, is_set_operate=False)

    def batch_set_v1(self, keys, host_indices):
        keys = self._tag_keys(keys)
        key_strs, ptrs, sizes = self._batch_preprocess(keys, host_indices)
        key_multiplier = len(key_strs) // len(keys)
        group_ids = self._expand_group_ids(keys, key_multiplier) if self._use_group_semantics else None
        exist_result = self._batch_exist(key_strs)
        set_idx = [i for i in range(len(key_strs)) if exist_result[i] != 1]
        set_results = [0 if exist_result[i] == 1 else -1 for i in range(len(key_strs))]
        self.last_put_keys = [key_strs[i] for i in set_idx]
        if set_idx:
            put_results = self._put_batch_zero_copy_impl(
                [key_strs[i] for i in set_idx], [ptrs[i] for i in set_idx], [sizes[i] for i in set_idx],
                None if group_ids is None else [group_ids[i] for i in set_idx],
            )
            self.last_put_results = list(put_results)
            for i, r in zip(set_idx, put_results):
                set_results[i] = r
        return self._batch_postprocess(set_results, is_set_operate=True)

    def batch_exists(self, keys):
        keys = self._tag_keys(keys)
        if self.is_mla_backend:
            query_keys, key_multiplier = [f"{k}_{self.mla_suffix}_k" for k in keys], 1
        else:
            query_keys, key_multiplier = [], 2
            for k in keys:
                query_keys += [f"{k}_{self.mha_suffix}_k", f"{k}_{self.mha_suffix}_v"]
        exist_result = self._batch_exist(query_keys)
        for i in range(len(query_keys)):
            if exist_result[i] != 1:
                return i // key_multiplier
        return len(query_keys) // key_multiplier

    def close(self):
        pass  # "MooncakeDistributedStore will automatically call the destructor"

    def clear(self):
        self.store.remove_all()

    def _put_batch_zero_copy_impl(self, key_strs, buffer_ptrs, buffer_sizes, group_ids=None):
        config = None
        if self._use_group_semantics and group_ids is not None:
            config = self._replicate_config_cls()
            config.group_ids = group_ids
        if buffer_ptrs and isinstance(buffer_ptrs[0], list):
            config = config or self._replicate_config_cls()
            return self.store.batch_put_from_multi_buffers(key_strs, buffer_ptrs, buffer_sizes, config)
        if config is not None:
            return self.store.batch_put_from(key_strs, buffer_ptrs, buffer_sizes, config)
        return self.store.batch_put_from(key_strs, buffer_ptrs, buffer_sizes)

    def _get_batch_zero_copy_impl(self, key_strs, buffer_ptrs, buffer_sizes):
        if buffer_ptrs and isinstance(buffer_ptrs[0], list):
            return self.store.batch_get_into_multi_buffers(key_strs, buffer_ptrs, buffer_sizes)
        return self.store.batch_get_into(key_strs, buffer_ptrs, buffer_sizes)

    def _batch_exist(self, key_strs):
        return self.store.batch_is_exist(key_strs)


def http_port(master) -> int:
    return int(master.http.rsplit(":", 1)[1])


# ---------------------------------------------------------------- HiCache (mooncake_store.py)


def test_sglang_check_server_reads_get_all_segments(engine_master):
    """mooncake_store.py MooncakeStore.check_server: GET http://<master ip>:<master_metrics_port>/get_all_segments,
    waiting while the text is empty; the answer names the mounted segment once a store has mounted one."""
    from mooncake.store import MooncakeDistributedStore

    url = f"http://{engine_master.http}/get_all_segments"
    host = MooncakeDistributedStore()
    assert host.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", engine_master.addr) == 0
    try:
        resp = requests.get(url, timeout=3)
        assert resp.status_code == 200, (resp.status_code, resp.text)
        assert host.get_hostname() in resp.text.split()
        s = MooncakeStore(StorageConfig(), engine_master.addr, http_port(engine_master), check_server=True)
        assert host.get_hostname() in s.check_server_response.text.split()
        s.clear()
        s.store.close()
    finally:
        host.close()


def test_sglang_hicache_mha_page_first_lifecycle(engine_master):
    """mooncake_store.py: __init__ (setup with 8 positional arguments and the client-HTTP keyword extras
    enable_storage_metrics adds, warmup put/is_exist/get), register_mem_pool_host (register_buffer of the host
    pool), batch_exists (batch_is_exist over _k/_v keys, prefix count), batch_set_v1 (batch_is_exist then
    batch_put_from of the missing keys, without a config), batch_get_v1 (batch_get_into into other host slots,
    bytes read per key), and a second engine instance reading the first's pages; byte for byte."""
    page, layers, token_bytes = 4, 3, 512
    cfg = StorageConfig(enable_storage_metrics=True)
    writer = MooncakeStore(cfg, engine_master.addr, http_port(engine_master))
    reader = MooncakeStore(cfg, engine_master.addr, http_port(engine_master))
    try:
        assert writer.setup_kwargs.keys() == {"enable_client_http_server", "client_http_port"}
        assert writer.dropped_setup_kwargs == []
        src = HostPool(mla=False, num_tokens=64, page_size=page, layer_num=layers, token_bytes=token_bytes, seed=5)
        dst = HostPool(mla=False, num_tokens=64, page_size=page, layer_num=layers, token_bytes=token_bytes)
        writer.register_mem_pool_host(src)
        reader.register_mem_pool_host(dst)
        keys = [f"page-hash-{i}" for i in range(6)]
        assert writer.batch_exists(keys) == 0

        idx4 = np.arange(0, 4 * page)
        assert writer.batch_set_v1(keys[:4], idx4) == [True] * 4
        assert writer.last_put_results == [0] * 8
        assert reader.batch_exists(keys) == 4, "prefix of the first four pages"
        idx6 = np.arange(0, 6 * page)
        assert writer.batch_set_v1(keys, idx6) == [True] * 6
        assert len(writer.last_put_keys) == 4, "only pages 4 and 5 (K and V) were missing"
        assert writer.last_put_keys[0] == "Qwen-Qwen3-8B_page-hash-4_0_k"
        assert reader.batch_exists(keys) == 6

        dst_idx = np.arange(10 * page, 16 * page)
        assert reader.batch_get_v1(keys, dst_idx) == [True] * 6
        assert reader.last_get_results == [page * layers * token_bytes] * 12
        for i in range(6):
            assert np.array_equal(dst.page(dst_idx[i * page]), src.page(i * page)), i
        # A page nobody stored: its K and V reads are negative codes, so the page is False.
        assert reader.batch_get_v1(["page-hash-missing"], np.arange(0, page)) == [False]
        assert all(r < 0 for r in reader.last_get_results)
        assert not dst.kv_buffer[:, 0:page].any()
    finally:
        writer.store.remove_all(force=True)
        for s in (reader, writer):
            s.close()
            s.store.close()


class PrefixMooncakeStore(MooncakeStore):
    """mooncake_store.py's MooncakeStore with its existence lookup served by Crescent's `batch_is_exist_prefix`:
    `batch_exists` (which counts the leading hits) gets the same count from one request that answers the run and
    leases it for the `batch_get_v1` that follows."""

    def _batch_exist(self, key_strs):
        run = self.store.batch_is_exist_prefix(key_strs)
        return [1] * run + [0] * (len(key_strs) - run)


@pytest.mark.skipif(ORIGINAL, reason="batch_is_exist_prefix is Crescent's own call: the original has none")
def test_sglang_batch_exists_in_one_request_and_the_pages_it_found_read_without_a_lookup(engine_master):
    """mooncake_store.py's batch_exists then batch_get_v1 (as in the lifecycle above), with batch_exists served by
    `batch_is_exist_prefix`: the same counts, one master request per lookup instead of one per batch_is_exist and
    another per read, and the read of the pages found takes the lookup's replica lists."""
    page, layers, token_bytes = 4, 2, 256
    writer = MooncakeStore(StorageConfig(), engine_master.addr, http_port(engine_master))
    reader = PrefixMooncakeStore(StorageConfig(), engine_master.addr, http_port(engine_master))
    try:
        src = HostPool(mla=False, num_tokens=64, page_size=page, layer_num=layers, token_bytes=token_bytes, seed=9)
        dst = HostPool(mla=False, num_tokens=64, page_size=page, layer_num=layers, token_bytes=token_bytes)
        writer.register_mem_pool_host(src)
        reader.register_mem_pool_host(dst)
        keys = [f"prefix-page-{i}" for i in range(6)]
        assert reader.batch_exists(keys) == 0
        assert writer.batch_set_v1(keys[:4], np.arange(0, 4 * page)) == [True] * 4
        # Page 5 stored, page 4 not: the prefix is the first four.
        assert writer.batch_set_v1(keys[5:], np.arange(5 * page, 6 * page)) == [True]

        lookups = master_count(engine_master.http, "requests_total", "batch_get_replica_list")
        assert reader.batch_exists(keys) == 4
        dst_idx = np.arange(8 * page, 12 * page)
        assert reader.batch_get_v1(keys[:4], dst_idx) == [True] * 4
        after = master_count(engine_master.http, "requests_total", "batch_get_replica_list")
        assert after == lookups, "the read took the lookup's replica lists"
        for i in range(4):
            assert np.array_equal(dst.page(dst_idx[i * page]), src.page(i * page)), i
    finally:
        writer.store.remove_all(force=True)
        for s in (reader, writer):
            s.close()
            s.store.close()


def test_sglang_hicache_clear_is_remove_all_without_force(engine_master):
    """mooncake_store.py MooncakeStore.clear: remove_all() without force. On the original, objects read within the
    master's lease (5 s, its default) are kept and the others go: it grants the lease on every read of an object
    (batch_get_into here) and on batch_is_exist, and holds it for the whole TTL. Crescent releases a read's lease
    when the read completes (ReleaseLeases, docs/protocol.md): a designed difference — only an object being read
    at that moment, or looked up without being read, is kept; pages read and done with go, as clear() asks."""
    page = 2
    s = MooncakeStore(StorageConfig(), engine_master.addr, http_port(engine_master))
    try:
        src = HostPool(mla=False, num_tokens=32, page_size=page, layer_num=2, token_bytes=256, seed=6)
        s.register_mem_pool_host(src)
        keys = [f"clear-{i}" for i in range(4)]
        # batch_set_v1's own batch_is_exist runs before the puts, so it leases nothing.
        assert s.batch_set_v1(keys, np.arange(0, 4 * page)) == [True] * 4
        assert s.batch_get_v1(keys[:2], np.arange(16, 16 + 2 * page)) == [True, True]
        s.clear()
        kept = [1] * 4 + [0] * 4 if ORIGINAL else [0] * 8
        assert s.store.batch_is_exist([f"Qwen-Qwen3-8B_{k}_0_{kv}" for k in keys for kv in "kv"]) == kept
    finally:
        s.store.remove_all(force=True)
        s.store.close()


def test_sglang_hicache_mla_layer_first_multi_buffers_with_group_ids(engine_master):
    """mooncake_store.py with is_mla_model and a layer_first host pool: _get_mla_buffer_meta packs one piece per
    layer per page (_pack_multi_buffer_meta), so batch_set_v1 calls batch_put_from_multi_buffers(keys, ptrs,
    sizes, ReplicateConfig) - here with enable_group_semantics, the config carrying one group id per key - and
    batch_get_v1 calls batch_get_into_multi_buffers; batch_exists asks batch_is_exist for the `_k` keys."""
    page, layers, token_bytes = 8, 4, 576
    cfg = StorageConfig(is_mla_model=True, extra_config={"enable_group_semantics": True, "extra_backend_tag": "t1"})
    s = MooncakeStore(cfg, engine_master.addr, http_port(engine_master))
    try:
        assert s._use_group_semantics, "ReplicateConfig.group_ids exists"
        src = HostPool(mla=True, num_tokens=64, page_size=page, layer_num=layers, token_bytes=token_bytes, seed=7)
        s.register_mem_pool_host(src)
        keys = [f"mla-{i}" for i in range(3)]
        assert s.batch_set_v1(keys, np.arange(0, 3 * page)) == [True] * 3
        assert s.last_put_keys == [f"t1_Qwen-Qwen3-8B_mla-{i}__k" for i in range(3)]
        assert s.batch_exists(keys + ["mla-missing"]) == 3
        assert s.batch_set_v1(keys, np.arange(0, 3 * page)) == [True] * 3, "all exist: nothing put"
        assert s.last_put_keys == []

        dst = HostPool(mla=True, num_tokens=64, page_size=page, layer_num=layers, token_bytes=token_bytes)
        s.register_buffer(dst.kv_buffer)
        s.mem_pool_host = dst
        assert s.batch_get_v1(keys, np.arange(4 * page, 7 * page)) == [True] * 3
        assert s.last_get_results == [page * layers * token_bytes] * 3
        for i in range(3):
            assert np.array_equal(dst.page((4 + i) * page), src.page(i * page))
    finally:
        s.store.remove_all(force=True)
        s.store.close()


def test_sglang_setup_type_error_retry_drops_the_unknown_keyword(engine_master):
    """mooncake_store.py __init__: setup's keyword extras (here the client-HTTP pair enable_storage_metrics adds,
    plus one a newer SGLang could pass) - a keyword the installed wheel does not know makes setup raise TypeError,
    the engine drops every extra whose name appears in the message and retries. The original's (pybind11) message
    lists the whole signature, so it names every known extra too and the engine drops them all; Crescent's names
    only the unknown one. Either way setup then succeeds without the unknown keyword."""
    s = MooncakeStore(StorageConfig(enable_storage_metrics=True,
                                    extra_config={"_extra_setup_kwargs": {"some_future_option": 1}}),
                      engine_master.addr, http_port(engine_master))
    try:
        assert "some_future_option" in s.dropped_setup_kwargs
        assert "some_future_option" not in s.setup_kwargs
        expected_dropped = (["enable_client_http_server", "client_http_port", "some_future_option"] if ORIGINAL
                            else ["some_future_option"])
        assert s.dropped_setup_kwargs == expected_dropped
    finally:
        s.store.close()


def test_sglang_setup_with_a_tenant(engine_master):
    """mooncake_store.py __init__: a non-default tenant_id travels to setup as a keyword (setup_kwargs["tenant_id"]);
    two engines of different tenants on one master, each putting and reading the same key name. The original
    accepts the keyword but keys are not per tenant (observed, see the assertion)."""
    a = MooncakeStore(StorageConfig(extra_config={"tenant_id": "tenant-a"}), engine_master.addr,
                      http_port(engine_master))
    b = MooncakeStore(StorageConfig(extra_config={"tenant_id": "tenant-b"}), engine_master.addr,
                      http_port(engine_master))
    try:
        assert a.setup_kwargs == {"tenant_id": "tenant-a"} and a.dropped_setup_kwargs == []
        assert a.store.put("shared-name", b"from a") == 0
        assert a.store.is_exist("shared-name") == 1
        seen_by_b = b.store.is_exist("shared-name")
        assert b.store.put("shared-name", b"from b") == 0
        got_a, got_b = a.store.get("shared-name"), b.store.get("shared-name")
        # The original (0.3.13.post1, default master flags) does not separate tenants' keys: b sees a's key and
        # b's put of an existing key keeps a's value. The replay pins that behaviour.
        assert (seen_by_b, got_a, got_b) == (1, b"from a", b"from a")
    finally:
        for s in (a, b):
            s.store.remove_all(force=True)
            s.store.close()


# ---------------------------------------------------------------- standalone storage (setup_dummy)


class MooncakeHostTensorAllocator:
    """mooncake_store.py MooncakeHostTensorAllocator: allocate(dims) takes the bytes from
    MooncakeHostMemAllocator().alloc and views them as the pool (a numpy uint8 array here, torch.frombuffer there)."""

    def __init__(self):
        from mooncake.store import MooncakeHostMemAllocator

        self.allocator = MooncakeHostMemAllocator()
        self.ptr = None

    def allocate(self, dims):
        self.dims = dims
        size = int(np.prod(dims))
        ptr_int = self.allocator.alloc(size)
        self.ptr = ptr_int
        c_array = (ctypes.c_uint8 * size).from_address(ptr_int)
        return np.ctypeslib.as_array(c_array).reshape(dims)


class StandaloneMooncakeStore(MooncakeStore):
    """mooncake_store.py MooncakeStore with standalone_storage on: the same engine, but __init__ attaches to the
    storage process on this host (client_server_address: the original's `mooncake_client`, on Crescent a
    `crescent node --memfd`) with setup_dummy instead of setting up a store of its own."""

    def __init__(self, storage_config: StorageConfig, client_server_address: str, mem_pool: HostPool):
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig

        self._replicate_config_cls = ReplicateConfig
        self._supports_group_ids = hasattr(ReplicateConfig, "group_ids")
        self.store = MooncakeDistributedStore()
        extra = storage_config.extra_config or {}
        self.enable_group_semantics = bool(extra.get("enable_group_semantics", False))
        self._use_group_semantics = self.enable_group_semantics and self._supports_group_ids
        parts = []
        if extra.get("extra_backend_tag") is not None:
            parts.append(str(extra["extra_backend_tag"]))
        if storage_config.model_name:
            parts.append("-".join(storage_config.model_name.split("/")))
        self.config_prefix = "_".join(parts) if parts else None
        if not isinstance(mem_pool.allocator, MooncakeHostTensorAllocator):
            raise RuntimeError("MooncakeStore with standalone_storage=True requires MooncakeHostTensorAllocator.")
        self.required_bytes = self._standalone_required_bytes(mem_pool)
        ret_code = self.store.setup_dummy(self.required_bytes, DEFAULT_LOCAL_BUFFER_SIZE, client_server_address)
        if ret_code:
            raise RuntimeError(f"Failed to setup Mooncake store, error code: {ret_code}")
        self.local_rank = storage_config.tp_rank
        self.warmup()
        self.is_mla_backend = storage_config.is_mla_model
        self.mha_suffix = f"{self.local_rank}"
        self.mla_suffix = ""
        self.registered_pools = {}

    @staticmethod
    def _standalone_required_bytes(mem_pool: HostPool) -> int:
        """The bytes of the host buffers the storage process must see: the KV buffer (a single pool, no sidecars)."""
        return int(mem_pool.kv_buffer.nbytes)


class StandaloneStorage:
    """The storage process SGLang's standalone mode attaches to, started beside the master: on Crescent a
    `crescent node --memfd` (conftest's Node), on the original its `mooncake_client` (conftest's
    OriginalRealClient, found beside $MOONCAKE_MASTER_BIN). `address` is client_server_address."""

    def __init__(self, master_addr: str, segment: int = 256 * MiB):
        from conftest import Node, OriginalRealClient, free_port

        if ORIGINAL:
            binary = pathlib.Path(os.environ.get("MOONCAKE_MASTER_BIN", "/work/mc-venv/bin/mooncake_master"))
            port = free_port()
            self._proc = OriginalRealClient(master_addr, port, segment, str(binary.parent / "mooncake_client"))
            self.address = f"127.0.0.1:{port}"
        else:
            self._proc = Node(master_addr, "127.0.0.1:0", f"{segment // MiB}MiB")
            self.address = self._proc.endpoint

    def stop(self) -> None:
        self._proc.stop()


@pytest.fixture
def standalone_master():
    """A master of the test's own: the storage process it starts stops at its end, and the original's
    `mooncake_client`, killed, leaves its segment on the master for a while (the module's other tests must not
    place objects there)."""
    m = start_master()
    yield m
    m.stop()


def test_sglang_standalone_storage_mha_lifecycle(standalone_master):
    """mooncake_store.py with standalone_storage: the host pool allocated by MooncakeHostTensorAllocator
    (MooncakeHostMemAllocator().alloc), __init__'s setup_dummy(_standalone_required_bytes(mem_pool),
    DEFAULT_LOCAL_BUFFER_SIZE, client_server_address) and warmup (put/is_exist/get), register_mem_pool_host
    (register_buffer of the pool), batch_exists, batch_set_v1 (batch_is_exist, batch_put_from of the missing
    keys), batch_get_v1 (batch_get_into into other slots of the same pool), clear (remove_all()) and close.
    A second engine set up as usual (not standalone) reads the attached engine's pages, byte for byte."""
    page, layers, token_bytes = 4, 3, 512
    storage = StandaloneStorage(standalone_master.addr)
    s = reader = None
    try:
        pool = HostPool(mla=False, num_tokens=64, page_size=page, layer_num=layers, token_bytes=token_bytes,
                        seed=11, allocator=MooncakeHostTensorAllocator())
        s = StandaloneMooncakeStore(StorageConfig(), storage.address, pool)
        assert s.required_bytes == 2 * 64 * layers * token_bytes
        s.register_mem_pool_host(pool)
        keys = [f"standalone-{i}" for i in range(6)]
        assert s.batch_exists(keys) == 0
        src = pool.kv_buffer.copy()  # what the pages hold before any get writes into the pool

        assert s.batch_set_v1(keys[:4], np.arange(0, 4 * page)) == [True] * 4
        assert s.last_put_results == [0] * 8
        assert s.batch_exists(keys) == 4
        assert s.batch_set_v1(keys, np.arange(0, 6 * page)) == [True] * 6
        assert s.last_put_keys == [f"Qwen-Qwen3-8B_standalone-{i}_0_{kv}" for i in (4, 5) for kv in "kv"]
        assert s.batch_exists(keys + ["standalone-missing"]) == 6

        # Its own pages back into other slots of its pool.
        dst_idx = np.arange(8 * page, 14 * page)
        assert s.batch_get_v1(keys, dst_idx) == [True] * 6
        assert s.last_get_results == [page * layers * token_bytes] * 12
        for i in range(6):
            for kv in (0, 1):
                assert np.array_equal(pool.kv_buffer[kv, (8 + i) * page:(9 + i) * page], src[kv, i * page:(i + 1) * page])

        # An engine of its own on the master (setup, a segment of its own) reads them from the storage process.
        reader = MooncakeStore(StorageConfig(), standalone_master.addr, http_port(standalone_master))
        other = HostPool(mla=False, num_tokens=64, page_size=page, layer_num=layers, token_bytes=token_bytes)
        reader.register_mem_pool_host(other)
        assert reader.batch_exists(keys) == 6
        assert reader.batch_get_v1(keys, np.arange(0, 6 * page)) == [True] * 6
        for i in range(6):
            assert np.array_equal(other.page(i * page), np.concatenate(
                [src[0, i * page:(i + 1) * page].ravel(), src[1, i * page:(i + 1) * page].ravel()])), i

        # Pages put and never looked up nor read hold no lease: clear() (remove_all without force) drops them.
        late = ["standalone-late-0", "standalone-late-1"]
        assert s.batch_set_v1(late, np.arange(14 * page, 16 * page)) == [True, True]
        s.clear()
        assert s.store.batch_is_exist([f"Qwen-Qwen3-8B_{k}_0_{kv}" for k in late for kv in "kv"]) == [0] * 4
        s.close()
    finally:
        if reader is not None:
            reader.store.remove_all(force=True)
            reader.store.close()
        if s is not None:
            s.store.remove_all(force=True)
            s.store.close()
        storage.stop()


def test_sglang_standalone_storage_mla_layer_first_multi_buffers(standalone_master):
    """mooncake_store.py with standalone_storage and an MLA model's layer_first host pool (allocated by
    MooncakeHostTensorAllocator): batch_set_v1 calls batch_put_from_multi_buffers (one piece per layer per page,
    a ReplicateConfig carrying group_ids under enable_group_semantics) and batch_get_v1
    batch_get_into_multi_buffers, through the store attached with setup_dummy; byte for byte."""
    page, layers, token_bytes = 8, 4, 576
    storage = StandaloneStorage(standalone_master.addr)
    s = None
    try:
        pool = HostPool(mla=True, num_tokens=64, page_size=page, layer_num=layers, token_bytes=token_bytes, seed=12,
                        allocator=MooncakeHostTensorAllocator())
        cfg = StorageConfig(is_mla_model=True, extra_config={"enable_group_semantics": True})
        s = StandaloneMooncakeStore(cfg, storage.address, pool)
        assert s.required_bytes == layers * 64 * token_bytes
        assert s._use_group_semantics, "ReplicateConfig.group_ids exists"
        s.register_mem_pool_host(pool)
        src = pool.kv_buffer.copy()
        keys = [f"standalone-mla-{i}" for i in range(3)]
        assert s.batch_set_v1(keys, np.arange(0, 3 * page)) == [True] * 3
        assert s.last_put_keys == [f"Qwen-Qwen3-8B_standalone-mla-{i}__k" for i in range(3)]
        assert s.last_put_results == [0] * 3
        assert s.batch_exists(keys + ["standalone-mla-missing"]) == 3
        assert s.batch_get_v1(keys, np.arange(4 * page, 7 * page)) == [True] * 3
        assert s.last_get_results == [page * layers * token_bytes] * 3
        for i in range(3):
            want = np.concatenate([src[layer, i * page:(i + 1) * page].ravel() for layer in range(layers)])
            assert np.array_equal(pool.page((4 + i) * page), want), i
        s.clear()
        s.close()
    finally:
        if s is not None:
            s.store.remove_all(force=True)
            s.store.close()
        storage.stop()


# ---------------------------------------------------------------- direct linker (mooncake_direct_linker.py)


class DevicePoolMLA:
    """A layer_first MLA device pool (layers, tokens, token_bytes) with the entry methods the linker calls:
    get_hybrid_pool_buffer, get_page_buffer_meta (for batch_set_v2), prepare_locations and
    get_prepared_layer_range_meta (for the range loads)."""

    def __init__(self, page_size, layer_num, num_tokens, token_bytes, seed=None):
        self.host = HostPool(mla=True, num_tokens=num_tokens, page_size=page_size, layer_num=layer_num,
                             token_bytes=token_bytes, seed=seed)
        self.page_size, self.layer_num, self.token_bytes = page_size, layer_num, token_bytes

    def get_hybrid_pool_buffer(self):
        return [self.host.kv_buffer]

    def get_page_buffer_meta(self, indices):
        return self.host.get_page_buffer_meta(indices)

    def prepare_locations(self, host_indices):
        return [int(i) for i in host_indices[:: self.page_size]]

    def get_prepared_layer_range_meta(self, locations, layer):
        """Per key: the layer's slot in the device pool, its size, and its offset inside the object."""
        base, h = self.host.kv_buffer.ctypes.data, self.host
        size = self.page_size * self.token_bytes
        ptrs = [[base + layer * h.size * self.token_bytes + loc * self.token_bytes] for loc in locations]
        return ptrs, [[size] for _ in locations], [[layer * size] for _ in locations]


class MooncakeDirectLinker:
    """mooncake_direct_linker.py for an MLA model (rank_replicated: suffix cp0_pp0), KV pool only."""

    def __init__(self, storage: MooncakeStore, pool: DevicePoolMLA, page_wise=False):
        self.storage = storage
        self.pools = {"kv": pool}
        self.num_layers = pool.layer_num
        self.enable_page_wise_load = page_wise
        self.page_wise_load_threshold = 1
        self.storage.mla_suffix = self.storage.mha_suffix = "cp0_pp0"
        self.register_buffers()

    def register_buffers(self):
        seen = set()
        for pool in self.pools.values():
            for buffer in pool.get_hybrid_pool_buffer():
                allocation = (buffer.ctypes.data, buffer.nbytes)
                if allocation in seen:
                    continue
                seen.add(allocation)
                result = self.storage.store.register_buffer(*allocation)
                if result not in (0, None):
                    raise RuntimeError(f"Failed to register GPU KV buffer with Mooncake, error code: {result}.")

    def _component_keys(self, page_keys):
        return self.storage._tag_keys([f"{k}_{self.storage.mla_suffix}_k" for k in page_keys])

    def offload(self, page_keys, host_indices):
        """offload_thread_func -> storage.batch_set_v2 (_batch_set_v2_aggregated): one batch_is_exist, then one
        batch_put_from_multi_buffers of the missing objects with a plain ReplicateConfig."""
        keys = self._component_keys(page_keys)
        ptrs, sizes = self.pools["kv"].get_page_buffer_meta(host_indices)
        ptrs, sizes = self.storage._pack_multi_buffer_meta(keys, ptrs, sizes)
        exist = self.storage._batch_exist(keys)
        io = [0 if e == 1 else -1 for e in exist]
        missing = [i for i, e in enumerate(exist) if e != 1]
        if missing:
            put = self.storage._put_batch_zero_copy_impl(
                [keys[i] for i in missing], [ptrs[i] for i in missing], [sizes[i] for i in missing])
            for i, r in zip(missing, put):
                io[i] = r
        return all(self.storage._batch_postprocess(io, is_set_operate=True, key_multiplier=1))

    def lookup(self, page_keys):
        """lookup -> batch_exists_v2 -> batch_exists: the restorable prefix pages 1..n."""
        n = self.storage.batch_exists(page_keys)
        return list(range(1, n + 1))

    def load_layer_wise(self, page_keys, host_indices):
        keys = self._component_keys(page_keys)
        locations = self.pools["kv"].prepare_locations(host_indices)
        started = []
        try:
            result = list(self.storage.store.batch_get_session_start(keys))
            if result != [0] * len(keys):
                raise RuntimeError(f"Mooncake get session start failed: results={result}")
            started.append(keys)
            if self.enable_page_wise_load and len(keys) >= self.page_wise_load_threshold:
                return self._load_page_wise(keys, locations)
            for layer in range(self.num_layers):
                ptrs, sizes, offsets = self.pools["kv"].get_prepared_layer_range_meta(locations, layer)
                result = self.storage.store.batch_get_into_multi_buffer_ranges(keys, ptrs, sizes, offsets)
                expected = [sum(item) for item in sizes]
                if result is None or isinstance(result, int) or list(result) != expected:
                    raise RuntimeError(f"Mooncake range get failed: layer={layer} result={result}")
            return True
        finally:
            for k in started:
                self.storage.store.batch_get_session_end(k)

    def _load_page_wise(self, keys, locations):
        all_ptrs, all_sizes, all_offsets = [[] for _ in keys], [[] for _ in keys], [[] for _ in keys]
        for layer in range(self.num_layers):
            p, s, o = self.pools["kv"].get_prepared_layer_range_meta(locations, layer)
            for i in range(len(keys)):
                all_ptrs[i] += p[i]
                all_sizes[i] += s[i]
                all_offsets[i] += o[i]
        result = self.storage.store.batch_get_into_multi_buffer_ranges(keys, all_ptrs, all_sizes, all_offsets)
        return list(result) == [sum(item) for item in all_sizes]


@pytest.mark.parametrize("page_wise", [False, True], ids=["layer-wise", "page-wise"])
def test_sglang_direct_linker_mla_offload_lookup_and_range_loads(engine_master, page_wise):
    """mooncake_direct_linker.py: register_buffers (register_buffer of the device pool), offload (batch_set_v2:
    batch_is_exist + batch_put_from_multi_buffers, one piece per layer), lookup (batch_exists_v2's
    batch_is_exist), load_layer_wise (batch_get_session_start, then per layer batch_get_into_multi_buffer_ranges
    with each layer's offset inside the object, then batch_get_session_end) or, page-wise, _load_page_wise (one
    ranged get over all layers). Another linker on the same master loads into other slots, byte for byte."""
    page, layers, token_bytes = 4, 3, 576
    cfg = StorageConfig(is_mla_model=True)
    ws = MooncakeStore(cfg, engine_master.addr, http_port(engine_master))
    rs = MooncakeStore(cfg, engine_master.addr, http_port(engine_master))
    try:
        src_pool = DevicePoolMLA(page, layers, 64, token_bytes, seed=8)
        dst_pool = DevicePoolMLA(page, layers, 64, token_bytes)
        writer = MooncakeDirectLinker(ws, src_pool, page_wise)
        reader = MooncakeDirectLinker(rs, dst_pool, page_wise)
        page_keys = [f"direct-{page_wise}-{i}" for i in range(3)]
        assert reader.lookup(page_keys) == []
        assert writer.offload(page_keys, np.arange(0, 3 * page)) is True
        assert writer.offload(page_keys, np.arange(0, 3 * page)) is True, "already stored: no put"
        assert reader.lookup(page_keys + ["direct-missing"]) == [1, 2, 3]
        dst_idx = np.arange(8 * page, 11 * page)
        assert reader.load_layer_wise(page_keys, dst_idx) is True
        for i in range(3):
            assert np.array_equal(dst_pool.host.page((8 + i) * page), src_pool.host.page(i * page)), i
        assert not dst_pool.host.kv_buffer[:, 0:8 * page].any()
    finally:
        ws.store.remove_all(force=True)
        for s in (rs, ws):
            s.store.close()


def test_sglang_direct_linker_load_of_a_vanished_page_fails_at_session_start(engine_master):
    """mooncake_direct_linker.py load_layer_wise: batch_get_session_start must answer 0 for every key, otherwise
    the batch fails (RuntimeError, the layer counter fails and the request recomputes); the original answers
    -704 (OBJECT_NOT_FOUND) for a key gone since the lookup and 0 for the others."""
    page, layers, token_bytes = 4, 2, 256
    cfg = StorageConfig(is_mla_model=True)
    ws = MooncakeStore(cfg, engine_master.addr, http_port(engine_master))
    rs = MooncakeStore(cfg, engine_master.addr, http_port(engine_master))
    try:
        writer = MooncakeDirectLinker(ws, DevicePoolMLA(page, layers, 32, token_bytes, seed=9))
        reader = MooncakeDirectLinker(rs, DevicePoolMLA(page, layers, 32, token_bytes))
        page_keys = ["vanish-0", "vanish-1"]
        assert writer.offload(page_keys, np.arange(0, 2 * page)) is True
        assert ws.store.remove(writer._component_keys(["vanish-1"])[0]) == 0
        with pytest.raises(RuntimeError, match=r"session start failed: results=\[0, -704\]"):
            reader.load_layer_wise(page_keys, np.arange(4 * page, 6 * page))
    finally:
        ws.store.remove_all(force=True)
        for s in (rs, ws):
            s.store.close()
