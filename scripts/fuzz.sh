#!/usr/bin/env bash
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]
# Builds the libFuzzer targets of tests/fuzz (build-fuzz: clang, TANDEM_FUZZ=ON, every library
# instrumented, AddressSanitizer and UBSan) and runs each TARGET (default: all of them) for
# SECONDS (default 30), one after the other, starting from the seed corpus
# (tests/fuzz/corpus/TARGET) and what earlier runs found (build-fuzz/corpus/TARGET). A target
# that crashes, leaks, times out or runs out of memory stops the script with a non-zero status
# and its input in build-fuzz/artifacts/TARGET/: fix the cause, then keep the input as a
# regression (tests/fuzz/regressions/TARGET/, replayed by ctest fuzz.replay.TARGET).
# CI runs every target for 20 s; the long runs the issue asks for: scripts/fuzz.sh 1800.
# FUZZ_JOBS=N runs N targets at once (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(conn_hello tcp_link local_cell ipc_import)
bash scripts/install-deps.sh
dir=build-fuzz
if [ ! -f "$dir/CMakeCache.txt" ]; then
    CC=clang CXX=clang++ cmake -S . -B "$dir" -DTANDEM_FUZZ=ON -DTANDEM_BUILD_BENCH=OFF \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$dir" -j"$(nproc)" --target "${targets[@]/#/fuzz_}"

run() {
    local t=$1 work="$dir/corpus/$1" art="$dir/artifacts/$1/"
    mkdir -p "$work" "$art"
    local env=()
    case $t in
        local_cell) env=(FI_PROVIDER_PATH="$PWD/$dir/lib" FI_PROVIDER=tandem FI_LOG_LEVEL=none) ;;
        ipc_import) env=(LD_LIBRARY_PATH="$PWD/$dir/tests/emucuda") ;;
    esac
    # -timeout: one input may take a few seconds (the link's passes, the victim's progress);
    # longer is a hang. Leak checks stay on: what one input leaks, millions add up.
    if env "${env[@]}" "$dir/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=20 \
        -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 -artifact_prefix="$art" \
        "$work" "tests/fuzz/corpus/$t" >"$dir/fuzz_$t.log" 2>&1; then
        echo "fuzz_$t: ${seconds}s, no finding ($(grep -a -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$dir/fuzz_$t.log" | grep -o '[0-9]*$') inputs, corpus $(find "$work" -type f | wc -l))"
    else
        echo "FAIL: fuzz_$t found a problem; its input is in $art (log: $dir/fuzz_$t.log)" >&2
        grep -a -m3 -E "ERROR|SUMMARY|==[0-9]+==" "$dir/fuzz_$t.log" >&2 || true
        return 1
    fi
}

jobs=${FUZZ_JOBS:-1}
status=0
pids=()
for t in "${targets[@]}"; do
    run "$t" &
    pids+=($!)
    if ((${#pids[@]} >= jobs)); then
        wait "${pids[0]}" || status=1
        pids=("${pids[@]:1}")
    fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
