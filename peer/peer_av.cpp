#include "peer/peer_av.h"

#include <cstring>

namespace tandem::peer {

struct ExportedAvOps {
    static fi_addr_t ep_addr(fid_peer_av *av, fid_ep *ep) noexcept {
        try {
            return ExportedAv::of(av)->ep_addr(ep);
        } catch (...) {
            return FI_ADDR_NOTAVAIL;
        }
    }
    static fi_addr_t addr_of(fid_peer_av *av, const void *addr, size_t addrlen) noexcept {
        try {
            return ExportedAv::of(av)->owner_.peer_addr_of(addr, addrlen);
        } catch (...) {
            return FI_ADDR_NOTAVAIL;
        }
    }
    static int lookup(fid_peer_av *av, fi_addr_t fi_addr, void *addr, size_t *addrlen) noexcept {
        try {
            if (!addrlen) return -FI_EINVAL;
            return ExportedAv::of(av)->owner_.peer_lookup(fi_addr, addr, addrlen);
        } catch (...) {
            return current_exception_errno();
        }
    }
    static inline fi_ops_av_owner ops = {
        sizeof(fi_ops_av_owner),
        Trampoline<&ExportedAv::query>::call<fid_peer_av>,
        ep_addr,
    };
    static const std::atomic<uint64_t> *version_word(fid_peer_av *av) noexcept {
        return ExportedAv::of(av)->owner_.peer_version_word();
    }
    static inline PeerAvOps ext = {sizeof(PeerAvOps), lookup, addr_of, version_word};
};

ExportedAv::ExportedAv(AvOwner &owner) : owner_(owner) {
    fid_ops_ = *exported_fid_ops();
    fid_ops_.ops_open = Trampoline<&ExportedAv::ops_open>::call<struct fid>;
    init_fid(FI_CLASS_PEER_AV, nullptr, &fid_ops_);
    fid()->owner_ops = &ExportedAvOps::ops;
    context_.size = sizeof context_;
    // 1.17's fi_peer_av_context names its member "struct fi_peer_av *": same object.
    context_.av = reinterpret_cast<decltype(context_.av)>(fid());
}

int ExportedAv::ops_open(const char *name, uint64_t, void **ops, void *) {
    if (!name || !ops) return -FI_EINVAL;
    if (std::strcmp(name, kPeerAvOpsName) != 0) return -FI_ENOSYS;
    *ops = &ExportedAvOps::ext;
    return 0;
}

ImportedAv::ImportedAv(fid_peer_av *av) : av_(av) {
    void *ops = nullptr;
    fid *f = &av->fid;
    if (f->ops && f->ops->size >= offsetof(fi_ops, ops_open) + sizeof f->ops->ops_open &&
        f->ops->ops_open && f->ops->ops_open(f, kPeerAvOpsName, 0, &ops, nullptr) == 0 && ops)
        ext_ = static_cast<PeerAvOps *>(ops);
    if (ext_ && ext_->size < sizeof(PeerAvOps)) ext_ = nullptr;  // an older owner's table
    if (ext_) version_word_ = ext_->version_word(av_);
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
