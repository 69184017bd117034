#include "offload_prov/domain.h"

#include "offload_prov/av.h"
#include "offload_prov/cq.h"
#include "offload_prov/endpoint.h"
#include "offload_prov/fabric.h"
#include "offload_prov/srx.h"

namespace tandem::off {

namespace {

fi_ops domain_fi_ops = fid_ops(&Trampoline<&Domain::close>::call<fid>);

fi_ops_domain domain_ops = {
    .size = sizeof(fi_ops_domain),
    .av_open = &Trampoline<&Domain::av_open>::call<fid_domain>,
    .cq_open = &Trampoline<&Domain::cq_open>::call<fid_domain>,
    .endpoint = &Trampoline<&Domain::endpoint>::call<fid_domain>,
    .scalable_ep = enosys<decltype(fi_ops_domain::scalable_ep)>,
    .cntr_open = enosys<decltype(fi_ops_domain::cntr_open)>,
    .poll_open = enosys<decltype(fi_ops_domain::poll_open)>,
    .stx_ctx = enosys<decltype(fi_ops_domain::stx_ctx)>,
    .srx_ctx = &Trampoline<&Domain::srx_ctx>::call<fid_domain>,
    .query_atomic = enosys<decltype(fi_ops_domain::query_atomic)>,
    .query_collective = enosys<decltype(fi_ops_domain::query_collective)>,
    .endpoint2 = &Trampoline<&Domain::endpoint2>::call<fid_domain>,
};

fi_ops_mr domain_mr_ops = {
    .size = sizeof(fi_ops_mr),
    .reg = &Trampoline<&Domain::mr_reg>::call<fid>,
    .regv = &Trampoline<&Domain::mr_regv>::call<fid>,
    .regattr = &Trampoline<&Domain::mr_regattr>::call<fid>,
};

}  // namespace

Domain::Domain(Fabric *fabric, const fi_info *info, fid_domain *owner)
    : fabric_(fabric), info_(fi_dupinfo(info)), owner_(owner) {
    if (!info_) fail(FI_ENOMEM, "fi_dupinfo");
    init_fid(FI_CLASS_DOMAIN, nullptr, &domain_fi_ops);
    fid()->ops = &domain_ops;
    fid()->mr = &domain_mr_ops;
    fabric_->hold();
}

Domain::~Domain() {
    fi_freeinfo(info_);
    fabric_->release();
}

int Domain::close() {
    if (refs_.load()) return -FI_EBUSY;
    delete this;
    return 0;
}

int Domain::av_open(fi_av_attr *attr, fid_av **av, void *context) {
    if (!attr || !av || !(attr->flags & FI_PEER)) return -FI_EINVAL;
    fid_peer_av *owner = peer::ImportedAv::from_context(context);
    if (!owner) return -FI_EINVAL;
    *av = (new Av(this, owner))->fid();
    return 0;
}

int Domain::cq_open(fi_cq_attr *attr, fid_cq **cq, void *context) {
    // fi_peer(3): a provider that cannot import the owner's CQ fails with -FI_EINVAL; this
    // one only imports.
    if (!attr || !cq || !(attr->flags & FI_PEER)) return -FI_EINVAL;
    fid_peer_cq *owner = peer::ImportedCq::from_context(context);
    if (!owner) return -FI_EINVAL;
    *cq = (new Cq(this, owner))->fid();
    return 0;
}

int Domain::srx_ctx(fi_rx_attr *attr, fid_ep **rx_ep, void *context) {
    if (!attr || !rx_ep || !(attr->op_flags & FI_PEER)) return -FI_EINVAL;
    fid_peer_srx *owner = peer::ImportedSrx::from_context(context);
    if (!owner) return -FI_EINVAL;
    *rx_ep = (new Srx(this, owner))->fid();
    return 0;
}

int Domain::endpoint(fi_info *info, fid_ep **ep, void *context) {
    return endpoint2(info, ep, 0, context);
}

// The endpoint is the offload twin of an owner's endpoint: fi_endpoint2 with
// FI_PEER_TRANSFER and a fi_peer_transfer_context naming the owner's endpoint.
int Domain::endpoint2(fi_info *info, fid_ep **ep, uint64_t flags, void *context) {
    if (!info || !ep || !(flags & FI_PEER_TRANSFER)) return -FI_EINVAL;
    auto *ctx = static_cast<fi_peer_transfer_context *>(context);
    if (!ctx || ctx->size < sizeof *ctx || !ctx->ep) return -FI_EINVAL;
    *ep = (new Endpoint(this, info, ctx))->fid();
    return 0;
}

int Domain::mr_reg(const void *buf, size_t len, uint64_t access, uint64_t offset, uint64_t key,
                   uint64_t flags, fid_mr **mr, void *context) {
    return fi_mr_reg(owner_, buf, len, access, offset, key, flags, mr, context);
}

int Domain::mr_regv(const iovec *iov, size_t count, uint64_t access, uint64_t offset, uint64_t key,
                    uint64_t flags, fid_mr **mr, void *context) {
    return fi_mr_regv(owner_, iov, count, access, offset, key, flags, mr, context);
}

int Domain::mr_regattr(const fi_mr_attr *attr, uint64_t flags, fid_mr **mr) {
    return fi_mr_regattr(owner_, attr, flags, mr);
}

}  // namespace tandem::off
