#!/usr/bin/env bash
# fi_info -p PROV must list the provider with both FI_EP_RDM and FI_EP_MSG endpoints, and
# nothing from another provider.
set -u
# shellcheck source=tests/clients/common.sh
. "$(dirname "$0")/common.sh"
prov=${1:-tandem}
need_tool FI_INFO_BIN fi_info

out=$(timeout 60 "$FI_INFO_BIN" -p "$prov" 2>&1)
rc=$?
echo "$out"
echo "--- fi_info -p $prov exited $rc"
[ "$rc" -eq 0 ] || fail "fi_info -p $prov exited $rc"

# Collect "provider type" pairs from the listing.
pairs=$(awk '/^provider:/ { p = $2 } /^[ \t]*type:/ { print p, $2 }' <<<"$out" | sort -u)
[ -n "$pairs" ] || fail "fi_info printed no endpoint for provider $prov"
echo "endpoints found:"
echo "$pairs" | sed 's/^/  /'
others=$(awk -v want="$prov" '$1 != want && index($1, want ";") != 1' <<<"$pairs")
[ -z "$others" ] || fail "fi_info -p $prov returned providers not built on $prov: $others"
for ep in FI_EP_RDM FI_EP_MSG; do
    grep -qx "$prov $ep" <<<"$pairs" || fail "fi_info -p $prov lists no $ep endpoint"
done
echo "PASS: $prov offers FI_EP_RDM and FI_EP_MSG"
