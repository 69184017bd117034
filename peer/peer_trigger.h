// The work of triggered operations and deferred work (fi_trigger(3)), which libfabric 1.17's
// peer API has no object for: what tandem hands off_tandem's trigger queue (the trigger_*
// entries of peer::OffloadOps, peer/offload_ops.h), and how it starts.
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
// Every trigger_* call is made with tandem's domain lock held (or under FI_THREAD_DOMAIN
// by the application's serialisation), and the queue calls start / discard under it too.
#pragma once

#include <rdma/fi_domain.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tandem::peer {

// One unit of work for the queue. Its condition is one of:
//  - a threshold: the counter's success count (plus its error count for deferred work, as
//    fi_trigger(3) says) has reached `threshold`;
//  - an XPU trigger: the device has written `xpu_value` (or more) into the endpoint's trigger
//    variable `xpu_var`, a value handed out by OffloadOps::trigger_xpu_variable.
// Work on one counter starts in threshold order, equal thresholds in the order queued; XPU
// work on one variable in the order of its values.
struct TriggerWork {
    enum class Kind : uint32_t { Threshold, Xpu } kind = Kind::Threshold;
    fid_cntr *cntr = nullptr;
    // Threshold work: the words holding cntr's success and error counts, valid as long as the
    // counter (its work is flushed before it closes, trigger_flush_counter). The owner holds the
    // counter and hands them with the work: the queue has nothing to ask it back.
    const std::atomic<uint64_t> *successes = nullptr;
    const std::atomic<uint64_t> *errors = nullptr;
    uint64_t threshold = 0;
    bool with_errors = false;
    uint64_t xpu_var = 0;  // handle from trigger_xpu_variable
    uint64_t xpu_value = 0;
    // Every counter the work names (its trigger, its completion counter, the target of a
    // counter operation): closing one of them discards the work (trigger_flush_counter).
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

}  // namespace tandem::peer
