#include "main_prov/domain.h"

#include "common/coarse_clock.h"
#include "common/fabric_compat.h"
#include "common/log.h"

#include "hmem/atomic_target.h"

#include "main_prov/av.h"
#include "main_prov/cntr.h"
#include "main_prov/cq.h"
#include "main_prov/endpoint.h"
#include "main_prov/config.h"
#include "main_prov/fabric.h"
#include "main_prov/interfaces.h"
#include "main_prov/local_path.h"
#include "main_prov/progress_thread.h"
#include "main_prov/srx.h"
#include "main_prov/wait.h"

#include <algorithm>

namespace tandem {

namespace {

fi_ops domain_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&Domain::close>::call<fid>,
    .bind = &Trampoline<&Domain::bind>::call<fid>,
    .control = &Trampoline<&Domain::control>::call<fid>,
    .ops_open = &Trampoline<&Domain::ops_open>::call<fid>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops_domain domain_ops = {
    .size = sizeof(fi_ops_domain),
    .av_open = &Trampoline<&Domain::av_open>::call<fid_domain>,
    .cq_open = &Trampoline<&Domain::cq_open>::call<fid_domain>,
    .endpoint = &Trampoline<&Domain::endpoint>::call<fid_domain>,
    .scalable_ep = &Trampoline<&Domain::scalable_ep>::call<fid_domain>,
    .cntr_open = &Trampoline<&Domain::cntr_open>::call<fid_domain>,
    .poll_open = &Trampoline<&Domain::poll_open>::call<fid_domain>,
    .stx_ctx = &Trampoline<&Domain::stx_ctx>::call<fid_domain>,
    .srx_ctx = &Trampoline<&Domain::srx_ctx>::call<fid_domain>,
    .query_atomic = &Trampoline<&Domain::query_atomic>::call<fid_domain>,
    .query_collective = &Trampoline<&Domain::query_collective>::call<fid_domain>,
    .endpoint2 = enosys<decltype(fi_ops_domain::endpoint2)>,
};

fi_ops_mr domain_mr_ops = {
    .size = sizeof(fi_ops_mr),
    .reg = &Trampoline<&Domain::mr_reg>::call<fid>,
    .regv = &Trampoline<&Domain::mr_regv>::call<fid>,
    .regattr = &Trampoline<&Domain::mr_regattr>::call<fid>,
};

}  // namespace

Domain::Domain(Fabric *fabric, const fi_info *info, void *context)
    : fabric_(fabric),
      info_(fi_dupinfo(info)),
      mutex_(!info || !info->domain_attr || info->domain_attr->threading != FI_THREAD_DOMAIN) {
    if (!info_) fail(FI_ENOMEM, "fi_dupinfo");
    mr_mode_ = info_->domain_attr->mr_mode;
    std::string why;
    link_ = open_link_domain(info_->domain_attr->name ? info_->domain_attr->name : "", &why);
    if (!link_) fail(FI_ENODEV, why.c_str());
    if (link_->caps().link_keys) {
        const bool nic_regions = (mr_mode_ & compat::kMrBasic) ||
                                 ((mr_mode_ & FI_MR_PROV_KEY) && (mr_mode_ & FI_MR_VIRT_ADDR));
        rma_served_ = (info_->caps & FI_RMA_EVENT) || !nic_regions;
        mr_table_.set_link(link_.get(), !rma_served_);
    }
    threading_ = info_->domain_attr->threading;
    init_fid(FI_CLASS_DOMAIN, context, &domain_fi_ops);
    fid()->ops = &domain_ops;
    fid()->mr = &domain_mr_ops;
    fabric_->hold();
    if (info_->domain_attr->control_progress == FI_PROGRESS_AUTO ||
        info_->domain_attr->data_progress == FI_PROGRESS_AUTO)
        start_progress_thread();
}

// FI_PROGRESS_AUTO: the thread shares the lock with the application's calls, so the lock is
// taken under every threading model (FI_THREAD_DOMAIN serialises the application's calls, not
// them with the thread).
void Domain::start_progress_thread() {
    mutex_.require();
    progress_thread_ = std::make_unique<ProgressThread>(*this);
    mutex_.watch_releases(progress_thread_.get());
    if (int ret = progress_thread_->start()) {
        mutex_.watch_releases(nullptr);
        progress_thread_.reset();
        fi_freeinfo(info_);
        fabric_->release();
        fail(-ret, "automatic progress thread");
    }
    TANDEM_INFO(FI_LOG_DOMAIN, "domain %s: automatic progress (thread tandem-progress)\n",
                info_->domain_attr->name ? info_->domain_attr->name : "");
}

Domain::~Domain() {
    if (progress_thread_) {
        progress_thread_->stop();
        mutex_.watch_releases(nullptr);
        progress_thread_.reset();
    }
    offload_.reset();
    fi_freeinfo(info_);
    fabric_->release();
}

OffloadDomain *Domain::offload() {
    if (!offload_tried_) {
        offload_tried_ = true;
        // Opened even with the local path off: the twin has work besides it.
        offload_ = OffloadDomain::open(*this);
    }
    return offload_.get();
}

int Domain::close() {
    if (refs_.load()) return -FI_EBUSY;
    delete this;
    return 0;
}

int Domain::bind(struct fid *, uint64_t) {
    return -FI_ENOSYS;
}
int Domain::control(int command, void *arg) {
    switch (command) {
        case FI_QUEUE_WORK:
            return queue_work(static_cast<const fi_deferred_work *>(arg));
        case FI_CANCEL_WORK:
            return cancel_work(static_cast<const fi_deferred_work *>(arg));
        case FI_FLUSH_WORK:
            return flush_work(static_cast<const fi_deferred_work *>(arg));
        default:
            return -FI_ENOSYS;
    }
}
int Domain::ops_open(const char *, uint64_t, void **, void *) {
    return -FI_ENOSYS;
}

int Domain::av_open(fi_av_attr *attr, fid_av **av, void *context) {
    if (!attr || !av) return -FI_EINVAL;
    auto *a = new Av(this, *attr, context);
    // fi_av(3): a named AV opened with map_addr 0 returns the one it uses.
    if (attr->name && !attr->map_addr) attr->map_addr = a->map_addr();
    *av = a->fid();
    return 0;
}

int Domain::cq_open(fi_cq_attr *attr, fid_cq **cq, void *context) {
    if (!attr || !cq) return -FI_EINVAL;
    auto *c = new Cq(this, *attr, context);
    *cq = c->fid();
    return 0;
}

int Domain::endpoint(fi_info *info, fid_ep **ep, void *context) {
    if (!info || !ep) return -FI_EINVAL;
    auto *e = new Endpoint(this, info, context);
    *ep = e->fid();
    return 0;
}

int Domain::scalable_ep(fi_info *, fid_ep **, void *) {
    return -FI_ENOSYS;
}

int Domain::cntr_open(fi_cntr_attr *attr, fid_cntr **cntr, void *context) {
    if (!attr || !cntr) return -FI_EINVAL;
    auto *c = new Cntr(this, *attr, context);
    *cntr = c->fid();
    return 0;
}

int Domain::poll_open(fi_poll_attr *attr, fid_poll **pollset) {
    if (!attr || !pollset) return -FI_EINVAL;
    auto *p = new PollObject(this, *attr);
    *pollset = p->fid();
    return 0;
}

int Domain::stx_ctx(fi_tx_attr *attr, fid_stx **stx, void *context) {
    if (!attr || !stx) return -FI_EINVAL;
    auto *s = new SharedTxContext(this, *attr, context);
    *stx = s->fid();
    return 0;
}

int Domain::srx_ctx(fi_rx_attr *attr, fid_ep **rx_ep, void *context) {
    if (!attr || !rx_ep) return -FI_EINVAL;
    auto *s = new SharedRxContext(this, *attr, context);
    *rx_ep = s->fid();
    return 0;
}

// What the endpoints' *valid calls answer (atomic::query), per kind of call.
int Domain::query_atomic(enum fi_datatype datatype, enum fi_op op, fi_atomic_attr *attr,
                         uint64_t flags) {
    if (!attr) return -FI_EINVAL;
    if ((flags & FI_FETCH_ATOMIC) && (flags & FI_COMPARE_ATOMIC)) return -FI_EINVAL;
    // Reductions of collectives (FI_COLLECTIVE) are for the collective engine; atomics whose
    // target is a tagged receive buffer (FI_TAGGED) are not offered.
    if (flags & FI_TAGGED) return -FI_EOPNOTSUPP;
    if (flags & FI_COLLECTIVE) {  // the reductions collectives accept
        if (int ret = coll_supported(FI_ALLREDUCE, raw_enum(datatype), raw_enum(op))) return ret;
        attr->count = peer::kCollMaxBytes / atomic::datatype_size(datatype);
        attr->size = atomic::datatype_size(datatype);
        return 0;
    }
    atomic::Kind kind = (flags & FI_FETCH_ATOMIC)     ? atomic::Kind::Fetch
                        : (flags & FI_COMPARE_ATOMIC) ? atomic::Kind::Compare
                                                      : atomic::Kind::Base;
    size_t count = 0;
    if (int ret = atomic::query(kind, datatype, op, &count)) return ret;
    attr->count = count;
    attr->size = atomic::datatype_size(datatype);
    return 0;
}

// fi_query_collective: exactly what post_collective accepts (coll_supported), with the limits
// of one call. FI_SCATTER in flags asks about reduce-scatter (fi_collective(3)).
int Domain::query_collective(enum fi_collective_op coll, fi_collective_attr *attr, uint64_t flags) {
    if (!attr) return -FI_EINVAL;
    int c = raw_enum(coll);
    if (flags & FI_SCATTER) c = FI_REDUCE_SCATTER;
    const int datatype = raw_enum(attr->datatype);
    if (int ret = coll_supported(c, datatype, raw_enum(attr->op))) return ret;
    const size_t elem = c == FI_BARRIER ? 0 : atomic::datatype_size(datatype);
    attr->datatype_attr.size = elem;
    attr->datatype_attr.count = elem ? peer::kCollMaxBytes / elem : 0;
    attr->max_members = peer::kCollMaxMembers;
    return 0;
}

int Domain::mr_reg(const void *buf, size_t len, uint64_t access, uint64_t offset,
                   uint64_t requested_key, uint64_t flags, fid_mr **mr, void *context) {
    iovec iov{const_cast<void *>(buf), len};
    return mr_regv(&iov, 1, access, offset, requested_key, flags, mr, context);
}

int Domain::mr_regv(const iovec *iov, size_t count, uint64_t access, uint64_t offset,
                    uint64_t requested_key, uint64_t flags, fid_mr **mr, void *context) {
    if (flags & compat::kMrDmabuf) return -FI_EINVAL;  // (a DMA-buf comes through fi_mr_regattr)
    fi_mr_attr attr{};
    attr.mr_iov = iov;
    attr.iov_count = count;
    attr.access = access;
    attr.offset = offset;
    attr.requested_key = requested_key;
    attr.context = context;
    attr.iface = FI_HMEM_SYSTEM;
    return mr_regattr(&attr, flags, mr);
}

int Domain::mr_regattr(const fi_mr_attr *attr, uint64_t flags, fid_mr **mr) {
    if (!attr || !mr) return -FI_EINVAL;
    if (attr->iov_count > info_->domain_attr->mr_iov_limit) return -FI_EINVAL;
    std::lock_guard guard(mutex_);
    auto *m = new MemoryRegion(this, *attr, flags);
    *mr = m->fid();
    return 0;
}

void Domain::progress() {
    TANDEM_LOCK_ASSERT(mutex_.held(), "Domain::progress without the domain lock");
    // Index loop: progress never opens or closes endpoints.
    for (size_t i = 0; i < endpoints_.size(); ++i) endpoints_[i]->progress();
    // Completions of this pass may have brought counters to their thresholds.
    if (triggers_waiting()) start_triggers();
}

bool Domain::work_pending() const {
    TANDEM_LOCK_ASSERT(mutex_.held(), "Domain::work_pending without the domain lock");
    for (auto *ep : endpoints_)
        if (ep->work_pending()) return true;
    return false;
}

int Domain::sleep_limit_ms() const {
    if (work_pending()) return 1;
    int limit = device_triggers_waiting_
                    ? std::max(1, static_cast<int>(Config::get().progress_poll_us / 1000))
                    : -1;
    for (auto *ep : endpoints_) limit = Deadline::shorter(limit, ms_until(ep->next_timer_ms()));
    return limit;
}

bool Domain::worth_a_look() const {
    for (auto *ep : endpoints_)
        if (ep->work_pending() || ep->twin_busy()) return true;
    return device_triggers_waiting_;  // (a subset of triggers_waiting)
}

void Domain::add_endpoint(Engine *ep) {
    endpoints_.push_back(ep);
}

void Domain::remove_endpoint(Engine *ep) {
    std::erase(endpoints_, ep);
}

void Domain::av_learnt_sources(const Av *av) {
    for (auto *ep : endpoints_) ep->tell_owner_new_sources(av);
}

void Domain::watch_fds(WaitSet &set) {
    std::vector<WaitFd> fds;
    for (auto *ep : endpoints_) ep->wait_fds(fds);
    for (WaitFd fd : fds) set.add(fd);
}

}  // namespace tandem
