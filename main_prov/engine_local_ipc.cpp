// The node-local channel's device messages in tandem's receive side: the decoder of IpcRts
// cells. An IpcRts names the sender's device buffers by their IPC handles; the receiver maps
// them and copies with its devices' engines, and tells the sender by a Fin once the message
// is read. It matches, is delivered or kept as unexpected as any other message (the one queue,
// so that one sender's messages match in the order it sent them). Mapping and copying are
// off_tandem's, whose cache of imported handles and device engines they are
// (peer::LocalPathOps::copy_ipc); matching, answers and completions are ours. A message the
// receiver cannot map (the handle refused here, no peer access, or FI_HMEM_P2P_DISABLED) is
// answered FI_EOPNOTSUPP: the sender sends it again in Frag cells flagged kLocalRestaged,
// which go into the receive the IpcRts matched (staged_, engine_local_rx.cpp).
#include "common/log.h"
#include "main_prov/engine.h"
#include "main_prov/local_path.h"
#include "main_prov/shm/channel.h"

#include <algorithm>
#include <cstring>

namespace tandem {

void Engine::receive_ipc_cell(const uint8_t *cell) {
    wire::LocalHeader lh;
    memcpy(&lh, cell, sizeof lh);
    if (lh.name_len > wire::kLocalNameRoom) [[unlikely]] {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed IpcRts (a %u-byte name)\n", lh.name_len);
        return;
    }
    const std::string_view sender(reinterpret_cast<const char *>(cell + sizeof lh), lh.name_len);
    const uint8_t *entries = cell + sizeof lh + wire::kLocalNameRoom;
    uint64_t named = 0;
    const bool fits = lh.iov_count > 0 && lh.iov_count <= wire::kLocalMaxIov;
    for (size_t i = 0; fits && i < lh.iov_count; ++i) {
        uint64_t length;
        memcpy(&length, entries + i * sizeof(wire::LocalIpc) + offsetof(wire::LocalIpc, length),
               sizeof length);
        named += length;
    }
    if (!fits || named != lh.total) [[unlikely]] {
        // Not a message we can read: the sender is told, not left to wait for ever.
        TANDEM_WARN(FI_LOG_EP_DATA, "refusing a malformed IpcRts (%u buffers, %llu bytes)\n",
                    lh.iov_count, (unsigned long long)lh.total);
        answer_local(sender, lh.msg_id, FI_EIO);
        return;
    }
    // The process whose handles they are is the one the sender's name leads to.
    if (!local_->channel()->vouch_for_process(lh, sender)) return;
    receive_local_rendezvous(lh, sender, LocalRts{.count = lh.iov_count, .ipc = true}, entries);
}

// The message an IpcRts names into a receive (entries: its ipc.count handles, as the cell
// carries them).
void Engine::start_local_ipc(RxOp *rx, const wire::ProtoHeader &hdr, std::string_view sender,
                             const LocalRts &ipc, const uint8_t *entries, fi_addr_t src) {
    const size_t n = std::min<size_t>(hdr.size, rx->total);
    wire::LocalIpc handles[wire::kLocalMaxIov];  // (copied: the cell is unaligned)
    memcpy(handles, entries, ipc.count * sizeof *handles);
    int err = 0;
    if (!local_)
        err = FI_ECONNRESET;  // (closed: nothing reaches the sender any more)
    else if (p2p_.mode() == FI_HMEM_P2P_DISABLED)
        err = FI_EOPNOTSUPP;  // this endpoint opens no handle: the sender stages instead
    else if (n)
        err = local_->copy_ipc(ipc.pid, handles, ipc.count, rx->iov, rx->device ? rx->mem : nullptr,
                               rx->count, n);
    if (err == FI_EOPNOTSUPP) {
        restage_local_ipc(rx, hdr, sender, ipc.pid);
        return;
    }
    finish_local_rts(rx, hdr, sender, src, n, err);
}

// The receive waits for the same message in cells (the sender's answer to our FI_EOPNOTSUPP),
// as a staged message that took it at its first fragment; the sender's death ends it as any
// staged message's (forget_dead_senders).
void Engine::restage_local_ipc(RxOp *rx, const wire::ProtoHeader &hdr, std::string_view sender,
                               pid_t pid) {
    std::pair<std::string, uint64_t> id{std::string(sender), hdr.msg_id};
    // A message of that id under way is a dead process's at the sender's address.
    if (auto it = staged_.find(id); it != staged_.end()) end_staged(it, FI_ECONNRESET);
    StagedMessage m;
    m.hdr = hdr;
    m.pid = pid;
    m.into = rx;
    m.restaged = true;
    // (Counted as refused when it came: finish_staged.)
    if (rx->device && rx->total && hdr.size && p2p_.mode() == FI_HMEM_P2P_REQUIRED)
        m.status = FI_EOPNOTSUPP;
    staged_.emplace(std::move(id), std::move(m));
    note_owner_waits();
    answer_local(sender, hdr.msg_id, FI_EOPNOTSUPP);
}

}  // namespace tandem
