#!/usr/bin/env bash
# usage: fi_pingpong.sh PROV EP_TYPE PORT [extra fi_pingpong options...]
# Runs fi_pingpong's server in the background and its client against 127.0.0.1, both under
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

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if tcp_port_listening "$port"; then
    fail "control port $port is already in use (another test run?)"
fi

echo "FI_PROVIDER=${FI_PROVIDER:-<unset>} FI_PROVIDER_PATH=${FI_PROVIDER_PATH:-<unset>} FI_TANDEM_LOCAL=${FI_TANDEM_LOCAL:-<unset>}"
common=(-p "$prov" -e "$ep" -I "$iters" -S all -c "$@")
echo "server: fi_pingpong ${common[*]} -B $port"
timeout "$limit" "$FI_PINGPONG_BIN" "${common[@]}" -B "$port" >"$tmp/server" 2>&1 &
server_pid=$!

# Start the client only once the server listens on its control port.
for _ in $(seq 1 150); do
    tcp_port_listening "$port" && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
done

client_rc=0
if tcp_port_listening "$port"; then
    echo "client: fi_pingpong ${common[*]} -P $port 127.0.0.1"
    timeout "$limit" "$FI_PINGPONG_BIN" "${common[@]}" -P "$port" 127.0.0.1 >"$tmp/client" 2>&1
    client_rc=$?
else
    echo "the server never listened on port $port" >"$tmp/client"
    client_rc=125
fi
[ "$client_rc" -eq 0 ] || kill "$server_pid" 2>/dev/null
wait "$server_pid"
server_rc=$?

echo "===== server (exit $server_rc) ====="
cat "$tmp/server"
echo "===== client (exit $client_rc) ====="
cat "$tmp/client"
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
[ "$status" -eq 0 ] && echo "PASS: fi_pingpong -p '$prov' -e $ep $*"
exit "$status"
