//! crc32c of data that lands in pieces: each piece is summed as it arrives (while its bytes are still in
//! cache, overlapping the wait for the next piece), and the sums of adjacent ranges are joined afterwards in
//! O(log n) instead of re-reading the bytes.
//!
//! Joining uses the CRC's linearity: `crc(A ‖ B) = crc(A) · x^(8·|B|) mod P  ⊕  crc(B)` (the pre- and
//! post-inversion cancel out). Polynomials are kept in the CRC's reflected bit order: bit 31 is the
//! coefficient of x^0.

/// The reflected CRC-32C (Castagnoli) polynomial.
const POLY: u32 = 0x82F6_3B78;

/// The polynomial `1` (x^0) in reflected order.
const ONE: u32 = 1 << 31;

/// `a · b mod P`: shift-and-add over the bits of `a`, multiplying `b` by x at each step.
fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = ONE;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        bit >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    product
}

/// `x^(8·len) mod P`: the operator that appends `len` zero bytes to a crc register.
fn zeros_operator(len: u64) -> u32 {
    // Square-and-multiply over the bits of 8·len, starting from x^1 (bit 30 in reflected order). `len` is a
    // byte count below 2^61, so the bit count fits a u64 too.
    let mut bits = len << 3;
    let mut power = ONE >> 1;
    let mut result = ONE;
    while bits != 0 {
        if bits & 1 != 0 {
            result = mul_mod(result, power);
        }
        power = mul_mod(power, power);
        bits >>= 1;
    }
    result
}

/// The crc32c of `A ‖ B` from `crc(A)`, `crc(B)` and `|B|` in bytes.
pub(crate) fn combine(first: u32, second: u32, second_len: u64) -> u32 {
    if second_len == 0 {
        return first;
    }
    mul_mod(zeros_operator(second_len), first) ^ second
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u64) -> Vec<u8> {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..len).map(|_| rng.u8(..)).collect()
    }

    #[test]
    fn joining_two_sums_equals_summing_the_concatenation() {
        for (a, b) in [(0, 0), (0, 1), (1, 0), (1, 1), (3, 5), (4096, 1), (1, 4096), (65_537, 262_144), (100, 999)] {
            let bytes = data(a + b, (a * 31 + b) as u64);
            let (head, tail) = bytes.split_at(a);
            assert_eq!(
                combine(crc32c::crc32c(head), crc32c::crc32c(tail), tail.len() as u64),
                crc32c::crc32c(&bytes),
                "split {a}+{b}"
            );
        }
    }

    #[test]
    fn many_pieces_join_in_order_and_order_matters() {
        let bytes = data(1 << 20, 7);
        let pieces: Vec<&[u8]> = bytes.chunks(77_777).collect();
        let joined = pieces.iter().fold(0, |crc, p| combine(crc, crc32c::crc32c(p), p.len() as u64));
        assert_eq!(joined, crc32c::crc32c(&bytes));
        let reversed = pieces.iter().rev().fold(0, |crc, p| combine(crc, crc32c::crc32c(p), p.len() as u64));
        assert_ne!(reversed, joined);
    }

    #[test]
    fn agrees_with_the_crates_own_combine() {
        let (a, b) = (0x1234_5678, 0x9abc_def0);
        for len in [1u64, 2, 3, 8, 1000, 1 << 18, (1 << 26) + 3] {
            assert_eq!(combine(a, b, len), crc32c::crc32c_combine(a, b, len as usize), "len {len}");
        }
    }
}
