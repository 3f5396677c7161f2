//! Deterministic value patterns: different for every seed and every offset, so a value read back from the
//! wrong key, the wrong offset or a stale replica never passes for the right one.

/// `len` pseudo-random bytes (xorshift64) for `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Whether `got` is exactly `pattern(len, seed)`; otherwise where it first differs (or how the lengths do).
pub fn check(got: &[u8], len: usize, seed: u64) -> Result<(), String> {
    if got.len() != len {
        return Err(format!("{} bytes, expected {len}", got.len()));
    }
    let want = pattern(len, seed);
    match got.iter().zip(&want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!("byte {i} of {len} is {:#04x}, expected {:#04x} (seed {seed})", got[i], want[i])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_seed_and_check_names_the_first_difference() {
        let a = pattern(1000, 1);
        assert_eq!(a, pattern(1000, 1));
        assert_ne!(a, pattern(1000, 2));
        assert_eq!(pattern(1001, 1)[..1000], a[..], "a longer pattern extends a shorter one");
        check(&a, 1000, 1).unwrap();
        let mut bad = a.clone();
        bad[700] ^= 1;
        assert!(check(&bad, 1000, 1).unwrap_err().starts_with("byte 700 of 1000"));
        assert!(check(&a[..999], 1000, 1).unwrap_err().contains("999 bytes"));
    }
}
