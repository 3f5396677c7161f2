//! Who a connection speaks for: the [`Principal`] a peer names in its hello and proves with its credential.
//!
//! A principal's text form is what credentials and the hello carry: `admin`, `node`, `node:NAME` or
//! `tenant:NAME`. What each may do is the master's rule (its `server::authz`); this module only names them.
//! `node:NAME` may do what `node` may; it exists so each storage node can hold a credential of its own: the keys
//! a host derives from its credential (grants, tickets) are then its alone, and a node broken into cannot seal
//! grants for, or accept tickets meant for, the others.

use crate::tenant::{TenantId, TenantIdError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Bytes of a ticket's nonce and sealed key.
pub const TICKET_LEN: usize = 32;

/// A data-plane ticket as the master hands it to a client: the session key its lanes to one host prove in their
/// hello, sealed (XOR with a pad only the client's own credential derives) so it crosses the control plane
/// unread. The host derives the same key from its own credential; nobody holds the cluster secret but the master.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedTicket {
    /// The host's principal (whose credential the session key derives from), for logs and the client's cache.
    pub host: String,
    /// When the host stops accepting the ticket, in Unix milliseconds.
    pub expires_ms: u64,
    /// Random per ticket: the pad's input, so no two tickets share a pad.
    pub nonce: [u8; TICKET_LEN],
    /// The session key XOR the pad.
    pub sealed: [u8; TICKET_LEN],
}

/// Who an authenticated peer is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    /// Tenant and segment administration, and everything a client may do in every tenant.
    Admin,
    /// A storage node: mounts and serves its own segments; no object operations. `None` is the shared `node`
    /// credential, `Some` a node's own (`node:NAME`).
    Node(Option<NodeName>),
    /// A client of one tenant: objects of that tenant only (and segments it hosts itself).
    Tenant(TenantId),
}

/// A principal's text that names none.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrincipalError {
    /// Not `admin`, `node`, `node:NAME` or `tenant:NAME`.
    #[error("unknown principal {0:?}: expected admin, node, node:NAME or tenant:NAME")]
    Unknown(String),
    /// `node:` with an invalid name.
    #[error("invalid node name {0:?}: 1 to {max} letters, digits, '.', '-' or '_'", max = NodeName::MAX_LEN)]
    NodeName(String),
    /// `tenant:` with an invalid tenant id.
    #[error("invalid tenant in principal: {0}")]
    Tenant(#[from] TenantIdError),
}

impl FromStr for Principal {
    type Err = PrincipalError;

    fn from_str(s: &str) -> Result<Self, PrincipalError> {
        match s {
            "admin" => Ok(Self::Admin),
            "node" => Ok(Self::Node(None)),
            _ => {
                if let Some(name) = s.strip_prefix("node:") {
                    return Ok(Self::Node(Some(name.parse()?)));
                }
                match s.strip_prefix("tenant:") {
                    // `tenant:` alone is the default tenant, as an empty tenant is everywhere else.
                    Some(t) => Ok(Self::Tenant(TenantId::new(t)?)),
                    None => Err(PrincipalError::Unknown(s.chars().take(64).collect())),
                }
            }
        }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Admin => f.write_str("admin"),
            Self::Node(None) => f.write_str("node"),
            Self::Node(Some(name)) => write!(f, "node:{name}"),
            Self::Tenant(t) => write!(f, "tenant:{t}"),
        }
    }
}

/// A storage node's own name in its principal (`node:NAME`): short, and plain enough for logs and file names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeName(std::sync::Arc<str>);

impl NodeName {
    /// Longest name, in bytes.
    pub const MAX_LEN: usize = 64;

    /// The name's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for NodeName {
    type Err = PrincipalError;

    fn from_str(s: &str) -> Result<Self, PrincipalError> {
        let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_');
        match !s.is_empty() && s.len() <= Self::MAX_LEN && s.bytes().all(plain) {
            true => Ok(Self(s.into())),
            false => Err(PrincipalError::NodeName(s.chars().take(Self::MAX_LEN + 1).collect())),
        }
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_round_trip_through_text_and_bad_ones_say_why() {
        for p in ["admin", "node", "node:gpu-07.rack_2", "tenant:a", "tenant:default"] {
            assert_eq!(p.parse::<Principal>().unwrap().to_string(), p);
        }
        assert_eq!("tenant:".parse::<Principal>().unwrap(), Principal::Tenant(TenantId::default_tenant()));
        assert!(matches!("root".parse::<Principal>(), Err(PrincipalError::Unknown(_))));
        assert!(matches!("tenant:_sys".parse::<Principal>(), Err(PrincipalError::Tenant(_))));
        assert_eq!("node:a".parse::<Principal>().unwrap(), Principal::Node(Some("a".parse().unwrap())));
        assert_ne!("node:a".parse::<Principal>().unwrap(), Principal::Node(None), "a node's own is not the shared one");
        for bad in ["node:", "node:a b", "node:a/b", "node:é", &format!("node:{}", "x".repeat(65))] {
            assert!(matches!(bad.parse::<Principal>(), Err(PrincipalError::NodeName(_))), "{bad}");
        }
    }
}
