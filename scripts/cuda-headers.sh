#!/usr/bin/env bash
# Puts CUDA 11.8's headers (Debian bookworm's non-free nvidia-cuda-dev) under
# build/cuda-headers/11.8/include, for the check of hmem/cuda_abi.h against a second CUDA
# (tests/unit/test_cuda_abi.cpp). Reuses them when already there. The system's apt
# configuration is left alone: the package is downloaded through a private sources list,
# package lists and cache in a scratch directory, and only its headers are unpacked (cuda.h,
# cudaTypedefs.h, and cuda_runtime.h with what it includes, for builds against 11.8's
# runtime API). Costs about 35 s (a 774 MB download) the first time, nothing afterwards.
#   scripts/cuda-headers.sh [DEST]   DEST defaults to build/cuda-headers/11.8
# Exits 1 when the package cannot be had (archive unreachable...): the reason is printed and
# kept in DEST.skip-reason, which the 11.8 check's ctest reports as its reason to skip.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/build/cuda-headers/11.8}
reason_file=$dest.skip-reason

if [ -f "$dest/include/cuda.h" ] && [ -f "$dest/include/cudaTypedefs.h" ]; then
    echo "cuda-headers: CUDA 11.8 headers already in $dest/include"
    exit 0
fi

mkdir -p "$(dirname "$dest")"
work=$(mktemp -d "$(dirname "$dest")/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The first error or warning of an apt log, on one line.
first_complaint() { grep -m1 -E '^(E|W|Err):' "$1" | tr -s ' \t' ' ' || tail -n1 "$1"; }

fail() {
    echo "cuda-headers: $1" >&2
    echo "$1" >"$reason_file"
    exit 1
}

# The bookworm suite of the archive the system already uses (its deb822 or one-line sources),
# non-free component only; CUDA_HEADERS_ARCHIVE=URL names another.
mirror=${CUDA_HEADERS_ARCHIVE:-}
[ -n "$mirror" ] || mirror=$(grep -rhoE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d \
    2>/dev/null | head -n1 | tr -d ' ' || true)
[ -n "$mirror" ] || fail "no Debian archive in the system's apt sources to fetch nvidia-cuda-dev from"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
signed=""
[ -f "$keyring" ] && signed="[signed-by=$keyring] "
echo "deb ${signed}${mirror%/} bookworm non-free" >"$work/sources.list"
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"

apt_private=(
    -o "Dir::Etc::SourceList=$work/sources.list"
    -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$work/lists"
    -o "Dir::Cache=$work/cache"
    -o Acquire::Retries=1
    -o Acquire::http::Timeout=30
    -o APT::Sandbox::User=root
)
apt-get "${apt_private[@]}" -qq --error-on=any update >"$work/update.log" 2>&1 ||
    fail "apt-get update of the bookworm non-free list failed: $(first_complaint "$work/update.log")"
(cd "$work" && apt-get "${apt_private[@]}" -qq download nvidia-cuda-dev >"$work/download.log" 2>&1) ||
    fail "downloading nvidia-cuda-dev failed: $(first_complaint "$work/download.log")"
deb=$(find "$work" -maxdepth 1 -name "nvidia-cuda-dev_*.deb" | head -n1)
[ -n "$deb" ] || fail "apt-get download left no nvidia-cuda-dev .deb"

# One decompression pass: cuda.h and cudaTypedefs.h, and the runtime API's headers
# (cuda_runtime.h, cuda_runtime_api.h and what they include: crt/, the vector and builtin
# types, the texture and surface headers...), i.e. the top level of /usr/include and crt/.
mkdir -p "$work/root"
dpkg-deb --fsys-tarfile "$deb" |
    tar -x -C "$work/root" --wildcards --no-wildcards-match-slash \
        './usr/include/*.h' './usr/include/*.hpp' './usr/include/crt/*' ||
    fail "unpacking the headers of $(basename "$deb") failed"
[ -f "$work/root/usr/include/cuda.h" ] || fail "$(basename "$deb") holds no usr/include/cuda.h"
version=$(awk '$1 == "#define" && $2 == "CUDA_VERSION" {print $3}' "$work/root/usr/include/cuda.h")

rm -rf "$dest"
mkdir -p "$dest"
mv "$work/root/usr/include" "$dest/include"
rm -f "$reason_file"
echo "cuda-headers: $(basename "$deb") (CUDA_VERSION $version): $(find "$dest/include" -type f | wc -l) headers in $dest/include"
