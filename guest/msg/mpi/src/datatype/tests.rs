use super::*;
use proptest::prelude::*;

fn b(k: Basic) -> Arc<Datatype> {
    Arc::new(Datatype::basic(k))
}

fn int() -> Arc<Datatype> {
    b(Basic::Int)
}

/// A buffer of `n` i32 holding 0, 1, 2, ...
fn ints(n: usize) -> Vec<u8> {
    (0..n as i32).flat_map(|i| i.to_ne_bytes()).collect()
}

fn as_ints(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect()
}

/// Packs `count` elements from a buffer of i32 0.. whose address is
/// element `origin_ints`, and reads the packed ints.
fn pack_ints(t: &Datatype, count: u64, n: usize, origin_ints: usize) -> Vec<i32> {
    let src = ints(n);
    let mut out = vec![0u8; (t.size() * count) as usize];
    let got = t.pack_slice(count, &src, origin_ints * 4, &mut out).unwrap();
    assert_eq!(got, out.len());
    as_ints(&out)
}

#[test]
fn predefined_sizes_names_and_pairs() {
    let i = int();
    assert_eq!((i.size(), i.extent(), i.name()), (4, 4, "MPI_INT".to_string()));
    assert!(i.is_committed() && i.is_contiguous());
    assert_eq!(i.basic_kind(), Some(Basic::Int));
    assert_eq!(Datatype::basic(Basic::LongDouble).extent(), 16);
    assert_eq!(Datatype::basic(Basic::CDoubleComplex).size(), 16);
    assert_eq!(Datatype::basic(Basic::Logical).name(), "MPI_LOGICAL");
    let layout = |p| {
        let t = Datatype::pair(p);
        (t.size(), t.lb(), t.extent(), t.true_extent(), t.name())
    };
    assert_eq!(layout(Pair::ShortInt), (6, 0, 8, 8, "MPI_SHORT_INT".into()));
    assert_eq!(layout(Pair::FloatInt), (8, 0, 8, 8, "MPI_FLOAT_INT".into()));
    assert_eq!(layout(Pair::DoubleInt), (12, 0, 16, 12, "MPI_DOUBLE_INT".into()));
    assert_eq!(layout(Pair::LongInt), (12, 0, 16, 12, "MPI_LONG_INT".into()));
    assert_eq!(layout(Pair::LongDoubleInt), (20, 0, 32, 20, "MPI_LONG_DOUBLE_INT".into()));
    assert_eq!(layout(Pair::TwoInt), (8, 0, 8, 8, "MPI_2INT".into()));
    assert_eq!(layout(Pair::TwoDoublePrecision).0, 16);
    let si = Datatype::pair(Pair::ShortInt);
    assert_eq!(
        si.runs(),
        &[Run { disp: 0, basic: Basic::Short, count: 1 }, Run { disp: 4, basic: Basic::Int, count: 1 }]
    );
    assert!(!si.is_contiguous());
    assert_eq!(si.pair_kind(), Some(Pair::ShortInt));
    assert!(Datatype::pair(Pair::TwoInt).is_contiguous());
    // The pair types as a struct built by hand have the same layout.
    let short = b(Basic::Short);
    let st = Datatype::structure(&[1, 1], &[0, 4], &[short, int()]).unwrap();
    assert_eq!((st.size(), st.extent()), (6, 8));
    // Every basic kind has a distinct MPI name.
    let mut names: Vec<_> = Basic::ALL.iter().map(|b| b.name()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), Basic::ALL.len());
}

#[test]
fn contiguous_and_vector() {
    let c = Datatype::contiguous(3, &int()).unwrap();
    assert_eq!((c.size(), c.extent(), c.elements()), (12, 12, 3));
    assert!(c.is_contiguous());
    assert_eq!(c.runs().len(), 1);
    assert_eq!(pack_ints(&c, 2, 6, 0), vec![0, 1, 2, 3, 4, 5]);

    let v = Datatype::vector(3, 2, 4, &int()).unwrap();
    assert_eq!((v.size(), v.lb(), v.extent()), (24, 0, 40));
    assert!(!v.is_contiguous());
    assert_eq!(pack_ints(&v, 1, 10, 0), vec![0, 1, 4, 5, 8, 9]);
    // The second element starts one extent (10 ints) later.
    assert_eq!(pack_ints(&v, 2, 20, 0), vec![0, 1, 4, 5, 8, 9, 10, 11, 14, 15, 18, 19]);
    // A vector whose blocks abut is contiguous.
    let dense = Datatype::vector(4, 2, 2, &int()).unwrap();
    assert!(dense.is_contiguous());
}

#[test]
fn hvector_negative_stride() {
    let v = Datatype::hvector(3, 1, -8, &int()).unwrap();
    assert_eq!((v.lb(), v.ub(), v.extent()), (-16, 4, 20));
    assert_eq!((v.true_lb(), v.true_ub()), (-16, 4));
    assert_eq!(pack_ints(&v, 1, 5, 4), vec![4, 2, 0]);
    // Out of the slice: the data below the origin is missing.
    let src = ints(5);
    let mut out = [0u8; 12];
    assert!(matches!(v.pack_slice(1, &src, 8, &mut out), Err(DatatypeError::OutOfBounds { lo: -8, .. })));
}

#[test]
fn indexed_kinds() {
    let t = Datatype::indexed(&[2, 1], &[5, 0], &int()).unwrap();
    assert_eq!((t.size(), t.lb(), t.ub()), (12, 0, 28));
    assert_eq!(pack_ints(&t, 1, 7, 0), vec![5, 6, 0]);
    // hindexed with out-of-order byte displacements.
    let h = Datatype::hindexed(&[1, 2, 0, 1], &[12, 0, 400, 20], &int()).unwrap();
    assert_eq!((h.size(), h.lb(), h.ub(), h.extent()), (16, 0, 24, 24));
    assert_eq!(pack_ints(&h, 1, 6, 0), vec![3, 0, 1, 5]);
    assert_eq!(pack_ints(&h, 2, 12, 0), vec![3, 0, 1, 5, 9, 6, 7, 11]);
    let ib = Datatype::indexed_block(2, &[3, 0], &int()).unwrap();
    assert_eq!(pack_ints(&ib, 1, 5, 0), vec![3, 4, 0, 1]);
    assert_eq!(ib.extent(), 20);
    let hb = Datatype::hindexed_block(1, &[8, -4], &int()).unwrap();
    assert_eq!((hb.lb(), hb.ub()), (-4, 12));
    assert_eq!(pack_ints(&hb, 1, 4, 1), vec![3, 0]);
}

#[test]
fn struct_with_padding() {
    // struct { char c; double d; int i; }: offsets 0, 8, 16; size 13;
    // extent rounded up to 24 by the double's alignment.
    let t = Datatype::structure(&[1, 1, 1], &[0, 8, 16], &[b(Basic::Char), b(Basic::Double), int()]).unwrap();
    assert_eq!((t.size(), t.lb(), t.ub(), t.true_ub()), (13, 0, 24, 20));
    assert_eq!(t.alignment(), 8);
    let mut src = vec![0u8; 48];
    src[0] = b'x';
    src[8..16].copy_from_slice(&1.5f64.to_ne_bytes());
    src[16..20].copy_from_slice(&7i32.to_ne_bytes());
    src[24] = b'y';
    src[32..40].copy_from_slice(&(-2.0f64).to_ne_bytes());
    src[40..44].copy_from_slice(&9i32.to_ne_bytes());
    let mut out = vec![0u8; 26];
    assert_eq!(t.pack_slice(2, &src, 0, &mut out).unwrap(), 26);
    assert_eq!(out[0], b'x');
    assert_eq!(f64::from_ne_bytes(out[1..9].try_into().unwrap()), 1.5);
    assert_eq!(i32::from_ne_bytes(out[9..13].try_into().unwrap()), 7);
    assert_eq!(out[13], b'y');
    assert_eq!(f64::from_ne_bytes(out[14..22].try_into().unwrap()), -2.0);
    assert_eq!(i32::from_ne_bytes(out[22..26].try_into().unwrap()), 9);
    // Unpack into a zeroed buffer restores exactly the data bytes.
    let mut back = vec![0u8; 48];
    assert_eq!(t.unpack_slice(2, &mut back, 0, &out).unwrap(), 26);
    let mut want = src.clone();
    for pad in (1..8).chain(20..24).chain(25..32).chain(44..48) {
        want[pad] = 0;
    }
    assert_eq!(back, want);
}

#[test]
fn nested_vector_of_struct() {
    // struct { int a; short b; }: size 6, extent 8.
    let s = Arc::new(Datatype::structure(&[1, 1], &[0, 4], &[int(), b(Basic::Short)]).unwrap());
    assert_eq!((s.size(), s.extent()), (6, 8));
    let v = Datatype::vector(2, 1, 2, &s).unwrap();
    assert_eq!((v.size(), v.extent(), v.true_ub()), (12, 24, 22));
    let mut src = vec![0u8; 48];
    for (k, at) in [0usize, 16, 24, 40].into_iter().enumerate() {
        src[at..at + 4].copy_from_slice(&(100 + k as i32).to_ne_bytes());
        src[at + 4..at + 6].copy_from_slice(&(k as i16).to_ne_bytes());
    }
    let mut out = vec![0u8; 24];
    assert_eq!(v.pack_slice(2, &src, 0, &mut out).unwrap(), 24);
    for k in 0..4 {
        let p = k * 6;
        assert_eq!(i32::from_ne_bytes(out[p..p + 4].try_into().unwrap()), 100 + k as i32);
        assert_eq!(i16::from_ne_bytes(out[p + 4..p + 6].try_into().unwrap()), k as i16);
    }
}

#[test]
fn subarray_3d_both_orders() {
    let c = Datatype::subarray(&[2, 3, 4], &[1, 2, 2], &[1, 1, 1], Order::C, &int()).unwrap();
    assert_eq!((c.size(), c.lb(), c.extent()), (16, 0, 96));
    assert_eq!((c.true_lb(), c.true_ub()), (17 * 4, 23 * 4));
    assert_eq!(pack_ints(&c, 1, 24, 0), vec![17, 18, 21, 22]);
    // Two subarrays in a row: the second starts one full array later.
    assert_eq!(pack_ints(&c, 2, 48, 0), vec![17, 18, 21, 22, 41, 42, 45, 46]);
    let f = Datatype::subarray(&[2, 3, 4], &[1, 2, 2], &[1, 1, 1], Order::Fortran, &int()).unwrap();
    assert_eq!((f.size(), f.extent()), (16, 96));
    assert_eq!(pack_ints(&f, 1, 24, 0), vec![9, 11, 15, 17]);
    assert!(Datatype::subarray(&[4], &[3], &[2], Order::C, &int()).is_err());
    assert!(Datatype::subarray(&[4, 4], &[3], &[0], Order::C, &int()).is_err());
    // The whole array is contiguous.
    let all = Datatype::subarray(&[3, 5], &[3, 5], &[0, 0], Order::C, &int()).unwrap();
    assert!(all.is_contiguous());
}

#[test]
fn resized_with_negative_lb() {
    let r = Arc::new(Datatype::resized(&int(), -4, 12).unwrap());
    assert_eq!((r.lb(), r.ub(), r.extent()), (-4, 8, 12));
    assert_eq!((r.true_lb(), r.true_ub()), (0, 4));
    assert!(!r.is_contiguous());
    let c = Datatype::contiguous(3, &r).unwrap();
    assert_eq!((c.lb(), c.ub(), c.size()), (-4, 32, 12));
    assert_eq!((c.true_lb(), c.true_ub()), (0, 28));
    assert_eq!(pack_ints(&c, 1, 8, 0), vec![0, 3, 6]);
    // Two of them: the second element starts 36 bytes later.
    assert_eq!(pack_ints(&c, 2, 16, 0), vec![0, 3, 6, 9, 12, 15]);
    // The markers are sticky: a struct keeps them and adds no padding.
    let s = Datatype::structure(&[1, 1], &[100, 0], &[r.clone(), b(Basic::Char)]).unwrap();
    assert_eq!((s.lb(), s.ub()), (96, 108));
    assert_eq!((s.true_lb(), s.true_ub()), (0, 104));
    // A negative extent: copies go downwards.
    let neg = Arc::new(Datatype::resized(&int(), 0, -4).unwrap());
    let cn = Datatype::contiguous(3, &neg).unwrap();
    assert_eq!(pack_ints(&cn, 1, 3, 2), vec![2, 1, 0]);
}

#[test]
fn get_elements_and_count() {
    let s = Datatype::structure(&[1, 1], &[0, 4], &[int(), b(Basic::Double)]).unwrap();
    assert_eq!(s.size(), 12);
    assert_eq!(s.get_elements(24), Some(4));
    assert_eq!(s.get_elements(28), Some(5));
    assert_eq!(s.get_elements(26), None);
    assert_eq!(s.get_elements(4), Some(1));
    assert_eq!(s.get_elements(6), None);
    assert_eq!(s.get_elements(0), Some(0));
    assert_eq!(s.get_count(24), Some(2));
    assert_eq!(s.get_count(28), None);
    let v = Datatype::vector(3, 2, 4, &int()).unwrap();
    assert_eq!(v.get_elements(12), Some(3));
    assert_eq!(v.get_elements(13), None);
    let empty = Datatype::contiguous(0, &int()).unwrap();
    assert_eq!((empty.size(), empty.extent()), (0, 0));
    assert_eq!(empty.get_count(0), Some(0));
    assert_eq!(empty.get_elements(4), None);
}

const CODES: Codes = Codes {
    order_c: 56,
    order_fortran: 57,
    distribute_block: 121,
    distribute_cyclic: 122,
    distribute_none: 123,
    distribute_dflt_darg: -49767,
};

#[test]
fn envelope_and_contents_round_trip() {
    let i = int();
    assert_eq!(i.envelope(&CODES).combiner, Combiner::Named);
    assert!(i.envelope(&CODES).integers.is_empty());

    let v = Datatype::vector(3, 2, 4, &i).unwrap();
    let e = v.envelope(&CODES);
    assert_eq!((e.combiner, e.integers.as_slice()), (Combiner::Vector, &[3, 2, 4][..]));
    assert!(e.addresses.is_empty());
    assert!(Arc::ptr_eq(&e.datatypes[0], &i));
    let again = Datatype::vector(e.integers[0], e.integers[1], e.integers[2], &e.datatypes[0]).unwrap();
    assert_eq!(again.runs(), v.runs());

    let h = Datatype::hvector(2, 1, 12, &i).unwrap();
    let e = h.envelope(&CODES);
    assert_eq!((e.combiner, e.integers, e.addresses), (Combiner::Hvector, vec![2, 1], vec![12]));

    let ix = Datatype::indexed(&[2, 1], &[5, 0], &i).unwrap();
    let e = ix.envelope(&CODES);
    assert_eq!((e.combiner, &e.integers), (Combiner::Indexed, &vec![2, 2, 1, 5, 0]));
    let n = e.integers[0] as usize;
    let again = Datatype::indexed(&e.integers[1..=n], &e.integers[n + 1..], &e.datatypes[0]).unwrap();
    assert_eq!(again.runs(), ix.runs());

    let hx = Datatype::hindexed(&[1, 2], &[12, 0], &i).unwrap();
    let e = hx.envelope(&CODES);
    assert_eq!((e.combiner, e.integers, e.addresses), (Combiner::Hindexed, vec![2, 1, 2], vec![12, 0]));

    let ib = Datatype::indexed_block(2, &[3, 0], &i).unwrap();
    let e = ib.envelope(&CODES);
    assert_eq!((e.combiner, e.integers), (Combiner::IndexedBlock, vec![2, 2, 3, 0]));
    let hb = Datatype::hindexed_block(2, &[3, 0], &i).unwrap();
    let e = hb.envelope(&CODES);
    assert_eq!((e.combiner, e.integers, e.addresses), (Combiner::HindexedBlock, vec![2, 2], vec![3, 0]));

    let d = b(Basic::Double);
    let s = Datatype::structure(&[1, 2], &[0, 8], &[i.clone(), d.clone()]).unwrap();
    let e = s.envelope(&CODES);
    assert_eq!((e.combiner, &e.integers, &e.addresses), (Combiner::Struct, &vec![2, 1, 2], &vec![0, 8]));
    let again = Datatype::structure(&e.integers[1..], &e.addresses, &e.datatypes).unwrap();
    assert_eq!((again.runs(), again.extent()), (s.runs(), s.extent()));

    let sa = Datatype::subarray(&[4, 5], &[2, 3], &[1, 0], Order::Fortran, &i).unwrap();
    let e = sa.envelope(&CODES);
    assert_eq!((e.combiner, e.integers), (Combiner::Subarray, vec![2, 4, 5, 2, 3, 1, 0, 57]));

    let r = Datatype::resized(&i, -4, 12).unwrap();
    let e = r.envelope(&CODES);
    assert_eq!((e.combiner, e.addresses), (Combiner::Resized, vec![-4, 12]));

    let c = Datatype::contiguous(7, &i).unwrap();
    assert_eq!(c.envelope(&CODES).integers, vec![7]);
    let dup = Datatype::dup(&i);
    let e = dup.envelope(&CODES);
    assert_eq!(e.combiner, Combiner::Dup);
    assert!(Arc::ptr_eq(&e.datatypes[0], &i));

    let da = Datatype::darray(
        4,
        1,
        &[8, 6],
        &[Distribution::Block(None), Distribution::Cyclic(Some(2))],
        &[2, 2],
        Order::C,
        &i,
    )
    .unwrap();
    let e = da.envelope(&CODES);
    assert_eq!(e.combiner, Combiner::Darray);
    assert_eq!(e.integers, vec![4, 1, 2, 8, 6, 121, 122, -49767, 2, 2, 2, 56]);
}

#[test]
fn names() {
    let i = int();
    assert_eq!(i.name(), "MPI_INT");
    assert_eq!(Datatype::basic(Basic::UnsignedLongLong).name(), "MPI_UNSIGNED_LONG_LONG");
    assert_eq!(Datatype::basic(Basic::CFloatComplex).name(), "MPI_C_FLOAT_COMPLEX");
    let v = Datatype::vector(2, 1, 2, &i).unwrap();
    assert_eq!(v.name(), "");
    v.set_name("halo column");
    assert_eq!(v.name(), "halo column");
    assert_eq!(Datatype::dup(&i).name(), "");
    assert!(Datatype::dup(&i).is_committed());
    assert!(!v.is_committed());
    v.commit();
    assert!(v.is_committed());
}

#[test]
fn bad_arguments_are_errors() {
    let i = int();
    assert_eq!(Datatype::contiguous(-1, &i).unwrap_err(), DatatypeError::Negative { what: "count", value: -1 });
    assert!(matches!(Datatype::vector(2, -3, 1, &i), Err(DatatypeError::Negative { .. })));
    assert!(matches!(Datatype::indexed(&[1, 2], &[0], &i), Err(DatatypeError::Length { .. })));
    assert!(matches!(Datatype::structure(&[1], &[0], &[i.clone(), i.clone()]), Err(DatatypeError::Length { .. })));
    assert_eq!(Datatype::contiguous(i64::MAX, &i).unwrap_err(), DatatypeError::Overflow);
    assert_eq!(Datatype::resized(&i, i64::MAX, 1).unwrap_err(), DatatypeError::Overflow);
    assert!(Datatype::subarray(&[], &[], &[], Order::C, &i).is_err());
    assert!(Datatype::darray(4, 4, &[8], &[Distribution::Block(None)], &[4], Order::C, &i).is_err());
    assert!(Datatype::darray(4, 0, &[8], &[Distribution::Block(None)], &[2], Order::C, &i).is_err());
    assert!(Datatype::darray(2, 0, &[8], &[Distribution::Block(Some(3))], &[2], Order::C, &i).is_err());
    // A type map too large to flatten is refused, not built.
    let v = Arc::new(Datatype::vector(1 << 12, 1, 2, &i).unwrap());
    assert_eq!(Datatype::contiguous(1 << 12, &v).unwrap_err(), DatatypeError::TooComplex);
}

#[test]
fn darray_block_and_cyclic() {
    let i = int();
    // 10 elements in blocks of ceil(10/3) = 4 over 3 processes: rank 2
    // owns 8 and 9.
    let t = Datatype::darray(3, 2, &[10], &[Distribution::Block(None)], &[3], Order::C, &i).unwrap();
    assert_eq!((t.lb(), t.extent()), (0, 40));
    assert_eq!(pack_ints(&t, 1, 10, 0), vec![8, 9]);
    // Cyclic(2) over 2 processes: rank 1 owns 2, 3, 6, 7.
    let t = Datatype::darray(2, 1, &[10], &[Distribution::Cyclic(Some(2))], &[2], Order::C, &i).unwrap();
    assert_eq!(pack_ints(&t, 1, 10, 0), vec![2, 3, 6, 7]);
    // 2-D 4x6, block x block over a 2x2 grid, C order: rank 1 is grid
    // (0, 1): rows 0-1, columns 3-5.
    let t =
        Datatype::darray(4, 1, &[4, 6], &[Distribution::Block(None), Distribution::Block(None)], &[2, 2], Order::C, &i)
            .unwrap();
    assert_eq!(pack_ints(&t, 1, 24, 0), vec![3, 4, 5, 9, 10, 11]);
    // The same in Fortran order: column-major indices, rows 0-1 of
    // columns 3-5.
    let t = Datatype::darray(
        4,
        1,
        &[4, 6],
        &[Distribution::Block(None), Distribution::Block(None)],
        &[2, 2],
        Order::Fortran,
        &i,
    )
    .unwrap();
    assert_eq!(pack_ints(&t, 1, 24, 0), vec![12, 13, 16, 17, 20, 21]);
}

#[test]
fn signatures() {
    let i = int();
    let v = Datatype::vector(2, 1, 2, &i).unwrap();
    let c = Datatype::contiguous(2, &i).unwrap();
    assert_eq!(compare_signatures(&v, 3, &c, 3), SignatureMatch::Equal);
    assert_eq!(compare_signatures(&v, 1, &i, 2), SignatureMatch::Equal);
    assert_eq!(compare_signatures(&v, 1, &i, 5), SignatureMatch::Prefix);
    assert_eq!(compare_signatures(&c, 3, &i, 5), SignatureMatch::Longer);
    let f = b(Basic::Float);
    assert_eq!(compare_signatures(&f, 1, &i, 1), SignatureMatch::Differ);
    let fi = Datatype::pair(Pair::FloatInt);
    let s = Datatype::structure(&[1, 1], &[0, 8], &[f.clone(), i.clone()]).unwrap();
    assert_eq!(compare_signatures(&fi, 4, &s, 4), SignatureMatch::Equal);
    assert_eq!(compare_signatures(&fi, 1, &i, 2), SignatureMatch::Differ);
    let packed = b(Basic::Packed);
    assert_eq!(compare_signatures(&fi, 2, &packed, 16), SignatureMatch::Equal);
    let sig: Vec<_> = fi.signature(2).collect();
    assert_eq!(sig, vec![(Basic::Float, 1), (Basic::Int, 1), (Basic::Float, 1), (Basic::Int, 1)]);
    let ii = Datatype::structure(&[1, 2], &[8, 0], &[i.clone(), i.clone()]).unwrap();
    assert_eq!(ii.signature(2).collect::<Vec<_>>(), vec![(Basic::Int, 6)]);
}

#[test]
fn partial_pack_and_unpack() {
    let t = Datatype::indexed(&[2, 1, 3], &[7, 0, 3], &int()).unwrap();
    let src = ints(40);
    let mut full = vec![0u8; (t.size() * 3) as usize];
    t.pack_slice(3, &src, 0, &mut full).unwrap();
    for offset in 0..full.len() {
        for len in [1usize, 3, 4, 9, 100] {
            let mut part = vec![0u8; len];
            // SAFETY: three elements of t lie inside src (checked by the
            // full pack above).
            let n = unsafe { t.pack_at(3, src.as_ptr(), offset as u64, &mut part) };
            let want = &full[offset..(offset + len).min(full.len())];
            assert_eq!(&part[..n], want, "offset {offset} len {len}");
        }
    }
    // Unpacking in pieces gives the same buffer as at once.
    let mut whole = vec![0u8; 160];
    t.unpack_slice(3, &mut whole, 0, &full).unwrap();
    let mut pieces = vec![0u8; 160];
    let mut at = 0;
    while at < full.len() {
        let end = (at + 5).min(full.len());
        // SAFETY: `pieces` holds three elements of t, and `full` is apart.
        let n = unsafe { t.unpack_at(3, pieces.as_mut_ptr(), at as u64, &full[at..end]) };
        assert_eq!(n, end - at);
        at = end;
    }
    assert_eq!(pieces, whole);
    // A short output buffer gets what fits.
    let mut short = [0u8; 6];
    assert_eq!(t.pack_slice(3, &src, 0, &mut short).unwrap(), 6);
    assert_eq!(short, full[..6]);
}

/// Index lists of a vector, computed from its definition.
fn vector_indices(count: usize, bl: usize, stride: usize, n: usize) -> Vec<i32> {
    let extent = (count - 1) * stride + bl;
    let mut v = Vec::new();
    for e in 0..n {
        for k in 0..count {
            for j in 0..bl {
                v.push((e * extent + k * stride + j) as i32);
            }
        }
    }
    v
}

proptest! {
    #[test]
    fn vector_pack_matches_definition(count in 1usize..6, bl in 1usize..4, extra in 0usize..4, n in 1usize..4) {
        let stride = bl + extra;
        let t = Datatype::vector(count as i64, bl as i64, stride as i64, &int()).unwrap();
        let want = vector_indices(count, bl, stride, n);
        let len = want.iter().max().map_or(0, |m| *m as usize + 1);
        prop_assert_eq!(pack_ints(&t, n as u64, len, 0), want);
    }

    #[test]
    fn indexed_pack_unpack_identity(
        blocks in proptest::collection::vec((1usize..4, 0usize..3), 1..6),
        perm_seed in any::<u64>(),
        n in 1u64..3,
    ) {
        // Non-overlapping blocks laid out in order, then listed shuffled.
        let mut at = 0usize;
        let mut list: Vec<(i64, i64)> = Vec::new();
        for (len, gap) in blocks {
            at += gap;
            list.push((len as i64, at as i64));
            at += len;
        }
        let mut s = perm_seed;
        for i in (1..list.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            list.swap(i, (s >> 33) as usize % (i + 1));
        }
        let bls: Vec<i64> = list.iter().map(|b| b.0).collect();
        let ds: Vec<i64> = list.iter().map(|b| b.1).collect();
        let t = Datatype::indexed(&bls, &ds, &int()).unwrap();
        let mut want = Vec::new();
        let ext = t.extent() / 4;
        for e in 0..n as i64 {
            for (len, d) in &list {
                want.extend((0..*len).map(|j| (e * ext + d + j) as i32));
            }
        }
        let len = (t.lb() / 4 + n as i64 * ext) as usize;
        let packed = pack_ints(&t, n, len, 0);
        prop_assert_eq!(&packed, &want);
        // unpack then pack again gives the same bytes.
        let bytes: Vec<u8> = packed.iter().flat_map(|i| i.to_ne_bytes()).collect();
        let mut buf = vec![0u8; len * 4];
        t.unpack_slice(n, &mut buf, 0, &bytes).unwrap();
        let mut again = vec![0u8; bytes.len()];
        t.pack_slice(n, &buf, 0, &mut again).unwrap();
        prop_assert_eq!(again, bytes);
    }
}

#[test]
fn typed_copy_between_layouts() {
    let i = int();
    // A column of a 4x3 matrix into a contiguous row, and back.
    let col = Datatype::vector(4, 1, 3, &i).unwrap();
    let row = Datatype::contiguous(4, &i).unwrap();
    let m = ints(12);
    let mut r = vec![0u8; 16];
    // SAFETY: m holds 12 ints, the column's span; r holds the row.
    let n = unsafe { copy(&col, 1, m.as_ptr().wrapping_add(4), &row, 1, r.as_mut_ptr()) };
    assert_eq!(n, 16);
    assert_eq!(as_ints(&r), vec![1, 4, 7, 10]);
    let mut back = vec![0u8; 48];
    // SAFETY: as above, the other way.
    let n = unsafe { copy(&row, 1, r.as_ptr(), &col, 1, back.as_mut_ptr().wrapping_add(8)) };
    assert_eq!(n, 16);
    assert_eq!(as_ints(&back), vec![0, 0, 1, 0, 0, 4, 0, 0, 7, 0, 0, 10]);
    // More than one bounce buffer's worth, and a shorter destination.
    let big = Datatype::vector(40_000, 1, 2, &i).unwrap();
    let src = ints(80_000);
    let mut dst = vec![0u8; 4 * 30_000];
    // SAFETY: src spans the vector; dst holds 30000 ints.
    let n = unsafe { copy(&big, 1, src.as_ptr(), &i, 30_000, dst.as_mut_ptr()) };
    assert_eq!(n, 120_000);
    let got = as_ints(&dst);
    assert!(got.iter().enumerate().all(|(k, v)| *v == 2 * k as i32));
}

#[test]
fn datatypes_are_shareable() {
    fn shared<T: Send + Sync>() {}
    shared::<Datatype>();
    shared::<Arc<Datatype>>();
}

/// Linear indices of a subarray, computed from its definition.
fn subarray_indices(sizes: &[usize], subsizes: &[usize], starts: &[usize], order: Order) -> Vec<i32> {
    let n = sizes.len();
    // Dimensions from slowest to fastest.
    let dims: Vec<usize> = match order {
        Order::C => (0..n).collect(),
        Order::Fortran => (0..n).rev().collect(),
    };
    let mut out = Vec::new();
    let total: usize = subsizes.iter().product();
    for mut k in 0..total {
        let mut idx = vec![0usize; n];
        for &d in dims.iter().rev() {
            idx[d] = starts[d] + k % subsizes[d];
            k /= subsizes[d];
        }
        let mut lin = 0;
        for &d in &dims {
            lin = lin * sizes[d] + idx[d];
        }
        out.push(lin as i32);
    }
    out
}

proptest! {
    #[test]
    fn subarray_matches_definition(
        dims in proptest::collection::vec((1usize..5, 0usize..5, 0usize..5), 1..4),
        fortran in any::<bool>(),
    ) {
        let sizes: Vec<usize> = dims.iter().map(|d| d.0).collect();
        let subsizes: Vec<usize> = dims.iter().map(|d| 1 + d.1 % d.0).collect();
        let starts: Vec<usize> = dims.iter().zip(&subsizes).map(|(d, s)| d.2 % (d.0 - s + 1)).collect();
        let order = if fortran { Order::Fortran } else { Order::C };
        let as64 = |v: &[usize]| v.iter().map(|x| *x as i64).collect::<Vec<_>>();
        let t = Datatype::subarray(&as64(&sizes), &as64(&subsizes), &as64(&starts), order, &int()).unwrap();
        let total: usize = sizes.iter().product();
        prop_assert_eq!(t.extent(), 4 * total as i64);
        prop_assert_eq!(pack_ints(&t, 1, total, 0), subarray_indices(&sizes, &subsizes, &starts, order));
    }
}

#[test]
fn huge_counts_of_empty_types_are_quick() {
    let empty = Arc::new(Datatype::contiguous(0, &int()).unwrap());
    let v = Datatype::vector(1 << 60, 3, 1, &empty).unwrap();
    assert_eq!((v.size(), v.extent()), (0, 0));
    // With markers the bounds still follow the blocks.
    let marked = Arc::new(Datatype::resized(&empty, 0, 4).unwrap());
    let v = Datatype::vector(1 << 40, 1, 2, &marked).unwrap();
    assert_eq!((v.size(), v.lb(), v.ub()), (0, 0, ((1i64 << 40) - 1) * 8 + 4));
    // A darray of a large global array does not list its indices.
    let d = Datatype::darray(2, 1, &[1 << 40], &[Distribution::Block(None)], &[2], Order::C, &int()).unwrap();
    assert_eq!(d.size(), 4 << 39);
    assert_eq!(d.runs().len(), 1);
    assert_eq!(d.true_lb(), 4 << 39);
}

#[test]
fn shared_predefined_instances() {
    for &k in Basic::ALL {
        let t = Datatype::shared_basic(k);
        assert!(Arc::ptr_eq(&t, &Datatype::shared_basic(k)));
        assert_eq!((t.basic_kind(), t.name()), (Some(k), k.name().to_string()));
        assert_eq!(t.size(), k.size() as u64);
    }
    for &p in Pair::ALL {
        let t = Datatype::shared_pair(p);
        assert!(Arc::ptr_eq(&t, &Datatype::shared_pair(p)));
        assert_eq!((t.pair_kind(), t.name()), (Some(p), p.name().to_string()));
        assert_eq!(t.size(), p.packed_size() as u64);
    }
}
