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
struct ProgressThreadRegistry {
    std::mutex mutex;  // before every domain lock
    std::vector<ProgressThread *> threads;

    static ProgressThreadRegistry &get() {
        static auto *registry = [] {
            auto *r = new ProgressThreadRegistry;  // never freed: fork handlers outlive exit
            pthread_atfork(&prepare, &parent, &child);
            return r;
        }();
        return *registry;
    }
    static void prepare() {
        auto &r = get();
        r.mutex.lock();
        for (auto *t : r.threads) t->domain_.lock().lock();
    }
    static void parent() {
        auto &r = get();
        for (auto *t : r.threads) t->domain_.lock().unlock();
        r.mutex.unlock();
    }
    static void child() {
        auto &r = get();
        for (auto *t : r.threads) {
            t->orphaned_ = true;
            t->asleep_.store(false, std::memory_order_relaxed);
            t->domain_.lock().unlock();
        }
        r.threads.clear();
        r.mutex.unlock();
    }
};

ProgressThread::ProgressThread(Domain &domain) : domain_(domain) {
    set_.add(kick_.fd());
}

ProgressThread::~ProgressThread() {
    stop();
}

bool ProgressThread::in_progress_thread() noexcept {
    return t_progress_thread;
}

int ProgressThread::start() {
    auto &registry = ProgressThreadRegistry::get();
    std::lock_guard guard(registry.mutex);
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
    registry.threads.push_back(this);
    return 0;
}

void ProgressThread::stop() {
    if (!running_) return;
    running_ = false;
    if (orphaned_) return;  // a child of fork(): the thread is the parent's
    {
        auto &registry = ProgressThreadRegistry::get();
        std::lock_guard guard(registry.mutex);
        std::erase(registry.threads, this);
    }
    stop_.store(true, std::memory_order_release);
    kick_.signal();
    pthread_join(thread_, nullptr);
}

void ProgressThread::stop_all() noexcept {
    std::vector<ProgressThread *> threads;
    {
        auto &registry = ProgressThreadRegistry::get();
        std::lock_guard guard(registry.mutex);
        threads = registry.threads;
    }
    for (auto *t : threads) t->stop();
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
    if (!domain_.device_triggers_waiting()) return -1;
    return static_cast<int64_t>(Config::get().progress_poll_us);
}

void ProgressThread::run() {
    std::unique_lock guard(domain_.lock());
    while (!stop_.load(std::memory_order_acquire)) {
        domain_.progress();
        passes_.fetch_add(1, std::memory_order_relaxed);
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
        sleeps_.fetch_add(1, std::memory_order_relaxed);
        guard.unlock();
        set_.wait_us(timeout_us);
        kick_.drain();
        guard.lock();
        asleep_.store(false, std::memory_order_relaxed);
    }
}

}  // namespace tandem
