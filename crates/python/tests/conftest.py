"""Fixtures: a real `crescent master` process (its JSON readiness line gives its address) and stores on it."""

import json
import os
import pathlib
import queue
import subprocess
import threading
import uuid

import pytest

from mooncake.store import MooncakeDistributedStore

REPO = pathlib.Path(__file__).resolve().parents[3]
MiB = 1 << 20


def crescent_bin() -> str:
    """The `crescent` binary: $CRESCENT_BIN, else the debug build under $CARGO_TARGET_DIR or target/."""
    explicit = os.environ.get("CRESCENT_BIN")
    if explicit:
        return explicit
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    path = target / "debug" / "crescent"
    if not path.is_file():
        raise RuntimeError(f"no crescent binary at {path}: build it (cargo build -p crescent-cli) or set CRESCENT_BIN")
    return str(path)


class Master:
    """A `crescent master` process on a free port, killed at the end."""

    def __init__(self, *extra: str):
        args = [crescent_bin(), "master", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", *extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        lines: "queue.Queue[str]" = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=lambda: lines.put(self.proc.stdout.readline()), daemon=True).start()
        try:
            ready = json.loads(lines.get(timeout=60))
        except (queue.Empty, json.JSONDecodeError) as e:
            self.proc.kill()
            raise RuntimeError(f"{args}: no readiness line: {e!r}")
        self.addr = ready["master"]
        self.admin = ready.get("admin", "")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def master():
    m = Master("--lease-ttl-ms", "500")
    yield m.addr
    m.stop()


def new_store(master_addr: str, segment: int = 64 * MiB, local: int = 64 * MiB) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", segment, local, "tcp", "", master_addr)
    assert rc == 0, f"setup returned {rc}"
    return s


@pytest.fixture
def store(master):
    """A store hosting a 64 MiB segment; emptied and closed afterwards."""
    s = new_store(master)
    yield s
    s.remove_all(force=True)
    s.close()


@pytest.fixture
def key():
    """A fresh key prefix per test."""
    return f"k-{uuid.uuid4().hex[:12]}"
