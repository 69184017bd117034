#!/usr/bin/env bash
# usage: code_limits.sh SOURCE_ROOT [CHECK]
# The limits the production code is held to (docs/architecture.md, "Routes of a message, and
# the step to one engine"), checked on the sources as they are, so that none creeps back:
#   functions  no function of the providers, the peer and memory layers, the shared plumbing
#              or the NCCL plugin longer than 80 lines (ctags' span: signature to closing brace)
#   files      no such file longer than 900 lines unless its opening comment says why, in a
#              sentence naming "900 lines"
#   adapter    the fid_ep adapter (class Endpoint, main_prov/endpoint.h) under 60 methods
#   locks      no recursive mutex anywhere in them (the domain lock is a plain one, and the
#              lock order is asserted: main_prov/lock_order.h)
#   routes     the node-local Short cell's routes as docs/architecture.md draws them: each
#              encoder and decoder called from the places listed there, and nowhere else (a
#              new caller is a new route, to be drawn there and counted here)
#   extensions one private extension between the two providers (peer::OffloadOps, with the
#              owner's answers it carries in) and tandem's own for tools, and their entries
#              (function pointers): no more than today's, so that none comes back as the
#              tables shrink (issue 36: 41 at its filing, in 8 tables)
# CHECK runs one of them (all by default). Each prints what breaks its limit, and the script
# fails if any does.
set -u
root=${1:?usage: $0 SOURCE_ROOT [CHECK]}
only=${2:-all}
cd "$root" || exit 1
command -v ctags >/dev/null || { echo "FAIL: ctags not found (scripts/install-deps.sh installs universal-ctags)"; exit 1; }
ctags --version | grep -q Universal || { echo "FAIL: ctags is not Universal Ctags"; exit 1; }

dirs=(common main_prov offload_prov peer hmem nccl_plugin)
mapfile -t sources < <(find "${dirs[@]}" \( -name '*.cpp' -o -name '*.h' -o -name '*.c' \) | sort)
[ "${#sources[@]}" -gt 100 ] || { echo "FAIL: found only ${#sources[@]} sources under ${dirs[*]}"; exit 1; }
status=0

check_functions() {
    local defs long counted
    # One line per function definition: "file:line end name" (file:line keeps the lines
    # distinct: ctags -x drops identical ones); its length is end - line + 1.
    defs=$(ctags -x --language-force=C++ --kinds-C++=f --fields=+ne --_xformat='%F:%n %{end} %N' \
               "${sources[@]}" 2>/dev/null)
    counted=$(awk '$2 ~ /^[0-9]+$/' <<<"$defs" | wc -l)
    # ctags must have found the definitions, with their ends, for the check to mean anything.
    [ "$counted" -gt 1000 ] || { echo "FAIL: ctags reported the end of only $counted functions"; status=1; return; }
    long=$(awk '$2 ~ /^[0-9]+$/ { split($1, at, ":"); n = $2 - at[2] + 1; if (n > 80) print n " lines: " $3 " (" $1 ")" }' <<<"$defs")
    if [ -n "$long" ]; then
        echo "FAIL: functions over 80 lines:"; echo "$long"; status=1
    else
        echo "ok: $counted functions, none over 80 lines"
    fi
}

check_files() {
    local f n bad=0
    for f in "${sources[@]}"; do
        n=$(wc -l <"$f")
        [ "$n" -le 900 ] && continue
        # The opening comment: the lines before the first that is not a // comment.
        if ! awk '!/^\/\//{exit} {print}' "$f" | grep -q '900 lines'; then
            echo "FAIL: $f has $n lines and its opening comment does not say why (no \"900 lines\")"
            bad=1
        fi
    done
    if [ "$bad" -eq 0 ]; then echo "ok: ${#sources[@]} files, none over 900 lines without a reason"; else status=1; fi
}

check_adapter() {
    local n
    [ -f main_prov/endpoint.h ] || { echo "FAIL: main_prov/endpoint.h missing"; status=1; return; }
    n=$(ctags -x --kinds-C++=+p --_xformat='%{scope}|%K|%N' --language-force=C++ main_prov/endpoint.h |
        awk -F'|' '$1 == "tandem::Endpoint" && ($2 == "prototype" || $2 == "function")' | wc -l)
    if [ "$n" -ge 60 ] || [ "$n" -eq 0 ]; then
        echo "FAIL: the fid_ep adapter (tandem::Endpoint) has $n methods, the limit is 59"; status=1
    else
        echo "ok: the fid_ep adapter has $n methods"
    fi
}

check_locks() {
    local hits
    hits=$(grep -n 'recursive_mutex\|recursive_timed_mutex\|PTHREAD_MUTEX_RECURSIVE' "${sources[@]}" |
           grep -v ':[0-9]*: *//')
    if [ -n "$hits" ]; then
        echo "FAIL: recursive locks:"; echo "$hits"; status=1
    else
        echo "ok: no recursive lock"
    fi
}

# The production files that call a function, one per call, sorted: "file name" lines.
callers_of() {
    grep -o -- "\b$1(" "${sources[@]}" /dev/null | grep -v '^/dev/null' | sed "s/:.*/ $1/" | sort
}

check_routes() {
    local name want got bad=0
    # name, then the files its calls may be in (one word per call), as the routes table says.
    local -a table=(
        # The one Short encoder: its two forms, both in common/short_cell.h.
        "write_short_head|common/short_cell.h common/short_cell.h common/short_cell.h"
        # One buffer from tandem's data call (send_by_lane), and the twin's own traffic and
        # the peer-API face (the channel's Outbox: shm::Outbox::fill_cell).
        "write_short|common/short_cell.h main_prov/endpoint_data.cpp main_prov/shm/outbox.cpp"
        # Any list, from tandem's general path (inject_local).
        "write_short_gather|common/short_cell.h main_prov/engine_send.cpp"
        # The one decoder: tandem's receive_short and its slow half, and the twin's for an
        # owner that is not tandem.
        "read_short|common/short_cell.h main_prov/endpoint_data.cpp main_prov/engine_local_rx.cpp offload_prov/ep/progress.cpp offload_prov/ep/progress.cpp"
        # tandem's larger node-local messages of host memory: one way in (issue_send), one
        # encoder each for Eager, Rts and Frag (declared, defined, called by send_local), and
        # their answers decoded in one place each (the Fin by dispatch_cell's receive_fin, and
        # a failed stream's end; finish_local_send's two forms, by id and by entry, declared
        # and defined, the first calling the second; the Cts by dispatch_cell).
        # A device message goes the same way in (send_local), then peer to peer (its IpcRts
        # encoded by send_local_ipc, the handles exported by the twin on tandem's one request,
        # LocalPath::export_ipc) or staged through the same three encoders
        # (send_local_device), and is restaged from one place when the receiver refuses its
        # handles (restage_local_send, called by finish_local_send).
        "send_local|main_prov/engine.h main_prov/engine_local_send.cpp main_prov/engine_send.cpp"
        "send_local_eager|main_prov/engine.h main_prov/engine_local_ipc.cpp main_prov/engine_local_send.cpp main_prov/engine_local_send.cpp"
        "send_local_rts|main_prov/engine.h main_prov/engine_local_ipc.cpp main_prov/engine_local_send.cpp main_prov/engine_local_send.cpp"
        "send_local_frag|main_prov/engine.h main_prov/engine_local_ipc.cpp main_prov/engine_local_ipc.cpp main_prov/engine_local_send.cpp main_prov/engine_local_send.cpp"
        "send_local_device|main_prov/engine.h main_prov/engine_local_ipc.cpp main_prov/engine_local_send.cpp"
        "send_local_ipc|main_prov/engine.h main_prov/engine_local_ipc.cpp main_prov/engine_local_ipc.cpp"
        "restage_local_send|main_prov/engine.h main_prov/engine_local_ipc.cpp main_prov/engine_local_send.cpp"
        "receive_fin|main_prov/endpoint_data.cpp main_prov/engine.h main_prov/engine_local_send.cpp"
        "finish_local_send|main_prov/engine.h main_prov/engine.h main_prov/engine_local_send.cpp main_prov/engine_local_send.cpp main_prov/engine_local_send.cpp main_prov/engine_local_send.cpp main_prov/engine_local_send.cpp"
        "receive_cts|main_prov/endpoint_data.cpp main_prov/engine.h main_prov/engine_local_send.cpp"
        # A device message (IpcRts) decoded by tandem alone (dispatch_cell), started as an Rts
        # is, at its match or when a receive takes it (start_local_rendezvous), its bytes copied by the
        # twin on tandem's one request (LocalPath::copy_ipc, declared and called).
        "receive_ipc_cell|main_prov/endpoint_data.cpp main_prov/engine.h main_prov/engine_local_ipc.cpp"
        "start_local_ipc|main_prov/engine.h main_prov/engine_local_ipc.cpp main_prov/engine_local_rts.cpp"
        "copy_ipc|main_prov/engine_local_ipc.cpp main_prov/local_path.h main_prov/local_path.h"
        # The handles of a device message tandem sends: exported by the twin (declared and
        # defined there, used by its own post_ipc and by the entry) on tandem's one request.
        "export_ipc|main_prov/engine_local_ipc.cpp main_prov/local_path.h main_prov/local_path.h offload_prov/offload_ops.cpp offload_prov/endpoint.h offload_prov/ep/send.cpp offload_prov/ep/send.cpp"
    )
    for row in "${table[@]}"; do
        name=${row%%|*}
        want=$(tr ' ' '\n' <<<"${row#*|}" | sed "s/\$/ $name/" | sort)
        got=$(callers_of "$name")
        if [ "$got" != "$want" ]; then
            echo "FAIL: $name is called from"; echo "$got" | sed 's/^/    /'
            echo "  and the routes table lists"; echo "$want" | sed 's/^/    /'
            bad=1
        fi
    done
    # No message of tandem's is posted through the twin (host or device memory): nothing in
    # main_prov posts a send on the twin endpoint.
    got=$(grep -E -c -- 'local_->send\(|fi_t?sendv?(msg)?\(twin_' main_prov/*.cpp main_prov/*.h |
          awk -F: '{ n += $2 } END { print n + 0 }')
    if [ "$got" -ne 0 ]; then echo "FAIL: $got sends of tandem's are posted through the twin"; bad=1; fi
    if [ "$bad" -eq 0 ]; then echo "ok: the node-local encoders and decoders are called where the routes table says"; else status=1; fi
}

check_extensions() {
    local total=0 n s line
    local -a tables=(peer/offload_ops.h:OffloadOps peer/offload_ops.h:OwnerOps
                     peer/ep_diag.h:EpDiagOps)
    # One extension between the providers (off_tandem's, which carries the owner's answers
    # in), and tandem's own for tools: no other fi_open_ops name.
    local names
    names=$(grep -h -o -E 'inline constexpr const char \*k[A-Za-z]+OpsName' peer/*.h | awk '{ print $5 }' | sort | tr '\n' ' ')
    if [ "$names" != "*kEpDiagOpsName *kOffloadOpsName " ]; then
        echo "FAIL: private extension names $names(expected kEpDiagOpsName and kOffloadOpsName)"; status=1; return
    fi
    for s in "${tables[@]}"; do
        n=$(awk -v name="${s#*:}" '$0 ~ "^struct " name " \\{" { on = 1; next } on && /^};/ { exit }
                                   on && /\(\*[a-z_]+\)\(/ { n++ } END { print n + 0 }' "${s%%:*}")
        [ "$n" -gt 0 ] || { echo "FAIL: no entries found in ${s#*:} (${s%%:*})"; status=1; return; }
        line+=" ${s#*:} $n"
        total=$((total + n))
    done
    if [ "$total" -gt 19 ]; then
        echo "FAIL: $total entries in the private extension tables (limit 19):$line"; status=1
    else
        echo "ok: $total entries in the private extension tables:$line"
    fi
}

case $only in
    all) check_functions; check_files; check_adapter; check_locks; check_routes; check_extensions ;;
    functions | files | adapter | locks | routes | extensions) "check_$only" ;;
    *) echo "unknown check: $only"; exit 2 ;;
esac
exit "$status"
