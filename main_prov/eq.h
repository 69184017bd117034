// fid_eq: connection-management and asynchronous events. Fabric-level, with its own lock;
// reading drives the connection progress of the passive and active endpoints bound to it.
#pragma once

#include "common/fid_adaptor.h"
#include "common/wait_fd.h"
#include "main_prov/wait.h"

#include <rdma/fi_eq.h>

#include <deque>
#include <memory>
#include <mutex>
#include <vector>

namespace tandem {

class Fabric;
class WaitObject;

// Something whose connection progress produces EQ events (a passive or MSG endpoint).
class CmSource {
  public:
    virtual ~CmSource() = default;
    virtual void progress_cm() = 0;
    virtual void cm_wait_fds(std::vector<int> &out) = 0;
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
    void add_source(CmSource *src);
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
    void progress_sources();
    ssize_t read_locked(uint32_t *event, void *buf, size_t len, uint64_t flags);

    Fabric *fabric_;
    std::mutex mutex_;
    std::deque<Event> events_;
    std::deque<ErrorEvent> errors_;
    std::vector<CmSource *> sources_;
    WaitBinding wait_;
    std::vector<uint8_t> last_err_data_;
};

}  // namespace tandem
