#!/usr/bin/env bash
# The whole test suite. Does the set-up first (idempotent: seconds when
# everything is already built), then:
#   lints      — cargo fmt --check, cargo clippy --workspace --all-targets -D warnings,
#                cargo-machete (no unused dependencies; set-up step "lint")
#   fast tier  — unit and in-process tests (real sockets, memfd guest RAM, real hub)
#   QEMU tier  — real guests booted by mc-cluster (tests/tests/*.rs, #[ignore]d
#                in a plain `cargo test`, run here with --ignored), with the
#                adapters on the hub's local ports (the default), then a
#                subset again with per-guest adapter processes
# Usage: scripts/test.sh [--fast]   (--fast: skip the QEMU tier)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"; usage_or_refuse "--fast" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
FAST_ONLY=0
[ "${1:-}" = "--fast" ] && FAST_ONLY=1

if [ "$FAST_ONLY" = 1 ]; then
    scripts/setup.sh --only "rust mpich mpich-suite pvm lint"
else
    scripts/setup.sh
    scripts/setup.sh --only lint
fi

echo
echo "==> lints (rustfmt, clippy with the workspace's deny lints, no unused dependencies)"
t0=$(date +%s)
cargo fmt --all --check || { echo "cargo fmt --check failed: run 'cargo fmt --all'"; exit 1; }
cargo clippy --workspace --all-targets -- -D warnings
"${MC_CACHE:-.cache}/cargo-machete/bin/cargo-machete" \
    || { echo "cargo-machete found dependencies no code uses: remove them from the Cargo.toml it names"; exit 1; }
echo "lints: $(( $(date +%s) - t0 )) s"

echo
echo "==> fast tier"
t0=$(date +%s)
cargo test --workspace --release
# The in-process adapter suites ran on local ports of the hub (the default,
# what mc-cluster uses); run them again with per-guest adapters on link ports.
MC_TEST_PORTS=link cargo test --release -p tests --test adapter_in_process --test adapter_fds --test vfio_user_fuzz
echo "fast tier: $(( $(date +%s) - t0 )) s"

if [ "$FAST_ONLY" = 0 ]; then
    echo
    echo "==> QEMU tier (real guests, one cluster at a time)"
    t0=$(date +%s)
    cargo test --release -p tests --no-fail-fast -- --ignored --test-threads=1
    echo "QEMU tier: $(( $(date +%s) - t0 )) s"
    echo
    echo "==> QEMU tier, per-guest adapters (mc-adapter processes on link ports): a representative subset"
    t0=$(date +%s)
    MC_TEST_ADAPTERS=per-guest cargo test --release -p tests -- --ignored --test-threads=1 \
        two_guests_store_reaches_peer killed_qemu_then_down_leaves_nothing \
        notification_wakes_waiting_guest_process injected_link_and_crc_errors_reach_the_guest \
        cluster_spinlock_counts_exactly_across_three_guests imc_kill_signals_remote_process \
        ump_pingpong_two_guests
    echo "QEMU tier, per-guest adapters: $(( $(date +%s) - t0 )) s"
fi
