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
bash "$root/scripts/quiet-kallsyms.sh" ctest --test-dir "$build" --output-on-failure --timeout 600 -j2
