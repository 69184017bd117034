#!/usr/bin/env bash
# fi_info -p tandem and the verbs link: with the emulated RDMA device in place
# (scripts/with-emulated-rdma.sh, serving loopback here), the device's domain is listed
# first, once per endpoint type, with the verbs link's attributes; without the device, and
# with FI_TANDEM_LINK=tcp, the listing is the TCP domains' alone, as before.
# usage: fi_info_verbs.sh WITH_EMULATED_RDMA_SCRIPT
set -u
# shellcheck source=tests/clients/common.sh
. "$(dirname "$0")/common.sh"
[ $# -eq 1 ] || fail "usage: $0 path/to/with-emulated-rdma.sh"
wrapper=$1
need_tool FI_INFO_BIN fi_info
export EMURDMA_NETDEV=lo

domains() {  # the domain names fi_info prints, in order
    awk '$1 == "domain:" { print $2 }' <<<"$1"
}

with=$(timeout 60 "$wrapper" "$FI_INFO_BIN" -p tandem 2>&1) || fail "fi_info under the emulated device failed: $with"
without=$(env -u FI_TANDEM_VERBS_LIB -u FI_TANDEM_RDMACM_LIB timeout 60 "$FI_INFO_BIN" -p tandem 2>&1) ||
    fail "fi_info without the emulated device failed: $without"
tcp_only=$(FI_TANDEM_LINK=tcp timeout 60 "$wrapper" "$FI_INFO_BIN" -p tandem 2>&1) ||
    fail "fi_info with FI_TANDEM_LINK=tcp failed: $tcp_only"
verbs_only=$(FI_TANDEM_LINK=verbs timeout 60 "$wrapper" "$FI_INFO_BIN" -p tandem 2>&1) ||
    fail "fi_info with FI_TANDEM_LINK=verbs failed: $verbs_only"
# (fi_info -v prints the environment variables it read with NUL bytes around their values.)
verbose=$(FI_TANDEM_LINK=verbs timeout 60 "$wrapper" "$FI_INFO_BIN" -p tandem -t FI_EP_RDM -v 2>&1 |
    tr -d '\000') || fail "fi_info -v with FI_TANDEM_LINK=verbs failed: $verbose"

echo "--- with the emulated device: $(domains "$with" | tr '\n' ' ')"
echo "--- without it:               $(domains "$without" | tr '\n' ' ')"
echo "--- FI_TANDEM_LINK=tcp:       $(domains "$tcp_only" | tr '\n' ' ')"
echo "--- FI_TANDEM_LINK=verbs:     $(domains "$verbs_only" | tr '\n' ' ')"

first_two=$(domains "$with" | head -2 | tr '\n' ' ')
[ "$first_two" = "emu_rdma0 emu_rdma0 " ] || fail "emu_rdma0 is not listed first for RDM and MSG: $first_two"
[ "$(domains "$with" | tail -n +3)" = "$(domains "$without")" ] ||
    fail "the TCP domains after the device's differ from the listing without it"
domains "$without" | grep -qx emu_rdma0 && fail "emu_rdma0 listed without the emulated device"
[ "$(domains "$tcp_only")" = "$(domains "$without")" ] || fail "FI_TANDEM_LINK=tcp lists other domains than TCP's"
[ "$(domains "$verbs_only" | sort -u)" = "emu_rdma0" ] || fail "FI_TANDEM_LINK=verbs lists other domains than the device's"

# The device's entries: the link's protocol and memory-registration needs, no FI_RMA_EVENT.
device_block=$verbose
grep -q "protocol: FI_PROTO_RDMA_CM_IB_RC" <<<"$device_block" || fail "no FI_PROTO_RDMA_CM_IB_RC on the device's entry"
grep -Eq "mr_mode: .*FI_MR_VIRT_ADDR" <<<"$device_block" || fail "no FI_MR_VIRT_ADDR in the device's mr_mode"
grep -Eq "mr_mode: .*FI_MR_PROV_KEY" <<<"$device_block" || fail "no FI_MR_PROV_KEY in the device's mr_mode"
grep -Eq "mr_iov_limit: 1$" <<<"$device_block" || fail "the device's mr_iov_limit is not 1"
grep -v '^FI_' <<<"$device_block" | grep -q "FI_RMA_EVENT" && fail "the device's entry offers FI_RMA_EVENT"
echo "PASS: emu_rdma0 listed first (verbs link), TCP listing unchanged without it"
