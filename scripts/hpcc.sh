#!/usr/bin/env bash
# Runs the HPC Challenge benchmark (Debian's hpcc, built against Open MPI) under Open MPI over
# tandem, and over the system's tcp;ofi_rxm as the reference.
#
#   scripts/hpcc.sh [-m MODES] [-n NPS] [-N SIZE] [-T SECONDS]
#
# HPCC is a whole MPI application: HPL (LU over a P x Q process grid), PTRANS, RandomAccess,
# FFT, DGEMM, STREAM, and the ring latency and bandwidth tests, each checking its own result.
# One mpirun per mode and number of ranks, with pml cm and mtl ofi forced onto the provider
# the way users name it (mtl_ofi_provider_include), in each mode:
#   local  tandem, default settings (node-local peers go through off_tandem's shared memory)
#   tcp    tandem with FI_TANDEM_LOCAL=0 (every peer over the TCP link)
#   rxm    the system's tcp;ofi_rxm (the reference)
# A run passes when mpirun exits 0 within the time limit, the summary says Success=1, HPL's
# residual checks all passed, RandomAccess and PTRANS found no error, and every rank enabled
# the provider's own RDM endpoint (tandem's info line; for rxm, ofi_rxm's). It prints one line
# per run with HPL's GFLOP/s and the ring latency and bandwidth, and exits 1 when any run
# failed. Problem size: N (default 1000, -N); grid 1 x 2 for 2 ranks, 2 x 2 for 4.
# Logs and outputs: <build>/hpcc/<mode>-np<N>/.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
modes=local,tcp,rxm
nps=2,4
size=1000
limit=300

usage() {
    echo "usage: $0 [-m MODES among local,tcp,rxm] [-n NPS] [-N SIZE] [-T SECONDS]" >&2
    exit 2
}
while getopts "m:n:N:T:h" opt; do
    case $opt in
        m) modes=$OPTARG ;;
        n) nps=$OPTARG ;;
        N) size=$OPTARG ;;
        T) limit=$OPTARG ;;
        *) usage ;;
    esac
done
[ -f "$build/lib/libtandem-fi.so" ] || {
    echo "error: no providers in $build/lib: build tandem first (scripts/build.sh)" >&2
    exit 2
}
source "$root/scripts/need-commands.sh"
need_commands hpcc:hpcc mpirun:openmpi-bin
example=/usr/share/doc/hpcc/examples/_hpccinf.txt
[ -f "$example" ] || { echo "error: $example is missing (package hpcc)" >&2; exit 2; }

# The user's environment is not the users' environment: no tuning, no other provider.
for v in $(env | sed -n 's/^\(FI_TANDEM_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset FI_PROVIDER FI_PROVIDER_PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# The input: the package's example with our N and grid. Its lines are positional: line 6 is
# N, lines 11 and 12 the grid's P and Q.
input() {
    local np=$1 p q
    case $np in
        1) p=1 q=1 ;;
        2) p=1 q=2 ;;
        4) p=2 q=2 ;;
        *) p=1 q=$np ;;
    esac
    sed -e "6s/^[0-9]*/$size/" -e "11s/^[0-9]*/$p/" -e "12s/^[0-9]*/$q/" "$example"
}

# summary KEY FILE: a value of the output's summary section.
summary() { sed -n "/^Begin of Summary/,/^End of Summary/s/^$1=//p" "$2" | head -1; }

failed=0
printf '%-6s %-4s %-6s %-8s %-10s %-14s %-12s %s\n' mode np result seconds "HPL GF/s" \
    "ring lat (us)" "ring BW GB/s" why
IFS=, read -ra mode_list <<<"$modes"
IFS=, read -ra np_list <<<"$nps"
for mode in "${mode_list[@]}"; do
    case $mode in
        local) prov=tandem env_args=() ;;
        tcp) prov=tandem env_args=(-x FI_TANDEM_LOCAL=0) ;;
        rxm) prov=tcp env_args=() ;;
        *) echo "error: unknown mode $mode" >&2 && exit 2 ;;
    esac
    for np in "${np_list[@]}"; do
        dir=$build/hpcc/$mode-np$np
        rm -rf "$dir"
        mkdir -p "$dir"
        input "$np" >"$dir/hpccinf.txt"
        t0=$(date +%s)
        rc=0
        # Info logging names the endpoints each rank enabled (checked below).
        (cd "$dir" && timeout -k 10 "$limit" mpirun --allow-run-as-root --oversubscribe \
            --bind-to none -np "$np" -x FI_PROVIDER_PATH="$build/lib" -x FI_LOG_LEVEL=info \
            "${env_args[@]}" --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "$prov" \
            hpcc) >"$dir/mpirun.log" 2>&1 </dev/null || rc=$?
        secs=$(($(date +%s) - t0))
        out=$dir/hpccoutf.txt
        why=""
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            why="timed out after $limit s"
        elif [ $rc -ne 0 ]; then
            why="mpirun exited $rc"
        elif [ ! -f "$out" ]; then
            why="no hpccoutf.txt"
        elif [ "$(summary Success "$out")" != 1 ]; then
            why="summary: Success is not 1"
        elif ! grep -q '^ *0 tests completed and failed residual checks' "$out" ||
            grep -q '^ *0 tests completed and passed residual checks' "$out"; then
            why="HPL residual checks"
        elif [ "$(summary MPIRandomAccess_Errors "$out")" != 0 ] ||
            [ "$(summary MPIRandomAccess_LCG_Errors "$out")" != 0 ]; then
            why="RandomAccess errors"
        elif [ "$(summary PTRANS_residual "$out")" != 0 ]; then
            why="PTRANS residual $(summary PTRANS_residual "$out")"
        fi
        # The provider that ran: every rank's RDM endpoint.
        if [ -z "$why" ]; then
            if [ "$prov" = tandem ]; then
                n=$(grep -Ec '::tandem:ep_ctrl:.*RDM endpoint enabled' "$dir/mpirun.log" || true)
                bad=$(grep -Ec '::(ofi_rxm|ofi_rxd):(av|ep_ctrl|ep_data|cq|domain):' \
                    "$dir/mpirun.log" || true)
                [ "$n" -ge "$np" ] && [ "$bad" -eq 0 ] ||
                    why="$n of $np ranks enabled a tandem RDM endpoint ($bad utility-provider lines)"
            else
                grep -q '::ofi_rxm:' "$dir/mpirun.log" || why="no ofi_rxm endpoint seen"
            fi
        fi
        if [ -z "$why" ]; then
            res=pass
        else
            res=FAIL
            failed=1
        fi
        gf=$(awk -v t="$(summary HPL_Tflops "$out" 2>/dev/null)" 'BEGIN { if (t != "") printf "%.2f", t * 1000 }')
        lat=$(summary RandomlyOrderedRingLatency_usec "$out" 2>/dev/null || true)
        bw=$(summary RandomlyOrderedRingBandwidth_GBytes "$out" 2>/dev/null || true)
        printf '%-6s %-4s %-6s %-8s %-10s %-14s %-12s %s\n' "$mode" "$np" "$res" "$secs" \
            "${gf:--}" "${lat:--}" "${bw:--}" "$why"
    done
done
if [ $failed -ne 0 ]; then
    echo "hpcc: FAILED (logs under $build/hpcc)"
    exit 1
fi
echo "hpcc: passed"
