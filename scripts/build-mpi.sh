#!/usr/bin/env bash
# Builds the MPI library, libmpi_abi.so.1 (the MPI 5.0 standard ABI), from
# the mpi crate's staticlib, into OUT_DIR (default: the cargo target's
# release folder), with the development link libmpi_abi.so next to it.
#
# rustc's cdylib cannot give the MPI_ names as weak aliases of the PMPI_
# ones, so the staticlib (whose global_asm! makes the aliases) is linked
# here with cc: whole, under the soname libmpi_abi.so.1, exporting MPI_*
# and PMPI_* and nothing else.
#
# Usage: build-mpi.sh [OUT_DIR]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_or_refuse "" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
OUT=${1:-$TARGET/release}
CC=${CC:-cc}
command -v "$CC" >/dev/null || { echo "build-mpi: no C compiler '$CC' (apt-get install build-essential)" >&2; exit 1; }

(cd "$REPO" && cargo build --release -q -p mpi --lib) || { echo "build-mpi: cargo build -p mpi failed" >&2; exit 1; }
LIB=$TARGET/release/libmpi.a
[ -f "$LIB" ] || { echo "build-mpi: $LIB missing after the build" >&2; exit 1; }

mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat >"$TMP/exports.map" <<'MAP'
{
    global: MPI_*; PMPI_*;
    local: *;
};
MAP
# What the Rust standard library needs from the C library
# (rustc --print native-static-libs for a staticlib).
"$CC" -shared -o "$TMP/libmpi_abi.so.1" \
    -Wl,-soname,libmpi_abi.so.1 -Wl,--version-script="$TMP/exports.map" -Wl,-z,defs \
    -Wl,--whole-archive "$LIB" -Wl,--no-whole-archive \
    -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
mv "$TMP/libmpi_abi.so.1" "$OUT/libmpi_abi.so.1"
ln -sfn libmpi_abi.so.1 "$OUT/libmpi_abi.so"
echo "build-mpi: $OUT/libmpi_abi.so.1"
