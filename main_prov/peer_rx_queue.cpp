#include "main_prov/peer_rx_queue.h"

#include "common/fabric_compat.h"
#include "common/iov.h"
#include "common/log.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"

#include <algorithm>

namespace tandem {

PeerRxQueue::PeerRxQueue(Domain &domain, RxMatcher &matcher, Engine *report_ep, Mode mode,
                         bool selective)
    : domain_(domain),
      matcher_(matcher),
      report_ep_(report_ep),
      mode_(mode),
      selective_(selective),
      // An importer we did not build has its core's layout; our twin has ours.
      export_(*this, mode == Mode::Direct ? peer::srx_abi_of(compat::core_version())
                                          : peer::SrxAbi::V1_17) {}

PeerRxQueue::~PeerRxQueue() {
    for (auto *e : spare_) delete e;
}

bool PeerRxQueue::caller_holds_lock() const {
    return mode_ == Mode::ThroughOwner || domain_.lock().in_peer_call();
}

peer::OwnerRxEntry *PeerRxQueue::new_entry(fi_addr_t addr, uint64_t tag, size_t size) {
    peer::OwnerRxEntry *e;
    if (spare_.empty()) {
        e = new peer::OwnerRxEntry;
    } else {
        e = spare_.back();
        spare_.pop_back();
        // iov and desc are written when the entry is filled.
        e->entry = {};
        e->owner_op = nullptr;
    }
    e->entry.srx = export_.fid();
    e->entry.addr = addr;
    e->entry.tag = tag;
    e->entry.size = size;
    e->entry.iov = e->iov;
    e->entry.desc = e->desc;
    e->owner = this;
    return e;
}

// The receive's buffer, context and flags, as the peer needs them to deliver.
void PeerRxQueue::fill(peer::OwnerRxEntry *e, RxOp *rx, bool tagged) {
    size_t count = std::min(rx->count, peer::kMaxEntryIov);
    for (size_t i = 0; i < count; ++i) {
        e->iov[i] = rx->iov[i];
        e->desc[i] = rx->desc[i];  // peer::MrDesc: where the buffer lives
    }
    e->entry.count = count;
    e->owner_op = rx;
    uint64_t kind = FI_RECV | (tagged ? FI_TAGGED : FI_MSG);
    if (mode_ == Mode::ThroughOwner) {
        // Our twin reports through LocalPath, which decides what the application sees.
        e->entry.context = rx;
        e->entry.flags = kind | FI_COMPLETION;
        return;
    }
    e->entry.context = rx->context;
    bool report = !selective_ || (rx->op_flags & FI_COMPLETION);
    e->entry.flags =
        kind | (rx->op_flags & ~uint64_t(FI_MULTI_RECV)) | (report ? FI_COMPLETION : 0);
    // A slice that used up its multi-receive buffer carries the release (fi_msg(3)).
    if (rx->parent && rx->parent->retired) e->entry.flags |= FI_MULTI_RECV | FI_COMPLETION;
}

int PeerRxQueue::get(bool tagged, fi_addr_t addr, uint64_t tag, size_t size,
                     fi_peer_rx_entry **entry) {
    if (!entry) return -FI_EINVAL;
    PeerEntryGuard guard(domain_.lock(), caller_holds_lock());
    peer::OwnerRxEntry *e = new_entry(addr, tag, size);
    RxOp *rx = matcher_.match_posted(tagged, tag, addr);
    *entry = &e->entry;
    if (!rx) return -FI_ENOENT;  // the message comes first: the peer queues it
    fill(e, Engine::slice_for(matcher_, rx, size), tagged);
    return 0;
}

int PeerRxQueue::peer_get_msg(fi_addr_t addr, size_t size, fi_peer_rx_entry **entry) {
    return get(false, addr, 0, size, entry);
}

int PeerRxQueue::peer_get_tag(fi_addr_t addr, uint64_t tag, fi_peer_rx_entry **entry) {
    return get(true, addr, tag, 0, entry);
}

int PeerRxQueue::queue(fi_peer_rx_entry *entry, bool tagged) {
    if (!entry) return -FI_EINVAL;
    PeerEntryGuard guard(domain_.lock(), caller_holds_lock());
    Unexpected ux;
    ux.ep = report_ep_;
    ux.peer_entry = peer::OwnerRxEntry::of(entry);
    ux.hdr.op = static_cast<uint8_t>(wire::ProtoOp::Eager);
    ux.hdr.flags = (tagged ? wire::kProtoTagged : 0) |
                   ((entry->flags & FI_REMOTE_CQ_DATA) ? wire::kProtoCqData : 0);
    ux.hdr.tag = entry->tag;
    ux.hdr.size = entry->size;
    if (entry->flags & FI_REMOTE_CQ_DATA)  // (a peer of 1.19 on writes it here)
        ux.hdr.cq_data = peer::OwnerRxEntry::of(entry)->cq_data;
    entry->flags |= tagged ? FI_TAGGED : FI_MSG;
    matcher_.push_unexpected(std::move(ux));
    return 0;
}

void PeerRxQueue::start(peer::OwnerRxEntry *e, RxOp *rx) {
    bool tagged = (e->entry.flags & FI_TAGGED) != 0;
    fill(e, rx, tagged);
    int ret;
    {
        DomainLock::PeerCall call(domain_.lock());
        ret = export_.start(&e->entry, tagged);
    }
    if (ret == 0) return;
    TANDEM_WARN(FI_LOG_EP_DATA, "peer could not start a queued message: %s\n", fi_strerror(-ret));
    if (report_ep_)
        report_ep_->write_rx_err(rx, FI_RECV | (tagged ? FI_TAGGED : FI_MSG), -ret, 0, 0,
                                 e->entry.tag, 0);
    matcher_.drop(rx);
    delete e;
}

void PeerRxQueue::discard(peer::OwnerRxEntry *e) {
    bool tagged = e->entry.flags & FI_TAGGED;
    // The peer frees the entry (free_entry) once it has dropped the message.
    int ret;
    {
        DomainLock::PeerCall call(domain_.lock());
        ret = export_.discard(&e->entry, tagged);
    }
    if (ret != 0) delete e;
}

void PeerRxQueue::peer_free_entry(fi_peer_rx_entry *entry) {
    if (!entry) return;
    PeerEntryGuard guard(domain_.lock(), caller_holds_lock());
    auto *e = peer::OwnerRxEntry::of(entry);
    // ThroughOwner: the RxOp completed (and went) through LocalPath already.
    if (mode_ == Mode::Direct && e->owner_op) matcher_.drop(static_cast<RxOp *>(e->owner_op));
    if (spare_.size() < 256)
        spare_.push_back(e);
    else
        delete e;
}

fi_addr_t PeerRxQueue::source(peer::OwnerRxEntry *e) {
    return e->entry.addr;
}

void PeerRxQueue::peer_foreach_unspec_addr(const std::function<void(fi_peer_rx_entry *)> &fn) {
    PeerEntryGuard guard(domain_.lock(), caller_holds_lock());
    matcher_.for_each_unexpected([&](Unexpected &ux) {
        if (ux.peer_entry && ux.peer_entry->owner == this &&
            ux.peer_entry->entry.addr == FI_ADDR_UNSPEC)
            fn(&ux.peer_entry->entry);
    });
}

// Direct mode: the importer reported the receive; tandem's bookkeeping of it ends here.

}  // namespace tandem
