// fid_cntr: success and error counts of the operations bound to it. Reading drives progress.
// Opened with FI_PEER (fi_peer(3), "PEER COUNTER"), it is the peer of another provider's counter:
// it counts into the owner's (peer/peer_cntr.h), has no value of its own, and its read only
// drives progress (the owner's fi_cntr_read calls it).
#pragma once

#include "common/idle_yield.h"

#include "common/fid_adaptor.h"
#include "common/wait_fd.h"
#include "main_prov/wait.h"
#include "peer/peer_cntr.h"

#include <rdma/fi_domain.h>

#include <atomic>
#include <memory>

namespace tandem {

class Domain;
class WaitObject;

class Cntr : public FidObject<Cntr, fid_cntr> {
  public:
    Cntr(Domain *domain, const fi_cntr_attr &attr, void *context);
    ~Cntr();

    int close();
    int control(int command, void *arg);
    uint64_t read();
    uint64_t readerr();
    int add(uint64_t value);
    int set(uint64_t value);
    int wait(uint64_t threshold, int timeout);
    int adderr(uint64_t value);
    int seterr(uint64_t value);

    // Inside tandem, with the domain lock held.
    void inc() {
        if (owner_.valid()) [[unlikely]]
            return count_into_owner(false);
        bump(value_, 1);
    }
    void inc_err() {
        if (owner_.valid()) [[unlikely]]
            return count_into_owner(true);
        bump(errors_, 1);
    }
    bool imported() const { return owner_.valid(); }
    // Deferred work's FI_CNTR_ADD / FI_CNTR_SET (fi_trigger(3)), run by the trigger queue: the
    // queue looks again after every start, so nothing more is started from here. (fi_cntr_add
    // and fi_cntr_set are these, then start what the new value makes due.)
    void add_by_work(uint64_t value) { bump(value_, value); }
    void set_by_work(uint64_t value) {
        value_.store(value);  // (sequentially consistent: see bump)
        wake();
    }
    int trywait();
    void hold() { ++refs_; }
    void release() { --refs_; }
    Domain *domain() const { return domain_; }
    // What a trigger queue reads (peer::TriggerWork::successes, errors).
    const std::atomic<uint64_t> &success_word() const { return value_; }
    const std::atomic<uint64_t> &error_word() const { return errors_; }

  private:
    void bump(std::atomic<uint64_t> &which, uint64_t n);
    void count_into_owner(bool error);
    void wake();
    // The application moved the counter: work triggered by it may be due now.
    void changed_by_application();

    Domain *domain_;
    peer::ImportedCntr owner_;  // FI_PEER: the owner's counter, which counts instead
    std::atomic<uint64_t> value_{0};
    std::atomic<uint64_t> errors_{0};
    WaitBinding wait_;
    std::atomic<bool> armed_{false};
    // fi_cntr_read polled with the value unchanged (guarded by the domain lock).
    IdleYield idle_;
    uint64_t last_read_ = 0;
    uint64_t last_err_read_ = 0;  // what fi_cntr_readerr returned last (trywait)
    int refs_ = 0;
};

}  // namespace tandem
