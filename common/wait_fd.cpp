#include "wait_fd.h"

#include "fabric_error.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

namespace tandem {

EventFd::EventFd() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) fail(errno, "eventfd");
}
EventFd::~EventFd() {
    close(fd_);
}

void EventFd::signal() noexcept {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(fd_, &one, sizeof one);
}

void EventFd::drain() noexcept {
    uint64_t value;
    [[maybe_unused]] ssize_t n = read(fd_, &value, sizeof value);
}

WaitSet::WaitSet() : epfd_(epoll_create1(EPOLL_CLOEXEC)) {
    if (epfd_ < 0) fail(errno, "epoll_create1");
}
WaitSet::~WaitSet() {
    close(epfd_);
}

void WaitSet::add(WaitFd fd) noexcept {
    epoll_event ev{};
    ev.events = EPOLLIN | (fd.writable ? EPOLLOUT : 0u);
    ev.data.fd = fd.fd;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd.fd, &ev) != 0 && errno == EEXIST)
        epoll_ctl(epfd_, EPOLL_CTL_MOD, fd.fd, &ev);
}

void WaitSet::remove(int fd) noexcept {
    epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
}

int WaitSet::wait(int timeout_ms) noexcept {
    epoll_event ev[8];
    int n = epoll_wait(epfd_, ev, 8, timeout_ms);
    if (n < 0) return errno == EINTR ? -1 : 0;
    return n > 0 ? 1 : 0;
}

bool WaitSet::wait_us(int64_t timeout_us) noexcept {
    if (timeout_us < 0) {
        while (wait(-1) < 0) {
        }
        return true;
    }
    epoll_event ev[8];
    timespec ts{static_cast<time_t>(timeout_us / 1000000),
                static_cast<long>(timeout_us % 1000000) * 1000};
    int n;
    do {
        n = epoll_pwait2(epfd_, ev, 8, &ts, nullptr);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && errno == ENOSYS)  // a kernel before 5.11: whole milliseconds, rounded up
        return wait(static_cast<int>((timeout_us + 999) / 1000)) > 0;
    return n > 0;
}

Deadline::Deadline(int timeout_ms)
    : infinite_(timeout_ms < 0),
      end_(std::chrono::steady_clock::now() +
           std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms)) {}

bool Deadline::expired() const noexcept {
    return !infinite_ && std::chrono::steady_clock::now() >= end_;
}

int Deadline::remaining_ms() const noexcept {
    if (infinite_) return -1;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end_ - std::chrono::steady_clock::now());
    return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

}  // namespace tandem
