// Triggered operations and deferred work, tandem's half (trigger.h): preparing the work,
// handing it to off_tandem's queue, and issuing or discarding it when the queue says so.
#include "main_prov/trigger.h"

#include "common/iov.h"
#include "common/log.h"
#include "main_prov/cntr.h"
#include "main_prov/domain.h"
#include "main_prov/endpoint.h"
#include "main_prov/local_path.h"
#include "peer/offload_ops.h"

#include <rdma/fi_trigger.h>

#include <optional>

namespace tandem {

namespace {

template <class... F>
struct Overload : F... {
    using F::operator()...;
};
// Spelled out for compilers without C++20's deduction for aggregates (clang before 17).
template <class... F>
Overload(F...) -> Overload<F...>;

// The completion flags of an operation that never started (its error completion).
uint64_t cq_flags_of(const TriggeredRequest &r) {
    return std::visit(
        Overload{
            [](const SendRequest &s) -> uint64_t {
                return FI_SEND | (s.tagged ? FI_TAGGED : FI_MSG);
            },
            [](const RecvRequest &s) -> uint64_t {
                return FI_RECV | (s.tagged ? FI_TAGGED : FI_MSG);
            },
            [](const RmaRequest &s) -> uint64_t { return FI_RMA | (s.write ? FI_WRITE : FI_READ); },
            [](const AtomicRequest &s) -> uint64_t {
                return FI_ATOMIC | (s.kind == atomic::Kind::Base ? FI_WRITE : FI_READ);
            },
            [](const CounterOpRequest &) -> uint64_t { return 0; },
            [](const CollRequest &) -> uint64_t { return FI_COLLECTIVE; },
        },
        r);
}

// A threshold condition on trigger (with the words the queue reads): its successes at the
// threshold for FI_TRIGGER, its successes plus errors for deferred work (fi_trigger(3)).
peer::TriggerWork threshold_condition(Cntr *trigger, uint64_t threshold, bool with_errors) {
    peer::TriggerWork work;
    work.kind = peer::TriggerWork::Kind::Threshold;
    work.cntr = trigger->fid();
    work.successes = &trigger->success_word();
    work.errors = &trigger->error_word();
    work.threshold = threshold;
    work.with_errors = with_errors;
    work.names[0] = trigger->fid();
    return work;
}

peer::TriggerWork deferred_condition(Cntr *trigger, uint64_t threshold) {
    return threshold_condition(trigger, threshold, true);
}

}  // namespace

void *context_of(const TriggeredRequest &r) {
    return std::visit(Overload{
                          [](const AtomicRequest &s) { return s.msg.context; },
                          [](const CounterOpRequest &) { return static_cast<void *>(nullptr); },
                          [](const auto &s) { return s.context; },
                      },
                      r);
}

uint64_t flags_of(const TriggeredRequest &r) {
    return std::visit(Overload{
                          [](const CounterOpRequest &) -> uint64_t { return 0; },
                          [](const auto &s) -> uint64_t { return s.flags; },
                      },
                      r);
}

const DeferredDone &done_of(const TriggeredRequest &r) {
    static const DeferredDone none{};
    return std::visit(Overload{
                          [](const CounterOpRequest &) -> const DeferredDone & { return none; },
                          [](const auto &s) -> const DeferredDone & { return s.done; },
                      },
                      r);
}

// ------------------------------------------------------------------------------------------
// The queue's callbacks

int TriggeredOp::start(void *arg) {
    auto *op = static_cast<TriggeredOp *>(arg);
    if (auto *c = std::get_if<CounterOpRequest>(&op->request)) {
        c->add ? c->cntr->add_by_work(c->value) : c->cntr->set_by_work(c->value);
        delete op;
        return 0;
    }
    if (op->ep->start_triggered(*op) == -FI_EAGAIN) return -FI_EAGAIN;
    delete op;
    return 0;
}

void TriggeredOp::discard(void *arg, int err, bool report) {
    auto *op = static_cast<TriggeredOp *>(arg);
    if (op->ep) op->ep->discard_triggered(*op, err, report);
    delete op;
}

// ------------------------------------------------------------------------------------------
// Engine: FI_TRIGGER operations and deferred work

ssize_t Engine::queue_triggered(TriggeredRequest &&r) {
    if (!(caps_ & FI_TRIGGER)) return -FI_EOPNOTSUPP;
    void *context = context_of(r);
    if (!context) return -FI_EINVAL;  // the fi_triggered_context is the operation's context
    const auto *ctx = static_cast<const fi_triggered_context *>(context);
    peer::TriggerWork work;
    const int event = raw_enum(ctx->event_type);
    if (event != FI_TRIGGER_THRESHOLD && event != FI_TRIGGER_XPU) return -FI_EINVAL;
    switch (ctx->event_type) {
        case FI_TRIGGER_THRESHOLD: {
            fid_cntr *cntr = ctx->trigger.threshold.cntr;
            Cntr *counter = domain_->counter_of(cntr);
            if (!counter) {
                TANDEM_WARN(FI_LOG_EP_DATA,
                            "FI_TRIGGER: the threshold counter is not an open counter of this "
                            "endpoint's domain\n");
                return -FI_EINVAL;
            }
            work = threshold_condition(counter, ctx->trigger.threshold.threshold, false);
            break;
        }
        case FI_TRIGGER_XPU:
            return queue_xpu(std::move(r), const_cast<fi_triggered_context *>(ctx), work);
        default:
            return -FI_EINVAL;
    }
    return hand_over(std::move(r), work, context);
}

int Engine::queue_deferred(TriggeredRequest &&r, Cntr *trigger, uint64_t threshold,
                           const void *match) {
    peer::TriggerWork work = deferred_condition(trigger, threshold);
    work.group = work_group();
    if (Cntr *done = done_of(r).cntr) work.names[1] = done->fid();
    return hand_over(std::move(r), work, match);
}

// The request joins the queue, counted against the endpoint's queue depth; the condition may
// hold already, in which case it starts before this returns.
int Engine::hand_over(TriggeredRequest &&r, peer::TriggerWork &work, const void *match) {
    const bool rx = is_receive(r);
    if (rx ? rx_->outstanding + rx_triggered_ >= info_->rx_attr->size
           : tx_outstanding_ + tx_triggered_ >= info_->tx_attr->size)
        return -FI_EAGAIN;
    auto op = std::make_unique<TriggeredOp>();
    op->domain = domain_;
    op->ep = this;
    op->request = std::move(r);
    op->match = match;
    if (int ret = own_inject_payload(*op)) return ret;
    if (!work.group) work.group = this;
    // Counted before it is queued: it may start (and be uncounted) inside queue_trigger.
    size_t &pending = rx ? rx_triggered_ : tx_triggered_;
    ++pending;
    if (int ret = domain_->queue_trigger(std::move(op), work)) {
        --pending;
        return ret;
    }
    used_triggers_ = true;
    return 0;
}

// FI_INJECT: the buffer is the application's again when the call returns, so a deferred
// inject keeps a copy of its payload (read now, with the device's copy for device memory).
int Engine::own_inject_payload(TriggeredOp &op) {
    auto own = [&](IovList &list) -> int {
        hmem::MemRef mem[kMaxIov];
        bool device = memory_of(list.iov, list.descs(), list.count, FI_INJECT, mem);
        op.owned.bytes.resize(list.len);
        ssize_t got = hmem::gather(op.owned.bytes.data(), list.iov, device ? mem : nullptr,
                                   list.count, 0, list.len);
        if (got < 0) return static_cast<int>(got);
        op.owned.device = device;
        iovec whole{op.owned.bytes.data(), list.len};
        return list.capture(&whole, nullptr, list.len ? 1 : 0);
    };
    return std::visit(
        Overload{
            [&](SendRequest &s) { return (s.flags & FI_INJECT) ? own(s.payload) : 0; },
            [&](RmaRequest &s) { return (s.write && (s.flags & FI_INJECT)) ? own(s.local) : 0; },
            [&](AtomicRequest &s) -> int {
                if (!(s.flags & FI_INJECT)) return 0;
                // The operands, one list of bytes the request then names.
                IovList list;
                const size_t elem = atomic::datatype_size(s.msg.datatype);
                iovec bytes[kMaxIov];
                for (size_t i = 0; i < s.msg.iov_count; ++i)
                    bytes[i] = {s.operand[i].addr, s.operand[i].count * elem};
                if (int ret = list.capture(bytes, s.has_desc ? s.desc : nullptr, s.msg.iov_count))
                    return ret;
                if (int ret = own(list)) return ret;
                s.msg.iov_count = 1;
                s.operand[0] = {list.iov[0].iov_base, list.len / elem};
                s.has_desc = false;
                return 0;
            },
            [](auto &) { return 0; },
        },
        op.request);
}

int Engine::start_triggered(TriggeredOp &op) {
    const bool rx = is_receive(op.request);
    --(rx ? rx_triggered_ : tx_triggered_);
    ssize_t ret;
    if (!rx && tx_outstanding_ + tx_triggered_ >= info_->tx_attr->size) {
        ret = -FI_EAGAIN;
    } else {
        try {
            ret = std::visit(Overload{
                                 [&](SendRequest &s) {
                                     s.flags &= ~FI_TRIGGER;
                                     return issue_send(s);
                                 },
                                 [&](RecvRequest &s) {
                                     s.flags &= ~FI_TRIGGER;
                                     return issue_recv(s);
                                 },
                                 [&](RmaRequest &s) {
                                     s.flags &= ~FI_TRIGGER;
                                     return issue_rma(s);
                                 },
                                 [&](AtomicRequest &s) {
                                     s.flags &= ~FI_TRIGGER;
                                     return issue_atomic(s);
                                 },
                                 [&](CollRequest &s) {
                                     s.flags &= ~FI_TRIGGER;
                                     return issue_collective(s);
                                 },
                                 [](CounterOpRequest &) { return ssize_t(-FI_EINVAL); },
                             },
                             op.request);
        } catch (...) {
            ret = current_exception_errno();
        }
    }
    if (ret == -FI_EAGAIN) {
        ++(rx ? rx_triggered_ : tx_triggered_);
        return -FI_EAGAIN;
    }
    if (ret) {
        TANDEM_INFO(FI_LOG_EP_DATA, "a triggered operation failed to start: %s\n",
                    fi_strerror(static_cast<int>(-ret)));
        report_unstarted(op, static_cast<int>(-ret));
    }
    return 0;
}

void Engine::discard_triggered(TriggeredOp &op, int err, bool report) {
    --(is_receive(op.request) ? rx_triggered_ : tx_triggered_);
    if (report) report_unstarted(op, err);
}

// What fi_cancel reports for an operation that never started: an error completion with its
// context (deferred work only when it asked for FI_COMPLETION), and an error count on the
// counter it would have counted on.
void Engine::report_unstarted(const TriggeredOp &op, int err) {
    const TriggeredRequest &r = op.request;
    const DeferredDone &done = done_of(r);
    const uint64_t flags = cq_flags_of(r);
    const bool rx = is_receive(r);
    Cntr *cntr = done.deferred ? done.cntr : rx ? recv_cntr_ : tx_counter(flags);
    if (cntr) cntr->inc_err();
    if (done.deferred && !(flags_of(r) & FI_COMPLETION)) return;
    if (rx)
        write_rx_error_entry(context_of(r), nullptr, flags, err, 0, 0, 0, 0);
    else
        write_tx_err(context_of(r), flags, err, 0);
}

// XPU triggers: one 64-bit variable in the named device's memory per endpoint and device
// (off_tandem's), which the device writes with a count; the operation is the count-th queued
// on it. The variable and value go back through the context's fi_trigger_var.
ssize_t Engine::queue_xpu(TriggeredRequest &&r, fi_triggered_context *ctx,
                          peer::TriggerWork &work) {
    if (!xpu_trigger_) {
        TANDEM_WARN(FI_LOG_EP_DATA,
                    "FI_TRIGGER_XPU on an endpoint without XPU triggers "
                    "(FI_XPU_TRIGGER, or from API 1.21 FI_TRIGGER and FI_HMEM)\n");
        return -FI_EINVAL;
    }
    fi_trigger_xpu &xpu = ctx->trigger.xpu;
    if (xpu.count < 1 || !xpu.var) return -FI_EINVAL;
    OffloadDomain *off = domain_->offload();
    if (!off || !off->ops()) return -FI_EOPNOTSUPP;
    uint64_t var = 0, value = 0;
    void *addr = nullptr;
    if (int ret = off->ops()->trigger_xpu_variable(off->domain(), this, xpu.iface, xpu.device.cuda,
                                                   &var, &addr, &value))
        return ret;
    used_triggers_ = true;  // its variable goes at close
    work.kind = peer::TriggerWork::Kind::Xpu;
    work.xpu_var = var;
    work.xpu_value = value;
    int ret = hand_over(std::move(r), work, ctx);
    if (ret) return ret;
    // (The operation may have started already: the device may have written the value.)
    xpu.count = 1;
    xpu.var[0].datatype = FI_UINT64;
    xpu.var[0].count = 1;
    xpu.var[0].addr = addr;
    xpu.var[0].value.val64 = value;
    return 0;
}

int Engine::xpu_trigger_shape(fi_trigger_xpu *xpu, size_t *optlen) {
    if (*optlen < sizeof *xpu) return -FI_ETOOSMALL;
    if (!xpu_trigger_ || xpu->iface != FI_HMEM_CUDA || xpu->device.cuda < 0 ||
        xpu->device.cuda >= hmem::Registry::instance().device_count(FI_HMEM_CUDA))
        return -FI_EOPNOTSUPP;
    if (xpu->count > 0) {
        if (!xpu->var) return -FI_EINVAL;
        xpu->var[0].datatype = FI_UINT64;
        xpu->var[0].count = 1;
    }
    xpu->count = 1;
    *optlen = sizeof *xpu;
    return 0;
}

// ------------------------------------------------------------------------------------------
// Domain: the queue's driver, and deferred work (FI_QUEUE_WORK and friends)

void Domain::add_counter(Cntr *cntr) {
    counters_.insert(cntr->fid());
}

void Domain::remove_counter(Cntr *cntr) {
    counters_.erase(cntr->fid());
    if (offload_ && offload_->ops() && triggers_waiting()) {
        size_t n = offload_->ops()->trigger_flush_counter(offload_->domain(), cntr->fid());
        if (n)
            TANDEM_WARN(FI_LOG_DOMAIN,
                        "counter closed with %zu triggered operations or work requests naming "
                        "it: discarded (FI_ECANCELED)\n",
                        n);
        note_triggers();
    }
}

Cntr *Domain::counter_of(fid_cntr *cntr) const {
    return cntr && counters_.count(cntr) ? Cntr::of(cntr) : nullptr;
}

void Domain::note_triggers() {
    size_t device = 0;
    bool waiting = offload_ && offload_->ops() &&
                   offload_->ops()->trigger_pending(offload_->domain(), &device) > 0;
    triggers_waiting_.store(waiting, std::memory_order_relaxed);
    device_triggers_waiting_ = device > 0;
}

void Domain::start_triggers() {
    if (!offload_ || !offload_->ops()) return;
    offload_->ops()->trigger_progress(offload_->domain());
    note_triggers();
}

// Hands a prepared operation to off_tandem's queue (work says when it starts, and its group);
// the condition may hold already, in which case it starts before this returns.
int Domain::queue_trigger(std::unique_ptr<TriggeredOp> op, peer::TriggerWork &work) {
    OffloadDomain *off = offload();
    if (!off || !off->ops()) {
        TANDEM_WARN(FI_LOG_DOMAIN, "triggered operations need %s, which is not available\n",
                    peer::kOffloadProvName);
        return -FI_EOPNOTSUPP;
    }
    work.arg = op.get();
    work.match = op->match;
    work.start = &TriggeredOp::start;
    work.discard = &TriggeredOp::discard;
    if (int ret = off->ops()->trigger_queue(off->domain(), &work)) return ret;
    op.release();  // the queue's now
    note_triggers();
    start_triggers();
    return 0;
}

namespace {

// The endpoint of a deferred work request's operation (an alias names its endpoint), when it
// is one of this domain's.
Engine *work_endpoint(Domain &domain, fid_ep *ep) {
    Engine *e = engine_of(ep);
    return e && e->domain() == &domain ? e : nullptr;
}

}  // namespace

int Domain::queue_work(const fi_deferred_work *work) {
    if (!work) return -FI_EINVAL;
    std::lock_guard guard(lock());
    Cntr *trigger = counter_of(work->triggering_cntr);
    if (!trigger) return -FI_EINVAL;
    DeferredDone done{true, nullptr};
    if (work->completion_cntr && !(done.cntr = counter_of(work->completion_cntr)))
        return -FI_EINVAL;
    // (Read as a number first: a value no fi_op_type names is the caller's, and no enum's.)
    const int op_type = raw_enum(work->op_type);
    if (op_type < FI_OP_RECV || op_type > FI_OP_CNTR_ADD)
        return -FI_ENOSYS;  // fi_trigger(3): an operation the provider does not support
    PreparedWork prepared;
    int ret;
    switch (work->op_type) {
        case FI_OP_CNTR_SET:
        case FI_OP_CNTR_ADD:
            return queue_counter_work(*work, trigger);
        case FI_OP_RECV:
        case FI_OP_SEND:
        case FI_OP_TRECV:
        case FI_OP_TSEND:
            ret = prepare_message_work(*work, prepared);
            break;
        case FI_OP_READ:
        case FI_OP_WRITE:
            ret = prepare_rma_work(*work, prepared);
            break;
        case FI_OP_ATOMIC:
        case FI_OP_FETCH_ATOMIC:
        case FI_OP_COMPARE_ATOMIC:
            ret = prepare_atomic_work(*work, prepared);
            break;
        default:
            return -FI_ENOSYS;  // fi_trigger(3): an operation the provider does not support
    }
    if (ret) return ret;
    std::visit(Overload{
                   [](CounterOpRequest &) {},
                   [&](auto &s) { s.done = done; },
               },
               prepared.request);
    return prepared.ep->queue_deferred(std::move(prepared.request), trigger, work->threshold, work);
}

// FI_OP_CNTR_SET / FI_OP_CNTR_ADD: no endpoint, the queue moves the counter itself.
int Domain::queue_counter_work(const fi_deferred_work &work, Cntr *trigger) {
    // fi_trigger(3): the completion counter must be NULL for counter operations.
    if (!work.op.cntr || work.completion_cntr) return -FI_EINVAL;
    Cntr *target = counter_of(work.op.cntr->cntr);
    if (!target) return -FI_EINVAL;
    auto op = std::make_unique<TriggeredOp>();
    op->domain = this;
    op->request = CounterOpRequest{target, work.op.cntr->value, work.op_type == FI_OP_CNTR_ADD};
    op->match = &work;
    peer::TriggerWork w = deferred_condition(trigger, work.threshold);
    w.names[1] = target->fid();
    w.group = this;
    return queue_trigger(std::move(op), w);
}

// FI_OP_SEND / RECV / TSEND / TRECV: one form for both, an fi_msg being an fi_msg_tagged
// without tag.
int Domain::prepare_message_work(const fi_deferred_work &work, PreparedWork &out) {
    const bool tagged = work.op_type == FI_OP_TRECV || work.op_type == FI_OP_TSEND;
    const bool send = work.op_type == FI_OP_SEND || work.op_type == FI_OP_TSEND;
    fi_msg_tagged m{};
    uint64_t flags = 0;
    fid_ep *fep = nullptr;
    if (tagged && work.op.tagged) {
        m = work.op.tagged->msg;
        flags = work.op.tagged->flags;
        fep = work.op.tagged->ep;
    } else if (!tagged && work.op.msg) {
        const fi_msg &u = work.op.msg->msg;
        m = {u.msg_iov, u.desc, u.iov_count, u.addr, 0, 0, u.context, u.data};
        flags = work.op.msg->flags;
        fep = work.op.msg->ep;
    }
    if (!(out.ep = work_endpoint(*this, fep))) return -FI_EINVAL;
    if (send) {
        SendRequest s;
        if (int ret = out.ep->prepare_send(
                {m.msg_iov, m.desc, m.iov_count, m.addr, m.context, flags, m.tag, m.data, tagged},
                s))
            return ret;
        out.request = std::move(s);
        return 0;
    }
    RecvRequest s;
    if (int ret = s.buffers.capture(m.msg_iov, m.desc, m.iov_count)) return ret;
    s.src = m.addr;
    s.context = m.context;
    s.flags = flags;
    s.tag = m.tag;
    s.ignore = m.ignore;
    s.tagged = tagged;
    out.request = std::move(s);
    return 0;
}

// FI_OP_READ / FI_OP_WRITE: one remote region.
int Domain::prepare_rma_work(const fi_deferred_work &work, PreparedWork &out) {
    const fi_op_rma *m = work.op.rma;
    if (!m || !(out.ep = work_endpoint(*this, m->ep))) return -FI_EINVAL;
    if (m->msg.rma_iov_count != 1 || !m->msg.rma_iov) return -FI_EINVAL;
    RmaRequest s;
    if (int ret =
            out.ep->prepare_rma({m->msg.msg_iov, m->msg.desc, m->msg.iov_count, m->msg.addr,
                                 m->msg.rma_iov[0].addr, m->msg.rma_iov[0].key, m->msg.context,
                                 m->flags, m->msg.data, work.op_type == FI_OP_WRITE},
                                s))
        return ret;
    out.request = std::move(s);
    return 0;
}

// FI_OP_ATOMIC / FETCH_ATOMIC / COMPARE_ATOMIC.
int Domain::prepare_atomic_work(const fi_deferred_work &work, PreparedWork &out) {
    std::optional<AtomicCall> call;
    fid_ep *fep = nullptr;
    if (work.op_type == FI_OP_ATOMIC && work.op.atomic) {
        fep = work.op.atomic->ep;
        call.emplace(AtomicCall{work.op.atomic->msg, atomic::Kind::Base, work.op.atomic->flags});
    } else if (work.op_type == FI_OP_FETCH_ATOMIC && work.op.fetch_atomic) {
        const fi_op_fetch_atomic *m = work.op.fetch_atomic;
        fep = m->ep;
        call.emplace(AtomicCall{m->msg, atomic::Kind::Fetch, m->flags});
        call->with_result(m->fetch.msg_iov, m->fetch.desc, m->fetch.iov_count);
    } else if (work.op_type == FI_OP_COMPARE_ATOMIC && work.op.compare_atomic) {
        const fi_op_compare_atomic *m = work.op.compare_atomic;
        fep = m->ep;
        call.emplace(AtomicCall{m->msg, atomic::Kind::Compare, m->flags});
        call->with_result(m->fetch.msg_iov, m->fetch.desc, m->fetch.iov_count);
        call->with_compare(m->compare.msg_iov, m->compare.desc, m->compare.iov_count);
    }
    if (!call || !(out.ep = work_endpoint(*this, fep))) return -FI_EINVAL;
    AtomicRequest s;
    if (int ret = out.ep->prepare_atomic(*call, s)) return ret;
    out.request = std::move(s);
    return 0;
}

int Domain::cancel_work(const fi_deferred_work *work) {
    if (!work) return -FI_EINVAL;
    std::lock_guard guard(lock());
    if (!offload_ || !offload_->ops()) return -FI_ENOENT;
    // The group is the endpoint of the request's operation (or this domain for a counter
    // operation), which it may no longer name validly: try the domain's endpoints.
    const peer::OffloadOps *t = offload_->ops();
    int ret = t->trigger_cancel(offload_->domain(), this, work);
    for (size_t i = 0; ret == -FI_ENOENT && i < endpoints_.size(); ++i)
        ret = t->trigger_cancel(offload_->domain(), endpoints_[i]->work_group(), work);
    note_triggers();
    return ret;
}

int Domain::flush_work(const fi_deferred_work *work) {
    std::lock_guard guard(lock());
    if (!offload_ || !offload_->ops()) return 0;
    fid_cntr *cntr = work ? work->triggering_cntr : nullptr;
    const peer::OffloadOps *t = offload_->ops();
    t->trigger_flush(offload_->domain(), this, cntr);
    for (Engine *ep : endpoints_) t->trigger_flush(offload_->domain(), ep->work_group(), cntr);
    note_triggers();
    return 0;
}

}  // namespace tandem
