#!/usr/bin/env bash
# The lab course's driver checker (docs/tutorial/03-driver.md): builds a
# student's driver (one C file with the commands of driver.c: info, rx,
# tx) statically on the host, runs it in two guests of a running cluster
# without imcd, and says which steps are right and which are wrong, with
# the part of docs/adapter.md to read for each.
#
# Usage: docs/tutorial/driver/check.sh DRIVER.c [CLUSTER]
#   CLUSTER: a running cluster of at least 2 nodes booted with
#   qemu-configs/raw-adapter.toml (default: lab-raw)
# Exit: 0 every check passed, 1 some failed, 2 bad usage or no cluster.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../../scripts/usage.sh"; usage_or_refuse "" -- "$@"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
SRC=${1:-}
NAME=${2:-lab-raw}
M=$REPO/target/release/mc-cluster
[ -n "$SRC" ] && [ -f "$SRC" ] || { echo "check: give the driver's C file (docs/tutorial/driver/driver.c)" >&2; exit 2; }
SHARE=$REPO/.run/$NAME/share
"$M" --name "$NAME" status >/dev/null 2>&1 && [ -d "$SHARE" ] \
    || { echo "check: cluster '$NAME' is not up: mc-cluster --name $NAME up --nodes 2 --config qemu-configs/raw-adapter.toml" >&2; exit 2; }
PASS=0 FAIL=0
ok() { echo "  ok    $*"; PASS=$((PASS + 1)); }
bad() { echo "  FAIL  $*"; FAIL=$((FAIL + 1)); }
end() { echo "$PASS of $((PASS + FAIL)) checks passed"; [ "$FAIL" = 0 ]; exit $?; }
x() { "$M" --name "$NAME" exec "$@"; }

echo "checking $SRC on cluster '$NAME'"
if cc -static -O2 -Wall -o "$SHARE/driver" "$SRC" 2>"$SHARE/driver-build.log"; then
    ok "builds (cc -static)"
else
    bad "does not build:"; sed 's/^/        /' "$SHARE/driver-build.log" | head -20; end
fi

info=$(x 0 -- /share/driver info 2>&1)
if [[ "$info" == *"id 0x4d430001"* && "$info" == *"page 8192"* ]]; then
    ok "info reads ID and PAGE_SIZE from BAR 0 ($info)"
else
    bad "info: expected 'id 0x4d430001 ... page 8192' (docs/adapter.md: How a guest reaches the adapter; Registers): ${info:-no output}"
fi
if [[ "$info" == *"link 1"* ]]; then ok "info reads LINK: up"; else bad "info: LINK bit 0 should read 1 (the link is up)"; fi

PAGE=60 OFF=8 VALUE=0x5a5a1996
x 1 -- sh -c "rm -f /tmp/driver-rx.log; /share/driver rx $PAGE $OFF $VALUE 15 >/tmp/driver-rx.log 2>&1 &"
i=0
until x 1 -- cat /tmp/driver-rx.log 2>/dev/null | grep -q listening; do
    i=$((i + 1))
    if [ $i -ge 20 ]; then
        bad "rx never printed 'listening on page $PAGE': $(x 1 -- cat /tmp/driver-rx.log 2>&1 | head -3)"; end
    fi
    sleep 0.5
done
ok "rx set up a receive buffer and started listening"

tx=$(x 0 -- /share/driver tx $PAGE $OFF $VALUE 2>&1)
err=$(sed -n 's/.*err_status \(0x[0-9a-f]*\).*/\1/p' <<<"$tx")
if [ "$err" = "0x0" ]; then
    ok "tx: the store went out with no error ($tx)"
elif [ -n "$err" ] && (( err & 1 )); then
    bad "tx: ERR_STATUS TX_DISABLED: the page needs TX (bit 0) in its PCT word 0 before the store (docs/adapter.md: Page control table)"
else
    bad "tx: expected 'err_status 0x0', got: ${tx:-no output}"
fi

i=0
until rx=$(x 1 -- cat /tmp/driver-rx.log 2>&1); [[ "$rx" == *got* || "$rx" == *nothing* ]]; do
    i=$((i + 1)); [ $i -ge 40 ] && break; sleep 0.5
done
rxerr=$(sed -n 's/.*err_status \(0x[0-9a-f]*\).*/\1/p' <<<"$rx")
drop=$(sed -n 's/.*rx_dropped \([0-9]*\).*/\1/p' <<<"$rx")
if [[ "$rx" == *"got $VALUE"* ]]; then
    ok "rx: the value arrived in node 1's buffer by DMA"
elif [ -n "$rxerr" ] && (( rxerr & 4 )); then
    bad "rx: ERR_STATUS RX_DMA: the adapter could not write your buffer. Bus mastering on (PCI command bit 2, after every open), and PCT word 1 the IOVA you mapped (docs/adapter.md: PCI identity; How a guest reaches the adapter)"
elif [ -n "$drop" ] && [ "$drop" -gt 0 ]; then
    bad "rx: RX_DROPPED $drop: the write came but the page had no RX (bit 1) in its PCT word 0 (docs/adapter.md: Page control table)"
else
    bad "rx: nothing arrived: ${rx:-no output}"
fi
end
