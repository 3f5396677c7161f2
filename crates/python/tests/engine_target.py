"""The master the engine-replay tests (test_engine_*.py) drive: Crescent's, or the original's.

`ENGINE_REPLAY_TARGET=original` starts the original's `mooncake_master` ($MOONCAKE_MASTER_BIN, default
/work/mc-venv/bin/mooncake_master); run pytest with the original's Python then (/work/mc-venv/bin/python), so that
`mooncake.store` is the original's too. Anything else (the default) starts `crescent master`. Both masters get the
same object lease (the original's default, 5 s), so the engines' calls meet the same rules on either side.

`ENGINE_REPLAY_TRACE=FILE` appends every store call, its arguments and its answer to FILE (normalised JSON lines);
`python engine_target.py ORIGINAL_TRACE CRESCENT_TRACE` (with pytest importable) prints where the two differ.
`crescent_gap` marks a replay Crescent does not pass yet (strict xfail on Crescent only), `original_gap` one the
original itself fails.
"""

import os

import pytest

from conftest import Master, OriginalMaster

TARGET = os.environ.get("ENGINE_REPLAY_TARGET", "crescent")
ORIGINAL = TARGET == "original"
MiB = 1 << 20
# The original master's default `default_kv_lease_ttl`; given to both masters explicitly.
LEASE_TTL_MS = 5000


def _original_master() -> OriginalMaster:
    return OriginalMaster(LEASE_TTL_MS, os.environ.get("MOONCAKE_MASTER_BIN", "/work/mc-venv/bin/mooncake_master"))


class CrescentMaster:
    """`crescent master` (conftest's `Master`) with the same lease; `http` is its admin (metrics) address."""

    def __init__(self) -> None:
        self._m = Master("--lease-ttl-ms", str(LEASE_TTL_MS))
        self.addr = self._m.addr
        self.http = self._m.admin

    def stop(self) -> None:
        self._m.stop()


def start_master():
    return _original_master() if ORIGINAL else CrescentMaster()


@pytest.fixture(scope="module")
def engine_master():
    """A master of the module's own (the target's), stopped at the end."""
    m = start_master()
    yield m
    m.stop()


def pattern(n: int, seed: int):
    """`n` deterministic bytes, different per seed (numpy uint8)."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


# ---- optional call trace: ENGINE_REPLAY_TRACE=FILE records every store call and its result, one JSON line each,
# normalised (addresses, ports, random suffixes) so that the traces of the two targets can be diffed line by line.

_TRACE = os.environ.get("ENGINE_REPLAY_TRACE")


def _norm(v, depth=0):
    import re

    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return "ptr" if v > 1 << 32 else v
    if isinstance(v, str):
        v = re.sub(r"[0-9a-f]{32}", "<uuid>", v)
        return re.sub(r"(127\.0\.0\.1|localhost):\d+", r"\1:<port>", v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        import hashlib

        b = bytes(v)
        return f"bytes[{len(b)}]:{hashlib.sha1(b).hexdigest()[:8]}"
    if isinstance(v, dict):
        return {str(_norm(k)): _norm(x, depth + 1) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if isinstance(v, (list, tuple)):
        return [_norm(x, depth + 1) for x in v]
    if type(v).__name__ == "ReplicaDescriptor":
        return "replica(memory)" if v.is_memory_replica() else "replica(other)"
    if type(v).__name__ == "ReplicateConfig":
        return "ReplicateConfig"
    if hasattr(v, "__buffer__") or type(v).__name__ in ("BufferHandle",):
        try:
            return _norm(memoryview(v))
        except TypeError:
            pass
    return type(v).__name__


class _Traced:
    """Forwards to a real MooncakeDistributedStore, logging each call."""

    def __init__(self, real_cls, log):
        object.__setattr__(self, "_real", real_cls())
        object.__setattr__(self, "_log", log)

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            import json

            # A port picked per run (SGLang's client_http_port) would make every trace line differ.
            shown = {k: ("<port>" if k.endswith("_port") else v) for k, v in kwargs.items()}
            entry = {"call": name, "args": _norm(list(args)), "kwargs": _norm(shown)}
            try:
                result = attr(*args, **kwargs)
            except Exception as e:
                first = str(e).splitlines()[0] if str(e) else ""
                entry["raised"] = f"{type(e).__name__}: {_norm(first)[:100]}"
                self._log.write(json.dumps(entry) + "\n")
                raise
            entry["result"] = _norm(result)
            self._log.write(json.dumps(entry) + "\n")
            return result

        return call


@pytest.fixture(autouse=True)
def engine_trace(request):
    """With ENGINE_REPLAY_TRACE set, every MooncakeDistributedStore the test makes is traced into that file."""
    if not _TRACE:
        yield
        return
    import mooncake.store

    real = mooncake.store.MooncakeDistributedStore
    with open(_TRACE, "a") as log:
        log.write(f'{{"test": "{request.node.nodeid}"}}\n')
        mooncake.store.MooncakeDistributedStore = lambda: _Traced(real, log)
        try:
            yield
        finally:
            mooncake.store.MooncakeDistributedStore = real


def crescent_gap(reason: str):
    """A replay Crescent does not pass yet (a call it lacks, or an answer unlike the original's): expected to fail
    on Crescent only, strictly, so the mark has to go once Crescent passes it. The calls stay in the test."""
    return pytest.mark.xfail(not ORIGINAL, reason=f"Crescent: {reason}", strict=True)


def original_gap(reason: str):
    """A replay the original itself fails (its bug, not a difference to keep): expected to fail on it only."""
    return pytest.mark.xfail(ORIGINAL, reason=f"original: {reason}", strict=True)


def _diff_traces(original_path: str, crescent_path: str) -> None:
    """Prints, per test, the calls whose arguments or answers differ between two traces."""
    import json

    def load(path):
        tests, cur = {}, None
        with open(path) as f:
            for line in f:
                d = json.loads(line)
                if "test" in d:
                    cur = d["test"]
                    tests.setdefault(cur, [])
                else:
                    tests[cur].append(d)
        return tests

    a, b = load(original_path), load(crescent_path)
    for test in a:
        x, y = a[test], b.get(test, [])
        pairs = [(i, x[i] if i < len(x) else None, y[i] if i < len(y) else None) for i in range(max(len(x), len(y)))]
        diffs = [(i, dx, dy) for i, dx, dy in pairs if dx != dy]
        if diffs:
            print(f"== {test} ({len(x)} vs {len(y)} calls)")
            for i, dx, dy in diffs:
                print(f"  #{i} original: {json.dumps(dx)[:400]}")
                print(f"     crescent: {json.dumps(dy)[:400]}")


if __name__ == "__main__":
    # python engine_target.py ORIGINAL_TRACE CRESCENT_TRACE
    import sys

    _diff_traces(sys.argv[1], sys.argv[2])
