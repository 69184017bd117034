#include "main_prov/cntr.h"

#include "main_prov/domain.h"
#include "main_prov/wait.h"

namespace tandem {

namespace {

fi_ops cntr_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&Cntr::close>::call<fid>,
    .bind = enosys<decltype(fi_ops::bind)>,
    .control = &Trampoline<&Cntr::control>::call<fid>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops_cntr cntr_ops = {
    .size = sizeof(fi_ops_cntr),
    .read = &Trampoline<&Cntr::read>::call<fid_cntr>,
    .readerr = &Trampoline<&Cntr::readerr>::call<fid_cntr>,
    .add = &Trampoline<&Cntr::add>::call<fid_cntr>,
    .set = &Trampoline<&Cntr::set>::call<fid_cntr>,
    .wait = &Trampoline<&Cntr::wait>::call<fid_cntr>,
    .adderr = &Trampoline<&Cntr::adderr>::call<fid_cntr>,
    .seterr = &Trampoline<&Cntr::seterr>::call<fid_cntr>,
};

}  // namespace

Cntr::Cntr(Domain *domain, const fi_cntr_attr &attr, void *context)
    : domain_(domain), wait_(raw_enum(attr.wait_obj), attr.wait_set, base_fid()) {
    if (raw_enum(attr.events) != FI_CNTR_EVENTS_COMP) fail(FI_ENOSYS, "unsupported counter events");
    if (attr.flags & ~uint64_t(FI_PEER)) fail(FI_EINVAL, "unsupported counter flags");
    if (attr.flags & FI_PEER) {
        // The context is the owner's fi_peer_cntr_context (also the fid's context, unused).
        owner_ = peer::ImportedCntr(peer::ImportedCntr::from_context(context));
        if (!owner_.valid()) fail(FI_EINVAL, "FI_PEER counter without a peer counter context");
    }
    init_fid(FI_CLASS_CNTR, context, &cntr_fi_ops);
    fid()->ops = &cntr_ops;
    domain_->hold();
    // A peer counter is not one of the domain's for triggered operations and deferred work:
    // its value is the owner's, which tandem cannot read (they refuse it: -FI_EINVAL).
    if (!imported()) {
        std::lock_guard guard(domain_->lock());
        domain_->add_counter(this);
    }
    wait_.join();  // last: fi_wait on the set may ask this counter from now on
}

Cntr::~Cntr() {
    domain_->release();
}

int Cntr::close() {
    {
        std::lock_guard guard(domain_->lock());
        if (refs_) return -FI_EBUSY;
        // Work that waits on this counter, counts into it or sets it can never run now: it
        // is discarded (a triggered operation reports FI_ECANCELED).
        if (!imported()) domain_->remove_counter(this);
    }
    wait_.leave();  // waits for an fi_wait inside this counter: not under the domain lock
    delete this;
    return 0;
}

int Cntr::control(int command, void *arg) {
    return wait_.control(command, arg, [this](WaitSet &set) {
        std::lock_guard guard(domain_->lock());
        domain_->watch_fds(set);
    });
}

// The eventfd is written only when a waiter may be asleep (armed by fi_cntr_wait or
// fi_trywait): a busy-polling application pays no system call per completion.
void Cntr::bump(std::atomic<uint64_t> &which, uint64_t n) {
    // Sequentially consistent, as the waiter's arming and look (wait): the increment and the
    // look at armed_ are not reordered, so one of the two sees the other.
    which.fetch_add(n);
    wake();
}

// Inside tandem's progress, under the domain lock; the owner may call back into tandem from
// its counter (to read another of tandem's objects), which PeerCall lets through.
void Cntr::count_into_owner(bool error) {
    DomainLock::PeerCall call(domain_->lock());
    error ? owner_.incerr() : owner_.inc();
}

void Cntr::wake() {
    if (wait_.set() && armed_.exchange(false)) wait_.signal().signal();
}

uint64_t Cntr::read() {
    if (imported()) [[unlikely]] {
        // fi_peer(3): the owner's fi_cntr_read drives the peer's progress through this.
        std::lock_guard guard(domain_->lock());
        domain_->progress();
        return 0;
    }
    uint64_t value;
    {
        std::lock_guard guard(domain_->lock());
        domain_->progress();
        value = value_.load(std::memory_order_acquire);
        // An unchanged value is an empty poll (see IdleYield).
        if (value != last_read_) {
            last_read_ = value;
            idle_.found();
            return value;
        }
        if (!idle_.empty_poll()) return value;
    }
    IdleYield::yield();
    return value;
}

uint64_t Cntr::readerr() {
    if (imported()) return 0;  // (the owner's to say; fi_peer(3) has the peer answer nothing)
    std::lock_guard guard(domain_->lock());
    domain_->progress();
    last_err_read_ = errors_.load(std::memory_order_acquire);
    return last_err_read_;
}

int Cntr::add(uint64_t value) {
    if (imported()) return -FI_ENOSYS;
    add_by_work(value);
    changed_by_application();
    return 0;
}

int Cntr::set(uint64_t value) {
    if (imported()) return -FI_ENOSYS;
    set_by_work(value);
    changed_by_application();
    return 0;
}

int Cntr::adderr(uint64_t value) {
    if (imported()) return -FI_ENOSYS;
    bump(errors_, value);
    changed_by_application();
    return 0;
}

int Cntr::seterr(uint64_t value) {
    if (imported()) return -FI_ENOSYS;
    errors_.store(value);  // (sequentially consistent: see bump)
    wake();
    changed_by_application();
    return 0;
}

// Triggered work starts from here rather than at the application's next progress call: a
// counter the application moves is often the signal that data is ready to go.
void Cntr::changed_by_application() {
    if (!domain_->triggers_waiting()) return;  // (one relaxed load when nothing waits)
    std::lock_guard guard(domain_->lock());
    domain_->start_triggers();
}

int Cntr::wait(uint64_t threshold, int timeout) {
    if (imported()) return -FI_ENOSYS;
    Deadline deadline(timeout);
    uint64_t errs_at_start = errors_.load();
    for (;;) {
        int limit = -1;
        {
            std::lock_guard guard(domain_->lock());
            // Armed, with old signals drained, before the value is looked at: an increment
            // after the look (fi_cntr_add on another thread takes no lock) then signals, and
            // the sleep below ends at once.
            if (wait_.set()) {
                wait_.signal().drain();
                armed_ = true;
            }
            domain_->progress();
            if (value_.load() >= threshold) return 0;
            // fi_cntr_wait(3): an error increment ends the wait with -FI_EAVAIL.
            if (errors_.load() != errs_at_start) return -FI_EAVAIL;
            if (wait_.set()) {
                domain_->watch_fds(*wait_.set());
                limit = domain_->sleep_limit_ms();
            }
        }
        if (deadline.expired()) return -FI_ETIMEDOUT;
        // (As fi_cq_sread: no periodic wake-up beyond the domain's limit.)
        if (wait_.set() && wait_.set()->wait(deadline.remaining_ms(limit)) < 0) return -FI_EINTR;
    }
}

// fi_trywait(3) refuses the sleep while events are queued: for a counter, a value or error
// count the application has not read (fi_cntr_read, fi_cntr_readerr). An increment after the
// look below finds the counter armed and signals, one before it is refused here.
int Cntr::trywait() {
    std::lock_guard guard(domain_->lock());
    domain_->progress();
    if (wait_.set()) {
        domain_->watch_fds(*wait_.set());
        armed_ = true;
    }
    if (value_.load() != last_read_ || errors_.load() != last_err_read_) return -FI_EAGAIN;
    return 0;
}

}  // namespace tandem
