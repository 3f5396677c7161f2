"""A store in a cluster serving TLS with client certificates (issue 17): the TLS files come from CRESCENT_TLS_*
or from setup's tls_* extras."""

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


def test_tls_files_given_to_setup_take_the_place_of_the_environment(tls_cluster, monkeypatch):
    addr, files = tls_cluster
    for var in TLS_VARS:
        monkeypatch.delenv(var, raising=False)
    extras = {"tls_ca": files["ca"], "tls_cert": files["cert"], "tls_key": files["key"],
              "tls_client_ca": files["ca"]}
    host = MooncakeDistributedStore()
    assert host.setup("localhost", "P2PHANDSHAKE", 32 * MiB, 16 * MiB, "tcp", "", addr, **extras) == 0
    # The dict form takes the same keys.
    reader = MooncakeDistributedStore()
    config = {"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE", "global_segment_size": 0,
              "local_buffer_size": 16 * MiB, "protocol": "tcp", "master_server_addr": addr,
              "tls_ca": files["ca"], "tls_cert": files["cert"], "tls_key": files["key"]}
    assert reader.setup(config) == 0
    try:
        value = os.urandom(MiB + 3)
        assert reader.put("tls-extras", value) == 0
        assert host.get("tls-extras") == value
    finally:
        reader.close()
        host.remove_all(force=True)
        host.close()
    # Extras and variables combine, each extra in place of its own variable.
    monkeypatch.setenv("CRESCENT_TLS_CERT", files["cert"])
    monkeypatch.setenv("CRESCENT_TLS_KEY", files["key"])
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", addr, tls_ca=files["ca"]) == 0, \
        "the certificate from the environment, the CA from setup"
    s.close()
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", addr, tls_ca="/nonexistent/ca.pem") < 0, \
        "a file that does not load is a setup error"
