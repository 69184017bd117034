// Peer counter (fi_peer(3), "PEER COUNTER", libfabric 1.19): a provider that is the peer of
// another's counter (fi_cntr_open with FI_PEER, the context a fi_peer_cntr_context) counts
// into the owner's through its two callbacks and keeps no value of its own. 1.17's headers
// lack these structures; their layout, the same from 1.19 to 2.6, is tandem's here
// (tests/unit/abi_layouts_2x.cpp checks it against 2.6's <rdma/providers/fi_peer.h>).
#pragma once

#include <rdma/fabric.h>

#include <cstddef>

namespace tandem::peer {

struct OwnerCntr;

// struct fi_ops_cntr_owner
struct OwnerCntrOps {
    size_t size;
    void (*inc)(OwnerCntr *cntr);
    void (*incerr)(OwnerCntr *cntr);
};

// struct fid_peer_cntr
struct OwnerCntr {
    struct fid fid;
    OwnerCntrOps *owner_ops;
};

// struct fi_peer_cntr_context
struct OwnerCntrContext {
    size_t size;
    OwnerCntr *cntr;
};

// The owner's counter as the peer sees it.
class ImportedCntr {
  public:
    ImportedCntr() = default;
    // The fi_peer_cntr_context passed as fi_cntr_open's context, checked: null when it names
    // no counter with both callbacks.
    static OwnerCntr *from_context(const void *context) {
        auto *ctx = static_cast<const OwnerCntrContext *>(context);
        if (!ctx || ctx->size < sizeof *ctx || !ctx->cntr || !ctx->cntr->owner_ops ||
            !ctx->cntr->owner_ops->inc || !ctx->cntr->owner_ops->incerr)
            return nullptr;
        return ctx->cntr;
    }
    explicit ImportedCntr(OwnerCntr *cntr) : cntr_(cntr) {}

    bool valid() const { return cntr_ != nullptr; }
    void inc() const { cntr_->owner_ops->inc(cntr_); }
    void incerr() const { cntr_->owner_ops->incerr(cntr_); }

  private:
    OwnerCntr *cntr_ = nullptr;
};

}  // namespace tandem::peer
