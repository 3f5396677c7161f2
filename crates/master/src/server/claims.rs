//! Which principal each client id belongs to. A client id is the peer's own claim in its hello (the MAC proves
//! the principal, not that the id is this peer's), so without this table a tenant could name another client's id
//! and ping, remount or unmount in its name. The first authenticated connection naming an id claims it for its
//! principal; a connection of another principal naming it is left without a client id (every request in that
//! id's name is refused) for as long as the claim holds.
//!
//! A claim holds while a connection naming the id is open, and after the last one closes for as long as the
//! master still tracks the client as alive (its liveness TTL): a client that reconnects keeps its id, and
//! nobody can step in between. `admin` never claims (it may act in any client's name anyway).
//!
//! Lock order: the claims mutex, then (in `alive`) the service's client table; nothing else under it.
//!
//! The table is this master's: after a failover the new leader's starts empty. What carries over is the log's
//! record of which principal mounted each client id's segments (`MasterService::mounter`): while such an id
//! has a segment mounted, a connection of another principal naming it is refused as if that principal held a
//! claim on it, so a node's id is its own on the new leader before the node reconnects. (An id that never
//! mounted anything — a pure client's — is claimed afresh by whichever principal names it first; it reaches no
//! data of another principal's that way: its objects are reached by tenant, not by client id.)

use crescent_net::auth::SecretId;
use crescent_proto::{ClientId, Principal};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Claims by client id.
#[derive(Debug, Default)]
pub struct ClientClaims {
    claims: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    by_client: HashMap<ClientId, Claim>,
    /// Client ids `admin` connections named (admin claims nothing), with the secret last proved: a process
    /// with the admin credential may host segments too (`server::hosts`). Swept with the claims.
    admin: HashMap<ClientId, Option<SecretId>>,
    /// The table's size after its last sweep of released claims: the next sweep waits until it doubles, so
    /// sweeping costs O(1) per claim made.
    swept_at: usize,
}

#[derive(Debug)]
struct Claim {
    principal: Principal,
    /// The secret its latest connection proved (what its segments' grants and tickets are sealed with).
    secret: Option<SecretId>,
    /// Open connections naming the id with this principal.
    open: usize,
}

/// One connection's hold on its client id's claim; dropping it (the connection ends) lets go.
#[derive(Debug)]
pub struct ClaimGuard {
    claims: Arc<ClientClaims>,
    client: ClientId,
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if let Some(c) = self.claims.claims.lock().by_client.get_mut(&self.client) {
            c.open = c.open.saturating_sub(1);
        }
    }
}

/// Another principal holds the client id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disputed {
    /// The principal holding it.
    pub holder: Principal,
}

impl ClientClaims {
    /// Claims `client` for `principal` for the life of the returned guard (`None` for `admin`, which claims
    /// nothing). Refused while another principal holds it: one of its connections naming the id is open, or
    /// `alive(client)` says the master still tracks the client, or (without a claim) `mounter`, the principal
    /// the service knows mounted the id's segments (`admin` included), is another.
    pub fn claim(
        self: &Arc<Self>,
        client: ClientId,
        principal: &Principal,
        secret: Option<SecretId>,
        mounter: Option<Principal>,
        alive: impl Fn(ClientId) -> bool,
    ) -> Result<Option<ClaimGuard>, Disputed> {
        let mut t = self.claims.lock();
        if t.by_client.len() + t.admin.len() >= 2 * t.swept_at.max(512) {
            // Released claims of clients the master forgot: nothing holds them any more.
            t.by_client.retain(|&id, c| c.open > 0 || alive(id));
            t.admin.retain(|&id, _| alive(id));
            t.swept_at = t.by_client.len() + t.admin.len();
        }
        if *principal == Principal::Admin {
            t.admin.insert(client, secret);
            return Ok(None);
        }
        match t.by_client.get_mut(&client) {
            Some(c) if c.principal == *principal => {
                c.open += 1;
                c.secret = secret;
            }
            Some(c) if c.open > 0 || alive(client) => return Err(Disputed { holder: c.principal.clone() }),
            _ if mounter.as_ref().is_some_and(|m| m != principal) => {
                return Err(Disputed { holder: mounter.unwrap_or(Principal::Admin) });
            }
            _ => {
                t.by_client.insert(client, Claim { principal: principal.clone(), secret, open: 1 });
            }
        }
        Ok(Some(ClaimGuard { claims: self.clone(), client }))
    }

    /// Who hosts the segments `client` mounted, and the secret it last proved: its claim's principal, else
    /// `admin` if only admin connections named it.
    pub fn host(&self, client: ClientId) -> Option<(Principal, Option<SecretId>)> {
        let t = self.claims.lock();
        match t.by_client.get(&client) {
            Some(c) => Some((c.principal.clone(), c.secret)),
            None => t.admin.get(&client).map(|s| (Principal::Admin, *s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Principal {
        s.parse().unwrap()
    }

    #[test]
    fn a_client_id_is_its_first_principals_while_connected_or_alive() {
        let claims = Arc::new(ClientClaims::default());
        let id = ClientId::random();
        let dead = |_| false;
        let a = claims.claim(id, &p("tenant:a"), None, None, dead).unwrap();
        assert!(a.is_some());
        assert_eq!(claims.host(id), Some((p("tenant:a"), None)), "a hosts what this id mounts");
        // Another principal is refused while a's connection is open, alive or not.
        assert_eq!(claims.claim(id, &p("tenant:b"), None, None, dead).unwrap_err(), Disputed { holder: p("tenant:a") });
        assert!(claims.claim(id, &p("node"), None, None, dead).is_err());
        // The same principal may open more connections; admin claims nothing and is never refused.
        let a2 = claims.claim(id, &p("tenant:a"), None, None, dead).unwrap();
        assert!(claims.claim(id, &p("admin"), None, None, dead).unwrap().is_none());
        assert_eq!(claims.host(id).unwrap().0, p("tenant:a"), "admin naming the id takes nothing from a");
        let admins = ClientId::random();
        assert!(claims.claim(admins, &p("admin"), None, None, dead).unwrap().is_none());
        assert_eq!(claims.host(admins), Some((Principal::Admin, None)));
        drop(a);
        assert!(claims.claim(id, &p("tenant:b"), None, None, dead).is_err(), "a's second connection still holds it");
        drop(a2);
        // Every connection closed, but the master still tracks the client: still a's.
        assert!(claims.claim(id, &p("tenant:b"), None, None, |_| true).is_err());
        // Forgotten by the master: free to claim again.
        let b = claims.claim(id, &p("tenant:b"), None, None, dead).unwrap();
        assert!(b.is_some());
        assert_eq!(claims.claim(id, &p("tenant:a"), None, None, dead).unwrap_err(), Disputed { holder: p("tenant:b") });
    }

    #[test]
    fn a_client_id_whose_segments_a_principal_mounted_is_that_ones_before_it_connects() {
        // A new leader: no claim yet, but the log says node:a mounted this id's segments.
        let claims = Arc::new(ClientClaims::default());
        let (id, dead) = (ClientId::random(), |_| false);
        let refused = claims.claim(id, &p("tenant:b"), None, Some(p("node:a")), dead);
        assert_eq!(refused.unwrap_err(), Disputed { holder: p("node:a") });
        assert!(claims.claim(id, &p("node:b"), None, Some(p("node:a")), dead).is_err(), "another node's too");
        assert!(claims.claim(id, &p("admin"), None, Some(p("node:a")), dead).unwrap().is_none(), "admin may");
        let a = claims.claim(id, &p("node:a"), None, Some(p("node:a")), dead).unwrap();
        assert!(a.is_some(), "its mounter claims it");
        // Segments an admin connection mounted are admin's: nobody else may name the id either.
        let admins = ClientId::random();
        assert!(claims.claim(admins, &p("tenant:b"), None, Some(Principal::Admin), dead).is_err());
    }

    #[test]
    fn released_claims_of_forgotten_clients_are_swept() {
        let claims = Arc::new(ClientClaims::default());
        for _ in 0..2000 {
            drop(claims.claim(ClientId::random(), &p("tenant:a"), None, None, |_| false).unwrap());
        }
        assert!(claims.claims.lock().by_client.len() <= 1024, "the table stays bounded");
        // A held claim survives every sweep.
        let id = ClientId::random();
        let _held = claims.claim(id, &p("tenant:a"), None, None, |_| false).unwrap();
        for _ in 0..2000 {
            drop(claims.claim(ClientId::random(), &p("tenant:a"), None, None, |_| false).unwrap());
        }
        assert!(claims.claim(id, &p("tenant:b"), None, None, |_| false).is_err());
    }
}
