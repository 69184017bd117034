#include "main_prov/wait.h"

#include "main_prov/cntr.h"
#include "main_prov/cq.h"
#include "main_prov/domain.h"
#include "main_prov/eq.h"
#include "main_prov/fabric.h"

#include <algorithm>

namespace tandem {

namespace {

fi_ops wait_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&WaitObject::close>::call<fid>,
    .bind = enosys<decltype(fi_ops::bind)>,
    .control = &Trampoline<&WaitObject::control>::call<fid>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops_wait wait_ops = {
    .size = sizeof(fi_ops_wait),
    .wait = &Trampoline<&WaitObject::wait>::call<fid_wait>,
};

fi_ops poll_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&PollObject::close>::call<fid>,
    .bind = enosys<decltype(fi_ops::bind)>,
    .control = enosys<decltype(fi_ops::control)>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops_poll poll_ops = {
    .size = sizeof(fi_ops_poll),
    .poll = &Trampoline<&PollObject::poll>::call<fid_poll>,
    .poll_add = &Trampoline<&PollObject::add>::call<fid_poll>,
    .poll_del = &Trampoline<&PollObject::del>::call<fid_poll>,
};

}  // namespace

WaitObject::WaitObject(Fabric *fabric, const fi_wait_attr &attr) : fabric_(fabric) {
    if (raw_enum(attr.wait_obj) != FI_WAIT_UNSPEC && raw_enum(attr.wait_obj) != FI_WAIT_FD)
        fail(FI_ENOSYS, "wait sets support FI_WAIT_UNSPEC and FI_WAIT_FD");
    if (attr.flags) fail(FI_EINVAL, "unsupported wait set flags");
    init_fid(FI_CLASS_WAIT, nullptr, &wait_fi_ops);
    fid()->ops = &wait_ops;
    fabric_->hold();
}

WaitObject::~WaitObject() {
    fabric_->release();
}

int WaitObject::close() {
    {
        std::lock_guard guard(mutex_);
        if (!members_.empty()) return -FI_EBUSY;
    }
    delete this;
    return 0;
}

int WaitObject::control(int command, void *arg) {
    if (command != FI_GETWAIT) return -FI_ENOSYS;
    if (!arg) return -FI_EINVAL;
    *static_cast<int *>(arg) = set_.fd();
    return 0;
}

void WaitObject::attach(struct fid *member) {
    std::lock_guard guard(mutex_);
    members_.push_back(member);
}

void WaitObject::detach(struct fid *member) {
    std::unique_lock lock(mutex_);
    std::erase(members_, member);
    walk_done_.wait(lock, [&] { return !walks_.contains(member); });
}

int WaitObject::wait(int timeout) {
    Deadline deadline(timeout);
    for (;;) {
        std::vector<struct fid *> members;
        {
            std::lock_guard guard(mutex_);
            members = members_;
            for (auto *m : members) ++walks_[m];
        }
        bool ready = false;
        int limit = -1;
        {
            // Released however the pass ends: a member's close waits for it.
            struct Release {
                WaitObject &set;
                const std::vector<struct fid *> &members;
                ~Release() {
                    std::lock_guard guard(set.mutex_);
                    bool some_done = false;
                    for (auto *m : members) {
                        auto it = set.walks_.find(m);
                        if (--it->second == 0) {
                            set.walks_.erase(it);
                            some_done = true;
                        }
                    }
                    if (some_done) set.walk_done_.notify_all();
                }
            } release{*this, members};
            for (auto *m : members) {
                if (trywait_one(m) == -FI_EAGAIN) {
                    ready = true;
                    break;
                }
                limit = Deadline::shorter(limit, sleep_limit_of(m));
            }
        }
        if (ready) return 0;
        if (deadline.expired()) return -FI_ETIMEDOUT;
        // Asleep until a member's descriptor wakes the set, the deadline, or the shortest of
        // the members' limits: no periodic wake-up beyond those (as fi_cq_sread).
        if (set_.wait(deadline.remaining_ms(limit)) < 0) return -FI_EINTR;
    }
}

PollObject::PollObject(Domain *domain, const fi_poll_attr &attr) : domain_(domain) {
    if (attr.flags) fail(FI_EINVAL, "unsupported poll set flags");
    init_fid(FI_CLASS_POLL, nullptr, &poll_fi_ops);
    fid()->ops = &poll_ops;
    domain_->hold();
}

PollObject::~PollObject() {
    domain_->release();
}

int PollObject::close() {
    delete this;
    return 0;
}

int PollObject::add(struct fid *event_fid, uint64_t flags) {
    (void)flags;
    if (!event_fid) return -FI_EINVAL;
    if (event_fid->fclass != FI_CLASS_CQ && event_fid->fclass != FI_CLASS_CNTR) return -FI_EINVAL;
    std::lock_guard guard(mutex_);
    if (std::find(members_.begin(), members_.end(), event_fid) != members_.end())
        return -FI_EALREADY;
    members_.push_back(event_fid);
    last_counts_.push_back(0);
    return 0;
}

int PollObject::del(struct fid *event_fid, uint64_t flags) {
    (void)flags;
    std::lock_guard guard(mutex_);
    auto it = std::find(members_.begin(), members_.end(), event_fid);
    if (it == members_.end()) return -FI_EINVAL;
    last_counts_.erase(last_counts_.begin() + (it - members_.begin()));
    members_.erase(it);
    return 0;
}

int PollObject::poll(void **context, int count) {
    if (count <= 0 || !context) return -FI_EINVAL;
    std::lock_guard guard(mutex_);
    int n = 0;
    for (size_t i = 0; i < members_.size() && n < count; ++i) {
        struct fid *m = members_[i];
        bool ready = false;
        if (m->fclass == FI_CLASS_CQ) {
            ready = Cq::of(m)->trywait() == -FI_EAGAIN;
        } else {
            uint64_t now = Cntr::of(m)->read() + Cntr::of(m)->readerr();
            ready = now != last_counts_[i];
            last_counts_[i] = now;
        }
        if (ready) context[n++] = m->context;
    }
    return n;
}

WaitBinding::WaitBinding(int wait_obj, fid_wait *wait_set, struct fid *owner) : owner_(owner) {
    switch (wait_obj) {
        case FI_WAIT_NONE:
            break;
        case FI_WAIT_UNSPEC:
        case FI_WAIT_FD:
            own_ = std::make_unique<WaitSet>();
            set_ = own_.get();
            break;
        case FI_WAIT_SET:
            if (!wait_set) fail(FI_EINVAL, "FI_WAIT_SET without a wait set");
            object_ = WaitObject::of(wait_set);
            set_ = &object_->set();
            break;
        default:
            fail(FI_ENOSYS, "unsupported wait object");
    }
    if (set_) set_->add(signal_.fd());
}

void WaitBinding::join() {
    if (!object_ || joined_) return;
    object_->attach(owner_);
    joined_ = true;
}

void WaitBinding::leave() {
    if (!object_) return;
    set_->remove(signal_.fd());
    if (joined_) object_->detach(owner_);
    joined_ = false;
    object_ = nullptr;
    set_ = nullptr;
}

WaitBinding::~WaitBinding() {
    leave();
    if (set_) set_->remove(signal_.fd());
}

int report_wait_object(void *arg, bool own_fd, bool in_set) {
    if (!arg) return -FI_EINVAL;
    *static_cast<fi_wait_obj *>(arg) = own_fd ? FI_WAIT_FD : in_set ? FI_WAIT_SET : FI_WAIT_NONE;
    return 0;
}

// How long fi_wait may sleep on a member before it must look again: its domain's
// Domain::sleep_limit_ms for a CQ or counter, its sources' for an EQ (-1: until a descriptor
// wakes it).
int sleep_limit_of(struct fid *f) {
    Domain *domain = nullptr;
    switch (f->fclass) {
        case FI_CLASS_CQ:
            domain = Cq::of(f)->domain();
            break;
        case FI_CLASS_CNTR:
            domain = Cntr::of(f)->domain();
            break;
        case FI_CLASS_EQ:
            return Eq::of(f)->sleep_limit_ms();
        default:
            return -1;
    }
    std::lock_guard guard(domain->lock());
    return domain->sleep_limit_ms();
}

int trywait_one(struct fid *f) {
    if (!f) return -FI_EINVAL;
    switch (f->fclass) {
        case FI_CLASS_CQ:
            return Cq::of(f)->trywait();
        case FI_CLASS_CNTR:
            return Cntr::of(f)->trywait();
        case FI_CLASS_EQ:
            return Eq::of(f)->trywait();
        case FI_CLASS_WAIT:
            return 0;
        default:
            return -FI_EINVAL;
    }
}

}  // namespace tandem
