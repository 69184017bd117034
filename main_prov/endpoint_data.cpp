// Data path of the endpoint: sends, receives, tag matching, rendezvous, RMA, completions.
//
// A message of at most eager_limit bytes travels as one link send (ProtoHeader + payload)
// into a posted link buffer and is copied into the matching receive (or kept as unexpected).
// A larger one sends a ProtoHeader + RtsBody naming the source buffers under internal keys;
// the receiver, once matched, RDMA-reads straight into the application's buffer and answers
// with a Fin, which completes the send. Nothing larger than one link buffer is ever held at
// the receiver for a message nobody asked for.
#include "common/iov.h"
#include "common/log.h"
#include "common/test_hook.h"
#include "hmem/atomic.h"
#include "main_prov/av.h"
#include "main_prov/cntr.h"
#include "main_prov/config.h"
#include "main_prov/conn_hello.h"
#include "main_prov/domain.h"
#include "main_prov/endpoint.h"
#include "main_prov/endpoint_alias.h"
#include "main_prov/endpoint_wr.h"
#include "main_prov/interfaces.h"
#include "main_prov/local_path.h"
#include "main_prov/peer_rx_queue.h"
#include "peer/peer_abi.h"

#include <algorithm>
#include <cstring>

namespace tandem {

namespace {

// A protocol message of our own (Fin, DeliveryAck, an atomic's answer with its values).
struct ControlMsg {
    wire::ProtoHeader hdr;
    uint8_t body[std::max(sizeof(wire::RtsBody), sizeof(wire::AtomicRespBody) + atomic::kMaxBytes)];
};

int error_of(WcStatus s) {
    switch (s) {
        case WcStatus::Success:
            return 0;
        case WcStatus::RemoteAccessError:
            return FI_EACCES;
        case WcStatus::RemoteInvalid:
            return FI_EINVAL;
        case WcStatus::RemoteOpError:
        case WcStatus::LocalFault:
            return FI_EIO;
        case WcStatus::Flushed:
            return FI_ECONNRESET;
        case WcStatus::Timeout:
            return FI_ETIMEDOUT;
    }
    return FI_EIO;
}

}  // namespace

// ------------------------------------------------------------------------------------------
// The Short cell into the peer's ring ourselves (peer::LocalLane), unless cells of the twin's
// wait for room there (ours would overtake them) or the ring is full.
[[gnu::always_inline]] inline ssize_t Endpoint::send_by_lane(peer::LocalLane *lane, const void *buf,
                                                             size_t len, void *context,
                                                             uint64_t flags, uint64_t tag,
                                                             uint64_t data, bool tagged) {
    if (*lane->blocked) return kNotTaken;
    void *slot = lane->ring->try_reserve(lane->producer, *lane->view);
    if (!slot) return kNotTaken;
    stop_at("local.ring_reserved");
    write_short(static_cast<uint8_t *>(slot), *lane->line,
                uint8_t((tagged ? wire::kLocalTagged : 0) |
                        ((flags & FI_REMOTE_CQ_DATA) ? wire::kLocalCqData : 0)),
                buf, len, tag, data);
    lane->ring->publish(slot);
    if (lane->view->wake) lane->wake(lane);
    if (send_cntr_) send_cntr_->inc();
    if (tx_cq_ && tx_reports(flags))
        tx_cq_->push(context, FI_SEND | (tagged ? FI_TAGGED : FI_MSG), 0, nullptr, 0, 0,
                     FI_ADDR_NOTAVAIL, nullptr);
    return 0;
}

// The small sends of issue_send, for the calls that name one buffer, before any of the
// general path's work (a request, its lists, the memory query): what they need is checked
// here, and anything else (a device buffer, a peer whose path is not known yet, a full ring
// or socket, earlier operations still queued, flags that ask for more than these give) goes
// the general way, which reports errors and keeps the order.
[[gnu::always_inline]] inline ssize_t Endpoint::send_direct(const void *buf, size_t len, void *desc,
                                                            fi_addr_t dest, void *context,
                                                            uint64_t flags, uint64_t tag,
                                                            uint64_t data, bool tagged) {
    constexpr uint64_t kNotDirect = FI_TRIGGER | FI_DELIVERY_COMPLETE | FI_PEER_TRANSFER;
    if ((flags & kNotDirect) || len > direct_limit_ || ((flags & FI_INJECT) && len > inject_size_))
        return kNotTaken;
    std::lock_guard guard(domain_->lock());
    if (!enabled_ || !(caps_ & (tagged ? FI_TAGGED : FI_MSG)) ||
        tx_outstanding_ + tx_triggered_ >= info_->tx_attr->size)
        return kNotTaken;
    if ((caps_ & FI_HMEM) &&
        (desc ? !peer::mem_of(desc).on_host()
              : (flags & FI_INJECT) && hmem::Registry::instance().any_device()))
        return kNotTaken;
    Peer *peer = peer_of(dest);
    if (peer->lane ||
        (peer->route == Peer::Route::Undecided && goes_local(peer, dest) && peer->lane)) {
        if (local_tx_pending_ || len > lane_limit_) return kNotTaken;
        return send_by_lane(peer->lane, buf, len, context, flags, tag, data, tagged);
    }
    // Over the link only at the level the general path reports at once (FI_INJECT_COMPLETE:
    // the bytes are the link's), behind nothing of this peer's.
    if (peer->route == Peer::Route::Local || !peer->established || !peer->conn ||
        !peer->held.empty() || (flags & FI_TRANSMIT_COMPLETE) || len > link_direct_limit_)
        return kNotTaken;
    return send_by_link(peer, buf, len, context, flags, tag, data, tagged);
}

// Entry points: the fi_msg / fi_tagged / fi_rma calls map onto three internal posts. The
// one-buffer calls are always inline: each is called only from its DataCall trampoline, and
// out of line its seven or eight arguments went through the stack (a tenth of fi_tsend).

[[gnu::always_inline]] inline ssize_t Endpoint::msg_recv(const OpDefaults &d, void *buf, size_t len,
                                                         void *desc, fi_addr_t src, void *context) {
    if (ssize_t ret = recv_one(buf, len, desc, src, 0, 0, context, d.rx, false); ret != kNotTaken)
        return ret;
    iovec iov{buf, len};
    return post_recv({&iov, &desc, 1, src, context, d.rx, 0, 0, false});
}
ssize_t Endpoint::msg_recvv(const OpDefaults &d, const iovec *iov, void **desc, size_t count,
                            fi_addr_t src, void *context) {
    return post_recv({iov, desc, count, src, context, d.rx, 0, 0, false});
}
ssize_t Endpoint::msg_recvmsg(const OpDefaults &, const fi_msg *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return post_recv({msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context,
                      flags & ~kNoCompletion, 0, 0, false});
}
[[gnu::always_inline]] inline ssize_t Endpoint::msg_send(const OpDefaults &d, const void *buf,
                                                         size_t len, void *desc, fi_addr_t dest,
                                                         void *context) {
    if (ssize_t ret = send_direct(buf, len, desc, dest, context, d.tx, 0, 0, false);
        ret != kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return post_send({&iov, &desc, 1, dest, context, d.tx, 0, 0, false});
}
ssize_t Endpoint::msg_sendv(const OpDefaults &d, const iovec *iov, void **desc, size_t count,
                            fi_addr_t dest, void *context) {
    return post_send({iov, desc, count, dest, context, d.tx, 0, 0, false});
}
ssize_t Endpoint::msg_sendmsg(const OpDefaults &, const fi_msg *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return post_send({msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context,
                      flags & ~kNoCompletion, 0, msg->data, false});
}
[[gnu::always_inline]] inline ssize_t Endpoint::msg_inject(const OpDefaults &, const void *buf,
                                                           size_t len, fi_addr_t dest) {
    if (ssize_t ret =
            send_direct(buf, len, nullptr, dest, nullptr, FI_INJECT | kNoCompletion, 0, 0, false);
        ret != kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return post_send({&iov, nullptr, 1, dest, nullptr, FI_INJECT | kNoCompletion, 0, 0, false});
}
[[gnu::always_inline]] inline ssize_t Endpoint::msg_senddata(const OpDefaults &d, const void *buf,
                                                             size_t len, void *desc, uint64_t data,
                                                             fi_addr_t dest, void *context) {
    if (ssize_t ret =
            send_direct(buf, len, desc, dest, context, d.tx | FI_REMOTE_CQ_DATA, 0, data, false);
        ret != kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return post_send({&iov, &desc, 1, dest, context, d.tx | FI_REMOTE_CQ_DATA, 0, data, false});
}
[[gnu::always_inline]] inline ssize_t Endpoint::msg_injectdata(const OpDefaults &, const void *buf,
                                                               size_t len, uint64_t data,
                                                               fi_addr_t dest) {
    if (ssize_t ret = send_direct(buf, len, nullptr, dest, nullptr,
                                  FI_INJECT | FI_REMOTE_CQ_DATA | kNoCompletion, 0, data, false);
        ret != kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return post_send({&iov, nullptr, 1, dest, nullptr,
                      FI_INJECT | FI_REMOTE_CQ_DATA | kNoCompletion, 0, data, false});
}

[[gnu::always_inline]] inline ssize_t Endpoint::tag_recv(const OpDefaults &d, void *buf, size_t len,
                                                         void *desc, fi_addr_t src, uint64_t tag,
                                                         uint64_t ignore, void *context) {
    if (ssize_t ret = recv_one(buf, len, desc, src, tag, ignore, context, d.rx, true);
        ret != kNotTaken)
        return ret;
    iovec iov{buf, len};
    return post_recv({&iov, &desc, 1, src, context, d.rx, tag, ignore, true});
}
ssize_t Endpoint::tag_recvv(const OpDefaults &d, const iovec *iov, void **desc, size_t count,
                            fi_addr_t src, uint64_t tag, uint64_t ignore, void *context) {
    return post_recv({iov, desc, count, src, context, d.rx, tag, ignore, true});
}
ssize_t Endpoint::tag_recvmsg(const OpDefaults &, const fi_msg_tagged *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    RecvArgs a{msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context,
               flags,        msg->tag,  msg->ignore,    true};
    if (flags & (FI_PEEK | FI_CLAIM)) {
        std::lock_guard guard(domain_->lock());
        check_rx_ready(FI_TAGGED);
        progress();
        return peek_or_claim_on(*rx_, this, caps_, a);
    }
    return post_recv(a);
}
[[gnu::always_inline]] inline ssize_t Endpoint::tag_send(const OpDefaults &d, const void *buf,
                                                         size_t len, void *desc, fi_addr_t dest,
                                                         uint64_t tag, void *context) {
    if (ssize_t ret = send_direct(buf, len, desc, dest, context, d.tx, tag, 0, true);
        ret != kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return post_send({&iov, &desc, 1, dest, context, d.tx, tag, 0, true});
}
ssize_t Endpoint::tag_sendv(const OpDefaults &d, const iovec *iov, void **desc, size_t count,
                            fi_addr_t dest, uint64_t tag, void *context) {
    return post_send({iov, desc, count, dest, context, d.tx, tag, 0, true});
}
ssize_t Endpoint::tag_sendmsg(const OpDefaults &, const fi_msg_tagged *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return post_send({msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context,
                      flags & ~kNoCompletion, msg->tag, msg->data, true});
}
[[gnu::always_inline]] inline ssize_t Endpoint::tag_inject(const OpDefaults &, const void *buf,
                                                           size_t len, fi_addr_t dest,
                                                           uint64_t tag) {
    if (ssize_t ret =
            send_direct(buf, len, nullptr, dest, nullptr, FI_INJECT | kNoCompletion, tag, 0, true);
        ret != kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return post_send({&iov, nullptr, 1, dest, nullptr, FI_INJECT | kNoCompletion, tag, 0, true});
}
[[gnu::always_inline]] inline ssize_t Endpoint::tag_senddata(const OpDefaults &d, const void *buf,
                                                             size_t len, void *desc, uint64_t data,
                                                             fi_addr_t dest, uint64_t tag,
                                                             void *context) {
    if (ssize_t ret =
            send_direct(buf, len, desc, dest, context, d.tx | FI_REMOTE_CQ_DATA, tag, data, true);
        ret != kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return post_send({&iov, &desc, 1, dest, context, d.tx | FI_REMOTE_CQ_DATA, tag, data, true});
}
[[gnu::always_inline]] inline ssize_t Endpoint::tag_injectdata(const OpDefaults &, const void *buf,
                                                               size_t len, uint64_t data,
                                                               fi_addr_t dest, uint64_t tag) {
    if (ssize_t ret = send_direct(buf, len, nullptr, dest, nullptr,
                                  FI_INJECT | FI_REMOTE_CQ_DATA | kNoCompletion, tag, data, true);
        ret != kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return post_send({&iov, nullptr, 1, dest, nullptr,
                      FI_INJECT | FI_REMOTE_CQ_DATA | kNoCompletion, tag, data, true});
}

ssize_t Endpoint::rma_read(const OpDefaults &d, void *buf, size_t len, void *desc, fi_addr_t src,
                           uint64_t addr, uint64_t key, void *context) {
    iovec iov{buf, len};
    return post_rma({&iov, &desc, 1, src, addr, key, context, d.tx, 0, false});
}
ssize_t Endpoint::rma_readv(const OpDefaults &d, const iovec *iov, void **desc, size_t count,
                            fi_addr_t src, uint64_t addr, uint64_t key, void *context) {
    return post_rma({iov, desc, count, src, addr, key, context, d.tx, 0, false});
}
ssize_t Endpoint::rma_readmsg(const OpDefaults &, const fi_msg_rma *msg, uint64_t flags) {
    if (!msg || msg->rma_iov_count != 1 || !msg->rma_iov) return -FI_EINVAL;
    return post_rma({msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->rma_iov[0].addr,
                     msg->rma_iov[0].key, msg->context, flags & ~kNoCompletion, msg->data, false});
}
ssize_t Endpoint::rma_write(const OpDefaults &d, const void *buf, size_t len, void *desc,
                            fi_addr_t dest, uint64_t addr, uint64_t key, void *context) {
    iovec iov{const_cast<void *>(buf), len};
    return post_rma({&iov, &desc, 1, dest, addr, key, context, d.tx, 0, true});
}
ssize_t Endpoint::rma_writev(const OpDefaults &d, const iovec *iov, void **desc, size_t count,
                             fi_addr_t dest, uint64_t addr, uint64_t key, void *context) {
    return post_rma({iov, desc, count, dest, addr, key, context, d.tx, 0, true});
}
ssize_t Endpoint::rma_writemsg(const OpDefaults &, const fi_msg_rma *msg, uint64_t flags) {
    if (!msg || msg->rma_iov_count != 1 || !msg->rma_iov) return -FI_EINVAL;
    return post_rma({msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->rma_iov[0].addr,
                     msg->rma_iov[0].key, msg->context, flags & ~kNoCompletion, msg->data, true});
}
ssize_t Endpoint::rma_inject(const OpDefaults &, const void *buf, size_t len, fi_addr_t dest,
                             uint64_t addr, uint64_t key) {
    iovec iov{const_cast<void *>(buf), len};
    return post_rma(
        {&iov, nullptr, 1, dest, addr, key, nullptr, FI_INJECT | kNoCompletion, 0, true});
}
ssize_t Endpoint::rma_writedata(const OpDefaults &d, const void *buf, size_t len, void *desc,
                                uint64_t data, fi_addr_t dest, uint64_t addr, uint64_t key,
                                void *context) {
    iovec iov{const_cast<void *>(buf), len};
    return post_rma(
        {&iov, &desc, 1, dest, addr, key, context, d.tx | FI_REMOTE_CQ_DATA, data, true});
}
ssize_t Endpoint::rma_injectdata(const OpDefaults &, const void *buf, size_t len, uint64_t data,
                                 fi_addr_t dest, uint64_t addr, uint64_t key) {
    iovec iov{const_cast<void *>(buf), len};
    return post_rma({&iov, nullptr, 1, dest, addr, key, nullptr,
                     FI_INJECT | FI_REMOTE_CQ_DATA | kNoCompletion, data, true});
}

// ------------------------------------------------------------------------------------------
// Transmit side

// cap 0: an operation of the offload twin (FI_PEER_TRANSFER), which is tandem's own traffic
// and does not depend on what the application asked for (a fi_pingpong endpoint with FI_MSG
// alone still has twins that introduce themselves with tagged messages).
void Endpoint::check_tx_ready(uint64_t cap) const {
    if (!enabled_) fail(FI_EOPBADSTATE, "endpoint not enabled");
    if (cap && !(caps_ & cap)) fail(FI_EOPNOTSUPP, "capability not requested");
}

void Endpoint::check_rx_ready(uint64_t cap) const {
    if (!enabled_) fail(FI_EOPBADSTATE, "endpoint not enabled");
    if (cap && !(caps_ & cap)) fail(FI_EOPNOTSUPP, "capability not requested");
}

Peer *Endpoint::peer_for(fi_addr_t addr) {
    if (type_ == FI_EP_MSG) {
        if (!msg_peer_ || msg_state_ != MsgState::Connected) fail(FI_ENOTCONN, "not connected");
        return msg_peer_;
    }
    if (peer_cache_version_ != av_->version()) {
        peer_by_addr_.clear();
        last_peer_ = nullptr;
        peer_cache_version_ = av_->version();
    }
    // A run of operations to one peer skips the hash lookup.
    if (last_peer_ && addr == last_peer_addr_) return last_peer_;
    auto it = peer_by_addr_.find(addr);
    Peer *peer;
    if (it != peer_by_addr_.end()) {
        peer = it->second;
    } else {
        const EndpointName *name = av_->name_of(addr);
        if (!name) fail(FI_EINVAL, "unknown destination address");
        auto &slot = peers_[name->key()];
        if (!slot) {
            slot = std::make_unique<Peer>();
            slot->name = *name;
        }
        peer = slot.get();
        peer_by_addr_[addr] = peer;
    }
    last_peer_addr_ = addr;
    last_peer_ = peer;
    return peer;
}

// Prepare: the call's checks that need no endpoint state, and its lists copied.
int Endpoint::prepare_send(const SendArgs &a, SendRequest &r) const {
    if (int ret = r.payload.capture(a.iov, a.desc, a.count)) return ret;
    if (r.payload.len > info_->ep_attr->max_msg_size) return -FI_EMSGSIZE;
    if ((a.flags & FI_INJECT) && r.payload.len > inject_size_) return -FI_EMSGSIZE;
    r.dest = a.dest;
    r.context = a.context;
    r.flags = a.flags;
    r.tag = a.tag;
    r.data = a.data;
    r.tagged = a.tagged;
    return 0;
}

ssize_t Endpoint::post_send(const SendArgs &a) {
    SendRequest r;
    if (int ret = prepare_send(a, r)) return ret;
    std::lock_guard guard(domain_->lock());
    return post_send_locked(a, r);
}

ssize_t Endpoint::post_send_locked(const SendArgs &a, SendRequest &r) {
    check_tx_ready(a.flags & FI_PEER_TRANSFER ? 0 : a.tagged ? FI_TAGGED : FI_MSG);
    if (r.flags & FI_TRIGGER) return queue_triggered(TriggeredRequest(std::move(r)));
    if (!make_tx_room()) return -FI_EAGAIN;
    return issue_send(r);
}

// An eager message the connection sends from the application's buffer before returning
// (LinkConnection::post_send_now): no operation, no copy of ours. Complete at once, as the
// general path completes an eager send once posted; the link's work request, acknowledged
// by the peer later, only gives back its place in the transmit queue (kWrDirect).
ssize_t Endpoint::send_by_link(Peer *peer, const void *buf, size_t len, void *context,
                               uint64_t flags, uint64_t tag, uint64_t data, bool tagged) {
    wire::ProtoHeader hdr{};
    hdr.op = static_cast<uint8_t>(wire::ProtoOp::Eager);
    hdr.flags = uint8_t((tagged ? wire::kProtoTagged : 0) |
                        ((flags & FI_REMOTE_CQ_DATA) ? wire::kProtoCqData : 0));
    hdr.tag = tag;
    hdr.cq_data = data;
    hdr.size = len;
    hdr.msg_id = next_op_id_;
    const iovec iov[2] = {{&hdr, sizeof hdr}, {const_cast<void *>(buf), len}};
    if (peer->conn->post_send_now(iov, len ? 2 : 1, kWrDirect) != 0) return kNotTaken;
    ++next_op_id_;
    ++tx_outstanding_;
    poll_link_soon();  // (the answer comes over the link)
    if (send_cntr_) send_cntr_->inc();
    if (tx_cq_ && tx_reports(flags))
        tx_cq_->push(context, FI_SEND | (tagged ? FI_TAGGED : FI_MSG), 0, nullptr, 0, 0,
                     FI_ADDR_NOTAVAIL, nullptr);
    return 0;
}

ssize_t Endpoint::recv_one(void *buf, size_t len, void *desc, fi_addr_t src, uint64_t tag,
                           uint64_t ignore, void *context, uint64_t flags, bool tagged) {
    constexpr uint64_t kNotOne = FI_PEER_TRANSFER | FI_TRIGGER | FI_MULTI_RECV;
    if (flags & kNotOne) return kNotTaken;
    std::lock_guard guard(domain_->lock());
    RxMatcher &m = *rx_;
    if (!enabled_ || !(caps_ & (tagged ? FI_TAGGED : FI_MSG)) || m.has_unexpected(tagged) ||
        m.outstanding + rx_triggered_ >= info_->rx_attr->size)
        return kNotTaken;
    RxOp *rx = m.new_op();
    rx->context = context;
    rx->op_flags = flags;
    rx->count = 1;
    rx->iov[0] = {buf, len};
    rx->desc[0] = desc;
    rx->mem[0] = peer::mem_of(desc);
    rx->device = !rx->mem[0].on_host();
    rx->total = len;
    if ((caps_ & FI_DIRECTED_RECV) && type_ == FI_EP_RDM) rx->src = src;
    rx->tag = tag;
    rx->ignore = ignore;
    rx->tagged = tagged;
    ++m.outstanding;
    m.post(rx);
    return 0;
}

// Room for one more transmit in the queue (tx_attr->size), after a progress pass if needed.
bool Endpoint::make_tx_room() {
    if (tx_outstanding_ + tx_triggered_ < info_->tx_attr->size) return true;
    progress();
    return tx_outstanding_ + tx_triggered_ < info_->tx_attr->size;
}

// Issue: start a prepared send, now (from the call) or later (from the trigger queue). The
// caller holds the domain lock and made room for it in the transmit queue.
ssize_t Endpoint::issue_send(SendRequest &r) {
    const iovec *const iov = r.payload.iov;
    void **const desc = r.payload.descs();
    const size_t count = r.payload.count;
    hmem::MemRef mem[kMaxIov];
    bool device = memory_of(iov, desc, count, r.flags, mem);
    // An inject's payload is copied before the call returns: never peer to peer.
    if (device && (r.flags & FI_INJECT) && p2p_.mode() == FI_HMEM_P2P_REQUIRED)
        return -FI_EOPNOTSUPP;
    Peer *peer = peer_for(r.dest);
    bool peer_transfer = r.flags & FI_PEER_TRANSFER;
    if (peer_transfer && !local_) return -FI_EINVAL;  // only our offload twin posts these
    if (!peer_transfer && inject_local(r, peer, device)) return 0;
    TxOp *op = new_send_op(r, peer);
    // The twin's traffic crosses the link (node-local twins talk over their own rings).
    if (!peer_transfer && goes_local(peer, r.dest)) return send_through_twin(op, r, device, mem);
    return send_over_link(op, r, device, mem);
}

// A small node-local message goes straight into the peer's ring and is complete once there
// (the data has reached the peer's endpoint: FI_TRANSMIT_COMPLETE), with no operation to
// allocate or complete later. Not while earlier operations through the twin are pending
// (their completions come first), nor for FI_DELIVERY_COMPLETE (the receiver answers) or
// device memory (the twin's P2P policy decides). When the ring has no room now, the
// ordinary path posts it to the twin, which answers -FI_EAGAIN while the ring is full
// (back-pressure: nothing is queued without bound). True when it went (and is complete).
bool Endpoint::inject_local(const SendRequest &r, Peer *peer, bool device) {
    if (device || (r.flags & FI_DELIVERY_COMPLETE) || !local_ || local_tx_pending_ != 0 ||
        r.payload.len > local_->inject_limit() || !goes_local(peer, r.dest))
        return false;
    if (local_->inject(r.payload.iov, r.payload.count, r.dest, r.tag, r.data,
                       (r.tagged ? FI_TAGGED : 0) | (r.flags & FI_REMOTE_CQ_DATA)) != 0)
        return false;
    complete_injected(r);
    return true;
}

// The operation of a send that is not complete when issued, as it is reported.
TxOp *Endpoint::new_send_op(const SendRequest &r, Peer *peer) {
    const bool peer_transfer = r.flags & FI_PEER_TRANSFER;
    TxOp *op = alloc_tx();
    op->kind = TxOp::Kind::Send;
    op->context = r.context;
    op->op_flags = r.flags;
    op->cq_flags = FI_SEND | (r.tagged ? FI_TAGGED : FI_MSG);
    op->report = tx_reports(r.flags, r.done);
    op->deferred = r.done.deferred;
    op->work_cntr = r.done.cntr;
    op->len = r.payload.len;
    op->peer = peer;
    op->id = next_op_id_++;
    op->peer_transfer = peer_transfer;
    if (peer_transfer) op->report = true;  // the twin always hears of its own operations
    return op;
}

// A send to a node-local peer, posted to the offload twin: it copies (or has the receiver
// read) the payload itself, except that an inject's buffer is the application's again when
// we return: hand the twin our copy of it.
ssize_t Endpoint::send_through_twin(TxOp *op, SendRequest &r, bool device,
                                    const hmem::MemRef *mem) {
    const iovec *twin_iov = r.payload.iov;
    void **twin_desc = r.payload.descs();
    size_t twin_count = r.payload.count;
    if (r.flags & FI_INJECT) {
        int ret = take_payload(op, r.payload.iov, device ? mem : nullptr, r.payload.count,
                               r.payload.len, true);
        if (ret) {
            free_tx(op);
            return ret;
        }
        twin_iov = op->iov.data();
        twin_desc = nullptr;  // our copy is host memory
        twin_count = op->iov.size();
    }
    ++tx_outstanding_;
    ++local_tx_pending_;
    op->local = true;
    int ret =
        local_->send(op, twin_iov, twin_desc, twin_count, r.dest, r.flags, r.tag, r.data, r.tagged);
    if (ret) {
        --tx_outstanding_;
        --local_tx_pending_;
        free_tx(op);
    }
    return ret;
}

// A send over the link: an Eager message carrying the payload, or an Rts naming the source
// for the receiver to read.
ssize_t Endpoint::send_over_link(TxOp *op, const SendRequest &r, bool device,
                                 const hmem::MemRef *mem) {
    const size_t len = r.payload.len;
    op->hdr.flags = (r.tagged ? wire::kProtoTagged : 0) |
                    ((r.flags & FI_REMOTE_CQ_DATA) ? wire::kProtoCqData : 0) |
                    (op->peer_transfer ? wire::kProtoPeer : 0);
    op->hdr.tag = r.tag;
    op->hdr.cq_data = r.data;
    op->hdr.size = len;
    op->hdr.msg_id = op->id;
    // Device memory the link moves peer to peer (a NIC reading it through its dma-buf) goes by
    // rendezvous whatever its size: an eager message is a copy into the protocol's buffer.
    const hmem::P2pDecision decision =
        device ? link_decision(len, eager_limit_) : hmem::P2pDecision::Stage;
    if (decision == hmem::P2pDecision::Fail) {
        ++tx_outstanding_;
        fail_tx(op, FI_EOPNOTSUPP);  // FI_HMEM_P2P_REQUIRED, and the link can only stage
        return 0;
    }
    int ret = len <= eager_limit_ && decision != hmem::P2pDecision::PeerToPeer
                  ? prepare_eager(op, r, device, mem)
                  : prepare_rts(op, r, device, mem, decision);
    if (ret) {
        free_tx(op);
        return ret;
    }
    ++tx_outstanding_;
    submit(op);
    return 0;
}

// An Eager message owns its bytes now (the link's bounce copy): the application may reuse its
// buffer when we return, and unless it asked for a stronger level the send is complete as
// soon as it is posted on an established connection (FI_INJECT_COMPLETE).
int Endpoint::prepare_eager(TxOp *op, const SendRequest &r, bool device, const hmem::MemRef *mem) {
    op->hdr.op = static_cast<uint8_t>(wire::ProtoOp::Eager);
    if (r.flags & FI_DELIVERY_COMPLETE) {
        op->hdr.flags |= wire::kProtoAckReq;
        op->await_remote = true;
    }
    int ret = take_payload(op, r.payload.iov, device ? mem : nullptr, r.payload.count,
                           r.payload.len, true);
    if (ret) return ret;
    op->inject_level = !(r.flags & (FI_TRANSMIT_COMPLETE | FI_DELIVERY_COMPLETE));
    return 0;
}

// An Rts: a NIC reads the source itself (the link's own keys), so device memory that is to
// be staged is copied to host memory first, and that is what the peer reads.
int Endpoint::prepare_rts(TxOp *op, const SendRequest &r, bool device, const hmem::MemRef *mem,
                          hmem::P2pDecision decision) {
    op->hdr.op = static_cast<uint8_t>(wire::ProtoOp::Rts);
    op->await_remote = true;
    const iovec *src = r.payload.iov;
    size_t src_count = r.payload.count;
    const hmem::MemRef *src_mem = mem;
    if (device && decision == hmem::P2pDecision::Stage && transport_->caps().link_keys) {
        if (int ret = take_payload(op, r.payload.iov, mem, r.payload.count, r.payload.len, true))
            return ret;
        src = op->iov.data();
        src_count = op->iov.size();
        src_mem = nullptr;
    }
    return expose(op, src, src_mem, src_count, FI_REMOTE_READ);
}

// Registers an operation's local buffers for the peer's access (a rendezvous source, a served
// RMA's buffers) and names them in op->rts; the keys go with the operation (retire_tx). 0, or
// a negative errno with nothing left registered when the link cannot register one (device
// memory its NIC cannot reach).
int Endpoint::expose(TxOp *op, const iovec *iov, const hmem::MemRef *mem, size_t count,
                     uint64_t access) {
    for (size_t i = 0; i < count; ++i) {
        if (!iov[i].iov_len) continue;
        const hmem::MemRef where = mem ? mem[i] : hmem::kHost;
        uint64_t key = domain_->mr_table().insert_internal(iov[i], where, access);
        if (!key) {
            for (uint64_t k : op->internal_keys) domain_->mr_table().erase_internal(k);
            op->internal_keys.clear();
            return where.on_host() ? -FI_EIO : -FI_EOPNOTSUPP;
        }
        op->internal_keys.push_back(key);
        op->rts.iov[op->rts.iov_count++] = {reinterpret_cast<uint64_t>(iov[i].iov_base),
                                            iov[i].iov_len, key};
    }
    return 0;
}

int Endpoint::prepare_rma(const RmaArgs &a, RmaRequest &r) const {
    if (int ret = r.local.capture(a.iov, a.desc, a.count)) return ret;
    if (r.local.len > info_->ep_attr->max_msg_size) return -FI_EMSGSIZE;
    if ((a.flags & FI_INJECT) && r.local.len > inject_size_) return -FI_EMSGSIZE;
    r.peer = a.peer;
    r.addr = a.addr;
    r.key = a.key;
    r.context = a.context;
    r.flags = a.flags;
    r.data = a.data;
    r.write = a.write;
    return 0;
}

ssize_t Endpoint::post_rma(const RmaArgs &a) {
    RmaRequest r;
    if (int ret = prepare_rma(a, r)) return ret;
    std::lock_guard guard(domain_->lock());
    check_tx_ready(a.write ? (FI_RMA | FI_WRITE) : (FI_RMA | FI_READ));
    if (!(caps_ & FI_RMA)) return -FI_EOPNOTSUPP;
    if (r.flags & FI_TRIGGER) return queue_triggered(TriggeredRequest(std::move(r)));
    if (!make_tx_room()) return -FI_EAGAIN;
    return issue_rma(r);
}

ssize_t Endpoint::issue_rma(RmaRequest &r) {
    const iovec *const iov = r.local.iov;
    void **const desc = r.local.descs();
    const size_t count = r.local.count;
    const size_t len = r.local.len;
    hmem::MemRef mem[kMaxIov];
    bool device = memory_of(iov, desc, count, r.flags, mem);
    // An inject's payload is copied before the call returns: never peer to peer.
    if (device && (r.flags & FI_INJECT) && p2p_.mode() == FI_HMEM_P2P_REQUIRED)
        return -FI_EOPNOTSUPP;
    Peer *peer = peer_for(r.peer);
    TxOp *op = alloc_tx();
    op->kind = r.write ? TxOp::Kind::Write : TxOp::Kind::Read;
    op->context = r.context;
    op->op_flags = r.flags;
    op->cq_flags = FI_RMA | (r.write ? FI_WRITE : FI_READ);
    op->report = tx_reports(r.flags, r.done);
    op->deferred = r.done.deferred;
    op->work_cntr = r.done.cntr;
    op->len = len;
    op->peer = peer;
    op->id = next_op_id_++;
    if (goes_local(peer, r.peer)) {
        const iovec *twin_iov = iov;
        void **twin_desc = desc;
        size_t twin_count = count;
        if (r.write && (r.flags & FI_INJECT)) {
            int ret = take_payload(op, iov, device ? mem : nullptr, count, len, true);
            if (ret) {
                free_tx(op);
                return ret;
            }
            twin_iov = op->iov.data();
            twin_desc = nullptr;
            twin_count = op->iov.size();
        }
        ++tx_outstanding_;
        ++local_tx_pending_;
        op->local = true;
        int ret = local_->rma(op, twin_iov, twin_desc, twin_count, r.peer, r.addr, r.key, r.flags,
                              r.data, r.write);
        if (ret) {
            --tx_outstanding_;
            --local_tx_pending_;
            free_tx(op);
        }
        return ret;
    }
    op->remote = {r.addr, r.key};
    const hmem::P2pDecision decision = device ? link_decision(len) : hmem::P2pDecision::PeerToPeer;
    if (decision == hmem::P2pDecision::Fail) {
        ++tx_outstanding_;
        fail_tx(op, FI_EOPNOTSUPP);
        return 0;
    }
    if (domain_->rma_served())
        return issue_served_rma(op, r, device ? mem : nullptr,
                                decision == hmem::P2pDecision::Stage);
    // Small writes are copied (the buffer is free at once); larger ones and reads use the
    // application's buffers until the link completes them.
    int ret = take_payload(op, iov, device ? mem : nullptr, count, len,
                           r.write && ((r.flags & FI_INJECT) || len <= inject_size_));
    if (ret) {
        free_tx(op);
        return ret;
    }
    if (r.write && (r.flags & FI_REMOTE_CQ_DATA)) {
        op->hdr.op = static_cast<uint8_t>(wire::ProtoOp::WriteNotify);
        op->hdr.flags = wire::kProtoCqData;
        op->hdr.cq_data = r.data;
        op->hdr.size = sizeof op->notify;
        op->hdr.msg_id = op->id;
        op->notify = {r.addr, len, r.key};
    }
    ++tx_outstanding_;
    submit(op);
    return 0;
}

// Order between atomics and RMA over a link. The link applies an RMA write or read as its
// frames arrive (as a NIC does), while an atomic is executed by the target's protocol when it
// processes the message carrying it, later: an RMA posted behind an atomic to the same peer
// could overtake it, and FI_ORDER_RAW, WAR and WAW hold between atomics and RMA alike. So
// while a peer has atomics out, an RMA to it waits here (Peer::held) until their answers have
// come, and whatever is posted after a held operation waits behind it. Messages and atomics
// are delivered in the order they were sent, and RMA before an atomic lands before it, so
// nothing else waits.
void Endpoint::submit(TxOp *op) {
    Peer *peer = op->peer;
    const bool rma = op->kind == TxOp::Kind::Write || op->kind == TxOp::Kind::Read;
    if (!peer->held.empty() || (rma && peer->atomics_out)) {
        peer->held.push_back(op);
        return;
    }
    if (op->kind == TxOp::Kind::Atomic) {
        ++peer->atomics_out;
        op->fenced = true;
    }
    start_tx(op);
}

// A peer's atomics were answered: what waited behind them goes, up to the next RMA that
// must wait for an atomic released here.
void Endpoint::release_held(Peer *peer) {
    while (!peer->held.empty()) {
        TxOp *op = peer->held.front();
        const bool rma = op->kind == TxOp::Kind::Write || op->kind == TxOp::Kind::Read;
        if (rma && peer->atomics_out) return;
        peer->held.pop_front();
        if (op->kind == TxOp::Kind::Atomic) {
            ++peer->atomics_out;
            op->fenced = true;
        }
        start_tx(op);
    }
}

void Endpoint::start_tx(TxOp *op) {
    poll_link_soon();
    Peer *peer = op->peer;
    if (peer->established && peer->conn) {
        op->conn = peer->conn;
        issue_tx(op);
        return;
    }
    peer->waiting.push_back(op);
    if (peer->conn || type_ != FI_EP_RDM) return;
    // First message to this peer: connect, naming ourselves so it can map us in its AV.
    EndpointName me;
    me.ss = transport_->name();
    substitute_interface_address(domain_->info()->domain_attr->name, me);
    std::vector<uint8_t> priv =
        build_conn_hello(wire::ConnKind::Rdm, auth_,
                         {reinterpret_cast<const uint8_t *>(&me.ss), size_t(me.length())}, {});
    peer->conn =
        transport_->connect(peer->name.sa(), peer->name.length(), priv.data(), priv.size());
    peer->conn->context = peer;
}

// op->link_wrs counts the work requests the link accepted, and only those: each one
// completes exactly once (as Flushed when the connection fails, even during the post that
// queued it), and the last of those completions finishes the operation (handle_wc). A post
// the link refused queued nothing and never completes, so the operation fails here only when
// nothing of it was accepted. (A writedata whose write was accepted and flushed at once, its
// notice then refused, waits for the write's completion: failing it here as well reported it
// twice, the second time after the op had been recycled.)
void Endpoint::issue_tx(TxOp *op) {
    LinkConnection *conn = op->conn;
    int ret = 0;
    op->link_wrs = 0;
    switch (op->kind) {
        case TxOp::Kind::Send: {
            iovec iov[kMaxIov + 2];
            size_t n = 0;
            iov[n++] = {&op->hdr, sizeof op->hdr};
            if (op->hdr.op == static_cast<uint8_t>(wire::ProtoOp::Rts)) {
                iov[n++] = {&op->rts, sizeof op->rts};
                await_remote_[op->id] = op;
            } else {
                for (auto &v : op->iov) iov[n++] = v;
                if (op->await_remote) await_remote_[op->id] = op;
            }
            ret = conn->post_send(iov, n, nullptr, wr_id(op, kWrTx));
            if (!ret) ++op->link_wrs;
            break;
        }
        case TxOp::Kind::Write:
        case TxOp::Kind::Read:
            if (op->served) {
                iovec iov[3] = {{&op->hdr, sizeof op->hdr},
                                {&op->served_target, sizeof op->served_target},
                                {&op->rts, sizeof op->rts}};
                await_remote_[op->id] = op;
                ret = conn->post_send(iov, 3, nullptr, wr_id(op, kWrTx));
                if (!ret) ++op->link_wrs;
                break;
            }
            if (op->kind == TxOp::Kind::Read) {
                ret = conn->post_read(op->iov.data(), op->mem.empty() ? nullptr : op->mem.data(),
                                      op->iov.size(), op->remote, wr_id(op, kWrTx));
                if (!ret) ++op->link_wrs;
                break;
            }
            ret = conn->post_write(op->iov.data(), op->mem.empty() ? nullptr : op->mem.data(),
                                   op->iov.size(), op->remote, nullptr, wr_id(op, kWrTx));
            if (ret) break;
            ++op->link_wrs;
            if (op->hdr.op == static_cast<uint8_t>(wire::ProtoOp::WriteNotify)) {
                // Delivered only if the write succeeded: a refused write reports no remote CQ
                // data at the target.
                iovec iov[2] = {{&op->hdr, sizeof op->hdr}, {&op->notify, sizeof op->notify}};
                ret = conn->post_send(iov, 2, nullptr, wr_id(op, kWrTx), true);
                if (!ret) ++op->link_wrs;
            }
            break;
        case TxOp::Kind::Atomic: {
            iovec iov[2] = {{&op->hdr, sizeof op->hdr},
                            {op->inject_copy.data(), op->inject_copy.size()}};
            await_remote_[op->id] = op;
            ret = conn->post_send(iov, 2, nullptr, wr_id(op, kWrTx));
            if (!ret) ++op->link_wrs;
            break;
        }
    }
    if (!ret && op->inject_level && !op->completed_early) {
        op->completed_early = true;
        tx_report(op);
        return;
    }
    if (!ret) return;
    // The connection is gone (or the link refused the request): the operation fails, once.
    op->error = ret == -FI_ENOTCONN ? FI_ECONNRESET : -ret;
    if (op->link_wrs > 0) return;  // what was accepted completes, and finishes it then
    await_remote_.erase(op->id);
    fail_tx(op, op->error);
}

Cntr *Endpoint::counter_for(const TxOp &op) const {
    if (op.deferred) return op.work_cntr;  // deferred work counts on its own counter only
    return tx_counter(op.cq_flags);
}

// The endpoint's counter of a transmit with these completion flags: sends, writes (atomics
// that return nothing among them), reads (and the fetch and compare atomics, which return
// data).
Cntr *Endpoint::tx_counter(uint64_t cq_flags) const {
    if (cq_flags & FI_SEND) return send_cntr_;
    return (cq_flags & FI_WRITE) ? write_cntr_ : read_cntr_;
}

// The operation is over (reported or failed): its keys, its queue slot and the op itself go.
void Endpoint::retire_tx(TxOp *op) {
    for (uint64_t key : op->internal_keys) domain_->mr_table().erase_internal(key);
    --tx_outstanding_;
    if (op->local) --local_tx_pending_;
    Peer *released = nullptr;
    if (op->fenced && --op->peer->atomics_out == 0 && !closing_) released = op->peer;
    free_tx(op);
    if (released) release_held(released);
}

// The payload an operation transmits: copied into its own bounce buffer (so the application
// may reuse its buffers at once; device memory is copied by its device), or the
// application's buffers themselves. 0 or a negative errno (a device copy failed).
int Endpoint::take_payload(TxOp *op, const iovec *iov, const hmem::MemRef *mem, size_t count,
                           size_t len, bool copy) {
    if (!copy) {
        for (size_t i = 0; i < count; ++i) {
            if (!iov[i].iov_len) continue;
            op->iov.push_back(iov[i]);
            if (mem) op->mem.push_back(mem[i]);  // in step with iov
        }
        return 0;
    }
    op->inject_copy.resize(len);
    if (mem) {
        ssize_t got = hmem::gather(op->inject_copy.data(), iov, mem, count, 0, len);
        if (got < 0) return static_cast<int>(got);
    } else {
        iov_gather(op->inject_copy.data(), iov, count, 0, len);
    }
    if (len) op->iov.push_back({op->inject_copy.data(), len});
    return 0;
}

// Where each buffer of a data call lives: from its descriptors, or for fi_inject (which
// carries none) from the memory interfaces. True when any is device memory. An endpoint
// opened without FI_HMEM is given host memory only, so it never asks the driver (a
// pointer query per inject would cost every application in a process that loaded CUDA).
bool Endpoint::memory_of(const iovec *iov, void **desc, size_t count, uint64_t flags,
                         hmem::MemRef *mem) const {
    if (!(caps_ & FI_HMEM)) {
        std::fill(mem, mem + count, hmem::kHost);
        return false;
    }
    if (desc) return peer::mems_of(desc, count, mem);
    bool device = false;
    bool look = (flags & FI_INJECT) && hmem::Registry::instance().any_device();
    for (size_t i = 0; i < count; ++i) {
        mem[i] = look ? hmem::detect(iov[i].iov_base) : hmem::kHost;
        device |= !mem[i].on_host();
    }
    return device;
}

hmem::P2pDecision Endpoint::link_decision(size_t len, size_t small) {
    hmem::P2pDecision d = p2p_.decide(transport_ && transport_->caps().device_p2p, len, small);
    auto &c = hmem::counters();
    switch (d) {
        case hmem::P2pDecision::PeerToPeer:
            c.p2p_transfers.fetch_add(1);
            break;
        case hmem::P2pDecision::Stage:
            c.staged_transfers.fetch_add(1);
            break;
        case hmem::P2pDecision::Fail:
            c.refused_transfers.fetch_add(1);
            TANDEM_INFO(FI_LOG_EP_DATA,
                        "FI_HMEM_P2P_REQUIRED: the link cannot move device memory peer to "
                        "peer\n");
            break;
    }
    return d;
}

void Endpoint::tx_report(TxOp *op) {
    if (op->peer_transfer) {
        if (local_)  // (gone while the endpoint closes: nobody to tell)
            local_->transfer_done({op->context, op->cq_flags, op->len, nullptr, 0, 0}, 0, 0,
                                  FI_ADDR_NOTAVAIL);
        return;
    }
    if (Cntr *cntr = counter_for(*op)) cntr->inc();
    if (op->report && tx_cq_)
        tx_cq_->write({op->context, op->cq_flags, 0, nullptr, 0, 0, FI_ADDR_NOTAVAIL});
}

// A send post_send put straight into a node-local peer's ring: what tx_report does for an
// operation (counter, and the CQ entry unless fi_inject or selective completion omit it).
void Endpoint::complete_injected(const SendRequest &r) {
    if (Cntr *cntr = r.done.deferred ? r.done.cntr : send_cntr_) cntr->inc();
    if (tx_cq_ && tx_reports(r.flags, r.done))
        tx_cq_->write({r.context, FI_SEND | (r.tagged ? FI_TAGGED : FI_MSG), 0, nullptr, 0, 0,
                       FI_ADDR_NOTAVAIL});
}

void Endpoint::finish_tx(TxOp *op) {
    if (op->error) {
        fail_tx(op, op->error);
        return;
    }
    if (!op->completed_early) tx_report(op);
    retire_tx(op);
}

void Endpoint::fail_tx(TxOp *op, int err) {
    if (op->completed_early) {
        // Reported complete at inject level already; the error can only be logged.
        TANDEM_INFO(FI_LOG_EP_DATA, "send completed at inject level failed later: %s\n",
                    fi_strerror(err));
        retire_tx(op);
        return;
    }
    if (op->peer_transfer) {
        if (local_)
            local_->transfer_done({op->context, op->cq_flags, op->len, nullptr, 0, 0}, err, 0,
                                  FI_ADDR_NOTAVAIL);
        retire_tx(op);
        return;
    }
    if (Cntr *cntr = counter_for(*op)) cntr->inc_err();
    if (!op->deferred || (op->op_flags & FI_COMPLETION))
        write_tx_err(op->context, op->cq_flags, err, op->len);
    retire_tx(op);
}

TxOp *Endpoint::alloc_tx() {
    if (tx_free_.empty()) return tx_ops_.emplace_back(std::make_unique<TxOp>()).get();
    TxOp *op = tx_free_.back();
    tx_free_.pop_back();
    return op;
}

// Back to the free list, reset but keeping its buffers' capacity for the next send.
void Endpoint::free_tx(TxOp *op) {
    op->reset();
    tx_free_.push_back(op);
}

void Endpoint::send_control(LinkConnection *conn, wire::ProtoOp op, const void *body, size_t len,
                            uint64_t msg_id) {
    if (!conn || conn->failed()) return;
    poll_link_soon();
    auto *msg = new ControlMsg{};
    msg->hdr.op = static_cast<uint8_t>(op);
    msg->hdr.size = len;
    msg->hdr.msg_id = msg_id;
    if (len) memcpy(msg->body, body, len);
    iovec iov[2] = {{&msg->hdr, sizeof msg->hdr}, {msg->body, len}};
    if (conn->post_send(iov, len ? 2 : 1, nullptr, wr_id(msg, kWrControl))) delete msg;
}

// ------------------------------------------------------------------------------------------
// Completion queue writes

void Endpoint::write_tx_err(void *context, uint64_t flags, int err, size_t len) {
    if (!tx_cq_) return;
    CompletionError e{};
    e.entry.op_context = context;
    e.entry.flags = flags;
    e.entry.len = len;
    e.entry.err = err;
    e.entry.prov_errno = err;
    e.src = FI_ADDR_NOTAVAIL;
    tx_cq_->write_error(e);
}

void Endpoint::write_rx_err(const RxOp *rx, uint64_t flags, int err, size_t len, size_t olen,
                            uint64_t tag, uint64_t data) {
    if (Cntr *cntr = rx->deferred ? rx->work_cntr : recv_cntr_) cntr->inc_err();
    if (rx->deferred && !(rx->op_flags & FI_COMPLETION)) return;
    write_rx_error_entry(rx->context, rx->count ? rx->iov[0].iov_base : nullptr, flags, err, len,
                         olen, tag, data);
}

void Endpoint::write_rx_error_entry(void *context, void *buf, uint64_t flags, int err, size_t len,
                                    size_t olen, uint64_t tag, uint64_t data) {
    if (!rx_cq_) return;
    CompletionError e{};
    e.entry.op_context = context;
    e.entry.flags = flags;
    e.entry.len = len;
    e.entry.buf = buf;
    e.entry.data = data;
    e.entry.tag = tag;
    e.entry.olen = olen;
    e.entry.err = err;
    e.entry.prov_errno = err;
    e.src = FI_ADDR_NOTAVAIL;
    e.owner = &rx_completions_;
    rx_cq_->write_error(e);
}

void Endpoint::write_rx_cq(const Completion &c, fi_addr_t src) {
    if (!rx_cq_) return;
    Completion out = c;
    out.src = src;
    out.owner = &rx_completions_;
    rx_cq_->write(out);
}

// ------------------------------------------------------------------------------------------
// Receive side

ssize_t Endpoint::post_recv(const RecvArgs &a) {
    std::lock_guard guard(domain_->lock());
    return post_recv_locked(a);
}

ssize_t Endpoint::post_recv_locked(const RecvArgs &a) {
    check_rx_ready(a.flags & FI_PEER_TRANSFER ? 0 : a.tagged ? FI_TAGGED : FI_MSG);
    if (a.flags & FI_PEER_TRANSFER) {
        // The offload twin's receive for its own traffic from remote twins.
        if (!local_) return -FI_EINVAL;
        if (a.flags & (FI_MULTI_RECV | FI_PEEK | FI_CLAIM)) return -FI_EINVAL;
        return post_recv_on(peer_rx_, this, caps_, a);
    }
    if (a.flags & FI_TRIGGER) {
        RecvRequest r;
        if (int ret = r.buffers.capture(a.iov, a.desc, a.count)) return ret;
        r.src = a.src;
        r.context = a.context;
        r.flags = a.flags;
        r.tag = a.tag;
        r.ignore = a.ignore;
        r.tagged = a.tagged;
        return queue_triggered(std::move(r));
    }
    if (rx_->outstanding + rx_triggered_ >= info_->rx_attr->size) return -FI_EAGAIN;
    RecvArgs args = a;
    if (!(caps_ & FI_DIRECTED_RECV) || type_ != FI_EP_RDM) args.src = FI_ADDR_UNSPEC;
    return post_recv_on(*rx_, this, caps_, args);
}

// A receive a trigger started (or deferred work): posted as fi_recvmsg would post it, but
// completing as its request says.
ssize_t Endpoint::issue_recv(RecvRequest &r) {
    if (rx_->outstanding + rx_triggered_ >= info_->rx_attr->size) return -FI_EAGAIN;
    RecvArgs args{r.buffers.iov, r.buffers.descs(), r.buffers.count, r.src, r.context, r.flags,
                  r.tag,         r.ignore,          r.tagged};
    if (!(caps_ & FI_DIRECTED_RECV) || type_ != FI_EP_RDM) args.src = FI_ADDR_UNSPEC;
    return post_recv_on(*rx_, this, caps_, args, r.done);
}

ssize_t Endpoint::post_recv_on(RxMatcher &m, Endpoint *report_ep, uint64_t caps, const RecvArgs &a,
                               const DeferredDone &done) {
    (void)report_ep;
    if (a.count && !a.iov) return -FI_EINVAL;
    if (a.count > kMaxIov) return -FI_EINVAL;
    if ((a.flags & FI_MULTI_RECV) && (a.tagged || !(caps & FI_MULTI_RECV) || a.count != 1))
        return -FI_EINVAL;
    RxOp *rx = m.new_op();
    rx->context = a.context;
    rx->op_flags = a.flags;
    rx->count = a.count;
    for (size_t i = 0; i < a.count; ++i) {
        rx->iov[i] = a.iov[i];
        rx->desc[i] = a.desc ? a.desc[i] : nullptr;
    }
    rx->device = a.desc && peer::mems_of(a.desc, a.count, rx->mem);
    rx->total = iov_length(a.iov, a.count);
    rx->src = a.src;
    rx->tag = a.tag;
    rx->ignore = a.ignore;
    rx->tagged = a.tagged;
    rx->multi = a.flags & FI_MULTI_RECV;
    rx->deferred = done.deferred;
    rx->work_cntr = done.cntr;
    ++m.outstanding;
    m.post(rx);
    if (!m.has_unexpected(rx->tagged)) return 0;  // the usual case: no Unexpected to build
    // Messages that arrived before this receive, oldest first (a multi-receive buffer takes
    // as many as fit before it is retired).
    Unexpected ux;
    auto src_of = [](const Unexpected &u) { return source_of(u); };
    // Delivery may complete (and free) the receive: decide everything before it.
    while (m.take_unexpected(*rx, src_of, ux)) {
        if (!rx->multi) {
            m.remove_posted(rx);
            deliver_unexpected_any(rx, ux);
            break;
        }
        RxOp *slice = slice_for(m, rx, ux.hdr.size);
        bool last = rx->retired;
        deliver_unexpected_any(slice, ux);
        if (last) break;
    }
    return 0;
}

// RDM: whether operations to this peer go through the offload twin (see Peer::Route).
// A peer reached over a link also meets our twin: the twin introduces itself to the peer's.
bool Endpoint::goes_local(Peer *peer, fi_addr_t addr) {
    if (!local_) return false;
    if (peer->route == Peer::Route::Undecided) {
        bool local = Config::get().local_path && local_->reaches(addr);
        peer->route = local ? Peer::Route::Local : Peer::Route::Link;
        if (local)
            peer->lane = local_->lane(addr);
        else
            local_->introduce(addr);
    }
    return peer->route == Peer::Route::Local;
}

fi_addr_t Endpoint::source_of(const Unexpected &ux) {
    if (ux.peer_entry) return ux.peer_entry->entry.addr;  // the peer's AV is ours
    return ux.ep->source_of(ux.conn);
}

// A message a peer provider holds (our offload twin, or another importer of our SRX) is
// delivered by that peer; one that came over a link by the endpoint it arrived on.
void Endpoint::deliver_unexpected_any(RxOp *rx, Unexpected &ux) {
    if (ux.peer_entry)
        PeerRxQueue::of(ux.peer_entry)->start(ux.peer_entry, rx);
    else
        ux.ep->deliver_unexpected(rx, ux);
}

void Endpoint::deliver_unexpected(RxOp *rx, Unexpected &ux) {
    fi_addr_t src = source_of(ux.conn);
    if (ux.rendezvous())
        start_rendezvous(rx, ux.conn, ux.hdr, ux.rts, src);
    else
        deliver_eager(rx, ux.conn, ux.hdr, ux.data.data(), src);
}

ssize_t Endpoint::peek_or_claim_on(RxMatcher &m, Endpoint *report_ep, uint64_t caps,
                                   const RecvArgs &a) {
    uint64_t cq_flags = FI_RECV | FI_TAGGED;
    RxOp probe;
    probe.context = a.context;
    probe.op_flags = a.flags;
    probe.count = std::min(a.count, kMaxIov);
    for (size_t i = 0; i < probe.count; ++i) {
        probe.iov[i] = a.iov[i];
        probe.desc[i] = a.desc ? a.desc[i] : nullptr;
    }
    // A claimed message is delivered into these buffers: where they live matters as for
    // any receive (and a peer provider reads the descriptors).
    probe.device = a.desc && peer::mems_of(a.desc, probe.count, probe.mem);
    probe.total = iov_length(probe.iov, probe.count);
    probe.tag = a.tag;
    probe.ignore = a.ignore;
    probe.tagged = true;
    probe.src = (caps & FI_DIRECTED_RECV) ? a.src : FI_ADDR_UNSPEC;
    auto src_of = [](const Unexpected &u) { return source_of(u); };

    if (a.flags & FI_PEEK) {
        Unexpected *found = m.peek(true, a.tag, a.ignore, probe.src, src_of);
        if (!found) {
            // fi_tagged(3): a peek that finds nothing completes with FI_ENOMSG.
            if (report_ep) report_ep->write_rx_err(&probe, cq_flags, FI_ENOMSG, 0, 0, a.tag, 0);
            return 0;
        }
        Endpoint *ep = found->ep ? found->ep : report_ep;
        fi_addr_t src = source_of(*found);
        size_t size = found->hdr.size;
        uint64_t tag = found->hdr.tag, data = found->hdr.cq_data;
        if (found->hdr.flags & wire::kProtoCqData) cq_flags |= FI_REMOTE_CQ_DATA;
        if (a.flags & FI_CLAIM) {
            found->claimed = true;
            found->claim_context = a.context;
        } else if (a.flags & FI_DISCARD) {
            if (found->peer_entry) {
                PeerRxQueue::of(found->peer_entry)->discard(found->peer_entry);
            } else if (found->rendezvous()) {
                wire::FinBody fin{found->hdr.msg_id, uint32_t(wire::FinStatus::Ok), 0};
                ep->send_control(found->conn, wire::ProtoOp::Fin, &fin, sizeof fin,
                                 found->hdr.msg_id);
            }
            m.erase_unexpected(found);
        }
        if (ep) ep->write_rx_cq({a.context, cq_flags, size, nullptr, data, tag, src}, src);
        return 0;
    }
    // FI_CLAIM: deliver (or discard) the message claimed by an earlier peek.
    Unexpected ux;
    if (!m.take_claimed(a.context, ux)) return -FI_EINVAL;
    Endpoint *ep = ux.ep ? ux.ep : report_ep;
    if (a.flags & FI_DISCARD) {
        if (ux.peer_entry) {
            PeerRxQueue::of(ux.peer_entry)->discard(ux.peer_entry);
        } else if (ux.rendezvous()) {
            wire::FinBody fin{ux.hdr.msg_id, uint32_t(wire::FinStatus::Ok), 0};
            ep->send_control(ux.conn, wire::ProtoOp::Fin, &fin, sizeof fin, ux.hdr.msg_id);
        }
        fi_addr_t src = source_of(ux);
        if (ux.hdr.flags & wire::kProtoCqData) cq_flags |= FI_REMOTE_CQ_DATA;
        if (ep)
            ep->write_rx_cq({a.context, cq_flags, 0, nullptr, ux.hdr.cq_data, ux.hdr.tag, src},
                            src);
        return 0;
    }
    RxOp *rx = m.new_op();
    *rx = probe;
    ++m.outstanding;
    deliver_unexpected_any(rx, ux);
    return 0;
}

// For a multi-receive buffer: carve the next message's slice; retire the buffer once less
// than FI_OPT_MIN_MULTI_RECV bytes are left.
RxOp *Endpoint::slice_for(RxMatcher &m, RxOp *rx, size_t len) {
    if (!rx->multi) return rx;
    size_t left = rx->total - rx->consumed;
    size_t take = std::min(len, left);
    RxOp *slice = m.new_op();
    slice->context = rx->context;
    slice->op_flags = rx->op_flags & ~uint64_t(FI_MULTI_RECV);
    slice->count = 1;
    slice->iov[0] = {static_cast<uint8_t *>(rx->iov[0].iov_base) + rx->consumed, take};
    slice->mem[0] = rx->mem[0];
    slice->desc[0] = rx->desc[0];
    slice->device = rx->device;
    slice->total = take;
    slice->parent = rx;
    slice->deferred = rx->deferred;
    slice->work_cntr = rx->work_cntr;
    rx->consumed += take;
    rx->children++;
    if (rx->total - rx->consumed < m.min_multi_recv || rx->total == rx->consumed) {
        rx->retired = true;
        m.remove_posted(rx);
    }
    return slice;
}

fi_addr_t Endpoint::source_of(LinkConnection *conn) {
    if (type_ != FI_EP_RDM || !conn) return FI_ADDR_NOTAVAIL;
    auto *peer = static_cast<Peer *>(conn->context);
    if (!peer || !av_) return FI_ADDR_NOTAVAIL;
    if (peer->av_version != av_->version()) {
        peer->addr = av_->addr_of(peer->name);
        peer->av_version = av_->version();
    }
    return peer->addr;
}

// A matched message joins its peer's order queue (see RxOp::order_queue).
void Endpoint::keep_order(RxOp *rx, LinkConnection *conn) {
    auto *peer = conn ? static_cast<Peer *>(conn->context) : nullptr;
    if (!peer) return;
    peer->rx_order.push_back(rx);
    rx->order_queue = &peer->rx_order;
}

void Endpoint::rx_complete(RxOp *rx, size_t len, uint64_t tag, uint64_t data, uint8_t proto_flags,
                           fi_addr_t src, int err, size_t olen) {
    rx->done = true;
    rx->done_len = len;
    rx->done_tag = tag;
    rx->done_data = data;
    rx->done_proto_flags = proto_flags;
    rx->done_src = src;
    rx->done_err = err;
    rx->done_olen = olen;
    std::deque<RxOp *> *queue = rx->order_queue;
    if (!queue) {
        report_rx(rx);
        return;
    }
    while (!queue->empty() && queue->front()->done) {
        RxOp *next = queue->front();
        queue->pop_front();
        report_rx(next);
    }
}

[[gnu::always_inline]] inline void Endpoint::whole_into(RxMatcher &m, RxOp *rx,
                                                        const peer::WholeMessage &msg) {
    size_t n = msg.len;
    if (rx->count == 1 && n <= rx->iov[0].iov_len) [[likely]]
        copy_bytes(rx->iov[0].iov_base, msg.data, n);
    else
        n = iov_scatter(rx->iov, rx->count, 0, msg.data, n);
    const size_t olen = msg.len - n;
    if (olen || rx->deferred || rx->order_queue || rx->parent || (rx->op_flags & FI_PEER_TRANSFER))
        [[unlikely]] {
        rx_complete(rx, n, msg.tag, msg.cq_data,
                    uint8_t((msg.tagged ? wire::kProtoTagged : 0) |
                            (msg.has_data ? wire::kProtoCqData : 0)),
                    msg.src, olen ? FI_ETRUNC : 0, olen);
        return;
    }
    if (recv_cntr_) recv_cntr_->inc();
    if (rx_cq_ && (!rx_selective_ || (rx->op_flags & FI_COMPLETION)))
        rx_cq_->push(
            rx->context,
            FI_RECV | (msg.tagged ? FI_TAGGED : FI_MSG) | (msg.has_data ? FI_REMOTE_CQ_DATA : 0), n,
            rx->count ? rx->iov[0].iov_base : nullptr, msg.cq_data, msg.tag, msg.src,
            &rx_completions_);
    --m.outstanding;
    m.free_op(rx);
}

void Endpoint::complete_whole(RxMatcher &m, RxOp *rx, const peer::WholeMessage &msg) {
    whole_into(m, rx, msg);
}

// A Short cell into the posted receive that takes it whole (host memory, no multi-receive
// buffer), as the twin's handle_short and PeerRxQueue::deliver_whole would put it there;
// false when none does (nothing taken: the twin queues or delivers the message).
[[gnu::always_inline]] inline bool Endpoint::take_short(const uint8_t *cell) {
    ShortView v;
    if (!read_short(cell, v)) return false;  // (the twin drops it, and says so)
    const uint64_t version = av_version_word_->load(std::memory_order_acquire);
    fi_addr_t src;
    if (last_sender_.matches(v.sender, version)) {
        src = last_sender_.addr;
    } else {
        src = av_->addr_of_bytes(v.sender.data(), v.sender.size());
        last_sender_.remember(v.sender, version, src);
    }
    const bool tagged = v.flags & wire::kLocalTagged;
    RxMatcher &m = *rx_;
    RxOp *rx = m.match_plain(tagged, v.tag, src);
    if (!rx) return false;
    whole_into(m, rx,
               {.data = v.data,
                .len = v.size,
                .tag = v.tag,
                .cq_data = v.cq_data,
                .src = src,
                .tagged = tagged,
                .has_data = (v.flags & wire::kLocalCqData) != 0});
    return true;
}

void Endpoint::take_local(const uint8_t *cell) {
    for (int i = 0; i < 64; ++i) {
        if (cell[0] != static_cast<uint8_t>(wire::LocalOp::Short) || !take_short(cell)) {
            twin_progress_(twin_ep_);
            return;
        }
        inbox_ring_->release();
        cell = static_cast<const uint8_t *>(inbox_ring_->peek());
        if (!cell) return;
    }
}

void Endpoint::report_rx(RxOp *rx) {
    uint64_t flags = FI_RECV | ((rx->done_proto_flags & wire::kProtoTagged) ? FI_TAGGED : FI_MSG);
    if (rx->done_proto_flags & wire::kProtoCqData) flags |= FI_REMOTE_CQ_DATA;
    RxOp *parent = rx->parent;
    if (parent) {
        parent->children--;
        if (parent->retired && parent->children == 0) flags |= FI_MULTI_RECV;
    }
    void *buf = rx->count ? rx->iov[0].iov_base : nullptr;
    if (rx->op_flags & FI_PEER_TRANSFER) {
        if (local_)
            local_->transfer_done(
                {rx->context, flags, rx->done_len, buf, rx->done_data, rx->done_tag}, rx->done_err,
                rx->done_olen, rx->done_src);
    } else if (rx->done_err) {
        write_rx_err(rx, flags, rx->done_err, rx->done_len, rx->done_olen, rx->done_tag,
                     rx->done_data);
    } else {
        if (Cntr *cntr = rx->deferred ? rx->work_cntr : recv_cntr_) cntr->inc();
        // The release of a multi-receive buffer is reported even under selective
        // completion (fi_msg(3)): it hands the buffer back. Deferred work reports only
        // what asked for FI_COMPLETION (fi_trigger(3)).
        const bool selective = rx_selective_ || rx->deferred;
        if (!selective || (rx->op_flags & FI_COMPLETION) || (flags & FI_MULTI_RECV))
            write_rx_cq(
                {rx->context, flags, rx->done_len, buf, rx->done_data, rx->done_tag, rx->done_src},
                rx->done_src);
    }
    if (parent) {
        matcher_of(rx).free_op(rx);
        if (parent->retired && parent->children == 0) release_rx(parent);
    } else {
        release_rx(rx);
    }
}

void Endpoint::release_rx(RxOp *rx) {
    RxMatcher &m = matcher_of(rx);
    --m.outstanding;
    m.free_op(rx);
}

void Endpoint::deliver_eager(RxOp *rx, LinkConnection *conn, const wire::ProtoHeader &hdr,
                             const uint8_t *payload, fi_addr_t src) {
    keep_order(rx, conn);
    size_t copied = 0;
    int err = 0;
    if (!rx->device) {
        copied = iov_scatter(rx->iov, rx->count, 0, payload, hdr.size);
    } else if (link_decision(hdr.size) == hmem::P2pDecision::Fail) {
        err = FI_EOPNOTSUPP;
    } else {
        ssize_t got = hmem::scatter(rx->iov, rx->mem, rx->count, 0, payload, hdr.size);
        if (got < 0)
            err = FI_EIO;
        else
            copied = static_cast<size_t>(got);
    }
    if (!err && copied < hdr.size) err = FI_ETRUNC;
    rx_complete(rx, copied, hdr.tag, hdr.cq_data, hdr.flags, src, err, hdr.size - copied);
}

void Endpoint::start_rendezvous(RxOp *rx, LinkConnection *conn, const wire::ProtoHeader &hdr,
                                const wire::RtsBody &rts, fi_addr_t src) {
    keep_order(rx, conn);
    rx->conn = conn;
    rx->msg_id = hdr.msg_id;
    rx->msg_len = hdr.size;
    rx->recv_len = std::min<size_t>(hdr.size, rx->total);
    rx->cq_data = hdr.cq_data;
    rx->msg_tag = hdr.tag;
    rx->proto_flags = hdr.flags;
    rx->msg_src = src;
    rx->reads = 0;
    if (rx->device && link_decision(rx->recv_len) == hmem::P2pDecision::Fail) {
        rx->error = FI_EOPNOTSUPP;
        finish_rendezvous(rx);
        return;
    }
    // Walk the sender's buffers and ours together; one RDMA read per overlapping piece.
    iovec theirs[wire::kMaxRtsIov];
    size_t ntheirs = std::min<size_t>(rts.iov_count, wire::kMaxRtsIov);
    for (size_t j = 0; j < ntheirs; ++j)
        theirs[j] = {reinterpret_cast<void *>(rts.iov[j].addr), rts.iov[j].length};
    iov_walk2(rx->iov, rx->count, theirs, ntheirs, rx->recv_len,
              [&](size_t i, uint8_t *mine, size_t j, uint8_t *at, size_t n) {
                  iovec local{mine, n};
                  RemoteRegion remote{reinterpret_cast<uint64_t>(at), rts.iov[j].key};
                  if (conn->post_read(&local, rx->device ? &rx->mem[i] : nullptr, 1, remote,
                                      wr_id(rx, kWrRxRead))) {
                      rx->error = FI_ECONNRESET;
                      return false;
                  }
                  ++rx->reads;
                  return true;
              });
    if (rx->reads == 0) finish_rendezvous(rx);
}

void Endpoint::finish_rendezvous(RxOp *rx) {
    wire::FinBody fin{rx->msg_id,
                      uint32_t(rx->error ? wire::FinStatus::ReadFailed : wire::FinStatus::Ok), 0};
    send_control(rx->conn, wire::ProtoOp::Fin, &fin, sizeof fin, rx->msg_id);
    int err = rx->error ? FI_EIO : (rx->recv_len < rx->msg_len ? FI_ETRUNC : 0);
    if (rx->error == FI_ECONNRESET || rx->error == FI_EOPNOTSUPP) err = rx->error;
    rx_complete(rx, rx->recv_len, rx->msg_tag, rx->cq_data, rx->proto_flags, rx->msg_src, err,
                rx->msg_len - rx->recv_len);
}

// The posted receive a message from a link goes to (its slice of a multi-receive buffer), or
// nullptr: then it is kept as unexpected (keep_unexpected) until a receive comes.
[[gnu::always_inline]] inline RxOp *Endpoint::match_from_link(const wire::ProtoHeader &hdr,
                                                              fi_addr_t src) {
    RxMatcher &m = matcher_for(hdr.flags);
    RxOp *rx = m.match_posted(hdr.flags & wire::kProtoTagged, hdr.tag, src);
    return rx ? slice_for(m, rx, hdr.size) : nullptr;
}

void Endpoint::keep_unexpected(LinkConnection *conn, Unexpected &&ux) {
    ux.ep = this;
    ux.conn = conn;
    matcher_for(ux.hdr.flags).push_unexpected(std::move(ux));
}

// The message kinds of handle_message: false when the message is malformed (nothing done).
// An eager message is the link's small-message path: inline into handle_message.
[[gnu::always_inline]] inline bool Endpoint::receive_eager(LinkConnection *conn,
                                                           const wire::ProtoHeader &hdr,
                                                           const uint8_t *body, size_t body_len) {
    if (hdr.size != body_len) return false;
    fi_addr_t src = source_of(conn);
    if (hdr.flags & wire::kProtoAckReq)
        send_control(conn, wire::ProtoOp::DeliveryAck, nullptr, 0, hdr.msg_id);
    if (RxOp *rx = match_from_link(hdr, src)) {
        deliver_eager(rx, conn, hdr, body, src);
        return true;
    }
    Unexpected ux;
    ux.hdr = hdr;
    ux.data.assign(body, body + body_len);
    keep_unexpected(conn, std::move(ux));
    return true;
}

bool Endpoint::receive_rts(LinkConnection *conn, const wire::ProtoHeader &hdr, const uint8_t *body,
                           size_t body_len) {
    wire::RtsBody rts{};
    if (body_len < sizeof rts) return false;
    memcpy(&rts, body, sizeof rts);
    if (rts.iov_count == 0 || rts.iov_count > wire::kMaxRtsIov) return false;
    uint64_t total = 0;
    for (uint32_t i = 0; i < rts.iov_count; ++i) total += rts.iov[i].length;
    if (total != hdr.size) return false;
    fi_addr_t src = source_of(conn);
    if (RxOp *rx = match_from_link(hdr, src)) {
        start_rendezvous(rx, conn, hdr, rts, src);
        return true;
    }
    Unexpected ux;
    ux.hdr = hdr;
    ux.rts = rts;
    keep_unexpected(conn, std::move(ux));
    return true;
}

// A Fin or a DeliveryAck: the peer is done with an operation that waited for it.
bool Endpoint::remote_done(const wire::ProtoHeader &hdr, const uint8_t *body, size_t body_len) {
    auto it = await_remote_.find(hdr.msg_id);
    if (it == await_remote_.end()) return false;
    TxOp *op = it->second;
    await_remote_.erase(it);
    if (hdr.op == static_cast<uint8_t>(wire::ProtoOp::Fin)) {
        wire::FinBody fin{};
        if (body_len >= sizeof fin) memcpy(&fin, body, sizeof fin);
        if (fin.status == uint32_t(wire::FinStatus::AccessDenied))
            op->error = FI_EACCES;
        else if (fin.status != uint32_t(wire::FinStatus::Ok))
            op->error = FI_EIO;
        if (!op->error && op->stage_back) {
            // A served read of device memory: the data came to host memory.
            if (hmem::scatter(op->iov.data(), op->mem.data(), op->iov.size(), 0,
                              op->inject_copy.data(), op->len) < 0)
                op->error = FI_EIO;
        }
    }
    op->await_remote = false;
    if (op->link_wrs == 0) finish_tx(op);
    return true;
}

bool Endpoint::receive_write_notify(LinkConnection *conn, const wire::ProtoHeader &hdr,
                                    const uint8_t *body, size_t body_len) {
    wire::WriteNotifyBody n{};
    if (body_len < sizeof n) return false;
    memcpy(&n, body, sizeof n);
    fi_addr_t src = source_of(conn);
    if (rx_cq_)
        write_rx_cq({nullptr, FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA, n.length, nullptr,
                     hdr.cq_data, 0, src},
                    src);
    return true;
}

// A protocol message that came over a link; one that is malformed is dropped, and said so.
void Endpoint::handle_message(LinkConnection *conn, const uint8_t *buf, size_t len) {
    wire::ProtoHeader hdr;
    if (len < sizeof hdr) {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a runt message (%zu bytes)\n", len);
        return;
    }
    memcpy(&hdr, buf, sizeof hdr);
    const uint8_t *body = buf + sizeof hdr;
    size_t body_len = len - sizeof hdr;
    bool ok = false;
    switch (static_cast<wire::ProtoOp>(hdr.op)) {
        case wire::ProtoOp::Eager:
            ok = receive_eager(conn, hdr, body, body_len);
            break;
        case wire::ProtoOp::Rts:
            ok = receive_rts(conn, hdr, body, body_len);
            break;
        case wire::ProtoOp::Fin:
        case wire::ProtoOp::DeliveryAck:
            ok = remote_done(hdr, body, body_len);
            break;
        case wire::ProtoOp::WriteNotify:
            ok = receive_write_notify(conn, hdr, body, body_len);
            break;
        case wire::ProtoOp::AtomicReq:
            ok = hdr.size == body_len;
            if (ok) serve_atomic(conn, hdr, body, body_len);
            break;
        case wire::ProtoOp::AtomicResp:
            ok = hdr.size == body_len && finish_atomic(hdr, body, body_len);
            break;
        case wire::ProtoOp::RmaReq:
            ok = serve_rma(conn, hdr, body, body_len);
            break;
    }
    if (!ok)
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed message (op %u, %zu bytes)\n", hdr.op,
                    len);
}

void Endpoint::repost(void *buf) {
    transport_->post_recv(buf, rx_buf_size_, wr_id(static_cast<uint8_t *>(buf), kWrBuffer));
}

void Endpoint::handle_wc(const WorkCompletion &wc) {
    switch (static_cast<WrKind>(wc.wr_id & kWrKindMask)) {
        case kWrBuffer: {
            auto *buf = wr_ptr<uint8_t>(wc.wr_id);
            if (wc.status == WcStatus::Success && wc.conn && wc.conn->context &&
                !hold_behind_served(wc.conn, buf, wc.byte_len))
                handle_message(wc.conn, buf, wc.byte_len);
            repost(buf);
            return;
        }
        case kWrTx: {
            TxOp *op = wr_ptr<TxOp>(wc.wr_id);
            if (wc.status != WcStatus::Success && !op->error) op->error = error_of(wc.status);
            if (--op->link_wrs > 0) return;
            if (op->error) {
                // No Fin / ack will come for an operation whose request failed.
                if (op->await_remote) await_remote_.erase(op->id);
                finish_tx(op);
                return;
            }
            if (!op->await_remote) finish_tx(op);
            return;
        }
        case kWrRxRead: {
            RxOp *rx = wr_ptr<RxOp>(wc.wr_id);
            if (wc.status != WcStatus::Success && !rx->error) rx->error = error_of(wc.status);
            if (--rx->reads == 0) finish_rendezvous(rx);
            return;
        }
        case kWrControl:
            delete wr_ptr<ControlMsg>(wc.wr_id);
            return;
        case kWrServed:
            served_done(wr_ptr<ServedRma>(wc.wr_id), wc.status);
            return;
        case kWrDirect:
            --tx_outstanding_;
            if (wc.status != WcStatus::Success)  // (reported complete when it was posted)
                TANDEM_INFO(FI_LOG_EP_DATA, "send completed at inject level failed later: %s\n",
                            fi_strerror(error_of(wc.status)));
            return;
    }
}

// At close, once the connections are down: the work requests they flushed still name our
// operations. Nothing is reported any more; what they hold is released. (An operation still
// waiting for a peer's Fin is released with await_remote_.)
void Endpoint::discard_link_work() {
    transport_->abort_all();  // what drain() could not close in time
    WorkCompletion wc[32];
    int n;
    while ((n = transport_->poll(wc, 32)) > 0) {
        for (int i = 0; i < n; ++i) {
            switch (static_cast<WrKind>(wc[i].wr_id & kWrKindMask)) {
                case kWrTx: {
                    TxOp *op = wr_ptr<TxOp>(wc[i].wr_id);
                    if (--op->link_wrs == 0 && !op->await_remote) retire_tx(op);
                    break;
                }
                case kWrRxRead: {
                    RxOp *rx = wr_ptr<RxOp>(wc[i].wr_id);
                    if (--rx->reads == 0) matcher_of(rx).free_op(rx);
                    break;
                }
                case kWrControl:
                    delete wr_ptr<ControlMsg>(wc[i].wr_id);
                    break;
                case kWrDirect:
                    --tx_outstanding_;
                    break;
                case kWrServed:
                    break;  // the jobs go below, unanswered
                case kWrBuffer:
                    break;  // our receive buffers, freed with the endpoint
            }
        }
    }
    // (An op the link never flushed stays out: it goes with the endpoint, its keys with the
    // domain.)
    for (auto &[id, op] : await_remote_)
        if (op->link_wrs == 0) retire_tx(op);
    await_remote_.clear();
    discard_served();
}

void Endpoint::fail_peer(Peer *peer, int err) {
    while (!peer->waiting.empty()) {
        TxOp *op = peer->waiting.front();
        peer->waiting.pop_front();
        fail_tx(op, err);
    }
    while (!peer->held.empty()) {
        TxOp *op = peer->held.front();
        peer->held.pop_front();
        fail_tx(op, err);
    }
    // Operations waiting for a Fin or an ack from this peer will never get one.
    for (auto it = await_remote_.begin(); it != await_remote_.end();) {
        TxOp *op = it->second;
        if (op->peer != peer) {
            ++it;
            continue;
        }
        it = await_remote_.erase(it);
        op->await_remote = false;
        op->error = err;
        if (op->link_wrs == 0) finish_tx(op);
    }
}

// The link's side of a progress pass, and what the twin's transfers left to report. Due on
// every pass while the link has anything to do; while the transport is idle (no connection:
// every peer so far is node-local, or none yet) only every kIdleLinkPolls-th pass, as the
// transport has only its listener, which need not cost a busy poll of the node-local path on
// every pass: a peer that connects is accepted at a later pass, or at the first pass after
// the application slept on the descriptors (wait_fds). Connections that have been silent for
// a long while (collectives' and other peer transfers' connections while the traffic is
// node-local), with nothing to write, are read every kQuietLinkPolls-th pass only, which spares
// the node-local path a system call per socket on most passes. A poll that finds anything, or
// anything to write, brings back a poll on every pass; so does every operation that gives the
// link work (poll_link_soon).
void Endpoint::progress_link() {
    if (shutdown_held_) post_held_shutdown();
    WorkCompletion wc[32];
    int found = 0;
    for (;;) {
        int n = transport_->poll(wc, 32);
        for (int i = 0; i < n; ++i) handle_wc(wc[i]);
        found += n;
        if (n < 32) break;
    }
    CmEvent ev;
    while (transport_->poll_cm(ev)) {
        handle_cm_event(ev);
        ++found;
    }
    empty_link_polls_ = found ? 0 : empty_link_polls_ + 1;
    // The passes until the next poll.
    if (shutdown_held_)
        link_countdown_ = 1;
    else if (transport_->idle())
        link_countdown_ = kIdleLinkPolls;
    else if (empty_link_polls_ >= kQuietAfter && !transport_->busy())
        link_countdown_ = kQuietLinkPolls;
    else
        link_countdown_ = 1;
    // Completions of the twin's own transfers, delivered last and outside every other call
    // into it (fi_peer(3): no recursion into its callbacks).
    if (local_) local_->flush_transfers();
}

ssize_t Endpoint::cancel(void *context) {
    std::lock_guard guard(domain_->lock());
    return cancel_locked(context);
}

ssize_t Endpoint::cancel_locked(void *context) {
    // A triggered operation that has not started is cancelled in off_tandem's queue (its
    // FI_ECANCELED completion written by the discard); one that started is an ordinary
    // operation from then on.
    if (tx_triggered_ + rx_triggered_) {
        OffloadDomain *off = domain_->offload();
        if (off && off->triggers() && off->triggers()->cancel(off->domain(), this, context) == 0) {
            domain_->note_triggers();
            return 0;
        }
    }
    ssize_t ret = cancel_on(*rx_, this, context);
    if (ret != -FI_ENOENT || !local_) return ret;
    // The offload twin's own receives (FI_PEER_TRANSFER): it hears of the cancellation
    // through its transfer callbacks, at the end of the pass, like of any of its transfers.
    RxOp *rx = peer_rx_.cancel(context);
    if (!rx) return -FI_ENOENT;
    local_->transfer_done({rx->context, FI_RECV | FI_TAGGED, 0, nullptr, 0, rx->tag}, FI_ECANCELED,
                          0, FI_ADDR_NOTAVAIL);
    --peer_rx_.outstanding;
    peer_rx_.free_op(rx);
    return 0;
}

ssize_t Endpoint::cancel_on(RxMatcher &m, Endpoint *report_ep, void *context) {
    RxOp *rx = m.cancel(context);
    if (!rx) return -FI_ENOENT;
    uint64_t flags = FI_RECV | (rx->tagged ? FI_TAGGED : FI_MSG);
    if (rx->multi) flags |= FI_MULTI_RECV;
    if (report_ep) report_ep->write_rx_err(rx, flags, FI_ECANCELED, 0, 0, rx->tag, 0);
    if (rx->multi && rx->children) {
        rx->retired = true;  // slices still to complete: the last one releases it
    } else {
        --m.outstanding;
        m.free_op(rx);
    }
    return 0;
}

bool Endpoint::resolve(uint64_t key, uint64_t addr, size_t len, uint64_t access,
                       LocalPieces &out) noexcept {
    return domain_->mr_table().resolve(key, addr, len, access, out);
}

void Endpoint::remote_access_done(uint64_t key, uint64_t access) noexcept {
    MemoryRegion *mr = domain_->mr_table().find(key);
    if (!mr) return;  // protocol-internal (rendezvous) access: not the application's event
    mr->count_remote_access(access);
    if (access == FI_REMOTE_WRITE && rwrite_cntr_) rwrite_cntr_->inc();
    if (access == FI_REMOTE_READ && rread_cntr_) rread_cntr_->inc();
}

// The tables of the message and tagged calls, here with the calls (see endpoint_alias.h).
fi_ops_msg ep_msg_ops = {
    .size = sizeof(fi_ops_msg),
    .recv = &DataCall<&Endpoint::msg_recv>::call,
    .recvv = &DataCall<&Endpoint::msg_recvv>::call,
    .recvmsg = &DataCall<&Endpoint::msg_recvmsg>::call,
    .send = &DataCall<&Endpoint::msg_send>::call,
    .sendv = &DataCall<&Endpoint::msg_sendv>::call,
    .sendmsg = &DataCall<&Endpoint::msg_sendmsg>::call,
    .inject = &DataCall<&Endpoint::msg_inject>::call,
    .senddata = &DataCall<&Endpoint::msg_senddata>::call,
    .injectdata = &DataCall<&Endpoint::msg_injectdata>::call,
};

fi_ops_tagged ep_tagged_ops = {
    .size = sizeof(fi_ops_tagged),
    .recv = &DataCall<&Endpoint::tag_recv>::call,
    .recvv = &DataCall<&Endpoint::tag_recvv>::call,
    .recvmsg = &DataCall<&Endpoint::tag_recvmsg>::call,
    .send = &DataCall<&Endpoint::tag_send>::call,
    .sendv = &DataCall<&Endpoint::tag_sendv>::call,
    .sendmsg = &DataCall<&Endpoint::tag_sendmsg>::call,
    .inject = &DataCall<&Endpoint::tag_inject>::call,
    .senddata = &DataCall<&Endpoint::tag_senddata>::call,
    .injectdata = &DataCall<&Endpoint::tag_injectdata>::call,
};

}  // namespace tandem
