#!/usr/bin/env bash
# fi_pingpong over the verbs link on a device that serves two interfaces (a NIC with a port
# on each): the emulated device serves loopback and the interface of this host's first global
# IPv4 address. Both fi_pingpong processes must run on emu_rdma0 at that address: the
# device's domain is listed for each interface it serves, and the client's destination picks
# the device whose route reaches it.
# usage: fi_pingpong_verbs_second_port.sh WITH_EMULATED_RDMA_SCRIPT PORT
set -u
# shellcheck source=tests/clients/common.sh
. "$(dirname "$0")/common.sh"
[ $# -eq 2 ] || fail "usage: $0 path/to/with-emulated-rdma.sh PORT"
wrapper=$1 port=$2
read -r ifname addr < <(ip -4 -o addr show scope global 2>/dev/null |
    awk '{ sub("/.*", "", $4); print $2, $4; exit }')
if [ -z "${addr:-}" ]; then
    echo "SKIP: no interface with a global IPv4 address here"
    exit 77
fi
echo "the emulated device serves lo and $ifname ($addr)"
exec env EMURDMA_NETDEV="lo,$ifname" "$wrapper" env FI_TANDEM_LOCAL=0 FI_TANDEM_LINK=verbs \
    EXPECT_DOMAIN=emu_rdma0 PINGPONG_ADDR="$addr" "$(dirname "$0")/fi_pingpong.sh" tandem rdm "$port"
