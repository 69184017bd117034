#!/usr/bin/env bash
# Installs everything tandem needs to build, test and benchmark on Debian bookworm.
# Idempotent; run as root (or with sudo available).
set -euo pipefail

packages=(
    build-essential cmake pkg-config git
    libfabric-dev libfabric-bin
    libibverbs-dev librdmacm-dev
    openmpi-bin libopenmpi-dev
    libgtest-dev googletest
    ucx-utils
    clang-format
    clang libclang-rt-dev
    iproute2 iptables
    gnuplot-nox
    valgrind
    universal-ctags
)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
