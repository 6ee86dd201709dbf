#!/usr/bin/env bash
# Bulk data guest to guest on a 2-node virtual cluster, every path in one
# run (node 0 to node 1), each figure printed as soon as it is measured:
#   1. the guest's own copy speed (ump-tool floor): the floor under any
#      message passing inside a TCG guest; and the ivshmem memory-copy
#      floor (mctool ivshmem-floor): a copy into QEMU ivshmem shared
#      memory and one out of it per message, the floor under any transport
#      through shared memory between guests (the cluster gets ivshmem);
#   2. the adapter's transmit DMA engine against stores through the
#      transmit window (mctool imc-dma-bench, through imcd);
#   3. UMP blocking messages over MEMORY CHANNEL, stores only
#      (UMP_DMA_THRESHOLD=0), then with DMA (the default threshold);
#   4. TCP between the same guests (virtio-net).
# After each series: the host CPU time it took (all processes, from
# /proc/stat) per GB moved. Figure 9 with the DMA path is copied to OUT_DIR
# (default bench-out/) as dma-fig9-bandwidth.svg.
#
# Usage: scripts/dma-bench.sh [OUT_DIR]
# Settings (environment): SIZES (default 4K,64K,256K,1M,4M), VOLUME (bytes
# per size, default 16M), RING (UMP_MC_BUFFER for the UMP series, default
# 32K, the paper's), SECS (seconds per size of the raw engine series, 2).
# CONFIG: a cluster definition other than qemu-configs/default.toml.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_or_refuse "" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/bench-out}
SIZES=${SIZES:-4K,64K,256K,1M,4M}
VOLUME=${VOLUME:-16M}
RING=${RING:-32K}
SECS=${SECS:-2}
NAME=dma-bench
mkdir -p "$OUT"
# The cluster: CONFIG (or the default) with ivshmem in every guest.
base=${CONFIG:-$REPO/qemu-configs/default.toml}
[ -f "$base" ] || { echo "dma-bench: no cluster definition $base" >&2; exit 1; }
CONFIG=$OUT/dma-bench-cluster.toml
if grep -q '^\[guest\]' "$base"; then
    sed -e '/^ivshmem *=/d' -e 's/^\[guest\]/[guest]\nivshmem = true/' "$base"
else
    cat "$base"
    printf '\n[guest]\nivshmem = true\n'
fi >"$CONFIG"
echo "cluster: $base, with ivshmem"
# shellcheck source=scripts/bench-cluster.sh
. "$REPO/scripts/bench-cluster.sh"
x() { "$M" --name $NAME exec "$@"; }
# Host CPU seconds used so far, all cores (user + nice + system).
cpu() { awk '/^cpu /{printf "%.2f", ($2+$3+$4)/100}' /proc/stat; }
# per_gb SERIES CPU0 BYTES: prints the host CPU per GB of a series.
per_gb() {
    awk -v s="$1" -v c0="$2" -v c1="$(cpu)" -v b="$3" \
        'BEGIN{ if (b > 0) printf "host CPU for %s: %.1f s per GB moved (%.1f s for %.0f MB)\n", s, (c1-c0)/(b/1e9), c1-c0, b/1e6 }'
}
# Bytes a `ump-tool bench` log says it moved.
moved() { sed -n 's/^moved \([0-9]*\) bytes.*/\1/p' "$1" | tail -1; }
sizes_bytes=$(echo "$SIZES" | tr ',' '\n' | awk '/[kK]$/{print $0*1024; next} /[mM]$/{print $0*1048576; next} {print $0+0}' | paste -sd, -)

echo "== 1. guest copy speed, and the ivshmem memory-copy floor (node 0)"
x 0 -- ump-tool floor --sizes "$SIZES"
volume_bytes=$(echo "$VOLUME" | awk '/[kK]$/{print $0*1024; next} /[mM]$/{print $0*1048576; next} {print $0+0}')
x 0 --timeout 1800 -- mctool ivshmem-floor --sizes "$sizes_bytes" --volume "$volume_bytes" | tee "$OUT/dma-ivshmem-floor.txt"

echo "== 2. transmit DMA engine against stores (through imcd, node 0 to node 1)"
x 1 -- sh -c "mctool imc-dma-bench --role recv --sizes $sizes_bytes >/tmp/dmarecv.log 2>&1 &"
sleep 2
c0=$(cpu)
x 0 --timeout 1800 -- mctool imc-dma-bench --role send --sizes "$sizes_bytes" --secs "$SECS" | tee "$OUT/dma-engine.txt"
echo "(host CPU for the raw series, stores and DMA together: $(awk -v a="$c0" -v b="$(cpu)" 'BEGIN{printf "%.1f", b-a}') s)"

run_ump() { # LABEL THRESHOLD ME PEER [extra bench options]
    local label=$1 thr=$2 me=$3 peer=$4; shift 4
    x 1 -- sh -c "UMP_MC_BUFFER=$RING UMP_DMA_THRESHOLD=$thr ump-tool serve --me $peer --peer $me >/tmp/serve-$peer.log 2>&1 &"
    local c0 log=$OUT/dma-ump-$me.txt
    c0=$(cpu)
    x 0 --timeout 1800 -- env UMP_MC_BUFFER="$RING" UMP_DMA_THRESHOLD="$thr" \
        ump-tool bench --me "$me" --mc-peer "$peer" --mc-label "$label" --blocking-only \
        --sizes "$SIZES" --volume "$VOLUME" --svg-dir /tmp "$@" | tee "$log"
    per_gb "$label" "$c0" "$(moved "$log")"
}
echo "== 3. UMP over MEMORY CHANNEL, ${RING} ring, blocking messages"
run_ump "UMP, stores" 0 200 201
run_ump "UMP, DMA" "${UMP_DMA_THRESHOLD:-1024}" 210 211
x 0 -- cat /tmp/fig9-bandwidth.svg >"$OUT/dma-fig9-bandwidth.svg"

echo "== 4. TCP between the same guests"
x 1 -- sh -c "ump-tool serve --me 221 --peer 220 --tcp-port 5997 >/tmp/serve-tcp.log 2>&1 &"
x 0 -- mkdir -p /tmp/tcp
c0=$(cpu)
x 0 --timeout 1800 -- ump-tool bench --me 220 --tcp 10.0.0.2:5997 --sizes "$SIZES" --volume "$VOLUME" \
    --svg-dir /tmp/tcp | tee "$OUT/dma-tcp.txt" || true
per_gb TCP "$c0" "$(moved "$OUT/dma-tcp.txt")"
echo "figures: $OUT/dma-*.txt; plot: $OUT/dma-fig9-bandwidth.svg"
