// Transmit side of the endpoint: a send's post and issue (a Short cell into a node-local ring,
// a larger node-local message of host memory by engine_local_send.cpp, device memory through
// the offload twin, or over a link as an Eager message or an Rts), and what every transmit shares
// once issued (RMA and atomics too): the order behind a peer's atomics, the start on a
// connection, the link's work requests, completion and failure, the operations' free list.
#include "common/iov.h"
#include "common/log.h"
#include "common/test_hook.h"
#include "main_prov/av.h"
#include "main_prov/cntr.h"
#include "main_prov/conn_hello.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"
#include "main_prov/engine_wr.h"
#include "main_prov/interfaces.h"
#include "main_prov/local_path.h"
#include "peer/peer_abi.h"

#include <algorithm>

namespace tandem {

// cap 0: an operation of the offload twin (FI_PEER_TRANSFER), which is tandem's own traffic
// and does not depend on what the application asked for (an endpoint without FI_TAGGED still
// carries its twin's collectives, which are tagged messages).
void Engine::check_tx_ready(uint64_t cap) const {
    if (!enabled_) fail(FI_EOPBADSTATE, "endpoint not enabled");
    if (cap && !(caps_ & cap)) fail(FI_EOPNOTSUPP, "capability not requested");
}

Peer *Engine::peer_for(fi_addr_t addr) {
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
int Engine::prepare_send(const SendArgs &a, SendRequest &r) const {
    if (int ret = r.payload.capture(a.iov, a.desc, a.count)) return ret;
    const SizeKind kind = a.tagged ? kTaggedSize : kMsgSize;
    if (r.payload.len > limits_.max[kind]) return -FI_EMSGSIZE;
    if ((a.flags & FI_INJECT) && r.payload.len > limits_.inject[kind]) return -FI_EMSGSIZE;
    r.dest = a.dest;
    r.context = a.context;
    r.flags = a.flags;
    r.tag = a.tag;
    r.data = a.data;
    r.tagged = a.tagged;
    return 0;
}

ssize_t Engine::post_send(const SendArgs &a) {
    SendRequest r;
    if (int ret = prepare_send(a, r)) return ret;
    std::lock_guard guard(domain_->lock());
    return post_send_locked(a, r);
}

ssize_t Engine::post_send_locked(const SendArgs &a, SendRequest &r) {
    check_tx_ready(a.flags & FI_PEER_TRANSFER ? 0 : a.tagged ? FI_TAGGED : FI_MSG);
    if (r.flags & FI_TRIGGER) return queue_triggered(TriggeredRequest(std::move(r)));
    if (!make_tx_room()) return -FI_EAGAIN;
    return issue_send(r);
}

// Room for one more transmit in the queue (tx_attr->size), after a progress pass if needed.
bool Engine::make_tx_room() {
    if (tx_outstanding_ + tx_triggered_ < info_->tx_attr->size) return true;
    progress();
    return tx_outstanding_ + tx_triggered_ < info_->tx_attr->size;
}

// Issue: start a prepared send, now (from the call) or later (from the trigger queue). The
// caller holds the domain lock and made room for it in the transmit queue.
ssize_t Engine::issue_send(SendRequest &r) {
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
    // (The twin's traffic crosses the link: node-local twins talk over their own rings.)
    if (!peer_transfer) {
        if (ssize_t ret = inject_local(r, peer, device); ret != kNotTaken) return ret;
        if (goes_local(peer, r.dest)) return send_local(r, peer, device ? mem : nullptr);
    }
    return send_over_link(new_send_op(r, peer), r, device, mem);
}

// A small node-local message of host memory is a Short cell: into the peer's ring through its
// lane (the one encoder of our Short cells; send_by_lane is its one-buffer form), complete once
// there (the data has reached the peer's endpoint: FI_TRANSMIT_COMPLETE), with no operation to
// allocate or complete later. Completions carry no order (comp_order FI_ORDER_NONE), so earlier
// operations still waiting for an answer (an Rts's Fin) do not hold it; the ring's order is
// the message order. Not for FI_DELIVERY_COMPLETE (the receiver answers: an Eager cell,
// send_local) or device memory (send_local_device). When cells wait for room in that ring
// (ours would overtake them) or the ring is full: -FI_EAGAIN, back-pressure as fi_msg(3)
// describes it, nothing queued without bound. When the peer died: an error completion
// (FI_ECONNRESET). kNotTaken when the message is not one for the lane, or when a new endpoint
// took the address of a peer that closed or died (send_local writes into its ring).
ssize_t Engine::inject_local(const SendRequest &r, Peer *peer, bool device) {
    if (device || (r.flags & FI_DELIVERY_COMPLETE) || !local_ || r.payload.len > lane_limit_ ||
        !goes_local(peer, r.dest) || !peer->lane)
        return kNotTaken;
    shm::Outbox &out = peer->lane->out;
    void *slot = out.claim(lane_producer_);
    if (!slot) [[unlikely]]
        return lane_refused(r, peer);
    stop_at("local.ring_reserved");
    write_short_gather(static_cast<uint8_t *>(slot), *lane_line_,
                       uint8_t((r.tagged ? wire::kLocalTagged : 0) |
                               ((r.flags & FI_REMOTE_CQ_DATA) ? wire::kLocalCqData : 0)),
                       r.payload.iov, r.payload.count, r.payload.len, r.tag, r.data);
    out.publish(slot);
    complete_injected(r);
    return 0;
}

// A lane that took no cell: it has no room now (-FI_EAGAIN), or its peer is not there any
// more (PeerInbox::reachable). A new endpoint at the peer's address is its peer from now on
// (relane): kNotTaken, the caller goes on into its ring. Else a peer whose endpoint closed
// (its process may run on) waits for one, or for the liveness check to judge the closed one
// dead (-FI_EAGAIN); a dead one fails the send with an error completion (FI_ECONNRESET), as
// any operation towards it.
ssize_t Engine::lane_refused(const SendRequest &r, Peer *peer) {
    const shm::PeerInbox &lane = *peer->lane;
    if (lane.reachable()) return -FI_EAGAIN;
    if (relane(peer, r.dest)) return kNotTaken;
    if (!lane.dead) return -FI_EAGAIN;
    TxOp *op = new_send_op(r, peer);
    ++tx_outstanding_;
    fail_tx(op, FI_ECONNRESET);
    return 0;
}

// A new process may have a dead peer's address now (a server restarted on its port): the
// channel then finds its inbox, which is this peer's lane from now on (true).
bool Engine::relane(Peer *peer, fi_addr_t dest) {
    shm::PeerInbox *now = local_->channel()->peer_at(dest);
    if (!now || !now->reachable()) return false;
    peer->lane = now;
    return true;
}

// The operation of a send that is not complete when issued, as it is reported.
TxOp *Engine::new_send_op(const SendRequest &r, Peer *peer) {
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

// A send over the link: an Eager message carrying the payload, or an Rts naming the source
// for the receiver to read.
ssize_t Engine::send_over_link(TxOp *op, const SendRequest &r, bool device,
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
int Engine::prepare_eager(TxOp *op, const SendRequest &r, bool device, const hmem::MemRef *mem) {
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
int Engine::prepare_rts(TxOp *op, const SendRequest &r, bool device, const hmem::MemRef *mem,
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

// Order between atomics and RMA over a link. The link applies an RMA write or read as its
// frames arrive (as a NIC does), while an atomic is executed by the target's protocol when it
// processes the message carrying it, later: an RMA posted behind an atomic to the same peer
// could overtake it, and FI_ORDER_RAW, WAR and WAW hold between atomics and RMA alike. So
// while a peer has atomics out, an RMA to it waits here (Peer::held) until their answers have
// come, and whatever is posted after a held operation waits behind it. Messages and atomics
// are delivered in the order they were sent, and RMA before an atomic lands before it, so
// nothing else waits.
void Engine::submit(TxOp *op) {
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
void Engine::release_held(Peer *peer) {
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

void Engine::start_tx(TxOp *op) {
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
void Engine::issue_tx(TxOp *op) {
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

Cntr *Engine::counter_for(const TxOp &op) const {
    if (op.deferred) return op.work_cntr;  // deferred work counts on its own counter only
    return tx_counter(op.cq_flags);
}

// The endpoint's counter of a transmit with these completion flags: sends, writes (atomics
// that return nothing among them), reads (and the fetch and compare atomics, which return
// data).
Cntr *Engine::tx_counter(uint64_t cq_flags) const {
    if (cq_flags & FI_SEND) return send_cntr_;
    return (cq_flags & FI_WRITE) ? write_cntr_ : read_cntr_;
}

// The operation is over (reported or failed): its keys, its queue slot and the op itself go.
void Engine::retire_tx(TxOp *op) {
    for (uint64_t key : op->internal_keys) domain_->mr_table().erase_internal(key);
    --tx_outstanding_;
    Peer *released = nullptr;
    if (op->fenced && --op->peer->atomics_out == 0 && !closing_) released = op->peer;
    free_tx(op);
    if (released) release_held(released);
}

// The payload an operation transmits: copied into its own bounce buffer (so the application
// may reuse its buffers at once; device memory is copied by its device), or the
// application's buffers themselves. 0 or a negative errno (a device copy failed).
int Engine::take_payload(TxOp *op, const iovec *iov, const hmem::MemRef *mem, size_t count,
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
bool Engine::memory_of(const iovec *iov, void **desc, size_t count, uint64_t flags,
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

hmem::P2pDecision Engine::link_decision(size_t len, size_t small) {
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

void Engine::tx_report(TxOp *op) {
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
void Engine::complete_injected(const SendRequest &r) {
    if (Cntr *cntr = r.done.deferred ? r.done.cntr : send_cntr_) cntr->inc();
    if (tx_cq_ && tx_reports(r.flags, r.done))
        tx_cq_->write({r.context, FI_SEND | (r.tagged ? FI_TAGGED : FI_MSG), 0, nullptr, 0, 0,
                       FI_ADDR_NOTAVAIL});
}

void Engine::finish_tx(TxOp *op) {
    if (op->error) {
        fail_tx(op, op->error);
        return;
    }
    if (!op->completed_early) tx_report(op);
    retire_tx(op);
}

void Engine::fail_tx(TxOp *op, int err) {
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

TxOp *Engine::alloc_tx() {
    if (tx_free_.empty()) return tx_ops_.emplace_back(std::make_unique<TxOp>()).get();
    TxOp *op = tx_free_.back();
    tx_free_.pop_back();
    return op;
}

// Back to the free list, reset but keeping its buffers' capacity for the next send.
void Engine::free_tx(TxOp *op) {
    op->reset();
    tx_free_.push_back(op);
}

void Engine::write_tx_err(void *context, uint64_t flags, int err, size_t len) {
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

}  // namespace tandem
