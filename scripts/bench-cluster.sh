# Sourced by the benchmark scripts: brings up a cluster of $NODES nodes
# (default 2) named $NAME (taken down when the script exits) and waits until
# imcd serves on every node. Needs REPO and NAME; sets M (the mc-cluster
# binary). CONFIG (from the environment) names another cluster definition
# than the default.
M=$REPO/target/release/mc-cluster
[ -x "$M" ] || { echo "$NAME: $M is missing: run scripts/setup.sh first" >&2; exit 1; }
trap '"$M" --name $NAME down >/dev/null 2>&1 || true' EXIT
"$M" --name "$NAME" up --nodes "${NODES:-2}" ${CONFIG:+--config "$CONFIG"} >/dev/null
for n in $(seq 0 $(( ${NODES:-2} - 1 ))); do
    "$M" --name "$NAME" exec $n --timeout 150 -- sh -c 'i=0; until grep -q listening /var/log/imcd.log; do
        [ $i -ge 600 ] && { echo "imcd not listening after 120 s:"; cat /var/log/imcd.log; exit 1; } >&2
        i=$((i+1)); sleep 0.2; done'
done
