#!/usr/bin/env bash
# Installs libimc (headers, libimc.a, libimc.so, imc.pc) into PREFIX and
# builds the C programs of examples/ statically against it, through
# pkg-config, into BIN_DIR (for the guest image; guests have no compiler).
#
# Usage: build-c.sh A_DIR SO_DIR PREFIX BIN_DIR
#   A_DIR:  where cargo left the static libimc.a (the guest build, +crt-static)
#   SO_DIR: where cargo left libimc.so (a host build: crt-static has no cdylib)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
USAGE="usage: build-c.sh A_DIR SO_DIR PREFIX BIN_DIR"
A_DIR=${1:?$USAGE}
SO_DIR=${2:?$USAGE}
PREFIX=${3:?$USAGE}
BIN_DIR=${4:?$USAGE}
VERSION=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$HERE/../../Cargo.toml" | head -1)
# What the Rust standard library needs from the C library (rustc --print native-static-libs).
PRIVATE="-lutil -lrt -lpthread -lm -ldl -lc -lgcc_eh -lgcc -lc"

for f in "$A_DIR/libimc.a" "$SO_DIR/libimc.so"; do
    [ -f "$f" ] || { echo "$f missing: build mc-libimc first (scripts/setup.sh)" >&2; exit 1; }
done
mkdir -p "$PREFIX"/{include/sys,lib/pkgconfig} "$BIN_DIR"
cp "$HERE/include/sys/imc.h" "$PREFIX/include/sys/imc.h"
cp "$HERE/include/imc.h" "$PREFIX/include/imc.h"
cp "$A_DIR/libimc.a" "$SO_DIR/libimc.so" "$PREFIX/lib/"
sed -e "s|@PREFIX@|$PREFIX|" -e "s|@VERSION@|$VERSION|" -e "s|@PRIVATE@|$PRIVATE|" \
    "$HERE/imc.pc.in" >"$PREFIX/lib/pkgconfig/imc.pc"

export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
for src in "$HERE"/examples/*.c; do
    name=$(basename "$src" .c)
    # --no-warnings: glibc's notes that getaddrinfo & co. need its shared
    # libraries at run time (libimc never resolves host names).
    # shellcheck disable=SC2046
    gcc -O2 -Wall -static -Wl,--no-warnings -o "$BIN_DIR/$name" "$src" $(pkg-config --static --cflags --libs imc)
done
echo "libimc: installed in $PREFIX; built $(ls "$HERE"/examples/*.c | wc -l) C programs into $BIN_DIR"
