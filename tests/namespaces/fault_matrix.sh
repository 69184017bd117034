#!/usr/bin/env bash
# fault_matrix.sh CASE: the network fault matrix. Two hosts are two network namespaces, each
# with its own mount and IPC namespaces and its own /dev/shm (so tandem sees two nodes and
# uses its TCP link), joined by a veth pair, or through packet_relay in a third namespace
# (two veth pairs, no IP forwarding: the relay copies Ethernet frames). fault_probe's server
# runs on host A, its client on host B (fault_probe.cpp describes the workload and its
# checks: tagged and untagged, eager and rendezvous messages both ways, RMA writes and reads,
# fetching FI_SUM and FI_CSWAP atomics, every byte and sequence number verified).
# Root only; exits 77 (skipped) where namespaces, iptables or Open MPI are missing.
#
# Each case asserts one outcome, within its bound (the bound is per operation: from being
# posted to its completion or error completion; fault_probe fails with STUCK past it):
#
#   case          fault                                      expected outcome           bound
#   loss1         iptables: 1% of packets into host B        every operation completes   20 s
#                 dropped (statistic, INPUT)                 with the right data, once
#   loss10        the same, 10%                              the same                    30 s
#   delay1        relay: 1 ms delay, each direction          the same                    10 s
#   delay50       relay: 50 ms delay, each direction         the same                    20 s
#   reorder       relay: 1 frame in 4 sent after the next    the same                    10 s
#   dup           relay: 10% of frames sent twice            the same                    10 s
#   outage_short  host A's veth down for 3 s mid-traffic     the same                    20 s
#   outage_long   FI_TANDEM_LINK_TIMEOUT=3000; host A's      every pending operation     6.5 s
#                 veth down for 8 s mid-traffic              ends in an error completion (timeout
#                                                            (a receive, which no peer   x 1.5
#                                                            owns, is cancelled by the   + 2 s)
#                                                            probe at the bound), none
#                                                            hangs, nothing completed is
#                                                            lost; once the link is up a
#                                                            fresh endpoint on B starts a
#                                                            session with the same server
#                                                            endpoint and it completes
#   mpi           iptables: 1% into host B; Open MPI         mpi_p2p prints PASS         100 s
#                 mpi_p2p, 2 ranks (one per host, pml cm,    (whole run)
#                 mtl ofi on tandem), mpirun on host A
#
# "Once" (no duplicate delivery) is checked by the probe for every message and atomic
# (dup=0). Each case also checks that its fault happened: the DROP rule's packet count, the
# relay's counts of delayed, reordered and duplicated frames, the error completions of the
# long outage; and that the traffic crossed the hosts' link.
set -euo pipefail
case_name=${1:?usage: fault_matrix.sh CASE}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../clients/common.sh
. "$here/../clients/common.sh"  # fail, skip
probe=${FAULT_PROBE:?FAULT_PROBE names tandem_fault_probe}
relay=${PACKET_RELAY:?PACKET_RELAY names tandem_packet_relay}
port_base=${TANDEM_NS_PORT_BASE:-32400}

[ "$(id -u)" -eq 0 ] || skip "needs root for ip netns, unshare and iptables"
command -v ip >/dev/null || skip "ip (iproute2) not installed"
unshare --net --mount --ipc --fork true 2>/dev/null || skip "this kernel or sandbox refuses new namespaces"

tag=$$
tmp=$(mktemp -d)
nsa=tfa-$tag nsb=tfb-$tag nsr=tfr-$tag
veth_a=tfa$tag veth_b=tfb$tag relay_a=tra$tag relay_b=trb$tag
subnet=10.$((150 + tag % 50)).$((tag / 50 % 250))
addr_a=$subnet.1 addr_b=$subnet.2
port=$((port_base + tag % 500))
relay_pid=
cleanup() {
    local pid
    [ -n "$relay_pid" ] && kill "$relay_pid" 2>/dev/null
    for pid in $(jobs -p); do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for ns in "$nsa" "$nsb" "$nsr"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

# A command prefix: a mount and IPC namespace of its own with a /dev/shm nobody else sees,
# so that the two hosts do not find each other through shared memory (tandem's node-local
# path) and talk over the link, as two machines do.
own_shm=(unshare --mount --ipc --propagation private
    sh -c 'mount -t tmpfs -o mode=1777 fault-shm /dev/shm && exec "$@"' own_shm)

# host_up NS IF ADDR: the host's interface up with its address. A veth hands TCP's 64 KiB
# segmentation-offload chunks to its peer whole; one segment per packet (gso_max_segs 1)
# makes the kernel cut them to the MTU first, so that loss, reordering and duplication hit
# packets of the size a wire carries, as the cases say.
host_up() {
    ip -n "$1" link set lo up
    ip -n "$1" addr add "$3/24" dev "$2"
    ip -n "$1" link set "$2" gso_max_segs 1
    ip -n "$1" link set "$2" up
}

# wait_carrier NS IF: tandem offers no domain on an interface without carrier, which a veth
# gets a moment after both its ends are up; a probe started before would find only lo.
wait_carrier() {
    local _
    for _ in $(seq 50); do
        case $(ip -n "$1" link show dev "$2") in *LOWER_UP*) return 0 ;; esac
        sleep 0.1
    done
    fail "$2 in $1 has no carrier after 5 s"
}

# Host A and host B joined by one veth pair.
make_direct() {
    ip netns add "$nsa"
    ip netns add "$nsb"
    ip link add "$veth_a" netns "$nsa" type veth peer name "$veth_b" netns "$nsb"
    host_up "$nsa" "$veth_a" "$addr_a"
    host_up "$nsb" "$veth_b" "$addr_b"
    wait_carrier "$nsa" "$veth_a"
    wait_carrier "$nsb" "$veth_b"
}

# Host A - relay - host B: a veth pair from each host into the relay's namespace, whose ends
# have no address; the relay (ARGS) copies frames between them.
make_relayed() {
    ip netns add "$nsa"
    ip netns add "$nsb"
    ip netns add "$nsr"
    ip link add "$veth_a" netns "$nsa" type veth peer name "$relay_a" netns "$nsr"
    ip link add "$veth_b" netns "$nsb" type veth peer name "$relay_b" netns "$nsr"
    host_up "$nsa" "$veth_a" "$addr_a"
    host_up "$nsb" "$veth_b" "$addr_b"
    ip -n "$nsr" link set lo up
    ip -n "$nsr" link set "$relay_a" up
    ip -n "$nsr" link set "$relay_b" up
    wait_carrier "$nsa" "$veth_a"
    wait_carrier "$nsb" "$veth_b"
    # Only the relay may carry traffic: the namespace routes nothing (a new namespace may
    # inherit forwarding from the host's; its interfaces have no address either).
    ip netns exec "$nsr" sh -c 'echo 0 >/proc/sys/net/ipv4/ip_forward'
    [ "$(ip netns exec "$nsr" cat /proc/sys/net/ipv4/ip_forward)" = 0 ] ||
        fail "IP forwarding is on in the relay namespace"
    ip netns exec "$nsr" "$relay" "$relay_a" "$relay_b" "$@" >"$tmp/relay" 2>&1 &
    relay_pid=$!
    local _
    for _ in $(seq 50); do
        grep -q '^packet_relay: ready' "$tmp/relay" && break
        kill -0 "$relay_pid" 2>/dev/null || { cat "$tmp/relay"; fail "packet_relay did not start"; }
        sleep 0.1
    done
    grep -q '^packet_relay: ready' "$tmp/relay" || fail "packet_relay not ready after 5 s"
}

# stop_relay: its counts, printed as it exits, into $relay_stats.
stop_relay() {
    kill -TERM "$relay_pid"
    wait "$relay_pid" || fail "packet_relay exited $?"
    relay_pid=
    cat "$tmp/relay"
    relay_stats=$(grep '^packet_relay: frames=' "$tmp/relay") || fail "packet_relay printed no counts"
}
relay_count() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$relay_stats"; }

# loss NS P: drop a fraction P of the packets entering host NS.
add_loss() {
    command -v iptables >/dev/null || skip "iptables not installed"
    ip netns exec "$1" iptables -A INPUT -m statistic --mode random --probability "$2" -j DROP ||
        skip "iptables (statistic match) does not work in a network namespace here"
}
dropped() {  # NS: packets the DROP rule took
    ip netns exec "$1" iptables -L INPUT -v -n -x | awk '$3 == "DROP" { print $1; exit }'
}

# start_probes BOUND_MS "SERVER_OPTS" "CLIENT_OPTS" [ENV...]: the server on host A, the
# client on host B, each inside timeout(1) as a last resort (the probes' own deadlines come
# first and name what hangs).
start_probes() {
    local bound=$1 sopts=$2 copts=$3
    shift 3
    local run=(env "$@" timeout -k 5 100)
    # shellcheck disable=SC2086
    ip netns exec "$nsa" "${own_shm[@]}" "${run[@]}" "$probe" server "$addr_a" "$port" \
        --bound-ms "$bound" --max-seconds 90 $sopts >"$tmp/server" 2>&1 &
    server_pid=$!
    # shellcheck disable=SC2086
    ip netns exec "$nsb" "${own_shm[@]}" "${run[@]}" "$probe" client "$addr_a" "$port" \
        --bound-ms "$bound" --max-seconds 90 $copts >"$tmp/client" 2>&1 &
    client_pid=$!
    t_start=$(date +%s.%N)
}
since_start() { awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# wait_line FILE PATTERN SECONDS: until FILE has a line matching PATTERN.
wait_line() {
    local _
    for _ in $(seq $(($3 * 10))); do
        grep -q "$2" "$1" && return 0
        sleep 0.1
    done
    return 1
}

# wait_probes: both exit codes, their output, the run's duration.
wait_probes() {
    server_rc=0 client_rc=0
    wait "$client_pid" || client_rc=$?
    wait "$server_pid" || server_rc=$?
    elapsed=$(since_start)
    # Round lines are many: the first and the last few of each side are enough to read.
    for side in server client; do
        rc_var=${side}_rc
        echo "--- $side (exit ${!rc_var})"
        grep -v ' round [0-9]* complete in ' "$tmp/$side" | grep -v '^fault_probe\[.*\]: result=' || true
        grep ' round [0-9]* complete in ' "$tmp/$side" | tail -3
        grep '^fault_probe\[.*\]: result=' "$tmp/$side" || true
    done
    echo "--- the probes ran $elapsed s"
}

summary_field() {  # SIDE FIELD
    sed -n "s/^fault_probe\[$1\]: result=.* $2=\([0-9.]*\).*/\1/p" "$tmp/$1"
}

# expect_pass: both probes exited 0 with result=PASS and no duplicate.
expect_pass() {
    [ "$client_rc" -eq 0 ] || fail "the client exited $client_rc"
    [ "$server_rc" -eq 0 ] || fail "the server exited $server_rc"
    local side
    for side in server client; do
        grep -q "^fault_probe\[$side\]: result=PASS " "$tmp/$side" || fail "the $side did not pass"
        [ "$(summary_field "$side" dup)" = 0 ] || fail "the $side saw a duplicate"
    done
    # Each endpoint was on its host's veth (not on lo, which would still reach the peer).
    grep -q "endpoint open at fi_sockaddr_in://$addr_a:$port\$" "$tmp/server" ||
        fail "the server's endpoint is not at $addr_a:$port"
    grep -q "endpoint open at fi_sockaddr_in://$addr_b:" "$tmp/client" ||
        fail "the client's endpoint is not on $addr_b"
}

# crossed MIN_BYTES: the traffic went over host B's veth, not through shared memory.
crossed() {
    local rx
    rx=$(ip -n "$nsb" -s link show "$veth_b" | awk '/RX:/ { getline; print $1 }')
    [ "${rx:-0}" -ge "$1" ] || fail "only ${rx:-0} bytes reached host B over its veth"
    echo "host B received $rx bytes over its veth"
}

# The data a run moves: per round and direction about 2.3 MiB of messages, 0.5 MiB of RMA.
min_bytes=$((2 << 20))

# outage SECONDS: host A's link down that long, then up again.
outage() {
    ip -n "$nsa" link set "$veth_a" down
    echo "host A's link down at $(since_start) s"
    sleep "$1"
    ip -n "$nsa" link set "$veth_a" up
    echo "host A's link up again"
}

case $case_name in
    loss1 | loss10)
        p=0.01 bound=20000 rounds=8
        [ "$case_name" = loss10 ] && p=0.10 bound=30000 rounds=3
        make_direct
        add_loss "$nsb" "$p"
        start_probes "$bound" "" "--rounds $rounds"
        wait_probes
        expect_pass
        crossed "$min_bytes"
        n=$(dropped "$nsb")
        [ "${n:-0}" -gt 0 ] || fail "the DROP rule dropped nothing"
        echo "PASS: $case_name: every operation completed with the right data; $n packets dropped into host B; max completion $(summary_field client max_ms) ms (bound $bound ms)"
        ;;
    delay1 | delay50 | reorder | dup)
        case $case_name in
            delay1) args=(--delay-ms 1) bound=10000 rounds=8 ;;
            delay50) args=(--delay-ms 50) bound=20000 rounds=5 ;;
            reorder) args=(--reorder-every 4) bound=10000 rounds=8 ;;
            dup) args=(--dup-prob 0.1 --seed "$tag") bound=10000 rounds=8 ;;
        esac
        make_relayed "${args[@]}"
        start_probes "$bound" "" "--rounds $rounds"
        wait_probes
        stop_relay
        expect_pass
        crossed "$min_bytes"
        case $case_name in
            delay*)
                [ "$(relay_count delayed)" -gt 1000 ] || fail "the relay delayed too few frames"
                # 2 x delay per round trip: the handshake alone needs two.
                d=${args[1]}
                first=$(sed -n 's/.* round 0 complete in \([0-9.]*\) ms/\1/p' "$tmp/client")
                awk -v f="$first" -v d="$d" 'BEGIN { exit !(f >= 2 * d) }' ||
                    fail "round 0 took $first ms, less than one round trip of 2 x $d ms"
                what="$(relay_count delayed) frames delayed $d ms"
                ;;
            reorder)
                [ "$(relay_count reordered)" -gt 100 ] || fail "the relay reordered too few frames"
                what="$(relay_count reordered) frames reordered"
                ;;
            dup)
                [ "$(relay_count duplicated)" -gt 100 ] || fail "the relay duplicated too few frames"
                what="$(relay_count duplicated) frames duplicated"
                ;;
        esac
        echo "PASS: $case_name: every operation completed with the right data, none twice; $what; max completion $(summary_field client max_ms) ms (bound $bound ms)"
        ;;
    outage_short)
        bound=20000
        make_direct
        # Rounds go on for 12 s, so traffic is in flight when the link goes and comes back.
        start_probes "$bound" "" "--rounds 3 --min-seconds 12"
        wait_line "$tmp/client" ' round 1 complete' 20 || fail "no traffic before the outage"
        outage 3
        wait_probes
        expect_pass
        crossed "$min_bytes"
        # Some operation waited through the outage: it hit traffic in flight.
        awk -v m="$(summary_field client max_ms)" 'BEGIN { exit !(m >= 2900) }' ||
            fail "no operation took as long as the outage: it missed the traffic"
        echo "PASS: outage_short: every operation completed with the right data across a 3 s outage; max completion $(summary_field client max_ms) ms (bound $bound ms)"
        ;;
    outage_long)
        # The link timeout (TCP_USER_TIMEOUT and keepalive of link sockets) is 3 s; the link is
        # down for 8 s, longer than any operation may stay pending (bound 6.5 s).
        timeout_ms=3000 bound=$((timeout_ms * 3 / 2 + 2000))
        # (fi_info prints the values of set variables between NUL bytes: dropped.)
        params=$("${FI_INFO_BIN:-fi_info}" -p tandem -e 2>/dev/null | tr -d '\0' || true)
        grep -aq FI_TANDEM_LINK_TIMEOUT <<<"$params" ||
            fail "tandem has no FI_TANDEM_LINK_TIMEOUT parameter (fi_info -e)"
        make_direct
        gate=$tmp/link-up
        start_probes "$bound" "--expect reconnect" "--expect reconnect --after-rounds 3 --gate $gate" \
            FI_TANDEM_LINK_TIMEOUT=$timeout_ms
        wait_line "$tmp/client" ' round 2 complete' 20 || fail "no traffic before the outage"
        outage 8
        touch "$gate"
        wait_probes
        expect_pass
        errors=0
        for side in server client; do
            n=$(sed -n 's/.* err{\([^}]*\)}.*/\1/p' "$tmp/$side" | tr ' ' '\n' | awk -F= '{ s += $2 } END { print s + 0 }')
            echo "$side: $n error completions, $(summary_field "$side" canceled) receives cancelled, max completion $(summary_field "$side" max_ms) ms"
            errors=$((errors + n))
        done
        [ "$errors" -gt 0 ] || fail "no operation failed: the outage did not hit pending traffic"
        grep -q 'session .* established' "$tmp/client" || fail "the client never reconnected"
        echo "PASS: outage_long: $errors operations ended in error completions within $bound ms, none hung, nothing completed was lost; a fresh endpoint then completed a session with the same server endpoint"
        ;;
    mpi)
        mpirun_bin=${MPIRUN:-mpirun}
        case $mpirun_bin in *-NOTFOUND | "") mpirun_bin=mpirun ;; esac
        command -v "$mpirun_bin" >/dev/null || skip "mpirun not found (openmpi-bin)"
        prog=${MPI_P2P:?MPI_P2P names tests/mpi/mpi_p2p}
        limit=100
        make_direct
        add_loss "$nsb" 0.01
        # Open MPI starts the remote rank's daemon through its rsh agent: this one takes the
        # host name (a veth address) to the namespace of that host, in which the daemon gets
        # the same private /dev/shm and host name as a real host would have. Open MPI passes
        # the daemon's command as words for a remote shell to join, as ssh does.
        agent=$tmp/netns-agent
        cat >"$agent" <<AGENT
#!/bin/sh
case \$1 in
    $addr_a) ns=$nsa name=fault-host-a ;;
    $addr_b) ns=$nsb name=fault-host-b ;;
    *) echo "netns-agent: no host \$1" >&2; exit 255 ;;
esac
shift
exec ip netns exec "\$ns" unshare --uts --mount --ipc --propagation private \\
    sh -c 'hostname "\$0" && mount -t tmpfs -o mode=1777 fault-shm /dev/shm && exec sh -c "\$1"' \\
    "\$name" "\$*"
AGENT
        chmod +x "$agent"
        printf '%s slots=1\n%s slots=1\n' "$addr_a" "$addr_b" >"$tmp/hosts"
        export MPI_TEST_WATCHDOG=$((limit - 20))  # mpi_p2p names the step that hangs
        # Info: the core's and tandem's lines show which endpoints ran (checked below).
        export FI_LOG_LEVEL=info
        # As users do: mtl_ofi_provider_include names tandem (FI_PROVIDER would only make the
        # core warn that it does not know the name before loading tandem from the path).
        unset FI_PROVIDER
        # mpirun runs on host A (its namespace, its /dev/shm, its name); host A's rank is
        # local to it, host B's comes through the agent. Both ranks reach each other over
        # the veth pair only (Open MPI's own wire-up too: oob_tcp_if_include).
        cmd=("$mpirun_bin" --allow-run-as-root --oversubscribe --bind-to none -np 2
             --hostfile "$tmp/hosts" --mca plm_rsh_agent "$agent"
             --mca oob_tcp_if_include "$subnet.0/24"
             --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include tandem
             --mca pml_base_verbose 10 --mca mtl_base_verbose 10
             -x FI_PROVIDER_PATH -x FI_LOG_LEVEL -x MPI_TEST_WATCHDOG "$prog")
        echo "+ ${cmd[*]}"
        t_start=$(date +%s.%N)
        rc=0
        ip netns exec "$nsa" unshare --uts --mount --ipc --propagation private \
            sh -c 'hostname fault-host-a && mount -t tmpfs -o mode=1777 fault-shm /dev/shm && exec "$@"' \
            mpirun-on-a timeout -k 10 "$limit" "${cmd[@]}" >"$tmp/mpi" 2>&1 || rc=$?
        elapsed=$(since_start)
        grep -v -e '^libfabric:' -e 'mca: base:' -e 'mca:base:select' -e 'select: ' -e $'^\t\t' "$tmp/mpi" || true
        grep '^libfabric:.*<warn>' "$tmp/mpi" | grep -v -e 'returned -61' -e OFI_MRAIL_ADDR || true
        echo "--- mpirun exited $rc after $elapsed s"
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then fail "mpirun hung: killed after $limit s"; fi
        [ "$rc" -eq 0 ] || fail "mpirun exited $rc"
        grep -q 'mpi_p2p: PASS' "$tmp/mpi" || fail "mpi_p2p printed no PASS line"
        n=$(grep -c 'select: component cm selected' "$tmp/mpi" || true)
        [ "$n" -eq 2 ] || fail "pml cm selected by $n of 2 ranks"
        # mtl ofi names the domain it opened: each rank's host's veth (tandem's domains are
        # interfaces), so the ranks talked over the pair and not over lo.
        grep -q "mtl:ofi:provider: $veth_a\$" "$tmp/mpi" || fail "no rank opened tandem's domain $veth_a"
        grep -q "mtl:ofi:provider: $veth_b\$" "$tmp/mpi" || fail "no rank opened tandem's domain $veth_b"
        # tandem's own RDM endpoints carried it, no utility provider stacked over them.
        n=$(grep -Ec "::tandem:ep_ctrl:.*RDM endpoint enabled on ($veth_a|$veth_b)" "$tmp/mpi" || true)
        [ "$n" -ge 2 ] || fail "$n of 2 ranks enabled a tandem RDM endpoint on their veth"
        ! grep -Eq '::(ofi_rxm|ofi_rxd|ofi_mrail):(av|ep_ctrl|ep_data|cq|domain):|rxm_ep_settings_init' "$tmp/mpi" ||
            fail "a utility provider was layered over tandem"
        crossed $((64 << 20))
        n=$(dropped "$nsb")
        [ "${n:-0}" -gt 0 ] || fail "the DROP rule dropped nothing"
        echo "PASS: mpi: mpi_p2p passed on 2 ranks in two namespaces under 1% loss in $elapsed s; $n packets dropped"
        ;;
    *) fail "unknown case $case_name" ;;
esac
