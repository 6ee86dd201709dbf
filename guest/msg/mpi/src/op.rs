//! The built-in reduction operations (`MPI_MAX` ... `MPI_NO_OP`) on packed
//! data: `inout[i] = input[i] op inout[i]` element by element, for exactly
//! the operation and type combinations MPI 3.1 §5.9.2 defines, and a clear
//! error for the others. Pure functions, called by whichever thread runs a
//! collective or an accumulate.
//!
//! Buffers hold elements back to back as [`Datatype::pack`] writes them
//! (a pair type's value then its index, with no padding), at any
//! alignment: elements are read with `from_ne_bytes`.
//!
//! # Rules
//! - Integers wrap on overflow (two's complement), as C code built with
//!   `-fwrapv` would; logical operations on C integers give 0 or 1.
//! - `MPI_MAX`/`MPI_MIN` on floating point follow C's `a > b ? a : b`
//!   (with `a` the input): a NaN in `inout` wins unless the input is
//!   greater, as in MPICH.
//! - `MPI_MAXLOC`/`MPI_MINLOC`: the better value wins; on equal values the
//!   lower index. Incomparable values (NaN) leave `inout` as it was.
//! - `long double` (x87 80-bit in 16 bytes) and its complex types are
//!   computed in software (`op/x87.rs`) with the FPU's rounding, so results
//!   match C code on x86_64 bit for bit; padding bytes of `inout` are kept.
//! - `MPI_REPLACE` and `MPI_NO_OP` apply to every type (accumulate).

use std::cmp::Ordering;

use thiserror::Error;

use crate::datatype::{Basic, Class, Datatype, Pair};

mod x87;

/// A built-in reduction operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Builtin {
    /// `MPI_MAX`.
    Max,
    /// `MPI_MIN`.
    Min,
    /// `MPI_SUM`.
    Sum,
    /// `MPI_PROD`.
    Prod,
    /// `MPI_LAND`.
    Land,
    /// `MPI_BAND`.
    Band,
    /// `MPI_LOR`.
    Lor,
    /// `MPI_BOR`.
    Bor,
    /// `MPI_LXOR`.
    Lxor,
    /// `MPI_BXOR`.
    Bxor,
    /// `MPI_MAXLOC`.
    Maxloc,
    /// `MPI_MINLOC`.
    Minloc,
    /// `MPI_REPLACE` (accumulate): the input replaces `inout`.
    Replace,
    /// `MPI_NO_OP` (accumulate): `inout` stays.
    NoOp,
}

impl Builtin {
    /// Every built-in operation.
    pub const ALL: &'static [Builtin] = &[
        Builtin::Max,
        Builtin::Min,
        Builtin::Sum,
        Builtin::Prod,
        Builtin::Land,
        Builtin::Band,
        Builtin::Lor,
        Builtin::Bor,
        Builtin::Lxor,
        Builtin::Bxor,
        Builtin::Maxloc,
        Builtin::Minloc,
        Builtin::Replace,
        Builtin::NoOp,
    ];

    /// The MPI name (`"MPI_SUM"`).
    pub const fn name(self) -> &'static str {
        match self {
            Builtin::Max => "MPI_MAX",
            Builtin::Min => "MPI_MIN",
            Builtin::Sum => "MPI_SUM",
            Builtin::Prod => "MPI_PROD",
            Builtin::Land => "MPI_LAND",
            Builtin::Band => "MPI_BAND",
            Builtin::Lor => "MPI_LOR",
            Builtin::Bor => "MPI_BOR",
            Builtin::Lxor => "MPI_LXOR",
            Builtin::Bxor => "MPI_BXOR",
            Builtin::Maxloc => "MPI_MAXLOC",
            Builtin::Minloc => "MPI_MINLOC",
            Builtin::Replace => "MPI_REPLACE",
            Builtin::NoOp => "MPI_NO_OP",
        }
    }

    /// `MPI_Op_commutative`: true for the arithmetic, logical, bitwise and
    /// location operations; false for `MPI_REPLACE` and `MPI_NO_OP`, whose
    /// result depends on which operand is which.
    pub const fn is_commutative(self) -> bool {
        !matches!(self, Builtin::Replace | Builtin::NoOp)
    }
}

/// What a reduction's elements are: a basic kind or a pair type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Elements of one basic kind.
    Basic(Basic),
    /// Value and index pairs.
    Pair(Pair),
}

impl Kind {
    /// Bytes per packed element.
    pub const fn packed_size(self) -> usize {
        match self {
            Kind::Basic(b) => b.size(),
            Kind::Pair(p) => p.packed_size(),
        }
    }

    /// The MPI name of the predefined type.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Basic(b) => b.name(),
            Kind::Pair(p) => p.name(),
        }
    }
}

/// Errors of reductions.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum OpError {
    /// MPI does not define the operation on the type.
    #[error("{op} is not defined on {ty}")]
    Undefined {
        /// The operation's name.
        op: &'static str,
        /// The type's name.
        ty: &'static str,
    },
    /// The two buffers differ in length.
    #[error("input has {input} bytes but inout has {inout}")]
    Lengths {
        /// Input length.
        input: usize,
        /// Inout length.
        inout: usize,
    },
    /// The buffers do not hold a whole number of elements.
    #[error("{len} bytes are not a whole number of {ty} elements of {size} bytes")]
    Partial {
        /// Buffer length.
        len: usize,
        /// The type's name.
        ty: &'static str,
        /// Element size.
        size: usize,
    },
    /// A derived datatype is not made of one predefined kind (or of one
    /// pair type for the location operations).
    #[error("{op} needs a datatype made of one predefined type; this one is not ({why})")]
    NotUniform {
        /// The operation's name.
        op: &'static str,
        /// What was found.
        why: String,
    },
}

/// Whether MPI defines `op` on `kind`.
pub fn is_defined(op: Builtin, kind: Kind) -> bool {
    use Builtin::*;
    use Class::*;
    match (op, kind) {
        (Replace | NoOp, _) => true,
        (Maxloc | Minloc, Kind::Pair(_)) => true,
        (_, Kind::Pair(_)) | (Maxloc | Minloc, _) => false,
        (op, Kind::Basic(b)) => {
            let c = b.class();
            match op {
                Max | Min => matches!(c, CInteger | FortranInteger | Floating | MultiLanguage),
                Sum | Prod => {
                    matches!(c, CInteger | FortranInteger | Floating | Complex | MultiLanguage)
                }
                Land | Lor | Lxor => matches!(c, CInteger | Logical),
                Band | Bor | Bxor => matches!(c, CInteger | FortranInteger | Byte | MultiLanguage),
                Maxloc | Minloc | Replace | NoOp => false,
            }
        }
    }
}

/// Checks that `op` can be applied to `kind` here.
pub fn check(op: Builtin, kind: Kind) -> Result<(), OpError> {
    if !is_defined(op, kind) {
        return Err(OpError::Undefined { op: op.name(), ty: kind.name() });
    }
    Ok(())
}

/// The element kind `op` sees in packed data of `dt`: its predefined pair
/// type, the pair type its signature repeats (location operations), or its
/// one basic kind. `MPI_REPLACE` and `MPI_NO_OP` accept any type and see
/// bytes when the kinds are mixed.
pub fn kind_for(op: Builtin, dt: &Datatype) -> Result<Kind, OpError> {
    if let Some(p) = dt.pair_kind() {
        return Ok(Kind::Pair(p));
    }
    let sig: Vec<(Basic, u64)> = dt.signature(1).collect();
    let not_uniform = |why: String| OpError::NotUniform { op: op.name(), why };
    if matches!(op, Builtin::Maxloc | Builtin::Minloc) {
        for &p in Pair::ALL {
            let (v, i) = p.kinds();
            let fits = if v == i {
                matches!(sig.as_slice(), [(b, n)] if *b == v && n % 2 == 0)
            } else {
                sig.len() % 2 == 0 && sig.chunks_exact(2).all(|c| c[0] == (v, 1) && c[1] == (i, 1))
            };
            if fits && !sig.is_empty() {
                return Ok(Kind::Pair(p));
            }
        }
        return Err(not_uniform("its signature is not a sequence of value and index pairs".into()));
    }
    match sig.as_slice() {
        [(b, _)] => Ok(Kind::Basic(*b)),
        _ if matches!(op, Builtin::Replace | Builtin::NoOp) => Ok(Kind::Basic(Basic::Byte)),
        [] => Err(not_uniform("it has no data".into())),
        _ => Err(not_uniform(format!("it mixes {}", sig.iter().map(|(b, _)| b.name()).collect::<Vec<_>>().join(", ")))),
    }
}

/// Applies `inout[i] = input[i] op inout[i]` to packed elements of `kind`.
pub fn reduce(op: Builtin, kind: Kind, input: &[u8], inout: &mut [u8]) -> Result<(), OpError> {
    if input.len() != inout.len() {
        return Err(OpError::Lengths { input: input.len(), inout: inout.len() });
    }
    let size = kind.packed_size();
    if input.len() % size != 0 {
        return Err(OpError::Partial { len: input.len(), ty: kind.name(), size });
    }
    check(op, kind)?;
    match op {
        Builtin::NoOp => return Ok(()),
        Builtin::Replace => {
            inout.copy_from_slice(input);
            return Ok(());
        }
        _ => {}
    }
    match kind {
        Kind::Pair(p) => loc(op, p, input, inout),
        Kind::Basic(b) => basic(op, b, input, inout),
    }
    Ok(())
}

/// A fixed-size element read from and written to native-endian bytes.
trait Elem: Copy {
    const N: usize;
    fn get(b: &[u8]) -> Self;
    fn put(self, b: &mut [u8]);
}

fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

macro_rules! elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const N: usize = std::mem::size_of::<$t>();
            fn get(b: &[u8]) -> Self {
                <$t>::from_ne_bytes(arr(b))
            }
            fn put(self, b: &mut [u8]) {
                b[..Self::N].copy_from_slice(&self.to_ne_bytes());
            }
        }
    )*};
}

elem!(i8, i16, i32, i64, u8, u16, u32, u64, f32, f64);

/// A complex number as two parts.
#[derive(Clone, Copy)]
struct Cx<T>(T, T);

impl<T: Elem> Elem for Cx<T> {
    const N: usize = 2 * T::N;
    fn get(b: &[u8]) -> Self {
        Cx(T::get(b), T::get(&b[T::N..]))
    }
    fn put(self, b: &mut [u8]) {
        self.0.put(b);
        self.1.put(&mut b[T::N..]);
    }
}

/// Calls `f(input element, inout element)` for each pair of `n`-byte
/// elements.
fn each(n: usize, input: &[u8], inout: &mut [u8], f: impl Fn(&[u8], &mut [u8])) {
    for (a, b) in input.chunks_exact(n).zip(inout.chunks_exact_mut(n)) {
        f(a, b);
    }
}

fn apply<T: Elem>(input: &[u8], inout: &mut [u8], f: impl Fn(T, T) -> T) {
    for (a, b) in input.chunks_exact(T::N).zip(inout.chunks_exact_mut(T::N)) {
        f(T::get(a), T::get(b)).put(b);
    }
}

macro_rules! int_ops {
    ($t:ty, $op:expr, $input:expr, $inout:expr) => {{
        let (i, o) = ($input, $inout);
        match $op {
            Builtin::Max => apply::<$t>(i, o, |a, b| a.max(b)),
            Builtin::Min => apply::<$t>(i, o, |a, b| a.min(b)),
            Builtin::Sum => apply::<$t>(i, o, |a, b| a.wrapping_add(b)),
            Builtin::Prod => apply::<$t>(i, o, |a, b| a.wrapping_mul(b)),
            Builtin::Land => apply::<$t>(i, o, |a, b| (a != 0 && b != 0) as $t),
            Builtin::Lor => apply::<$t>(i, o, |a, b| (a != 0 || b != 0) as $t),
            Builtin::Lxor => apply::<$t>(i, o, |a, b| ((a != 0) != (b != 0)) as $t),
            Builtin::Band => apply::<$t>(i, o, |a, b| a & b),
            Builtin::Bor => apply::<$t>(i, o, |a, b| a | b),
            Builtin::Bxor => apply::<$t>(i, o, |a, b| a ^ b),
            Builtin::Maxloc | Builtin::Minloc | Builtin::Replace | Builtin::NoOp => {}
        }
    }};
}

macro_rules! float_ops {
    ($t:ty, $op:expr, $input:expr, $inout:expr) => {{
        let (i, o) = ($input, $inout);
        match $op {
            Builtin::Max => apply::<$t>(i, o, |a, b| if a > b { a } else { b }),
            Builtin::Min => apply::<$t>(i, o, |a, b| if a < b { a } else { b }),
            Builtin::Sum => apply::<$t>(i, o, |a, b| a + b),
            Builtin::Prod => apply::<$t>(i, o, |a, b| a * b),
            _ => {}
        }
    }};
}

macro_rules! complex_ops {
    ($t:ty, $op:expr, $input:expr, $inout:expr) => {{
        let (i, o) = ($input, $inout);
        match $op {
            Builtin::Sum => apply::<Cx<$t>>(i, o, |a, b| Cx(a.0 + b.0, a.1 + b.1)),
            Builtin::Prod => apply::<Cx<$t>>(i, o, |a, b| Cx(a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0)),
            _ => {}
        }
    }};
}

/// One basic kind, `op` already checked.
fn basic(op: Builtin, b: Basic, input: &[u8], inout: &mut [u8]) {
    use Basic::*;
    match b {
        SignedChar | Int8 | Integer1 => int_ops!(i8, op, input, inout),
        UnsignedChar | Uint8 | Byte | CBool | CxxBool | Logical1 => int_ops!(u8, op, input, inout),
        Short | Int16 | Integer2 => int_ops!(i16, op, input, inout),
        UnsignedShort | Uint16 | Logical2 => int_ops!(u16, op, input, inout),
        Int | Int32 | Integer | Integer4 | Logical | Logical4 => int_ops!(i32, op, input, inout),
        Unsigned | Uint32 => int_ops!(u32, op, input, inout),
        Long | LongLong | Int64 | Integer8 | Aint | Offset | Count | Logical8 => {
            int_ops!(i64, op, input, inout)
        }
        UnsignedLong | UnsignedLongLong | Uint64 => int_ops!(u64, op, input, inout),
        Float | Real | Real4 => float_ops!(f32, op, input, inout),
        Double | DoublePrecision | Real8 => float_ops!(f64, op, input, inout),
        LongDouble => {
            let pick = |want: Ordering| {
                move |a: &[u8], b: &mut [u8]| {
                    if x87::compare(a, b) == Some(want) {
                        b[..10].copy_from_slice(&a[..10]);
                    }
                }
            };
            match op {
                Builtin::Max => each(16, input, inout, pick(Ordering::Greater)),
                Builtin::Min => each(16, input, inout, pick(Ordering::Less)),
                Builtin::Sum => each(16, input, inout, |a, b| {
                    let old = arr::<16>(b);
                    x87::add(a, &old, b)
                }),
                Builtin::Prod => each(16, input, inout, |a, b| {
                    let old = arr::<16>(b);
                    x87::mul(a, &old, b)
                }),
                _ => {}
            }
        }
        CLongDoubleComplex | CxxLongDoubleComplex => match op {
            Builtin::Sum => each(32, input, inout, |a, b| {
                let old = arr::<32>(b);
                x87::add(&a[..16], &old[..16], &mut b[..16]);
                x87::add(&a[16..], &old[16..], &mut b[16..]);
            }),
            Builtin::Prod => each(32, input, inout, |a, b| {
                let (ar, ai) = (&a[..16], &a[16..]);
                let old = arr::<32>(b);
                let (br, bi) = (&old[..16], &old[16..]);
                let (mut t1, mut t2) = ([0u8; 16], [0u8; 16]);
                x87::mul(ar, br, &mut t1);
                x87::mul(ai, bi, &mut t2);
                x87::negate(&mut t2);
                x87::add(&t1, &t2, &mut b[..16]);
                x87::mul(ar, bi, &mut t1);
                x87::mul(ai, br, &mut t2);
                x87::add(&t1, &t2, &mut b[16..]);
            }),
            _ => {}
        },
        CFloatComplex | CxxFloatComplex | Complex | Complex8 => complex_ops!(f32, op, input, inout),
        CDoubleComplex | CxxDoubleComplex | DoubleComplex | Complex16 => {
            complex_ops!(f64, op, input, inout)
        }
        // Refused by `check`: no arithmetic on characters or packed data.
        Char | Wchar | Character | Packed => {}
    }
}

/// Compares two packed values of kind `b` (a pair's value or index).
fn compare(b: Basic, x: &[u8], y: &[u8]) -> Option<Ordering> {
    match b {
        Basic::Short => Some(i16::get(x).cmp(&i16::get(y))),
        Basic::Int | Basic::Integer => Some(i32::get(x).cmp(&i32::get(y))),
        Basic::Long => Some(i64::get(x).cmp(&i64::get(y))),
        Basic::Float | Basic::Real => f32::get(x).partial_cmp(&f32::get(y)),
        Basic::Double | Basic::DoublePrecision => f64::get(x).partial_cmp(&f64::get(y)),
        Basic::LongDouble => x87::compare(x, y),
        _ => None,
    }
}

/// `MPI_MAXLOC` / `MPI_MINLOC` on packed pairs.
fn loc(op: Builtin, p: Pair, input: &[u8], inout: &mut [u8]) {
    let (v, i) = p.kinds();
    let n = p.packed_size();
    let want = if op == Builtin::Maxloc { Ordering::Greater } else { Ordering::Less };
    for (a, b) in input.chunks_exact(n).zip(inout.chunks_exact_mut(n)) {
        let vs = v.size();
        match compare(v, &a[..vs], &b[..vs]) {
            Some(o) if o == want => b.copy_from_slice(a),
            Some(Ordering::Equal) if compare(i, &a[vs..], &b[vs..]) == Some(Ordering::Less) => {
                b[vs..].copy_from_slice(&a[vs..]);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
