#include "main_prov/fabric.h"

#include "main_prov/domain.h"
#include "main_prov/eq.h"
#include "main_prov/pep.h"
#include "main_prov/wait.h"

namespace tandem {

namespace {

fi_ops fabric_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&Fabric::close>::call<fid>,
    .bind = enosys<decltype(fi_ops::bind)>,
    .control = &Trampoline<&Fabric::control>::call<fid>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops_fabric fabric_ops = {
    .size = sizeof(fi_ops_fabric),
    .domain = &Trampoline<&Fabric::domain>::call<fid_fabric>,
    .passive_ep = &Trampoline<&Fabric::passive_ep>::call<fid_fabric>,
    .eq_open = &Trampoline<&Fabric::eq_open>::call<fid_fabric>,
    .wait_open = &Trampoline<&Fabric::wait_open>::call<fid_fabric>,
    .trywait = &Trampoline<&Fabric::trywait>::call<fid_fabric>,
    .domain2 = &Trampoline<&Fabric::domain2>::call<fid_fabric>,
};

}  // namespace

Fabric::Fabric(const fi_fabric_attr &attr, void *context) : name_(attr.name ? attr.name : "") {
    init_fid(FI_CLASS_FABRIC, context, &fabric_fi_ops);
    fid()->ops = &fabric_ops;
}

int Fabric::close() {
    if (refs_.load()) return -FI_EBUSY;
    delete this;
    return 0;
}

int Fabric::control(int, void *) {
    return -FI_ENOSYS;
}

int Fabric::domain(fi_info *info, fid_domain **dom, void *context) {
    return domain2(info, dom, 0, context);
}

int Fabric::domain2(fi_info *info, fid_domain **dom, uint64_t flags, void *context) {
    if (!info || !dom || !info->domain_attr) return -FI_EINVAL;
    // FI_PEER (a peer domain) is the offload provider's business, not the main provider's.
    if (flags) return -FI_EINVAL;
    auto *d = new Domain(this, info, context);
    *dom = d->fid();
    return 0;
}

int Fabric::passive_ep(fi_info *info, fid_pep **pep, void *context) {
    if (!info || !pep) return -FI_EINVAL;
    auto *p = new PassiveEndpoint(this, info, context);
    *pep = p->fid();
    return 0;
}

int Fabric::eq_open(fi_eq_attr *attr, fid_eq **eq, void *context) {
    if (!attr || !eq) return -FI_EINVAL;
    auto *e = new Eq(this, *attr, context);
    *eq = e->fid();
    return 0;
}

int Fabric::wait_open(fi_wait_attr *attr, fid_wait **waitset) {
    if (!attr || !waitset) return -FI_EINVAL;
    auto *w = new WaitObject(this, *attr);
    *waitset = w->fid();
    return 0;
}

int Fabric::trywait(struct fid **fids, int count) {
    if (count < 0 || (count && !fids)) return -FI_EINVAL;
    for (int i = 0; i < count; ++i) {
        int ret = trywait_one(fids[i]);
        if (ret) return ret;
    }
    return 0;
}

}  // namespace tandem
