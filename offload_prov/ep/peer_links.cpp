// Peers' inboxes: the link to a destination (by fi_addr_t) or to a sender (by its address
// bytes), opened on first use (shm::open_peer) and cached per AV version; a sender's fi_addr_t; and
// the liveness check that fails, rather than leaves hanging, what waited on a peer that died.
#include "offload_prov/endpoint.h"

#include "common/log.h"
#include "offload_prov/av.h"
#include "offload_prov/config.h"

#include <cstring>

namespace tandem::off {

using wire::LocalHeader;

int Endpoint::reachable(fi_addr_t addr) {
    if (!enabled_) return 0;
    PeerLink *link = link_for(addr);
    return link && !link->dead;
}

int Endpoint::single_copy(fi_addr_t addr) {
    PeerLink *link = enabled_ ? link_for(addr) : nullptr;
    if (!link || link->dead) return -FI_ENOENT;
    return link->cma ? 1 : 0;
}

// The link of a destination, remembered per fi_addr_t until the AV changes (an address
// removed and another inserted may reuse the fi_addr_t).
Endpoint::PeerLink *Endpoint::link_for(fi_addr_t addr) {
    if (!shm_permitted_) return nullptr;
    uint64_t version = av_->owner().version();
    if (version != links_version_) {
        link_by_addr_.clear();
        last_link_ = nullptr;
        links_version_ = version;
    }
    if (addr == last_addr_ && last_link_) return last_link_;
    auto it = link_by_addr_.find(addr);
    if (it != link_by_addr_.end()) {
        last_addr_ = addr;
        last_link_ = it->second;
        return it->second;
    }
    uint8_t name[128];
    size_t len = sizeof name;
    if (av_->owner().lookup(addr, name, &len) != 0 || len > sizeof name) return nullptr;
    auto key = shm::local_key(name, len);
    if (!key) return nullptr;
    PeerLink *link = link_for_key(*key, std::string_view(reinterpret_cast<char *>(name), len));
    if (link) link_by_addr_[addr] = link;
    return link;
}

Endpoint::PeerLink *Endpoint::link_for_key(const std::string &key, std::string_view addr) {
    auto it = links_.find(key);
    if (it != links_.end()) return it->second.get();
    // (None: no endpoint of this address on this node, not ours, not one that lives, or not a
    // peer of ours: shm::open_peer.)
    const shm::PeerPolicy policy{.auth = auth_,
                                 .job = Config::get().job,
                                 .cma = Config::get().cma,
                                 .cma_off = " (FI_OFF_TANDEM_CMA=0)"};
    std::optional<shm::PeerInbox> peer = shm::open_peer(key, addr, policy);
    if (!peer) return nullptr;
    auto link = std::make_unique<PeerLink>(std::move(*peer));
    PeerLink *raw = link.get();
    links_.emplace(key, std::move(link));
    return raw;
}

// The inbox of the endpoint that sent a cell (named by its address bytes), if it lives.
Endpoint::PeerLink *Endpoint::link_to(std::string_view sender) {
    if (last_sender_link_ && sender == last_sender_)
        return last_sender_link_->dead ? nullptr : last_sender_link_;
    auto key = shm::local_key(sender.data(), sender.size());
    PeerLink *link = key ? link_for_key(*key, sender) : nullptr;
    if (link) {
        last_sender_.assign(sender);
        last_sender_link_ = link;
    }
    return link && !link->dead ? link : nullptr;
}

// The sender's fi_addr_t in the shared AV. Looked up through the owner once per sender and
// AV version: a receive completion must not pay a reverse lookup.
// source_of past its last-sender check. The name is read as whole words there: it comes from
// a cell (zero-padded to a multiple of 8, the rest of the cell after it) and is kept here the
// same way.
fi_addr_t Endpoint::find_source(std::string_view sender) {
    uint64_t version = av_->owner().version();
    if (version != sources_version_) {
        sources_.clear();
        sources_version_ = version;
    }
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
    bool found = false;
    for (const auto &[name, a] : sources_)
        if (name == sender) {
            addr = a;
            found = true;
            break;
        }
    if (!found) {
        addr = av_->owner().addr_of(sender.data(), sender.size());
        if (sources_.size() >= 64) sources_.clear();
        sources_.emplace_back(std::string(sender), addr);
    }
    if (av_version_word_) last_source_.remember(sender, version, addr);
    return addr;
}

// A peer that died leaves our operations waiting on it with errors, not a hang, and no
// cell it had claimed in our inbox without publishing it stops the cells behind. A peer
// is dead once the cells it wrote us before it died are read (shm::DeathVerdict): true while
// a verdict waits for that (the caller checks again soon).
bool Endpoint::check_peers() {
    if (uint32_t n =
            inbox_ ? inbox_->reclaim_dead([this](uint32_t id) { return claimants_.alive(id); }) : 0)
        TANDEM_INFO(FI_LOG_EP_DATA, "skipped %u inbox cells claimed by dead processes\n", n);
    bool waiting = false;
    for (auto &[key, link] : links_) {
        if (link->dead) continue;
        switch (link->verdict.judge(link->segment, inbox_)) {
            case shm::DeathVerdict::State::kAlive:
                break;
            case shm::DeathVerdict::State::kDraining:
                waiting = true;
                break;
            case shm::DeathVerdict::State::kDead:
                bury(link.get(), key);
                break;
        }
    }
    return waiting;
}

// A peer found dead: what waits on it ends with FI_ECONNRESET, and nothing more goes to it.
void Endpoint::bury(PeerLink *link, const std::string &key) {
    link->dead = true;
    link->out.close_dead(sender_);  // (its backlog's streams end with FI_ECONNRESET)
    TANDEM_INFO(FI_LOG_EP_DATA, "node-local peer %s died\n", key.c_str());
    for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second.link != link) {
            ++it;
            continue;
        }
        complete_tx(it->second.context, it->second.flags, it->second.len, FI_ECONNRESET);
        it = pending_.erase(it);
    }
    for (AtomicSlot &slot : atomics_)
        if (slot.link == link) finish_atomic_slot(slot, FI_ECONNRESET);
    // Receives whose sender was still to write its half.
    for (auto it = splits_.begin(); it != splits_.end();) {
        auto sender = shm::local_key(it->first.first.data(), it->first.first.size());
        if (!sender || *sender != key) {
            ++it;
            continue;
        }
        Split split = it->second;
        it = splits_.erase(it);
        claims_.release(split.claim);
        if (split.entry) complete_rx(split.entry, split.hdr, split.n, FI_ECONNRESET, split.src);
    }
    // Its staged writes that failed here, and what it sent behind a split write of its:
    // nobody waits for any of it now.
    std::erase_if(failed_writes_, [&](const auto &f) {
        auto sender = shm::local_key(f.first.first.data(), f.first.first.size());
        return sender && *sender == key;
    });
    std::erase_if(deferred_, [&](const auto &d) {
        auto sender = shm::local_key(d.first.data(), d.first.size());
        return sender && *sender == key;
    });
    // Receives waiting for a staged copy it will never send, and its memory we mapped.
    for (auto it = restaging_.begin(); it != restaging_.end();) {
        auto sender = shm::local_key(it->first.first.data(), it->first.first.size());
        if (!sender || *sender != key) {
            ++it;
            continue;
        }
        fi_peer_rx_entry *entry = it->second;
        LocalHeader hdr{};
        hdr.total = entry->size;
        hdr.tag = entry->tag;
        it = restaging_.erase(it);
        complete_rx(entry, hdr, 0, FI_ECONNRESET, entry->addr);
    }
    ipc_import_.forget_peer(static_cast<uint64_t>(link->pid));
}

}  // namespace tandem::off
