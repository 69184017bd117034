// The lock order of the main provider (docs/architecture.md, "Threads and progress"):
//
//     domain lock (DomainLock)    ─┐
//                                  ├─>  EQ mutex (EqMutex)
//     passive endpoint's mutex    ─┘
//
// CQ and counter progress holds the domain lock and posts connection events to an EQ; a
// passive endpoint's progress holds its mutex and posts FI_CONNREQ. So a thread that holds an
// EQ's mutex takes no other lock of tandem's and calls into no endpoint (an EQ walks its
// sources without its mutex: Eq::for_each_source).
//
// No lock is taken twice by one thread: the domain lock is a plain mutex. The offload twin
// runs only inside tandem's calls, under the lock, and what it calls back (the endpoint face
// it was given, main_prov/owner_face.h, and the peer CQ, SRX and AV made for it) expects the
// lock held instead of taking it.
//
// The checks are on in every build (TANDEM_LOCK_CHECKS, default 1): each costs a load and a
// compare of a thread-local address, and a violation aborts at once with a message, where the
// deadlock it allows would need an unlucky schedule. Sanitizer builds (TANDEM_LOCK_CHECKS=2)
// also check each release of the domain lock, which the message path would pay for twice.
#pragma once

#include <atomic>
#include <mutex>

#ifndef TANDEM_LOCK_CHECKS
#define TANDEM_LOCK_CHECKS 1
#endif

namespace tandem {

#if TANDEM_LOCK_CHECKS
namespace lock_order {
// EQ mutexes the calling thread holds. Initial-exec: in the static TLS block, not in a
// dynamic one that libfabric's dlclose of the provider at exit leaves behind; LeakSanitizer's
// exit-time scan of such a stale dynamic block crashed (GCC 12's libsanitizer).
[[gnu::tls_model("initial-exec")]] inline thread_local int eq_mutexes_held = 0;
// The calling thread, as the address of a thread-local byte: one instruction, where
// std::this_thread::get_id() is a call into libc.
[[gnu::tls_model("initial-exec")]] inline thread_local char thread_byte = 0;
inline const void *this_thread() noexcept {
    return &thread_byte;
}
[[noreturn]] void violated(const char *what) noexcept;
}  // namespace lock_order
#define TANDEM_LOCK_ASSERT(cond, what)                     \
    do {                                                   \
        if (!(cond)) ::tandem::lock_order::violated(what); \
    } while (0)
#else
#define TANDEM_LOCK_ASSERT(cond, what) ((void)0)
#endif

// Called before taking a lock that comes before the EQ's in the order.
inline void lock_order_before_eq([[maybe_unused]] const char *lock_name) noexcept {
    TANDEM_LOCK_ASSERT(lock_order::eq_mutexes_held == 0, lock_name);
}

// An EQ's mutex: the last lock of the order.
class EqMutex {
  public:
    void lock() {
        mutex_.lock();
#if TANDEM_LOCK_CHECKS
        owner_.store(lock_order::this_thread(), std::memory_order_relaxed);
        ++lock_order::eq_mutexes_held;
#endif
    }
    void unlock() {
#if TANDEM_LOCK_CHECKS
        --lock_order::eq_mutexes_held;
        owner_.store(nullptr, std::memory_order_relaxed);
#endif
        mutex_.unlock();
    }
#if TANDEM_LOCK_CHECKS
    // Whether the calling thread holds it (for TANDEM_LOCK_ASSERT only).
    bool held() const noexcept {
        return owner_.load(std::memory_order_relaxed) == lock_order::this_thread();
    }
#endif

  private:
    std::mutex mutex_;
#if TANDEM_LOCK_CHECKS
    std::atomic<const void *> owner_{nullptr};
#endif
};

// A domain's lock, first in the order: CQ and counter progress holds it and posts connection
// events to EQs. Not recursive (see the top of this file).
// Under FI_THREAD_DOMAIN the application serialises every call on the domain's objects
// (fi_domain(3)), so the lock is skipped, until an endpoint of the domain is bound to an EQ:
// an EQ is the fabric's, any thread may read it while another reads a CQ, and its reads drive
// that endpoint's progress. From then on the lock is taken (require()).
class DomainLock {
  public:
    // Told at every release of the lock, just before it (automatic progress: the domain's
    // progress thread sleeps, and the call that releases may have left it work).
    class ReleaseWatcher {
      public:
        virtual void released() noexcept = 0;

      protected:
        ~ReleaseWatcher() = default;
    };

    explicit DomainLock(bool needed) : needed_(needed) {}
    void lock() {
        if (!needed_.load(std::memory_order_relaxed)) return;  // (skipped: no order to keep)
        lock_order_before_eq("the domain lock taken under an EQ's mutex");
#if TANDEM_LOCK_CHECKS
        TANDEM_LOCK_ASSERT(owner_.load(std::memory_order_relaxed) != lock_order::this_thread(),
                           "the domain lock taken again by the thread that holds it (a call "
                           "from inside tandem into one of its locking entry points)");
#endif
        mutex_.lock();
#if TANDEM_LOCK_CHECKS
        owner_.store(lock_order::this_thread(), std::memory_order_relaxed);
#endif
    }
    void unlock() {
        if (!needed_.load(std::memory_order_relaxed)) return;
#if TANDEM_LOCK_CHECKS > 1
        TANDEM_LOCK_ASSERT(held(),
                           "the domain lock released by a thread that does not hold it "
                           "(turned on inside one of its guards?)");
#endif
        if (watcher_) [[unlikely]]
            watcher_->released();
#if TANDEM_LOCK_CHECKS
        owner_.store(nullptr, std::memory_order_relaxed);
#endif
        mutex_.unlock();
    }
    // Takes the lock from now on, for good. The caller holds no guard of it (a guard taken
    // while it was skipped would release a mutex it never locked), and no other thread is
    // inside the domain: under FI_THREAD_DOMAIN the application serialises the call that turns
    // it on (fi_ep_bind to an EQ) with every other call on the domain's objects, and no EQ
    // reaches the domain's endpoints before one of them is bound.
    void require() noexcept {
        needed_.store(true, std::memory_order_relaxed);
    }
    // Set before the watcher's thread starts and cleared after it ended (the domain's
    // automatic progress), when no other thread is inside the domain; the lock is then
    // required for good.
    void watch_releases(ReleaseWatcher *watcher) noexcept {
        watcher_ = watcher;
    }
    // Whether the lock is taken (for the log).
    bool taken() const noexcept {
        return needed_.load(std::memory_order_relaxed);
    }
    // Around a call, made under this lock, into a provider tandem did not build (its start or
    // discard of a message it queued): what that provider calls back on this thread meanwhile
    // (free_entry, a write into an exported CQ) runs under the lock already (PeerEntryGuard).
    class PeerCall {
      public:
        // (Nested calls restore the outer one's mark: a counter or CQ the owner imported may
        // be written from inside tandem's start of a message the owner asked for.)
        explicit PeerCall(DomainLock &lock)
            : lock_(lock), outer_(lock.peer_call_.load(std::memory_order_relaxed)) {
            lock_.peer_call_.store(lock_order::this_thread(), std::memory_order_relaxed);
        }
        ~PeerCall() { lock_.peer_call_.store(outer_, std::memory_order_relaxed); }
        PeerCall(const PeerCall &) = delete;
        PeerCall &operator=(const PeerCall &) = delete;

      private:
        DomainLock &lock_;
        const void *outer_;
    };
    // Whether the calling thread is inside such a call (and so holds the lock).
    bool in_peer_call() const noexcept {
        return peer_call_.load(std::memory_order_relaxed) == lock_order::this_thread();
    }
#if TANDEM_LOCK_CHECKS
    // Whether the calling thread may touch the domain's objects: it holds the lock, or the
    // lock is skipped (the application serialises).
    bool held() const noexcept {
        return !needed_.load(std::memory_order_relaxed) ||
               owner_.load(std::memory_order_relaxed) == lock_order::this_thread();
    }
#endif

  private:
    // The thread inside a PeerCall, or null (set and cleared under the lock; another thread
    // only compares it with its own address, which it can never find there).
    std::atomic<const void *> peer_call_{nullptr};
    // Relaxed: it only goes from false to true, before the domain's first EQ binding, and a
    // thread that reads it afterwards learned of that binding through the EQ's mutex or the
    // application's own ordering of its calls.
    std::atomic<bool> needed_;
    ReleaseWatcher *watcher_ = nullptr;
    std::mutex mutex_;
#if TANDEM_LOCK_CHECKS
    // Relaxed: only the thread that stored its own address can find it there (a thread reads
    // either its own store or another thread's, never its own address stored by another).
    std::atomic<const void *> owner_{nullptr};
#endif
};

// The guard of an entry point that callers of two kinds reach through objects of one kind:
// tandem's own offload twin, which runs only inside tandem's calls and so under the domain
// lock, and a provider tandem did not build, which imported the object (fi_peer(3)) and holds
// no lock of tandem's. Each object knows which it serves when it is made (its role), so the
// lock is taken by the second kind only, and the first kind's calls check that it is held.
class PeerEntryGuard {
  public:
    PeerEntryGuard(DomainLock &lock, bool caller_holds_lock)
        : lock_(lock), take_(!caller_holds_lock) {
        if (take_)
            lock_.lock();
        else
            TANDEM_LOCK_ASSERT(lock_.held(), "the twin called back into tandem outside its lock");
    }
    ~PeerEntryGuard() {
        if (take_) lock_.unlock();
    }
    PeerEntryGuard(const PeerEntryGuard &) = delete;
    PeerEntryGuard &operator=(const PeerEntryGuard &) = delete;

  private:
    DomainLock &lock_;
    bool take_;
};

// The caller holds the domain lock (an entry point only tandem's twin reaches).
#define TANDEM_ASSERT_DOMAIN_LOCK_HELD(domain)                         \
    TANDEM_LOCK_ASSERT((domain)->lock().held(),                        \
                       "the twin called back into tandem outside its " \
                       "lock")

// A passive endpoint's mutex: before the EQ's in the order (its progress posts FI_CONNREQ).
class PepMutex {
  public:
    void lock() {
        lock_order_before_eq("a passive endpoint's mutex taken under an EQ's mutex");
        mutex_.lock();
    }
    void unlock() { mutex_.unlock(); }

  private:
    std::mutex mutex_;
};

}  // namespace tandem
