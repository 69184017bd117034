#!/usr/bin/env bash
# Runs libfabric's conformance suite (fabtests) against this build's providers.
#
#   scripts/fabtests.sh SRC [options]
#   scripts/fabtests.sh -L PREFIX [options]
#
# With -L, the libfabric installed in PREFIX and the fabtests installed with it (as
# scripts/libfabric2.sh installs libfabric 2.6.0 and its fabtests) run instead, under that
# libfabric (LD_LIBRARY_PATH), with the lists scripts/fabtests-<its version>-excluded.txt and
# -notrun.txt; nothing is built.
#
# SRC is a libfabric source tree (or its fabtests/ directory) of the same version as the
# installed libfabric, e.g. made with
#   git -C <libfabric clone> archive v1.17.0 fabtests | tar -x -C /tmp/fabtests-src
# or a fabtests tarball (fabtests-<version>.tar.gz), or a directory holding one of the
# installed libfabric's version: CI passes ../shared/vendor, which is read-only there, so a
# tarball is unpacked under <build>/fabtests. Nothing of it is kept in this repository.
# The script installs what it needs with apt,
# builds fabtests out of tree into <build>/fabtests, and runs the standard runner
# (runfabtests.sh) against <build>/lib with `-p tandem` and no tuning variables, once per mode:
#   local  both processes on 127.0.0.1, default settings (the node-local path)
#   tcp    both processes on 127.0.0.1 with FI_TANDEM_LOCAL=0 (the TCP link)
#   nic    both processes on this host's first non-loopback IPv4 address, default settings
#   verbs  both processes on 127.0.0.1 over the verbs link on the EMULATED RDMA device of the
#          tests (tests/emurdma, serving loopback, as scripts/with-emulated-rdma.sh sets it up),
#          with FI_TANDEM_LOCAL=0 and FI_TANDEM_LINK=verbs; not in the default modes
#   lnx    (with -L of a libfabric 2.x) -p lnx with FI_LNX_PROV_LINKS=shm+tandem: tandem as the
#          network provider lnx links with shm, through the peer API; server and client on
#          127.0.0.1 but each in a UTS namespace of its own (hostnames tandem-node-a and -b: an
#          `ssh` of this script's runs the runner's commands so), so that lnx takes them for two
#          nodes and carries their traffic over tandem, not shm; addresses are exchanged out of
#          band (runfabtests.sh -b), as lnx needs. As root; not in the default modes. Its
#          exclusions: scripts/fabtests-<version>-lnx-excluded.txt
# With -P (as root) the modes run at once, each but nic in network and mount namespaces of its
# own (loopback up, a private /dev/shm): the runner's fixed ports and tandem's segments, named
# after addresses, would collide otherwise; nic needs the host's interfaces and stays outside.
# A run of fabtests keeps a core less than half busy (client and server mostly wait on each
# other), so two modes at once take little more than one.
# With the quick, standard or functional set, each mode also runs fi_multinode_coll (which the
# runner does not: it needs a launcher) with 2, 3, 4 and 8 processes, and the local mode, as
# root, a job of 5 spread over two "nodes" (mount namespaces with their own /dev/shm).
# It prints one row per test and mode, and exits non-zero when a test fails that is not on
# scripts/fabtests-excluded.txt, or is not run (ENODATA/ENOSYS) without being on
# scripts/fabtests-notrun.txt. docs/fabtests.md has the results and the reasons.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
excluded_file=$root/scripts/fabtests-excluded.txt
notrun_file=$root/scripts/fabtests-notrun.txt
sets=quick
modes=local,tcp,nic
per_test_timeout=60
nic_addr=""
run_excluded=0
parallel=0
all_args=("$@")

usage() {
    cat >&2 <<EOF
usage: $0 SRC [options]
  SRC           a libfabric source tree, its fabtests/ directory, a fabtests-<version>.tar.gz,
                or a directory holding fabtests-<installed libfabric version>.tar.gz
  -b DIR        tandem build directory (default: \$BUILD_DIR or $root/build)
  -t SETS       runner test sets, e.g. quick, standard, unit,functional (default: $sets)
  -m MODES      comma-separated modes among local,tcp,nic,verbs,lnx (default: $modes)
  -T SECONDS    the runner's timeout for each test program (default: $per_test_timeout)
  -a ADDR       address for the nic mode (default: first global IPv4 of an interface up)
  -x            also run the excluded tests (their failures are shown, not counted)
  -L PREFIX     run the libfabric and fabtests installed in PREFIX (no SRC then)
  -P            the modes at once, each in namespaces of its own (as root)
EOF
    exit 2
}

[ $# -ge 1 ] || usage
src=""
if [[ $1 != -* ]]; then
    src=$1
    shift
fi
sum=""
libprefix=""
while getopts "b:t:m:T:a:xL:Ph" opt; do
    case $opt in
        b) build=$(cd "$OPTARG" && pwd) ;;
        t) sets=$OPTARG ;;
        m) modes=$OPTARG ;;
        T) per_test_timeout=$OPTARG ;;
        a) nic_addr=$OPTARG ;;
        x) run_excluded=1 ;;
        L) libprefix=$(cd "$OPTARG" && pwd) ;;
        P) parallel=1 ;;
        *) usage ;;
    esac
done

[ -n "$src" ] || [ -n "$libprefix" ] || usage
[ -z "$src" ] || [ -e "$src" ] || { echo "error: $src does not exist" >&2; exit 2; }
[ -f "$build/lib/libtandem-fi.so" ] || {
    echo "error: no providers in $build/lib: build tandem first (scripts/build.sh)" >&2
    exit 2
}
# (Absolute: the runner runs from its own directory, and the shims must be found from there.)
build=$(cd "$build" && pwd)

# --- what the build and the runner need ------------------------------------------------------
source "$root/scripts/need-commands.sh"
headers=()
dpkg-query -W -f='${Status}' libfabric-dev 2>/dev/null | grep -q "install ok installed" ||
    headers=(+libfabric-dev)
need_commands autoreconf:autoconf aclocal:automake libtoolize:libtool make:make gcc:gcc \
    pkg-config:pkg-config python3:python3 ip:iproute2 ps:procps setsid:util-linux \
    timeout:coreutils getopt:util-linux tar:tar gzip:gzip sha256sum:coreutils "${headers[@]}"

if [ -n "$libprefix" ]; then
    # --- an installed libfabric and its fabtests ------------------------------------------------
    lib_version=$(sed -n 's/^Version: *//p' "$libprefix/lib/pkgconfig/libfabric.pc")
    ft=$build/fabtests-$lib_version
    bin=$libprefix/bin
    [ -x "$bin/runfabtests.sh" ] || { echo "error: no fabtests in $bin" >&2; exit 2; }
    excluded_file=$root/scripts/fabtests-$lib_version-excluded.txt
    notrun_file=$root/scripts/fabtests-$lib_version-notrun.txt
    [ -f "$excluded_file" ] && [ -f "$notrun_file" ] ||
        { echo "error: no $excluded_file or $notrun_file" >&2; exit 2; }
    lnx_excluded_file=$root/scripts/fabtests-$lib_version-lnx-excluded.txt
    export LD_LIBRARY_PATH=$libprefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    mkdir -p "$ft"
else
    lib_version=$(pkg-config --modversion libfabric)
    ft=$build/fabtests

    # --- the source: a tree, or a tarball unpacked under the build tree --------------------------
    # A directory without configure.ac (a vendor directory) stands for its tarball of the installed
    # version. A tarball is unpacked once per content (its sha256), since its directory may be
    # read-only and a fresh clone has no other place for it.
    if [ -d "$src" ] && [ ! -f "$src/configure.ac" ] && [ ! -f "$src/fabtests/configure.ac" ]; then
        if [ -f "$src/fabtests-$lib_version.tar.gz" ]; then
            src=$src/fabtests-$lib_version.tar.gz
        else
            echo "error: $src is no source tree and holds no fabtests-$lib_version.tar.gz" >&2
            exit 2
        fi
    fi
    if [ -f "$src" ]; then
        tarball=$(cd "$(dirname "$src")" && pwd)/$(basename "$src")
        sum=$(sha256sum "$tarball" | cut -d' ' -f1)
        unpacked=$ft/tarball
        if [ "$(cat "$unpacked/.sha256" 2>/dev/null)" != "$sum" ]; then
            rm -rf "$unpacked"
            mkdir -p "$unpacked"
            tar -xf "$tarball" -C "$unpacked" || { echo "error: cannot unpack $tarball" >&2; exit 2; }
            echo "$sum" >"$unpacked/.sha256"
        fi
        # The tarball's one top folder (fabtests-<version>/).
        src=$(find "$unpacked" -mindepth 1 -maxdepth 1 -type d | head -1)
        [ -n "$src" ] || { echo "error: $tarball holds no top folder" >&2; exit 2; }
    fi
    if [ -f "$src/fabtests/configure.ac" ]; then
        src=$src/fabtests
    elif [ ! -f "$src/configure.ac" ] || ! grep -q 'AC_INIT(\[fabtests\]' "$src/configure.ac"; then
        echo "error: $src is neither a libfabric source tree nor its fabtests directory" >&2
        exit 2
    fi
    src=$(cd "$src" && pwd)

    # fabtests speaks to the library through its headers and ABI: use the installed version's.
    src_version=$(sed -n 's/^AC_INIT(\[fabtests\], *\[\([^]]*\)\].*/\1/p' "$src/configure.ac")
    if [ "$src_version" != "$lib_version" ]; then
        echo "error: fabtests $src_version in $src, but the installed libfabric is $lib_version" >&2
        exit 2
    fi

    # --- build fabtests out of tree ------------------------------------------------------------
    bin=$ft/install/bin
    stamp="$src_version $src${sum:+ $sum}"
    if [ "$(cat "$ft/install/.source" 2>/dev/null)" != "$stamp" ] || [ ! -x "$bin/runfabtests.sh" ]; then
        echo "building fabtests $src_version from $src in $ft"
        rm -rf "$ft/src" "$ft/obj" "$ft/install"
        mkdir -p "$ft/obj" "$ft/logs"
        # autoreconf writes into the tree it runs in: a copy keeps SRC_DIR as it was given.
        cp -a "$src" "$ft/src"
        step() {
            local name=$1
            shift
            if ! "$@" >"$ft/logs/$name.log" 2>&1; then
                echo "error: fabtests $name failed; the end of $ft/logs/$name.log:" >&2
                tail -20 "$ft/logs/$name.log" >&2
                exit 2
            fi
        }
        step autoreconf bash -c "cd '$ft/src' && mkdir -p config && autoreconf -ivf"
        step configure bash -c "cd '$ft/obj' && ../src/configure --with-libfabric=/usr --prefix='$ft/install'"
        step make make -C "$ft/obj" -j"$(nproc)"
        step install make -C "$ft/obj" install
        echo "$stamp" >"$ft/install/.source"
    fi

fi  # (an installed libfabric, or SRC built here)

# --- the runner's cleanup, kept to this run -------------------------------------------------
# After a timeout runfabtests.sh kills every process whose name starts with fi_ that
# `ps -e` lists, on the whole machine. A ps of our own, first in PATH, lists only the
# processes of the runner's session. (A PID namespace would do it too, but tandem's
# node-local path tells live shared-memory segments from dead ones by PID, which a
# namespace would make disagree with the processes outside it.)
shim=$ft/shim
mkdir -p "$shim"
real_ps=$(command -v ps)
cat >"$shim/ps" <<EOF
#!/bin/sh
if [ "\$1" = "-eo" ] && [ -n "\${FABTESTS_SID:-}" ]; then
    shift
    exec $real_ps -s "\$FABTESTS_SID" -o "\$@"
fi
exec $real_ps "\$@"
EOF
chmod +x "$shim/ps"
# The lnx mode's two "nodes": runfabtests.sh runs a command on host H as `ssh <options> H CMD`;
# here that is CMD in a UTS namespace whose hostname is H, in this directory and environment.
cat >"$shim/ssh" <<'EOF'
#!/bin/bash
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do
    case $1 in -o) shift 2 ;; *) shift ;; esac
done
host=$1
shift
exec unshare -u bash -c 'hostname "$0" && eval "$1"' "$host" "$*"
EOF
chmod +x "$shim/ssh"

# --- patterns ---------------------------------------------------------------------------------
# A pattern file: one regex per line (matched against the runner's test name as the runner
# does), with the reason on the comment line just above it.
declare -a ex_pat=() ex_why=() nr_pat=() nr_why=()
load_patterns() {
    local file=$1 line why=""
    local -n pats=$2 whys=$3
    while IFS= read -r line || [ -n "$line" ]; do
        if [[ $line =~ ^[[:space:]]*#[[:space:]]*(.*)$ ]]; then
            why=${BASH_REMATCH[1]}
        elif [[ $line =~ [^[:space:]] ]]; then
            pats+=("$line")
            whys+=("$why")
        fi
    done <"$file"
}
load_patterns "$excluded_file" ex_pat ex_why
load_patterns "$notrun_file" nr_pat nr_why

# Prints the reason of the first pattern that matches the test, or fails.
reason_for() {
    local name=$1 kind=$2 i
    local -n pats=${kind}_pat whys=${kind}_why
    for i in "${!pats[@]}"; do
        if [[ $name =~ ${pats[$i]} ]]; then
            echo "${whys[$i]}"
            return 0
        fi
    done
    return 1
}

# --- run ------------------------------------------------------------------------------------
first_global_ipv4() {
    ip -4 -o addr show up scope global 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}'
}

rundir=$ft/run
mkdir -p "$rundir"
# The user's environment is not the users' environment: no tuning, no other provider.
for v in $(env | sed -n 's/^\(FI_TANDEM_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset FI_PROVIDER FI_PROVIDER_PATH

# multinode_coll NP ADDR [VAR=VALUE...]: one fi_multinode_coll job of NP ranks (NP = A+B:
# A ranks in one mount namespace with its own /dev/shm, B in another); fails if any rank does.
multinode_coll() {
    local np=$1 addr=$2
    shift 2
    local -a groups
    IFS=+ read -ra groups <<<"$np"
    local total=0 g
    for g in "${groups[@]}"; do total=$((total + g)); done
    local -a pids=()
    for g in "${groups[@]}"; do
        local cmd="" i
        for ((i = 0; i < g; i++)); do
            cmd+="timeout $per_test_timeout $bin/fi_multinode_coll -n $total -s $addr -p tandem & sleep 0.1; "
        done
        cmd+="rc=0; for p in \$(jobs -p); do wait \$p || rc=1; done; exit \$rc"
        if ((${#groups[@]} > 1)); then
            (cd "$rundir" && env FI_PROVIDER_PATH="$build/lib" "$@" unshare -m \
                bash -c "mount -t tmpfs tmpfs /dev/shm && $cmd") &
        else
            (cd "$rundir" && env FI_PROVIDER_PATH="$build/lib" "$@" bash -c "$cmd") &
        fi
        pids+=($!)
        sleep 0.3
    done
    local rc=0 p
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

declare -a ran_modes=()
IFS=, read -ra mode_list <<<"$modes"
all_modes=("${mode_list[@]}")
# One client-server test the runner does not list, as the runner runs one: the server, then
# the client, both -p tandem, into $log.extra; its row into $log. Uses the mode's $log,
# $addr, $envs, $rundir (set in the loop below). NAME as the row says it, then the binary
# and its arguments.
run_pair() {
    local name=$1 binary=$2
    shift 2
    if [ $run_excluded -eq 0 ] && reason_for "$name" ex >/dev/null; then
        printf -- '- name: %s -p "tandem"\n  result: Excluded\n' "$name" >>"$log"
        return
    fi
    local targs=(-p tandem "$@") before after server res=Pass
    # (grep -c exits 1 on no match: not a failure here.)
    before=$(grep -c 'fi_getinfo().*ret=-61' "$log.extra" 2>/dev/null || true)
    echo "== $name" >>"$log.extra"
    (cd "$rundir" && env FI_PROVIDER_PATH="$build/lib" "${envs[@]}" \
        timeout "$per_test_timeout" "$bin/$binary" "${targs[@]}" -s "$addr") \
        >>"$log.extra" 2>&1 </dev/null &
    server=$!
    sleep 0.5
    (cd "$rundir" && env FI_PROVIDER_PATH="$build/lib" "${envs[@]}" \
        timeout "$per_test_timeout" "$bin/$binary" "${targs[@]}" -s "$addr" "$addr") \
        >>"$log.extra" 2>&1 </dev/null || res=Fail
    wait "$server" || res=Fail
    # Both sides found nothing to run on (-FI_ENODATA): not run, as the runner says.
    after=$(grep -c 'fi_getinfo().*ret=-61' "$log.extra" || true)
    [ "$res" = Fail ] && [ $((after - ${before:-0})) -ge 2 ] && res=Notrun
    printf -- '- name: %s -p "tandem"\n  result: %s\n' "$name" "$res" >>"$log"
}

# -P: this script again for each mode but nic, in namespaces of its own, in the background
# (FABTESTS_CHILD: it runs its mode and leaves the summary to this one); nic runs here.
declare -A child_pid=()
if [ $parallel -eq 1 ] && [ -z "${FABTESTS_CHILD:-}" ] && ((${#mode_list[@]} > 1)); then
    if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null; then
        echo "-P: the modes run one after the other (their namespaces need root)"
    else
        declare -a stay=()
        for mode in "${mode_list[@]}"; do
            if [ "$mode" = nic ]; then
                stay+=("$mode")
                continue
            fi
            FABTESTS_CHILD=1 unshare -n -m bash -c \
                'ip link set lo up && mount -t tmpfs tmpfs /dev/shm && exec bash "$@"' child \
                "$root/scripts/fabtests.sh" "${all_args[@]}" -m "$mode" \
                >"$rundir/$mode.out" 2>&1 </dev/null &
            child_pid[$mode]=$!
        done
        mode_list=("${stay[@]}")
    fi
fi
for mode in "${mode_list[@]}"; do
    envs=()
    case $mode in
        local) addr=127.0.0.1 ;;
        tcp) addr=127.0.0.1 envs=(FI_TANDEM_LOCAL=0) ;;
        verbs)
            emulated=$build/tests/emurdma/libtandem-emurdma.so
            [ -f "$emulated" ] || { echo "error: mode verbs needs $emulated (build the tests)" >&2; exit 2; }
            addr=127.0.0.1
            envs=(FI_TANDEM_LOCAL=0 FI_TANDEM_LINK=verbs EMURDMA_NETDEV=lo
                  FI_TANDEM_VERBS_LIB="$emulated" FI_TANDEM_RDMACM_LIB="$emulated") ;;
        lnx)
            if [ -z "$libprefix" ] || [ "$(id -u)" -ne 0 ]; then
                echo "mode lnx: skipped, it needs -L (a libfabric with lnx) and root (namespaces)"
                continue
            fi
            addr=127.0.0.1 envs=(FI_LNX_PROV_LINKS=shm+tandem) ;;
        nic)
            addr=${nic_addr:-$(first_global_ipv4)}
            if [ -z "$addr" ]; then
                echo "mode nic: skipped, this host has no global IPv4 address on an interface up"
                continue
            fi
            ;;
        *) echo "error: unknown mode $mode" >&2 && exit 2 ;;
    esac
    log=$rundir/$mode.log
    # This run's programs only: the side logs are appended to test by test.
    : >"$log.extra"
    : >"$log.multinode"
    excl_args=()
    prov=tandem hosts=() mode_excluded=$excluded_file
    if [ "$mode" = lnx ]; then
        prov=lnx hosts=(tandem-node-a tandem-node-b) mode_excluded=$lnx_excluded_file
        excl_args=(-b)
    fi
    [ $run_excluded -eq 1 ] || excl_args+=(-f "$mode_excluded")
    echo "mode $mode: runfabtests.sh -t $sets on $addr ${envs[*]} (log: $log)"
    # The runner leaves its temporary files in the current directory.
    (cd "$rundir" && env PATH="$shim:$PATH" FI_PROVIDER_PATH="$build/lib" "${envs[@]}" \
        setsid --wait bash -c 'export FABTESTS_SID=$$; exec bash "$@"' runner \
        "$bin/runfabtests.sh" -p "$bin" -v -T "$per_test_timeout" -t "$sets" \
        -s "$addr" -c "$addr" "${excl_args[@]}" "$prov" "${hosts[@]}") >"$log" 2>&1 </dev/null ||
        true
    # Client-server tests the runners do not list run here as the runner runs one (server,
    # then client, both -p tandem), into the same log: the 1.17 runner has no
    # fi_rdm_deferred_wq, and neither runner the address-reuse variants of
    # fi_rdm_multi_client (-R: each client endpoint opened at the first one's address, which
    # also happens by chance when the kernel hands the next endpoint the port the last freed).
    if [ "$mode" != lnx ] &&
        [[ ",$sets," == *,quick,* || ",$sets," == *,standard,* || ",$sets," == *,functional,* ]]; then
        for variant in "" msg tagged rma atomic f_atomic c_atomic; do
            run_pair "fi_rdm_deferred_wq${variant:+ -T $variant}" fi_rdm_deferred_wq \
                ${variant:+-T "$variant"}
        done
        run_pair "fi_rdm_multi_client -C 10 -I 5 -R" fi_rdm_multi_client -C 10 -I 5 -R
        run_pair "fi_rdm_multi_client -C 10 -I 5 -U -R" fi_rdm_multi_client -C 10 -I 5 -U -R
    fi
    # The runner's multinode set needs a job launcher; fi_multinode_coll's ranks meet at the
    # first one's address, so they run here directly: 2, 3, 4 and 8 processes, and in the
    # local mode also as two nodes (two mount namespaces, each its own /dev/shm: as root).
    if [ "$mode" != lnx ] &&
        [[ ",$sets," == *,quick,* || ",$sets," == *,standard,* || ",$sets," == *,functional,* ]]; then
        for np in 2 3 4 8 2+3; do
            name="fi_multinode_coll -n $np"
            if [ "$np" = 2+3 ]; then
                [ "$mode" = local ] && [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null || continue
                name="fi_multinode_coll -n 5 (two nodes: 2 + 3)"
            fi
            res=Pass
            multinode_coll "$np" "$addr" "${envs[@]}" >>"$log.multinode" 2>&1 </dev/null || res=Fail
            printf -- '- name: %s -p "tandem"\n  result: %s\n' "$name" "$res" >>"$log"
        done
    fi
    ran_modes+=("$mode")
done
if [ -n "${FABTESTS_CHILD:-}" ]; then
    # (3: the mode was skipped; the parent reads the log and sums up)
    ((${#ran_modes[@]})) && exit 0 || exit 3
fi
declare -A ran=()
for mode in "${ran_modes[@]}"; do ran[$mode]=1; done
for mode in "${!child_pid[@]}"; do
    rc=0
    wait "${child_pid[$mode]}" || rc=$?
    cat "$rundir/$mode.out"
    case $rc in
        0) ran[$mode]=1 ;;
        3) ;;
        *) echo "error: mode $mode stopped with status $rc ($rundir/$mode.out)" >&2; exit 2 ;;
    esac
done
ran_modes=()
for mode in "${all_modes[@]}"; do [ -z "${ran[$mode]:-}" ] || ran_modes+=("$mode"); done
((${#ran_modes[@]})) || { echo "no mode ran" >&2; exit 2; }

# --- summary ----------------------------------------------------------------------------------
# Each log is the runner's verbose YAML: "- name: <test> -p "tandem"" then "  result: <R>".
declare -A result=()
declare -a order=()
for mode in "${ran_modes[@]}"; do
    while IFS=$'\t' read -r name res; do
        [ -n "${result[$name]+x}" ] || order+=("$name")
        result[$name]=1
        result["$name|$mode"]=$res
    done < <(awk -v addr="$( [ "$mode" = nic ] && echo "${nic_addr:-$(first_global_ipv4)}" || echo 127.0.0.1)" '
        /^- name: / { n = $0; sub(/^- name: +/, "", n); sub(/ -p "(tandem|lnx)"$/, "", n)
                      gsub(addr, "ADDR", n); next }
        /^  result: / && n != "" { r = $0; sub(/^  result: +/, "", r); print n "\t" r; n = "" }
    ' "$rundir/$mode.log")
done

bad=0
declare -a notes=() failed=()
printf '\n%-58s' "test"
for mode in "${ran_modes[@]}"; do printf '%-10s' "$mode"; done
printf '\n'
for name in "${order[@]}"; do
    printf '%-58s' "$name"
    for mode in "${ran_modes[@]}"; do
        res=${result["$name|$mode"]:-}
        case $res in
            Pass*) cell=pass ;;
            Excluded) cell=excluded ;;
            Notrun)
                if why=$(reason_for "$name" nr) || why=$(reason_for "$name" ex); then
                    cell=notrun
                else
                    cell=NOTRUN!
                    bad=1
                    notes+=("$mode: $name was not run (ENODATA/ENOSYS) and is not on $notrun_file")
                fi
                ;;
            Fail*)
                if why=$(reason_for "$name" ex); then
                    cell=xfail
                    notes+=("$mode: $name failed (excluded: $why)")
                else
                    cell=FAIL!
                    bad=1
                    notes+=("$mode: $name FAILED (see $rundir/$mode.log)")
                    failed+=("$mode|$name")
                fi
                ;;
            "") cell=- ;;
            *) cell=$res ;;
        esac
        printf '%-10s' "$cell"
    done
    printf '\n'
done
for mode in "${ran_modes[@]}"; do
    printf '%s: ' "$mode"
    for kind in Pass Fail Notrun Excluded; do
        n=0
        for name in "${order[@]}"; do [[ ${result["$name|$mode"]:-} == $kind* ]] && n=$((n + 1)); done
        printf '%s %d  ' "$kind" "$n"
    done
    printf '\n'
done
if ((${#notes[@]})); then printf '%s\n' "${notes[@]}"; fi
# What a failed test printed (its record in the runner's log, or its section of the side
# logs), so that a failure CI met once can be read from CI's output: at most 60 lines each.
for entry in "${failed[@]}"; do
    mode=${entry%%|*} name=${entry#*|}
    echo "--- $mode: $name"
    {
        awk -v n="$name" -v addr="$( [ "$mode" = nic ] && echo "${nic_addr:-$(first_global_ipv4)}" || echo 127.0.0.1)" '
            index($0, "- name:") == 1 { s = $0; sub(/^- name: +/, "", s)
                                        sub(/ -p "(tandem|lnx)"$/, "", s); gsub(addr, "ADDR", s)
                                        on = s == n } on' "$rundir/$mode.log"
        awk -v n="== $name" '/^== / { on = $0 == n } on' "$rundir/$mode.log.extra" 2>/dev/null
    } | head -60
done
if [ $bad -ne 0 ]; then
    echo "fabtests: FAILED"
    exit 1
fi
echo "fabtests: passed (apart from the documented exclusions)"
