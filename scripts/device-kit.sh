#!/usr/bin/env bash
# The device kit: everything needed to run tandem's GPU contract on a machine that has nothing
# but an NVIDIA driver (no network, no package registry, no compiler, no libfabric, an unknown
# and possibly older glibc), as files under one folder:
#
#   bash scripts/device-kit.sh            builds build/device-kit/ (at most 48 MiB)
#   bash build/device-kit/run.sh          on the GPU machine (docs/device-kit.md)
#   bash build/device-kit/run.sh --emulated   here, against the emulated driver it carries
#
# What it holds:
#   bin/       the test programs of every suite with real-GPU cases (hmem_transfer, _atomic,
#              _trigger, _coll, _memory_iface, nccl_plugin_test), hmem_bench, tandem_bench,
#              device_probe, and fabtests 1.17.0's device-memory programs built --with-cuda
#   prov/      the providers (FI_PROVIDER_PATH); lib/ also holds the NCCL plugin
#   lib/       the system's libfabric.so.1 and the ldd closure of everything above (libibverbs,
#              librdmacm, libstdc++, glibc) with the dynamic loader: every program runs through
#              the carried loader, so the machine's own glibc does not matter
#   cuda/      libcudart.so of the CUDA whose headers fabtests was built with (fabtests dlopens
#              the runtime; the machine has only the driver)
#   emulated/  the tests' emulated driver and runtime, for --emulated only
#   tools/     patchelf, which run.sh uses to point the programs at the loader where the kit is
#   run.sh     scripts/device-kit-run.sh
# Programs and libraries carry RUNPATH $ORIGIN/../lib (or $ORIGIN), so the kit can sit anywhere;
# only the loader's path is absolute, and run.sh writes it into each program where the kit is.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
vendor=${VENDOR_DIR:-$root/../shared/vendor}
kit=$build/device-kit
work=$build/device-kit-work
max_mib=48

log() { echo "device-kit: $*"; }
die() { echo "device-kit: error: $*" >&2; exit 1; }

# --- tools ----------------------------------------------------------------------------------
source "$root/scripts/need-commands.sh"
need_commands patchelf:patchelf autoreconf:autoconf aclocal:automake libtoolize:libtool

# --- tandem: the providers, the plugin, the programs ----------------------------------------
[ -f "$build/CMakeCache.txt" ] || bash "$root/scripts/build.sh"
programs=(hmem_transfer hmem_atomic hmem_trigger hmem_coll hmem_memory_iface nccl_plugin_test
          hmem_bench tandem_bench device_probe)
log "building tandem's providers and the kit's programs"
cmake --build "$build" -j"$(nproc)" --target tandem-fi off_tandem-fi nccl-net-tandem \
    tandem_emucuda tandem_emucudart "${programs[@]}" >"$build/device-kit-build.log" 2>&1 ||
    { tail -20 "$build/device-kit-build.log" >&2; die "the build failed"; }

# --- fabtests with CUDA ----------------------------------------------------------------------
# CUDA's headers: 11.8's when scripts/cuda-headers.sh brought its runtime headers too (the oldest
# CUDA, so the runtime it needs runs on the most drivers), else the toolkit of these machines.
# Either way with the runtime library of the same CUDA beside them, which the kit carries.
cuda="" cudart=""
for dir in "$build/cuda-headers/11.8" /usr/local/cuda; do
    [ -f "$dir/include/cuda_runtime.h" ] && [ -f "$dir/include/cuda.h" ] || continue
    cudart=$(ls "$dir"/lib64/libcudart.so.[0-9]* "$dir"/lib/libcudart.so.[0-9]* 2>/dev/null |
             sort -V | tail -1 || true)
    [ -n "$cudart" ] && { cuda=$dir; break; }
done
[ -n "$cuda" ] || die "no CUDA headers with cuda_runtime.h and libcudart.so (/usr/local/cuda)"
tarball=$vendor/fabtests-1.17.0.tar.gz
[ -f "$tarball" ] || die "no $tarball"
ft=$work/fabtests
stamp="$(sha256sum "$tarball" | cut -d' ' -f1) $cuda"
if [ "$(cat "$ft/install/.stamp" 2>/dev/null)" != "$stamp" ]; then
    log "building fabtests 1.17.0 --with-cuda=$cuda (about a minute)"
    rm -rf "$ft" && mkdir -p "$ft/obj"
    tar -xzf "$tarball" -C "$ft" && mv "$ft"/fabtests-1.17.0 "$ft/src"
    (cd "$ft/src" && mkdir -p config && autoreconf -ivf) >"$ft/autoreconf.log" 2>&1 ||
        die "fabtests autoreconf failed ($ft/autoreconf.log)"
    (cd "$ft/obj" && ../src/configure --with-libfabric=/usr --with-cuda="$cuda" \
        --prefix="$ft/install") >"$ft/configure.log" 2>&1 ||
        die "fabtests configure failed ($ft/configure.log)"
    make -C "$ft/obj" -j"$(nproc)" install >"$ft/make.log" 2>&1 ||
        { tail -20 "$ft/make.log" >&2; die "fabtests make failed"; }
    echo "$stamp" >"$ft/install/.stamp"
fi
fabtests=(fi_rdm_pingpong fi_rma_bw)

# --- the kit ---------------------------------------------------------------------------------
log "assembling $kit"
rm -rf "$kit"
mkdir -p "$kit"/{bin,prov,lib,cuda,emulated,tools}
for p in "${programs[@]}"; do
    src=$(find "$build/tests" "$build/bench" -maxdepth 2 -type f -name "$p" -perm -u+x | head -1)
    [ -n "$src" ] || die "no program $p in $build"
    cp "$src" "$kit/bin/"
done
for p in "${fabtests[@]}"; do cp "$ft/install/bin/$p" "$kit/bin/"; done
cp "$build/lib/libtandem-fi.so" "$build/lib/liboff_tandem-fi.so" "$kit/prov/"
cp "$build/lib/libnccl-net-tandem.so" "$kit/lib/"
cp -L "$cudart" "$kit/cuda/libcudart.so"
emu=$build/tests/emucuda
cp -L "$emu/libcuda.so.1" "$kit/emulated/libcuda.so.1"
ln -s libcuda.so.1 "$kit/emulated/libcuda.so"
cp -L "$emu/libcudart.so" "$kit/emulated/libcudart.so"
cp "$(command -v patchelf)" "$kit/tools/"
libfabric=$(ldconfig -p | awk '/libfabric\.so\.1 .*x86-64/ {print $NF; exit}')
[ -n "$libfabric" ] || die "the system has no libfabric.so.1 (libfabric1)"
cp -L "$libfabric" "$kit/lib/libfabric.so.1"

# The ldd closure: every library an object of the kit needs, by its soname, until nothing is
# new. The loader itself is the one line of ldd's output without "=>".
closure_pass() {
    local added=0 f line name path
    for f in "$kit"/bin/* "$kit"/prov/* "$kit"/lib/* "$kit"/cuda/* "$kit"/tools/*; do
        [ -f "$f" ] && [ ! -L "$f" ] || continue
        while read -r line; do
            case $line in
                *"=> not found"*) die "$(basename "$f") needs ${line%% *}, which is not found" ;;
                *"=> /"*) name=${line%% *}; path=${line#*=> }; path=${path%% (*} ;;
                /*ld-linux*) path=${line%% (*}; name=$(basename "$path") ;;
                *) continue ;;
            esac
            case $name in libcuda.so*) continue ;; esac  # the machine's driver, never carried
            if [ ! -e "$kit/lib/$name" ]; then
                cp -L "$path" "$kit/lib/$name"
                added=1
            fi
        done < <(ldd "$f" 2>/dev/null || true)
    done
    return $((1 - added))
}
while closure_pass; do :; done
loader=$(cd "$kit/lib" && ls ld-linux-*.so.* | head -1)
[ -n "$loader" ] || die "no dynamic loader in the closure"

# Relocatable: programs find lib/ beside them, libraries each other; symbols and debug
# information stripped (the size limit), except the loader and glibc's own objects, which are
# carried as the system has them.
relocate() {  # relocate RUNPATH FILE...
    local rpath=$1 f
    shift
    for f in "$@"; do
        strip --strip-unneeded "$f" 2>/dev/null || true
        patchelf --set-rpath "$rpath" "$f"
    done
}
relocate '$ORIGIN/../lib' "$kit"/bin/* "$kit"/tools/* "$kit"/prov/* "$kit"/cuda/*.so
for f in "$kit"/lib/*; do
    case $(basename "$f") in ld-linux-*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*) ;;
        *) relocate '$ORIGIN' "$f" ;;
    esac
done
cp "$root/scripts/device-kit-run.sh" "$kit/run.sh"
chmod +x "$kit/run.sh"
{
    echo "tandem device kit, built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "loader lib/$loader; fabtests 1.17.0 built with $cuda (CUDA $(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$cuda/include/cuda.h"))"
    echo "libfabric $(basename "$(readlink -f "$libfabric")") from $libfabric"
} >"$kit/MANIFEST"
(cd "$kit" && find . -type f | sort | xargs sha256sum) >>"$kit/MANIFEST"
mib=$(( $(du -sb "$kit" | cut -f1) / 1048576 ))
log "built $kit: ${mib} MiB, $(find "$kit" -type f | wc -l) files"
[ "$mib" -le "$max_mib" ] || die "the kit is ${mib} MiB, over its ${max_mib} MiB"
