// The TCP link's listener (tcp_link.h): the listening socket, the connections it accepts, and
// the check that keeps strangers (accepted, not yet identified) from holding sockets for ever.
#include "main_prov/link/tcp_link.h"
#include "main_prov/link/tcp_link_internal.h"

#include "common/coarse_clock.h"

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace tandem {

int TcpTransport::listen(const sockaddr *addr, socklen_t len, int backlog) {
    int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, addr, len) < 0 || ::listen(fd, backlog) < 0) {
        int err = errno;
        close(fd);
        return err == EADDRINUSE ? -FI_EADDRINUSE : -err;
    }
    listen_fd_ = fd;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
    return FI_SUCCESS;
}

sockaddr_storage TcpTransport::name() const {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (listen_fd_ >= 0) getsockname(listen_fd_, reinterpret_cast<sockaddr *>(&ss), &len);
    return ss;
}

void TcpTransport::accept_new() {
    if (listen_fd_ < 0) return;
    for (;;) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR) continue;
            return;
        }
        set_socket_options(fd, config_);
        choose_congestion(fd);
        conns_.push_back(
            std::make_unique<TcpConnection>(this, fd, TcpConnection::State::AwaitingRequest));
        watch(conns_.back().get());
        ++strangers_;
        check_strangers();
    }
}

void TcpTransport::check_strangers() {
    size_t awaiting = 0;
    size_t rejected_open = 0;
    TcpConnection *oldest = nullptr;
    int64_t now = -1;
    for (auto &c : conns_) {
        if (c->rejected() && !c->failed()) ++rejected_open;
        if (c->state() != TcpConnection::State::AwaitingRequest) continue;
        if (c->request_started_ms() >= 0) {
            if (now < 0) now = coarse_now_ms();
            if (now - c->request_started_ms() > kRequestTimeoutMs) {
                c->close_stranger("connection request not completed in time (slowloris?)");
                continue;
            }
        }
        ++awaiting;
        if (!oldest || c->accepted_ms() < oldest->accepted_ms()) oldest = c.get();
    }
    if (awaiting > kMaxAwaiting && oldest) {
        oldest->close_stranger("too many connections waiting to identify themselves");
        --awaiting;
    }
    strangers_ = awaiting;
    rejected_open_ = rejected_open;
    // What failed before its request was reported, or after it was rejected, is nobody's: it
    // goes now. (Nothing refers to it: no work request was posted on it, no event is queued.)
    std::erase_if(conns_, [](const std::unique_ptr<TcpConnection> &c) {
        return c->failed() && c->unowned();
    });
}

}  // namespace tandem
