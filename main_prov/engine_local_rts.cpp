// The node-local channel's single copy in tandem's receive side: the decoder of Rts cells (a
// message its receiver copies out of the sender's memory with cross-memory attach, the sender
// told by a Fin once it is read) and of the WriteDone cells that end a split copy of one
// (shm::SingleCopy: from wire::kLocalSplitMin both processes copy half). An Rts matches, is
// delivered or kept as unexpected as any other message (the one queue, so that one sender's
// messages match in the order it sent them); what is kept is the sender's buffer list, read
// once a receive comes. Device receives are read through a host bounce buffer.
#include "common/log.h"
#include "common/test_hook.h"
#include "main_prov/engine.h"
#include "main_prov/local_path.h"
#include "main_prov/shm/channel.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

namespace tandem {

void Engine::receive_rts_cell(const uint8_t *cell) {
    wire::LocalHeader lh;
    memcpy(&lh, cell, sizeof lh);
    const std::string_view sender(reinterpret_cast<const char *>(cell + sizeof lh),
                                  std::min<size_t>(lh.name_len, wire::kLocalNameRoom));
    shm::Channel *channel = local_->channel();
    LocalRts rts;
    rts.count = lh.iov_count;
    uint64_t named = 0;
    const bool fits = lh.name_len <= wire::kLocalNameRoom && lh.iov_count <= wire::kLocalMaxIov;
    if (fits) {
        memcpy(rts.iov, cell + sizeof lh + wire::kLocalNameRoom,
               rts.count * sizeof(wire::LocalIov));
        for (size_t i = 0; i < rts.count; ++i) named += rts.iov[i].length;
    }
    if (!fits || !rts.count || named != lh.total) [[unlikely]] {
        // Not a message we can read: the sender, if it is one of ours, is told, not left to
        // wait for ever.
        TANDEM_WARN(FI_LOG_EP_DATA, "refusing a malformed Rts (%u buffers, %llu bytes)\n",
                    lh.iov_count, (unsigned long long)lh.total);
        if (lh.name_len <= wire::kLocalNameRoom) answer_local(sender, lh.msg_id, FI_EIO);
        return;
    }
    // The process we are to read from is the one the sender's name leads to (answered as
    // refused otherwise).
    if (!channel->vouch_for_process(lh, sender)) return;
    receive_local_rendezvous(lh, sender, rts, nullptr);
}

void Engine::receive_local_rendezvous(const wire::LocalHeader &lh, std::string_view sender,
                                      LocalRts rts, const uint8_t *entries) {
    rts.pid = lh.pid;
    wire::ProtoHeader hdr = proto_header_of(lh);
    hdr.op = static_cast<uint8_t>(wire::ProtoOp::Rts);
    hdr.size = lh.total;
    hdr.flags &= uint8_t(~wire::kProtoAckReq);  // (a Fin comes anyway, once it is read)
    const fi_addr_t src = local_source(sender);
    RxMatcher &m = *rx_;
    if (RxOp *rx = m.match_posted(hdr.flags & wire::kProtoTagged, hdr.tag, src)) {
        start_local_rendezvous(slice_for(m, rx, hdr.size), hdr, sender, rts, entries, src);
        return;
    }
    Unexpected ux;
    ux.ep = this;
    ux.src = src;
    if (src == FI_ADDR_NOTAVAIL) ux.sender = sender;
    ux.answer_to = sender;
    ux.hdr = hdr;
    ux.local_rts = rts;
    if (rts.ipc) ux.data.assign(entries, entries + rts.count * sizeof(wire::LocalIpc));
    m.push_unexpected(std::move(ux));
}

void Engine::start_local_rendezvous(RxOp *rx, const wire::ProtoHeader &hdr, std::string_view sender,
                                    const LocalRts &rts, const uint8_t *entries, fi_addr_t src) {
    if (rts.ipc)
        start_local_ipc(rx, hdr, sender, rts, entries, src);
    else
        start_local_rts(rx, hdr, sender, rts, src);
}

// The message an Rts names into a receive: now, or our half now and the sender's part at its
// WriteDone (local_splits_).
void Engine::start_local_rts(RxOp *rx, const wire::ProtoHeader &hdr, std::string_view sender,
                             const LocalRts &rts, fi_addr_t src) {
    const size_t n = std::min<size_t>(hdr.size, rx->total);
    iovec theirs[wire::kLocalMaxIov];
    shm::remote_iovecs(reinterpret_cast<const uint8_t *>(rts.iov), rts.count, theirs);
    shm::Channel *channel = local_ ? local_->channel() : nullptr;
    stop_at("local.before_cma_read");
    int err = 0;
    if (!channel) {
        err = FI_ECONNRESET;  // (closed: nothing reaches the sender any more)
    } else if (rx->device) {
        // Cross-memory attach reaches no device memory: a copy through host memory.
        if (local_refuses_device(n))
            err = FI_EOPNOTSUPP;
        else if (n)
            err = shm::SingleCopy::read_through_host(rts.pid, rx->iov, rx->mem, rx->count, theirs,
                                                     rts.count, n);
    } else {
        shm::SingleCopy copy(rts.pid, rx->iov, rx->count, theirs, rts.count, n);
        if (!copy.start(*channel, channel->sender_peer(sender), hdr.msg_id)) {
            local_splits_.insert_or_assign(std::make_pair(std::string(sender), hdr.msg_id),
                                           LocalSplit{rx, hdr, src, copy});
            note_owner_waits();
            flush_soon(*channel);  // (the Cts may wait in the sender's backlog)
            return;
        }
        err = copy.status();
    }
    finish_local_rts(rx, hdr, sender, src, n, err);
}

// The sender may have its buffers back (Fin, with our status), and the receive completes:
// truncated when it had less room than the message.
void Engine::finish_local_rts(RxOp *rx, const wire::ProtoHeader &hdr, std::string_view sender,
                              fi_addr_t src, size_t n, int err) {
    answer_local(sender, hdr.msg_id, err);
    const size_t olen = hdr.size - n;
    if (!err && olen) err = FI_ETRUNC;
    rx_complete(rx, n, hdr.tag, hdr.cq_data, hdr.flags, src, err, olen);
}

void Engine::wait_on_senders() {
    forget_dead_senders();
    if (!local_splits_.empty() && !inbox_ring_->peek() && ++split_waits_ % kYieldEvery == 0)
        sched_yield();
}

void Engine::note_owner_waits() {
    if (!local_) return;
    const bool waits = !local_sends_.empty() || !local_splits_.empty() || !staged_.empty();
    local_->channel()->owner_waits = waits;
    if (waits && twin_quiet_) *twin_quiet_ = false;  // (its next pass sees it)
}

bool Engine::receive_write_done(const uint8_t *cell) {
    wire::LocalHeader lh;
    memcpy(&lh, cell, sizeof lh);
    if (lh.name_len > wire::kLocalNameRoom) return false;
    const std::string_view sender(reinterpret_cast<const char *>(cell + sizeof lh), lh.name_len);
    auto it = local_splits_.find(std::make_pair(std::string(sender), lh.msg_id));
    if (it == local_splits_.end()) return false;
    if (lh.pid != it->second.copy.pid()) [[unlikely]] {
        // Only the sender's process writes its part: a WriteDone from another is no news of it.
        TANDEM_WARN(FI_LOG_EP_DATA, "ignoring a WriteDone from process %d for process %d's\n",
                    lh.pid, it->second.copy.pid());
        return true;
    }
    LocalSplit split = std::move(it->second);
    local_splits_.erase(it);
    note_owner_waits();
    split.copy.finish(*local_->channel(), lh.status);
    finish_local_rts(split.rx, split.hdr, sender, split.src, split.copy.length(),
                     split.copy.status());
    return true;
}

}  // namespace tandem
