#!/usr/bin/env bash
# nccl-tests (github.com/NVIDIA/nccl-tests) over the plugin, as a user runs them: two ranks on
# this host under mpirun, NCCL told to load libnccl-net-tandem.so (NCCL_NET_PLUGIN=tandem) and
# to use the network between the ranks (NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1), so that
# all_reduce_perf and sendrecv_perf move every byte through the plugin. It needs GPUs, NCCL and
# the nccl-tests binaries (NCCL_TESTS_DIR, or all_reduce_perf on PATH); where one is missing it
# exits 77, which ctest reports as skipped, with the reason on stdout.
#   nccl_tests.sh PLUGIN_DIR
set -u
plugin_dir=$1
# shellcheck source=../clients/common.sh
. "$(dirname "$0")/../clients/common.sh"  # fail, skip

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU' ||
    skip "no NVIDIA GPU (nvidia-smi lists none)"
ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2' || skip "NCCL is not installed (libnccl.so.2)"
dir=${NCCL_TESTS_DIR:-$(dirname "$(command -v all_reduce_perf 2>/dev/null || echo /nonexistent/x)")}
for t in all_reduce_perf sendrecv_perf; do
    [ -x "$dir/$t" ] || skip "nccl-tests not found (set NCCL_TESTS_DIR to its build/ directory)"
done
command -v mpirun >/dev/null 2>&1 || skip "mpirun not found"
[ -e "$plugin_dir/libnccl-net-tandem.so" ] || fail "$plugin_dir/libnccl-net-tandem.so not built"

for t in all_reduce_perf sendrecv_perf; do
    out=$(mktemp)
    if ! timeout 600 mpirun --allow-run-as-root --oversubscribe -np 2 \
        -x LD_LIBRARY_PATH="$plugin_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        -x FI_PROVIDER_PATH="$plugin_dir" -x NCCL_NET_PLUGIN=tandem -x NCCL_DEBUG=INFO \
        -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 \
        "$dir/$t" -b 8 -e 64M -f 4 -g 1 >"$out" 2>&1; then
        cat "$out"
        fail "$t exited non-zero"
    fi
    grep -q 'Loaded net plugin tandem' "$out" || { cat "$out"; fail "$t: NCCL did not load the plugin"; }
    grep -q 'Out of bounds values : 0 OK' "$out" || { cat "$out"; fail "$t: wrong results"; }
    grep -E '^#|Avg bus bandwidth' "$out" | tail -3
    rm -f "$out"
done
