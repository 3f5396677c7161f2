//! Where the CLI finds the cluster secret and credentials, and the rule that keeps an unauthenticated server
//! off the network.
//!
//! Servers (`up`, `master`, `node`) take the cluster secret from `--secret-file FILE`, else
//! `CRESCENT_SECRET_FILE`, else `CRESCENT_SECRET` (never from a flag holding the secret: flags show in `ps`).
//! Client commands take a credential from `CRESCENT_CREDENTIAL_FILE` or `CRESCENT_CREDENTIAL`
//! (`PRINCIPAL:KEYHEX`, as `crescent credential` prints it); an operator who holds the secret itself acts as
//! `admin`. Without a secret a server listens on loopback only unless `--insecure` says otherwise.

use anyhow::{Context, Result, bail};
use crescent_net::auth::{Credential, CredentialSource, Keyring};
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
}

impl SecretArgs {
    /// The keyring: `--secret-file`, else the environment, else none.
    pub fn keyring(&self) -> Result<Option<Arc<Keyring>>> {
        keyring(self.secret_file.as_deref())
    }

    /// Refuses to expose `addrs` (what, where) beyond loopback without authentication unless `--insecure`;
    /// says at start-up how the server is protected.
    pub fn guard(&self, keyring: Option<&Keyring>, addrs: &[(&str, SocketAddr)]) -> Result<()> {
        if let Some(ring) = keyring {
            tracing::info!(secrets = ring.len(), "authentication on: peers must prove a credential of the cluster");
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
                "refusing to listen on {} without authentication: give a cluster secret (--secret-file FILE or \
                 CRESCENT_SECRET_FILE; `crescent secret` makes one) or pass --insecure",
                exposed.join(", ")
            );
        }
        Ok(())
    }
}

/// Reloads `keyring` from its file on every SIGHUP (a rotation without a restart: write both secrets, reload
/// every server, move the clients to the new credentials, then leave only the new secret and reload again).
pub fn reload_on_hangup(keyring: Option<Arc<Keyring>>, server: &'static str) -> Result<()> {
    let Some(ring) = keyring else { return Ok(()) };
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match ring.reload() {
                Ok(n) => tracing::info!(server, secrets = n, "reloaded the cluster secret"),
                Err(e) => tracing::error!(server, "the cluster secret was not reloaded (the old one stays): {e}"),
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

/// The credential of a client command: `CRESCENT_CREDENTIAL_FILE`, else `CRESCENT_CREDENTIAL`, else `admin`
/// derived from a cluster secret in the environment, else none.
pub fn client_credential() -> Result<Option<CredentialSource>> {
    if let Some(c) = Credential::from_env().context("the credential from the environment")? {
        return Ok(Some(c.into()));
    }
    let ring = Keyring::from_env().context("the cluster secret from the environment")?;
    Ok(ring.map(|r| CredentialSource::Derived(Arc::new(r), Principal::Admin)))
}

/// `crescent credential PRINCIPAL`: prints the credential of a principal, derived from the cluster secret.
#[derive(clap::Args, Debug)]
pub struct CredentialArgs {
    /// `admin`, `node` or `tenant:NAME`.
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
        assert!(strict.guard(None, &[("rpc", lo), ("admin", lo)]).is_ok());
        let e = strict.guard(None, &[("rpc", any), ("admin", lo)]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("rpc 0.0.0.0:1") && e.contains("--insecure") && !e.contains("admin"), "{e}");
        let insecure = SecretArgs { insecure: true, ..SecretArgs::default() };
        assert!(insecure.guard(None, &[("rpc", any)]).is_ok());
        let ring = Keyring::parse("a secret of enough length").unwrap_or_else(|e| panic!("{e}"));
        assert!(strict.guard(Some(&ring), &[("rpc", any)]).is_ok(), "authenticated: any address");
    }
}
