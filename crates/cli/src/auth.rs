//! Where the CLI finds the cluster secret and credentials, and the rule that keeps an unauthenticated server
//! off the network.
//!
//! Servers (`up`, `master`, `node`) take the cluster secret from `--secret-file FILE`, else
//! `CRESCENT_SECRET_FILE`, else `CRESCENT_SECRET` (never from a flag holding the secret: flags show in `ps`).
//! Client commands take a credential from `CRESCENT_CREDENTIAL_FILE` or `CRESCENT_CREDENTIAL`
//! (`PRINCIPAL:KEYHEX`, as `crescent credential` prints it); an operator who holds the secret itself acts as
//! `admin`. Without a secret a server listens on loopback only unless `--insecure` says otherwise.
//!
//! TLS: servers serve `--tls-cert`/`--tls-key` (and require client certificates of `--tls-client-ca`) and
//! verify the servers they dial against `--tls-ca`; client commands take the same files from `CRESCENT_TLS_*`.
//! A server that requires client certificates authenticates its peers without a secret.

use anyhow::{Context, Result, bail};
use crescent_net::auth::{Credential, CredentialSource, Keyring};
use crescent_net::host::NodeKeys;
use crescent_net::tls::{Tls, TlsClient, TlsFiles};
use crescent_proto::Principal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `--secret-file` and `--insecure`, for the servers.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct SecretArgs {
    /// File holding the cluster secret (one per line; two during a rotation, the first current).
    #[arg(
        long,
        value_name = "FILE",
        help = "File (mode 600) holding the cluster secret: peers must prove a \
        credential derived from it (one secret per line, two during a rotation, the first current; also \
        CRESCENT_SECRET_FILE or CRESCENT_SECRET) [default: no authentication, loopback only]"
    )]
    secret_file: Option<PathBuf>,
    /// Listen on a non-loopback address without authentication.
    #[arg(
        long,
        help = "Listen on a non-loopback address without a cluster secret: anyone who reaches the \
        ports can read and destroy every object"
    )]
    insecure: bool,
    /// Certificate chain (PEM) served, and presented to the servers dialled.
    #[arg(long, value_name = "FILE", env = crescent_net::tls::CERT_ENV, help = "Serve TLS with this \
        certificate chain (PEM, leaf first; also presented as the client certificate to the servers this process \
        dials; needs --tls-key) [default: plain TCP]")]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of `--tls-cert`.
    #[arg(long, value_name = "FILE", env = crescent_net::tls::KEY_ENV, help = "Private key (PEM) of --tls-cert")]
    tls_key: Option<PathBuf>,
    /// CA certificates (PEM) the servers this process dials must chain to.
    #[arg(long, value_name = "FILE", env = crescent_net::tls::CA_ENV, help = "Dial masters and storage nodes \
        through TLS, verifying their certificates against these CA certificates (PEM)")]
    tls_ca: Option<PathBuf>,
    /// CA certificates (PEM) client certificates must chain to; required when given.
    #[arg(long, value_name = "FILE", env = crescent_net::tls::CLIENT_CA_ENV, help = "Require every peer to \
        present a client certificate chaining to these CA certificates (PEM); needs --tls-cert")]
    tls_client_ca: Option<PathBuf>,
    /// The name every server's certificate is checked for.
    #[arg(long, value_name = "NAME", env = crescent_net::tls::SERVER_NAME_ENV, help = "Check every server's \
        certificate for this name [default: the host of each address dialled]")]
    tls_server_name: Option<String>,
}

impl SecretArgs {
    /// The keyring: `--secret-file`, else the environment, else none.
    pub fn keyring(&self) -> Result<Option<Arc<Keyring>>> {
        keyring(self.secret_file.as_deref())
    }

    /// The TLS of `--tls-*` (each also from its `CRESCENT_TLS_*` variable).
    pub fn tls(&self) -> Result<Tls> {
        let files = TlsFiles {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            ca: self.tls_ca.clone(),
            client_ca: self.tls_client_ca.clone(),
            server_name: self.tls_server_name.clone(),
        };
        Ok(Tls::load(&files)?)
    }

    /// Refuses to expose `addrs` (what, where) beyond loopback without authentication (a cluster secret or a
    /// node's credential, or TLS client certificates) unless `--insecure`; says at start-up how the server is
    /// protected.
    pub fn guard(&self, authenticates: bool, tls: &Tls, addrs: &[(&str, SocketAddr)]) -> Result<()> {
        match &tls.server {
            Some(t) if t.verifies_clients() => tracing::info!("TLS on: peers must present a client certificate"),
            Some(_) => tracing::info!("TLS on (server certificate only)"),
            None => {}
        }
        if authenticates {
            tracing::info!("authentication on: peers must prove a credential (or, at a node, a ticket)");
            return Ok(());
        }
        if tls.server.as_ref().is_some_and(|t| t.verifies_clients()) {
            tracing::warn!(
                "no cluster secret: TLS client certificates admit peers, but every admitted peer acts as admin \
                 (no tenant scopes, no data-plane grants)"
            );
            return Ok(());
        }
        let exposed: Vec<String> =
            addrs.iter().filter(|(_, a)| !a.ip().is_loopback()).map(|(what, a)| format!("{what} {a}")).collect();
        if exposed.is_empty() {
            tracing::warn!("authentication off (no cluster secret): serving on loopback only");
        } else if self.insecure {
            tracing::warn!(
                "authentication off on {} (--insecure): anyone who reaches these ports can read and destroy data",
                exposed.join(", ")
            );
        } else {
            bail!(
                "refusing to listen on {} without authentication: give a master a cluster secret (--secret-file \
                 FILE or CRESCENT_SECRET_FILE; `crescent secret` makes one) and a node its credential \
                 (--credential-file FILE or CRESCENT_CREDENTIAL_FILE), or pass --insecure",
                exposed.join(", ")
            );
        }
        Ok(())
    }
}

/// Reloads `keyring` and `tls` from their files on every SIGHUP: a secret rotation without a restart (write both
/// secrets, reload every server, move the clients to the new credentials, then leave only the new secret and
/// reload again), and renewed TLS certificates (new connections use them). A file that does not load leaves
/// what was in force.
pub fn reload_on_hangup(
    keyring: Option<Arc<Keyring>>,
    keys: Option<Arc<NodeKeys>>,
    tls: Tls,
    server: &'static str,
) -> Result<()> {
    if keyring.is_none() && keys.is_none() && !tls.is_on() {
        return Ok(());
    }
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if let Some(ring) = &keyring {
                match ring.reload() {
                    Ok(n) => tracing::info!(server, secrets = n, "reloaded the cluster secret"),
                    Err(e) => tracing::error!(server, "the cluster secret was not reloaded (the old one stays): {e}"),
                }
            }
            if let Some(keys) = &keys {
                match keys.reload() {
                    Ok(n) => tracing::info!(server, credentials = n, "reloaded the node's credential"),
                    Err(e) => tracing::error!(server, "the credential was not reloaded (the old one stays): {e}"),
                }
            }
            if tls.is_on() {
                match tls.reload() {
                    Ok(()) => tracing::info!(server, "reloaded the TLS certificates"),
                    Err(e) => {
                        tracing::error!(server, "the TLS certificates were not reloaded (the old ones stay): {e}")
                    }
                }
            }
        }
    });
    Ok(())
}

/// The keyring in `file`, else the environment's, else none.
fn keyring(file: Option<&Path>) -> Result<Option<Arc<Keyring>>> {
    let ring = match file {
        Some(path) => Some(Keyring::load(path)?),
        None => Keyring::from_env().context("the cluster secret from the environment")?,
    };
    Ok(ring.map(Arc::new))
}

/// A storage node's keys: `--credential-file`, else the credential in the environment, else (with a warning:
/// the node then holds the secret, so breaking into it yields every credential) derived for `node` from a
/// cluster secret; none without any.
pub fn node_keys(credential_file: Option<&Path>, secrets: &SecretArgs) -> Result<Option<Arc<NodeKeys>>> {
    if let Some(path) = credential_file {
        return Ok(Some(Arc::new(NodeKeys::load(path)?)));
    }
    if let Some(keys) = NodeKeys::from_env().context("the node's credential from the environment")? {
        return Ok(Some(Arc::new(keys)));
    }
    Ok(secrets.keyring()?.map(|ring| {
        tracing::warn!(
            "this node holds the cluster secret: give it its own credential instead (`crescent credential node:NAME` \
             into --credential-file), so a node broken into yields no other principal's"
        );
        Arc::new(NodeKeys::derived(ring, Principal::Node(None)))
    }))
}

/// The credential of a client command: `CRESCENT_CREDENTIAL_FILE`, else `CRESCENT_CREDENTIAL`, else `admin`
/// derived from a cluster secret in the environment, else none.
pub fn client_credential() -> Result<Option<CredentialSource>> {
    if let Some(c) = Credential::from_env().context("the credential from the environment")? {
        return Ok(Some(c.into()));
    }
    let ring = Keyring::from_env().context("the cluster secret from the environment")?;
    Ok(ring.map(|r| CredentialSource::Derived(Arc::new(r), Principal::Admin)))
}

/// The TLS client side of a client command: the `CRESCENT_TLS_*` environment (`CRESCENT_TLS_CA` turns it on).
pub fn client_tls() -> Result<Option<Arc<TlsClient>>> {
    Ok(Tls::from_env().context("TLS from the environment")?.client)
}

/// `crescent credential PRINCIPAL`: prints the credential of a principal, derived from the cluster secret.
#[derive(clap::Args, Debug)]
pub struct CredentialArgs {
    /// `admin`, `node`, `node:NAME` or `tenant:NAME`.
    principal: String,
    /// File holding the cluster secret (else CRESCENT_SECRET_FILE or CRESCENT_SECRET).
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
}

/// Prints `PRINCIPAL:KEYHEX` for `a.principal` (to hand to that principal's processes, e.g. as
/// `CRESCENT_CREDENTIAL`).
pub fn credential(a: &CredentialArgs) -> Result<()> {
    let principal: Principal = a.principal.parse()?;
    let Some(ring) = keyring(a.secret_file.as_deref())? else {
        bail!("no cluster secret: give --secret-file FILE, CRESCENT_SECRET_FILE or CRESCENT_SECRET");
    };
    println!("{}", &*ring.credential(principal).to_text());
    Ok(())
}

/// `crescent certs DIR`: a self-signed cluster CA and one certificate for every process.
#[derive(clap::Args, Debug)]
pub struct CertsArgs {
    /// Directory to write `ca.pem`, `cert.pem` and `key.pem` (mode 600) into.
    dir: PathBuf,
    /// A DNS name or IP address the certificate is valid for (repeatable) [default: localhost, 127.0.0.1].
    #[arg(long = "name", value_name = "NAME")]
    names: Vec<String>,
}

/// Writes a CA and a certificate for `a.names` (servers and clients alike) into `a.dir`, and says how to use them.
pub fn certs(a: &CertsArgs) -> Result<()> {
    let names = if a.names.is_empty() { vec!["localhost".to_owned(), "127.0.0.1".to_owned()] } else { a.names.clone() };
    let f = crescent_net::tls::certgen::write(&a.dir, &names)
        .with_context(|| format!("writing TLS material into {}", a.dir.display()))?;
    println!(
        "CA {}; certificate {} and key {} for {}",
        f.ca.display(),
        f.cert.display(),
        f.key.display(),
        names.join(", ")
    );
    println!(
        "servers: --tls-cert {} --tls-key {} --tls-ca {} [--tls-client-ca {}]",
        f.cert.display(),
        f.key.display(),
        f.ca.display(),
        f.ca.display()
    );
    println!(
        "clients: CRESCENT_TLS_CA={} [CRESCENT_TLS_CERT={} CRESCENT_TLS_KEY={}]",
        f.ca.display(),
        f.cert.display(),
        f.key.display()
    );
    Ok(())
}

/// `crescent secret`: prints a fresh random cluster secret (256 bits, hex).
pub fn secret() -> Result<()> {
    let bytes = crescent_net::auth::nonce()?;
    println!("{}", hex::encode(bytes));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unauthenticated_server_stays_on_loopback_unless_insecure() {
        let lo: SocketAddr = "127.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}"));
        let any: SocketAddr = "0.0.0.0:1".parse().unwrap_or_else(|e| panic!("{e}"));
        let strict = SecretArgs::default();
        let plain = Tls::default();
        assert!(strict.guard(false, &plain, &[("rpc", lo), ("admin", lo)]).is_ok());
        let e = strict
            .guard(false, &plain, &[("rpc", any), ("admin", lo)])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("rpc 0.0.0.0:1") && e.contains("--insecure") && !e.contains("admin"), "{e}");
        let insecure = SecretArgs { insecure: true, ..SecretArgs::default() };
        assert!(insecure.guard(false, &Tls::default(), &[("rpc", any)]).is_ok());
        assert!(strict.guard(true, &plain, &[("rpc", any)]).is_ok(), "authenticated: any address");

        // TLS with client certificates authenticates; a server certificate alone does not.
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let f = crescent_net::tls::certgen::write(dir.path(), &["127.0.0.1".into()]).unwrap_or_else(|e| panic!("{e}"));
        let server_only = SecretArgs { tls_cert: Some(f.cert), tls_key: Some(f.key), ..SecretArgs::default() };
        let tls = server_only.tls().unwrap_or_else(|e| panic!("{e}"));
        assert!(server_only.guard(false, &tls, &[("rpc", any)]).is_err(), "TLS without client certificates");
        let mutual = SecretArgs { tls_client_ca: Some(f.ca), ..server_only };
        let tls = mutual.tls().unwrap_or_else(|e| panic!("{e}"));
        assert!(mutual.guard(false, &tls, &[("rpc", any)]).is_ok(), "client certificates: any address");
    }
}
