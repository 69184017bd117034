#include "peer/peer_srx.h"

namespace tandem::peer {

struct ExportedSrxOps {
    // The entry callbacks carry no srx argument: the entry's srx field leads back to the
    // export.
    static SrxOwner &owner_of(fi_peer_rx_entry *entry) {
        return ExportedSrx::of(entry->srx)->owner_;
    }
    static int queue_msg(fi_peer_rx_entry *e) noexcept {
        return guard([&] { return owner_of(e).peer_queue_msg(e); });
    }
    static int queue_tag(fi_peer_rx_entry *e) noexcept {
        return guard([&] { return owner_of(e).peer_queue_tag(e); });
    }
    static void free_entry(fi_peer_rx_entry *e) noexcept {
        guard([&] {
            owner_of(e).peer_free_entry(e);
            return 0;
        });
    }
    template <class F>
    static int guard(F &&f) noexcept {
        try {
            return f();
        } catch (...) {
            return current_exception_errno();
        }
    }
    static inline fi_ops_srx_owner ops = {
        sizeof(fi_ops_srx_owner),
        Trampoline<&ExportedSrx::get_msg>::call<fid_peer_srx>,
        Trampoline<&ExportedSrx::get_tag>::call<fid_peer_srx>,
        queue_msg,
        queue_tag,
        free_entry,
    };
};

ExportedSrx::ExportedSrx(SrxOwner &owner) : owner_(owner) {
    init_fid(FI_CLASS_SRX_CTX, nullptr, exported_fid_ops());
    fid()->owner_ops = &ExportedSrxOps::ops;
    fid()->peer_ops = nullptr;
    context_.size = sizeof context_;
    context_.srx = fid();
}

bool ExportedSrx::peer_attached() const {
    auto *self = const_cast<ExportedSrx *>(this);
    const fi_ops_srx_peer *ops = self->fid()->peer_ops;
    return ops && ops->start_msg && ops->start_tag && ops->discard_msg && ops->discard_tag;
}

int ExportedSrx::start(fi_peer_rx_entry *entry, bool tagged) {
    if (!peer_attached()) return -FI_ENOSYS;
    fi_ops_srx_peer *ops = fid()->peer_ops;
    return tagged ? ops->start_tag(entry) : ops->start_msg(entry);
}

int ExportedSrx::discard(fi_peer_rx_entry *entry, bool tagged) {
    if (!peer_attached()) return -FI_ENOSYS;
    fi_ops_srx_peer *ops = fid()->peer_ops;
    return tagged ? ops->discard_tag(entry) : ops->discard_msg(entry);
}

fid_peer_srx *ImportedSrx::from_context(const void *context) {
    auto *ctx = static_cast<const fi_peer_srx_context *>(context);
    if (!ctx || ctx->size < sizeof *ctx || !ctx->srx || !ctx->srx->owner_ops) return nullptr;
    const fi_ops_srx_owner *o = ctx->srx->owner_ops;
    if (!o->get_msg || !o->get_tag || !o->queue_msg || !o->queue_tag || !o->free_entry)
        return nullptr;
    return ctx->srx;
}

}  // namespace tandem::peer
