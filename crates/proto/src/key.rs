//! Object keys.

use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;

/// The longest key accepted, in bytes (the original system's limit).
pub const MAX_KEY_LEN: usize = 4096;

/// Why a string is not a valid [`ObjectKey`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Keys must hold at least one byte.
    #[error("object key is empty")]
    Empty,
    /// Keys are bounded so one request cannot make the master allocate without limit.
    #[error("object key is {len} bytes, the limit is {MAX_KEY_LEN}")]
    TooLong {
        /// The offending key's length in bytes.
        len: usize,
    },
}

impl KeyError {
    /// The wire code: an empty key is `INVALID_PARAMS`, an oversized one `INVALID_KEY`.
    pub fn code(&self) -> crate::ErrorCode {
        match self {
            KeyError::Empty => crate::ErrorCode::InvalidParams,
            KeyError::TooLong { .. } => crate::ErrorCode::InvalidKey,
        }
    }
}

/// A user key: non-empty UTF-8, at most [`MAX_KEY_LEN`] bytes. It may contain any character, NUL included; the
/// tenant is never part of it (identity is the pair `(TenantId, ObjectKey)`).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ObjectKey(Box<str>);

impl ObjectKey {
    /// Validates and wraps a key.
    pub fn new(key: impl Into<String>) -> Result<Self, KeyError> {
        let key: String = key.into();
        Self::check(&key)?;
        Ok(Self(key.into_boxed_str()))
    }

    /// Checks a borrowed key without allocating.
    pub fn check(key: &str) -> Result<(), KeyError> {
        if key.is_empty() {
            Err(KeyError::Empty)
        } else if key.len() > MAX_KEY_LEN {
            Err(KeyError::TooLong { len: key.len() })
        } else {
            Ok(())
        }
    }

    /// The key text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for ObjectKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ObjectKey::new(s).map_err(serde::de::Error::custom)
    }
}

impl TryFrom<&str> for ObjectKey {
    type Error = KeyError;
    fn try_from(s: &str) -> Result<Self, KeyError> {
        ObjectKey::new(s)
    }
}

impl AsRef<str> for ObjectKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_limits_are_enforced() {
        assert_eq!(ObjectKey::new(""), Err(KeyError::Empty));
        assert!(ObjectKey::new("a".repeat(MAX_KEY_LEN)).is_ok());
        assert_eq!(ObjectKey::new("a".repeat(MAX_KEY_LEN + 1)), Err(KeyError::TooLong { len: MAX_KEY_LEN + 1 }));
        assert_eq!(ObjectKey::new("with\0nul").unwrap().as_str(), "with\0nul");
    }

    #[test]
    fn deserialisation_rechecks_limits() {
        let bytes = postcard::to_stdvec(&"").unwrap();
        assert!(postcard::from_bytes::<ObjectKey>(&bytes).is_err());
        let long = "k".repeat(MAX_KEY_LEN + 1);
        let bytes = postcard::to_stdvec(&long).unwrap();
        assert!(postcard::from_bytes::<ObjectKey>(&bytes).is_err());
        let ok = ObjectKey::new("prefix/block-1").unwrap();
        let bytes = postcard::to_stdvec(&ok).unwrap();
        assert_eq!(postcard::from_bytes::<ObjectKey>(&bytes).unwrap(), ok);
    }
}
