#!/usr/bin/env bash
# What the register trace costs the store path (docs/adapter.md, "The
# register trace"): 8-byte stores per second from one guest into the
# transmit window (mctool bench-tx --stride 16, every store its own
# packet) with no trace client ("off"), with a client whose filter admits
# none of them (--kind irq: "filtered"), and with one that reads every
# store (--kind tx: "read"). Rounds are interleaved on one 2-guest cluster
# without imcd; the medians are printed with their ratios to "off".
#
# Usage: scripts/trace-bench.sh [--rounds N] [--stores N] [--name NAME]
#   (after scripts/setup.sh; default 6 rounds of 200000 stores)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
usage_or_refuse "--rounds --stores --name" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
M=$REPO/target/release/mc-cluster
ROUNDS=6
STORES=200000
NAME=bench-trace
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "trace-bench: $1 needs a value" >&2; exit 2; }
    case "$1" in
        --rounds) ROUNDS=$2; shift 2 ;;
        --stores) STORES=$2; shift 2 ;;
        --name) NAME=$2; shift 2 ;;
    esac
done
[[ $ROUNDS =~ ^[0-9]+$ && $ROUNDS -ge 1 ]] || { echo "trace-bench: --rounds must be 1 or more, not '$ROUNDS'" >&2; exit 2; }
[[ $STORES =~ ^[0-9]+$ && $STORES -ge 1000 ]] || { echo "trace-bench: --stores must be 1000 or more, not '$STORES'" >&2; exit 2; }
[ -x "$M" ] || { echo "trace-bench: $M missing: run scripts/setup.sh" >&2; exit 1; }

"$M" --name "$NAME" down >/dev/null 2>&1 || true
echo "==> booting 2 guests without imcd"
"$M" --name "$NAME" up --nodes 2 --config "$REPO/qemu-configs/raw-adapter.toml" >/dev/null

rate() { # stores per second of one bench-tx
    "$M" --name "$NAME" exec 0 -- mctool bench-tx --page 5 --stores "$STORES" --stride 16 \
        | sed -n 's/.*stores_per_sec=\([0-9]*\).*/\1/p'
}
LOG=$(mktemp); trap 'rm -f "$LOG"; "$M" --name "$NAME" down >/dev/null 2>&1 || true' EXIT
traced() { # KIND: a bench-tx while a trace client follows KIND (decoded, into $LOG)
    "$M" --name "$NAME" trace 0 --kind "$1" >"$LOG" 2>&1 &
    local t=$!
    sleep 0.7
    rate
    sleep 0.5
    kill $t 2>/dev/null; wait $t 2>/dev/null || true
}
dropped() { # events lost since the adapter was created, as the last trace's client last announced
    sed -n 's/^-- \([0-9]*\) events dropped.*/\1/p' "$LOG" | tail -1 | grep . || echo "$seen"
}
off=() filtered=() read=() seen=0
for r in $(seq 1 "$ROUNDS"); do
    off+=("$(rate)") filtered+=("$(traced irq)") read+=("$(traced tx)")
    now=$(dropped); d=$((now - seen)); seen=$now
    echo "round $r of $ROUNDS: off ${off[-1]}  filtered ${filtered[-1]}  read ${read[-1]}  (stores/s; the reader lost $d of $STORES events)"
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : int((v[NR/2]+v[NR/2+1])/2)}'; }
mo=$(median "${off[@]}") mf=$(median "${filtered[@]}") mr=$(median "${read[@]}")
echo
echo "median stores/s: off $mo, filtered $mf ($(awk "BEGIN {printf \"%.2f\", $mf/$mo}") of off), read $mr ($(awk "BEGIN {printf \"%.2f\", $mr/$mo}") of off)"
echo "events the reader lost: $seen of $((ROUNDS * STORES)) (counted by the adapter, announced by the client)"
