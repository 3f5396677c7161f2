"""`setup` with an `etcd://` master address (issue 15 §4): the store finds the cluster's leader through its master
view in a real etcd, in Crescent's form `etcd://HOST:PORT/CLUSTER` and in the original's `etcd://h1:p;h2:p` (the
cluster from CRESCENT_CLUSTER_ID). The leader side is simulated: the test writes the view key as a leader would.
A missing etcd binary fails the test (CRESCENT_ETCD_BIN overrides /usr/bin/etcd)."""

import base64
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

from conftest import Master, MiB, new_store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """A single-member etcd on free loopback ports with a temporary data directory, killed at the end."""

    def __init__(self):
        binary = os.environ.get("CRESCENT_ETCD_BIN", "/usr/bin/etcd")
        if not os.path.isfile(binary):
            raise RuntimeError(f"etcd binary {binary} not found: install Debian's etcd-server or set CRESCENT_ETCD_BIN")
        self.dir = tempfile.TemporaryDirectory(prefix="crescent-etcd-")
        self.port, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{peer}"
        self.proc = subprocess.Popen(
            [binary, "--name=test", f"--data-dir={self.dir.name}/data", f"--listen-client-urls={client_url}",
             f"--advertise-client-urls={client_url}", f"--listen-peer-urls={peer_url}",
             f"--initial-advertise-peer-urls={peer_url}", f"--initial-cluster=test={peer_url}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("etcd did not become healthy")
            time.sleep(0.02)  # polling a readiness probe

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                return json.load(r).get("health") == "true"
        except OSError:
            return False

    def put(self, key: bytes, value: bytes) -> None:
        """A put through etcd's JSON gateway (etcd 3.4 serves it at /v3/kv/put)."""
        body = json.dumps({"key": base64.b64encode(key).decode(), "value": base64.b64encode(value).decode()})
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v3/kv/put", data=body.encode(), method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.dir.cleanup()


@pytest.fixture
def etcd():
    e = Etcd()
    yield e
    e.stop()


def lead(etcd: Etcd, cluster: str, leader: str) -> None:
    """Names `leader` in the cluster's master view (the value a leader stores)."""
    etcd.put(f"/crescent/{cluster}/master_view".encode(), json.dumps({"leader": leader}).encode())


def test_setup_with_an_etcd_address_finds_the_leader(etcd, key, monkeypatch):
    m = Master()
    try:
        lead(etcd, "py-cluster", m.addr)
        # A store hosting a segment: its segment mounts at the leader, its puts go there.
        hosting = new_store(f"etcd://127.0.0.1:{etcd.port}/py-cluster", segment=16 * MiB, local=16 * MiB)
        assert hosting.put(key, b"via the leader") == 0
        assert hosting.get(key) == b"via the leader"
        # The original's form names no cluster: it comes from the environment.
        monkeypatch.setenv("CRESCENT_CLUSTER_ID", "py-cluster")
        reader = new_store(f"etcd://127.0.0.1:{etcd.port};127.0.0.1:{etcd.port}", segment=0, local=16 * MiB)
        assert reader.get(key) == b"via the leader"
        reader.close()
        hosting.close()
    finally:
        m.stop()


def test_a_bad_etcd_address_is_invalid_params():
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", "etcd://nohost/c") == -600
