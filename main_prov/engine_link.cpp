// The endpoint's protocol over a link: the messages that arrive, the link's work completions,
// control messages, and the link's part of a progress pass.
//
// A message of at most eager_limit bytes travels as one link send (ProtoHeader + payload)
// into a posted link buffer and is copied into the matching receive (or kept as unexpected).
// A larger one sends a ProtoHeader + RtsBody naming the source buffers under internal keys;
// the receiver, once matched, RDMA-reads straight into the application's buffer and answers
// with a Fin, which completes the send. Nothing larger than one link buffer is ever held at
// the receiver for a message nobody asked for.
#include "common/iov.h"
#include "common/log.h"
#include "hmem/atomic.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"
#include "main_prov/engine_wr.h"
#include "main_prov/local_path.h"

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

void Engine::send_control(LinkConnection *conn, wire::ProtoOp op, const void *body, size_t len,
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

// conn == nullptr: a node-local message (a Short or Eager cell). A device receive
// then refuses it only under FI_HMEM_P2P_REQUIRED, as the twin decides for the cells it
// delivers: nothing about a message in a host cell is peer to peer, and no link decides.
int Engine::deliver_eager(RxOp *rx, LinkConnection *conn, const wire::ProtoHeader &hdr,
                          const uint8_t *payload, fi_addr_t src) {
    keep_order(rx, conn);
    size_t copied = 0;
    int err = 0;
    if (!rx->device) {
        copied = iov_scatter(rx->iov, rx->count, 0, payload, hdr.size);
    } else if (conn ? link_decision(hdr.size) == hmem::P2pDecision::Fail
                    : local_refuses_device(hdr.size)) {
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
    return err;
}

void Engine::start_rendezvous(RxOp *rx, LinkConnection *conn, const wire::ProtoHeader &hdr,
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

void Engine::finish_rendezvous(RxOp *rx) {
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
[[gnu::always_inline]] inline RxOp *Engine::match_from_link(const wire::ProtoHeader &hdr,
                                                            fi_addr_t src) {
    RxMatcher &m = matcher_for(hdr.flags);
    RxOp *rx = m.match_posted(hdr.flags & wire::kProtoTagged, hdr.tag, src);
    if (rx) return slice_for(m, rx, hdr.size);
    if (owner_srx_ && !(hdr.flags & wire::kProtoPeer)) [[unlikely]]
        return match_with_owner(hdr, src);
    return nullptr;
}

void Engine::keep_unexpected(LinkConnection *conn, Unexpected &&ux) {
    ux.ep = this;
    ux.conn = conn;
    Unexpected &kept = matcher_for(ux.hdr.flags).push_unexpected(std::move(ux));
    if (unqueued_entry_) [[unlikely]]
        queue_with_owner(kept);
}

// The message kinds of handle_message: false when the message is malformed (nothing done).
// An eager message is the link's small-message path: inline into handle_message.
[[gnu::always_inline]] inline bool Engine::receive_eager(LinkConnection *conn,
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

bool Engine::receive_rts(LinkConnection *conn, const wire::ProtoHeader &hdr, const uint8_t *body,
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
bool Engine::remote_done(const wire::ProtoHeader &hdr, const uint8_t *body, size_t body_len) {
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

bool Engine::receive_write_notify(LinkConnection *conn, const wire::ProtoHeader &hdr,
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
void Engine::handle_message(LinkConnection *conn, const uint8_t *buf, size_t len) {
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

void Engine::repost(void *buf) {
    transport_->post_recv(buf, rx_buf_size_, wr_id(static_cast<uint8_t *>(buf), kWrBuffer));
}

void Engine::handle_wc(const WorkCompletion &wc) {
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
void Engine::discard_link_work() {
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

void Engine::fail_peer(Peer *peer, int err) {
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
void Engine::progress_link() {
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

}  // namespace tandem
