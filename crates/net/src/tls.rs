//! TLS on both planes and the admin HTTP: rustls, TLS 1.3 only, aws-lc-rs's AES-GCM (AES-128 preferred: the
//! fastest suite where the CPU has AES instructions), no session tickets (connections are long-lived and
//! pooled). A server with a certificate takes every connection through the handshake before its hello; with a
//! client CA it also requires, and verifies, a client certificate. A client with a CA verifies the server's
//! certificate against it (by the host of the address it dials, or one name every server's certificate
//! carries) and, with a certificate of its own, presents it.
//!
//! TLS protects the bytes on the wire and, with client certificates, who may connect at all; what a peer may
//! do is still the cluster secret's credentials and the master's grants (`auth`, `grant`), which work the same
//! over TLS or not.

use crate::auth::{AuthFailure, AuthFailures};
use crate::conn::{Conn, TlsSocket};
use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Environment variable naming the certificate chain (PEM) a process presents.
pub const CERT_ENV: &str = "CRESCENT_TLS_CERT";
/// Environment variable naming the private key (PEM) of [`CERT_ENV`].
pub const KEY_ENV: &str = "CRESCENT_TLS_KEY";
/// Environment variable naming the CA certificates (PEM) servers' certificates are verified against.
pub const CA_ENV: &str = "CRESCENT_TLS_CA";
/// Environment variable naming the CA certificates (PEM) a server requires client certificates from.
pub const CLIENT_CA_ENV: &str = "CRESCENT_TLS_CLIENT_CA";
/// Environment variable naming the one name every server's certificate is checked for (else each address's host).
pub const SERVER_NAME_ENV: &str = "CRESCENT_TLS_SERVER_NAME";

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or parsed.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// Options that do not make a whole setup.
    #[error("{0}")]
    Incomplete(&'static str),
    /// rustls refused the material.
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
    /// A name no certificate can carry.
    #[error("invalid TLS server name {0:?}")]
    ServerName(String),
}

/// Where a process's TLS material is (all optional; see [`Tls::load`] for what each enables).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain (PEM), leaf first: served by a server, presented by a client.
    pub cert: Option<PathBuf>,
    /// The private key of `cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
    /// CA certificates (PEM) that servers' certificates must chain to; a client with none does not use TLS.
    pub ca: Option<PathBuf>,
    /// CA certificates (PEM) that a server requires client certificates to chain to.
    pub client_ca: Option<PathBuf>,
    /// The name every server's certificate is checked for; `None`: the host of the address dialled.
    pub server_name: Option<String>,
}

impl TlsFiles {
    /// The files the `CRESCENT_TLS_*` environment variables name.
    pub fn from_env() -> Self {
        let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        TlsFiles {
            cert: var(CERT_ENV).map(PathBuf::from),
            key: var(KEY_ENV).map(PathBuf::from),
            ca: var(CA_ENV).map(PathBuf::from),
            client_ca: var(CLIENT_CA_ENV).map(PathBuf::from),
            server_name: var(SERVER_NAME_ENV).and_then(|v| v.into_string().ok()),
        }
    }

    /// Whether any TLS option is set.
    pub fn is_empty(&self) -> bool {
        *self == TlsFiles::default()
    }
}

/// A process's TLS: the server side its listeners use, the client side its dialers use (each optional).
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// With a certificate: what listeners take connections through.
    pub server: Option<Arc<TlsServer>>,
    /// With a CA: what dialers take connections through.
    pub client: Option<Arc<TlsClient>>,
}

impl Tls {
    /// Loads `files`: `cert` + `key` make a server side (requiring client certificates of `client_ca` when
    /// given); `ca` makes a client side (presenting `cert` + `key` when given). A key without a certificate,
    /// or a client CA without a certificate to serve, is refused.
    pub fn load(files: &TlsFiles) -> Result<Tls, TlsError> {
        let (server, client) = configs(files)?;
        let server = server.map(|config| {
            Arc::new(TlsServer {
                acceptor: ArcSwap::from_pointee(TlsAcceptor::from(Arc::new(config))),
                verifies_clients: files.client_ca.is_some(),
                files: files.clone(),
            })
        });
        let server_name = match &files.server_name {
            None => None,
            Some(name) => Some(server_name(name)?),
        };
        let client = client.map(|config| {
            Arc::new(TlsClient {
                connector: ArcSwap::from_pointee(TlsConnector::from(Arc::new(config))),
                server_name,
                files: files.clone(),
            })
        });
        Ok(Tls { server, client })
    }

    /// Reads the files again (renewed certificates, a new CA): new connections use them, established ones keep
    /// their sessions. On an error nothing changes.
    pub fn reload(&self) -> Result<(), TlsError> {
        let files = match (&self.server, &self.client) {
            (Some(s), _) => &s.files,
            (None, Some(c)) => &c.files,
            (None, None) => return Ok(()),
        };
        let (server, client) = configs(files)?;
        if let (Some(side), Some(config)) = (&self.server, server) {
            side.acceptor.store(Arc::new(TlsAcceptor::from(Arc::new(config))));
        }
        if let (Some(side), Some(config)) = (&self.client, client) {
            side.connector.store(Arc::new(TlsConnector::from(Arc::new(config))));
        }
        Ok(())
    }

    /// Whether either side is configured.
    pub fn is_on(&self) -> bool {
        self.server.is_some() || self.client.is_some()
    }

    /// [`Tls::load`] of the `CRESCENT_TLS_*` environment (a client's or the Python package's).
    pub fn from_env() -> Result<Tls, TlsError> {
        Tls::load(&TlsFiles::from_env())
    }
}

/// The rustls configurations `files` make: the server's (with a certificate) and the client's (with a CA).
fn configs(files: &TlsFiles) -> Result<(Option<ServerConfig>, Option<ClientConfig>), TlsError> {
    let identity = match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => Some((certs(cert)?, private_key(key)?)),
        (None, None) => None,
        _ => return Err(TlsError::Incomplete("a TLS certificate and its key go together (give both)")),
    };
    if files.client_ca.is_some() && identity.is_none() {
        return Err(TlsError::Incomplete("requiring client certificates needs a server certificate and key"));
    }
    let provider = Arc::new(provider());
    let server = match &identity {
        None => None,
        Some((chain, key)) => {
            let builder = ServerConfig::builder_with_provider(provider.clone())
                .with_protocol_versions(&[&rustls::version::TLS13])?;
            let builder = match &files.client_ca {
                Some(path) => {
                    let verifier = WebPkiClientVerifier::builder_with_provider(roots(path)?.into(), provider.clone())
                        .build()
                        .map_err(|e| TlsError::File { path: path.clone(), why: e.to_string() })?;
                    builder.with_client_cert_verifier(verifier)
                }
                None => builder.with_no_client_auth(),
            };
            let mut config = builder.with_single_cert(chain.clone(), key.clone_key())?;
            config.send_tls13_tickets = 0;
            Some(config)
        }
    };
    let client = match &files.ca {
        None => None,
        Some(path) => {
            let builder = ClientConfig::builder_with_provider(provider)
                .with_protocol_versions(&[&rustls::version::TLS13])?
                .with_root_certificates(roots(path)?);
            Some(match identity {
                Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
                None => builder.with_no_client_auth(),
            })
        }
    };
    Ok((server, client))
}

/// rustls with aws-lc-rs, its TLS 1.3 suites ordered AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305.
fn provider() -> rustls::crypto::CryptoProvider {
    use rustls::crypto::aws_lc_rs::{cipher_suite as suite, default_provider};
    rustls::crypto::CryptoProvider {
        cipher_suites: vec![
            suite::TLS13_AES_128_GCM_SHA256,
            suite::TLS13_AES_256_GCM_SHA384,
            suite::TLS13_CHACHA20_POLY1305_SHA256,
        ],
        ..default_provider()
    }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |why: String| TlsError::File { path: path.to_owned(), why };
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if chain.is_empty() {
        return Err(bad("no PEM certificate in the file".into()));
    }
    Ok(chain)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File { path: path.to_owned(), why: e.to_string() })
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certs(path)? {
        store.add(cert).map_err(|e| TlsError::File { path: path.to_owned(), why: e.to_string() })?;
    }
    Ok(store)
}

fn server_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(name.to_owned()).map_err(|_| TlsError::ServerName(name.to_owned()))
}

/// The server side: what a listener takes each new connection through.
pub struct TlsServer {
    /// Swapped whole by [`Tls::reload`].
    acceptor: ArcSwap<TlsAcceptor>,
    /// Whether a client certificate is required (and verified).
    verifies_clients: bool,
    /// What it was loaded from (and is reloaded from).
    files: TlsFiles,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServer").field("verifies_clients", &self.verifies_clients).finish_non_exhaustive()
    }
}

impl TlsServer {
    /// Whether clients must present a certificate of the client CA (they are authenticated by TLS).
    pub fn verifies_clients(&self) -> bool {
        self.verifies_clients
    }
}

/// The client side: what a dialer takes each new connection through.
pub struct TlsClient {
    /// Swapped whole by [`Tls::reload`].
    connector: ArcSwap<TlsConnector>,
    /// The name every server's certificate must carry; `None`: the host of the address dialled.
    server_name: Option<ServerName<'static>>,
    /// What it was loaded from (and is reloaded from).
    files: TlsFiles,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

/// Why a connection did not get through a TLS handshake.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeFailure {
    /// Not within the deadline.
    #[error("TLS handshake not done within {0:?}")]
    Timeout(Duration),
    /// The peer is not who it must be, or does not speak TLS (a plain client, a bad or missing certificate).
    #[error("TLS handshake failed: {0}")]
    Refused(io::Error),
}

/// Takes a freshly accepted connection through the server's TLS handshake within `deadline`, or leaves it plain
/// without `tls`.
pub async fn accept(tls: Option<&TlsServer>, stream: TcpStream, deadline: Duration) -> Result<Conn, HandshakeFailure> {
    let Some(tls) = tls else { return Ok(Conn::Plain(stream)) };
    let stream = TlsSocket::new(stream);
    let acceptor = tls.acceptor.load_full();
    match tokio::time::timeout(deadline, acceptor.accept(stream)).await {
        Err(_) => Err(HandshakeFailure::Timeout(deadline)),
        Ok(Err(e)) => Err(HandshakeFailure::Refused(e)),
        Ok(Ok(s)) => Ok(Conn::Tls(Box::new(s.into()))),
    }
}

/// [`accept`] for a server: a refused handshake is counted (and logged at the rate limit) in `failures` as
/// `server`'s failed authentication of `peer`.
pub async fn accept_counted(
    tls: Option<&TlsServer>,
    stream: TcpStream,
    deadline: Duration,
    failures: &AuthFailures,
    server: &str,
    peer: std::net::SocketAddr,
) -> Result<Conn, HandshakeFailure> {
    let accepted = accept(tls, stream, deadline).await;
    if let Err(HandshakeFailure::Refused(e)) = &accepted {
        failures.record(server, Some(peer), &AuthFailure::Tls(e.to_string()));
    }
    accepted
}

/// Takes a freshly dialled connection to `endpoint` (`host:port`) through the client's TLS handshake (the caller
/// bounds it), or leaves it plain without `tls`.
pub async fn connect(tls: Option<&TlsClient>, stream: TcpStream, endpoint: &str) -> io::Result<Conn> {
    let Some(tls) = tls else { return Ok(Conn::Plain(stream)) };
    let name = match &tls.server_name {
        Some(name) => name.clone(),
        None => server_name(host_of(endpoint)).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
    };
    let stream = TlsSocket::new(stream);
    let connector = tls.connector.load_full();
    let s = connector.connect(name, stream).await?;
    Ok(Conn::Tls(Box::new(s.into())))
}

/// The host of `host:port` (`[v6]:port` too).
fn host_of(endpoint: &str) -> &str {
    let host = endpoint.rsplit_once(':').map_or(endpoint, |(h, _)| h);
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

/// Self-signed cluster material for a quick start and for tests (feature `certgen`): a CA, and one certificate
/// for every process of the cluster (servers and clients alike) carrying `names` (DNS names or IP addresses).
#[cfg(any(test, feature = "certgen"))]
pub mod certgen {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    use std::path::{Path, PathBuf};

    /// PEM texts of generated material.
    #[derive(Debug, Clone)]
    pub struct Material {
        /// The CA certificate (for `--tls-ca` and `--tls-client-ca`).
        pub ca: String,
        /// A certificate signed by the CA for `names`, usable as a server's and as a client's.
        pub cert: String,
        /// Its private key.
        pub key: String,
    }

    /// Generates a CA and one certificate for `names` (ECDSA P-256, valid from now for ten years).
    pub fn generate(names: &[String]) -> Result<Material, rcgen::Error> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "Crescent cluster CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca.self_signed(&ca_key)?;
        let key = KeyPair::generate()?;
        let mut leaf = CertificateParams::new(names.to_vec())?;
        leaf.distinguished_name.push(DnType::CommonName, "Crescent");
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = leaf.signed_by(&key, &Issuer::new(ca, ca_key))?;
        Ok(Material { ca: ca_cert.pem(), cert: cert.pem(), key: key.serialize_pem() })
    }

    /// Files written by [`write()`].
    #[derive(Debug, Clone)]
    pub struct Files {
        /// `ca.pem`.
        pub ca: PathBuf,
        /// `cert.pem`.
        pub cert: PathBuf,
        /// `key.pem` (mode 600).
        pub key: PathBuf,
    }

    /// Writes [`generate`]'s material into `dir` as `ca.pem`, `cert.pem` and `key.pem` (mode 600).
    pub fn write(dir: &Path, names: &[String]) -> std::io::Result<Files> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let m = generate(names).map_err(std::io::Error::other)?;
        std::fs::create_dir_all(dir)?;
        let files = Files { ca: dir.join("ca.pem"), cert: dir.join("cert.pem"), key: dir.join("key.pem") };
        std::fs::write(&files.ca, m.ca)?;
        std::fs::write(&files.cert, m.cert)?;
        let mut key =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&files.key)?;
        key.write_all(m.key.as_bytes())?;
        Ok(files)
    }
}

/// Loopback connections for this crate's tests, plain or TLS.
#[cfg(test)]
pub(crate) mod testing {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Both sides of a cluster's TLS (one certificate for 127.0.0.1, servers verifying clients).
    pub(crate) fn cluster() -> Tls {
        let dir = tempfile::tempdir().unwrap();
        let f = certgen::write(dir.path(), &["127.0.0.1".to_owned()]).unwrap();
        let files = TlsFiles {
            cert: Some(f.cert),
            key: Some(f.key),
            ca: Some(f.ca.clone()),
            client_ca: Some(f.ca),
            server_name: None,
        };
        Tls::load(&files).unwrap()
    }

    /// A connected (server, client) pair over loopback, through a TLS handshake when `tls`.
    pub(crate) async fn pair(tls: bool) -> (Conn, Conn) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let dial = TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let t = if tls { cluster() } else { Tls::default() };
        let endpoint = addr.to_string();
        let (server, client) = tokio::join!(
            accept(t.server.as_deref(), accepted, Duration::from_secs(10)),
            connect(t.client.as_deref(), dial, &endpoint)
        );
        (server.unwrap(), client.unwrap())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_host_of_an_address() {
        assert_eq!(host_of("127.0.0.1:5"), "127.0.0.1");
        assert_eq!(host_of("[::1]:5"), "::1");
        assert_eq!(host_of("node-3.example:5"), "node-3.example");
        assert_eq!(host_of("bare"), "bare");
    }

    #[test]
    fn incomplete_options_are_refused_and_unreadable_files_named() {
        let key_only = TlsFiles { key: Some("k.pem".into()), ..TlsFiles::default() };
        assert!(matches!(Tls::load(&key_only), Err(TlsError::Incomplete(_))));
        let client_ca_only = TlsFiles { client_ca: Some("ca.pem".into()), ..TlsFiles::default() };
        assert!(matches!(Tls::load(&client_ca_only), Err(TlsError::Incomplete(_))));
        let missing = TlsFiles { ca: Some("/nonexistent/ca.pem".into()), ..TlsFiles::default() };
        let e = Tls::load(&missing).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let none = Tls::load(&TlsFiles::default()).unwrap();
        assert!(none.server.is_none() && none.client.is_none());
    }

    #[tokio::test]
    async fn bytes_cross_a_verified_session_and_a_stranger_is_refused() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut server, mut client) = testing::pair(true).await;
        assert!(server.is_tls() && client.is_tls());
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");

        // Another cluster's client (its own CA and certificate) and a plain client are both refused.
        let ours = testing::cluster();
        let theirs = testing::cluster();
        for client_tls in [theirs.client.clone(), None] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let dial = TcpStream::connect(addr).await.unwrap();
            let (accepted, _) = listener.accept().await.unwrap();
            let endpoint = addr.to_string();
            let plain = client_tls.is_none();
            let (served, dialled) =
                tokio::join!(accept(ours.server.as_deref(), accepted, Duration::from_secs(2)), async {
                    let mut c = connect(client_tls.as_deref(), dial, &endpoint).await?;
                    c.write_all(b"hello?").await?;
                    c.flush().await?;
                    let mut b = [0u8; 1];
                    c.read(&mut b).await
                });
            assert!(matches!(served, Err(HandshakeFailure::Refused(_))), "{served:?}");
            // The plain client reads the server's alert record; the other cluster's fails its handshake.
            assert!(plain || dialled.is_err(), "the stranger's session stood: {dialled:?}");
        }
    }

    /// A handshake of `client` with `server` over loopback: whether both ends got through.
    async fn handshake(server: &Tls, client: &Tls) -> bool {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let dial = TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let endpoint = addr.to_string();
        let (s, c) = tokio::join!(
            accept(server.server.as_deref(), accepted, Duration::from_secs(5)),
            connect(client.client.as_deref(), dial, &endpoint)
        );
        s.is_ok() && c.is_ok()
    }

    #[tokio::test]
    async fn a_reload_takes_renewed_files_for_new_connections_and_a_bad_one_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["127.0.0.1".to_owned()];
        let old = certgen::write(dir.path(), &names).unwrap();
        let files = TlsFiles {
            cert: Some(old.cert.clone()),
            key: Some(old.key.clone()),
            ca: Some(old.ca.clone()),
            client_ca: None,
            server_name: None,
        };
        let server = Tls::load(&files).unwrap();
        let old_client = Tls::load(&TlsFiles { ca: Some(old.ca.clone()), ..TlsFiles::default() }).unwrap();
        let ca_before = std::fs::read(&old.ca).unwrap();
        assert!(handshake(&server, &old_client).await);

        // A new CA and certificate in the same files: after the reload, only the new CA's clients get through.
        certgen::write(dir.path(), &names).unwrap();
        let new_client = Tls::load(&TlsFiles { ca: Some(old.ca.clone()), ..TlsFiles::default() }).unwrap();
        assert!(!handshake(&server, &new_client).await, "the new CA trusted before the reload");
        server.reload().unwrap();
        assert!(handshake(&server, &new_client).await, "the renewed certificate not served");
        assert!(!handshake(&server, &old_client).await, "the old certificate still served");

        // A broken file: the reload fails and the server goes on with what it had.
        std::fs::write(&old.cert, b"not a certificate").unwrap();
        assert!(server.reload().is_err());
        assert!(handshake(&server, &new_client).await, "a failed reload changed the server");
        assert_ne!(std::fs::read(&old.ca).unwrap(), ca_before);
    }
}
