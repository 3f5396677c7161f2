"""Fixtures: a real `crescent master` process (its JSON readiness line gives its address) and stores on it."""

import json
import os
import pathlib
import queue
import socket
import subprocess
import sys
import threading
import time
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


class Node:
    """A `crescent node` process on `master` (its JSON readiness line says it mounted), killed at the end;
    memfd-backed unless `memfd` is false, so a store on this host can map its memory (`setup_dummy`). `endpoint` is what it advertises;
    `extra` more flags (`--credential-file FILE` in a cluster with a secret)."""

    def __init__(self, master: str, listen: str = "127.0.0.1:0", segment: str = "64MiB", memfd: bool = True,
                 *extra: str):
        args = [crescent_bin(), "node", "--master", master, "--listen", listen, "--segment-size", segment]
        args += ["--memfd"] if memfd else []
        args += extra
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        lines: "queue.Queue[str]" = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=lambda: lines.put(self.proc.stdout.readline()), daemon=True).start()
        try:
            ready = json.loads(lines.get(timeout=60))
        except (queue.Empty, json.JSONDecodeError) as e:
            self.proc.kill()
            raise RuntimeError(f"{args}: no readiness line: {e!r}")
        self.endpoint = ready["node"]

    def stop(self) -> None:
        """Stops the node as an operator does (SIGTERM: it unmounts its segments first)."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def kill(self) -> None:
        """Kills the node (SIGKILL: its segments stay mounted until the master stops hearing it)."""
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def master():
    m = Master("--lease-ttl-ms", "500")
    yield m.addr
    m.stop()


def master_count(admin: str, metric: str, op: str) -> int:
    """A per-operation counter (`crescent_master_{metric}{op="..."}`) from the /metrics of the master whose admin
    HTTP is at `admin` (0 before the operation's first request)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://{admin}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(f'crescent_master_{metric}{{op="{op}"}} '):
            return int(float(line.split()[-1]))
    return 0


def new_store(master_addr: str, segment: int = 64 * MiB, local: int = 64 * MiB) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", segment, local, "tcp", "", master_addr)
    assert rc == 0, f"setup returned {rc}"
    return s


def emptied_store(master_addr: str):
    """A store hosting a 64 MiB segment, emptied and closed when the generator ends (a fixture's body)."""
    s = new_store(master_addr)
    yield s
    s.remove_all(force=True)
    s.close()


@pytest.fixture
def store(master):
    """A store hosting a 64 MiB segment; emptied and closed afterwards."""
    yield from emptied_store(master)


@pytest.fixture
def key():
    """A fresh key prefix per test."""
    return f"k-{uuid.uuid4().hex[:12]}"


# ---- the original wheel as a second implementation (test_engine_calls.py) ----
#
# A test parametrised with `impl` runs once on Crescent and once on the original wheel (its `[original]` item). The
# original is another interpreter (its `mooncake.store` and Crescent's cannot share a process), so the `[original]`
# items run there: the first one met runs every `[original]` item of the session in that interpreter (pytest, with
# CRESCENT_ENGINE_IMPL=original) and each item here takes its outcome from that run. Without the original's
# interpreter (MOONCAKE_ORIGINAL_PYTHON, default /work/mc-venv/bin/python) those items are skipped.

ENGINE_IMPL = os.environ.get("CRESCENT_ENGINE_IMPL", "crescent")
ORIGINAL_PYTHON = os.environ.get("MOONCAKE_ORIGINAL_PYTHON", "/work/mc-venv/bin/python")
FAKE_TORCH = pathlib.Path(__file__).resolve().parent / "fake_torch"
if ENGINE_IMPL == "original":
    # The original's tensor calls need `torch`; the stand-in in fake_torch/ is enough for them.
    sys.path.insert(0, str(FAKE_TORCH))

_original_outcomes: "dict[str, tuple[str, str]]" = {}


def _run_original_items(session) -> None:
    """Runs every `[original]` item of the session in the original's interpreter; records each one's outcome."""
    import tempfile
    import xml.etree.ElementTree as ET

    items = [i for i in session.items if getattr(i, "callspec", None) and i.callspec.params.get("impl") == "original"]
    with tempfile.TemporaryDirectory() as tmp:
        report = pathlib.Path(tmp) / "report.xml"
        args = [ORIGINAL_PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
        env = dict(os.environ, CRESCENT_ENGINE_IMPL="original")
        run = subprocess.run(args + [i.nodeid for i in items], cwd=session.config.rootpath, env=env,
                             capture_output=True, text=True, timeout=900)
        if not report.is_file():
            for i in items:
                _original_outcomes[i.nodeid] = ("failed", f"the original's run failed:\n{run.stdout}\n{run.stderr}")
            return
        for case in ET.parse(report).getroot().iter("testcase"):
            name = case.get("name", "")
            outcome, text = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = "skipped" if tag == "skipped" else "failed"
                    text = (el.get("message") or "") + "\n" + (el.text or "")
                    break
            for i in items:
                if i.name == name:
                    _original_outcomes[i.nodeid] = (outcome, text)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """An `[original]` item outside the original's interpreter: its outcome is that of its run there."""
    callspec = getattr(pyfuncitem, "callspec", None)
    if ENGINE_IMPL == "original" or callspec is None or callspec.params.get("impl") != "original":
        return None
    if not pathlib.Path(ORIGINAL_PYTHON).is_file():
        pytest.skip(f"no original wheel interpreter at {ORIGINAL_PYTHON}")
    if not _original_outcomes:
        _run_original_items(pyfuncitem.session)
    outcome, text = _original_outcomes.get(pyfuncitem.nodeid, ("failed", "no outcome from the original's run"))
    if outcome == "skipped":
        pytest.skip(f"on the original: {text.strip()}")
    if outcome != "passed":
        pytest.fail(f"on the original wheel:\n{text}", pytrace=False)
    return True


def free_port() -> int:
    """A loopback port free now (a server started next binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OriginalMaster:
    """The original's `mooncake_master` on free loopback ports (`addr` its RPC, `http` its metrics/admin HTTP),
    ready once its RPC port accepts, killed at the end. `binary`: default, the one beside the running interpreter
    (the original's wheel installs it there)."""

    def __init__(self, lease_ms: int, binary: "str | None" = None, *extra: str):
        rpc, http = free_port(), free_port()
        binary = binary or str(pathlib.Path(sys.executable).parent / "mooncake_master")
        args = [
            binary,
            f"--rpc_port={rpc}",
            "--rpc_address=127.0.0.1",
            f"--metrics_port={http}",
            f"--default_kv_lease_ttl={lease_ms}",
            *extra,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addr = f"127.0.0.1:{rpc}"
        self.http = f"127.0.0.1:{http}"
        await_port(rpc, self.proc, f"{args}: the master")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def await_port(port: int, proc: subprocess.Popen, what: str) -> None:
    """Waits until `port` on loopback accepts connections (`proc` gives no other sign it is ready)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{what} did not start")
            time.sleep(0.05)  # polling for the port to open: the child gives no other signal


class OriginalRealClient:
    """The original's `mooncake_client` (the process its `setup_dummy` attaches to) on `master`, serving
    `segment` bytes, listening on loopback `port`; killed at the end."""

    def __init__(self, master: str, port: int, segment: int, binary: "str | None" = None):
        binary = binary or str(pathlib.Path(sys.executable).parent / "mooncake_client")
        args = [
            binary,
            f"--master_server_address={master}",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--global_segment_size={segment}",
            "--protocol=tcp",
            "--metadata_server=P2PHANDSHAKE",
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await_port(port, self.proc, "mooncake_client")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
