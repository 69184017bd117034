#!/usr/bin/env bash
# Installs the dependencies and builds tandem into ${BUILD_DIR:-build}.
# Extra CMake arguments pass through, e.g. scripts/build.sh -DTANDEM_SANITIZE=ON.
# BUILD_TARGETS="a b ...": build only those targets (and what they need).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
bash "$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
# shellcheck disable=SC2086  # a list of target names
cmake --build "$build" -j"$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
echo "providers: $build/lib (FI_PROVIDER_PATH=$build/lib)"
