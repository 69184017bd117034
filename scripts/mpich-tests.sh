#!/usr/bin/env bash
# usage: mpich-tests.sh SRC_DIR [-m MODULES] [-p MODES] [-n NPS] [-t SECONDS] [-o OUTDIR] [-R N]
#                         [-k REGEX] [-r]
#
# MPICH's test suite (test/mpi of pmodels/mpich, tag v4.3.2) against the system's Open MPI 4.1
# over tandem, with the system's tcp;ofi_rxm as the reference (docs/mpi-suites.md).
#
# SRC_DIR is a tree holding test/mpi, maint/version.m4 and confdb of MPICH, e.g.
#   git -C MPICH_CLONE archive v4.3.2 test/mpi maint/version.m4 confdb | tar -x -C SRC_DIR
# (or test/mpi itself). Nothing of it is copied into this repository: the suite is generated
# in SRC_DIR (autogen.sh, once) and configured and built out of tree in
# ${BUILD_DIR:-build}/mpich-tests (configured once, each module built when it is run).
#
# The tests run through the suite's own runner (test/mpi/runtests), module by module (a
# module is a directory of test/mpi with its testlist), with -maxnp=NP: a test listed for
# more than NP ranks runs on NP (runtests lowers it, it does not skip it). Its mpiexec is a
# wrapper (written into the build directory) that runs Open MPI's mpirun
# --allow-run-as-root --oversubscribe --bind-to none with, per mode,
#   local  -x FI_PROVIDER_PATH=<build>/lib, pml cm, mtl ofi, mtl_ofi_provider_include tandem
#          (tandem's node-local path)
#   tcp    the same with -x FI_TANDEM_LOCAL=0 (tandem's TCP link)
#   rxm    pml cm, mtl ofi over the system's tcp;ofi_rxm (the reference)
#   vader  pml ob1, btl self,vader (no libfabric: Open MPI's own shared memory; optional, to
#          tell a failure of Open MPI or of the suite from a provider's)
# and kills a test after SECONDS (default 60), printing the backtraces of its ranks
# (gdb "thread apply all bt", saved under OUTDIR/bt) first.
#
# Options:
#   -m MODULES  comma-separated directories of test/mpi (default: comm,pt2pt,group,topo,attr,
#               init,info,errhan,coll,datatype)
#   -p MODES    comma-separated among local,tcp,rxm,vader (default: local,tcp,rxm)
#   -n NPS      comma-separated maximum rank counts (default: 4,2)
#   -t SECONDS  time limit of one test (default 60)
#   -o OUTDIR   results (default: ${BUILD_DIR:-build}/mpich-tests/results)
#   -R N        a test that fails over tandem but passes over rxm is run N more times in that
#               mode and over rxm (default 2): if it fails over rxm too it is flaky in Open MPI
#               or the test, not a tandem-only failure
#   -k REGEX    only the testlist entries whose program name matches REGEX (awk), e.g.
#               -m coll -k '^ic' for the intercommunicator collectives (a module's results
#               replace its earlier ones in OUTDIR: give a subset its own -o)
#   -r          report only: print the tables of the results already in OUTDIR
#
# The testlist is run as MPICH lists it, but for two things: an entry that differs from an
# earlier one only in MPIR_CVAR_ environment (MPICH's algorithm selections, which Open MPI
# ignores: the same program on the same ranks again) is left out, and the time limit of one
# test is SECONDS, or its testlist timeLimit when that is over runtests' default 180 s (up to
# 300 s).
#
# Prints, per rank count and module, the tests run and passed per mode and how long each mode
# took, the tests that fail on the reference too (with the first line of what they said), and
# the tests that pass over rxm but fail over tandem. Exits 1 if there is any of the last.
set -u
export LC_ALL=C # the compilers' messages (quoted in the reasons) in ASCII

die() { echo "mpich-tests: $*" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
modules=comm,pt2pt,group,topo,attr,init,info,errhan,coll,datatype
modes=local,tcp,rxm
nps=4,2
limit=60
outdir=
report_only=0
reruns=2
keep=

[ $# -ge 1 ] || die "usage: $0 SRC_DIR [-m MODULES] [-p MODES] [-n NPS] [-t SECONDS] [-o OUTDIR] [-R N] [-k REGEX] [-r]"
src=$1
shift
while getopts "m:p:n:t:o:rR:k:" o; do
    case $o in
        m) modules=$OPTARG ;;
        p) modes=$OPTARG ;;
        n) nps=$OPTARG ;;
        t) limit=$OPTARG ;;
        o) outdir=$OPTARG ;;
        r) report_only=1 ;;
        R) reruns=$OPTARG ;;
        k) keep=$OPTARG ;;
        *) die "unknown option" ;;
    esac
done
IFS=, read -r -a modules <<<"$modules"
IFS=, read -r -a modes <<<"$modes"
IFS=, read -r -a nps <<<"$nps"
for m in "${modes[@]}"; do
    case $m in local | tcp | rxm | vader) ;; *) die "unknown mode $m" ;; esac
done

[ -d "$src/test/mpi" ] && src=$src/test/mpi
[ -f "$src/configure.ac" ] && [ -f "$src/runtests" ] || die "$src holds no MPICH test/mpi"
src=$(cd "$src" && pwd)
build=${BUILD_DIR:-$here/build}
case $build in /*) ;; *) build=$here/$build ;; esac
lib=$build/lib
bdir=$build/mpich-tests
outdir=${outdir:-$bdir/results}
mkdir -p "$outdir/bt" "$outdir/logs"
results=$outdir/results.tsv

# --- the suite: generated once, configured once -------------------------------------------
if [ $report_only -eq 0 ]; then
    [ -f "$lib/libtandem-fi.so" ] || die "$lib/libtandem-fi.so missing (build the providers first)"
    command -v mpicc >/dev/null && command -v mpirun >/dev/null ||
        die "mpicc/mpirun missing (apt-get install openmpi-bin libopenmpi-dev)"
    if [ ! -x "$src/configure" ]; then
        for t in autoconf automake libtoolize python3 perl; do
            command -v $t >/dev/null || die "$t missing (apt-get install autoconf automake libtool python3 perl)"
        done
        # autogen.sh takes version.m4 and confdb from ../../maint and ../../confdb.
        [ -e "$src/version.m4" ] || [ -e "$src/../../maint/version.m4" ] ||
            die "no maint/version.m4 beside test/mpi (git archive v4.3.2 test/mpi maint/version.m4 confdb)"
        [ -e "$src/confdb" ] || [ -e "$src/../../confdb" ] ||
            die "no confdb beside test/mpi (git archive v4.3.2 test/mpi maint/version.m4 confdb)"
        echo "== autogen.sh in $src"
        (cd "$src" && sh autogen.sh) >"$outdir/logs/autogen.log" 2>&1 ||
            die "autogen.sh failed, see $outdir/logs/autogen.log"
    fi
    if [ ! -f "$bdir/Makefile" ]; then
        # C only; --enable-strictmpi leaves out the tests of MPICH's extensions (MPIX_);
        # no dtpools (its generated datatype tests), spawn, fault tolerance or performance tests.
        echo "== configure in $bdir"
        mkdir -p "$bdir"
        (cd "$bdir" && "$src/configure" --with-mpi=/usr --disable-fortran --disable-cxx \
            --enable-strictmpi --disable-dtpools --disable-spawn --disable-ft-tests \
            --disable-perftest) >"$outdir/logs/configure.log" 2>&1 ||
            die "configure failed, see $outdir/logs/configure.log"
    fi
    if [ ! -f "$bdir/util/.built" ]; then
        make -j2 -C "$bdir/util" >"$outdir/logs/build-util.log" 2>&1 ||
            die "building util failed, see $outdir/logs/build-util.log"
        touch "$bdir/util/.built"
    fi
fi

# --- mpiexec as the runner calls it: WRAPPER -n NP ./program args ---------------------------
wrapper=$bdir/mpiexec-wrapper
# Written to a new file and renamed, so that a run going on meanwhile never reads half of it.
[ $report_only -eq 0 ] && cat >"$wrapper.new" <<EOF
#!/usr/bin/env bash
# Written by scripts/mpich-tests.sh: Open MPI's mpirun for MPICH's runtests, per mode
# (MPICH_TESTS_MODE), killed after MPICH_TESTS_LIMIT seconds with its ranks' backtraces kept.
mode=\${MPICH_TESTS_MODE:?}
limit=\${MPICH_TESTS_LIMIT:-60}
# A test given a longer timeLimit in its testlist than runtests' default (180 s; runtests
# passes it as MPIEXEC_TIMEOUT) gets that.
t=\${MPIEXEC_TIMEOUT:-180}
t=\${t%.*}
[ "\$t" -gt 300 ] && t=300
[ "\$t" -gt 180 ] && [ "\$t" -gt "\$limit" ] && limit=\$t
lib=$lib
btdir=$outdir/bt
EOF
[ $report_only -eq 0 ] && cat >>"$wrapper.new" <<'EOF'
args=(--allow-run-as-root --oversubscribe --bind-to none)
case $mode in
    local) args+=(-x FI_PROVIDER_PATH=$lib --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include tandem) ;;
    tcp) args+=(-x FI_PROVIDER_PATH=$lib -x FI_TANDEM_LOCAL=0 --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include tandem) ;;
    rxm) args+=(-x FI_PROVIDER=tcp,ofi_rxm --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "tcp;ofi_rxm") ;;
    vader) args+=(--mca pml ob1 --mca btl self,vader) ;;
esac
# Environment the testlist asks for (runtests sets it in our environment) reaches the ranks.
for v in $(compgen -e); do
    case $v in MPIR_CVAR_* | MPITEST_* | MPIR_* ) args+=(-x "$v") ;; esac
done
# mpirun leads a session of its own (setsid), so that it and its ranks can be ended by id.
flag=$(mktemp)
rm -f "$flag"
setsid mpirun "${args[@]}" "$@" &
pid=$!
prog=
for a in "$@"; do case $a in ./*) prog=${a#./}; break ;; esac; done
np=$2
bt=$btdir/$(basename "$PWD")-$prog-np$np-$mode.bt
# The watchdog: after the limit, the ranks' stacks (children of mpirun), then mpirun's process
# group and the ranks killed by id.
(
    sleep "$limit"
    kill -0 $pid 2>/dev/null || exit 0
    touch "$flag"
    ranks=$(pgrep -P $pid)
    : >"$bt"
    for r in $ranks; do
        echo "=== rank pid $r: $(tr '\0' ' ' </proc/$r/cmdline 2>/dev/null)" >>"$bt"
        timeout 30 gdb -p "$r" -batch -nx -ex "set pagination off" -ex "thread apply all bt" \
            </dev/null >>"$bt" 2>&1
    done
    kill -TERM -- -$pid $ranks 2>/dev/null
    sleep 2
    kill -KILL -- -$pid $ranks 2>/dev/null
) </dev/null >/dev/null 2>&1 &
w=$!
wait $pid 2>/dev/null
rc=$?
if [ -e "$flag" ]; then
    wait $w
    rm -f "$flag"
    echo "TIMEOUT: $prog on $np ranks ($mode) still running after $limit s; backtraces in $bt"
    exit 124
fi
kill $(pgrep -P $w) $w 2>/dev/null
wait $w 2>/dev/null
exit $rc
EOF
if [ $report_only -eq 0 ]; then
    chmod +x "$wrapper.new"
    mv "$wrapper.new" "$wrapper"
fi

# --- the selection: every rank on the intended provider (checked once per mode) ------------
check_selection() {
    local mode=$1 log=$outdir/logs/selection-$mode.log want n
    case $mode in
        local | tcp) want=tandem ;;
        rxm) want='tcp;ofi_rxm' ;;
        vader) want= ;;
    esac
    [ -n "$want" ] || return 0
    [ -x "$bdir/comm/dup" ] || make -C "$bdir/comm" dup >/dev/null 2>&1
    (cd "$bdir/comm" && MPICH_TESTS_MODE=$mode "$wrapper" -n 2 --mca mtl_base_verbose 10 \
        -x FI_LOG_LEVEL=info ./dup) >"$log" 2>&1
    # As tests/mpi/run_mpi.sh checks: mtl ofi opened a provider in every rank; for tandem,
    # every rank registered it and enabled its own RDM endpoint, with no utility provider
    # layered in between; for the reference, every rank set up an ofi_rxm endpoint.
    n=$(grep -c "mtl:ofi:provider: " "$log")
    [ "$n" -eq 2 ] || die "mode $mode: mtl ofi opened a provider in $n of 2 ranks (see $log)"
    if [ "$want" = tandem ]; then
        n=$(grep -Ec "registering provider: tandem \(" "$log")
        [ "$n" -ge 2 ] || die "mode $mode: libfabric registered tandem in $n of 2 ranks (see $log)"
        n=$(grep -Ec '::(ofi_rxm|ofi_rxd|ofi_mrail):(av|ep_ctrl|ep_data|cq|domain):|rxm_ep_settings_init' "$log")
        [ "$n" -eq 0 ] || die "mode $mode: a utility provider logged $n lines (see $log)"
        n=$(grep -Ec "::tandem:ep_ctrl:.*RDM endpoint enabled on" "$log")
        [ "$n" -ge 2 ] || die "mode $mode: $n of 2 ranks enabled a tandem RDM endpoint (see $log)"
    else
        n=$(grep -c 'rxm_ep_settings_init' "$log")
        [ "$n" -ge 2 ] || die "mode rxm: $n of 2 ranks set up an ofi_rxm endpoint (see $log)"
    fi
    echo "   selection $mode: both ranks on $want $(grep -Eo 'RDM endpoint enabled on [^ ,]*' "$log" | sort -u | sed 's/^/(/;s/$/)/')"
}

# --- one module at one np in one mode: runtests, then its TAP into results.tsv --------------
run_module() {
    local mod=$1 np=$2 mode=$3 tap t0 t1
    tap=$outdir/logs/$mod-np$np-$mode.tap
    t0=$(date +%s)
    (cd "$bdir/$mod" && MPICH_TESTS_MODE=$mode MPICH_TESTS_LIMIT=$limit \
        perl "$src/runtests" -srcdir="$src/$mod" -tests=testlist.run -mpiexec="$wrapper" \
        -maxnp="$np" -tapfile="$tap") >"$outdir/logs/$mod-np$np-$mode.out" 2>&1
    t1=$(date +%s)
    # Results: np module mode seq test status reason; one line per runtests entry.
    awk -v np="$np" -v mod="$mod" -v mode="$mode" -v secs=$((t1 - t0)) '
        function flush() {
            if (name == "") return
            printf "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", np, mod, mode, seq, name, st, why
            name = ""
        }
        /^(not )?ok [0-9]+ - / {
            flush()
            st = ($1 == "not") ? "fail" : "pass"
            i = ($1 == "not") ? 3 : 2
            seq = $i
            p = $(i + 2); sub(/^.*\//, "", p)
            name = p "(" $(i + 3) ")"
            why = ""
            if ($0 ~ /# SKIP/) { st = "skip"; why = $0; sub(/^.*# SKIP /, "", why) }
            next
        }
        /^## / && st == "fail" && why == "" {
            l = substr($0, 4)
            if (l ~ /^Test output|^[ \t]*$|^-+$|^Program .* exited without No Errors|^ *No Errors/) next
            if (l ~ /^Failed to build/) {
                why = "build failed"
                next
            }
            why = l
            next
        }
        /^## / && why == "build failed" && /undefined reference to/ {
            l = $0; sub(/^.*undefined reference to ./, "", l); sub(/.$/, "", l)
            why = "build failed: " l " missing"
        }
        /^## / && why == "build failed" && /error: static assertion failed: "MPI_[A-Za-z_]+ was removed/ {
            l = $0; sub(/^.*failed: "/, "", l); sub(/ was removed.*$/, "", l)
            why = "build failed: " l " (removed in MPI-3.0) refused by Open MPI'"'"'s mpi.h"
        }
        /^## / && why == "build failed" && /(error|warning): implicit declaration of function/ {
            l = $0; sub(/^.*of function ./, "", l); sub(/.;.*$/, "", l)
            why = "build failed: " l " undeclared"
        }
        END { flush(); printf "#time\t%s\t%s\t%s\t%d\n", np, mod, mode, secs }
    ' "$tap" | sed 's/\t\t*$//' >>"$results.new"
}

# testlist.run: the module's testlist (generated by configure, or the source's), comments and
# blank lines out (so that runtests' Nth test is its Nth line), without the entries that differ
# from an earlier one only in MPIR_CVAR_ settings.
make_testlist() {
    local mod=$1 f=$bdir/$1/testlist
    [ -f "$f" ] || f=$src/$1/testlist
    awk -v keep="$keep" '{ sub(/#.*/, ""); sub(/^[ \t]+/, "") } NF && (keep == "" || $1 ~ keep) {
        k = ""
        for (i = 1; i <= NF; i++) if ($i !~ /^env=MPIR_CVAR_/) k = k " " $i
        if (k in seen) { dropped++; next }
        seen[k] = 1; print
    } END { printf "%d\n", dropped > "/dev/stderr" }' "$f" >"$bdir/$mod/testlist.run" 2>"$bdir/$mod/testlist.dropped"
}

# rerun MOD NP MODE SEQ: the SEQth test of testlist.run once more; prints pass or fail.
rerun() {
    local mod=$1 np=$2 mode=$3 seq=$4 tap
    sed -n "${seq}p" "$bdir/$mod/testlist.run" >"$bdir/$mod/testlist.rerun"
    tap=$outdir/logs/rerun.tap
    (cd "$bdir/$mod" && MPICH_TESTS_MODE=$mode MPICH_TESTS_LIMIT=$limit \
        perl "$src/runtests" -srcdir="$src/$mod" -tests=testlist.rerun -mpiexec="$wrapper" \
        -maxnp="$np" -tapfile="$tap") >>"$outdir/logs/reruns.out" 2>&1
    if grep -q "^ok 1 " "$tap"; then echo pass; else echo fail; fi
}

# The tests of MOD at NP that failed over tandem and passed over rxm, run again.
rerun_suspects() {
    local mod=$1 np=$2 seq name mode r i line
    [ "$reruns" -gt 0 ] || return 0
    awk -F'\t' -v np="$np" -v mod="$mod" '
        $1 == np && $2 == mod { st[$4 "\t" $5, $3] = $6; k[$4 "\t" $5] = 1 }
        END { for (t in k) if (st[t, "rxm"] == "pass")
                  for (m in st) { split(m, a, SUBSEP)
                      if (a[1] == t && (a[2] == "local" || a[2] == "tcp") && st[m] == "fail") print t "\t" a[2] } }
    ' "$results" | sort -n | while IFS=$'\t' read -r seq name mode; do
        line="$np\t$mod\t$seq\t$name"
        for r in "$mode" rxm; do
            local p=0
            for i in $(seq "$reruns"); do [ "$(rerun "$mod" "$np" "$r" "$seq")" = pass ] && p=$((p + 1)); done
            echo "   rerun $name at np <= $np over $r: $p of $reruns passed"
            line="$line\t$r=$p/$reruns"
        done
        # one line per test and tandem mode: np mod seq name MODE=p/n rxm=p/n
        awk -F'\t' -v np="$np" -v mod="$mod" -v seq="$seq" -v m="$mode" \
            '!($1 == np && $2 == mod && $3 == seq && index($5, m "=") == 1)' "$reruns_tsv" >"$reruns_tsv.tmp" 2>/dev/null
        mv "$reruns_tsv.tmp" "$reruns_tsv"
        printf "$line\n" >>"$reruns_tsv"
    done
}
reruns_tsv=$outdir/reruns.tsv
touch "$reruns_tsv"

if [ $report_only -eq 0 ]; then
    for mode in "${modes[@]}"; do check_selection "$mode"; done
    for np in "${nps[@]}"; do
        for mod in "${modules[@]}"; do
            [ -d "$src/$mod" ] || die "no module $mod in $src"
            make_testlist "$mod"
            if [ -n "$keep" ]; then
                # only the programs of the entries kept
                make -k -j2 -C "$bdir/$mod" $(awk '{ print $1 }' "$bdir/$mod/testlist.run" | sort -u) \
                    >"$outdir/logs/build-$mod-part.log" 2>&1
            elif [ ! -f "$bdir/$mod/.built" ]; then
                echo "== building $mod"
                # -k: a test that does not build (an MPI 4.0 function Open MPI 4.1 lacks) is
                # reported by runtests as failed, the others still run.
                make -k -j2 -C "$bdir/$mod" >"$outdir/logs/build-$mod.log" 2>&1
                touch "$bdir/$mod/.built"
            fi
            echo "   $mod: $(wc -l <"$bdir/$mod/testlist.run") tests listed, $(cat "$bdir/$mod/testlist.dropped") MPIR_CVAR_ variants left out"
            for mode in "${modes[@]}"; do
                echo "== $mod, np <= $np, $mode ($(date -u +%H:%M:%S))"
                : >"$results.new"
                run_module "$mod" "$np" "$mode"
                # Earlier results of the same module, np and mode are replaced.
                if [ -f "$results" ]; then
                    awk -F'\t' -v np="$np" -v mod="$mod" -v mode="$mode" '
                        !(($1 == np && $2 == mod && $3 == mode) ||
                          ($1 == "#time" && $2 == np && $3 == mod && $4 == mode))' \
                        "$results" >"$results.tmp"
                    mv "$results.tmp" "$results"
                fi
                cat "$results.new" >>"$results"
                rm -f "$results.new"
                awk -F'\t' -v np="$np" -v mod="$mod" -v mode="$mode" '
                    $1 == np && $2 == mod && $3 == mode { n[$6]++ }
                    $1 == "#time" && $2 == np && $3 == mod && $4 == mode { s = $5 }
                    END { printf "   %d pass, %d fail, %d skipped, %d s\n", n["pass"], n["fail"], n["skip"], s }
                ' "$results"
            done
            case " ${modes[*]} " in *" rxm "*) rerun_suspects "$mod" "$np" ;; esac
        done
    done
fi

# --- the tables -----------------------------------------------------------------------------
[ -s "$results" ] || die "no results in $results"
awk -F'\t' '
    function fmt(s) { return sprintf("%dm%02ds", s / 60, s % 60) }
    FILENAME == rr {
        # np mod seq name MODE=p/n rxm=p/n
        split($5, a, "="); split($6, b, "=")
        rer[$1 SUBSEP $2 SUBSEP $3 SUBSEP $4 SUBSEP a[1]] = $5 ", rxm " b[2]
        split(b[2], c, "/"); if (c[1] < c[2]) rflaky[$1 SUBSEP $2 SUBSEP $3 SUBSEP $4 SUBSEP a[1]] = 1
        next
    }
    $1 == "#time" { secs[$2 SUBSEP $3 SUBSEP $4] = $5; next }
    {
        np = $1; mod = $2; mode = $3; key = $4 SUBSEP $5
        k = np SUBSEP mod
        if (!(k in seen)) { seen[k] = 1; order[++nk] = k }
        if (!((k SUBSEP mode) in hasmode)) { hasmode[k SUBSEP mode] = 1; modes[k] = modes[k] " " mode }
        if (!((k SUBSEP key) in tseen)) { tseen[k SUBSEP key] = 1; tests[k, ++nt[k]] = key }
        st[k SUBSEP key SUBSEP mode] = $6
        why[k SUBSEP key SUBSEP mode] = $7
    }
    END {
        bad = 0
        for (i = 1; i <= nk; i++) {
            k = order[i]; split(k, a, SUBSEP); np = a[1]; mod = a[2]
            m = split(substr(modes[k], 2), ml, " ")
            nrun = 0; nskip = 0
            for (j = 1; j <= nt[k]; j++) {
                t = tests[k, j]; skipped = 1
                for (x = 1; x <= m; x++) if (st[k SUBSEP t SUBSEP ml[x]] != "skip") skipped = 0
                if (skipped) nskip++; else nrun++
            }
            printf "\n%s, at most %d ranks: %d tests (%d skipped by runtests)\n", mod, np, nrun, nskip
            printf "  %-6s %5s %5s %8s\n", "mode", "pass", "fail", "time"
            for (x = 1; x <= m; x++) {
                p = 0; f = 0
                for (j = 1; j <= nt[k]; j++) {
                    s = st[k SUBSEP tests[k, j] SUBSEP ml[x]]
                    if (s == "pass") p++; else if (s == "fail" || s == "") f++
                }
                printf "  %-6s %5d %5d %8s\n", ml[x], p, f, fmt(secs[np SUBSEP mod SUBSEP ml[x]])
            }
            hdr = 0
            for (j = 1; j <= nt[k]; j++) {
                t = tests[k, j]; split(t, tt, SUBSEP)
                if (st[k SUBSEP t SUBSEP "rxm"] == "fail") {
                    if (!hdr++) printf "  failing on the reference (rxm) too:\n"
                    line = "    " tt[2] ":"
                    for (x = 1; x <= m; x++) line = line " " ml[x] "=" st[k SUBSEP t SUBSEP ml[x]]
                    printf "%s\n      %s\n", line, substr(why[k SUBSEP t SUBSEP "rxm"], 1, 150)
                }
            }
            hdr = 0
            for (j = 1; j <= nt[k]; j++) {
                t = tests[k, j]; split(t, tt, SUBSEP)
                if (st[k SUBSEP t SUBSEP "rxm"] != "pass") continue
                for (x = 1; x <= m; x++) {
                    md = ml[x]
                    if ((md == "local" || md == "tcp") && st[k SUBSEP t SUBSEP md] == "fail") {
                        rk = k SUBSEP t SUBSEP md
                        if (rk in rflaky) {
                            fl[++nfl] = sprintf("    %s %s: %s\n      reruns: %s\n", tt[2], md,
                                substr(why[rk], 1, 150), rer[rk])
                            continue
                        }
                        if (!hdr++) printf "  TANDEM-ONLY FAILURES (pass over rxm):\n"
                        printf "    %s %s: %s\n", tt[2], md, substr(why[rk], 1, 150)
                        if (rk in rer) printf "      reruns: %s\n", rer[rk]
                        bad++
                    }
                }
            }
            if (nfl) printf "  failed over tandem, passed over rxm, then failed over rxm too when run again:\n"
            for (x = 1; x <= nfl; x++) printf "%s", fl[x]
            nfl = 0
            hdr = 0
            for (j = 1; j <= nt[k]; j++) {
                t = tests[k, j]; split(t, tt, SUBSEP)
                s = ""
                for (x = 1; x <= m; x++) if (st[k SUBSEP t SUBSEP ml[x]] == "skip") s = s " " ml[x]
                if (s != "" && nskip_listed[k SUBSEP t]++ == 0) {
                    if (!hdr++) printf "  skipped by runtests:\n"
                    printf "    %s: %s\n", tt[2], why[k SUBSEP t SUBSEP ml[1]]
                }
            }
        }
        printf "\n%d tandem-only failure(s)\n", bad
        exit (bad > 0)
    }
' rr="$reruns_tsv" "$reruns_tsv" "$results"
