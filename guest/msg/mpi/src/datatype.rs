//! MPI datatypes: the predefined element kinds ([`Basic`], [`Pair`]), the
//! derived-type constructors, extents and bounds, pack and unpack, element
//! counts of partial messages, type signatures, names, envelopes, and
//! copies between two typed buffers.
//!
//! A [`Datatype`] is immutable apart from its name and its committed flag, so
//! the C layer shares it through `Arc` between the application's threads and
//! the progress engine; pack and unpack only read it.
//!
//! # Model
//! A type is kept flattened: its type map is a list of [`Run`]s (a
//! displacement, a [`Basic`] kind and how many consecutive elements of that
//! kind start there), in type-map order, with runs that continue each other
//! merged. Packing walks the runs; a type whose one run covers its whole
//! extent is contiguous and packs with a single copy.
//!
//! Bounds follow MPI 3.1 §4.1.6 and §4.1.7: `lb` and `ub` come from explicit
//! markers (set by [`Datatype::resized`], and by subarray and darray, which
//! MPI defines through resized), which are sticky through later
//! constructors, and otherwise from the data. As in MPICH and Open MPI, the
//! alignment increment (epsilon) that rounds the extent up to the largest
//! alignment of the entries is added by `struct` only (this is also how the
//! pair types get their C layout); the other constructors take their
//! extents from their old types' extents.
//!
//! Sizes and alignments are those of C on x86_64 Linux (LP64, `long double`
//! is the x87 80-bit format in 16 bytes of storage) and of gfortran.
//!
//! # ABI independence
//! Nothing here knows handle values. Orders and distributions of subarray
//! and darray are enums here; [`Datatype::envelope`] takes the C layer's
//! codes for them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use thiserror::Error;

/// The most runs a flattened type map may have. Each run takes 32 bytes,
/// so the largest type map takes 64 MiB.
pub const MAX_RUNS: usize = 1 << 21;

/// Errors of datatype construction and of buffer checks.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DatatypeError {
    /// A count, block length or size is negative.
    #[error("{what} must not be negative (got {value})")]
    Negative {
        /// Which argument.
        what: &'static str,
        /// Its value.
        value: i64,
    },
    /// Argument arrays that must have the same length do not.
    #[error("{what}: {got} entries given where {want} are needed")]
    Length {
        /// Which array.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length it needed.
        want: usize,
    },
    /// Another invalid argument.
    #[error("{0}")]
    Invalid(String),
    /// A size, extent or displacement does not fit in 64 bits.
    #[error("datatype size, extent or displacement overflows 64 bits")]
    Overflow,
    /// The flattened type map would be too large.
    #[error("the flattened type map would need more than {MAX_RUNS} runs")]
    TooComplex,
    /// A buffer slice does not hold the data a typed access would touch.
    #[error("typed access touches bytes {lo}..{hi} relative to the slice, which has {len}")]
    OutOfBounds {
        /// Lowest byte touched, relative to the slice's start.
        lo: i128,
        /// One past the highest byte touched.
        hi: i128,
        /// The slice's length.
        len: usize,
    },
}

type Result<T> = std::result::Result<T, DatatypeError>;

/// The classes MPI 3.1 §5.9.2 groups predefined types into for the
/// predefined reduction operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// C integer (signed char, unsigned char, short ... uint64_t; not char).
    CInteger,
    /// Fortran integer.
    FortranInteger,
    /// Floating point (C and Fortran).
    Floating,
    /// Logical (C `_Bool`, C++ `bool`, Fortran `LOGICAL`).
    Logical,
    /// Complex (C, C++ and Fortran).
    Complex,
    /// `MPI_BYTE`.
    Byte,
    /// Multi-language types: `MPI_AINT`, `MPI_OFFSET`, `MPI_COUNT`.
    MultiLanguage,
    /// Characters, `MPI_PACKED`: no arithmetic reduction applies.
    Other,
}

macro_rules! basics {
    ($($(#[$m:meta])* $v:ident = $name:literal, $size:expr, $align:expr, $class:ident;)*) => {
        /// A predefined element kind: the basic entries of every type map.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Basic {
            $($(#[$m])* $v,)*
        }

        impl Basic {
            /// Every basic kind.
            pub const ALL: &'static [Basic] = &[$(Basic::$v,)*];

            /// Size in bytes.
            pub const fn size(self) -> usize {
                match self { $(Basic::$v => $size,)* }
            }

            /// Alignment in bytes (x86_64 System V).
            pub const fn align(self) -> usize {
                match self { $(Basic::$v => $align,)* }
            }

            /// The MPI name of the predefined datatype (`"MPI_INT"`).
            pub const fn name(self) -> &'static str {
                match self { $(Basic::$v => $name,)* }
            }

            /// The reduction class.
            pub const fn class(self) -> Class {
                match self { $(Basic::$v => Class::$class,)* }
            }
        }
    };
}

basics! {
    /// C `char`.
    Char = "MPI_CHAR", 1, 1, Other;
    /// C `signed char`.
    SignedChar = "MPI_SIGNED_CHAR", 1, 1, CInteger;
    /// C `unsigned char`.
    UnsignedChar = "MPI_UNSIGNED_CHAR", 1, 1, CInteger;
    /// Uninterpreted byte.
    Byte = "MPI_BYTE", 1, 1, Byte;
    /// C `short`.
    Short = "MPI_SHORT", 2, 2, CInteger;
    /// C `unsigned short`.
    UnsignedShort = "MPI_UNSIGNED_SHORT", 2, 2, CInteger;
    /// C `int`.
    Int = "MPI_INT", 4, 4, CInteger;
    /// C `unsigned`.
    Unsigned = "MPI_UNSIGNED", 4, 4, CInteger;
    /// C `long`.
    Long = "MPI_LONG", 8, 8, CInteger;
    /// C `unsigned long`.
    UnsignedLong = "MPI_UNSIGNED_LONG", 8, 8, CInteger;
    /// C `long long`.
    LongLong = "MPI_LONG_LONG", 8, 8, CInteger;
    /// C `unsigned long long`.
    UnsignedLongLong = "MPI_UNSIGNED_LONG_LONG", 8, 8, CInteger;
    /// C `float`.
    Float = "MPI_FLOAT", 4, 4, Floating;
    /// C `double`.
    Double = "MPI_DOUBLE", 8, 8, Floating;
    /// C `long double`: x87 extended precision in 16 bytes.
    LongDouble = "MPI_LONG_DOUBLE", 16, 16, Floating;
    /// C `wchar_t`.
    Wchar = "MPI_WCHAR", 4, 4, Other;
    /// C `_Bool`.
    CBool = "MPI_C_BOOL", 1, 1, Logical;
    /// C `int8_t`.
    Int8 = "MPI_INT8_T", 1, 1, CInteger;
    /// C `int16_t`.
    Int16 = "MPI_INT16_T", 2, 2, CInteger;
    /// C `int32_t`.
    Int32 = "MPI_INT32_T", 4, 4, CInteger;
    /// C `int64_t`.
    Int64 = "MPI_INT64_T", 8, 8, CInteger;
    /// C `uint8_t`.
    Uint8 = "MPI_UINT8_T", 1, 1, CInteger;
    /// C `uint16_t`.
    Uint16 = "MPI_UINT16_T", 2, 2, CInteger;
    /// C `uint32_t`.
    Uint32 = "MPI_UINT32_T", 4, 4, CInteger;
    /// C `uint64_t`.
    Uint64 = "MPI_UINT64_T", 8, 8, CInteger;
    /// C `float _Complex`.
    CFloatComplex = "MPI_C_FLOAT_COMPLEX", 8, 4, Complex;
    /// C `double _Complex`.
    CDoubleComplex = "MPI_C_DOUBLE_COMPLEX", 16, 8, Complex;
    /// C `long double _Complex`.
    CLongDoubleComplex = "MPI_C_LONG_DOUBLE_COMPLEX", 32, 16, Complex;
    /// C++ `bool`.
    CxxBool = "MPI_CXX_BOOL", 1, 1, Logical;
    /// C++ `std::complex<float>`.
    CxxFloatComplex = "MPI_CXX_FLOAT_COMPLEX", 8, 4, Complex;
    /// C++ `std::complex<double>`.
    CxxDoubleComplex = "MPI_CXX_DOUBLE_COMPLEX", 16, 8, Complex;
    /// C++ `std::complex<long double>`.
    CxxLongDoubleComplex = "MPI_CXX_LONG_DOUBLE_COMPLEX", 32, 16, Complex;
    /// `MPI_Aint`.
    Aint = "MPI_AINT", 8, 8, MultiLanguage;
    /// `MPI_Offset`.
    Offset = "MPI_OFFSET", 8, 8, MultiLanguage;
    /// `MPI_Count`.
    Count = "MPI_COUNT", 8, 8, MultiLanguage;
    /// Packed data (`MPI_PACKED`), one byte per element.
    Packed = "MPI_PACKED", 1, 1, Other;
    /// Fortran `INTEGER`.
    Integer = "MPI_INTEGER", 4, 4, FortranInteger;
    /// Fortran `REAL`.
    Real = "MPI_REAL", 4, 4, Floating;
    /// Fortran `DOUBLE PRECISION`.
    DoublePrecision = "MPI_DOUBLE_PRECISION", 8, 8, Floating;
    /// Fortran `LOGICAL` (gfortran: 4 bytes, true is 1).
    Logical = "MPI_LOGICAL", 4, 4, Logical;
    /// Fortran `CHARACTER`.
    Character = "MPI_CHARACTER", 1, 1, Other;
    /// Fortran `COMPLEX`.
    Complex = "MPI_COMPLEX", 8, 4, Complex;
    /// Fortran `DOUBLE COMPLEX`.
    DoubleComplex = "MPI_DOUBLE_COMPLEX", 16, 8, Complex;
    /// Fortran `LOGICAL*1`.
    Logical1 = "MPI_LOGICAL1", 1, 1, Logical;
    /// Fortran `LOGICAL*2`.
    Logical2 = "MPI_LOGICAL2", 2, 2, Logical;
    /// Fortran `LOGICAL*4`.
    Logical4 = "MPI_LOGICAL4", 4, 4, Logical;
    /// Fortran `LOGICAL*8`.
    Logical8 = "MPI_LOGICAL8", 8, 8, Logical;
    /// Fortran `INTEGER*1`.
    Integer1 = "MPI_INTEGER1", 1, 1, FortranInteger;
    /// Fortran `INTEGER*2`.
    Integer2 = "MPI_INTEGER2", 2, 2, FortranInteger;
    /// Fortran `INTEGER*4`.
    Integer4 = "MPI_INTEGER4", 4, 4, FortranInteger;
    /// Fortran `INTEGER*8`.
    Integer8 = "MPI_INTEGER8", 8, 8, FortranInteger;
    /// Fortran `REAL*4`.
    Real4 = "MPI_REAL4", 4, 4, Floating;
    /// Fortran `REAL*8`.
    Real8 = "MPI_REAL8", 8, 8, Floating;
    /// Fortran `COMPLEX*8`.
    Complex8 = "MPI_COMPLEX8", 8, 4, Complex;
    /// Fortran `COMPLEX*16`.
    Complex16 = "MPI_COMPLEX16", 16, 8, Complex;
}

/// The predefined pair types of `MPI_MAXLOC` and `MPI_MINLOC`: a value and
/// an index, laid out as the C struct `{ value; int index; }` (or two
/// Fortran values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pair {
    /// `MPI_FLOAT_INT`: size 8, extent 8.
    FloatInt,
    /// `MPI_DOUBLE_INT`: size 12, extent 16.
    DoubleInt,
    /// `MPI_LONG_INT`: size 12, extent 16.
    LongInt,
    /// `MPI_2INT`: size 8, extent 8.
    TwoInt,
    /// `MPI_SHORT_INT`: size 6, extent 8.
    ShortInt,
    /// `MPI_LONG_DOUBLE_INT`: size 20, extent 32.
    LongDoubleInt,
    /// `MPI_2INTEGER`.
    TwoInteger,
    /// `MPI_2REAL`.
    TwoReal,
    /// `MPI_2DOUBLE_PRECISION`.
    TwoDoublePrecision,
}

impl Pair {
    /// Every pair type.
    pub const ALL: &'static [Pair] = &[
        Pair::FloatInt,
        Pair::DoubleInt,
        Pair::LongInt,
        Pair::TwoInt,
        Pair::ShortInt,
        Pair::LongDoubleInt,
        Pair::TwoInteger,
        Pair::TwoReal,
        Pair::TwoDoublePrecision,
    ];

    /// The value's kind and the index's kind.
    pub const fn kinds(self) -> (Basic, Basic) {
        match self {
            Pair::FloatInt => (Basic::Float, Basic::Int),
            Pair::DoubleInt => (Basic::Double, Basic::Int),
            Pair::LongInt => (Basic::Long, Basic::Int),
            Pair::TwoInt => (Basic::Int, Basic::Int),
            Pair::ShortInt => (Basic::Short, Basic::Int),
            Pair::LongDoubleInt => (Basic::LongDouble, Basic::Int),
            Pair::TwoInteger => (Basic::Integer, Basic::Integer),
            Pair::TwoReal => (Basic::Real, Basic::Real),
            Pair::TwoDoublePrecision => (Basic::DoublePrecision, Basic::DoublePrecision),
        }
    }

    /// The MPI name (`"MPI_DOUBLE_INT"`).
    pub const fn name(self) -> &'static str {
        match self {
            Pair::FloatInt => "MPI_FLOAT_INT",
            Pair::DoubleInt => "MPI_DOUBLE_INT",
            Pair::LongInt => "MPI_LONG_INT",
            Pair::TwoInt => "MPI_2INT",
            Pair::ShortInt => "MPI_SHORT_INT",
            Pair::LongDoubleInt => "MPI_LONG_DOUBLE_INT",
            Pair::TwoInteger => "MPI_2INTEGER",
            Pair::TwoReal => "MPI_2REAL",
            Pair::TwoDoublePrecision => "MPI_2DOUBLE_PRECISION",
        }
    }

    /// Packed size of one pair (value then index, no padding).
    pub const fn packed_size(self) -> usize {
        let (a, b) = self.kinds();
        a.size() + b.size()
    }
}

/// Element order of a subarray or darray.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Order {
    /// Row-major: the last dimension varies fastest (`MPI_ORDER_C`).
    C,
    /// Column-major: the first dimension varies fastest
    /// (`MPI_ORDER_FORTRAN`).
    Fortran,
}

/// How a darray distributes one dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Distribution {
    /// `MPI_DISTRIBUTE_BLOCK` with a block size, or `None` for the default
    /// (`MPI_DISTRIBUTE_DFLT_DARG`).
    Block(Option<i64>),
    /// `MPI_DISTRIBUTE_CYCLIC` with a block size, or `None` for the default
    /// (1).
    Cyclic(Option<i64>),
    /// `MPI_DISTRIBUTE_NONE`.
    None,
}

/// How a datatype was made (`MPI_COMBINER_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Combiner {
    /// A predefined type.
    Named,
    /// `MPI_Type_dup`.
    Dup,
    /// `MPI_Type_contiguous`.
    Contiguous,
    /// `MPI_Type_vector`.
    Vector,
    /// `MPI_Type_create_hvector`.
    Hvector,
    /// `MPI_Type_indexed`.
    Indexed,
    /// `MPI_Type_create_hindexed`.
    Hindexed,
    /// `MPI_Type_create_indexed_block`.
    IndexedBlock,
    /// `MPI_Type_create_hindexed_block`.
    HindexedBlock,
    /// `MPI_Type_create_struct`.
    Struct,
    /// `MPI_Type_create_subarray`.
    Subarray,
    /// `MPI_Type_create_darray`.
    Darray,
    /// `MPI_Type_create_resized`.
    Resized,
}

/// The arguments a datatype was made from, as `MPI_Type_get_contents`
/// returns them, typed.
#[derive(Debug, Clone)]
pub enum Contents {
    /// A predefined type.
    Named,
    /// `MPI_Type_dup(old)`.
    Dup(Arc<Datatype>),
    /// `MPI_Type_contiguous`.
    Contiguous {
        /// Count.
        count: i64,
        /// Old type.
        old: Arc<Datatype>,
    },
    /// `MPI_Type_vector`, or `MPI_Type_create_hvector` when `bytes`.
    Vector {
        /// Number of blocks.
        count: i64,
        /// Elements per block.
        blocklength: i64,
        /// Stride, in old extents or in bytes.
        stride: i64,
        /// Whether the stride is in bytes (hvector).
        bytes: bool,
        /// Old type.
        old: Arc<Datatype>,
    },
    /// `MPI_Type_indexed` or `MPI_Type_create_hindexed`.
    Indexed {
        /// Block lengths.
        blocklengths: Vec<i64>,
        /// Displacements, in old extents or in bytes.
        displacements: Vec<i64>,
        /// Whether the displacements are in bytes (hindexed).
        bytes: bool,
        /// Old type.
        old: Arc<Datatype>,
    },
    /// `MPI_Type_create_indexed_block` or `MPI_Type_create_hindexed_block`.
    IndexedBlock {
        /// The one block length.
        blocklength: i64,
        /// Displacements, in old extents or in bytes.
        displacements: Vec<i64>,
        /// Whether the displacements are in bytes.
        bytes: bool,
        /// Old type.
        old: Arc<Datatype>,
    },
    /// `MPI_Type_create_struct`.
    Struct {
        /// Block lengths.
        blocklengths: Vec<i64>,
        /// Byte displacements.
        displacements: Vec<i64>,
        /// Types.
        types: Vec<Arc<Datatype>>,
    },
    /// `MPI_Type_create_subarray`.
    Subarray {
        /// Sizes of the full array.
        sizes: Vec<i64>,
        /// Sizes of the subarray.
        subsizes: Vec<i64>,
        /// Starts of the subarray.
        starts: Vec<i64>,
        /// Order.
        order: Order,
        /// Old type.
        old: Arc<Datatype>,
    },
    /// `MPI_Type_create_darray`.
    Darray {
        /// Number of processes in the grid.
        size: i64,
        /// This process's rank in the grid.
        rank: i64,
        /// Sizes of the global array.
        gsizes: Vec<i64>,
        /// Distribution of each dimension.
        distribs: Vec<Distribution>,
        /// Process grid.
        psizes: Vec<i64>,
        /// Order.
        order: Order,
        /// Old type.
        old: Arc<Datatype>,
    },
    /// `MPI_Type_create_resized`.
    Resized {
        /// New lower bound.
        lb: i64,
        /// New extent.
        extent: i64,
        /// Old type.
        old: Arc<Datatype>,
    },
}

/// The C layer's integer codes for the enums `MPI_Type_get_contents`
/// returns among its integers.
#[derive(Debug, Clone, Copy)]
pub struct Codes {
    /// `MPI_ORDER_C`.
    pub order_c: i64,
    /// `MPI_ORDER_FORTRAN`.
    pub order_fortran: i64,
    /// `MPI_DISTRIBUTE_BLOCK`.
    pub distribute_block: i64,
    /// `MPI_DISTRIBUTE_CYCLIC`.
    pub distribute_cyclic: i64,
    /// `MPI_DISTRIBUTE_NONE`.
    pub distribute_none: i64,
    /// `MPI_DISTRIBUTE_DFLT_DARG`.
    pub distribute_dflt_darg: i64,
}

/// `MPI_Type_get_envelope` and `MPI_Type_get_contents` in one: the
/// combiner and the integers, addresses and datatypes in MPI's order.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// The combiner.
    pub combiner: Combiner,
    /// The integer arguments (counts, block lengths, element displacements,
    /// sizes, order codes).
    pub integers: Vec<i64>,
    /// The address arguments (byte strides and displacements, lb, extent).
    pub addresses: Vec<i64>,
    /// The datatype arguments.
    pub datatypes: Vec<Arc<Datatype>>,
}

/// One run of a flattened type map: `count` consecutive elements of kind
/// `basic`, the first at byte displacement `disp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Byte displacement from the buffer's start.
    pub disp: i64,
    /// Element kind.
    pub basic: Basic,
    /// Number of consecutive elements.
    pub count: u64,
}

impl Run {
    fn bytes(&self) -> u64 {
        self.count * self.basic.size() as u64
    }
}

/// How a received or sent signature compares with another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureMatch {
    /// The same sequence of basic kinds.
    Equal,
    /// The first is a proper prefix of the second (a short message).
    Prefix,
    /// The second is a proper prefix of the first (truncation).
    Longer,
    /// They differ in some basic kind.
    Differ,
}

/// A datatype: a flattened type map with its bounds, name and envelope.
#[derive(Debug)]
pub struct Datatype {
    runs: Vec<Run>,
    /// Packed offset of each run within one element.
    offsets: Vec<u64>,
    size: u64,
    elements: u64,
    lb: i64,
    ub: i64,
    true_lb: i64,
    true_ub: i64,
    explicit_lb: bool,
    explicit_ub: bool,
    align: u64,
    contiguous: bool,
    pair: Option<Pair>,
    contents: Contents,
    name: Mutex<String>,
    committed: AtomicBool,
}

fn ovf<T>(v: Option<T>) -> Result<T> {
    v.ok_or(DatatypeError::Overflow)
}

fn non_negative(what: &'static str, value: i64) -> Result<u64> {
    u64::try_from(value).map_err(|_| DatatypeError::Negative { what, value })
}

fn same_length(what: &'static str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(DatatypeError::Length { what, got, want })
    }
}

fn mul_i(a: i64, b: i64) -> Result<i64> {
    ovf(a.checked_mul(b))
}

fn add_i(a: i64, b: i64) -> Result<i64> {
    ovf(a.checked_add(b))
}

fn as_i(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| DatatypeError::Overflow)
}

fn min_opt(a: Option<i64>, b: i64) -> Option<i64> {
    Some(a.map_or(b, |a| a.min(b)))
}

fn max_opt(a: Option<i64>, b: i64) -> Option<i64> {
    Some(a.map_or(b, |a| a.max(b)))
}

/// Accumulates a type map from blocks of copies of old types.
#[derive(Default)]
struct Builder {
    runs: Vec<Run>,
    size: u64,
    elements: u64,
    align: u64,
    data_lo: Option<i64>,
    data_hi: Option<i64>,
    imp_lb: Option<i64>,
    imp_ub: Option<i64>,
    exp_lb: Option<i64>,
    exp_ub: Option<i64>,
}

impl Builder {
    fn push(&mut self, run: Run) -> Result<()> {
        if run.count == 0 {
            return Ok(());
        }
        if let Some(last) = self.runs.last_mut() {
            if last.basic == run.basic
                && as_i(last.bytes()).ok().and_then(|b| last.disp.checked_add(b)) == Some(run.disp)
            {
                last.count = ovf(last.count.checked_add(run.count))?;
                return Ok(());
            }
        }
        if self.runs.len() >= MAX_RUNS {
            return Err(DatatypeError::TooComplex);
        }
        self.runs.push(run);
        Ok(())
    }

    /// Adds `copies` copies of `t`, the first at byte displacement `base`,
    /// the next ones `step` bytes apart.
    fn add(&mut self, base: i64, copies: u64, step: i64, t: &Datatype) -> Result<()> {
        if copies == 0 {
            return Ok(());
        }
        let span = mul_i(as_i(copies - 1)?, step)?;
        let lo = add_i(base, span.min(0))?;
        let hi = add_i(base, span.max(0))?;
        let has_data = t.size > 0;
        if t.explicit_lb {
            self.exp_lb = min_opt(self.exp_lb, add_i(lo, t.lb)?);
        } else if has_data {
            self.imp_lb = min_opt(self.imp_lb, add_i(lo, t.lb)?);
        }
        if t.explicit_ub {
            self.exp_ub = max_opt(self.exp_ub, add_i(hi, t.ub)?);
        } else if has_data {
            self.imp_ub = max_opt(self.imp_ub, add_i(hi, t.ub)?);
        }
        if has_data {
            self.data_lo = min_opt(self.data_lo, add_i(lo, t.true_lb)?);
            self.data_hi = max_opt(self.data_hi, add_i(hi, t.true_ub)?);
        }
        self.align = self.align.max(t.align);
        self.size = ovf(t.size.checked_mul(copies).and_then(|s| s.checked_add(self.size)))?;
        self.elements = ovf(t.elements.checked_mul(copies).and_then(|s| s.checked_add(self.elements)))?;
        match t.runs.as_slice() {
            [] => {}
            [r] if as_i(r.bytes())? == step => {
                // Copies that abut form one run.
                self.push(Run {
                    disp: add_i(base, r.disp)?,
                    basic: r.basic,
                    count: ovf(r.count.checked_mul(copies))?,
                })?;
            }
            runs => {
                // Each copy adds at least all but one of its runs (its first
                // may continue the previous copy's last): refuse early
                // rather than after filling memory.
                let per_copy = (runs.len() as u64 - 1).max(1);
                let least = copies.saturating_sub(1).saturating_mul(per_copy);
                if least.saturating_add(self.runs.len() as u64) > MAX_RUNS as u64 {
                    return Err(DatatypeError::TooComplex);
                }
                for k in 0..copies {
                    let off = add_i(base, mul_i(as_i(k)?, step)?)?;
                    for r in runs {
                        self.push(Run { disp: add_i(off, r.disp)?, ..*r })?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The finished type; `pad` adds struct's alignment epsilon.
    fn finish(self, pad: bool, contents: Contents) -> Result<Datatype> {
        let lb = self.exp_lb.or(self.imp_lb).unwrap_or(0);
        let mut ub = self.exp_ub.or(self.imp_ub).unwrap_or(lb);
        if pad && self.exp_ub.is_none() && self.align > 1 {
            let extent = ovf(ub.checked_sub(lb))?;
            let a = as_i(self.align)?;
            let rem = extent.rem_euclid(a);
            if rem != 0 {
                ub = add_i(ub, a - rem)?;
            }
        }
        ovf(ub.checked_sub(lb))?;
        Ok(Datatype::from_parts(
            self.runs,
            self.size,
            self.elements,
            (lb, ub),
            (self.data_lo.unwrap_or(0), self.data_hi.unwrap_or(0)),
            (self.exp_lb.is_some(), self.exp_ub.is_some()),
            self.align.max(1),
            None,
            contents,
            String::new(),
        ))
    }
}

impl Datatype {
    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        runs: Vec<Run>,
        size: u64,
        elements: u64,
        (lb, ub): (i64, i64),
        (true_lb, true_ub): (i64, i64),
        (explicit_lb, explicit_ub): (bool, bool),
        align: u64,
        pair: Option<Pair>,
        contents: Contents,
        name: String,
    ) -> Datatype {
        let mut offsets = Vec::with_capacity(runs.len());
        let mut off = 0u64;
        for r in &runs {
            offsets.push(off);
            off += r.bytes();
        }
        let contiguous = size == 0
            || (runs.len() == 1
                && runs[0].disp == lb
                && ub.checked_sub(lb).and_then(|e| u64::try_from(e).ok()) == Some(size));
        Datatype {
            runs,
            offsets,
            size,
            elements,
            lb,
            ub,
            true_lb,
            true_ub,
            explicit_lb,
            explicit_ub,
            align,
            contiguous,
            pair,
            contents,
            name: Mutex::new(name),
            committed: AtomicBool::new(false),
        }
    }

    /// The predefined datatype of one basic kind (committed, named).
    pub fn basic(b: Basic) -> Datatype {
        let size = b.size() as u64;
        let t = Datatype::from_parts(
            vec![Run { disp: 0, basic: b, count: 1 }],
            size,
            1,
            (0, size as i64),
            (0, size as i64),
            (false, false),
            b.align() as u64,
            None,
            Contents::Named,
            b.name().to_string(),
        );
        t.commit();
        t
    }

    /// The predefined pair type (committed, named), with its C struct
    /// layout.
    pub fn pair(p: Pair) -> Datatype {
        let (a, b) = p.kinds();
        let off = a.size().div_ceil(b.align()) * b.align();
        let align = a.align().max(b.align());
        let data_end = (off + b.size()) as i64;
        let ub = (off + b.size()).div_ceil(align) * align;
        let first = Run { disp: 0, basic: a, count: 1 };
        let runs = if a == b && off == a.size() {
            vec![Run { count: 2, ..first }]
        } else {
            vec![first, Run { disp: off as i64, basic: b, count: 1 }]
        };
        let t = Datatype::from_parts(
            runs,
            (a.size() + b.size()) as u64,
            2,
            (0, ub as i64),
            (0, data_end),
            (false, false),
            align as u64,
            Some(p),
            Contents::Named,
            p.name().to_string(),
        );
        t.commit();
        t
    }

    /// The one shared instance of a predefined basic type.
    pub fn shared_basic(b: Basic) -> Arc<Datatype> {
        static ALL: OnceLock<Vec<Arc<Datatype>>> = OnceLock::new();
        let all = ALL.get_or_init(|| Basic::ALL.iter().map(|&b| Arc::new(Datatype::basic(b))).collect());
        all[b as usize].clone()
    }

    /// The one shared instance of a predefined pair type.
    pub fn shared_pair(p: Pair) -> Arc<Datatype> {
        static ALL: OnceLock<Vec<Arc<Datatype>>> = OnceLock::new();
        let all = ALL.get_or_init(|| Pair::ALL.iter().map(|&p| Arc::new(Datatype::pair(p))).collect());
        all[p as usize].clone()
    }

    /// `MPI_Type_contiguous`.
    pub fn contiguous(count: i64, old: &Arc<Datatype>) -> Result<Datatype> {
        let n = non_negative("count", count)?;
        let mut b = Builder::default();
        b.add(0, n, old.extent(), old)?;
        b.finish(false, Contents::Contiguous { count, old: old.clone() })
    }

    /// `MPI_Type_vector`: `count` blocks of `blocklength` old elements, block
    /// starts `stride` old extents apart.
    pub fn vector(count: i64, blocklength: i64, stride: i64, old: &Arc<Datatype>) -> Result<Datatype> {
        let step = mul_i(stride, old.extent())?;
        Self::vector_bytes(count, blocklength, step, old, false, stride)
    }

    /// `MPI_Type_create_hvector`: as [`Datatype::vector`] with the stride
    /// in bytes.
    pub fn hvector(count: i64, blocklength: i64, stride: i64, old: &Arc<Datatype>) -> Result<Datatype> {
        Self::vector_bytes(count, blocklength, stride, old, true, stride)
    }

    fn vector_bytes(
        count: i64,
        blocklength: i64,
        step: i64,
        old: &Arc<Datatype>,
        bytes: bool,
        stride: i64,
    ) -> Result<Datatype> {
        let n = non_negative("count", count)?;
        let bl = non_negative("blocklength", blocklength)?;
        let mut b = Builder::default();
        let ext = old.extent();
        if bl > 0 {
            let block_bytes = mul_i(as_i(bl)?, ext)?;
            if n > 1 && step == block_bytes {
                b.add(0, ovf(n.checked_mul(bl))?, ext, old)?;
            } else {
                // Every block adds runs, except when the old type has no
                // data: then the bounds come from the first and last blocks.
                let ks: Box<dyn Iterator<Item = u64>> =
                    if old.runs.is_empty() { Box::new([0, n.saturating_sub(1)].into_iter()) } else { Box::new(0..n) };
                for k in ks {
                    b.add(mul_i(as_i(k)?, step)?, bl, ext, old)?;
                }
            }
        }
        b.finish(false, Contents::Vector { count, blocklength, stride, bytes, old: old.clone() })
    }

    /// `MPI_Type_indexed`: blocks at displacements counted in old extents.
    pub fn indexed(blocklengths: &[i64], displacements: &[i64], old: &Arc<Datatype>) -> Result<Datatype> {
        Self::indexed_any(blocklengths, displacements, old, false)
    }

    /// `MPI_Type_create_hindexed`: blocks at byte displacements.
    pub fn hindexed(blocklengths: &[i64], displacements: &[i64], old: &Arc<Datatype>) -> Result<Datatype> {
        Self::indexed_any(blocklengths, displacements, old, true)
    }

    fn indexed_any(blocklengths: &[i64], displacements: &[i64], old: &Arc<Datatype>, bytes: bool) -> Result<Datatype> {
        same_length("displacements", displacements.len(), blocklengths.len())?;
        let ext = old.extent();
        let mut b = Builder::default();
        for (&bl, &d) in blocklengths.iter().zip(displacements) {
            let bl = non_negative("blocklength", bl)?;
            let base = if bytes { d } else { mul_i(d, ext)? };
            b.add(base, bl, ext, old)?;
        }
        b.finish(
            false,
            Contents::Indexed {
                blocklengths: blocklengths.to_vec(),
                displacements: displacements.to_vec(),
                bytes,
                old: old.clone(),
            },
        )
    }

    /// `MPI_Type_create_indexed_block`: blocks of one length at
    /// displacements counted in old extents.
    pub fn indexed_block(blocklength: i64, displacements: &[i64], old: &Arc<Datatype>) -> Result<Datatype> {
        Self::indexed_block_any(blocklength, displacements, old, false)
    }

    /// `MPI_Type_create_hindexed_block`: blocks of one length at byte
    /// displacements.
    pub fn hindexed_block(blocklength: i64, displacements: &[i64], old: &Arc<Datatype>) -> Result<Datatype> {
        Self::indexed_block_any(blocklength, displacements, old, true)
    }

    fn indexed_block_any(
        blocklength: i64,
        displacements: &[i64],
        old: &Arc<Datatype>,
        bytes: bool,
    ) -> Result<Datatype> {
        let bl = non_negative("blocklength", blocklength)?;
        let ext = old.extent();
        let mut b = Builder::default();
        for &d in displacements {
            let base = if bytes { d } else { mul_i(d, ext)? };
            b.add(base, bl, ext, old)?;
        }
        b.finish(
            false,
            Contents::IndexedBlock { blocklength, displacements: displacements.to_vec(), bytes, old: old.clone() },
        )
    }

    /// `MPI_Type_create_struct`. The extent is rounded up to the largest
    /// alignment of the entries unless an explicit upper bound is set.
    pub fn structure(blocklengths: &[i64], displacements: &[i64], types: &[Arc<Datatype>]) -> Result<Datatype> {
        same_length("displacements", displacements.len(), blocklengths.len())?;
        same_length("types", types.len(), blocklengths.len())?;
        let mut b = Builder::default();
        for ((&bl, &d), t) in blocklengths.iter().zip(displacements).zip(types) {
            let bl = non_negative("blocklength", bl)?;
            b.add(d, bl, t.extent(), t)?;
        }
        b.finish(
            true,
            Contents::Struct {
                blocklengths: blocklengths.to_vec(),
                displacements: displacements.to_vec(),
                types: types.to_vec(),
            },
        )
    }

    /// `MPI_Type_create_resized`: the same type map with explicit bounds
    /// `lb` and `lb + extent`.
    pub fn resized(old: &Arc<Datatype>, lb: i64, extent: i64) -> Result<Datatype> {
        let ub = add_i(lb, extent)?;
        let mut t = old.rebuilt(Contents::Resized { lb, extent, old: old.clone() });
        t.lb = lb;
        t.ub = ub;
        t.explicit_lb = true;
        t.explicit_ub = true;
        Ok(t.recomputed())
    }

    /// `MPI_Type_dup`: the same type, unnamed, committed if `old` is.
    pub fn dup(old: &Arc<Datatype>) -> Datatype {
        let t = old.rebuilt(Contents::Dup(old.clone()));
        if old.is_committed() {
            t.commit();
        }
        t
    }

    fn rebuilt(&self, contents: Contents) -> Datatype {
        Datatype::from_parts(
            self.runs.clone(),
            self.size,
            self.elements,
            (self.lb, self.ub),
            (self.true_lb, self.true_ub),
            (self.explicit_lb, self.explicit_ub),
            self.align,
            self.pair,
            contents,
            String::new(),
        )
    }

    fn recomputed(self) -> Datatype {
        let name = self.name();
        Datatype::from_parts(
            self.runs,
            self.size,
            self.elements,
            (self.lb, self.ub),
            (self.true_lb, self.true_ub),
            (self.explicit_lb, self.explicit_ub),
            self.align,
            self.pair,
            self.contents,
            name,
        )
    }

    /// `MPI_Type_create_subarray`.
    pub fn subarray(
        sizes: &[i64],
        subsizes: &[i64],
        starts: &[i64],
        order: Order,
        old: &Arc<Datatype>,
    ) -> Result<Datatype> {
        let n = sizes.len();
        if n == 0 {
            return Err(DatatypeError::Invalid("subarray: ndims must be at least 1".into()));
        }
        same_length("subsizes", subsizes.len(), n)?;
        same_length("starts", starts.len(), n)?;
        for i in 0..n {
            if sizes[i] < 1 {
                return Err(DatatypeError::Invalid(format!("subarray: sizes[{i}] = {} is not positive", sizes[i])));
            }
            if subsizes[i] < 0 || subsizes[i] > sizes[i] {
                return Err(DatatypeError::Invalid(format!(
                    "subarray: subsizes[{i}] = {} is not in 0..={}",
                    subsizes[i], sizes[i]
                )));
            }
            if starts[i] < 0 || starts[i] > sizes[i] - subsizes[i] {
                return Err(DatatypeError::Invalid(format!(
                    "subarray: starts[{i}] = {} is not in 0..={}",
                    starts[i],
                    sizes[i] - subsizes[i]
                )));
            }
        }
        // Dimensions from the fastest-varying outwards.
        let dims: Vec<usize> = match order {
            Order::C => (0..n).rev().collect(),
            Order::Fortran => (0..n).collect(),
        };
        let ext = old.extent();
        let mut stride = ext;
        let mut offset = 0i64;
        let mut t: Option<Datatype> = None;
        for &d in &dims {
            let mut b = Builder::default();
            let inner: &Datatype = t.as_ref().unwrap_or(&**old);
            b.add(0, non_negative("subsizes", subsizes[d])?, stride, inner)?;
            offset = add_i(offset, mul_i(starts[d], stride)?)?;
            stride = mul_i(stride, sizes[d])?;
            t = Some(b.finish(false, Contents::Named)?);
        }
        let mut b = Builder::default();
        if let Some(t) = &t {
            b.add(offset, 1, 0, t)?;
        }
        let mut out = b.finish(
            false,
            Contents::Subarray {
                sizes: sizes.to_vec(),
                subsizes: subsizes.to_vec(),
                starts: starts.to_vec(),
                order,
                old: old.clone(),
            },
        )?;
        // The full array's bounds: lb 0, extent the product of sizes.
        out.lb = 0;
        out.ub = stride;
        out.explicit_lb = true;
        out.explicit_ub = true;
        Ok(out.recomputed())
    }

    /// `MPI_Type_create_darray`: this process's part of a block, cyclic or
    /// undistributed global array over a `psizes` grid of `size`
    /// processes (row-major rank order in the grid).
    #[allow(clippy::too_many_arguments)]
    pub fn darray(
        size: i64,
        rank: i64,
        gsizes: &[i64],
        distribs: &[Distribution],
        psizes: &[i64],
        order: Order,
        old: &Arc<Datatype>,
    ) -> Result<Datatype> {
        let n = gsizes.len();
        if n == 0 {
            return Err(DatatypeError::Invalid("darray: ndims must be at least 1".into()));
        }
        same_length("distribs", distribs.len(), n)?;
        same_length("psizes", psizes.len(), n)?;
        if size < 1 || rank < 0 || rank >= size {
            return Err(DatatypeError::Invalid(format!("darray: rank {rank} is not in a group of {size}")));
        }
        let mut grid = 1i64;
        for (i, (&p, &g)) in psizes.iter().zip(gsizes).enumerate() {
            if p < 1 || g < 1 {
                return Err(DatatypeError::Invalid(format!(
                    "darray: gsizes[{i}] = {g} and psizes[{i}] = {p} must be positive"
                )));
            }
            if distribs[i] == Distribution::None && p != 1 {
                return Err(DatatypeError::Invalid(format!(
                    "darray: dimension {i} is not distributed but psizes[{i}] = {p}"
                )));
            }
            grid = mul_i(grid, p)?;
        }
        if grid != size {
            return Err(DatatypeError::Invalid(format!("darray: the process grid has {grid} processes, not {size}")));
        }
        // Grid coordinates, row-major as MPI specifies.
        let mut coords = vec![0i64; n];
        let mut r = rank;
        for i in (0..n).rev() {
            coords[i] = r % psizes[i];
            r /= psizes[i];
        }
        // The blocks of indices (start, length) this process owns in each
        // dimension.
        let mut owned: Vec<Vec<(i64, i64)>> = Vec::with_capacity(n);
        for i in 0..n {
            let (g, p, c) = (gsizes[i], psizes[i], coords[i]);
            let blocks: Vec<(i64, i64)> = match distribs[i] {
                Distribution::None => vec![(0, g)],
                Distribution::Block(arg) => {
                    let b = match arg {
                        None => g / p + i64::from(g % p != 0),
                        Some(b) if b >= 1 && b.checked_mul(p).is_some_and(|bp| bp >= g) => b,
                        Some(b) => {
                            return Err(DatatypeError::Invalid(format!(
                                "darray: block size {b} in dimension {i} does not cover {g} elements over {p} processes"
                            )))
                        }
                    };
                    let lo = c.saturating_mul(b).min(g);
                    let hi = (c + 1).saturating_mul(b).min(g);
                    vec![(lo, hi - lo)]
                }
                Distribution::Cyclic(arg) => {
                    let b = arg.unwrap_or(1);
                    if b < 1 {
                        return Err(DatatypeError::Invalid(format!(
                            "darray: cyclic block size {b} in dimension {i} is not positive"
                        )));
                    }
                    if p == 1 {
                        vec![(0, g)]
                    } else {
                        let mut v = Vec::new();
                        let mut start = c.saturating_mul(b);
                        while start < g {
                            v.push((start, b.min(g - start)));
                            start = start.saturating_add(b.saturating_mul(p));
                        }
                        v
                    }
                }
            };
            owned.push(blocks);
        }
        let dims: Vec<usize> = match order {
            Order::C => (0..n).rev().collect(),
            Order::Fortran => (0..n).collect(),
        };
        let ext = old.extent();
        let mut stride = ext;
        let mut t: Option<Datatype> = None;
        for &d in &dims {
            let mut b = Builder::default();
            let inner: &Datatype = t.as_ref().unwrap_or(&**old);
            // Nothing to place when the inner part is empty: the bounds are
            // set explicitly below.
            if inner.size > 0 {
                for &(start, len) in &owned[d] {
                    b.add(mul_i(start, stride)?, len as u64, stride, inner)?;
                }
            }
            stride = mul_i(stride, gsizes[d])?;
            t = Some(b.finish(false, Contents::Named)?);
        }
        let mut b = Builder::default();
        if let Some(t) = &t {
            b.add(0, 1, 0, t)?;
        }
        let mut out = b.finish(
            false,
            Contents::Darray {
                size,
                rank,
                gsizes: gsizes.to_vec(),
                distribs: distribs.to_vec(),
                psizes: psizes.to_vec(),
                order,
                old: old.clone(),
            },
        )?;
        out.lb = 0;
        out.ub = stride;
        out.explicit_lb = true;
        out.explicit_ub = true;
        Ok(out.recomputed())
    }

    /// `MPI_Type_commit`.
    pub fn commit(&self) {
        self.committed.store(true, Ordering::Release);
    }

    /// Whether the type has been committed.
    pub fn is_committed(&self) -> bool {
        self.committed.load(Ordering::Acquire)
    }

    /// `MPI_Type_get_name`: the predefined name, the name set, or `""`.
    pub fn name(&self) -> String {
        self.name.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// `MPI_Type_set_name`.
    pub fn set_name(&self, name: &str) {
        *self.name.lock().unwrap_or_else(PoisonError::into_inner) = name.to_string();
    }

    /// The flattened type map of one element.
    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    /// `MPI_Type_size_x`: bytes of data in one element.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Number of basic elements in one element.
    pub fn elements(&self) -> u64 {
        self.elements
    }

    /// Lower bound.
    pub fn lb(&self) -> i64 {
        self.lb
    }

    /// Upper bound.
    pub fn ub(&self) -> i64 {
        self.ub
    }

    /// Extent (`ub - lb`, may be negative after resized).
    pub fn extent(&self) -> i64 {
        self.ub - self.lb
    }

    /// True lower bound: the lowest byte of data.
    pub fn true_lb(&self) -> i64 {
        self.true_lb
    }

    /// True upper bound: one past the highest byte of data.
    pub fn true_ub(&self) -> i64 {
        self.true_ub
    }

    /// True extent.
    pub fn true_extent(&self) -> i64 {
        self.true_ub - self.true_lb
    }

    /// Largest alignment of the entries.
    pub fn alignment(&self) -> u64 {
        self.align
    }

    /// Whether `count` elements are one block of `count * size` bytes
    /// starting at `lb`, so that packing is one copy.
    pub fn is_contiguous(&self) -> bool {
        self.contiguous
    }

    /// The pair kind of a predefined pair type (or of a dup or resized
    /// copy of one, whose packed form is the same).
    pub fn pair_kind(&self) -> Option<Pair> {
        self.pair
    }

    /// The basic kind of a predefined type.
    pub fn basic_kind(&self) -> Option<Basic> {
        match (&self.contents, self.runs.as_slice(), self.pair) {
            (Contents::Named, [r], None) if r.count == 1 => Some(r.basic),
            _ => None,
        }
    }

    /// The combiner.
    pub fn combiner(&self) -> Combiner {
        match &self.contents {
            Contents::Named => Combiner::Named,
            Contents::Dup(_) => Combiner::Dup,
            Contents::Contiguous { .. } => Combiner::Contiguous,
            Contents::Vector { bytes: false, .. } => Combiner::Vector,
            Contents::Vector { bytes: true, .. } => Combiner::Hvector,
            Contents::Indexed { bytes: false, .. } => Combiner::Indexed,
            Contents::Indexed { bytes: true, .. } => Combiner::Hindexed,
            Contents::IndexedBlock { bytes: false, .. } => Combiner::IndexedBlock,
            Contents::IndexedBlock { bytes: true, .. } => Combiner::HindexedBlock,
            Contents::Struct { .. } => Combiner::Struct,
            Contents::Subarray { .. } => Combiner::Subarray,
            Contents::Darray { .. } => Combiner::Darray,
            Contents::Resized { .. } => Combiner::Resized,
        }
    }

    /// The arguments the type was made from.
    pub fn contents(&self) -> &Contents {
        &self.contents
    }

    /// The envelope and contents in MPI's argument order
    /// (`MPI_Type_get_envelope`, `MPI_Type_get_contents`), with `codes`
    /// for orders and distributions.
    pub fn envelope(&self, codes: &Codes) -> Envelope {
        let order = |o: &Order| match o {
            Order::C => codes.order_c,
            Order::Fortran => codes.order_fortran,
        };
        let len = |v: usize| v as i64;
        let (integers, addresses, datatypes) = match &self.contents {
            Contents::Named => (vec![], vec![], vec![]),
            Contents::Dup(old) => (vec![], vec![], vec![old.clone()]),
            Contents::Contiguous { count, old } => (vec![*count], vec![], vec![old.clone()]),
            Contents::Vector { count, blocklength, stride, bytes: false, old } => {
                (vec![*count, *blocklength, *stride], vec![], vec![old.clone()])
            }
            Contents::Vector { count, blocklength, stride, bytes: true, old } => {
                (vec![*count, *blocklength], vec![*stride], vec![old.clone()])
            }
            Contents::Indexed { blocklengths, displacements, bytes, old } => {
                let mut ints = vec![len(blocklengths.len())];
                ints.extend(blocklengths);
                if *bytes {
                    (ints, displacements.clone(), vec![old.clone()])
                } else {
                    ints.extend(displacements);
                    (ints, vec![], vec![old.clone()])
                }
            }
            Contents::IndexedBlock { blocklength, displacements, bytes, old } => {
                let mut ints = vec![len(displacements.len()), *blocklength];
                if *bytes {
                    (ints, displacements.clone(), vec![old.clone()])
                } else {
                    ints.extend(displacements);
                    (ints, vec![], vec![old.clone()])
                }
            }
            Contents::Struct { blocklengths, displacements, types } => {
                let mut ints = vec![len(blocklengths.len())];
                ints.extend(blocklengths);
                (ints, displacements.clone(), types.clone())
            }
            Contents::Subarray { sizes, subsizes, starts, order: o, old } => {
                let mut ints = vec![len(sizes.len())];
                ints.extend(sizes);
                ints.extend(subsizes);
                ints.extend(starts);
                ints.push(order(o));
                (ints, vec![], vec![old.clone()])
            }
            Contents::Darray { size, rank, gsizes, distribs, psizes, order: o, old } => {
                let mut ints = vec![*size, *rank, len(gsizes.len())];
                ints.extend(gsizes);
                ints.extend(distribs.iter().map(|d| match d {
                    Distribution::Block(_) => codes.distribute_block,
                    Distribution::Cyclic(_) => codes.distribute_cyclic,
                    Distribution::None => codes.distribute_none,
                }));
                ints.extend(distribs.iter().map(|d| match d {
                    Distribution::Block(Some(b)) | Distribution::Cyclic(Some(b)) => *b,
                    _ => codes.distribute_dflt_darg,
                }));
                ints.extend(psizes);
                ints.push(order(o));
                (ints, vec![], vec![old.clone()])
            }
            Contents::Resized { lb, extent, old } => (vec![], vec![*lb, *extent], vec![old.clone()]),
        };
        Envelope { combiner: self.combiner(), integers, addresses, datatypes }
    }

    /// `MPI_Pack_size`: packed bytes of `count` elements.
    pub fn pack_size(&self, count: u64) -> Option<u64> {
        self.size.checked_mul(count)
    }

    /// `MPI_Get_count`: whole elements in `bytes`, or `None`
    /// (`MPI_UNDEFINED`) when `bytes` is not a multiple of the size.
    pub fn get_count(&self, bytes: u64) -> Option<u64> {
        if self.size == 0 {
            return (bytes == 0).then_some(0);
        }
        (bytes % self.size == 0).then_some(bytes / self.size)
    }

    /// `MPI_Get_elements`: basic elements in the first `bytes` packed bytes
    /// of a message of this type, or `None` (`MPI_UNDEFINED`) when `bytes`
    /// ends inside a basic element.
    pub fn get_elements(&self, bytes: u64) -> Option<u64> {
        if self.size == 0 {
            return (bytes == 0).then_some(0);
        }
        let whole = bytes / self.size;
        let mut rest = bytes % self.size;
        let mut n = whole.checked_mul(self.elements)?;
        for r in &self.runs {
            if rest == 0 {
                break;
            }
            let b = r.bytes();
            if rest >= b {
                n += r.count;
                rest -= b;
            } else {
                let s = r.basic.size() as u64;
                if rest % s != 0 {
                    return None;
                }
                n += rest / s;
                rest = 0;
            }
        }
        Some(n)
    }

    /// The bytes `count` elements touch, relative to the buffer's address:
    /// `lo..hi`, empty when there is no data.
    pub fn span(&self, count: u64) -> Option<(i128, i128)> {
        if count == 0 || self.size == 0 {
            return Some((0, 0));
        }
        let reach = (count as i128 - 1) * self.extent() as i128;
        Some((self.true_lb as i128 + reach.min(0), self.true_ub as i128 + reach.max(0)))
    }

    /// The pieces of memory (displacement, bytes) holding packed bytes
    /// `offset..offset + len` of `count` elements, in packed order, with
    /// pieces that continue each other merged (one-sided communication
    /// sends these to the target, which knows no datatype of the origin's).
    pub fn pieces(&self, count: u64, offset: u64, len: u64) -> Vec<(i64, u64)> {
        let len = self.size.saturating_mul(count).saturating_sub(offset).min(len);
        let mut out: Vec<(i64, u64)> = Vec::new();
        self.segments(count, offset, len, |disp, _, n| match out.last_mut() {
            Some(last) if last.0 + last.1 as i64 == disp => last.1 += n,
            _ => out.push((disp, n)),
        });
        out
    }

    /// Calls `f(displacement, packed_position, bytes)` for each piece of
    /// memory holding packed bytes `offset..offset + len` of `count`
    /// elements, in packed order (`len` already clipped to the data).
    fn segments(&self, count: u64, offset: u64, len: u64, mut f: impl FnMut(i64, u64, u64)) {
        if len == 0 {
            return;
        }
        let ext = self.extent();
        if self.contiguous {
            f(self.lb + offset as i64, offset, len);
            return;
        }
        let mut elem = offset / self.size;
        let within = offset % self.size;
        let mut i = match self.offsets.binary_search(&within) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let mut skip = within - self.offsets[i];
        let mut pos = offset;
        let end = offset + len;
        while pos < end && elem < count {
            let base = (elem as i64).wrapping_mul(ext);
            while i < self.runs.len() && pos < end {
                let r = &self.runs[i];
                let n = (r.bytes() - skip).min(end - pos);
                f(base.wrapping_add(r.disp).wrapping_add(skip as i64), pos, n);
                pos += n;
                skip = 0;
                i += 1;
            }
            i = 0;
            elem += 1;
        }
    }

    /// Packs packed bytes `offset..` of `count` elements at `src` into
    /// `out`, as many as fit; returns how many were written.
    ///
    /// # Safety
    /// Every byte of `count` elements of this type at `src` (see
    /// [`Datatype::span`]) must be readable.
    pub unsafe fn pack_at(&self, count: u64, src: *const u8, offset: u64, out: &mut [u8]) -> usize {
        let total = self.size.saturating_mul(count);
        let len = total.saturating_sub(offset).min(out.len() as u64);
        self.segments(count, offset, len, |disp, pos, n| {
            let at = (pos - offset) as usize;
            // SAFETY: the caller guarantees the element's bytes at `src` are
            // readable; `at + n <= len <= out.len()`, and `out` is a distinct
            // `&mut` slice, so the ranges cannot overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(src.wrapping_offset(disp as isize), out.as_mut_ptr().add(at), n as usize)
            }
        });
        len as usize
    }

    /// Packs `count` elements at `src` into `out` (`MPI_Pack`), as many
    /// bytes as fit; returns how many were written.
    ///
    /// # Safety
    /// As [`Datatype::pack_at`].
    pub unsafe fn pack(&self, count: u64, src: *const u8, out: &mut [u8]) -> usize {
        // SAFETY: the caller upholds pack_at's contract.
        unsafe { self.pack_at(count, src, 0, out) }
    }

    /// Unpacks `input` as packed bytes `offset..` of `count` elements
    /// into the buffer at `dst`; returns how many bytes were used.
    ///
    /// # Safety
    /// Every byte of `count` elements of this type at `dst` must be
    /// writable and must not overlap `input`.
    pub unsafe fn unpack_at(&self, count: u64, dst: *mut u8, offset: u64, input: &[u8]) -> usize {
        let total = self.size.saturating_mul(count);
        let len = total.saturating_sub(offset).min(input.len() as u64);
        self.segments(count, offset, len, |disp, pos, n| {
            let at = (pos - offset) as usize;
            // SAFETY: the caller guarantees the element's bytes at `dst` are
            // writable and apart from `input`; `at + n <= input.len()`.
            unsafe {
                std::ptr::copy_nonoverlapping(input.as_ptr().add(at), dst.wrapping_offset(disp as isize), n as usize)
            }
        });
        len as usize
    }

    /// Unpacks `input` into `count` elements at `dst` (`MPI_Unpack`);
    /// returns how many bytes were used.
    ///
    /// # Safety
    /// As [`Datatype::unpack_at`].
    pub unsafe fn unpack(&self, count: u64, dst: *mut u8, input: &[u8]) -> usize {
        // SAFETY: the caller upholds unpack_at's contract.
        unsafe { self.unpack_at(count, dst, 0, input) }
    }

    fn check_slice(&self, count: u64, origin: usize, len: usize) -> Result<()> {
        let (lo, hi) = self.span(count).ok_or(DatatypeError::Overflow)?;
        if lo == hi {
            return Ok(());
        }
        let (lo, hi) = (lo + origin as i128, hi + origin as i128);
        if lo < 0 || hi > len as i128 {
            return Err(DatatypeError::OutOfBounds { lo, hi, len });
        }
        Ok(())
    }

    /// Safe [`Datatype::pack`]: the buffer's address is `src[origin]`.
    pub fn pack_slice(&self, count: u64, src: &[u8], origin: usize, out: &mut [u8]) -> Result<usize> {
        self.check_slice(count, origin, src.len())?;
        let base = src.as_ptr().wrapping_add(origin);
        // SAFETY: check_slice proved every byte the elements touch lies in
        // `src`.
        Ok(unsafe { self.pack(count, base, out) })
    }

    /// Safe [`Datatype::unpack`]: the buffer's address is `dst[origin]`.
    pub fn unpack_slice(&self, count: u64, dst: &mut [u8], origin: usize, input: &[u8]) -> Result<usize> {
        self.check_slice(count, origin, dst.len())?;
        let base = dst.as_mut_ptr().wrapping_add(origin);
        // SAFETY: check_slice proved every byte the elements touch lies in
        // `dst`, which as a `&mut` cannot overlap `input`.
        Ok(unsafe { self.unpack(count, base, input) })
    }

    /// The type signature of `count` elements: basic kinds with repeat
    /// counts, consecutive equal kinds merged.
    pub fn signature(&self, count: u64) -> Signature<'_> {
        let uniform = self
            .runs
            .first()
            .filter(|f| self.runs.iter().all(|r| r.basic == f.basic))
            .map(|f| (f.basic, self.elements.saturating_mul(count)));
        Signature { t: self, count, elem: 0, i: 0, uniform }
    }
}

/// Iterator over a type signature, from [`Datatype::signature`].
pub struct Signature<'a> {
    t: &'a Datatype,
    count: u64,
    elem: u64,
    i: usize,
    uniform: Option<(Basic, u64)>,
}

impl Signature<'_> {
    fn next_run(&mut self) -> Option<(Basic, u64)> {
        if self.i >= self.t.runs.len() {
            self.i = 0;
            self.elem += 1;
        }
        if self.elem >= self.count || self.t.runs.is_empty() {
            return None;
        }
        let r = self.t.runs[self.i];
        self.i += 1;
        Some((r.basic, r.count))
    }

    fn peek_basic(&self) -> Option<Basic> {
        let (elem, i) = if self.i >= self.t.runs.len() { (self.elem + 1, 0) } else { (self.elem, self.i) };
        (elem < self.count).then(|| self.t.runs.get(i).map(|r| r.basic))?
    }
}

impl Iterator for Signature<'_> {
    type Item = (Basic, u64);

    fn next(&mut self) -> Option<(Basic, u64)> {
        if let Some(u) = self.uniform.take() {
            self.count = 0;
            return (u.1 > 0).then_some(u);
        }
        let (b, mut n) = self.next_run()?;
        while self.peek_basic() == Some(b) {
            n += self.next_run().map_or(0, |r| r.1);
        }
        Some((b, n))
    }
}

/// Bytes of the bounce buffer [`copy`] packs through.
const COPY_CHUNK: usize = 64 * 1024;

/// Copies `src_count` elements of `src_type` at `src` into `dst_count`
/// elements of `dst_type` at `dst`, through their packed form (the types'
/// signatures are the caller's to check). Copies the smaller of the two
/// sizes and returns it.
///
/// # Safety
/// The source elements must be readable, the destination elements
/// writable, and the two must not overlap.
pub unsafe fn copy(
    src_type: &Datatype,
    src_count: u64,
    src: *const u8,
    dst_type: &Datatype,
    dst_count: u64,
    dst: *mut u8,
) -> u64 {
    let n = src_type.size.saturating_mul(src_count).min(dst_type.size.saturating_mul(dst_count));
    if n == 0 {
        return 0;
    }
    if src_type.contiguous && dst_type.contiguous {
        // SAFETY: both buffers hold at least `n` data bytes from their lower
        // bounds, readable and writable as the caller guarantees, and apart.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.wrapping_offset(src_type.lb as isize),
                dst.wrapping_offset(dst_type.lb as isize),
                n as usize,
            )
        };
        return n;
    }
    let mut bounce = vec![0u8; (n as usize).min(COPY_CHUNK)];
    let mut done = 0u64;
    while done < n {
        let want = ((n - done) as usize).min(bounce.len());
        // SAFETY: the caller guarantees the source elements are readable.
        let got = unsafe { src_type.pack_at(src_count, src, done, &mut bounce[..want]) };
        // SAFETY: the caller guarantees the destination elements are
        // writable; the bounce buffer is ours.
        unsafe { dst_type.unpack_at(dst_count, dst, done, &bounce[..got]) };
        done += got as u64;
        if got == 0 {
            break;
        }
    }
    done
}

/// Compares the signature of `a_count` elements of `a` with that of
/// `b_count` elements of `b`. `MPI_PACKED` on either side matches any
/// kinds byte for byte.
pub fn compare_signatures(a: &Datatype, a_count: u64, b: &Datatype, b_count: u64) -> SignatureMatch {
    let packed = |t: &Datatype| t.runs.iter().all(|r| r.basic == Basic::Packed) && !t.runs.is_empty();
    let ordered = |x: u128, y: u128| match x.cmp(&y) {
        std::cmp::Ordering::Equal => SignatureMatch::Equal,
        std::cmp::Ordering::Less => SignatureMatch::Prefix,
        std::cmp::Ordering::Greater => SignatureMatch::Longer,
    };
    if packed(a) || packed(b) {
        return ordered(a.size as u128 * a_count as u128, b.size as u128 * b_count as u128);
    }
    let mut sa = a.signature(a_count);
    let mut sb = b.signature(b_count);
    let (mut ca, mut cb) = (sa.next(), sb.next());
    loop {
        match (ca, cb) {
            (None, None) => return SignatureMatch::Equal,
            (None, Some(_)) => return SignatureMatch::Prefix,
            (Some(_), None) => return SignatureMatch::Longer,
            (Some((ka, na)), Some((kb, nb))) => {
                if ka != kb {
                    return SignatureMatch::Differ;
                }
                let m = na.min(nb);
                ca = if na > m { Some((ka, na - m)) } else { sa.next() };
                cb = if nb > m { Some((kb, nb - m)) } else { sb.next() };
            }
        }
    }
}

#[cfg(test)]
mod tests;
