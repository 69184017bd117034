#!/usr/bin/env bash
# Naming tandem gives tandem's own RDM endpoints, never ofi_rxm stacked over its MSG
# endpoints, whichever way a user names it: fi_info -p tandem, FI_PROVIDER=tandem, or no
# filter at all (what Open MPI's prefix-matching include list sees). "tandem;ofi_rxm", named,
# still gives the stack.
set -u
# shellcheck source=tests/clients/common.sh
. "$(dirname "$0")/common.sh"
need_tool FI_INFO_BIN fi_info

# providers_of ARGS...: the provider names of fi_info's RDM answers, one per line, sorted.
providers_of() {
    local out rc
    out=$(timeout 60 "$@" -t FI_EP_RDM 2>&1)
    rc=$?
    [ "$rc" -eq 0 ] || { echo "$out" >&2; fail "$* -t FI_EP_RDM exited $rc"; }
    awk '/^provider:/ { print $2 }' <<<"$out" | sort -u
}

# expect_exactly WHAT LIST: LIST is the single provider name WHAT.
expect_exactly() {
    echo "  got: $(tr '\n' ' ' <<<"$2")"
    [ "$2" = "$1" ] || fail "expected only '$1'"
}

echo "fi_info -p tandem (FI_PROVIDER=${FI_PROVIDER:-<unset>}):"
expect_exactly tandem "$(providers_of "$FI_INFO_BIN" -p tandem)"

echo "FI_PROVIDER=tandem fi_info:"
expect_exactly tandem "$(FI_PROVIDER=tandem providers_of "$FI_INFO_BIN")"

echo "fi_info with no filter (as Open MPI sees the list):"
all=$(env -u FI_PROVIDER bash -c "$(declare -f providers_of fail); providers_of '$FI_INFO_BIN'")
echo "  got: $(tr '\n' ' ' <<<"$all")"
grep -qx tandem <<<"$all" || fail "tandem is missing from the unfiltered list"
grep -q '^tandem;' <<<"$all" && fail "a utility provider is stacked over tandem unasked"

echo "fi_info -p 'tandem;ofi_rxm' (FI_PROVIDER=tandem,ofi_rxm):"
expect_exactly 'tandem;ofi_rxm' "$(FI_PROVIDER=tandem,ofi_rxm providers_of "$FI_INFO_BIN" -p 'tandem;ofi_rxm')"

echo "PASS: naming tandem gives tandem; tandem;ofi_rxm only when named"
