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
# Asked for remote-access events, the device's domain offers them (its target serves RMA).
rma_event=$(FI_TANDEM_LINK=verbs timeout 60 "$wrapper" "$FI_INFO_BIN" -p tandem -t FI_EP_RDM \
    -c "FI_RMA|FI_RMA_EVENT" -v 2>&1 | tr -d '\000') ||
    fail "fi_info -c 'FI_RMA|FI_RMA_EVENT' with FI_TANDEM_LINK=verbs failed: $rma_event"

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

# The device's entries: the link's protocol and memory-registration needs, no FI_RMA_EVENT
# unless asked for (a secondary capability that would cost the NIC's RMA path).
device_block=$verbose
grep -q "protocol: FI_PROTO_RDMA_CM_IB_RC" <<<"$device_block" || fail "no FI_PROTO_RDMA_CM_IB_RC on the device's entry"
grep -Eq "mr_mode: .*FI_MR_VIRT_ADDR" <<<"$device_block" || fail "no FI_MR_VIRT_ADDR in the device's mr_mode"
grep -Eq "mr_mode: .*FI_MR_PROV_KEY" <<<"$device_block" || fail "no FI_MR_PROV_KEY in the device's mr_mode"
grep -Eq "mr_iov_limit: 1$" <<<"$device_block" || fail "the device's mr_iov_limit is not 1"
grep -v '^FI_' <<<"$device_block" | grep -q "FI_RMA_EVENT" && fail "the device's entry offers FI_RMA_EVENT"
rma_event_domains=$(awk '/fi_domain_attr:/ { d = 1 } d && $1 == "name:" { print $2; d = 0 }' <<<"$rma_event" | sort -u)
[ "$rma_event_domains" = "emu_rdma0" ] ||
    fail "asked for FI_RMA_EVENT, the device's domain is not listed: $rma_event_domains"
grep -v '^FI_' <<<"$rma_event" | grep -Eq "caps: .*FI_RMA_EVENT" ||
    fail "asked for FI_RMA_EVENT, the device's entry does not offer it"
grep -Eq "mr_iov_limit: 1$" <<<"$rma_event" &&
    fail "with FI_RMA_EVENT the device's regions are the domain's own, yet mr_iov_limit is 1"
# A destination picks the link: the device (serving loopback here) for 127.0.0.1, TCP for an
# address the route reaches from another interface.
to_lo=$(timeout 60 "$wrapper" "$FI_INFO_BIN" -p tandem -n 127.0.0.1 2>&1) ||
    fail "fi_info -n 127.0.0.1 failed: $to_lo"
[ "$(domains "$to_lo" | head -1)" = "emu_rdma0" ] ||
    fail "for destination 127.0.0.1 the device is not listed first: $(domains "$to_lo" | tr '\n' ' ')"
other=$(ip -4 -o addr show scope global 2>/dev/null | awk '{ sub("/.*", "", $4); print $4; exit }')
if [ -n "$other" ]; then
    to_other=$(timeout 60 "$wrapper" "$FI_INFO_BIN" -p tandem -n "$other" 2>&1) ||
        fail "fi_info -n $other failed: $to_other"
    echo "--- destination $other:     $(domains "$to_other" | tr '\n' ' ')"
    domains "$to_other" | grep -qx emu_rdma0 &&
        fail "for destination $other (not routed through loopback's device) emu_rdma0 is listed"
    [ -n "$(domains "$to_other")" ] || fail "for destination $other no TCP domain is listed"
    # A device serving two interfaces (a port on each) is listed on each, under its own name.
    other_if=$(ip -4 -o addr show scope global | awk '{ print $2; exit }')
    two=$(EMURDMA_NETDEV="lo,$other_if" FI_TANDEM_LINK=verbs timeout 60 "$wrapper" "$FI_INFO_BIN" \
        -p tandem -t FI_EP_RDM 2>&1) || fail "fi_info with the device on lo and $other_if failed: $two"
    fabrics=$(awk '$1 == "fabric:" { print $2 }' <<<"$two" | sort | tr '\n' ' ')
    echo "--- device on lo and $other_if: $(domains "$two" | tr '\n' ' ')/ $fabrics"
    [ "$(domains "$two" | tr '\n' ' ')" = "emu_rdma0 emu_rdma0 " ] ||
        fail "the device serving lo and $other_if is not listed once on each"
    grep -q "127.0.0.0/8" <<<"$fabrics" || fail "the device's loopback fabric is missing: $fabrics"
    [ "$(wc -w <<<"$fabrics")" -eq 2 ] || fail "the device's two entries are not on two fabrics: $fabrics"
else
    echo "(no global IPv4 address here: only the loopback destination checked)"
fi
echo "PASS: emu_rdma0 listed first (verbs link), TCP listing unchanged without it"
