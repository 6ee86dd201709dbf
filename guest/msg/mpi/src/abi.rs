//! The MPI 5.0 standard ABI as Rust sees it: the C types, the layout of
//! `MPI_Status`, the value of every predefined handle and constant, the
//! callback types, and the [`weak_alias!`](crate::weak_alias) macro that
//! gives each `PMPI_` entry point its weak `MPI_` name. `include/mpi.h`
//! states the same values for C; a unit test below compiles that header
//! and compares every value with the tables here, and the `tests` crate's
//! `mpi_abi_header` test compares the header with the standard ABI header
//! of MPICH's wheel. Plain data: no state, any thread.
//!
//! # Handles
//! Every handle type is one machine word in C (a pointer to an incomplete
//! struct, `struct MPI_ABI_Comm *` and so on), [`usize`] here. The
//! standard reserves the words below 1024 (`0x400`) for the predefined
//! handles and spends them like this:
//!
//! | words           | kind                                              |
//! |-----------------|---------------------------------------------------|
//! | `0x000`         | never a handle (null pointer)                     |
//! | `0x020..=0x03f` | operations (`MPI_OP_NULL` = `0x20`)               |
//! | `0x100..=0x107` | communicators                                     |
//! | `0x108..=0x10f` | groups                                            |
//! | `0x110..=0x117` | windows                                           |
//! | `0x118..=0x11f` | files                                             |
//! | `0x120..=0x127` | sessions                                          |
//! | `0x128..=0x12f` | messages                                          |
//! | `0x130..=0x13f` | info objects                                      |
//! | `0x140..=0x17f` | error handlers                                    |
//! | `0x180..=0x1ff` | requests                                          |
//! | `0x200..=0x3ff` | datatypes                                         |
//!
//! Each kind's null handle is the first word of its block, so a null
//! handle still says which kind it is. Operations are grouped by what
//! they accept: arithmetic `0x21..`, bitwise `0x28..`, logical `0x30..`,
//! location `0x38..`, and the one-sided-only `0x3c..`.
//!
//! Datatype words carry more: bit 6 (`0x40`) is set when the type's size
//! is the same on every platform, and then bits 3 to 5 hold log2 of that
//! size in bytes (`MPI_INT32_T` = `0x250`: size 1 << 2). Bit 7 (`0x80`)
//! on top of it marks Fortran's sized types (`MPI_INTEGER4`, `MPI_REAL8`).
//! Without bit 6 the size is the C compiler's (`MPI_INT`, `MPI_LONG`,
//! `MPI_LONG_DOUBLE`), in blocks: `0x201..` the address, count and offset
//! types and `MPI_PACKED`, `0x208..` C integers, `0x210..` C floating
//! point and complex, `0x218..` Fortran's default kinds, `0x220..` long
//! double, `0x228..` the value-index pairs for `MPI_MINLOC` and
//! `MPI_MAXLOC`, `0x238..` booleans and `MPI_WCHAR`.
//!
//! Handles this library makes at run time are therefore words of 1024 and
//! up. Special buffer and array addresses (`MPI_IN_PLACE`,
//! `MPI_STATUS_IGNORE`, ...) are small integers cast to pointers; they are
//! kept here as their address value ([`usize`]), to compare with
//! `ptr as usize`.
//!
//! # Entry points
//! The library's C functions are `PMPI_X` (strong, the profiling names)
//! and `MPI_X` (a weak alias a profiler may override), made by
//! `#[no_mangle] pub unsafe extern "C" fn PMPI_X` plus
//! `weak_alias!(MPI_X, PMPI_X)`. `scripts/build-mpi.sh` links the staticlib
//! into `libmpi_abi.so.1`, exporting only those two families. This module
//! defines one entry point itself, the ABI's version query
//! [`PMPI_Get_version`].

#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case)]

use std::ffi::{c_int, c_void};

/// `MPI_Aint`: an address or displacement (`intptr_t`).
pub type MPI_Aint = isize;
/// `MPI_Offset`: a file offset (`int64_t`).
pub type MPI_Offset = i64;
/// `MPI_Count`: a count that may exceed `int` (as wide as `MPI_Offset`).
pub type MPI_Count = i64;
/// `MPI_Fint`: Fortran's default `INTEGER` as this library assumes it (the
/// standard ABI leaves it out of `mpi.h`; the size is a run-time query,
/// `MPI_Abi_get_fortran_info`).
pub type MPI_Fint = i32;

/// A communicator handle.
pub type MPI_Comm = usize;
/// A datatype handle.
pub type MPI_Datatype = usize;
/// A reduction operation handle.
pub type MPI_Op = usize;
/// A group handle.
pub type MPI_Group = usize;
/// A request handle.
pub type MPI_Request = usize;
/// An error handler handle.
pub type MPI_Errhandler = usize;
/// An info object handle.
pub type MPI_Info = usize;
/// A one-sided window handle.
pub type MPI_Win = usize;
/// A file handle.
pub type MPI_File = usize;
/// A matched-message handle (`MPI_Mprobe`).
pub type MPI_Message = usize;
/// A session handle.
pub type MPI_Session = usize;

/// `MPI_Status`: three public fields and five words for the library, 32
/// bytes in all.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MPI_Status {
    /// Rank of the sender.
    pub MPI_SOURCE: c_int,
    /// Tag of the message.
    pub MPI_TAG: c_int,
    /// Error of this request (set by the multiple-completion calls).
    pub MPI_ERROR: c_int,
    /// The library's own fields (the runtime keeps the received byte
    /// count and the cancelled flag here).
    pub MPI_internal: [c_int; 5],
}

/// `MPI_User_function`: a user reduction operation.
pub type MPI_User_function =
    unsafe extern "C" fn(invec: *mut c_void, inoutvec: *mut c_void, len: *mut c_int, datatype: *mut MPI_Datatype);
/// `MPI_User_function_c`: a user reduction operation, large counts.
pub type MPI_User_function_c =
    unsafe extern "C" fn(invec: *mut c_void, inoutvec: *mut c_void, len: *mut MPI_Count, datatype: *mut MPI_Datatype);
/// `MPI_Copy_function` (deprecated): copies a communicator attribute.
pub type MPI_Copy_function = MPI_Comm_copy_attr_function;
/// `MPI_Delete_function` (deprecated): deletes a communicator attribute.
pub type MPI_Delete_function = MPI_Comm_delete_attr_function;
/// `MPI_Comm_copy_attr_function`: copies a communicator attribute on dup.
pub type MPI_Comm_copy_attr_function = unsafe extern "C" fn(
    comm: MPI_Comm,
    keyval: c_int,
    extra_state: *mut c_void,
    attribute_val_in: *mut c_void,
    attribute_val_out: *mut c_void,
    flag: *mut c_int,
) -> c_int;
/// `MPI_Comm_delete_attr_function`: deletes a communicator attribute.
pub type MPI_Comm_delete_attr_function =
    unsafe extern "C" fn(comm: MPI_Comm, keyval: c_int, attribute_val: *mut c_void, extra_state: *mut c_void) -> c_int;
/// `MPI_Type_copy_attr_function`: copies a datatype attribute on dup.
pub type MPI_Type_copy_attr_function = unsafe extern "C" fn(
    datatype: MPI_Datatype,
    keyval: c_int,
    extra_state: *mut c_void,
    attribute_val_in: *mut c_void,
    attribute_val_out: *mut c_void,
    flag: *mut c_int,
) -> c_int;
/// `MPI_Type_delete_attr_function`: deletes a datatype attribute.
pub type MPI_Type_delete_attr_function = unsafe extern "C" fn(
    datatype: MPI_Datatype,
    keyval: c_int,
    attribute_val: *mut c_void,
    extra_state: *mut c_void,
) -> c_int;
/// `MPI_Win_copy_attr_function`: copies a window attribute.
pub type MPI_Win_copy_attr_function = unsafe extern "C" fn(
    win: MPI_Win,
    keyval: c_int,
    extra_state: *mut c_void,
    attribute_val_in: *mut c_void,
    attribute_val_out: *mut c_void,
    flag: *mut c_int,
) -> c_int;
/// `MPI_Win_delete_attr_function`: deletes a window attribute.
pub type MPI_Win_delete_attr_function =
    unsafe extern "C" fn(win: MPI_Win, keyval: c_int, attribute_val: *mut c_void, extra_state: *mut c_void) -> c_int;
/// `MPI_Comm_errhandler_function`: a communicator error handler (C
/// variadic: implementations pass nothing after the error code).
pub type MPI_Comm_errhandler_function = unsafe extern "C" fn(comm: *mut MPI_Comm, error_code: *mut c_int, ...);
/// `MPI_File_errhandler_function`: a file error handler.
pub type MPI_File_errhandler_function = unsafe extern "C" fn(file: *mut MPI_File, error_code: *mut c_int, ...);
/// `MPI_Win_errhandler_function`: a window error handler.
pub type MPI_Win_errhandler_function = unsafe extern "C" fn(win: *mut MPI_Win, error_code: *mut c_int, ...);
/// `MPI_Session_errhandler_function`: a session error handler.
pub type MPI_Session_errhandler_function = unsafe extern "C" fn(session: *mut MPI_Session, error_code: *mut c_int, ...);
/// `MPI_Grequest_query_function`: fills the status of a generalized request.
pub type MPI_Grequest_query_function = unsafe extern "C" fn(extra_state: *mut c_void, status: *mut MPI_Status) -> c_int;
/// `MPI_Grequest_free_function`: frees a generalized request's state.
pub type MPI_Grequest_free_function = unsafe extern "C" fn(extra_state: *mut c_void) -> c_int;
/// `MPI_Grequest_cancel_function`: cancels a generalized request.
pub type MPI_Grequest_cancel_function = unsafe extern "C" fn(extra_state: *mut c_void, complete: c_int) -> c_int;

/// Declares `pub const`s of one type and a table of `(name, value)` for
/// them, each with a generated doc line.
macro_rules! table {
    ($(#[$tm:meta])* $table:ident: $ty:ty, $what:literal { $($name:ident = $val:expr,)* }) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: ", $what, ".")]
            pub const $name: $ty = $val;
        )*
        $(#[$tm])*
        pub const $table: &[(&str, $ty)] = &[$((stringify!($name), $name),)*];
    };
}

table! {
    /// The version constants.
    VERSIONS: c_int, "version of the standard and of its ABI" {
        MPI_VERSION = 5,
        MPI_SUBVERSION = 0,
        MPI_ABI_VERSION = 1,
        MPI_ABI_SUBVERSION = 0,
    }
}

table! {
    /// Predefined reduction operations.
    OPS: MPI_Op, "predefined operation" {
        MPI_OP_NULL = 0x20,
        MPI_SUM = 0x21,
        MPI_MIN = 0x22,
        MPI_MAX = 0x23,
        MPI_PROD = 0x24,
        MPI_BAND = 0x28,
        MPI_BOR = 0x29,
        MPI_BXOR = 0x2a,
        MPI_LAND = 0x30,
        MPI_LOR = 0x31,
        MPI_LXOR = 0x32,
        MPI_MINLOC = 0x38,
        MPI_MAXLOC = 0x39,
        MPI_REPLACE = 0x3c,
        MPI_NO_OP = 0x3d,
    }
}

table! {
    /// Predefined communicators.
    COMMS: MPI_Comm, "predefined communicator" {
        MPI_COMM_NULL = 0x100,
        MPI_COMM_WORLD = 0x101,
        MPI_COMM_SELF = 0x102,
    }
}

table! {
    /// Predefined groups.
    GROUPS: MPI_Group, "predefined group" {
        MPI_GROUP_NULL = 0x108,
        MPI_GROUP_EMPTY = 0x109,
    }
}

table! {
    /// The other null and predefined handles, one kind each.
    OTHER_HANDLES: usize, "predefined handle" {
        MPI_WIN_NULL = 0x110,
        MPI_FILE_NULL = 0x118,
        MPI_SESSION_NULL = 0x120,
        MPI_MESSAGE_NULL = 0x128,
        MPI_MESSAGE_NO_PROC = 0x129,
        MPI_INFO_NULL = 0x130,
        MPI_INFO_ENV = 0x131,
        MPI_ERRHANDLER_NULL = 0x140,
        MPI_ERRORS_ARE_FATAL = 0x141,
        MPI_ERRORS_ABORT = 0x142,
        MPI_ERRORS_RETURN = 0x143,
        MPI_REQUEST_NULL = 0x180,
    }
}

table! {
    /// Predefined datatypes (each handle once; see [`DATATYPE_ALIASES`]).
    DATATYPES: MPI_Datatype, "predefined datatype" {
        MPI_DATATYPE_NULL = 0x200,
        MPI_AINT = 0x201,
        MPI_COUNT = 0x202,
        MPI_OFFSET = 0x203,
        MPI_PACKED = 0x207,
        MPI_SHORT = 0x208,
        MPI_INT = 0x209,
        MPI_LONG = 0x20a,
        MPI_LONG_LONG = 0x20b,
        MPI_UNSIGNED_SHORT = 0x20c,
        MPI_UNSIGNED = 0x20d,
        MPI_UNSIGNED_LONG = 0x20e,
        MPI_UNSIGNED_LONG_LONG = 0x20f,
        MPI_FLOAT = 0x210,
        MPI_C_FLOAT_COMPLEX = 0x212,
        MPI_CXX_FLOAT_COMPLEX = 0x213,
        MPI_DOUBLE = 0x214,
        MPI_C_DOUBLE_COMPLEX = 0x216,
        MPI_CXX_DOUBLE_COMPLEX = 0x217,
        MPI_LOGICAL = 0x218,
        MPI_INTEGER = 0x219,
        MPI_REAL = 0x21a,
        MPI_COMPLEX = 0x21b,
        MPI_DOUBLE_PRECISION = 0x21c,
        MPI_DOUBLE_COMPLEX = 0x21d,
        MPI_CHARACTER = 0x21e,
        MPI_LONG_DOUBLE = 0x220,
        MPI_C_LONG_DOUBLE_COMPLEX = 0x224,
        MPI_CXX_LONG_DOUBLE_COMPLEX = 0x225,
        MPI_FLOAT_INT = 0x228,
        MPI_DOUBLE_INT = 0x229,
        MPI_LONG_INT = 0x22a,
        MPI_2INT = 0x22b,
        MPI_SHORT_INT = 0x22c,
        MPI_LONG_DOUBLE_INT = 0x22d,
        MPI_2REAL = 0x230,
        MPI_2DOUBLE_PRECISION = 0x231,
        MPI_2INTEGER = 0x232,
        MPI_C_BOOL = 0x238,
        MPI_CXX_BOOL = 0x239,
        MPI_WCHAR = 0x23c,
        MPI_INT8_T = 0x240,
        MPI_UINT8_T = 0x241,
        MPI_CHAR = 0x243,
        MPI_SIGNED_CHAR = 0x244,
        MPI_UNSIGNED_CHAR = 0x245,
        MPI_BYTE = 0x247,
        MPI_INT16_T = 0x248,
        MPI_UINT16_T = 0x249,
        MPI_INT32_T = 0x250,
        MPI_UINT32_T = 0x251,
        MPI_INT64_T = 0x258,
        MPI_UINT64_T = 0x259,
        MPI_LOGICAL1 = 0x2c0,
        MPI_INTEGER1 = 0x2c1,
        MPI_LOGICAL2 = 0x2c8,
        MPI_INTEGER2 = 0x2c9,
        MPI_REAL2 = 0x2ca,
        MPI_LOGICAL4 = 0x2d0,
        MPI_INTEGER4 = 0x2d1,
        MPI_REAL4 = 0x2d2,
        MPI_COMPLEX4 = 0x2d3,
        MPI_LOGICAL8 = 0x2d8,
        MPI_INTEGER8 = 0x2d9,
        MPI_REAL8 = 0x2da,
        MPI_COMPLEX8 = 0x2db,
        MPI_LOGICAL16 = 0x2e0,
        MPI_INTEGER16 = 0x2e1,
        MPI_REAL16 = 0x2e2,
        MPI_COMPLEX16 = 0x2e3,
        MPI_COMPLEX32 = 0x2eb,
    }
}

table! {
    /// Second names of predefined datatypes.
    DATATYPE_ALIASES: MPI_Datatype, "another name of a predefined datatype" {
        MPI_LONG_LONG_INT = MPI_LONG_LONG,
        MPI_C_COMPLEX = MPI_C_FLOAT_COMPLEX,
    }
}

table! {
    /// Error classes, `MPI_SUCCESS` first, and the tool interface's codes.
    ERROR_CLASSES: c_int, "error class" {
        MPI_SUCCESS = 0,
        MPI_ERR_BUFFER = 1,
        MPI_ERR_COUNT = 2,
        MPI_ERR_TYPE = 3,
        MPI_ERR_TAG = 4,
        MPI_ERR_COMM = 5,
        MPI_ERR_RANK = 6,
        MPI_ERR_REQUEST = 7,
        MPI_ERR_ROOT = 8,
        MPI_ERR_GROUP = 9,
        MPI_ERR_OP = 10,
        MPI_ERR_TOPOLOGY = 11,
        MPI_ERR_DIMS = 12,
        MPI_ERR_ARG = 13,
        MPI_ERR_UNKNOWN = 14,
        MPI_ERR_TRUNCATE = 15,
        MPI_ERR_OTHER = 16,
        MPI_ERR_INTERN = 17,
        MPI_ERR_PENDING = 18,
        MPI_ERR_IN_STATUS = 19,
        MPI_ERR_ACCESS = 20,
        MPI_ERR_AMODE = 21,
        MPI_ERR_ASSERT = 22,
        MPI_ERR_BAD_FILE = 23,
        MPI_ERR_BASE = 24,
        MPI_ERR_CONVERSION = 25,
        MPI_ERR_DISP = 26,
        MPI_ERR_DUP_DATAREP = 27,
        MPI_ERR_FILE_EXISTS = 28,
        MPI_ERR_FILE_IN_USE = 29,
        MPI_ERR_FILE = 30,
        MPI_ERR_INFO_KEY = 31,
        MPI_ERR_INFO_NOKEY = 32,
        MPI_ERR_INFO_VALUE = 33,
        MPI_ERR_INFO = 34,
        MPI_ERR_IO = 35,
        MPI_ERR_KEYVAL = 36,
        MPI_ERR_LOCKTYPE = 37,
        MPI_ERR_NAME = 38,
        MPI_ERR_NO_MEM = 39,
        MPI_ERR_NOT_SAME = 40,
        MPI_ERR_NO_SPACE = 41,
        MPI_ERR_NO_SUCH_FILE = 42,
        MPI_ERR_PORT = 43,
        MPI_ERR_QUOTA = 44,
        MPI_ERR_READ_ONLY = 45,
        MPI_ERR_RMA_ATTACH = 46,
        MPI_ERR_RMA_CONFLICT = 47,
        MPI_ERR_RMA_RANGE = 48,
        MPI_ERR_RMA_SHARED = 49,
        MPI_ERR_RMA_SYNC = 50,
        MPI_ERR_SERVICE = 51,
        MPI_ERR_SIZE = 52,
        MPI_ERR_SPAWN = 53,
        MPI_ERR_UNSUPPORTED_DATAREP = 54,
        MPI_ERR_UNSUPPORTED_OPERATION = 55,
        MPI_ERR_WIN = 56,
        MPI_ERR_RMA_FLAVOR = 57,
        MPI_ERR_PROC_ABORTED = 58,
        MPI_ERR_VALUE_TOO_LARGE = 59,
        MPI_ERR_SESSION = 60,
        MPI_ERR_ERRHANDLER = 61,
        MPI_ERR_ABI = 62,
        MPI_T_ERR_CANNOT_INIT = 1001,
        MPI_T_ERR_NOT_ACCESSIBLE = 1002,
        MPI_T_ERR_NOT_INITIALIZED = 1003,
        MPI_T_ERR_NOT_SUPPORTED = 1004,
        MPI_T_ERR_MEMORY = 1005,
        MPI_T_ERR_INVALID = 1006,
        MPI_T_ERR_INVALID_INDEX = 1007,
        MPI_T_ERR_INVALID_ITEM = 1008,
        MPI_T_ERR_INVALID_SESSION = 1009,
        MPI_T_ERR_INVALID_HANDLE = 1010,
        MPI_T_ERR_INVALID_NAME = 1011,
        MPI_T_ERR_OUT_OF_HANDLES = 1012,
        MPI_T_ERR_OUT_OF_SESSIONS = 1013,
        MPI_T_ERR_CVAR_SET_NOT_NOW = 1014,
        MPI_T_ERR_CVAR_SET_NEVER = 1015,
        MPI_T_ERR_PVAR_NO_WRITE = 1016,
        MPI_T_ERR_PVAR_NO_STARTSTOP = 1017,
        MPI_T_ERR_PVAR_NO_ATOMIC = 1018,
        MPI_ERR_LASTCODE = 0x3fff,
    }
}

table! {
    /// Integer constants: ranks and wildcards, sizes of strings, modes,
    /// thread levels, comparisons, topologies, combiners, attribute keys.
    INTEGERS: c_int, "integer constant" {
        MPI_ANY_SOURCE = -1,
        MPI_ANY_TAG = -2,
        MPI_PROC_NULL = -3,
        MPI_ROOT = -4,
        MPI_UNDEFINED = -32766,
        MPI_F_STATUS_SIZE = 8,
        MPI_F_SOURCE = 0,
        MPI_F_TAG = 1,
        MPI_F_ERROR = 2,
        MPI_MAX_DATAREP_STRING = 128,
        MPI_MAX_ERROR_STRING = 512,
        MPI_MAX_INFO_KEY = 256,
        MPI_MAX_INFO_VAL = 1024,
        MPI_MAX_LIBRARY_VERSION_STRING = 8192,
        MPI_MAX_OBJECT_NAME = 128,
        MPI_MAX_PORT_NAME = 1024,
        MPI_MAX_PROCESSOR_NAME = 256,
        MPI_MAX_STRINGTAG_LEN = 1024,
        MPI_MAX_PSET_NAME_LEN = 1024,
        MPI_BSEND_OVERHEAD = 512,
        MPI_MODE_APPEND = 1,
        MPI_MODE_CREATE = 2,
        MPI_MODE_DELETE_ON_CLOSE = 4,
        MPI_MODE_EXCL = 8,
        MPI_MODE_RDONLY = 16,
        MPI_MODE_RDWR = 32,
        MPI_MODE_SEQUENTIAL = 64,
        MPI_MODE_UNIQUE_OPEN = 128,
        MPI_MODE_WRONLY = 256,
        MPI_MODE_NOCHECK = 1024,
        MPI_MODE_NOPRECEDE = 2048,
        MPI_MODE_NOPUT = 4096,
        MPI_MODE_NOSTORE = 8192,
        MPI_MODE_NOSUCCEED = 16384,
        MPI_THREAD_SINGLE = 0,
        MPI_THREAD_FUNNELED = 1024,
        MPI_THREAD_SERIALIZED = 2048,
        MPI_THREAD_MULTIPLE = 4096,
        MPI_ORDER_C = 12,
        MPI_ORDER_FORTRAN = 15,
        MPI_DISTRIBUTE_NONE = 16,
        MPI_DISTRIBUTE_BLOCK = 17,
        MPI_DISTRIBUTE_CYCLIC = 18,
        MPI_DISTRIBUTE_DFLT_DARG = 19,
        MPI_COMBINER_NAMED = 101,
        MPI_COMBINER_DUP = 102,
        MPI_COMBINER_CONTIGUOUS = 103,
        MPI_COMBINER_VECTOR = 104,
        MPI_COMBINER_HVECTOR = 105,
        MPI_COMBINER_INDEXED = 106,
        MPI_COMBINER_HINDEXED = 107,
        MPI_COMBINER_INDEXED_BLOCK = 108,
        MPI_COMBINER_HINDEXED_BLOCK = 109,
        MPI_COMBINER_STRUCT = 110,
        MPI_COMBINER_SUBARRAY = 111,
        MPI_COMBINER_DARRAY = 112,
        MPI_COMBINER_F90_REAL = 113,
        MPI_COMBINER_F90_COMPLEX = 114,
        MPI_COMBINER_F90_INTEGER = 115,
        MPI_COMBINER_RESIZED = 116,
        MPI_COMBINER_VALUE_INDEX = 117,
        MPI_TYPECLASS_INTEGER = 192,
        MPI_TYPECLASS_REAL = 193,
        MPI_TYPECLASS_COMPLEX = 194,
        MPI_IDENT = 201,
        MPI_CONGRUENT = 202,
        MPI_SIMILAR = 203,
        MPI_UNEQUAL = 204,
        MPI_CART = 211,
        MPI_GRAPH = 212,
        MPI_DIST_GRAPH = 213,
        MPI_COMM_TYPE_SHARED = 221,
        MPI_COMM_TYPE_HW_UNGUIDED = 222,
        MPI_COMM_TYPE_HW_GUIDED = 223,
        MPI_COMM_TYPE_RESOURCE_GUIDED = 224,
        MPI_LOCK_EXCLUSIVE = 301,
        MPI_LOCK_SHARED = 302,
        MPI_WIN_FLAVOR_CREATE = 311,
        MPI_WIN_FLAVOR_ALLOCATE = 312,
        MPI_WIN_FLAVOR_DYNAMIC = 313,
        MPI_WIN_FLAVOR_SHARED = 314,
        MPI_WIN_UNIFIED = 321,
        MPI_WIN_SEPARATE = 322,
        MPI_SEEK_CUR = 401,
        MPI_SEEK_END = 402,
        MPI_SEEK_SET = 403,
        MPI_KEYVAL_INVALID = 0,
        MPI_TAG_UB = 501,
        MPI_IO = 502,
        MPI_HOST = 503,
        MPI_WTIME_IS_GLOBAL = 504,
        MPI_APPNUM = 505,
        MPI_LASTUSEDCODE = 506,
        MPI_UNIVERSE_SIZE = 507,
        MPI_WIN_BASE = 601,
        MPI_WIN_DISP_UNIT = 602,
        MPI_WIN_SIZE = 603,
        MPI_WIN_CREATE_FLAVOR = 604,
        MPI_WIN_MODEL = 605,
    }
}

table! {
    /// The tool interface's (`MPI_T_`) integer constants.
    TOOL_INTEGERS: c_int, "tool interface constant" {
        MPI_T_CB_REQUIRE_NONE = 0x00,
        MPI_T_CB_REQUIRE_MPI_RESTRICTED = 0x03,
        MPI_T_CB_REQUIRE_THREAD_SAFE = 0x0f,
        MPI_T_CB_REQUIRE_ASYNC_SIGNAL_SAFE = 0x3f,
        MPI_T_SOURCE_ORDERED = 1,
        MPI_T_SOURCE_UNORDERED = 2,
        MPI_T_VERBOSITY_USER_BASIC = 0x09,
        MPI_T_VERBOSITY_USER_DETAIL = 0x0a,
        MPI_T_VERBOSITY_USER_ALL = 0x0c,
        MPI_T_VERBOSITY_TUNER_BASIC = 0x11,
        MPI_T_VERBOSITY_TUNER_DETAIL = 0x12,
        MPI_T_VERBOSITY_TUNER_ALL = 0x14,
        MPI_T_VERBOSITY_MPIDEV_BASIC = 0x21,
        MPI_T_VERBOSITY_MPIDEV_DETAIL = 0x22,
        MPI_T_VERBOSITY_MPIDEV_ALL = 0x24,
        MPI_T_BIND_NO_OBJECT = 1,
        MPI_T_BIND_MPI_COMM = 2,
        MPI_T_BIND_MPI_DATATYPE = 3,
        MPI_T_BIND_MPI_ERRHANDLER = 4,
        MPI_T_BIND_MPI_FILE = 5,
        MPI_T_BIND_MPI_GROUP = 6,
        MPI_T_BIND_MPI_OP = 7,
        MPI_T_BIND_MPI_REQUEST = 8,
        MPI_T_BIND_MPI_WIN = 9,
        MPI_T_BIND_MPI_MESSAGE = 10,
        MPI_T_BIND_MPI_INFO = 11,
        MPI_T_BIND_MPI_SESSION = 12,
        MPI_T_SCOPE_CONSTANT = 1,
        MPI_T_SCOPE_READONLY = 2,
        MPI_T_SCOPE_LOCAL = 3,
        MPI_T_SCOPE_GROUP = 4,
        MPI_T_SCOPE_GROUP_EQ = 5,
        MPI_T_SCOPE_ALL = 6,
        MPI_T_SCOPE_ALL_EQ = 7,
        MPI_T_PVAR_CLASS_STATE = 1,
        MPI_T_PVAR_CLASS_LEVEL = 2,
        MPI_T_PVAR_CLASS_SIZE = 3,
        MPI_T_PVAR_CLASS_PERCENTAGE = 4,
        MPI_T_PVAR_CLASS_HIGHWATERMARK = 5,
        MPI_T_PVAR_CLASS_LOWWATERMARK = 6,
        MPI_T_PVAR_CLASS_COUNTER = 7,
        MPI_T_PVAR_CLASS_AGGREGATE = 8,
        MPI_T_PVAR_CLASS_TIMER = 9,
        MPI_T_PVAR_CLASS_GENERIC = 10,
    }
}

table! {
    /// Special addresses (buffers, arrays, callbacks, tool handles), as
    /// the address value of the pointer C passes.
    ADDRESSES: usize, "special address, compare with `ptr as usize`" {
        MPI_BOTTOM = 0,
        MPI_IN_PLACE = 1,
        MPI_BUFFER_AUTOMATIC = 2,
        MPI_ARGV_NULL = 0,
        MPI_ARGVS_NULL = 0,
        MPI_ERRCODES_IGNORE = 0,
        MPI_STATUS_IGNORE = 0,
        MPI_STATUSES_IGNORE = 0,
        MPI_UNWEIGHTED = 10,
        MPI_WEIGHTS_EMPTY = 11,
        MPI_NULL_COPY_FN = 0,
        MPI_DUP_FN = 1,
        MPI_NULL_DELETE_FN = 0,
        MPI_COMM_NULL_COPY_FN = 0,
        MPI_COMM_DUP_FN = 1,
        MPI_COMM_NULL_DELETE_FN = 0,
        MPI_TYPE_NULL_COPY_FN = 0,
        MPI_TYPE_DUP_FN = 1,
        MPI_TYPE_NULL_DELETE_FN = 0,
        MPI_WIN_NULL_COPY_FN = 0,
        MPI_WIN_DUP_FN = 1,
        MPI_WIN_NULL_DELETE_FN = 0,
        MPI_CONVERSION_FN_NULL = 0,
        MPI_CONVERSION_FN_NULL_C = 0,
        MPI_T_ENUM_NULL = 0,
        MPI_T_CVAR_HANDLE_NULL = 0,
        MPI_T_PVAR_SESSION_NULL = 0,
        MPI_T_PVAR_HANDLE_NULL = 0,
        MPI_T_PVAR_ALL_HANDLES = 1,
    }
}

/// `MPI_DISPLACEMENT_CURRENT`: the file view displacement that means "the
/// current position" (shared file pointer).
pub const MPI_DISPLACEMENT_CURRENT: MPI_Offset = -1;

/// Every constant of the ABI with its value widened to `i64`, for
/// comparisons with `mpi.h` (special addresses as their integer value).
pub fn all_constants() -> Vec<(&'static str, i64)> {
    let mut v: Vec<(&'static str, i64)> = Vec::new();
    for t in [VERSIONS, ERROR_CLASSES, INTEGERS, TOOL_INTEGERS] {
        v.extend(t.iter().map(|&(n, x)| (n, x as i64)));
    }
    for t in [OPS, COMMS, GROUPS, OTHER_HANDLES, DATATYPES, DATATYPE_ALIASES, ADDRESSES] {
        v.extend(t.iter().map(|&(n, x)| (n, x as i64)));
    }
    v.push(("MPI_DISPLACEMENT_CURRENT", MPI_DISPLACEMENT_CURRENT));
    v
}

/// Words below this are the predefined handles; the runtime's handles
/// start here.
pub const FIRST_RUNTIME_HANDLE: usize = 0x400;

/// Which kind of object a predefined handle word belongs to (see the
/// module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleKind {
    /// `MPI_Op`.
    Op,
    /// `MPI_Comm`.
    Comm,
    /// `MPI_Group`.
    Group,
    /// `MPI_Win`.
    Win,
    /// `MPI_File`.
    File,
    /// `MPI_Session`.
    Session,
    /// `MPI_Message`.
    Message,
    /// `MPI_Info`.
    Info,
    /// `MPI_Errhandler`.
    Errhandler,
    /// `MPI_Request`.
    Request,
    /// `MPI_Datatype`.
    Datatype,
}

/// The kind of block a word below [`FIRST_RUNTIME_HANDLE`] falls in, or
/// `None` for a runtime handle or a reserved word. Says nothing about
/// whether that exact word is defined: see [`predefined_name`].
pub fn predefined_kind(h: usize) -> Option<HandleKind> {
    Some(match h {
        0x020..=0x03f => HandleKind::Op,
        0x100..=0x107 => HandleKind::Comm,
        0x108..=0x10f => HandleKind::Group,
        0x110..=0x117 => HandleKind::Win,
        0x118..=0x11f => HandleKind::File,
        0x120..=0x127 => HandleKind::Session,
        0x128..=0x12f => HandleKind::Message,
        0x130..=0x13f => HandleKind::Info,
        0x140..=0x17f => HandleKind::Errhandler,
        0x180..=0x1ff => HandleKind::Request,
        0x200..=0x3ff => HandleKind::Datatype,
        _ => return None,
    })
}

/// The C name of a predefined handle (null handles included), or `None`
/// when `h` is not one. Aliases answer with their first name
/// (`MPI_LONG_LONG`, not `MPI_LONG_LONG_INT`).
pub fn predefined_name(h: usize) -> Option<&'static str> {
    [OPS, COMMS, GROUPS, OTHER_HANDLES, DATATYPES].iter().find_map(|t| t.iter().find(|e| e.1 == h).map(|e| e.0))
}

/// True for the predefined datatypes, `MPI_DATATYPE_NULL` excluded.
pub fn is_predefined_datatype(h: MPI_Datatype) -> bool {
    h != MPI_DATATYPE_NULL && DATATYPES.iter().any(|e| e.1 == h)
}

/// True for the predefined operations, `MPI_OP_NULL` excluded.
pub fn is_predefined_op(h: MPI_Op) -> bool {
    h != MPI_OP_NULL && OPS.iter().any(|e| e.1 == h)
}

/// The size in bytes a predefined datatype's handle encodes (bit 6 set:
/// 1 << bits 3..=5), or `None` when its size is the C compiler's or `h`
/// is not a predefined datatype.
pub fn encoded_size(h: MPI_Datatype) -> Option<usize> {
    (is_predefined_datatype(h) && h & 0x40 != 0).then(|| 1 << ((h >> 3) & 7))
}

/// Gives the Rust function `$pmpi` (a `#[no_mangle] extern "C"` function)
/// the second, weak name `$mpi`, as the standard's profiling interface
/// wants: a tool that defines `MPI_X` itself overrides ours and still calls
/// `PMPI_X`. `nm -D libmpi_abi.so.1` shows `W MPI_X` and `T PMPI_X`.
///
/// From any module of the crate (the macro lives at the crate root):
///
/// ```ignore
/// #[no_mangle]
/// pub unsafe extern "C" fn PMPI_Barrier(comm: MPI_Comm) -> c_int { ... }
/// crate::weak_alias!(MPI_Barrier, PMPI_Barrier);
/// ```
///
/// Each `PMPI_` name must be defined once in the crate: this module
/// already defines `PMPI_Get_version`.
#[macro_export]
macro_rules! weak_alias {
    ($mpi:ident, $pmpi:ident) => {
        ::core::arch::global_asm!(
            concat!(".weak ", stringify!($mpi)),
            concat!(".type ", stringify!($mpi), ", @function"),
            concat!(".set ", stringify!($mpi), ", ", stringify!($pmpi)),
        );
    };
}

/// `MPI_Get_version`: the version of the standard this library follows
/// (5.0). Callable at any time, before `MPI_Init` and after
/// `MPI_Finalize`, from any thread.
///
/// # Safety
/// `version` and `subversion` are null or point to writable `int`s.
#[no_mangle]
pub unsafe extern "C" fn PMPI_Get_version(version: *mut c_int, subversion: *mut c_int) -> c_int {
    if version.is_null() || subversion.is_null() {
        return MPI_ERR_ARG;
    }
    // SAFETY: both are non-null and the caller passes writable ints.
    unsafe {
        *version = MPI_VERSION;
        *subversion = MPI_SUBVERSION;
    }
    MPI_SUCCESS
}
weak_alias!(MPI_Get_version, PMPI_Get_version);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::PathBuf;
    use std::process::Command;

    #[test]
    fn encoding_facts_hold_for_every_predefined_handle() {
        for (name, h) in OPS {
            assert_eq!(predefined_kind(*h), Some(HandleKind::Op), "{name}");
        }
        for (name, h) in COMMS {
            assert_eq!(predefined_kind(*h), Some(HandleKind::Comm), "{name}");
        }
        for (name, h) in GROUPS {
            assert_eq!(predefined_kind(*h), Some(HandleKind::Group), "{name}");
        }
        for (name, h) in DATATYPES {
            assert_eq!(predefined_kind(*h), Some(HandleKind::Datatype), "{name}");
            assert_eq!(predefined_name(*h), Some(*name));
            assert!(*h < FIRST_RUNTIME_HANDLE);
        }
        let kinds: Vec<_> = OTHER_HANDLES.iter().map(|(_, h)| predefined_kind(*h).unwrap()).collect();
        use HandleKind::*;
        assert_eq!(
            kinds,
            [Win, File, Session, Message, Message, Info, Info, Errhandler, Errhandler, Errhandler, Errhandler, Request]
        );
        assert_eq!(predefined_kind(FIRST_RUNTIME_HANDLE), None);
        assert_eq!(predefined_kind(0), None);
        // no two predefined handles share a word
        let mut seen = HashMap::new();
        for t in [OPS, COMMS, GROUPS, OTHER_HANDLES, DATATYPES] {
            for (n, h) in t {
                assert!(seen.insert(*h, *n).is_none(), "{n} and {:?} share {h:#x}", seen.get(h));
            }
        }
        assert!(is_predefined_datatype(MPI_DOUBLE) && !is_predefined_datatype(MPI_DATATYPE_NULL));
        assert!(!is_predefined_datatype(0x211) && !is_predefined_datatype(MPI_SUM));
        assert!(is_predefined_op(MPI_MAXLOC) && !is_predefined_op(MPI_OP_NULL) && !is_predefined_op(MPI_INT));
        assert_eq!(predefined_name(MPI_LONG_LONG_INT), Some("MPI_LONG_LONG"));
    }

    #[test]
    fn encoded_sizes_are_the_types_sizes() {
        let sized = [
            (MPI_INT8_T, 1),
            (MPI_UINT8_T, 1),
            (MPI_CHAR, 1),
            (MPI_SIGNED_CHAR, 1),
            (MPI_UNSIGNED_CHAR, 1),
            (MPI_BYTE, 1),
            (MPI_INT16_T, 2),
            (MPI_UINT16_T, 2),
            (MPI_INT32_T, 4),
            (MPI_UINT32_T, 4),
            (MPI_INT64_T, 8),
            (MPI_UINT64_T, 8),
            (MPI_LOGICAL1, 1),
            (MPI_INTEGER1, 1),
            (MPI_LOGICAL2, 2),
            (MPI_INTEGER2, 2),
            (MPI_REAL2, 2),
            (MPI_LOGICAL4, 4),
            (MPI_INTEGER4, 4),
            (MPI_REAL4, 4),
            (MPI_COMPLEX4, 4),
            (MPI_LOGICAL8, 8),
            (MPI_INTEGER8, 8),
            (MPI_REAL8, 8),
            (MPI_COMPLEX8, 8),
            (MPI_LOGICAL16, 16),
            (MPI_INTEGER16, 16),
            (MPI_REAL16, 16),
            (MPI_COMPLEX16, 16),
            (MPI_COMPLEX32, 32),
        ];
        for (h, size) in sized {
            assert_eq!(encoded_size(h), Some(size), "{}", predefined_name(h).unwrap());
        }
        for (name, h) in DATATYPES {
            if !sized.iter().any(|s| s.0 == *h) {
                assert_eq!(encoded_size(*h), None, "{name}");
            }
        }
    }

    #[test]
    fn status_layout() {
        assert_eq!(std::mem::size_of::<MPI_Status>(), 32);
        assert_eq!(std::mem::align_of::<MPI_Status>(), 4);
        assert_eq!(std::mem::offset_of!(MPI_Status, MPI_SOURCE), 0);
        assert_eq!(std::mem::offset_of!(MPI_Status, MPI_TAG), 4);
        assert_eq!(std::mem::offset_of!(MPI_Status, MPI_ERROR), 8);
        assert_eq!(std::mem::offset_of!(MPI_Status, MPI_internal), 12);
    }

    #[test]
    fn get_version_answers_5_0() {
        let (mut v, mut s) = (0, -1);
        // SAFETY: both point to live ints.
        assert_eq!(unsafe { PMPI_Get_version(&mut v, &mut s) }, MPI_SUCCESS);
        assert_eq!((v, s), (5, 0));
        // SAFETY: a null pointer is refused before any write.
        assert_eq!(unsafe { PMPI_Get_version(std::ptr::null_mut(), &mut s) }, MPI_ERR_ARG);
    }

    /// The constants `mpi.h` defines: `#define MPI_X value` and `MPI_X =`
    /// enumerators.
    fn header_constant_names(text: &str) -> Vec<String> {
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let mut names = Vec::new();
        for line in text.lines() {
            let l = line.trim_start();
            if let Some(rest) = l.strip_prefix("#define ") {
                let name: String = rest.chars().take_while(|&c| ident(c)).collect();
                let after = &rest[name.len()..];
                if name.starts_with("MPI_") && after.starts_with(' ') && !after.trim().is_empty() {
                    names.push(name);
                }
            } else if !l.starts_with('#') {
                for (i, _) in l.match_indices("MPI_") {
                    if i > 0 && ident(l[..i].chars().last().unwrap()) {
                        continue;
                    }
                    let name: String = l[i..].chars().take_while(|&c| ident(c)).collect();
                    let after = l[i + name.len()..].trim_start();
                    if after.starts_with('=') && !after.starts_with("==") {
                        names.push(name);
                    }
                }
            }
        }
        names
    }

    #[test]
    fn header_parser_finds_defines_and_enumerators() {
        let names = header_constant_names(
            "#define MPI_A ((MPI_Op)1)\n#define MPI_F(x) x\n#define MPI_G\n  MPI_B = 2, MPI_C = -3,\nint MPI_D(int);\n",
        );
        assert_eq!(names, ["MPI_A", "MPI_B", "MPI_C"]);
    }

    /// Compiles a C program against `include/mpi.h` that prints every
    /// constant this module defines, the sizes of the C types and the
    /// offsets in `MPI_Status`, and compares them with the Rust values.
    #[test]
    fn mpi_h_agrees_with_this_module() {
        let Some(cc) = ["cc", "gcc"].into_iter().find(|c| Command::new(c).arg("--version").output().is_ok()) else {
            eprintln!("SKIPPED: no C compiler (cc) to compile include/mpi.h with");
            return;
        };
        let include = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include");
        let consts = all_constants();
        let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <mpi.h>\n");
        c.push_str("#define P(n) printf(\"%s %lld\\n\", #n, (long long)(intptr_t)(n))\nint main(void) {\n");
        for (name, _) in &consts {
            c.push_str(&format!("P({name});\n"));
        }
        let sizes = [
            ("MPI_Aint", std::mem::size_of::<MPI_Aint>()),
            ("MPI_Offset", std::mem::size_of::<MPI_Offset>()),
            ("MPI_Count", std::mem::size_of::<MPI_Count>()),
            ("MPI_Comm", std::mem::size_of::<MPI_Comm>()),
            ("MPI_Datatype", std::mem::size_of::<MPI_Datatype>()),
            ("MPI_Op", std::mem::size_of::<MPI_Op>()),
            ("MPI_Group", std::mem::size_of::<MPI_Group>()),
            ("MPI_Request", std::mem::size_of::<MPI_Request>()),
            ("MPI_Errhandler", std::mem::size_of::<MPI_Errhandler>()),
            ("MPI_Info", std::mem::size_of::<MPI_Info>()),
            ("MPI_Win", std::mem::size_of::<MPI_Win>()),
            ("MPI_File", std::mem::size_of::<MPI_File>()),
            ("MPI_Message", std::mem::size_of::<MPI_Message>()),
            ("MPI_Session", std::mem::size_of::<MPI_Session>()),
            ("MPI_Status", std::mem::size_of::<MPI_Status>()),
        ];
        for (t, _) in &sizes {
            c.push_str(&format!("printf(\"sizeof({t}) %zu\\n\", sizeof({t}));\n"));
        }
        for f in ["MPI_SOURCE", "MPI_TAG", "MPI_ERROR", "MPI_internal"] {
            c.push_str(&format!("printf(\"offsetof({f}) %zu\\n\", offsetof(MPI_Status, {f}));\n"));
        }
        c.push_str("return 0;\n}\n");
        let dir = std::env::temp_dir().join(format!("mpi-abi-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("values.c"), c).unwrap();
        let exe = dir.join("values");
        let out = Command::new(cc)
            .args(["-std=c11", "-Wall", "-Werror", "-o"])
            .arg(&exe)
            .arg(dir.join("values.c"))
            .arg("-I")
            .arg(&include)
            .output()
            .unwrap();
        assert!(out.status.success(), "{cc}:\n{}", String::from_utf8_lossy(&out.stderr));
        let run = Command::new(&exe).output().unwrap();
        assert!(run.status.success());
        let text = String::from_utf8(run.stdout).unwrap();
        let got: HashMap<&str, i64> =
            text.lines().filter_map(|l| l.split_once(' ')).map(|(n, v)| (n, v.parse().unwrap())).collect();
        for (name, v) in &consts {
            assert_eq!(got.get(name), Some(v), "{name}: mpi.h and abi.rs disagree");
        }
        let header = std::fs::read_to_string(include.join("mpi.h")).unwrap();
        for name in header_constant_names(&header) {
            assert!(consts.iter().any(|c| c.0 == name), "mpi.h defines {name}, abi.rs does not");
        }
        for (t, size) in &sizes {
            assert_eq!(got[format!("sizeof({t})").as_str()], *size as i64, "sizeof({t})");
        }
        let offsets = [
            ("MPI_SOURCE", std::mem::offset_of!(MPI_Status, MPI_SOURCE)),
            ("MPI_TAG", std::mem::offset_of!(MPI_Status, MPI_TAG)),
            ("MPI_ERROR", std::mem::offset_of!(MPI_Status, MPI_ERROR)),
            ("MPI_internal", std::mem::offset_of!(MPI_Status, MPI_internal)),
        ];
        for (f, off) in offsets {
            assert_eq!(got[format!("offsetof({f})").as_str()], off as i64, "offsetof(MPI_Status, {f})");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
