#!/usr/bin/env bash
# fi_info -l must list the provider (the core found and loaded lib<prov>-fi.so).
set -u
# shellcheck source=tests/clients/common.sh
. "$(dirname "$0")/common.sh"
prov=${1:-tandem}
need_tool FI_INFO_BIN fi_info

out=$(timeout 60 "$FI_INFO_BIN" -l 2>&1)
rc=$?
echo "$out"
echo "--- fi_info -l exited $rc (FI_PROVIDER_PATH=${FI_PROVIDER_PATH:-<unset>})"
[ "$rc" -eq 0 ] || fail "fi_info -l exited $rc"
grep -qx "$prov:" <<<"$out" || fail "fi_info -l does not list $prov"
version=$(awk -v p="$prov:" '$0 == p { getline; print $2; exit }' <<<"$out")
[ -n "$version" ] || fail "fi_info -l lists $prov without a version"
echo "PASS: fi_info -l lists $prov (version $version)"
