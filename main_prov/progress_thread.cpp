#include "main_prov/progress_thread.h"

#include "common/log.h"
#include "main_prov/config.h"
#include "main_prov/domain.h"

#include <sys/prctl.h>

#include <csignal>
#include <mutex>
#include <vector>

namespace tandem {

namespace {
[[gnu::tls_model("initial-exec")]] thread_local bool t_progress_thread = false;
}  // namespace

// The progress threads of the process, for fork(): before it, every thread is kept out of its
// domain (its lock taken), so the child's copy of each domain is consistent and unlocked;
// the child's objects then know that their thread does not run there (orphaned_).
// Two mutexes, so that no cycle forms with the libfabric core's lock, which the core holds
// when it calls the provider's cleanup (stop_all) and which a domain takes under its own lock
// (opening off_tandem): fork_mutex comes before every domain lock and is taken only by a fork
// and by a domain's close (which holds no lock); list_mutex guards the list alone and no lock
// is ever taken under it.
struct ProgressThreadRegistry {
    std::mutex fork_mutex;
    std::mutex list_mutex;
    std::vector<ProgressThread *> threads;
    std::vector<ProgressThread *> forking;  // the threads whose domains prepare() locked

    static ProgressThreadRegistry &get() {
        static auto *registry = [] {
            auto *r = new ProgressThreadRegistry;  // never freed: fork handlers outlive exit
            pthread_atfork(&prepare, &parent, &child);
            return r;
        }();
        return *registry;
    }
    void add(ProgressThread *t) {
        std::lock_guard guard(list_mutex);
        threads.push_back(t);
    }
    void remove(ProgressThread *t) {
        std::lock_guard guard(list_mutex);
        std::erase(threads, t);
    }
    static void prepare() {
        auto &r = get();
        r.fork_mutex.lock();
        {
            std::lock_guard guard(r.list_mutex);
            r.forking = r.threads;
        }
        for (auto *t : r.forking) t->domain_.lock().lock();
    }
    static void parent() {
        auto &r = get();
        for (auto *t : r.forking) t->domain_.lock().unlock();
        r.forking.clear();
        r.fork_mutex.unlock();
    }
    static void child() {
        auto &r = get();
        for (auto *t : r.forking) {
            t->orphaned_ = true;
            t->asleep_.store(false, std::memory_order_relaxed);
            t->domain_.lock().unlock();
        }
        // Another thread of the parent may have held the list's mutex: the child's copy
        // starts afresh, with no thread.
        new (&r.list_mutex) std::mutex;
        r.threads.clear();
        r.forking.clear();
        r.fork_mutex.unlock();
    }
};

ProgressThread::ProgressThread(Domain &domain) : domain_(domain) {
    set_.add(kick_.fd());
}

ProgressThread::~ProgressThread() {
    stop();
}

int ProgressThread::start() {
    auto &registry = ProgressThreadRegistry::get();
    std::lock_guard fork_guard(registry.fork_mutex);  // made and listed before any fork
    // Created with every signal blocked, so that the application's threads take them (a
    // handler's interrupted call is theirs) and this one is never interrupted.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int ret = pthread_create(&thread_, nullptr, &ProgressThread::main, this);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (ret) {
        TANDEM_WARN(FI_LOG_DOMAIN, "automatic progress: no thread (%s)\n", strerror(ret));
        return -FI_EAGAIN;
    }
    pthread_setname_np(thread_, "tandem-progress");  // what ps, gdb and the tests see
    running_ = true;
    registry.add(this);
    return 0;
}

void ProgressThread::stop() {
    if (!running_) return;
    if (orphaned_) {  // a child of fork(): the thread is the parent's
        running_ = false;
        return;
    }
    {
        // Not while a fork() holds this domain's lock (prepare() has this object in hand).
        auto &registry = ProgressThreadRegistry::get();
        std::lock_guard guard(registry.fork_mutex);
        registry.remove(this);
    }
    end();
}

void ProgressThread::end() {
    running_ = false;
    stop_.store(true, std::memory_order_release);
    kick_.signal();
    pthread_join(thread_, nullptr);
}

// (Called with the core's lock held: the fork mutex is not taken, see the registry. The
// process is exiting; a fork() in another thread at this moment is not served.)
void ProgressThread::stop_all() noexcept {
    auto &registry = ProgressThreadRegistry::get();
    std::vector<ProgressThread *> threads;
    {
        std::lock_guard guard(registry.list_mutex);
        threads.swap(registry.threads);
    }
    for (auto *t : threads)
        if (t->running_ && !t->orphaned_) t->end();
}

void *ProgressThread::main(void *self) {
    t_progress_thread = true;
    // Timer wake-ups (device polling) at the interval asked for, not 50 us late.
    prctl(PR_SET_TIMERSLACK, 1UL);
    static_cast<ProgressThread *>(self)->run();
    return nullptr;
}

void ProgressThread::released() noexcept {
    if (!asleep_.load(std::memory_order_relaxed) || t_progress_thread) return;
    if (!domain_.worth_a_look()) return;
    asleep_.store(false, std::memory_order_relaxed);
    kick_.signal();
}

int64_t ProgressThread::prepare_sleep() {
    domain_.watch_fds(set_);
    if (domain_.device_triggers_waiting())
        return static_cast<int64_t>(Config::get().progress_poll_us);
    // (Timed work of the links, a stalled stranger's time: Domain::sleep_limit_ms.)
    const int limit = domain_.sleep_limit_ms();
    return limit < 0 ? -1 : int64_t(limit) * 1000;
}

void ProgressThread::run() {
    std::unique_lock guard(domain_.lock());
    while (!stop_.load(std::memory_order_acquire)) {
        domain_.progress();
        if (domain_.work_pending()) {
            // Work only the CPU moves (bytes a socket did not take yet, a connection being
            // made): another pass, letting the application's calls in between.
            guard.unlock();
            sched_yield();
            guard.lock();
            continue;
        }
        const int64_t timeout_us = prepare_sleep();
        asleep_.store(true, std::memory_order_relaxed);
        guard.unlock();
        set_.wait_us(timeout_us);
        kick_.drain();
        guard.lock();
        asleep_.store(false, std::memory_order_relaxed);
    }
}

}  // namespace tandem
