use super::*;
use std::sync::Arc;

fn bytes_i32(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect()
}

fn run_i32(op: Builtin, input: &[i32], inout: &[i32]) -> Vec<i32> {
    let mut io = bytes_i32(inout);
    reduce(op, Kind::Basic(Basic::Int), &bytes_i32(input), &mut io).unwrap();
    i32s(&io)
}

#[test]
fn integer_ops() {
    let a = [5, -3, 0, i32::MAX, 12];
    let b = [2, -7, 9, 1, 10];
    assert_eq!(run_i32(Builtin::Max, &a, &b), vec![5, -3, 9, i32::MAX, 12]);
    assert_eq!(run_i32(Builtin::Min, &a, &b), vec![2, -7, 0, 1, 10]);
    assert_eq!(run_i32(Builtin::Sum, &a, &b), vec![7, -10, 9, i32::MIN, 22]);
    assert_eq!(run_i32(Builtin::Prod, &a, &b), vec![10, 21, 0, i32::MAX, 120]);
    assert_eq!(run_i32(Builtin::Land, &a, &b), vec![1, 1, 0, 1, 1]);
    assert_eq!(run_i32(Builtin::Lor, &a, &[0, 0, 0, 0, 0]), vec![1, 1, 0, 1, 1]);
    assert_eq!(run_i32(Builtin::Lxor, &a, &b), vec![0, 0, 1, 0, 0]);
    assert_eq!(run_i32(Builtin::Band, &a, &b), vec![0, -7, 0, 1, 8]);
    assert_eq!(run_i32(Builtin::Bor, &a, &b), vec![7, -3, 9, i32::MAX, 14]);
    assert_eq!(run_i32(Builtin::Bxor, &a, &b), vec![7, 4, 9, i32::MAX - 1, 6]);
    assert_eq!(run_i32(Builtin::Replace, &a, &b), a.to_vec());
    assert_eq!(run_i32(Builtin::NoOp, &a, &b), b.to_vec());
    // Unsigned compare differs from signed.
    let mut io = 1u32.to_ne_bytes().to_vec();
    reduce(Builtin::Max, Kind::Basic(Basic::Unsigned), &u32::MAX.to_ne_bytes(), &mut io).unwrap();
    assert_eq!(io, u32::MAX.to_ne_bytes());
    let mut io = 1i64.to_ne_bytes().to_vec();
    reduce(Builtin::Sum, Kind::Basic(Basic::Count), &(1i64 << 40).to_ne_bytes(), &mut io).unwrap();
    assert_eq!(i64::from_ne_bytes(io.try_into().unwrap()), (1 << 40) + 1);
    let mut io = vec![0b1100u8, 0xff];
    reduce(Builtin::Bxor, Kind::Basic(Basic::Byte), &[0b1010, 0x0f], &mut io).unwrap();
    assert_eq!(io, vec![0b0110, 0xf0]);
    let mut io = 3i16.to_ne_bytes().to_vec();
    reduce(Builtin::Prod, Kind::Basic(Basic::Integer2), &(-4i16).to_ne_bytes(), &mut io).unwrap();
    assert_eq!(i16::from_ne_bytes(io.try_into().unwrap()), -12);
}

#[test]
fn floating_ops() {
    let f = |v: &[f64]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
    let g = |b: &[u8]| b.chunks_exact(8).map(|c| f64::from_ne_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
    let a = [1.5, -2.0, 3.0];
    let b = [0.25, -1.0, 3.0];
    for (op, want) in [
        (Builtin::Sum, vec![1.75, -3.0, 6.0]),
        (Builtin::Prod, vec![0.375, 2.0, 9.0]),
        (Builtin::Max, vec![1.5, -1.0, 3.0]),
        (Builtin::Min, vec![0.25, -2.0, 3.0]),
    ] {
        let mut io = f(&b);
        reduce(op, Kind::Basic(Basic::Double), &f(&a), &mut io).unwrap();
        assert_eq!(g(&io), want, "{op:?}");
    }
    let mut io = 2.0f32.to_ne_bytes().to_vec();
    reduce(Builtin::Prod, Kind::Basic(Basic::Real), &4.5f32.to_ne_bytes(), &mut io).unwrap();
    assert_eq!(f32::from_ne_bytes(io.try_into().unwrap()), 9.0);
}

#[test]
fn complex_sum_and_prod() {
    let c = |v: &[(f64, f64)]| {
        v.iter().flat_map(|(r, i)| r.to_ne_bytes().into_iter().chain(i.to_ne_bytes())).collect::<Vec<u8>>()
    };
    let a = c(&[(1.0, 2.0), (0.0, 1.0)]);
    let mut io = c(&[(3.0, -1.0), (0.0, 1.0)]);
    reduce(Builtin::Sum, Kind::Basic(Basic::CDoubleComplex), &a, &mut io).unwrap();
    assert_eq!(io, c(&[(4.0, 1.0), (0.0, 2.0)]));
    let mut io = c(&[(3.0, -1.0), (0.0, 1.0)]);
    reduce(Builtin::Prod, Kind::Basic(Basic::DoubleComplex), &a, &mut io).unwrap();
    // (1+2i)(3-i) = 5+5i; i*i = -1.
    assert_eq!(io, c(&[(5.0, 5.0), (-1.0, 0.0)]));
    // float complex
    let fc = |r: f32, i: f32| r.to_ne_bytes().into_iter().chain(i.to_ne_bytes()).collect::<Vec<u8>>();
    let mut io = fc(2.0, 3.0);
    reduce(Builtin::Prod, Kind::Basic(Basic::CFloatComplex), &fc(1.0, -1.0), &mut io).unwrap();
    assert_eq!(io, fc(5.0, 1.0));
    assert!(matches!(
        reduce(Builtin::Max, Kind::Basic(Basic::Complex), &fc(1.0, 0.0), &mut fc(0.0, 0.0)),
        Err(OpError::Undefined { op: "MPI_MAX", ty: "MPI_COMPLEX" })
    ));
}

#[test]
fn logical_ops() {
    let mut io = vec![1u8, 1, 0, 0];
    reduce(Builtin::Land, Kind::Basic(Basic::CBool), &[1, 0, 1, 0], &mut io).unwrap();
    assert_eq!(io, vec![1, 0, 0, 0]);
    let mut io = vec![1u8, 1, 0, 0];
    reduce(Builtin::Lor, Kind::Basic(Basic::CBool), &[1, 0, 1, 0], &mut io).unwrap();
    assert_eq!(io, vec![1, 1, 1, 0]);
    let mut io = vec![1u8, 1, 0, 0];
    reduce(Builtin::Lxor, Kind::Basic(Basic::CBool), &[1, 0, 1, 0], &mut io).unwrap();
    assert_eq!(io, vec![0, 1, 1, 0]);
    // Fortran LOGICAL: 4 bytes, true is 1.
    let mut io = bytes_i32(&[1, 0, 1]);
    reduce(Builtin::Lxor, Kind::Basic(Basic::Logical), &bytes_i32(&[1, 1, 0]), &mut io).unwrap();
    assert_eq!(i32s(&io), vec![0, 1, 1]);
    for op in [Builtin::Sum, Builtin::Max, Builtin::Band] {
        assert!(matches!(reduce(op, Kind::Basic(Basic::CBool), &[1], &mut [0]), Err(OpError::Undefined { .. })));
    }
}

#[test]
fn undefined_combinations_are_refused() {
    let undefined = [
        (Builtin::Band, Basic::Float),
        (Builtin::Land, Basic::Double),
        (Builtin::Land, Basic::Integer),
        (Builtin::Land, Basic::Aint),
        (Builtin::Sum, Basic::Char),
        (Builtin::Max, Basic::Wchar),
        (Builtin::Sum, Basic::Byte),
        (Builtin::Max, Basic::Packed),
        (Builtin::Bor, Basic::Logical),
        (Builtin::Maxloc, Basic::Int),
    ];
    for (op, b) in undefined {
        let n = b.size();
        let e = reduce(op, Kind::Basic(b), &vec![0; n], &mut vec![0; n]).unwrap_err();
        assert_eq!(e, OpError::Undefined { op: op.name(), ty: b.name() });
        assert!(e.to_string().contains("not defined"));
    }
    assert!(!is_defined(Builtin::Sum, Kind::Pair(Pair::TwoInt)));
    // Defined ones pass, spot checks of each class.
    for (op, b) in [
        (Builtin::Band, Basic::Integer8),
        (Builtin::Bxor, Basic::Offset),
        (Builtin::Land, Basic::Uint64),
        (Builtin::Max, Basic::Real8),
        (Builtin::Prod, Basic::Complex16),
        (Builtin::Replace, Basic::Char),
        (Builtin::NoOp, Basic::Packed),
    ] {
        assert!(is_defined(op, Kind::Basic(b)), "{op:?} {b:?}");
    }
    // Every pair and every op: only the location ops and accumulate's.
    for &p in Pair::ALL {
        for &op in Builtin::ALL {
            let want = matches!(op, Builtin::Maxloc | Builtin::Minloc | Builtin::Replace | Builtin::NoOp);
            assert_eq!(is_defined(op, Kind::Pair(p)), want);
        }
    }
    // Lengths and partial elements.
    assert_eq!(
        reduce(Builtin::Sum, Kind::Basic(Basic::Int), &[0; 8], &mut [0; 4]).unwrap_err(),
        OpError::Lengths { input: 8, inout: 4 }
    );
    assert!(matches!(
        reduce(Builtin::Sum, Kind::Basic(Basic::Int), &[0; 6], &mut [0; 6]),
        Err(OpError::Partial { len: 6, size: 4, .. })
    ));
}

/// A packed (value, index) pair.
fn pair_bytes<V: Elem, I: Elem>(v: &[(V, I)]) -> Vec<u8> {
    let mut out = vec![0u8; v.len() * (V::N + I::N)];
    for (k, (x, i)) in v.iter().enumerate() {
        let at = k * (V::N + I::N);
        x.put(&mut out[at..]);
        i.put(&mut out[at + V::N..]);
    }
    out
}

#[test]
fn maxloc_minloc_with_ties() {
    let a = pair_bytes(&[(3.0f32, 7i32), (2.0, 5), (1.0, 9), (4.0, 2)]);
    let b = pair_bytes(&[(1.0f32, 1i32), (2.0, 8), (1.0, 4), (5.0, 0)]);
    let mut io = b.clone();
    reduce(Builtin::Maxloc, Kind::Pair(Pair::FloatInt), &a, &mut io).unwrap();
    assert_eq!(io, pair_bytes(&[(3.0f32, 7i32), (2.0, 5), (1.0, 4), (5.0, 0)]));
    let mut io = b.clone();
    reduce(Builtin::Minloc, Kind::Pair(Pair::FloatInt), &a, &mut io).unwrap();
    assert_eq!(io, pair_bytes(&[(1.0f32, 1i32), (2.0, 5), (1.0, 4), (4.0, 2)]));
    // SHORT_INT packs to 6 bytes: elements are unaligned.
    let a = pair_bytes(&[(-2i16, 3i32), (7, 1)]);
    let mut io = pair_bytes(&[(-2i16, 2i32), (6, 0)]);
    reduce(Builtin::Maxloc, Kind::Pair(Pair::ShortInt), &a, &mut io).unwrap();
    assert_eq!(io, pair_bytes(&[(-2i16, 2i32), (7, 1)]));
    // DOUBLE_INT and LONG_INT.
    let a = pair_bytes(&[(1e300f64, 4i32)]);
    let mut io = pair_bytes(&[(-1e300f64, 3i32)]);
    reduce(Builtin::Minloc, Kind::Pair(Pair::DoubleInt), &a, &mut io).unwrap();
    assert_eq!(io, pair_bytes(&[(-1e300f64, 3i32)]));
    let a = pair_bytes(&[(i64::MAX, 4i32)]);
    let mut io = pair_bytes(&[(i64::MIN, 3i32)]);
    reduce(Builtin::Maxloc, Kind::Pair(Pair::LongInt), &a, &mut io).unwrap();
    assert_eq!(io, pair_bytes(&[(i64::MAX, 4i32)]));
    // 2REAL: the index is a REAL too; the lower one wins a tie.
    let a = pair_bytes(&[(5.0f32, 2.0f32)]);
    let mut io = pair_bytes(&[(5.0f32, 3.0f32)]);
    reduce(Builtin::Maxloc, Kind::Pair(Pair::TwoReal), &a, &mut io).unwrap();
    assert_eq!(io, pair_bytes(&[(5.0f32, 2.0f32)]));
    // 2INT.
    let a = bytes_i32(&[9, 1, 9, 6]);
    let mut io = bytes_i32(&[9, 0, 8, 7]);
    reduce(Builtin::Maxloc, Kind::Pair(Pair::TwoInt), &a, &mut io).unwrap();
    assert_eq!(i32s(&io), vec![9, 0, 9, 6]);
}

/// An x87 extended value from sign, exponent and mantissa, with padding
/// bytes set to `pad`.
fn x87(sign: bool, exp: u16, mant: u64, pad: u8) -> [u8; 16] {
    let mut b = [pad; 16];
    b[..8].copy_from_slice(&mant.to_le_bytes());
    b[8..10].copy_from_slice(&((exp | if sign { 0x8000 } else { 0 }).to_le_bytes()));
    b
}

#[test]
fn long_double_compare_and_arithmetic() {
    let one = x87(false, 0x3fff, 1 << 63, 0xaa);
    let two = x87(false, 0x4000, 1 << 63, 0xbb);
    let onehalf = x87(false, 0x3fff, 3 << 62, 0xcc);
    let minus_two = x87(true, 0x4000, 1 << 63, 0xdd);
    let cat = |v: &[[u8; 16]]| v.concat();
    let mut io = cat(&[two, one, minus_two]);
    reduce(Builtin::Max, Kind::Basic(Basic::LongDouble), &cat(&[one, onehalf, one]), &mut io).unwrap();
    // Values are copied, the padding bytes of inout stay.
    let onehalf_aa = x87(false, 0x3fff, 3 << 62, 0xaa);
    let one_dd = x87(false, 0x3fff, 1 << 63, 0xdd);
    assert_eq!(io, cat(&[two, onehalf_aa, one_dd]));
    let mut io = cat(&[two, one, minus_two]);
    reduce(Builtin::Min, Kind::Basic(Basic::LongDouble), &cat(&[one, onehalf, one]), &mut io).unwrap();
    let one_bb = x87(false, 0x3fff, 1 << 63, 0xbb);
    assert_eq!(io, cat(&[one_bb, one, minus_two]));
    // Sum and product: 1 + 2 = 3 and 1.5 * 2 = 3, inout's padding kept.
    let three = x87(false, 0x4000, 3 << 62, 0xbb);
    let mut io = cat(&[two, two]);
    reduce(Builtin::Sum, Kind::Basic(Basic::LongDouble), &cat(&[one, one]), &mut io).unwrap();
    assert_eq!(io, cat(&[three, three]));
    let mut io = two.to_vec();
    reduce(Builtin::Prod, Kind::Basic(Basic::LongDouble), &onehalf, &mut io).unwrap();
    assert_eq!(io, three);
    // long double complex: (1 + 2i)(3 - i) = 5 + 5i; (1 + 2i) + (3 - i) = 4 + i.
    let v = |x: f64| {
        let (s, m) = (x < 0.0, x.abs());
        let e = m.log2().floor() as i32;
        let mant = ((m / 2f64.powi(e)) * 2f64.powi(63)) as u64;
        x87(s, (0x3fff + e) as u16, mant, 0)
    };
    let c = |re: f64, im: f64| cat(&[v(re), v(im)]);
    let mut io = c(3.0, -1.0);
    reduce(Builtin::Prod, Kind::Basic(Basic::CLongDoubleComplex), &c(1.0, 2.0), &mut io).unwrap();
    assert_eq!(io, c(5.0, 5.0));
    let mut io = c(3.0, -1.0);
    reduce(Builtin::Sum, Kind::Basic(Basic::CxxLongDoubleComplex), &c(1.0, 2.0), &mut io).unwrap();
    assert_eq!(io, c(4.0, 1.0));
    // LONG_DOUBLE_INT: 20 packed bytes; equal values keep the lower index.
    let p = |v: [u8; 16], i: i32| {
        let mut b = v[..].to_vec();
        b.extend(i.to_ne_bytes());
        b
    };
    let a = [p(one, 4), p(two, 9)].concat();
    let mut io = [p(one, 2), p(onehalf, 1)].concat();
    reduce(Builtin::Maxloc, Kind::Pair(Pair::LongDoubleInt), &a, &mut io).unwrap();
    assert_eq!(io, [p(one, 2), p(two, 9)].concat());
}

#[test]
fn unaligned_buffers() {
    let mut inp = [0u8; 1 + 16];
    let mut io = [0u8; 3 + 16];
    for k in 0..2 {
        inp[1 + 8 * k..9 + 8 * k].copy_from_slice(&(1.25f64 * (k + 1) as f64).to_ne_bytes());
        io[3 + 8 * k..11 + 8 * k].copy_from_slice(&(10.0f64).to_ne_bytes());
    }
    reduce(Builtin::Sum, Kind::Basic(Basic::Double), &inp[1..], &mut io[3..]).unwrap();
    assert_eq!(f64::from_ne_bytes(io[3..11].try_into().unwrap()), 11.25);
    assert_eq!(f64::from_ne_bytes(io[11..19].try_into().unwrap()), 12.5);
    assert_eq!(&io[..3], &[0, 0, 0]);
}

#[test]
fn kinds_of_datatypes() {
    let int = Arc::new(Datatype::basic(Basic::Int));
    let float = Arc::new(Datatype::basic(Basic::Float));
    let c = Datatype::contiguous(3, &int).unwrap();
    assert_eq!(kind_for(Builtin::Sum, &c), Ok(Kind::Basic(Basic::Int)));
    assert_eq!(kind_for(Builtin::Sum, &Datatype::pair(Pair::DoubleInt)), Ok(Kind::Pair(Pair::DoubleInt)));
    let two = Arc::new(Datatype::pair(Pair::TwoInt));
    let c2 = Datatype::contiguous(2, &two).unwrap();
    assert_eq!(kind_for(Builtin::Maxloc, &c2), Ok(Kind::Pair(Pair::TwoInt)));
    let fi = Arc::new(Datatype::structure(&[1, 1], &[0, 4], &[float.clone(), int.clone()]).unwrap());
    let v = Datatype::vector(3, 1, 2, &fi).unwrap();
    assert_eq!(kind_for(Builtin::Minloc, &v), Ok(Kind::Pair(Pair::FloatInt)));
    assert!(matches!(kind_for(Builtin::Sum, &v), Err(OpError::NotUniform { .. })));
    assert_eq!(kind_for(Builtin::Replace, &v), Ok(Kind::Basic(Basic::Byte)));
    let odd = Datatype::contiguous(3, &int).unwrap();
    assert!(kind_for(Builtin::Maxloc, &odd).is_err());
    let empty = Datatype::contiguous(0, &int).unwrap();
    assert!(kind_for(Builtin::Sum, &empty).is_err());
}

#[test]
fn names_and_commutativity() {
    assert_eq!(Builtin::Lxor.name(), "MPI_LXOR");
    assert!(Builtin::Sum.is_commutative() && Builtin::Maxloc.is_commutative());
    assert!(!Builtin::Replace.is_commutative() && !Builtin::NoOp.is_commutative());
}
