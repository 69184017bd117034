#!/usr/bin/env bash
# Builds libfabric 2.6.0 (core, its shm, tcp, rxm and lnx providers, and its fabtests) from
# ../shared/vendor/libfabric-2.6.0.tar.gz into <build>/libfabric-2.6.0, for running tandem
# under a newer core than the system's (docs/compatibility.md). Nothing of it is kept in this
# repository, and nothing is installed outside the build tree.
#
#   scripts/libfabric2.sh [TARBALL]        prints the prefix (<build>/libfabric-2.6.0/prefix)
#
# The build is reused when its stamp names the same tarball content (sha256) and configure
# flags: 134 s on two cores the first time (autogen, configure, make and install of the core
# and of fabtests), nothing after.
#
# Run tandem under it with
#   LD_LIBRARY_PATH=<prefix>/lib FI_PROVIDER_PATH=<build>/lib <prefix>/bin/fi_info -p tandem
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
tarball=${1:-$root/../shared/vendor/libfabric-2.6.0.tar.gz}
[ -f "$tarball" ] || { echo "error: no $tarball" >&2; exit 2; }
tarball=$(cd "$(dirname "$tarball")" && pwd)/$(basename "$tarball")

source "$root/scripts/need-commands.sh"
need_commands autoreconf:autoconf aclocal:automake libtoolize:libtool make:make gcc:gcc \
    g++:g++ pkg-config:pkg-config sha256sum:coreutils tar:tar gzip:gzip

mkdir -p "$build"
build=$(cd "$build" && pwd)
top=$build/libfabric-2.6.0
prefix=$top/prefix
# The providers tandem meets (shm, tcp with rxm, and lnx, which links them); the rest left out
# of the build to keep it short.
configure_flags="--enable-shm --enable-tcp --enable-rxm --enable-lnx --disable-efa --disable-psm2
    --disable-psm3 --disable-opx --disable-cxi --disable-usnic --disable-ucx --disable-verbs
    --disable-lpp --disable-sockets --disable-udp --disable-rxd --disable-mrail --disable-sm2
    --disable-perf --disable-trace --disable-monitor --disable-hook_debug --disable-hook_hmem
    --disable-dmabuf_peer_mem"
configure_flags=$(echo $configure_flags)  # (one line: it is part of the stamp)
sum="$(sha256sum "$tarball" | cut -d' ' -f1) $configure_flags"
if [ "$(cat "$prefix/.sha256" 2>/dev/null)" = "$sum" ] && [ -x "$prefix/bin/fi_info" ] &&
    [ -x "$prefix/bin/runfabtests.sh" ]; then
    echo "$prefix"
    exit 0
fi

log=$top/build.log
rm -rf "$top"
mkdir -p "$top/src"
echo "building libfabric from $tarball in $top (log: $log)" >&2
tar -xf "$tarball" -C "$top/src" --strip-components=1
jobs=$(nproc)
(
    set -e
    cd "$top/src"
    ./autogen.sh
    ./configure --prefix="$prefix" $configure_flags
    make -j"$jobs"
    make install
    cd fabtests
    ./autogen.sh
    ./configure --prefix="$prefix" --with-libfabric="$prefix"
    make -j"$jobs"
    make install
) >"$log" 2>&1 || {
    tail -30 "$log" >&2
    echo "error: building libfabric 2.6.0 failed (log: $log)" >&2
    exit 1
}
echo "$sum" >"$prefix/.sha256"
echo "$prefix"
