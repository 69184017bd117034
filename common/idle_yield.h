// An application that polls a completion queue or counter with nothing coming, pass after
// pass: when processes outnumber cores, the process it waits for may have no core, and a busy
// poll keeps it off ours until the scheduler's time slice ends (milliseconds per message).
// After kEmptyPolls empty polls in a row (tens to hundreds of microseconds), the poll gives the
// core away once (sched_yield), outside every lock. A poll that finds anything starts the
// count again, so a process whose messages keep coming never yields; with a core to spare the
// yield returns at once.
#pragma once

#include <sched.h>

namespace tandem {

class IdleYield {
  public:
    static constexpr unsigned kEmptyPolls = 1024;
    // Call with the object's lock held; true when the caller is to yield once it released it.
    bool empty_poll() {
        if (++empty_ < kEmptyPolls) return false;
        empty_ = 0;
        return true;
    }
    void found() { empty_ = 0; }
    static void yield() { sched_yield(); }

  private:
    unsigned empty_ = 0;
};

}  // namespace tandem
