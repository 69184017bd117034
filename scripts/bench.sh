#!/usr/bin/env bash
# Compare tandem against the system libfabric's tcp;ofi_rxm (and UCX over TCP when
# ucx_perftest is installed) on this machine, as ratios of medians over alternating runs.
#
#   scripts/bench.sh [-b BUILD_DIR] [-n RUNS] [-p "PROV,PROV,..."] [--local | --paths LIST]
#                    [--sizes LIST] [--no-ucx] [--json FILE] [--plot [DIR]]
#   scripts/bench.sh [-b BUILD_DIR] --hmem
#   scripts/bench.sh [-b BUILD_DIR] [-n RUNS] --atomic [--local] [--json FILE]
#   scripts/bench.sh [-b BUILD_DIR] [-n RUNS] --trigger [--local] [--json FILE]
#   scripts/bench.sh [-b BUILD_DIR] [-n RUNS] --coll [--np "2 4 8"] [--json FILE]
#   scripts/bench.sh [-b BUILD_DIR] [-n RUNS] --nccl [--local] [--json FILE]
#   scripts/bench.sh [-b BUILD_DIR] [-n RUNS] --progress [--local] [--json FILE]
#   scripts/bench.sh [-b BUILD_DIR] [-n RUNS] --targets [--json FILE] [--baseline BUILD_DIR]
#
#   -b BUILD_DIR  the CMake build directory (default: <repo>/build); needs
#                 BUILD_DIR/bench/tandem_bench (--coll: BUILD_DIR/bench/coll_bench) and, for
#                 tandem, BUILD_DIR/lib/libtandem-fi.so
#   -n RUNS       runs per provider (default 5); providers alternate within each run
#   -p LIST       comma-separated provider strings (default "tandem,tcp;ofi_rxm"); the first
#                 is the one the ratios are about, the second the reference
#   --local       node-local comparison: tandem through off_tandem's shared memory against
#                 the system's shm provider and UCX's shared-memory transports (default
#                 providers "tandem,shm", UCX_TLS=posix,cma). Without it tandem runs with
#                 FI_TANDEM_LOCAL=0, so that its TCP link is what is compared with tcp;ofi_rxm.
#   --no-ucx      skip ucx_perftest
#   --sizes LIST  message sizes in tandem_bench's -S syntax: a comma list (8,4k,1m) and/or
#                 ranges of powers of two (8:4m); default 8,1m. tandem_bench measures them all
#                 in its one run; ucx_perftest runs latency and bandwidth once per size, with
#                 iteration counts that shrink as the size grows (latency 20000 * 8 / size,
#                 within 200..20000; bandwidth 1000 * 1 MiB / size, within 50..100000). With
#                 sizes other than 8,1m each run prints one line per provider of
#                 SIZE:latency/tagged bandwidth, and the tables have a row per metric and size.
#   --paths LIST  link, local, verbs, or several of them (link,local): the comparisons to
#                 make, each with the defaults of its own (link: providers "tandem,tcp;ofi_rxm",
#                 UCX_TLS=tcp, FI_TANDEM_LOCAL=0; local: as --local; verbs: tandem alone over
#                 its verbs link on the EMULATED RDMA device of the tests, as
#                 scripts/with-emulated-rdma.sh sets it up, serving loopback, FI_TANDEM_LOCAL=0
#                 and FI_TANDEM_LINK=verbs: figures of the emulator's sockets and threads, not
#                 of a NIC, labelled EMULATED everywhere). -p only with a single path. Default:
#                 local with --local, else link; --local and --paths exclude each other. Each
#                 run goes through every path; the medians and ratios are printed per path.
#   --json FILE   also write the results as JSON. The default mode always does (default FILE
#                 BUILD_DIR/bench-results/bench-YYYYmmdd-HHMMSS.json; "bench.sh: results in
#                 FILE" at the end): {"tool", "date" (ISO 8601), "host", "cores", "build",
#                 "runs", "paths": [...], "sizes": [bytes...], "results": [{"run", "path",
#                 "provider", "metric", "size", "value", "unit"}...], "medians": [{"path",
#                 "provider", "metric", "size", "value", "unit"}...], "failures": [{"run",
#                 "path", "provider", "failed": true}...]}, one object per line in the arrays;
#                 metric latency (us), tagged_bw and rma_write_bw (MB/s; UCX has no RMA); a
#                 failed run has no results, only its failures entry. --atomic, --trigger,
#                 --coll, --nccl and --progress write one only when asked: {"tool", "mode",
#                 "date", "host", "cores", "build", "runs", "results": [{"label", "key",
#                 "value"}...], "medians": [{"label", "key", "value"}...], "failures":
#                 [{"label", "failed": true}...]}, label and key as those modes key their tables
#                 (no run numbers).
#   --plot [DIR]  after the runs, charts of the medians (scripts/bench-plot.sh, gnuplot):
#                 DIR/latency.png (log-log) and DIR/bandwidth.png (tagged, log x), one series
#                 per provider and path, and the same charts as latency.svg and bandwidth.svg.
#                 DIR defaults to the JSON file's name without .json. Without --sizes it means
#                 --sizes 8,64,512,4k,32k,256k,1m,4m; without --paths or --local, --paths
#                 link,local.
#   --hmem        GPU memory instead: BUILD_DIR/bench/hmem_bench, device-to-device ping-pong
#                 under each FI_OPT_FI_HMEM_P2P policy, node-local and over the network path.
#                 With a real CUDA driver it measures the GPU; without one it runs on the
#                 tests' emulated driver (BUILD_DIR/tests/emucuda) and labels the figures so.
#   --atomic      8-byte (FI_UINT64) atomics instead (tandem_bench -t alat,arate): latency of
#                 fi_fetch_atomic FI_SUM, fi_atomic FI_SUM (plain, and with
#                 FI_DELIVERY_COMPLETE) and fi_compare_atomic FI_CSWAP, one at a time, and the
#                 rate of fi_atomic FI_SUM with 64 in flight. tandem node-local against shm and
#                 tandem over its link (FI_TANDEM_LOCAL=0) against tcp;ofi_rxm, the order
#                 reversed every other run; ratios tandem / system of the medians. With --local
#                 only the node-local pair. No UCX; -p does not apply. An operation a provider
#                 does not offer shows as n/a, its reason below the table.
#   --trigger     triggered operations instead (tandem_bench -t trig): 8 B ping-pong latency
#                 with the send posted at t0 (direct) and posted beforehand with FI_TRIGGER on
#                 a counter that fi_cntr_add starts at t0 (trig), iterations alternating. The
#                 same pairs and order as --atomic (system providers without FI_TRIGGER show
#                 n/a); prints tandem's ratio trig / direct of the medians and their
#                 difference, the trigger's overhead on the path to the peer. With --local
#                 only the node-local pair. No UCX; -p does not apply.
#   --coll        collectives instead: BUILD_DIR/bench/coll_bench (built where MPI is) under
#                 mpirun on this host (--oversubscribe --bind-to none; MPI itself on pml ob1,
#                 btl self,vader), measuring fi_allreduce (FI_SUM, FI_FLOAT; 8 B, 64 KiB,
#                 1 MiB, 16 MiB) and fi_barrier on tandem (its node-local path) and on
#                 tandem;ofi_rxm (FI_OFI_RXM_USE_SRX=1), and Open MPI's own MPI_Allreduce and
#                 MPI_Barrier (default coll components) as the reference. For each rank count,
#                 RUNS rounds of the three, the order reversed every other round; each figure
#                 is the slowest rank's median batch latency, bandwidth = size / latency
#                 (GB/s). Prints every run, then per rank count the medians and the ratios
#                 tandem / Open MPI (latency: target <= 1.0, bandwidth: target >= 1.0),
#                 tandem / tandem;ofi_rxm bandwidth (target >= 2.0), and the barrier latency
#                 ratios; a mode or size that did not run shows n/a, its reason below. With more
#                 ranks than CPUs, every rank yields the CPU when idle (Open MPI's own rule for
#                 oversubscribed nodes; coll_bench does the same in its CQ polling).
#                 libfabric 1.17's ofi_rxm loses collective transfers above its eager limit
#                 (FI_OFI_RXM_BUFFER_SIZE, 16384 by default): tandem;ofi_rxm runs only sizes up
#                 to FI_OFI_RXM_BUFFER_SIZE (passed on when set; its receive buffers cost that
#                 much each). No UCX; -p and --local do not apply.
#   --np LIST     with --coll: the rank counts, space-separated (default "2 4 8")
#   --targets     the latency, memory and oversubscription targets in one invocation (node-local
#                 and TCP 8 B latency against UCX, Open MPI over tandem against vader, 1 MiB
#                 bandwidth, MPI_Allreduce of 4 ranks on this host's cores, two processes on one
#                 core, resident memory with 1, 16, 64 peers): scripts/bench-targets.sh -h
#   --nccl        the NCCL network plugin instead: BUILD_DIR/bench/nccl_bench (the plugin
#                 BUILD_DIR/lib/libnccl-net-tandem.so driven as NCCL's proxy does, host
#                 buffers) against tandem's raw tagged bandwidth (tandem_bench -t bw), both
#                 with 32 transfers in flight (NCCL_NET_MAX_REQUESTS) at 64 KiB, 1 MiB and
#                 16 MiB; node-local, and (without --local) over the link (FI_TANDEM_LOCAL=0);
#                 the two programs alternate, the order reversed every other run. Prints every
#                 run, the medians and the ratios plugin / raw (target >= 0.95). No UCX; -p
#                 does not apply.
#   --progress    automatic progress (FI_PROGRESS_AUTO) instead: BUILD_DIR/bench/progress_bench
#                 on tandem, node-local and (without --local) over the link (FI_TANDEM_LOCAL=0),
#                 every measurement in processes forked for it: overlap (a tagged receive of
#                 1 MiB or 64 MiB posted, one fi_tsend, then both processes compute 100 ms
#                 without a libfabric call; the share of the receive buffer that holds the data
#                 then, in fully landed 4 KiB pages; auto against manual, target auto >= 90%),
#                 idle CPU (one process with automatic progress, two endpoints after a message
#                 each way, asleep 10 s: its CPU time as a share of one core, target < 1%) and
#                 8 B ping-pong latency (both busy-polling; auto / manual, target <= 1.5). Auto
#                 and manual alternate, the order reversed every other run. Prints every run,
#                 the medians and each target's verdict (MISSED where missed); a missed target
#                 is a finding, not a failure: the exit status is non-zero only when a run
#                 failed. --json keys: LABEL local/auto, local/manual, local/idle (and link/...),
#                 KEY overlap_1MiB, overlap_64MiB (%), latency_us, thread_wakeups_per_rt and
#                 thread_cpu_pct (auto: the initiator's progress thread during the ping-pong),
#                 cpu_pct, wakeups_per_s (idle). Busy-polling figures need idle cores: the load
#                 average is printed before and after. No UCX; -p does not apply.
#
# Each run is one tandem_bench process pair (fork mode: server and client on this host, both
# busy-polling, nothing pinned) per provider and path measuring tagged ping-pong latency and
# tagged-send and RMA-write bandwidth (window 64) at every size (by default 8 B and 1 MiB, of
# which the tables show 8 B latency and 1 MiB bandwidth). Prints every run (from the second
# with the time taken so far and an estimate of the time left), then medians and the ratios
# first/second for latency (lower is better) and bandwidth (higher is better), and where the
# JSON file went. Exits non-zero if any run of any provider failed (a failed UCX run, any of
# its sizes failing, counts none of its figures) or the charts could not be drawn.
set -u

here=$(cd "$(dirname "$0")" && pwd)
# --targets is a script of its own (scripts/bench-targets.sh), with the other options given.
for arg in "$@"; do
    if [ "$arg" = --targets ]; then
        args=()
        for a in "$@"; do [ "$a" = --targets ] || args+=("$a"); done
        exec bash "$here/bench-targets.sh" "${args[@]}"
    fi
done
repo=$(cd "$here/.." && pwd)
build=$repo/build
runs=5
providers=""
use_ucx=1
local=0
hmem=0
atomic=0
trigger=0
coll=0
nccl=0
progress=0
nps=""
json=""
size_list=""
path_list=""
plot=0
plot_dir=""
while [ $# -gt 0 ]; do
    case $1 in
        --json|--sizes|--paths)
            [ $# -ge 2 ] || { echo "bench.sh: $1 needs a value (see -h)" >&2; exit 1; }
            case $1 in --json) json=$2 ;; --sizes) size_list=$2 ;; --paths) path_list=$2 ;; esac
            shift 2 ;;
        --plot)  # an optional DIR: the next word, unless it is an option
            plot=1; shift
            if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then plot_dir=$1; shift; fi ;;
        -b) build=$2; shift 2 ;;
        -n) runs=$2; shift 2 ;;
        -p) providers=$2; shift 2 ;;
        --no-ucx) use_ucx=0; shift ;;
        --local) local=1; shift ;;
        --hmem) hmem=1; shift ;;
        --atomic) atomic=1; shift ;;
        --trigger) trigger=1; shift ;;
        --coll) coll=1; shift ;;
        --nccl) nccl=1; shift ;;
        --progress) progress=1; shift ;;
        --np) nps=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown option $1 (see -h)" >&2; exit 1 ;;
    esac
done
build=$(cd "$build" 2>/dev/null && pwd) || { echo "bench.sh: no build directory $build" >&2; exit 1; }
started=$(date +%s)
case $runs in
    ''|*[!0-9]*) echo "bench.sh: bad -n \"$runs\" (a count of runs)" >&2; exit 1 ;;
esac

# expand_sizes LIST: the byte counts of a tandem_bench -S list (see its parse_sizes), one per
# line, ascending and each once; fails on what tandem_bench would refuse.
expand_sizes() {
    local bytes
    bytes=$(awk -v list="$1" '
        function bytes(s,   m) {
            if (s !~ /^[0-9]+([kKmMgG][iI]?[bB]?)?$/) return -1
            m = 1
            if (s ~ /[kK]/) m = 1024; else if (s ~ /[mM]/) m = 1048576; else if (s ~ /[gG]/) m = 1073741824
            return (s + 0) * m
        }
        BEGIN {
            k = split(list, item, ",")
            if (k == 0) exit 1
            for (i = 1; i <= k; i++) {
                c = index(item[i], ":")
                if (!c) {
                    v = bytes(item[i])
                    if (v < 0) exit 1
                    printf "%.0f\n", v
                    continue
                }
                lo = bytes(substr(item[i], 1, c - 1)); hi = bytes(substr(item[i], c + 1))
                if (lo < 0 || hi < 0) exit 1
                if (lo == 0) { print 0; lo = 1 }
                for (v = lo; v <= hi; v *= 2) printf "%.0f\n", v
            }
        }') || return 1
    sort -nu <<<"$bytes"
}

default_mode=0
[ "$hmem$atomic$trigger$coll$nccl$progress" = 000000 ] && default_mode=1
if [ "$default_mode" = 0 ]; then
    if [ -n "$size_list$path_list" ] || [ "$plot" = 1 ]; then
        echo "bench.sh: --sizes, --paths and --plot apply to the default mode only (see -h)" >&2
        exit 1
    fi
    [ "$hmem" = 0 ] || [ -z "$json" ] || { echo "bench.sh: --json does not apply to --hmem (see -h)" >&2; exit 1; }
else
    if [ -n "$path_list" ] && [ "$local" = 1 ]; then
        echo "bench.sh: --local and --paths exclude each other (--local is --paths local; see -h)" >&2
        exit 1
    fi
    if [ "$plot" = 1 ]; then
        [ -n "$size_list" ] || size_list=8,64,512,4k,32k,256k,1m,4m
        [ -n "$path_list" ] || [ "$local" = 1 ] || path_list=link,local
        command -v gnuplot >/dev/null 2>&1 || {
            echo "bench.sh: --plot needs gnuplot (apt-get install gnuplot-nox, or scripts/install-deps.sh)" >&2
            exit 1
        }
    fi
    [ -n "$size_list" ] || size_list=8,1m
    if [ -z "$path_list" ]; then
        if [ "$local" = 1 ]; then path_list="local"; else path_list="link"; fi
    fi
    # the paths to compare, in the order given, each once
    bench_paths=()
    IFS=',' read -ra items <<<"$path_list"
    for item in "${items[@]}"; do
        case $item in
            link|local|verbs) ;;
            *) echo "bench.sh: bad --paths \"$path_list\" (link, local, verbs or a list of them)" >&2; exit 1 ;;
        esac
        case " ${bench_paths[*]} " in *" $item "*) ;; *) bench_paths+=("$item") ;; esac
    done
    [ "${#bench_paths[@]}" -gt 0 ] || { echo "bench.sh: bad --paths \"$path_list\" (link, local or link,local)" >&2; exit 1; }
    if [[ " ${bench_paths[*]} " == *" verbs "* ]] && [ ! -f "$build/tests/emurdma/libtandem-emurdma.so" ]; then
        echo "bench.sh: --paths verbs needs the emulated RDMA device, $build/tests/emurdma/libtandem-emurdma.so (build the tests)" >&2
        exit 1
    fi
    if [ "${#bench_paths[@]}" -gt 1 ] && [ -n "$providers" ]; then
        echo "bench.sh: -p needs a single path (with --paths $path_list each path has its own providers; see -h)" >&2
        exit 1
    fi
    if ! sizes_text=$(expand_sizes "$size_list") || [ -z "$sizes_text" ]; then
        echo "bench.sh: bad --sizes \"$size_list\" (tandem_bench -S syntax: 8,4k,1m or 8:4m)" >&2
        exit 1
    fi
    mapfile -t bench_sizes <<<"$sizes_text"
    # Sizes 8 and 1 MiB alone (the default): today's one line per provider and run, and the
    # three-row table of 8 B latency and 1 MiB bandwidth. Otherwise every size everywhere.
    classic=0
    [ "${bench_sizes[*]}" = "8 1048576" ] && classic=1
    [ -n "$json" ] || json=$build/bench-results/bench-$(date -d "@$started" +%Y%m%d-%H%M%S).json
    if ! mkdir -p "$(dirname "$json")" || [ ! -w "$(dirname "$json")" ]; then
        echo "bench.sh: cannot write $json" >&2
        exit 1
    fi
    if [ -z "$plot_dir" ]; then
        plot_dir=${json%.json}
        [ "$plot_dir" != "$json" ] || plot_dir=$json.charts
    fi
fi
if [ "$coll" = 1 ]; then
    if [ "$hmem" = 1 ] || [ "$atomic" = 1 ] || [ "$trigger" = 1 ]; then
        echo "bench.sh: --coll excludes --hmem, --atomic and --trigger (see -h)" >&2
        exit 1
    fi
    [ -z "$providers" ] || { echo "bench.sh: -p does not apply to --coll (see -h)" >&2; exit 1; }
    [ "$local" = 0 ] || { echo "bench.sh: --local does not apply to --coll (see -h)" >&2; exit 1; }
    [ -n "$nps" ] || nps="2 4 8"
    for np in $nps; do
        case $np in
            ''|*[!0-9]*|0) echo "bench.sh: bad --np \"$nps\" (rank counts, e.g. \"2 4 8\")" >&2; exit 1 ;;
        esac
    done
    use_ucx=0
elif [ -n "$nps" ]; then
    echo "bench.sh: --np applies to --coll only (see -h)" >&2
    exit 1
fi

if [ "$nccl" = 1 ]; then
    if [ "$hmem" = 1 ] || [ "$atomic" = 1 ] || [ "$trigger" = 1 ] || [ "$coll" = 1 ]; then
        echo "bench.sh: --nccl excludes --hmem, --atomic, --trigger and --coll (see -h)" >&2
        exit 1
    fi
    [ -z "$providers" ] || { echo "bench.sh: -p does not apply to --nccl (see -h)" >&2; exit 1; }
    nb=$build/bench/nccl_bench tb=$build/bench/tandem_bench
    for f in "$nb" "$tb" "$build/lib/libnccl-net-tandem.so"; do
        [ -e "$f" ] || { echo "bench.sh: $f not built (cmake --build $build)" >&2; exit 1; }
    done
    use_ucx=0
fi

if [ "$progress" = 1 ]; then
    if [ "$hmem$atomic$trigger$coll$nccl" != 00000 ]; then
        echo "bench.sh: --progress excludes --hmem, --atomic, --trigger, --coll and --nccl (see -h)" >&2
        exit 1
    fi
    [ -z "$providers" ] || { echo "bench.sh: -p does not apply to --progress (see -h)" >&2; exit 1; }
    pb=$build/bench/progress_bench
    [ -x "$pb" ] || { echo "bench.sh: $pb not built (cmake --build $build --target progress_bench)" >&2; exit 1; }
    [ -e "$build/lib/libtandem-fi.so" ] || {
        echo "bench.sh: $build/lib/libtandem-fi.so not built (cmake --build $build --target tandem-fi off_tandem-fi)" >&2
        exit 1
    }
    use_ucx=0
fi

if [ "$hmem" = 1 ]; then
    hb=$build/bench/hmem_bench
    [ -x "$hb" ] || { echo "bench.sh: $hb not built (cmake --build $build --target hmem_bench)" >&2; exit 1; }
    export FI_PROVIDER_PATH=$build/lib FI_PROVIDER=tandem
    # A real driver first; otherwise the tests' emulated one (hmem_bench labels its figures).
    if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
        export LD_LIBRARY_PATH=$build/tests/emucuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
    status=0
    "$hb" || status=1
    echo
    FI_TANDEM_LOCAL=0 "$hb" || status=1
    exit $status
fi
bench=$build/bench/tandem_bench
if [ "$coll" = 0 ] && [ "$progress" = 0 ]; then
    [ -x "$bench" ] || { echo "bench.sh: $bench not built (cmake --build $build --target tandem_bench)" >&2; exit 1; }
fi
if [ "$atomic" = 1 ] && [ "$trigger" = 1 ]; then
    echo "bench.sh: --atomic and --trigger exclude each other (see -h)" >&2
    exit 1
fi
if [ "$atomic" = 1 ] || [ "$trigger" = 1 ]; then
    [ -z "$providers" ] || {
        echo "bench.sh: -p does not apply to --$([ "$atomic" = 1 ] && echo atomic || echo trigger) (see -h)" >&2
        exit 1
    }
    use_ucx=0
fi

# path_config PATH (default mode): the providers (provs), UCX transports and tandem's
# node-local switch of one path. local: tandem through off_tandem's shared memory against shm
# and UCX's shared-memory transports; link: tandem with FI_TANDEM_LOCAL=0 against tcp;ofi_rxm
# and UCX over TCP. -p replaces the providers (one path only).
# path_config PATH: the providers of a path, UCX's transports, tandem's settings (tandem_env:
# more of its environment; path_ucx: whether UCX is compared there).
emulated_rdma=$build/tests/emurdma/libtandem-emurdma.so
path_config() {
    tandem_env=() path_ucx=1
    case $1 in
        local)
            IFS=',' read -ra provs <<<"${providers:-"tandem,shm"}"
            ucx_tls=posix,cma ucx_name="ucx(sm)" tandem_local=1 ;;
        verbs)
            IFS=',' read -ra provs <<<"${providers:-"tandem"}"
            tandem_local=0 path_ucx=0
            tandem_env=(FI_TANDEM_LINK=verbs EMURDMA_NETDEV=lo FI_TANDEM_VERBS_LIB="$emulated_rdma"
                        FI_TANDEM_RDMACM_LIB="$emulated_rdma") ;;
        *)
            IFS=',' read -ra provs <<<"${providers:-"tandem,tcp;ofi_rxm"}"
            ucx_tls=tcp ucx_name="ucx(tcp)" tandem_local=0 ;;
    esac
}
# path_title PATH: how the tables name a path
path_title() {
    case $1 in
        verbs) echo "verbs: EMULATED RDMA device emu_rdma0 (tests/emurdma), not a NIC's figures" ;;
        *) echo "$1" ;;
    esac
}
if [ "$use_ucx" = 1 ] && ! command -v ucx_perftest >/dev/null 2>&1; then
    echo "bench.sh: ucx_perftest not found, skipping UCX (apt-get install ucx-utils)"
    use_ucx=0
fi

results=$(mktemp)
tmp=$(mktemp -d)
trap 'mode_json; rm -rf "$results" "$tmp"' EXIT
failed=0

# The JSON files (--json; the default mode's is always written). awk_json: functions for the
# awk programs that write them: jstr (a JSON string), isnum (a number JSON takes as it is) and
# median (of vals[K, 1..N], as the tables print it: the middle value, or the mean of the two
# middle ones with FMT).
awk_json='
function jstr(s,   i, c, o) {
    o = ""
    for (i = 1; i <= length(s); i++) {
        c = substr(s, i, 1)
        o = o ((c == "\\" || c == "\"") ? "\\" c : c)
    }
    return "\"" o "\""
}
function isnum(v) { return v ~ /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/ }
function median(k, n, fmt,   i, j, t, a) {
    for (i = 1; i <= n; i++) a[i] = vals[k, i]
    for (i = 2; i <= n; i++) {
        t = a[i]
        for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]
        a[j + 1] = t
    }
    if (n % 2) return a[(n + 1) / 2]
    return sprintf(fmt, (a[n / 2] + a[n / 2 + 1]) / 2)
}'
# json_head [MODE]: the opening members common to every JSON file, one per line.
json_head() {
    awk -v mode="${1:-}" -v date="$(date -d "@$started" -Iseconds)" -v host="$(uname -n)" \
        -v cores="$(nproc)" -v build="$build" -v runs="$runs" "$awk_json"'
        BEGIN {
            print "{"
            print "  \"tool\": \"tandem scripts/bench.sh\","
            if (mode != "") print "  \"mode\": " jstr(mode) ","
            print "  \"date\": " jstr(date) ","
            print "  \"host\": " jstr(host) ","
            print "  \"cores\": " cores ","
            print "  \"build\": " jstr(build) ","
            print "  \"runs\": " runs ","
        }'
}
# mode_json (at exit): with --json, --atomic, --trigger, --coll, --nccl and --progress write
# their results file's "LABEL KEY VALUE" lines ("LABEL failed 1" for a failed run) and the
# medians.
mode_json() {
    [ "$default_mode" = 0 ] && [ -n "$json" ] && [ -e "$results" ] || return 0
    local mode fmt=%.2f
    for mode in atomic trigger coll nccl progress; do [ "${!mode}" = 1 ] && break; done
    case $mode in coll|progress) fmt=%.4g ;; esac  # (an idle CPU share is a few thousandths)
    { json_head "$mode"
      awk -v fmt="$fmt" "$awk_json"'
        $2 == "failed" { fail[++nf] = $1; next }
        NF >= 3 && isnum($3) {
            k = $1 SUBSEP $2
            if (!(k in cnt)) { key[++nk] = k; lab[nk] = $1; nam[nk] = $2 }
            vals[k, ++cnt[k]] = $3
            res[++nr] = "{\"label\":" jstr($1) ",\"key\":" jstr($2) ",\"value\":" $3 "}"
        }
        END {
            print "  \"results\": ["
            for (i = 1; i <= nr; i++) print "    " res[i] (i < nr ? "," : "")
            print "  ],"
            print "  \"medians\": ["
            for (i = 1; i <= nk; i++)
                print "    {\"label\":" jstr(lab[i]) ",\"key\":" jstr(nam[i]) ",\"value\":" \
                      median(key[i], cnt[key[i]], fmt) "}" (i < nk ? "," : "")
            print "  ],"
            print "  \"failures\": ["
            for (i = 1; i <= nf; i++) print "    {\"label\":" jstr(fail[i]) ",\"failed\":true}" (i < nf ? "," : "")
            print "  ]"
            print "}"
        }' "$results"
    } >"$json" && echo "bench.sh: results in $json"
}

median() {  # median PROV METRIC
    awk -v p="$1" -v m="$2" '$1 == p && $2 == m { print $3 }' "$results" |
        sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "n/a"; else if (NR % 2) print a[(NR + 1) / 2];
                                            else printf "%.2f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "n/a" || b == "n/a" || b + 0 == 0) print "n/a"; else printf "%.2f\n", a / b }'
}
# awk_sz: sz(BYTES), a size as the per-run lines name it (8, 64K, 1M)
awk_sz='function sz(b) {
            if (b >= 1048576 && b % 1048576 == 0) return b / 1048576 "M"
            if (b >= 1024 && b % 1024 == 0) return b / 1024 "K"
            return b }'
# size_name BYTES: a size as the tables name it (8 B, 64 KiB, 1 MiB)
size_name() {
    awk -v b="$1" 'BEGIN { if (b >= 1048576 && b % 1048576 == 0) print b / 1048576 " MiB"
                           else if (b >= 1024 && b % 1024 == 0) print b / 1024 " KiB"
                           else print b " B" }'
}

if [ "$nccl" = 1 ]; then
    out=$tmp/out
    paths=(local)
    [ "$local" = 1 ] || paths+=(link)
    sizes=(65536 1048576 16777216)
    echo "bench.sh --nccl: $runs runs of: nccl_bench (plugin), tandem_bench -t bw (raw tagged);"
    echo "          window 32, sizes ${sizes[*]}; paths: ${paths[*]} (link: FI_TANDEM_LOCAL=0)"
    echo "          order reversed every other run; build $build; load average now: $(cut -d' ' -f1-3 /proc/loadavg)"
    # nccl_one PATH WHAT: one run; appends "PATH/WHAT size MB/s" lines.
    nccl_one() {
        local path=$1 what=$2 loc=1
        [ "$path" = link ] && loc=0
        local size iters col=2
        : >"$out"
        # Each size its own run, with a window count that moves 4 to 16 GiB (a run of the
        # programs' default ~1 GiB lasts a tenth of a second here, and its figure varied by 15%).
        for size in 64k:2000 1m:400 16m:30; do
            iters=${size#*:} size=${size%%:*}
            local -a cmd=("$nb" -w 32 -S "$size" -i "$iters")
            [ "$what" = raw ] && cmd=("$tb" -p tandem -t bw -w 32 -S "$size" -i "$iters" -T 140) col=3
            if ! timeout 150 env FI_PROVIDER_PATH="$build/lib" FI_PROVIDER=tandem FI_TANDEM_LOCAL=$loc \
                LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NET_PLUGIN=tandem \
                "${cmd[@]}" >>"$out" 2>&1; then
                echo "  $path/$what: FAILED:"
                sed 's/^/    /' "$out"
                failed=1
                return
            fi
        done
        awk -v k="$path/$what" -v c=$col '!/^#/ && NF >= c && $1 ~ /^[0-9]+$/ { print k, $1, $c }' "$out" >>"$results"
        printf '  %-12s' "$path/$what"
        awk -v c=$col '!/^#/ && NF >= c && $1 ~ /^[0-9]+$/ { printf " %9s B %9s MB/s", $1, $c }' "$out"
        echo
    }
    for r in $(seq 1 "$runs"); do
        echo "run $r/$runs"
        for path in "${paths[@]}"; do
            if [ $((r % 2)) = 1 ]; then order=(plugin raw); else order=(raw plugin); fi
            for what in "${order[@]}"; do nccl_one "$path" "$what"; done
        done
    done
    echo
    echo "medians over $runs runs (MB/s) and plugin / raw (target >= 0.95)"
    printf '%-6s %10s %12s %12s %8s\n' path size plugin raw ratio
    for path in "${paths[@]}"; do
        for size in "${sizes[@]}"; do
            p=$(median "$path/plugin" "$size") q=$(median "$path/raw" "$size")
            printf '%-6s %10s %12s %12s %8s\n' "$path" "$size" "$p" "$q" "$(ratio "$p" "$q")"
        done
    done
    if [ "$failed" != 0 ]; then
        echo
        echo "bench.sh: some runs FAILED (see above)"
        exit 1
    fi
    exit 0
fi


# run_keyed LABEL PROV TANDEM_LOCAL TESTS WORD: one tandem_bench run of -t TESTS (alat,arate:
# lines "  atomic KEY ...", WORD atomic; trig: "  trigger KEY ...", WORD trigger); appends
# "LABEL key value" lines to the results and "LABEL: key n/a: reason" lines to the notes.
run_keyed() {
    local label=$1 prov=$2 loc=$3 tests=$4 word=$5 out=$tmp/out
    local -a envs=(env -u FI_PROVIDER)
    case $prov in
        tandem|tandem\;*) envs+=(FI_PROVIDER_PATH="$build/lib" FI_TANDEM_LOCAL="$loc") ;;
        *) envs+=(-u FI_PROVIDER_PATH) ;;
    esac
    if ! timeout 150 "${envs[@]}" "$bench" -p "$prov" -t "$tests" -T 140 >"$out" 2>&1; then
        echo "  $label: FAILED:"
        sed 's/^/    /' "$out"
        echo "$label failed 1" >>"$results"
        failed=1
        return
    fi
    # "  WORD KEY VALUE UNIT [mean M | overall R]", or "  WORD KEY n/a UNIT (reason)"
    awk -v p="$label" -v w="$word" '$1 == w && $3 != "n/a" { print p, $2, $3 }' "$out" >>"$results"
    awk -v p="$label" -v w="$word" '$1 == w && $3 == "n/a" {
                           r = $0; sub(/^[^(]*\(/, "", r); sub(/\)[^)]*$/, "", r)
                           print p ": " $2 " n/a: " r }' "$out" >>"$tmp/notes"
    printf '  %-14s' "$label"
    awk -v w="$word" '$1 == w { k = $2; sub(/^send_/, "", k); sub(/_lat$/, "", k)
                                printf " %s %s%s", k, $3, $3 == "n/a" ? "" : $4 == "us" ? "us" : " " $4 }' "$out"
    echo
}

# The keyed runs (--atomic, --trigger): tandem and the system provider next to it, node-local
# and (without --local) over the link, $runs times, the order reversed every other run.
# keyed_rounds OPTION TESTS WORD
keyed_rounds() {
    local option=$1 tests=$2 word=$3 r c i label prov loc
    # label:provider:FI_TANDEM_LOCAL, in pairs (tandem, then the system provider it is held to)
    configs=("tandem(local):tandem:1" "shm:shm:")
    [ "$local" = 1 ] || configs+=("tandem(link):tandem:0" "tcp;ofi_rxm:tcp;ofi_rxm:")
    : >"$tmp/notes"
    echo "bench.sh $option: $runs runs of: $(for c in "${configs[@]}"; do printf '%s ' "${c%%:*}"; done)"
    [ "$local" = 1 ] || echo "          tandem(link) is tandem with FI_TANDEM_LOCAL=0"
    echo "          order reversed every other run"
    echo "          build $build; load average now: $(cut -d' ' -f1-3 /proc/loadavg)"
    for r in $(seq 1 "$runs"); do
        echo "run $r/$runs"
        local order=("${configs[@]}")
        if [ $((r % 2)) = 0 ]; then
            order=()
            for ((i = ${#configs[@]} - 1; i >= 0; i--)); do order+=("${configs[i]}"); done
        fi
        for c in "${order[@]}"; do
            IFS=: read -r label prov loc <<<"$c"
            run_keyed "$label" "$prov" "$loc" "$tests" "$word"
        done
    done
}

# After the keyed tables: why a provider answered n/a, then the exit status of the runs.
keyed_notes() {
    if [ -s "$tmp/notes" ]; then
        echo
        sort -u "$tmp/notes"
    fi
}
keyed_exit() {
    if [ "$failed" != 0 ]; then
        echo
        echo "bench.sh: some runs FAILED (see above)"
        exit 1
    fi
    exit 0
}

if [ "$progress" = 1 ]; then
    # progress_bench forks the processes of every measurement, sets FI_TANDEM_LOCAL in each,
    # alternates the modes and prints the table; "LABEL KEY VALUE" lines go to the results
    # (--json). It bounds each of its waits (30 s) and each run; timeout(1) is the last resort.
    progress_paths=local,link
    [ "$local" = 1 ] && progress_paths=local
    echo "bench.sh --progress: $runs runs; build $build; load average now: $(cut -d' ' -f1-3 /proc/loadavg)"
    npaths=$(tr ',' '\n' <<<"$progress_paths" | wc -l)
    if ! timeout -k 10 $((runs * npaths * 600 + 60)) env -u FI_PROVIDER -u FI_TANDEM_LOCAL \
            FI_PROVIDER_PATH="$build/lib" "$pb" -n "$runs" -P "$progress_paths" -r "$results"; then
        failed=1
    fi
    echo
    echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
    keyed_exit
fi

if [ "$coll" = 1 ]; then
    cb=$build/bench/coll_bench
    [ -x "$cb" ] || {
        echo "bench.sh: $cb not built (cmake --build $build --target coll_bench; it needs MPI:" \
             "apt-get install libopenmpi-dev, then reconfigure)" >&2
        exit 1
    }
    command -v mpirun >/dev/null || { echo "bench.sh: mpirun not found (apt-get install openmpi-bin)" >&2; exit 1; }
    for lib in libtandem-fi.so liboff_tandem-fi.so; do
        [ -e "$build/lib/$lib" ] || {
            echo "bench.sh: $build/lib/$lib not built (cmake --build $build --target tandem-fi off_tandem-fi)" >&2
            exit 1
        }
    done
    # The buffer sizes (bytes), named in the tables by size_name.
    coll_sizes=(8 65536 1048576 16777216)
    # libfabric 1.17's ofi_rxm completes a collective's transfers to its collective engine
    # on the eager path only: above the eager limit (rendezvous, segmentation) the completion
    # goes to the application's CQ with the engine's context and the operation never ends.
    rxm_limit=${FI_OFI_RXM_BUFFER_SIZE:-16384}
    case $rxm_limit in
        ''|*[!0-9]*) echo "bench.sh: FI_OFI_RXM_BUFFER_SIZE=$rxm_limit: only a plain byte count is understood here" >&2; exit 1 ;;
    esac
    rxm_sizes=() rxm_skipped=()
    for s in "${coll_sizes[@]}"; do
        if [ "$s" -le "$rxm_limit" ]; then rxm_sizes+=("$s"); else rxm_skipped+=("$s"); fi
    done
    # label:mode; the labels key the results (one word each).
    configs=("tandem:fabric" "tandem;ofi_rxm:fabric" "openmpi:mpi")
    cpus=$(nproc)

    # run_coll LABEL NP ROUND: one mpirun of coll_bench; appends "LABEL npN_KEY value" lines to
    # the results (KEY arSIZE_lat, arSIZE_bw, bar_lat) and "LABEL ...: reason" lines to the notes.
    run_coll() {
        local label=$1 np=$2 round=$3 out=$tmp/out sizes=("${coll_sizes[@]}") s
        local -a envs=(env -u FI_PROVIDER) xs=() args=()
        case $label in
            openmpi)
                envs+=(-u FI_PROVIDER_PATH)
                args=(--mode mpi) ;;
            *)
                envs+=(FI_PROVIDER_PATH="$build/lib")
                xs=(-x FI_PROVIDER_PATH)
                [ -n "${FI_TANDEM_LOCAL:-}" ] && xs+=(-x FI_TANDEM_LOCAL)
                if [ "$label" = "tandem;ofi_rxm" ]; then
                    envs+=(FI_OFI_RXM_USE_SRX=1)
                    xs+=(-x FI_OFI_RXM_USE_SRX)
                    [ -n "${FI_OFI_RXM_BUFFER_SIZE:-}" ] && xs+=(-x FI_OFI_RXM_BUFFER_SIZE)
                    sizes=("${rxm_sizes[@]}")
                    for s in "${rxm_skipped[@]}"; do
                        echo "$label: allreduce $(size_name "$s") n/a: above ofi_rxm's eager limit" \
                             "($rxm_limit B, FI_OFI_RXM_BUFFER_SIZE); libfabric 1.17's rxm completes" \
                             "larger collective transfers to the application's CQ, not to its" \
                             "collective engine, and the operation never ends" >>"$tmp/notes"
                    done
                fi
                args=(--mode fabric --provider "$label") ;;
        esac
        [ "${#sizes[@]}" -gt 0 ] && args+=(--sizes "$(IFS=,; echo "${sizes[*]}")")
        # coll_bench's watchdog names what hung before timeout(1) ends mpirun.
        if ! timeout -k 10 290 "${envs[@]}" mpirun --allow-run-as-root --oversubscribe --bind-to none \
                -np "$np" --mca pml ob1 --mca btl self,vader "${xs[@]}" \
                "$cb" "${args[@]}" --timeout 270 >"$out" 2>&1; then
            echo "  np $np $label: FAILED:"
            sed 's/^/    /' "$out"
            echo "$label failed 1" >>"$results"
            echo "$label: np $np FAILED in run $round (output above)" >>"$tmp/notes"
            failed=1
            return
        fi
        # "coll allreduce SIZE lat_us L bw_gbs B ...", "coll barrier 0 lat_us L ...",
        # "coll allreduce SIZE n/a (REASON)", "coll n/a (REASON)"
        awk -v p="$label" -v n="np$np" '
            $1 == "coll" && $2 == "allreduce" && $4 == "lat_us" { print p, n "_ar" $3 "_lat", $5; print p, n "_ar" $3 "_bw", $7 }
            $1 == "coll" && $2 == "barrier" && $4 == "lat_us" { print p, n "_bar_lat", $5 }' "$out" >>"$results"
        awk -v p="$label" -v n="$np" '
            $1 == "coll" && (($2 == "n/a") || ($4 == "n/a")) {
                r = $0; sub(/^[^(]*\(/, "", r); sub(/\)[^)]*$/, "", r)
                print p ": " ($2 == "n/a" ? "np " n " n/a" : $2 " " $3 " B n/a") ": " r }' "$out" >>"$tmp/notes"
        printf '  np %-2s %-15s' "$np" "$label"
        awk "$awk_sz"'
             $1 == "coll" && $2 == "n/a" { printf " n/a" }
             $1 == "coll" && $2 == "allreduce" && $4 == "n/a" { printf " %s n/a |", sz($3) }
             $1 == "coll" && $2 == "allreduce" && $4 == "lat_us" { printf " %s %sus %sGB/s |", sz($3), $5, $7 }
             $1 == "coll" && $2 == "barrier" && $4 == "lat_us" { printf " barrier %sus", $5 }' "$out"
        echo
    }

    : >"$tmp/notes"
    echo "bench.sh --coll: $runs runs per rank count of: $(for c in "${configs[@]}"; do printf '%s ' "${c%%:*}"; done)"
    echo "          ranks: $nps ($cpus CPUs here: more ranks than that yield when idle);" \
         "order reversed every other run"
    echo "          tandem's node-local path: $([ "${FI_TANDEM_LOCAL:-1}" = 0 ] && echo off || echo on);" \
         "openmpi: pml ob1, btl self,vader, its default coll components"
    echo "          build $build; load average now: $(cut -d' ' -f1-3 /proc/loadavg)"
    for np in $nps; do
        for r in $(seq 1 "$runs"); do
            echo "np $np, run $r/$runs"
            order=("${configs[@]}")
            if [ $((r % 2)) = 0 ]; then
                order=()
                for ((i = ${#configs[@]} - 1; i >= 0; i--)); do order+=("${configs[i]}"); done
            fi
            for c in "${order[@]}"; do run_coll "${c%%:*}" "$np" "$r"; done
        done
    done

    # median's mean of the middle two keeps two decimals; the 8 B bandwidths need more digits.
    coll_median() {
        awk -v p="$1" -v m="$2" '$1 == p && $2 == m { print $3 }' "$results" |
            sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "n/a"; else if (NR % 2) print a[(NR + 1) / 2];
                                                else printf "%.4g\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
    }
    q() { ratio "$(coll_median "$1" "$3")" "$(coll_median "$2" "$3")"; }
    echo
    echo "medians over $runs runs: latency in us (lower is better), bandwidth in GB/s (higher is"
    echo "better); ratios of the medians: tandem / openmpi and tandem / tandem;ofi_rxm"
    for np in $nps; do
        echo
        printf '%-24s %12s %15s %12s %12s %12s\n' "np $np" tandem "tandem;ofi_rxm" openmpi "t / openmpi" "t / rxm"
        for s in "${coll_sizes[@]}" barrier; do
            if [ "$s" = barrier ]; then
                rows=("bar_lat:barrier latency")
            else
                rows=("ar${s}_lat:allreduce $(size_name "$s") lat" "ar${s}_bw:allreduce $(size_name "$s") bw")
            fi
            for row in "${rows[@]}"; do
                key=np${np}_${row%%:*}
                printf '%-24s %12s %15s %12s %12s %12s\n' "${row#*:}" "$(coll_median tandem "$key")" \
                    "$(coll_median "tandem;ofi_rxm" "$key")" "$(coll_median openmpi "$key")" \
                    "$(q tandem openmpi "$key")" "$(q tandem "tandem;ofi_rxm" "$key")"
            done
        done
    done
    keyed_notes
    echo
    echo "targets (ratios of the medians):"
    # verdict RATIO OP BOUND
    verdict() {
        awk -v q="$1" -v op="$2" -v b="$3" 'BEGIN {
            if (q == "n/a") print "not measured";
            else if ((op == "<=" && q + 0 <= b + 0) || (op == ">=" && q + 0 >= b + 0)) print "met";
            else print "NOT met" }'
    }
    for np in $nps; do
        for s in "${coll_sizes[@]}"; do
            k=np${np}_ar$s
            a=$(q tandem openmpi "${k}_lat") b=$(q tandem openmpi "${k}_bw") c=$(q tandem "tandem;ofi_rxm" "${k}_bw")
            printf '  np %-2s allreduce %-7s lat t/openmpi %6s <= 1.0 %-13s bw t/openmpi %6s >= 1.0 %-13s bw t/rxm %6s >= 2.0 %s\n' \
                "$np" "$(size_name "$s")" "$a" "$(verdict "$a" "<=" 1.0)" "$b" "$(verdict "$b" ">=" 1.0)" \
                "$c" "$(verdict "$c" ">=" 2.0)"
        done
        a=$(q tandem openmpi "np${np}_bar_lat") c=$(q tandem "tandem;ofi_rxm" "np${np}_bar_lat")
        printf '  np %-2s barrier           lat t/openmpi %6s <= 1.0 %-13s lat t/rxm  %6s (no target)\n' \
            "$np" "$a" "$(verdict "$a" "<=" 1.0)" "$c"
    done
    keyed_exit
fi

if [ "$atomic" = 1 ]; then
    keyed_rounds --atomic alat,arate atomic
    echo
    echo "medians over $runs runs; ratio = tandem / system (latency: below 1 is better,"
    echo "rate: above 1 is better)"
    printf '%-30s' "metric"
    for ((i = 0; i < ${#configs[@]}; i += 2)); do
        printf ' %14s %14s %6s' "${configs[i]%%:*}" "${configs[i + 1]%%:*}" "ratio"
    done
    echo
    for m in "fetch_sum_lat:fetch-add latency (us)" "sum_lat:add latency (us)" \
             "sum_dc_lat:add, delivery complete (us)" "cswap_lat:cswap latency (us)" \
             "sum_rate:add rate, 64 in flight (op/s)"; do
        key=${m%%:*}
        printf '%-30s' "${m#*:}"
        for ((i = 0; i < ${#configs[@]}; i += 2)); do
            a=$(median "${configs[i]%%:*}" "$key") b=$(median "${configs[i + 1]%%:*}" "$key")
            printf ' %14s %14s %6s' "$a" "$b" "$(ratio "$a" "$b")"
        done
        echo
    done
    keyed_notes
    echo
    echo "target: 8 B fetch-add latency at most 1.0x the system provider's:"
    for ((i = 0; i < ${#configs[@]}; i += 2)); do
        a=${configs[i]%%:*} b=${configs[i + 1]%%:*}
        q=$(ratio "$(median "$a" fetch_sum_lat)" "$(median "$b" fetch_sum_lat)")
        verdict=$(awk -v q="$q" 'BEGIN { if (q == "n/a") print "not measured"; else if (q + 0 <= 1.0) print "met"; else print "NOT met" }')
        printf '  %-14s / %-12s %6s   %s\n' "$a" "$b" "$q" "$verdict"
    done
    keyed_exit
fi

if [ "$trigger" = 1 ]; then
    keyed_rounds --trigger trig trigger
    echo
    echo "medians over $runs runs (8 B ping-pong, half round trip, us; lower is better)"
    printf '%-30s' "metric"
    for ((i = 0; i < ${#configs[@]}; i += 2)); do
        printf ' %14s %14s' "${configs[i]%%:*}" "${configs[i + 1]%%:*}"
    done
    echo
    for m in "send_direct_lat:send posted at t0 (us)" "send_trig_lat:triggered at t0 (us)"; do
        key=${m%%:*}
        printf '%-30s' "${m#*:}"
        for ((i = 0; i < ${#configs[@]}; i += 2)); do
            printf ' %14s %14s' "$(median "${configs[i]%%:*}" "$key")" "$(median "${configs[i + 1]%%:*}" "$key")"
        done
        echo
    done
    keyed_notes
    echo
    echo "tandem, trig / direct (medians); the difference is the time from the counter reaching"
    echo "its threshold to the send leaving, the trigger's overhead on the path to the peer:"
    for ((i = 0; i < ${#configs[@]}; i += 2)); do
        a=${configs[i]%%:*}
        d=$(median "$a" send_direct_lat) t=$(median "$a" send_trig_lat)
        diff=$(awk -v d="$d" -v t="$t" 'BEGIN { if (d == "n/a" || t == "n/a") print "n/a"; else printf "%+.2f us\n", t - d }')
        printf '  %-14s %6s   (%s)\n' "$a" "$(ratio "$t" "$d")" "$diff"
    done
    keyed_exit
fi

# The default mode: every provider of every path, and UCX, in each run. $tmp/runs holds a
# line "RUN PATH PROVIDER METRIC SIZE VALUE" per figure (metric latency, tagged_bw or
# rma_write_bw), $tmp/fails a line "RUN PATH PROVIDER" per failed run (it has no figures).
: >"$tmp/runs"
: >"$tmp/fails"
multi=0
[ "${#bench_paths[@]}" -gt 1 ] && multi=1
lw=14  # the width of the providers' names in the per-run lines
[ "$multi" = 1 ] && lw=20
[[ " ${bench_paths[*]} " == *" verbs "* ]] && lw=24
# tandem_bench's watchdog: 280 s as ever for up to two sizes, 30 s more per further size
bench_watchdog=280
[ "${#bench_sizes[@]}" -gt 2 ] && bench_watchdog=$((280 + 30 * (${#bench_sizes[@]} - 2)))
# label PROV PATH: how the per-run lines name a provider (with the path when there are two)
label() {
    if [ "$2" = verbs ]; then echo "$1 (verbs, EMULATED)"
    elif [ "$multi" = 1 ]; then echo "$1 ($2)"
    else echo "$1"; fi
}

# run_libfabric PATH PROV RUN: one tandem_bench run at every size; appends to $tmp/runs.
run_libfabric() {
    local path=$1 prov=$2 run=$3 out=$tmp/out name
    name=$(label "$prov" "$path")
    local -a envs=(env -u FI_PROVIDER)
    case $prov in
        tandem|tandem\;*) envs+=(FI_PROVIDER_PATH="$build/lib" FI_TANDEM_LOCAL=$tandem_local "${tandem_env[@]}") ;;
        *) envs+=(-u FI_PROVIDER_PATH) ;;
    esac
    if ! timeout $((bench_watchdog + 20)) "${envs[@]}" "$bench" -p "$prov" -S "$size_list" -t lat,bw,rma \
            -T "$bench_watchdog" >"$out" 2>&1; then
        echo "  $name: FAILED:"
        sed 's/^/    /' "$out"
        echo "$run $path $prov" >>"$tmp/fails"
        failed=1
        return
    fi
    # table rows: size lat_us tag_bw rma_bw ("-" for what was not measured)
    awk -v r="$run" -v path="$path" -v p="$prov" "$awk_json"'
        !/^#/ && NF >= 4 && $1 ~ /^[0-9]+$/ {
            if (isnum($2)) print r, path, p, "latency", $1, $2
            if (isnum($3)) print r, path, p, "tagged_bw", $1, $3
            if (isnum($4)) print r, path, p, "rma_write_bw", $1, $4
        }' "$out" >>"$tmp/runs"
    if [ "$classic" = 1 ]; then
        printf "  %-${lw}s 8 B lat %8s us   1 MiB tagged %9s MB/s   1 MiB rma write %9s MB/s\n" "$name" \
            "$(awk '!/^#/ && $1 == 8 { print $2 }' "$out")" \
            "$(awk '!/^#/ && $1 == 1048576 { print $3 }' "$out")" \
            "$(awk '!/^#/ && $1 == 1048576 { print $4 }' "$out")"
    else
        printf "  %-${lw}s" "$name"
        awk "$awk_sz"' !/^#/ && NF >= 4 && $1 ~ /^[0-9]+$/ { printf " %s:%sus/%sMB/s", sz($1), $2, $3 }' "$out"
        echo
    fi
}

ucx_port=$((47970 + RANDOM % 20))
# run_ucx TEST SIZE ITERS WARMUP: prints the "Final:" line's overall latency or bandwidth.
run_ucx() {
    local test=$1 size=$2 iters=$3 warm=$4
    ucx_port=$((ucx_port + 1))
    UCX_TLS=$ucx_tls timeout 120 ucx_perftest -p "$ucx_port" >"$tmp/ucx_server" 2>&1 &
    local spid=$!
    local out=""
    for _ in $(seq 1 50); do
        out=$(UCX_TLS=$ucx_tls timeout 120 ucx_perftest 127.0.0.1 -p "$ucx_port" -t "$test" -s "$size" \
              -n "$iters" -w "$warm" 2>&1) && break
        out=""
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
    done
    wait "$spid" 2>/dev/null
    # Final: iters p50_lat avg_lat overall_lat avg_bw overall_bw avg_rate overall_rate
    case $test in
        *_lat) awk '/^Final:/ { print $5 }' <<<"$out" ;;
        *) awk '/^Final:/ { print $7 }' <<<"$out" ;;
    esac
}

# run_ucx_sizes PATH RUN: ucx_perftest's tag_lat and tag_bw at every size, the iteration counts
# shrinking with the size (8 B latency and 1 MiB bandwidth as ever: 20000 and 1000); appends
# to $tmp/runs, or (any of them failed) to $tmp/fails.
run_ucx_sizes() {
    local path=$1 run=$2 s b li bi lat bw ok=1 line="" lat8="" bw1m=""
    : >"$tmp/ucx_run"
    for s in "${bench_sizes[@]}"; do
        b=$((s > 0 ? s : 1))
        li=$((20000 * 8 / b)) bi=$((1000 * 1048576 / b))
        li=$((li < 200 ? 200 : li > 20000 ? 20000 : li))
        bi=$((bi < 50 ? 50 : bi > 100000 ? 100000 : bi))
        lat=$(run_ucx tag_lat "$s" "$li" $((li / 10)))
        bw=$(run_ucx tag_bw "$s" "$bi" $((bi / 10)))
        [[ $lat =~ ^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]] || lat=""
        [[ $bw =~ ^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]] || bw=""
        [ -n "$lat" ] && echo "$run $path $ucx_name latency $s $lat" >>"$tmp/ucx_run"
        [ -n "$bw" ] && echo "$run $path $ucx_name tagged_bw $s $bw" >>"$tmp/ucx_run"
        [ -n "$lat" ] && [ -n "$bw" ] || ok=0
        [ "$s" = 8 ] && lat8=$lat
        [ "$s" = 1048576 ] && bw1m=$bw
        line+=" $(awk -v b="$s" "$awk_sz"' BEGIN { printf "%s", sz(b) }'):${lat:-FAIL}us/${bw:-FAIL}MB/s"
    done
    if [ "$ok" = 1 ]; then
        cat "$tmp/ucx_run" >>"$tmp/runs"
    else
        echo "$run $path $ucx_name" >>"$tmp/fails"
        failed=1
    fi
    if [ "$classic" = 1 ]; then
        printf "  %-${lw}s 8 B lat %8s us   1 MiB tagged %9s MB/s\n" "$(label "$ucx_name" "$path")" \
            "${lat8:-FAIL}" "${bw1m:-FAIL}"
    else
        printf "  %-${lw}s%s\n" "$(label "$ucx_name" "$path")" "$line"
    fi
}

ucx_note() { [ "$use_ucx" = 1 ] && [ "$path_ucx" = 1 ] && echo ", ucx_perftest (UCX_TLS=$ucx_tls)"; }
local_note() { if [ "$tandem_local" = 1 ]; then echo on; else echo off; fi; }
if [ "$multi" = 0 ]; then
    path_config "${bench_paths[0]}"
    echo "bench.sh: $runs runs of: ${provs[*]}$(ucx_note)"
    echo "          tandem's node-local path: $(local_note)"
    [ "${bench_paths[0]}" = verbs ] && echo "          path $(path_title verbs)"
else
    echo "bench.sh: $runs runs, each through the paths ${bench_paths[*]}:"
    for path in "${bench_paths[@]}"; do
        path_config "$path"
        printf '  %-6s %s%s; tandem'\''s node-local path: %s\n' "$path:" "${provs[*]}" "$(ucx_note)" "$(local_note)"
    done
fi
if [ "$classic" = 0 ]; then
    echo "          sizes:$(for s in "${bench_sizes[@]}"; do awk -v b="$s" "$awk_sz"' BEGIN { printf " %s", sz(b) }'; done)" \
         "(a run's line: SIZE:latency/tagged bandwidth)"
fi
echo "          build $build; load average now: $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$SECONDS
for r in $(seq 1 "$runs"); do
    if [ "$r" = 1 ]; then
        echo "run $r/$runs"
    else
        spent=$((SECONDS - t0))
        echo "run $r/$runs (elapsed ${spent}s, about $(((spent * (runs - r + 1) + (r - 1) / 2) / (r - 1)))s left)"
    fi
    for path in "${bench_paths[@]}"; do
        path_config "$path"
        for prov in "${provs[@]}"; do run_libfabric "$path" "$prov" "$r"; done
        [ "$use_ucx" = 1 ] && [ "$path_ucx" = 1 ] && run_ucx_sizes "$path" "$r"
    done
done

# The medians, "PATH PROVIDER METRIC SIZE VALUE" in the order of the tables, into $tmp/medians
# and med[PATH|PROVIDER|METRIC|SIZE].
for path in "${bench_paths[@]}"; do
    path_config "$path"
    names=("${provs[@]}")
    [ "$use_ucx" = 1 ] && [ "$path_ucx" = 1 ] && names+=("$ucx_name")
    for n in "${names[@]}"; do
        for m in latency tagged_bw rma_write_bw; do
            for s in "${bench_sizes[@]}"; do echo "$path $n $m $s"; done
        done
    done
done >"$tmp/keys"
awk "$awk_json"'
    NR == FNR { k = $2 SUBSEP $3 SUBSEP $4 SUBSEP $5; vals[k, ++cnt[k]] = $6; next }
    { k = $1 SUBSEP $2 SUBSEP $3 SUBSEP $4; if (k in cnt) print $0, median(k, cnt[k], "%.2f") }' \
    "$tmp/runs" "$tmp/keys" >"$tmp/medians"
declare -A med=()
while read -r path n m s v; do med["$path|$n|$m|$s"]=$v; done <"$tmp/medians"
# median_of PATH PROVIDER METRIC SIZE
median_of() { echo "${med["$1|$2|$3|$4"]:-n/a}"; }

for path in "${bench_paths[@]}"; do
    path_config "$path"
    names=("${provs[@]}")
    [ "$use_ucx" = 1 ] && [ "$path_ucx" = 1 ] && names+=("$ucx_name")
    echo
    if [ "$multi" = 1 ]; then
        echo "medians over $runs runs, path $(path_title "$path") (tandem's node-local path: $(local_note))"
    else
        echo "medians over $runs runs$([ "$path" = verbs ] && echo ", path $(path_title verbs)")"
    fi
    printf '%-26s' "metric"
    for n in "${names[@]}"; do printf ' %14s' "$n"; done
    echo
    rows=()
    if [ "$classic" = 1 ]; then
        rows=("latency 8:8 B latency (us)" "tagged_bw 1048576:1 MiB tagged (MB/s)"
              "rma_write_bw 1048576:1 MiB rma write (MB/s)")
    else
        for m in "latency:latency (us)" "tagged_bw:tagged (MB/s)" "rma_write_bw:rma write (MB/s)"; do
            for s in "${bench_sizes[@]}"; do rows+=("${m%%:*} $s:$(size_name "$s") ${m#*:}"); done
        done
    fi
    for row in "${rows[@]}"; do
        key=${row%%:*}
        printf '%-26s' "${row#*:}"
        for n in "${names[@]}"; do printf ' %14s' "$(median_of "$path" "$n" "${key% *}" "${key#* }")"; done
        echo
    done
    [ "${#provs[@]}" -ge 2 ] || continue
    a=${provs[0]} b=${provs[1]}
    q() { ratio "$(median_of "$path" "$1" "$3" "$4")" "$(median_of "$path" "$2" "$3" "$4")"; }
    echo
    if [ "$classic" = 1 ]; then
        echo "ratios $a / $b (medians):"
        printf '  8 B latency      %6s   (below 1: %s is faster)\n' "$(q "$a" "$b" latency 8)" "$a"
        printf '  1 MiB tagged bw  %6s   (above 1: %s moves more)\n' "$(q "$a" "$b" tagged_bw 1048576)" "$a"
        printf '  1 MiB rma bw     %6s\n' "$(q "$a" "$b" rma_write_bw 1048576)"
        if [ "$use_ucx" = 1 ]; then
            echo "ratios $a / $ucx_name (medians):"
            printf '  8 B latency      %6s\n' "$(q "$a" "$ucx_name" latency 8)"
            printf '  1 MiB tagged bw  %6s\n' "$(q "$a" "$ucx_name" tagged_bw 1048576)"
        fi
    else
        echo "ratios $a / $b (medians; latency below 1: $a is faster, bandwidth above 1: $a moves more):"
        printf '  %-9s %8s %10s %8s\n' size latency "tagged bw" "rma bw"
        for s in "${bench_sizes[@]}"; do
            printf '  %-9s %8s %10s %8s\n' "$(size_name "$s")" "$(q "$a" "$b" latency "$s")" \
                "$(q "$a" "$b" tagged_bw "$s")" "$(q "$a" "$b" rma_write_bw "$s")"
        done
        if [ "$use_ucx" = 1 ]; then
            echo "ratios $a / $ucx_name (medians):"
            printf '  %-9s %8s %10s\n' size latency "tagged bw"
            for s in "${bench_sizes[@]}"; do
                printf '  %-9s %8s %10s\n' "$(size_name "$s")" "$(q "$a" "$ucx_name" latency "$s")" \
                    "$(q "$a" "$ucx_name" tagged_bw "$s")"
            done
        fi
    fi
done

# The JSON file: its head, then every figure, the medians and the failed runs, one object a
# line (scripts/bench-plot.sh reads the medians so).
{
    json_head
    printf '  "paths": [%s],\n' "$(printf '"%s",' "${bench_paths[@]}" | sed 's/,$//')"
    printf '  "sizes": [%s],\n' "$(IFS=,; echo "${bench_sizes[*]}")"
    awk "$awk_json"'
        function unit(m) { return m == "latency" ? "us" : "MB/s" }
        FILENAME == ARGV[1] {
            res[++nr] = "{\"run\":" $1 ",\"path\":" jstr($2) ",\"provider\":" jstr($3) ",\"metric\":" \
                        jstr($4) ",\"size\":" $5 ",\"value\":" $6 ",\"unit\":" jstr(unit($4)) "}"
        }
        FILENAME == ARGV[2] {
            mds[++nm] = "{\"path\":" jstr($1) ",\"provider\":" jstr($2) ",\"metric\":" jstr($3) \
                        ",\"size\":" $4 ",\"value\":" $5 ",\"unit\":" jstr(unit($3)) "}"
        }
        FILENAME == ARGV[3] {
            fls[++nf] = "{\"run\":" $1 ",\"path\":" jstr($2) ",\"provider\":" jstr($3) ",\"failed\":true}"
        }
        END {
            print "  \"results\": ["
            for (i = 1; i <= nr; i++) print "    " res[i] (i < nr ? "," : "")
            print "  ],"
            print "  \"medians\": ["
            for (i = 1; i <= nm; i++) print "    " mds[i] (i < nm ? "," : "")
            print "  ],"
            print "  \"failures\": ["
            for (i = 1; i <= nf; i++) print "    " fls[i] (i < nf ? "," : "")
            print "  ]"
            print "}"
        }' "$tmp/runs" "$tmp/medians" "$tmp/fails"
} >"$json" || { echo "bench.sh: could not write $json" >&2; failed=1; }
echo "bench.sh: results in $json"
if [ "$plot" = 1 ]; then
    if "$here/bench-plot.sh" "$json" "$plot_dir"; then
        echo "bench.sh: charts in $plot_dir (latency.png, bandwidth.png; the same as .svg)"
    else
        echo "bench.sh: the charts FAILED (scripts/bench-plot.sh $json $plot_dir)"
        failed=1
    fi
fi
if [ "$failed" != 0 ]; then
    echo
    echo "bench.sh: some runs FAILED (see above)"
    exit 1
fi
