#!/usr/bin/env bash
# Builds the PVM library from the pvm crate's staticlib, into OUT_DIR
# (default: the cargo target's release folder):
#   libpvm3.so.3   every pvm_* call, PVM's data symbols and the internal
#                  calls Debian's example programs import (soname
#                  libpvm3.so.3, as Debian's PVM 3.4.6 has it);
#   libgpvm3.so.3  the group library's soname: it holds nothing and needs
#                  libpvm3.so.3, where the group calls are (a program that
#                  needs both finds them there);
# and the development links libpvm3.so and libgpvm3.so next to them.
#
# Usage: build-pvm.sh [OUT_DIR]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_or_refuse "" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
OUT=${1:-$TARGET/release}
CC=${CC:-cc}
command -v "$CC" >/dev/null || { echo "build-pvm: no C compiler '$CC' (apt-get install build-essential)" >&2; exit 1; }

(cd "$REPO" && cargo build --release -q -p pvm --lib) || { echo "build-pvm: cargo build -p pvm failed" >&2; exit 1; }
LIB=$TARGET/release/libpvm.a
[ -f "$LIB" ] || { echo "build-pvm: $LIB missing after the build" >&2; exit 1; }

mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat >"$TMP/exports.map" <<'MAP'
{
    global: pvm*; Pvm*; lpvmerr; i_dump;
    local: *;
};
MAP
"$CC" -O2 -fPIC -c "$REPO/guest/msg/pvm/c/varargs.c" -o "$TMP/varargs.o"
# What the Rust standard library needs from the C library
# (rustc --print native-static-libs for a staticlib).
"$CC" -shared -o "$TMP/libpvm3.so.3" \
    -Wl,-soname,libpvm3.so.3 -Wl,--version-script="$TMP/exports.map" -Wl,-z,defs \
    "$TMP/varargs.o" -Wl,--whole-archive "$LIB" -Wl,--no-whole-archive \
    -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
echo 'int pvm_mc_groups_in_libpvm3;' >"$TMP/g.c"
"$CC" -shared -fPIC -o "$TMP/libgpvm3.so.3" -Wl,-soname,libgpvm3.so.3 -Wl,--no-as-needed \
    "$TMP/g.c" -L"$TMP" -l:libpvm3.so.3
mv "$TMP/libpvm3.so.3" "$TMP/libgpvm3.so.3" "$OUT/"
ln -sfn libpvm3.so.3 "$OUT/libpvm3.so"
ln -sfn libgpvm3.so.3 "$OUT/libgpvm3.so"
echo "build-pvm: $OUT/libpvm3.so.3 $OUT/libgpvm3.so.3"
