#!/usr/bin/env bash
# Network namespaces standing in for hosts, to run a cluster across hosts on
# one machine (README, "Clusters across hosts"). PREFIX-hub is the hub's
# host: it holds a bridge at 10.77.0.1/24. Each "host" PREFIX-h1 ...
# PREFIX-hN reaches it, and the others, only through its own veth pair
# (eth0, 10.77.0.(10+I), on the bridge as port hI): cutting that link cuts
# the host off, as pulling its cable would. The namespaces share this
# machine's files, so a cluster's run folder is seen by every "host".
#
# Usage: scripts/netns-hosts.sh up PREFIX HOSTS       make PREFIX-hub and PREFIX-h1..HOSTS
#        scripts/netns-hosts.sh down PREFIX           remove them (and whatever runs in them)
#        scripts/netns-hosts.sh config PREFIX HOSTS PER_HOST [PORT]
#                                     print a cluster definition: the hub in PREFIX-hub on
#                                     10.77.0.1:PORT (default 7400), PER_HOST nodes on each host
#        scripts/netns-hosts.sh cut PREFIX I          take host I's link down (both directions)
#        scripts/netns-hosts.sh heal PREFIX I         bring it back
# Needs root (ip netns) and iproute2.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
usage_if_asked "$@"

die() { echo "netns-hosts: $*" >&2; exit 2; }
cmd=${1:-}
prefix=${2:-}
[ -n "$cmd" ] && [ -n "$prefix" ] || { usage_text >&2; exit 2; }
[[ "$prefix" =~ ^[A-Za-z0-9_.-]{1,40}$ ]] || die "PREFIX '$prefix': letters, digits, '.', '_' and '-' only"
number() { [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] && [ "$2" -le "$3" ] || die "$1 must be a number from 1 to $3, not '$2'"; }
hub="$prefix-hub"
in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
exists() { ip netns list | awk '{print $1}' | grep -qx "$1"; }
hosts_of() { ip netns list | awk '{print $1}' | grep -E "^$prefix-h[0-9]+\$" | sed "s/^$prefix-h//" | sort -n; }

case "$cmd" in
    up)
        number HOSTS "${3:-}" 200
        [ "$(id -u)" = 0 ] || die "needs root (ip netns add)"
        exists "$hub" && die "$hub exists already: run 'scripts/netns-hosts.sh down $prefix' first"
        ip netns add "$hub"
        in_ns "$hub" ip link set lo up
        in_ns "$hub" ip link add br0 type bridge
        in_ns "$hub" ip addr add 10.77.0.1/24 dev br0
        in_ns "$hub" ip link set br0 up
        for i in $(seq 1 "$3"); do
            ns="$prefix-h$i"
            ip netns add "$ns"
            in_ns "$ns" ip link set lo up
            ip link add "h$i" netns "$hub" type veth peer name eth0 netns "$ns"
            in_ns "$hub" ip link set "h$i" master br0 up
            in_ns "$ns" ip addr add "10.77.0.$((10 + i))/24" dev eth0
            in_ns "$ns" ip link set eth0 up
        done
        echo "netns-hosts: $hub (hub, 10.77.0.1) and $3 hosts $prefix-h1..$prefix-h$3 (10.77.0.11..)"
        ;;
    down)
        for ns in $(ip netns list | awk '{print $1}' | grep -E "^$prefix-(hub|h[0-9]+)\$" || true); do
            # Whatever still runs there goes first, or the namespace stays
            # alive through it.
            for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
            ip netns del "$ns"
        done
        ;;
    config)
        number HOSTS "${3:-}" 200
        number PER_HOST "${4:-}" 64
        port=${5:-7400}
        number PORT "$port" 65535
        nodes=$(($3 * $4))
        placement=""
        for i in $(seq 1 "$3"); do for _ in $(seq 1 "$4"); do placement+="\"h$i\", "; done; done
        cat <<EOF
# A cluster across the network namespaces of 'scripts/netns-hosts.sh up $prefix $3'.
[cluster]
nodes = $nodes
hub_ports = $(( nodes > 8 ? nodes : 8 ))
adapters = "per-guest"   # each guest's mc-adapter runs beside its QEMU, on the guest's host
placement = [${placement%, }]

[hub]
transport = "tcp"        # the adapters join over TCP with the cluster's secret
tcp_listen = "10.77.0.1:$port"
host = "hub"

[guest]
lan = "off"              # the guests' LAN joins one host's guests only

[hosts.hub]
way_in = ["ip", "netns", "exec", "$hub"]
EOF
        for i in $(seq 1 "$3"); do
            printf '[hosts.h%s]\nway_in = ["ip", "netns", "exec", "%s-h%s"]\n' "$i" "$prefix" "$i"
        done
        ;;
    cut|heal)
        number HOST "${3:-}" 200
        exists "$prefix-h$3" || die "no host $prefix-h$3 (hosts: $(hosts_of | tr '\n' ' '))"
        state=$([ "$cmd" = cut ] && echo down || echo up)
        in_ns "$hub" ip link set "h$3" "$state"
        ;;
    *) usage_text >&2; exit 2 ;;
esac
