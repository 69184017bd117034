#!/usr/bin/env bash
# Proves that the device kit needs nothing from outside itself: runs build/device-kit/run.sh
# --emulated in a `docker run --network none` container of plain debian:bookworm-slim (no
# package installed, no network), with the kit mounted read-only (docs/device-kit.md).
#
#   bash scripts/device-kit-container.sh [run.sh options]      (as root; default --quick)
#
# Installs docker.io and starts dockerd where needed, makes the base image with
# docker/make-base.sh (debootstrap from the Debian archive, no registry) when it is absent, and
# builds the kit when it is absent. The table and logs land in build/device-kit-container/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
image=debian:bookworm-slim
[ "$(id -u)" -eq 0 ] || { echo "device-kit-container.sh: run as root (Docker)" >&2; exit 1; }
[ $# -gt 0 ] || set -- --quick

if ! command -v dockerd >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
    nohup dockerd >/var/log/tandem-dockerd.log 2>&1 &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start (/var/log/tandem-dockerd.log)" >&2; exit 1; }
fi
bash "$root/docker/make-base.sh" "$image"
[ -x "$build/device-kit/run.sh" ] || bash "$root/scripts/device-kit.sh"

out=$build/device-kit-container
rm -rf "$out" && mkdir -p "$out"
echo "device-kit-container: run.sh --emulated $* in $image, --network none, kit read-only"
# /dev/shm of 2 GiB, as GPU jobs run their containers (docker's default 64 MiB holds neither
# the node-local rings nor the emulated device memory, which are shared-memory objects).
docker run --rm --network none --shm-size=2g \
    -v "$build/device-kit:/kit:ro" -v "$out:/out" -e OUT=/out \
    "$image" bash /kit/run.sh --emulated "$@"
