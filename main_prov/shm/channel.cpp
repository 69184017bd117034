#include "main_prov/shm/channel.h"

#include "common/log.h"

#include <rdma/fi_errno.h>
#include <unistd.h>

#include <algorithm>

namespace tandem::shm {

void Channel::open_inbox(const std::string &key, const InboxShape &shape,
                         const PeerPolicy &policy) {
    reap_stale();
    InboxSegment seg = InboxSegment::create(key, shape.cells, shape.cell_size, shape.identity);
    // We own the key now (the segment was created exclusively), and its wake FIFO with it.
    wake_.emplace(key);
    segment_.emplace(std::move(seg));
    inbox_ = segment_->ring;
    heartbeat_ = &segment_->info->heartbeat;
    claims_ = SplitClaims(segment_->split_claims);
    policy_ = policy;
    version_word_ = book_.version_word();
}

PeerInbox *Channel::find_peer_at(fi_addr_t addr) {
    if (!segment_) return nullptr;
    uint64_t version = book_version();
    if (version != peers_version_) {
        peer_by_addr_.clear();
        last_peer_ = nullptr;
        peers_version_ = version;
    }
    PeerInbox *peer = nullptr;
    if (auto it = peer_by_addr_.find(addr); it != peer_by_addr_.end() && it->second->reachable()) {
        peer = it->second;
    } else {
        uint8_t name[128];
        size_t len = sizeof name;
        if (book_.lookup(addr, name, &len) != 0 || len > sizeof name) return nullptr;
        auto key = local_key(name, len);
        if (!key) return nullptr;
        peer = peer_of(*key, std::string_view(reinterpret_cast<char *>(name), len));
        if (!peer) return nullptr;
        peer_by_addr_[addr] = peer;
    }
    last_addr_ = addr;
    last_peer_ = peer;
    return peer;
}

PeerInbox *Channel::peer_of(const std::string &key, std::string_view addr, bool sent_us) {
    if (!segment_) return nullptr;
    auto it = peers_.find(key);
    if (it != peers_.end() && (it->second->reachable() || (!sent_us && !reopen_due(*it->second))))
        return it->second.get();
    // (None: no endpoint of this address on this node, not ours, not one that lives, or not a
    // peer of ours: open_peer.)
    std::optional<PeerInbox> opened = open_peer(key, addr, policy_);
    if (!opened) return it == peers_.end() ? nullptr : it->second.get();
    auto peer = std::make_unique<PeerInbox>(std::move(*opened));
    PeerInbox *raw = peer.get();
    if (it == peers_.end()) {
        peers_.emplace(key, std::move(peer));
        return raw;
    }
    // A new endpoint at the address of one that died (a server restarted on its port) or
    // closed (the same process may open the next one there, as fabtests' multi-client test
    // does): the key is the new one's now. One that closed is judged as a dead one is, from
    // the retiring list (check_peers): operations sent to it end by its answers, which may
    // still wait in our inbox, or with FI_ECONNRESET once none can.
    PeerInbox &old = *it->second;
    TANDEM_INFO(FI_LOG_EP_CTRL, "node-local peer %s: a new endpoint (pid %d) after pid %d's %s\n",
                key.c_str(), raw->pid, old.pid, old.dead ? "death" : "close");
    if (old.dead) {
        buried_.push_back(std::move(it->second));
    } else {
        old.succeeded_in_process = raw->pid == old.pid;
        retiring_.push_back(std::move(it->second));
    }
    it->second = std::move(peer);
    forget_lookups();
    return raw;
}

bool Channel::reopen_due(PeerInbox &gone) {
    const int64_t now = coarse_now_ms();
    if (now < gone.reopen_at_ms) return false;
    gone.reopen_at_ms = now + kReopenEveryMs;
    return true;
}

// The lookups kept by address and by sender name: one may lead to a peer that a new one
// replaced.
void Channel::forget_lookups() {
    peer_by_addr_.clear();
    last_addr_ = FI_ADDR_NOTAVAIL;
    last_peer_ = nullptr;
    last_sender_.clear();
    last_sender_peer_ = nullptr;
}

PeerInbox *Channel::sender_peer(std::string_view sender) {
    if (last_sender_peer_ && sender == last_sender_ && last_sender_peer_->reachable())
        return last_sender_peer_;
    auto key = local_key(sender.data(), sender.size());
    // (A cell from an address whose peer died or closed is the news that a new endpoint may
    // be there: looked for at once, whenever the last look was. Waiting for the next look
    // due lost the answers to the first cells of an endpoint reopened there.)
    PeerInbox *peer = key ? peer_of(*key, sender, true) : nullptr;
    if (peer) {
        last_sender_.assign(sender);
        last_sender_peer_ = peer;
    }
    return peer && !peer->dead ? peer : nullptr;
}

bool Channel::names_process(const wire::LocalHeader &hdr) {
    switch (static_cast<wire::LocalOp>(hdr.op)) {
        case wire::LocalOp::Rts:
        case wire::LocalOp::Cts:
        case wire::LocalOp::IpcRts:
        case wire::LocalOp::IpcWrite:
            return true;
        case wire::LocalOp::Write:
        case wire::LocalOp::Read:
            // Without the initiator's iov a write's data is inline, and a read's answer goes
            // back in ReadData cells: no cross-memory attach to the initiator.
            return hdr.iov_count > 0;
        default:
            return false;
    }
}

PeerInbox *Channel::vouch_for_process(wire::LocalHeader &hdr, std::string_view sender) {
    PeerInbox *peer = sender_peer(sender);
    const auto op = static_cast<wire::LocalOp>(hdr.op);
    const bool cma = op != wire::LocalOp::IpcRts && op != wire::LocalOp::IpcWrite;
    if (peer && (!cma || peer->cma)) {
        hdr.pid = peer->pid;
        return peer;
    }
    TANDEM_WARN(
        FI_LOG_EP_DATA, "refusing a cell (op %u) that names process %d: %s\n", hdr.op, hdr.pid,
        !peer ? "its sender has no segment here" : "no cross-memory attach with its sender");
    if (!peer) return nullptr;
    const bool cts = op == wire::LocalOp::Cts;
    wire::LocalHeader answer =
        header(cts ? wire::LocalOp::WriteDone : wire::LocalOp::Fin, hdr.msg_id);
    answer.status = cts ? FI_EIO : FI_EACCES;
    peer->out.push(sender_, answer, nullptr, 0);
    return nullptr;
}

bool Channel::answer(std::string_view sender, uint64_t msg_id, int status) {
    PeerInbox *to = sender_peer(sender);
    if (!to) return false;
    wire::LocalHeader fin = header(wire::LocalOp::Fin, msg_id);
    fin.status = status;
    to->out.push(sender_, fin, nullptr, 0);
    return true;
}

wire::LocalHeader Channel::header(wire::LocalOp op, uint64_t msg_id) const {
    wire::LocalHeader hdr{};
    hdr.op = static_cast<uint8_t>(op);
    hdr.name_len = sender_.short_line ? sender_.short_line->name_len : 0;
    hdr.pid = pid_;
    hdr.msg_id = msg_id;
    return hdr;
}

// source_of past its last-sender check. The name is read as whole words there: it comes from
// a cell (zero-padded to a multiple of 8, the rest of the cell after it) and is kept here the
// same way.
fi_addr_t Channel::find_source(std::string_view sender) {
    uint64_t version = book_version();
    if (version != sources_version_) {
        sources_.clear();
        sources_version_ = version;
    }
    auto known = std::find_if(sources_.begin(), sources_.end(),
                              [&](const auto &source) { return source.first == sender; });
    fi_addr_t addr;
    if (known != sources_.end()) {
        addr = known->second;
    } else {
        addr = book_.addr_of(sender.data(), sender.size());
        if (sources_.size() >= 64) sources_.clear();
        sources_.emplace_back(std::string(sender), addr);
    }
    if (version_word_) last_source_.remember(sender, version, addr);
    return addr;
}

// No cell a dead process claimed in our inbox without publishing it stops the cells behind.
void Channel::skip_dead_claims() {
    if (!inbox_) return;
    if (uint32_t n = inbox_->reclaim_dead([this](uint32_t id) { return claimants_.alive(id); }))
        TANDEM_INFO(FI_LOG_EP_DATA, "skipped %u inbox cells claimed by dead processes\n", n);
}

void Channel::mark_dead(PeerInbox &peer) {
    peer.dead = true;
    peer.out.close_dead(sender_);  // (its backlog's streams end with FI_ECONNRESET)
    deaths_.push_back({peer.key, peer.pid, peer.succeeded_in_process});
    TANDEM_INFO(FI_LOG_EP_DATA,
                "node-local peer %s is gone (its endpoint closed or its process died)\n",
                peer.key.c_str());
}

void Channel::flush_all() {
    for (auto &[key, peer] : peers_)
        if (!peer->dead) peer->out.flush(sender_);
}

}  // namespace tandem::shm
