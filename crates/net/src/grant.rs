//! Data-plane grants: the capabilities a master seals and storage nodes check.
//!
//! Authentication says who a peer is; a grant says which bytes it may touch. For every put the master seals a
//! write grant for the replica ranges it allocated, and for every get a read grant for the ranges the lease
//! covers: `(operation, segment, ranges, expiry, term, bearer)` under `HMAC-SHA256(grant key, …)`, truncated
//! to 128 bits — one per range in a single object's reply, one per segment and operation in a batch's (up to
//! `MAX_GRANT_RANGES` ranges), so a node checks one tag per batch ([`HeldGrants`]). The grant key is the segment's host's own (`crate::host`: derived from the host's credential,
//! which the master derives from the cluster secret), so the master and the host share it without a message,
//! no host can seal grants for another's segments, and checking a grant costs one HMAC on the node (no round
//! trip to the master). A node moves bytes only for a
//! request whose range lies inside the grant range it names, on a connection whose hello proved the grant's bearer (the same
//! principal and client id), before the grant expires. Expiry is wall-clock Unix milliseconds (master and nodes are assumed NTP-synchronised;
//! [`SKEW_MS`] of slack, at most half the grant's life, is subtracted from what the master promises).

use crate::host::NodeKeys;
use crescent_proto::transfer::{GRANT_TAG_LEN, Grant, GrantRange, GrantUse, MAX_GRANT_RANGES, MAX_GRANT_SLOTS};
use crescent_proto::{ClientId, ErrorCode, Principal, SegmentId};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

type HmacSha256 = Hmac<Sha256>;

/// What a grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// What a grant's tag covers, fed to `mac`: a fixed layout, the ranges (their count first), then the
/// principal (its length is implied).
fn message(mac: &mut HmacSha256, op: GrantOp, segment: &SegmentId, bearer: &Bearer, grant: &Grant) {
    let mut m = [0u8; 53];
    m[0] = op.byte();
    m[1..17].copy_from_slice(segment.0.as_bytes());
    m[17..33].copy_from_slice(bearer.client.0.as_bytes());
    m[33..41].copy_from_slice(&grant.expires_ms.to_be_bytes());
    m[41..49].copy_from_slice(&grant.epoch.to_be_bytes());
    m[49..53].copy_from_slice(&u32::try_from(grant.ranges.len()).unwrap_or(u32::MAX).to_be_bytes());
    mac.update(&m);
    for r in &grant.ranges {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&r.offset.to_be_bytes());
        b[8..].copy_from_slice(&r.length.to_be_bytes());
        mac.update(&b);
    }
    mac.update(bearer.text.as_bytes());
}

/// Seals a grant for `bearer` to perform `op` on any of `ranges` of `segment` until `expires_ms` (Unix ms)
/// under `key` (a host's grant key, `crate::host::HostKeys`).
pub(crate) fn seal(
    key: &HmacSha256,
    op: GrantOp,
    segment: &SegmentId,
    bearer: &Bearer,
    ranges: Vec<GrantRange>,
    expires_ms: u64,
    epoch: u64,
) -> Grant {
    let mut grant = Grant { ranges, expires_ms, epoch, tag: [0; GRANT_TAG_LEN] };
    let mut mac = key.clone();
    message(&mut mac, op, segment, bearer, &grant);
    grant.tag.copy_from_slice(&mac.finalize().into_bytes()[..GRANT_TAG_LEN]);
    grant
}

/// The expiry of a grant that lasts `ttl` from now, less the clock-skew slack (at most half of `ttl`).
pub(crate) fn expiry_for(ttl: Duration) -> u64 {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    unix_ms().saturating_add(ttl_ms - SKEW_MS.min(ttl_ms / 2))
}

/// Whether `grant`, sealed under one of `keys`, lets `bearer` perform `op` on `segment` at `now_ms` (which of
/// its ranges a request may touch is the caller's check). Constant-time in the tag; every key is tried.
pub(crate) fn verify<'a>(
    keys: impl Iterator<Item = &'a HmacSha256>,
    op: GrantOp,
    segment: &SegmentId,
    bearer: &Bearer,
    grant: &Grant,
    now_ms: u64,
) -> Result<(), GrantRefusal> {
    if grant.ranges.len() > MAX_GRANT_RANGES {
        return Err(GrantRefusal::Invalid);
    }
    let mut valid = false;
    for key in keys {
        let mut mac = key.clone();
        message(&mut mac, op, segment, bearer, grant);
        valid |= mac.verify_truncated_left(&grant.tag).is_ok();
    }
    if !valid {
        return Err(GrantRefusal::Invalid);
    }
    if now_ms >= grant.expires_ms {
        return Err(GrantRefusal::Expired);
    }
    Ok(())
}

/// A grant a connection's node has checked, kept in a slot for the later requests of its batch.
#[derive(Debug)]
struct Held {
    op: GrantOp,
    segment: SegmentId,
    ranges: Vec<GrantRange>,
    expires_ms: u64,
    epoch: u64,
}

/// The grants one data-plane connection holds (see [`GrantUse`]): each checked once, when a request carries
/// it, then used by index. What a slot holds is only ever a grant whose tag checked for this connection's
/// bearer, or why the last one carried into it was refused (so the requests naming it get the same answer).
#[derive(Debug, Default)]
pub struct HeldGrants {
    slots: Vec<Option<Result<Held, GrantRefusal>>>,
}

impl HeldGrants {
    /// Whether `grant` lets `bearer` perform `op` on `[offset, offset + length)` of `segment` now, checking a
    /// carried grant's tag with `keys` (and keeping it, or its refusal, in its slot).
    #[allow(clippy::too_many_arguments)] // the exact tuple a transfer is checked by
    pub fn check(
        &mut self,
        keys: &NodeKeys,
        op: GrantOp,
        segment: &SegmentId,
        bearer: &Bearer,
        grant: Option<GrantUse>,
        offset: u64,
        length: u64,
        now_ms: u64,
    ) -> Result<(), GrantRefusal> {
        let grant = grant.ok_or(GrantRefusal::Missing)?;
        let (slot, index) = (usize::from(grant.slot()), usize::from(grant.range()));
        if slot >= MAX_GRANT_SLOTS {
            return Err(GrantRefusal::Missing);
        }
        if let GrantUse::Carried { grant, .. } = grant {
            if self.slots.len() <= slot {
                self.slots.resize_with(slot + 1, || None);
            }
            let checked = keys.verify_grant(op, segment, bearer, &grant, now_ms).map(|()| Held {
                op,
                segment: *segment,
                ranges: grant.ranges,
                expires_ms: grant.expires_ms,
                epoch: grant.epoch,
            });
            self.slots[slot] = Some(checked);
        }
        let held = match self.slots.get(slot) {
            Some(Some(Ok(held))) => held,
            Some(Some(Err(why))) => return Err(*why),
            _ => return Err(GrantRefusal::Missing),
        };
        if held.op != op || held.segment != *segment {
            return Err(GrantRefusal::Invalid);
        }
        if now_ms >= held.expires_ms || !keys.honours_term(held.epoch) {
            return Err(GrantRefusal::Expired);
        }
        if !held.ranges.get(index).is_some_and(|r| r.covers(offset, length)) {
            return Err(GrantRefusal::OutOfRange);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Keyring;
    use crate::host::HostKeys;

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

    fn ranges(r: &[(u64, u64)]) -> Vec<GrantRange> {
        r.iter().map(|&(offset, length)| GrantRange { offset, length }).collect()
    }

    fn carried(grant: &Grant, range: u16) -> Option<GrantUse> {
        Some(GrantUse::Carried { slot: 0, range, grant: grant.clone() })
    }

    fn held(slot: u8, range: u16) -> Option<GrantUse> {
        Some(GrantUse::Held { slot, range })
    }

    #[test]
    fn a_grant_covers_its_ranges_for_its_bearer_and_operation_only() {
        let (master, node) = host(S1);
        let (seg, client) = ids();
        let g = master.seal_grant(GrantOp::Write, &seg, &client, ranges(&[(4096, 8192), (65536, 4096)]), 10_000);
        let check = |op, seg: &SegmentId, client: &Bearer, range, off, len, now| {
            HeldGrants::default().check(&node, op, seg, client, carried(&g, range), off, len, now)
        };
        assert_eq!(check(GrantOp::Write, &seg, &client, 0, 4096, 8192, 9_999), Ok(()));
        assert_eq!(check(GrantOp::Write, &seg, &client, 0, 4096 + 2048, 2048, 0), Ok(()), "a stripe inside it");
        assert_eq!(check(GrantOp::Write, &seg, &client, 1, 65536, 4096, 0), Ok(()), "its second range");
        assert_eq!(check(GrantOp::Write, &seg, &client, 0, 65536, 4096, 0), Err(GrantRefusal::OutOfRange));
        assert_eq!(check(GrantOp::Write, &seg, &client, 2, 65536, 1, 0), Err(GrantRefusal::OutOfRange), "no third");
        assert_eq!(check(GrantOp::Write, &seg, &client, 0, 0, 4096, 0), Err(GrantRefusal::OutOfRange));
        assert_eq!(check(GrantOp::Write, &seg, &client, 0, 4096, 8193, 0), Err(GrantRefusal::OutOfRange));
        assert_eq!(check(GrantOp::Write, &seg, &client, 0, u64::MAX, 2, 0), Err(GrantRefusal::OutOfRange));
        assert_eq!(check(GrantOp::Write, &seg, &client, 0, 4096, 8192, 10_000), Err(GrantRefusal::Expired));
        assert_eq!(check(GrantOp::Read, &seg, &client, 0, 4096, 8192, 0), Err(GrantRefusal::Invalid));
        let other_seg = SegmentId::random();
        assert_eq!(check(GrantOp::Write, &other_seg, &client, 0, 4096, 8192, 0), Err(GrantRefusal::Invalid));
        let other_client = Bearer::new(client.principal.clone(), Some(ClientId::random()));
        assert_eq!(check(GrantOp::Write, &seg, &other_client, 0, 4096, 8192, 0), Err(GrantRefusal::Invalid));
        let other_principal = Bearer::new("tenant:b".parse::<Principal>().unwrap(), Some(client.client));
        assert_eq!(check(GrantOp::Write, &seg, &other_principal, 0, 4096, 8192, 0), Err(GrantRefusal::Invalid));
        let none = HeldGrants::default().check(&node, GrantOp::Write, &seg, &client, None, 4096, 1, 0);
        assert_eq!(none, Err(GrantRefusal::Missing));
        assert_eq!(none.unwrap_err().code(), ErrorCode::PermissionDenied);
        assert_eq!(GrantRefusal::Expired.code(), ErrorCode::GrantExpired);
    }

    #[test]
    fn altered_grants_and_foreign_keys_are_refused() {
        let (master, node) = host(S1);
        let (seg, client) = ids();
        let g = master.seal_grant(GrantOp::Read, &seg, &client, ranges(&[(0, 4096), (8192, 4096)]), 10_000);
        let mut too_many = g.clone();
        too_many.ranges = ranges(&vec![(0, 1); MAX_GRANT_RANGES + 1]);
        for altered in [
            Grant { ranges: ranges(&[(0, 1 << 30), (8192, 4096)]), ..g.clone() },
            Grant { ranges: ranges(&[(0, 4096)]), ..g.clone() },
            Grant { ranges: ranges(&[(8192, 4096), (0, 4096)]), ..g.clone() },
            Grant { ranges: ranges(&[(0, 4096), (8192, 4096), (1 << 20, 4096)]), ..g.clone() },
            Grant { expires_ms: u64::MAX, ..g.clone() },
            Grant { epoch: 1, ..g.clone() },
            Grant { tag: [0; GRANT_TAG_LEN], ..g.clone() },
            too_many,
        ] {
            let r = node.verify_grant(GrantOp::Read, &seg, &client, &altered, 0);
            assert_eq!(r, Err(GrantRefusal::Invalid), "{altered:?}");
        }
        let (_, other) = host(S2);
        assert_eq!(other.verify_grant(GrantOp::Read, &seg, &client, &g, 0), Err(GrantRefusal::Invalid));
        assert_eq!(node.verify_grant(GrantOp::Read, &seg, &client, &g, 0), Ok(()));
    }

    #[test]
    fn a_carried_grant_is_checked_once_and_held_for_the_requests_after_it() {
        let (master, node) = host(S1);
        let (seg, client) = ids();
        let g = master.seal_grant(GrantOp::Read, &seg, &client, ranges(&[(0, 4096), (8192, 4096)]), 10_000);
        let mut conn = HeldGrants::default();
        let mut check =
            |op, seg: &SegmentId, grant, off, now| conn.check(&node, op, seg, &client, grant, off, 4096, now);
        assert_eq!(check(GrantOp::Read, &seg, held(0, 0), 0, 0), Err(GrantRefusal::Missing), "nothing carried yet");
        let into_3 = Some(GrantUse::Carried { slot: 3, range: 1, grant: g.clone() });
        assert_eq!(check(GrantOp::Read, &seg, into_3, 8192, 0), Ok(()));
        assert_eq!(check(GrantOp::Read, &seg, held(3, 0), 0, 0), Ok(()));
        assert_eq!(check(GrantOp::Read, &seg, held(3, 1), 8192, 9_999), Ok(()));
        assert_eq!(check(GrantOp::Read, &seg, held(3, 1), 0, 0), Err(GrantRefusal::OutOfRange));
        assert_eq!(check(GrantOp::Read, &seg, held(3, 1), 8192, 10_000), Err(GrantRefusal::Expired));
        assert_eq!(check(GrantOp::Write, &seg, held(3, 0), 0, 0), Err(GrantRefusal::Invalid), "held for reads");
        assert_eq!(check(GrantOp::Read, &SegmentId::random(), held(3, 0), 0, 0), Err(GrantRefusal::Invalid));
        assert_eq!(check(GrantOp::Read, &seg, held(2, 0), 0, 0), Err(GrantRefusal::Missing), "another slot");
        let beyond = MAX_GRANT_SLOTS as u8;
        assert_eq!(check(GrantOp::Read, &seg, held(beyond, 0), 0, 0), Err(GrantRefusal::Missing));
        let too_far = Some(GrantUse::Carried { slot: beyond, range: 0, grant: g.clone() });
        assert_eq!(check(GrantOp::Read, &seg, too_far, 0, 0), Err(GrantRefusal::Missing));
        // A forgery carried into the slot replaces the grant: the requests naming the slot get its refusal.
        let forged =
            Some(GrantUse::Carried { slot: 3, range: 0, grant: Grant { tag: [1; GRANT_TAG_LEN], ..g.clone() } });
        assert_eq!(check(GrantOp::Read, &seg, forged, 0, 0), Err(GrantRefusal::Invalid));
        assert_eq!(check(GrantOp::Read, &seg, held(3, 0), 0, 0), Err(GrantRefusal::Invalid));
        // An expired one likewise answers expired (the client asks for a new grant).
        let late = Some(GrantUse::Carried { slot: 3, range: 0, grant: g.clone() });
        assert_eq!(check(GrantOp::Read, &seg, late, 0, 20_000), Err(GrantRefusal::Expired));
        assert_eq!(check(GrantOp::Read, &seg, held(3, 0), 0, 0), Err(GrantRefusal::Expired));
    }

    #[test]
    fn a_held_grant_of_a_term_the_host_has_moved_on_from_is_refused() {
        let (master, node) = host(S1);
        let (seg, client) = ids();
        let ttl = Duration::from_secs(60);
        let old = master.seal_grant_for(GrantOp::Read, &seg, &client, ranges(&[(0, 8)]), ttl, 1_000);
        let mut conn = HeldGrants::default();
        let now = unix_ms();
        let carried = Some(GrantUse::Carried { slot: 0, range: 0, grant: old });
        assert_eq!(conn.check(&node, GrantOp::Read, &seg, &client, carried, 0, 8, now), Ok(()));
        let new = master.seal_grant_for(GrantOp::Read, &seg, &client, ranges(&[(0, 8)]), ttl, 2_000);
        assert_eq!(node.verify_grant(GrantOp::Read, &seg, &client, &new, now), Ok(()));
        assert_eq!(conn.check(&node, GrantOp::Read, &seg, &client, held(0, 0), 0, 8, now), Err(GrantRefusal::Expired));
    }

    #[test]
    fn a_grant_of_the_most_ranges_fits_a_data_plane_header() {
        let (master, _) = host(S1);
        let (seg, client) = ids();
        let g = master.seal_grant(
            GrantOp::Write,
            &seg,
            &client,
            ranges(&vec![(u64::MAX, u64::MAX); MAX_GRANT_RANGES]),
            u64::MAX,
        );
        let req = crescent_proto::transfer::TransferRequest::Write {
            segment: seg,
            offset: u64::MAX,
            grant: Some(GrantUse::Carried { slot: u8::MAX, range: u16::MAX, grant: g }),
        };
        let head = crescent_proto::wire::Head::encode(u64::MAX, &req, 0).unwrap();
        assert!(head.as_bytes().len() <= crescent_proto::wire::MAX_DATA_HEADER, "{}", head.as_bytes().len());
    }

    #[test]
    fn a_grant_for_a_duration_expires_short_of_it_by_the_skew_slack() {
        let (ring, _) = host(S1);
        let (seg, client) = ids();
        let before = unix_ms();
        let g = ring.seal_grant_for(GrantOp::Read, &seg, &client, ranges(&[(0, 1)]), Duration::from_secs(5), 0);
        assert!(g.expires_ms >= before + 5000 - SKEW_MS && g.expires_ms <= unix_ms() + 5000 - SKEW_MS);
        let before = unix_ms();
        let short = ring.seal_grant_for(GrantOp::Read, &seg, &client, ranges(&[(0, 1)]), Duration::from_millis(400), 0);
        assert!(short.expires_ms >= before + 200 && short.expires_ms <= unix_ms() + 200, "short grants keep half");
    }
}
