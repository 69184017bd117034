// Connection management on the TCP link (tcp_link.h): the connection request and its answer
// (CmRequest, CmAccept, CmReject frames), orderly disconnection, the settings of a connected
// socket, and the connections a transport makes, adopts, releases and destroys.
#include "main_prov/link/tcp_link.h"
#include "main_prov/link/tcp_link_internal.h"

#include "common/fabric_error.h"
#include "common/log.h"
#include "common/test_hook.h"

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace tandem {

void set_socket_options(int fd, const TcpLinkConfig &config) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (config.socket_buffer) {
        int size = static_cast<int>(config.socket_buffer);
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    }
    // A peer host that vanishes (power, cable, a partition) sends no reset: without a bound
    // the kernel retransmits for about 15 minutes, and an idle connection, on which the other
    // side may still owe us a rendezvous read or an acknowledgement, never fails at all. Data
    // unacknowledged for timeout_ms fails the socket (ETIMEDOUT); an idle one is probed from
    // timeout/2 on, and the same bound applies to the probes (Linux counts TCP_USER_TIMEOUT
    // against unanswered keepalives too). The peer's kernel answers both whatever its
    // application is doing, so a process that simply makes no progress calls is not failed.
    if (config.timeout_ms) {
        unsigned timeout = config.timeout_ms;
        int idle = std::max(1u, timeout / 2000), interval = std::max(1u, timeout / 4000), count = 4;
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout, sizeof timeout);
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    }
}

namespace {

// The two ends of a connected socket are in this host (and network namespace): the peer is
// a loopback address, or the kernel gave the connection the peer's own address as its source.
bool same_host(int fd) {
    sockaddr_storage self{}, peer{};
    socklen_t self_len = sizeof self, peer_len = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&self), &self_len) != 0 ||
        getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &peer_len) != 0 ||
        self.ss_family != peer.ss_family)
        return false;
    if (peer.ss_family == AF_INET) {
        auto &a = reinterpret_cast<const sockaddr_in &>(self).sin_addr;
        auto &b = reinterpret_cast<const sockaddr_in &>(peer).sin_addr;
        return (ntohl(b.s_addr) >> 24) == IN_LOOPBACKNET || a.s_addr == b.s_addr;
    }
    if (peer.ss_family == AF_INET6) {
        auto &a = reinterpret_cast<const sockaddr_in6 &>(self).sin6_addr;
        auto &b = reinterpret_cast<const sockaddr_in6 &>(peer).sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(&b) || memcmp(&a, &b, sizeof a) == 0;
    }
    return false;
}

}  // namespace

void TcpConnection::send_cm_request(const void *priv, size_t len) {
    wire::TcpCmHello hello{wire::kTcpMagic, wire::kTcpVersion, 0, static_cast<uint32_t>(len), 0};
    iovec iov[2] = {{&hello, sizeof hello}, {const_cast<void *>(priv), len}};
    queue_frame(make_frame(wire::TcpOp::CmRequest, iov, nullptr, len ? 2 : 1, true));
}

int TcpConnection::accept(const void *priv, size_t len) {
    if (state_ != State::RequestReceived) return -FI_EINVAL;
    if (len > wire::kMaxCmPrivate) return -FI_EINVAL;
    iovec iov{const_cast<void *>(priv), len};
    queue_frame(make_frame(wire::TcpOp::CmAccept, &iov, nullptr, len ? 1 : 0, true));
    state_ = State::Established;
    flush_send();
    transport_->push_cm({CmEventType::Established, this, {}});
    return FI_SUCCESS;
}

int TcpConnection::reject(const void *priv, size_t len) {
    if (state_ != State::RequestReceived) return -FI_EINVAL;
    if (len > wire::kMaxCmPrivate) return -FI_EINVAL;
    iovec iov{const_cast<void *>(priv), len};
    queue_frame(make_frame(wire::TcpOp::CmReject, &iov, nullptr, len ? 1 : 0, true));
    disconnect_requested_ = true;
    reported_down_ = true;  // the application already knows: it rejected
    rejected_ = true;
    transport_->note_rejected();
    flush_send();
    return FI_SUCCESS;
}

void TcpConnection::disconnect() {
    if (state_ == State::Closed || disconnect_requested_) return;
    if (state_ == State::Established) {
        queue_frame(make_frame(wire::TcpOp::Disconnect, nullptr, nullptr, 0, false));
        flush_send();
    }
    disconnect_requested_ = true;
    reported_down_ = true;  // the local side asked for it: no Disconnected event to itself
    if (state_ != State::Established && state_ != State::RequestReceived)
        fail_connection(nullptr, 0);
}

void TcpConnection::handle_cm_frame() {
    auto op = static_cast<wire::TcpOp>(cur_.op);
    if (op == wire::TcpOp::CmRequest) {
        wire::TcpCmHello hello{};
        if (state_ != State::AwaitingRequest || cm_payload_.size() < sizeof hello) {
            fail_connection("unexpected connection request", EPROTO);
            return;
        }
        memcpy(&hello, cm_payload_.data(), sizeof hello);
        if (hello.magic != wire::kTcpMagic || hello.version != wire::kTcpVersion ||
            hello.priv_len != cm_payload_.size() - sizeof hello) {
            fail_connection("connection request from an incompatible peer", EPROTO);
            return;
        }
        stop_at("link.request_received");
        state_ = State::RequestReceived;
        unannounced_ = false;
        transport_->push_cm(
            {CmEventType::ConnectRequest, this,
             std::vector<uint8_t>(cm_payload_.begin() + sizeof hello, cm_payload_.end())});
        return;
    }
    if (state_ != State::RequestSent) {
        fail_connection("unexpected connection answer", EPROTO);
        return;
    }
    if (op == wire::TcpOp::CmAccept) {
        state_ = State::Established;
        transport_->push_cm({CmEventType::Established, this, cm_payload_});
        return;
    }
    // CmReject
    transport_->push_cm({CmEventType::Rejected, this, cm_payload_});
    reported_down_ = true;
    fail_connection(nullptr, 0);
}

LinkConnection *TcpTransport::connect(const sockaddr *dst, socklen_t len, const void *priv,
                                      size_t priv_len, const sockaddr *src, socklen_t src_len) {
    if (priv_len > wire::kMaxCmPrivate + 64) fail(FI_EINVAL, "connection data too large");
    int fd = socket(dst->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) fail(errno, "socket");
    set_socket_options(fd, config_);
    if (src) {
        // The address was reserved by the application (a passive endpoint's, or setname):
        // SO_REUSEADDR lets the connection take it while a socket that held it lingers.
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, src, src_len) != 0) {
            int err = errno;
            ::close(fd);
            fail(err, "cannot bind the connection to its source address");
        }
    }
    auto conn = std::make_unique<TcpConnection>(this, fd, TcpConnection::State::Connecting);
    if (::connect(fd, dst, len) < 0 && errno != EINPROGRESS) {
        int err = errno;
        TANDEM_INFO(FI_LOG_EP_CTRL, "connect: %s\n", strerror(err));
        // Report it like a late failure so callers have one path.
        conns_.push_back(std::move(conn));
        conns_.back()->send_cm_request(priv, priv_len);
        conns_.back()->progress(false);
        watch(conns_.back().get());
        return conns_.back().get();
    }
    conn->send_cm_request(priv, priv_len);
    conns_.push_back(std::move(conn));
    watch(conns_.back().get());
    return conns_.back().get();
}

void TcpTransport::adopt(std::unique_ptr<LinkConnection> conn) {
    auto *tcp = static_cast<TcpConnection *>(conn.release());
    tcp->set_transport(this);
    conns_.emplace_back(tcp);
    watch(tcp);
}

std::unique_ptr<LinkConnection> TcpTransport::release(LinkConnection *conn) {
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {
        if (it->get() == conn) {
            unwatch(it->get());
            std::unique_ptr<LinkConnection> out(it->release());
            conns_.erase(it);
            return out;
        }
    }
    return nullptr;
}

void TcpTransport::disconnect_all() {
    for (auto &c : conns_) c->disconnect();
}

void TcpTransport::abort_all() {
    for (auto &c : conns_) c->abort();
    for (auto &c : graveyard_) c->abort();
}

bool TcpTransport::drain(int timeout_ms) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        bool busy = false;
        for (auto &c : conns_) busy |= !c->failed();
        for (auto &c : graveyard_) busy |= !c->failed();
        if (!busy) return true;
        if (std::chrono::steady_clock::now() >= end) return false;
        progress();
    }
}

void TcpTransport::destroy(LinkConnection *conn) {
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {
        if (it->get() != conn) continue;
        conn->context = nullptr;
        (*it)->disconnect();
        // Completions already queued for it still name it: keep it until they are read.
        graveyard_.push_back(std::move(*it));
        conns_.erase(it);
        break;
    }
}

// Congestion control matters where there is a network to share. Between two sockets of one
// host there is none, and a pacing algorithm only costs: under BBR (the system default on
// some distributions) every burst waits for a pacing timer, and 1 MiB transfers over loopback
// measured half as fast as under reno. So "auto" picks reno there (which the kernel lets any
// process choose) and leaves connections to other hosts to the system's choice.
void TcpTransport::choose_congestion(int fd) {
    const std::string &setting = config_.congestion;
    if (setting.empty() || setting == "system") return;
    const bool automatic = setting == "auto";
    if (automatic && !same_host(fd)) return;
    const std::string name = automatic ? "reno" : setting;
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                   static_cast<socklen_t>(name.size())) == 0)
        return;
    int err = errno;
    if (automatic || congestion_refused_) {
        TANDEM_DEBUG(FI_LOG_EP_CTRL, "congestion control %s refused: %s\n", name.c_str(),
                     strerror(err));
        return;
    }
    congestion_refused_ = true;
    TANDEM_WARN(FI_LOG_EP_CTRL,
                "congestion control %s refused (%s): links keep the system's default; see "
                "/proc/sys/net/ipv4/tcp_allowed_congestion_control\n",
                name.c_str(), strerror(err));
}

}  // namespace tandem
