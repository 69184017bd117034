// fid_wait (fi_wait_open) and fid_poll (fi_poll_open): sets an application sleeps on.
// A wait set is one epoll descriptor that CQs, counters and EQs opened with FI_WAIT_SET
// add their descriptors to; a poll set reports which of its CQs and counters have events.
#pragma once

#include "common/fid_adaptor.h"
#include "common/wait_fd.h"

#include <rdma/fi_eq.h>
#include <rdma/fi_domain.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <unordered_map>
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
    // Returns once no fi_wait is inside `member` (it may then be freed). The caller holds no
    // lock of tandem's: an fi_wait inside a CQ's fi_trywait may be waiting for the domain
    // lock.
    void detach(struct fid *member);

  private:
    Fabric *fabric_;
    WaitSet set_;
    std::mutex mutex_;  // a leaf: fi_wait asks its members without it
    std::vector<struct fid *> members_;
    // fi_wait calls inside each member (counted under mutex_); detach waits for 0.
    std::unordered_map<struct fid *, int> walks_;
    std::condition_variable walk_done_;
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
    // Into the application's wait set (FI_WAIT_SET), where fi_wait asks the owner: the owner
    // calls it last in its constructor, once it can be asked.
    void join();
    // Out of the application's wait set, once no fi_wait on it is inside the owner: the
    // owner's close calls it before freeing anything (holding no lock of tandem's); the
    // destructor does if it was not called.
    void leave();
    EventFd &signal() { return signal_; }
    // FI_GETWAITOBJ, and FI_GETWAIT after add_fds(own set) put the owner's sockets in.
    template <class AddFds>
    int control(int command, void *arg, AddFds &&add_fds);

  private:
    std::unique_ptr<WaitSet> own_;
    WaitSet *set_ = nullptr;
    WaitObject *object_ = nullptr;
    bool joined_ = false;
    struct fid *owner_;
    EventFd signal_;
};

// FI_GETWAITOBJ for a CQ, counter or EQ: FI_WAIT_FD for its own descriptor, FI_WAIT_SET when
// it sleeps on an application's wait set, FI_WAIT_NONE without a wait object.
int report_wait_object(void *arg, bool own_fd, bool in_set);

// fi_trywait for any of tandem's waitable objects.
int trywait_one(struct fid *f);
// How long fi_wait may sleep on one of them before it must look again (-1: no limit).
int sleep_limit_of(struct fid *f);

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
