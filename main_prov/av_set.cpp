#include "main_prov/av_set.h"

#include "main_prov/av.h"
#include "main_prov/domain.h"

#include <algorithm>

namespace tandem {

namespace {

fi_ops av_set_fi_ops =
    fid_ops(&Trampoline<&AvSet::close>::call<fid>, enosys<decltype(fi_ops::bind)>,
            &Trampoline<&AvSet::control>::call<fid>);

fi_ops_av_set av_set_ops = {
    .size = sizeof(fi_ops_av_set),
    .set_union = &Trampoline<&AvSet::set_union>::call<fid_av_set>,
    .intersect = &Trampoline<&AvSet::intersect>::call<fid_av_set>,
    .diff = &Trampoline<&AvSet::diff>::call<fid_av_set>,
    .insert = &Trampoline<&AvSet::insert>::call<fid_av_set>,
    .remove = &Trampoline<&AvSet::remove>::call<fid_av_set>,
    .addr = &Trampoline<&AvSet::addr>::call<fid_av_set>,
};

}  // namespace

// fi_av_set(3): the set starts with start_addr .. end_addr every stride (when both are given)
// and holds at most count addresses (0: as many as the AV has).
AvSet::AvSet(Av *av, const fi_av_set_attr &attr, void *context) : av_(av), capacity_(attr.count) {
    if (attr.flags & ~uint64_t(FI_UNIVERSE)) fail(FI_EINVAL, "unsupported AV set flags");
    // A communication key names the group on the fabric: tandem mixes it into the group's
    // identity (its tags), so sets of the same members with different keys never meet.
    if (attr.comm_key_size) {
        if (!attr.comm_key || attr.comm_key_size > kMaxCommKey) fail(FI_EINVAL, "AV set comm_key");
        comm_key_.assign(attr.comm_key, attr.comm_key + attr.comm_key_size);
    }
    std::lock_guard guard(av_->domain()->lock());
    if (attr.flags & FI_UNIVERSE) {
        for (fi_addr_t a = 0; av_->name_of(a); ++a) members_.push_back(a);
    } else if (attr.start_addr != FI_ADDR_NOTAVAIL && attr.end_addr != FI_ADDR_NOTAVAIL) {
        if (attr.end_addr < attr.start_addr || attr.stride == 0) fail(FI_EINVAL, "AV set range");
        for (fi_addr_t a = attr.start_addr; a <= attr.end_addr; a += attr.stride) {
            if (!av_->name_of(a)) fail(FI_EINVAL, "AV set range names an empty entry");
            members_.push_back(a);
        }
    }
    if (capacity_ && members_.size() > capacity_) fail(FI_EINVAL, "AV set larger than count");
    init_fid(FI_CLASS_AV_SET, context, &av_set_fi_ops);
    fid()->ops = &av_set_ops;
    av_->hold();
}

AvSet::~AvSet() {
    std::lock_guard guard(av_->domain()->lock());
    if (coll_addr_ != FI_ADDR_NOTAVAIL) av_->domain()->coll_addresses().remove(coll_addr_);
    av_->release();
}

int AvSet::close() {
    delete this;
    return 0;
}

int AvSet::control(int command, void *arg) {
    if (command != FI_EXPORT_FID) return -FI_ENOSYS;
    auto *exp = static_cast<fi_fid_export *>(arg);
    if (!exp || !exp->fid) return -FI_EINVAL;
    if (!exported_) exported_ = std::make_unique<peer::ExportedAvSet>(*this);
    *exp->fid = exported_->base_fid();
    return 0;
}

const AvSet *AvSet::other(const fid_av_set *src) const {
    const AvSet *o = from(src);
    if (!o) fail(FI_EINVAL, "not a tandem AV set");
    if (o->av_ != av_) fail(FI_EINVAL, "AV sets of different AVs");
    return o;
}

int AvSet::set_union(const fid_av_set *src) {
    const AvSet *o = other(src);
    std::lock_guard guard(av_->domain()->lock());
    for (fi_addr_t a : o->members_)
        if (std::find(members_.begin(), members_.end(), a) == members_.end()) {
            if (capacity_ && members_.size() == capacity_) return -FI_ENOSPC;
            members_.push_back(a);
        }
    return 0;
}

int AvSet::intersect(const fid_av_set *src) {
    const AvSet *o = other(src);
    std::lock_guard guard(av_->domain()->lock());
    std::erase_if(members_, [o](fi_addr_t a) {
        return std::find(o->members_.begin(), o->members_.end(), a) == o->members_.end();
    });
    return 0;
}

int AvSet::diff(const fid_av_set *src) {
    const AvSet *o = other(src);
    std::lock_guard guard(av_->domain()->lock());
    std::erase_if(members_, [o](fi_addr_t a) {
        return std::find(o->members_.begin(), o->members_.end(), a) != o->members_.end();
    });
    return 0;
}

int AvSet::insert(fi_addr_t addr) {
    std::lock_guard guard(av_->domain()->lock());
    if (!av_->name_of(addr)) return -FI_EINVAL;
    if (std::find(members_.begin(), members_.end(), addr) != members_.end()) return -FI_EINVAL;
    if (capacity_ && members_.size() == capacity_) return -FI_ENOSPC;
    members_.push_back(addr);
    return 0;
}

int AvSet::remove(fi_addr_t addr) {
    std::lock_guard guard(av_->domain()->lock());
    auto it = std::find(members_.begin(), members_.end(), addr);
    if (it == members_.end()) return -FI_EINVAL;
    members_.erase(it);
    return 0;
}

int AvSet::addr(fi_addr_t *coll_addr) {
    if (!coll_addr) return -FI_EINVAL;
    std::lock_guard guard(av_->domain()->lock());
    if (coll_addr_ == FI_ADDR_NOTAVAIL) coll_addr_ = av_->domain()->coll_addresses().add(this);
    *coll_addr = coll_addr_;
    return 0;
}

AvSet *AvSet::from(const fid_av_set *set) {
    if (!set || set->fid.fclass != FI_CLASS_AV_SET || set->ops != &av_set_ops) return nullptr;
    return AvSet::of(set);
}

int AvSet::peer_members(fi_addr_t *addr, size_t *count) {
    std::lock_guard guard(av_->domain()->lock());
    size_t room = *count;
    *count = members_.size();
    if (room < members_.size()) return -FI_ETOOSMALL;
    std::copy(members_.begin(), members_.end(), addr);
    return 0;
}

}  // namespace tandem
