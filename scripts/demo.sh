#!/usr/bin/env bash
# Installs everything (scripts/setup.sh), then runs the main job:
#  1. a 2-node virtual cluster where node 0 stores a pattern through its
#     MEMORY CHANNEL transmit window and node 1 reads the same bytes from its
#     receive memory (the adapter, driven directly);
#  2. a 3-node cluster running the paper's Figure 6 program in C over the
#     TruCluster MEMORY CHANNEL API (libimc and imcd), two copies per node.
#
# Usage: scripts/demo.sh   (no options; as root on a fresh Debian bookworm machine)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_or_refuse "" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
scripts/setup.sh

M=target/release/mc-cluster
NAME=demo
trap '"$M" --name $NAME down' EXIT
step() { printf '\n==> %s\n' "$*"; }

step "boot a 2-node cluster: hub, 2 adapters, 2 QEMU guests (raw adapter access, no imcd)"
"$M" --name $NAME up --nodes 2 --config qemu-configs/raw-adapter.toml

step "node 1: map a receive buffer for DMA, enable receive on pages 0 and 1"
"$M" --name $NAME exec 1 -- mctool rx --pages 0,1

step "node 0: store an 8 KiB pattern into page 0 of the transmit window, then a flag into page 1"
"$M" --name $NAME exec 0 -- mctool fill --page 0 --seed 1996
"$M" --name $NAME exec 0 -- mctool poke --page 1 --value 1
"$M" --name $NAME exec 1 -- mctool wait --page 1 --value 1

step "what node 0 stored (first 64 bytes)"
"$M" --name $NAME exec 0 -- sh -c 'mctool pattern --page 0 --seed 1996 | od -An -tx1 | head -4'
step "what node 1 received (first 64 bytes)"
"$M" --name $NAME exec 1 -- sh -c 'mctool dump --page 0 | od -An -tx1 | head -4'

sent=$("$M" --name $NAME exec 0 -- sh -c 'mctool pattern --page 0 --seed 1996 | md5sum')
got=$("$M" --name $NAME exec 1 -- sh -c 'mctool dump --page 0 | md5sum')
step "md5 of the 8 KiB page: sent ${sent%% *}, received ${got%% *}"
"$M" --name $NAME exec 1 -- mctool stop
"$M" --name $NAME exec 1 -- mctool info
if [ "$sent" != "$got" ]; then
    echo "MISMATCH: node 1 did not receive what node 0 stored" >&2
    exit 1
fi
echo "OK: node 1 received exactly what node 0 stored"
"$M" --name $NAME down >/dev/null

step "boot a 3-node cluster with imcd (the TruCluster MEMORY CHANNEL daemon) in every guest"
"$M" --name $NAME up --nodes 3
for n in 0 1 2; do
    "$M" --name $NAME exec $n -- sh -c 'while ! grep -q listening /var/log/imcd.log; do sleep 0.2; done'
done
step "Figure 6 of the paper, in C against libimc: 2 copies on each node share a global counter"
for n in 0 1 2; do
    "$M" --name $NAME exec $n -- sh -c \
        '(FIG6_COPIES=6 figure6 >/tmp/a.log 2>&1; echo $? >/tmp/a.rc) & (FIG6_COPIES=6 figure6 >/tmp/b.log 2>&1; echo $? >/tmp/b.rc) &'
done
for n in 0 1 2; do
    "$M" --name $NAME exec $n --timeout 240 -- sh -c \
        'while [ ! -s /tmp/a.rc ] || [ ! -s /tmp/b.rc ]; do sleep 0.5; done; cat /tmp/a.log /tmp/b.log' | sed "s/^/node $n: /"
    "$M" --name $NAME exec $n -- sh -c '[ "$(cat /tmp/a.rc)$(cat /tmp/b.rc)" = 00 ]' \
        || { echo "Figure 6 failed on node $n" >&2; exit 1; }
done
echo "OK: the counter rose to 6 and went back to 0; every copy saw the pattern"
