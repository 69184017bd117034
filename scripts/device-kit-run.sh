#!/usr/bin/env bash
# run.sh of the device kit (built by scripts/device-kit.sh; docs/device-kit.md): tandem's GPU
# contract on this machine, with nothing from outside the kit but the NVIDIA driver.
#
#   bash run.sh [--emulated] [--quick]
#     --emulated   the kit's emulated driver and runtime instead of the machine's driver (what
#                  CI and the network-less container check: the same steps, the same table)
#     --quick      fewer iterations in the benchmarks
#   OUT=DIR        also write the table as DIR/device-kit.json, and each step's log in DIR
#
# Steps: the driver probe (device name, memory, compute capability); the real-GPU cases of every
# suite, node-local and over the TCP link; fabtests' device-memory ping-pong and RMA between two
# processes on one GPU under each FI_OPT_FI_HMEM_P2P policy (FI_TANDEM_HMEM_P2P); hmem_bench.
# One table at the end; exit 0 when nothing failed. It needs bash and coreutils only.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
emulated=0
quick=0
for arg in "$@"; do
    case $arg in
        --emulated) emulated=1 ;;
        --quick) quick=1 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done
start=$(date +%s)
out=${OUT:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tandem-kit.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
logs=${out:-$tmp}
mkdir -p "$logs"

# --- the kit where it is: a writable copy when it is not writable -----------------------------
kit=$here
if [ ! -w "$kit/bin" ]; then
    cp -a "$here" "$tmp/kit"
    kit=$tmp/kit
fi
loader=$(ls "$kit"/lib/ld-linux-*.so.* 2>/dev/null | head -1)
[ -x "$loader" ] || { echo "run.sh: no loader in $kit/lib" >&2; exit 2; }
# Every program's interpreter: the kit's loader, where the kit now is (once per place).
if [ "$(cat "$kit/.interp" 2>/dev/null)" != "$loader" ]; then
    for f in "$kit"/bin/*; do
        "$loader" --library-path "$kit/lib" "$kit/tools/patchelf" --set-interpreter "$loader" "$f" ||
            { echo "run.sh: cannot set the interpreter of $f" >&2; exit 2; }
    done
    echo "$loader" >"$kit/.interp"
fi

# --- the driver: the machine's libcuda.so.1, or the emulated one ------------------------------
drv=$tmp/driver
mkdir -p "$drv"
if [ $emulated = 1 ]; then
    ln -s "$kit/emulated/libcuda.so.1" "$drv/libcuda.so.1"
    ln -s "$kit/emulated/libcuda.so.1" "$drv/libcuda.so"
    ln -s "$kit/emulated/libcudart.so" "$drv/libcudart.so"
else
    host=""
    for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/nvidia/lib64 \
             /usr/local/nvidia/lib /usr/lib/wsl/lib; do
        [ -e "$d/libcuda.so.1" ] && { host=$d/libcuda.so.1; break; }
    done
    if [ -z "$host" ] && command -v ldconfig >/dev/null; then
        host=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print $NF; exit}')
    fi
    [ -n "$host" ] || { echo "run.sh: no libcuda.so.1 on this machine (the NVIDIA driver)" >&2; exit 1; }
    ln -s "$host" "$drv/libcuda.so.1"
    ln -s "$host" "$drv/libcuda.so"
    ln -s "$kit/cuda/libcudart.so" "$drv/libcudart.so"
fi
# Only the driver's folder of our own on the path: the machine's library folders would put its
# glibc beside the kit's loader.
export LD_LIBRARY_PATH=$drv
export FI_PROVIDER_PATH=$kit/prov FI_PROVIDER=tandem
unset FI_TANDEM_LOCAL FI_TANDEM_HMEM_P2P FI_HMEM_DISABLE_P2P

rows=()   # "step|result|GB/s|us|detail"
failed=0
row() {
    rows+=("$1|$2|$3|$4|$5")
    [ "$2" = FAIL ] && failed=$((failed + 1))
    printf '%-34s %-5s %8s %9s  %s\n' "$1" "$2" "$3" "$4" "$5"
}

# --- 1. the driver ----------------------------------------------------------------------------
echo "== driver"
if "$kit/bin/device_probe" >"$logs/probe.log" 2>&1; then
    cat "$logs/probe.log"
    name=$(sed -n 's/^device0\.name //p' "$logs/probe.log")
    row probe PASS - - "$(sed -n 's/^devices //p' "$logs/probe.log") device(s), $name, CUDA $(sed -n 's/^driver\.cuda_version //p' "$logs/probe.log"), cc $(sed -n 's/^device0\.compute_capability //p' "$logs/probe.log"), $(sed -n 's/^device0\.memory_mib //p' "$logs/probe.log") MiB"
else
    cat "$logs/probe.log"
    row probe FAIL - - "$(tail -1 "$logs/probe.log")"
    echo "run.sh: no usable driver or device: nothing else can run" >&2
    exit 1
fi

# --- 2. the suites' real-GPU cases --------------------------------------------------------------
# gtest's closing lines: "[  PASSED  ] N tests.", "[  SKIPPED ] N tests", and one
# "[  FAILED  ] Suite.Name (N ms)" for each failed test.
gtest_row() {
    local name=$1 logf=$2 rc=$3 pass skip fail result
    pass=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$logf" | tail -1)
    skip=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$logf" | tail -1)
    # (--gtest_brief prints no count of failures: each failed test's own line is counted.)
    fail=$(grep -cE '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$logf")
    pass=${pass:-0} skip=${skip:-0} fail=${fail:-0}
    result=PASS
    [ "$rc" -ne 0 ] || [ "$fail" -ne 0 ] && result=FAIL
    [ "$pass" -eq 0 ] && [ "$result" = PASS ] && result=SKIP
    row "$name" "$result" - - "$pass passed, $fail failed, $skip skipped${4:+; $4}"
}
suite() {  # suite NAME PROGRAM [VAR=VALUE...]
    local name=$1 prog=$2 rc
    shift 2
    env "$@" timeout 300 "$kit/bin/$prog" --gtest_brief=1 >"$logs/$name.log" 2>&1
    rc=$?
    local why=""
    [ $rc -eq 124 ] && why="timed out after 300 s"
    gtest_row "$name" "$logs/$name.log" $rc "$why"
}
echo "== suites"
suite hmem.transfer hmem_transfer FI_TANDEM_MR_VIRT_ADDR=1
suite hmem.transfer.net hmem_transfer FI_TANDEM_MR_VIRT_ADDR=1 FI_TANDEM_LOCAL=0
for s in atomic trigger coll; do
    suite "hmem.$s" "hmem_$s"
    suite "hmem.$s.net" "hmem_$s" FI_TANDEM_LOCAL=0
done
suite hmem.memory_iface hmem_memory_iface
suite nccl.local nccl_plugin_test NCCL_NET_PLUGIN=tandem
suite nccl.net nccl_plugin_test NCCL_NET_PLUGIN=tandem FI_TANDEM_LOCAL=0

# --- 3. fabtests: device memory between two processes on one GPU, under each policy -------------
# A server and a client of one program on 127.0.0.1; -v checks every byte. The client's last
# line is the largest size's: bytes iters total time MB/sec usec/xfer Mxfers/sec.
port=9390
# EXPECT: "ok", or "refused" where tandem documents an FI_EOPNOTSUPP error completion (under
# REQUIRED, node-local RMA reads of device memory, which have no peer-to-peer form yet:
# docs/architecture.md), and the step passes only if that is what happened.
fabtest() {  # fabtest NAME POLICY EXPECT PROGRAM ARGS...
    local name=$1 policy=$2 expect=$3 prog=$4 srv rc line
    shift 4
    port=$((port + 1))
    srv="$logs/$name.server.log"
    FI_TANDEM_HMEM_P2P=$policy timeout 120 "$kit/bin/$prog" -p tandem -D cuda -B $port -s 127.0.0.1 "$@" >"$srv" 2>&1 &
    local pid=$!
    sleep 0.5
    FI_TANDEM_HMEM_P2P=$policy timeout 120 "$kit/bin/$prog" -p tandem -D cuda -P $port "$@" 127.0.0.1 >"$logs/$name.log" 2>&1
    rc=$?
    wait $pid || rc=$((rc == 0 ? 1 : rc))
    line=$(grep -E '^[0-9]+[kmg]? ' "$logs/$name.log" | tail -1)
    if [ "$expect" = refused ]; then
        if [ $rc -ne 0 ] && grep -q 'cq_readerr 95 (Operation not supported)' "$logs/$name.log"; then
            row "$name" PASS - - "refused (FI_EOPNOTSUPP) as documented, FI_TANDEM_HMEM_P2P=$policy"
        else
            row "$name" FAIL - - "exit $rc, expected an FI_EOPNOTSUPP error completion"
        fi
    elif [ $rc -eq 0 ] && [ -n "$line" ]; then
        set -- $line
        row "$name" PASS "$(awk -v m="$5" 'BEGIN { printf "%.2f", m / 1000 }')" "$6" "$1 B, verified, FI_TANDEM_HMEM_P2P=$policy"
    else
        row "$name" FAIL - - "exit $rc, FI_TANDEM_HMEM_P2P=$policy: $(tail -1 "$logs/$name.log")"
    fi
}
echo "== fabtests (device memory, two processes)"
iters=1000
[ $quick = 1 ] && iters=100
for policy in enabled preferred required disabled; do
    read_expect=ok
    [ $policy = required ] && read_expect=refused
    fabtest "fi_rdm_pingpong.$policy" $policy ok fi_rdm_pingpong -S 1048576 -I $iters -v
    fabtest "fi_rdm_pingpong.8B.$policy" $policy ok fi_rdm_pingpong -S 8 -I $iters -v
    fabtest "fi_rma_bw.write.$policy" $policy ok fi_rma_bw -o write -S 1048576 -I $((iters / 10)) -v
    fabtest "fi_rma_bw.read.$policy" $policy $read_expect fi_rma_bw -o read -S 1048576 \
        -I $((iters / 10)) -v
done

# --- 4. benchmarks on device buffers ----------------------------------------------------------
echo "== benchmarks"
n=200
[ $quick = 1 ] && n=20
for path in local net; do
    extra=()
    [ $path = net ] && extra=(FI_TANDEM_LOCAL=0)
    if env "${extra[@]}" timeout 300 "$kit/bin/hmem_bench" -n $n -s 8,1048576 >"$logs/hmem_bench.$path.log" 2>&1; then
        while read -r policy size lat mbs mech; do
            step=hmem_bench.$path.$policy
            [ "$size" = - ] || step+=.$size
            row "$step" PASS \
                "$(awk -v m="$mbs" 'BEGIN { printf "%.2f", m / 1000 }')" "$lat" "$mech"
        done < <(grep -E '^(ENABLED|PREFERRED|REQUIRED|DISABLED) ' "$logs/hmem_bench.$path.log")
    else
        row "hmem_bench.$path" FAIL - - "$(tail -1 "$logs/hmem_bench.$path.log")"
    fi
done

# tandem_bench: host buffers only (it stamps and checks its buffers with the CPU), the host
# baseline of the same machine beside hmem_bench's device figures.
if timeout 120 "$kit/bin/tandem_bench" -p tandem -S 8,1048576 -t lat,bw -i $n \
        >"$logs/tandem_bench.log" 2>&1 && grep -q 'all transfers verified' "$logs/tandem_bench.log"; then
    while read -r size lat mbs _; do
        row "tandem_bench.host.$size" PASS "$(awk -v m="$mbs" 'BEGIN { printf "%.2f", m / 1000 }')" \
            "$lat" "host buffers, node-local, verified"
    done < <(grep -E '^ *[0-9]+ +[0-9.]+ +[0-9.]+' "$logs/tandem_bench.log")
else
    row tandem_bench.host FAIL - - "$(tail -1 "$logs/tandem_bench.log")"
fi

# --- the table --------------------------------------------------------------------------------
secs=$(( $(date +%s) - start ))
mode=$([ $emulated = 1 ] && echo "emulated driver" || echo "the machine's driver")
echo
echo "== tandem device kit: ${#rows[@]} steps, $failed failed, ${secs} s, $mode"
printf '%-34s %-5s %8s %9s  %s\n' step result GB/s us detail
for r in "${rows[@]}"; do
    IFS='|' read -r a b c d e <<<"$r"
    printf '%-34s %-5s %8s %9s  %s\n' "$a" "$b" "$c" "$d" "$e"
done
if [ -n "$out" ]; then
    esc() { local s=${1//\\/\\\\}; printf '%s' "${s//\"/\\\"}"; }
    {
        printf '{"emulated": %s, "seconds": %s, "failed": %s, "steps": [' "$emulated" "$secs" "$failed"
        sep=""
        for r in "${rows[@]}"; do
            IFS='|' read -r a b c d e <<<"$r"
            printf '%s\n  {"step": "%s", "result": "%s", "gbps": "%s", "us": "%s", "detail": "%s"}' \
                "$sep" "$(esc "$a")" "$b" "$c" "$d" "$(esc "$e")"
            sep=","
        done
        printf '\n]}\n'
    } >"$out/device-kit.json"
    echo "run.sh: the table is in $out/device-kit.json"
fi
[ $failed -eq 0 ]
