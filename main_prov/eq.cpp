#include "main_prov/eq.h"

#include "main_prov/fabric.h"
#include "main_prov/wait.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tandem {

#if TANDEM_LOCK_CHECKS
void lock_order::violated(const char *what) noexcept {
    std::fprintf(stderr, "tandem: lock order violated: %s (main_prov/lock_order.h)\n", what);
    std::fflush(stderr);
    std::abort();
}
#endif

namespace {

fi_ops eq_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&Eq::close>::call<fid>,
    .bind = enosys<decltype(fi_ops::bind)>,
    .control = &Trampoline<&Eq::control>::call<fid>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops_eq eq_ops = {
    .size = sizeof(fi_ops_eq),
    .read = &Trampoline<&Eq::read>::call<fid_eq>,
    .readerr = &Trampoline<&Eq::readerr>::call<fid_eq>,
    .write = &Trampoline<&Eq::write>::call<fid_eq>,
    .sread = &Trampoline<&Eq::sread>::call<fid_eq>,
    .strerror = &Trampoline<&Eq::strerror>::call<fid_eq>,
};

}  // namespace

Eq::Eq(Fabric *fabric, const fi_eq_attr &attr, void *context)
    : fabric_(fabric), wait_(raw_enum(attr.wait_obj), attr.wait_set, base_fid()) {
    if (attr.flags & ~uint64_t(FI_WRITE | FI_AFFINITY)) fail(FI_EINVAL, "unsupported EQ flags");
    init_fid(FI_CLASS_EQ, context, &eq_fi_ops);
    fid()->ops = &eq_ops;
    fabric_->hold();
    wait_.join();  // last: fi_wait on the set may ask this EQ from now on
}

Eq::~Eq() {
    fabric_->release();
}

int Eq::close() {
    {
        std::lock_guard guard(mutex_);
        if (!sources_.empty()) return -FI_EBUSY;
    }
    wait_.leave();
    delete this;
    return 0;
}

int Eq::control(int command, void *arg) {
    return wait_.control(command, arg, [this](WaitSet &set) { watch_sources(set); });
}

template <class F>
void Eq::for_each_source(F &&f) {
    TANDEM_LOCK_ASSERT(!mutex_.held(), "an EQ calls into its sources under its own mutex");
    std::vector<CmSource *> walk;
    {
        std::lock_guard guard(mutex_);
        walk = sources_;
        for (auto *s : walk) ++s->eq_walks_;
    }
    // Released however the walk ends (a source may throw): a close waits for it.
    struct Release {
        Eq &eq;
        const std::vector<CmSource *> &walk;
        ~Release() {
            std::lock_guard guard(eq.mutex_);
            bool some_done = false;
            for (auto *s : walk) some_done |= --s->eq_walks_ == 0;
            if (some_done) eq.walk_done_.notify_all();
        }
    } release{*this, walk};
    for (auto *s : walk) f(*s);
}

void Eq::progress_sources() {
    // A source takes its own lock (the domain's, or the passive endpoint's) and may post here.
    for_each_source([](CmSource &s) { s.progress_cm(); });
}

int Eq::sleep_limit_ms() {
    int limit = -1;
    for_each_source(
        [&limit](CmSource &s) { limit = Deadline::shorter(limit, s.sleep_limit_ms()); });
    return limit;
}

void Eq::watch_sources(WaitSet &set) {
    for_each_source([&set](CmSource &s) { s.cm_watch(set); });
}

ssize_t Eq::read_locked(uint32_t *event, void *buf, size_t len, uint64_t flags) {
    if (!errors_.empty()) return -FI_EAVAIL;
    if (events_.empty()) return -FI_EAGAIN;
    Event &ev = events_.front();
    // No buffer: the caller wants the event's type alone (fabtests' collective tests read
    // FI_JOIN_COMPLETE so, as libfabric's own EQs allow); the body is dropped.
    if (buf && len < ev.body.size()) return -FI_ETOOSMALL;
    if (event) *event = ev.type;
    size_t n = buf ? ev.body.size() : 0;
    if (n) memcpy(buf, ev.body.data(), n);
    if (!(flags & FI_PEEK)) events_.pop_front();
    if (events_.empty() && errors_.empty()) wait_.signal().drain();
    return static_cast<ssize_t>(n);
}

ssize_t Eq::read(uint32_t *event, void *buf, size_t len, uint64_t flags) {
    if (len && !buf) return -FI_EINVAL;
    {
        std::lock_guard guard(mutex_);
        if (!events_.empty() || !errors_.empty()) return read_locked(event, buf, len, flags);
    }
    progress_sources();
    std::lock_guard guard(mutex_);
    return read_locked(event, buf, len, flags);
}

ssize_t Eq::readerr(fi_eq_err_entry *buf, uint64_t flags) {
    if (!buf) return -FI_EINVAL;
    std::lock_guard guard(mutex_);
    if (errors_.empty()) return -FI_EAGAIN;
    ErrorEvent &e = errors_.front();
    void *user_data = buf->err_data;
    size_t user_size = buf->err_data_size;
    *buf = e.entry;
    if (user_data && user_size) {
        size_t n = std::min(user_size, e.data.size());
        if (n) memcpy(user_data, e.data.data(), n);
        buf->err_data = user_data;
        buf->err_data_size = n;
    } else {
        last_err_data_ = e.data;
        buf->err_data = last_err_data_.empty() ? nullptr : last_err_data_.data();
        buf->err_data_size = last_err_data_.size();
    }
    if (!(flags & FI_PEEK)) errors_.pop_front();
    return sizeof(fi_eq_err_entry);
}

ssize_t Eq::write(uint32_t event, const void *buf, size_t len, uint64_t flags) {
    (void)flags;
    if (len && !buf) return -FI_EINVAL;
    post(event, buf, len);
    return static_cast<ssize_t>(len);
}

ssize_t Eq::sread(uint32_t *event, void *buf, size_t len, int timeout, uint64_t flags) {
    if (!wait_.set()) return -FI_ENOSYS;
    Deadline deadline(timeout);
    for (;;) {
        ssize_t n = read(event, buf, len, flags);
        if (n != -FI_EAGAIN) return n;
        watch_sources(*wait_.set());
        const int limit = sleep_limit_ms();
        if (deadline.expired()) return -FI_EAGAIN;
        // Asleep until a source's descriptor or a write wakes us, the deadline, or the
        // sources' limit (a held FI_SHUTDOWN, a stalled stranger's time): no periodic wake-up.
        if (wait_.set()->wait(deadline.remaining_ms(limit)) < 0) return -FI_EINTR;
    }
}

const char *Eq::strerror(int prov_errno, const void *err_data, char *buf, size_t len) {
    (void)err_data;
    const char *text = fi_strerror(prov_errno < 0 ? -prov_errno : prov_errno);
    if (buf && len) {
        strncpy(buf, text, len - 1);
        buf[len - 1] = '\0';
        return buf;
    }
    return text;
}

void Eq::post(uint32_t event, const void *buf, size_t len) {
    std::lock_guard guard(mutex_);
    Event ev{event, {}};
    if (len)
        ev.body.assign(static_cast<const uint8_t *>(buf), static_cast<const uint8_t *>(buf) + len);
    events_.push_back(std::move(ev));
    if (wait_.set()) wait_.signal().signal();
}

void Eq::post_error(fid_t fid, void *context, int err, const void *err_data, size_t err_len,
                    uint64_t data) {
    std::lock_guard guard(mutex_);
    ErrorEvent e{};
    e.entry.fid = fid;
    e.entry.context = context;
    e.entry.data = data;
    e.entry.err = err < 0 ? -err : err;
    e.entry.prov_errno = e.entry.err;
    if (err_len)
        e.data.assign(static_cast<const uint8_t *>(err_data),
                      static_cast<const uint8_t *>(err_data) + err_len);
    errors_.push_back(std::move(e));
    if (wait_.set()) wait_.signal().signal();
}

int Eq::trywait() {
    progress_sources();
    {
        std::lock_guard guard(mutex_);
        if (!events_.empty() || !errors_.empty()) return -FI_EAGAIN;
    }
    // An event posted from here on signals the eventfd, which is in the set: no wake-up lost.
    if (wait_.set()) watch_sources(*wait_.set());
    return 0;
}

void Eq::add_source(CmSource *src) {
    std::lock_guard guard(mutex_);
    sources_.push_back(src);
}

void Eq::remove_source(CmSource *src) {
    std::unique_lock lock(mutex_);
    std::erase(sources_, src);
    walk_done_.wait(lock, [src] { return src->eq_walks_ == 0; });
}

}  // namespace tandem
