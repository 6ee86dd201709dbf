#!/usr/bin/env bash
# The soak test: a cluster of real guests (per-guest adapters) runs a
# checked workload on every node (sequenced broadcast writes, counters
# under a cluster spinlock, UMP ping-pong) while a seeded fault injector
# flaps links, holds links down past the flap grace, corrupts frames,
# kills and reboots guests and restarts the hub. Prints progress as it
# goes and one table at the end; exits non-zero unless every fault was
# detected and nothing was lost, reordered or hung outside an announced
# outage. Figures: .run/soak/share/soak/result.json.
#
# Usage: scripts/soak.sh [--nodes N] [--minutes M] [--seed S]
#        [--fault-every SECONDS] [--rate RECORDS_PER_S] [--keep] [--hosts H]
#        (defaults: 4 nodes, 10 minutes, seed 1; run scripts/setup.sh first)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_or_refuse "--nodes --minutes --seed --fault-every --rate --keep --hosts" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
cargo build --release --quiet -p tests --bin mc-soak
exec "$REPO/target/release/mc-soak" "$@"
