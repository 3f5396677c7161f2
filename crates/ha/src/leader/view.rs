//! The master view: who leads a cluster, and since which view version.
//!
//! One etcd key per cluster, `/crescent/<cluster>/master_view`, created (create-if-absent) by the leader under
//! its lease, so it vanishes when the leader's lease does. Its value is JSON (readable with `etcdctl`):
//! `{"leader":"HOST:PORT","admin":"HOST:PORT"}` — the client RPC address and, when the master serves one, its
//! admin HTTP address. The view version is not in the value: it is the key's etcd `create_revision`, which
//! strictly increases across leaders (every new leader creates the key anew), so a party that has seen version
//! `v` ignores any view `< v`. The same version is the producer view a promoted leader claims in the oplog, so
//! a deposed leader's writes fail its compare.

use crate::oplog::codec::{ClusterIdError, OpLogKeys};
use serde::{Deserialize, Serialize};

/// Most bytes in a master-view value (two addresses and a little JSON).
pub const MAX_VIEW_VALUE_BYTES: usize = 1024;
/// Environment variable naming the cluster id when a master address does not (`etcd://h1:p;h2:p`).
pub const CLUSTER_ID_ENV: &str = "CRESCENT_CLUSTER_ID";
/// The cluster id used when neither the address nor the environment names one.
pub const DEFAULT_CLUSTER_ID: &str = "crescent";

/// Who leads a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterView {
    /// The leader's client RPC address (`host:port`).
    pub leader: String,
    /// The leader's admin HTTP address, when it serves one.
    pub admin: Option<String>,
    /// The view version: strictly increasing across leaders (etcd's create revision of the key).
    pub version: u64,
}

/// Why a master view or a master address cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    /// The stored value is not a master view.
    #[error("malformed master view value: {0}")]
    Malformed(String),
    /// The cluster id is not a valid namespace.
    #[error(transparent)]
    Cluster(#[from] ClusterIdError),
    /// The address is neither `host:port[,…]` nor `etcd://HOST:PORT[,…][/CLUSTER]`.
    #[error("bad master address {0:?}: expected host:port[,host:port…] or etcd://HOST:PORT[,HOST:PORT…][/CLUSTER]")]
    BadAddress(String),
}

#[derive(Serialize, Deserialize)]
struct WireView {
    leader: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    admin: Option<String>,
}

/// `/crescent/<cluster>/master_view` (the cluster id checked as the oplog checks it).
pub fn master_view_key(cluster: &str) -> Result<Vec<u8>, ClusterIdError> {
    OpLogKeys::new(cluster)?;
    Ok(format!("/crescent/{cluster}/master_view").into_bytes())
}

impl MasterView {
    /// The value a leader stores (the version is the key's create revision, not part of the value).
    pub fn encode_value(leader: &str, admin: Option<&str>) -> Vec<u8> {
        let wire = WireView { leader: leader.to_owned(), admin: admin.map(str::to_owned) };
        // Serialising two strings cannot fail.
        serde_json::to_vec(&wire).unwrap_or_default()
    }

    /// The view a stored `value` describes at `version`.
    pub fn decode(value: &[u8], version: u64) -> Result<Self, ViewError> {
        if value.len() > MAX_VIEW_VALUE_BYTES {
            return Err(ViewError::Malformed(format!("{} bytes, the limit is {MAX_VIEW_VALUE_BYTES}", value.len())));
        }
        let wire: WireView = serde_json::from_slice(value).map_err(|e| ViewError::Malformed(e.to_string()))?;
        if wire.leader.is_empty() {
            return Err(ViewError::Malformed("empty leader address".into()));
        }
        if version == 0 {
            return Err(ViewError::Malformed("view version 0".into()));
        }
        Ok(Self { leader: wire.leader, admin: wire.admin, version })
    }
}

/// Where a party finds the master: directly, or through a cluster's master view in etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MasterAddress {
    /// `host:port`, or several separated by commas (tried in turn).
    Direct(Vec<String>),
    /// `etcd://HOST:PORT[,HOST:PORT…]/CLUSTER`, or the original's `etcd://h1:p;h2:p` (cluster from
    /// [`CLUSTER_ID_ENV`], else [`DEFAULT_CLUSTER_ID`]).
    Etcd {
        /// etcd endpoints, `host:port` each.
        endpoints: Vec<String>,
        /// The cluster whose leader to follow.
        cluster: String,
    },
}

impl MasterAddress {
    /// Parses an address, taking the cluster id from the environment when an `etcd://` address names none.
    pub fn parse(s: &str) -> Result<Self, ViewError> {
        Self::parse_with(s, std::env::var(CLUSTER_ID_ENV).ok().as_deref())
    }

    /// Parses an address; `default_cluster` is used when an `etcd://` address names none.
    pub fn parse_with(s: &str, default_cluster: Option<&str>) -> Result<Self, ViewError> {
        let bad = || ViewError::BadAddress(s.to_owned());
        let s = s.trim();
        let Some(rest) = s.strip_prefix("etcd://") else {
            let hosts: Vec<String> = s.split(',').map(|h| h.trim().to_owned()).collect();
            if hosts.iter().any(|h| !is_host_port(h)) {
                return Err(bad());
            }
            return Ok(Self::Direct(hosts));
        };
        let (hosts, cluster) = match rest.split_once('/') {
            Some((h, c)) if !c.is_empty() => (h, c.to_owned()),
            Some((h, _)) => (h, default_cluster.unwrap_or(DEFAULT_CLUSTER_ID).to_owned()),
            None => (rest, default_cluster.unwrap_or(DEFAULT_CLUSTER_ID).to_owned()),
        };
        let endpoints: Vec<String> = hosts.split([',', ';']).map(|h| h.trim().to_owned()).collect();
        if endpoints.iter().any(|h| !is_host_port(h)) {
            return Err(bad());
        }
        OpLogKeys::new(&cluster)?;
        Ok(Self::Etcd { endpoints, cluster })
    }
}

/// `host:port` with a non-empty host and a numeric port.
fn is_host_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_value_round_trips_and_pins_its_encoding() {
        let v = MasterView::encode_value("10.0.0.1:50051", Some("10.0.0.1:9003"));
        assert_eq!(v, br#"{"leader":"10.0.0.1:50051","admin":"10.0.0.1:9003"}"#);
        let view = MasterView::decode(&v, 7).unwrap();
        assert_eq!(
            view,
            MasterView { leader: "10.0.0.1:50051".into(), admin: Some("10.0.0.1:9003".into()), version: 7 }
        );
        assert_eq!(MasterView::encode_value("h:1", None), br#"{"leader":"h:1"}"#);
    }

    #[test]
    fn malformed_views_are_refused() {
        assert!(matches!(MasterView::decode(b"h:1", 3), Err(ViewError::Malformed(_))));
        assert!(matches!(MasterView::decode(br#"{"leader":""}"#, 3), Err(ViewError::Malformed(_))));
        assert!(matches!(MasterView::decode(br#"{"leader":"h:1"}"#, 0), Err(ViewError::Malformed(_))));
        let big = vec![b' '; MAX_VIEW_VALUE_BYTES + 1];
        assert!(matches!(MasterView::decode(&big, 3), Err(ViewError::Malformed(_))));
    }

    #[test]
    fn key_is_per_cluster_and_checks_the_id() {
        assert_eq!(master_view_key("prod-1").unwrap(), b"/crescent/prod-1/master_view");
        assert!(master_view_key("a/b").is_err());
    }

    #[test]
    fn addresses_parse_in_every_documented_form() {
        assert_eq!(MasterAddress::parse_with("h:1", None).unwrap(), MasterAddress::Direct(vec!["h:1".into()]));
        assert_eq!(
            MasterAddress::parse_with("h:1, g:2", None).unwrap(),
            MasterAddress::Direct(vec!["h:1".into(), "g:2".into()])
        );
        let etcd = |e: &[&str], c: &str| MasterAddress::Etcd {
            endpoints: e.iter().map(|s| s.to_string()).collect(),
            cluster: c.into(),
        };
        assert_eq!(MasterAddress::parse_with("etcd://a:1,b:2/prod", None).unwrap(), etcd(&["a:1", "b:2"], "prod"));
        assert_eq!(MasterAddress::parse_with("etcd://a:1;b:2", Some("env")).unwrap(), etcd(&["a:1", "b:2"], "env"));
        assert_eq!(MasterAddress::parse_with("etcd://a:1", None).unwrap(), etcd(&["a:1"], DEFAULT_CLUSTER_ID));
        assert_eq!(MasterAddress::parse_with("etcd://a:1/", None).unwrap(), etcd(&["a:1"], DEFAULT_CLUSTER_ID));
        for bad in ["", "h", "h:x", "etcd://", "etcd://a:1/bad id", "etcd://a:1,/c", ":1"] {
            assert!(MasterAddress::parse_with(bad, None).is_err(), "{bad:?} should be refused");
        }
    }
}
