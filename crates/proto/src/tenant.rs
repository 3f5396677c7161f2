//! Tenant identifiers.

use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;
use std::sync::Arc;

/// Longest tenant id in bytes. Every mutation names its tenant in the operation log, whose entries hold at most
/// this many (the master checks at compile time that the two agree), so a longer id is refused here, before
/// anything changes, rather than applied and then refused by the log.
pub const MAX_TENANT_LEN: usize = 256;

/// Why a string is not a valid tenant id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantIdError {
    /// Longer than [`MAX_TENANT_LEN`] bytes.
    #[error("tenant id is {0} bytes, the limit is {MAX_TENANT_LEN}")]
    TooLong(usize),
    /// `_` prefixes are reserved for the system.
    #[error("tenant id {0:?} starts with the reserved prefix '_'")]
    ReservedPrefix(String),
    /// Control bytes (< 0x20, 0x7F) are refused so ids print and log safely.
    #[error("tenant id {0:?} contains a control byte")]
    ControlByte(String),
}

/// A tenant (namespace and quota owner). `""` means `default`. Cheap to clone: tenant ids are shared by every
/// object of the tenant.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct TenantId(Arc<str>);

impl TenantId {
    /// The name of the tenant every request belongs to when multi-tenancy is off or no tenant is named.
    pub const DEFAULT: &'static str = "default";

    /// Validates a tenant id; `""` becomes `default`.
    pub fn new(id: &str) -> Result<Self, TenantIdError> {
        if id.is_empty() {
            return Ok(Self::default_tenant());
        }
        if id.len() > MAX_TENANT_LEN {
            return Err(TenantIdError::TooLong(id.len()));
        }
        if id.starts_with('_') {
            return Err(TenantIdError::ReservedPrefix(id.to_owned()));
        }
        if id.bytes().any(|b| b < 0x20 || b == 0x7F) {
            return Err(TenantIdError::ControlByte(id.to_owned()));
        }
        Ok(Self(Arc::from(id)))
    }

    /// The `default` tenant.
    pub fn default_tenant() -> Self {
        Self(Arc::from(Self::DEFAULT))
    }

    /// Whether this is the `default` tenant.
    pub fn is_default(&self) -> bool {
        &*self.0 == Self::DEFAULT
    }

    /// The normalised id text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TenantId {
    fn default() -> Self {
        Self::default_tenant()
    }
}

impl<'de> Deserialize<'de> for TenantId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        TenantId::new(&s).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TenantId({:?})", &*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_means_default() {
        let t = TenantId::new("").unwrap();
        assert!(t.is_default());
        assert_eq!(t, TenantId::new("default").unwrap());
        assert_eq!(t, TenantId::default());
    }

    #[test]
    fn reserved_and_control_bytes_are_invalid() {
        assert!(matches!(TenantId::new("_sys"), Err(TenantIdError::ReservedPrefix(_))));
        assert!(TenantId::new(&"t".repeat(MAX_TENANT_LEN)).is_ok());
        assert_eq!(TenantId::new(&"t".repeat(MAX_TENANT_LEN + 1)), Err(TenantIdError::TooLong(MAX_TENANT_LEN + 1)));
        for bad in ["a\0b", "line\n", "tab\t", "del\x7f", "\x1f"] {
            assert!(matches!(TenantId::new(bad), Err(TenantIdError::ControlByte(_))), "{bad:?}");
        }
        for good in ["a", "tenant-a", "a_b", "ünïcode", " space", "~"] {
            assert!(TenantId::new(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn deserialisation_validates() {
        let bad = postcard::to_stdvec(&"_x").unwrap();
        assert!(postcard::from_bytes::<TenantId>(&bad).is_err());
        let empty = postcard::to_stdvec(&"").unwrap();
        assert!(postcard::from_bytes::<TenantId>(&empty).unwrap().is_default());
    }
}
