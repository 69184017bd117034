// The node-local channel's device messages in tandem, both ways.
//
// Sending: a message of device memory goes peer to peer where the P2P policy allows and its
// buffers have IPC handles (exported by off_tandem, whose driver calls and cache they are:
// peer::OffloadOps::export_ipc): an IpcRts naming them, which the receiver maps and copies
// from, and which ends at its Fin. Otherwise it is staged by the device's copies, never by the
// CPU: an Eager cell, a host bounce read by CMA (an Rts), or Frag cells. A receiver that cannot
// map the handles answers FI_EOPNOTSUPP: the same message again in Frag cells flagged
// kLocalRestaged, for the receive it holds (under FI_HMEM_P2P_REQUIRED an empty one that
// carries the error instead).
//
// Receiving: the decoder of IpcRts cells. An IpcRts names the sender's device buffers by their IPC
// handles; the receiver maps them and copies with its devices' engines, and tells the sender by a
// Fin once the message is read. It matches, is delivered or kept as unexpected as any other message
// (the one queue, so that one sender's messages match in the order it sent them). Mapping and
// copying are off_tandem's, whose cache of imported handles and device engines they are
// (peer::OffloadOps::copy_ipc); matching, answers and completions are ours. A message the
// receiver cannot map (the handle refused here, no peer access, or FI_HMEM_P2P_DISABLED) is
// answered FI_EOPNOTSUPP: the sender sends it again in Frag cells flagged kLocalRestaged,
// which go into the receive the IpcRts matched (staged_, engine_local_rx.cpp).
#include "common/log.h"
#include "main_prov/engine.h"
#include "main_prov/local_path.h"
#include "main_prov/shm/channel.h"
#include "main_prov/shm/send_choice.h"

#include <algorithm>
#include <cstring>

namespace tandem {

// A device message (op->iov and op->mem hold its buffers), its header built: peer to peer, or
// staged, or refused (FI_EOPNOTSUPP) as the P2P policy decides. The hmem counters count it
// once, by how it went.
void Engine::send_local_device(TxOp *op, shm::PeerInbox &to, wire::LocalHeader hdr) {
    const size_t len = op->len;
    using shm::DeviceSend;
    const DeviceSend how = shm::decide_device_send(p2p_, len, wire::kLocalBodyRoom, to.cma,
                                                   [&] { return send_local_ipc(op, to, hdr); });
    if (how == DeviceSend::PeerToPeer) return;  // (sent)
    if (how == DeviceSend::Refuse) {
        fail_tx(op, FI_EOPNOTSUPP);
    } else if (how == DeviceSend::HostBounce) {
        // Our device copies it once into a host bounce that the receiver reads like any host
        // message (single copy), instead of cell by cell.
        op->inject_copy.resize(len);
        if (hmem::gather(op->inject_copy.data(), op->iov.data(), op->mem.data(), op->iov.size(), 0,
                         len) != ssize_t(len)) [[unlikely]] {
            fail_tx(op, FI_EIO);
            return;
        }
        op->iov.assign(1, iovec{op->inject_copy.data(), len});
        op->mem.clear();
        send_local_rts(op, to, hdr, 0, 0);
    } else if (how == DeviceSend::Frag) {
        send_local_frag(op, to, hdr, op->iov.data(), op->iov.size(), op->mem.data());
    } else {
        hdr.size = static_cast<uint32_t>(len);
        send_local_eager(op, to, hdr, op->iov.data(), op->iov.size(), op->mem.data());
    }
}

// An IpcRts naming op's device buffers; false when some buffer has no IPC handle (or the peer
// could not map one of ours: another pid namespace), and nothing was sent. It ends at the
// receiver's Fin (restage_local_send when the receiver could not map them).
bool Engine::send_local_ipc(TxOp *op, shm::PeerInbox &to, wire::LocalHeader hdr) {
    // The peer maps our handles under our pid: a pid that names another process there rules
    // it out.
    if (!to.same_pid_ns) return false;
    wire::LocalIpc body[wire::kLocalMaxIov];
    const int n = local_->export_ipc(op->iov.data(), op->mem.data(), op->iov.size(), body);
    if (n <= 0) return false;
    hdr.op = static_cast<uint8_t>(wire::LocalOp::IpcRts);
    hdr.iov_count = static_cast<uint8_t>(n);
    hdr.flags &= uint8_t(~wire::kLocalAckReq);  // the Fin comes anyway, after delivery
    await_local(op, to, 0, 0, true);
    to.out.push(local_->channel()->sender(), hdr, body, n * sizeof(wire::LocalIpc));
    return true;
}

// The receiver of our IpcRts s could not map our memory (FI_EOPNOTSUPP): the same message in
// Frag cells flagged kLocalRestaged, for the receive it holds, copied out by our device; or,
// under FI_HMEM_P2P_REQUIRED, an empty last Frag carrying the error, which releases that
// receive. True when the send goes on (restaged), false when it ends with the error.
bool Engine::restage_local_send(const LocalSend &s) {
    TxOp *op = s.op;
    shm::PeerInbox &to = *s.to;
    auto &counters = hmem::counters();
    wire::LocalHeader hdr = local_header(op, wire::LocalOp::Frag);
    hdr.flags |= wire::kLocalRestaged;
    shm::Channel &channel = *local_->channel();
    if (p2p_.mode() == FI_HMEM_P2P_REQUIRED) {
        counters.refused_transfers.fetch_add(1, std::memory_order_relaxed);
        if (to.reachable()) {
            hdr.flags = uint8_t((hdr.flags & ~wire::kLocalAckReq) | wire::kLocalLast);
            hdr.status = FI_EOPNOTSUPP;
            to.out.push(channel.sender(), hdr, nullptr, 0);
            flush_soon(channel);
        }
        return false;
    }
    if (!to.reachable()) return false;
    counters.p2p_transfers.fetch_sub(1, std::memory_order_relaxed);
    counters.staged_transfers.fetch_add(1, std::memory_order_relaxed);
    // (FI_DELIVERY_COMPLETE: it completes at the receiver's Fin for the staged copy.)
    send_local_frag(op, to, hdr, op->iov.data(), op->iov.size(), op->mem.data());
    return true;
}

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
