#include "offload_prov/cq.h"

#include "offload_prov/domain.h"
#include "offload_prov/endpoint.h"

namespace tandem::off {

namespace {

fi_ops cq_fi_ops = fid_ops(&Trampoline<&Cq::close>::call<fid>);

fi_ops_cq cq_ops = {
    .size = sizeof(fi_ops_cq),
    .read = &Trampoline<&Cq::read>::call<fid_cq>,
    .readfrom = &Trampoline<&Cq::readfrom>::call<fid_cq>,
    .readerr = &Trampoline<&Cq::readerr>::call<fid_cq>,
    .sread = enosys<decltype(fi_ops_cq::sread)>,
    .sreadfrom = enosys<decltype(fi_ops_cq::sreadfrom)>,
    .signal = enosys<decltype(fi_ops_cq::signal)>,
    .strerror = &Trampoline<&Cq::strerror>::call<fid_cq>,
};

}  // namespace

Cq::Cq(Domain *domain, fid_peer_cq *owner) : domain_(domain), owner_(owner) {
    init_fid(FI_CLASS_CQ, nullptr, &cq_fi_ops);
    fid()->ops = &cq_ops;
    domain_->hold();
}

Cq::~Cq() {
    domain_->release();
}

int Cq::close() {
    if (!endpoints_.empty()) return -FI_EBUSY;
    delete this;
    return 0;
}

ssize_t Cq::read(void *buf, size_t count) {
    if (buf || count) return -FI_ENOSYS;
    // Index loop, no copy (this runs on every poll of the owner): progress opens and closes
    // no endpoint.
    for (size_t i = 0; i < endpoints_.size(); ++i) endpoints_[i]->progress();
    return 0;
}

Cq *Cq::ours(struct fid *f) {
    return f && f->fclass == FI_CLASS_CQ && f->ops == &cq_fi_ops ? Cq::of(f) : nullptr;
}

int Cq::trywait() {
    bool pending = false;
    for (Endpoint *ep : endpoints_) {  // (every one armed)
        try {
            pending |= ep->arm() != 0;
        } catch (...) {
            pending = true;  // (a pass will report what failed)
        }
    }
    return pending ? -FI_EAGAIN : 0;
}

ssize_t Cq::readfrom(void *buf, size_t count, fi_addr_t *) {
    return read(buf, count);
}

ssize_t Cq::readerr(fi_cq_err_entry *, uint64_t) {
    return -FI_ENOSYS;
}

const char *Cq::strerror(int prov_errno, const void *, char *buf, size_t len) {
    const char *text = fi_strerror(prov_errno < 0 ? -prov_errno : prov_errno);
    if (buf && len) {
        snprintf(buf, len, "%s", text);
        return buf;
    }
    return text;
}

}  // namespace tandem::off
