#!/usr/bin/env bash
# UMP's Figures 8 and 9 on a 2-node virtual cluster: message time and
# bandwidth against size over MEMORY CHANNEL (node 0 to node 1), shared
# memory (two processes on node 0) and TCP (node 0 to node 1, virtio-net),
# blocking and non-blocking writes, measured in one run. Prints the table
# and copies the two SVG plots to OUT_DIR (default bench-out/).
#
# Usage: scripts/ump-bench.sh [OUT_DIR]   (after scripts/setup.sh; ump-tool is
# the crate guest/ump-tool, built into the guest image)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/bench-out}
M=$REPO/target/release/mc-cluster
NAME=ump-bench
mkdir -p "$OUT"
trap '"$M" --name $NAME down >/dev/null' EXIT
"$M" --name $NAME up --nodes 2 >/dev/null
for n in 0 1; do
    "$M" --name $NAME exec $n -- sh -c 'while ! grep -q listening /var/log/imcd.log; do sleep 0.2; done'
done
# Echo processes: on node 1 (MEMORY CHANNEL peer, and TCP), on node 0 (shared-memory peer).
"$M" --name $NAME exec 1 -- sh -c 'ump-tool serve --me 101 --peer 100 --tcp-port 5998 >/tmp/serve.log 2>&1 &'
"$M" --name $NAME exec 0 -- sh -c 'ump-tool serve --me 102 --peer 100 >/tmp/serve.log 2>&1 &'
"$M" --name $NAME exec 0 --timeout 900 -- \
    ump-tool bench --me 100 --mc-peer 101 --shm-peer 102 --tcp 10.0.0.2:5998 --svg-dir /tmp "$@"
for f in fig8-latency.svg fig9-bandwidth.svg; do
    "$M" --name $NAME exec 0 -- cat "/tmp/$f" >"$OUT/ump-$f"
done
echo "plots: $OUT/ump-fig8-latency.svg $OUT/ump-fig9-bandwidth.svg"
