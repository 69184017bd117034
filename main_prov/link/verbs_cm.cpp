// Connection management on the verbs link (verbs_link.h), through rdma_cm: listening,
// connecting (address, route, queue pair, request), accepting and rejecting with private data,
// disconnecting, and the rdma_cm events that move a connection between these states.
#include "main_prov/link/verbs_link.h"
#include "main_prov/link/verbs_link_internal.h"

#include "common/log.h"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>

namespace tandem {

using verbs_detail::copy_addr;
using verbs_detail::fi_errno_of;
using verbs_detail::kMaxConnectData;

namespace {

// IB CM rejection reason "consumer defined": the peer's application refused (rdma_reject),
// as opposed to nobody listening (invalid service id) or a timeout.
constexpr int kConsumerReject = 28;
// What a REP and a REJ carry (see kMaxConnectData).
constexpr size_t kMaxAcceptData = 196 - 1;
constexpr size_t kMaxRejectData = 148 - 1;

std::vector<uint8_t> framed(const void *priv, size_t len) {
    std::vector<uint8_t> out(1 + len);
    out[0] = static_cast<uint8_t>(len);
    if (len) memcpy(out.data() + 1, priv, len);
    return out;
}

std::vector<uint8_t> unframed(const void *data, size_t len) {
    const auto *p = static_cast<const uint8_t *>(data);
    if (!p || len == 0 || p[0] > len - 1) return {};
    return std::vector<uint8_t>(p + 1, p + 1 + p[0]);
}

rdma_conn_param conn_param(const VerbsDevice &dev, const void *priv, size_t len) {
    rdma_conn_param p{};
    p.private_data = priv;
    p.private_data_len = static_cast<uint8_t>(len);
    // RDMA reads in flight: the device's limit, enough for rendezvous pipelines.
    int rd = std::min({dev.attr().max_qp_rd_atom, dev.attr().max_qp_init_rd_atom, 16});
    p.responder_resources = p.initiator_depth = static_cast<uint8_t>(std::max(rd, 1));
    p.retry_count = dev.config().retry;
    p.rnr_retry_count = dev.config().rnr_retry;
    return p;
}

}  // namespace

int VerbsConnection::create_qp() {
    VerbsDevice &dev = transport_->device();
    if (id_->verbs != dev.context()) {
        TANDEM_WARN(FI_LOG_EP_CTRL, "a connection reached %s through another RDMA device\n",
                    dev.name().c_str());
        return -FI_EADDRNOTAVAIL;
    }
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = transport_->cq_;
    a.srq = transport_->srq_;
    a.qp_type = IBV_QPT_RC;
    a.sq_sig_all = 1;
    a.cap.max_send_wr = std::min<uint32_t>(dev.config().sq_depth, dev.attr().max_qp_wr);
    a.cap.max_send_sge = dev.caps().max_sge;
    a.cap.max_recv_wr = 1;
    a.cap.max_recv_sge = 1;
    a.cap.max_inline_data = dev.config().max_inline;
    ibv_qp_init_attr want = a;
    if (transport_->api_.create_qp(id_, dev.pd(), &a) != 0) {
        // Some devices offer no inline data at all.
        a = want;
        a.cap.max_inline_data = 0;
        if (transport_->api_.create_qp(id_, dev.pd(), &a) != 0) {
            int err = errno;
            TANDEM_WARN(FI_LOG_EP_CTRL, "%s: rdma_create_qp: %s\n", dev.name().c_str(),
                        strerror(err));
            return fi_errno_of(err);
        }
    }
    qp_ = id_->qp;
    max_inline_ = a.cap.max_inline_data;
    max_sge_ = std::max<uint32_t>(a.cap.max_send_sge, 1);
    sq_depth_ = std::max<uint32_t>(a.cap.max_send_wr, 1);
    transport_->watch_qp(this);
    return 0;
}

int VerbsConnection::accept(const void *priv, size_t len) {
    if (state_ != State::RequestReceived) return -FI_EINVAL;
    if (len > kMaxAcceptData) return -FI_EINVAL;
    if (int ret = create_qp()) return ret;
    std::vector<uint8_t> data = framed(priv, len);
    rdma_conn_param p = conn_param(transport_->device(), data.data(), data.size());
    if (transport_->api_.accept(id_, &p) != 0) return fi_errno_of(errno);
    // Accepted is established for the protocol (as on the TCP link, and as fabtests expect
    // of fi_accept): what it posts before the peer's RTU makes the queue pair ready to send
    // waits here, deferred, and goes when rdma_cm says ESTABLISHED.
    state_ = State::Accepting;
    transport_->report({CmEventType::Established, this, {}});
    return 0;
}

// An owner's reject gives the connection up: nothing above names it again, and the link lets
// it go at its next pass (bury_rejected). disconnect and destroy refuse a request through
// send_reject, as the owner still holds the connection then.
int VerbsConnection::reject(const void *priv, size_t len) {
    int ret = send_reject(priv, len);
    if (ret == 0) {
        rejected_ = true;
        transport_->rejected_waiting_ = true;
    }
    return ret;
}

int VerbsConnection::send_reject(const void *priv, size_t len) {
    if (state_ != State::RequestReceived) return -FI_EINVAL;
    if (len > kMaxRejectData) return -FI_EINVAL;
    std::vector<uint8_t> data = framed(priv, len);
    if (transport_->api_.reject(id_, data.data(), static_cast<uint8_t>(data.size())) != 0)
        return fi_errno_of(errno);
    state_ = State::Closed;
    reported_down_ = true;  // the protocol knows: it rejected
    return 0;
}

void VerbsConnection::disconnect() {
    switch (state_) {
        case State::RequestReceived:
            send_reject(nullptr, 0);
            return;
        case State::Resolving:
            fail(nullptr);
            return;
        case State::Connecting:
        case State::Accepting:
        case State::Established:
            // Orderly: what was posted goes first (rdma_disconnect moves the queue pair to the
            // error state, which would flush it), as a TCP FIN follows the data before it.
            state_ = State::Closing;
            if (!outstanding_.empty() || !deferred_.empty())
                disconnect_pending_ = true;
            else
                transport_->api_.disconnect(id_);
            return;
        case State::Closing:
        case State::Closed:
            return;
    }
}

int VerbsTransport::listen(const sockaddr *addr, socklen_t, int backlog) {
    if (status_) return status_;
    if (listen_id_) return -FI_EINVAL;
    if (api_.create_id(channel_, &listen_id_, nullptr, RDMA_PS_TCP) != 0) return fi_errno_of(errno);
    auto undo = [&](int err) {
        api_.destroy_id(listen_id_);
        listen_id_ = nullptr;
        return err;
    };
    if (api_.bind_addr(listen_id_, const_cast<sockaddr *>(addr)) != 0)
        return undo(fi_errno_of(errno));
    if (listen_id_->verbs && listen_id_->verbs != device_->context())
        return undo(-FI_EADDRNOTAVAIL);  // the address belongs to another device
    if (api_.listen(listen_id_, backlog) != 0) return undo(fi_errno_of(errno));
    return 0;
}

sockaddr_storage VerbsTransport::name() const {
    return listen_id_ ? copy_addr(rdma_get_local_addr(listen_id_)) : sockaddr_storage{};
}

LinkConnection *VerbsTransport::connect(const sockaddr *dst, socklen_t, const void *priv,
                                        size_t priv_len, const sockaddr *src, socklen_t) {
    rdma_cm_id *id = nullptr;
    if (status_ == 0 && api_.create_id(channel_, &id, nullptr, RDMA_PS_TCP) != 0) id = nullptr;
    auto conn = std::make_unique<VerbsConnection>(this, id, VerbsConnection::State::Resolving);
    VerbsConnection *c = conn.get();
    conns_.push_back(std::move(conn));
    if (!id) {
        c->fail("no rdma_cm id");
        return c;
    }
    if (priv_len > kMaxConnectData) {
        TANDEM_WARN(FI_LOG_EP_CTRL,
                    "%s: %zu bytes of connection data, rdma_cm carries at most %zu\n",
                    device_->name().c_str(), priv_len, kMaxConnectData);
        c->fail(nullptr);
        return c;
    }
    c->connect_priv_ = framed(priv, priv_len);
    if (api_.resolve_addr(id, const_cast<sockaddr *>(src), const_cast<sockaddr *>(dst),
                          device_->config().resolve_timeout_ms) != 0)
        c->fail(strerror(errno));
    ++transitional_;
    // Take the resolution as far as it has come: where rdma_cm answers at once, the request
    // leaves within this call, as a TCP connect's SYN does, not at the next progress call.
    read_cm_events();
    return c;
}

void VerbsTransport::process_cm_event(rdma_cm_event *ev) {
    using State = VerbsConnection::State;
    rdma_cm_id *id = ev->id;
    auto private_data = [&] {
        return unframed(ev->param.conn.private_data, ev->param.conn.private_data_len);
    };
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
        auto conn = std::make_unique<VerbsConnection>(this, id, State::RequestReceived);
        VerbsConnection *c = conn.get();
        conns_.push_back(std::move(conn));
        report({CmEventType::ConnectRequest, c, private_data()});
        return;
    }
    if (ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
        TANDEM_WARN(FI_LOG_EP_CTRL, "%s: the RDMA device was removed\n", device_->name().c_str());
        for (auto &c : conns_) c->fail(nullptr);
        status_ = -FI_ENODEV;
        return;
    }
    if (id == listen_id_) return;
    VerbsConnection *c = find(static_cast<LinkConnection *>(id->context));
    if (!c) return;  // destroyed or handed to another transport
    switch (ev->event) {
        case RDMA_CM_EVENT_ADDR_RESOLVED:
            if (api_.resolve_route(id, device_->config().resolve_timeout_ms) != 0)
                c->fail(strerror(errno));
            return;
        case RDMA_CM_EVENT_ROUTE_RESOLVED: {
            if (c->state_ != State::Resolving) return;
            if (c->create_qp() != 0) {
                c->fail(nullptr);
                return;
            }
            rdma_conn_param p =
                conn_param(*device_, c->connect_priv_.data(), c->connect_priv_.size());
            if (api_.connect(id, &p) != 0) {
                c->fail(strerror(errno));
                return;
            }
            c->state_ = State::Connecting;
            return;
        }
        case RDMA_CM_EVENT_ESTABLISHED:
            c->ready_ = c->state_ != State::Closed;
            deferred_work_ = true;
            if (c->state_ == State::Accepting) c->state_ = State::Established;  // reported
            if (c->state_ != State::Connecting) return;
            c->state_ = State::Established;
            report({CmEventType::Established, c, private_data()});
            return;
        case RDMA_CM_EVENT_REJECTED:
            if (c->state_ == State::Closed) return;
            c->state_ = State::Closed;
            c->reported_down_ = true;
            if (ev->status == kConsumerReject)
                report({CmEventType::Rejected, c, private_data()});
            else
                report({CmEventType::Unreachable, c, {}});
            if (c->outstanding_.empty()) c->flush_deferred();
            return;
        case RDMA_CM_EVENT_ADDR_ERROR:
        case RDMA_CM_EVENT_ROUTE_ERROR:
        case RDMA_CM_EVENT_UNREACHABLE:
        case RDMA_CM_EVENT_CONNECT_ERROR:
            c->fail(nullptr);
            return;
        case RDMA_CM_EVENT_DISCONNECTED:
            // What the peer sent before it disconnected is in the CQ already: collect it
            // first, so that the protocol reads it before it hears of the disconnection.
            poll_cq();
            if (c->state_ == State::Closing) c->state_ = State::Established;  // as fail() expects
            c->fail(nullptr);
            return;
        default:  // TIMEWAIT_EXIT, ADDR_CHANGE, ...
            return;
    }
}

void VerbsTransport::read_cm_events() {
    rdma_cm_event *ev = nullptr;
    while (channel_ && api_.get_cm_event(channel_, &ev) == 0) {
        process_cm_event(ev);
        api_.ack_cm_event(ev);
    }
}

// Rejected connections go to the graveyard, where they wait for nothing (no work request was
// ever posted on them) and are reaped with the others.
void VerbsTransport::bury_rejected() {
    rejected_waiting_ = false;
    for (auto it = conns_.begin(); it != conns_.end();) {
        if (!(*it)->rejected_) {
            ++it;
            continue;
        }
        (*it)->context = nullptr;
        graveyard_.push_back(std::move(*it));
        it = conns_.erase(it);
    }
}

}  // namespace tandem
