#!/usr/bin/env bash
# UMP's Figures 8 and 9 on a 2-node virtual cluster: message time and
# bandwidth against size over MEMORY CHANNEL (node 0 to node 1), shared
# memory (two processes on node 0) and TCP (node 0 to node 1, virtio-net),
# blocking and non-blocking writes, measured in one run. Prints the table
# and copies the two SVG plots to OUT_DIR (default bench-out/).
#
# Each figure is printed as soon as it is measured; the table comes at the
# end. The echo processes serve until the benchmark closes its channels
# (or an hour passes with nothing to do, `ump-tool serve --idle`); every
# wait of the benchmark has a deadline (`ump-tool bench --timeout`, 60 s).
#
# Usage: scripts/ump-bench.sh [OUT_DIR [ump-tool bench options...]]
# (after scripts/setup.sh; ump-tool is the crate guest/tools/ump-tool, built into
# the guest image)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_if_asked "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/bench-out}
[ $# -gt 0 ] && shift
NAME=ump-bench
mkdir -p "$OUT"
# shellcheck source=scripts/bench-cluster.sh
. "$REPO/scripts/bench-cluster.sh"
# Echo processes: on node 1 (MEMORY CHANNEL peer, and TCP), on node 0 (shared-memory peer).
"$M" --name $NAME exec 1 -- sh -c 'ump-tool serve --me 101 --peer 100 --tcp-port 5998 >/tmp/serve.log 2>&1 &'
"$M" --name $NAME exec 0 -- sh -c 'ump-tool serve --me 102 --peer 100 >/tmp/serve.log 2>&1 &'
if ! "$M" --name $NAME exec 0 --timeout 1800 -- \
    ump-tool bench --me 100 --mc-peer 101 --shm-peer 102 --tcp 10.0.0.2:5998 --svg-dir /tmp "$@"; then
    for n in 1 0; do
        echo "echo process on node $n (/tmp/serve.log):" >&2
        "$M" --name $NAME exec $n -- cat /tmp/serve.log >&2 || true
    done
    exit 1
fi
for f in fig8-latency.svg fig9-bandwidth.svg; do
    "$M" --name $NAME exec 0 -- cat "/tmp/$f" >"$OUT/ump-$f"
done
echo "plots: $OUT/ump-fig8-latency.svg $OUT/ump-fig9-bandwidth.svg"
