#include "offload_prov/av.h"

#include "common/fabric_compat.h"
#include "offload_prov/domain.h"

namespace tandem::off {

namespace {

fi_ops av_fi_ops = fid_ops(&Trampoline<&Av::close>::call<fid>);

// 1.20's table, as tandem's (common/fabric_compat.h): whatever headers the build uses, the
// twin's AV answers every entry a core of 1.17 to 2.6 may call.
using AvOps = compat::AvOps1_20;
AvOps av_ops = {
    .size = sizeof(AvOps),
    .insert = enosys<decltype(AvOps::insert)>,
    .insertsvc = enosys<decltype(AvOps::insertsvc)>,
    .insertsym = enosys<decltype(AvOps::insertsym)>,
    .remove = enosys<decltype(AvOps::remove)>,
    .lookup = enosys<decltype(AvOps::lookup)>,
    .straddr = enosys<decltype(AvOps::straddr)>,
    .av_set = &Trampoline<&Av::av_set>::call<fid_av>,
    .insert_auth_key = enosys<decltype(AvOps::insert_auth_key)>,
    .lookup_auth_key = enosys<decltype(AvOps::lookup_auth_key)>,
    .set_user_id = enosys<decltype(AvOps::set_user_id)>,
};

fi_ops av_set_fi_ops = fid_ops(&Trampoline<&AvSet::close>::call<fid>);

// Set algebra happens on the owner's set; the peer only reads the members.
fi_ops_av_set av_set_ops = {
    .size = sizeof(fi_ops_av_set),
    .set_union = enosys<decltype(fi_ops_av_set::set_union)>,
    .intersect = enosys<decltype(fi_ops_av_set::intersect)>,
    .diff = enosys<decltype(fi_ops_av_set::diff)>,
    .insert = enosys<decltype(fi_ops_av_set::insert)>,
    .remove = enosys<decltype(fi_ops_av_set::remove)>,
    .addr = enosys<decltype(fi_ops_av_set::addr)>,
};

}  // namespace

Av::Av(Domain *domain, fid_peer_av *owner) : domain_(domain), owner_(owner) {
    init_fid(FI_CLASS_AV, nullptr, &av_fi_ops);
    fid()->ops = reinterpret_cast<fi_ops_av *>(&av_ops);
    domain_->hold();
}

Av::~Av() {
    domain_->release();
}

int Av::close() {
    if (refs_.load()) return -FI_EBUSY;
    delete this;
    return 0;
}

int Av::av_set(fi_av_set_attr *attr, fid_av_set **set, void *context) {
    if (!attr || !set || !(attr->flags & FI_PEER)) return -FI_EINVAL;
    fid_peer_av_set *owner = peer::ImportedAvSet::from_context(context);
    if (!owner) return -FI_EINVAL;
    *set = (new AvSet(this, owner))->fid();
    return 0;
}

AvSet::AvSet(Av *av, fid_peer_av_set *owner) : av_(av), owner_(owner) {
    init_fid(FI_CLASS_AV_SET, nullptr, &av_set_fi_ops);
    fid()->ops = &av_set_ops;
    av_->hold();
}

AvSet::~AvSet() {
    av_->release();
}

int AvSet::close() {
    delete this;
    return 0;
}

std::vector<fi_addr_t> AvSet::members() const {
    size_t count = 0;
    std::vector<fi_addr_t> out;
    int ret = owner_.members(nullptr, &count);
    while (ret == -FI_ETOOSMALL) {
        out.resize(count);
        ret = owner_.members(out.data(), &count);
    }
    if (ret) fail(-ret, "fid_peer_av_set members");
    out.resize(count);
    return out;
}

}  // namespace tandem::off
