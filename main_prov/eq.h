// fid_eq: connection-management and asynchronous events. Fabric-level, with its own lock;
// reading drives the connection progress of the passive and active endpoints bound to it.
#pragma once

#include "common/fid_adaptor.h"
#include "common/wait_fd.h"
#include "main_prov/lock_order.h"
#include "main_prov/wait.h"

#include <rdma/fi_eq.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

namespace tandem {

class Fabric;
class WaitObject;

// Something whose connection progress produces EQ events (a passive or MSG endpoint). The
// EQ calls these without its mutex (lock order: the source's lock, then the EQ's), from any
// thread that reads, waits on or asks for the wait object of the EQ.
class CmSource {
  public:
    virtual ~CmSource() = default;
    virtual void progress_cm() = 0;
    // Adds the descriptors whose readiness means progress_cm has work into `set`, while the
    // source's lock keeps them open (a descriptor closed meanwhile could be a new one by the
    // time it is added).
    virtual void cm_watch(WaitSet &set) = 0;
    // How long a sleeper may wait on those descriptors before progress_cm must run again
    // (-1: until one wakes it).
    virtual int sleep_limit_ms() = 0;

  private:
    friend class Eq;
    // Walks of the EQ this source is bound to that are calling it (Eq::for_each_source);
    // guarded by that EQ's mutex.
    int eq_walks_ = 0;
};

class Eq : public FidObject<Eq, fid_eq> {
  public:
    Eq(Fabric *fabric, const fi_eq_attr &attr, void *context);
    ~Eq();

    int close();
    int control(int command, void *arg);
    ssize_t read(uint32_t *event, void *buf, size_t len, uint64_t flags);
    ssize_t readerr(fi_eq_err_entry *buf, uint64_t flags);
    ssize_t write(uint32_t event, const void *buf, size_t len, uint64_t flags);
    ssize_t sread(uint32_t *event, void *buf, size_t len, int timeout, uint64_t flags);
    const char *strerror(int prov_errno, const void *err_data, char *buf, size_t len);

    // Inside tandem (any thread; takes the EQ lock).
    void post(uint32_t event, const void *buf, size_t len);
    // An error event; err_data (reject data, for instance) is copied.
    void post_error(fid_t fid, void *context, int err, const void *err_data, size_t err_len,
                    uint64_t data = 0);
    int trywait();
    // The shortest of its sources' sleep limits (CmSource::sleep_limit_ms); -1: none.
    int sleep_limit_ms();
    void add_source(CmSource *src);
    // Returns once no other thread is inside `src` on this EQ's behalf, so that the caller
    // may free it. The caller holds no lock of tandem's: a walk that is inside `src` may be
    // waiting for the domain lock or the passive endpoint's mutex.
    void remove_source(CmSource *src);

  private:
    struct Event {
        uint32_t type;
        std::vector<uint8_t> body;
    };
    struct ErrorEvent {
        fi_eq_err_entry entry;
        std::vector<uint8_t> data;
    };
    // Calls f(source) for every bound source, without the EQ's mutex; each stays bound (its
    // close waits) until the walk is done.
    template <class F>
    void for_each_source(F &&f);
    void progress_sources();
    // The sources' descriptors into the wait set, so that a sleeper wakes when progress has
    // work to do.
    void watch_sources(WaitSet &set);
    ssize_t read_locked(uint32_t *event, void *buf, size_t len, uint64_t flags);

    Fabric *fabric_;
    EqMutex mutex_;                          // last in the lock order (main_prov/lock_order.h)
    std::condition_variable_any walk_done_;  // a source's eq_walks_ went to 0
    std::deque<Event> events_;
    std::deque<ErrorEvent> errors_;
    std::vector<CmSource *> sources_;
    WaitBinding wait_;
    std::vector<uint8_t> last_err_data_;
};

}  // namespace tandem
