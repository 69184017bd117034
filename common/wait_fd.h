// The file descriptors an application may sleep on. A WaitSet is an epoll descriptor that
// contains an eventfd (signalled when a completion or event is written) and the sockets of
// every endpoint whose progress can produce one: with manual progress, "readable" must
// mean "progress has work to do", not only "a completion is already queued".
#pragma once

#include <chrono>
#include <cstdint>

namespace tandem {

class EventFd {
  public:
    EventFd();
    ~EventFd();
    EventFd(const EventFd &) = delete;
    EventFd &operator=(const EventFd &) = delete;
    int fd() const noexcept { return fd_; }
    void signal() noexcept;
    void drain() noexcept;

  private:
    int fd_;
};

// A descriptor a sleeper watches: readable, and writable too while its owner has bytes it
// could not write yet (a socket whose buffer was full, a connect under way): the peer that
// drains them sends nothing back, so only the writable edge can wake the sleeper for them.
struct WaitFd {
    int fd = -1;
    bool writable = false;
};

class WaitSet {
  public:
    WaitSet();
    ~WaitSet();
    WaitSet(const WaitSet &) = delete;
    WaitSet &operator=(const WaitSet &) = delete;

    int fd() const noexcept { return epfd_; }
    void add(int fd) noexcept { add(WaitFd{fd, false}); }
    // Watches fd as it asks now: a descriptor already in the set takes the new interest (each
    // sleep brings the set up to date first, so writable interest lasts while it is wanted).
    void add(WaitFd fd) noexcept;
    void remove(int fd) noexcept;  // absent descriptors are ignored
    // Sleeps until some member is readable or the timeout (ms, negative = forever) expires.
    // 1: woken by a member; 0: timed out; -1: a signal handler ran (the blocking call that
    // sleeps here returns -FI_EINTR, as a system call interrupted so does).
    int wait(int timeout_ms) noexcept;
    // The same with a timeout in microseconds (negative = forever), for sleeps shorter than a
    // millisecond (a device polled on a timer).
    // Signals interrupt it not (the caller blocks them).
    bool wait_us(int64_t timeout_us) noexcept;

  private:
    int epfd_;
};

// Milliseconds left until a deadline given as fi_*sread timeout (negative = infinite).
class Deadline {
  public:
    explicit Deadline(int timeout_ms);
    bool expired() const noexcept;
    int remaining_ms() const noexcept;  // -1 for infinite
    // The shorter of two sleep limits (negative: no limit).
    static int shorter(int a, int b) noexcept { return a < 0 ? b : b < 0 ? a : (a < b ? a : b); }
    // What is left, at most limit_ms (negative: no limit); -1 when neither bounds it.
    int remaining_ms(int limit_ms) const noexcept {
        const int left = remaining_ms();
        if (limit_ms < 0) return left;
        return left < 0 || left > limit_ms ? limit_ms : left;
    }

  private:
    bool infinite_;
    std::chrono::steady_clock::time_point end_;
};

}  // namespace tandem
