#include "offload_prov/trigger/trigger_queue.h"

#include <rdma/fi_errno.h>

namespace tandem::off {

TriggerQueue::~TriggerQueue() {
    discard_all();
}

size_t TriggerQueue::discard_all() {
    return discard_if([](const peer::TriggerWork &) { return true; }, false);
}

int TriggerQueue::queue(const peer::TriggerWork &work) {
    if (!work.start || !work.discard) return -FI_EINVAL;
    Lists *lists;
    uintptr_t id;
    uint64_t at;
    if (work.kind == peer::TriggerWork::Kind::Threshold) {
        if (!work.cntr || !work.successes || (work.with_errors && !work.errors)) return -FI_EINVAL;
        lists = &by_counter_;
        // Work counting errors too (deferred work) waits in a list of its own: it must not
        // queue behind work of the same counter that waits for successes alone.
        id = reinterpret_cast<uintptr_t>(work.cntr) | (work.with_errors ? 1 : 0);
        at = work.threshold;
    } else {
        if (!xpu_read_) return -FI_EINVAL;
        lists = &by_variable_;
        id = work.xpu_var;
        at = work.xpu_value;
    }
    (*lists)[id].emplace(Key{at, next_order_++}, work);
    ++pending_;
    return 0;
}

size_t TriggerQueue::progress() {
    if (running_) {
        again_ = true;  // a start moved a counter: the running pass looks again
        return 0;
    }
    if (!pending_) return 0;
    running_ = true;
    size_t started = 0;
    do {
        again_ = false;
        size_t n = start_due(by_counter_, false) + start_due(by_variable_, true);
        if (n) again_ = true;
        started += n;
    } while (again_ && pending_);
    running_ = false;
    return started;
}

// Starts the due heads of every list. A start calls the owner, which may queue, cancel or
// discard work: no iterator is held across one.
size_t TriggerQueue::start_due(Lists &lists, bool xpu) {
    if (lists.empty()) return 0;
    std::vector<uintptr_t> ids;
    ids.reserve(lists.size());
    for (auto &[id, w] : lists) ids.push_back(id);
    size_t started = 0;
    for (uintptr_t id : ids) {
        for (;;) {
            auto it = lists.find(id);
            if (it == lists.end()) break;
            if (it->second.empty()) {
                lists.erase(it);
                break;
            }
            auto head = it->second.begin();
            uint64_t value;
            if (xpu) {
                if (!xpu_read_(id, &value)) break;
            } else {
                const peer::TriggerWork &w = head->second;
                value = w.successes->load(std::memory_order_acquire);
                if (w.with_errors) value += w.errors->load(std::memory_order_acquire);
            }
            if (value < head->first.first) break;
            Key key = head->first;
            peer::TriggerWork work = head->second;
            it->second.erase(head);
            --pending_;
            if (work.start(work.arg) == -FI_EAGAIN) {
                // First in line again, in its place: the next pass retries it.
                lists[id].emplace(key, work);
                ++pending_;
                break;
            }
            ++started;
        }
    }
    return started;
}

template <class Pred>
size_t TriggerQueue::discard_if(Pred pred, bool report) {
    std::vector<peer::TriggerWork> gone;
    for (Lists *lists : {&by_counter_, &by_variable_}) {
        for (auto it = lists->begin(); it != lists->end();) {
            auto &work = it->second;
            for (auto w = work.begin(); w != work.end();) {
                if (pred(w->second)) {
                    gone.push_back(w->second);
                    w = work.erase(w);
                } else {
                    ++w;
                }
            }
            it = work.empty() ? lists->erase(it) : std::next(it);
        }
    }
    pending_ -= gone.size();
    for (const peer::TriggerWork &w : gone) w.discard(w.arg, FI_ECANCELED, report);
    return gone.size();
}

int TriggerQueue::cancel(const void *group, const void *match) {
    bool one = false;
    size_t n = discard_if(
        [&](const peer::TriggerWork &w) {
            if (one || w.group != group || w.match != match) return false;
            return one = true;
        },
        true);
    return n ? 0 : -FI_ENOENT;
}

size_t TriggerQueue::flush(const void *group, fid_cntr *cntr) {
    return discard_if(
        [&](const peer::TriggerWork &w) {
            return w.group == group &&
                   (!cntr || (w.kind == peer::TriggerWork::Kind::Threshold && w.cntr == cntr));
        },
        true);
}

size_t TriggerQueue::flush_counter(fid_cntr *cntr) {
    return discard_if(
        [&](const peer::TriggerWork &w) {
            for (fid_cntr *c : w.names)
                if (c == cntr) return true;
            return w.kind == peer::TriggerWork::Kind::Threshold && w.cntr == cntr;
        },
        true);
}

size_t TriggerQueue::discard_group(const void *group) {
    return discard_if([&](const peer::TriggerWork &w) { return w.group == group; }, false);
}

}  // namespace tandem::off
