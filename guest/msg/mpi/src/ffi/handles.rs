//! Handles to and from C `int`s (`MPI_Comm_toint`, `MPI_Type_fromint`,
//! ...: the standard ABI's way to pass handles through Fortran or files)
//! and address arithmetic (`MPI_Aint_add`, `MPI_Aint_diff`). Every handle
//! this library makes is below 2^31, so a handle's int is its word.

use std::ffi::c_int;

use crate::abi::*;

/// Declares `PMPI_X_toint` and `PMPI_X_fromint` for one handle type.
macro_rules! int_handles {
    ($($t:ident: $to:ident / $pto:ident, $from:ident / $pfrom:ident;)*) => {
        $(
            #[doc = concat!("`", stringify!($to), "`.")]
            #[no_mangle]
            pub extern "C" fn $pto(h: $t) -> c_int {
                h as c_int
            }
            $crate::weak_alias!($to, $pto);
            #[doc = concat!("`", stringify!($from), "`.")]
            #[no_mangle]
            pub extern "C" fn $pfrom(i: c_int) -> $t {
                i as u32 as $t
            }
            $crate::weak_alias!($from, $pfrom);
        )*
    };
}

int_handles! {
    MPI_Comm: MPI_Comm_toint / PMPI_Comm_toint, MPI_Comm_fromint / PMPI_Comm_fromint;
    MPI_Errhandler: MPI_Errhandler_toint / PMPI_Errhandler_toint, MPI_Errhandler_fromint / PMPI_Errhandler_fromint;
    MPI_File: MPI_File_toint / PMPI_File_toint, MPI_File_fromint / PMPI_File_fromint;
    MPI_Group: MPI_Group_toint / PMPI_Group_toint, MPI_Group_fromint / PMPI_Group_fromint;
    MPI_Info: MPI_Info_toint / PMPI_Info_toint, MPI_Info_fromint / PMPI_Info_fromint;
    MPI_Message: MPI_Message_toint / PMPI_Message_toint, MPI_Message_fromint / PMPI_Message_fromint;
    MPI_Op: MPI_Op_toint / PMPI_Op_toint, MPI_Op_fromint / PMPI_Op_fromint;
    MPI_Request: MPI_Request_toint / PMPI_Request_toint, MPI_Request_fromint / PMPI_Request_fromint;
    MPI_Session: MPI_Session_toint / PMPI_Session_toint, MPI_Session_fromint / PMPI_Session_fromint;
    MPI_Datatype: MPI_Type_toint / PMPI_Type_toint, MPI_Type_fromint / PMPI_Type_fromint;
    MPI_Win: MPI_Win_toint / PMPI_Win_toint, MPI_Win_fromint / PMPI_Win_fromint;
}

/// `MPI_Aint_add`: an address plus a displacement.
#[no_mangle]
pub extern "C" fn PMPI_Aint_add(base: MPI_Aint, disp: MPI_Aint) -> MPI_Aint {
    base.wrapping_add(disp)
}
crate::weak_alias!(MPI_Aint_add, PMPI_Aint_add);

/// `MPI_Aint_diff`: the distance between two addresses.
#[no_mangle]
pub extern "C" fn PMPI_Aint_diff(a: MPI_Aint, b: MPI_Aint) -> MPI_Aint {
    a.wrapping_sub(b)
}
crate::weak_alias!(MPI_Aint_diff, PMPI_Aint_diff);
