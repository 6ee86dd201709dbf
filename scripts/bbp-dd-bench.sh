#!/usr/bin/env bash
# The Billboard Protocol and Direct Deposit side by side with UMP and our
# MPI, in one run on one cluster (4 guests by default), each figure
# printed as it is measured:
#   0. the guest's own copy speed (ump-tool floor), the floor under every
#      layer's large messages;
#   1. UMP's one-way time and bandwidth between guests 0 and 1
#      (ump-tool bench, blocking writes), for reference;
#   2. our MPI's 8-byte one-way median between guests 0 and 1
#      (tests/mpi/bench/latency.c), for reference;
#   3. Direct Deposit between guests 0 and 1 (dd-tool bench with dd-tool
#      serve): one-way by stores and by DMA, 4 bytes to 64 KiB, bandwidth
#      to 4 MiB, and the DMA engine's own rate at 1 MiB (Avalanche's
#      Figure 1);
#   4. the Billboard Protocol, one rank per guest (bbp-tool bench under
#      mc-cluster mpirun): one-way 4 bytes to 4 KiB between ranks 0 and 1
#      (SCRAMNet's Figure 1), a message to one rank against a multicast to
#      all until the last answer is back (Figure 4), and the barrier on 2
#      to NODES ranks (Figure 6).
# Then one table with the papers' figures beside ours and the goal ratios,
# and SVG plots (bbp-latency.svg, bbp-broadcast.svg, bbp-barrier.svg,
# dd-latency.svg, dd-bandwidth.svg, drawn by target/release/bbp-dd-plot
# from the BENCH lines); the plots, the raw output and the table stay in
# OUT_DIR (default bench-out/bbp-dd). About 5 minutes.
#
# Usage: scripts/bbp-dd-bench.sh [OUT_DIR]   (after scripts/setup.sh)
# Settings (environment): NODES (guests, default 4), CONFIG (the cluster
# definition, default qemu-configs/mpi.toml), TRIPS (round trips per
# latency point, default 200), BBP_ITERS (round trips per BBP point,
# default 200).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_or_refuse "" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/bench-out/bbp-dd}
NODES=${NODES:-4}
CONFIG=${CONFIG:-$REPO/qemu-configs/mpi.toml}
TRIPS=${TRIPS:-200}
BBP_ITERS=${BBP_ITERS:-200}
NAME=bbp-dd-bench
T0=$(date +%s)
say() { printf '[%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { echo "bbp-dd-bench: $*" >&2; exit 1; }
[[ "$NODES" =~ ^[0-9]+$ ]] && [ "$NODES" -ge 2 ] || die "NODES must be a number of guests, at least 2"
[[ "$TRIPS" =~ ^[0-9]+$ ]] && [ "$TRIPS" -ge 10 ] || die "TRIPS must be a number, at least 10"
[[ "$BBP_ITERS" =~ ^[0-9]+$ ]] && [ "$BBP_ITERS" -ge 10 ] || die "BBP_ITERS must be a number, at least 10"
PLOT=$REPO/target/release/bbp-dd-plot
[ -x "$PLOT" ] || die "no $PLOT: run scripts/setup.sh"
mkdir -p "$OUT"
rm -f "$OUT"/*.txt

say "building latency (MPI standard ABI) with the host compiler"
"$REPO/guest/msg/mpi/mpicc" -O2 "$REPO/tests/mpi/bench/latency.c" -o "$OUT/latency" 2>"$OUT/build.log" \
    || die "building latency failed (see $OUT/build.log)"
# shellcheck source=scripts/bench-cluster.sh
. "$REPO/scripts/bench-cluster.sh"
cp "$OUT/latency" "$REPO/.run/$NAME/share/"
x() { "$M" --name $NAME exec "$@"; }
say "cluster: $NODES guests from ${CONFIG#"$REPO"/}"

say "0. the guest's own copy speed (the floor under every layer: a copy, and a copy with UMP's check)"
x 0 --timeout 600 -- ump-tool floor --sizes 4K,64K,1M | tee "$OUT/floor.log"

say "1. UMP between guests 0 and 1 (reference)"
x 1 -- sh -c 'ump-tool serve --me 101 --peer 100 >/tmp/ump-serve.log 2>&1 &'
x 0 --timeout 3600 -- ump-tool bench --me 100 --mc-peer 101 --blocking-only --sizes 8,64,1K,4K,64K,1M,4M \
    --volume 8M --svg-dir /tmp >"$OUT/ump.log" 2>&1 || { tail "$OUT/ump.log" >&2; die "ump-tool bench failed"; }
# Rows "SIZE | T us R MB/s": one-way time and bandwidth.
awk '$2 == "|" && $1 ~ /^[0-9]+$/ { printf "BENCH ump-oneway %s %s us\nBENCH ump-bw %s %s MB/s\n", $1, $3, $1, $5 }' \
    "$OUT/ump.log" | tee "$OUT/ump.txt"
grep -q 'ump-oneway 8 ' "$OUT/ump.txt" || die "no 8-byte row in ump-tool's output (see $OUT/ump.log)"

say "2. our MPI, 8 bytes between guests 0 and 1 (reference)"
"$M" --name $NAME mpirun -n 2 --ppn 1 --timeout 3600 /share/latency >"$OUT/mpi.log" 2>&1 \
    || { tail "$OUT/mpi.log" >&2; die "latency on our MPI failed"; }
awk '$1 == "latency" && $2 == "pingpong8" { print "BENCH mpi-oneway 8 " $3 " us" }' "$OUT/mpi.log" | tee "$OUT/mpi.txt"

say "3. Direct Deposit between guests 0 and 1"
x 1 -- sh -c 'dd-tool serve --peer 0 >/tmp/dd-serve.log 2>&1 &'
x 0 --timeout 3600 -- dd-tool bench --peer 1 --trips "$TRIPS" 2> >(sed 's/^/      /' >&2) | tee "$OUT/dd.txt"
grep -q '^BENCH dd-' "$OUT/dd.txt" || die "dd-tool bench printed no figures (see above)"

say "4. the Billboard Protocol, one rank on each of the $NODES guests"
"$M" --name $NAME mpirun -n "$NODES" --ppn 1 --timeout 3600 /bin/bbp-tool bench --iters "$BBP_ITERS" \
    2> >(grep -v '^rank .*: sent' | sed 's/^/      /' >&2) | tee "$OUT/bbp.txt"
grep -q '^BENCH bbp-' "$OUT/bbp.txt" || die "bbp-tool bench printed no figures (see above)"

say "table and plots"
{
    echo "BBP, Direct Deposit, UMP and MPI, $NODES TCG guests, ${CONFIG##*/}, $(date -u +%Y-%m-%d)"
    "$PLOT" --out "$OUT" --note "$NODES TCG guests, ${CONFIG##*/}" "$OUT"/ump.txt "$OUT"/mpi.txt "$OUT"/dd.txt "$OUT"/bbp.txt
} | tee "$OUT/summary.txt"
say "done; figures and logs in ${OUT#"$REPO"/}"
