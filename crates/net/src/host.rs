//! What a host of segments (a storage node, or a client hosting memory) holds instead of the cluster secret:
//! keys derived from its own credential, so a host that is broken into yields its own keys and nothing else.
//!
//! From a host's credential key `K` (`HMAC(secret, principal)`, see `crate::auth`):
//! * its **grant key** `HMAC(K, "crescent/grant/v1")` seals the grants for its segments (`crate::grant`);
//! * its **ticket key** `HMAC(K, "crescent/ticket/v1")` derives, for each ticket, the **session key**
//!   `HMAC(ticket key, client principal ‖ 0 ‖ client id ‖ expiry)` that a client's lanes to the host prove in their
//!   hello instead of the client's own credential.
//!
//! The master derives `K` of any principal from the secret, so it seals grants and issues tickets for every
//! host; a host derives only its own. A client gets a ticket from the master over its authenticated control
//! connection ([`Keyring::issue_ticket`]): the session key XOR `HMAC(client key, "crescent/ticket-wrap/v1" ‖
//! nonce ‖ host ‖ client id ‖ expiry)`, which only the client can open ([`Credential::open_ticket`]) — Kerberos'
//! shape with HMACs only. Hosts that share a credential share these keys: give each node its own principal
//! (`node:NAME`) to keep nodes from each other.
//!
//! During a rotation a host holds two credentials (a credential file of two lines, current first) and accepts
//! grants and tickets under either; a reload keeps the keys it drops for [`GRANT_GRACE`] so transfers sealed a
//! moment earlier finish. The master seals with the key of the secret the host last proved to it.

use crate::auth::{self, AuthConfigError, AuthFailure, Credential, GRANT_GRACE, Key, Keyring, SecretId, ServerProof};
use crate::grant::{self, Bearer, GrantOp, GrantRefusal};
use crescent_proto::auth::{SealedTicket, TICKET_LEN};
use crescent_proto::transfer::{Grant, GrantRange};
use crescent_proto::wire::AUTH_LEN;
use crescent_proto::{ClientId, Principal, SegmentId};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

type HmacSha256 = Hmac<Sha256>;

const GRANT_LABEL: &[u8] = b"crescent/grant/v1\0";
const TICKET_LABEL: &[u8] = b"crescent/ticket/v1\0";
const WRAP_LABEL: &[u8] = b"crescent/ticket-wrap/v1\0";

/// How long a ticket the master issues lasts.
pub const TICKET_TTL: Duration = Duration::from_secs(3600);

/// One host's grant and ticket keys, as keyed HMAC states (cloned per use: a check costs the message's
/// compressions only).
#[derive(Clone)]
pub struct HostKeys {
    grant: HmacSha256,
    ticket: HmacSha256,
}

impl fmt::Debug for HostKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HostKeys(redacted)")
    }
}

impl HostKeys {
    fn from_key(key: &[u8; AUTH_LEN]) -> Self {
        Self {
            grant: auth::mac_with(&auth::derive_raw(key, GRANT_LABEL)[..]),
            ticket: auth::mac_with(&auth::derive_raw(key, TICKET_LABEL)[..]),
        }
    }

    /// The keys of the host that holds `credential`.
    pub fn of(credential: &Credential) -> Self {
        Self::from_key(credential.key())
    }

    /// Seals a grant for `bearer` to perform `op` on any of `ranges` of `segment` (one of this host's) until
    /// `expires_ms` (Unix ms), of no master term (epoch 0).
    pub fn seal_grant(
        &self,
        op: GrantOp,
        segment: &SegmentId,
        bearer: &Bearer,
        ranges: Vec<GrantRange>,
        expires_ms: u64,
    ) -> Grant {
        grant::seal(&self.grant, op, segment, bearer, ranges, expires_ms, 0)
    }

    /// Seals a grant of the master term `epoch` that lasts `ttl` from now, less the clock-skew slack (at most
    /// half of `ttl`).
    pub fn seal_grant_for(
        &self,
        op: GrantOp,
        segment: &SegmentId,
        bearer: &Bearer,
        ranges: Vec<GrantRange>,
        ttl: Duration,
        epoch: u64,
    ) -> Grant {
        grant::seal(&self.grant, op, segment, bearer, ranges, grant::expiry_for(ttl), epoch)
    }

    /// The session key of a ticket for `client` (principal and id) expiring at `expires_ms`.
    fn session_key(&self, client: &Principal, client_id: ClientId, expires_ms: u64) -> Key {
        let mut mac = self.ticket.clone();
        mac.update(client.to_string().as_bytes());
        mac.update(&[0]);
        mac.update(client_id.0.as_bytes());
        mac.update(&expires_ms.to_be_bytes());
        Zeroizing::new(mac.finalize().into_bytes().into())
    }

    /// The ticket of `client` to this host, as a credential its lanes prove (for a process that holds the
    /// secret and needs no sealing: the master's own probes).
    pub fn ticket(&self, client: &Principal, client_id: ClientId, expires_ms: u64) -> Credential {
        let key = self.session_key(client, client_id, expires_ms);
        Credential::with_key(client.clone(), key, Some(expires_ms))
    }
}

/// The pad a ticket's session key travels under: only the holder of the client's key derives it.
fn pad(client_key: &[u8; AUTH_LEN], nonce: &[u8; TICKET_LEN], host: &str, client_id: ClientId, expires_ms: u64) -> Key {
    let mut mac = auth::mac_with(client_key);
    mac.update(WRAP_LABEL);
    mac.update(nonce);
    mac.update(host.as_bytes());
    mac.update(&[0]);
    mac.update(client_id.0.as_bytes());
    mac.update(&expires_ms.to_be_bytes());
    Zeroizing::new(mac.finalize().into_bytes().into())
}

fn xor(a: &[u8; AUTH_LEN], b: &[u8; AUTH_LEN]) -> [u8; AUTH_LEN] {
    std::array::from_fn(|i| a[i] ^ b[i])
}

impl Keyring {
    /// The keys of the host whose credential is `host`'s under the secret `secret` names (else the current
    /// one): what the master seals that host's grants and issues its tickets with.
    pub fn host_keys(&self, host: &Principal, secret: Option<SecretId>) -> HostKeys {
        HostKeys::from_key(&self.key_of(host, secret))
    }

    /// A ticket for `client` (the principal its control connection proved, under `client_secret`, and its
    /// client id) to the host `host` holding `keys`, lasting [`TICKET_TTL`], sealed so only that client opens it.
    pub fn issue_ticket(
        &self,
        host: &Principal,
        keys: &HostKeys,
        client: &Principal,
        client_secret: Option<SecretId>,
        client_id: ClientId,
    ) -> std::io::Result<SealedTicket> {
        let expires_ms = grant::expiry_for(TICKET_TTL);
        let nonce = auth::nonce()?;
        let host = host.to_string();
        let session = keys.session_key(client, client_id, expires_ms);
        let pad = pad(&self.key_of(client, client_secret), &nonce, &host, client_id, expires_ms);
        Ok(SealedTicket { host, expires_ms, nonce, sealed: xor(&session, &pad) })
    }
}

impl Credential {
    /// Opens a ticket the master sealed for this credential and `client_id`: the credential the client's lanes
    /// to that host prove. A ticket sealed for another credential opens to a key no host accepts.
    pub fn open_ticket(&self, ticket: &SealedTicket, client_id: ClientId) -> Credential {
        let pad = pad(self.key(), &ticket.nonce, &ticket.host, client_id, ticket.expires_ms);
        let key = Zeroizing::new(xor(&ticket.sealed, &pad));
        Credential::with_key(self.principal().clone(), key, Some(ticket.expires_ms))
    }
}

/// A host's keys, reloadable in place: from a credential (or a file of one or two, current first), or derived
/// from a keyring for a process that holds the secret anyway (`crescent up`, tests).
pub struct NodeKeys {
    source: Source,
    state: RwLock<Arc<KeyState>>,
    /// The newest master term among the grants honoured so far: older terms' grants are refused.
    epoch: AtomicU64,
}

enum Source {
    /// Given once; never changes.
    Fixed,
    /// A credential file, read again by [`NodeKeys::reload`].
    File(PathBuf),
    /// Derived from a keyring's secrets, following its reloads.
    Ring(Arc<Keyring>, Principal),
}

struct KeyState {
    /// The credentials, current first (1, or 2 during a rotation); all of one principal.
    credentials: Vec<Credential>,
    /// Their keys, same order.
    keys: Vec<HostKeys>,
    /// Keys a reload dropped, still accepted until the instant given ([`GRANT_GRACE`]).
    retired: Vec<(HostKeys, Instant)>,
    /// For a keyring source, the key set these derive from (a reload of the ring makes a new one).
    derived_from: Option<Arc<auth::KeySet>>,
}

impl KeyState {
    fn new(credentials: Vec<Credential>) -> Self {
        let keys = credentials.iter().map(HostKeys::of).collect();
        Self { credentials, keys, retired: Vec::new(), derived_from: None }
    }

    /// The state after a reload to `fresh`: keys no longer listed stay accepted for `grace`.
    fn reloaded(&self, fresh: Vec<Credential>, grace: Duration) -> Self {
        let now = Instant::now();
        let mut next = Self::new(fresh);
        let gone = self.credentials.iter().filter(|c| !next.credentials.iter().any(|n| n.key() == c.key()));
        let gone: Vec<_> = gone.map(|c| (HostKeys::of(c), now + grace)).collect();
        let still = self.retired.iter().filter(|(_, until)| *until > now).cloned();
        next.retired = gone.into_iter().chain(still).collect();
        next
    }

    /// Every key that verifies now: the listed ones, then retired ones still in their grace.
    fn verifying(&self) -> impl Iterator<Item = &HostKeys> {
        let now = Instant::now();
        self.keys.iter().chain(self.retired.iter().filter(move |(_, until)| *until > now).map(|(k, _)| k))
    }
}

impl fmt::Debug for NodeKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeKeys({}, keys redacted)", self.principal())
    }
}

impl NodeKeys {
    /// Keys from `source`, holding `state` now; no master term seen yet.
    fn with(source: Source, state: KeyState) -> Self {
        Self { source, state: RwLock::new(Arc::new(state)), epoch: AtomicU64::new(0) }
    }

    /// The keys of one credential.
    pub fn fixed(credential: Credential) -> Self {
        Self::with(Source::Fixed, KeyState::new(vec![credential]))
    }

    /// The keys of the credentials in `text`: one `PRINCIPAL:KEYHEX` per line (blank lines and `#` comments
    /// skipped), 1 or 2, all of one principal, the first current.
    pub fn parse(text: &str) -> Result<Self, AuthConfigError> {
        Ok(Self::with(Source::Fixed, KeyState::new(parse_credentials(text)?)))
    }

    /// The keys of the credentials in a file (which [`NodeKeys::reload`] reads again).
    pub fn load(path: &Path) -> Result<Self, AuthConfigError> {
        let credentials = parse_credentials(&auth::read_secret_file(path)?)?;
        Ok(Self::with(Source::File(path.to_owned()), KeyState::new(credentials)))
    }

    /// The keys of `principal` derived from `ring` (one per secret), following the ring's reloads: for a
    /// process that holds the secret anyway.
    pub fn derived(ring: Arc<Keyring>, principal: Principal) -> Self {
        let state = Self::derive(&ring, &principal, None);
        Self::with(Source::Ring(ring, principal), state)
    }

    fn derive(ring: &Keyring, principal: &Principal, previous: Option<&KeyState>) -> KeyState {
        let set = ring.snapshot();
        let credentials = set
            .secrets()
            .iter()
            .map(|s| Credential::with_key(principal.clone(), auth::derive(s, principal), None))
            .collect();
        let mut state = match previous {
            Some(p) => p.reloaded(credentials, GRANT_GRACE),
            None => KeyState::new(credentials),
        };
        state.derived_from = Some(set);
        state
    }

    /// The keys of the credential the environment names (`CRESCENT_CREDENTIAL_FILE`, else
    /// `CRESCENT_CREDENTIAL`), if any.
    pub fn from_env() -> Result<Option<Self>, AuthConfigError> {
        auth::from_env(auth::CREDENTIAL_FILE_ENV, auth::CREDENTIAL_ENV, Self::load, Self::parse)
    }

    /// The keys of the host credential the environment names ([`auth::HOST_CREDENTIAL_FILE_ENV`], else
    /// [`auth::HOST_CREDENTIAL_ENV`]), else none: what a process that is a client too hosts memory with, when
    /// its hosting should not share its client credential's keys.
    pub fn host_from_env() -> Result<Option<Self>, AuthConfigError> {
        auth::from_env(auth::HOST_CREDENTIAL_FILE_ENV, auth::HOST_CREDENTIAL_ENV, Self::load, Self::parse)
    }

    /// The keys of this moment (for a keyring source, re-derived when the ring was reloaded).
    fn state(&self) -> Arc<KeyState> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner).clone();
        let Source::Ring(ring, principal) = &self.source else { return state };
        let current = ring.snapshot();
        if state.derived_from.as_ref().is_some_and(|d| Arc::ptr_eq(d, &current)) {
            return state;
        }
        let mut guard = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if !guard.derived_from.as_ref().is_some_and(|d| Arc::ptr_eq(d, &current)) {
            *guard = Arc::new(Self::derive(ring, principal, Some(&guard)));
        }
        guard.clone()
    }

    /// Reads the credential file again (a keyring source follows its ring by itself); the keys it drops stay
    /// accepted for [`GRANT_GRACE`]. Returns how many credentials are valid now.
    pub fn reload(&self) -> Result<usize, AuthConfigError> {
        match &self.source {
            Source::File(path) => self.replace(parse_credentials(&auth::read_secret_file(path)?)?, GRANT_GRACE),
            Source::Ring(..) => Ok(self.state().credentials.len()),
            Source::Fixed => Err(AuthConfigError::NoFile),
        }
    }

    /// Makes `text`'s credentials the valid ones, as a reload of a file holding it would; the keys it drops stay
    /// accepted for `grace`.
    pub fn replace_with(&self, text: &str, grace: Duration) -> Result<usize, AuthConfigError> {
        self.replace(parse_credentials(text)?, grace)
    }

    fn replace(&self, fresh: Vec<Credential>, grace: Duration) -> Result<usize, AuthConfigError> {
        let n = fresh.len();
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if fresh[0].principal() != state.credentials[0].principal() {
            return Err(AuthConfigError::Credential(format!(
                "a reload may not change the host's principal ({} to {})",
                state.credentials[0].principal(),
                fresh[0].principal()
            )));
        }
        *state = Arc::new(state.reloaded(fresh, grace));
        Ok(n)
    }

    /// The host's principal.
    pub fn principal(&self) -> Principal {
        self.state().credentials[0].principal().clone()
    }

    /// The credential the host proves to the master now.
    pub fn credential(&self) -> Credential {
        self.state().credentials[0].clone()
    }

    /// Whether `grant` lets `bearer` perform `op` on `segment` at `now_ms` (see `crate::grant`; which range a
    /// request may touch is [`HeldGrants`](crate::grant::HeldGrants)' check); every valid key is tried. A valid
    /// grant of a master term older than the newest this host has honoured is refused as expired (the client
    /// asks the current master again).
    pub fn verify_grant(
        &self,
        op: GrantOp,
        segment: &SegmentId,
        bearer: &Bearer,
        grant: &Grant,
        now_ms: u64,
    ) -> Result<(), GrantRefusal> {
        let state = self.state();
        grant::verify(state.verifying().map(|k| &k.grant), op, segment, bearer, grant, now_ms)?;
        // Only a grant whose tag checked raises the term: a peer cannot make one up.
        if grant.epoch < self.epoch.fetch_max(grant.epoch, Ordering::Relaxed) {
            return Err(GrantRefusal::Expired);
        }
        Ok(())
    }

    /// Whether a grant of the master term `epoch` is still honoured: no newer term's grant has been.
    pub fn honours_term(&self, epoch: u64) -> bool {
        epoch >= self.epoch.load(Ordering::Relaxed)
    }

    /// The host's check of a lane's hello: `mac` proves the session key of a ticket for `client` (principal and
    /// id) expiring at `expires_ms`, under one of this host's keys, and the ticket has not expired at `now_ms`.
    pub(crate) fn verify_ticket(
        &self,
        client: &Principal,
        client_id: ClientId,
        expires_ms: u64,
        transcript: &[u8; AUTH_LEN],
        mac: &[u8; AUTH_LEN],
        now_ms: u64,
    ) -> Result<ServerProof, AuthFailure> {
        let state = self.state();
        let sessions: Vec<Key> = state.verifying().map(|k| k.session_key(client, client_id, expires_ms)).collect();
        let (proof, _) =
            auth::first_match(sessions.iter(), transcript, mac).ok_or_else(|| AuthFailure::BadProof(client.clone()))?;
        // Checked after the MAC, so an expiry a peer made up is never reported as an expiry.
        if now_ms >= expires_ms {
            return Err(AuthFailure::TicketExpired(client.clone()));
        }
        Ok(proof)
    }
}

fn parse_credentials(text: &str) -> Result<Vec<Credential>, AuthConfigError> {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    if lines.is_empty() || lines.len() > auth::MAX_SECRETS {
        return Err(AuthConfigError::Credential(format!(
            "a credential file holds 1 or {} credentials, one per line (found {})",
            auth::MAX_SECRETS,
            lines.len()
        )));
    }
    let credentials = lines.into_iter().map(Credential::parse).collect::<Result<Vec<_>, _>>()?;
    if credentials.iter().any(|c| c.principal() != credentials[0].principal()) {
        return Err(AuthConfigError::Credential("the credentials of a file must be of one principal".into()));
    }
    Ok(credentials)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grant of `[0, length)` of `seg` under `keys` that never expires.
    fn sealed(keys: &HostKeys, op: GrantOp, seg: &SegmentId, bearer: &Bearer, length: u64) -> Grant {
        keys.seal_grant(op, seg, bearer, vec![GrantRange { offset: 0, length }], u64::MAX)
    }

    fn first_8() -> Vec<GrantRange> {
        vec![GrantRange { offset: 0, length: 8 }]
    }
    use crate::auth::{Plane, transcript};

    const S1: &str = "0123456789abcdef-first";
    const S2: &str = "0123456789abcdef-second";

    fn node(name: &str) -> Principal {
        name.parse().unwrap()
    }

    #[test]
    fn a_host_checks_the_grants_the_master_seals_for_it_and_no_other_hosts() {
        let ring = Keyring::parse(S1).unwrap();
        let (seg, bearer) = (SegmentId::random(), Bearer::new(node("tenant:a"), Some(ClientId::random())));
        let a = NodeKeys::fixed(ring.credential(node("node:a")));
        let for_a = sealed(&ring.host_keys(&node("node:a"), None), GrantOp::Write, &seg, &bearer, 64);
        assert_eq!(a.verify_grant(GrantOp::Write, &seg, &bearer, &for_a, 0), Ok(()));
        // Every other host (another named node, the shared `node` credential, a tenant's store) refuses it, and a
        // host forging with its own keys is refused by `a`.
        for other in ["node:b", "node", "tenant:b"] {
            let b = NodeKeys::fixed(ring.credential(node(other)));
            let refused = b.verify_grant(GrantOp::Write, &seg, &bearer, &for_a, 0);
            assert_eq!(refused, Err(GrantRefusal::Invalid), "{other}");
            let forged = sealed(&HostKeys::of(&b.credential()), GrantOp::Write, &seg, &bearer, 64);
            let refused = a.verify_grant(GrantOp::Write, &seg, &bearer, &forged, 0);
            assert_eq!(refused, Err(GrantRefusal::Invalid), "forged by {other}");
        }
    }

    #[test]
    fn a_ticket_opens_only_for_its_client_and_proves_only_to_its_host() {
        let ring = Keyring::parse(S1).unwrap();
        let (client, id) = (ring.credential(node("tenant:a")), ClientId::random());
        let host = NodeKeys::fixed(ring.credential(node("node")));
        let keys = ring.host_keys(&node("node"), None);
        let sealed = ring.issue_ticket(&node("node"), &keys, client.principal(), None, id).unwrap();
        assert_eq!(sealed.host, "node");
        let ticket = client.open_ticket(&sealed, id);
        let expires = ticket.ticket_expires_ms().unwrap();
        let t = transcript(Plane::Data, b"hello", &[3; AUTH_LEN]);
        let mac = ticket.client_mac(&t);
        let proof = host.verify_ticket(client.principal(), id, expires, &t, &mac, 0).unwrap();
        assert!(ticket.verify_server(&t, &proof.0), "the host proves it holds the ticket key");
        // Opened by another client (another key, or another id): a key the host refuses.
        let thief = ring.credential(node("tenant:b")).open_ticket(&sealed, id);
        let stolen = host.verify_ticket(client.principal(), id, expires, &t, &thief.client_mac(&t), 0);
        assert!(matches!(stolen, Err(AuthFailure::BadProof(_))));
        let other_id = client.open_ticket(&sealed, ClientId::random());
        assert!(host.verify_ticket(client.principal(), id, expires, &t, &other_id.client_mac(&t), 0).is_err());
        // The same ticket at another host, for another principal, with another expiry, or expired.
        for other in ["node:b", "tenant:b"] {
            let other_host = NodeKeys::fixed(ring.credential(node(other)));
            assert!(other_host.verify_ticket(client.principal(), id, expires, &t, &mac, 0).is_err(), "{other}");
        }
        assert!(host.verify_ticket(&node("admin"), id, expires, &t, &mac, 0).is_err());
        assert!(host.verify_ticket(client.principal(), id, expires + 1, &t, &mac, 0).is_err());
        let late = host.verify_ticket(client.principal(), id, expires, &t, &mac, expires);
        assert!(matches!(late, Err(AuthFailure::TicketExpired(_))), "{:?}", late.err());
        assert!(!format!("{host:?}{keys:?}").contains(&*client.token()));
    }

    #[test]
    fn the_master_seals_with_the_secret_a_host_proved_and_a_reload_keeps_dropped_keys_for_the_grace() {
        let rotating = Keyring::parse(&format!("{S2}\n{S1}")).unwrap();
        let old = Keyring::parse(S1).unwrap();
        let (seg, bearer) = (SegmentId::random(), Bearer::new(node("admin"), None));
        let host = NodeKeys::parse(&old.credential(node("node")).to_text()).unwrap();
        let proved = crate::auth::SecretId::of(S1.as_bytes());
        let g = sealed(&rotating.host_keys(&node("node"), Some(proved)), GrantOp::Read, &seg, &bearer, 8);
        assert_eq!(host.verify_grant(GrantOp::Read, &seg, &bearer, &g, 0), Ok(()));
        let current = sealed(&rotating.host_keys(&node("node"), None), GrantOp::Read, &seg, &bearer, 8);
        assert_eq!(host.verify_grant(GrantOp::Read, &seg, &bearer, &current, 0), Err(GrantRefusal::Invalid));
        // The host takes both credentials, then drops the old one: its grants hold for the grace only.
        let both = format!(
            "{}\n{}",
            rotating.credential(node("node")).to_text().as_str(),
            old.credential(node("node")).to_text().as_str()
        );
        assert_eq!(host.replace_with(&both, Duration::ZERO).unwrap(), 2);
        assert_eq!(host.verify_grant(GrantOp::Read, &seg, &bearer, &current, 0), Ok(()));
        let new_only = rotating.credential(node("node")).to_text();
        host.replace_with(&new_only, Duration::from_secs(30)).unwrap();
        assert_eq!(host.verify_grant(GrantOp::Read, &seg, &bearer, &g, 0), Ok(()), "within the grace");
        host.replace_with(&new_only, Duration::ZERO).unwrap();
        assert_eq!(host.verify_grant(GrantOp::Read, &seg, &bearer, &g, 0), Ok(()), "its own deadline");
        let fresh = NodeKeys::parse(&both).unwrap();
        fresh.replace_with(&new_only, Duration::ZERO).unwrap();
        assert_eq!(fresh.verify_grant(GrantOp::Read, &seg, &bearer, &g, 0), Err(GrantRefusal::Invalid));
        let other = old.credential(node("admin")).to_text();
        assert!(fresh.replace_with(&other, Duration::ZERO).is_err(), "a reload keeps the principal");
    }

    #[test]
    fn a_host_refuses_the_grants_of_a_master_term_older_than_one_it_honoured() {
        let ring = Keyring::parse(S1).unwrap();
        let (seg, bearer) = (SegmentId::random(), Bearer::new(node("tenant:a"), Some(ClientId::random())));
        let host = NodeKeys::fixed(ring.credential(node("node")));
        let master = ring.host_keys(&node("node"), None);
        let ttl = Duration::from_secs(60);
        let (old, new) = (1_000, 2_000);
        let check = |g: &Grant| host.verify_grant(GrantOp::Read, &seg, &bearer, g, grant::unix_ms());
        let g_old = master.seal_grant_for(GrantOp::Read, &seg, &bearer, first_8(), ttl, old);
        assert_eq!(check(&g_old), Ok(()), "the only term seen so far");
        // A forged newer term does not check, and does not move the host on.
        assert_eq!(check(&Grant { epoch: new + 1, ..g_old.clone() }), Err(GrantRefusal::Invalid));
        assert_eq!(check(&g_old), Ok(()));
        // The successor's first grant moves it on: the predecessor's live grants are refused from then on.
        let g_new = master.seal_grant_for(GrantOp::Read, &seg, &bearer, first_8(), ttl, new);
        assert_eq!(check(&g_new), Ok(()));
        assert_eq!(check(&g_old), Err(GrantRefusal::Expired));
        assert_eq!(check(&g_new), Ok(()));
    }

    #[test]
    fn keys_derived_from_a_keyring_follow_its_reloads() {
        let ring = Arc::new(Keyring::parse(S1).unwrap());
        let host = NodeKeys::derived(ring.clone(), node("node"));
        let (seg, bearer) = (SegmentId::random(), Bearer::new(node("admin"), None));
        assert_eq!(host.credential().to_text(), ring.credential(node("node")).to_text());
        ring.replace_with(S2).unwrap();
        assert_eq!(host.credential().to_text(), ring.credential(node("node")).to_text());
        let g = sealed(&ring.host_keys(&node("node"), None), GrantOp::Read, &seg, &bearer, 8);
        assert_eq!(host.verify_grant(GrantOp::Read, &seg, &bearer, &g, 0), Ok(()));
    }

    #[test]
    fn credential_files_hold_one_or_two_of_one_principal() {
        let ring = Keyring::parse(S1).unwrap();
        let a = ring.credential(node("node")).to_text();
        let b = ring.credential(node("admin")).to_text();
        assert!(NodeKeys::parse(&format!("# a node\n{}\n", a.as_str())).is_ok());
        assert!(NodeKeys::parse(&format!("{}\n{}", a.as_str(), b.as_str())).is_err());
        assert!(NodeKeys::parse(&format!("{0}\n{0}\n{0}", a.as_str())).is_err());
        assert!(NodeKeys::parse("").is_err());
    }
}
