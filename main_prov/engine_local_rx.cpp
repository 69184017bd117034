// The node-local channel's receive side in tandem: the decoders of the message cells that
// carry host memory, read off the twin's inbox by read_inbox (endpoint_data.cpp, with the
// Short cell's fast path). A Short cell past a plain posted receive, an Eager cell and a
// staged message reassembled from its Frag cells end in receive_local, which matches,
// delivers or keeps the message as any other (the one queue of unexpected messages), and
// answers a sender that waits for a Fin through its Outbox; a staged message that a plain
// posted receive takes at its first fragment is copied there fragment by fragment (so is a
// restaged device message, into the receive its IpcRts matched). Rts cells are
// engine_local_rts.cpp's, IpcRts cells engine_local_ipc.cpp's; RMA and atomics are still the
// twin's (docs/architecture.md, step 3).
#include "common/iov.h"
#include "common/log.h"
#include "main_prov/av.h"
#include "main_prov/engine.h"
#include "main_prov/local_path.h"
#include "main_prov/shm/channel.h"

#include <algorithm>
#include <cstring>

namespace tandem {

// A Short cell that no plain posted receive takes.
void Engine::receive_short_slow(const uint8_t *cell, fi_addr_t src) {
    ShortView v;
    if (!read_short(cell, v)) return;  // (receive_short read it already)
    wire::ProtoHeader hdr{};
    hdr.op = static_cast<uint8_t>(wire::ProtoOp::Eager);
    hdr.flags = uint8_t(((v.flags & wire::kLocalTagged) ? wire::kProtoTagged : 0) |
                        ((v.flags & wire::kLocalCqData) ? wire::kProtoCqData : 0));
    hdr.size = v.size;
    hdr.tag = v.tag;
    hdr.cq_data = v.cq_data;
    receive_local(hdr, v.sender, v.data, src);
}

void Engine::receive_eager_cell(const uint8_t *cell) {
    wire::LocalHeader lh;
    memcpy(&lh, cell, sizeof lh);
    if (lh.name_len > wire::kLocalNameRoom || lh.size > wire::kLocalBodyRoom || lh.total != lh.size)
        [[unlikely]] {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed eager cell (%u bytes, %llu claimed)\n",
                    lh.size, (unsigned long long)lh.total);
        return;
    }
    const std::string_view sender(reinterpret_cast<const char *>(cell + sizeof lh), lh.name_len);
    receive_local(proto_header_of(lh), sender, cell + sizeof lh + wire::kLocalNameRoom,
                  local_source(sender));
}

// A fragment of a staged message (Frag cells: one sender's come in order, each after the one
// before). A Frag with a status ends its message instead (the sender could not copy its
// memory). A restaged device message's (kLocalRestaged) go into the receive its IpcRts
// matched (restage_local_ipc).
void Engine::receive_frag(const uint8_t *cell) {
    wire::LocalHeader lh;
    memcpy(&lh, cell, sizeof lh);
    if (lh.name_len > wire::kLocalNameRoom || lh.size > wire::kLocalBodyRoom) [[unlikely]] {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed fragment\n");
        return;
    }
    const std::string_view sender(reinterpret_cast<const char *>(cell + sizeof lh), lh.name_len);
    std::pair<std::string, uint64_t> id{std::string(sender), lh.msg_id};
    auto it = staged_.find(id);
    if (lh.status) {
        if (it != staged_.end()) end_staged(it, lh.status);
        return;
    }
    // A message of 0 bytes goes whole (Eager), and none is larger than we take: the first
    // fragment's total is what reassembly reserves, so it is checked first.
    if (lh.total == 0 || lh.total > info_->ep_attr->max_msg_size) {
        if (it != staged_.end()) end_staged(it, FI_EIO);
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a fragment of a %llu-byte message\n",
                    (unsigned long long)lh.total);
        return;
    }
    // A first fragment where a message of that id is under way is a new process's at the
    // sender's address (the one before died mid message, and ids start again at 1): the dead
    // one's message ends as its death would have ended it.
    if (lh.offset == 0 && !awaits_restaged(it, lh)) {
        if (it != staged_.end()) end_staged(it, FI_ECONNRESET);
        it = start_staged(std::move(id), lh, sender);
    }
    if (it == staged_.end() || lh.offset != it->second.received ||
        lh.total != it->second.hdr.size || lh.size > lh.total - lh.offset) {
        if (it != staged_.end()) end_staged(it, FI_EIO);
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a fragment out of its message\n");
        return;
    }
    StagedMessage &m = it->second;
    const uint8_t *body = cell + sizeof lh + wire::kLocalNameRoom;
    if (!m.into)
        m.data.insert(m.data.end(), body, body + lh.size);
    else if (!m.into->device)
        m.placed += iov_scatter(m.into->iov, m.into->count, lh.offset, body, lh.size);
    else if (!m.status)  // (a restaged message into device memory)
        place_device_fragment(m, lh.offset, body, lh.size);
    m.received += lh.size;
    if (m.received == lh.total) finish_staged(it);
}

// A restaged message's first fragment, for the receive its IpcRts matched (from the process
// that sent that IpcRts; the sender asks delivery complete on the fragments).
bool Engine::awaits_restaged(StagedMap::iterator it, const wire::LocalHeader &lh) {
    if (!(lh.flags & wire::kLocalRestaged) || it == staged_.end()) return false;
    StagedMessage &m = it->second;
    if (!m.restaged || m.received || m.pid != lh.pid) return false;
    if (lh.flags & wire::kLocalAckReq) m.hdr.flags |= wire::kProtoAckReq;
    return true;
}

void Engine::place_device_fragment(StagedMessage &m, uint64_t offset, const uint8_t *body,
                                   uint32_t size) {
    const ssize_t placed =
        hmem::scatter(m.into->iov, m.into->mem, m.into->count, offset, body, size);
    if (placed < 0) {
        TANDEM_WARN(FI_LOG_EP_DATA, "a restaged fragment's copy failed: %s\n",
                    fi_strerror(int(-placed)));
        m.status = FI_EIO;
        return;
    }
    m.placed += size_t(placed);
}

// A staged message's first fragment: the first posted receive it matches takes it now when
// that is a plain host buffer and the channel watches the sender's process (the one that
// wrote the fragment), whose death would end the message; otherwise it is reassembled.
Engine::StagedMap::iterator Engine::start_staged(std::pair<std::string, uint64_t> id,
                                                 const wire::LocalHeader &lh,
                                                 std::string_view sender) {
    StagedMessage m;
    m.hdr = proto_header_of(lh);
    m.hdr.size = lh.total;
    m.pid = lh.pid;
    shm::Channel *channel = local_ ? local_->channel() : nullptr;
    shm::PeerInbox *peer = channel ? channel->sender_peer(sender) : nullptr;
    if (peer && peer->pid == m.pid)
        m.into =
            rx_->match_plain(m.hdr.flags & wire::kProtoTagged, m.hdr.tag, local_source(sender));
    // (Each fragment goes at the end of what came before, so the memory held is what was sent,
    // not what the first fragment claims.)
    if (!m.into) m.data.reserve(std::min<uint64_t>(lh.total, 64u << 20));
    auto it = staged_.insert_or_assign(std::move(id), std::move(m)).first;
    note_owner_waits();
    return it;
}

void Engine::finish_staged(StagedMap::iterator it) {
    StagedMessage m = std::move(it->second);
    const std::string sender = it->first.first;
    staged_.erase(it);
    note_owner_waits();
    const fi_addr_t src = local_source(sender);
    if (!m.into) {
        receive_local(m.hdr, sender, m.data.data(), src, &m.data);
        return;
    }
    const size_t olen = m.hdr.size - m.placed;
    int err = m.status ? m.status : olen ? FI_ETRUNC : 0;
    if (m.status == FI_EOPNOTSUPP)
        hmem::counters().refused_transfers.fetch_add(1, std::memory_order_relaxed);
    rx_complete(m.into, m.placed, m.hdr.tag, m.hdr.cq_data, m.hdr.flags, src, err, olen);
    if (m.hdr.flags & wire::kProtoAckReq) answer_local(sender, m.hdr.msg_id, m.status);
}

void Engine::end_staged(StagedMap::iterator it, int status) {
    if (RxOp *rx = it->second.into) {
        const wire::ProtoHeader &hdr = it->second.hdr;
        rx_complete(rx, 0, hdr.tag, hdr.cq_data, hdr.flags, local_source(it->first.first), status,
                    hdr.size);
    }
    staged_.erase(it);
    note_owner_waits();
}

void Engine::forget_dead_senders() {
    shm::Channel *channel = local_ ? local_->channel() : nullptr;
    if (!channel) return;
    const std::vector<shm::Channel::Death> &deaths = channel->deaths();
    for (; deaths_seen_ < deaths.size(); ++deaths_seen_) {
        const shm::Channel::Death &dead = deaths[deaths_seen_];
        // (By process as well as address: a new process at the address may have begun a
        // message under the same id before the death was judged. An endpoint that closed,
        // succeeded by another of its process at its address, cannot be told from that one
        // by its cells: what they sent is left to end as it comes.)
        const auto sent_by_dead = [&dead](const std::string &sender, pid_t pid) {
            return !dead.succeeded_in_process && pid == dead.pid &&
                   shm::names_key(sender, dead.key);
        };
        for (auto it = staged_.begin(); it != staged_.end();) {
            auto next = std::next(it);
            if (sent_by_dead(it->first.first, it->second.pid)) end_staged(it, FI_ECONNRESET);
            it = next;
        }
        for (auto it = local_splits_.begin(); it != local_splits_.end();) {
            if (!sent_by_dead(it->first.first, it->second.copy.pid())) {
                ++it;
                continue;
            }
            LocalSplit split = std::move(it->second);
            const std::string sender = it->first.first;
            it = local_splits_.erase(it);
            note_owner_waits();
            split.copy.abandon(*channel);
            finish_local_rts(split.rx, split.hdr, sender, split.src, split.copy.length(),
                             split.copy.status());
        }
        if (!local_sends_.empty()) fail_sends_to_dead();
    }
}

// The message a long header describes, as the engine's receive side takes every message.
wire::ProtoHeader Engine::proto_header_of(const wire::LocalHeader &lh) {
    wire::ProtoHeader hdr{};
    hdr.op = static_cast<uint8_t>(wire::ProtoOp::Eager);
    hdr.flags = uint8_t(((lh.flags & wire::kLocalTagged) ? wire::kProtoTagged : 0) |
                        ((lh.flags & wire::kLocalCqData) ? wire::kProtoCqData : 0) |
                        ((lh.flags & wire::kLocalAckReq) ? wire::kProtoAckReq : 0));
    hdr.size = lh.size;
    hdr.tag = lh.tag;
    hdr.cq_data = lh.cq_data;
    hdr.msg_id = lh.msg_id;
    return hdr;
}

// A node-local message in host cells: into the first posted receive it matches (a device or
// multi-receive buffer included), or kept, with its payload, until a receive comes (in the
// same queue as every other unexpected message, so that one sender's messages match in the
// order it sent them; `owned`, when given, is moved there). A sender waiting for a Fin
// (kProtoAckReq) gets it once the message is delivered or discarded.
void Engine::receive_local(const wire::ProtoHeader &hdr, std::string_view sender,
                           const uint8_t *data, fi_addr_t src, std::vector<uint8_t> *owned) {
    RxMatcher &m = *rx_;
    if (RxOp *rx = m.match_posted(hdr.flags & wire::kProtoTagged, hdr.tag, src)) {
        int err = deliver_eager(slice_for(m, rx, hdr.size), nullptr, hdr, data, src);
        if (hdr.flags & wire::kProtoAckReq)
            answer_local(sender, hdr.msg_id, err == FI_ETRUNC ? 0 : err);
        return;
    }
    Unexpected ux;
    ux.ep = this;
    ux.src = src;
    if (src == FI_ADDR_NOTAVAIL) ux.sender = sender;
    if (hdr.flags & wire::kProtoAckReq) ux.answer_to = sender;
    ux.hdr = hdr;
    if (owned)
        ux.data = std::move(*owned);
    else
        ux.data.assign(data, data + hdr.size);
    m.push_unexpected(std::move(ux));
}

fi_addr_t Engine::local_source_lookup(std::string_view sender, uint64_t version) {
    const fi_addr_t src = av_->addr_of_bytes(sender.data(), sender.size());
    last_sender_.remember(sender, version, src);
    return src;
}

void Engine::answer_local(std::string_view sender, uint64_t msg_id, int status) {
    shm::Channel *channel = local_ ? local_->channel() : nullptr;
    if (channel && channel->answer(sender, msg_id, status)) flush_soon(*channel);
}

// A full ring keeps what we pushed in the peer's backlog, which the twin's pass flushes: that
// pass must come while the twin would otherwise be quiet.
void Engine::flush_soon(shm::Channel &channel) {
    if (channel.sender().backlogged) *twin_quiet_ = false;
}

// What the twin decides for the cells it delivers into device memory: a copy, refused only
// under FI_HMEM_P2P_REQUIRED.
bool Engine::local_refuses_device(size_t len) {
    if (!len || p2p_.mode() != FI_HMEM_P2P_REQUIRED) return false;
    hmem::counters().refused_transfers.fetch_add(1, std::memory_order_relaxed);
    return true;
}

}  // namespace tandem
