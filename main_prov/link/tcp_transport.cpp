// The TCP link's transport (tcp_link.h): its connections' sockets, one progress pass over
// them (direct receives, or one epoll_wait beyond a few connections), posted receives, and
// the completions and connection events it hands out.
#include "main_prov/link/tcp_link.h"
#include "main_prov/link/tcp_link_internal.h"

#include "common/fabric_error.h"
#include "common/coarse_clock.h"

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace tandem {

namespace {

// Up to this many connections a pass tries recv() on each; beyond, one epoll_wait tells
// which sockets are readable.
constexpr size_t kDirectPollConnections = 2;
constexpr uint64_t kListenerCheckPasses = 1024;

}  // namespace

TcpTransport::TcpTransport(RemoteKeyResolver *resolver, const TcpLinkConfig &config)
    : resolver_(resolver), config_(config), epfd_(epoll_create1(EPOLL_CLOEXEC)) {
    if (epfd_ < 0) fail(errno, "epoll_create1");
    caps_ = caps_for(config);
}

LinkCaps TcpTransport::caps_for(const TcpLinkConfig &config) {
    LinkCaps caps;
    caps.max_inline = config.max_inline;
    caps.max_send_size = config.max_send_size;
    caps.max_send_now = config.max_send_size;  // (copied only if the socket is full)
    caps.max_rdma_size = size_t{1} << 40;
    caps.max_sge = 16;
    caps.rdma_read = true;
    caps.rdma_write = true;
    caps.remote_access_events = true;
    return caps;
}

TcpTransport::~TcpTransport() {
    if (listen_fd_ >= 0) close(listen_fd_);
    close(epfd_);
}

int TcpTransport::post_recv(void *buf, size_t len, uint64_t wr_id) {
    posted_.push_back({buf, len, wr_id});
    return FI_SUCCESS;
}

// Connection sockets join the epoll set only once there are more of them than a pass reads
// directly (conns_ counts the new one already). A socket in an epoll set costs every segment
// that arrives a callback into epoll, run by the sending side on loopback before its sendmsg
// returns: 3-4% of an 8-byte round trip, measured. (Waiting on a wait set polls the sockets
// themselves: wait_fds.)
void TcpTransport::watch(TcpConnection *conn) {
    if (conns_.size() <= kDirectPollConnections && !conns_watched_) return;
    auto add = [this](TcpConnection *c) {
        if (c->wait_fd() < 0) return;
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.ptr = c;
        epoll_ctl(epfd_, EPOLL_CTL_ADD, c->wait_fd(), &ev);
    };
    if (conns_watched_) {
        add(conn);
        return;
    }
    conns_watched_ = true;
    for (auto &c : conns_) add(c.get());
}

void TcpTransport::unwatch(TcpConnection *conn) {
    if (conns_watched_ && conn->wait_fd() >= 0)
        epoll_ctl(epfd_, EPOLL_CTL_DEL, conn->wait_fd(), nullptr);
}

// One pass over the sockets. With few connections, a recv() on each is the cheapest way to
// find data (one system call per idle connection); the listener and larger sets (whose
// sockets are then in the epoll set: watch) are checked with one epoll_wait.
void TcpTransport::progress(bool check_all) {
    ++passes_;
    // The listener (and every socket) is checked by epoll at least every kListenerCheckPasses
    // passes and, as the clock is read every 16th pass, about every millisecond of a busy
    // poll. (Cheap as it is, the clock read on every pass was a measurable share of a
    // node-local ping-pong.) Passes far apart would stretch that to seconds: who progresses
    // rarely asks for the check (check_all, progress_now).
    int64_t now_ms = last_full_ms_;
    if (passes_ % 16 == 0) now_ms = coarse_now_ms();
    bool full = check_all || conns_.size() > kDirectPollConnections ||
                passes_ % kListenerCheckPasses == 0 || now_ms != last_full_ms_;
    bool direct = !full;
    if (full) last_full_ms_ = now_ms;
    // Only the listener to watch (every peer so far is node-local, or none yet): it waits for
    // the next check rather than cost a system call on every pass.
    if (direct && conns_.empty() && graveyard_.empty()) return;
    if (direct) {
        for (size_t i = 0; i < conns_.size(); ++i) conns_[i]->progress(true);
    } else {
        epoll_event ev[64];
        int n = epoll_wait(epfd_, ev, 64, 0);
        std::vector<TcpConnection *> ready;
        for (int i = 0; i < n; ++i) {
            if (ev[i].data.ptr == nullptr)
                accept_new();
            else
                ready.push_back(static_cast<TcpConnection *>(ev[i].data.ptr));
        }
        for (size_t i = 0; i < conns_.size(); ++i) {
            TcpConnection *c = conns_[i].get();
            bool readable =
                !conns_watched_ || std::find(ready.begin(), ready.end(), c) != ready.end();
            c->progress(readable);
        }
    }
    for (auto &c : graveyard_) c->progress(true);
    if (full && has_strangers()) check_strangers();
}

int TcpTransport::poll(WorkCompletion *wc, int max) {
    if (completions_.empty()) progress();
    int n = 0;
    while (n < max && !completions_.empty()) {
        wc[n++] = completions_.front();
        completions_.pop_front();
    }
    if (completions_.empty() && cm_events_.empty()) {
        // Nothing can name a destroyed connection any more.
        std::erase_if(graveyard_, [](auto &c) { return c->failed(); });
    }
    return n;
}

// Connection events are produced by the progress pass of poll(); this only hands them out.
bool TcpTransport::poll_cm(CmEvent &event) {
    if (cm_events_.empty()) return false;
    event = std::move(cm_events_.front());
    cm_events_.pop_front();
    return true;
}

void TcpTransport::wait_fds(std::vector<WaitFd> &out) const {
    if (listen_fd_ >= 0) out.push_back({listen_fd_, false});
    for (auto &c : conns_)
        if (c->wait_fd() >= 0) out.push_back({c->wait_fd(), c->wants_write()});
}

// A receiver asleep in fi_cq_sread, or on its descriptor, makes no passes; a peer whose sends
// complete on our acknowledgements would wait for them as long as it sleeps.
void TcpTransport::before_sleep() {
    for (auto &c : conns_) c->acknowledge_all();
    // A stalled stranger whose time ran out goes now: a pass of a woken sleeper may not be one
    // that looks at strangers (they are looked at on the passes that check everything).
    if (has_strangers()) {
        const int64_t due = next_timer_ms();
        if (due >= 0 && coarse_now_ms() >= due) check_strangers();
    }
}

int64_t TcpTransport::next_timer_ms() const {
    int64_t due = -1;
    for (auto &c : conns_) {
        if (c->state() != TcpConnection::State::AwaitingRequest || c->request_started_ms() < 0)
            continue;
        const int64_t at = c->request_started_ms() + kRequestTimeoutMs + 1;  // (check_strangers)
        if (due < 0 || at < due) due = at;
    }
    return due;
}

}  // namespace tandem
