"""A store in a cluster with a secret (issue 17): credentials from setup's extras or the environment."""

import os
import subprocess

import pytest

from conftest import Master, MiB, Node, crescent_bin
from mooncake.store import MooncakeDistributedStore

SECRET = "a cluster secret for the python tests"
AUTHENTICATION_FAILED = -1800
PERMISSION_DENIED = -1801


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    path = tmp_path_factory.mktemp("auth") / "secret"
    path.write_text(SECRET)
    path.chmod(0o600)
    m = Master("--secret-file", str(path), "--multi-tenant")
    yield m.addr, str(path)
    m.stop()


CREDENTIAL_VARS = ("CRESCENT_CREDENTIAL", "CRESCENT_CREDENTIAL_FILE", "CRESCENT_SECRET", "CRESCENT_SECRET_FILE",
                   "CRESCENT_HOST_CREDENTIAL", "CRESCENT_HOST_CREDENTIAL_FILE", "MOONCAKE_MASTER", "CRESCENT_MASTER")


def credential(principal: str, secret_file: str) -> str:
    out = subprocess.run(
        [crescent_bin(), "credential", principal, "--secret-file", secret_file],
        check=True, capture_output=True, text=True,
    )
    return out.stdout.strip()


def admin_quota(addr: str, secret_file: str, tenant: str) -> None:
    env = dict(os.environ, CRESCENT_SECRET_FILE=secret_file)
    subprocess.run([crescent_bin(), "tenant", "set-quota", tenant, "64MiB", "--master", addr],
                   check=True, capture_output=True, env=env)


def test_a_store_without_a_credential_is_refused(secured, monkeypatch):
    addr, _ = secured
    for var in ("CRESCENT_CREDENTIAL", "CRESCENT_CREDENTIAL_FILE", "CRESCENT_SECRET", "CRESCENT_SECRET_FILE"):
        monkeypatch.delenv(var, raising=False)
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", addr) == AUTHENTICATION_FAILED


def test_a_credential_from_setup_or_the_environment_reaches_its_tenant_only(secured, monkeypatch):
    addr, secret_file = secured
    for t in ("a", "b"):
        admin_quota(addr, secret_file, t)
    for var in ("CRESCENT_SECRET", "CRESCENT_CREDENTIAL", "CRESCENT_CREDENTIAL_FILE"):
        monkeypatch.delenv(var, raising=False)
    # The secret in the environment lets `a` host its memory (and would make its client tenant:a); the
    # credential given to `setup` is the one its client proves.
    monkeypatch.setenv("CRESCENT_SECRET_FILE", secret_file)
    cred_a, cred_b = credential("tenant:a", secret_file), credential("tenant:b", secret_file)
    a = MooncakeDistributedStore()
    assert a.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", addr, tenant_id="a",
                   credential=cred_a) == 0
    assert a.put("k", b"from a") == 0
    assert a.get("k") == b"from a"
    # tenant:b's credential given to a store of tenant a: it wins over the secret, and is refused tenant a.
    wrong = MooncakeDistributedStore()
    assert wrong.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", addr, tenant_id="a",
                       credential=cred_b) == 0
    assert wrong.get("k") != b"from a"
    assert wrong.put("k2", b"planted") == PERMISSION_DENIED
    wrong.close()

    # A credential from the environment (no secret), used for tenant b: every call is refused.
    monkeypatch.delenv("CRESCENT_SECRET_FILE")
    monkeypatch.setenv("CRESCENT_CREDENTIAL", cred_a)
    b = MooncakeDistributedStore()
    assert b.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", addr, tenant_id="b") == 0
    assert b.put("k", b"planted") == PERMISSION_DENIED
    assert b.is_exist("k") < 0
    b.close()
    assert a.get("k") == b"from a", "a's object is untouched"
    a.close()


def test_a_store_hosting_a_segment_needs_only_its_credential(secured, monkeypatch):
    addr, secret_file = secured
    admin_quota(addr, secret_file, "c")
    for var in ("CRESCENT_CREDENTIAL", "CRESCENT_CREDENTIAL_FILE", "CRESCENT_SECRET", "CRESCENT_SECRET_FILE"):
        monkeypatch.delenv(var, raising=False)
    # Its credential alone: the hosted segment checks the tickets and grants of its peers with keys derived
    # from it (the master derives the same from the secret); no process but the master holds the secret.
    host = MooncakeDistributedStore()
    cred = credential("tenant:c", secret_file)
    assert host.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", addr, tenant_id="c",
                      credential=cred) == 0
    value = os.urandom(256 * 1024)
    assert host.put("big", value) == 0
    assert host.get("big") == value
    # A client of the same tenant, its credential derived from the secret in its environment, reads it from
    # the host's segment: its lanes prove a ticket the master issued it for that host.
    monkeypatch.setenv("CRESCENT_SECRET_FILE", secret_file)
    reader = MooncakeDistributedStore()
    assert reader.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", addr, tenant_id="c") == 0
    assert reader.get("big") == value
    reader.close()
    host.close()


def test_a_store_hosts_its_segment_under_a_host_credential_of_its_own(secured, monkeypatch, tmp_path):
    addr, secret_file = secured
    admin_quota(addr, secret_file, "d")
    for var in ("CRESCENT_CREDENTIAL", "CRESCENT_CREDENTIAL_FILE", "CRESCENT_SECRET", "CRESCENT_SECRET_FILE",
                "CRESCENT_HOST_CREDENTIAL", "CRESCENT_HOST_CREDENTIAL_FILE"):
        monkeypatch.delenv(var, raising=False)
    # The client is tenant d's; the segment is served and mounted as node:py-d (its own connection), so its
    # keys are not tenant d's: the master seals its grants and its peers' tickets for node:py-d.
    host = MooncakeDistributedStore()
    assert host.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", addr, tenant_id="d",
                      credential=credential("tenant:d", secret_file),
                      host_credential=credential("node:py-d", secret_file)) == 0
    value = os.urandom(256 * 1024)
    assert host.put("big", value) == 0
    # Another store of tenant d, its host credential from the environment, reads it through a ticket to node:py-d
    # (a host checking with tenant d's keys would refuse it).
    host_file = tmp_path / "host.cred"
    host_file.write_text(credential("node:py-d2", secret_file))
    host_file.chmod(0o600)
    monkeypatch.setenv("CRESCENT_HOST_CREDENTIAL_FILE", str(host_file))
    reader = MooncakeDistributedStore()
    assert reader.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", addr, tenant_id="d",
                        credential=credential("tenant:d", secret_file)) == 0
    assert reader.get("big") == value
    reader.close()
    host.close()
    # A host credential of another cluster: the segment's connection is refused, and so is the setup.
    other = MooncakeDistributedStore()
    foreign = "node:py-x:" + "00" * 32
    assert other.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", addr, tenant_id="d",
                       credential=credential("tenant:d", secret_file), host_credential=foreign) < 0


def test_sessions_move_bytes_under_the_grants_of_their_batched_replies(secured, monkeypatch):
    """Put and get sessions (their lookups and reservations batched) write to and read from another store's
    segment in a cluster with a secret: each range goes under the grant its batch reply named."""
    import ctypes

    addr, secret_file = secured
    admin_quota(addr, secret_file, "s")
    for var in ("CRESCENT_CREDENTIAL", "CRESCENT_CREDENTIAL_FILE", "CRESCENT_SECRET", "CRESCENT_SECRET_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CRESCENT_SECRET_FILE", secret_file)
    host = MooncakeDistributedStore()
    assert host.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", addr, tenant_id="s") == 0
    client = MooncakeDistributedStore()  # no segment: every byte crosses the data plane to the host's
    assert client.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", addr, tenant_id="s") == 0
    buf = ctypes.create_string_buffer(64 * 1024)
    ptr = ctypes.addressof(buf)
    assert client.register_buffer(ptr, len(buf)) == 0
    keys = ["s1", "s2", "s3"]
    assert client.batch_put_session_start(keys, [4096] * 3) == [0, 0, 0]
    for i in range(3):
        ctypes.memmove(ptr + i * 4096, bytes([i + 1]) * 4096, 4096)
    ptrs = [[ptr + i * 4096, ptr + i * 4096 + 1024] for i in range(3)]
    assert client.batch_put_from_multi_buffer_ranges(keys, ptrs, [[1024, 3072]] * 3, [[0, 1024]] * 3) == [4096] * 3
    assert client.batch_put_session_end(keys) == [0, 0, 0]
    assert [host.get(k) for k in keys] == [bytes([i + 1]) * 4096 for i in range(3)]
    assert client.batch_get_session_start(keys) == [0, 0, 0]
    dst = [[ptr + 32768 + i * 100] for i in range(3)]
    assert client.batch_get_into_multi_buffer_ranges(keys, dst, [[100]] * 3, [[3996]] * 3) == [100] * 3
    assert [buf.raw[32768 + i * 100:32768 + (i + 1) * 100] for i in range(3)] == [bytes([i + 1]) * 100 for i in range(3)]
    assert client.batch_get_session_end(keys) == 0
    client.close()
    host.close()


# ---- setup_dummy: a store attached to a `crescent node --memfd` of a cluster with a secret ----


@pytest.fixture(scope="module")
def secured_node(secured, tmp_path_factory):
    """A memfd-backed node of the secured cluster, under a credential of its own (it holds no secret)."""
    addr, secret_file = secured
    path = tmp_path_factory.mktemp("node") / "node.cred"
    path.write_text(credential("node:dummy", secret_file))
    path.chmod(0o600)
    n = Node(addr, "127.0.0.1:0", "64MiB", True, "--credential-file", str(path))
    yield n
    n.stop()


def test_setup_dummy_attaches_with_the_credential_and_master_from_the_environment(secured, secured_node, monkeypatch):
    """The node's lanes admit a ticket only: the store asks the master named by MOONCAKE_MASTER for one, proving
    the credential in the environment; its puts land in the node's memory and a store set up as usual reads them."""
    addr, secret_file = secured
    admin_quota(addr, secret_file, "e")
    for var in CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)
    cred = credential("tenant:e", secret_file)
    monkeypatch.setenv("MOONCAKE_MASTER", addr)
    monkeypatch.setenv("CRESCENT_CREDENTIAL", cred)
    s = MooncakeDistributedStore()
    assert s.setup_dummy(32 * MiB, 16 * MiB, secured_node.endpoint) == 0
    try:
        value = os.urandom(MiB)
        assert s.put("dummy", value) == 0
        assert s.get("dummy") == value
        (replica,) = s.get_replica_desc("dummy")
        assert replica.get_memory_descriptor().buffer_descriptor.transport_endpoint == secured_node.endpoint
        other = MooncakeDistributedStore()
        assert other.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", addr, tenant_id="e",
                           credential=cred) == 0
        try:
            assert other.get("dummy") == value, "another client reads it from the node, under a ticket"
            assert other.put("from-other", b"o" * (2 * MiB)) == 0
            assert s.get("from-other") == b"o" * (2 * MiB)
        finally:
            other.close()
        assert s.remove("dummy", force=True) == 0
        assert s.remove("from-other", force=True) == 0
    finally:
        assert s.close() == 0


def test_setup_dummy_takes_the_master_from_crescent_master_and_the_credential_from_a_file(
        secured, secured_node, monkeypatch, tmp_path):
    addr, secret_file = secured
    admin_quota(addr, secret_file, "f")
    for var in CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "store.cred"
    path.write_text(credential("tenant:f", secret_file))
    path.chmod(0o600)
    monkeypatch.setenv("CRESCENT_MASTER", addr)
    monkeypatch.setenv("CRESCENT_CREDENTIAL_FILE", str(path))
    s = MooncakeDistributedStore()
    assert s.setup_dummy(32 * MiB, 16 * MiB, secured_node.endpoint) == 0
    assert s.put("f", b"file" * 1000) == 0
    assert s.get("f") == b"file" * 1000
    assert s.remove("f", force=True) == 0
    assert s.close() == 0


def test_setup_dummy_without_a_credential_or_master_or_with_a_wrong_one_is_refused(secured, secured_node, monkeypatch):
    addr, secret_file = secured
    admin_quota(addr, secret_file, "g")
    for var in CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)
    s = MooncakeDistributedStore()
    monkeypatch.setenv("MOONCAKE_MASTER", addr)
    assert s.setup_dummy(32 * MiB, 16 * MiB, secured_node.endpoint) == AUTHENTICATION_FAILED, "no credential"
    # A credential of another cluster (its key not derived from this one's secret): the master refuses the ticket.
    monkeypatch.setenv("CRESCENT_CREDENTIAL", "tenant:g:" + "00" * 32)
    assert s.setup_dummy(32 * MiB, 16 * MiB, secured_node.endpoint) == AUTHENTICATION_FAILED, "a wrong credential"
    # The right credential, but no master to ask a ticket from.
    monkeypatch.setenv("CRESCENT_CREDENTIAL", credential("tenant:g", secret_file))
    monkeypatch.delenv("MOONCAKE_MASTER")
    assert s.setup_dummy(32 * MiB, 16 * MiB, secured_node.endpoint) == AUTHENTICATION_FAILED, "no master"
    assert s.put("g", b"x") < 0, "not set up"
    # The process and the store survive the refusals: set up right, it works.
    monkeypatch.setenv("MOONCAKE_MASTER", addr)
    assert s.setup_dummy(32 * MiB, 16 * MiB, secured_node.endpoint) == 0
    assert s.put("g", b"x" * 4096) == 0
    assert s.get("g") == b"x" * 4096
    assert s.remove("g", force=True) == 0
    assert s.close() == 0


def test_an_attached_store_mounts_segments_at_run_time_under_its_credential(secured, secured_node, monkeypatch):
    """A segment `allocate_and_mount_segment` adds is served by a node of the store's own, which proves the store's
    credential to the master (as a client-only store's does)."""
    addr, secret_file = secured
    admin_quota(addr, secret_file, "h")
    for var in CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)
    cred = credential("tenant:h", secret_file)
    monkeypatch.setenv("MOONCAKE_MASTER", addr)
    monkeypatch.setenv("CRESCENT_CREDENTIAL", cred)
    s = MooncakeDistributedStore()
    assert s.setup_dummy(32 * MiB, 16 * MiB, secured_node.endpoint) == 0
    r = s.allocate_and_mount_segment(16 * MiB)
    assert r["ret"] == 0, r
    (sid,) = r["segment_ids"]
    assert s.unmount_and_free_segment([sid]) == 0
    assert s.close() == 0


def test_setup_dummy_with_the_cluster_secret_in_the_environment_acts_in_the_default_tenant(
        secured, secured_node, monkeypatch):
    addr, secret_file = secured
    admin_quota(addr, secret_file, "default")  # a multi-tenant master serves registered tenants only
    for var in CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MOONCAKE_MASTER", addr)
    monkeypatch.setenv("CRESCENT_SECRET_FILE", secret_file)
    s = MooncakeDistributedStore()
    assert s.setup_dummy(32 * MiB, 16 * MiB, secured_node.endpoint) == 0
    assert s.put("default-tenant", b"d" * 4096) == 0
    assert s.get("default-tenant") == b"d" * 4096
    assert s.remove("default-tenant", force=True) == 0
    assert s.close() == 0


def test_copy_and_move_tasks_run_under_the_hosts_credentials(secured, monkeypatch):
    """A copy task is made by the node holding the source: its lanes to the target's node prove a ticket the master
    issued it, and its writes the grants sealed into the task. Both stores host memory with their own
    credential only (no secret in their environment)."""
    import time

    from conftest import free_port
    from mooncake.store import ReplicateConfig, TaskStatus

    addr, secret_file = secured
    admin_quota(addr, secret_file, "t")
    for var in CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)
    cred = credential("tenant:t", secret_file)
    stores, names = [], []
    for _ in range(2):
        s = MooncakeDistributedStore()
        name = f"127.0.0.1:{free_port()}"
        assert s.setup(name, "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", addr, tenant_id="t", credential=cred) == 0
        stores.append(s)
        names.append(name)
    a, b = stores
    cfg = ReplicateConfig()
    cfg.preferred_segment = names[0]
    value = os.urandom(512 * 1024)
    assert a.put("copied", value, cfg) == 0

    def finished(task_id):
        deadline = time.monotonic() + 30
        while True:
            r, rc = a.query_task(task_id)
            assert rc == 0
            if r.status in (TaskStatus.SUCCESS, TaskStatus.FAILED):
                return r
            assert time.monotonic() < deadline
            time.sleep(0.02)  # polling the task's status: nothing else tells it

    tid, rc = a.create_copy_task("copied", [names[1]])
    assert rc == 0
    r = finished(tid)
    assert r.status == TaskStatus.SUCCESS, r.message
    assert len(a.get_replica_desc("copied")) == 2
    tid, rc = a.create_move_task("copied", names[0], names[1])
    assert rc == 0
    assert finished(tid).status == TaskStatus.SUCCESS
    a.close()
    assert b.get("copied") == value, "the copy on b is whole once a's store is gone"
    b.close()
