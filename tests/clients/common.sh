# shellcheck shell=bash
# Shared helpers for the real-client tests (sourced, not run).

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# skip REASON: the test cannot run here; ctest (SKIP_RETURN_CODE 77) reports it skipped.
skip() {
    echo "SKIPPED: $*"
    exit 77
}

# need_tool VAR default: resolve a tool from an environment override or PATH.
need_tool() {
    local var=$1 def=$2 path
    path=${!var:-$def}
    case $path in *-NOTFOUND) path=$def ;; esac
    command -v "$path" >/dev/null 2>&1 || fail "$def not found (install libfabric-bin)"
    printf -v "$var" '%s' "$(command -v "$path")"
}

# select_provider PROV: make libfabric give the application PROV the way users ask for it.
# - A core name (tandem): nothing beyond the FI_PROVIDER=tandem the test environment already
#   sets and the application's own -p PROV. tandem tells the core not to stack ofi_rxm over it
#   unasked, so that is enough to reach tandem's own endpoints (rxm_in_path checks it).
# - A layered name (tandem;ofi_rxm): make sure every part passes the filter.
select_provider() {
    case $1 in
        *\;*) widen_provider_filter "$1" ;;
        *) ;;
    esac
}

# rxm_in_path LOG: true if LOG (libfabric's output at FI_LOG_LEVEL=info) shows an ofi_rxm
# endpoint at work: its AV, its endpoint settings, its connection manager. The core's own
# lines about rxm (parameter reads, layering skipped) do not count.
rxm_in_path() {
    grep -Eq '::ofi_rxm:(av|ep_ctrl|ep_data|cq|domain):|rxm_ep_settings_init' "$1"
}

# tandem_endpoint_in_path LOG TYPE: true if tandem logged that it enabled an endpoint of
# TYPE (RDM or MSG).
tandem_endpoint_in_path() {
    grep -Eq "::tandem:ep_ctrl:.*$2 endpoint enabled on " "$1"
}

# node_local_in_path LOG: true if the node-local channel opened a peer's inbox to carry traffic
# (the channel's open_peer logs it, from whichever provider's call opened it first: tandem's
# data calls, or off_tandem answering a cell).
node_local_in_path() {
    grep -Eq '::(off_)?tandem:ep_ctrl:.*node-local peer ' "$1"
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
