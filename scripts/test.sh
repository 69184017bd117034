#!/usr/bin/env bash
# The README's test command: installs, builds and runs the whole test suite.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
# CUDA 11.8's headers, for the check of hmem/cuda_abi.h against them (unit.cuda_abi.cuda11_8):
# fetched once into build/cuda-headers (about 35 s), before the build configures that check.
# Where they cannot be had, that check alone skips, saying why.
bash "$root/scripts/cuda-headers.sh" || echo "test.sh: no CUDA 11.8 headers: unit.cuda_abi.cuda11_8 will skip"
bash "$root/scripts/build.sh" "$@"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Four at once on two cores: a test program spends most of its time asleep before it starts
# (the system libfabric's PSM libraries calibrate the CPU's clock in 125 us sleeps when they
# load, about 0.17 s of each process; an api test takes 0.27 s, 0.08 of it on a core). The
# whole suite: 697 s at -j2, 544 at -j4 on this machine.
bash "$root/scripts/quiet-kallsyms.sh" ctest --test-dir "$build" --output-on-failure --timeout 600 -j4
