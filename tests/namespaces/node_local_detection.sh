#!/usr/bin/env bash
# node_local_detection.sh CASE: two tandem_bench processes (server and client, as a user runs
# them) in the namespaces CASE names, a transfer of every size class between them with the
# data verified, and the path both report (tandem's endpoint diagnostics) checked against the
# one expected. Needs root (unshare, ip netns); exits 77 (skipped) where namespaces cannot be
# made.
#
#   same             one host, nothing unshared             node-local, single copy (CMA)
#   own-shm          client: own mount and IPC namespaces
#                    and its own /dev/shm                   link
#   own-pid          client: own pid namespace, /dev/shm
#                    shared                                 node-local, staged
#   hosts            two network namespaces joined by a veth
#                    pair, each with its own mount and IPC
#                    namespaces and /dev/shm: two hosts     link, over the veth addresses
#   hosts-shared-shm two network namespaces joined by a veth
#                    pair that share /dev/shm, the client
#                    in its own pid namespace               node-local, staged
#   carrier          a bridge that is up with an address and
#                    no carrier (docker0 before any
#                    container) beside a veth pair: fi_info
#                    lists the veth's domain and not the bridge's
set -euo pipefail
case_name=${1:?usage: node_local_detection.sh CASE}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../clients/common.sh
. "$here/../clients/common.sh"  # fail, skip
bench=${TANDEM_BENCH:?TANDEM_BENCH names bench/tandem_bench}
port_base=${TANDEM_NS_PORT_BASE:-31900}

[ "$(id -u)" -eq 0 ] || skip "needs root for unshare and ip netns"
unshare --net --mount --ipc --pid --fork true 2>/dev/null || skip "this kernel or sandbox refuses new namespaces"
command -v ip >/dev/null || skip "ip (iproute2) not installed"

tag=$$
tmp=$(mktemp -d)
nsa=tnd-a-$tag nsb=tnd-b-$tag veth_a=tva$tag veth_b=tvb$tag bridge=tbr$tag
subnet=10.$((200 + tag % 50)).$((tag / 50 % 250)).0
addr_a=${subnet%.0}.1 addr_b=${subnet%.0}.2
cleanup() {
    local pid
    for pid in $(jobs -p); do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$nsa" 2>/dev/null || true
    ip netns del "$nsb" 2>/dev/null || true
    ip link del "$veth_a" 2>/dev/null || true
    ip link del "$bridge" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

# Two network namespaces ("hosts") joined by a veth pair, loopback up in each.
make_hosts() {
    ip netns add "$nsa"
    ip netns add "$nsb"
    ip link add "$veth_a" type veth peer name "$veth_b"
    ip link set "$veth_a" netns "$nsa"
    ip link set "$veth_b" netns "$nsb"
    ip -n "$nsa" addr add "$addr_a/24" dev "$veth_a"
    ip -n "$nsb" addr add "$addr_b/24" dev "$veth_b"
    for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
    ip -n "$nsa" link set "$veth_a" up
    ip -n "$nsb" link set "$veth_b" up
}

# A command prefix: a mount and IPC namespace of its own, with a /dev/shm nobody else sees.
own_shm=(unshare --mount --ipc --propagation private
    sh -c 'mount -t tmpfs -o mode=1777 tandem-shm /dev/shm && exec "$@"' own_shm)
# A command prefix: a pid namespace of its own (pid 1 there), /dev/shm still shared.
own_pid=(unshare --pid --fork --mount-proc)

# run_pair PORT SERVER_PREFIX... -- CLIENT_PREFIX...: a server bound to the control port,
# then the client; both outputs kept. The prefixes (possibly empty) wrap each command.
run_pair() {
    local port=$1 host=$2
    shift 2
    local server_prefix=() client_prefix=()
    while [ "$1" != -- ]; do server_prefix+=("$1"); shift; done
    shift
    client_prefix=("$@")
    "${server_prefix[@]}" "$bench" -p tandem -T 120 -s "$host:$port" >"$tmp/server" 2>&1 &
    local server=$!  # the client retries its connection while the server starts
    local rc=0
    "${client_prefix[@]}" "$bench" -p tandem -T 120 -c "$host:$port" -S 8,4k,64k,1m,4m \
        -t lat,bw,rma -i 20 >"$tmp/client" 2>&1 || rc=$?
    wait "$server" || rc=$((rc ? rc : 100 + $?))
    echo "--- client"; cat "$tmp/client"; echo "--- server"; cat "$tmp/server"
    [ "$rc" -eq 0 ] || fail "the benchmark pair failed (exit $rc)"
    grep -q '^# all transfers verified' "$tmp/client" || fail "transfers not verified"
}

# expect_path WANT: both processes reported WANT.
expect_path() {
    local side got
    for side in client server; do
        got=$(sed -n 's/^# path: //p' "$tmp/$side" | tail -1)
        [ "$got" = "$1" ] || fail "$side took the path '$got', expected '$1'"
    done
    echo "PASS: both processes: $1"
}

port=$((port_base + tag % 500))
case $case_name in
    same)
        run_pair "$port" 127.0.0.1 --
        expect_path "node-local, single copy (CMA)"
        ;;
    own-shm)
        run_pair "$port" 127.0.0.1 -- "${own_shm[@]}"
        expect_path "link"
        ;;
    own-pid)
        run_pair "$port" 127.0.0.1 -- "${own_pid[@]}"
        expect_path "node-local, staged"
        ;;
    hosts)
        make_hosts
        run_pair "$port" "$addr_a" ip netns exec "$nsa" "${own_shm[@]}" \
            -- ip netns exec "$nsb" "${own_shm[@]}"
        expect_path "link"
        # The fabric addresses were the veth's: the traffic crossed the pair.
        rx=$(ip -n "$nsb" -s link show "$veth_b" | awk '/RX:/ { getline; print $1 }')
        [ "${rx:-0}" -gt 4000000 ] || fail "only ${rx:-0} bytes crossed the veth pair"
        echo "PASS: $rx bytes received over the veth pair"
        ;;
    hosts-shared-shm)
        make_hosts
        run_pair "$port" "$addr_a" ip netns exec "$nsa" -- ip netns exec "$nsb" "${own_pid[@]}"
        expect_path "node-local, staged"
        ;;
    carrier)
        make_hosts
        # A bridge whose only port is down has no carrier, as docker0 before any container.
        ip -n "$nsa" link add "$bridge" type bridge
        ip -n "$nsa" link add "${bridge}p" type veth peer name "${bridge}q"
        ip -n "$nsa" link set "${bridge}p" master "$bridge"
        ip -n "$nsa" addr add 10.254.$((tag % 250)).1/24 dev "$bridge"
        ip -n "$nsa" link set "$bridge" up
        sleep 0.2
        ip -n "$nsa" link show "$bridge" | grep -q NO-CARRIER || fail "the bridge has a carrier"
        domains=$(ip netns exec "$nsa" "${FI_INFO_BIN:-fi_info}" -p tandem -t FI_EP_RDM \
            | sed -n 's/^ *domain: *//p' | sort -u | tr '\n' ' ')
        echo "domains: $domains"
        case " $domains " in *" $veth_a "*) ;; *) fail "no domain for $veth_a (up, with carrier)" ;; esac
        case " $domains " in *" $bridge "*) fail "a domain for $bridge, which has no carrier" ;; esac
        echo "PASS: $veth_a has a domain, $bridge (no carrier) has none"
        ;;
    *) fail "unknown case $case_name" ;;
esac
