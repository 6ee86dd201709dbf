#!/usr/bin/env bash
# The 4-guest MPI barrier against the 2-guest 8-byte ping-pong, and how
# long the guests' vCPU threads waited for a host core meanwhile: on a
# host with fewer cores than vCPUs the barrier is bound by the cores, and
# this shows by how much.
#
# Boots 2 guests, then 4 (default cluster definition, 1 rank per guest),
# builds tests/mpi/bench/latency.c with mpicc into each cluster's shared
# folder, and runs it RUNS times (default 3) with ROUNDS round trips
# (default 3000). Per run: the ping-pong, barrier and allreduce medians,
# and the vCPU threads' time running and waiting on the host's run queue
# (fields 1 and 2 of /proc/PID/task/TID/schedstat, summed over the
# threads named "CPU n/TCG" of the cluster's QEMUs), over the run's wall
# time. Last line: the 4-guest barrier over the 2-guest ping-pong
# (medians of the runs).
#
# Usage: scripts/barrier-bench.sh [--runs N] [--rounds N] [--config FILE]
#   (after scripts/setup.sh)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
usage_or_refuse "--runs --rounds --config" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
M=$REPO/target/release/mc-cluster
RUNS=3
ROUNDS=3000
CONFIG=$REPO/qemu-configs/default.toml
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "barrier-bench: $1 needs a value" >&2; exit 2; }
    case "$1" in
        --runs) RUNS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --config) CONFIG=$2; shift 2 ;;
    esac
done
[[ $RUNS =~ ^[0-9]+$ && $RUNS -ge 1 ]] || { echo "barrier-bench: --runs must be a count of at least 1, not '$RUNS'" >&2; exit 2; }
[[ $ROUNDS =~ ^[0-9]+$ && $ROUNDS -ge 10 ]] || { echo "barrier-bench: --rounds must be 10 or more, not '$ROUNDS'" >&2; exit 2; }
[ -x "$M" ] || { echo "barrier-bench: $M missing: run scripts/setup.sh" >&2; exit 1; }
MPICC=$REPO/guest/msg/mpi/mpicc
TMP=$(mktemp -d)
CLUSTER=
trap '[ -z "$CLUSTER" ] || "$M" --name "$CLUSTER" down >/dev/null 2>&1 || true; rm -rf "$TMP"' EXIT

# vcpu_ms: "running waiting" milliseconds of the vCPU threads of cluster $1.
vcpu_ms() {
    python3 - "$REPO/.run/$1/state.json" <<'EOF'
import json, os, sys
s = json.load(open(sys.argv[1]))
run = wait = 0
for n in s["nodes"]:
    base = f"/proc/{n['qemu_pid']}/task"
    for t in os.listdir(base):
        try:
            comm = open(f"{base}/{t}/comm").read()
            if "/TCG" not in comm and "/KVM" not in comm:
                continue
            r, w, _ = open(f"{base}/{t}/schedstat").read().split()
        except OSError:
            continue
        run += int(r)
        wait += int(w)
print(run // 1_000_000, wait // 1_000_000)
EOF
}

for nodes in 2 4; do
    CLUSTER=bench-barrier$nodes
    echo "==> booting $nodes guests ($(basename "$CONFIG"))"
    "$M" --name "$CLUSTER" down >/dev/null 2>&1 || true
    "$M" --name "$CLUSTER" up --nodes "$nodes" --config "$CONFIG" >"$TMP/up.log" 2>&1 \
        || { cat "$TMP/up.log" >&2; echo "barrier-bench: the cluster did not come up" >&2; exit 1; }
    "$MPICC" -O2 "$REPO/tests/mpi/bench/latency.c" -o "$REPO/.run/$CLUSTER/share/latency" 2>"$TMP/build.log" \
        || { cat "$TMP/build.log" >&2; echo "barrier-bench: building latency.c failed" >&2; exit 1; }
    for r in $(seq 1 "$RUNS"); do
        read -r run0 wait0 <<<"$(vcpu_ms "$CLUSTER")"
        t0=$(date +%s%N)
        "$M" --name "$CLUSTER" mpirun -n "$nodes" --ppn 1 /share/latency -r "$ROUNDS" >"$TMP/out" 2>&1 \
            || { cat "$TMP/out" >&2; echo "barrier-bench: latency.c failed" >&2; exit 1; }
        t1=$(date +%s%N)
        read -r run1 wait1 <<<"$(vcpu_ms "$CLUSTER")"
        p50() { awk -v w="$1" '$1 == "latency" && $2 == w { print $3 }' "$TMP/out"; }
        printf '%d guests, run %d: pingpong8 p50 %s us, barrier %s us, allreduce8 %s us; vCPUs ran %.1f s and waited for a core %.1f s over %.1f s\n' \
            "$nodes" "$r" "$(p50 pingpong8)" "$(p50 barrier)" "$(p50 allreduce8)" \
            "$(echo "($run1 - $run0) / 1000" | bc -l)" "$(echo "($wait1 - $wait0) / 1000" | bc -l)" \
            "$(echo "($t1 - $t0) / 1000000000" | bc -l)"
        echo "$nodes $(p50 pingpong8) $(p50 barrier)" >>"$TMP/figures"
    done
    "$M" --name "$CLUSTER" down >/dev/null
    CLUSTER=
done
python3 - "$TMP/figures" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
ping2 = statistics.median(float(r[1]) for r in rows if r[0] == "2")
bar4 = statistics.median(float(r[2]) for r in rows if r[0] == "4")
print(f"4-guest barrier {bar4:.1f} us / 2-guest pingpong8 {ping2:.1f} us = {bar4 / ping2:.1f}x (medians of the runs)")
EOF
