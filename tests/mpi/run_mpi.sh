#!/usr/bin/env bash
# usage: run_mpi.sh NP PROGRAM [args...]
# Runs PROGRAM on NP ranks under Open MPI with the ofi MTL forced onto one libfabric provider
# (MPI_TEST_PROVIDER, default tandem; a layered name like "tcp;ofi_rxm" works too), inside
# timeout(1). Fails unless
#   - mpirun exits 0 and the program prints its "PASS" line,
#   - every rank selected pml cm and mtl ofi (a silent fallback to another pml is a failure),
#   - the libfabric core registered the provider, and (for a core provider) no utility
#     provider such as ofi_rxm was layered over it.
set -u
fail() { echo "FAIL: $*" >&2; exit 1; }
[ $# -ge 2 ] || fail "usage: $0 NP PROGRAM [args]"
np=$1 prog=$2
shift 2
prov=${MPI_TEST_PROVIDER:-tandem}
limit=${MPI_TEST_TIMEOUT:-270}
mpirun_bin=${MPIRUN:-mpirun}
case $mpirun_bin in *-NOTFOUND|"") mpirun_bin=mpirun ;; esac
command -v "$mpirun_bin" >/dev/null || fail "mpirun not found (install openmpi-bin)"
[ -x "$prog" ] || fail "$prog is not an executable"

# libfabric must hand Open MPI exactly $prov. For a core provider (tandem) an inclusion filter
# FI_PROVIDER=tandem is not enough: it still admits "tandem;ofi_rxm" (the filter applies to the
# core name), which the core lists first for RDM, and mtl_ofi_provider_include matches only the
# part before ';'. So exclude the utility providers; the include list then leaves only tandem.
# For a layered name ("tcp;ofi_rxm") admit exactly its parts.
core=${prov%%;*}
case $prov in
    *\;*) FI_PROVIDER=${prov//;/,} ;;
    *) FI_PROVIDER="^ofi_rxm,ofi_rxd,ofi_mrail" ;;
esac
export FI_PROVIDER
# Core-level info logging shows which providers the core registered, in each rank.
export FI_LOG_LEVEL=${FI_LOG_LEVEL:-info}
export FI_LOG_SUBSYS=${FI_LOG_SUBSYS:-core}

# The programs' own watchdog fires first and names the step that hung.
export MPI_TEST_WATCHDOG=$((limit > 60 ? limit - 30 : limit / 2))
xargs=(-x FI_PROVIDER -x FI_LOG_LEVEL -x FI_LOG_SUBSYS -x MPI_TEST_WATCHDOG)
[ -n "${FI_PROVIDER_PATH:-}" ] && xargs+=(-x FI_PROVIDER_PATH)
[ -n "${FI_TANDEM_LOCAL:-}" ] && xargs+=(-x FI_TANDEM_LOCAL)

cmd=("$mpirun_bin" --allow-run-as-root --oversubscribe --bind-to none -np "$np"
     --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "$prov"
     --mca pml_base_verbose 10 --mca mtl_base_verbose 10
     "${xargs[@]}" "$prog" "$@")
echo "FI_PROVIDER=$FI_PROVIDER FI_PROVIDER_PATH=${FI_PROVIDER_PATH:-<unset>}"
echo "+ timeout $limit ${cmd[*]}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
timeout -k 10 "$limit" "${cmd[@]}" >"$log" 2>&1
rc=$?

# The program's own lines and anything that looks like an error, in full; the verbose
# selection and log chatter summarised.
grep -v -e '^libfabric:' -e 'mca: base:' -e 'mca:base:select' -e 'select: ' -e 'selected cm best priority' -e $'^\t\t' "$log"
echo "--- selection (from the verbose output):"
grep -E 'select: component (cm|ofi) selected|mtl:ofi:provider:|registering provider: '"$core"'\b' "$log" |
    sed -E 's/^libfabric:[0-9]+:[0-9]+:://' | sort | uniq -c
echo "--- mpirun exited $rc"

status=0
[ "$rc" -eq 124 ] && { echo "FAIL: timed out after $limit s" >&2; status=1; }
[ "$rc" -eq 0 ] || { echo "FAIL: mpirun exited $rc" >&2; status=1; }
name=$(basename "$prog")
grep -q "^$name: PASS" "$log" || { echo "FAIL: $name printed no PASS line" >&2; status=1; }
n=$(grep -c 'select: component cm selected' "$log")
[ "$n" -eq "$np" ] || { echo "FAIL: pml cm selected by $n of $np ranks" >&2; status=1; }
n=$(grep -c 'mtl:ofi:provider:' "$log")
[ "$n" -eq "$np" ] || { echo "FAIL: mtl ofi opened a provider in $n of $np ranks" >&2; status=1; }
n=$(grep -Ec "registering provider: $core \(" "$log")
[ "$n" -ge "$np" ] || { echo "FAIL: libfabric registered provider $core in $n of $np ranks" >&2; status=1; }
case $prov in
    *\;*) ;;
    *)  # No utility provider may have been layered in between: the core logs its calls made
        # on a utility provider's behalf as "libfabric:PID:TIME:ofi_rxm:core:...", and rxm logs
        # its endpoint settings. (Their parameter reads at load time do not count.)
        n=$(grep -Ec '^libfabric:[0-9]+:[0-9]+:(ofi_rxm|ofi_rxd|ofi_mrail):|rxm_ep_settings_init' "$log")
        [ "$n" -eq 0 ] || { echo "FAIL: a utility provider logged $n lines: not plain $prov" >&2; status=1; } ;;
esac
[ "$status" -eq 0 ] && echo "PASS: $name on $np ranks over $prov"
exit "$status"
