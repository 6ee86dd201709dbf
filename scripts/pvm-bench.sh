#!/usr/bin/env bash
# Our PVM side by side with Debian's PVM 3.4.6 over TCP, in the same guests,
# with the same binaries (Debian's own examples and tests/pvm/bench/
# pingpong.c, built once against pvm3.h; the library is chosen by
# LD_LIBRARY_PATH and PVM_ROOT), in one run on clusters of 2 and then 4
# guests (SIZES; NODES=N for one cluster of N). Debian's pvmd runs on every
# guest, started through our mpiexec (scripts/pvm-peer.sh). Each figure is printed as soon as it is
# measured:
#   1. ours: Debian's `timing` (its round trip and bandwidth lines),
#      pingpong between guests 0 and 1 with pvm_psend/pvm_precv and with
#      packed messages (8 bytes to MAX), and pingpong inside guest 0
#      (shared memory);
#   2. our MPI's 8-byte one-way median between guests 0 and 1
#      (tests/mpi/bench/latency.c), for reference;
#   3. Debian's PVM over TCP on the cluster LAN: the same timing and
#      pingpong runs.
# Then one table (8-byte one-way medians, bandwidth at MAX, the ratios
# against the goals, the paper's Table 4 beside) and SVG plots in the style
# of the paper's Figures 11 and 12 (pvm-latency.svg, pvm-bandwidth.svg,
# drawn by target/release/mpi-bench-plot --layer pvm); the plots, the raw
# files (NetPIPE's format: bytes, Mbps, one-way seconds) and the logs stay
# in OUT_DIR/N-guests (default OUT_DIR: bench-out/pvm).
#
# Usage: scripts/pvm-bench.sh [OUT_DIR]   (after scripts/setup.sh)
# Settings (environment): SIZES (cluster sizes, "2 4"), NODES (one size
# only, into OUT_DIR itself), MAX (largest size, default 1048576),
# ROUNDS (round trips per size up to 64 KiB, fewer above; default 100),
# CONFIG (the cluster definition, default qemu-configs/mpi.toml).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_or_refuse "" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/bench-out/pvm}
SIZES=${SIZES:-2 4}
MAX=${MAX:-1048576}
ROUNDS=${ROUNDS:-100}
CONFIG=${CONFIG:-$REPO/qemu-configs/mpi.toml}
MC_CACHE=${MC_CACHE:-$REPO/.cache}
DEB=$MC_CACHE/pvm/root/usr/bin
NAME=pvm-bench
T0=$(date +%s)
say() { printf '[%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { echo "pvm-bench: $*" >&2; exit 1; }
# Without NODES: one cluster after the other, of each size in SIZES, each
# into OUT_DIR/N-guests; then their tables together.
if [ -z "${NODES:-}" ]; then
    for n in $SIZES; do
        [[ "$n" =~ ^[0-9]+$ ]] || die "SIZES holds '$n', not a number of guests"
        say "=== a cluster of $n guests"
        NODES=$n "$0" "$OUT/$n-guests" || die "the run on $n guests failed"
    done
    for n in $SIZES; do cat "$OUT/$n-guests/summary.txt"; done
    exit 0
fi
[ "$NODES" -ge 2 ] || die "NODES must be at least 2"
[ -x "$DEB/timing" ] || die "no Debian PVM in $MC_CACHE/pvm: run scripts/setup.sh (step pvm)"
[ -f "$REPO/target/release/libpvm3.so.3" ] || die "no libpvm3.so.3: run scripts/setup.sh"
[ -x "$REPO/target/release/mpi-bench-plot" ] || die "no mpi-bench-plot: run scripts/setup.sh"
mkdir -p "$OUT"

say "building pingpong (pvm3.h) and latency (MPI standard ABI) with the host compiler"
cc -O2 -I "$REPO/guest/msg/pvm/include" "$REPO/tests/pvm/bench/pingpong.c" -o "$OUT/pingpong" \
    -L "$REPO/target/release" -lpvm3 2>"$OUT/build.log" || die "building pingpong failed (see $OUT/build.log)"
"$REPO/guest/msg/mpi/mpicc" -O2 "$REPO/tests/mpi/bench/latency.c" -o "$OUT/latency" 2>>"$OUT/build.log" \
    || die "building latency failed (see $OUT/build.log)"

# shellcheck source=scripts/bench-cluster.sh
. "$REPO/scripts/bench-cluster.sh"
SHARE=$REPO/.run/$NAME/share
say "copying Debian's examples (for ours: /share/pvm), Debian's PVM (/share/dpvm) and the programs"
mkdir -p "$SHARE/pvm/bin/LINUX64"
cp "$DEB"/* "$SHARE/pvm/bin/LINUX64/"
"$REPO/scripts/pvm-peer.sh" "$SHARE/dpvm" /share/dpvm
cp "$OUT/pingpong" "$OUT/latency" "$SHARE/"
LAN=$(sed -n 's/.*"lan": *"\([a-z]*\)".*/\1/p' "$REPO/.run/$NAME/state.json")
say "cluster: $NODES guests from ${CONFIG#"$REPO"/}, LAN backend: ${LAN:-unknown}"
x() { "$M" --name $NAME exec "$@"; }
ENV_ours="export PVM_ROOT=/share/pvm"
ENV_debian=". /share/dpvm/env"
# run LIB CMD: a shell command in guest 0 in that PVM's environment.
run() { local e="ENV_$1"; x 0 --timeout 3600 -- sh -c "cd /tmp && ${!e} && $2"; }
# pingpongs LIB: the ping-pong runs of one PVM, into OUT/pp-LIB-*.
pingpongs() {
    local l=$1 m w
    for m in psend pack; do
        for w in node1 node0; do
            [ "$w" = node0 ] && { [ "$l" = ours ] && [ $m = psend ] || continue; }
            say "   $l: pingpong $m, guest 0 <-> ${w/node/guest }"
            run "$l" "/share/pingpong -m $m -w $w -x $MAX -r $ROUNDS -o /share/pp-$l-$m-$w.np" \
                | tee "$OUT/pp-$l-$m-$w.txt"
            grep -q FAILED "$OUT/pp-$l-$m-$w.txt" && die "pingpong on $l failed (see $OUT/pp-$l-$m-$w.txt)"
            cp "$SHARE/pp-$l-$m-$w.np" "$OUT/"
        done
    done
}
# timing LIB: Debian's timing example (it exits 1 by design; "done" ends it).
timing() {
    say "   $1: Debian's timing (timing_slave on guest 1)"
    run "$1" '$PVM_ROOT/bin/LINUX64/timing' >"$OUT/timing-$1.txt" 2>&1 || true
    grep -q done "$OUT/timing-$1.txt" || die "timing on $1 did not finish (see $OUT/timing-$1.txt)"
    grep -A2 "Avg uSec" "$OUT/timing-$1.txt" | sed 's/^/      /'
}

say "1. ours (tables in MEMORY CHANNEL space, UMP between the tasks)"
timing ours
pingpongs ours
say "2. our MPI, 8 bytes between guests 0 and 1"
"$M" --name $NAME mpirun -n 2 --ppn 1 --timeout 3600 /share/latency | tee "$OUT/latency-mpi.txt"
grep -q '^latency ok' "$OUT/latency-mpi.txt" || die "latency on our MPI failed (see $OUT/latency-mpi.txt)"
say "3. Debian's PVM 3.4.6 over TCP ($NODES hosts)"
hosts=$(seq -s ' ' -f 'node%g' 0 $(( NODES - 1 )))
run debian "\$PVM_ROOT/lib/pvm-up $hosts" || die "Debian's pvmd did not start on $hosts"
timing debian
pingpongs debian
run debian '$PVM_ROOT/lib/pvm-down' || true

# at FILE BYTES COLUMN: a pingpong line's column (3 median us, 6 MB/s).
at() { awk -v n="$2" -v c="$3" '$1 == "pingpong" && $3 == n { v = $c } END { print v }' "$1"; }
last() { awk '$1 == "pingpong" { v = $6 } END { print v }' "$1"; }
mpi8=$(awk '$1 == "latency" && $2 == "pingpong8" { print $3 }' "$OUT/latency-mpi.txt")
{
echo
echo "PVM side by side, $NODES TCG guests, cluster ${CONFIG#"$REPO"/}, LAN: ${LAN:-unknown}"
printf '%-40s %14s %14s   %s\n' "" "8 B one way" "$MAX B" "paper (Table 4, 1997)"
row() { printf '%-40s %11s us %9s MB/s   %s\n' "$1" "$(at "$2" 8 4)" "$(last "$2")" "$3"; }
row "ours, psend, guests 0-1 (MEMORY CHANNEL)" "$OUT/pp-ours-psend-node1.txt" "Digital PVM over MC: 8-11 us, 43 MB/s"
row "ours, packed, guests 0-1" "$OUT/pp-ours-pack-node1.txt" ""
row "ours, psend, inside guest 0 (shm)" "$OUT/pp-ours-psend-node0.txt" "Digital PVM over shm: 3-5 us, 66 MB/s"
row "Debian's PVM, psend, over TCP" "$OUT/pp-debian-psend-node1.txt" "PVM 3.3.9 over FDDI: 400 us"
row "Debian's PVM, packed, over TCP" "$OUT/pp-debian-pack-node1.txt" "PVM 3.3.9 over shm: 60 us"
printf '%-40s %11s us\n' "our MPI, guests 0-1 (latency.c median)" "$mpi8"
awk -v p="$(at "$OUT/pp-ours-psend-node1.txt" 8 4)" -v k="$(at "$OUT/pp-ours-pack-node1.txt" 8 4)" \
    -v d="$(at "$OUT/pp-debian-pack-node1.txt" 8 4)" -v m="$mpi8" \
    -v b="$(last "$OUT/pp-ours-psend-node1.txt")" -v e="$(last "$OUT/pp-debian-psend-node1.txt")" \
    'BEGIN { printf "ratios: 8-byte one way, packed PVM / our MPI %.2f (goal <= 1.25), psend PVM / our MPI %.2f;\n", k / m, p / m
             printf "        Debian packed / ours packed %.1f (goal >= 10); bandwidth at the largest size ours / Debian %.1f (goal >= 5)\n", d / k, b / e }'
} | tee "$OUT/summary.txt"
PLOT=(--layer pvm --out "$OUT" --note "$NODES TCG guests, ${CONFIG##*/}, LAN $LAN"
      --np "ours, psend, MEMORY CHANNEL=$OUT/pp-ours-psend-node1.np"
      --np "ours, packed, MEMORY CHANNEL=$OUT/pp-ours-pack-node1.np"
      --np "ours, psend, one guest=$OUT/pp-ours-psend-node0.np"
      --np "Debian PVM, psend, TCP=$OUT/pp-debian-psend-node1.np"
      --np "Debian PVM, packed, TCP=$OUT/pp-debian-pack-node1.np")
"$REPO/target/release/mpi-bench-plot" "${PLOT[@]}" || die "drawing the plots failed"
say "done; figures and logs in ${OUT#"$REPO"/}"
