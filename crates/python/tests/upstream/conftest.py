"""Runs the original's own store tests (vendored unmodified beside this file, see README.md) against Crescent.

Each test module gets a real `crescent master` of its own on free loopback ports (the vendored files keep state in
module-level stores, so scripts/test.sh runs each file in its own pytest process), and the environment the files
read is set to point at it. Tests that need something Crescent does not have yet are deselected in ONE table,
`NOT_YET`, each with the reason, and tests the original itself fails (Crescent doing as it does) in
`ORIGINAL_FAILS`, each with why; nothing else is skipped or edited.

With `MOONCAKE_MASTER_BIN` set (e.g. /work/mc-venv/bin/mooncake_master, run under the original's wheel) the same
files run against the original's master instead, with nothing deselected: that is how a disputed behaviour is
checked against the original.
"""

import gc
import importlib.util
import os
import pathlib
import shutil
import tempfile

import pytest

HERE = pathlib.Path(__file__).resolve().parent

# The package tests' helpers (`Master`, `crescent_bin`), loaded by path: both files are named conftest.py, so a
# plain `import conftest` would give whichever pytest imported last.
_spec = importlib.util.spec_from_file_location("crescent_python_tests_conftest", HERE.parent / "conftest.py")
assert _spec is not None and _spec.loader is not None
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
Master = _helpers.Master
OriginalMaster = _helpers.OriginalMaster
Node = _helpers.Node
OriginalRealClient = _helpers.OriginalRealClient

# The read lease the masters get, in ms. The vendored files sleep this long before removing what they just read
# (their DEFAULT_KV_LEASE_TTL, read at import, so set here, before pytest imports them); the original's own CI
# uses the same 500.
LEASE_TTL_MS = 500
# The promotion test's two waits (default 25 s each, sized for the original's 10 s heartbeats): Crescent promotes
# on the read itself and evicts to disk within a watermark round, so 5 s is ample.
PROMOTION_WAIT_SECONDS = 5

os.environ["DEFAULT_KV_LEASE_TTL"] = str(LEASE_TTL_MS)
os.environ["PROMOTION_WAIT_SECONDS"] = str(PROMOTION_WAIT_SECONDS)
os.environ["PROTOCOL"] = "tcp"
os.environ["DEVICE_NAME"] = ""
os.environ["LOCAL_HOSTNAME"] = "localhost"
# Crescent has no metadata server (the argument is accepted and unused); the original's P2P handshake needs none.
os.environ["MC_METADATA_SERVER"] = "P2PHANDSHAKE"

# test file name -> extra `crescent master` flags. None needed today: the eviction and disk-tier tests run on the
# master's defaults (eviction above a 0.9 used ratio; a store's disk tier comes from its own setup's
# enable_ssd_offload and MOONCAKE_OFFLOAD_FILE_STORAGE_PATH, set below).
CRESCENT_MASTER_FLAGS: "dict[str, list[str]]" = {}

# test file name -> the (port, segment bytes) of the "real client" its `setup_dummy` attaches to, started beside
# the master as the original's run_tests.sh starts `mooncake_client` (its default port, which the file hardcodes):
# the original's `mooncake_client`, or on Crescent a `crescent node` sharing its memory (`--memfd`).
REAL_CLIENTS = {"test_dummy_client.py": (50052, 512 << 20)}

# test file name -> extra flags for the original's master, as the original's scripts/run_tests.sh starts it.
ORIGINAL_MASTER_FLAGS = {
    "test_offload_on_eviction.py": ["--enable_offload=true", "--offload_on_evict=true"],
    "test_promotion_on_hit.py": [
        "--enable_offload=true",
        "--offload_on_evict=true",
        "--promotion_on_hit=true",
        "--promotion_admission_threshold=1",
    ],
}

# What Crescent cannot run yet: "file::Class::test" (or "file::Class": all its tests) -> the missing call or
# behaviour. Keep it small and true: an entry that matches no collected test fails the run.
NOT_YET = {
}

# What the original fails too (run the file with MOONCAKE_MASTER_BIN to see it): "file::Class::test" -> why. Crescent
# does as the original does, so these are deselected against Crescent as well. Same rule as NOT_YET: an entry that
# matches no collected test fails the run.
ORIGINAL_FAILS = {
    "test_batch_replica_clear.py::TestBatchReplicaClearSingleStore::test_clear_with_active_lease": "expects a put "
    "to lease its object; the original's PutEnd grants none (GrantReadLease(0)), so its BatchReplicaClear clears "
    "the keys at once",
    "test_batch_replica_clear.py::TestBatchReplicaClearSingleStore::test_clear_mixed_expired_and_active": "as "
    "test_clear_with_active_lease: the keys just put hold no lease, and are cleared",
}

DESELECTED = {**NOT_YET, **ORIGINAL_FAILS}


def _against_original() -> bool:
    return bool(os.environ.get("MOONCAKE_MASTER_BIN"))


def _test_id(item: pytest.Item) -> str:
    return "::".join([item.path.name, *item.nodeid.split("::")[1:]])


def _not_yet(test_id: str) -> bool:
    return any(test_id == k or test_id.startswith(k + "::") for k in DESELECTED)


def pytest_collection_modifyitems(config: pytest.Config, items: "list[pytest.Item]") -> None:
    if _against_original():
        return
    files = {item.path.name for item in items}
    ids = [_test_id(item) for item in items]
    stale = [
        k for k in DESELECTED if k.split("::")[0] in files and not any(i == k or i.startswith(k + "::") for i in ids)
    ]
    if stale:
        raise pytest.UsageError(f"NOT_YET or ORIGINAL_FAILS names tests that do not exist: {stale}")
    keep, drop = [], []
    for item, test_id in zip(items, ids):
        (drop if _not_yet(test_id) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str:
    target = os.environ.get("MOONCAKE_MASTER_BIN") or _helpers.crescent_bin()
    return (
        f"upstream tests against {target}; NOT_YET has {len(NOT_YET)} entries, ORIGINAL_FAILS {len(ORIGINAL_FAILS)}"
    )




def _close_open_stores() -> None:
    """Closes the stores the module left open (the vendored classes never close theirs; their process's exit
    would), while their master still answers: each unmounts cleanly instead of warning at exit that it could not."""
    from mooncake.store import MooncakeDistributedStore

    for obj in gc.get_objects():
        if isinstance(obj, MooncakeDistributedStore):
            obj.close()


@pytest.fixture(scope="module", autouse=True)
def upstream_master(request: pytest.FixtureRequest):
    """A master of the module's own, and the environment its vendored file reads to find it."""
    name = request.path.name
    offload_dir = tempfile.mkdtemp(prefix="crescent-upstream-offload-")
    original = os.environ.get("MOONCAKE_MASTER_BIN")
    if original:
        # The original's offload buckets flush at 500 keys / 256 MB: too much for these workloads to reach disk
        # (its run_tests.sh lowers them the same way).
        os.environ["MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT"] = "10"
        os.environ["MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES"] = str(10 << 20)
        master = OriginalMaster(LEASE_TTL_MS, original, f"--root_fs_dir={offload_dir}", *ORIGINAL_MASTER_FLAGS.get(name, []))
    else:
        master = Master("--lease-ttl-ms", str(LEASE_TTL_MS), *CRESCENT_MASTER_FLAGS.get(name, []))
    real_client = None
    if name in REAL_CLIENTS:
        port, segment = REAL_CLIENTS[name]
        if original:
            binary = str(pathlib.Path(original).parent / "mooncake_client")
            real_client = OriginalRealClient(master.addr, port, segment, binary)
        else:
            real_client = Node(master.addr, f"127.0.0.1:{port}", str(segment))
    saved = {k: os.environ.get(k) for k in ("MASTER_SERVER", "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH")}
    os.environ["MASTER_SERVER"] = master.addr
    # Where a store set up with enable_ssd_offload (and no ssd_offload_path) keeps its disk tier, as in the
    # original.
    os.environ["MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"] = offload_dir
    try:
        yield master.addr
    finally:
        _close_open_stores()
        if real_client is not None:
            real_client.stop()
        master.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(offload_dir, ignore_errors=True)
