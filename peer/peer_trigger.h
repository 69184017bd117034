// The peer objects of triggered operations and deferred work (fi_trigger(3)), which
// libfabric 1.17's peer API does not have: tandem's counters as off_tandem sees them, and
// off_tandem's trigger queue as tandem hands work to it.
//
// tandem captures a triggered operation (or a deferred work request) and hands it to the
// trigger queue of its off_tandem peer domain, which holds it and starts it when its
// condition is met, by calling tandem back: tandem issues the operation on its endpoint as if
// it had just been posted, so node-local peers and link peers are served alike. Counters stay
// tandem's; the queue reads their values through the words tandem hands with each work (one
// load each per pass, and no call back into tandem from inside its own progress), and is
// driven by tandem's progress (every pass that can have moved a counter: completions,
// fi_cntr_add/set).
//
// Every call of TriggerOps is made with tandem's domain lock held (or under FI_THREAD_DOMAIN
// by the application's serialisation), and the queue calls start / discard under it too.
#pragma once

#include <rdma/fi_domain.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tandem::peer {

// fi_open_ops name, on off_tandem's domain, of its trigger queue.
inline constexpr const char *kTriggerOpsName = "off_tandem_trigger_v3";

// One unit of work for the queue. Its condition is one of:
//  - a threshold: the counter's success count (plus its error count for deferred work, as
//    fi_trigger(3) says) has reached `threshold`;
//  - an XPU trigger: the device has written `xpu_value` (or more) into the endpoint's trigger
//    variable `xpu_var`, a value handed out by TriggerOps::xpu_variable.
// Work on one counter starts in threshold order, equal thresholds in the order queued; XPU
// work on one variable in the order of its values.
struct TriggerWork {
    enum class Kind : uint32_t { Threshold, Xpu } kind = Kind::Threshold;
    fid_cntr *cntr = nullptr;
    // Threshold work: the words holding cntr's success and error counts, valid as long as the
    // counter (its work is flushed before it closes, flush_counter). The owner holds the
    // counter and hands them with the work: the queue has nothing to ask it back.
    const std::atomic<uint64_t> *successes = nullptr;
    const std::atomic<uint64_t> *errors = nullptr;
    uint64_t threshold = 0;
    bool with_errors = false;
    uint64_t xpu_var = 0;  // handle from xpu_variable
    uint64_t xpu_value = 0;
    // Every counter the work names (its trigger, its completion counter, the target of a
    // counter operation): closing one of them discards the work (flush_counter).
    fid_cntr *names[3] = {};
    // The owner's operation, the key fi_cancel / FI_CANCEL_WORK finds it by, and the group
    // (the owner's endpoint, or its domain for counter operations) discarded together.
    void *arg = nullptr;
    const void *match = nullptr;
    const void *group = nullptr;
    // The condition is met: issue it. 0 (the work is done with), or -FI_EAGAIN: no room
    // now, the queue keeps it first in line and calls again on a later pass.
    int (*start)(void *arg) = nullptr;
    // It will never start: cancelled, flushed, or its group or a counter it names closed
    // (err: FI_ECANCELED). The owner reports it as it sees fit and frees it.
    void (*discard)(void *arg, int err, bool report) = nullptr;
};

struct TriggerOps {
    size_t size;
    // 0, or -FI_EINVAL (no condition, unknown variable), -FI_ENOMEM.
    int (*queue)(fid_domain *domain, const TriggerWork *work);
    // Starts what is due; the number started. Cheap when nothing waits (pending == 0).
    size_t (*progress)(fid_domain *domain);
    // The work waiting; *device (may be null) gets how much of it waits for a value a device
    // writes (XPU triggers), which only polling notices (the owner's automatic progress then
    // wakes on a timer).
    size_t (*pending)(fid_domain *domain, size_t *device);
    // The work of group queued with this match key: discarded (reported), 0; -FI_ENOENT when
    // none waits (never queued, or already started).
    int (*cancel)(fid_domain *domain, const void *group, const void *match);
    // Discards (reported) every work of group triggered by cntr (every work of group when
    // cntr is null); the number discarded.
    size_t (*flush)(fid_domain *domain, const void *group, fid_cntr *cntr);
    // Discards every work that names cntr in any role (before the counter closes; reported).
    size_t (*flush_counter)(fid_domain *domain, fid_cntr *cntr);
    // Discards every work of group without reports (its endpoint closes).
    size_t (*discard_group)(fid_domain *domain, const void *group);
    // XPU triggers: the trigger variable of group on the device (iface, device), created on
    // first use in that device's memory, and the value the device writes to start the next
    // work queued on it. 0, or -FI_EOPNOTSUPP (no such device, or it cannot host one).
    int (*xpu_variable)(fid_domain *domain, const void *group, int iface, int device, uint64_t *var,
                        void **addr, uint64_t *value);
};

}  // namespace tandem::peer
