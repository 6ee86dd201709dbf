/*
 * mpi.h: the C interface of this project's MPI library, libmpi_abi.so.1,
 * which follows the MPI 5.0 standard ABI (MPI_ABI_VERSION 1.0). A program
 * built against this header runs with any library of that ABI: the one
 * found through LD_LIBRARY_PATH or ld.so.conf is the one that runs it.
 *
 * Handles are pointers to incomplete structs (one struct per kind, so C
 * and C++ catch a communicator passed as a datatype); the predefined ones
 * are small integer values below 1024, laid out by kind (see the header
 * comment of guest/msg/mpi/src/abi.rs, which holds the same values for Rust).
 *
 * Every function has two names: MPI_X (weak in the library, for profiling
 * tools to override) and PMPI_X (the library's own).
 */
#ifndef MCMPI_MPI_H
#define MCMPI_MPI_H

#include <stdint.h>

#if defined(__cplusplus)
extern "C" {
#endif

/* ------------------------------------------------------------ versions -- */
#define MPI_VERSION 5
#define MPI_SUBVERSION 0
#define MPI_ABI_VERSION 1
#define MPI_ABI_SUBVERSION 0

/* --------------------------------------------------------- basic types -- */
typedef intptr_t MPI_Aint;  /* addresses and displacements */
typedef int64_t MPI_Offset; /* file offsets */
typedef MPI_Offset MPI_Count; /* the wider of MPI_Aint and MPI_Offset */

/* Three public fields, then five ints of the library's own (32 bytes). */
typedef struct {
    int MPI_SOURCE;
    int MPI_TAG;
    int MPI_ERROR;
    int MPI_internal[5];
} MPI_Status;

/* -------------------------------------------------------------- handles -- */
typedef struct MPI_ABI_Op *MPI_Op;
typedef struct MPI_ABI_Comm *MPI_Comm;
typedef struct MPI_ABI_Group *MPI_Group;
typedef struct MPI_ABI_Win *MPI_Win;
typedef struct MPI_ABI_File *MPI_File;
typedef struct MPI_ABI_Session *MPI_Session;
typedef struct MPI_ABI_Message *MPI_Message;
typedef struct MPI_ABI_Info *MPI_Info;
typedef struct MPI_ABI_Errhandler *MPI_Errhandler;
typedef struct MPI_ABI_Request *MPI_Request;
typedef struct MPI_ABI_Datatype *MPI_Datatype;

/* Operations: 0x20 to 0x3f. */
#define MPI_OP_NULL ((MPI_Op)0x020)
#define MPI_SUM     ((MPI_Op)0x021)
#define MPI_MIN     ((MPI_Op)0x022)
#define MPI_MAX     ((MPI_Op)0x023)
#define MPI_PROD    ((MPI_Op)0x024)
#define MPI_BAND    ((MPI_Op)0x028)
#define MPI_BOR     ((MPI_Op)0x029)
#define MPI_BXOR    ((MPI_Op)0x02a)
#define MPI_LAND    ((MPI_Op)0x030)
#define MPI_LOR     ((MPI_Op)0x031)
#define MPI_LXOR    ((MPI_Op)0x032)
#define MPI_MINLOC  ((MPI_Op)0x038)
#define MPI_MAXLOC  ((MPI_Op)0x039)
#define MPI_REPLACE ((MPI_Op)0x03c)
#define MPI_NO_OP   ((MPI_Op)0x03d)

/* Communicators, groups and the other kinds: 0x100 to 0x1ff. */
#define MPI_COMM_NULL        ((MPI_Comm)0x100)
#define MPI_COMM_WORLD       ((MPI_Comm)0x101)
#define MPI_COMM_SELF        ((MPI_Comm)0x102)
#define MPI_GROUP_NULL       ((MPI_Group)0x108)
#define MPI_GROUP_EMPTY      ((MPI_Group)0x109)
#define MPI_WIN_NULL         ((MPI_Win)0x110)
#define MPI_FILE_NULL        ((MPI_File)0x118)
#define MPI_SESSION_NULL     ((MPI_Session)0x120)
#define MPI_MESSAGE_NULL     ((MPI_Message)0x128)
#define MPI_MESSAGE_NO_PROC  ((MPI_Message)0x129)
#define MPI_INFO_NULL        ((MPI_Info)0x130)
#define MPI_INFO_ENV         ((MPI_Info)0x131)
#define MPI_ERRHANDLER_NULL  ((MPI_Errhandler)0x140)
#define MPI_ERRORS_ARE_FATAL ((MPI_Errhandler)0x141)
#define MPI_ERRORS_ABORT     ((MPI_Errhandler)0x142)
#define MPI_ERRORS_RETURN    ((MPI_Errhandler)0x143)
#define MPI_REQUEST_NULL     ((MPI_Request)0x180)

/* Datatypes: 0x200 to 0x3ff. With 0x40 set the size is fixed and
 * 1 << ((handle >> 3) & 7) bytes; 0x80 on top marks Fortran's sized types. */
#define MPI_DATATYPE_NULL ((MPI_Datatype)0x200)
/* address, count, offset; packed bytes */
#define MPI_AINT   ((MPI_Datatype)0x201)
#define MPI_COUNT  ((MPI_Datatype)0x202)
#define MPI_OFFSET ((MPI_Datatype)0x203)
#define MPI_PACKED ((MPI_Datatype)0x207)
/* C integers */
#define MPI_SHORT              ((MPI_Datatype)0x208)
#define MPI_INT                ((MPI_Datatype)0x209)
#define MPI_LONG               ((MPI_Datatype)0x20a)
#define MPI_LONG_LONG          ((MPI_Datatype)0x20b)
#define MPI_LONG_LONG_INT      MPI_LONG_LONG
#define MPI_UNSIGNED_SHORT     ((MPI_Datatype)0x20c)
#define MPI_UNSIGNED           ((MPI_Datatype)0x20d)
#define MPI_UNSIGNED_LONG      ((MPI_Datatype)0x20e)
#define MPI_UNSIGNED_LONG_LONG ((MPI_Datatype)0x20f)
/* C and C++ floating point and complex */
#define MPI_FLOAT                   ((MPI_Datatype)0x210)
#define MPI_C_FLOAT_COMPLEX         ((MPI_Datatype)0x212)
#define MPI_C_COMPLEX               MPI_C_FLOAT_COMPLEX
#define MPI_CXX_FLOAT_COMPLEX       ((MPI_Datatype)0x213)
#define MPI_DOUBLE                  ((MPI_Datatype)0x214)
#define MPI_C_DOUBLE_COMPLEX        ((MPI_Datatype)0x216)
#define MPI_CXX_DOUBLE_COMPLEX      ((MPI_Datatype)0x217)
#define MPI_LONG_DOUBLE             ((MPI_Datatype)0x220)
#define MPI_C_LONG_DOUBLE_COMPLEX   ((MPI_Datatype)0x224)
#define MPI_CXX_LONG_DOUBLE_COMPLEX ((MPI_Datatype)0x225)
/* Fortran's default kinds */
#define MPI_LOGICAL          ((MPI_Datatype)0x218)
#define MPI_INTEGER          ((MPI_Datatype)0x219)
#define MPI_REAL             ((MPI_Datatype)0x21a)
#define MPI_COMPLEX          ((MPI_Datatype)0x21b)
#define MPI_DOUBLE_PRECISION ((MPI_Datatype)0x21c)
#define MPI_DOUBLE_COMPLEX   ((MPI_Datatype)0x21d)
#define MPI_CHARACTER        ((MPI_Datatype)0x21e)
/* value-index pairs (MPI_MINLOC, MPI_MAXLOC) */
#define MPI_FLOAT_INT         ((MPI_Datatype)0x228)
#define MPI_DOUBLE_INT        ((MPI_Datatype)0x229)
#define MPI_LONG_INT          ((MPI_Datatype)0x22a)
#define MPI_2INT              ((MPI_Datatype)0x22b)
#define MPI_SHORT_INT         ((MPI_Datatype)0x22c)
#define MPI_LONG_DOUBLE_INT   ((MPI_Datatype)0x22d)
#define MPI_2REAL             ((MPI_Datatype)0x230)
#define MPI_2DOUBLE_PRECISION ((MPI_Datatype)0x231)
#define MPI_2INTEGER          ((MPI_Datatype)0x232)
/* booleans and wide characters */
#define MPI_C_BOOL   ((MPI_Datatype)0x238)
#define MPI_CXX_BOOL ((MPI_Datatype)0x239)
#define MPI_WCHAR    ((MPI_Datatype)0x23c)
/* fixed size: 1, 2, 4 and 8 bytes */
#define MPI_INT8_T        ((MPI_Datatype)0x240)
#define MPI_UINT8_T       ((MPI_Datatype)0x241)
#define MPI_CHAR          ((MPI_Datatype)0x243)
#define MPI_SIGNED_CHAR   ((MPI_Datatype)0x244)
#define MPI_UNSIGNED_CHAR ((MPI_Datatype)0x245)
#define MPI_BYTE          ((MPI_Datatype)0x247)
#define MPI_INT16_T       ((MPI_Datatype)0x248)
#define MPI_UINT16_T      ((MPI_Datatype)0x249)
#define MPI_INT32_T       ((MPI_Datatype)0x250)
#define MPI_UINT32_T      ((MPI_Datatype)0x251)
#define MPI_INT64_T       ((MPI_Datatype)0x258)
#define MPI_UINT64_T      ((MPI_Datatype)0x259)
/* Fortran's sized types: 1, 2, 4, 8, 16 and 32 bytes */
#define MPI_LOGICAL1  ((MPI_Datatype)0x2c0)
#define MPI_INTEGER1  ((MPI_Datatype)0x2c1)
#define MPI_LOGICAL2  ((MPI_Datatype)0x2c8)
#define MPI_INTEGER2  ((MPI_Datatype)0x2c9)
#define MPI_REAL2     ((MPI_Datatype)0x2ca)
#define MPI_LOGICAL4  ((MPI_Datatype)0x2d0)
#define MPI_INTEGER4  ((MPI_Datatype)0x2d1)
#define MPI_REAL4     ((MPI_Datatype)0x2d2)
#define MPI_COMPLEX4  ((MPI_Datatype)0x2d3)
#define MPI_LOGICAL8  ((MPI_Datatype)0x2d8)
#define MPI_INTEGER8  ((MPI_Datatype)0x2d9)
#define MPI_REAL8     ((MPI_Datatype)0x2da)
#define MPI_COMPLEX8  ((MPI_Datatype)0x2db)
#define MPI_LOGICAL16 ((MPI_Datatype)0x2e0)
#define MPI_INTEGER16 ((MPI_Datatype)0x2e1)
#define MPI_REAL16    ((MPI_Datatype)0x2e2)
#define MPI_COMPLEX16 ((MPI_Datatype)0x2e3)
#define MPI_COMPLEX32 ((MPI_Datatype)0x2eb)

/* --------------------------------------------------------- error classes -- */
enum {
    MPI_SUCCESS = 0,
    /* MPI-1 */
    MPI_ERR_BUFFER = 1, MPI_ERR_COUNT = 2, MPI_ERR_TYPE = 3, MPI_ERR_TAG = 4,
    MPI_ERR_COMM = 5, MPI_ERR_RANK = 6, MPI_ERR_REQUEST = 7, MPI_ERR_ROOT = 8,
    MPI_ERR_GROUP = 9, MPI_ERR_OP = 10, MPI_ERR_TOPOLOGY = 11, MPI_ERR_DIMS = 12,
    MPI_ERR_ARG = 13, MPI_ERR_UNKNOWN = 14, MPI_ERR_TRUNCATE = 15, MPI_ERR_OTHER = 16,
    MPI_ERR_INTERN = 17, MPI_ERR_PENDING = 18, MPI_ERR_IN_STATUS = 19,
    /* MPI-2 */
    MPI_ERR_ACCESS = 20, MPI_ERR_AMODE = 21, MPI_ERR_ASSERT = 22, MPI_ERR_BAD_FILE = 23,
    MPI_ERR_BASE = 24, MPI_ERR_CONVERSION = 25, MPI_ERR_DISP = 26, MPI_ERR_DUP_DATAREP = 27,
    MPI_ERR_FILE_EXISTS = 28, MPI_ERR_FILE_IN_USE = 29, MPI_ERR_FILE = 30,
    MPI_ERR_INFO_KEY = 31, MPI_ERR_INFO_NOKEY = 32, MPI_ERR_INFO_VALUE = 33, MPI_ERR_INFO = 34,
    MPI_ERR_IO = 35, MPI_ERR_KEYVAL = 36, MPI_ERR_LOCKTYPE = 37, MPI_ERR_NAME = 38,
    MPI_ERR_NO_MEM = 39, MPI_ERR_NOT_SAME = 40, MPI_ERR_NO_SPACE = 41, MPI_ERR_NO_SUCH_FILE = 42,
    MPI_ERR_PORT = 43, MPI_ERR_QUOTA = 44, MPI_ERR_READ_ONLY = 45, MPI_ERR_RMA_ATTACH = 46,
    MPI_ERR_RMA_CONFLICT = 47, MPI_ERR_RMA_RANGE = 48, MPI_ERR_RMA_SHARED = 49,
    MPI_ERR_RMA_SYNC = 50, MPI_ERR_SERVICE = 51, MPI_ERR_SIZE = 52, MPI_ERR_SPAWN = 53,
    MPI_ERR_UNSUPPORTED_DATAREP = 54, MPI_ERR_UNSUPPORTED_OPERATION = 55, MPI_ERR_WIN = 56,
    /* MPI-3 to MPI-5 */
    MPI_ERR_RMA_FLAVOR = 57, MPI_ERR_PROC_ABORTED = 58, MPI_ERR_VALUE_TOO_LARGE = 59,
    MPI_ERR_SESSION = 60, MPI_ERR_ERRHANDLER = 61, MPI_ERR_ABI = 62,
    /* the tool interface */
    MPI_T_ERR_CANNOT_INIT = 1001, MPI_T_ERR_NOT_ACCESSIBLE = 1002,
    MPI_T_ERR_NOT_INITIALIZED = 1003, MPI_T_ERR_NOT_SUPPORTED = 1004, MPI_T_ERR_MEMORY = 1005,
    MPI_T_ERR_INVALID = 1006, MPI_T_ERR_INVALID_INDEX = 1007, MPI_T_ERR_INVALID_ITEM = 1008,
    MPI_T_ERR_INVALID_SESSION = 1009, MPI_T_ERR_INVALID_HANDLE = 1010,
    MPI_T_ERR_INVALID_NAME = 1011, MPI_T_ERR_OUT_OF_HANDLES = 1012,
    MPI_T_ERR_OUT_OF_SESSIONS = 1013, MPI_T_ERR_CVAR_SET_NOT_NOW = 1014,
    MPI_T_ERR_CVAR_SET_NEVER = 1015, MPI_T_ERR_PVAR_NO_WRITE = 1016,
    MPI_T_ERR_PVAR_NO_STARTSTOP = 1017, MPI_T_ERR_PVAR_NO_ATOMIC = 1018,
    /* no error class or code is above this */
    MPI_ERR_LASTCODE = 16383
};

/* ---------------------------------------------------- special addresses -- */
#define MPI_BOTTOM           ((void *)0)
#define MPI_IN_PLACE         ((void *)1)
#define MPI_BUFFER_AUTOMATIC ((void *)2)
#define MPI_ARGV_NULL        ((char **)0)
#define MPI_ARGVS_NULL       ((char ***)0)
#define MPI_ERRCODES_IGNORE  ((int *)0)
#define MPI_STATUS_IGNORE    ((MPI_Status *)0)
#define MPI_STATUSES_IGNORE  ((MPI_Status *)0)
#define MPI_UNWEIGHTED       ((int *)10)
#define MPI_WEIGHTS_EMPTY    ((int *)11)

/* ------------------------------------------------------ string lengths -- */
#define MPI_MAX_DATAREP_STRING 128
#define MPI_MAX_ERROR_STRING 512
#define MPI_MAX_INFO_KEY 256
#define MPI_MAX_INFO_VAL 1024
#define MPI_MAX_LIBRARY_VERSION_STRING 8192
#define MPI_MAX_OBJECT_NAME 128
#define MPI_MAX_PORT_NAME 1024
#define MPI_MAX_PROCESSOR_NAME 256
#define MPI_MAX_STRINGTAG_LEN 1024
#define MPI_MAX_PSET_NAME_LEN 1024
/* what MPI_Bsend needs on top of the data, per message */
#define MPI_BSEND_OVERHEAD 512

/* File open modes, then window assertions: single bits, to be OR-ed. */
enum {
    MPI_MODE_APPEND = 1, MPI_MODE_CREATE = 2, MPI_MODE_DELETE_ON_CLOSE = 4,
    MPI_MODE_EXCL = 8, MPI_MODE_RDONLY = 16, MPI_MODE_RDWR = 32,
    MPI_MODE_SEQUENTIAL = 64, MPI_MODE_UNIQUE_OPEN = 128, MPI_MODE_WRONLY = 256,
    MPI_MODE_NOCHECK = 1024, MPI_MODE_NOPRECEDE = 2048, MPI_MODE_NOPUT = 4096,
    MPI_MODE_NOSTORE = 8192, MPI_MODE_NOSUCCEED = 16384
};

/* Wildcards and rank sentinels (negative, never a rank or tag). */
enum {
    MPI_ANY_SOURCE = -1,
    MPI_ANY_TAG = -2,
    MPI_PROC_NULL = -3,
    MPI_ROOT = -4,
    MPI_UNDEFINED = -32766
};

/* Fortran status: its length and the places of the public fields. */
enum { MPI_F_STATUS_SIZE = 8, MPI_F_SOURCE = 0, MPI_F_TAG = 1, MPI_F_ERROR = 2 };

enum {
    /* thread levels, in increasing order */
    MPI_THREAD_SINGLE = 0, MPI_THREAD_FUNNELED = 1024,
    MPI_THREAD_SERIALIZED = 2048, MPI_THREAD_MULTIPLE = 4096,
    /* array order and distribution (MPI_Type_create_subarray, _darray) */
    MPI_ORDER_C = 12, MPI_ORDER_FORTRAN = 15,
    MPI_DISTRIBUTE_NONE = 16, MPI_DISTRIBUTE_BLOCK = 17,
    MPI_DISTRIBUTE_CYCLIC = 18, MPI_DISTRIBUTE_DFLT_DARG = 19,
    /* MPI_Type_get_envelope's combiners */
    MPI_COMBINER_NAMED = 101, MPI_COMBINER_DUP = 102, MPI_COMBINER_CONTIGUOUS = 103,
    MPI_COMBINER_VECTOR = 104, MPI_COMBINER_HVECTOR = 105, MPI_COMBINER_INDEXED = 106,
    MPI_COMBINER_HINDEXED = 107, MPI_COMBINER_INDEXED_BLOCK = 108,
    MPI_COMBINER_HINDEXED_BLOCK = 109, MPI_COMBINER_STRUCT = 110,
    MPI_COMBINER_SUBARRAY = 111, MPI_COMBINER_DARRAY = 112,
    MPI_COMBINER_F90_REAL = 113, MPI_COMBINER_F90_COMPLEX = 114,
    MPI_COMBINER_F90_INTEGER = 115, MPI_COMBINER_RESIZED = 116,
    MPI_COMBINER_VALUE_INDEX = 117,
    /* MPI_Type_match_size's classes */
    MPI_TYPECLASS_INTEGER = 192, MPI_TYPECLASS_REAL = 193, MPI_TYPECLASS_COMPLEX = 194,
    /* results of the group and communicator comparisons */
    MPI_IDENT = 201, MPI_CONGRUENT = 202, MPI_SIMILAR = 203, MPI_UNEQUAL = 204,
    /* virtual topologies */
    MPI_CART = 211, MPI_GRAPH = 212, MPI_DIST_GRAPH = 213,
    /* MPI_Comm_split_type */
    MPI_COMM_TYPE_SHARED = 221, MPI_COMM_TYPE_HW_UNGUIDED = 222,
    MPI_COMM_TYPE_HW_GUIDED = 223, MPI_COMM_TYPE_RESOURCE_GUIDED = 224,
    /* windows: lock types, flavors, memory models */
    MPI_LOCK_EXCLUSIVE = 301, MPI_LOCK_SHARED = 302,
    MPI_WIN_FLAVOR_CREATE = 311, MPI_WIN_FLAVOR_ALLOCATE = 312,
    MPI_WIN_FLAVOR_DYNAMIC = 313, MPI_WIN_FLAVOR_SHARED = 314,
    MPI_WIN_UNIFIED = 321, MPI_WIN_SEPARATE = 322,
    /* MPI_File_seek */
    MPI_SEEK_CUR = 401, MPI_SEEK_END = 402, MPI_SEEK_SET = 403
};

/* Attribute keys: the invalid one, then the predefined ones. */
enum {
    MPI_KEYVAL_INVALID = 0,
    MPI_TAG_UB = 501, MPI_IO = 502, MPI_HOST = 503, MPI_WTIME_IS_GLOBAL = 504,
    MPI_APPNUM = 505, MPI_LASTUSEDCODE = 506, MPI_UNIVERSE_SIZE = 507,
    MPI_WIN_BASE = 601, MPI_WIN_DISP_UNIT = 602, MPI_WIN_SIZE = 603,
    MPI_WIN_CREATE_FLAVOR = 604, MPI_WIN_MODEL = 605
};

/* MPI_File_set_view's "current position" displacement */
#define MPI_DISPLACEMENT_CURRENT ((MPI_Offset)-1)

/* ------------------------------------------------------------ callbacks -- */
typedef void(MPI_User_function)(void *invec, void *inoutvec, int *len, MPI_Datatype *datatype);
typedef void(MPI_User_function_c)(void *invec, void *inoutvec, MPI_Count *len, MPI_Datatype *datatype);

typedef int(MPI_Grequest_query_function)(void *extra_state, MPI_Status *status);
typedef int(MPI_Grequest_free_function)(void *extra_state);
typedef int(MPI_Grequest_cancel_function)(void *extra_state, int complete);

typedef int(MPI_Comm_copy_attr_function)(MPI_Comm oldcomm, int comm_keyval, void *extra_state,
                                         void *attribute_val_in, void *attribute_val_out, int *flag);
typedef int(MPI_Comm_delete_attr_function)(MPI_Comm comm, int comm_keyval, void *attribute_val,
                                           void *extra_state);
typedef int(MPI_Type_copy_attr_function)(MPI_Datatype oldtype, int type_keyval, void *extra_state,
                                         void *attribute_val_in, void *attribute_val_out, int *flag);
typedef int(MPI_Type_delete_attr_function)(MPI_Datatype datatype, int type_keyval, void *attribute_val,
                                           void *extra_state);
typedef int(MPI_Win_copy_attr_function)(MPI_Win oldwin, int win_keyval, void *extra_state,
                                        void *attribute_val_in, void *attribute_val_out, int *flag);
typedef int(MPI_Win_delete_attr_function)(MPI_Win win, int win_keyval, void *attribute_val,
                                          void *extra_state);
/* MPI-1's names for the communicator attribute callbacks (deprecated) */
typedef int(MPI_Copy_function)(MPI_Comm oldcomm, int keyval, void *extra_state, void *attribute_val_in,
                               void *attribute_val_out, int *flag);
typedef int(MPI_Delete_function)(MPI_Comm comm, int keyval, void *attribute_val, void *extra_state);

typedef int(MPI_Datarep_extent_function)(MPI_Datatype datatype, MPI_Aint *extent, void *extra_state);
typedef int(MPI_Datarep_conversion_function)(void *userbuf, MPI_Datatype datatype, int count, void *filebuf,
                                             MPI_Offset position, void *extra_state);
typedef int(MPI_Datarep_conversion_function_c)(void *userbuf, MPI_Datatype datatype, MPI_Count count,
                                               void *filebuf, MPI_Offset position, void *extra_state);

/* Error handlers get the object and the error code; nothing follows them. */
typedef void(MPI_Comm_errhandler_function)(MPI_Comm *comm, int *error_code, ...);
typedef void(MPI_File_errhandler_function)(MPI_File *file, int *error_code, ...);
typedef void(MPI_Win_errhandler_function)(MPI_Win *win, int *error_code, ...);
typedef void(MPI_Session_errhandler_function)(MPI_Session *session, int *error_code, ...);
typedef MPI_Comm_errhandler_function MPI_Comm_errhandler_fn;
typedef MPI_File_errhandler_function MPI_File_errhandler_fn;
typedef MPI_Win_errhandler_function MPI_Win_errhandler_fn;
typedef MPI_Session_errhandler_function MPI_Session_errhandler_fn;

/* The predefined attribute callbacks are special values, not functions:
 * 0 copies nothing (or deletes nothing), 1 copies the attribute's value. */
#define MPI_NULL_COPY_FN         ((MPI_Copy_function *)0)
#define MPI_DUP_FN               ((MPI_Copy_function *)1)
#define MPI_NULL_DELETE_FN       ((MPI_Delete_function *)0)
#define MPI_COMM_NULL_COPY_FN    ((MPI_Comm_copy_attr_function *)0)
#define MPI_COMM_DUP_FN          ((MPI_Comm_copy_attr_function *)1)
#define MPI_COMM_NULL_DELETE_FN  ((MPI_Comm_delete_attr_function *)0)
#define MPI_TYPE_NULL_COPY_FN    ((MPI_Type_copy_attr_function *)0)
#define MPI_TYPE_DUP_FN          ((MPI_Type_copy_attr_function *)1)
#define MPI_TYPE_NULL_DELETE_FN  ((MPI_Type_delete_attr_function *)0)
#define MPI_WIN_NULL_COPY_FN     ((MPI_Win_copy_attr_function *)0)
#define MPI_WIN_DUP_FN           ((MPI_Win_copy_attr_function *)1)
#define MPI_WIN_NULL_DELETE_FN   ((MPI_Win_delete_attr_function *)0)
#define MPI_CONVERSION_FN_NULL   ((MPI_Datarep_conversion_function *)0)
#define MPI_CONVERSION_FN_NULL_C ((MPI_Datarep_conversion_function_c *)0)

/* ---------------------------------------------- the tool interface (MPI_T) -- */
typedef struct MPI_T_enum_t *MPI_T_enum;
typedef struct MPI_T_cvar_handle_t *MPI_T_cvar_handle;
typedef struct MPI_T_pvar_handle_t *MPI_T_pvar_handle;
typedef struct MPI_T_pvar_session_t *MPI_T_pvar_session;
typedef struct MPI_T_event_registration_t *MPI_T_event_registration;
typedef struct MPI_T_event_instance_t *MPI_T_event_instance;

#define MPI_T_ENUM_NULL         ((MPI_T_enum)0)
#define MPI_T_CVAR_HANDLE_NULL  ((MPI_T_cvar_handle)0)
#define MPI_T_PVAR_SESSION_NULL ((MPI_T_pvar_session)0)
#define MPI_T_PVAR_HANDLE_NULL  ((MPI_T_pvar_handle)0)
#define MPI_T_PVAR_ALL_HANDLES  ((MPI_T_pvar_handle)1)

typedef enum MPI_T_cb_safety {
    MPI_T_CB_REQUIRE_NONE = 0x00,
    MPI_T_CB_REQUIRE_MPI_RESTRICTED = 0x03,
    MPI_T_CB_REQUIRE_THREAD_SAFE = 0x0f,
    MPI_T_CB_REQUIRE_ASYNC_SIGNAL_SAFE = 0x3f
} MPI_T_cb_safety;

typedef enum MPI_T_source_order { MPI_T_SOURCE_ORDERED = 1, MPI_T_SOURCE_UNORDERED = 2 } MPI_T_source_order;

enum {
    /* verbosity: audience in the high bits, detail in the low ones */
    MPI_T_VERBOSITY_USER_BASIC = 0x09, MPI_T_VERBOSITY_USER_DETAIL = 0x0a, MPI_T_VERBOSITY_USER_ALL = 0x0c,
    MPI_T_VERBOSITY_TUNER_BASIC = 0x11, MPI_T_VERBOSITY_TUNER_DETAIL = 0x12, MPI_T_VERBOSITY_TUNER_ALL = 0x14,
    MPI_T_VERBOSITY_MPIDEV_BASIC = 0x21, MPI_T_VERBOSITY_MPIDEV_DETAIL = 0x22,
    MPI_T_VERBOSITY_MPIDEV_ALL = 0x24
};
enum {
    MPI_T_BIND_NO_OBJECT = 1, MPI_T_BIND_MPI_COMM = 2, MPI_T_BIND_MPI_DATATYPE = 3,
    MPI_T_BIND_MPI_ERRHANDLER = 4, MPI_T_BIND_MPI_FILE = 5, MPI_T_BIND_MPI_GROUP = 6,
    MPI_T_BIND_MPI_OP = 7, MPI_T_BIND_MPI_REQUEST = 8, MPI_T_BIND_MPI_WIN = 9,
    MPI_T_BIND_MPI_MESSAGE = 10, MPI_T_BIND_MPI_INFO = 11, MPI_T_BIND_MPI_SESSION = 12
};
enum {
    MPI_T_SCOPE_CONSTANT = 1, MPI_T_SCOPE_READONLY = 2, MPI_T_SCOPE_LOCAL = 3, MPI_T_SCOPE_GROUP = 4,
    MPI_T_SCOPE_GROUP_EQ = 5, MPI_T_SCOPE_ALL = 6, MPI_T_SCOPE_ALL_EQ = 7
};
enum {
    MPI_T_PVAR_CLASS_STATE = 1, MPI_T_PVAR_CLASS_LEVEL = 2, MPI_T_PVAR_CLASS_SIZE = 3,
    MPI_T_PVAR_CLASS_PERCENTAGE = 4, MPI_T_PVAR_CLASS_HIGHWATERMARK = 5,
    MPI_T_PVAR_CLASS_LOWWATERMARK = 6, MPI_T_PVAR_CLASS_COUNTER = 7,
    MPI_T_PVAR_CLASS_AGGREGATE = 8, MPI_T_PVAR_CLASS_TIMER = 9, MPI_T_PVAR_CLASS_GENERIC = 10
};

typedef void(MPI_T_event_cb_function)(MPI_T_event_instance event_instance,
                                      MPI_T_event_registration event_registration, MPI_T_cb_safety cb_safety,
                                      void *user_data);
typedef void(MPI_T_event_free_cb_function)(MPI_T_event_registration event_registration,
                                           MPI_T_cb_safety cb_safety, void *user_data);
typedef void(MPI_T_event_dropped_cb_function)(MPI_Count count, MPI_T_event_registration event_registration,
                                              int source_index, MPI_T_cb_safety cb_safety, void *user_data);

/* ------------------------------------------------------------ functions -- */
/* MCMPI_FN_(type, X, (params)) declares MPI_X and PMPI_X. */
#define MCMPI_FN_(ret, name, params) ret MPI_##name params; ret PMPI_##name params;
/* MCMPI_COLL_(X, Ix, params...) declares a collective in its three forms:
 * blocking MPI_X, non-blocking MPI_Ix and persistent MPI_X_init. */
#define MCMPI_COLL_(name, iname, ...)                                     \
    MCMPI_FN_(int, name, (__VA_ARGS__))                                   \
    MCMPI_FN_(int, iname, (__VA_ARGS__, MPI_Request *request))            \
    MCMPI_FN_(int, name##_init, (__VA_ARGS__, MPI_Info info, MPI_Request *request))

/* The standard ABI's own queries. */
MCMPI_FN_(int, Abi_get_version, (int *abi_major, int *abi_minor))
MCMPI_FN_(int, Abi_get_info, (MPI_Info *info))
MCMPI_FN_(int, Abi_get_fortran_info, (MPI_Info *info))
MCMPI_FN_(int, Abi_set_fortran_info, (MPI_Info info))
MCMPI_FN_(int, Abi_get_fortran_booleans, (int logical_size, void *logical_true, void *logical_false, int *is_set))
MCMPI_FN_(int, Abi_set_fortran_booleans, (int logical_size, void *logical_true, void *logical_false))

/* Start, end and the environment. */
MCMPI_FN_(int, Init, (int *argc, char ***argv))
MCMPI_FN_(int, Init_thread, (int *argc, char ***argv, int required, int *provided))
MCMPI_FN_(int, Initialized, (int *flag))
MCMPI_FN_(int, Finalize, (void))
MCMPI_FN_(int, Finalized, (int *flag))
MCMPI_FN_(int, Query_thread, (int *provided))
MCMPI_FN_(int, Is_thread_main, (int *flag))
MCMPI_FN_(int, Abort, (MPI_Comm comm, int errorcode))
MCMPI_FN_(int, Get_version, (int *version, int *subversion))
MCMPI_FN_(int, Get_library_version, (char *version, int *resultlen))
MCMPI_FN_(int, Get_processor_name, (char *name, int *resultlen))
MCMPI_FN_(int, Get_hw_resource_info, (MPI_Info *hw_info))
MCMPI_FN_(int, Alloc_mem, (MPI_Aint size, MPI_Info info, void *baseptr))
MCMPI_FN_(int, Free_mem, (void *base))
MCMPI_FN_(double, Wtime, (void))
MCMPI_FN_(double, Wtick, (void))
MCMPI_FN_(int, Pcontrol, (const int level, ...))

/* Point to point. */
MCMPI_FN_(int, Send, (const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm))
MCMPI_FN_(int, Bsend, (const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm))
MCMPI_FN_(int, Ssend, (const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm))
MCMPI_FN_(int, Rsend, (const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm))
MCMPI_FN_(int, Recv, (void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
                      MPI_Status *status))
MCMPI_FN_(int, Isend, (const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm,
                       MPI_Request *request))
MCMPI_FN_(int, Ibsend, (const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm,
                        MPI_Request *request))
MCMPI_FN_(int, Issend, (const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm,
                        MPI_Request *request))
MCMPI_FN_(int, Irsend, (const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm,
                        MPI_Request *request))
MCMPI_FN_(int, Irecv, (void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
                       MPI_Request *request))
MCMPI_FN_(int, Send_init, (const void *buf, int count, MPI_Datatype datatype, int dest, int tag,
                           MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Bsend_init, (const void *buf, int count, MPI_Datatype datatype, int dest, int tag,
                            MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Ssend_init, (const void *buf, int count, MPI_Datatype datatype, int dest, int tag,
                            MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Rsend_init, (const void *buf, int count, MPI_Datatype datatype, int dest, int tag,
                            MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Recv_init, (void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
                           MPI_Request *request))
MCMPI_FN_(int, Sendrecv, (const void *sendbuf, int sendcount, MPI_Datatype sendtype, int dest, int sendtag,
                          void *recvbuf, int recvcount, MPI_Datatype recvtype, int source, int recvtag,
                          MPI_Comm comm, MPI_Status *status))
MCMPI_FN_(int, Sendrecv_replace, (void *buf, int count, MPI_Datatype datatype, int dest, int sendtag,
                                  int source, int recvtag, MPI_Comm comm, MPI_Status *status))
MCMPI_FN_(int, Isendrecv, (const void *sendbuf, int sendcount, MPI_Datatype sendtype, int dest, int sendtag,
                           void *recvbuf, int recvcount, MPI_Datatype recvtype, int source, int recvtag,
                           MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Isendrecv_replace, (void *buf, int count, MPI_Datatype datatype, int dest, int sendtag,
                                   int source, int recvtag, MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Probe, (int source, int tag, MPI_Comm comm, MPI_Status *status))
MCMPI_FN_(int, Iprobe, (int source, int tag, MPI_Comm comm, int *flag, MPI_Status *status))
MCMPI_FN_(int, Mprobe, (int source, int tag, MPI_Comm comm, MPI_Message *message, MPI_Status *status))
MCMPI_FN_(int, Improbe, (int source, int tag, MPI_Comm comm, int *flag, MPI_Message *message,
                         MPI_Status *status))
MCMPI_FN_(int, Mrecv, (void *buf, int count, MPI_Datatype datatype, MPI_Message *message, MPI_Status *status))
MCMPI_FN_(int, Imrecv, (void *buf, int count, MPI_Datatype datatype, MPI_Message *message,
                        MPI_Request *request))
MCMPI_FN_(int, Get_count, (const MPI_Status *status, MPI_Datatype datatype, int *count))
MCMPI_FN_(int, Get_elements, (const MPI_Status *status, MPI_Datatype datatype, int *count))
MCMPI_FN_(int, Get_elements_x, (const MPI_Status *status, MPI_Datatype datatype, MPI_Count *count))
MCMPI_FN_(int, Buffer_attach, (void *buffer, int size))
MCMPI_FN_(int, Buffer_detach, (void *buffer_addr, int *size))
MCMPI_FN_(int, Buffer_flush, (void))
MCMPI_FN_(int, Buffer_iflush, (MPI_Request *request))
MCMPI_FN_(int, Comm_attach_buffer, (MPI_Comm comm, void *buffer, int size))
MCMPI_FN_(int, Comm_detach_buffer, (MPI_Comm comm, void *buffer_addr, int *size))
MCMPI_FN_(int, Comm_flush_buffer, (MPI_Comm comm))
MCMPI_FN_(int, Comm_iflush_buffer, (MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Session_attach_buffer, (MPI_Session session, void *buffer, int size))
MCMPI_FN_(int, Session_detach_buffer, (MPI_Session session, void *buffer_addr, int *size))
MCMPI_FN_(int, Session_flush_buffer, (MPI_Session session))
MCMPI_FN_(int, Session_iflush_buffer, (MPI_Session session, MPI_Request *request))

/* Partitioned communication. */
MCMPI_FN_(int, Psend_init, (const void *buf, int partitions, MPI_Count count, MPI_Datatype datatype, int dest,
                            int tag, MPI_Comm comm, MPI_Info info, MPI_Request *request))
MCMPI_FN_(int, Precv_init, (void *buf, int partitions, MPI_Count count, MPI_Datatype datatype, int source,
                            int tag, MPI_Comm comm, MPI_Info info, MPI_Request *request))
MCMPI_FN_(int, Pready, (int partition, MPI_Request request))
MCMPI_FN_(int, Pready_range, (int partition_low, int partition_high, MPI_Request request))
MCMPI_FN_(int, Pready_list, (int length, const int array_of_partitions[], MPI_Request request))
MCMPI_FN_(int, Parrived, (MPI_Request request, int partition, int *flag))

/* Requests and statuses. */
MCMPI_FN_(int, Wait, (MPI_Request *request, MPI_Status *status))
MCMPI_FN_(int, Test, (MPI_Request *request, int *flag, MPI_Status *status))
MCMPI_FN_(int, Waitall, (int count, MPI_Request array_of_requests[], MPI_Status array_of_statuses[]))
MCMPI_FN_(int, Testall, (int count, MPI_Request array_of_requests[], int *flag, MPI_Status array_of_statuses[]))
MCMPI_FN_(int, Waitany, (int count, MPI_Request array_of_requests[], int *index, MPI_Status *status))
MCMPI_FN_(int, Testany, (int count, MPI_Request array_of_requests[], int *index, int *flag, MPI_Status *status))
MCMPI_FN_(int, Waitsome, (int incount, MPI_Request array_of_requests[], int *outcount, int array_of_indices[],
                          MPI_Status array_of_statuses[]))
MCMPI_FN_(int, Testsome, (int incount, MPI_Request array_of_requests[], int *outcount, int array_of_indices[],
                          MPI_Status array_of_statuses[]))
MCMPI_FN_(int, Request_free, (MPI_Request *request))
MCMPI_FN_(int, Request_get_status, (MPI_Request request, int *flag, MPI_Status *status))
MCMPI_FN_(int, Request_get_status_all, (int count, const MPI_Request array_of_requests[], int *flag,
                                        MPI_Status array_of_statuses[]))
MCMPI_FN_(int, Request_get_status_any, (int count, const MPI_Request array_of_requests[], int *index, int *flag,
                                        MPI_Status *status))
MCMPI_FN_(int, Request_get_status_some, (int incount, const MPI_Request array_of_requests[], int *outcount,
                                         int array_of_indices[], MPI_Status array_of_statuses[]))
MCMPI_FN_(int, Cancel, (MPI_Request *request))
MCMPI_FN_(int, Test_cancelled, (const MPI_Status *status, int *flag))
MCMPI_FN_(int, Start, (MPI_Request *request))
MCMPI_FN_(int, Startall, (int count, MPI_Request array_of_requests[]))
MCMPI_FN_(int, Grequest_start, (MPI_Grequest_query_function *query_fn, MPI_Grequest_free_function *free_fn,
                                MPI_Grequest_cancel_function *cancel_fn, void *extra_state, MPI_Request *request))
MCMPI_FN_(int, Grequest_complete, (MPI_Request request))
MCMPI_FN_(int, Status_set_cancelled, (MPI_Status *status, int flag))
MCMPI_FN_(int, Status_set_elements, (MPI_Status *status, MPI_Datatype datatype, int count))
MCMPI_FN_(int, Status_set_elements_x, (MPI_Status *status, MPI_Datatype datatype, MPI_Count count))
MCMPI_FN_(int, Status_get_source, (const MPI_Status *status, int *source))
MCMPI_FN_(int, Status_get_tag, (const MPI_Status *status, int *tag))
MCMPI_FN_(int, Status_get_error, (const MPI_Status *status, int *error))
MCMPI_FN_(int, Status_set_source, (MPI_Status *status, int source))
MCMPI_FN_(int, Status_set_tag, (MPI_Status *status, int tag))
MCMPI_FN_(int, Status_set_error, (MPI_Status *status, int error))

/* Datatypes. */
MCMPI_FN_(int, Type_contiguous, (int count, MPI_Datatype oldtype, MPI_Datatype *newtype))
MCMPI_FN_(int, Type_vector, (int count, int blocklength, int stride, MPI_Datatype oldtype, MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_hvector, (int count, int blocklength, MPI_Aint stride, MPI_Datatype oldtype,
                                     MPI_Datatype *newtype))
MCMPI_FN_(int, Type_indexed, (int count, const int array_of_blocklengths[], const int array_of_displacements[],
                              MPI_Datatype oldtype, MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_hindexed, (int count, const int array_of_blocklengths[],
                                      const MPI_Aint array_of_displacements[], MPI_Datatype oldtype,
                                      MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_indexed_block, (int count, int blocklength, const int array_of_displacements[],
                                           MPI_Datatype oldtype, MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_hindexed_block, (int count, int blocklength, const MPI_Aint array_of_displacements[],
                                            MPI_Datatype oldtype, MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_struct, (int count, const int array_of_blocklengths[],
                                    const MPI_Aint array_of_displacements[], const MPI_Datatype array_of_types[],
                                    MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_subarray, (int ndims, const int array_of_sizes[], const int array_of_subsizes[],
                                      const int array_of_starts[], int order, MPI_Datatype oldtype,
                                      MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_darray, (int size, int rank, int ndims, const int array_of_gsizes[],
                                    const int array_of_distribs[], const int array_of_dargs[],
                                    const int array_of_psizes[], int order, MPI_Datatype oldtype,
                                    MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_resized, (MPI_Datatype oldtype, MPI_Aint lb, MPI_Aint extent, MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_f90_real, (int p, int r, MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_f90_complex, (int p, int r, MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_f90_integer, (int r, MPI_Datatype *newtype))
MCMPI_FN_(int, Type_get_value_index, (MPI_Datatype value_type, MPI_Datatype index_type, MPI_Datatype *pair_type))
MCMPI_FN_(int, Type_match_size, (int typeclass, int size, MPI_Datatype *datatype))
MCMPI_FN_(int, Type_dup, (MPI_Datatype oldtype, MPI_Datatype *newtype))
MCMPI_FN_(int, Type_commit, (MPI_Datatype *datatype))
MCMPI_FN_(int, Type_free, (MPI_Datatype *datatype))
MCMPI_FN_(int, Type_size, (MPI_Datatype datatype, int *size))
MCMPI_FN_(int, Type_size_x, (MPI_Datatype datatype, MPI_Count *size))
MCMPI_FN_(int, Type_get_extent, (MPI_Datatype datatype, MPI_Aint *lb, MPI_Aint *extent))
MCMPI_FN_(int, Type_get_extent_x, (MPI_Datatype datatype, MPI_Count *lb, MPI_Count *extent))
MCMPI_FN_(int, Type_get_true_extent, (MPI_Datatype datatype, MPI_Aint *true_lb, MPI_Aint *true_extent))
MCMPI_FN_(int, Type_get_true_extent_x, (MPI_Datatype datatype, MPI_Count *true_lb, MPI_Count *true_extent))
MCMPI_FN_(int, Type_get_envelope, (MPI_Datatype datatype, int *num_integers, int *num_addresses,
                                   int *num_datatypes, int *combiner))
MCMPI_FN_(int, Type_get_contents, (MPI_Datatype datatype, int max_integers, int max_addresses, int max_datatypes,
                                   int array_of_integers[], MPI_Aint array_of_addresses[],
                                   MPI_Datatype array_of_datatypes[]))
MCMPI_FN_(int, Type_get_name, (MPI_Datatype datatype, char *type_name, int *resultlen))
MCMPI_FN_(int, Type_set_name, (MPI_Datatype datatype, const char *type_name))
MCMPI_FN_(int, Type_create_keyval, (MPI_Type_copy_attr_function *type_copy_attr_fn,
                                    MPI_Type_delete_attr_function *type_delete_attr_fn, int *type_keyval,
                                    void *extra_state))
MCMPI_FN_(int, Type_free_keyval, (int *type_keyval))
MCMPI_FN_(int, Type_set_attr, (MPI_Datatype datatype, int type_keyval, void *attribute_val))
MCMPI_FN_(int, Type_get_attr, (MPI_Datatype datatype, int type_keyval, void *attribute_val, int *flag))
MCMPI_FN_(int, Type_delete_attr, (MPI_Datatype datatype, int type_keyval))
MCMPI_FN_(int, Get_address, (const void *location, MPI_Aint *address))
MCMPI_FN_(MPI_Aint, Aint_add, (MPI_Aint base, MPI_Aint disp))
MCMPI_FN_(MPI_Aint, Aint_diff, (MPI_Aint addr1, MPI_Aint addr2))
MCMPI_FN_(int, Pack, (const void *inbuf, int incount, MPI_Datatype datatype, void *outbuf, int outsize,
                      int *position, MPI_Comm comm))
MCMPI_FN_(int, Unpack, (const void *inbuf, int insize, int *position, void *outbuf, int outcount,
                        MPI_Datatype datatype, MPI_Comm comm))
MCMPI_FN_(int, Pack_size, (int incount, MPI_Datatype datatype, MPI_Comm comm, int *size))
MCMPI_FN_(int, Pack_external, (const char datarep[], const void *inbuf, int incount, MPI_Datatype datatype,
                               void *outbuf, MPI_Aint outsize, MPI_Aint *position))
MCMPI_FN_(int, Unpack_external, (const char datarep[], const void *inbuf, MPI_Aint insize, MPI_Aint *position,
                                 void *outbuf, int outcount, MPI_Datatype datatype))
MCMPI_FN_(int, Pack_external_size, (const char datarep[], int incount, MPI_Datatype datatype, MPI_Aint *size))
MCMPI_FN_(int, Register_datarep, (const char *datarep, MPI_Datarep_conversion_function *read_conversion_fn,
                                  MPI_Datarep_conversion_function *write_conversion_fn,
                                  MPI_Datarep_extent_function *dtype_file_extent_fn, void *extra_state))

/* Collectives, each blocking, non-blocking and persistent. */
MCMPI_COLL_(Barrier, Ibarrier, MPI_Comm comm)
MCMPI_COLL_(Bcast, Ibcast, void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm)
MCMPI_COLL_(Gather, Igather, const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
            int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm)
MCMPI_COLL_(Gatherv, Igatherv, const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
            const int recvcounts[], const int displs[], MPI_Datatype recvtype, int root, MPI_Comm comm)
MCMPI_COLL_(Scatter, Iscatter, const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
            int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm)
MCMPI_COLL_(Scatterv, Iscatterv, const void *sendbuf, const int sendcounts[], const int displs[],
            MPI_Datatype sendtype, void *recvbuf, int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm)
MCMPI_COLL_(Allgather, Iallgather, const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
            int recvcount, MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_(Allgatherv, Iallgatherv, const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
            const int recvcounts[], const int displs[], MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_(Alltoall, Ialltoall, const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
            int recvcount, MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_(Alltoallv, Ialltoallv, const void *sendbuf, const int sendcounts[], const int sdispls[],
            MPI_Datatype sendtype, void *recvbuf, const int recvcounts[], const int rdispls[],
            MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_(Alltoallw, Ialltoallw, const void *sendbuf, const int sendcounts[], const int sdispls[],
            const MPI_Datatype sendtypes[], void *recvbuf, const int recvcounts[], const int rdispls[],
            const MPI_Datatype recvtypes[], MPI_Comm comm)
MCMPI_COLL_(Reduce, Ireduce, const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
            int root, MPI_Comm comm)
MCMPI_COLL_(Allreduce, Iallreduce, const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype,
            MPI_Op op, MPI_Comm comm)
MCMPI_COLL_(Reduce_scatter, Ireduce_scatter, const void *sendbuf, void *recvbuf, const int recvcounts[],
            MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)
MCMPI_COLL_(Reduce_scatter_block, Ireduce_scatter_block, const void *sendbuf, void *recvbuf, int recvcount,
            MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)
MCMPI_COLL_(Scan, Iscan, const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
            MPI_Comm comm)
MCMPI_COLL_(Exscan, Iexscan, const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
            MPI_Comm comm)
MCMPI_COLL_(Neighbor_allgather, Ineighbor_allgather, const void *sendbuf, int sendcount, MPI_Datatype sendtype,
            void *recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_(Neighbor_allgatherv, Ineighbor_allgatherv, const void *sendbuf, int sendcount, MPI_Datatype sendtype,
            void *recvbuf, const int recvcounts[], const int displs[], MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_(Neighbor_alltoall, Ineighbor_alltoall, const void *sendbuf, int sendcount, MPI_Datatype sendtype,
            void *recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_(Neighbor_alltoallv, Ineighbor_alltoallv, const void *sendbuf, const int sendcounts[],
            const int sdispls[], MPI_Datatype sendtype, void *recvbuf, const int recvcounts[],
            const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_(Neighbor_alltoallw, Ineighbor_alltoallw, const void *sendbuf, const int sendcounts[],
            const MPI_Aint sdispls[], const MPI_Datatype sendtypes[], void *recvbuf, const int recvcounts[],
            const MPI_Aint rdispls[], const MPI_Datatype recvtypes[], MPI_Comm comm)
MCMPI_FN_(int, Reduce_local, (const void *inbuf, void *inoutbuf, int count, MPI_Datatype datatype, MPI_Op op))
MCMPI_FN_(int, Op_create, (MPI_User_function *user_fn, int commute, MPI_Op *op))
MCMPI_FN_(int, Op_free, (MPI_Op *op))
MCMPI_FN_(int, Op_commutative, (MPI_Op op, int *commute))

/* Groups. */
MCMPI_FN_(int, Group_size, (MPI_Group group, int *size))
MCMPI_FN_(int, Group_rank, (MPI_Group group, int *rank))
MCMPI_FN_(int, Group_translate_ranks, (MPI_Group group1, int n, const int ranks1[], MPI_Group group2,
                                       int ranks2[]))
MCMPI_FN_(int, Group_compare, (MPI_Group group1, MPI_Group group2, int *result))
MCMPI_FN_(int, Group_union, (MPI_Group group1, MPI_Group group2, MPI_Group *newgroup))
MCMPI_FN_(int, Group_intersection, (MPI_Group group1, MPI_Group group2, MPI_Group *newgroup))
MCMPI_FN_(int, Group_difference, (MPI_Group group1, MPI_Group group2, MPI_Group *newgroup))
MCMPI_FN_(int, Group_incl, (MPI_Group group, int n, const int ranks[], MPI_Group *newgroup))
MCMPI_FN_(int, Group_excl, (MPI_Group group, int n, const int ranks[], MPI_Group *newgroup))
MCMPI_FN_(int, Group_range_incl, (MPI_Group group, int n, int ranges[][3], MPI_Group *newgroup))
MCMPI_FN_(int, Group_range_excl, (MPI_Group group, int n, int ranges[][3], MPI_Group *newgroup))
MCMPI_FN_(int, Group_free, (MPI_Group *group))
MCMPI_FN_(int, Group_from_session_pset, (MPI_Session session, const char *pset_name, MPI_Group *newgroup))

/* Communicators and their attributes. */
MCMPI_FN_(int, Comm_size, (MPI_Comm comm, int *size))
MCMPI_FN_(int, Comm_rank, (MPI_Comm comm, int *rank))
MCMPI_FN_(int, Comm_compare, (MPI_Comm comm1, MPI_Comm comm2, int *result))
MCMPI_FN_(int, Comm_group, (MPI_Comm comm, MPI_Group *group))
MCMPI_FN_(int, Comm_dup, (MPI_Comm comm, MPI_Comm *newcomm))
MCMPI_FN_(int, Comm_dup_with_info, (MPI_Comm comm, MPI_Info info, MPI_Comm *newcomm))
MCMPI_FN_(int, Comm_idup, (MPI_Comm comm, MPI_Comm *newcomm, MPI_Request *request))
MCMPI_FN_(int, Comm_idup_with_info, (MPI_Comm comm, MPI_Info info, MPI_Comm *newcomm, MPI_Request *request))
MCMPI_FN_(int, Comm_create, (MPI_Comm comm, MPI_Group group, MPI_Comm *newcomm))
MCMPI_FN_(int, Comm_create_group, (MPI_Comm comm, MPI_Group group, int tag, MPI_Comm *newcomm))
MCMPI_FN_(int, Comm_create_from_group, (MPI_Group group, const char *stringtag, MPI_Info info,
                                        MPI_Errhandler errhandler, MPI_Comm *newcomm))
MCMPI_FN_(int, Comm_split, (MPI_Comm comm, int color, int key, MPI_Comm *newcomm))
MCMPI_FN_(int, Comm_split_type, (MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm *newcomm))
MCMPI_FN_(int, Comm_free, (MPI_Comm *comm))
MCMPI_FN_(int, Comm_test_inter, (MPI_Comm comm, int *flag))
MCMPI_FN_(int, Comm_remote_size, (MPI_Comm comm, int *size))
MCMPI_FN_(int, Comm_remote_group, (MPI_Comm comm, MPI_Group *group))
MCMPI_FN_(int, Intercomm_create, (MPI_Comm local_comm, int local_leader, MPI_Comm peer_comm, int remote_leader,
                                  int tag, MPI_Comm *newintercomm))
MCMPI_FN_(int, Intercomm_create_from_groups, (MPI_Group local_group, int local_leader, MPI_Group remote_group,
                                              int remote_leader, const char *stringtag, MPI_Info info,
                                              MPI_Errhandler errhandler, MPI_Comm *newintercomm))
MCMPI_FN_(int, Intercomm_merge, (MPI_Comm intercomm, int high, MPI_Comm *newintracomm))
MCMPI_FN_(int, Comm_set_info, (MPI_Comm comm, MPI_Info info))
MCMPI_FN_(int, Comm_get_info, (MPI_Comm comm, MPI_Info *info_used))
MCMPI_FN_(int, Comm_set_name, (MPI_Comm comm, const char *comm_name))
MCMPI_FN_(int, Comm_get_name, (MPI_Comm comm, char *comm_name, int *resultlen))
MCMPI_FN_(int, Comm_create_keyval, (MPI_Comm_copy_attr_function *comm_copy_attr_fn,
                                    MPI_Comm_delete_attr_function *comm_delete_attr_fn, int *comm_keyval,
                                    void *extra_state))
MCMPI_FN_(int, Comm_free_keyval, (int *comm_keyval))
MCMPI_FN_(int, Comm_set_attr, (MPI_Comm comm, int comm_keyval, void *attribute_val))
MCMPI_FN_(int, Comm_get_attr, (MPI_Comm comm, int comm_keyval, void *attribute_val, int *flag))
MCMPI_FN_(int, Comm_delete_attr, (MPI_Comm comm, int comm_keyval))
MCMPI_FN_(int, Keyval_create, (MPI_Copy_function *copy_fn, MPI_Delete_function *delete_fn, int *keyval,
                               void *extra_state))
MCMPI_FN_(int, Keyval_free, (int *keyval))
MCMPI_FN_(int, Attr_put, (MPI_Comm comm, int keyval, void *attribute_val))
MCMPI_FN_(int, Attr_get, (MPI_Comm comm, int keyval, void *attribute_val, int *flag))
MCMPI_FN_(int, Attr_delete, (MPI_Comm comm, int keyval))

/* Virtual topologies. */
MCMPI_FN_(int, Dims_create, (int nnodes, int ndims, int dims[]))
MCMPI_FN_(int, Cart_create, (MPI_Comm comm_old, int ndims, const int dims[], const int periods[], int reorder,
                             MPI_Comm *comm_cart))
MCMPI_FN_(int, Cartdim_get, (MPI_Comm comm, int *ndims))
MCMPI_FN_(int, Cart_get, (MPI_Comm comm, int maxdims, int dims[], int periods[], int coords[]))
MCMPI_FN_(int, Cart_rank, (MPI_Comm comm, const int coords[], int *rank))
MCMPI_FN_(int, Cart_coords, (MPI_Comm comm, int rank, int maxdims, int coords[]))
MCMPI_FN_(int, Cart_shift, (MPI_Comm comm, int direction, int disp, int *rank_source, int *rank_dest))
MCMPI_FN_(int, Cart_sub, (MPI_Comm comm, const int remain_dims[], MPI_Comm *newcomm))
MCMPI_FN_(int, Cart_map, (MPI_Comm comm, int ndims, const int dims[], const int periods[], int *newrank))
MCMPI_FN_(int, Graph_create, (MPI_Comm comm_old, int nnodes, const int index[], const int edges[], int reorder,
                              MPI_Comm *comm_graph))
MCMPI_FN_(int, Graphdims_get, (MPI_Comm comm, int *nnodes, int *nedges))
MCMPI_FN_(int, Graph_get, (MPI_Comm comm, int maxindex, int maxedges, int index[], int edges[]))
MCMPI_FN_(int, Graph_neighbors_count, (MPI_Comm comm, int rank, int *nneighbors))
MCMPI_FN_(int, Graph_neighbors, (MPI_Comm comm, int rank, int maxneighbors, int neighbors[]))
MCMPI_FN_(int, Graph_map, (MPI_Comm comm, int nnodes, const int index[], const int edges[], int *newrank))
MCMPI_FN_(int, Topo_test, (MPI_Comm comm, int *status))
MCMPI_FN_(int, Dist_graph_create_adjacent, (MPI_Comm comm_old, int indegree, const int sources[],
                                            const int sourceweights[], int outdegree, const int destinations[],
                                            const int destweights[], MPI_Info info, int reorder,
                                            MPI_Comm *comm_dist_graph))
MCMPI_FN_(int, Dist_graph_create, (MPI_Comm comm_old, int n, const int sources[], const int degrees[],
                                   const int destinations[], const int weights[], MPI_Info info, int reorder,
                                   MPI_Comm *comm_dist_graph))
MCMPI_FN_(int, Dist_graph_neighbors_count, (MPI_Comm comm, int *indegree, int *outdegree, int *weighted))
MCMPI_FN_(int, Dist_graph_neighbors, (MPI_Comm comm, int maxindegree, int sources[], int sourceweights[],
                                      int maxoutdegree, int destinations[], int destweights[]))

/* Errors and error handlers. */
MCMPI_FN_(int, Error_class, (int errorcode, int *errorclass))
MCMPI_FN_(int, Error_string, (int errorcode, char *string, int *resultlen))
MCMPI_FN_(int, Add_error_class, (int *errorclass))
MCMPI_FN_(int, Add_error_code, (int errorclass, int *errorcode))
MCMPI_FN_(int, Add_error_string, (int errorcode, const char *string))
MCMPI_FN_(int, Remove_error_class, (int errorclass))
MCMPI_FN_(int, Remove_error_code, (int errorcode))
MCMPI_FN_(int, Remove_error_string, (int errorcode))
MCMPI_FN_(int, Errhandler_free, (MPI_Errhandler *errhandler))
MCMPI_FN_(int, Comm_create_errhandler, (MPI_Comm_errhandler_function *comm_errhandler_fn,
                                        MPI_Errhandler *errhandler))
MCMPI_FN_(int, Comm_set_errhandler, (MPI_Comm comm, MPI_Errhandler errhandler))
MCMPI_FN_(int, Comm_get_errhandler, (MPI_Comm comm, MPI_Errhandler *errhandler))
MCMPI_FN_(int, Comm_call_errhandler, (MPI_Comm comm, int errorcode))
MCMPI_FN_(int, Win_create_errhandler, (MPI_Win_errhandler_function *win_errhandler_fn,
                                       MPI_Errhandler *errhandler))
MCMPI_FN_(int, Win_set_errhandler, (MPI_Win win, MPI_Errhandler errhandler))
MCMPI_FN_(int, Win_get_errhandler, (MPI_Win win, MPI_Errhandler *errhandler))
MCMPI_FN_(int, Win_call_errhandler, (MPI_Win win, int errorcode))
MCMPI_FN_(int, File_create_errhandler, (MPI_File_errhandler_function *file_errhandler_fn,
                                        MPI_Errhandler *errhandler))
MCMPI_FN_(int, File_set_errhandler, (MPI_File file, MPI_Errhandler errhandler))
MCMPI_FN_(int, File_get_errhandler, (MPI_File file, MPI_Errhandler *errhandler))
MCMPI_FN_(int, File_call_errhandler, (MPI_File fh, int errorcode))
MCMPI_FN_(int, Session_create_errhandler, (MPI_Session_errhandler_function *session_errhandler_fn,
                                           MPI_Errhandler *errhandler))
MCMPI_FN_(int, Session_set_errhandler, (MPI_Session session, MPI_Errhandler errhandler))
MCMPI_FN_(int, Session_get_errhandler, (MPI_Session session, MPI_Errhandler *errhandler))
MCMPI_FN_(int, Session_call_errhandler, (MPI_Session session, int errorcode))

/* Info objects. */
MCMPI_FN_(int, Info_create, (MPI_Info *info))
MCMPI_FN_(int, Info_create_env, (int argc, char *argv[], MPI_Info *info))
MCMPI_FN_(int, Info_set, (MPI_Info info, const char *key, const char *value))
MCMPI_FN_(int, Info_delete, (MPI_Info info, const char *key))
MCMPI_FN_(int, Info_get, (MPI_Info info, const char *key, int valuelen, char *value, int *flag))
MCMPI_FN_(int, Info_get_string, (MPI_Info info, const char *key, int *buflen, char *value, int *flag))
MCMPI_FN_(int, Info_get_valuelen, (MPI_Info info, const char *key, int *valuelen, int *flag))
MCMPI_FN_(int, Info_get_nkeys, (MPI_Info info, int *nkeys))
MCMPI_FN_(int, Info_get_nthkey, (MPI_Info info, int n, char *key))
MCMPI_FN_(int, Info_dup, (MPI_Info info, MPI_Info *newinfo))
MCMPI_FN_(int, Info_free, (MPI_Info *info))

/* Sessions. */
MCMPI_FN_(int, Session_init, (MPI_Info info, MPI_Errhandler errhandler, MPI_Session *session))
MCMPI_FN_(int, Session_finalize, (MPI_Session *session))
MCMPI_FN_(int, Session_get_num_psets, (MPI_Session session, MPI_Info info, int *npset_names))
MCMPI_FN_(int, Session_get_nth_pset, (MPI_Session session, MPI_Info info, int n, int *pset_len, char *pset_name))
MCMPI_FN_(int, Session_get_info, (MPI_Session session, MPI_Info *info_used))
MCMPI_FN_(int, Session_get_pset_info, (MPI_Session session, const char *pset_name, MPI_Info *info))

/* Process creation and connection. */
MCMPI_FN_(int, Comm_spawn, (const char *command, char *argv[], int maxprocs, MPI_Info info, int root,
                            MPI_Comm comm, MPI_Comm *intercomm, int array_of_errcodes[]))
MCMPI_FN_(int, Comm_spawn_multiple, (int count, char *array_of_commands[], char **array_of_argv[],
                                     const int array_of_maxprocs[], const MPI_Info array_of_info[], int root,
                                     MPI_Comm comm, MPI_Comm *intercomm, int array_of_errcodes[]))
MCMPI_FN_(int, Comm_get_parent, (MPI_Comm *parent))
MCMPI_FN_(int, Open_port, (MPI_Info info, char *port_name))
MCMPI_FN_(int, Close_port, (const char *port_name))
MCMPI_FN_(int, Comm_accept, (const char *port_name, MPI_Info info, int root, MPI_Comm comm, MPI_Comm *newcomm))
MCMPI_FN_(int, Comm_connect, (const char *port_name, MPI_Info info, int root, MPI_Comm comm, MPI_Comm *newcomm))
MCMPI_FN_(int, Publish_name, (const char *service_name, MPI_Info info, const char *port_name))
MCMPI_FN_(int, Unpublish_name, (const char *service_name, MPI_Info info, const char *port_name))
MCMPI_FN_(int, Lookup_name, (const char *service_name, MPI_Info info, char *port_name))
MCMPI_FN_(int, Comm_disconnect, (MPI_Comm *comm))
MCMPI_FN_(int, Comm_join, (int fd, MPI_Comm *intercomm))

/* One-sided communication. */
MCMPI_FN_(int, Win_create, (void *base, MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm,
                            MPI_Win *win))
MCMPI_FN_(int, Win_allocate, (MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm, void *baseptr,
                              MPI_Win *win))
MCMPI_FN_(int, Win_allocate_shared, (MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm, void *baseptr,
                                     MPI_Win *win))
MCMPI_FN_(int, Win_shared_query, (MPI_Win win, int rank, MPI_Aint *size, int *disp_unit, void *baseptr))
MCMPI_FN_(int, Win_create_dynamic, (MPI_Info info, MPI_Comm comm, MPI_Win *win))
MCMPI_FN_(int, Win_attach, (MPI_Win win, void *base, MPI_Aint size))
MCMPI_FN_(int, Win_detach, (MPI_Win win, const void *base))
MCMPI_FN_(int, Win_free, (MPI_Win *win))
MCMPI_FN_(int, Win_get_group, (MPI_Win win, MPI_Group *group))
MCMPI_FN_(int, Win_set_info, (MPI_Win win, MPI_Info info))
MCMPI_FN_(int, Win_get_info, (MPI_Win win, MPI_Info *info_used))
MCMPI_FN_(int, Win_set_name, (MPI_Win win, const char *win_name))
MCMPI_FN_(int, Win_get_name, (MPI_Win win, char *win_name, int *resultlen))
MCMPI_FN_(int, Win_create_keyval, (MPI_Win_copy_attr_function *win_copy_attr_fn,
                                   MPI_Win_delete_attr_function *win_delete_attr_fn, int *win_keyval,
                                   void *extra_state))
MCMPI_FN_(int, Win_free_keyval, (int *win_keyval))
MCMPI_FN_(int, Win_set_attr, (MPI_Win win, int win_keyval, void *attribute_val))
MCMPI_FN_(int, Win_get_attr, (MPI_Win win, int win_keyval, void *attribute_val, int *flag))
MCMPI_FN_(int, Win_delete_attr, (MPI_Win win, int win_keyval))
MCMPI_FN_(int, Put, (const void *origin_addr, int origin_count, MPI_Datatype origin_datatype, int target_rank,
                     MPI_Aint target_disp, int target_count, MPI_Datatype target_datatype, MPI_Win win))
MCMPI_FN_(int, Get, (void *origin_addr, int origin_count, MPI_Datatype origin_datatype, int target_rank,
                     MPI_Aint target_disp, int target_count, MPI_Datatype target_datatype, MPI_Win win))
MCMPI_FN_(int, Accumulate, (const void *origin_addr, int origin_count, MPI_Datatype origin_datatype,
                            int target_rank, MPI_Aint target_disp, int target_count,
                            MPI_Datatype target_datatype, MPI_Op op, MPI_Win win))
MCMPI_FN_(int, Get_accumulate, (const void *origin_addr, int origin_count, MPI_Datatype origin_datatype,
                                void *result_addr, int result_count, MPI_Datatype result_datatype,
                                int target_rank, MPI_Aint target_disp, int target_count,
                                MPI_Datatype target_datatype, MPI_Op op, MPI_Win win))
MCMPI_FN_(int, Fetch_and_op, (const void *origin_addr, void *result_addr, MPI_Datatype datatype, int target_rank,
                              MPI_Aint target_disp, MPI_Op op, MPI_Win win))
MCMPI_FN_(int, Compare_and_swap, (const void *origin_addr, const void *compare_addr, void *result_addr,
                                  MPI_Datatype datatype, int target_rank, MPI_Aint target_disp, MPI_Win win))
MCMPI_FN_(int, Rput, (const void *origin_addr, int origin_count, MPI_Datatype origin_datatype, int target_rank,
                      MPI_Aint target_disp, int target_count, MPI_Datatype target_datatype, MPI_Win win,
                      MPI_Request *request))
MCMPI_FN_(int, Rget, (void *origin_addr, int origin_count, MPI_Datatype origin_datatype, int target_rank,
                      MPI_Aint target_disp, int target_count, MPI_Datatype target_datatype, MPI_Win win,
                      MPI_Request *request))
MCMPI_FN_(int, Raccumulate, (const void *origin_addr, int origin_count, MPI_Datatype origin_datatype,
                             int target_rank, MPI_Aint target_disp, int target_count,
                             MPI_Datatype target_datatype, MPI_Op op, MPI_Win win, MPI_Request *request))
MCMPI_FN_(int, Rget_accumulate, (const void *origin_addr, int origin_count, MPI_Datatype origin_datatype,
                                 void *result_addr, int result_count, MPI_Datatype result_datatype,
                                 int target_rank, MPI_Aint target_disp, int target_count,
                                 MPI_Datatype target_datatype, MPI_Op op, MPI_Win win, MPI_Request *request))
MCMPI_FN_(int, Win_fence, (int assert, MPI_Win win))
MCMPI_FN_(int, Win_start, (MPI_Group group, int assert, MPI_Win win))
MCMPI_FN_(int, Win_complete, (MPI_Win win))
MCMPI_FN_(int, Win_post, (MPI_Group group, int assert, MPI_Win win))
MCMPI_FN_(int, Win_wait, (MPI_Win win))
MCMPI_FN_(int, Win_test, (MPI_Win win, int *flag))
MCMPI_FN_(int, Win_lock, (int lock_type, int rank, int assert, MPI_Win win))
MCMPI_FN_(int, Win_lock_all, (int assert, MPI_Win win))
MCMPI_FN_(int, Win_unlock, (int rank, MPI_Win win))
MCMPI_FN_(int, Win_unlock_all, (MPI_Win win))
MCMPI_FN_(int, Win_flush, (int rank, MPI_Win win))
MCMPI_FN_(int, Win_flush_all, (MPI_Win win))
MCMPI_FN_(int, Win_flush_local, (int rank, MPI_Win win))
MCMPI_FN_(int, Win_flush_local_all, (MPI_Win win))
MCMPI_FN_(int, Win_sync, (MPI_Win win))

/* Large counts: the _c forms take MPI_Count counts and MPI_Aint
 * displacement arrays where the forms above take int. */
#define MCMPI_COLL_C_(name, iname, ...)                                   \
    MCMPI_FN_(int, name##_c, (__VA_ARGS__))                               \
    MCMPI_FN_(int, iname##_c, (__VA_ARGS__, MPI_Request *request))        \
    MCMPI_FN_(int, name##_init_c, (__VA_ARGS__, MPI_Info info, MPI_Request *request))

MCMPI_FN_(int, Send_c, (const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm))
MCMPI_FN_(int, Bsend_c, (const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm))
MCMPI_FN_(int, Ssend_c, (const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm))
MCMPI_FN_(int, Rsend_c, (const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm))
MCMPI_FN_(int, Recv_c, (void *buf, MPI_Count count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
                        MPI_Status *status))
MCMPI_FN_(int, Isend_c, (const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                         MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Ibsend_c, (const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                          MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Issend_c, (const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                          MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Irsend_c, (const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                          MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Irecv_c, (void *buf, MPI_Count count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
                         MPI_Request *request))
MCMPI_FN_(int, Send_init_c, (const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                             MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Bsend_init_c, (const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                              MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Ssend_init_c, (const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                              MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Rsend_init_c, (const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                              MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Recv_init_c, (void *buf, MPI_Count count, MPI_Datatype datatype, int source, int tag,
                             MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Sendrecv_c, (const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype, int dest,
                            int sendtag, void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, int source,
                            int recvtag, MPI_Comm comm, MPI_Status *status))
MCMPI_FN_(int, Sendrecv_replace_c, (void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int sendtag,
                                    int source, int recvtag, MPI_Comm comm, MPI_Status *status))
MCMPI_FN_(int, Isendrecv_c, (const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype, int dest,
                             int sendtag, void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, int source,
                             int recvtag, MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Isendrecv_replace_c, (void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int sendtag,
                                     int source, int recvtag, MPI_Comm comm, MPI_Request *request))
MCMPI_FN_(int, Mrecv_c, (void *buf, MPI_Count count, MPI_Datatype datatype, MPI_Message *message,
                         MPI_Status *status))
MCMPI_FN_(int, Imrecv_c, (void *buf, MPI_Count count, MPI_Datatype datatype, MPI_Message *message,
                          MPI_Request *request))
MCMPI_FN_(int, Get_count_c, (const MPI_Status *status, MPI_Datatype datatype, MPI_Count *count))
MCMPI_FN_(int, Get_elements_c, (const MPI_Status *status, MPI_Datatype datatype, MPI_Count *count))
MCMPI_FN_(int, Status_set_elements_c, (MPI_Status *status, MPI_Datatype datatype, MPI_Count count))
MCMPI_FN_(int, Buffer_attach_c, (void *buffer, MPI_Count size))
MCMPI_FN_(int, Buffer_detach_c, (void *buffer_addr, MPI_Count *size))
MCMPI_FN_(int, Comm_attach_buffer_c, (MPI_Comm comm, void *buffer, MPI_Count size))
MCMPI_FN_(int, Comm_detach_buffer_c, (MPI_Comm comm, void *buffer_addr, MPI_Count *size))
MCMPI_FN_(int, Session_attach_buffer_c, (MPI_Session session, void *buffer, MPI_Count size))
MCMPI_FN_(int, Session_detach_buffer_c, (MPI_Session session, void *buffer_addr, MPI_Count *size))

MCMPI_COLL_C_(Bcast, Ibcast, void *buffer, MPI_Count count, MPI_Datatype datatype, int root, MPI_Comm comm)
MCMPI_COLL_C_(Gather, Igather, const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype, void *recvbuf,
              MPI_Count recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm)
MCMPI_COLL_C_(Gatherv, Igatherv, const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype, void *recvbuf,
              const MPI_Count recvcounts[], const MPI_Aint displs[], MPI_Datatype recvtype, int root,
              MPI_Comm comm)
MCMPI_COLL_C_(Scatter, Iscatter, const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype, void *recvbuf,
              MPI_Count recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm)
MCMPI_COLL_C_(Scatterv, Iscatterv, const void *sendbuf, const MPI_Count sendcounts[], const MPI_Aint displs[],
              MPI_Datatype sendtype, void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, int root,
              MPI_Comm comm)
MCMPI_COLL_C_(Allgather, Iallgather, const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
              void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_C_(Allgatherv, Iallgatherv, const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
              void *recvbuf, const MPI_Count recvcounts[], const MPI_Aint displs[], MPI_Datatype recvtype,
              MPI_Comm comm)
MCMPI_COLL_C_(Alltoall, Ialltoall, const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
              void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_C_(Alltoallv, Ialltoallv, const void *sendbuf, const MPI_Count sendcounts[], const MPI_Aint sdispls[],
              MPI_Datatype sendtype, void *recvbuf, const MPI_Count recvcounts[], const MPI_Aint rdispls[],
              MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_C_(Alltoallw, Ialltoallw, const void *sendbuf, const MPI_Count sendcounts[], const MPI_Aint sdispls[],
              const MPI_Datatype sendtypes[], void *recvbuf, const MPI_Count recvcounts[],
              const MPI_Aint rdispls[], const MPI_Datatype recvtypes[], MPI_Comm comm)
MCMPI_COLL_C_(Reduce, Ireduce, const void *sendbuf, void *recvbuf, MPI_Count count, MPI_Datatype datatype,
              MPI_Op op, int root, MPI_Comm comm)
MCMPI_COLL_C_(Allreduce, Iallreduce, const void *sendbuf, void *recvbuf, MPI_Count count, MPI_Datatype datatype,
              MPI_Op op, MPI_Comm comm)
MCMPI_COLL_C_(Reduce_scatter, Ireduce_scatter, const void *sendbuf, void *recvbuf, const MPI_Count recvcounts[],
              MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)
MCMPI_COLL_C_(Reduce_scatter_block, Ireduce_scatter_block, const void *sendbuf, void *recvbuf,
              MPI_Count recvcount, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)
MCMPI_COLL_C_(Scan, Iscan, const void *sendbuf, void *recvbuf, MPI_Count count, MPI_Datatype datatype, MPI_Op op,
              MPI_Comm comm)
MCMPI_COLL_C_(Exscan, Iexscan, const void *sendbuf, void *recvbuf, MPI_Count count, MPI_Datatype datatype,
              MPI_Op op, MPI_Comm comm)
MCMPI_COLL_C_(Neighbor_allgather, Ineighbor_allgather, const void *sendbuf, MPI_Count sendcount,
              MPI_Datatype sendtype, void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_C_(Neighbor_allgatherv, Ineighbor_allgatherv, const void *sendbuf, MPI_Count sendcount,
              MPI_Datatype sendtype, void *recvbuf, const MPI_Count recvcounts[], const MPI_Aint displs[],
              MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_C_(Neighbor_alltoall, Ineighbor_alltoall, const void *sendbuf, MPI_Count sendcount,
              MPI_Datatype sendtype, void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_C_(Neighbor_alltoallv, Ineighbor_alltoallv, const void *sendbuf, const MPI_Count sendcounts[],
              const MPI_Aint sdispls[], MPI_Datatype sendtype, void *recvbuf, const MPI_Count recvcounts[],
              const MPI_Aint rdispls[], MPI_Datatype recvtype, MPI_Comm comm)
MCMPI_COLL_C_(Neighbor_alltoallw, Ineighbor_alltoallw, const void *sendbuf, const MPI_Count sendcounts[],
              const MPI_Aint sdispls[], const MPI_Datatype sendtypes[], void *recvbuf,
              const MPI_Count recvcounts[], const MPI_Aint rdispls[], const MPI_Datatype recvtypes[],
              MPI_Comm comm)
MCMPI_FN_(int, Reduce_local_c, (const void *inbuf, void *inoutbuf, MPI_Count count, MPI_Datatype datatype,
                                MPI_Op op))
MCMPI_FN_(int, Op_create_c, (MPI_User_function_c *user_fn, int commute, MPI_Op *op))

MCMPI_FN_(int, Type_contiguous_c, (MPI_Count count, MPI_Datatype oldtype, MPI_Datatype *newtype))
MCMPI_FN_(int, Type_vector_c, (MPI_Count count, MPI_Count blocklength, MPI_Count stride, MPI_Datatype oldtype,
                               MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_hvector_c, (MPI_Count count, MPI_Count blocklength, MPI_Count stride,
                                       MPI_Datatype oldtype, MPI_Datatype *newtype))
MCMPI_FN_(int, Type_indexed_c, (MPI_Count count, const MPI_Count array_of_blocklengths[],
                                const MPI_Count array_of_displacements[], MPI_Datatype oldtype,
                                MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_hindexed_c, (MPI_Count count, const MPI_Count array_of_blocklengths[],
                                        const MPI_Count array_of_displacements[], MPI_Datatype oldtype,
                                        MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_indexed_block_c, (MPI_Count count, MPI_Count blocklength,
                                             const MPI_Count array_of_displacements[], MPI_Datatype oldtype,
                                             MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_hindexed_block_c, (MPI_Count count, MPI_Count blocklength,
                                              const MPI_Count array_of_displacements[], MPI_Datatype oldtype,
                                              MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_struct_c, (MPI_Count count, const MPI_Count array_of_blocklengths[],
                                      const MPI_Count array_of_displacements[],
                                      const MPI_Datatype array_of_types[], MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_subarray_c, (int ndims, const MPI_Count array_of_sizes[],
                                        const MPI_Count array_of_subsizes[], const MPI_Count array_of_starts[],
                                        int order, MPI_Datatype oldtype, MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_darray_c, (int size, int rank, int ndims, const MPI_Count array_of_gsizes[],
                                      const int array_of_distribs[], const int array_of_dargs[],
                                      const int array_of_psizes[], int order, MPI_Datatype oldtype,
                                      MPI_Datatype *newtype))
MCMPI_FN_(int, Type_create_resized_c, (MPI_Datatype oldtype, MPI_Count lb, MPI_Count extent,
                                       MPI_Datatype *newtype))
MCMPI_FN_(int, Type_size_c, (MPI_Datatype datatype, MPI_Count *size))
MCMPI_FN_(int, Type_get_extent_c, (MPI_Datatype datatype, MPI_Count *lb, MPI_Count *extent))
MCMPI_FN_(int, Type_get_true_extent_c, (MPI_Datatype datatype, MPI_Count *true_lb, MPI_Count *true_extent))
MCMPI_FN_(int, Type_get_envelope_c, (MPI_Datatype datatype, MPI_Count *num_integers, MPI_Count *num_addresses,
                                     MPI_Count *num_large_counts, MPI_Count *num_datatypes, int *combiner))
MCMPI_FN_(int, Type_get_contents_c, (MPI_Datatype datatype, MPI_Count max_integers, MPI_Count max_addresses,
                                     MPI_Count max_large_counts, MPI_Count max_datatypes, int array_of_integers[],
                                     MPI_Aint array_of_addresses[], MPI_Count array_of_large_counts[],
                                     MPI_Datatype array_of_datatypes[]))
MCMPI_FN_(int, Pack_c, (const void *inbuf, MPI_Count incount, MPI_Datatype datatype, void *outbuf,
                        MPI_Count outsize, MPI_Count *position, MPI_Comm comm))
MCMPI_FN_(int, Unpack_c, (const void *inbuf, MPI_Count insize, MPI_Count *position, void *outbuf,
                          MPI_Count outcount, MPI_Datatype datatype, MPI_Comm comm))
MCMPI_FN_(int, Pack_size_c, (MPI_Count incount, MPI_Datatype datatype, MPI_Comm comm, MPI_Count *size))
MCMPI_FN_(int, Pack_external_c, (const char datarep[], const void *inbuf, MPI_Count incount, MPI_Datatype datatype,
                                 void *outbuf, MPI_Count outsize, MPI_Count *position))
MCMPI_FN_(int, Unpack_external_c, (const char datarep[], const void *inbuf, MPI_Count insize, MPI_Count *position,
                                   void *outbuf, MPI_Count outcount, MPI_Datatype datatype))
MCMPI_FN_(int, Pack_external_size_c, (const char datarep[], MPI_Count incount, MPI_Datatype datatype,
                                      MPI_Count *size))
MCMPI_FN_(int, Register_datarep_c, (const char *datarep, MPI_Datarep_conversion_function_c *read_conversion_fn,
                                    MPI_Datarep_conversion_function_c *write_conversion_fn,
                                    MPI_Datarep_extent_function *dtype_file_extent_fn, void *extra_state))

MCMPI_FN_(int, Win_create_c, (void *base, MPI_Aint size, MPI_Aint disp_unit, MPI_Info info, MPI_Comm comm,
                              MPI_Win *win))
MCMPI_FN_(int, Win_allocate_c, (MPI_Aint size, MPI_Aint disp_unit, MPI_Info info, MPI_Comm comm, void *baseptr,
                                MPI_Win *win))
MCMPI_FN_(int, Win_allocate_shared_c, (MPI_Aint size, MPI_Aint disp_unit, MPI_Info info, MPI_Comm comm,
                                       void *baseptr, MPI_Win *win))
MCMPI_FN_(int, Win_shared_query_c, (MPI_Win win, int rank, MPI_Aint *size, MPI_Aint *disp_unit, void *baseptr))
MCMPI_FN_(int, Put_c, (const void *origin_addr, MPI_Count origin_count, MPI_Datatype origin_datatype,
                       int target_rank, MPI_Aint target_disp, MPI_Count target_count,
                       MPI_Datatype target_datatype, MPI_Win win))
MCMPI_FN_(int, Get_c, (void *origin_addr, MPI_Count origin_count, MPI_Datatype origin_datatype, int target_rank,
                       MPI_Aint target_disp, MPI_Count target_count, MPI_Datatype target_datatype, MPI_Win win))
MCMPI_FN_(int, Accumulate_c, (const void *origin_addr, MPI_Count origin_count, MPI_Datatype origin_datatype,
                              int target_rank, MPI_Aint target_disp, MPI_Count target_count,
                              MPI_Datatype target_datatype, MPI_Op op, MPI_Win win))
MCMPI_FN_(int, Get_accumulate_c, (const void *origin_addr, MPI_Count origin_count, MPI_Datatype origin_datatype,
                                  void *result_addr, MPI_Count result_count, MPI_Datatype result_datatype,
                                  int target_rank, MPI_Aint target_disp, MPI_Count target_count,
                                  MPI_Datatype target_datatype, MPI_Op op, MPI_Win win))
MCMPI_FN_(int, Rput_c, (const void *origin_addr, MPI_Count origin_count, MPI_Datatype origin_datatype,
                        int target_rank, MPI_Aint target_disp, MPI_Count target_count,
                        MPI_Datatype target_datatype, MPI_Win win, MPI_Request *request))
MCMPI_FN_(int, Rget_c, (void *origin_addr, MPI_Count origin_count, MPI_Datatype origin_datatype, int target_rank,
                        MPI_Aint target_disp, MPI_Count target_count, MPI_Datatype target_datatype, MPI_Win win,
                        MPI_Request *request))
MCMPI_FN_(int, Raccumulate_c, (const void *origin_addr, MPI_Count origin_count, MPI_Datatype origin_datatype,
                               int target_rank, MPI_Aint target_disp, MPI_Count target_count,
                               MPI_Datatype target_datatype, MPI_Op op, MPI_Win win, MPI_Request *request))
MCMPI_FN_(int, Rget_accumulate_c, (const void *origin_addr, MPI_Count origin_count,
                                   MPI_Datatype origin_datatype, void *result_addr, MPI_Count result_count,
                                   MPI_Datatype result_datatype, int target_rank, MPI_Aint target_disp,
                                   MPI_Count target_count, MPI_Datatype target_datatype, MPI_Op op, MPI_Win win,
                                   MPI_Request *request))

/* Files (MPI-IO). Data access comes with int and MPI_Count counts: */
/* MCMPI_IO_(X, head, buf, tail): MPI_File_X and MPI_File_X_c as
 * (MPI_File fh, head buf, count, MPI_Datatype datatype, tail). */
#define MCMPI_IO_(name, head, buf, tail)                                                    \
    MCMPI_FN_(int, File_##name, (MPI_File fh, head buf, int count, MPI_Datatype datatype tail)) \
    MCMPI_FN_(int, File_##name##_c, (MPI_File fh, head buf, MPI_Count count, MPI_Datatype datatype tail))
#define MCMPI_AT_ MPI_Offset offset,
#define MCMPI_STATUS_ , MPI_Status *status
#define MCMPI_REQUEST_ , MPI_Request *request
MCMPI_FN_(int, File_open, (MPI_Comm comm, const char *filename, int amode, MPI_Info info, MPI_File *fh))
MCMPI_FN_(int, File_close, (MPI_File *fh))
MCMPI_FN_(int, File_delete, (const char *filename, MPI_Info info))
MCMPI_FN_(int, File_set_size, (MPI_File fh, MPI_Offset size))
MCMPI_FN_(int, File_preallocate, (MPI_File fh, MPI_Offset size))
MCMPI_FN_(int, File_get_size, (MPI_File fh, MPI_Offset *size))
MCMPI_FN_(int, File_get_group, (MPI_File fh, MPI_Group *group))
MCMPI_FN_(int, File_get_amode, (MPI_File fh, int *amode))
MCMPI_FN_(int, File_set_info, (MPI_File fh, MPI_Info info))
MCMPI_FN_(int, File_get_info, (MPI_File fh, MPI_Info *info_used))
MCMPI_FN_(int, File_set_view, (MPI_File fh, MPI_Offset disp, MPI_Datatype etype, MPI_Datatype filetype,
                               const char *datarep, MPI_Info info))
MCMPI_FN_(int, File_get_view, (MPI_File fh, MPI_Offset *disp, MPI_Datatype *etype, MPI_Datatype *filetype,
                               char *datarep))
MCMPI_IO_(read, , void *buf, MCMPI_STATUS_)
MCMPI_IO_(read_all, , void *buf, MCMPI_STATUS_)
MCMPI_IO_(read_shared, , void *buf, MCMPI_STATUS_)
MCMPI_IO_(read_ordered, , void *buf, MCMPI_STATUS_)
MCMPI_IO_(read_at, MCMPI_AT_, void *buf, MCMPI_STATUS_)
MCMPI_IO_(read_at_all, MCMPI_AT_, void *buf, MCMPI_STATUS_)
MCMPI_IO_(write, , const void *buf, MCMPI_STATUS_)
MCMPI_IO_(write_all, , const void *buf, MCMPI_STATUS_)
MCMPI_IO_(write_shared, , const void *buf, MCMPI_STATUS_)
MCMPI_IO_(write_ordered, , const void *buf, MCMPI_STATUS_)
MCMPI_IO_(write_at, MCMPI_AT_, const void *buf, MCMPI_STATUS_)
MCMPI_IO_(write_at_all, MCMPI_AT_, const void *buf, MCMPI_STATUS_)
MCMPI_IO_(iread, , void *buf, MCMPI_REQUEST_)
MCMPI_IO_(iread_all, , void *buf, MCMPI_REQUEST_)
MCMPI_IO_(iread_shared, , void *buf, MCMPI_REQUEST_)
MCMPI_IO_(iread_at, MCMPI_AT_, void *buf, MCMPI_REQUEST_)
MCMPI_IO_(iread_at_all, MCMPI_AT_, void *buf, MCMPI_REQUEST_)
MCMPI_IO_(iwrite, , const void *buf, MCMPI_REQUEST_)
MCMPI_IO_(iwrite_all, , const void *buf, MCMPI_REQUEST_)
MCMPI_IO_(iwrite_shared, , const void *buf, MCMPI_REQUEST_)
MCMPI_IO_(iwrite_at, MCMPI_AT_, const void *buf, MCMPI_REQUEST_)
MCMPI_IO_(iwrite_at_all, MCMPI_AT_, const void *buf, MCMPI_REQUEST_)
/* split collectives: X_begin (with a count) and X_end */
MCMPI_IO_(read_all_begin, , void *buf, )
MCMPI_IO_(read_at_all_begin, MCMPI_AT_, void *buf, )
MCMPI_IO_(read_ordered_begin, , void *buf, )
MCMPI_IO_(write_all_begin, , const void *buf, )
MCMPI_IO_(write_at_all_begin, MCMPI_AT_, const void *buf, )
MCMPI_IO_(write_ordered_begin, , const void *buf, )
MCMPI_FN_(int, File_read_all_end, (MPI_File fh, void *buf, MPI_Status *status))
MCMPI_FN_(int, File_read_at_all_end, (MPI_File fh, void *buf, MPI_Status *status))
MCMPI_FN_(int, File_read_ordered_end, (MPI_File fh, void *buf, MPI_Status *status))
MCMPI_FN_(int, File_write_all_end, (MPI_File fh, const void *buf, MPI_Status *status))
MCMPI_FN_(int, File_write_at_all_end, (MPI_File fh, const void *buf, MPI_Status *status))
MCMPI_FN_(int, File_write_ordered_end, (MPI_File fh, const void *buf, MPI_Status *status))
MCMPI_FN_(int, File_seek, (MPI_File fh, MPI_Offset offset, int whence))
MCMPI_FN_(int, File_seek_shared, (MPI_File fh, MPI_Offset offset, int whence))
MCMPI_FN_(int, File_get_position, (MPI_File fh, MPI_Offset *offset))
MCMPI_FN_(int, File_get_position_shared, (MPI_File fh, MPI_Offset *offset))
MCMPI_FN_(int, File_get_byte_offset, (MPI_File fh, MPI_Offset offset, MPI_Offset *disp))
MCMPI_FN_(int, File_get_type_extent, (MPI_File fh, MPI_Datatype datatype, MPI_Aint *extent))
MCMPI_FN_(int, File_get_type_extent_c, (MPI_File fh, MPI_Datatype datatype, MPI_Count *extent))
MCMPI_FN_(int, File_set_atomicity, (MPI_File fh, int flag))
MCMPI_FN_(int, File_get_atomicity, (MPI_File fh, int *flag))
MCMPI_FN_(int, File_sync, (MPI_File fh))

/* The tool interface. */
MCMPI_FN_(int, T_init_thread, (int required, int *provided))
MCMPI_FN_(int, T_finalize, (void))
MCMPI_FN_(int, T_enum_get_info, (MPI_T_enum enumtype, int *num, char *name, int *name_len))
MCMPI_FN_(int, T_enum_get_item, (MPI_T_enum enumtype, int indx, int *value, char *name, int *name_len))
MCMPI_FN_(int, T_cvar_get_num, (int *num_cvar))
MCMPI_FN_(int, T_cvar_get_info, (int cvar_index, char *name, int *name_len, int *verbosity, MPI_Datatype *datatype,
                                 MPI_T_enum *enumtype, char *desc, int *desc_len, int *bind, int *scope))
MCMPI_FN_(int, T_cvar_get_index, (const char *name, int *cvar_index))
MCMPI_FN_(int, T_cvar_handle_alloc, (int cvar_index, void *obj_handle, MPI_T_cvar_handle *handle, int *count))
MCMPI_FN_(int, T_cvar_handle_free, (MPI_T_cvar_handle *handle))
MCMPI_FN_(int, T_cvar_read, (MPI_T_cvar_handle handle, void *buf))
MCMPI_FN_(int, T_cvar_write, (MPI_T_cvar_handle handle, const void *buf))
MCMPI_FN_(int, T_pvar_get_num, (int *num_pvar))
MCMPI_FN_(int, T_pvar_get_info, (int pvar_index, char *name, int *name_len, int *verbosity, int *var_class,
                                 MPI_Datatype *datatype, MPI_T_enum *enumtype, char *desc, int *desc_len, int *bind,
                                 int *readonly, int *continuous, int *atomic))
MCMPI_FN_(int, T_pvar_get_index, (const char *name, int var_class, int *pvar_index))
MCMPI_FN_(int, T_pvar_session_create, (MPI_T_pvar_session *session))
MCMPI_FN_(int, T_pvar_session_free, (MPI_T_pvar_session *session))
MCMPI_FN_(int, T_pvar_handle_alloc, (MPI_T_pvar_session session, int pvar_index, void *obj_handle,
                                     MPI_T_pvar_handle *handle, int *count))
MCMPI_FN_(int, T_pvar_handle_free, (MPI_T_pvar_session session, MPI_T_pvar_handle *handle))
MCMPI_FN_(int, T_pvar_start, (MPI_T_pvar_session session, MPI_T_pvar_handle handle))
MCMPI_FN_(int, T_pvar_stop, (MPI_T_pvar_session session, MPI_T_pvar_handle handle))
MCMPI_FN_(int, T_pvar_read, (MPI_T_pvar_session session, MPI_T_pvar_handle handle, void *buf))
MCMPI_FN_(int, T_pvar_write, (MPI_T_pvar_session session, MPI_T_pvar_handle handle, const void *buf))
MCMPI_FN_(int, T_pvar_reset, (MPI_T_pvar_session session, MPI_T_pvar_handle handle))
MCMPI_FN_(int, T_pvar_readreset, (MPI_T_pvar_session session, MPI_T_pvar_handle handle, void *buf))
MCMPI_FN_(int, T_category_get_num, (int *num_cat))
MCMPI_FN_(int, T_category_get_info, (int cat_index, char *name, int *name_len, char *desc, int *desc_len,
                                     int *num_cvars, int *num_pvars, int *num_categories))
MCMPI_FN_(int, T_category_get_num_events, (int cat_index, int *num_events))
MCMPI_FN_(int, T_category_get_index, (const char *name, int *cat_index))
MCMPI_FN_(int, T_category_get_cvars, (int cat_index, int len, int indices[]))
MCMPI_FN_(int, T_category_get_pvars, (int cat_index, int len, int indices[]))
MCMPI_FN_(int, T_category_get_events, (int cat_index, int len, int indices[]))
MCMPI_FN_(int, T_category_get_categories, (int cat_index, int len, int indices[]))
MCMPI_FN_(int, T_category_changed, (int *update_number))
MCMPI_FN_(int, T_source_get_num, (int *num_sources))
MCMPI_FN_(int, T_source_get_info, (int source_index, char *name, int *name_len, char *desc, int *desc_len,
                                   MPI_T_source_order *ordering, MPI_Count *ticks_per_second, MPI_Count *max_ticks,
                                   MPI_Info *info))
MCMPI_FN_(int, T_source_get_timestamp, (int source_index, MPI_Count *timestamp))
MCMPI_FN_(int, T_event_get_num, (int *num_events))
MCMPI_FN_(int, T_event_get_info, (int event_index, char *name, int *name_len, int *verbosity,
                                  MPI_Datatype array_of_datatypes[], MPI_Aint array_of_displacements[],
                                  int *num_elements, MPI_T_enum *enumtype, MPI_Info *info, char *desc,
                                  int *desc_len, int *bind))
MCMPI_FN_(int, T_event_get_index, (const char *name, int *event_index))
MCMPI_FN_(int, T_event_handle_alloc, (int event_index, void *obj_handle, MPI_Info info,
                                      MPI_T_event_registration *event_registration))
MCMPI_FN_(int, T_event_handle_set_info, (MPI_T_event_registration event_registration, MPI_Info info))
MCMPI_FN_(int, T_event_handle_get_info, (MPI_T_event_registration event_registration, MPI_Info *info_used))
MCMPI_FN_(int, T_event_register_callback, (MPI_T_event_registration event_registration, MPI_T_cb_safety cb_safety,
                                           MPI_Info info, void *user_data,
                                           MPI_T_event_cb_function *event_cb_function))
MCMPI_FN_(int, T_event_callback_set_info, (MPI_T_event_registration event_registration, MPI_T_cb_safety cb_safety,
                                           MPI_Info info))
MCMPI_FN_(int, T_event_callback_get_info, (MPI_T_event_registration event_registration, MPI_T_cb_safety cb_safety,
                                           MPI_Info *info_used))
MCMPI_FN_(int, T_event_handle_free, (MPI_T_event_registration event_registration, void *user_data,
                                     MPI_T_event_free_cb_function *free_cb_function))
MCMPI_FN_(int, T_event_set_dropped_handler, (MPI_T_event_registration event_registration,
                                             MPI_T_event_dropped_cb_function *dropped_cb_function))
MCMPI_FN_(int, T_event_read, (MPI_T_event_instance event_instance, int element_index, void *buffer))
MCMPI_FN_(int, T_event_copy, (MPI_T_event_instance event_instance, void *buffer))
MCMPI_FN_(int, T_event_get_timestamp, (MPI_T_event_instance event_instance, MPI_Count *event_timestamp))
MCMPI_FN_(int, T_event_get_source, (MPI_T_event_instance event_instance, int *source_index))

/* Handles to and from int (for languages that keep them in an integer). */
MCMPI_FN_(int, Comm_toint, (MPI_Comm comm))
MCMPI_FN_(MPI_Comm, Comm_fromint, (int comm))
MCMPI_FN_(int, Errhandler_toint, (MPI_Errhandler errhandler))
MCMPI_FN_(MPI_Errhandler, Errhandler_fromint, (int errhandler))
MCMPI_FN_(int, File_toint, (MPI_File file))
MCMPI_FN_(MPI_File, File_fromint, (int file))
MCMPI_FN_(int, Group_toint, (MPI_Group group))
MCMPI_FN_(MPI_Group, Group_fromint, (int group))
MCMPI_FN_(int, Info_toint, (MPI_Info info))
MCMPI_FN_(MPI_Info, Info_fromint, (int info))
MCMPI_FN_(int, Message_toint, (MPI_Message message))
MCMPI_FN_(MPI_Message, Message_fromint, (int message))
MCMPI_FN_(int, Op_toint, (MPI_Op op))
MCMPI_FN_(MPI_Op, Op_fromint, (int op))
MCMPI_FN_(int, Request_toint, (MPI_Request request))
MCMPI_FN_(MPI_Request, Request_fromint, (int request))
MCMPI_FN_(int, Session_toint, (MPI_Session session))
MCMPI_FN_(MPI_Session, Session_fromint, (int session))
MCMPI_FN_(int, Type_toint, (MPI_Datatype datatype))
MCMPI_FN_(MPI_Datatype, Type_fromint, (int datatype))
MCMPI_FN_(int, Win_toint, (MPI_Win win))
MCMPI_FN_(MPI_Win, Win_fromint, (int win))

#undef MCMPI_REQUEST_
#undef MCMPI_STATUS_
#undef MCMPI_AT_
#undef MCMPI_IO_
#undef MCMPI_COLL_C_
#undef MCMPI_COLL_
#undef MCMPI_FN_

#if defined(__cplusplus)
}
#endif

#endif /* MCMPI_MPI_H */
