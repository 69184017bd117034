#!/usr/bin/env bash
# tandem demonstration: two processes talk through the tandem libfabric provider.
#
#   scripts/demo.sh [BUILD_DIR]        (default: <repo>/build, already built)
#
# 1. shows that the system libfabric finds the tandem provider (fi_info),
# 2. starts a tandem_bench server and a tandem_bench client as two separate processes that
#    meet over 127.0.0.1 (a plain TCP socket only exchanges addresses and keys), and measures
#    tagged ping-pong latency, tagged-send bandwidth and RMA-write bandwidth through tandem
#    for 8 B, 4 KiB, 64 KiB and 1 MiB, with every transfer verified: once over the
#    node-local path (tandem + off_tandem, shared memory), once over the network path,
# 3. prints what it measured.
# Builds nothing. Environment: DEMO_PORT (control port, default 47930), DEMO_SIZES, and
# DEMO_PROVIDER (default tandem; e.g. "tcp;ofi_rxm" runs the same demo on a system provider).
set -u

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench-table.sh
. "$here/bench-table.sh"
build=${1:-$here/../build}
build=$(cd "$build" 2>/dev/null && pwd) || { echo "demo: no build directory ${1:-$here/../build}" >&2; exit 1; }
bench=$build/bench/tandem_bench
lib=$build/lib/libtandem-fi.so
prov=${DEMO_PROVIDER:-tandem}
need=("$bench")
[ "$prov" = tandem ] && need+=("$lib")
for f in "${need[@]}"; do
    [ -e "$f" ] || { echo "demo: $f is missing: build first (cmake -S . -B build && cmake --build build)" >&2; exit 1; }
done
sizes=${DEMO_SIZES:-8,4k,64k,1m}
export FI_PROVIDER_PATH=$build/lib
unset FI_PROVIDER

listening() {  # listening PORT: something listens on this TCP port
    local hex
    hex=$(printf '%04X' "$1")
    awk -v p=":$hex" 'NR > 1 && substr($2, length($2) - 4) == p && $4 == "0A" { f = 1 } END { exit !f }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
port=${DEMO_PORT:-47930}
while listening "$port"; do port=$((port + 1)); done

echo "== $prov demo ($(date '+%F %T'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
[ "$prov" = tandem ] && echo "   provider library: $lib"
echo
echo "== 1. libfabric sees the provider"
if command -v fi_info >/dev/null; then
    fi_info -l | grep -A1 "^${prov%%;*}:" | sed 's/^/   /'
    echo "   endpoints offered (fi_info -p '$prov'):"
    listing=$(fi_info -p "$prov" 2>/dev/null |
        awk '/^provider:/ { p = $2 } /^ *domain:/ { d = $2 } /^ *type:/ { t = $2 }
             /^ *protocol:/ { printf "     %-16s %-10s domain %-8s %s\n", p, t, d, $2 }' | sort -u)
    echo "${listing:-     (none)}"
    if grep -q "^ *$prov;ofi_rxm " <<<"$listing"; then
        echo "   (\"$prov;ofi_rxm\" is the core's ofi_rxm layered over $prov's MSG endpoints)"
    fi
else
    echo "   (fi_info not installed: apt-get install libfabric-bin)"
fi
domain_opt=()
if command -v fi_info >/dev/null && fi_info -p "$prov" -t FI_EP_RDM 2>/dev/null | grep -Eq '^ *domain: lo$'; then
    domain_opt=(-d lo)  # 127.0.0.1 lives on the loopback interface: use tandem's "lo" domain
fi

# run_pair LABEL DESCRIPTION: one server + client pair; prints the client's table, returns non-zero on failure.
run_pair() {
    local label=$1
    echo
    echo "== 2$label. two processes over 127.0.0.1: tandem_bench server + client (FI_EP_RDM${domain_opt[*]:+, domain lo})"
    echo "   (the measured traffic goes through $prov; the TCP socket only exchanges addresses)"
    echo "   \$ tandem_bench -p '$prov' ${domain_opt[*]} -s 127.0.0.1:$port &"
    timeout 240 "$bench" -p "$prov" "${domain_opt[@]}" -s "127.0.0.1:$port" -T 230 >"$tmp/server" 2>&1 &
    local server=$!
    echo "   \$ tandem_bench -p '$prov' ${domain_opt[*]} -c 127.0.0.1:$port -S $sizes"
    timeout 240 "$bench" -p "$prov" "${domain_opt[@]}" -c "127.0.0.1:$port" -S "$sizes" -T 230 >"$tmp/client" 2>&1
    local client_rc=$?
    [ "$client_rc" -eq 0 ] || kill "$server" 2>/dev/null
    wait "$server"
    local server_rc=$?
    sed 's/^/   /' "$tmp/client"
    if [ "$client_rc" -ne 0 ] || [ "$server_rc" -ne 0 ]; then
        echo
        echo "== demo FAILED: client exited $client_rc, server exited $server_rc. Server output:"
        sed 's/^/   /' "$tmp/server"
        return 1
    fi
    echo
    echo "== 3$label. what was measured ($prov$2, two processes, both busy-polling)"
    print_bench_table "$tmp/client"
    grep -q '^# all transfers verified' "$tmp/client" && echo "   every transfer's data was verified on the receiving side"
    port=$((port + 1))
    while listening "$port"; do port=$((port + 1)); done
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "$prov" = tandem ]; then
    # Both processes are on this node: by default tandem hands their traffic to its offload
    # provider's shared memory; FI_TANDEM_LOCAL=0 makes it cross tandem's TCP link instead.
    export FI_TANDEM_LOCAL=1
    run_pair a ", node-local path: off_tandem shared memory" || exit 1
    export FI_TANDEM_LOCAL=0
    run_pair b ", network path: TCP link (FI_TANDEM_LOCAL=0)" || exit 1
else
    run_pair "" "" || exit 1
fi
# GPU memory (FI_HMEM) under each P2P policy, node-local: on a real CUDA driver where there is
# one, else on the tests' emulated driver (hmem_bench then says its figures are no GPU's).
hb=$build/bench/hmem_bench
if [ "$prov" = tandem ] && [ -x "$hb" ]; then
    if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' || [ -e "$build/tests/emucuda/libcuda.so.1" ]; then
        echo
        echo "== 4. GPU memory through the provider pair: device-to-device ping-pong per FI_OPT_FI_HMEM_P2P"
        ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' ||
            export LD_LIBRARY_PATH=$build/tests/emucuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        FI_TANDEM_LOCAL=1 "$hb" -n 100 -s 8,65536,1048576 | sed 's/^/   /' || exit 1
    fi
fi
# Collectives, started as users start jobs: two ranks under mpirun, node-local (the group's
# shared segment), then by messages over the TCP link.
cb=$build/bench/coll_bench
if [ "$prov" = tandem ] && [ -x "$cb" ] && command -v mpirun >/dev/null 2>&1; then
    echo
    echo "== 5. collectives: fi_allreduce (FI_SUM, FI_FLOAT) and fi_barrier, 2 ranks under mpirun"
    for local in 1 0; do
        echo "   FI_TANDEM_LOCAL=$local ($([ $local = 1 ] && echo "node-local: one shared segment" || echo "by messages over the TCP link"))"
        FI_TANDEM_LOCAL=$local FI_PROVIDER_PATH=$build/lib OMPI_ALLOW_RUN_AS_ROOT=1 \
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun --oversubscribe --bind-to none \
            -np 2 --mca pml ob1 --mca btl self,vader -x FI_PROVIDER_PATH -x FI_TANDEM_LOCAL \
            "$cb" --mode fabric --provider tandem --sizes 8,64k,1m --budget 0.5 2>&1 |
            grep '^coll' | sed 's/^/     /' || exit 1
    done
    echo "   (scripts/bench.sh --coll compares them with Open MPI's own at 2, 4 and 8 ranks)"
fi
echo
echo "   latency: half the round trip of a tagged ping-pong; bandwidth: 64 operations in flight,"
echo "   1 MB = 10^6 bytes. Compare with the system providers: scripts/bench.sh -b $build"
echo "   (network path) and scripts/bench.sh --local -b $build (node-local path)"
