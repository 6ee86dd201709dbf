#!/usr/bin/env bash
# A job's start-up: from the launch command on the host to the last rank's
# return from MPI_Init, ours (`mc-cluster mpirun`) against MPICH 5.0.2
# over TCP (its mpiexec in guest 0, proxies started through mc-rsh) in the
# same guests, with the same binary (tests/mpi/bench/init.c: each rank
# prints a line as soon as MPI_Init returns; the time is that of the last
# line's arrival on the host).
#
# Boots NODES guests (default 4) from CONFIG (default qemu-configs/mpi.toml),
# runs one job first (the first after boot also maps imcd's and the
# adapters' first regions; printed apart), then RUNS jobs (default 5) of
# RANKS ranks (default NODES) on each library, alternating. Prints each
# run as it ends, then the medians and MPICH's over ours. With
# MPIEXEC_TRACE=1 in the environment, our runs also print mpiexec's and
# each rank's phases (`MCMPI_TRACE`).
#
# Usage: scripts/startup-bench.sh [--runs N] [--nodes N] [--ranks N] [--config FILE] [--no-mpich]
#   (after scripts/setup.sh; MPICH comes with its step `mpich`)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
usage_or_refuse "--runs --nodes --ranks --config --no-mpich" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
M=$REPO/target/release/mc-cluster
MC_CACHE=${MC_CACHE:-$REPO/.cache}
RUNS=5
NODES=4
RANKS=
CONFIG=$REPO/qemu-configs/mpi.toml
MPICH=1
while [ $# -gt 0 ]; do
    case "$1" in
        --no-mpich) MPICH=0; shift; continue ;;
    esac
    [ $# -ge 2 ] || { echo "startup-bench: $1 needs a value" >&2; exit 2; }
    case "$1" in
        --runs) RUNS=$2; shift 2 ;;
        --nodes) NODES=$2; shift 2 ;;
        --ranks) RANKS=$2; shift 2 ;;
        --config) CONFIG=$2; shift 2 ;;
    esac
done
RANKS=${RANKS:-$NODES}
for v in RUNS NODES RANKS; do
    [[ ${!v} =~ ^[0-9]+$ && ${!v} -ge 1 ]] || { echo "startup-bench: --${v,,} must be a count of at least 1, not '${!v}'" >&2; exit 2; }
done
[ "$NODES" -ge 2 ] || { echo "startup-bench: --nodes must be at least 2" >&2; exit 2; }
[ -x "$M" ] || { echo "startup-bench: $M missing: run scripts/setup.sh" >&2; exit 1; }
if [ "$MPICH" = 1 ] && [ ! -x "$MC_CACHE/mpich/bin/mpiexec" ]; then
    echo "startup-bench: no MPICH in $MC_CACHE/mpich: run scripts/setup.sh --only mpich, or pass --no-mpich" >&2
    exit 1
fi
CLUSTER=bench-startup
TMP=$(mktemp -d)
trap '"$M" --name "$CLUSTER" down >/dev/null 2>&1 || true; rm -rf "$TMP"' EXIT

echo "==> booting $NODES guests ($(basename "$CONFIG"))"
"$M" --name "$CLUSTER" down >/dev/null 2>&1 || true
"$M" --name "$CLUSTER" up --nodes "$NODES" --config "$CONFIG" >"$TMP/up.log" 2>&1 \
    || { cat "$TMP/up.log" >&2; echo "startup-bench: the cluster did not come up" >&2; exit 1; }
SHARE=$REPO/.run/$CLUSTER/share
"$REPO/guest/msg/mpi/mpicc" -O2 "$REPO/tests/mpi/bench/init.c" -o "$SHARE/init" 2>"$TMP/build.log" \
    || { cat "$TMP/build.log" >&2; echo "startup-bench: building init.c failed" >&2; exit 1; }
if [ "$MPICH" = 1 ]; then
    cp -r "$MC_CACHE/mpich" "$SHARE/mpich"
    cp "$REPO/guest/msg/mpi/mc-rsh" "$SHARE/mc-rsh"
fi
hosts=$(seq -s, -f 'node%g' 0 $((NODES - 1)))
ppn=$(( (RANKS + NODES - 1) / NODES ))

python3 - "$M" "$CLUSTER" "$RANKS" "$RUNS" "$MPICH" "$hosts" "$ppn" <<'PY'
import os, statistics, subprocess, sys, time

m, cluster, ranks, runs, mpich, hosts, ppn = sys.argv[1:]
ranks, runs, mpich = int(ranks), int(runs), mpich == "1"
trace = os.environ.get("MPIEXEC_TRACE")

def ours():
    env = ["--env", "MPIEXEC_TRACE=1", "--env", "MCMPI_TRACE=1"] if trace else []
    return [m, "--name", cluster, "mpirun", "--timeout", "120", "-n", str(ranks), *env, "/share/init"]

def theirs():
    script = (f"cd /tmp && LD_LIBRARY_PATH=/share/mpich/lib /share/mpich/bin/mpiexec -launcher rsh "
              f"-launcher-exec /share/mc-rsh -hosts {hosts} -n {ranks} -ppn {ppn} "
              f"-genv MPIR_CVAR_CH4_NETMOD ofi -genv FI_PROVIDER tcp -genv FI_TCP_IFACE eth0 /share/init")
    return [m, "--name", cluster, "exec", "0", "--timeout", "120", "--", "sh", "-c", script]

def start(cmd, what):
    """Seconds from the launch to the last rank's line, and the job's whole time."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, last = 0, None
    for line in p.stdout:
        if line.startswith("initialized "):
            seen += 1
            if seen == ranks:
                last = time.monotonic() - t0
    err = p.stderr.read()
    rc = p.wait()
    whole = time.monotonic() - t0
    if rc != 0 or last is None:
        sys.exit(f"startup-bench: {what} failed (exit {rc}, {seen} of {ranks} ranks initialized):\n{err}")
    if trace and what == "ours":
        sys.stderr.write(err)
    return last, whole

first, whole = start(ours(), "ours")
print(f"first job after boot, ours: last MPI_Init returned {first:.2f} s after the launch (job {whole:.2f} s)", flush=True)
if mpich:
    first, whole = start(theirs(), "MPICH")
    print(f"first job after boot, MPICH over TCP: {first:.2f} s (job {whole:.2f} s)", flush=True)
figs = {"ours": [], "MPICH": []}
for r in range(1, runs + 1):
    for name, cmd in [("ours", ours)] + ([("MPICH", theirs)] if mpich else []):
        s, whole = start(cmd(), name)
        figs[name].append(s)
        print(f"run {r}/{runs}, {name}: last MPI_Init returned {s:.2f} s after the launch (job {whole:.2f} s)", flush=True)
o = statistics.median(figs["ours"])
line = f"{ranks} ranks on {hosts.count(',') + 1} guests: start-up median {o:.2f} s (ours)"
if mpich:
    t = statistics.median(figs["MPICH"])
    line += f", {t:.2f} s (MPICH over TCP): MPICH/ours = {t / o:.1f}x"
print(line)
PY
