#!/usr/bin/env bash
# scripts/bench.sh --targets: the figures the latency work is held to, all in one invocation,
# each against its reference on this machine, as ratios of medians over alternating runs.
#
#   scripts/bench.sh --targets [-b BUILD_DIR] [-n RUNS] [--json FILE] [--baseline BUILD_DIR]
#
# --baseline BASE: another build of tandem (an earlier commit, built in its own tree) measured
# in the same runs, between the two sides of each tandem pair, so that the new build and the
# old alternate too (the same tandem_bench, only FI_PROVIDER_PATH differs): local_lat,
# link_lat, local_bw, link_bw and mpi_lat get a ".base" figure, and "new against baseline"
# prints each ratio with a limit of 5% (latency new / base <= 1.05, bandwidth base / new
# <= 1.05). Those ratios are medians of paired ratios: each new figure is divided by the
# baseline's measured next to it (the i-th of a run with the i-th), because a VM's speed
# moves by tens of percent within minutes, far more than the limit, and a ratio of two medians
# taken minutes apart measures that drift. Bandwidth gets BW_PAIRS pairs a run (default 3:
# the one beside the reference, then back-to-back pairs in alternating order).
#
# Every run measures, in pairs whose order is reversed every other run:
#   local_lat   8 B tagged ping-pong (half round trip), node-local: tandem (tandem_bench)
#               against UCX's shared memory (ucx_perftest tag_lat, UCX_TLS=posix,cma)
#   link_lat    8 B over TCP: tandem's link (FI_TANDEM_LOCAL=0) against UCX over TCP
#               (UCX_TLS=tcp)
#   local_bw    1 MiB tagged bandwidth (window 64): tandem node-local against shm
#   link_bw     1 MiB over TCP: tandem's link against tcp;ofi_rxm
#   mpi_lat     Open MPI, 2 ranks, 8 B MPI_Send/MPI_Recv (bench/mpi_lat): pml cm, mtl ofi over
#               tandem (mtl_ofi_provider_include tandem) against pml ob1, btl self,vader
#   allreduce   Open MPI's MPI_Allreduce, 4 ranks on this host's cores (mpirun
#               --oversubscribe, Open MPI's defaults otherwise; bench/coll_bench --mode mpi),
#               64 KiB and 1 MiB: over tandem against over vader
#   oversub     two processes on one core (taskset -c 0): 8 B latency and 1 MiB bandwidth,
#               tandem node-local against shm
# and once: the resident memory of an endpoint with 1, 16 and 64 peers (bench/mem_bench),
# tandem node-local against shm, tandem's link against tcp;ofi_rxm.
#
# Prints every run, then the medians, the ratios and each target with PASS or FAIL:
#   local_lat tandem / ucx(sm) <= 0.90     mpi_lat tandem / vader <= 1.20
#   link_lat tandem / ucx(tcp) <= 0.95     allreduce tandem / vader <= 1.00 (each size)
#   memory at 64 peers: tandem / shm <= 1.00 (node-local), tandem / tcp;ofi_rxm <= 1.00 (link)
# Bandwidth and the oversubscribed case have no ratio target here: they are printed next to
# the system's providers (and the bandwidth checked against its figures before this work in
# docs/latency.md). JSON (--json, default BUILD_DIR/bench-results/targets-DATE.json):
# {"tool", "mode": "targets", "date", "host", "cores", "runs", "results": [{"run", "key",
# "value", "unit"}], "medians": [{"key", "value", "unit"}], "targets": [{"name", "ratio",
# "limit", "pass"}], "memory": [{"key", "peers", "kib"}]}. Exit status 1 when a measurement
# failed (a target missed is reported, not an error).
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=$repo/build
runs=5
json=""
base=""
while [ $# -gt 0 ]; do
    case $1 in
        -b) build=$2; shift 2 ;;
        -n) runs=$2; shift 2 ;;
        --json) json=$2; shift 2 ;;
        --baseline) base=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "bench.sh --targets: unknown option $1 (see -h)" >&2; exit 1 ;;
    esac
done
case $runs in ''|*[!0-9]*|0) echo "bench.sh --targets: bad -n \"$runs\"" >&2; exit 1 ;; esac
build=$(cd "$build" 2>/dev/null && pwd) || { echo "bench.sh --targets: no build directory" >&2; exit 1; }
for f in bench/tandem_bench bench/mem_bench bench/mpi_lat bench/coll_bench lib/libtandem-fi.so; do
    [ -e "$build/$f" ] || { echo "bench.sh --targets: $build/$f not built" >&2; exit 1; }
done
if [ -n "$base" ]; then
    base=$(cd "$base" 2>/dev/null && pwd) || { echo "bench.sh --targets: no baseline directory" >&2; exit 1; }
    [ -e "$base/lib/libtandem-fi.so" ] || { echo "bench.sh --targets: $base/lib/libtandem-fi.so not built" >&2; exit 1; }
fi
for c in ucx_perftest mpirun taskset; do
    command -v "$c" >/dev/null || { echo "bench.sh --targets: $c not found (scripts/install-deps.sh)" >&2; exit 1; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
started=$(date +%s)
[ -n "$json" ] || json=$build/bench-results/targets-$(date -d "@$started" +%Y%m%d-%H%M%S).json
mkdir -p "$(dirname "$json")" || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/results"
failed=0
tb=$build/bench/tandem_bench
prov_path=$build/lib

# record RUN KEY VALUE UNIT (an empty or non-numeric VALUE is a failed measurement)
record() {
    if [[ $3 =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
        echo "$1 $2 $3 $4" >>"$tmp/results"
        printf "  %-28s %12s %s\n" "$2" "$3" "$4"
    else
        printf "  %-28s %12s\n" "$2" "FAILED"
        failed=1
    fi
}

# tandem_bench PROVIDER TEST SIZE [ENV or a command to run it under...]: the latency (lat) or
# bandwidth (bw) column. $tb_iters, when set: tandem_bench's -i (iterations or windows).
tb_iters=""
tb_run() {
    local prov=$1 test=$2 size=$3
    shift 3
    local col=2
    [ "$test" = bw ] && col=3
    env FI_PROVIDER_PATH="$prov_path" "$@" timeout 200 "$tb" -p "$prov" -t "$test" -S "$size" \
        ${tb_iters:+-i "$tb_iters"} 2>/dev/null |
        awk -v c=$col '!/^#/ && $1 ~ /^[0-9]+$/ { print $c; exit }'
}

ucx_port=$((41970 + RANDOM % 20))
# ucx TLS TEST [ITERS]: ucx_perftest's overall latency (us) or bandwidth (MB/s) at 8 B or
# 1 MiB.
ucx_run() {
    local tls=$1 test=$2 size=8 iters=${3:-20000} field=5
    [ "$test" = tag_bw ] && size=1048576 iters=${3:-1000} field=7
    ucx_port=$((ucx_port + 1))
    UCX_TLS=$tls timeout 120 ucx_perftest -p "$ucx_port" >/dev/null 2>&1 &
    local spid=$! out=""
    for _ in $(seq 1 50); do
        out=$(UCX_TLS=$tls timeout 120 ucx_perftest 127.0.0.1 -p "$ucx_port" -t "$test" -s "$size" \
              -n "$iters" -w $((iters / 10)) 2>&1) && break
        out=""
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
    done
    wait "$spid" 2>/dev/null
    awk -v f=$field '/^Final:/ { print $f }' <<<"$out"
}

mpi_tandem=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include tandem -x FI_PROVIDER_PATH="$prov_path")
mpi_vader=(--mca pml ob1 --mca btl self,vader)
mpi_lat_run() {
    timeout 120 mpirun -np 2 "$@" "$build/bench/mpi_lat" -s 8 2>/dev/null |
        awk '$1 == "mpi" && $2 == "latency" { print $5; exit }'
}
# allreduce_run MPIRUN-ARGS...: "LAT64K LAT1M" (us)
allreduce_run() {
    timeout 200 mpirun -np 4 --oversubscribe "$@" "$build/bench/coll_bench" --mode mpi \
        --sizes 64k,1m 2>/dev/null |
        awk '$2 == "allreduce" && $3 == 65536 { a = $5 } $2 == "allreduce" && $3 == 1048576 { b = $5 }
             END { print a, b }'
}

# pair RUN FIRST-FN SECOND-FN: runs the two in order, reversed on even runs; with a baseline,
# the baseline's measurement (c) between them.
pair() {
    if (($1 % 2)); then "$2"; [ -n "$base" ] && c; "$3"; else "$3"; [ -n "$base" ] && c; "$2"; fi
}
# The baseline's tandem, for c(): its providers, the same tandem_bench.
on_base() { prov_path=$base/lib "$@"; }
mpi_base=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include tandem -x FI_PROVIDER_PATH="$base/lib")
c() { :; }
# more_bw_pairs RUN METRIC [ENV...]: with a baseline, BW_PAIRS - 1 more back-to-back pairs of
# the new build and the baseline at 1 MiB, the order alternating.
bw_pairs=${BW_PAIRS:-3}
more_bw_pairs() {
    [ -n "$base" ] || return 0
    local run=$1 m=$2 k
    shift 2
    for k in $(seq 2 "$bw_pairs"); do
        if (((run + k) % 2)); then
            record "$run" "$m.tandem" "$(tb_run tandem bw 1m "$@")" MB/s
            record "$run" "$m.base" "$(on_base tb_run tandem bw 1m "$@")" MB/s
        else
            record "$run" "$m.base" "$(on_base tb_run tandem bw 1m "$@")" MB/s
            record "$run" "$m.tandem" "$(tb_run tandem bw 1m "$@")" MB/s
        fi
    done
}

echo "bench.sh --targets: $runs runs on $(nproc) cores ($(hostname)), build $build"
for run in $(seq 1 "$runs"); do
    elapsed=$(($(date +%s) - started))
    echo "run $run/$runs (elapsed ${elapsed}s)"
    # (200,000 round trips each, some 40 ms: at the default 10,000 a run lasts 2 ms, and one
    # interruption moves its figure by several percent.)
    a() { record "$run" local_lat.tandem "$(tb_iters=200000 tb_run tandem lat 8)" us; }
    b() { record "$run" local_lat.ucx_sm "$(ucx_run posix,cma tag_lat 200000)" us; }
    c() { record "$run" local_lat.base "$(tb_iters=200000 on_base tb_run tandem lat 8)" us; }
    pair "$run" a b
    a() { record "$run" link_lat.tandem "$(tb_run tandem lat 8 FI_TANDEM_LOCAL=0)" us; }
    b() { record "$run" link_lat.ucx_tcp "$(ucx_run tcp tag_lat)" us; }
    c() { record "$run" link_lat.base "$(on_base tb_run tandem lat 8 FI_TANDEM_LOCAL=0)" us; }
    pair "$run" a b
    a() { record "$run" local_bw.tandem "$(tb_run tandem bw 1m)" MB/s; }
    b() { record "$run" local_bw.shm "$(tb_run shm bw 1m)" MB/s; }
    c() { record "$run" local_bw.base "$(on_base tb_run tandem bw 1m)" MB/s; }
    pair "$run" a b
    more_bw_pairs "$run" local_bw
    a() { record "$run" link_bw.tandem "$(tb_run tandem bw 1m FI_TANDEM_LOCAL=0)" MB/s; }
    b() { record "$run" link_bw.tcp_rxm "$(tb_run 'tcp;ofi_rxm' bw 1m)" MB/s; }
    c() { record "$run" link_bw.base "$(on_base tb_run tandem bw 1m FI_TANDEM_LOCAL=0)" MB/s; }
    pair "$run" a b
    more_bw_pairs "$run" link_bw FI_TANDEM_LOCAL=0
    a() { record "$run" mpi_lat.tandem "$(mpi_lat_run "${mpi_tandem[@]}")" us; }
    b() { record "$run" mpi_lat.vader "$(mpi_lat_run "${mpi_vader[@]}")" us; }
    c() { record "$run" mpi_lat.base "$(mpi_lat_run "${mpi_base[@]}")" us; }
    pair "$run" a b
    c() { :; }
    a() {
        read -r x y <<<"$(allreduce_run "${mpi_tandem[@]}")"
        record "$run" allreduce_64k.tandem "${x:-}" us
        record "$run" allreduce_1m.tandem "${y:-}" us
    }
    b() {
        read -r x y <<<"$(allreduce_run "${mpi_vader[@]}")"
        record "$run" allreduce_64k.vader "${x:-}" us
        record "$run" allreduce_1m.vader "${y:-}" us
    }
    pair "$run" a b
    # (Few iterations: a provider that never gives the core away takes a time slice each.)
    a() {
        record "$run" oversub_lat.tandem "$(tb_iters=300 tb_run tandem lat 8 taskset -c 0)" us
        record "$run" oversub_bw.tandem "$(tb_iters=20 tb_run tandem bw 1m taskset -c 0)" MB/s
    }
    b() {
        record "$run" oversub_lat.shm "$(tb_iters=300 tb_run shm lat 8 taskset -c 0)" us
        record "$run" oversub_bw.shm "$(tb_iters=20 tb_run shm bw 1m taskset -c 0)" MB/s
    }
    pair "$run" a b
done

echo "resident memory (KiB over a process with libfabric loaded; bench/mem_bench)"
: >"$tmp/memory"
mem_run() {  # KEY PROVIDER [ENV...]
    local key=$1 prov=$2
    shift 2
    local out
    out=$(env FI_PROVIDER_PATH="$prov_path" "$@" timeout 300 "$build/bench/mem_bench" -p "$prov" -n 1,16,64 2>/dev/null)
    if ! grep -q '^mem 64 ' <<<"$out"; then
        echo "  $key: FAILED"
        failed=1
        return
    fi
    awk -v k="$key" '$1 == "mem" { print k, $2, $4 }' <<<"$out" >>"$tmp/memory"
}
mem_run local.tandem tandem
mem_run local.shm shm
mem_run link.tandem tandem FI_TANDEM_LOCAL=0
mem_run link.tcp_rxm 'tcp;ofi_rxm'
printf "  %-16s %10s %10s %10s\n" "" "1 peer" "16 peers" "64 peers"
for k in local.tandem local.shm link.tandem link.tcp_rxm; do
    awk -v k="$k" '$1 == k { v[$2] = $3 } END { printf "  %-16s %10s %10s %10s\n", k, v[1], v[16], v[64] }' "$tmp/memory"
done

# Medians per key, the ratios and the targets.
awk '{ print $2, $3, $4 }' "$tmp/results" | sort -k1,1 -k2,2g |
    awk '{ k = $1; v[k, ++n[k]] = $2; u[k] = $3 }
         END { for (k in n) { m = (n[k] % 2) ? v[k, (n[k] + 1) / 2] : (v[k, n[k] / 2] + v[k, n[k] / 2 + 1]) / 2;
                              print k, m, u[k] } }' | sort >"$tmp/medians"
med() { awk -v k="$1" '$1 == k { print $2 }' "$tmp/medians"; }
mem64() { awk -v k="$1" '$1 == k && $2 == 64 { print $3 }' "$tmp/memory"; }
echo
echo "medians over $runs runs"
awk '{ printf "  %-28s %12s %s\n", $1, $2, $3 }' "$tmp/medians"
echo
echo "targets (ratio of medians)"
: >"$tmp/targets"
target() {  # NAME NUMERATOR DENOMINATOR LIMIT
    local name=$1 num=$2 den=$3 limit=$4
    if [ -z "$num" ] || [ -z "$den" ]; then
        printf "  %-40s %8s\n" "$name" "n/a"
        return
    fi
    awk -v n="$name" -v a="$num" -v b="$den" -v l="$limit" 'BEGIN {
        r = a / b; pass = (r <= l) ? "PASS" : "FAIL"
        printf "  %-40s %8.3f  (<= %.2f)  %s\n", n, r, l, pass
        printf "%s %.4f %s %s\n", n, r, l, (r <= l) ? "true" : "false" > "/dev/stderr"
    }' 2>>"$tmp/targets"
}
target "local 8 B: tandem / ucx(sm)" "$(med local_lat.tandem)" "$(med local_lat.ucx_sm)" 0.90
target "mpi 8 B: tandem / vader" "$(med mpi_lat.tandem)" "$(med mpi_lat.vader)" 1.20
target "link 8 B: tandem / ucx(tcp)" "$(med link_lat.tandem)" "$(med link_lat.ucx_tcp)" 0.95
target "allreduce 64 KiB, 4 ranks: tandem / vader" "$(med allreduce_64k.tandem)" "$(med allreduce_64k.vader)" 1.00
target "allreduce 1 MiB, 4 ranks: tandem / vader" "$(med allreduce_1m.tandem)" "$(med allreduce_1m.vader)" 1.00
target "memory, 64 peers: tandem / shm" "$(mem64 local.tandem)" "$(mem64 local.shm)" 1.00
target "memory, 64 peers: tandem / tcp;ofi_rxm" "$(mem64 link.tandem)" "$(mem64 link.tcp_rxm)" 1.00
# paired METRIC NUM DEN: the median over the runs' pairs (the i-th NUM figure of a run with
# the i-th DEN figure of that run) of NUM / DEN, and how many pairs.
paired() {
    awk -v a="$1.$2" -v b="$1.$3" '
        $2 == a { x[$1, ++nx[$1]] = $3; runs[$1] = 1 }
        $2 == b { y[$1, ++ny[$1]] = $3 }
        END { for (r in runs) for (i = 1; i <= nx[r] && i <= ny[r]; i++) if (y[r, i] > 0) print x[r, i] / y[r, i] }' \
        "$tmp/results" | sort -g |
        awk '{ v[++n] = $1 } END { if (n) printf "%.4f %d\n", (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2, n }'
}
if [ -n "$base" ]; then
    echo
    echo "new against baseline ($base; median of paired ratios, limit 5%)"
    for m in local_lat link_lat mpi_lat local_bw link_bw; do
        case $m in *_bw) num=base den=tandem label="$m: baseline / new" ;;
                   *) num=tandem den=base label="$m: new / baseline" ;; esac
        read -r ratio npairs <<<"$(paired "$m" "$num" "$den")"
        target "$label (${npairs:-0} pairs)" "${ratio:-}" "${ratio:+1}" 1.05
    done
fi
echo
echo "for comparison (no target): 1 MiB bandwidth, and two processes on one core"
for p in "local_bw tandem shm" "link_bw tandem tcp_rxm" "oversub_lat tandem shm" "oversub_bw tandem shm"; do
    read -r m x y <<<"$p"
    a=$(med "$m.$x") b=$(med "$m.$y")
    [ -n "$a" ] && [ -n "$b" ] && awk -v m="$m" -v x="$x" -v y="$y" -v a="$a" -v b="$b" \
        'BEGIN { printf "  %-12s %s %s, %s %s: ratio %.3f\n", m, x, a, y, b, a / b }'
done

{
    printf '{"tool": "bench.sh", "mode": "targets", "date": "%s", "host": "%s", "cores": %s, "runs": %s,\n' \
        "$(date -d "@$started" -Iseconds)" "$(hostname)" "$(nproc)" "$runs"
    echo ' "results": ['
    awk '{ printf "%s  {\"run\": %s, \"key\": \"%s\", \"value\": %s, \"unit\": \"%s\"}", (NR > 1 ? ",\n" : ""), $1, $2, $3, $4 }' "$tmp/results"
    echo; echo ' ],'
    echo ' "medians": ['
    awk '{ printf "%s  {\"key\": \"%s\", \"value\": %s, \"unit\": \"%s\"}", (NR > 1 ? ",\n" : ""), $1, $2, $3 }' "$tmp/medians"
    echo; echo ' ],'
    echo ' "targets": ['
    awk '{ name = $0; sub(/ [^ ]+ [^ ]+ [^ ]+$/, "", name); n = split($0, f, " ");
           printf "%s  {\"name\": \"%s\", \"ratio\": %s, \"limit\": %s, \"pass\": %s}", (NR > 1 ? ",\n" : ""), name, f[n - 2], f[n - 1], f[n] }' "$tmp/targets"
    echo; echo ' ],'
    echo ' "memory": ['
    awk '{ printf "%s  {\"key\": \"%s\", \"peers\": %s, \"kib\": %s}", (NR > 1 ? ",\n" : ""), $1, $2, $3 }' "$tmp/memory"
    echo; echo ' ]}'
} >"$json"
echo
echo "bench.sh: results in $json (took $(($(date +%s) - started)) s)"
exit $failed
