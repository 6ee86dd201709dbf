//! What the guest's measuring and checking tools share, so that every tool
//! means the same thing by a percentile or a test pattern: `mctool`,
//! `imc-bench`, `ump-tool` and the QEMU tier's checks. No I/O.
//!
//! - [`stats`]: nearest-rank percentiles of raw latency samples.
//! - [`pattern`]: the non-repeating test pattern `mctool fill` writes and
//!   the tests check.
#![warn(missing_docs)]

pub mod stats;

/// A non-repeating test pattern: `len` bytes for `page` with `seed`
/// (xorshift64*, 8 bytes per step, never all zero).
pub fn pattern(seed: u64, page: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ page.wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_deterministic_and_does_not_repeat() {
        let a = pattern(7, 0, 8192);
        assert_eq!(a, pattern(7, 0, 8192));
        assert_ne!(a, pattern(7, 1, 8192));
        assert_ne!(a, pattern(8, 0, 8192));
        let words: std::collections::HashSet<&[u8]> = a.chunks(8).collect();
        assert_eq!(words.len(), 1024, "every 8-byte word differs");
    }
}
