//! The master's side of the hosts' keys (`crescent_net::host`): for each segment, the keys its host holds, to
//! seal that segment's grants and issue tickets to it with. No host holds the cluster secret; each derives its
//! keys from its own credential, which the master derives from the secret.
//!
//! A segment's host is the principal whose connection mounted it (`MasterService::mounter`, logged with the
//! segment, so a new leader knows it from the log), else the one whose connection claimed the client id that
//! mounted it (`server::claims`), under the secret that connection proved (so during a rotation a host that
//! still proves the old secret gets grants it can check; a host that has not connected to this master yet gets
//! them under the current secret).

use super::claims::ClientClaims;
use crate::service::MasterService;
use crescent_net::auth::{Keyring, SecretId};
use crescent_net::host::HostKeys;
use crescent_proto::auth::SealedTicket;
use crescent_proto::wire::ErrorFrame;
use crescent_proto::{ClientId, ErrorCode, Principal, SegmentId};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Most host keys cached (principals × secrets): past it the cache starts over.
const MAX_CACHED: usize = 4096;

/// The keyring, the client claims, and the host keys derived so far.
#[derive(Debug)]
pub struct Hosts {
    ring: Arc<Keyring>,
    claims: Arc<ClientClaims>,
    /// Derived keys by host and secret (a leaf lock, held only to look up or insert).
    cache: Mutex<HashMap<(Principal, SecretId), Arc<HostKeys>>>,
}

impl Hosts {
    /// The hosts of a master authenticating with `ring`.
    pub fn new(ring: Arc<Keyring>) -> Arc<Self> {
        Arc::new(Self { ring, claims: Arc::default(), cache: Mutex::default() })
    }

    /// The cluster secret(s).
    pub fn ring(&self) -> &Arc<Keyring> {
        &self.ring
    }

    /// Which principal holds each client id.
    pub fn claims(&self) -> &Arc<ClientClaims> {
        &self.claims
    }

    /// The host of `segment` as `svc` knows its owner: its principal, and the keys it holds.
    pub fn of_segment(&self, svc: &MasterService, segment: SegmentId) -> Option<(Principal, Arc<HostKeys>)> {
        let owner = svc.pool().owner(segment)?;
        let (principal, secret) = match (svc.mounter(owner), self.claims.host(owner)) {
            (Some(mounter), Some((claimant, secret))) if mounter == claimant => (mounter, secret),
            // Not connected to this master yet (a failover): its keys of the current secret.
            (Some(mounter), _) => (mounter, None),
            (None, claim) => claim?,
        };
        let keys = self.keys(&principal, secret);
        Some((principal, keys))
    }

    fn keys(&self, host: &Principal, secret: Option<SecretId>) -> Arc<HostKeys> {
        let id = self.ring.resolve(secret);
        let mut cache = self.cache.lock();
        if let Some(k) = cache.get(&(host.clone(), id)) {
            return k.clone();
        }
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        let keys = Arc::new(self.ring.host_keys(host, Some(id)));
        cache.insert((host.clone(), id), keys.clone());
        keys
    }

    /// A ticket to `segment`'s host for the caller (its principal, the secret it proved, its client id).
    pub fn ticket(
        &self,
        svc: &MasterService,
        segment: SegmentId,
        client: &Principal,
        secret: Option<SecretId>,
        client_id: ClientId,
    ) -> Result<SealedTicket, ErrorFrame> {
        let Some((host, keys)) = self.of_segment(svc, segment) else {
            let message = match svc.pool().owner(segment) {
                None => format!("segment {segment} is not mounted"),
                Some(owner) => {
                    format!("the host of segment {segment} (client {owner}) has not connected to this master yet")
                }
            };
            return Err(ErrorFrame { code: ErrorCode::SegmentNotFound, message });
        };
        self.ring
            .issue_ticket(&host, &keys, client, secret, client_id)
            .map_err(|e| ErrorFrame { code: ErrorCode::InternalError, message: format!("no ticket: {e}") })
    }
}
