#!/usr/bin/env bash
# Installs everything (scripts/setup.sh), then runs the main job: a 2-node
# virtual cluster where node 0 stores a pattern through its MEMORY CHANNEL
# transmit window and node 1 reads the same bytes from its receive memory.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
scripts/setup.sh

M=target/release/mc-cluster
NAME=demo
trap '"$M" --name $NAME down' EXIT
step() { printf '\n==> %s\n' "$*"; }

step "boot a 2-node cluster: hub, 2 adapters, 2 QEMU guests"
"$M" --name $NAME up --nodes 2

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
