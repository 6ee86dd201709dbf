#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo fuzz, libFuzzer) of the decoders that take
# untrusted bytes. Targets (fuzz/fuzz_targets/):
#   vfio_user     the vfio-user server (device/src/vfio_user.rs) over a real
#                 socket pair, with fds attached, behind a checking device
#   link_frame    the link decoder (protocol/link): raw frame streams and
#                 sealed payloads of every kind
#   control_line  the hub's control-line parser (hub/src/control.rs)
#   imc_line      imcd's request decoder and the clients' reply decoder
#                 (protocol/imc-proto)
# Each target runs N seconds; seeds come from the encoders (written into the
# corpus at start). Prints per target: runs, runs/s, coverage (edges),
# features, corpus size, crashes. Exits 1 when a target crashed; the input
# is in fuzz/artifacts/<target>/ (reproduce: scripts/fuzz.sh --repro TARGET FILE).
#
# Needs cargo-fuzz: scripts/setup.sh --only fuzz (into $MC_CACHE/cargo-fuzz).
# Default build: no sanitizer (stable Rust as is; the code under test is
# safe Rust, whose checks panic on their own). --asan builds with
# AddressSanitizer, which needs -Zsanitizer: RUSTC_BOOTSTRAP=1 lets the
# stable compiler take it (separate build folder, fuzz/target/asan).
#
# Usage: scripts/fuzz.sh [--seconds N] [--asan] [--if-installed] [TARGET...]
#        scripts/fuzz.sh [--asan] --repro TARGET FILE
#   --seconds N     per target (default 30)
#   --asan          AddressSanitizer build (above)
#   --repro T FILE  run target T on one input FILE (a crash to reproduce)
#   --if-installed  without cargo-fuzz: say so and exit 0 (the test script's smoke run)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MC_CACHE=${MC_CACHE:-$REPO/.cache}
ALL_TARGETS=(vfio_user link_frame control_line imc_line)
SECONDS_PER=30
ASAN=0
IF_INSTALLED=0
REPRO=()
TARGETS=()
while [ $# -gt 0 ]; do
    arg=$1; shift
    case "$arg" in
        --seconds) SECONDS_PER="${1:?--seconds needs a number}"; shift ;;
        --asan) ASAN=1 ;;
        --if-installed) IF_INSTALLED=1 ;;
        --repro)
            REPRO=("${1:?--repro needs TARGET FILE}" "$(realpath -e "${2:?--repro needs TARGET FILE}")") || exit 2
            TARGETS+=("$1"); shift 2 ;;
        -h|--help) usage_text; exit 0 ;;
        -*) echo "fuzz: unknown option '$arg' (try --help)" >&2; exit 2 ;;
        *) TARGETS+=("$arg") ;;
    esac
done
[[ "$SECONDS_PER" =~ ^[0-9]+$ ]] && [ "$SECONDS_PER" -gt 0 ] || { echo "fuzz: --seconds needs a positive number" >&2; exit 2; }
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
    [[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || { echo "fuzz: unknown target '$t' (targets: ${ALL_TARGETS[*]})" >&2; exit 2; }
done

PATH="$MC_CACHE/cargo-fuzz/bin:$PATH"
if ! command -v cargo-fuzz >/dev/null; then
    msg="cargo-fuzz is not installed (scripts/setup.sh --only fuzz installs it into $MC_CACHE/cargo-fuzz)"
    if [ "$IF_INSTALLED" = 1 ]; then echo "fuzz: skipped: $msg"; exit 0; fi
    echo "fuzz: $msg" >&2
    exit 2
fi

cd "$REPO/fuzz"
BUILD=(-O)
if [ "$ASAN" = 1 ]; then
    export RUSTC_BOOTSTRAP=1
    BUILD+=(--sanitizer address --target-dir "$REPO/fuzz/target/asan")
else
    BUILD+=(--sanitizer none)
fi

t0=$(date +%s)
echo "==> building the fuzz targets (cargo fuzz build ${BUILD[*]})"
cargo fuzz build "${BUILD[@]}" 2>&1 | grep -Ev '^\s+(Compiling|Checking|Blocking|Downloaded?|Updating|Locking)\b' || true
[ "${PIPESTATUS[0]}" = 0 ] || { echo "fuzz: build failed" >&2; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

if [ ${#REPRO[@]} -gt 0 ]; then
    exec cargo fuzz run "${BUILD[@]}" "${REPRO[0]}" "${REPRO[1]}"
fi

LOGS="$REPO/fuzz/artifacts/logs"
mkdir -p "$LOGS"
crashed=0
rows=()
for t in "${TARGETS[@]}"; do
    log="$LOGS/$t.log"
    echo "==> $t: ${SECONDS_PER} s (log: ${log#"$REPO"/})"
    rc=0
    FUZZ_SEED_DIR="$REPO/fuzz/corpus/$t" cargo fuzz run "${BUILD[@]}" "$t" -- \
        -max_total_time="$SECONDS_PER" -timeout=10 -max_len=8192 -rss_limit_mb=2048 \
        -print_final_stats=1 >"$log" 2>&1 || rc=$?
    # The last status line libFuzzer printed: "#RUNS <event> cov: C ft: F corp: N/SIZE ... exec/s: R".
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    [ -n "$runs" ] || runs=$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")
    if [ "$rc" = 0 ]; then
        crashes=0
    else
        crashed=1
        crashes="1: $(sed -n 's/.*Test unit written to \(.*\)/\1/p' "$log" | tail -1)"
        [ "$crashes" != "1: " ] || crashes="exit $rc (see the log)"
        { grep -E "panicked at|ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer)" "$log" || true; } | head -3 | sed 's/^/    /'
    fi
    rows+=("$(printf '%-13s %10s %8s %6s %7s %7s  %s' "$t" "${runs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes")")
done

echo
printf '%-13s %10s %8s %6s %7s %7s  %s\n' target runs runs/s cov ft corpus crashes
printf '%s\n' "${rows[@]}"
echo "total: $(( $(date +%s) - t0 )) s"
exit "$crashed"
