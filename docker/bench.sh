#!/usr/bin/env bash
# tandem_bench between two containers, in the two standard set-ups (and a third, for the
# staged copy), printing the demo's table for each, with every transfer's data verified and
# the path tandem took. Writes every run and the medians as JSON; --plot renders them.
#
#   bash docker/bench.sh [-n RUNS] [-S SIZES] [-i IMAGE] [--compare] [--json FILE] [--plot [DIR]]
#                        [SETUP...]
#
# SETUP (default: network node-local):
#   network            two containers on a bridge network (their own network, IPC and pid
#                      namespaces): tandem's link, over the bridge
#   node-local         two containers sharing IPC (so /dev/shm) and pid namespaces
#                      (--ipc container:, --pid container: of a third container that holds
#                      them and only sleeps) and allowed cross-memory attach
#                      (--cap-add SYS_PTRACE: Docker 20.10's default seccomp profile refuses
#                      process_vm_readv without it): the node-local path, single copy by CMA
#   node-local-staged  /dev/shm shared (--ipc container:) but not the pid namespace: the
#                      node-local path, copies staged through the shared rings
#
# --compare also runs the system's own provider in each set-up, the order reversed every
# other run: tcp;ofi_rxm over the bridge (network), shm (node-local; shm needs cross-memory
# attach, so not in node-local-staged). Its figures go to the same JSON and charts.
#
# The image (default tandem:latest) comes from docker/Dockerfile; scripts/test-containers.sh
# builds it. -S takes tandem_bench's size syntax (default 8,4k,64k,1m,4m). Exits non-zero if a
# run failed, a transfer was not verified, or a set-up took another path than it should.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=../scripts/bench-table.sh
. "$repo/scripts/bench-table.sh"

runs=1 sizes=8,4k,64k,1m,4m image=tandem:latest json="" plot=0 plot_dir="" compare=0 setups=()
while [ $# -gt 0 ]; do
    case $1 in
        -n) runs=$2; shift 2 ;;
        -S) sizes=$2; shift 2 ;;
        -i) image=$2; shift 2 ;;
        --compare) compare=1; shift ;;
        --json) json=$2; shift 2 ;;
        --plot)
            plot=1
            if [ $# -gt 1 ] && [[ $2 != -* ]] && [[ $2 != network ]] && [[ $2 != node-local* ]]; then
                plot_dir=$2; shift
            fi
            shift ;;
        network|node-local|node-local-staged) setups+=("$1"); shift ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "docker/bench.sh: unknown argument $1 (see -h)" >&2; exit 1 ;;
    esac
done
[ ${#setups[@]} -gt 0 ] || setups=(network node-local)
docker image inspect "$image" >/dev/null 2>&1 ||
    { echo "docker/bench.sh: no image $image (bash scripts/test-containers.sh builds it)" >&2; exit 1; }
[ -n "$json" ] || json=$repo/build/bench-results/containers-$(date +%Y%m%d-%H%M%S).json
mkdir -p "$(dirname "$json")"
[ -n "$plot_dir" ] || plot_dir=${json%.json}

tag=tandem-bench-$$
net=$tag-net
tmp=$(mktemp -d)
cleanup() {
    docker rm -f "$tag-server" "$tag-client" "$tag-holder" >/dev/null 2>&1
    docker network rm "$net" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
docker network create "$net" >/dev/null || exit 1

declare -A system_provider=([network]="tcp;ofi_rxm" [node-local]="shm")
declare -A want_path=(
    [network]="link"
    [node-local]="node-local, single copy (CMA)"
    [node-local-staged]="node-local, staged"
)
: >"$tmp/results"
failed=0
started=$(date +%s)

# one_run SETUP RUN PROVIDER: a server container, then a client container against it.
one_run() {
    local setup=$1 run=$2 prov=$3
    local -a server_opts=(--network "$net") client_opts=(--network "$net")
    # The shared IPC (and pid) namespaces belong to a third container that only sleeps: when
    # the first process of a pid namespace exits, the kernel kills the rest, so neither
    # benchmark process may be it (the server ends first and would kill the client).
    local holder=$tag-holder
    docker rm -f "$tag-server" "$tag-client" "$holder" >/dev/null 2>&1
    case $setup in
        node-local)
            docker run -d --name "$holder" --ipc shareable "$image" sleep infinity >/dev/null || return 1
            # Docker 20.10's default seccomp profile refuses process_vm_readv/writev to a
            # container without CAP_SYS_PTRACE; both sides copy (the split copy writes).
            server_opts+=(--ipc "container:$holder" --pid "container:$holder" --cap-add SYS_PTRACE)
            client_opts+=(--ipc "container:$holder" --pid "container:$holder" --cap-add SYS_PTRACE) ;;
        node-local-staged)
            docker run -d --name "$holder" --ipc shareable "$image" sleep infinity >/dev/null || return 1
            server_opts+=(--ipc "container:$holder")
            client_opts+=(--ipc "container:$holder") ;;
    esac
    docker run -d --name "$tag-server" "${server_opts[@]}" "$image" \
        tandem_bench -p "$prov" -T 280 -s 7000 >/dev/null || return 1
    docker run --name "$tag-client" "${client_opts[@]}" "$image" \
        tandem_bench -p "$prov" -T 280 -c "$tag-server:7000" -S "$sizes" >"$tmp/client" 2>&1
    local client_rc=$?
    local server_rc
    server_rc=$(docker wait "$tag-server")
    docker logs "$tag-server" >"$tmp/server" 2>&1
    docker rm -f "$tag-server" "$tag-client" "$holder" >/dev/null 2>&1
    echo
    echo "== $setup, $prov, run $run/$runs: tandem_bench server and client in two containers"
    print_bench_table "$tmp/client"
    local verdict=ok got_client got_server
    got_client=$(sed -n 's/^# path: //p' "$tmp/client" | tail -1)
    got_server=$(sed -n 's/^# path: //p' "$tmp/server" | tail -1)
    if [ "$client_rc" -ne 0 ] || [ "$server_rc" != 0 ]; then
        verdict="FAILED (client exit $client_rc, server exit $server_rc)"
    elif ! grep -q '^# all transfers verified' "$tmp/client"; then
        verdict="FAILED (transfers not verified)"
    elif [ "$prov" = tandem ] &&
        { [ "$got_client" != "${want_path[$setup]}" ] || [ "$got_server" != "${want_path[$setup]}" ]; }; then
        verdict="FAILED (path: client '$got_client', server '$got_server'; expected '${want_path[$setup]}')"
    fi
    if [ "$verdict" = ok ]; then
        echo "   every transfer's data was verified on the receiving side${got_client:+; path: $got_client}"
        awk -v s="$setup" -v r="$run" -v p="$prov" '!/^#/ && NF >= 4 && $1 ~ /^[0-9]+$/ {
                if ($2 != "-") print r, s, p, $1, "latency", $2, "us"
                if ($3 != "-") print r, s, p, $1, "tagged_bw", $3, "MB/s"
                if ($4 != "-") print r, s, p, $1, "rma_write_bw", $4, "MB/s" }' "$tmp/client" >>"$tmp/results"
    else
        echo "   $verdict"
        echo "   --- client"; sed 's/^/   /' "$tmp/client"
        echo "   --- server"; sed 's/^/   /' "$tmp/server"
        echo "$run $setup $prov" >>"$tmp/failures"
        failed=1
    fi
}

echo "docker/bench.sh: image $image; set-ups: ${setups[*]}; $runs run(s) each; sizes $sizes"
# (set-up, provider) pairs: tandem, and with --compare the system's provider next to it.
pairs=()
for setup in "${setups[@]}"; do
    pairs+=("$setup tandem")
    [ "$compare" = 1 ] && [ -n "${system_provider[$setup]:-}" ] && pairs+=("$setup ${system_provider[$setup]}")
done
total=$((runs * ${#pairs[@]})) done_runs=0
for r in $(seq 1 "$runs"); do
    order=("${pairs[@]}")
    if [ $((r % 2)) = 0 ]; then
        order=()
        for ((i = ${#pairs[@]} - 1; i >= 0; i--)); do order+=("${pairs[i]}"); done
    fi
    for pair in "${order[@]}"; do
        setup=${pair% *} prov=${pair#* }
        now=$(date +%s)
        left=""
        [ "$done_runs" -gt 0 ] &&
            left=", about $(((now - started) * (total - done_runs) / done_runs))s left"
        echo
        echo "-- run $((done_runs + 1))/$total (elapsed $((now - started))s$left)"
        one_run "$setup" "$r" "$prov"
        done_runs=$((done_runs + 1))
    done
done

# JSON: every run, then the medians per (set-up, size, metric), in the layout scripts/bench.sh
# writes (one object per line; scripts/bench-plot.sh reads it): the set-up is the path.
{
    echo '{'
    echo '  "tool": "tandem docker/bench.sh",'
    echo "  \"date\": \"$(date -Iseconds)\","
    echo "  \"host\": \"$(hostname)\","
    echo "  \"cores\": $(nproc),"
    echo "  \"image\": \"$image\","
    echo "  \"runs\": $runs,"
    echo "  \"paths\": [$(printf '"%s",' "${setups[@]}" | sed 's/,$//')],"
    echo '  "results": ['
    awk '{ printf "%s    {\"run\":%s,\"path\":\"%s\",\"provider\":\"%s\",\"metric\":\"%s\",\"size\":%s,\"value\":%s,\"unit\":\"%s\"}",
                  (NR > 1 ? ",\n" : ""), $1, $2, $3, $5, $4, $6, $7 } END { if (NR) print "" }' "$tmp/results"
    echo '  ],'
    echo '  "medians": ['
    sort -k2,2 -k3,3 -k5,5 -k4,4n -k6,6g "$tmp/results" |
        awk '{ k = $2 " " $3 " " $4 " " $5 " " $7; v[k] = v[k] " " $6; n[k]++; if (!(k in seen)) { seen[k] = 1; order[++m] = k } }
             END { for (i = 1; i <= m; i++) { k = order[i]; split(v[k], a, " "); c = n[k]
                       med = c % 2 ? a[(c + 1) / 2] : sprintf("%.2f", (a[c / 2] + a[c / 2 + 1]) / 2)
                       split(k, f, " ")
                       printf "%s    {\"path\":\"%s\",\"provider\":\"%s\",\"metric\":\"%s\",\"size\":%s,\"value\":%s,\"unit\":\"%s\"}",
                              (i > 1 ? ",\n" : ""), f[1], f[2], f[4], f[3], med, f[5] }
                   if (m) print "" }'
    echo '  ],'
    echo '  "failures": ['
    if [ -s "$tmp/failures" ]; then
        awk '{ printf "%s    {\"run\":%s,\"path\":\"%s\",\"provider\":\"%s\",\"failed\":true}", (NR > 1 ? ",\n" : ""), $1, $2, $3 }
             END { print "" }' "$tmp/failures"
    fi
    echo '  ]'
    echo '}'
} >"$json"
echo
echo "docker/bench.sh: results in $json"
if [ "$plot" = 1 ]; then
    bash "$repo/scripts/bench-plot.sh" "$json" "$plot_dir" && echo "docker/bench.sh: charts in $plot_dir"
fi
exit $failed
