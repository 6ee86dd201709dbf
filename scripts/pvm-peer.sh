#!/bin/bash
# pvm-peer.sh DIR GUEST_DIR: lays out Debian's PVM 3.4.6 (set-up's step pvm,
# .cache/pvm/root) in DIR, a folder the guests see as GUEST_DIR (a cluster's
# shared folder: DIR=.run/<name>/share/dpvm, GUEST_DIR=/share/dpvm), as the
# peer our libpvm3.so.3 is compared with (docs/pvm.md, "Real PVM as the peer"):
#   GUEST_DIR/env             source it: PVM_ROOT, LD_LIBRARY_PATH, PVM_RSH...
#   GUEST_DIR/lib/pvm-up H... starts pvmd on the guests named (TCP, the LAN)
#   GUEST_DIR/lib/pvm-down    halts it
#   GUEST_DIR/bin/LINUX64/    Debian's example programs and console (pvm)
# Debian's libpvm3.so.3 needs libtirpc.so.3 and its Kerberos libraries,
# which the guests lack: they go in lib/ with it.
#
# Usage: scripts/pvm-peer.sh DIR GUEST_DIR   (after scripts/setup.sh)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_or_refuse "" -- "$@"
REPO=$(cd "$(dirname "$0")/.." && pwd)
[ $# -eq 2 ] || { echo "usage: $0 DIR GUEST_DIR" >&2; exit 2; }
dir=$1 gdir=$2
deb=${MC_CACHE:-$REPO/.cache}/pvm/root
[ -x "$deb/usr/bin/pvmd" ] && [ -e "$deb/usr/lib/x86_64-linux-gnu/libkrb5.so.3" ] \
    || { echo "$0: Debian's PVM is not in $deb: run scripts/setup.sh --only pvm" >&2; exit 1; }
mkdir -p "$dir/lib" "$dir/bin/LINUX64"
cp -L "$deb"/usr/lib/x86_64-linux-gnu/*.so.[0-9] "$deb"/lib/x86_64-linux-gnu/*.so.[0-9] "$dir/lib/"
cp "$deb/usr/bin/pvmd" "$dir/lib/pvmd3"
cp "$deb/usr/bin/pvmgs" "$dir/lib/pvmgs"
find "$deb/usr/bin" -maxdepth 1 -type f ! -name pvmd ! -name aimk -exec cp {} "$dir/bin/LINUX64/" \;
cp "$REPO"/guest/msg/pvm/peer/{pvmd,pvm-up,pvm-down} "$dir/lib/"
cp "$REPO/guest/msg/mpi/mc-rsh" "$dir/lib/rsh"
sed "s|@DIR@|$gdir|g" "$REPO/guest/msg/pvm/peer/env.in" >"$dir/env"
