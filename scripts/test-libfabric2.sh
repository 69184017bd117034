#!/usr/bin/env bash
# tandem under libfabric 2.6.0 (docs/compatibility.md): the providers this build made against
# the system's libfabric 1.17 headers, loaded by the 2.6 core that scripts/libfabric2.sh builds
# from ../shared/vendor into the build tree, as a site's newer libfabric would load them.
#
#   scripts/test-libfabric2.sh [-t SETS] [-F] [-H]
#       -t SETS  2.6's fabtests sets (runfabtests.sh -t; default quick: unit, functional, short)
#       -F       without 2.6's fabtests
#       -H       also tandem built against 2.6's headers (step 3b)
#
# In order, each step failing the script:
#  1. the peer-API layouts and the 2.x values tandem keeps (peer/peer_abi_versions.h,
#     common/fabric_compat.h) are those of 2.6's own headers: tests/unit/abi_layouts_2x.cpp
#     compiled against them;
#  2. 2.6's fi_info -p tandem lists tandem's RDM and MSG endpoints;
#  3. the api, peer and clients suites under 2.6's libfabric.so.1 (LD_LIBRARY_PATH; their
#     programs were built against 1.17, as old applications are), with api.api_versions'
#     Core.IsTheOneNamed checking that 2.6 is what they loaded and its Receives tests asking
#     for API 2.0 through that core;
# 3b. a second build of tandem against 2.6's headers and library (cmake
#     -DTANDEM_LIBFABRIC_PREFIX, warnings as errors, in $BUILD_DIR/against-<version>): its
#     providers and NCCL plugin, and 2.6's tagged ping-pong over them, node-local (through
#     off_tandem) and over the TCP link; with -H the whole build, and its api, peer and clients
#     suites under 2.6;
#  4. 2.6's own fabtests (built against 2.6) with -p tandem, node-local and over the TCP link,
#     the two modes at once in namespaces of their own as root (scripts/fabtests.sh -L -P, its
#     lists scripts/fabtests-2.6-*.txt);
#  5. tandem as lnx's network provider (FI_LNX_PROV_LINKS=shm+tandem): a tagged ping-pong
#     between two emulated nodes (UTS namespaces), each end's log saying that tandem takes
#     its receives from lnx's SRX (fi_peer(3));
#  6. 2.6's fabtests quick set with -p lnx over shm+tandem on the two emulated nodes
#     (scripts/fabtests.sh -m lnx), also with -F.
# Costs on two cores: the 2.6 build 134 s once (reused after), steps 1 and 2 a few seconds,
# step 3 about 55 s, step 3b 110 s (the providers against 2.6's headers; with -H the whole
# build 371 s and its suites 41 s), step 4 with the quick set 246 s as root (the modes at
# once; one after the other 477 s), steps 5 and 6 about 60 s; measured on the quiet machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
fabtests=1
sets=quick
headers=0
while getopts "t:FH" opt; do
    case $opt in
        t) sets=$OPTARG ;;
        F) fabtests=0 ;;
        H) headers=1 ;;
        *) echo "usage: $0 [-t SETS] [-F] [-H]" >&2; exit 2 ;;
    esac
done
[ -f "$build/lib/libtandem-fi.so" ] || { echo "error: build tandem first (scripts/build.sh)" >&2; exit 2; }

prefix=$(BUILD_DIR="$build" bash "$root/scripts/libfabric2.sh")
version=$(sed -n 's/^Version: *//p' "$prefix/lib/pkgconfig/libfabric.pc")
echo "== libfabric $version in $prefix"

echo "== 1. layouts against $version's headers"
g++ -std=c++20 -fsyntax-only -I"$root" -I"$prefix/include" "$root/tests/unit/abi_layouts_2x.cpp"

echo "== 2. fi_info -p tandem ($version's)"
listing=$(LD_LIBRARY_PATH=$prefix/lib FI_PROVIDER_PATH=$build/lib "$prefix/bin/fi_info" -p tandem)
for type in FI_EP_RDM FI_EP_MSG; do
    grep -q "type: $type" <<<"$listing" || {
        echo "error: $version's fi_info lists no tandem $type endpoint:" >&2
        echo "$listing" >&2
        exit 1
    }
done
echo "tandem listed: $(grep -c '^provider: tandem' <<<"$listing") entries"

echo "== 3. api, peer and clients suites under $version"
(
    export LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export TANDEM_EXPECT_CORE=${version%.*}
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    ctest --test-dir "$build" -L '^(api|peer|clients)$' --output-on-failure --timeout 300 -j2
)

# The second build: its providers always (warnings as errors), checked by 2.6's own programs;
# with -H everything, and its suites run.
against=$build/against-$version
echo "== 3b. tandem built against $version's headers and library ($against)"
cmake -S "$root" -B "$against" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTANDEM_LIBFABRIC_PREFIX="$prefix" -DCMAKE_COMPILE_WARNING_AS_ERROR=ON >/dev/null
targets=(--target tandem-fi off_tandem-fi nccl-net-tandem)
[ $headers -eq 0 ] || targets=()
cmake --build "$against" -j"$(nproc)" "${targets[@]}" >"$against.log" 2>&1 || {
    tail -40 "$against.log" >&2
    echo "error: the build against $version's headers failed ($against.log)" >&2
    exit 1
}
# A ping-pong between two processes over those providers, node-local (the node-local
# channel's log must name the peer) and over the TCP link.
pp_env=(LD_LIBRARY_PATH="$prefix/lib" FI_PROVIDER_PATH="$against/lib" FI_LOG_LEVEL=info)
pp=("$prefix/bin/fi_rdm_tagged_pingpong" -p tandem -I 1000 -S 1024)
pp_out=$(mktemp -d)
for local in 1 0; do
    env "${pp_env[@]}" FI_TANDEM_LOCAL=$local timeout 60 "${pp[@]}" >"$pp_out/server" 2>&1 &
    server=$!
    sleep 0.5
    env "${pp_env[@]}" FI_TANDEM_LOCAL=$local timeout 60 "${pp[@]}" 127.0.0.1 >"$pp_out/client" 2>&1 ||
        { cat "$pp_out/client" >&2; exit 1; }
    wait "$server" || { cat "$pp_out/server" >&2; exit 1; }
    if [ $local -eq 1 ] && ! grep -q "node-local peer" "$pp_out/client"; then
        echo "error: the node-local ping-pong did not go through the node-local channel:" >&2
        cat "$pp_out/client" >&2
        exit 1
    fi
    echo "$( [ $local -eq 1 ] && echo node-local || echo 'TCP link  '): $(grep -E '^1k ' "$pp_out/client")"
done
rm -rf "$pp_out"
if [ $headers -eq 1 ]; then
    (
        export LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export TANDEM_EXPECT_CORE=${version%.*}
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        ctest --test-dir "$against" -L '^(api|peer|clients)$' --output-on-failure --timeout 300 -j2
    )
fi

if [ $fabtests -eq 1 ]; then
    echo "== 4. $version's fabtests, -p tandem"
    BUILD_DIR="$build" bash "$root/scripts/fabtests.sh" -L "$prefix" -t "$sets" -m local,tcp -P
fi

echo "== 5. tandem under $version's lnx, linked with shm (FI_LNX_PROV_LINKS=shm+tandem)"
if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null; then
    echo "skipped: two nodes are emulated with UTS namespaces (unshare -u), which needs root"
    exit 0
fi
# A ping-pong between two "nodes" (each process in a UTS namespace with a hostname of its own,
# so lnx sends over its network provider, not shm): both ends must say that tandem's endpoint
# takes its receives from lnx's SRX, and the latency is shown (a few microseconds over
# tandem's TCP link, where shm would take well under one).
lnx_env=(LD_LIBRARY_PATH="$prefix/lib" FI_PROVIDER_PATH="$build/lib" FI_LNX_PROV_LINKS=shm+tandem
         FI_LOG_LEVEL=info FI_LOG_PROV=tandem)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ping=("$prefix/bin/fi_rdm_tagged_pingpong" -p lnx -E -I 1000 -S 64 -s 127.0.0.1)
env "${lnx_env[@]}" timeout 60 unshare -u bash -c 'hostname tandem-node-a && exec "$@"' _ \
    "${ping[@]}" >"$out/server" 2>&1 &
server=$!
sleep 0.5
env "${lnx_env[@]}" timeout 60 unshare -u bash -c 'hostname tandem-node-b && exec "$@"' _ \
    "${ping[@]}" 127.0.0.1 >"$out/client" 2>&1 || { cat "$out/client" >&2; exit 1; }
wait "$server" || { cat "$out/server" >&2; exit 1; }
for side in server client; do
    grep -q "receives matched by the owner of a peer SRX" "$out/$side" || {
        echo "error: the $side's tandem endpoint did not take lnx's SRX:" >&2
        cat "$out/$side" >&2
        exit 1
    }
done
grep -E '^(bytes|64) ' "$out/client"
echo "== 6. $version's fabtests, -p lnx over shm+tandem on two emulated nodes"
BUILD_DIR="$build" bash "$root/scripts/fabtests.sh" -L "$prefix" -t quick -m lnx
