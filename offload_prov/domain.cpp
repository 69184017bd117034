#include "offload_prov/domain.h"

#include "offload_prov/av.h"
#include "offload_prov/cq.h"
#include "offload_prov/endpoint.h"
#include "offload_prov/fabric.h"
#include "offload_prov/srx.h"

#include <cstring>

namespace tandem::off {

namespace {

fi_ops domain_fi_ops =
    fid_ops(&Trampoline<&Domain::close>::call<fid>, enosys<decltype(fi_ops::bind)>,
            enosys<decltype(fi_ops::control)>, &Trampoline<&Domain::ops_open>::call<fid>);

// peer::TriggerOps: thin shims onto the domain's TriggerQueue.
TriggerQueue &queue_of(fid_domain *d) {
    return Domain::of(d)->triggers();
}

peer::TriggerOps trigger_ops = {
    .size = sizeof(peer::TriggerOps),
    .queue = [](fid_domain *d, const peer::TriggerWork *w) noexcept -> int {
        try {
            return queue_of(d).queue(*w);
        } catch (...) {
            return -FI_ENOMEM;
        }
    },
    .progress = [](fid_domain *d) noexcept { return queue_of(d).progress(); },
    .pending = [](fid_domain *d) noexcept { return queue_of(d).pending(); },
    .cancel = [](fid_domain *d, const void *group,
                 const void *match) noexcept { return queue_of(d).cancel(group, match); },
    .flush = [](fid_domain *d, const void *group,
                fid_cntr *cntr) noexcept { return queue_of(d).flush(group, cntr); },
    .flush_counter = [](fid_domain *d,
                        fid_cntr *cntr) noexcept { return queue_of(d).flush_counter(cntr); },
    .discard_group = [](fid_domain *d,
                        const void *group) noexcept { return queue_of(d).discard_group(group); },
    .xpu_variable = [](fid_domain *d, const void *group, int iface, int device, uint64_t *var,
                       void **addr, uint64_t *value) noexcept -> int {
        return Domain::of(d)->xpu_variable(group, iface, device, var, addr, value);
    },
};

// A tandem counter's words (peer::PeerCntrOps), asked once per counter that gets work.
TriggerQueue::CounterWords words_of(fid_cntr *cntr) {
    void *ops = nullptr;
    if (!cntr || !cntr->fid.ops || !cntr->fid.ops->ops_open ||
        cntr->fid.ops->ops_open(&cntr->fid, peer::kPeerCntrOpsName, 0, &ops, nullptr) != 0)
        return {};
    auto *c = static_cast<peer::PeerCntrOps *>(ops);
    return {c->success_word(cntr), c->error_word(cntr)};
}

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
    : fabric_(fabric), info_(fi_dupinfo(info)), owner_(owner), triggers_(words_of) {
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

int Domain::ops_open(const char *name, uint64_t, void **ops, void *) {
    if (!name || !ops) return -FI_EINVAL;
    if (strcmp(name, peer::kTriggerOpsName) == 0) {
        *ops = &trigger_ops;
        return 0;
    }
    return -FI_ENOSYS;
}

int Domain::xpu_variable(const void *, int, int, uint64_t *, void **, uint64_t *) {
    return -FI_EOPNOTSUPP;
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
