#!/usr/bin/env bash
# Latency benchmark of the virtual MEMORY CHANNEL, guest to guest, against
# TCP and plain shared memory between the same two guests, in one run:
#
#   1. MEMORY CHANNEL: ping-pong of 8-byte stores between two guests, the
#      receiver polling its receive memory (one way = RTT / 2);
#   2. TCP: the same ping-pong over the cluster LAN (virtio-net);
#   3. ivshmem: the same ping-pong over QEMU ivshmem-plain shared memory
#      polled by both guests (the memory-speed floor between two VMs);
#   4. the ratios TCP / MEMORY CHANNEL and MEMORY CHANNEL / ivshmem;
#   5. UMP's 0-byte message time over MEMORY CHANNEL (ump-tool bench);
#   6. 8 guests storing at once (mctool bench-tx, one packet per store):
#      aggregate packets/s and deliveries/s from the hub's counters
#      (a second, 8-node cluster: minutes; skipped with --quick);
#   7. host-only: the hub benchmark (cargo bench -p hub --bench hub_bench).
#
# Percentiles are nearest-rank over the raw samples (mc_guest::stats); the
# round-trip samples are kept in OUT_DIR (default bench-out/). Clusters:
# bench-lat (2 nodes) and bench-lat8 (8 nodes), qemu-configs/latency-bench.toml.
#
# Usage: scripts/latency-bench.sh [--rounds N] [--warmup N] [--stores N]
#                                 [--hub-nodes LIST] [--quick] [--out DIR]
#   (after scripts/setup.sh)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
M=$REPO/target/release/mc-cluster
CFG=$REPO/qemu-configs/latency-bench.toml
NAME=bench-lat
NAME8=bench-lat8

ROUNDS=2000
WARMUP=200
STORES=100000
HUB_NODES=2,8
QUICK=0
OUT=$REPO/bench-out
ADAPTERS=in-hub
WRITE_MULTIPLE=auto

usage() {
    cat <<EOF
usage: scripts/latency-bench.sh [options]
  --rounds N        measured ping-pong round trips per wire (default $ROUNDS)
  --warmup N        round trips before those, not recorded (default $WARMUP)
  --stores N        8-byte stores per node in the 8-node part (default $STORES)
  --hub-nodes LIST  node counts of the host-only hub benchmark (default $HUB_NODES)
  --quick           skip the 8-node part (it boots 8 guests: minutes)
  --adapters MODE   in-hub (default: local ports of the hub) or per-guest
                    (one mc-adapter process per guest on a link port)
  --write-multiple W  auto (default), on or off: vfio-user write_multiple,
                    the store path through QEMU (docs/adapter.md)
  --out DIR         where raw samples go (default bench-out/)
  -h, --help        this text
EOF
}
die_usage() {
    echo "latency-bench: $*" >&2
    usage >&2
    exit 2
}
need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die_usage "$1 needs a value"; }
need_count() { # NAME VALUE MIN
    [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] || die_usage "$1 must be a whole number of at least $3, not '$2'"
}
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) need_value "$@"; need_count --rounds "$2" 1; ROUNDS=$2; shift 2 ;;
        --warmup) need_value "$@"; need_count --warmup "$2" 0; WARMUP=$2; shift 2 ;;
        --stores) need_value "$@"; need_count --stores "$2" 100; STORES=$2; shift 2 ;;
        --hub-nodes)
            need_value "$@"
            [[ $2 =~ ^[0-9]+(,[0-9]+)*$ ]] || die_usage "--hub-nodes is a comma-separated list of node counts, not '$2'"
            HUB_NODES=$2; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --adapters)
            need_value "$@"
            [[ $2 == in-hub || $2 == per-guest ]] || die_usage "--adapters is in-hub or per-guest, not '$2'"
            ADAPTERS=$2; shift 2 ;;
        --write-multiple)
            need_value "$@"
            [[ $2 == on || $2 == off || $2 == auto ]] || die_usage "--write-multiple is auto, on or off, not '$2'"
            WRITE_MULTIPLE=$2; shift 2 ;;
        --out) need_value "$@"; OUT=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die_usage "unknown argument '$1'" ;;
    esac
done
[ -x "$M" ] || { echo "latency-bench: $M missing: run scripts/setup.sh first" >&2; exit 1; }
mkdir -p "$OUT"
TMP=$(mktemp -d)
# The bench's cluster config: latency-bench.toml with the data path asked for.
sed "s/^\[qemu\]$/[qemu]\nwrite_multiple = \"$WRITE_MULTIPLE\"/" "$REPO/qemu-configs/latency-bench.toml" >"$TMP/cluster.toml"
printf '\n[cluster]\nadapters = "%s"\n' "$ADAPTERS" >>"$TMP/cluster.toml"
CFG=$TMP/cluster.toml

T0=$(date +%s)
say() { printf '[%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
# The host's load average (1 and 5 min): guests spin on 2 cores, so anything
# else running on the host shows up in the tails (and the medians).
load() { cut -d' ' -f1,2 /proc/loadavg; }
LOAD_START=$(load)
fail() { echo "latency-bench: error: $*" >&2; exit 1; }
cleanup() {
    "$M" --name $NAME down >/dev/null 2>&1 || true
    "$M" --name $NAME8 down >/dev/null 2>&1 || true
    rm -rf "$TMP"
}
trap cleanup EXIT

# `x` NODE CMD...: run in a guest of the 2-node cluster.
x() { local n=$1; shift; "$M" --name $NAME exec "$n" --timeout 1800 -- "$@"; }
# A KEY=VALUE field of a line.
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1f", a / b; else print "-" }'; }

# ------------------------------------------------------------ host-only ----
# The hub alone: simulated adapters over Unix sockets, no guests.
say "host-only: cargo bench -p hub --bench hub_bench (MC_BENCH_NODES=$HUB_NODES)"
(cd "$REPO" && MC_BENCH_NODES=$HUB_NODES cargo bench -q -p hub --bench hub_bench 2>"$TMP/hub-bench.err") \
    >"$TMP/hub-bench.out" || { cat "$TMP/hub-bench.err" >&2; fail "the hub benchmark failed"; }
HOST_ROWS=$(grep -E '^ *[0-9]+ +[0-9]+B \|' "$TMP/hub-bench.out" || true)
[ -n "$HOST_ROWS" ] || fail "the hub benchmark printed no figures (see its output above)"
# The whole store path without guests: a fake QEMU pipelines posted 8-byte
# writes into adapter A's vfio-user socket; adapter B's memfd RAM receives.
for ports in local link; do
    say "host-only: cargo bench -p tests --bench adapter_throughput (MC_TEST_PORTS=$ports)"
    (cd "$REPO" && MC_TEST_PORTS=$ports cargo bench -q -p tests --bench adapter_throughput 2>"$TMP/pipe-$ports.err") \
        >"$TMP/pipe-$ports.out" || { cat "$TMP/pipe-$ports.err" >&2; fail "the adapter pipeline benchmark failed"; }
    sed 's/^/    /' "$TMP/pipe-$ports.out"
done

# ------------------------------------------------------------ 2 nodes ------
say "booting 2 guests (cluster $NAME, latency-bench.toml, adapters $ADAPTERS, write_multiple $WRITE_MULTIPLE)"
"$M" --name $NAME down >/dev/null 2>&1 || true
"$M" --name $NAME up --nodes 2 --config "$CFG" | sed 's/^/    /'
ACCEL=$(sed -n 's/.*"accel": *"\([a-z]*\)".*/\1/p' "$REPO/.run/$NAME/state.json" 2>/dev/null || true)
CLOCK=$(x 0 cat /sys/devices/system/clocksource/clocksource0/current_clocksource)
CPUS=$(x 0 nproc)
say "guests: ${ACCEL:-?}, $CPUS vCPU each, clocksource $CLOCK; host: $(nproc) cores, load average $(load)"

# pingpong VIA [PING-ARGS...]: pong on node 1 (background), ping on node 0.
# Prints the ping's result line.
pingpong() {
    local via=$1; shift
    local common="--via $via --rounds $ROUNDS --warmup $WARMUP"
    x 1 sh -c "(mctool pingpong --role pong $common >/tmp/pong-$via.log 2>&1; echo \$? >/tmp/pong-$via.rc) &"
    x 1 sh -c "i=0; until grep -q 'pong ready' /tmp/pong-$via.log; do
                   if [ -e /tmp/pong-$via.rc ] || [ \$i -ge 600 ]; then cat /tmp/pong-$via.log; exit 1; fi
                   i=\$((i+1)); sleep 0.1; done" >"$TMP/pong.err" \
        || fail "pong ($via) did not start on node 1: $(cat "$TMP/pong.err")"
    local line
    line=$(x 0 mctool pingpong --role ping $common --samples "/tmp/rtt-$via.txt" "$@") \
        || fail "ping ($via) failed on node 0: $line"
    x 1 sh -c "i=0; until [ -e /tmp/pong-$via.rc ]; do [ \$i -ge 100 ] && exit 1; i=\$((i+1)); sleep 0.1; done
               [ \"\$(cat /tmp/pong-$via.rc)\" = 0 ] || { cat /tmp/pong-$via.log; exit 1; }" >"$TMP/pong.err" \
        || fail "pong ($via) on node 1 did not finish cleanly: $(cat "$TMP/pong.err")"
    x 0 cat "/tmp/rtt-$via.txt" >"$OUT/latency-rtt-$via.txt"
    echo "$line"
}

say "MEMORY CHANNEL ping-pong: $ROUNDS round trips of 8-byte stores (+$WARMUP warm-up), polling receiver"
MC=$(pingpong mc)
say "    $MC"

# Which LAN the TCP figures cross: the netdev QEMU was given, the guest's driver.
QPID=$(sed -n '/"nodes"/,$p' "$REPO/.run/$NAME/state.json" | sed -n 's/.*"qemu_pid": *\([0-9]*\).*/\1/p' | head -1)
NETDEV=$(tr '\0' '\n' <"/proc/$QPID/cmdline" | sed -n '/^-netdev$/{n;p}' | head -1)
NETDEV_DEV=$(tr '\0' '\n' <"/proc/$QPID/cmdline" | grep -o '^virtio-net-pci[^,]*,netdev=[a-z]*' | head -1)
GUEST_NIC=$(x 0 sh -c 'echo "$(basename "$(readlink /sys/class/net/eth0/device/driver)") $(ip -4 -o addr show eth0 | awk "{print \$4}")"')
PEER_IP=10.0.0.2
LAN="QEMU -netdev $NETDEV + -device $NETDEV_DEV; guest eth0: $GUEST_NIC; node 0 -> $PEER_IP"
say "TCP ping-pong over the cluster LAN: $LAN"
TCP=$(pingpong tcp --peer $PEER_IP)
say "    $TCP"

say "ivshmem ping-pong: QEMU ivshmem-plain (one shared 1 MiB file), both guests polling"
IVSH=$(pingpong ivshmem)
say "    $IVSH"

# UMP needs imcd: start it by hand now that the raw-adapter measurements are done.
say "UMP 0-byte messages over MEMORY CHANNEL: starting imcd on both guests"
for n in 0 1; do x $n sh -c 'imcd >/var/log/imcd.log 2>&1 &'; done
for n in 0 1; do
    x $n sh -c 'i=0; until grep -q listening /var/log/imcd.log; do [ $i -ge 600 ] && { cat /var/log/imcd.log; exit 1; }; i=$((i+1)); sleep 0.1; done' \
        >"$TMP/imcd.err" || fail "imcd did not start on node $n: $(cat "$TMP/imcd.err")"
done
x 1 sh -c 'ump-tool serve --me 101 --peer 100 >/tmp/ump-serve.log 2>&1 &'
x 0 ump-tool bench --me 100 --mc-peer 101 --sizes 0 --volume 400K --svg-dir /tmp >"$TMP/ump.out" 2>&1 \
    || { cat "$TMP/ump.out" >&2; fail "ump-tool bench failed"; }
# Row "0 | T us R MB/s | T us R MB/s": blocking, then non-blocking writes.
UMP_B=$(awk '$1 == "0" && $2 == "|" { print $3 }' "$TMP/ump.out")
UMP_NB=$(awk '$1 == "0" && $2 == "|" { print $8 }' "$TMP/ump.out")
[ -n "$UMP_B" ] || { cat "$TMP/ump.out" >&2; fail "no 0-byte row in ump-tool's output"; }
say "    UMP 0 bytes, one way (half the median round trip of 400): blocking $UMP_B us, non-blocking $UMP_NB us"
LOAD_2NODE=$(load)
"$M" --name $NAME down >/dev/null

# ------------------------------------------------------------ 8 nodes ------
# stats_sample: one line "SECONDS w0 f0 w1 f1 ..." (writes_in, frames_out per node 0..7).
stats_sample() {
    local t j
    t=$(date +%s.%N)
    j=$("$M" --name $NAME8 hub -- stats | tr -d ' \n') || return 1
    printf '%s' "$t"
    for n in 0 1 2 3 4 5 6 7; do
        grep -o "{[^{}]*\"node\":$n,[^{}]*}" <<<"$j" \
            | sed -n 's/.*"writes_in":\([0-9]*\).*"frames_out":\([0-9]*\).*/ \1 \2/p' | tr -d '\n'
    done
    echo
}
if [ "$QUICK" = 1 ]; then
    say "8 nodes storing at once: skipped (--quick)"
else
    say "8 nodes storing at once: booting 8 guests (cluster $NAME8; minutes under TCG)"
    "$M" --name $NAME8 down >/dev/null 2>&1 || true
    "$M" --name $NAME8 up --nodes 8 --config "$CFG" | sed 's/^/    /'
    # The guest agent runs one command at a time: bench-tx runs in the
    # guests' background, held at a start line until /tmp/go appears.
    for n in 0 1 2 3 4 5 6 7; do
        "$M" --name $NAME8 exec $n -- sh -c "(until [ -e /tmp/go ]; do sleep 0.05; done
            mctool bench-tx --stride 16 --stores $STORES >/tmp/btx.log 2>&1; echo \$? >/tmp/btx.rc) &" \
            || fail "could not start bench-tx on node $n"
    done
    stats_sample >"$TMP/stats.txt" || fail "hub stats failed"
    [ "$(wc -w <"$TMP/stats.txt")" = 17 ] || fail "hub stats did not list 8 nodes: $(cat "$TMP/stats.txt")"
    say "    host load average $(load); every node storing $STORES x 8 bytes, stride 16 (one packet per store); sampling the hub's counters"
    gopids=()
    for n in 0 1 2 3 4 5 6 7; do "$M" --name $NAME8 exec $n -- touch /tmp/go & gopids+=($!); done
    for p in "${gopids[@]}"; do wait "$p" || fail "could not start bench-tx everywhere"; done
    # Every store is one packet: done when the hub has taken 8 x STORES more
    # writes (or when nothing moved for 60 s).
    total() { awk '{ s = 0; for (i = 0; i < 8; i++) s += $(2 + 2 * i); print s }' <<<"$1"; }
    first=$(total "$(head -1 "$TMP/stats.txt")")
    last=$first; still=0
    while [ $(( last - first )) -lt $(( 8 * STORES )) ]; do
        sleep 1
        line=$(stats_sample) || fail "hub stats failed"
        echo "$line" >>"$TMP/stats.txt"
        now=$(total "$line")
        if [ "$now" = "$last" ]; then still=$((still + 1)); else still=0; fi
        [ $still -lt 60 ] || { echo "    the hub took no writes for 60 s ($(( now - first )) of $(( 8 * STORES )))"; break; }
        last=$now
    done
    for n in 0 1 2 3 4 5 6 7; do
        "$M" --name $NAME8 exec $n -- sh -c 'i=0; until [ -e /tmp/btx.rc ]; do [ $i -ge 600 ] && exit 1; i=$((i+1)); sleep 0.1; done
            cat /tmp/btx.log; exit "$(cat /tmp/btx.rc)"' >"$TMP/btx$n.out" 2>&1 \
            || fail "bench-tx on node $n failed: $(cat "$TMP/btx$n.out")"
    done
    stats_sample >>"$TMP/stats.txt"
    cp "$TMP/stats.txt" "$OUT/latency-8node-hub-stats.txt"
    # Windows between samples in which all 8 nodes' writes_in grew: all storing at once.
    read -r PKTS DELS SECS ALL_PKTS ALL_DELS ALL_SECS < <(awk '
        NF == 17 {
            if (have) {
                dt = $1 - t; all = 1; dw = 0; df = 0
                for (i = 0; i < 8; i++) {
                    d = $(2 + 2 * i) - w[i]; if (d <= 0) all = 0
                    dw += d; df += $(3 + 2 * i) - f[i]
                }
                if (all) { W += dw; F += df; S += dt }
                AW += dw; AF += df
            } else t0 = $1
            have = 1; t = $1
            for (i = 0; i < 8; i++) { w[i] = $(2 + 2 * i); f[i] = $(3 + 2 * i) }
        }
        END { printf "%d %d %.3f %d %d %.3f\n", W, F, S, AW, AF, t - t0 }' "$TMP/stats.txt")
    SUM_RATE=0
    for n in 0 1 2 3 4 5 6 7; do
        l=$(grep 'packets_per_sec=' "$TMP/btx$n.out") || fail "no bench-tx figures from node $n: $(cat "$TMP/btx$n.out")"
        say "    node $n: $l"
        SUM_RATE=$(awk -v a="$SUM_RATE" -v b="$(field "$l" packets_per_sec)" 'BEGIN { print a + b }')
    done
    if awk -v s="$SECS" 'BEGIN { exit !(s > 0) }'; then
        AGG_PKTS=$(awk -v p="$PKTS" -v s="$SECS" 'BEGIN { printf "%.0f", p / s }')
        AGG_DELS=$(awk -v p="$DELS" -v s="$SECS" 'BEGIN { printf "%.0f", p / s }')
    else
        AGG_PKTS=-; AGG_DELS=-
    fi
    RUN_PKTS=$(awk -v p="$ALL_PKTS" -v s="$ALL_SECS" 'BEGIN { printf "%.0f", p / s }')
    RUN_DELS=$(awk -v p="$ALL_DELS" -v s="$ALL_SECS" 'BEGIN { printf "%.0f", p / s }')
    say "    hub, all 8 links carrying writes ($SECS s of samples): $PKTS writes_in, $DELS frames_out"
    say "    hub, whole run ($ALL_SECS s): $ALL_PKTS writes_in, $ALL_DELS frames_out (expected packets x 7 receivers = $(( ALL_PKTS * 7 )))"
    "$M" --name $NAME8 down >/dev/null
fi

# ------------------------------------------------------------ report -------
one() { field "$1" "one_way_$2_us"; }
echo
echo "== latency-bench: $(date -u '+%Y-%m-%d %H:%M UTC'), ${ACCEL:-?} guests ($CPUS vCPU, clocksource $CLOCK), $(nproc) host cores =="
echo "host load average (1, 5 min): $LOAD_START at the start, $LOAD_2NODE after the 2-node part, $(load) at the end"
echo "one way = RTT / 2 of 8-byte values, $ROUNDS round trips after $WARMUP warm-up, nearest-rank percentiles (raw RTTs: $OUT/latency-rtt-*.txt)"
# The path the adapters chose ("store path: direct ..." or "... queued ...").
STORE_PATH=$(cat "$REPO/.run/$NAME"/hub.log "$REPO/.run/$NAME"/node*/adapter.log 2>/dev/null \
    | grep -o 'store path: [a-z]*' | sort | uniq -c | sed 's/^ *//' | paste -sd, - || true)
echo "MEMORY CHANNEL: adapters $ADAPTERS, vfio-user write_multiple $WRITE_MULTIPLE (${STORE_PATH:-store path not logged})"
echo "TCP: $LAN"
echo
printf '%-44s %10s %10s %10s\n' "guest -> guest, one way" "p50 us" "p99 us" "p99.9 us"
for row in "MEMORY CHANNEL (store, polled receive)|$MC" "TCP (virtio-net, socket netdev)|$TCP" "ivshmem (shared memory, polled)|$IVSH"; do
    printf '%-44s %10s %10s %10s\n' "${row%%|*}" "$(one "${row#*|}" p50)" "$(one "${row#*|}" p99)" "$(one "${row#*|}" p999)"
done
printf '%-44s %10s %10s %10s\n' "ratio TCP / MEMORY CHANNEL" \
    "$(ratio "$(one "$TCP" p50)" "$(one "$MC" p50)")" "$(ratio "$(one "$TCP" p99)" "$(one "$MC" p99)")" \
    "$(ratio "$(one "$TCP" p999)" "$(one "$MC" p999)")"
printf '%-44s %10s %10s %10s\n' "ratio MEMORY CHANNEL / ivshmem" \
    "$(ratio "$(one "$MC" p50)" "$(one "$IVSH" p50)")" "$(ratio "$(one "$MC" p99)" "$(one "$IVSH" p99)")" \
    "$(ratio "$(one "$MC" p999)" "$(one "$IVSH" p999)")"
printf '%-44s %10s %10s %10s\n' "UMP 0-byte message over MC, blocking" "$UMP_B" "-" "-"
printf '%-44s %10s %10s %10s\n' "UMP 0-byte message over MC, non-blocking" "$UMP_NB" "-" "-"
echo "(UMP: half the median round trip of 400, ump-tool bench)"
echo
if [ "$QUICK" = 1 ]; then
    echo "8 nodes storing at once: skipped (--quick)"
else
    printf '%-44s %14s %14s\n' "8 nodes storing at once (bench-tx, stride 16)" "packets/s" "deliveries/s"
    printf '%-44s %14s %14s\n' "hub counters, while all 8 links carried writes" "$AGG_PKTS" "$AGG_DELS"
    printf '%-44s %14s %14s\n' "hub counters, whole run" "$RUN_PKTS" "$RUN_DELS"
    printf '%-44s %14s %14s\n' "stores issued (sum of bench-tx's own rates)" "$(printf '%.0f' "$SUM_RATE")" "-"
    echo "(packets = writes_in, deliveries = frames_out, summed over nodes; 7 receivers each; $STORES stores per node;"
    echo " bench-tx's rate is how fast stores leave the guest into the adapter, ahead of the hub)"
fi
echo
echo "host-only (no guests): hub_bench, N simulated adapters all broadcasting over Unix sockets"
printf '%-28s %7s %12s %14s %13s %13s\n' "path" "payload" "writes/s" "deliveries/s" "paced p50 us" "paced p99 us"
while read -r nodes payload _ w d _ p50 p99; do
    printf '%-28s %7s %12s %14s %13s %13s\n' "hub, $nodes nodes" "$payload" "$w" "$d" "$p50" "$p99"
done <<<"$HOST_ROWS"
echo
echo "host-only (no guests): fake QEMU -> adapter A's vfio-user socket -> hub -> adapter B's memfd RAM"
printf '%-28s %14s %14s %13s %13s\n' "port kind" "packets/s" "(coalesced)" "p50 us" "p99 us"
for ports in local link; do
    f=$TMP/pipe-$ports.out
    strided=$(awk '/^strided/ { for (i = 1; i <= NF; i++) if ($(i+1) == "packets/s") print $i }' "$f")
    seqw=$(awk '/^sequential/ { for (i = 1; i <= NF; i++) if ($(i+1) == "writes/s") print $i }' "$f")
    p50=$(sed -n 's/.* p50 \([0-9.]*\) us.*/\1/p' "$f")
    p99=$(sed -n 's/.* p99 \([0-9.]*\) us.*/\1/p' "$f")
    label=$([ $ports = local ] && echo "local ports (in-hub)" || echo "link ports (per-guest)")
    printf '%-28s %14s %14s %13s %13s\n' "$label" "$strided" "$seqw w/s" "$p50" "$p99"
done
echo "(packets/s: one packet per store; coalesced: 8-byte writes/s when stores are contiguous;"
echo " p50/p99: one store from the socket to the peer's memory)"
