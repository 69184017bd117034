#!/bin/bash
# The NCCL plugin's virtual NIC (makeVDevice) against one device: two network namespaces joined
# by two veth pairs (v0 and v1 in each, 10.231.1.0/24 and 10.231.2.0/24), bench/nccl_bench's
# receiver in one and sender in the other, over tandem's TCP link (FI_TANDEM_LOCAL=0: both
# processes share /dev/shm), 1 MiB to 64 MiB, the two modes alternating, medians of RUNS.
#
#   bash scripts/nccl-vnic-bench.sh [BUILD_DIR] [RUNS]      (root: ip netns)
set -euo pipefail
build=${1:-build}
runs=${2:-5}
bench=$build/bench/nccl_bench
[ -x "$bench" ] || { echo "no $bench (cmake --build $build --target nccl_bench)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "needs root (ip netns)" >&2; exit 77; }
rx=tvnic-rx-$$ tx=tvnic-tx-$$
cleanup() { ip netns del "$rx" 2>/dev/null || true; ip netns del "$tx" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$rx"
ip netns add "$tx"
for i in 0 1; do
    ip link add v$i netns "$rx" type veth peer name v$i netns "$tx"
    ip -n "$rx" addr add 10.231.$((i + 1)).1/24 dev v$i
    ip -n "$tx" addr add 10.231.$((i + 1)).2/24 dev v$i
    ip -n "$rx" link set v$i up
    ip -n "$tx" link set v$i up
done
for ns in "$rx" "$tx"; do
    ip -n "$ns" link set lo up
    for i in 0 1; do
        for _ in $(seq 50); do
            case $(ip -n "$ns" link show dev v$i) in *LOWER_UP*) break ;; esac
            sleep 0.1
        done
    done
done
export FI_PROVIDER_PATH=$build/lib FI_PROVIDER=tandem LD_LIBRARY_PATH=$build/lib
export NCCL_NET_PLUGIN=tandem FI_TANDEM_LOCAL=0 FI_TANDEM_IFACE=v0,v1
sizes="1M 4M 16M 64M"
declare -A iters=([1M]=64 [4M]=16 [16M]=4 [64M]=2)  # 8-buffer windows: 512 MiB to 1 GiB a run
out=$(mktemp)
for run in $(seq "$runs"); do
    for mode in one vnic; do
        for s in $sizes; do
            args=(-S "$s" -w 8 -i "${iters[$s]}" -n "$rx,$tx")
            [ "$mode" = vnic ] && args+=(-v 0,1)
            bw=$("$bench" "${args[@]}" | awk '!/^#/ {print $2}')
            echo "$run $mode $s $bw" | tee -a "$out"
        done
    done
done
echo "# size  one_device_MB/s  vnic_MB/s  ratio  (medians of $runs alternating runs)"
for s in $sizes; do
    med() { grep " $1 $s " "$out" | awk '{print $4}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
    one=$(med one) vn=$(med vnic)
    echo "$s $one $vn $(awk -v a="$one" -v b="$vn" 'BEGIN {printf "%.2f", b / a}')"
done
rm -f "$out"
