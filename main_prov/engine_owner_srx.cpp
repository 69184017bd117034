// tandem as the peer of a shared receive context another provider owns (fi_peer(3), "PEER
// SRX"): lnx links tandem with shm and matches every receive itself. Messages come over
// tandem's link only (bind_srx turns the node-local path off: the owner has its own for the
// node), so this is the link's receive side with the owner in place of tandem's posted
// receives:
//  - a message arrives and no receive of tandem's takes it (there are none: the context
//    refuses them): get_msg / get_tag asks the owner for its buffer;
//  - it gives one: the message goes into it as into a posted receive (eager copy, or the
//    rendezvous read), the completion goes to the CQ (the owner's, through a peer CQ), and
//    release_rx gives the entry back (free_entry);
//  - it gives none: the message is kept as unexpected, as always, and queued with the owner
//    in the entry it gave, which names the kept message (peer_context). The owner starts it
//    when the application posts a matching receive (owner_hands_back: then as above), or
//    discards it (dropped, a rendezvous sender told it may finish).
// Sources are told to the owner as completions tell them: the user ID of FI_AV_USER_ID
// (which lnx inserts every address with) or the fi_addr_t.
#include "common/log.h"
#include "main_prov/av.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"
#include "common/iov.h"

namespace tandem {

namespace {

uint64_t queued_flags(const wire::ProtoHeader &hdr) {
    return FI_RECV | ((hdr.flags & wire::kProtoTagged) ? FI_TAGGED : FI_MSG) |
           ((hdr.flags & wire::kProtoCqData) ? FI_REMOTE_CQ_DATA : 0);
}

}  // namespace

fi_ops_srx_peer *Engine::owner_peer_ops() {
    static constinit fi_ops_srx_peer ops = {
        .size = sizeof(fi_ops_srx_peer),
        .start_msg = [](fi_peer_rx_entry *e) { return owner_hands_back(e, true); },
        .start_tag = [](fi_peer_rx_entry *e) { return owner_hands_back(e, true); },
        .discard_msg = [](fi_peer_rx_entry *e) { return owner_hands_back(e, false); },
        .discard_tag = [](fi_peer_rx_entry *e) { return owner_hands_back(e, false); },
    };
    return &ops;
}

fi_addr_t Engine::reported_source(fi_addr_t src) const {
    return av_ ? av_->reported(src) : src;
}

RxOp *Engine::match_with_owner(const wire::ProtoHeader &hdr, fi_addr_t src) {
    const bool tagged = hdr.flags & wire::kProtoTagged;
    void *entry = nullptr;
    int ret;
    {
        DomainLock::PeerCall call(domain_->lock());
        ret = owner_srx_->get(tagged, reported_source(src), hdr.size, hdr.tag, &entry);
    }
    if (ret == 0 && entry) return owned_receive(*rx_, entry, tagged);
    if (ret == -FI_ENOENT && entry) {
        unqueued_entry_ = entry;  // (keep_unexpected queues it)
        return nullptr;
    }
    // Without an entry the owner can never hand the message a buffer: it stays here, where
    // nothing will ask for it, and the owner's application hears of it through the log.
    TANDEM_WARN(FI_LOG_EP_DATA, "the SRX owner had no entry for a message (%d): it is dropped\n",
                ret);
    return nullptr;
}

RxOp *Engine::owned_receive(RxMatcher &m, void *entry, bool tagged) {
    peer::OwnedReceive r = owner_srx_->read(entry);
    if (r.count > kMaxIov) {
        TANDEM_WARN(FI_LOG_EP_DATA, "an SRX owner's receive of %zu buffers: the first %zu used\n",
                    r.count, kMaxIov);
        r.count = kMaxIov;
    }
    RxOp *rx = m.new_op();
    rx->context = r.context;
    rx->op_flags = r.flags & FI_COMPLETION;
    rx->count = r.iov ? r.count : 0;
    for (size_t i = 0; i < rx->count; ++i) {
        rx->iov[i] = r.iov[i];
        rx->desc[i] = r.desc ? r.desc[i] : nullptr;
    }
    rx->device = r.desc && peer::mems_of(rx->desc, rx->count, rx->mem);
    rx->total = iov_length(rx->iov, rx->count);
    rx->tagged = tagged;
    rx->owned = true;
    rx->owner_entry = entry;
    ++m.outstanding;
    return rx;
}

void Engine::queue_with_owner(Unexpected &kept) {
    void *entry = std::exchange(unqueued_entry_, nullptr);
    kept.owner_entry = entry;
    peer::QueuedMessage m;
    m.addr = reported_source(source_of(kept.conn));
    m.size = kept.hdr.size;
    m.tag = kept.hdr.tag;
    m.flags = queued_flags(kept.hdr);
    m.cq_data = kept.hdr.cq_data;
    m.peer_context = &kept;
    int ret;
    {
        DomainLock::PeerCall call(domain_->lock());
        ret = owner_srx_->queue(kept.tagged(), entry, m);
    }
    if (ret) {
        TANDEM_WARN(FI_LOG_EP_DATA, "the SRX owner refused a queued message: %d\n", ret);
        return;
    }
    owner_queued_.insert(entry);
}

namespace {
// The endpoint whose queued entries foreach_unspec_addr is asking about (get_addr has no
// argument but the entry); set by tell_owner_new_sources on this thread, under the lock.
thread_local const Engine *asking_owner = nullptr;
}  // namespace

// fi_peer(3): a peer whose AV gains addresses calls foreach_unspec_addr, and the owner gives
// each entry it keeps with source FI_ADDR_UNSPEC to get_addr. Without it a message that came
// before its sender was inserted would never meet a receive directed at that sender.
void Engine::tell_owner_new_sources(const Av *av) {
    if (!owner_srx_ || av != av_ || owner_queued_.empty()) return;
    const Engine *outer = std::exchange(asking_owner, this);
    {
        DomainLock::PeerCall call(domain_->lock());
        owner_srx_->foreach_unspec_addr(&queued_source);
    }
    asking_owner = outer;
}

fi_addr_t Engine::queued_source(void *entry) {
    const Engine *ep = asking_owner;
    if (!ep || !ep->owner_queued_.contains(entry)) return FI_ADDR_UNSPEC;
    peer::OwnedReceive r = peer::ForeignOwnerSrx::read(ep->owner_srx_->abi(), entry);
    const auto *kept = static_cast<const Unexpected *>(r.peer_context);
    return ep->reported_source(source_of(*kept));
}

void Engine::owner_done(void *entry) {
    DomainLock::PeerCall call(domain_->lock());
    owner_srx_->free_entry(entry);
}

// The owner found a receive for a message tandem queued with it (start), or drops it
// (discard). Called from the owner's receive call, outside tandem's lock; the entry names the
// kept message (peer_context), and that its endpoint.
int Engine::owner_hands_back(fi_peer_rx_entry *entry, bool start) {
    if (!entry) return -FI_EINVAL;
    peer::OwnedReceive r = peer::ForeignOwnerSrx::read(peer::ForeignOwnerSrx::core_abi(), entry);
    auto *kept = static_cast<Unexpected *>(r.peer_context);
    if (!kept || !kept->ep || kept->owner_entry != entry) return -FI_EINVAL;
    Engine *ep = kept->ep;
    PeerEntryGuard guard(ep->domain_->lock(), ep->domain_->lock().in_peer_call());
    return start ? ep->start_queued(kept, entry) : ep->discard_queued(kept);
}

int Engine::start_queued(Unexpected *kept, void *entry) {
    owner_queued_.erase(entry);
    Unexpected ux = std::move(*kept);
    rx_->erase_unexpected(kept);
    RxOp *rx = owned_receive(*rx_, entry, ux.tagged());
    deliver_unexpected(rx, ux);
    return 0;
}

// fi_peer(3): no completion, and the entry is the owner's again (it frees it itself).
int Engine::discard_queued(Unexpected *kept) {
    owner_queued_.erase(kept->owner_entry);
    Unexpected ux = std::move(*kept);
    rx_->erase_unexpected(kept);
    if (ux.rendezvous()) {
        wire::FinBody fin{ux.hdr.msg_id, uint32_t(wire::FinStatus::Ok), 0};
        send_control(ux.conn, wire::ProtoOp::Fin, &fin, sizeof fin, ux.hdr.msg_id);
    }
    return 0;
}

}  // namespace tandem
