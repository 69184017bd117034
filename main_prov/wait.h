// fid_wait (fi_wait_open) and fid_poll (fi_poll_open): sets an application sleeps on.
// A wait set is one epoll descriptor that CQs, counters and EQs opened with FI_WAIT_SET
// add their descriptors to; a poll set reports which of its CQs and counters have events.
#pragma once

#include "common/fid_adaptor.h"
#include "common/wait_fd.h"

#include <rdma/fi_eq.h>
#include <rdma/fi_domain.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace tandem {

class Fabric;
class Domain;

class WaitObject : public FidObject<WaitObject, fid_wait> {
  public:
    WaitObject(Fabric *fabric, const fi_wait_attr &attr);
    ~WaitObject();

    int close();
    int control(int command, void *arg);
    int wait(int timeout);

    WaitSet &set() { return set_; }
    // CQs, counters and EQs opened on this set; fi_wait checks them before sleeping.
    void attach(struct fid *member);
    void detach(struct fid *member);

  private:
    Fabric *fabric_;
    WaitSet set_;
    std::mutex mutex_;
    std::vector<struct fid *> members_;
};

class PollObject : public FidObject<PollObject, fid_poll> {
  public:
    PollObject(Domain *domain, const fi_poll_attr &attr);
    ~PollObject();

    int close();
    int poll(void **context, int count);
    int add(struct fid *event_fid, uint64_t flags);
    int del(struct fid *event_fid, uint64_t flags);

  private:
    Domain *domain_;
    std::mutex mutex_;
    std::vector<struct fid *> members_;
    std::vector<uint64_t> last_counts_;  // counters: value at the previous poll
};

// The wait object of a CQ, counter or EQ: none, its own epoll descriptor (FI_WAIT_FD,
// FI_WAIT_UNSPEC) or an application's wait set (FI_WAIT_SET), plus the eventfd that the
// object signals when an entry arrives for a sleeper.
class WaitBinding {
  public:
    // wait_obj is the raw attribute value; owner is the object's fid (for the wait set).
    WaitBinding(int wait_obj, fid_wait *wait_set, struct fid *owner);
    ~WaitBinding();
    WaitBinding(const WaitBinding &) = delete;
    WaitBinding &operator=(const WaitBinding &) = delete;

    WaitSet *set() const { return set_; }  // nullptr for FI_WAIT_NONE
    WaitSet *own() const { return own_.get(); }
    EventFd &signal() { return signal_; }
    // FI_GETWAITOBJ, and FI_GETWAIT after add_fds(own set) put the owner's sockets in.
    template <class AddFds>
    int control(int command, void *arg, AddFds &&add_fds);

  private:
    std::unique_ptr<WaitSet> own_;
    WaitSet *set_ = nullptr;
    WaitObject *object_ = nullptr;
    struct fid *owner_;
    EventFd signal_;
};

// FI_GETWAITOBJ for a CQ, counter or EQ: FI_WAIT_FD for its own descriptor, FI_WAIT_SET when
// it sleeps on an application's wait set, FI_WAIT_NONE without a wait object.
int report_wait_object(void *arg, bool own_fd, bool in_set);

// fi_trywait for any of tandem's waitable objects.
int trywait_one(struct fid *f);

template <class AddFds>
int WaitBinding::control(int command, void *arg, AddFds &&add_fds) {
    if (command == FI_GETWAITOBJ)
        return report_wait_object(arg, own_ != nullptr, object_ != nullptr);
    if (command != FI_GETWAIT) return -FI_ENOSYS;
    if (!own_) return -FI_ENODATA;
    if (!arg) return -FI_EINVAL;
    add_fds(*own_);
    *static_cast<int *>(arg) = own_->fd();
    return 0;
}

}  // namespace tandem
