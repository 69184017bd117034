#include "main_prov/cq.h"

#include "common/log.h"

#include "main_prov/domain.h"
#include "main_prov/wait.h"

#include <cstring>

namespace tandem {

namespace {

size_t entry_size_of(int format) {
    switch (format) {
        case FI_CQ_FORMAT_CONTEXT:
            return sizeof(fi_cq_entry);
        case FI_CQ_FORMAT_MSG:
            return sizeof(fi_cq_msg_entry);
        case FI_CQ_FORMAT_DATA:
            return sizeof(fi_cq_data_entry);
        case FI_CQ_FORMAT_TAGGED:
            return sizeof(fi_cq_tagged_entry);
        default:
            return 0;
    }
}

fi_ops cq_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&Cq::close>::call<fid>,
    .bind = enosys<decltype(fi_ops::bind)>,
    .control = &Trampoline<&Cq::control>::call<fid>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops_cq cq_ops = {
    .size = sizeof(fi_ops_cq),
    .read = &Trampoline<&Cq::read>::call<fid_cq>,
    .readfrom = &Trampoline<&Cq::readfrom>::call<fid_cq>,
    .readerr = &Trampoline<&Cq::readerr>::call<fid_cq>,
    .sread = &Trampoline<&Cq::sread>::call<fid_cq>,
    .sreadfrom = &Trampoline<&Cq::sreadfrom>::call<fid_cq>,
    .signal = &Trampoline<&Cq::signal>::call<fid_cq>,
    .strerror = &Trampoline<&Cq::strerror>::call<fid_cq>,
};

}  // namespace

Cq::Cq(Domain *domain, const fi_cq_attr &attr, void *context)
    : domain_(domain),
      format_(FI_CQ_FORMAT_CONTEXT),
      entry_size_(0),
      wait_(raw_enum(attr.wait_obj), attr.wait_set, base_fid()) {
    int format = raw_enum(attr.format);
    entry_size_ = format == FI_CQ_FORMAT_UNSPEC ? sizeof(fi_cq_entry) : entry_size_of(format);
    if (entry_size_ && format != FI_CQ_FORMAT_UNSPEC) format_ = static_cast<fi_cq_format>(format);
    if (!entry_size_) fail(FI_ENOSYS, "unsupported CQ format");
    if (attr.flags & ~uint64_t(FI_AFFINITY | FI_PEER)) fail(FI_EINVAL, "unsupported CQ flags");
    if (attr.flags & FI_PEER) {
        // The context is the owner's fi_peer_cq_context; the fid's own context is unused.
        owner_cq_ = peer::ImportedCq(peer::ImportedCq::from_context(context));
        if (!owner_cq_.valid()) fail(FI_EINVAL, "FI_PEER CQ without a peer CQ context");
    }
    if (raw_enum(attr.wait_cond) != FI_CQ_COND_NONE &&
        raw_enum(attr.wait_cond) != FI_CQ_COND_THRESHOLD)
        fail(FI_ENOSYS, "unsupported CQ wait condition");
    init_fid(FI_CLASS_CQ, context, &cq_fi_ops);
    fid()->ops = &cq_ops;
    domain_->hold();
    wait_.join();  // last: fi_wait on the set may ask this CQ from now on
}

Cq::~Cq() {
    domain_->release();
}

int Cq::close() {
    {
        std::lock_guard guard(domain_->lock());
        if (refs_) return -FI_EBUSY;
    }
    wait_.leave();  // waits for an fi_wait inside this CQ: not under the domain lock
    delete this;
    return 0;
}

int Cq::control(int command, void *arg) {
    if (command == FI_EXPORT_FID) {
        auto *exp = static_cast<fi_fid_export *>(arg);
        if (!exp || !exp->fid) return -FI_EINVAL;
        std::lock_guard guard(domain_->lock());
        if (!exported_) exported_ = std::make_unique<peer::ExportedCq>(*this);
        *exp->fid = exported_->base_fid();
        return 0;
    }
    return wait_.control(command, arg, [this](WaitSet &set) {
        std::lock_guard guard(domain_->lock());
        domain_->watch_fds(set);
    });
}

void Cq::copy_out(const Completion &c, void *dst) const {
    switch (format_) {
        case FI_CQ_FORMAT_CONTEXT:
            static_cast<fi_cq_entry *>(dst)->op_context = c.op_context;
            break;
        case FI_CQ_FORMAT_MSG:
            *static_cast<fi_cq_msg_entry *>(dst) = {c.op_context, c.flags, c.len};
            break;
        case FI_CQ_FORMAT_DATA:
            *static_cast<fi_cq_data_entry *>(dst) = {c.op_context, c.flags, c.len, c.buf, c.data};
            break;
        case FI_CQ_FORMAT_TAGGED:
            *static_cast<fi_cq_tagged_entry *>(dst) = {c.op_context, c.flags, c.len,
                                                       c.buf,        c.data,  c.tag};
            break;
        default:
            break;
    }
}

ssize_t Cq::read_locked(void *buf, size_t count, fi_addr_t *src_addr) {
    if (entries_.empty() || !errors_.empty()) {
        domain_->progress();
    }
    // An error waiting at the head is reported before later successes (fi_cq(3)).
    if (!errors_.empty()) return -FI_EAVAIL;
    if (entries_.empty()) return -FI_EAGAIN;
    return take(buf, count, src_addr);
}

ssize_t Cq::take(void *buf, size_t count, fi_addr_t *src_addr) {
    size_t n = 0;
    auto *out = static_cast<uint8_t *>(buf);
    while (n < count && !entries_.empty()) {
        const Completion &c = entries_.front();
        copy_out(c, out + n * entry_size_);
        if (src_addr) src_addr[n] = c.src;
        if (c.owner) --c.owner->queued;
        entries_.pop_front();
        ++n;
    }
    if (signal_pending_) drain_signal_if_empty();
    return static_cast<ssize_t>(n);
}

// Nothing left to read: the eventfd must not stay readable, or a reader asleep on it would
// wake at once, again and again.
void Cq::drain_signal_if_empty() {
    if (entries_.empty() && signal_pending_) {
        signal_pending_ = false;
        wait_.signal().drain();
    }
}

// (readfrom without the source list, spelled out: the busy poll of most applications.)
ssize_t Cq::read(void *buf, size_t count) {
    if (count && !buf) return -FI_EINVAL;
    if (imported()) [[unlikely]] {
        // fi_peer(3): the owner drives our progress with fi_cq_read(cq, NULL, 0).
        if (count) return -FI_ENOSYS;
        std::lock_guard guard(domain_->lock());
        domain_->progress();
        return 0;
    }
    {
        std::lock_guard guard(domain_->lock());
        if (entries_.empty() || !errors_.empty()) {
            domain_->progress();
            if (!errors_.empty()) return -FI_EAVAIL;
        }
        if (!entries_.empty()) {
            idle_.found();
            return take(buf, count, nullptr);
        }
        if (!idle_.empty_poll()) return -FI_EAGAIN;
    }
    IdleYield::yield();  // (see IdleYield: outside the lock)
    return -FI_EAGAIN;
}

ssize_t Cq::readfrom(void *buf, size_t count, fi_addr_t *src_addr) {
    if (count && !buf) return -FI_EINVAL;
    if (imported()) return -FI_ENOSYS;  // (fi_peer(3): the owner's CQ is the one to read)
    ssize_t n;
    {
        std::lock_guard guard(domain_->lock());
        n = read_locked(buf, count, src_addr);
        if (n != -FI_EAGAIN) {
            idle_.found();
            return n;
        }
        if (!idle_.empty_poll()) return n;
    }
    IdleYield::yield();
    return n;
}

ssize_t Cq::readerr(fi_cq_err_entry *buf, uint64_t flags) {
    (void)flags;
    if (!buf) return -FI_EINVAL;
    if (imported()) return -FI_ENOSYS;
    std::lock_guard guard(domain_->lock());
    if (errors_.empty()) domain_->progress();
    if (errors_.empty()) return -FI_EAGAIN;
    const fi_cq_err_entry &e = errors_.front().entry;
    // API >= 1.5: a caller-provided err_data buffer of err_data_size bytes is filled;
    // otherwise err_data points at provider memory valid until the next readerr.
    void *user_data = buf->err_data;
    size_t user_size = buf->err_data_size;
    *buf = e;
    if (user_data && user_size) {
        size_t n = std::min(user_size, e.err_data_size);
        if (n) memcpy(user_data, e.err_data, n);
        buf->err_data = user_data;
        buf->err_data_size = n;
    } else {
        buf->err_data = nullptr;
        buf->err_data_size = 0;
    }
    if (errors_.front().owner) --errors_.front().owner->queued;
    errors_.pop_front();
    return 1;
}

ssize_t Cq::sread(void *buf, size_t count, const void *cond, int timeout) {
    return sreadfrom(buf, count, nullptr, cond, timeout);
}

ssize_t Cq::sreadfrom(void *buf, size_t count, fi_addr_t *src_addr, const void *cond, int timeout) {
    (void)cond;
    if (!wait_.set() || imported()) return -FI_ENOSYS;
    if (count && !buf) return -FI_EINVAL;
    Deadline deadline(timeout);
    for (;;) {
        int limit;
        {
            std::lock_guard guard(domain_->lock());
            ssize_t n = read_locked(buf, count, src_addr);
            if (n != -FI_EAGAIN) return n;
            if (signalled_) {
                signalled_ = false;
                return -FI_EAGAIN;  // fi_cq_signal: wake without a completion
            }
            domain_->watch_fds(*wait_.set());
            armed_ = true;
            limit = domain_->sleep_limit_ms();
        }
        if (deadline.expired()) return -FI_EAGAIN;
        // Asleep until a descriptor wakes us (a completion, a socket, the node-local wake, the
        // twin's timer), the deadline, or the domain's limit: no periodic wake-up beyond that.
        if (wait_.set()->wait(deadline.remaining_ms(limit)) < 0) return -FI_EINTR;
    }
}

// A peer's completion: fi_peer(3) makes locking, signalling and overflow the owner's job,
// which write() does as for tandem's own. Source addresses are passed as the peer gave them
// (ours when it shares our AV).
ssize_t Cq::peer_write(void *context, uint64_t flags, size_t len, void *buf, uint64_t data,
                       uint64_t tag, fi_addr_t src) {
    // (From inside our start of a message the peer queued, the lock is ours already.)
    PeerEntryGuard guard(domain_->lock(), domain_->lock().in_peer_call());
    write({context, flags, len, buf, data, tag, src});
    return 0;
}

ssize_t Cq::peer_writeerr(const fi_cq_err_entry &err) {
    PeerEntryGuard guard(domain_->lock(), domain_->lock().in_peer_call());
    CompletionError e{};
    e.entry = err;
    // The peer's error data is not ours to keep pointing at.
    e.entry.err_data = nullptr;
    e.entry.err_data_size = 0;
    e.src = FI_ADDR_NOTAVAIL;
    write_error(e);
    return 0;
}

int Cq::signal() {
    std::lock_guard guard(domain_->lock());
    signalled_ = true;
    signal_pending_ = true;
    wait_.signal().signal();
    return 0;
}

const char *Cq::strerror(int prov_errno, const void *err_data, char *buf, size_t len) {
    (void)err_data;
    const char *text = fi_strerror(prov_errno < 0 ? -prov_errno : prov_errno);
    if (buf && len) {
        strncpy(buf, text, len - 1);
        buf[len - 1] = '\0';
        return buf;
    }
    return text;
}

// The eventfd is written only when someone may be asleep (armed by sread or fi_trywait),
// so a busy-polling application pays no system call per completion.
void Cq::signal_sleeper() {
    armed_ = false;
    signal_pending_ = true;
    wait_.signal().signal();
}

void Cq::forward(void *context, uint64_t flags, size_t len, void *buf, uint64_t data, uint64_t tag,
                 fi_addr_t src) {
    DomainLock::PeerCall call(domain_->lock());
    ssize_t ret = owner_cq_.write(context, flags, len, buf, data, tag, src);
    if (ret) TANDEM_WARN(FI_LOG_CQ, "the owner of a peer CQ refused a completion: %zd\n", ret);
}

void Cq::write_error(const CompletionError &e) {
    if (imported()) [[unlikely]] {
        DomainLock::PeerCall call(domain_->lock());
        ssize_t ret = owner_cq_.writeerr(e.entry);
        if (ret) TANDEM_WARN(FI_LOG_CQ, "the owner of a peer CQ refused an error: %zd\n", ret);
        return;
    }
    if (e.owner) ++e.owner->queued;
    errors_.push_back(e);
    if (armed_) {
        armed_ = false;
        signal_pending_ = true;
        wait_.signal().signal();
    }
}

void Cq::discard_receives_of(CompletionOwner *owner) {
    entries_.remove_if([owner](const Completion &c) { return c.owner == owner; });
    std::erase_if(errors_, [owner](const CompletionError &e) { return e.owner == owner; });
    owner->queued = 0;
    drain_signal_if_empty();
}

int Cq::trywait() {
    std::lock_guard guard(domain_->lock());
    domain_->progress();
    if (has_entries()) return -FI_EAGAIN;
    if (wait_.set()) {
        domain_->watch_fds(*wait_.set());
        armed_ = true;
    }
    return 0;
}

}  // namespace tandem
