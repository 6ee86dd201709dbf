//! x87 extended precision (C `long double` on x86_64) in software: compare,
//! add and multiply with one rounding to nearest-even at 64 significand
//! bits, as the FPU does under Linux's default precision control. Values
//! are 10 bytes (64-bit significand with explicit integer bit, then sign
//! and 15-bit exponent) in 16 bytes of storage; the 6 padding bytes of the
//! result are left as they were. Pure functions.

use std::cmp::Ordering;

const BIAS: i32 = 16383;
const EXP_MAX: i32 = 0x7fff;
/// The "real indefinite" NaN the FPU returns for invalid operations.
const INDEFINITE: (bool, u16, u64) = (true, 0x7fff, 0xc000_0000_0000_0000);

/// A decoded value.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Val {
    /// A NaN, as its encoded parts (quieted).
    Nan(bool, u16, u64),
    /// An infinity.
    Inf(bool),
    /// A zero.
    Zero(bool),
    /// `m * 2^e`, `m` with its top bit set.
    Fin(bool, i32, u64),
}

/// The encoded parts: sign, 15-bit exponent, significand.
pub(super) fn parts(b: &[u8]) -> (bool, u16, u64) {
    let se = u16::from_le_bytes([b[8], b[9]]);
    let mut m = [0u8; 8];
    m.copy_from_slice(&b[..8]);
    (se & 0x8000 != 0, se & 0x7fff, u64::from_le_bytes(m))
}

fn decode(b: &[u8]) -> Val {
    let (s, e, m) = parts(b);
    if e as i32 == EXP_MAX {
        return if m << 1 == 0 { Val::Inf(s) } else { Val::Nan(s, e, m | 0xc000_0000_0000_0000) };
    }
    if m == 0 {
        return Val::Zero(s);
    }
    if e != 0 && m >> 63 == 0 {
        // An unnormal: the FPU treats it as an invalid operand.
        let (s, e, m) = INDEFINITE;
        return Val::Nan(s, e, m);
    }
    // Denormals (e == 0) scale like e == 1.
    let lz = m.leading_zeros() as i32;
    let exp = (e as i32).max(1) - BIAS - 63 - lz;
    Val::Fin(s, exp, m << lz)
}

fn encode(out: &mut [u8], (s, e, m): (bool, u16, u64)) {
    out[..8].copy_from_slice(&m.to_le_bytes());
    let se = e | if s { 0x8000 } else { 0 };
    out[8..10].copy_from_slice(&se.to_le_bytes());
}

/// Shifts right, folding the bits shifted out into the lowest bit.
fn shr_sticky(x: u128, d: u32) -> u128 {
    if d == 0 {
        x
    } else if d >= 128 {
        u128::from(x != 0)
    } else {
        (x >> d) | u128::from(x & ((1u128 << d) - 1) != 0)
    }
}

/// Rounds `m * 2^e` (m not zero) to the nearest x87 value, ties to even.
fn round(s: bool, m: u128, e: i32) -> (bool, u16, u64) {
    let lz = m.leading_zeros() as i32;
    let mut m = m << lz;
    // Now the value is (m >> 64) * 2^(e - lz + 64) with rounding bits below.
    let mut field = e - lz + 64 + BIAS + 63;
    if field <= 0 {
        // Denormal: exponent field 0 scales like 1.
        m = shr_sticky(m, (1 - field).min(200) as u32);
        field = 0;
    }
    let mut sig = (m >> 64) as u64;
    let rest = m as u64;
    let half = 1u64 << 63;
    if rest > half || (rest == half && sig & 1 == 1) {
        let (n, carry) = sig.overflowing_add(1);
        sig = n;
        if carry {
            sig = 1 << 63;
            field += 1;
        }
    }
    if field == 0 && sig >> 63 == 1 {
        // A denormal rounded up to the smallest normal.
        field = 1;
    }
    if field >= EXP_MAX {
        return (s, EXP_MAX as u16, 1 << 63);
    }
    if sig == 0 {
        return (s, 0, 0);
    }
    (s, field as u16, sig)
}

fn fin_add(a: (bool, i32, u64), b: (bool, i32, u64)) -> (bool, u16, u64) {
    // Larger exponent first.
    let (a, b) = if a.1 >= b.1 { (a, b) } else { (b, a) };
    let ma = (a.2 as u128) << 63;
    let mb = shr_sticky((b.2 as u128) << 63, (a.1 - b.1) as u32);
    let e = a.1 - 63;
    if a.0 == b.0 {
        return round(a.0, ma + mb, e);
    }
    match ma.cmp(&mb) {
        Ordering::Equal => (false, 0, 0),
        Ordering::Greater => round(a.0, ma - mb, e),
        Ordering::Less => round(b.0, mb - ma, e),
    }
}

/// `a + b`, written to `out[..10]`.
pub(super) fn add(a: &[u8], b: &[u8], out: &mut [u8]) {
    let r = match (decode(a), decode(b)) {
        (Val::Nan(s, e, m), _) | (_, Val::Nan(s, e, m)) => (s, e, m),
        (Val::Inf(x), Val::Inf(y)) if x != y => INDEFINITE,
        (Val::Inf(x), _) | (_, Val::Inf(x)) => (x, EXP_MAX as u16, 1 << 63),
        (Val::Zero(x), Val::Zero(y)) => (x && y, 0, 0),
        (Val::Zero(_), Val::Fin(s, e, m)) | (Val::Fin(s, e, m), Val::Zero(_)) => round(s, m as u128, e),
        (Val::Fin(s, e, m), Val::Fin(t, f, n)) => fin_add((s, e, m), (t, f, n)),
    };
    encode(out, r);
}

/// `a * b`, written to `out[..10]`.
pub(super) fn mul(a: &[u8], b: &[u8], out: &mut [u8]) {
    let r = match (decode(a), decode(b)) {
        (Val::Nan(s, e, m), _) | (_, Val::Nan(s, e, m)) => (s, e, m),
        (Val::Inf(_), Val::Zero(_)) | (Val::Zero(_), Val::Inf(_)) => INDEFINITE,
        (Val::Inf(x), Val::Inf(y) | Val::Fin(y, ..)) | (Val::Fin(x, ..), Val::Inf(y)) => {
            (x != y, EXP_MAX as u16, 1 << 63)
        }
        (Val::Zero(x), Val::Zero(y) | Val::Fin(y, ..)) | (Val::Fin(x, ..), Val::Zero(y)) => (x != y, 0, 0),
        (Val::Fin(s, e, m), Val::Fin(t, f, n)) => round(s != t, m as u128 * n as u128, e + f),
    };
    encode(out, r);
}

/// Negates in place.
pub(super) fn negate(v: &mut [u8]) {
    v[9] ^= 0x80;
}

/// Compares two values; `None` if either is a NaN (or an unnormal).
pub(super) fn compare(a: &[u8], b: &[u8]) -> Option<Ordering> {
    let key = |v: Val| match v {
        Val::Nan(..) => None,
        Val::Zero(_) => Some((0i8, 0i32, 0u64)),
        Val::Inf(s) => Some((if s { -1 } else { 1 }, i32::MAX, 0)),
        Val::Fin(s, e, m) => Some((if s { -1 } else { 1 }, e, m)),
    };
    let (x, y) = (key(decode(a))?, key(decode(b))?);
    Some(match x.0.cmp(&y.0) {
        Ordering::Equal if x.0 < 0 => (y.1, y.2).cmp(&(x.1, x.2)),
        Ordering::Equal => (x.1, x.2).cmp(&(y.1, y.2)),
        o => o,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The x87 encoding of a finite or infinite f64 (exact).
    fn from_f64(x: f64) -> [u8; 16] {
        let bits = x.to_bits();
        let s = bits >> 63 == 1;
        let e = ((bits >> 52) & 0x7ff) as i32;
        let f = bits & ((1 << 52) - 1);
        let mut out = [0u8; 16];
        let r = if e == 0x7ff {
            (s, 0x7fff, (1 << 63) | (f << 11))
        } else if e == 0 && f == 0 {
            (s, 0, 0)
        } else if e == 0 {
            round(s, f as u128, -1074)
        } else {
            (s, (e - 1023 + BIAS) as u16, (1 << 63) | (f << 11))
        };
        encode(&mut out, r);
        out
    }

    fn val(s: bool, e: u16, m: u64) -> [u8; 16] {
        let mut b = [0u8; 16];
        encode(&mut b, (s, e, m));
        b
    }

    fn sum(a: &[u8; 16], b: &[u8; 16]) -> (bool, u16, u64) {
        let mut o = [0u8; 16];
        add(a, b, &mut o);
        parts(&o)
    }

    fn prod(a: &[u8; 16], b: &[u8; 16]) -> (bool, u16, u64) {
        let mut o = [0u8; 16];
        mul(a, b, &mut o);
        parts(&o)
    }

    const ONE: u64 = 1 << 63;

    #[test]
    fn sums_round_to_nearest_even_at_64_bits() {
        let one = val(false, 0x3fff, ONE);
        assert_eq!(sum(&one, &one), (false, 0x4000, ONE));
        // 1 + 2^-63: one more ulp, which a double would lose.
        let ulp = val(false, 0x3fff - 63, ONE);
        assert_eq!(sum(&one, &ulp), (false, 0x3fff, ONE + 1));
        // 1 + 2^-64: a tie, to even.
        let half_ulp = val(false, 0x3fff - 64, ONE);
        assert_eq!(sum(&one, &half_ulp), (false, 0x3fff, ONE));
        // 1 + 2^-64 (1 + 2^-36): above the tie, up.
        let above = val(false, 0x3fff - 64, ONE + (1 << 27));
        assert_eq!(sum(&one, &above), (false, 0x3fff, ONE + 1));
        // (1 + 2^-63) + 2^-64: a tie from an odd significand, up.
        let odd = val(false, 0x3fff, ONE + 1);
        assert_eq!(sum(&odd, &half_ulp), (false, 0x3fff, ONE + 2));
        // Cancellation: 1 - (1 + 2^-63) = -2^-63.
        let minus_odd = val(true, 0x3fff, ONE + 1);
        assert_eq!(sum(&one, &minus_odd), (true, 0x3fff - 63, ONE));
        // x - x is +0; -0 + -0 is -0.
        let minus_one = val(true, 0x3fff, ONE);
        assert_eq!(sum(&one, &minus_one), (false, 0, 0));
        assert_eq!(sum(&val(true, 0, 0), &val(true, 0, 0)), (true, 0, 0));
        // Overflow to infinity; infinities; NaN.
        let max = val(false, 0x7ffe, u64::MAX);
        assert_eq!(sum(&max, &max), (false, 0x7fff, ONE));
        let inf = val(false, 0x7fff, ONE);
        let minus_inf = val(true, 0x7fff, ONE);
        assert_eq!(sum(&inf, &minus_inf), INDEFINITE);
        assert_eq!(sum(&inf, &one), (false, 0x7fff, ONE));
        // Denormals: the smallest twice, and carrying into the normals.
        let tiny = val(false, 0, 1);
        assert_eq!(sum(&tiny, &tiny), (false, 0, 2));
        let big_denormal = val(false, 0, ONE - 1);
        assert_eq!(sum(&big_denormal, &tiny), (false, 1, ONE));
    }

    #[test]
    fn products() {
        let odd = val(false, 0x3fff, ONE + 1);
        // (1 + 2^-63)^2 = 1 + 2^-62 + 2^-126: rounds to 1 + 2^-62.
        assert_eq!(prod(&odd, &odd), (false, 0x3fff, ONE + 2));
        assert_eq!(prod(&from_f64(-2.0), &from_f64(3.0)), parts(&from_f64(-6.0)));
        assert_eq!(prod(&from_f64(0.0), &from_f64(-3.0)), (true, 0, 0));
        let inf = val(false, 0x7fff, ONE);
        assert_eq!(prod(&inf, &from_f64(0.0)), INDEFINITE);
        assert_eq!(prod(&inf, &from_f64(-1.0)), (true, 0x7fff, ONE));
        // Underflow to the smallest denormal and to zero.
        let small = val(false, 1, ONE);
        let half = from_f64(0.5);
        assert_eq!(prod(&small, &half), (false, 0, ONE >> 1));
        let tiny = val(false, 0, 1);
        assert_eq!(prod(&tiny, &half), (false, 0, 0));
    }

    #[test]
    fn comparisons() {
        let c = |a: f64, b: f64| compare(&from_f64(a), &from_f64(b));
        assert_eq!(c(1.0, 2.0), Some(Ordering::Less));
        assert_eq!(c(-1.0, -2.0), Some(Ordering::Greater));
        assert_eq!(c(-0.0, 0.0), Some(Ordering::Equal));
        assert_eq!(c(f64::NEG_INFINITY, -1e300), Some(Ordering::Less));
        assert_eq!(c(f64::NAN, 1.0), None);
        assert_eq!(c(5e-324, 0.0), Some(Ordering::Greater));
    }

    proptest! {
        // Multiples of 2^-10 with 24-bit magnitudes: their sums (35 bits)
        // and products (48 bits) are exact in both formats, so the x87
        // result must be the f64 one exactly.
        #[test]
        fn agrees_with_exact_f64(i in -(1i32 << 24)..(1 << 24), j in -(1i32 << 24)..(1 << 24)) {
            let (a, b) = (i as f64 / 1024.0, j as f64 / 1024.0);
            let (x, y) = (from_f64(a), from_f64(b));
            prop_assert_eq!(sum(&x, &y), parts(&from_f64(a + b)));
            prop_assert_eq!(prod(&x, &y), parts(&from_f64(a * b)));
        }
    }
}
