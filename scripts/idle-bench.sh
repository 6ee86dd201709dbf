#!/usr/bin/env bash
# Idle cost of a virtual cluster: what each guest takes of a host core
# while nothing runs in it but its daemons (imcd, mpid, the agent).
#
# Boots NODES guests (default 4) with the default cluster definition,
# lets them settle, then reads the host's CPU accounting of every QEMU
# (its vCPU threads and the rest apart) and of the hub over SECONDS
# (default 60). Inside each guest it reads how much CPU time imcd, mpid
# and the agent used over the same window (as the guest counts it).
#
# Usage: scripts/idle-bench.sh [--nodes N] [--seconds S] [--config FILE]
#                              [--name NAME] [--keep]
#   --keep   leave the cluster running afterwards (default: down)
#   (after scripts/setup.sh)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
usage_or_refuse "--nodes --seconds --config --name --keep" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
M=$REPO/target/release/mc-cluster
NODES=4
SECONDS_=60
CONFIG=$REPO/qemu-configs/default.toml
NAME=bench-idle
KEEP=0
while [ $# -gt 0 ]; do
    [ "$1" = --keep ] || [ $# -ge 2 ] || { echo "idle-bench: $1 needs a value" >&2; exit 2; }
    case "$1" in
        --nodes) NODES=$2; shift 2 ;;
        --seconds) SECONDS_=$2; shift 2 ;;
        --config) CONFIG=$2; shift 2 ;;
        --name) NAME=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
    esac
done
[[ $NODES =~ ^[0-9]+$ && $NODES -ge 1 ]] || { echo "idle-bench: --nodes must be a count of at least 1, not '$NODES'" >&2; exit 2; }
[[ $SECONDS_ =~ ^[0-9]+$ && $SECONDS_ -ge 5 ]] || { echo "idle-bench: --seconds must be 5 or more, not '$SECONDS_'" >&2; exit 2; }
[ -x "$M" ] || { echo "idle-bench: $M missing: run scripts/setup.sh" >&2; exit 1; }

TCK=$(getconf CLK_TCK)
RUN=$REPO/.run/$NAME
[ "$KEEP" = 1 ] || trap '"$M" --name "$NAME" down >/dev/null 2>&1 || true' EXIT

echo "==> booting $NODES guests ($(basename "$CONFIG"))"
"$M" --name "$NAME" down >/dev/null 2>&1 || true
"$M" --name "$NAME" up --nodes "$NODES" --config "$CONFIG"
echo "==> settling 10 s (boot-time work ends)"
sleep 10

# Host side: "pid comm-class ticks" for every thread of every QEMU and the hub.
pids() { # the QEMU pids in node order, then the hub's
    python3 - "$RUN/state.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(" ".join(str(n["qemu_pid"]) for n in s["nodes"]), s["hub_pid"])
EOF
}
read -r -a PIDS <<<"$(pids)"
host_ticks() { # PID -> "vcpu other" ticks (utime + stime) of its threads
    local pid=$1 v=0 o=0 t comm ticks
    for t in /proc/"$pid"/task/*; do
        comm=$(cat "$t/comm" 2>/dev/null) || continue
        # The fields after the command name: utime and stime are 14 and 15.
        ticks=$(sed 's/.*) //' "$t/stat" 2>/dev/null | awk '{ print $12 + $13 }') || continue
        if [[ $comm == CPU* ]]; then v=$((v + ticks)); else o=$((o + ticks)); fi
    done
    echo "$v $o"
}
# Guest side: CPU ticks (as the guest counts them) of its daemons.
guest_ticks() { # NODE -> "imcd mpid agent"
    "$M" --name "$NAME" exec "$1" --timeout 30 -- sh -c '
        for n in imcd mpid mc-agent; do
            t=0
            for p in $(pidof $n); do
                t=$((t + $(sed "s/.*) //" /proc/$p/stat | awk "{ print \$12 + \$13 }")))
            done
            printf "%s " $t
        done' 2>/dev/null || echo "? ? ?"
}

declare -a H0 G0
for i in "${!PIDS[@]}"; do H0[i]=$(host_ticks "${PIDS[i]}"); done
for n in $(seq 0 $((NODES - 1))); do G0[n]=$(guest_ticks "$n"); done
t0=$(date +%s.%N)
echo "==> measuring $SECONDS_ s"
for ((s = 10; s <= SECONDS_; s += 10)); do
    sleep 10
    echo "  ${s} s"
done
rest=$((SECONDS_ % 10))
[ "$rest" -gt 0 ] && sleep "$rest"
declare -a H1 G1
for i in "${!PIDS[@]}"; do H1[i]=$(host_ticks "${PIDS[i]}"); done
t1=$(date +%s.%N)
for n in $(seq 0 $((NODES - 1))); do G1[n]=$(guest_ticks "$n"); done
wall=$(echo "$t1 - $t0" | bc -l)

pct() { echo "scale=1; 100 * $1 / $TCK / $wall" | bc -l; }
echo
echo "idle cost over ${wall%.*} s, $NODES guests, $(basename "$CONFIG"), % of one host core:"
printf "%-6s %8s %8s %8s   %-28s\n" "" "QEMU" "vCPU" "other" "in the guest: imcd mpid agent"
total=0
for n in $(seq 0 $((NODES - 1))); do
    read -r v0 o0 <<<"${H0[n]}"
    read -r v1 o1 <<<"${H1[n]}"
    dv=$((v1 - v0)); do_=$((o1 - o0))
    total=$((total + dv + do_))
    read -r a0 b0 c0 <<<"${G0[n]}"
    read -r a1 b1 c1 <<<"${G1[n]}"
    guest="?"
    [[ $a0$a1$b0$b1$c0$c1 =~ ^[0-9]+$ ]] && guest="$(pct $((a1 - a0))) $(pct $((b1 - b0))) $(pct $((c1 - c0)))"
    printf "%-6s %7s%% %7s%% %7s%%   %s\n" "node$n" "$(pct $((dv + do_)))" "$(pct $dv)" "$(pct $do_)" "$guest"
done
hub=${#PIDS[@]}; hub=$((hub - 1))
read -r v0 o0 <<<"${H0[hub]}"
read -r v1 o1 <<<"${H1[hub]}"
printf "%-6s %7s%%\n" "hub" "$(pct $((v1 + o1 - v0 - o0)))"
echo "mean per guest: $(echo "scale=1; 100 * $total / $TCK / $wall / $NODES" | bc -l)% of a core"
