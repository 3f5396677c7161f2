//! Data-plane grants: the capabilities a master seals and storage nodes check.
//!
//! Authentication says who a peer is; a grant says which bytes it may touch. For every put the master seals a
//! write grant for each replica range it allocated, and for every get a read grant for each range the lease
//! covers: `(operation, segment, offset, length, expiry, bearer)` under `HMAC-SHA256(grant key, …)`, truncated
//! to 128 bits. The grant key is the segment's host's own (`crate::host`: derived from the host's credential,
//! which the master derives from the cluster secret), so the master and the host share it without a message,
//! no host can seal grants for another's segments, and checking a grant costs one HMAC on the node (no round
//! trip to the master). A node moves bytes only for a
//! request whose range lies inside its grant's, on a connection whose hello proved the grant's bearer (the same
//! principal and client id), before the grant expires. Expiry is wall-clock Unix milliseconds (master and nodes are assumed NTP-synchronised;
//! [`SKEW_MS`] of slack, at most half the grant's life, is subtracted from what the master promises).

use crescent_proto::transfer::{GRANT_TAG_LEN, Grant};
use crescent_proto::{ClientId, ErrorCode, Principal, SegmentId};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

type HmacSha256 = Hmac<Sha256>;

/// What a grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantOp {
    /// Reading the range (a get under a lease).
    Read,
    /// Writing the range (a put's allocated replica).
    Write,
}

impl GrantOp {
    fn byte(self) -> u8 {
        match self {
            Self::Read => b'r',
            Self::Write => b'w',
        }
    }
}

/// How much clock difference between master and nodes a grant tolerates: a grant lives this much shorter than
/// what it protects (a lease), and a master keeps freed space out of reuse this much longer than its write
/// grants live.
pub const SKEW_MS: u64 = 1000;

/// Why a node refused a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GrantRefusal {
    /// The request carried no grant.
    #[error("no grant: the master grants every transfer")]
    Missing,
    /// The grant has expired.
    #[error("the grant expired")]
    Expired,
    /// The request's range is not inside the grant's.
    #[error("the range is outside the grant")]
    OutOfRange,
    /// The tag does not match: forged, altered, for another segment, operation or client, or sealed with a
    /// retired key.
    #[error("the grant is not valid for this transfer")]
    Invalid,
}

impl GrantRefusal {
    /// The wire code: an expired grant can be fetched again, the others are refusals.
    pub fn code(self) -> ErrorCode {
        match self {
            Self::Expired => ErrorCode::GrantExpired,
            Self::Missing | Self::OutOfRange | Self::Invalid => ErrorCode::PermissionDenied,
        }
    }
}

/// Now as Unix milliseconds (what grant expiries count in).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Who may use a grant: the principal an authenticated hello proved and the client id it named (bound into that
/// hello's MAC). A grant seen by another peer is useless to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bearer {
    /// The client id (a peer that named none is the nil id).
    pub client: ClientId,
    /// The proven principal.
    pub principal: Principal,
    /// The principal's text, made once per connection rather than per grant.
    text: Arc<str>,
}

impl Bearer {
    /// The bearer of a hello that proved `principal` and named `client`.
    pub fn new(principal: Principal, client: Option<ClientId>) -> Self {
        let text = Arc::from(principal.to_string());
        Self { client: client.unwrap_or(ClientId::from_u64_pair(0, 0)), principal, text }
    }
}

/// What a grant's tag covers, fed to `mac`: a fixed layout, then the principal (its length is implied).
fn message(mac: &mut HmacSha256, op: GrantOp, segment: &SegmentId, bearer: &Bearer, grant: (u64, u64, u64, u64)) {
    let (offset, length, expires_ms, epoch) = grant;
    let mut m = [0u8; 65];
    m[0] = op.byte();
    m[1..17].copy_from_slice(segment.0.as_bytes());
    m[17..33].copy_from_slice(bearer.client.0.as_bytes());
    m[33..41].copy_from_slice(&offset.to_be_bytes());
    m[41..49].copy_from_slice(&length.to_be_bytes());
    m[49..57].copy_from_slice(&expires_ms.to_be_bytes());
    m[57..65].copy_from_slice(&epoch.to_be_bytes());
    mac.update(&m);
    mac.update(bearer.text.as_bytes());
}

/// Seals a grant for `bearer` to perform `op` on `[offset, offset + length)` of `segment` until `expires_ms`
/// (Unix ms) under `key` (a host's grant key, `crate::host::HostKeys`).
pub(crate) fn seal(
    key: &HmacSha256,
    op: GrantOp,
    segment: &SegmentId,
    bearer: &Bearer,
    range: (u64, u64),
    expires_ms: u64,
    epoch: u64,
) -> Grant {
    let (offset, length) = range;
    let mut mac = key.clone();
    message(&mut mac, op, segment, bearer, (offset, length, expires_ms, epoch));
    let full = mac.finalize().into_bytes();
    let mut tag = [0u8; GRANT_TAG_LEN];
    tag.copy_from_slice(&full[..GRANT_TAG_LEN]);
    Grant { offset, length, expires_ms, epoch, tag }
}

/// The expiry of a grant that lasts `ttl` from now, less the clock-skew slack (at most half of `ttl`).
pub(crate) fn expiry_for(ttl: Duration) -> u64 {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    unix_ms().saturating_add(ttl_ms - SKEW_MS.min(ttl_ms / 2))
}

/// Whether `grant`, sealed under one of `keys`, lets `bearer` perform `op` on `[offset, offset + length)` of
/// `segment` at `now_ms`. Constant-time in the tag; every key is tried.
#[allow(clippy::too_many_arguments)] // the exact tuple a grant binds
pub(crate) fn check<'a>(
    keys: impl Iterator<Item = &'a HmacSha256>,
    op: GrantOp,
    segment: &SegmentId,
    bearer: &Bearer,
    grant: Option<&Grant>,
    offset: u64,
    length: u64,
    now_ms: u64,
) -> Result<(), GrantRefusal> {
    let g = grant.ok_or(GrantRefusal::Missing)?;
    let mut valid = false;
    for key in keys {
        let mut mac = key.clone();
        message(&mut mac, op, segment, bearer, (g.offset, g.length, g.expires_ms, g.epoch));
        valid |= mac.verify_truncated_left(&g.tag).is_ok();
    }
    if !valid {
        return Err(GrantRefusal::Invalid);
    }
    if now_ms >= g.expires_ms {
        return Err(GrantRefusal::Expired);
    }
    if !g.covers(offset, length) {
        return Err(GrantRefusal::OutOfRange);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Keyring;
    use crate::host::{HostKeys, NodeKeys};

    const S1: &str = "0123456789abcdef-first";
    const S2: &str = "0123456789abcdef-second";

    /// What the master seals a host's grants with, and the host's own keys.
    fn host(secret: &str) -> (HostKeys, NodeKeys) {
        let ring = Keyring::parse(secret).unwrap();
        let principal = Principal::Node(None);
        (ring.host_keys(&principal, None), NodeKeys::fixed(ring.credential(principal)))
    }

    fn ids() -> (SegmentId, Bearer) {
        (SegmentId::random(), Bearer::new("tenant:a".parse::<Principal>().unwrap(), Some(ClientId::random())))
    }

    #[test]
    fn a_grant_covers_its_range_for_its_bearer_and_operation_only() {
        let (master, ring) = host(S1);
        let (seg, client) = ids();
        let g = master.seal_grant(GrantOp::Write, &seg, &client, 4096, 8192, 10_000);
        let check = |op, seg: &SegmentId, client: &Bearer, off, len, now| {
            ring.check_grant(op, seg, client, Some(&g), off, len, now)
        };
        assert_eq!(check(GrantOp::Write, &seg, &client, 4096, 8192, 9_999), Ok(()));
        assert_eq!(check(GrantOp::Write, &seg, &client, 4096 + 2048, 2048, 0), Ok(()), "a stripe inside it");
        assert_eq!(check(GrantOp::Write, &seg, &client, 0, 4096, 0), Err(GrantRefusal::OutOfRange));
        assert_eq!(check(GrantOp::Write, &seg, &client, 4096, 8193, 0), Err(GrantRefusal::OutOfRange));
        assert_eq!(check(GrantOp::Write, &seg, &client, u64::MAX, 2, 0), Err(GrantRefusal::OutOfRange));
        assert_eq!(check(GrantOp::Write, &seg, &client, 4096, 8192, 10_000), Err(GrantRefusal::Expired));
        assert_eq!(check(GrantOp::Read, &seg, &client, 4096, 8192, 0), Err(GrantRefusal::Invalid));
        assert_eq!(check(GrantOp::Write, &SegmentId::random(), &client, 4096, 8192, 0), Err(GrantRefusal::Invalid));
        let other_client = Bearer::new(client.principal.clone(), Some(ClientId::random()));
        assert_eq!(check(GrantOp::Write, &seg, &other_client, 4096, 8192, 0), Err(GrantRefusal::Invalid));
        let other_principal = Bearer::new("tenant:b".parse::<Principal>().unwrap(), Some(client.client));
        assert_eq!(check(GrantOp::Write, &seg, &other_principal, 4096, 8192, 0), Err(GrantRefusal::Invalid));
        let none = ring.check_grant(GrantOp::Write, &seg, &client, None, 4096, 1, 0);
        assert_eq!(none, Err(GrantRefusal::Missing));
        assert_eq!(none.unwrap_err().code(), ErrorCode::PermissionDenied);
        assert_eq!(GrantRefusal::Expired.code(), ErrorCode::GrantExpired);
    }

    #[test]
    fn altered_grants_and_foreign_keys_are_refused() {
        let (master, ring) = host(S1);
        let (seg, client) = ids();
        let g = master.seal_grant(GrantOp::Read, &seg, &client, 0, 4096, 10_000);
        for altered in [
            Grant { length: 1 << 30, ..g },
            Grant { offset: 1, ..g },
            Grant { expires_ms: u64::MAX, ..g },
            Grant { epoch: 1, ..g },
            Grant { tag: [0; GRANT_TAG_LEN], ..g },
        ] {
            let r = ring.check_grant(GrantOp::Read, &seg, &client, Some(&altered), 0, 1, 0);
            assert_eq!(r, Err(GrantRefusal::Invalid), "{altered:?}");
        }
        let (_, other) = host(S2);
        assert_eq!(other.check_grant(GrantOp::Read, &seg, &client, Some(&g), 0, 1, 0), Err(GrantRefusal::Invalid));
    }

    #[test]
    fn a_grant_for_a_duration_expires_short_of_it_by_the_skew_slack() {
        let (ring, _) = host(S1);
        let (seg, client) = ids();
        let before = unix_ms();
        let g = ring.seal_grant_for(GrantOp::Read, &seg, &client, 0, 1, Duration::from_secs(5), 0);
        assert!(g.expires_ms >= before + 5000 - SKEW_MS && g.expires_ms <= unix_ms() + 5000 - SKEW_MS);
        let before = unix_ms();
        let short = ring.seal_grant_for(GrantOp::Read, &seg, &client, 0, 1, Duration::from_millis(400), 0);
        assert!(short.expires_ms >= before + 200 && short.expires_ms <= unix_ms() + 200, "short grants keep half");
    }
}
