#!/usr/bin/env bash
# The README's demo command: installs, builds, then runs two processes over tandem and
# prints what they measured.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
bash "$root/scripts/build.sh"
bash "$root/scripts/demo.sh" "$build"
