#!/usr/bin/env bash
# Runs the Intel MPI Benchmarks (IMB) under Open MPI over tandem, and over the system's
# tcp;ofi_rxm as the reference.
#
#   scripts/imb.sh [options]
#
# The IMB source is a tarball (imb-<version>.tar.gz) or a directory holding one; by default
# ../shared/vendor beside the repository, which is read-only in CI: it is unpacked and built
# out of tree under <build>/imb (IMB's makefiles build in their own tree), each binary only
# when it is missing. Nothing of IMB is kept in this repository.
#
# Each run is one mpirun of one IMB binary on N ranks of this host, the way users run it:
#   IMB-MPI1, IMB-NBC, IMB-P2P  pml cm, mtl ofi, mtl_ofi_provider_include <provider>
#   IMB-RMA, IMB-EXT            one-sided through osc rdma over btl ofi forced onto
#                               tandem (pml ob1 with btl tcp for the two-sided part, which
#                               btl ofi of Open MPI 4.1 does not carry): the settings of
#                               tests/mpi/run_mpi.sh's MPI_TEST_MODE=osc
#                               (-o pt2pt: osc pt2pt over pml cm instead; the rxm mode always,
#                               as Open MPI 4.1's btl ofi opens no module on tcp;ofi_rxm)
# in each mode:
#   local  tandem, default settings (node-local peers go through off_tandem's shared memory)
#   tcp    tandem with FI_TANDEM_LOCAL=0 (every peer over the TCP link)
#   rxm    the system's tcp;ofi_rxm (the reference: what fails here is not tandem's)
# A run fails when mpirun exits non-zero, when it outlives the timeout (a hang, or a run too
# slow to tell from one: the ranks' backtraces are taken with gdb, when there is one, before
# they are killed), when its output holds an error or a warning of tandem's, when IMB did not
# reach MPI_Finalize, or when what ran is not what was asked for: every rank's pml (and mtl)
# from Open MPI's verbose selection, as tests/mpi/run_mpi.sh checks it; over tandem, every
# rank's tandem RDM endpoint, no utility provider in between, and the path of the mode (the
# ranks met node-local in the local mode, over the link in the tcp mode, from tandem's info
# log); over tcp;ofi_rxm, every rank's ofi_rxm endpoint.
# It prints one line per run (benchmark, ranks, mode, result, seconds) and exits 1 when any
# run failed. Logs: <build>/imb/run/<binary>-np<N>-<mode>.log. docs/imb.md has the results.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
src=$root/../shared/vendor
benchmarks=MPI1,EXT,NBC,RMA,P2P
modes=local,tcp,rxm
nps=2,4
quick=0
onesided=rdma
maxlog=20
limit=""
extra=()

usage() {
    cat >&2 <<EOF
usage: $0 [options] [-- IMB arguments, e.g. benchmark names]
  -s SRC        IMB tarball, or a directory holding imb-*.tar.gz (default: $src)
  -b DIR        tandem build directory (default: \$BUILD_DIR or $root/build)
  -B LIST       IMB binaries, comma-separated among MPI1,EXT,NBC,RMA,P2P (default: $benchmarks)
  -m MODES      comma-separated modes among local,tcp,rxm (default: $modes)
  -n NPS        comma-separated numbers of ranks (default: $nps)
  -q            quick: few iterations and sizes (-iter 10 -msglog 0:M -time 5 -npmin N;
                IMB-P2P: -iter 10 -msglog 0:M -pause 0)
  -M M          with -q, the largest message is 2^M bytes (default: $maxlog)
  -o OSC        one-sided path of IMB-RMA and IMB-EXT over tandem: rdma (osc rdma over btl
                ofi, as tests/mpi/run_mpi.sh's osc mode) or pt2pt (osc pt2pt over mtl ofi)
                (default: $onesided; the rxm mode always takes pt2pt)
  -T SECONDS    timeout of each run (default: 360 quick, 900 otherwise)
  -p PROGRESS   manual or auto: Open MPI's mtl_ofi_data_progress and mtl_ofi_control_progress
                (auto: the provider's automatic progress, tandem's progress thread; default:
                what Open MPI asks by default, which is the provider's default, manual)
EOF
    exit 2
}

progress=""
while getopts "s:b:B:m:n:qM:o:T:p:h" opt; do
    case $opt in
        s) src=$OPTARG ;;
        b) build=$(cd "$OPTARG" && pwd) ;;
        B) benchmarks=$OPTARG ;;
        m) modes=$OPTARG ;;
        n) nps=$OPTARG ;;
        q) quick=1 ;;
        M) maxlog=$OPTARG ;;
        o) onesided=$OPTARG ;;
        T) limit=$OPTARG ;;
        p) progress=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
extra=("$@")
# (Quick runs took 4 to 250 s here, on 2 cores shared with other work, the longest being
# osc rdma's accumulates over the TCP link on 4 ranks.)
[ -n "$limit" ] || { [ $quick -eq 1 ] && limit=360 || limit=900; }

[ -f "$build/lib/libtandem-fi.so" ] || {
    echo "error: no providers in $build/lib: build tandem first (scripts/build.sh)" >&2
    exit 2
}
IFS=, read -ra bench_list <<<"$benchmarks"
IFS=, read -ra mode_list <<<"$modes"
IFS=, read -ra np_list <<<"$nps"
for b in "${bench_list[@]}"; do
    case $b in
        MPI1 | EXT | NBC | RMA | P2P) ;;
        *) echo "error: unknown IMB binary $b" >&2 && exit 2 ;;
    esac
done
case $onesided in rdma | pt2pt) ;; *) echo "error: -o takes rdma or pt2pt" >&2; exit 2 ;; esac
case $progress in "" | manual | auto) ;; *) echo "error: -p takes manual or auto" >&2; exit 2 ;; esac
for m in "${mode_list[@]}"; do
    case $m in local | tcp | rxm) ;; *) echo "error: unknown mode $m" >&2 && exit 2 ;; esac
done

# --- what the build and the runs need ---------------------------------------------------------
source "$root/scripts/need-commands.sh"
need_commands mpicc:libopenmpi-dev mpicxx:libopenmpi-dev mpirun:openmpi-bin make:make g++:g++ \
    tar:tar gzip:gzip sha256sum:coreutils timeout:coreutils setsid:util-linux

# --- the source: a tarball, unpacked under the build tree ------------------------------------
if [ -d "$src" ]; then
    tarball=$(ls "$src"/imb-*.tar.gz 2>/dev/null | sort -V | tail -1)
    [ -n "$tarball" ] || { echo "error: no imb-*.tar.gz in $src" >&2; exit 2; }
else
    tarball=$src
fi
[ -f "$tarball" ] || { echo "error: no IMB tarball at $tarball" >&2; exit 2; }
imb=$build/imb
bin=$imb/bin
sum=$(sha256sum "$tarball" | cut -d' ' -f1)
if [ "$(cat "$imb/.sha256" 2>/dev/null)" != "$sum" ]; then
    # Another tarball: nothing built from the old one stays.
    rm -rf "$imb/src" "$bin"
    mkdir -p "$imb/src"
    tar -xf "$tarball" -C "$imb/src" || { echo "error: cannot unpack $tarball" >&2; exit 2; }
    echo "$sum" >"$imb/.sha256"
fi
top=$(find "$imb/src" -mindepth 1 -maxdepth 1 -type d | head -1)
[ -f "$top/Makefile" ] || { echo "error: $tarball holds no IMB tree" >&2; exit 2; }

# --- build the binaries that are missing -------------------------------------------------------
# IMB's top Makefile calls plain `make` in src_cpp/ and src_c/P2P/ (no jobserver for -j), so
# the sub-makes are called here as it calls them. Open MPI 4.1's C++ bindings trip IMB's
# -Werror: OMPI_SKIP_MPICXX leaves them out (IMB uses only the C API).
mkdir -p "$bin" "$imb/logs"
for b in "${bench_list[@]}"; do
    [ -x "$bin/IMB-$b" ] && continue
    echo "building IMB-$b in $top"
    t0=$(date +%s)
    if [ "$b" = P2P ]; then
        dir=$top/src_c/P2P
        args=(TARGET=P2P CC=mpicc)
    else
        dir=$top/src_cpp
        args=(TARGET="$b" CC=mpicc CXX=mpicxx CXXFLAGS=-DOMPI_SKIP_MPICXX=1)
    fi
    if ! make -C "$dir" -f Makefile -j"$(nproc)" "${args[@]}" >"$imb/logs/IMB-$b.log" 2>&1; then
        echo "error: building IMB-$b failed; the end of $imb/logs/IMB-$b.log:" >&2
        tail -20 "$imb/logs/IMB-$b.log" >&2
        exit 2
    fi
    cp "$dir/IMB-$b" "$bin/IMB-$b"
    echo "built IMB-$b in $(($(date +%s) - t0)) s"
done

# --- run -------------------------------------------------------------------------------------
rundir=$imb/run
mkdir -p "$rundir"
# The user's environment is not the users' environment: no tuning, no other provider.
for v in $(env | sed -n 's/^\(FI_TANDEM_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset FI_PROVIDER FI_PROVIDER_PATH FI_LOG_LEVEL FI_LOG_SUBSYS

# The ranks' backtraces (all threads), when gdb is there: where a hung run waits.
backtraces() {
    local sid=$1 out=$2 pid
    command -v gdb >/dev/null || { echo "(no gdb: no backtraces)" >>"$out"; return 0; }
    for pid in $(ps -eo pid=,sid=,comm= | awk -v s="$sid" '$2 == s && $3 ~ /^IMB-/ {print $1}'); do
        echo "=== backtrace of rank pid $pid" >>"$out"
        timeout 60 gdb -p "$pid" -batch -nx -ex "set pagination off" -ex "thread apply all bt" \
            >>"$out" 2>&1 </dev/null || true
    done
}

# Ends every process of session SID (the one setsid started for a run), and only those.
kill_session() {
    local sid=$1 sig pids
    for sig in TERM KILL; do
        pids=$(ps -eo pid=,sid= | awk -v s="$sid" '$2 == s {print $1}')
        [ -n "$pids" ] || return 0
        kill -"$sig" $pids 2>/dev/null || true
        sleep 3
    done
}

# run_one BINARY NP MODE: one mpirun; sets res (pass/FAIL/HANG) and why.
run_one() {
    local b=$1 np=$2 mode=$3
    local log=$rundir/IMB-$b-np$np-$mode${progress:+-$progress}.log
    local prov=tandem osc=""
    # One-sided: osc rdma over btl ofi on tandem (run_mpi.sh's MPI_TEST_MODE=osc), or osc
    # pt2pt over pml cm (-o pt2pt: what an mtl ofi user of Open MPI 4.1 gets by default, as
    # osc rdma needs a btl). The reference takes osc pt2pt: Open MPI 4.1's btl ofi opens no
    # module on tcp;ofi_rxm (MPI_Win_create then fails with MPI_ERR_WIN).
    case $b in RMA | EXT) osc=$onesided ;; esac
    [ "$mode" = rxm ] && [ -n "$osc" ] && osc=pt2pt
    # Info logging says which providers the core registered and which endpoints ran.
    local -a envs=(FI_PROVIDER_PATH="$build/lib")
    case $mode in
        local) ;;
        tcp) envs+=(FI_TANDEM_LOCAL=0) ;;
        # A layered name is admitted part by part, as run_mpi.sh does; a core provider is
        # left to Open MPI's include list.
        rxm) prov="tcp;ofi_rxm" envs+=(FI_PROVIDER=tcp,ofi_rxm) ;;
    esac
    if [ "$osc" = rdma ]; then
        # tandem's debug lines name every atomic it executes; only the data path's, so the
        # log stays small.
        envs+=(FI_LOG_LEVEL=debug FI_LOG_SUBSYS=core,ep_ctrl,ep_data)
    else
        envs+=(FI_LOG_LEVEL=info)
    fi
    local -a xargs=() e
    for e in "${envs[@]}"; do xargs+=(-x "$e"); done
    local -a cmd=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" "${xargs[@]}")
    if [ "$osc" = rdma ]; then
        # pml ob1 with btl tcp for the two-sided part, which btl ofi of Open MPI 4.1 does not
        # carry.
        cmd+=(--mca pml ob1 --mca btl self,tcp,ofi --mca osc rdma
              --mca btl_ofi_provider_include "$prov" --mca pml_base_verbose 10)
    else
        cmd+=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "$prov"
              --mca pml_base_verbose 10 --mca mtl_base_verbose 10)
        [ -n "$progress" ] &&
            cmd+=(--mca mtl_ofi_data_progress "$progress" --mca mtl_ofi_control_progress "$progress")
        [ "$osc" = pt2pt ] && cmd+=(--mca osc pt2pt)
    fi
    local -a iargs=()
    if [ $quick -eq 1 ]; then
        # Messages up to 2^maxlog bytes (default 1 MiB: past tandem's eager limit of 64 KiB,
        # into the rendezvous and single-copy paths), 10 repetitions each.
        if [ "$b" = P2P ]; then
            iargs=(-iter 10 -msglog "0:$maxlog" -pause 0)
        else
            # -npmin N: the collectives on all N ranks only, not on every smaller group too.
            iargs=(-iter 10 -msglog "0:$maxlog" -time 5 -npmin "$np")
        fi
    fi
    cmd+=("$bin/IMB-$b" "${iargs[@]}" "${extra[@]}")
    echo "+ ${envs[*]} ${cmd[*]}" >"$log"

    # mpirun in a session of its own, so that a hang is killed whole and nothing else is; the
    # outer timeout is a backstop should the backtraces themselves hang.
    setsid timeout -k 10 $((limit + 300)) "${cmd[@]}" >>"$log" 2>&1 </dev/null &
    local pid=$! waited=0 rc
    while kill -0 "$pid" 2>/dev/null && [ $waited -lt "$limit" ]; do
        sleep 1
        waited=$((waited + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "=== timed out after $limit s" >>"$log"
        backtraces "$pid" "$log.bt"
        kill_session "$pid"
        wait "$pid" 2>/dev/null || true
        res=HANG why="timed out after $limit s (backtraces: $log.bt)"
        return
    fi
    rc=0
    wait "$pid" || rc=$?
    res=pass why=""
    fail() { res=FAIL; why="${why:+$why; }$*"; }
    [ "$rc" -eq 0 ] || fail "mpirun exited $rc"
    # IMB's own lines and Open MPI's, without the log and verbose chatter: any error there.
    local errs
    errs=$(grep -v -e '^libfabric:' -e 'mca: base:' -e 'mca:base:select' -e 'select: ' \
        -e 'mtl:ofi:' -e $'^\t\t' -e '^+ ' "$log" |
        grep -Ei 'error|abort|fail|segmentation|signal|killed|not found|unable|mismatch|unknown' |
        head -3 || true)
    [ -z "$errs" ] || fail "output: $(echo "$errs" | tr '\n' '|')"
    grep -q 'All processes entering MPI_Finalize' "$log" || fail "IMB did not reach MPI_Finalize"
    # tandem warns only of what went wrong (a refused key, a dropped message, a lost link).
    errs=$(grep -E '::(off_)?tandem:[a-z_]+:.*<warn>' "$log" | head -2 || true)
    [ -z "$errs" ] || fail "tandem warned: $(echo "$errs" | tr '\n' '|')"

    # What ran: every rank's pml, and its provider.
    local n
    if [ "$osc" = rdma ]; then
        n=$(grep -c 'select: component ob1 selected' "$log" || true)
        [ "$n" -eq "$np" ] || fail "pml ob1 selected by $n of $np ranks"
    else
        n=$(grep -c 'select: component cm selected' "$log" || true)
        [ "$n" -eq "$np" ] || fail "pml cm selected by $n of $np ranks"
        # (The line names the domain, e.g. eth0: the provider is checked below.)
        n=$(grep -c 'mtl:ofi:provider:' "$log" || true)
        [ "$n" -eq "$np" ] || fail "mtl ofi opened a provider in $n of $np ranks"
    fi
    if [ "$mode" = rxm ]; then
        n=$(grep -c 'rxm_ep_settings_init' "$log" || true)
        [ "$n" -ge "$np" ] || fail "$n of $np ranks set up an ofi_rxm endpoint"
        return
    fi
    # tandem's own RDM endpoint in every rank, and no utility provider layered in between.
    n=$(grep -Ec '::tandem:ep_ctrl:.*RDM endpoint enabled on ' "$log" || true)
    [ "$n" -ge "$np" ] || fail "$n of $np ranks enabled a tandem RDM endpoint"
    n=$(grep -Ec '::(ofi_rxm|ofi_rxd|ofi_mrail):(av|ep_ctrl|ep_data|cq|domain):|rxm_ep_settings_init' \
        "$log" || true)
    [ "$n" -eq 0 ] || fail "a utility provider logged $n lines: not plain tandem"
    # The path of the mode. A rank's tandem endpoint logs its first meeting with each peer it
    # moves data with: node-local ("node-local peer ...") or over the link ("peer at fi_addr
    # ...: over the link"). With osc rdma, btl ofi carries only RMA and atomics (it has no
    # sends), so a meeting there is one-sided traffic; without btl ofi, osc rdma creates no
    # window here at all (MPI_ERR_WIN).
    local met_local met_link
    # (The node-local channel's open_peer logs under the provider whose call opened the peer.)
    met_local=$(grep -Ec '::(off_)?tandem:ep_ctrl:.*node-local peer .* single copy' "$log" || true)
    met_link=$(grep -Ec '::tandem:ep_ctrl:.*peer at fi_addr [0-9]+: over the link' "$log" || true)
    if [ "$mode" = local ]; then
        [ "$met_local" -gt 0 ] || fail "no rank met a peer on the node-local path"
        [ "$met_link" -eq 0 ] || fail "$met_link peers met over the link in the local mode"
    else
        n=$(grep -Ec '::tandem:core:.*read bool var local=0' "$log" || true)
        [ "$n" -ge "$np" ] || fail "FI_TANDEM_LOCAL=0 reached $n of $np ranks"
        [ "$met_link" -gt 0 ] || fail "no rank met a peer over the link"
        [ "$met_local" -eq 0 ] || fail "$met_local peers met on the node-local path in the tcp mode"
    fi
    if [ "$osc" = rdma ]; then
        # For the log: few or none, as osc rdma keeps its locks in shared memory between ranks
        # of one node and does floating-point accumulates (IMB's) as get and put.
        n=$({ grep -Eo 'tandem:ep_data:[a-z_]+\(\):[0-9]+<debug> atomic op ' "$log" || true; } |
            wc -l)
        echo "=== tandem logged $n atomic operations" >>"$log"
    fi
}

printf '%-10s %3s  %-6s %-5s %8s\n' benchmark np mode result seconds
declare -a notes=()
bad=0
t_all=$(date +%s)
for b in "${bench_list[@]}"; do
    for np in "${np_list[@]}"; do
        for mode in "${mode_list[@]}"; do
            t0=$(date +%s)
            run_one "$b" "$np" "$mode"
            dt=$(($(date +%s) - t0))
            printf '%-10s %3s  %-6s %-5s %8s\n' "IMB-$b" "$np" "$mode" "$res" "$dt"
            if [ "$res" != pass ]; then
                bad=1
                notes+=("IMB-$b -np $np $mode: $why (log: $rundir/IMB-$b-np$np-$mode.log)")
            fi
        done
    done
done
echo "all runs: $(($(date +%s) - t_all)) s"
if ((${#notes[@]})); then printf '%s\n' "${notes[@]}"; fi
if [ $bad -ne 0 ]; then
    echo "imb: FAILED"
    exit 1
fi
echo "imb: passed"
