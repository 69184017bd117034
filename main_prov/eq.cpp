#include "main_prov/eq.h"

#include "main_prov/fabric.h"
#include "main_prov/wait.h"

#include <algorithm>
#include <cstring>

namespace tandem {

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
}

Eq::~Eq() {
    fabric_->release();
}

int Eq::close() {
    {
        std::lock_guard guard(mutex_);
        if (!sources_.empty()) return -FI_EBUSY;
    }
    delete this;
    return 0;
}

int Eq::control(int command, void *arg) {
    return wait_.control(command, arg, [this](WaitSet &set) {
        std::vector<int> fds;
        {
            std::lock_guard guard(mutex_);
            for (auto *s : sources_) s->cm_wait_fds(fds);
        }
        for (int fd : fds) set.add(fd);
    });
}

void Eq::progress_sources() {
    std::vector<CmSource *> sources;
    {
        std::lock_guard guard(mutex_);
        sources = sources_;
    }
    // Without the EQ lock: a source takes its own lock and may post here.
    for (auto *s : sources) s->progress_cm();
}

ssize_t Eq::read_locked(uint32_t *event, void *buf, size_t len, uint64_t flags) {
    if (!errors_.empty()) return -FI_EAVAIL;
    if (events_.empty()) return -FI_EAGAIN;
    Event &ev = events_.front();
    if (len < ev.body.size()) return -FI_ETOOSMALL;
    if (event) *event = ev.type;
    size_t n = ev.body.size();
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
        std::vector<int> fds;
        {
            std::lock_guard guard(mutex_);
            for (auto *s : sources_) s->cm_wait_fds(fds);
        }
        for (int fd : fds) wait_.set()->add(fd);
        if (deadline.expired()) return -FI_EAGAIN;
        int left = deadline.remaining_ms();
        wait_.set()->wait(left < 0 || left > 50 ? 50 : left);
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
    std::vector<int> fds;
    {
        std::lock_guard guard(mutex_);
        if (!events_.empty() || !errors_.empty()) return -FI_EAGAIN;
        for (auto *s : sources_) s->cm_wait_fds(fds);
    }
    if (wait_.set())
        for (int fd : fds) wait_.set()->add(fd);
    return 0;
}

void Eq::add_source(CmSource *src) {
    std::lock_guard guard(mutex_);
    sources_.push_back(src);
}

void Eq::remove_source(CmSource *src) {
    std::lock_guard guard(mutex_);
    std::erase(sources_, src);
}

}  // namespace tandem
