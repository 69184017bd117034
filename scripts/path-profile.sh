#!/usr/bin/env bash
# The instructions of a small tagged message's calls, per call, counted by callgrind (exact and
# repeatable: the same binary and input give the same count whatever else the machine does),
# for tandem's node-local path and, for comparison, the system's shm provider:
#
#   scripts/path-profile.sh [-b BUILD_DIR] [-i ITERS] [PROVIDER...]   (default: tandem shm)
#
# Runs bench/path_profile (two endpoints of one process ping-pong 8 bytes, one thread) under
# valgrind once per kind of call (PATH_PROFILE_PHASE) and prints, per provider, instructions
# per call of fi_tsend, fi_trecv, the fi_cq_read that delivers a message, the one that returns
# a send's completion, an empty fi_cq_read, and a whole round trip (two messages). The
# breakdown in docs/latency.md was made with it. PATH_PROFILE_LIB=DIR: the providers of
# another build (its lib directory), for a before/after comparison.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$here/../build
iters=20000
while [ $# -gt 0 ]; do
    case $1 in
        -b) build=$2; shift 2 ;;
        -i) iters=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) break ;;
    esac
done
providers=("$@")
[ ${#providers[@]} -gt 0 ] || providers=(tandem shm)
prog=$build/bench/path_profile
[ -x "$prog" ] || { echo "path-profile.sh: $prog not built" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "path-profile.sh: valgrind not found (scripts/install-deps.sh)" >&2; exit 1; }
export FI_PROVIDER_PATH=${PATH_PROFILE_LIB:-$build/lib}
count() {  # PROVIDER PHASE: instructions collected
    PATH_PROFILE_PHASE=$2 valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/dev/null \
        "$prog" -p "$1" -i "$iters" 2>&1 >/dev/null | awk '/Collected :/ { print $NF }'
}
printf "%-10s %10s %10s %10s %10s %10s %12s\n" provider fi_tsend fi_trecv deliver complete empty round_trip
for p in "${providers[@]}"; do
    line=$(printf "%-10s" "$p")
    for phase in send recv deliver complete empty all; do
        n=$(count "$p" "$phase")
        calls=$((2 * iters))
        [ "$phase" = empty ] && calls=$iters
        [ "$phase" = all ] && calls=$iters
        if [ -z "$n" ]; then
            v=FAILED
        else
            v=$(awk -v n="$n" -v c="$calls" 'BEGIN { printf "%.0f", n / c }')
        fi
        w=10
        [ "$phase" = all ] && w=12
        line+=$(printf " %${w}s" "$v")
    done
    echo "$line"
done
