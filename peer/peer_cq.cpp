#include "peer/peer_cq.h"

namespace tandem::peer {

// The peer uses only the owner ops; fi_close and friends on the exported fid are the
// owner's business, so a peer calling them gets -FI_ENOSYS rather than a crash.
static fi_ops g_exported_fid_ops = fid_ops(enosys<decltype(fi_ops::close)>);

struct ExportedCqOps {
    static inline fi_ops_cq_owner ops = {
        sizeof(fi_ops_cq_owner),
        Trampoline<&ExportedCq::write>::call<fid_peer_cq>,
        Trampoline<&ExportedCq::writeerr>::call<fid_peer_cq>,
    };
};

fi_ops *exported_fid_ops() {
    return &g_exported_fid_ops;
}

ExportedCq::ExportedCq(CqOwner &owner) : owner_(owner) {
    init_fid(FI_CLASS_PEER_CQ, nullptr, &g_exported_fid_ops);
    fid()->owner_ops = &ExportedCqOps::ops;
    context_.size = sizeof context_;
    context_.cq = fid();
}

fid_peer_cq *ImportedCq::from_context(const void *context) {
    auto *ctx = static_cast<const fi_peer_cq_context *>(context);
    if (!ctx || ctx->size < sizeof *ctx || !ctx->cq || !ctx->cq->owner_ops ||
        !ctx->cq->owner_ops->write || !ctx->cq->owner_ops->writeerr)
        return nullptr;
    return ctx->cq;
}

}  // namespace tandem::peer
