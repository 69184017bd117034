// FI_PROGRESS_AUTO: one thread per domain that drives the domain's progress while the
// application computes (docs/architecture.md, "Threads and progress").
//
// The thread runs Domain::progress under the domain's lock, as a CQ read does, and sleeps
// when a pass leaves nothing that only the CPU can move: in epoll_wait on what announces new
// work (link sockets and listeners, the node-local wake-up of every endpoint's twin, a verbs
// completion channel) and on its own eventfd, which an application call kicks when it leaves
// such work behind (DomainLock::ReleaseWatcher). It wakes on a timer only while device-written
// trigger variables (XPU) wait, every FI_TANDEM_PROGRESS_POLL_US.
#pragma once

#include "common/wait_fd.h"
#include "main_prov/lock_order.h"

#include <pthread.h>

#include <atomic>
#include <cstdint>

namespace tandem {

class Domain;

class ProgressThread final : public DomainLock::ReleaseWatcher {
  public:
    explicit ProgressThread(Domain &domain);
    ~ProgressThread();  // stops the thread (stop())
    ProgressThread(const ProgressThread &) = delete;
    ProgressThread &operator=(const ProgressThread &) = delete;

    // Starts the thread (signals blocked in it: they go to the application's threads).
    // 0 or a negative fabric errno.
    int start();
    // Ends the thread and waits for it. The caller holds no lock of the domain's. In a child
    // of fork() the thread does not exist: nothing is waited for.
    void stop();

    // DomainLock::ReleaseWatcher: an application's call on the domain is about to release
    // the lock. When the thread sleeps and the call left work no descriptor announces (a
    // socket's unsent bytes, a connection being made, a triggered operation to start), the
    // thread is woken. Under the lock.
    void released() noexcept override;

    // Ends every progress thread of the process (the provider is about to be unloaded).
    static void stop_all() noexcept;

  private:
    static void *main(void *self);
    // Stops and joins the thread (stop() once it has left the registry).
    void end();
    void run();
    // Before sleeping, under the lock: arms every source (Domain::watch_fds) and says how long
    // to sleep in microseconds (-1: until woken).
    int64_t prepare_sleep();

    Domain &domain_;
    EventFd kick_;
    WaitSet set_;
    pthread_t thread_{};
    bool running_ = false;
    // Set by the child handler of pthread_atfork: this object was copied into a child of
    // fork(), where its thread does not run.
    bool orphaned_ = false;
    std::atomic<bool> stop_{false};
    // True between the thread's last pass and its wake-up (written under the domain lock).
    std::atomic<bool> asleep_{false};

    friend struct ProgressThreadRegistry;
};

}  // namespace tandem
