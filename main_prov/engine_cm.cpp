// Connection management of the endpoint: a MSG endpoint's connect, accept and shutdown, and
// the link's connection events (an RDM peer connecting on demand, a connection up, refused
// or lost) with what they report on the EQ.
#include "common/log.h"
#include "main_prov/conn_hello.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"

#include <cstring>

namespace tandem {

int Engine::getpeer(void *addr, size_t *addrlen) {
    if (!addrlen) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
    if (type_ != FI_EP_MSG || !msg_peer_ || !msg_peer_->conn) return -FI_ENOTCONN;
    EndpointName name;
    name.ss = msg_peer_->conn->peer_address();
    size_t need = name.length(), have = *addrlen;
    *addrlen = need;
    if (have < need) return -FI_ETOOSMALL;
    if (!addr) return -FI_EINVAL;
    memcpy(addr, &name.ss, need);
    return 0;
}

int Engine::connect(const void *addr, const void *param, size_t paramlen) {
    if (type_ != FI_EP_MSG) return -FI_EOPNOTSUPP;
    if (paramlen && !param) return -FI_EINVAL;
    if (paramlen > cm_data_size_) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
    if (!enabled_) {
        int ret = enable_locked();
        if (ret) return ret;
    }
    if (msg_state_ != MsgState::Idle) return -FI_EISCONN;
    EndpointName dst;
    const void *target = addr ? addr : info_->dest_addr;
    size_t target_len = addr ? sizeof(sockaddr_storage) : info_->dest_addrlen;
    if (!target || !EndpointName::from_bytes(target, target_len, dst)) return -FI_EINVAL;
    std::vector<uint8_t> priv = build_conn_hello(wire::ConnKind::Msg, auth_, {},
                                                 {static_cast<const uint8_t *>(param), paramlen});
    auto peer = std::make_unique<Peer>();
    peer->name = dst;
    // An address the application reserved (setname, or a passive endpoint's) is the
    // connection's own; with port 0 the system picks one, as for any client socket.
    bool reserved = src_name_.port() != 0;
    peer->conn =
        transport_->connect(dst.sa(), dst.length(), priv.data(), priv.size(),
                            reserved ? src_name_.sa() : nullptr, reserved ? src_name_.length() : 0);
    peer->conn->context = peer.get();
    msg_peer_ = peer.get();
    peers_[dst.key()] = std::move(peer);
    msg_state_ = MsgState::Connecting;
    return 0;
}

void Engine::adopt_request(std::unique_ptr<LinkConnection> conn) {
    if (!conn) fail(FI_EINVAL, "connection request already answered");
    auto peer = std::make_unique<Peer>();
    peer->conn = conn.get();
    conn->context = peer.get();
    msg_peer_ = peer.get();
    peers_["passive"] = std::move(peer);
    pending_request_ = std::move(conn);
    msg_state_ = MsgState::Accepting;
}

int Engine::accept(const void *param, size_t paramlen) {
    if (type_ != FI_EP_MSG) return -FI_EOPNOTSUPP;
    if (paramlen && !param) return -FI_EINVAL;
    if (paramlen > cm_data_size_) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
    if (!enabled_) {
        int ret = enable_locked();
        if (ret) return ret;
    }
    if (msg_state_ != MsgState::Accepting || !pending_request_) return -FI_EOPBADSTATE;
    LinkConnection *conn = pending_request_.get();
    transport_->adopt(std::move(pending_request_));
    int ret = conn->accept(param, paramlen);
    if (ret) return ret;
    // The connection is up once accepted: FI_CONNECTED goes to the EQ now, before the
    // application reads it for the next request. Left to this endpoint's next progress, it
    // came after the passive endpoint's next FI_CONNREQ whenever an EQ read progressed the
    // listener first (fabtests' fi_multi_ep waits for FI_CONNECTED of the endpoint it just
    // accepted).
    CmEvent ev;
    while (transport_->poll_cm(ev)) handle_cm_event(ev);
    return 0;
}

int Engine::shutdown(uint64_t flags) {
    if (flags) return -FI_EBADFLAGS;
    if (type_ != FI_EP_MSG) return -FI_EOPNOTSUPP;
    std::lock_guard guard(domain_->lock());
    if (!msg_peer_ || !msg_peer_->conn) return -FI_ENOTCONN;
    if (msg_state_ == MsgState::Shutdown) return 0;
    msg_state_ = MsgState::Shutdown;
    msg_peer_->established = false;
    msg_peer_->conn->disconnect();
    // The endpoint that shuts down gets its FI_SHUTDOWN too, at once (verbs' rdma_disconnect
    // produces a local DISCONNECTED event, libfabric's tcp provider writes the event): an
    // application may wait for it before closing, as fabtests' fi_cm_data does on both
    // sides. The peer's disconnect that follows adds none (the state is no longer
    // Connected).
    if (eq_) {
        fi_eq_cm_entry entry{};
        entry.fid = &self_->fid;
        eq_->post(FI_SHUTDOWN, &entry, sizeof entry);
    }
    return 0;
}

// An EQ read is a connection-management call: the pass it makes polls the link, whatever
// the countdown of a quiet or idle link says (progress_link), or a connection's answer waits
// up to 256 of the EQ's passes.
void Engine::progress_cm() {
    std::lock_guard guard(domain_->lock());
    poll_link_soon();
    progress();
}

// The EQ's sleeper watches the link's descriptors: when one wakes it, the next pass polls the
// link (as wait_fds arranges for a CQ's sleeper).
void Engine::cm_watch(WaitSet &set) {
    std::vector<WaitFd> fds;
    std::lock_guard guard(domain_->lock());
    link_fds(fds);
    for (WaitFd fd : fds) set.add(fd);
}

int Engine::sleep_limit_ms() {
    std::lock_guard guard(domain_->lock());
    return domain_->sleep_limit_ms();
}

// FI_SHUTDOWN of a MSG endpoint waits until the application has read every receive
// completion the endpoint had queued: then, when it sees the event, nothing of the connection
// is left in the CQ. ofi_rxm depends on it: on FI_SHUTDOWN it closes the endpoint and reads
// the CQ, reposting each receive buffer on the endpoint it completed on; a completion read
// after the close was either lost (discarded by close) or reposted on a closed endpoint.
// An application that waits for the event before it reads its CQ gets it after
// kShutdownHold all the same, rather than never.
void Engine::post_held_shutdown() {
    TANDEM_LOCK_ASSERT(domain_->lock().held(),
                       "an endpoint posts to its EQ without the domain lock");
    if (!shutdown_held_) return;
    if (rx_completions_.queued && std::chrono::steady_clock::now() < shutdown_due_) return;
    shutdown_held_ = false;
    fi_eq_cm_entry entry{};
    entry.fid = &self_->fid;
    eq_->post(FI_SHUTDOWN, &entry, sizeof entry);
}

void Engine::handle_cm_event(CmEvent &ev) {
    TANDEM_LOCK_ASSERT(domain_->lock().held(), "connection events handled without the domain lock");
    LinkConnection *conn = ev.conn;
    Peer *peer = static_cast<Peer *>(conn->context);
    switch (ev.type) {
        case CmEventType::ConnectRequest:
            connect_requested(ev);
            return;
        case CmEventType::Established:
            if (peer) connection_up(peer, ev);
            return;
        case CmEventType::Rejected:
        case CmEventType::Unreachable:
            connection_refused(peer, ev);
            return;
        case CmEventType::Disconnected:
            connection_lost(peer, conn);
            return;
    }
}

// RDM: a peer connecting on demand. Its hello names its listening address.
void Engine::connect_requested(CmEvent &ev) {
    LinkConnection *conn = ev.conn;
    EndpointName name;
    std::string why;
    if (type_ != FI_EP_RDM) {
        conn->reject(nullptr, 0);
        return;
    }
    auto hello = accept_conn_hello(ev.private_data, wire::ConnKind::Rdm, auth_, &why);
    if (hello && !EndpointName::from_bytes(hello->name.data(), hello->name.size(), name))
        why = "a malformed endpoint name";
    if (!why.empty()) {
        EndpointName from;
        from.ss = conn->peer_address();
        TANDEM_WARN(FI_LOG_EP_CTRL, "rejecting a connection request from %s: %s\n",
                    from.to_string().c_str(), why.c_str());
        conn->reject(nullptr, 0);
        return;
    }
    auto &slot = peers_[name.key()];
    if (!slot) {
        slot = std::make_unique<Peer>();
        slot->name = name;
    }
    conn->context = slot.get();
    conn->accept(nullptr, 0);
}

void Engine::connection_up(Peer *peer, CmEvent &ev) {
    LinkConnection *conn = ev.conn;
    if (type_ == FI_EP_RDM) {
        // Send on whichever connection with this peer is up first: nothing has been sent on
        // one still pending, so switching keeps our order, and an operation left waiting
        // behind it would sit unsent until the application's next call (manual progress),
        // stalling a peer that already waits for it.
        if (!peer->established) peer->conn = conn;
        if (peer->conn == conn) {
            peer->established = true;
            while (!peer->waiting.empty()) {
                TxOp *op = peer->waiting.front();
                peer->waiting.pop_front();
                op->conn = conn;
                issue_tx(op);
            }
        }
        return;
    }
    // MSG endpoint.
    peer->established = true;
    msg_state_ = MsgState::Connected;
    if (eq_) {
        std::vector<uint8_t> buf(sizeof(fi_eq_cm_entry) + ev.private_data.size());
        auto *entry = reinterpret_cast<fi_eq_cm_entry *>(buf.data());
        entry->fid = &self_->fid;
        entry->info = nullptr;
        if (!ev.private_data.empty())
            memcpy(entry->data, ev.private_data.data(), ev.private_data.size());
        eq_->post(FI_CONNECTED, buf.data(), buf.size());
    }
}

// Rejected or unreachable: either way the application sees FI_ECONNREFUSED.
void Engine::connection_refused(Peer *peer, CmEvent &ev) {
    LinkConnection *conn = ev.conn;
    const int err = FI_ECONNREFUSED;
    if (type_ == FI_EP_MSG) {
        msg_state_ = MsgState::Shutdown;
        if (eq_)
            eq_->post_error(&self_->fid, self_->fid.context, err, ev.private_data.data(),
                            ev.private_data.size());
    }
    // A connection that lost the race to one already up fails nothing.
    if (peer && (peer->conn == conn || !peer->established)) {
        fail_peer(peer, err);
        if (peer->conn == conn) peer->conn = nullptr;
    }
    forget_served(conn);
    transport_->destroy(conn);
}

void Engine::connection_lost(Peer *peer, LinkConnection *conn) {
    if (type_ == FI_EP_MSG) {
        bool was_up = msg_state_ == MsgState::Connected;
        msg_state_ = MsgState::Shutdown;
        if (peer) peer->established = false;
        // Reported once the application has read what the peer sent before it left.
        shutdown_held_ = eq_ && was_up;
        shutdown_due_ = std::chrono::steady_clock::now() + kShutdownHold;
        post_held_shutdown();
        if (peer) fail_peer(peer, FI_ECONNRESET);
        return;
    }
    if (peer) {
        fail_peer(peer, FI_ECONNRESET);
        if (peer->conn == conn) {
            peer->conn = nullptr;
            peer->established = false;
        }
    }
    forget_served(conn);
    transport_->destroy(conn);
}

}  // namespace tandem
