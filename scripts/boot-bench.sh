#!/usr/bin/env bash
# Boot time of a virtual cluster: how long `mc-cluster up` takes until
# every node is ready (its agent answers and its mpid listens, so a job can
# start at once), for several cluster sizes, one after the other.
#
# For each size it prints when the first and the last node were ready
# (seconds since the guests started), and the whole `up` (hub, LAN and
# guests).
#
# Usage: scripts/boot-bench.sh [--nodes LIST] [--config FILE] [--name NAME]
#   --nodes LIST   comma-separated cluster sizes (default 2,4,8)
#   --config FILE  the cluster definition (default qemu-configs/default.toml)
#   (after scripts/setup.sh)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
usage_or_refuse "--nodes --config --name" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
M=$REPO/target/release/mc-cluster
SIZES=2,4,8
CONFIG=$REPO/qemu-configs/default.toml
NAME=bench-boot
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "boot-bench: $1 needs a value" >&2; exit 2; }
    case "$1" in
        --nodes) SIZES=$2; shift 2 ;;
        --config) CONFIG=$2; shift 2 ;;
        --name) NAME=$2; shift 2 ;;
    esac
done
[[ $SIZES =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "boot-bench: --nodes is a comma-separated list of sizes, not '$SIZES'" >&2; exit 2; }
[ -f "$CONFIG" ] || { echo "boot-bench: no config file $CONFIG" >&2; exit 2; }
[ -x "$M" ] || { echo "boot-bench: $M missing: run scripts/setup.sh" >&2; exit 1; }
trap '"$M" --name "$NAME" down >/dev/null 2>&1 || true' EXIT

declare -a ROWS
for n in ${SIZES//,/ }; do
    "$M" --name "$NAME" down >/dev/null 2>&1 || true
    echo "==> booting $n guests ($(basename "$CONFIG"))"
    t0=$(date +%s.%N)
    out=$("$M" --name "$NAME" up --nodes "$n" --config "$CONFIG" 2>&1) || { echo "$out"; echo "boot-bench: up of $n nodes failed" >&2; exit 1; }
    up_s=$(echo "$(date +%s.%N) - $t0" | bc)
    # "node K ready after S s (mpid listening)", one line per node.
    ready=$(echo "$out" | sed -n 's/.*node [0-9]* ready after \([0-9.]*\) s.*/\1/p' | sort -n)
    [ "$(echo "$ready" | grep -c .)" = "$n" ] || { echo "$out"; echo "boot-bench: not every node said it was ready" >&2; exit 1; }
    first=$(echo "$ready" | head -1)
    last=$(echo "$ready" | tail -1)
    printf '    %s nodes: first ready %s s, last %s s, up returned after %.1f s\n' "$n" "$first" "$last" "$up_s"
    ROWS+=("$(printf '| %s | %s s | %s s | %.1f s |' "$n" "$first" "$last" "$up_s")")
done
"$M" --name "$NAME" down >/dev/null 2>&1 || true

echo
echo "== boot-bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) host cores, $(basename "$CONFIG") =="
echo "ready = the guest's agent answers and its mpid listens (seconds after the guests started)"
echo "| nodes | first ready | last ready | mc-cluster up |"
echo "|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
