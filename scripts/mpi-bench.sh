#!/usr/bin/env bash
# Our MPI side by side with MPICH 5.0.2 over TCP, in the same guests, with
# the same binaries (built once against the MPI standard ABI; the library
# is chosen by LD_LIBRARY_PATH), in one run on a NODES-guest cluster
# (default 4). Each figure is printed as soon as it is measured:
#   1. NetPIPE's NPtcp between guests 0 and 1 over the cluster LAN;
#   2. NetPIPE's NPmpi across guests 0 and 1 on ours (MEMORY CHANNEL);
#   3. the same NPmpi across guests 0 and 1 on MPICH over TCP (libfabric's
#      tcp provider pinned to eth0; NETMOD=ucx for UCX's tcp transport);
#   4. NPmpi with both ranks inside guest 0 on ours (shared memory);
#   5. collectives (tests/mpi/bench/collbench.c): Barrier, Bcast,
#      Allreduce, Alltoall against size on all guests and on 2, both
#      libraries;
#   6. an integer sort (tests/mpi/bench/isort.c) on all guests, both
#      libraries, its answer verified;
#   7. latency distributions (tests/mpi/bench/latency.c) on both
#      libraries: medians of 8-byte one-way times between guests 0 and 1
#      (2 ranks, as NetPIPE), and of barriers and 8-byte allreduces with
#      one rank on every guest (a noisy host moves averages far more than
#      medians);
#   8. zero copy (tests/mpi/bench/bw.c): ping-pong bandwidth between
#      guests 0 and 1 with buffers from MPI_Alloc_mem, on both libraries,
#      and with heap buffers on ours (every byte of a last round checked).
# Then one table (latency at 8 bytes, bandwidth at 1 MiB, ratios, the LAN
# the figures used) and SVG plots (mpi-latency.svg, mpi-bandwidth.svg and
# one per collective, drawn by target/release/mpi-bench-plot); the plots,
# the raw NetPIPE files and the logs are kept in OUT_DIR (default
# bench-out/mpi).
#
# MPICH starts its proxies in the other guests with Hydra's rsh launcher,
# through our mpiexec (guest/msg/mpi/mc-rsh, copied to /share/mc-rsh): no ssh
# is needed in the guests.
#
# Usage: scripts/mpi-bench.sh [OUT_DIR]   (after scripts/setup.sh)
# Settings (environment): NODES (4), NETMOD (ofi or ucx), MAX (largest
# size, default 1048576), ISORT_KEYS (default 2097152), CONFIG (the
# cluster definition, default qemu-configs/mpi.toml: stores sent from the
# vCPU thread and QEMU's I/O threads real-time, docs/mpi.md "The cluster
# for MPI"; CONFIG=qemu-configs/default.toml for the plain cluster).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_or_refuse "" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/bench-out/mpi}
NODES=${NODES:-4}
NETMOD=${NETMOD:-ofi}
CONFIG=${CONFIG:-$REPO/qemu-configs/mpi.toml}
MAX=${MAX:-1048576}
ISORT_KEYS=${ISORT_KEYS:-2097152}
MC_CACHE=${MC_CACHE:-$REPO/.cache}
NP=$MC_CACHE/netpipe-src
NAME=mpi-bench
T0=$(date +%s)
say() { printf '[%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { echo "mpi-bench: $*" >&2; exit 1; }
[ "$NODES" -ge 2 ] || die "NODES must be at least 2"
[ -f "$NP/src/netpipe.c" ] || die "no NetPIPE source in $NP: run scripts/setup.sh (step netpipe)"
[ -x "$MC_CACHE/mpich/bin/mpiexec" ] || die "no MPICH in $MC_CACHE/mpich: run scripts/setup.sh (step mpich)"
[ -f "$REPO/target/release/libmpi_abi.so.1" ] || die "no libmpi_abi.so.1: run scripts/setup.sh"
[ -x "$REPO/target/release/mpi-bench-plot" ] || die "no mpi-bench-plot: run scripts/setup.sh"
mkdir -p "$OUT"

say "building NPtcp, NPmpi, collbench, isort, latency and bw (host compiler, standard ABI)"
BIN=$OUT/bin
mkdir -p "$BIN"
S=$NP/src
cc -O2 -static -DTCP -I"$S" "$S/netpipe.c" "$S/tcp.c" -o "$BIN/NPtcp" 2>"$OUT/build.log" \
    || die "building NPtcp failed (see $OUT/build.log)"
for p in "NPmpi:-DMPI -I$S $S/netpipe.c $S/mpi.c" "collbench:$REPO/tests/mpi/bench/collbench.c" \
         "isort:$REPO/tests/mpi/bench/isort.c" "latency:$REPO/tests/mpi/bench/latency.c" \
         "bw:$REPO/tests/mpi/bench/bw.c"; do
    # shellcheck disable=SC2086
    "$REPO/guest/msg/mpi/mpicc" -O2 ${p#*:} -o "$BIN/${p%%:*}" 2>>"$OUT/build.log" \
        || die "building ${p%%:*} failed (see $OUT/build.log)"
done

# shellcheck source=scripts/bench-cluster.sh
. "$REPO/scripts/bench-cluster.sh"
SHARE=$REPO/.run/$NAME/share
say "copying the binaries and MPICH into the shared folder"
cp "$BIN"/* "$SHARE/"
rm -rf "$SHARE/mpich"
cp -r "$MC_CACHE/mpich" "$SHARE/mpich"
cp "$REPO/guest/msg/mpi/mc-rsh" "$SHARE/mc-rsh"
LAN=$(sed -n 's/.*"lan": *"\([a-z]*\)".*/\1/p' "$REPO/.run/$NAME/state.json")
say "cluster: $NODES guests from ${CONFIG#"$REPO"/}, LAN backend: ${LAN:-unknown}"
x() { "$M" --name $NAME exec "$@"; }
hosts=$(seq -s, -f 'node%g' 0 $(( NODES - 1 )))
case "$NETMOD" in
    ofi) PIN="-genv MPIR_CVAR_CH4_NETMOD ofi -genv FI_PROVIDER tcp -genv FI_TCP_IFACE eth0" ;;
    ucx) PIN="-genv MPIR_CVAR_CH4_NETMOD ucx -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES eth0" ;;
    *) die "NETMOD must be ofi or ucx, not '$NETMOD'" ;;
esac
# mpich N PPN HOSTS PROG ARGS...: the program on MPICH over TCP.
mpich() {
    local n=$1 ppn=$2 h=$3; shift 3
    x 0 --timeout 3600 -- sh -c "cd /tmp && LD_LIBRARY_PATH=/share/mpich/lib /share/mpich/bin/mpiexec \
        -launcher rsh -launcher-exec /share/mc-rsh -hosts $h -n $n -ppn $ppn $PIN $*"
}
# ours N PPN PROG ARGS...
ours() {
    local n=$1 ppn=$2; shift 2
    "$M" --name $NAME mpirun -n "$n" --ppn "$ppn" --timeout 3600 "$@"
}
# NetPIPE's output files: one line per size (bytes, Mbps, one-way seconds).
p8() { awk '$1 <= 8 { v = $3 * 1e6 } END { print v }' "$1"; }   # one-way µs at 8 bytes
bw() { awk '{ v = $2 / 8 } END { print v }' "$1"; }             # MB/s at the largest size
# np_summary FILE LABEL: "label: 8 B one way, largest size MB/s, peak MB/s".
np_summary() {
    awk -v l="$2" -v lat="$(p8 "$1")" -v bw="$(bw "$1")" '$2 / 8 > peak { peak = $2 / 8 }
        END { printf "%s: 8-byte one-way %.1f us, largest size %.1f MB/s, peak %.1f MB/s\n", l, lat, bw, peak }' "$1"
}

say "1. NPtcp, guest 0 -> guest 1 over the LAN"
x 1 -- sh -c "cd /tmp && (/share/NPtcp -u $MAX >/tmp/nptcp-recv.log 2>&1 &)"
sleep 1
x 0 --timeout 3600 -- sh -c "cd /tmp && /share/NPtcp -h 10.0.0.2 -u $MAX -o /share/np-tcp.out >/dev/null"
cp "$SHARE/np-tcp.out" "$OUT/"
np_summary "$OUT/np-tcp.out" "NPtcp" | tee "$OUT/summary.txt"

say "2. NPmpi on ours, guest 0 <-> guest 1 (MEMORY CHANNEL)"
ours 2 1 /share/NPmpi -u "$MAX" -o /share/np-ours.out >"$OUT/np-ours.log" 2>&1 || die "NPmpi on ours failed (see $OUT/np-ours.log)"
cp "$SHARE/np-ours.out" "$OUT/"
np_summary "$OUT/np-ours.out" "NPmpi, ours across guests" | tee -a "$OUT/summary.txt"

say "3. NPmpi on MPICH 5.0.2 ($NETMOD tcp on eth0), guest 0 <-> guest 1"
mpich 2 1 node0,node1 /share/NPmpi -u "$MAX" -o /share/np-mpich.out >"$OUT/np-mpich.log" 2>&1 \
    || die "NPmpi on MPICH failed (see $OUT/np-mpich.log)"
cp "$SHARE/np-mpich.out" "$OUT/"
np_summary "$OUT/np-mpich.out" "NPmpi, MPICH over TCP" | tee -a "$OUT/summary.txt"

say "4. NPmpi on ours, both ranks in guest 0 (shared memory)"
ours 2 2 /share/NPmpi -u "$MAX" -o /share/np-ours-shm.out >"$OUT/np-ours-shm.log" 2>&1 \
    || die "NPmpi in one guest failed (see $OUT/np-ours-shm.log)"
cp "$SHARE/np-ours-shm.out" "$OUT/"
np_summary "$OUT/np-ours-shm.out" "NPmpi, ours in one guest" | tee -a "$OUT/summary.txt"

say "5. collectives on $NODES guests, then on 2"
ours "$NODES" 1 /share/collbench -m "$MAX" | tee "$OUT/coll-ours.txt"
mpich "$NODES" 1 "$hosts" /share/collbench -m "$MAX" | tee "$OUT/coll-mpich.txt"
if [ "$NODES" -gt 2 ]; then
    ours 2 1 /share/collbench -m "$MAX" | tee "$OUT/coll-ours-2.txt"
    mpich 2 1 node0,node1 /share/collbench -m "$MAX" | tee "$OUT/coll-mpich-2.txt"
fi

say "6. integer sort of $ISORT_KEYS keys on $NODES guests"
ours "$NODES" 1 /share/isort -n "$ISORT_KEYS" | tee "$OUT/isort-ours.txt"
mpich "$NODES" 1 "$hosts" /share/isort -n "$ISORT_KEYS" | tee "$OUT/isort-mpich.txt"

say "7. latency distributions: 8 bytes between guests 0 and 1, collectives on all $NODES guests"
{ ours 2 1 /share/latency; ours "$NODES" 1 /share/latency -c; } | tee "$OUT/latency-ours.txt"
{ mpich 2 1 node0,node1 /share/latency; mpich "$NODES" 1 "$hosts" /share/latency -c; } | tee "$OUT/latency-mpich.txt"
for l in ours mpich; do
    [ "$(grep -c '^latency ok' "$OUT/latency-$l.txt")" = 2 ] || die "latency on $l failed (see $OUT/latency-$l.txt)"
done

BW_SIZES=64K,256K,1M,2M,4M
say "8. zero copy: ping-pong bandwidth between guests 0 and 1, sizes $BW_SIZES"
ours 2 1 /share/bw -a -s $BW_SIZES | tee "$OUT/bw-ours-alloc.txt"
ours 2 1 /share/bw -s $BW_SIZES | tee "$OUT/bw-ours-heap.txt"
mpich 2 1 node0,node1 /share/bw -a -s $BW_SIZES | tee "$OUT/bw-mpich-alloc.txt"
for f in ours-alloc ours-heap mpich-alloc; do
    grep -q '^bw ok' "$OUT/bw-$f.txt" || die "bw ($f) failed (see $OUT/bw-$f.txt)"
    # As NetPIPE writes it (bytes, Mbps, one-way seconds), for the plot.
    awk '$1 == "bw" && $2 ~ /^[0-9]+$/ { print $2, $3 * 8, $4 / 1e6 }' "$OUT/bw-$f.txt" >"$OUT/bw-$f.np"
done

echo
echo "MPI side by side, $NODES TCG guests, cluster ${CONFIG#"$REPO"/}, LAN: ${LAN:-unknown}, MPICH netmod: $NETMOD"
cat "$OUT/summary.txt"
printf '%-7s %-10s %9s %14s %14s %8s\n' guests op bytes "ours (us)" "MPICH (us)" "MPICH/ours"
for g in "$NODES:" "2:-2"; do
    [ -f "$OUT/coll-ours${g#*:}.txt" ] || continue
    join -j1 <(awk '$1 == "coll" { print $2 "/" $3, $4 }' "$OUT/coll-ours${g#*:}.txt" | sort) \
             <(awk '$1 == "coll" { print $2 "/" $3, $4 }' "$OUT/coll-mpich${g#*:}.txt" | sort) \
        | sort -t/ -k1,1 -k2n | awk -v g="${g%%:*}" '{ split($1, k, "/");
            printf "%-7s %-10s %9s %14.1f %14.1f %8.2f\n", g, k[1], k[2], $2, $3, $3 / $2 }'
done
for l in ours mpich; do
    awk -v l="$l" '/^isort best/ { t = $3 } /^isort verified/ { ok = "verified" } /FAILED/ { ok = "FAILED" }
        END { printf "isort on %s: best round %.3f s, answer %s\n", l, t, ok }' "$OUT/isort-$l.txt"
done
awk -v a="$(p8 "$OUT/np-ours.out")" -v b="$(p8 "$OUT/np-mpich.out")" -v c="$(bw "$OUT/np-ours.out")" -v d="$(bw "$OUT/np-mpich.out")" \
    'BEGIN { printf "ratios across guests: 8-byte latency MPICH/ours %.2f (goal >= 25), bandwidth at the largest size ours/MPICH %.2f (goal >= 10)\n", b / a, c / d }'
printf '%-9s %16s %16s %16s %12s\n' bytes "ours, Alloc_mem" "ours, heap" "MPICH, Alloc_mem" "ours/MPICH"
join <(awk '$1 == "bw" && $2 ~ /^[0-9]+$/ { print $2, $3 }' "$OUT/bw-ours-alloc.txt") \
     <(awk '$1 == "bw" && $2 ~ /^[0-9]+$/ { print $2, $3 }' "$OUT/bw-ours-heap.txt") \
    | join - <(awk '$1 == "bw" && $2 ~ /^[0-9]+$/ { print $2, $3 }' "$OUT/bw-mpich-alloc.txt") \
    | awk '{ printf "%-9s %11.1f MB/s %11.1f MB/s %11.1f MB/s %12.2f\n", $1, $2, $3, $4, $2 / $4 }'
# med LIB WHAT: the median of a latency line.
med() { awk -v w="$2" '$1 == "latency" && $2 == w { v = $3 } END { print v }' "$OUT/latency-$1.txt"; }
printf '%-32s %12s %12s %10s\n' "median (us)" ours MPICH MPICH/ours
for w in pingpong8 barrier allreduce8; do
    awk -v w="$w" -v a="$(med ours $w)" -v b="$(med mpich $w)" \
        'BEGIN { printf "%-32s %12.1f %12.1f %10.2f\n", w, a, b, b / a }'
done
awk -v p="$(med ours pingpong8)" -v q="$(med mpich pingpong8)" -v b="$(med ours barrier)" -v n="$NODES" \
    'BEGIN { printf "medians: 8-byte latency MPICH/ours %.2f (goal >= 25); barrier on %d guests / 8-byte one way, ours %.2f (goal <= 2)\n", q / p, n, b / p }'
PLOT=(--out "$OUT" --note "$NODES TCG guests, ${CONFIG##*/}, LAN $LAN"
      --np "ours, MEMORY CHANNEL=$OUT/np-ours.out" --np "MPICH over TCP=$OUT/np-mpich.out"
      --np "NPtcp=$OUT/np-tcp.out" --np "ours, one guest=$OUT/np-ours-shm.out"
      --np "ours, MPI_Alloc_mem (bw)=$OUT/bw-ours-alloc.np" --np "MPICH, MPI_Alloc_mem (bw)=$OUT/bw-mpich-alloc.np"
      --coll "ours, $NODES guests=$OUT/coll-ours.txt" --coll "MPICH, $NODES guests=$OUT/coll-mpich.txt")
[ "$NODES" -gt 2 ] && PLOT+=(--coll "ours, 2 guests=$OUT/coll-ours-2.txt" --coll "MPICH, 2 guests=$OUT/coll-mpich-2.txt")
"$REPO/target/release/mpi-bench-plot" "${PLOT[@]}" || die "drawing the plots failed"
say "done: $OUT"
