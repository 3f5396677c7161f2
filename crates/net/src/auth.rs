//! Authentication: the cluster secret, the credentials derived from it, and the MACs of the authenticated hello.
//!
//! One **cluster secret** (a file or an environment variable, never a flag: a flag shows in `ps`) is held by
//! the master. Every other process holds a **credential**: a principal (`admin`, `node`, `node:NAME`,
//! `tenant:NAME`) and the key `HMAC-SHA256(secret, "crescent/principal/v1\0" ‖ principal)`, so the master
//! verifies any principal without a list of users, and a credential proves nothing beyond its principal. A [`Keyring`] holds one or two
//! secrets: during a rotation both are valid (credentials derived from either are accepted, the first derives new
//! ones), so secrets change without downtime.
//!
//! The hello proves the credential without sending it: the client names its principal and a fresh nonce, the
//! server answers with its own nonce, and each side sends `HMAC(key, label ‖ SHA256(hello ‖ server nonce))`
//! under its own label ([`Credential::client_mac`], [`verify_client`]); the server's proof shows the client it talks to a
//! holder of the cluster secret. Comparisons are constant-time (`hmac`'s `verify_slice`); keys are zeroed on
//! drop and never printed (`Debug` redacts them).

use crescent_proto::Principal;
use crescent_proto::wire::AUTH_LEN;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;
use zeroize::Zeroizing;

type HmacSha256 = Hmac<Sha256>;

/// Environment variable naming a file that holds the cluster secret(s).
pub const SECRET_FILE_ENV: &str = "CRESCENT_SECRET_FILE";
/// Environment variable holding the cluster secret itself (one secret; a file allows two, for rotation).
pub const SECRET_ENV: &str = "CRESCENT_SECRET";
/// Environment variable naming a file that holds a credential (`PRINCIPAL:KEYHEX`).
pub const CREDENTIAL_FILE_ENV: &str = "CRESCENT_CREDENTIAL_FILE";
/// Environment variable holding a credential (`PRINCIPAL:KEYHEX`).
pub const CREDENTIAL_ENV: &str = "CRESCENT_CREDENTIAL";
/// Environment variable naming a file that holds the credential a process hosting memory beside its client
/// (the Python store) hosts it with, when that is not its client's (a `node:NAME` of its own).
pub const HOST_CREDENTIAL_FILE_ENV: &str = "CRESCENT_HOST_CREDENTIAL_FILE";
/// Environment variable holding that host credential.
pub const HOST_CREDENTIAL_ENV: &str = "CRESCENT_HOST_CREDENTIAL";

/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;
/// Most secrets a keyring holds: the current one and, during a rotation, one other.
pub const MAX_SECRETS: usize = 2;

const PRINCIPAL_LABEL: &[u8] = b"crescent/principal/v1\0";
const CLIENT_LABEL: &[u8] = b"crescent/hello/client/v1\0";
const SERVER_LABEL: &[u8] = b"crescent/hello/server/v1\0";
const SECRET_ID_LABEL: &[u8] = b"crescent/secret-id/v1\0";

/// Why a secret or a credential could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {why}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why (in the message, not a `source`: an error chain would print it twice).
        why: std::io::Error,
    },
    /// A secret shorter than [`MIN_SECRET_LEN`].
    #[error("a cluster secret must be at least {MIN_SECRET_LEN} bytes (found one of {0})")]
    ShortSecret(usize),
    /// No secret at all, or more than [`MAX_SECRETS`].
    #[error("a secret file holds 1 or {MAX_SECRETS} secrets, one per line (found {0})")]
    SecretCount(usize),
    /// A credential that is not `PRINCIPAL:KEYHEX`.
    #[error("invalid credential: {0}")]
    Credential(String),
    /// A reload of a keyring that was not read from a file.
    #[error("the cluster secret was not read from a file (CRESCENT_SECRET): nothing to reload")]
    NoFile,
}

/// A key of [`AUTH_LEN`] bytes, zeroed on drop.
pub(crate) type Key = Zeroizing<[u8; AUTH_LEN]>;

/// The cluster secret(s) a master (or a process trusted with the secret) verifies credentials with. Reloadable
/// in place ([`Keyring::reload`], on SIGHUP), so a rotation needs no restart: connections authenticate with the
/// secrets of the moment they say hello.
pub struct Keyring {
    /// The first derives credentials; every one verifies. Replaced whole by a reload (a leaf lock, held only
    /// to clone the `Arc`).
    secrets: RwLock<Arc<KeySet>>,
    /// The file it was loaded from, if any (what a reload reads again).
    source: Option<PathBuf>,
}

type Secrets = Vec<Zeroizing<Vec<u8>>>;

/// The valid secrets and their ids.
pub(crate) struct KeySet {
    secrets: Secrets,
    /// Each secret's [`SecretId`], same order.
    ids: Vec<SecretId>,
}

impl KeySet {
    fn new(secrets: Secrets) -> Self {
        Self { ids: secrets.iter().map(|s| SecretId::of(s)).collect(), secrets }
    }
}

/// How long a host still accepts grants and tickets of a key a reload retired (`crate::host`): longer than any
/// transfer takes from its grant to its last stripe, so one sealed just before a rotation finishes.
pub const GRANT_GRACE: Duration = Duration::from_secs(30);

/// Names one secret without revealing it (the first 8 bytes of `HMAC(secret, "crescent/secret-id/v1")`): what
/// the master remembers of the secret a peer proved, to seal that peer's grants and tickets with the same one
/// during a rotation. Stable across reloads, unlike a position in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SecretId(u64);

impl SecretId {
    pub(crate) fn of(secret: &[u8]) -> Self {
        let id = derive_raw(secret, SECRET_ID_LABEL);
        let mut first = [0u8; 8];
        first.copy_from_slice(&id[..8]);
        Self(u64::from_be_bytes(first))
    }
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Keyring({} secret(s), redacted)", self.len())
    }
}

impl Keyring {
    /// A keyring from the text of a secret file: one secret per line (surrounding whitespace ignored, blank
    /// lines and `#` comments skipped), the first current, an optional second also accepted.
    pub fn parse(text: &str) -> Result<Self, AuthConfigError> {
        Ok(Self { secrets: RwLock::new(Arc::new(KeySet::new(parse_secrets(text)?))), source: None })
    }

    /// The keyring in a secret file (which [`Keyring::reload`] reads again).
    pub fn load(path: &Path) -> Result<Self, AuthConfigError> {
        let secrets = parse_secrets(&read_secret_file(path)?)?;
        Ok(Self { secrets: RwLock::new(Arc::new(KeySet::new(secrets))), source: Some(path.to_owned()) })
    }

    /// The keyring the environment names: [`SECRET_FILE_ENV`], else [`SECRET_ENV`], else none.
    pub fn from_env() -> Result<Option<Self>, AuthConfigError> {
        from_env(SECRET_FILE_ENV, SECRET_ENV, Self::load, Self::parse)
    }

    /// Reads the secret file again and, if it is valid, makes its secrets the valid ones (new handshakes use
    /// them; open connections stay). Returns how many are valid now. A keyring not loaded from a file, or a
    /// file that no longer parses, keeps its secrets (and the error says why).
    pub fn reload(&self) -> Result<usize, AuthConfigError> {
        let Some(path) = &self.source else { return Err(AuthConfigError::NoFile) };
        self.replace(parse_secrets(&read_secret_file(path)?)?)
    }

    /// Makes `text`'s secrets the valid ones, as a reload of a file holding it would.
    pub fn replace_with(&self, text: &str) -> Result<usize, AuthConfigError> {
        self.replace(parse_secrets(text)?)
    }

    fn replace(&self, fresh: Secrets) -> Result<usize, AuthConfigError> {
        let n = fresh.len();
        *self.secrets.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(KeySet::new(fresh));
        Ok(n)
    }

    pub(crate) fn snapshot(&self) -> Arc<KeySet> {
        self.secrets.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// How many secrets are valid now (2 during a rotation).
    pub fn len(&self) -> usize {
        self.snapshot().secrets.len()
    }

    /// Always false: a keyring holds at least one secret.
    pub fn is_empty(&self) -> bool {
        self.snapshot().secrets.is_empty()
    }

    /// The credential of `principal`, derived from the current secret.
    pub fn credential(&self, principal: Principal) -> Credential {
        let key = derive(&self.snapshot().secrets[0], &principal);
        Credential { principal, key, ticket: None }
    }

    /// Whether `token` (a bearer token: the hex key of a credential, as [`Credential::token`] gives it) is a key
    /// `principal` may hold now; constant-time, every key compared.
    pub fn verify_token(&self, principal: &Principal, token: &str) -> bool {
        let mut given = Zeroizing::new([0u8; AUTH_LEN]);
        if hex::decode_to_slice(token.trim(), &mut given[..]).is_err() {
            return false;
        }
        self.keys(principal).iter().fold(false, |ok, (key, _)| subtle_eq(&given[..], &key[..]) | ok)
    }

    /// The keys `principal` may hold now, current first, each with its secret's id.
    fn keys(&self, principal: &Principal) -> Vec<(Key, SecretId)> {
        let set = self.snapshot();
        set.secrets.iter().zip(&set.ids).map(|(s, id)| (derive(s, principal), *id)).collect()
    }

    /// `id` if it names a valid secret, else the current secret's id.
    pub fn resolve(&self, id: Option<SecretId>) -> SecretId {
        let set = self.snapshot();
        id.filter(|id| set.ids.contains(id)).unwrap_or(set.ids[0])
    }

    /// The key of `principal` under the secret `id` names, else under the current secret (a peer whose secret
    /// was retired since it proved it has moved on, or is refused at its next hello anyway).
    pub(crate) fn key_of(&self, principal: &Principal, id: Option<SecretId>) -> Key {
        let set = self.snapshot();
        let at = id.and_then(|id| set.ids.iter().position(|i| *i == id)).unwrap_or(0);
        derive(&set.secrets[at], principal)
    }
}

impl KeySet {
    /// The secrets, current first (what a host's keys derive from, see `crate::host`).
    pub(crate) fn secrets(&self) -> &[Zeroizing<Vec<u8>>] {
        &self.secrets
    }
}

fn parse_secrets(text: &str) -> Result<Secrets, AuthConfigError> {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    if lines.is_empty() || lines.len() > MAX_SECRETS {
        return Err(AuthConfigError::SecretCount(lines.len()));
    }
    let mut secrets = Vec::with_capacity(lines.len());
    for s in lines {
        if s.len() < MIN_SECRET_LEN {
            return Err(AuthConfigError::ShortSecret(s.len()));
        }
        secrets.push(Zeroizing::new(s.as_bytes().to_vec()));
    }
    Ok(secrets)
}

/// Where a process's credential comes from: fixed, or derived from its keyring at each handshake (so a process
/// holding the secret follows a rotation on reload).
#[derive(Clone, Debug)]
pub enum CredentialSource {
    /// A credential given to the process.
    Fixed(Arc<Credential>),
    /// The credential of a principal, derived from the keyring's current secret.
    Derived(Arc<Keyring>, Principal),
    /// A host's current credential (`crate::host`).
    Host(Arc<crate::host::NodeKeys>),
}

impl CredentialSource {
    /// The credential to prove now.
    pub fn current(&self) -> Credential {
        match self {
            Self::Fixed(c) => Credential::clone(c),
            Self::Derived(ring, principal) => ring.credential(principal.clone()),
            Self::Host(keys) => keys.credential(),
        }
    }
}

impl From<Credential> for CredentialSource {
    fn from(c: Credential) -> Self {
        Self::Fixed(Arc::new(c))
    }
}

/// What the environment names: the file in `file_var`, else the text of `text_var`, else nothing (an empty
/// variable counts as unset).
pub(crate) fn from_env<T>(
    file_var: &str,
    text_var: &str,
    load: impl FnOnce(&Path) -> Result<T, AuthConfigError>,
    parse: impl FnOnce(&str) -> Result<T, AuthConfigError>,
) -> Result<Option<T>, AuthConfigError> {
    if let Some(path) = std::env::var_os(file_var).filter(|p| !p.is_empty()) {
        return load(Path::new(&path)).map(Some);
    }
    match std::env::var(text_var) {
        Ok(s) if !s.is_empty() => parse(&s).map(Some),
        _ => Ok(None),
    }
}

/// Reads a secret or credential file, refusing (on Unix) one that others may read: a secret readable by every
/// local user is no secret.
pub(crate) fn read_secret_file(path: &Path) -> Result<String, AuthConfigError> {
    let err = |why| AuthConfigError::Read { path: path.to_owned(), why };
    let meta = std::fs::metadata(path).map_err(err)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            let detail = format!("mode {:o} lets others read it; chmod 600 it", meta.permissions().mode() & 0o777);
            return Err(err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, detail)));
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    std::fs::read_to_string(path).map_err(err)
}

pub(crate) fn derive(secret: &[u8], principal: &Principal) -> Key {
    let mut mac = mac_with(secret);
    mac.update(PRINCIPAL_LABEL);
    mac.update(principal.to_string().as_bytes());
    Zeroizing::new(mac.finalize().into_bytes().into())
}

/// `HMAC(secret, label)`: a key for one purpose, so no derived key can stand in for another.
pub(crate) fn derive_raw(secret: &[u8], label: &[u8]) -> Key {
    Zeroizing::new(mac_with(secret).chain_update(label).finalize().into_bytes().into())
}

pub(crate) fn mac_with(key: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of every length, so the error arm is never taken; it stays total without a panic path.
    <HmacSha256 as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| <HmacSha256 as hmac::digest::KeyInit>::new(&Default::default()))
}

/// What a client proves itself with: a principal and its key. A ticket (`crate::host`) is a credential too: the
/// session key one host derives for this principal and client, until the ticket's expiry.
#[derive(Clone)]
pub struct Credential {
    principal: Principal,
    key: Key,
    /// For a ticket, its expiry (Unix ms), which the hello names so the host derives the same key.
    ticket: Option<u64>,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credential({}, key redacted)", self.principal)
    }
}

impl Credential {
    /// Parses `PRINCIPAL:KEYHEX` (the form `crescent credential` prints).
    pub fn parse(text: &str) -> Result<Self, AuthConfigError> {
        let bad = |why: &str| AuthConfigError::Credential(why.to_owned());
        let (principal, hex_key) = text.trim().rsplit_once(':').ok_or_else(|| bad("expected PRINCIPAL:KEYHEX"))?;
        let principal: Principal = principal.parse().map_err(|e| AuthConfigError::Credential(format!("{e}")))?;
        let mut key = Zeroizing::new([0u8; AUTH_LEN]);
        hex::decode_to_slice(hex_key, &mut key[..])
            .map_err(|_| bad("the key must be 64 hexadecimal digits (as `crescent credential` prints it)"))?;
        Ok(Self { principal, key, ticket: None })
    }

    /// The credential in a file.
    pub fn load(path: &Path) -> Result<Self, AuthConfigError> {
        Self::parse(&read_secret_file(path)?)
    }

    /// The credential the environment names: [`CREDENTIAL_FILE_ENV`], else [`CREDENTIAL_ENV`], else none.
    pub fn from_env() -> Result<Option<Self>, AuthConfigError> {
        from_env(CREDENTIAL_FILE_ENV, CREDENTIAL_ENV, Self::load, Self::parse)
    }

    /// A credential of `principal` with `key` (for a ticket, with its expiry).
    pub(crate) fn with_key(principal: Principal, key: Key, ticket: Option<u64>) -> Self {
        Self { principal, key, ticket }
    }

    /// Who this credential speaks for.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// For a ticket, when it expires (Unix ms); `None` for a credential.
    pub fn ticket_expires_ms(&self) -> Option<u64> {
        self.ticket
    }

    /// The key itself (for deriving from it within this crate).
    pub(crate) fn key(&self) -> &[u8; AUTH_LEN] {
        &self.key
    }

    /// The `PRINCIPAL:KEYHEX` text (secret: for the operator who hands it out, never for logs).
    pub fn to_text(&self) -> Zeroizing<String> {
        Zeroizing::new(format!("{}:{}", self.principal, hex::encode(&self.key[..])))
    }

    /// The bearer token form of the key (hex), for HTTP clients of the admin API.
    pub fn token(&self) -> Zeroizing<String> {
        Zeroizing::new(hex::encode(&self.key[..]))
    }

    /// The client's proof for a handshake.
    pub fn client_mac(&self, transcript: &[u8; AUTH_LEN]) -> [u8; AUTH_LEN] {
        mac_of(&self.key, CLIENT_LABEL, transcript)
    }

    /// Whether `mac` is the server's proof for a handshake, in constant time.
    pub fn verify_server(&self, transcript: &[u8; AUTH_LEN], mac: &[u8; AUTH_LEN]) -> bool {
        verify(&self.key, SERVER_LABEL, transcript, mac)
    }
}

/// Constant-time equality of two byte strings of the same length (HMAC comparison of the inputs, as `hmac`
/// does for its own tags).
fn subtle_eq(a: &[u8], b: &[u8]) -> bool {
    let mut m = mac_with(b"crescent/compare");
    m.update(a);
    m.verify_slice(&mac_with(b"crescent/compare").chain_update(b).finalize().into_bytes()).is_ok()
}

fn mac_of(key: &[u8; AUTH_LEN], label: &[u8], transcript: &[u8; AUTH_LEN]) -> [u8; AUTH_LEN] {
    mac_with(key).chain_update(label).chain_update(transcript).finalize().into_bytes().into()
}

fn verify(key: &[u8; AUTH_LEN], label: &[u8], transcript: &[u8; AUTH_LEN], mac: &[u8; AUTH_LEN]) -> bool {
    mac_with(key).chain_update(label).chain_update(transcript).verify_slice(mac).is_ok()
}

/// Which kind of server a handshake is with. Bound into the transcript, so a hello and its proof made for one
/// kind are worthless at the other: a storage node (or anything posing as one at an address a client was sent
/// to) cannot relay a client's handshake to the master and inherit the client's session there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// The master's RPC.
    Control,
    /// A storage node's data plane.
    Data,
}

impl Plane {
    fn label(self) -> &'static [u8] {
        match self {
            Self::Control => b"crescent/plane/control\0",
            Self::Data => b"crescent/plane/data\0",
        }
    }
}

/// What both sides MAC: the kind of server, the hello as sent (its encoded frame) and the server's nonce.
pub fn transcript(plane: Plane, hello_frame: &[u8], server_nonce: &[u8; AUTH_LEN]) -> [u8; AUTH_LEN] {
    Sha256::new().chain_update(plane.label()).chain_update(hello_frame).chain_update(server_nonce).finalize().into()
}

/// A fresh random nonce from the operating system.
pub fn nonce() -> std::io::Result<[u8; AUTH_LEN]> {
    let mut n = [0u8; AUTH_LEN];
    getrandom::fill(&mut n).map_err(|e| std::io::Error::other(format!("no randomness: {e}")))?;
    Ok(n)
}

/// The server's check of a client's proof: the principal's key (current secret, else the other) whose MAC
/// matches, returned to sign the server's own proof with, and the id of the secret it derives from.
pub fn verify_client(
    ring: &Keyring,
    principal: &Principal,
    transcript: &[u8; AUTH_LEN],
    mac: &[u8; AUTH_LEN],
) -> Option<(ServerProof, SecretId)> {
    let keys = ring.keys(principal);
    let found = first_match(keys.iter().map(|(k, _)| k), transcript, mac)?;
    Some((found.0, keys[found.1].1))
}

/// The first of `keys` under which `mac` is the client's proof, as the server's proof and its position. Every
/// key is tried, matched or not, so the time taken does not tell which one matched.
pub(crate) fn first_match<'a>(
    keys: impl Iterator<Item = &'a Key>,
    transcript: &[u8; AUTH_LEN],
    mac: &[u8; AUTH_LEN],
) -> Option<(ServerProof, usize)> {
    let mut found = None;
    for (i, key) in keys.enumerate() {
        if verify(key, CLIENT_LABEL, transcript, mac) && found.is_none() {
            found = Some((ServerProof(mac_of(key, SERVER_LABEL, transcript)), i));
        }
    }
    found
}

/// The server's proof for a handshake whose client proved itself.
pub struct ServerProof(pub [u8; AUTH_LEN]);

/// Why a peer was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthFailure {
    /// The peer did not try to authenticate.
    #[error(
        "this cluster requires authentication: give the client a credential ({CREDENTIAL_ENV} or {CREDENTIAL_FILE_ENV})"
    )]
    Missing,
    /// It named no principal this cluster knows.
    #[error("unknown principal: {0}")]
    BadPrincipal(String),
    /// Its proof was wrong: a wrong or revoked key.
    #[error("authentication failed for {0}: wrong or revoked credential")]
    BadProof(Principal),
    /// A storage node's peer proved no ticket, or a credential where a ticket belongs (or the reverse).
    #[error("{0}")]
    WrongProof(&'static str),
    /// Its ticket has expired (the client fetches another from the master).
    #[error("the data-plane ticket of {0} has expired")]
    TicketExpired(Principal),
    /// It did not get through the TLS handshake (no TLS, no or a wrong client certificate).
    #[error("{0}")]
    Tls(String),
    /// Its hello named a client id another principal holds (the master's client claims).
    #[error("{principal} named client id {client}, which {holder} holds")]
    ClientIdHeld {
        /// Who named it.
        principal: Principal,
        /// The id.
        client: crescent_proto::ClientId,
        /// Who holds it.
        holder: Principal,
    },
}

/// Failed authentications: counted (for `/metrics`) and logged at most once a second with the count of those
/// not logged.
#[derive(Debug)]
pub struct AuthFailures {
    total: AtomicU64,
    unlogged: AtomicU64,
    last_log: gate::Slot,
}

impl Default for AuthFailures {
    fn default() -> Self {
        Self { total: AtomicU64::new(0), unlogged: AtomicU64::new(0), last_log: gate::Slot::new() }
    }
}

impl AuthFailures {
    /// How often at most a failure is logged.
    pub const LOG_EVERY: Duration = Duration::from_secs(1);

    /// Counts a failure and logs it unless one was logged within [`Self::LOG_EVERY`].
    pub fn record(&self, server: &str, peer: Option<SocketAddr>, why: &AuthFailure) {
        self.total.fetch_add(1, Ordering::Relaxed);
        if self.last_log.claim(Self::LOG_EVERY) {
            let suppressed = self.unlogged.swap(0, Ordering::Relaxed);
            tracing::warn!(server, ?peer, suppressed, "refused a peer: {why}");
        } else {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Failures since start.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// A lock-free "at most once per interval" gate.
mod gate {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    /// The last time the gate opened, as nanoseconds since a process-wide origin (0: never).
    #[derive(Debug)]
    pub struct Slot(AtomicU64);

    fn origin() -> Instant {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        *ORIGIN.get_or_init(Instant::now)
    }

    impl Slot {
        pub fn new() -> Self {
            Self(AtomicU64::new(0))
        }

        /// Whether the caller may act now: true at most once per `every`.
        pub fn claim(&self, every: Duration) -> bool {
            let now = (origin().elapsed().as_nanos() as u64).max(1);
            let last = self.0.load(Ordering::Relaxed);
            if last != 0 && now.saturating_sub(last) < every.as_nanos() as u64 {
                return false;
            }
            self.0.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crescent_proto::TenantId;

    const S1: &str = "0123456789abcdef-first";
    const S2: &str = "0123456789abcdef-second";

    fn tenant(t: &str) -> Principal {
        Principal::Tenant(TenantId::new(t).unwrap())
    }

    #[test]
    fn credentials_derive_per_principal_and_round_trip_through_text() {
        let ring = Keyring::parse(S1).unwrap();
        let a = ring.credential(tenant("a"));
        let b = ring.credential(tenant("b"));
        assert_ne!(a.to_text(), b.to_text(), "each principal has its own key");
        let back = Credential::parse(&a.to_text()).unwrap();
        assert_eq!(back.to_text(), a.to_text());
        assert_eq!(back.principal(), &tenant("a"));
        assert!(ring.verify_token(&tenant("a"), &a.token()));
        assert!(!ring.verify_token(&tenant("a"), &b.token()), "b's key is not a's");
        assert!(!ring.verify_token(&tenant("a"), "zz"));
        assert!(!format!("{a:?}{ring:?}").contains(&*a.token()), "Debug never shows a key");
        assert!(!format!("{ring:?}").contains(S1));
    }

    #[test]
    fn bad_secrets_and_credentials_are_refused_with_a_reason() {
        assert!(matches!(Keyring::parse("short"), Err(AuthConfigError::ShortSecret(5))));
        assert!(matches!(Keyring::parse("# only a comment\n\n"), Err(AuthConfigError::SecretCount(0))));
        let three = format!("{S1}\n{S2}\n{S1}x");
        assert!(matches!(Keyring::parse(&three), Err(AuthConfigError::SecretCount(3))));
        for bad in ["admin", "admin:12", "root:00", &format!("tenant:_x:{}", "0".repeat(64))] {
            assert!(Credential::parse(bad).is_err(), "{bad}");
        }
        assert!(Credential::parse(&format!("tenant:a:{}", "0".repeat(64))).is_ok(), "a tenant's ':' is fine");
    }

    #[test]
    fn a_proof_verifies_under_either_secret_of_a_rotation_and_nothing_else() {
        let old = Keyring::parse(S1).unwrap();
        let rotating = Keyring::parse(&format!("{S2}\n{S1}")).unwrap();
        let new = Keyring::parse(S2).unwrap();
        let t = transcript(Plane::Control, b"hello", &[7; AUTH_LEN]);
        let cred = old.credential(Principal::Node(None));
        let mac = cred.client_mac(&t);
        let (proof, id) =
            verify_client(&rotating, &Principal::Node(None), &t, &mac).expect("the old secret is still valid");
        assert!(cred.verify_server(&t, &proof.0), "the server proves itself with the key that matched");
        assert_eq!(id, SecretId::of(S1.as_bytes()), "and names the secret it matched");
        assert_ne!(id, SecretId::of(S2.as_bytes()));
        assert!(verify_client(&new, &Principal::Node(None), &t, &mac).is_none(), "retired: refused");
        assert!(verify_client(&old, &Principal::Admin, &t, &mac).is_none(), "bound to its principal");
        let other = transcript(Plane::Control, b"hello", &[8; AUTH_LEN]);
        assert!(verify_client(&old, &Principal::Node(None), &other, &mac).is_none(), "bound to the server's nonce");
        assert!(!cred.verify_server(&t, &mac), "a client's MAC is not a server's proof");
    }

    #[test]
    fn secret_files_others_can_read_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, S1).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Keyring::load(&path).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Keyring::load(&path).unwrap().len(), 1);
    }

    #[test]
    fn failures_are_counted_every_time_and_logged_at_a_rate() {
        let f = AuthFailures::default();
        for _ in 0..5 {
            f.record("test", None, &AuthFailure::Missing);
        }
        assert_eq!(f.total(), 5);
        assert_eq!(f.unlogged.load(Ordering::Relaxed), 4, "one logged, four held back");
    }
}
