//! Self-describing values: every value a campaign writes says which key and which write it belongs to, and how
//! long and what its payload is, so a read can be judged from its bytes alone.
//!
//! Layout (little-endian): `MAGIC` (8 bytes) | key length `u16` | key | write id `u64` | payload length `u32` |
//! crc32c of the payload `u32` | payload. The payload is a pseudo-random stream seeded by the write id.

/// The first bytes of every value.
pub const MAGIC: &[u8; 8] = b"CHAOSv1\0";

/// The value of write `wid` of `key`, with a payload of `len` bytes.
pub fn encode(key: &str, wid: u64, len: usize) -> Vec<u8> {
    let mut payload = vec![0u8; len];
    let mut rng = fastrand::Rng::with_seed(wid);
    rng.fill(&mut payload);
    let mut v = Vec::with_capacity(MAGIC.len() + 2 + key.len() + 16 + len);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&(key.len() as u16).to_le_bytes());
    v.extend_from_slice(key.as_bytes());
    v.extend_from_slice(&wid.to_le_bytes());
    v.extend_from_slice(&(len as u32).to_le_bytes());
    v.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    v.extend_from_slice(&payload);
    v
}

/// Why bytes read for a key are not a whole value written to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Torn {
    /// The bytes end before the header or the payload it announces does.
    #[error("truncated: {0} bytes")]
    Truncated(usize),
    /// The bytes go on past the payload the header announces.
    #[error("{extra} bytes past the announced payload")]
    Trailing {
        /// Bytes too many.
        extra: usize,
    },
    /// No magic at the start.
    #[error("no header (first bytes {0})")]
    NoHeader(String),
    /// The header names another key.
    #[error("value of key {0:?}")]
    OtherKey(String),
    /// The payload's checksum differs from the header's.
    #[error("payload crc32c {got:#010x}, header says {want:#010x}")]
    Checksum {
        /// Summed over the payload read.
        got: u32,
        /// In the header.
        want: u32,
    },
}

fn take<'a>(b: &mut &'a [u8], n: usize, total: usize) -> Result<&'a [u8], Torn> {
    if b.len() < n {
        return Err(Torn::Truncated(total));
    }
    let (head, rest) = b.split_at(n);
    *b = rest;
    Ok(head)
}

fn array<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&s[..N]);
    a
}

/// The write id of `bytes` read for `key`, if they are a whole value of that key.
pub fn decode(key: &str, bytes: &[u8]) -> Result<u64, Torn> {
    let total = bytes.len();
    let mut b = bytes;
    let magic = take(&mut b, MAGIC.len(), total)?;
    if magic != MAGIC {
        return Err(Torn::NoHeader(hex::encode(magic)));
    }
    let klen = u16::from_le_bytes(array(take(&mut b, 2, total)?)) as usize;
    let k = take(&mut b, klen, total)?;
    if k != key.as_bytes() {
        return Err(Torn::OtherKey(String::from_utf8_lossy(k).into_owned()));
    }
    let wid = u64::from_le_bytes(array(take(&mut b, 8, total)?));
    let len = u32::from_le_bytes(array(take(&mut b, 4, total)?)) as usize;
    let want = u32::from_le_bytes(array(take(&mut b, 4, total)?));
    let payload = take(&mut b, len, total)?;
    if !b.is_empty() {
        return Err(Torn::Trailing { extra: b.len() });
    }
    let got = crc32c::crc32c(payload);
    if got != want {
        return Err(Torn::Checksum { got, want });
    }
    Ok(wid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_decodes_to_its_write() {
        let v = encode("k1", 42, 3000);
        assert_eq!(decode("k1", &v), Ok(42));
        assert_eq!(decode("k1", &encode("k1", 7, 0)), Ok(7));
    }

    #[test]
    fn torn_or_foreign_bytes_are_named() {
        let v = encode("k1", 42, 3000);
        assert_eq!(decode("k2", &v), Err(Torn::OtherKey("k1".into())));
        assert_eq!(decode("k1", &v[..v.len() - 1]), Err(Torn::Truncated(v.len() - 1)));
        assert_eq!(decode("k1", &v[..5]), Err(Torn::Truncated(5)));
        let mut long = v.clone();
        long.push(0);
        assert_eq!(decode("k1", &long), Err(Torn::Trailing { extra: 1 }));
        let mut flipped = v.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(matches!(decode("k1", &flipped), Err(Torn::Checksum { .. })));
        assert!(matches!(decode("k1", &[0u8; 64]), Err(Torn::NoHeader(_))));
        // Another write's payload under this write's header.
        let other = encode("k1", 43, 3000);
        let mut spliced = v[..v.len() - 3000].to_vec();
        spliced.extend_from_slice(&other[other.len() - 3000..]);
        assert!(matches!(decode("k1", &spliced), Err(Torn::Checksum { .. })));
    }
}
