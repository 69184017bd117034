#!/usr/bin/env bash
# Builds the base image debian:bookworm locally when it is absent: no image registry is
# needed, only the Debian package archive. debootstrap makes a minimal bookworm root, which
# `docker import` turns into an image.
#
#   bash docker/make-base.sh [TAG]     (default debian:bookworm; run as root)
set -euo pipefail
tag=${1:-debian:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "make-base: $tag is already there"
    exit 0
fi
command -v debootstrap >/dev/null || {
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap
}
root=$(mktemp -d /var/tmp/tandem-bookworm.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "make-base: debootstrap bookworm from $mirror into $root (a few minutes)"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 || {
    tail -20 "$root.log" >&2
    exit 1
}
rm -f "$root.log"
# The image's apt uses the same archive, so images built on it need no registry either.
echo "deb $mirror bookworm main" >"$root/etc/apt/sources.list"
echo "deb $mirror bookworm-updates main" >>"$root/etc/apt/sources.list"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
echo "make-base: imported $tag ($(docker image inspect -f '{{.Size}}' "$tag") bytes)"
