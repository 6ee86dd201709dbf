#!/usr/bin/env bash
# Installs the C libraries — libimc (TruCluster MEMORY CHANNEL API,
# <sys/imc.h>), libump (UMP, <ump.h>), libdd (Direct Deposit, <dd.h>) and libbbp (BBP, <bbp.h>): headers, .a, .so and pkg-config
# files — into PREFIX, and builds the C programs of
# guest/client/libimc/examples/ statically against them, through pkg-config,
# into BIN_DIR (for the guest image; guests have no compiler).
#
# Usage: build-c.sh A_DIR SO_DIR PREFIX BIN_DIR
#   A_DIR:  where cargo left libimc.a, libump.a, libdd.a and libbbp.a (the guest build, +crt-static)
#   SO_DIR: where cargo left libimc.so, libump.so, libdd.so and libbbp.so (a host build: crt-static has no cdylib)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_or_refuse "" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
USAGE="usage: build-c.sh A_DIR SO_DIR PREFIX BIN_DIR"
A_DIR=${1:?$USAGE}
SO_DIR=${2:?$USAGE}
PREFIX=${3:?$USAGE}
BIN_DIR=${4:?$USAGE}
VERSION=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$REPO/Cargo.toml" | head -1)
# What the Rust standard library needs from the C library (rustc --print native-static-libs).
PRIVATE="-lutil -lrt -lpthread -lm -ldl -lc -lgcc_eh -lgcc -lc"

mkdir -p "$PREFIX"/{include/sys,lib/pkgconfig} "$BIN_DIR"
install_lib() { # name pc.in headers...
    local name=$1 pcin=$2
    shift 2
    for f in "$A_DIR/lib$name.a" "$SO_DIR/lib$name.so"; do
        [ -f "$f" ] || { echo "$f missing: build it first (scripts/setup.sh)" >&2; exit 1; }
    done
    cp "$A_DIR/lib$name.a" "$SO_DIR/lib$name.so" "$PREFIX/lib/"
    for h in "$@"; do cp "$h" "$PREFIX/include/${h##*/include/}"; done
    sed -e "s|@PREFIX@|$PREFIX|" -e "s|@VERSION@|$VERSION|" -e "s|@PRIVATE@|$PRIVATE|" \
        "$pcin" >"$PREFIX/lib/pkgconfig/$name.pc"
}
install_lib imc "$REPO/guest/client/libimc/imc.pc.in" \
    "$REPO/guest/client/libimc/include/sys/imc.h" "$REPO/guest/client/libimc/include/imc.h"
install_lib ump "$REPO/guest/msg/ump/ump.pc.in" "$REPO/guest/msg/ump/include/ump.h"
install_lib dd "$REPO/guest/msg/dd/dd.pc.in" "$REPO/guest/msg/dd/include/dd.h"
install_lib bbp "$REPO/guest/msg/bbp/bbp.pc.in" "$REPO/guest/msg/bbp/include/bbp.h"

export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
n=0
for src in "$REPO"/guest/client/libimc/examples/*.c; do
    name=$(basename "$src" .c)
    # --no-warnings: glibc's notes that getaddrinfo & co. need its shared
    # libraries at run time (neither library resolves host names).
    # shellcheck disable=SC2046
    gcc -O2 -Wall -static -Wl,--no-warnings -o "$BIN_DIR/$name" "$src" $(pkg-config --static --cflags --libs imc)
    n=$((n + 1))
done
echo "C libraries (imc, ump, dd, bbp) installed in $PREFIX; built $n C programs into $BIN_DIR"
