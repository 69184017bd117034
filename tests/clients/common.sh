# shellcheck shell=bash
# Shared helpers for the real-client tests (sourced, not run).

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# need_tool VAR default: resolve a tool from an environment override or PATH.
need_tool() {
    local var=$1 def=$2 path
    path=${!var:-$def}
    case $path in *-NOTFOUND) path=$def ;; esac
    command -v "$path" >/dev/null 2>&1 || fail "$def not found (install libfabric-bin)"
    printf -v "$var" '%s' "$(command -v "$path")"
}

# select_provider PROV: make libfabric give the application exactly PROV.
# - A core name (tandem): FI_PROVIDER=tandem does NOT hide "tandem;ofi_rxm" (the filter applies
#   to the core name), and the core lists the layered RDM endpoints first, so an application
#   asking for "tandem" RDM would silently run ofi_rxm over tandem's MSG endpoints. Exclude the
#   utility providers instead; the application's -p PROV then picks the core provider itself.
# - A layered name (tandem;ofi_rxm): make sure every part passes the filter.
select_provider() {
    case $1 in
        *\;*) widen_provider_filter "$1" ;;
        *) export FI_PROVIDER="^ofi_rxm,ofi_rxd,ofi_mrail" ;;
    esac
}

# Add each ;-separated component of $1 to an inclusion filter in FI_PROVIDER.
widen_provider_filter() {
    local prov=$1 part
    [ -n "${FI_PROVIDER:-}" ] || return 0
    case $FI_PROVIDER in ^*) return 0 ;; esac
    local IFS=';'
    for part in $prov; do
        case ",$FI_PROVIDER," in *",$part,"*) ;; *) FI_PROVIDER="$FI_PROVIDER,$part" ;; esac
    done
    export FI_PROVIDER
}

# tcp_port_listening PORT: true if something listens on TCP port PORT (IPv4 or IPv6).
tcp_port_listening() {
    local hex f
    hex=$(printf '%04X' "$1")
    for f in /proc/net/tcp /proc/net/tcp6; do
        [ -r "$f" ] || continue
        awk -v p=":$hex" 'NR > 1 && substr($2, length($2) - 4) == p && $4 == "0A" { found = 1 }
                          END { exit !found }' "$f" && return 0
    done
    return 1
}
