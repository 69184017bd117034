#include "offload_prov/domain.h"

#include "offload_prov/av.h"
#include "offload_prov/cq.h"
#include "offload_prov/endpoint.h"
#include "offload_prov/fabric.h"
#include "offload_prov/offload_ops.h"
#include "offload_prov/srx.h"

#include <cstring>

namespace tandem::off {

namespace {

fi_ops domain_fi_ops =
    fid_ops(&Trampoline<&Domain::close>::call<fid>, enosys<decltype(fi_ops::bind)>,
            enosys<decltype(fi_ops::control)>, &Trampoline<&Domain::ops_open>::call<fid>);

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
    : fabric_(fabric),
      info_(fi_dupinfo(info)),
      owner_(owner),
      triggers_([this](uint64_t var, uint64_t *value) { return xpu_read(var, value); }) {
    if (!info_) fail(FI_ENOMEM, "fi_dupinfo");
    init_fid(FI_CLASS_DOMAIN, nullptr, &domain_fi_ops);
    fid()->ops = &domain_ops;
    fid()->mr = &domain_mr_ops;
    fabric_->hold();
}

Domain::~Domain() {
    triggers_.discard_all();  // before the variables its work waits on
    for (auto &[handle, v] : xpu_vars_) v.ops->signal_close(v.state);
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
    if (strcmp(name, peer::kOffloadOpsName) != 0) return -FI_ENOSYS;
    // (fi_open_ops hands out void *: the owner only reads the table.)
    *ops = const_cast<peer::OffloadOps *>(&offload_ops());
    return 0;
}

// One variable per owner endpoint and device, as fi_trigger(3) allows ("providers may return
// the same trigger variable for multiple data transfer requests"): the device writes a count,
// and the n-th work queued on the variable starts once the word holds n or more. Work on it
// therefore starts in the order it was queued, as the man page asks users to trigger it.
int Domain::xpu_variable(const void *group, int iface, int device, uint64_t *var, void **addr,
                         uint64_t *value) {
    if (iface != FI_HMEM_CUDA || device < 0) return -FI_EOPNOTSUPP;
    const hmem::IfaceOps *ops = hmem::Registry::instance().ops(FI_HMEM_CUDA);
    if (!ops || device >= hmem::Registry::instance().device_count(FI_HMEM_CUDA))
        return -FI_EOPNOTSUPP;
    auto key = std::make_pair(group, std::make_pair(iface, device));
    auto it = xpu_by_owner_.find(key);
    if (it == xpu_by_owner_.end()) {
        XpuVariable v;
        v.group = group;
        v.ops = ops;
        if (int ret = ops->signal_open(static_cast<uint64_t>(device), &v.word, &v.state))
            return ret;
        uint64_t handle = next_xpu_var_++;
        xpu_vars_.emplace(handle, v);
        it = xpu_by_owner_.emplace(key, handle).first;
    }
    XpuVariable &v = xpu_vars_.at(it->second);
    *var = it->second;
    *addr = v.word;
    *value = ++v.next;
    return 0;
}

// The value the device has written so far, as last read; each call moves the read on.
bool Domain::xpu_read(uint64_t var, uint64_t *value) {
    auto it = xpu_vars_.find(var);
    if (it == xpu_vars_.end()) return false;
    XpuVariable &v = it->second;
    uint64_t now = 0;
    if (v.ops->signal_poll(v.state, &now) == 1) v.seen = now;
    *value = v.seen;
    return true;
}

size_t Domain::discard_group(const void *group) {
    size_t n = triggers_.discard_group(group);
    close_variables(group);
    return n;
}

void Domain::close_variables(const void *group) {
    for (auto it = xpu_by_owner_.begin(); it != xpu_by_owner_.end();) {
        if (it->first.first != group) {
            ++it;
            continue;
        }
        auto v = xpu_vars_.find(it->second);
        if (v != xpu_vars_.end()) {
            v->second.ops->signal_close(v->second.state);
            xpu_vars_.erase(v);
        }
        it = xpu_by_owner_.erase(it);
    }
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
