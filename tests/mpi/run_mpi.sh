#!/usr/bin/env bash
# usage: run_mpi.sh NP PROGRAM [args...]
# MPI_TEST_MODE=osc: one-sided communication instead, Open MPI's osc rdma over its btl ofi
# forced onto the provider (pml ob1 with btl tcp for the two-sided part, which btl ofi of
# Open MPI 4.1 does not carry); then the checks are that every rank enabled the provider's
# RDM endpoint and that the provider itself executed the program's atomics.
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

# Open MPI is told the provider the way its users tell it: mtl_ofi_provider_include alone.
# For a core provider (tandem) no FI_PROVIDER filter is set: libfabric lists every provider it
# has and Open MPI picks by name (matching the part before ';'), so tandem must not come
# back stacked under ofi_rxm (checked below). For a layered name ("tcp;ofi_rxm") admit
# exactly its parts.
core=${prov%%;*}
case $prov in
    *\;*) export FI_PROVIDER=${prov//;/,} ;;
    *) unset FI_PROVIDER ;;
esac
# Info logging shows which providers the core registered and which endpoints ran, per rank.
export FI_LOG_LEVEL=${FI_LOG_LEVEL:-info}

# The programs' own watchdog fires first and names the step that hung.
export MPI_TEST_WATCHDOG=$((limit > 60 ? limit - 30 : limit / 2))
xargs=(-x FI_LOG_LEVEL -x MPI_TEST_WATCHDOG)
[ -n "${FI_PROVIDER:-}" ] && xargs+=(-x FI_PROVIDER)
[ -n "${FI_PROVIDER_PATH:-}" ] && xargs+=(-x FI_PROVIDER_PATH)
[ -n "${FI_TANDEM_LOCAL:-}" ] && xargs+=(-x FI_TANDEM_LOCAL)
# The verbs link and the emulated RDMA device (scripts/with-emulated-rdma.sh) reach every rank.
for v in FI_TANDEM_LINK FI_TANDEM_VERBS_LIB FI_TANDEM_RDMACM_LIB EMURDMA_NETDEV; do
    [ -n "${!v:-}" ] && xargs+=(-x "$v")
done

# MPI_TEST_PROGRESS=auto: Open MPI asks the provider for automatic progress (its mtl ofi
# parameters), and every rank's domain must have started tandem's progress thread.
progress_args=()
if [ "${MPI_TEST_PROGRESS:-}" = auto ]; then
    progress_args=(--mca mtl_ofi_data_progress auto --mca mtl_ofi_control_progress auto)
fi

mode=${MPI_TEST_MODE:-p2p}
if [ "$mode" = osc ]; then
    # The provider's debug lines name every atomic it executes (checked below); only the data
    # path's, so that few lines of the ranks interleave with the program's output.
    export FI_LOG_LEVEL=debug FI_LOG_SUBSYS=core,ep_ctrl,ep_data
    xargs+=(-x FI_LOG_SUBSYS)
    cmd=("$mpirun_bin" --allow-run-as-root --oversubscribe --bind-to none -np "$np"
         --mca pml ob1 --mca btl self,tcp,ofi --mca osc rdma
         --mca btl_ofi_provider_include "$prov"
         "${xargs[@]}" "$prog" "$@")
else
    cmd=("$mpirun_bin" --allow-run-as-root --oversubscribe --bind-to none -np "$np"
         --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "$prov"
         --mca pml_base_verbose 10 --mca mtl_base_verbose 10 "${progress_args[@]}"
         "${xargs[@]}" "$prog" "$@")
fi
echo "FI_PROVIDER=${FI_PROVIDER:-<unset>} FI_PROVIDER_PATH=${FI_PROVIDER_PATH:-<unset>}"
echo "+ timeout $limit ${cmd[*]}"
# mpirun merges the ranks' streams into one, where a line of one rank can cut into another's
# ("istering provider: tandem" was seen once); the checks below read each rank's own files
# (--output-filename DIR: DIR/<job>/rank.N/{stdout,stderr}), the merged log is for reading.
log=$(mktemp)
ranks_dir=$(mktemp -d)
trap '[ -n "${MPI_KEEP_RANKS:-}" ] || rm -rf "$log" "$ranks_dir"' EXIT
cmd=("${cmd[@]:0:1}" --output-filename "$ranks_dir" "${cmd[@]:1}")
timeout -k 10 "$limit" "${cmd[@]}" >"$log" 2>&1
rc=$?
# The output of rank r: its stdout and stderr.
rank_output() { cat "$ranks_dir"/*/rank."$1"/stdout "$ranks_dir"/*/rank."$1"/stderr 2>/dev/null; }
# Ranks whose own output matches the extended regular expression $1.
ranks_matching() {
    local r n=0
    for ((r = 0; r < np; r++)); do rank_output "$r" | grep -Eq -- "$1" && n=$((n + 1)); done
    echo "$n"
}

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
grep -q "$name: PASS" "$log" || { echo "FAIL: $name printed no PASS line" >&2; status=1; }
if [ "$mode" = osc ]; then
    # Every rank but 0 fetch-adds 500 times into rank 0's window (mpi_osc.c), and each atomic
    # logs one line ("atomic op ..." where it is executed over a link, or where the node-local
    # twin, off_$core, sends it), in the rank that executes or sends it.
    n=$(for ((r = 0; r < np; r++)); do rank_output "$r"; done |
        grep -Ec "^libfabric:[0-9]+:[0-9]+::(off_)?$core:ep_data:[a-z_]+\(\):[0-9]+<debug> atomic op ")
    want=$(((np - 1) * 500))
    [ "$n" -ge "$want" ] || { echo "FAIL: $core logged $n atomics, expected at least $want" >&2; status=1; }
    echo "--- $core carried $n atomic operations"
else
    n=$(ranks_matching 'select: component cm selected')
    [ "$n" -eq "$np" ] || { echo "FAIL: pml cm selected by $n of $np ranks" >&2; status=1; }
    n=$(ranks_matching 'mtl:ofi:provider:')
    [ "$n" -eq "$np" ] || { echo "FAIL: mtl ofi opened a provider in $n of $np ranks" >&2; status=1; }
fi
n=$(ranks_matching "^libfabric:[0-9]+:[0-9]+::core:core:[a-z_]+\(\):[0-9]+<info> registering provider: $core \(")
[ "$n" -eq "$np" ] || { echo "FAIL: libfabric registered provider $core in $n of $np ranks" >&2; status=1; }
case $prov in
    *\;*) ;;
    *)  # No utility provider may have been layered in between: an ofi_rxm endpoint logs its
        # AV and endpoint settings (the core's own lines about rxm, such as parameter reads or
        # layering it skipped, do not count). Every rank enabled tandem's own RDM endpoint.
        n=$(for ((r = 0; r < np; r++)); do rank_output "$r"; done |
            grep -Ec '::(ofi_rxm|ofi_rxd|ofi_mrail):(av|ep_ctrl|ep_data|cq|domain):|rxm_ep_settings_init')
        [ "$n" -eq 0 ] || { echo "FAIL: a utility provider logged $n lines: not plain $prov" >&2; status=1; }
        n=$(ranks_matching "::$core:ep_ctrl:.*RDM endpoint enabled on ${EXPECT_DOMAIN:-}")
        [ "$n" -eq "$np" ] ||
            { echo "FAIL: $n of $np ranks enabled a $core RDM endpoint ${EXPECT_DOMAIN:+on $EXPECT_DOMAIN}" >&2; status=1; }
        if [ "${MPI_TEST_PROGRESS:-}" = auto ]; then
            n=$(ranks_matching "::$core:domain:.*automatic progress \\(thread tandem-progress\\)")
            [ "$n" -eq "$np" ] ||
                { echo "FAIL: $n of $np ranks opened a $core domain with automatic progress" >&2; status=1; }
        fi ;;
esac
[ "$status" -eq 0 ] && echo "PASS: $name on $np ranks over $prov"
exit "$status"
