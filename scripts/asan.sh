#!/usr/bin/env bash
# Builds tandem with AddressSanitizer and UBSan into ${BUILD_DIR:-build-asan} and runs the suites
# that feed tandem hostile or broken input (CI's subset, a few minutes): rogue TCP peers, peers
# killed at chosen points, authorization keys, bad arguments at the API, node-local trust
# (cells naming other processes, other jobs), segments left by dead processes, and every fuzz
# target's seed corpus and regression inputs. A sanitizer report fails its test.
#   scripts/asan.sh --all   the whole test suite instead (about 15 minutes on two cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export BUILD_DIR=${BUILD_DIR:-$root/build-asan}
suites='rogue_peer|peer_death|auth_key|bad_input|local_trust|local_segments|fuzz\.replay'
if [ "${1:-}" = "--all" ]; then
    shift
    export BUILD_TARGETS=""
    suites='.'
else
    export BUILD_TARGETS=${BUILD_TARGETS-"tandem-fi off_tandem-fi tandem_emurdma tandem_emucuda api_rogue_peer api_peer_death api_auth_key api_bad_input peer_local_trust peer_local_segments fuzz_conn_hello fuzz_tcp_link fuzz_local_cell fuzz_ipc_import"}
fi
bash "$root/scripts/build.sh" -DTANDEM_SANITIZE=ON "$@"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bash "$root/scripts/quiet-kallsyms.sh" ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 600 -j2 -R "$suites"
