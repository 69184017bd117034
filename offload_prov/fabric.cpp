#include "offload_prov/fabric.h"

#include "offload_prov/cq.h"
#include "offload_prov/domain.h"
#include "offload_prov/eq.h"
#include "peer/peer_abi.h"

namespace tandem::off {

namespace {

fi_ops fabric_fi_ops = fid_ops(&Trampoline<&Fabric::close>::call<fid>);

fi_ops_fabric fabric_ops = {
    .size = sizeof(fi_ops_fabric),
    .domain = &Trampoline<&Fabric::domain>::call<fid_fabric>,
    .passive_ep = enosys<decltype(fi_ops_fabric::passive_ep)>,
    .eq_open = &Trampoline<&Fabric::eq_open>::call<fid_fabric>,
    .wait_open = enosys<decltype(fi_ops_fabric::wait_open)>,
    .trywait = &Trampoline<&Fabric::trywait>::call<fid_fabric>,
    .domain2 = &Trampoline<&Fabric::domain2>::call<fid_fabric>,
};

}  // namespace

Fabric::Fabric(void *context) {
    init_fid(FI_CLASS_FABRIC, context, &fabric_fi_ops);
    fid()->ops = &fabric_ops;
}

int Fabric::close() {
    if (refs_.load()) return -FI_EBUSY;
    delete this;
    return 0;
}

// Our CQs' endpoints prepare their wake-ups for a sleeping owner; every CQ is asked, even
// after one answered that work is pending, so that each arms what it watches.
int Fabric::trywait(struct fid **fids, int count) {
    if (count < 0 || (count && !fids)) return -FI_EINVAL;
    int ret = 0;
    for (int i = 0; i < count; ++i) {
        Cq *cq = Cq::ours(fids[i]);
        if (!cq) return -FI_EINVAL;
        if (cq->trywait() == -FI_EAGAIN) ret = -FI_EAGAIN;
    }
    return ret;
}

// A domain of the offload provider exists only as the peer of an owner's domain.
int Fabric::domain(fi_info *, fid_domain **, void *) {
    return -FI_EINVAL;
}

int Fabric::domain2(fi_info *info, fid_domain **dom, uint64_t flags, void *context) {
    if (!info || !dom || !(flags & FI_PEER)) return -FI_EINVAL;
    auto *ctx = static_cast<fi_peer_domain_context *>(context);
    if (!ctx || ctx->size < sizeof *ctx || !ctx->domain) return -FI_EINVAL;
    *dom = (new Domain(this, info, ctx->domain))->fid();
    return 0;
}

int Fabric::eq_open(fi_eq_attr *attr, fid_eq **eq, void *context) {
    if (!attr || !eq || !(attr->flags & FI_PEER)) return -FI_EINVAL;
    auto *ctx = static_cast<fi_peer_eq_context *>(context);
    if (!ctx || ctx->size < sizeof *ctx || !ctx->eq) return -FI_EINVAL;
    *eq = (new Eq(this, ctx->eq))->fid();
    return 0;
}

}  // namespace tandem::off
