//! What the measuring and checking tools share, so that every tool means
//! the same thing by a percentile or a test pattern, and draws the same
//! figures: `mctool`, `imc-bench`, `ump-tool`, `mpi-bench-plot` and the
//! QEMU tier's checks. No I/O, but how a tool ends ([`exit`]).
//!
//! - [`exit`]: a tool's `main`: exit codes, and 141 on a closed pipe.
//! - [`plot`]: log-log line plots as SVG (the benchmarks' figures).
//! - [`soak`]: the words of the soak workload and how a reader judges them.
//! - [`stats`]: nearest-rank percentiles of raw latency samples.
//! - [`pattern`]: the non-repeating test pattern `mctool fill` writes and
//!   the tests check.
//! - [`message`]: the bytes of a numbered test message, as `ump-tool`
//!   sends and checks them.
#![warn(missing_docs)]

pub mod exit;
pub mod plot;
pub mod soak;
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

/// The bytes of test message `seq` of `len` bytes (every byte depends on
/// both; xorshift64), as `ump-tool` sends and checks them.
pub fn message(seq: u64, len: usize) -> Vec<u8> {
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ len as u64 | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
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

    #[test]
    fn messages_depend_on_number_and_length() {
        let m = message(3, 1000);
        assert_eq!(m, message(3, 1000));
        assert_ne!(m, message(4, 1000));
        assert_ne!(m[..999], message(3, 999)[..], "the length is part of the seed");
        assert!(message(0, 0).is_empty());
        let distinct: std::collections::HashSet<u8> = m.iter().copied().collect();
        assert!(distinct.len() > 200, "the bytes vary: {} distinct", distinct.len());
    }
}
