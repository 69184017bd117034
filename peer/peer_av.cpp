#include "peer/peer_av.h"

namespace tandem::peer {

struct ExportedAvOps {
    static fi_addr_t ep_addr(fid_peer_av *av, fid_ep *ep) noexcept {
        try {
            return ExportedAv::of(av)->ep_addr(ep);
        } catch (...) {
            return FI_ADDR_NOTAVAIL;
        }
    }
    static inline fi_ops_av_owner ops = {
        sizeof(fi_ops_av_owner),
        Trampoline<&ExportedAv::query>::call<fid_peer_av>,
        ep_addr,
    };
};

ExportedAv::ExportedAv(AvOwner &owner) : owner_(owner) {
    init_fid(FI_CLASS_PEER_AV, nullptr, exported_fid_ops());
    fid()->owner_ops = &ExportedAvOps::ops;
    context_.size = sizeof context_;
    // 1.17's fi_peer_av_context names its member "struct fi_peer_av *": same object.
    context_.av = reinterpret_cast<decltype(context_.av)>(fid());
}

fid_peer_av *ImportedAv::from_context(const void *context) {
    auto *ctx = static_cast<const fi_peer_av_context *>(context);
    if (!ctx || ctx->size < sizeof *ctx || !ctx->av) return nullptr;
    auto *av = reinterpret_cast<fid_peer_av *>(ctx->av);
    if (!av->owner_ops || !av->owner_ops->query || !av->owner_ops->ep_addr) return nullptr;
    return av;
}

struct ExportedAvSetOps {
    static inline fi_ops_av_set_owner ops = {
        sizeof(fi_ops_av_set_owner),
        Trampoline<&ExportedAvSet::members>::call<fid_peer_av_set>,
    };
};

ExportedAvSet::ExportedAvSet(AvSetOwner &owner) : owner_(owner) {
    init_fid(FI_CLASS_PEER_AV_SET, nullptr, exported_fid_ops());
    fid()->owner_ops = &ExportedAvSetOps::ops;
    context_.size = sizeof context_;
    context_.av_set = reinterpret_cast<decltype(context_.av_set)>(fid());
}

fid_peer_av_set *ImportedAvSet::from_context(const void *context) {
    auto *ctx = static_cast<const fi_peer_av_set_context *>(context);
    if (!ctx || ctx->size < sizeof *ctx || !ctx->av_set) return nullptr;
    auto *set = reinterpret_cast<fid_peer_av_set *>(ctx->av_set);
    if (!set->owner_ops || !set->owner_ops->members) return nullptr;
    return set;
}

}  // namespace tandem::peer
