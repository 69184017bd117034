#include "main_prov/shm/wake.h"

#include "common/log.h"
#include "main_prov/shm/inbox_segment.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace tandem::shm {

InboxWake::InboxWake(const std::string &key) : path_(wake_path(key)) {
    unlink(path_.c_str());
    if (mkfifo(path_.c_str(), 0600) != 0) {
        int err = errno;
        path_.clear();  // not ours to remove
        throw ShmError(-err, "mkfifo " + wake_path(key));
    }
    read_end_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    write_end_ = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (read_end_ < 0 || write_end_ < 0) fail_with("open");
    open_wait_set();
}

InboxWake::InboxWake(NoFifo) {
    int ends[2];
    if (::pipe2(ends, O_NONBLOCK | O_CLOEXEC) != 0) fail_with("pipe2 for a wake without a FIFO");
    read_end_ = ends[0];
    write_end_ = ends[1];
    open_wait_set();
}

void InboxWake::fail_with(const char *what) {
    int err = errno;
    std::string where = path_;
    release();  // (a throwing constructor runs no destructor)
    throw ShmError(-err, std::string(what) + " " + where);
}

void InboxWake::open_wait_set() {
    wait_set_ = ::epoll_create1(EPOLL_CLOEXEC);
    timer_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (wait_set_ < 0 || timer_ < 0) fail_with("epoll_create1 / timerfd_create for");
    for (int fd : {read_end_, timer_}) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = fd;
        if (::epoll_ctl(wait_set_, EPOLL_CTL_ADD, fd, &ev) != 0) fail_with("epoll_ctl for");
    }
}

InboxWake::~InboxWake() {
    release();
}

void InboxWake::release() noexcept {
    for (int *fd : {&read_end_, &write_end_, &wait_set_, &timer_})
        if (*fd >= 0) {
            ::close(*fd);
            *fd = -1;
        }
    if (!path_.empty()) unlink(path_.c_str());
    path_.clear();
}

void InboxWake::drain() {
    char bytes[64];
    while (::read(read_end_, bytes, sizeof bytes) > 0) {
    }
    uint64_t expirations;
    (void)!::read(timer_, &expirations, sizeof expirations);
}

void InboxWake::wake_self() {
    char byte = 0;
    (void)!::write(write_end_, &byte, 1);  // (full: it is readable already)
}

void InboxWake::set_timer(int64_t ms) {
    if (ms < 1) ms = 1;
    itimerspec when{};
    when.it_value.tv_sec = ms / 1000;
    when.it_value.tv_nsec = (ms % 1000) * 1000000;
    ::timerfd_settime(timer_, 0, &when, nullptr);
    timer_set_ = true;
}

void InboxWake::stop_timer() {
    itimerspec never{};
    ::timerfd_settime(timer_, 0, &never, nullptr);
    timer_set_ = false;
}

PeerWake::PeerWake(PeerWake &&other) noexcept
    : key_(std::move(other.key_)), fd_(std::exchange(other.fd_, -1)) {}

PeerWake &PeerWake::operator=(PeerWake &&other) noexcept {
    if (this != &other) {
        if (fd_ >= 0) ::close(fd_);
        key_ = std::move(other.key_);
        fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
}

PeerWake::~PeerWake() {
    if (fd_ >= 0) ::close(fd_);
}

void PeerWake::wake() {
    if (key_.empty()) return;
    // Opened for reading too (Linux allows it on a FIFO; we never read): the FIFO then always
    // has a reader, so a write after the peer died fails quietly (or fills the FIFO: EAGAIN)
    // instead of raising SIGPIPE in the application's thread, whose handler may be the
    // default: death. (A peer that sleeps armed and then dies: its arm made our next send
    // wake it.)
    if (fd_ < 0) fd_ = ::open(wake_path(key_).c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    char byte = 0;
    if (fd_ >= 0 && ::write(fd_, &byte, 1) < 0 && errno != EAGAIN)
        TANDEM_DEBUG(FI_LOG_EP_DATA, "wake of %s failed: %s\n", key_.c_str(), strerror(errno));
}

}  // namespace tandem::shm
