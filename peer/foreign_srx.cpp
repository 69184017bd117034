#include "peer/foreign_srx.h"

#include "common/fabric_compat.h"
#include "common/log.h"

namespace tandem::peer {

namespace {

// The entry structure of each layout (the 1.17 one is this build's fi_peer_rx_entry).
template <SrxAbi Abi>
struct EntryOf {
    using type = RxEntryLinked;
};
template <>
struct EntryOf<SrxAbi::V1_17> {
    using type = fi_peer_rx_entry;
};
template <>
struct EntryOf<SrxAbi::V2_3> {
    using type = RxEntryUnlinked;
};

template <SrxAbi Abi>
auto *entry_of(void *e) {
    return static_cast<typename EntryOf<Abi>::type *>(e);
}

// Calls f with the owner's entry typed by its layout.
template <class F>
auto with_entry(SrxAbi abi, void *e, F &&f) {
    switch (abi) {
        case SrxAbi::V1_17:
            return f(entry_of<SrxAbi::V1_17>(e));
        case SrxAbi::V1_19:
        case SrxAbi::V2_0:
            return f(entry_of<SrxAbi::V2_0>(e));
        case SrxAbi::V2_3:
            break;
    }
    return f(entry_of<SrxAbi::V2_3>(e));
}

}  // namespace

fid_peer_srx *ForeignOwnerSrx::from_context(const void *context) {
    auto *ctx = static_cast<const fi_peer_srx_context *>(context);
    if (!ctx || ctx->size < sizeof *ctx || !ctx->srx || !ctx->srx->owner_ops) {
        TANDEM_WARN(FI_LOG_EP_CTRL, "fi_srx_context(FI_PEER) without a peer SRX context\n");
        return nullptr;
    }
    // Every release's owner ops start with size, get_msg, get_tag, queue_msg, queue_tag.
    const fi_ops_srx_owner *o = ctx->srx->owner_ops;
    if (!o->get_msg || !o->get_tag || !o->queue_msg || !o->queue_tag) {
        TANDEM_WARN(FI_LOG_EP_CTRL, "a peer SRX owner without get and queue calls\n");
        return nullptr;
    }
    return ctx->srx;
}

int ForeignOwnerSrx::get(bool tagged, fi_addr_t addr, size_t size, uint64_t tag,
                         void **entry) const {
    switch (abi_) {
        case SrxAbi::V1_17: {
            auto *e = reinterpret_cast<fi_peer_rx_entry **>(entry);
            const fi_ops_srx_owner *o = srx_->owner_ops;
            return tagged ? o->get_tag(srx_, addr, tag, e) : o->get_msg(srx_, addr, size, e);
        }
        case SrxAbi::V1_19: {
            auto *o = reinterpret_cast<const SrxOwnerOps1_19 *>(srx_->owner_ops);
            return tagged ? o->get_tag(srx_, addr, tag, entry)
                          : o->get_msg(srx_, addr, size, entry);
        }
        case SrxAbi::V2_0:
        case SrxAbi::V2_3:
            break;
    }
    auto *o = reinterpret_cast<const SrxOwnerOps2_0 *>(srx_->owner_ops);
    MatchAttr attr{addr, size, tag};
    return tagged ? o->get_tag(srx_, &attr, entry) : o->get_msg(srx_, &attr, entry);
}

int ForeignOwnerSrx::queue(bool tagged, void *entry, const QueuedMessage &m) const {
    with_entry(abi_, entry, [&](auto *e) {
        e->addr = m.addr;
        e->size = m.size;
        e->tag = m.tag;
        e->flags = m.flags;
        e->peer_context = m.peer_context;
        if constexpr (requires { e->cq_data; }) e->cq_data = m.cq_data;
        return 0;
    });
    // queue_msg and queue_tag keep their places and their one-pointer argument in every
    // release; only the entry behind the pointer differs.
    const fi_ops_srx_owner *o = srx_->owner_ops;
    auto *e = static_cast<fi_peer_rx_entry *>(entry);
    return tagged ? o->queue_tag(e) : o->queue_msg(e);
}

// free_entry moved behind foreach_unspec_addr in 1.19.
void ForeignOwnerSrx::free_entry(void *entry) const {
    if (abi_ == SrxAbi::V1_17) {
        srx_->owner_ops->free_entry(static_cast<fi_peer_rx_entry *>(entry));
        return;
    }
    reinterpret_cast<const SrxOwnerOps2_0 *>(srx_->owner_ops)->free_entry(entry);
}

bool ForeignOwnerSrx::foreach_unspec_addr(GetAddr get_addr) const {
    if (abi_ == SrxAbi::V1_17) return false;
    // Same place in 1.19's table and 2.0's (behind queue_tag); an owner may leave it out.
    auto *o = reinterpret_cast<const SrxOwnerOps1_19 *>(srx_->owner_ops);
    static_assert(offsetof(SrxOwnerOps1_19, foreach_unspec_addr) ==
                  offsetof(SrxOwnerOps2_0, foreach_unspec_addr));
    if (o->size < offsetof(SrxOwnerOps1_19, foreach_unspec_addr) + sizeof(GetAddr) ||
        !o->foreach_unspec_addr)
        return false;
    o->foreach_unspec_addr(srx_, get_addr);
    return true;
}

SrxAbi ForeignOwnerSrx::core_abi() {
    return srx_abi_of(compat::core_version());
}

OwnedReceive ForeignOwnerSrx::read(SrxAbi abi, void *entry) {
    return with_entry(abi, entry, [](auto *e) {
        return OwnedReceive{e->iov, e->desc, e->count, e->context, e->flags, e->peer_context};
    });
}

}  // namespace tandem::peer
