// How node-local endpoints wake one another, and themselves. A receiver that sleeps arms its
// ring first (ShmRing's sleep protocol); the producer whose claim sees the arm writes a byte
// into the receiver's wake FIFO, a named pipe beside its segment. A peer that dies writes
// nothing, though: a sleeper whose operations wait on peers needs a timer of its own for the
// next check of their liveness. What a sleeper watches is one descriptor, an epoll set of both.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace tandem::shm {

// Our own side: the FIFO peers write (created here, removed when we go), and the timer.
class InboxWake {
  public:
    // Makes the FIFO of the endpoint with that key (wake_path); one left by a dead owner of
    // the key goes (the key is ours once our segment exists). Throws ShmError.
    explicit InboxWake(const std::string &key);
    // An endpoint without an inbox (FI_OPT_SHARED_MEMORY_PERMITTED false): no FIFO, so no
    // peer wakes it, but it wakes itself (wake_self) and for its checks (the timer) the same
    // way. Throws ShmError.
    struct NoFifo {};
    explicit InboxWake(NoFifo);
    ~InboxWake();
    InboxWake(const InboxWake &) = delete;
    InboxWake &operator=(const InboxWake &) = delete;

    // Readable when a peer woke us, wake_self() was called, or the timer expired.
    int fd() const noexcept { return wait_set_; }
    // Takes what made fd() readable (before a sleep: what woke us last is not news).
    void drain();
    // fd() readable at once: there is work the sleeper must not sleep over.
    void wake_self();
    // The timer fires once, `ms` (at least 1) from now; stop_timer() disarms it.
    void set_timer(int64_t ms);
    void stop_timer();
    bool timer_set() const noexcept { return timer_set_; }

  private:
    // The epoll set of the read end and the timer (the constructors' common part).
    void open_wait_set();
    [[noreturn]] void fail_with(const char *what);
    void release() noexcept;

    std::string path_;
    // We keep a write end ourselves so that the read end never sees a hang-up (which would
    // make it readable for ever); wake_self() writes it.
    int read_end_ = -1, write_end_ = -1;
    int timer_ = -1, wait_set_ = -1;
    bool timer_set_ = false;
};

// A peer's FIFO, its write end opened when first needed.
class PeerWake {
  public:
    PeerWake() = default;  // wakes nobody
    explicit PeerWake(std::string key) : key_(std::move(key)) {}
    PeerWake(PeerWake &&other) noexcept;
    PeerWake &operator=(PeerWake &&other) noexcept;
    PeerWake(const PeerWake &) = delete;
    PeerWake &operator=(const PeerWake &) = delete;
    ~PeerWake();

    // A byte into the peer's FIFO. Failure is quiet (logged): a peer that died needs no wake,
    // and a full FIFO has bytes enough to wake its reader.
    void wake();

  private:
    std::string key_;
    int fd_ = -1;
};

}  // namespace tandem::shm
