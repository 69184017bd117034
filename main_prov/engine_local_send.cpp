// tandem's node-local messages of host memory that are no Short cell (engine_send.cpp writes
// those): the one encoder of tandem's Eager cells, Rts cells and Frag streams, each through the
// peer's Outbox in the channel, in the order of the peer's other cells. What ends them is
// decoded here too: the receiver's Fin, the Cts of a split copy (we write our part), the end
// of a stream (the last cell in the ring), and a peer's death. Our operation ids carry
// wire::kLocalOwnerOp, so that the answers in our inbox are told from the twin's.
#include "common/log.h"
#include "main_prov/engine.h"
#include "main_prov/local_path.h"
#include "main_prov/shm/channel.h"
#include "main_prov/shm/send_choice.h"
#include "main_prov/shm/single_copy.h"

#include <cstring>

namespace tandem {

// A message to a node-local peer. Of host memory: an Eager cell when it fits one, else by
// single copy (an Rts naming our buffers, which the receiver reads) or staged through the ring
// (Frag), as shm::stages_better judges. It completes once its cells are in the peer's ring
// (or in our backlog to it: they are copies), except an Rts, which completes at the Fin, and a
// delivery-complete send, which completes at the Fin the receiver sends once the message is in
// a receive buffer. Of device memory (`mem`, else null): peer to peer or staged by the
// device's copies (send_local_device), except an inject's, copied into host memory now and
// sent as host memory. Back-pressure as for a Short cell: -FI_EAGAIN while cells wait for room
// in the peer's ring.
ssize_t Engine::send_local(SendRequest &r, Peer *peer, const hmem::MemRef *mem) {
    if (!peer->lane->reachable()) [[unlikely]] {
        if (ssize_t ret = lane_refused(r, peer); ret != kNotTaken) return ret;
    }
    shm::PeerInbox &to = *peer->lane;
    if (!to.out.admits()) return -FI_EAGAIN;
    TxOp *op = new_send_op(r, peer);
    const size_t len = r.payload.len;
    const bool inject = r.flags & FI_INJECT;
    const bool device = mem && !inject;
    const bool rts = !device && len > wire::kLocalBodyRoom && to.cma;
    // The source stays the application's until the send completes, except an inject's
    // (copied now); an Rts keeps its list for the receiver's Cts, a device message for its
    // IPC handles or its device's copies.
    if (inject || rts || device) {
        if (int ret = take_payload(op, r.payload.iov, mem, r.payload.count, len, inject)) {
            free_tx(op);  // (the device could not copy an inject's payload)
            return ret;
        }
    }
    const iovec *iov = inject || rts ? op->iov.data() : r.payload.iov;
    const size_t count = inject || rts ? op->iov.size() : r.payload.count;
    op->hdr.tag = r.tag;
    op->hdr.cq_data = r.data;
    wire::LocalHeader hdr = local_header(op, wire::LocalOp::Eager);
    ++tx_outstanding_;
    double rts_ns = 0;
    if (device) {
        send_local_device(op, to, hdr);
    } else if (len <= wire::kLocalBodyRoom) {
        hdr.size = static_cast<uint32_t>(len);
        send_local_eager(op, to, hdr, iov, count, nullptr);
    } else if (rts && !shm::stages_better(to, len, &rts_ns)) {
        send_local_rts(op, to, hdr, shm::now_ns(), rts_ns);
    } else {
        send_local_frag(op, to, hdr, iov, count, nullptr);
    }
    return 0;
}

// The header of a cell of our message op (the size is the caller's).
wire::LocalHeader Engine::local_header(const TxOp *op, wire::LocalOp kind) {
    wire::LocalHeader hdr = local_->channel()->header(kind, op->id | wire::kLocalOwnerOp);
    hdr.flags = uint8_t(((op->cq_flags & FI_TAGGED) ? wire::kLocalTagged : 0) |
                        ((op->op_flags & FI_REMOTE_CQ_DATA) ? wire::kLocalCqData : 0) |
                        ((op->op_flags & FI_DELIVERY_COMPLETE) ? wire::kLocalAckReq : 0));
    hdr.tag = op->hdr.tag;
    hdr.cq_data = op->hdr.cq_data;
    hdr.total = op->len;
    return hdr;
}

// One cell (mem: device buffers the device copies out of; the copy can fail: FI_EIO, nothing
// sent).
void Engine::send_local_eager(TxOp *op, shm::PeerInbox &to, const wire::LocalHeader &hdr,
                              const iovec *iov, size_t count, const hmem::MemRef *mem) {
    if (!to.out.push_gather(local_->channel()->sender(), hdr, iov, count, 0, hdr.total, mem))
        [[unlikely]] {
        fail_tx(op, FI_EIO);  // (the device could not copy the payload: nothing was sent)
        return;
    }
    // Delivery complete: it waits for the receiver's Fin, which can only come with a later
    // read of our inbox (under the same lock), so it is registered after the push.
    if (hdr.flags & wire::kLocalAckReq)
        await_local(op, to, 0, 0);
    else
        finish_tx(op);
}

// Single copy: the receiver reads op->iov with CMA (half of it written by us after its Cts, from
// wire::kLocalSplitMin); the buffers are the application's until the Fin.
// posted_ns and rts_ns: what the choice of single copy expected (0: no choice made, a device
// message's host bounce).
void Engine::send_local_rts(TxOp *op, shm::PeerInbox &to, wire::LocalHeader hdr, int64_t posted_ns,
                            double rts_ns) {
    wire::LocalIov body[wire::kLocalMaxIov];
    size_t n = 0;
    for (const iovec &v : op->iov)
        if (v.iov_len) body[n++] = {reinterpret_cast<uint64_t>(v.iov_base), v.iov_len};
    hdr.op = static_cast<uint8_t>(wire::LocalOp::Rts);
    hdr.iov_count = static_cast<uint8_t>(n);
    hdr.size = static_cast<uint32_t>(n * sizeof(wire::LocalIov));  // (the list is the body)
    hdr.flags &= uint8_t(~wire::kLocalAckReq);  // the Fin comes anyway, once it is read
    await_local(op, to, posted_ns, rts_ns);
    to.out.push(local_->channel()->sender(), hdr, body, n * sizeof(wire::LocalIov));
}

// Staged: as many cells as it takes, cut from the source as the ring makes room; the stream's
// end (stream_ended) completes the send, or fails it.
// (mem: device buffers, which the device copies out of cell by cell.)
void Engine::send_local_frag(TxOp *op, shm::PeerInbox &to, wire::LocalHeader hdr, const iovec *iov,
                             size_t count, const hmem::MemRef *mem) {
    const bool ack = hdr.flags & wire::kLocalAckReq;
    hdr.op = static_cast<uint8_t>(wire::LocalOp::Frag);
    if (ack) await_local(op, to, 0, 0);
    shm::StreamEnd end{
        .kind = ack ? shm::StreamEnd::Kind::FailPending : shm::StreamEnd::Kind::CompleteTx,
        .context = op,
        .to = this};
    shm::Channel &channel = *local_->channel();
    to.out.push_stream(channel.sender(), hdr, iov, count, hdr.total, mem, end);
    flush_soon(channel);  // (the rest of the stream waits in the backlog)
}

void Engine::await_local(TxOp *op, shm::PeerInbox &to, int64_t posted_ns, double expected_ns,
                         bool ipc) {
    local_sends_.emplace(op->id | wire::kLocalOwnerOp,
                         LocalSend{op, &to, posted_ns, expected_ns, ipc});
    note_owner_waits();
}

// A Fin for one of our operations. Only the peer the operation went to answers it
// (local_send_to): a Fin in another's name (any local process of this user can write our
// inbox) would give the application its buffers back while the receiver may still read them.
void Engine::receive_fin(const uint8_t *cell) {
    wire::LocalHeader lh;
    memcpy(&lh, cell, sizeof lh);
    if (lh.name_len > wire::kLocalNameRoom) [[unlikely]] {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed Fin\n");
        return;
    }
    const std::string_view sender(reinterpret_cast<const char *>(cell + sizeof lh), lh.name_len);
    auto it = local_send_to(lh.msg_id, local_->channel()->sender_peer(sender));
    if (it != local_sends_.end()) finish_local_send(it, lh.status);
}

// Our operation msg_id, when `from` is the peer it went to; local_sends_.end() otherwise (it
// ended already: a death, a stream that failed; or another peer answers it, logged).
Engine::LocalSendMap::iterator Engine::local_send_to(uint64_t msg_id, const shm::PeerInbox *from) {
    auto it = local_sends_.find(msg_id);
    if (it == local_sends_.end() || shm::same_address(it->second.to, from)) [[likely]]
        return it;
    TANDEM_WARN(FI_LOG_EP_DATA, "ignoring an answer for an operation sent to another peer\n");
    return local_sends_.end();
}

// The receiver's answer (status 0, or its FI_* code) for our operation msg_id.
void Engine::finish_local_send(uint64_t msg_id, int status) {
    auto it = local_sends_.find(msg_id);
    if (it != local_sends_.end()) finish_local_send(it, status);  // (else ended already)
}

void Engine::finish_local_send(LocalSendMap::iterator it, int status) {
    const LocalSend s = it->second;
    local_sends_.erase(it);
    note_owner_waits();
    if (s.ipc && status == FI_EOPNOTSUPP && restage_local_send(s)) return;
    if (s.posted_ns && !status) shm::learn_lateness(*s.to, s.posted_ns, s.expected_ns);
    settle_tx(s.op, status);
}

// A stream of ours ended: its last cell is in the ring (0), or its peer died (FI_ECONNRESET).
void Engine::stream_ended(const shm::Stream &stream, int status) {
    if (stream.end.kind == shm::StreamEnd::Kind::FailPending) {
        if (status) finish_local_send(stream.hdr.msg_id, status);
        return;
    }
    settle_tx(static_cast<TxOp *>(stream.end.context), status);
}

// A receiver's Cts for an Rts of ours: our part written into its buffers (shm::SingleCopy).
void Engine::receive_cts(const uint8_t *cell) {
    wire::LocalHeader lh;
    memcpy(&lh, cell, sizeof lh);
    if (lh.name_len > wire::kLocalNameRoom || lh.iov_count > wire::kLocalMaxIov) [[unlikely]] {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed Cts\n");
        return;
    }
    const std::string_view sender(reinterpret_cast<const char *>(cell + sizeof lh), lh.name_len);
    shm::Channel &channel = *local_->channel();
    // (Refused, and its sender told, when its name does not lead to the process it names.)
    const shm::PeerInbox *from = channel.vouch_for_process(lh, sender);
    if (!from) return;
    // Only the peer the Rts went to asks for our part (anyone else's Cts is answered as one
    // for an operation we no longer have: nothing of ours written into its memory).
    auto it = local_send_to(lh.msg_id, from);
    const TxOp *op = it != local_sends_.end() ? it->second.op : nullptr;
    const bool source = op && !op->iov.empty();
    shm::SingleCopy::write_part(channel, lh, sender, cell + sizeof lh + wire::kLocalNameRoom,
                                source ? op->iov.data() : nullptr, source ? op->iov.size() : 0);
    flush_soon(channel);
}

// What waited on a peer found dead fails (its streams ended already, with the peer's backlog).
void Engine::fail_sends_to_dead() {
    for (auto it = local_sends_.begin(); it != local_sends_.end();) {
        if (!it->second.to->dead) {
            ++it;
            continue;
        }
        TxOp *op = it->second.op;
        it = local_sends_.erase(it);
        fail_tx(op, FI_ECONNRESET);
    }
    note_owner_waits();
}

}  // namespace tandem
