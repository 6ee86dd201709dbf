#!/usr/bin/env bash
# One-sided MPI, ours against MPICH 5.0.2's over TCP, side by side in the
# same two guests with the same binary (tests/mpi/bench/rma.c, built once
# against the MPI standard ABI; the library is chosen by LD_LIBRARY_PATH):
# OSU-style put and get latency (one operation, then MPI_Win_flush), put
# and get bandwidth (64 operations a flush) and a put between fences,
# rank 0 on guest 0 accessing rank 1's window on guest 1. Each figure is
# printed as it is measured; then one table with the ratios.
#
# Usage: scripts/rma-bench.sh [OUT_DIR]   (after scripts/setup.sh; default
# bench-out/rma). Settings (environment): MAX (largest size, default
# 1048576), ROUNDS (default 200), NETMOD (ofi or ucx), CONFIG (default
# qemu-configs/mpi.toml).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_or_refuse "" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/bench-out/rma}
NODES=2
NETMOD=${NETMOD:-ofi}
CONFIG=${CONFIG:-$REPO/qemu-configs/mpi.toml}
MAX=${MAX:-1048576}
ROUNDS=${ROUNDS:-200}
MC_CACHE=${MC_CACHE:-$REPO/.cache}
NAME=rma-bench
T0=$(date +%s)
say() { printf '[%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { echo "rma-bench: $*" >&2; exit 1; }
[ -x "$MC_CACHE/mpich/bin/mpiexec" ] || die "no MPICH in $MC_CACHE/mpich: run scripts/setup.sh (step mpich)"
[ -f "$REPO/target/release/libmpi_abi.so.1" ] || die "no libmpi_abi.so.1: run scripts/setup.sh"
mkdir -p "$OUT"
"$REPO/guest/msg/mpi/mpicc" -O2 "$REPO/tests/mpi/bench/rma.c" -o "$OUT/rma" 2>"$OUT/build.log" \
    || die "building tests/mpi/bench/rma.c failed (see $OUT/build.log)"

# shellcheck source=scripts/bench-cluster.sh
. "$REPO/scripts/bench-cluster.sh"
SHARE=$REPO/.run/$NAME/share
cp "$OUT/rma" "$SHARE/rma"
rm -rf "$SHARE/mpich"
cp -r "$MC_CACHE/mpich" "$SHARE/mpich"
cp "$REPO/guest/msg/mpi/mc-rsh" "$SHARE/mc-rsh"
case "$NETMOD" in
    ofi) PIN="-genv MPIR_CVAR_CH4_NETMOD ofi -genv FI_PROVIDER tcp -genv FI_TCP_IFACE eth0" ;;
    ucx) PIN="-genv MPIR_CVAR_CH4_NETMOD ucx -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES eth0" ;;
    *) die "NETMOD must be ofi or ucx, not '$NETMOD'" ;;
esac
say "cluster: 2 guests from ${CONFIG#"$REPO"/}"

say "1. ours (MEMORY CHANNEL), rank 0 on guest 0 -> rank 1 on guest 1"
"$M" --name $NAME mpirun -n 2 --ppn 1 --timeout 3600 /share/rma -m "$MAX" -r "$ROUNDS" | tee "$OUT/rma-ours.txt"
grep -q "FAILED" "$OUT/rma-ours.txt" && die "ours: a get brought wrong bytes"

say "2. MPICH 5.0.2 ($NETMOD tcp on eth0), same guests, same binary"
"$M" --name $NAME exec 0 --timeout 3600 -- sh -c "cd /tmp && LD_LIBRARY_PATH=/share/mpich/lib /share/mpich/bin/mpiexec \
    -launcher rsh -launcher-exec /share/mc-rsh -hosts node0,node1 -n 2 -ppn 1 $PIN /share/rma -m $MAX -r $ROUNDS" \
    | tee "$OUT/rma-mpich.txt"
grep -q "FAILED" "$OUT/rma-mpich.txt" && die "MPICH: a get brought wrong bytes"

say "3. side by side (latency: medians in us, MPICH/ours; bandwidth: MB/s, ours/MPICH)"
printf '%-10s %9s %9s %7s %9s %9s %7s %10s %10s %7s %10s %10s %7s\n' bytes \
    "put us" "MPICH" ratio "get us" "MPICH" ratio "put MB/s" "MPICH" ratio "get MB/s" "MPICH" ratio | tee "$OUT/table.txt"
# col FILE WHAT: "size value" lines of one measurement.
col() { awk -v w="$2" '$1 == "rma" && $2 == w { print $3, $4 }' "$1" | sort -k1,1; }
join <(col "$OUT/rma-ours.txt" put_lat) <(col "$OUT/rma-mpich.txt" put_lat) \
    | join - <(col "$OUT/rma-ours.txt" get_lat) | join - <(col "$OUT/rma-mpich.txt" get_lat) \
    | join - <(col "$OUT/rma-ours.txt" put_bw) | join - <(col "$OUT/rma-mpich.txt" put_bw) \
    | join - <(col "$OUT/rma-ours.txt" get_bw) | join - <(col "$OUT/rma-mpich.txt" get_bw) \
    | awk '{ printf "%-10s %9.1f %9.1f %7.2f %9.1f %9.1f %7.2f %10.1f %10.1f %7.2f %10.1f %10.1f %7.2f\n",
             $1, $2, $3, $3 / $2, $4, $5, $5 / $4, $6, $7, $6 / $7, $8, $9, $8 / $9 }' | sort -n | tee -a "$OUT/table.txt"
say "done: $OUT"
