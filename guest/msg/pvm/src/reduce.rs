//! The predefined reductions of `pvm_reduce` (`PvmSum`, `PvmProduct`,
//! `PvmMax`, `PvmMin`) on PVM's type codes: `x[i] = x[i] op y[i]` over
//! native bytes. Complex numbers add and multiply as complex numbers and
//! have no order (`PvmBadParam` for max and min), as in PVM. Pure
//! functions, on the calling thread.

use crate::consts::err;

/// A reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Sum,
    Product,
    Max,
    Min,
}

macro_rules! each {
    ($x:expr, $y:expr, $t:ty, $f:expr) => {{
        const W: usize = std::mem::size_of::<$t>();
        for (a, b) in $x.chunks_exact_mut(W).zip($y.chunks_exact(W)) {
            let p = <$t>::from_ne_bytes(a.try_into().unwrap_or([0; W]));
            let q = <$t>::from_ne_bytes(b.try_into().unwrap_or([0; W]));
            let r: $t = $f(p, q);
            a.copy_from_slice(&r.to_ne_bytes());
        }
    }};
}

macro_rules! numeric {
    ($op:expr, $x:expr, $y:expr, $t:ty, $wrap:ident) => {
        match $op {
            Op::Sum => each!($x, $y, $t, |p: $t, q: $t| p.$wrap(q)),
            Op::Product => each!($x, $y, $t, |p: $t, q: $t| p * q),
            Op::Max => each!($x, $y, $t, |p: $t, q: $t| if q > p { q } else { p }),
            Op::Min => each!($x, $y, $t, |p: $t, q: $t| if q < p { q } else { p }),
        }
    };
}

trait Add2 {
    fn add2(self, o: Self) -> Self;
}
macro_rules! add2_float {
    ($($t:ty),*) => {$(impl Add2 for $t { fn add2(self, o: Self) -> Self { self + o } })*};
}
add2_float!(f32, f64);

/// Applies `op` to `n` items of PVM type `ty`: `x = x op y`.
pub fn apply(op: Op, ty: i32, x: &mut [u8], y: &[u8], n: usize) -> Result<(), i32> {
    let size = crate::consts::type_size(ty).ok_or(err::BAD_PARAM)?;
    if x.len() < n * size || y.len() < n * size {
        return Err(err::BAD_PARAM);
    }
    let (x, y) = (&mut x[..n * size], &y[..n * size]);
    match ty {
        2 => numeric!(op, x, y, i16, wrapping_add),
        3 => numeric!(op, x, y, i32, wrapping_add),
        8 => numeric!(op, x, y, i64, wrapping_add),
        9 => numeric!(op, x, y, u16, wrapping_add),
        10 => numeric!(op, x, y, u32, wrapping_add),
        11 => numeric!(op, x, y, u64, wrapping_add),
        4 => numeric!(op, x, y, f32, add2),
        6 => numeric!(op, x, y, f64, add2),
        5 => complex::<f32, 4>(op, x, y)?,
        7 => complex::<f64, 8>(op, x, y)?,
        _ => return Err(err::BAD_PARAM),
    }
    Ok(())
}

trait Float: Copy + std::ops::Add<Output = Self> + std::ops::Sub<Output = Self> + std::ops::Mul<Output = Self> {
    fn get(b: &[u8]) -> Self;
    fn put(self, b: &mut [u8]);
}
impl Float for f32 {
    fn get(b: &[u8]) -> Self {
        f32::from_ne_bytes(b.try_into().unwrap_or([0; 4]))
    }
    fn put(self, b: &mut [u8]) {
        b.copy_from_slice(&self.to_ne_bytes())
    }
}
impl Float for f64 {
    fn get(b: &[u8]) -> Self {
        f64::from_ne_bytes(b.try_into().unwrap_or([0; 8]))
    }
    fn put(self, b: &mut [u8]) {
        b.copy_from_slice(&self.to_ne_bytes())
    }
}

fn complex<F: Float, const W: usize>(op: Op, x: &mut [u8], y: &[u8]) -> Result<(), i32> {
    for (a, b) in x.chunks_exact_mut(2 * W).zip(y.chunks_exact(2 * W)) {
        let (ar, ai) = (F::get(&a[..W]), F::get(&a[W..]));
        let (br, bi) = (F::get(&b[..W]), F::get(&b[W..]));
        let (r, i) = match op {
            Op::Sum => (ar + br, ai + bi),
            Op::Product => (ar * br - ai * bi, ar * bi + ai * br),
            Op::Max | Op::Min => return Err(err::BAD_PARAM),
        };
        r.put(&mut a[..W]);
        i.put(&mut a[W..]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(v: &[i32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn integers_and_floats_reduce() {
        let mut x = ints(&[1, -5, 7]);
        apply(Op::Sum, 3, &mut x, &ints(&[2, 5, i32::MAX]), 3).unwrap();
        assert_eq!(x, ints(&[3, 0, 7i32.wrapping_add(i32::MAX)]));
        let mut x = ints(&[1, -5, 7]);
        apply(Op::Max, 3, &mut x, &ints(&[2, -6, 7]), 3).unwrap();
        assert_eq!(x, ints(&[2, -5, 7]));
        apply(Op::Min, 3, &mut x, &ints(&[0, -6, 8]), 3).unwrap();
        assert_eq!(x, ints(&[0, -6, 7]));
        let mut d: Vec<u8> = [1.5f64, 2.0].iter().flat_map(|v| v.to_ne_bytes()).collect();
        let e: Vec<u8> = [2.0f64, -3.0].iter().flat_map(|v| v.to_ne_bytes()).collect();
        apply(Op::Product, 6, &mut d, &e, 2).unwrap();
        assert_eq!(d, [3.0f64, -6.0].iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<u8>>());
        let mut u = 250u16.to_ne_bytes().to_vec();
        apply(Op::Max, 9, &mut u, &40000u16.to_ne_bytes(), 1).unwrap();
        assert_eq!(u, 40000u16.to_ne_bytes());
    }

    #[test]
    fn complex_numbers_multiply_and_have_no_order() {
        let c = |v: [f32; 2]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let mut x = c([1.0, 2.0]);
        apply(Op::Product, 5, &mut x, &c([3.0, -1.0]), 1).unwrap();
        assert_eq!(x, c([5.0, 5.0]));
        apply(Op::Sum, 5, &mut x, &c([1.0, 1.0]), 1).unwrap();
        assert_eq!(x, c([6.0, 6.0]));
        assert_eq!(apply(Op::Max, 5, &mut x, &c([0.0, 0.0]), 1), Err(err::BAD_PARAM));
        assert_eq!(apply(Op::Sum, 1, &mut [0u8; 4], &[0u8; 4], 4), Err(err::BAD_PARAM), "bytes do not reduce");
        assert_eq!(apply(Op::Sum, 3, &mut [0u8; 4], &[0u8; 4], 2), Err(err::BAD_PARAM), "too short");
    }
}
