#!/usr/bin/env bash
# Builds tandem with ThreadSanitizer into ${BUILD_DIR:-build-tsan} and runs the suites where
# several threads use one domain, fabric or wait set at once (FI_THREAD_SAFE stress, EQ and CQ
# readers beside connections that come and go, FI_THREAD_DOMAIN with an EQ reader, wait
# sets, the NCCL plugin's connections streamed by several threads), the same suites with
# automatic progress (their api_auto.* variants: tandem's progress thread beside every call)
# and the progress thread's own suite (api.progress, api_net.progress). A race or lock-order
# inversion TSan reports fails its test, and so does a lock taken against tandem's order
# (main_prov/lock_order.h, checked in every build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export BUILD_DIR=${BUILD_DIR:-$root/build-tsan}
# Only what these suites run: the providers, the emulated devices and the suites' programs.
export BUILD_TARGETS=${BUILD_TARGETS-"tandem-fi off_tandem-fi nccl-net-tandem tandem_emurdma tandem_emucuda api_threads api_eq api_msg_ep api_wait api_progress nccl_plugin_test"}
bash "$root/scripts/build.sh" -DTANDEM_SANITIZE=thread "$@"
bash "$root/scripts/quiet-kallsyms.sh" ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 300 -j2 \
    -R 'threads|\.eq\.|msg_ep|\.wait\.|\.progress\.|nccl\..*Threads'
