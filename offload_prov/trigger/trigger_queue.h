// off_tandem's trigger queue: triggered operations and deferred work of one domain, held
// until their condition is met and then started by calling their owner back
// (peer/peer_trigger.h says what the owner hands over and when it is called).
//
// Work waits in one ordered list per counter (two: successes alone for FI_TRIGGER, successes
// and errors for deferred work), keyed by (threshold, order queued), so a pass
// looks at the head of each list only: one load of the counter's words per counter that has
// work waiting, whatever the number of operations. Work started by a pass can move counters
// (a counter operation, an operation that completes at once), so a pass runs until nothing
// more is due: chains of triggers fire in one progress call. A start that finds no room
// (-FI_EAGAIN) stops its counter's list there, in order, until the next pass.
#pragma once

#include "peer/peer_trigger.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tandem::off {

class TriggerQueue {
  public:
    // XPU trigger variables: the value the device has written so far (false: not known yet,
    // a read is under way), from whatever watches the variable.
    using XpuRead = std::function<bool(uint64_t var, uint64_t *value)>;

    explicit TriggerQueue(XpuRead xpu_read = {}) : xpu_read_(std::move(xpu_read)) {}
    ~TriggerQueue();
    TriggerQueue(const TriggerQueue &) = delete;
    TriggerQueue &operator=(const TriggerQueue &) = delete;

    int queue(const peer::TriggerWork &work);
    size_t progress();
    size_t pending() const { return pending_; }
    // Work waiting for an XPU trigger variable (noticed only by reading it).
    size_t device_pending() const {
        size_t n = 0;
        for (const auto &[var, w] : by_variable_) n += w.size();
        return n;
    }
    int cancel(const void *group, const void *match);
    size_t flush(const void *group, fid_cntr *cntr);
    size_t flush_counter(fid_cntr *cntr);
    size_t discard_group(const void *group);
    size_t discard_all();  // without reports

  private:
    using Key = std::pair<uint64_t, uint64_t>;  // (threshold or XPU value, order queued)
    // The work of one list, in start order; threshold work reads its counter's words off its
    // head (every work of a list names the same counter). Threshold work by counter, XPU work
    // by variable.
    using Waiting = std::map<Key, peer::TriggerWork>;
    using Lists = std::unordered_map<uintptr_t, Waiting>;
    size_t start_due(Lists &lists, bool xpu);
    template <class Pred>
    size_t discard_if(Pred pred, bool report);

    XpuRead xpu_read_;
    Lists by_counter_;
    Lists by_variable_;
    uint64_t next_order_ = 0;
    size_t pending_ = 0;
    bool running_ = false;  // inside progress(): a start that moves a counter re-enters
    bool again_ = false;
};

}  // namespace tandem::off
