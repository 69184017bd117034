// The adapter's data calls of fi_msg and fi_tagged, with their tables (ep_msg_ops,
// ep_tagged_ops), and the engine's small-message path they take: a small send into a
// node-local peer's ring (send_by_lane) or straight onto an established connection
// (send_by_link), a receive of one buffer (recv_one), and the receiving end of the node-local
// path (read_inbox, receive_short). One translation unit for both sides of the adapter's
// boundary, so that each call is compiled into its DataCall trampoline with what it inlines
// (docs/latency.md, "Where the instructions went", item 8): move none of these out without
// counting scripts/path-profile.sh before and after.
//
// The general path behind them: engine_send.cpp (transmit side), engine_recv.cpp (receive
// side), engine_link.cpp (the protocol over a link), engine_rma.cpp (RMA).
#include "common/coarse_clock.h"
#include "common/iov.h"
#include "common/log.h"
#include "common/test_hook.h"
#include "main_prov/av.h"
#include "main_prov/cntr.h"
#include "main_prov/config.h"
#include "main_prov/domain.h"
#include "main_prov/endpoint.h"
#include "main_prov/endpoint_alias.h"
#include "main_prov/engine_wr.h"
#include "main_prov/local_path.h"
#include "peer/peer_abi.h"

#include <cstring>

namespace tandem {

// The Short cell into the peer's ring ourselves (its Outbox: shm::Outbox::claim), unless cells
// of the twin's wait for room there (ours would overtake them) or the ring is full.
[[gnu::always_inline]] inline ssize_t Engine::send_by_lane(shm::PeerInbox *lane, const void *buf,
                                                           size_t len, void *context,
                                                           uint64_t flags, uint64_t tag,
                                                           uint64_t data, bool tagged) {
    void *slot = lane->out.claim(lane_producer_);
    if (!slot) return kNotTaken;
    stop_at("local.ring_reserved");
    write_short(static_cast<uint8_t *>(slot), *lane_line_,
                uint8_t((tagged ? wire::kLocalTagged : 0) |
                        ((flags & FI_REMOTE_CQ_DATA) ? wire::kLocalCqData : 0)),
                buf, len, tag, data);
    lane->out.publish(slot);
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
[[gnu::always_inline]] inline ssize_t Engine::send_direct(const void *buf, size_t len, void *desc,
                                                          fi_addr_t dest, void *context,
                                                          uint64_t flags, uint64_t tag,
                                                          uint64_t data, bool tagged) {
    constexpr uint64_t kNotDirect = FI_TRIGGER | FI_DELIVERY_COMPLETE | FI_PEER_TRANSFER;
    if ((flags & kNotDirect) || len > direct_limit_ ||
        ((flags & FI_INJECT) && len > direct_inject_))
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
        if (len > lane_limit_) return kNotTaken;
        return send_by_lane(peer->lane, buf, len, context, flags, tag, data, tagged);
    }
    // Over the link only at the level the general path reports at once (FI_INJECT_COMPLETE:
    // the bytes are the link's), behind nothing of this peer's.
    if (peer->route == Peer::Route::Local || !peer->established || !peer->conn ||
        !peer->held.empty() || (flags & FI_TRANSMIT_COMPLETE) || len > link_direct_limit_)
        return kNotTaken;
    return send_by_link(peer, buf, len, context, flags, tag, data, tagged);
}

// The adapter's fi_msg / fi_tagged calls: each form maps onto the engine's post_send or
// post_recv, the one-buffer forms first onto its small-message path. Those are always inline:
// each is called only from its DataCall trampoline, and out of line its seven or eight
// arguments went through the stack (a tenth of fi_tsend).
namespace {

[[gnu::always_inline]] inline ssize_t msg_recv(Engine &e, const OpDefaults &d, void *buf,
                                               size_t len, void *desc, fi_addr_t src,
                                               void *context) {
    if (ssize_t ret = e.recv_one(buf, len, desc, src, 0, 0, context, d.rx, false);
        ret != Engine::kNotTaken)
        return ret;
    iovec iov{buf, len};
    return e.post_recv({&iov, &desc, 1, src, context, d.rx, 0, 0, false});
}

ssize_t msg_recvv(Engine &e, const OpDefaults &d, const iovec *iov, void **desc, size_t count,
                  fi_addr_t src, void *context) {
    return e.post_recv({iov, desc, count, src, context, d.rx, 0, 0, false});
}

ssize_t msg_recvmsg(Engine &e, const OpDefaults &, const fi_msg *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return e.post_recv({msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context,
                        flags & ~kNoCompletion, 0, 0, false});
}

[[gnu::always_inline]] inline ssize_t msg_send(Engine &e, const OpDefaults &d, const void *buf,
                                               size_t len, void *desc, fi_addr_t dest,
                                               void *context) {
    if (ssize_t ret = e.send_direct(buf, len, desc, dest, context, d.tx, 0, 0, false);
        ret != Engine::kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return e.post_send({&iov, &desc, 1, dest, context, d.tx, 0, 0, false});
}

ssize_t msg_sendv(Engine &e, const OpDefaults &d, const iovec *iov, void **desc, size_t count,
                  fi_addr_t dest, void *context) {
    return e.post_send({iov, desc, count, dest, context, d.tx, 0, 0, false});
}

ssize_t msg_sendmsg(Engine &e, const OpDefaults &, const fi_msg *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return e.post_send({msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context,
                        flags & ~kNoCompletion, 0, msg->data, false});
}

[[gnu::always_inline]] inline ssize_t msg_inject(Engine &e, const OpDefaults &, const void *buf,
                                                 size_t len, fi_addr_t dest) {
    if (ssize_t ret =
            e.send_direct(buf, len, nullptr, dest, nullptr, FI_INJECT | kNoCompletion, 0, 0, false);
        ret != Engine::kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return e.post_send({&iov, nullptr, 1, dest, nullptr, FI_INJECT | kNoCompletion, 0, 0, false});
}

[[gnu::always_inline]] inline ssize_t msg_senddata(Engine &e, const OpDefaults &d, const void *buf,
                                                   size_t len, void *desc, uint64_t data,
                                                   fi_addr_t dest, void *context) {
    if (ssize_t ret =
            e.send_direct(buf, len, desc, dest, context, d.tx | FI_REMOTE_CQ_DATA, 0, data, false);
        ret != Engine::kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return e.post_send({&iov, &desc, 1, dest, context, d.tx | FI_REMOTE_CQ_DATA, 0, data, false});
}

[[gnu::always_inline]] inline ssize_t msg_injectdata(Engine &e, const OpDefaults &, const void *buf,
                                                     size_t len, uint64_t data, fi_addr_t dest) {
    if (ssize_t ret = e.send_direct(buf, len, nullptr, dest, nullptr,
                                    FI_INJECT | FI_REMOTE_CQ_DATA | kNoCompletion, 0, data, false);
        ret != Engine::kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return e.post_send({&iov, nullptr, 1, dest, nullptr,
                        FI_INJECT | FI_REMOTE_CQ_DATA | kNoCompletion, 0, data, false});
}

[[gnu::always_inline]] inline ssize_t tag_recv(Engine &e, const OpDefaults &d, void *buf,
                                               size_t len, void *desc, fi_addr_t src, uint64_t tag,
                                               uint64_t ignore, void *context) {
    if (ssize_t ret = e.recv_one(buf, len, desc, src, tag, ignore, context, d.rx, true);
        ret != Engine::kNotTaken)
        return ret;
    iovec iov{buf, len};
    return e.post_recv({&iov, &desc, 1, src, context, d.rx, tag, ignore, true});
}

ssize_t tag_recvv(Engine &e, const OpDefaults &d, const iovec *iov, void **desc, size_t count,
                  fi_addr_t src, uint64_t tag, uint64_t ignore, void *context) {
    return e.post_recv({iov, desc, count, src, context, d.rx, tag, ignore, true});
}

ssize_t tag_recvmsg(Engine &e, const OpDefaults &, const fi_msg_tagged *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    const Engine::RecvArgs a{msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context,
                             flags,        msg->tag,  msg->ignore,    true};
    if (flags & (FI_PEEK | FI_CLAIM)) return e.peek_or_claim(a);
    return e.post_recv(a);
}

[[gnu::always_inline]] inline ssize_t tag_send(Engine &e, const OpDefaults &d, const void *buf,
                                               size_t len, void *desc, fi_addr_t dest, uint64_t tag,
                                               void *context) {
    if (ssize_t ret = e.send_direct(buf, len, desc, dest, context, d.tx, tag, 0, true);
        ret != Engine::kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return e.post_send({&iov, &desc, 1, dest, context, d.tx, tag, 0, true});
}

ssize_t tag_sendv(Engine &e, const OpDefaults &d, const iovec *iov, void **desc, size_t count,
                  fi_addr_t dest, uint64_t tag, void *context) {
    return e.post_send({iov, desc, count, dest, context, d.tx, tag, 0, true});
}

ssize_t tag_sendmsg(Engine &e, const OpDefaults &, const fi_msg_tagged *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return e.post_send({msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context,
                        flags & ~kNoCompletion, msg->tag, msg->data, true});
}

[[gnu::always_inline]] inline ssize_t tag_inject(Engine &e, const OpDefaults &, const void *buf,
                                                 size_t len, fi_addr_t dest, uint64_t tag) {
    if (ssize_t ret = e.send_direct(buf, len, nullptr, dest, nullptr, FI_INJECT | kNoCompletion,
                                    tag, 0, true);
        ret != Engine::kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return e.post_send({&iov, nullptr, 1, dest, nullptr, FI_INJECT | kNoCompletion, tag, 0, true});
}

[[gnu::always_inline]] inline ssize_t tag_senddata(Engine &e, const OpDefaults &d, const void *buf,
                                                   size_t len, void *desc, uint64_t data,
                                                   fi_addr_t dest, uint64_t tag, void *context) {
    if (ssize_t ret =
            e.send_direct(buf, len, desc, dest, context, d.tx | FI_REMOTE_CQ_DATA, tag, data, true);
        ret != Engine::kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return e.post_send({&iov, &desc, 1, dest, context, d.tx | FI_REMOTE_CQ_DATA, tag, data, true});
}

[[gnu::always_inline]] inline ssize_t tag_injectdata(Engine &e, const OpDefaults &, const void *buf,
                                                     size_t len, uint64_t data, fi_addr_t dest,
                                                     uint64_t tag) {
    if (ssize_t ret = e.send_direct(buf, len, nullptr, dest, nullptr,
                                    FI_INJECT | FI_REMOTE_CQ_DATA | kNoCompletion, tag, data, true);
        ret != Engine::kNotTaken)
        return ret;
    iovec iov{const_cast<void *>(buf), len};
    return e.post_send({&iov, nullptr, 1, dest, nullptr,
                        FI_INJECT | FI_REMOTE_CQ_DATA | kNoCompletion, tag, data, true});
}

}  // namespace

// An eager message the connection sends from the application's buffer before returning
// (LinkConnection::post_send_now): no operation, no copy of ours. Complete at once, as the
// general path completes an eager send once posted; the link's work request, acknowledged
// by the peer later, only gives back its place in the transmit queue (kWrDirect).
ssize_t Engine::send_by_link(Peer *peer, const void *buf, size_t len, void *context, uint64_t flags,
                             uint64_t tag, uint64_t data, bool tagged) {
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

ssize_t Engine::recv_one(void *buf, size_t len, void *desc, fi_addr_t src, uint64_t tag,
                         uint64_t ignore, void *context, uint64_t flags, bool tagged) {
    constexpr uint64_t kNotOne = FI_PEER_TRANSFER | FI_TRIGGER | FI_MULTI_RECV;
    if (flags & kNotOne) return kNotTaken;
    std::lock_guard guard(domain_->lock());
    RxMatcher &m = *rx_;
    if (!enabled_ || !(caps_ & (tagged ? FI_TAGGED : FI_MSG)) || m.has_unexpected(tagged) ||
        m.outstanding + rx_triggered_ >= info_->rx_attr->size ||
        (exact_source_ && src == FI_ADDR_UNSPEC))  // (post_recv refuses it)
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
    rx->src = rx_source(src, tagged);
    rx->tag = tag;
    rx->ignore = ignore;
    rx->tagged = tagged;
    ++m.outstanding;
    m.post(rx);
    return 0;
}

// RDM: whether operations to this peer go through the offload twin (see Peer::Route).
bool Engine::goes_local(Peer *peer, fi_addr_t addr) {
    if (!local_) return false;
    if (peer->route == Peer::Route::Undecided) {
        // (A node-local peer is one the twin's channel finds alive under its address.)
        shm::Channel *channel = Config::get().local_path ? local_->channel() : nullptr;
        shm::PeerInbox *to = channel ? channel->peer_at(addr) : nullptr;
        peer->lane = to && !to->dead ? to : nullptr;
        peer->route = peer->lane ? Peer::Route::Local : Peer::Route::Link;
        // (The node-local channel logs the peers it opens; this is the other half, which
        // tools read to tell which path a run met its peers on.)
        if (!peer->lane)
            TANDEM_INFO(FI_LOG_EP_CTRL, "peer at fi_addr %lu: over the link\n",
                        (unsigned long)addr);
    }
    return peer->route == Peer::Route::Local;
}

[[gnu::always_inline]] inline void Engine::short_into(RxMatcher &m, RxOp *rx, const ShortView &v,
                                                      fi_addr_t src) {
    size_t n = v.size;
    if (rx->count == 1 && n <= rx->iov[0].iov_len) [[likely]]
        copy_bytes(rx->iov[0].iov_base, v.data, n);
    else
        n = iov_scatter(rx->iov, rx->count, 0, v.data, n);
    const size_t olen = v.size - n;
    const bool tagged = v.flags & wire::kLocalTagged;
    const bool has_data = v.flags & wire::kLocalCqData;
    if (olen || rx->deferred || rx->order_queue || rx->parent || (rx->op_flags & FI_PEER_TRANSFER))
        [[unlikely]] {
        rx_complete(
            rx, n, v.tag, v.cq_data,
            uint8_t((tagged ? wire::kProtoTagged : 0) | (has_data ? wire::kProtoCqData : 0)), src,
            olen ? FI_ETRUNC : 0, olen);
        return;
    }
    if (recv_cntr_) recv_cntr_->inc();
    if (rx_cq_ && (!rx_selective_ || (rx->op_flags & FI_COMPLETION)))
        rx_cq_->push(rx->context,
                     FI_RECV | (tagged ? FI_TAGGED : FI_MSG) | (has_data ? FI_REMOTE_CQ_DATA : 0),
                     n, rx->count ? rx->iov[0].iov_base : nullptr, v.cq_data, v.tag,
                     av_->reported(src), &rx_completions_);
    --m.outstanding;
    m.free_op(rx);
}

// A Short cell, wherever it was read: into the first posted receive it matches, kept as
// unexpected when there is none (receive_short_slow). The common case, a plain host-memory
// receive already posted, inline.
[[gnu::always_inline]] inline void Engine::receive_short(const uint8_t *cell) {
    ShortView v;
    if (!read_short(cell, v)) [[unlikely]] {
        drop_malformed_short();
        return;
    }
    const fi_addr_t src = local_source(v.sender);
    RxMatcher &m = *rx_;
    if (RxOp *rx = m.match_plain(v.flags & wire::kLocalTagged, v.tag, src)) [[likely]] {
        short_into(m, rx, v, src);
        return;
    }
    receive_short_slow(cell, src);  // (the cell, not v: v stays in registers)
}

void Engine::drop_malformed_short() {
    TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed node-local cell\n");
}

void Engine::read_inbox(const uint8_t *cell) {
    // Our heartbeat (shm::Channel::beat): the twin beats it on its passes, which do not come
    // while each pass of ours finds a cell (a flood from several senders); senders would then
    // take us for a process without a core and stage their large messages. So every 32nd pass
    // that reads beats it too (the clock read costs about a pass).
    if ((++reading_passes_ & 31) == 0) [[unlikely]]
        local_->channel()->beat(coarse_now_ms());
    for (int i = 0; i < 64; ++i) {
        if (holds_->active()) [[unlikely]] {
            if (!read_held(cell)) return;
        } else if (cell[0] == static_cast<uint8_t>(wire::LocalOp::Short)) {
            receive_short(cell);
        } else {
            dispatch_cell(cell);
        }
        inbox_ring_->release();
        cell = static_cast<const uint8_t *>(inbox_ring_->peek());
        // (A cell the twin took may have lifted a hold: its sender's kept cells go next.)
        if (!cell && !holds_->has_released()) return;
    }
}

// While a sender is held or released cells wait: those first (they are older than anything
// of their sender's in the ring), then `cell` kept or dispatched. False: there was no cell.
bool Engine::read_held(const uint8_t *cell) {
    holds_->replay([this](const uint8_t *c) { dispatch_cell(c); });
    if (!cell) return false;
    if (!holds_->keep_if_held(cell)) dispatch_cell(cell);
    return true;
}

// The operation id of a long-header cell (an answer's: whose operation it ends).
static uint64_t answer_id(const uint8_t *cell) {
    uint64_t id;
    memcpy(&id, cell + offsetof(wire::LocalHeader, msg_id), sizeof id);
    return id;
}

// Messages are ours (Short, Eager, Frag, Rts, IpcRts, and the WriteDone of a split copy of
// ours), and the answers to our operations (Fin, Cts: ids with kLocalOwnerOp); RMA, atomics
// and the answers to the twin's operations are the twin's.
void Engine::dispatch_cell(const uint8_t *cell) {
    using wire::LocalOp;
    switch (static_cast<LocalOp>(cell[0])) {
        case LocalOp::Short:
            receive_short(cell);
            return;
        case LocalOp::Eager:
            receive_eager_cell(cell);
            return;
        case LocalOp::Frag:
            receive_frag(cell);
            return;
        case LocalOp::Rts:
            receive_rts_cell(cell);
            return;
        case LocalOp::IpcRts:
            receive_ipc_cell(cell);
            return;
        case LocalOp::WriteDone:
            if (!local_splits_.empty() && receive_write_done(cell)) return;
            break;
        case LocalOp::Fin:
            if (answer_id(cell) & wire::kLocalOwnerOp) {
                receive_fin(cell);
                return;
            }
            break;
        case LocalOp::Cts:
            if (answer_id(cell) & wire::kLocalOwnerOp) {
                receive_cts(cell);
                return;
            }
            break;
        default:
            break;
    }
    twin_take_cell_(twin_ep_, cell);
}

// The tables of the message and tagged calls, here with the calls (see endpoint_alias.h).
fi_ops_msg ep_msg_ops = {
    .size = sizeof(fi_ops_msg),
    .recv = &DataCall<&msg_recv>::call,
    .recvv = &DataCall<&msg_recvv>::call,
    .recvmsg = &DataCall<&msg_recvmsg>::call,
    .send = &DataCall<&msg_send>::call,
    .sendv = &DataCall<&msg_sendv>::call,
    .sendmsg = &DataCall<&msg_sendmsg>::call,
    .inject = &DataCall<&msg_inject>::call,
    .senddata = &DataCall<&msg_senddata>::call,
    .injectdata = &DataCall<&msg_injectdata>::call,
};

fi_ops_tagged ep_tagged_ops = {
    .size = sizeof(fi_ops_tagged),
    .recv = &DataCall<&tag_recv>::call,
    .recvv = &DataCall<&tag_recvv>::call,
    .recvmsg = &DataCall<&tag_recvmsg>::call,
    .send = &DataCall<&tag_send>::call,
    .sendv = &DataCall<&tag_sendv>::call,
    .sendmsg = &DataCall<&tag_sendmsg>::call,
    .inject = &DataCall<&tag_inject>::call,
    .senddata = &DataCall<&tag_senddata>::call,
    .injectdata = &DataCall<&tag_injectdata>::call,
};

}  // namespace tandem
