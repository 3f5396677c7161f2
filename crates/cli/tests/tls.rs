//! Issue 17 §1, TLS: a `crescent up` serving TLS with client certificates (and a cluster secret) on both planes
//! and the admin HTTP. A verified client (in-process, and the `crescent` CLI from the environment) puts and gets
//! through it; a plain client, a client without a certificate and another cluster's client are all refused, told
//! why, and counted; the victim's bytes are unchanged.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crescent_client::{Client, ClientConfig};
use crescent_net::auth::{CredentialSource, Keyring};
use crescent_net::tls::{Tls, TlsClient, TlsFiles};
use crescent_proto::Principal;
use crescent_testkit::{Proc, TestTls, check, pattern};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECRET: &str = "the secret of this TLS test cluster";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_crescent"))
}

fn path(p: &Option<std::path::PathBuf>) -> &str {
    p.as_deref().and_then(Path::to_str).unwrap()
}

/// `crescent up` with a secret and TLS requiring client certificates of `t`'s CA.
fn start(t: &TestTls, dir: &Path) -> Proc {
    let secret = dir.join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let f = &t.files;
    Proc::start(
        bin(),
        &[
            "up",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--secret-file",
            secret.to_str().unwrap(),
            "--tls-cert",
            path(&f.cert),
            "--tls-key",
            path(&f.key),
            "--tls-ca",
            path(&f.ca),
            "--tls-client-ca",
            path(&f.client_ca),
            "--segment-size",
            "64MiB",
            "--prefault",
            "false",
        ],
    )
}

fn client(master: &str, tls: Option<Arc<TlsClient>>) -> Client {
    let admin = Keyring::parse(SECRET).unwrap().credential(Principal::Admin);
    let c = ClientConfig::new(master)
        .with_credential(Some(CredentialSource::from(admin)))
        .with_tls(tls)
        .with_request_timeout(Duration::from_secs(10));
    Client::new(c)
}

/// One HTTP/1.0 GET over `tls` (or plain): the whole answer, or the error.
async fn https_get(addr: &str, tls: Option<&TlsClient>, path: &str) -> std::io::Result<String> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut conn = crescent_net::tls::connect(tls, tcp, addr).await?;
    conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await?;
    conn.flush().await?;
    let mut out = String::new();
    conn.read_to_string(&mut out).await?;
    Ok(out)
}

/// The value of an unlabelled counter on `/metrics`.
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{name} not on /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_serves_verified_clients_only_on_every_port() {
    let t = crescent_testkit::tls();
    let dir = tempfile::tempdir().unwrap();
    let up = start(&t, dir.path());
    let (master, admin) = (up.field("master"), up.field("admin"));

    // A verified client: values of every size through TLS on both planes, bytes intact.
    let c = client(&master, t.tls.client.clone());
    for (i, size) in [1usize, 4 << 10, 1 << 20, (4 << 20) + 3].into_iter().enumerate() {
        let key = format!("k{i}");
        c.put(&key, &pattern(size, i as u64)).await.unwrap();
        check(&c.get(&key).await.unwrap(), size, i as u64).unwrap();
    }

    // The CLI as a user runs it: the TLS files from the environment.
    let f = &t.files;
    let with_env = |args: &[&str], stdin: &[u8], tls_env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(["--master", &master]).args(args).env("CRESCENT_SECRET", SECRET);
        for k in ["CRESCENT_TLS_CA", "CRESCENT_TLS_CERT", "CRESCENT_TLS_KEY", "CRESCENT_SECRET_FILE"] {
            cmd.env_remove(k);
        }
        cmd.envs(tls_env.iter().copied());
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin).unwrap();
        child.wait_with_output().unwrap()
    };
    let full =
        [("CRESCENT_TLS_CA", path(&f.ca)), ("CRESCENT_TLS_CERT", path(&f.cert)), ("CRESCENT_TLS_KEY", path(&f.key))];
    let put = with_env(&["put", "cli-key", "-"], b"through TLS", &full);
    assert!(put.status.success(), "{}", String::from_utf8_lossy(&put.stderr));
    let got = with_env(&["get", "cli-key"], b"", &full);
    assert_eq!(got.stdout, b"through TLS", "{}", String::from_utf8_lossy(&got.stderr));

    // A plain CLI is told the cluster speaks TLS; one without a client certificate, that it needs one.
    let plain = with_env(&["get", "cli-key"], b"", &[]);
    let said = String::from_utf8_lossy(&plain.stderr);
    assert!(!plain.status.success() && said.contains("speaks TLS"), "{said}");
    let no_cert = with_env(&["get", "cli-key"], b"", &[("CRESCENT_TLS_CA", path(&f.ca))]);
    let said = String::from_utf8_lossy(&no_cert.stderr);
    assert!(!no_cert.status.success() && said.contains("Certificate"), "{said}");

    // Another cluster's client (its own CA and certificate) and a plain in-process client are refused too.
    let other = crescent_testkit::tls();
    for tls in [other.tls.client.clone(), None] {
        let stranger = client(&master, tls);
        assert!(stranger.get("k0").await.is_err(), "a stranger read through the master");
        assert!(stranger.put("k0", b"overwritten").await.is_err(), "a stranger wrote");
    }
    // The node's data port: a plain peer and another cluster's peer get nowhere, and the bytes are unchanged.
    let node = up.field("node");
    for tls in [None, other.tls.client.as_deref()] {
        let tcp = tokio::net::TcpStream::connect(&node).await.unwrap();
        let refused = match crescent_net::tls::connect(tls, tcp, &node).await {
            Err(_) => true,
            Ok(mut conn) => {
                let _ = conn.write_all(&[0u8; 64]).await;
                let _ = conn.flush().await;
                let mut buf = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut buf)).await;
                // A plain peer may read the server's TLS alert record (type 0x15), never a frame.
                buf.is_empty() || buf[0] == 0x15
            }
        };
        assert!(refused, "the data port answered a stranger");
    }
    check(&c.get("k0").await.unwrap(), 1, 0).unwrap();

    // The admin port speaks HTTPS to a verified client only, and counts the refusals.
    let health = https_get(&admin, t.tls.client.as_deref(), "/health").await.unwrap();
    assert!(health.starts_with("HTTP/1.0 200") || health.starts_with("HTTP/1.1 200"), "{health}");
    let plain = https_get(&admin, None, "/health").await;
    assert!(!plain.as_deref().unwrap_or("").contains("200 OK"), "plain HTTP answered: {plain:?}");
    let metrics = https_get(&admin, t.tls.client.as_deref(), "/metrics").await.unwrap();
    let failures = counter(&metrics, "crescent_master_auth_failures_total");
    assert!(failures >= 3, "refused handshakes counted: {failures}");
    // Without a client certificate: no HTTPS either.
    let ca_only = Tls::load(&TlsFiles { ca: f.ca.clone(), ..TlsFiles::default() }).unwrap();
    let no_cert = https_get(&admin, ca_only.client.as_deref(), "/health").await;
    assert!(!no_cert.as_deref().unwrap_or("").contains("200 OK"), "admin without a client cert: {no_cert:?}");
}
