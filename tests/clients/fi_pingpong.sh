#!/usr/bin/env bash
# usage: fi_pingpong.sh PROV EP_TYPE PORT [extra fi_pingpong options...]
# Runs fi_pingpong's server in the background and its client against 127.0.0.1 (or
# PINGPONG_ADDR: fi_pingpong has no source option, the server takes the first entry of
# fi_getinfo), both under
# timeout(1), with data integrity checks (-c). Fails if either side exits non-zero, or either
# side prints no result table.
set -u
# shellcheck source=tests/clients/common.sh
. "$(dirname "$0")/common.sh"
[ $# -ge 3 ] || fail "usage: $0 PROV EP_TYPE PORT [fi_pingpong options]"
prov=$1 ep=$2 port=$3
shift 3
need_tool FI_PINGPONG_BIN fi_pingpong
select_provider "$prov"
limit=${PINGPONG_TIMEOUT:-90}
iters=${PINGPONG_ITERS:-20}
addr=${PINGPONG_ADDR:-127.0.0.1}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if tcp_port_listening "$port"; then
    fail "control port $port is already in use (another test run?)"
fi

# libfabric's info-level log says which provider and which path ran (checked below).
export FI_LOG_LEVEL=info
echo "FI_PROVIDER=${FI_PROVIDER:-<unset>} FI_PROVIDER_PATH=${FI_PROVIDER_PATH:-<unset>} FI_TANDEM_LOCAL=${FI_TANDEM_LOCAL:-<unset>}"
common=(-p "$prov" -e "$ep" -I "$iters" -S all -c "$@")
server_opts=(-B "$port")
echo "server: fi_pingpong ${common[*]} ${server_opts[*]}"
timeout "$limit" "$FI_PINGPONG_BIN" "${common[@]}" "${server_opts[@]}" >"$tmp/server" 2>&1 &
server_pid=$!

# Start the client only once the server listens on its control port.
for _ in $(seq 1 150); do
    tcp_port_listening "$port" && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
done

client_rc=0
if tcp_port_listening "$port"; then
    echo "client: fi_pingpong ${common[*]} -P $port $addr"
    timeout "$limit" "$FI_PINGPONG_BIN" "${common[@]}" -P "$port" "$addr" >"$tmp/client" 2>&1
    client_rc=$?
else
    echo "the server never listened on port $port" >"$tmp/client"
    client_rc=125
fi
[ "$client_rc" -eq 0 ] || kill "$server_pid" 2>/dev/null
wait "$server_pid"
server_rc=$?

# The program's own output in full, libfabric's log lines left out (they are checked below).
for side in server client; do
    rc_var=${side}_rc
    echo "===== $side (exit ${!rc_var}) ====="
    grep -v '^libfabric:' "$tmp/$side"
done
echo "====="

has_table() {
    grep -Eq '^bytes[[:space:]]+#sent[[:space:]]+#ack' "$1" &&
        grep -Eq '^[0-9]+[kmg]?[[:space:]]+[0-9]+[[:space:]]+=[0-9]+[[:space:]]' "$1"
}
status=0
[ "$server_rc" -eq 0 ] || { echo "FAIL: server exited $server_rc" >&2; status=1; }
[ "$client_rc" -eq 0 ] || { echo "FAIL: client exited $client_rc" >&2; status=1; }
has_table "$tmp/server" || { echo "FAIL: server printed no result table" >&2; status=1; }
has_table "$tmp/client" || { echo "FAIL: client printed no result table" >&2; status=1; }
# Which endpoints ran: named tandem, fi_pingpong must get tandem's own endpoint, never
# ofi_rxm stacked over tandem's MSG endpoints; RDM peers on this node go through off_tandem
# unless FI_TANDEM_LOCAL=0 turns the node-local path off.
ep_upper=$(tr '[:lower:]' '[:upper:]' <<<"$ep")
for side in server client; do
    case $prov in
        *\;ofi_rxm)
            rxm_in_path "$tmp/$side" || { echo "FAIL: $side: no ofi_rxm endpoint in the log" >&2; status=1; } ;;
        *)
            rxm_in_path "$tmp/$side" && { echo "FAIL: $side: ofi_rxm ran, not plain $prov" >&2; status=1; }
            tandem_endpoint_in_path "$tmp/$side" "$ep_upper" ||
                { echo "FAIL: $side: tandem enabled no $ep_upper endpoint" >&2; status=1; }
            # The endpoint's line says which, as the path then taken does.
            if [ "$ep" = rdm ] && [ "${FI_TANDEM_LOCAL:-1}" != 0 ]; then path=on; else path=off; fi
            grep -Eq "::tandem:ep_ctrl:.*$ep_upper endpoint enabled on .*, node-local path $path," "$tmp/$side" ||
                { echo "FAIL: $side: the endpoint's line does not say \"node-local path $path\"" >&2; status=1; }
            if [ "$path" = on ]; then
                node_local_in_path "$tmp/$side" ||
                    { echo "FAIL: $side: the node-local path did not run" >&2; status=1; }
                # What copies cost is measured while the endpoint is enabled, before any
                # message (the first large one waited 40 ms for it in the timed loop).
                costs=$(grep -n -m1 "::off_tandem:ep_ctrl:.* copy costs measured in " "$tmp/$side" | cut -d: -f1)
                enabled=$(grep -n -m1 "::tandem:ep_ctrl:.*$ep_upper endpoint enabled on " "$tmp/$side" | cut -d: -f1)
                [ -n "$costs" ] && [ -n "$enabled" ] && [ "$costs" -lt "$enabled" ] ||
                    { echo "FAIL: $side: copy costs not measured before the endpoint was enabled" >&2; status=1; }
            else
                node_local_in_path "$tmp/$side" &&
                    { echo "FAIL: $side: the node-local path ran with FI_TANDEM_LOCAL=${FI_TANDEM_LOCAL:-1}" >&2; status=1; }
            fi ;;
    esac
done
# The domain the endpoints ran on, where the caller names one (an RDMA device's: the verbs
# link), and for RDM (whose endpoint listens from the start) at the address asked for.
if [ -n "${EXPECT_DOMAIN:-}" ]; then
    at=""
    [ "$ep" = rdm ] && at=".* at fi_sockaddr_in://$addr:"
    for side in server client; do
        grep -Eq "::tandem:ep_ctrl:.* endpoint enabled on $EXPECT_DOMAIN,$at" "$tmp/$side" ||
            { echo "FAIL: $side: no endpoint enabled on $EXPECT_DOMAIN${at:+ at $addr}" >&2; status=1; }
    done
fi
[ "$status" -eq 0 ] && echo "PASS: fi_pingpong -p '$prov' -e $ep $* ${EXPECT_DOMAIN:+on $EXPECT_DOMAIN}"
exit "$status"
