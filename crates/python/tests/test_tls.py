"""A store in a cluster serving TLS with client certificates (issue 17): the TLS files come from CRESCENT_TLS_*."""

import os
import subprocess

import pytest

from conftest import Master, MiB, crescent_bin
from mooncake.store import MooncakeDistributedStore

TLS_VARS = ("CRESCENT_TLS_CA", "CRESCENT_TLS_CERT", "CRESCENT_TLS_KEY", "CRESCENT_TLS_CLIENT_CA")


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    pki = tmp_path_factory.mktemp("pki")
    subprocess.run([crescent_bin(), "certs", str(pki)], check=True, capture_output=True)
    files = {"ca": str(pki / "ca.pem"), "cert": str(pki / "cert.pem"), "key": str(pki / "key.pem")}
    m = Master("--tls-cert", files["cert"], "--tls-key", files["key"], "--tls-ca", files["ca"],
               "--tls-client-ca", files["ca"])
    yield m.addr, files
    m.stop()


def use_tls(monkeypatch, files, cert=True, client_ca=True):
    for var in TLS_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CRESCENT_TLS_CA", files["ca"])
    if cert:
        monkeypatch.setenv("CRESCENT_TLS_CERT", files["cert"])
        monkeypatch.setenv("CRESCENT_TLS_KEY", files["key"])
    if client_ca:
        monkeypatch.setenv("CRESCENT_TLS_CLIENT_CA", files["ca"])


def test_a_store_without_tls_or_without_a_client_certificate_is_refused(tls_cluster, monkeypatch):
    addr, files = tls_cluster
    for var in TLS_VARS:
        monkeypatch.delenv(var, raising=False)
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", addr) < 0
    use_tls(monkeypatch, files, cert=False, client_ca=False)
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", addr) < 0
    # Dialling through TLS but hosting a segment with no certificate to serve it: refused at setup.
    assert s.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", addr) < 0


def test_stores_with_certificates_host_and_read_each_other_through_tls(tls_cluster, monkeypatch):
    addr, files = tls_cluster
    use_tls(monkeypatch, files)
    host = MooncakeDistributedStore()
    assert host.setup("localhost", "P2PHANDSHAKE", 32 * MiB, 16 * MiB, "tcp", "", addr) == 0
    reader = MooncakeDistributedStore()
    assert reader.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", addr) == 0
    try:
        value = os.urandom(3 * MiB + 5)
        # The reader contributes no memory: its put lands in the host's segment, over TLS both ways.
        assert reader.put("tls-big", value) == 0
        assert host.get("tls-big") == value
        assert reader.get("tls-big") == value
        assert reader.is_exist("tls-big") == 1
    finally:
        reader.close()
        host.remove_all(force=True)
        host.close()
