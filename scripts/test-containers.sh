#!/usr/bin/env bash
# The container benchmarks end to end, on a Debian machine with nothing but the project:
#   1. installs docker.io if missing, and starts dockerd if none runs;
#   2. builds the base image debian:bookworm from the Debian archive if it is absent
#      (docker/make-base.sh: debootstrap, docker import; no registry needed);
#   3. builds the image (docker/Dockerfile: the README's install-deps.sh and build.sh);
#   4. runs docker/bench.sh in every set-up (network, node-local, node-local-staged), with the
#      system's providers beside tandem (--compare: tcp;ofi_rxm, shm), which fails unless
#      every transfer was verified and each set-up took its path, and renders the charts
#      (--plot).
#
#   bash scripts/test-containers.sh [-n RUNS] [docker/bench.sh options...]     (as root)
#
# Takes 5 to 10 minutes the first time (base image, dependencies, compilation), about one
# minute per run of the three set-ups after that. Not part of .ci/run, whose time budget it
# would take; the namespace tests there (tests/namespaces) check the same detection without
# Docker.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "test-containers.sh: run as root (Docker)" >&2; exit 1; }

if ! command -v dockerd >/dev/null; then
    echo "test-containers.sh: installing docker.io"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap gnuplot-nox >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
    echo "test-containers.sh: starting dockerd (log: /var/log/tandem-dockerd.log)"
    nohup dockerd >/var/log/tandem-dockerd.log 2>&1 &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "test-containers.sh: dockerd did not start" >&2; tail /var/log/tandem-dockerd.log >&2; exit 1; }
fi
command -v gnuplot >/dev/null || bash "$repo/scripts/install-deps.sh"

bash "$repo/docker/make-base.sh" debian:bookworm
echo "test-containers.sh: building the image tandem:latest (docker/Dockerfile)"
docker build -q -f "$repo/docker/Dockerfile" -t tandem:latest "$repo" >/dev/null
echo "test-containers.sh: image $(docker image inspect -f '{{.Id}}' tandem:latest | cut -c1-19)," \
    "$(($(docker image inspect -f '{{.Size}}' tandem:latest) / 1000000)) MB"
docker run --rm tandem:latest fi_info -p tandem -t FI_EP_RDM | grep -q 'provider: tandem' ||
    { echo "test-containers.sh: fi_info in the image does not list tandem" >&2; exit 1; }
exec bash "$repo/docker/bench.sh" --compare --plot "$@" network node-local node-local-staged
