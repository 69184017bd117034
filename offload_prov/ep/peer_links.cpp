// Peers (the channel, main_prov/shm/channel.h, opens and keeps them over the owner's AV):
// whether a peer is reachable, and what the liveness check's verdict fails, rather than leaves
// hanging: what waited on a peer that died.
#include "offload_prov/endpoint.h"

#include "offload_prov/av.h"

namespace tandem::off {

using wire::LocalHeader;

int Endpoint::reachable(fi_addr_t addr) {
    if (!enabled_) return 0;
    PeerLink *link = link_for(addr);
    return link && !link->dead;
}

// A peer that died leaves our operations waiting on it with errors, not a hang, and no
// cell it had claimed in our inbox without publishing it stops the cells behind. A peer
// is dead once the cells it wrote us before it died are read (shm::DeathVerdict): true while
// a verdict waits for that (the caller checks again soon).
bool Endpoint::check_peers() {
    return channel_->check_peers([this](PeerLink &link) { bury(link); });
}

// A peer found dead (the channel marked it so and ended its backlog's streams): what else
// waits on it ends with FI_ECONNRESET.
void Endpoint::bury(PeerLink &link) {
    const auto sent_by_it = [&link](std::string_view name) {
        return shm::names_key(name, link.key);
    };
    for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second.link != &link) {
            ++it;
            continue;
        }
        complete_tx(it->second.context, it->second.flags, it->second.len, FI_ECONNRESET);
        it = pending_.erase(it);
    }
    for (AtomicSlot &slot : atomics_)
        if (slot.link == &link) finish_atomic_slot(slot, FI_ECONNRESET);
    // What is kept by sender address: a closed endpoint succeeded by another of its process
    // at its address cannot be told from that one there (left to end as it comes).
    if (link.succeeded_in_process) return;
    // Receives whose sender was still to write its half.
    for (auto it = splits_.begin(); it != splits_.end();) {
        if (!sent_by_it(it->first.first)) {
            ++it;
            continue;
        }
        Split split = std::move(it->second);
        it = splits_.erase(it);
        split.copy.abandon(*channel_);
        if (split.entry)
            complete_rx(split.entry, split.hdr, split.copy.length(), FI_ECONNRESET, split.src);
    }
    // Its staged writes that failed here, the messages it was staging (its own, by pid: a new
    // process at its address may have begun one under the same id), and what it sent behind
    // a split write of its: nobody waits for any of it now.
    const auto keyed_by_it = [&](const auto &entry) { return sent_by_it(entry.first.first); };
    std::erase_if(failed_writes_, keyed_by_it);
    std::erase_if(staged_, [&](const auto &entry) {
        return entry.second.hdr.pid == link.pid && keyed_by_it(entry);
    });
    channel_->holds().forget(sent_by_it);
    // Receives waiting for a staged copy it will never send, and its memory we mapped.
    for (auto it = restaging_.begin(); it != restaging_.end();) {
        if (!sent_by_it(it->first.first)) {
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
    ipc_import_.forget_peer(static_cast<uint64_t>(link.pid));
}

}  // namespace tandem::off
