// The owner side of a peer SRX over one of tandem's receive matchers (an endpoint's own, or
// a shared receive context's). A peer provider that gets a message asks for a receive buffer
// here; a message that finds none is queued among the matcher's unexpected messages, in
// arrival order with those that came over tandem's links, and started when a receive
// matching it is posted (Engine::deliver_unexpected).
//
// Two ways a peer's receive completions reach the application:
//  - ThroughOwner (tandem's own offload twin): entry->context is tandem's RxOp and the
//    peer writes the completion to the endpoint's LocalPath, which completes the RxOp as a
//    link completion would (counters, selective completion, multi-receive, ordering);
//  - Direct (an SRX exported with fi_export_fid to any importer, e.g. libfabric's shm):
//    entry->context is the application's and the importer writes the completion itself;
//    the RxOp is released when the importer frees the entry.
#pragma once

#include "main_prov/lock_order.h"
#include "main_prov/rx_matcher.h"
#include "peer/peer_srx.h"

#include <functional>
#include <vector>

namespace tandem {

class Domain;
class Engine;

class PeerRxQueue final : public peer::SrxOwner {
  public:
    enum class Mode { ThroughOwner, Direct };
    PeerRxQueue(Domain &domain, RxMatcher &matcher, Engine *report_ep, Mode mode, bool selective);
    ~PeerRxQueue();

    peer::ExportedSrx &exported() { return export_; }
    // With the domain lock held: a posted receive matched a message the peer queued.
    void start(peer::OwnerRxEntry *e, RxOp *rx);
    // FI_DISCARD of a queued message.
    void discard(peer::OwnerRxEntry *e);
    static PeerRxQueue *of(peer::OwnerRxEntry *e) { return static_cast<PeerRxQueue *>(e->owner); }
    // The source of a message the peer queued, as the AV names it now.
    fi_addr_t source(peer::OwnerRxEntry *e);

    int peer_get_msg(fi_addr_t addr, size_t size, fi_peer_rx_entry **entry) override;
    int peer_get_tag(fi_addr_t addr, uint64_t tag, fi_peer_rx_entry **entry) override;
    int peer_queue_msg(fi_peer_rx_entry *entry) override { return queue(entry, false); }
    int peer_queue_tag(fi_peer_rx_entry *entry) override { return queue(entry, true); }
    void peer_free_entry(fi_peer_rx_entry *entry) override;
    void peer_foreach_unspec_addr(const std::function<void(fi_peer_rx_entry *)> &fn) override;

  private:
    // Whether the caller of an entry holds the domain lock: our own twin always does (it runs
    // only inside tandem's calls); a provider we did not build (Direct, through
    // fi_srx_context) does only when it calls back from inside our start or discard of one of
    // its messages (free_entry, made while we hold the lock), on that thread.
    bool caller_holds_lock() const;
    int get(bool tagged, fi_addr_t addr, uint64_t tag, size_t size, fi_peer_rx_entry **entry);
    int queue(fi_peer_rx_entry *entry, bool tagged);
    peer::OwnerRxEntry *new_entry(fi_addr_t addr, uint64_t tag, size_t size);
    void fill(peer::OwnerRxEntry *e, RxOp *rx, bool tagged);

    Domain &domain_;
    RxMatcher &matcher_;
    Engine *report_ep_;
    Mode mode_;
    bool selective_;
    peer::ExportedSrx export_;
    std::vector<peer::OwnerRxEntry *> spare_;  // entries to reuse: no allocation per message
};

}  // namespace tandem
