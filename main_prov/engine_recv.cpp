// Receive side of the endpoint: posting receives (and the messages that came before them),
// peek and claim, multi-receive slices, completion in each peer's order, the receive CQ's
// entries, and cancel.
#include "common/iov.h"
#include "main_prov/av.h"
#include "main_prov/cntr.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"

#include "common/fabric_compat.h"
#include "main_prov/local_path.h"
#include "main_prov/peer_rx_queue.h"
#include "peer/peer_abi.h"

#include <algorithm>

namespace tandem {

void Engine::check_rx_ready(uint64_t cap) const {
    if (!enabled_) fail(FI_EOPBADSTATE, "endpoint not enabled");
    if (cap && !(caps_ & cap)) fail(FI_EOPNOTSUPP, "capability not requested");
}

void Engine::write_rx_err(const RxOp *rx, uint64_t flags, int err, size_t len, size_t olen,
                          uint64_t tag, uint64_t data) {
    if (Cntr *cntr = rx->deferred ? rx->work_cntr : recv_cntr_) cntr->inc_err();
    if (rx->deferred && !(rx->op_flags & FI_COMPLETION)) return;
    write_rx_error_entry(rx->context, rx->count ? rx->iov[0].iov_base : nullptr, flags, err, len,
                         olen, tag, data);
}

void Engine::write_rx_error_entry(void *context, void *buf, uint64_t flags, int err, size_t len,
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

void Engine::write_rx_cq(const Completion &c, fi_addr_t src) {
    if (!rx_cq_) return;
    Completion out = c;
    out.src = reported_source(src);
    out.owner = &rx_completions_;
    rx_cq_->write(out);
}

ssize_t Engine::post_recv(const RecvArgs &a) {
    std::lock_guard guard(domain_->lock());
    return post_recv_locked(a);
}

ssize_t Engine::post_recv_locked(const RecvArgs &a) {
    check_rx_ready(a.flags & FI_PEER_TRANSFER ? 0 : a.tagged ? FI_TAGGED : FI_MSG);
    if (a.flags & FI_PEER_TRANSFER) {
        // The offload twin's receive for its own traffic from remote twins.
        if (!local_) return -FI_EINVAL;
        if (a.flags & (FI_MULTI_RECV | FI_PEEK | FI_CLAIM)) return -FI_EINVAL;
        return post_recv_on(peer_rx_, this, caps_, a);
    }
    // FI_EXACT_DIRECTED_RECV (API 2.0): a receive that names no source is the caller's error.
    if (exact_source_ && a.src == FI_ADDR_UNSPEC) return -FI_EINVAL;
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
    args.src = rx_source(a.src, a.tagged);
    return post_recv_on(*rx_, this, caps_, args);
}

// A receive a trigger started (or deferred work): posted as fi_recvmsg would post it, but
// completing as its request says.
ssize_t Engine::issue_recv(RecvRequest &r) {
    if (rx_->outstanding + rx_triggered_ >= info_->rx_attr->size) return -FI_EAGAIN;
    RecvArgs args{r.buffers.iov, r.buffers.descs(), r.buffers.count, r.src, r.context, r.flags,
                  r.tag,         r.ignore,          r.tagged};
    args.src = rx_source(r.src, r.tagged);
    return post_recv_on(*rx_, this, caps_, args, r.done);
}

ssize_t Engine::post_recv_on(RxMatcher &m, Engine *report_ep, uint64_t caps, const RecvArgs &a,
                             const DeferredDone &done) {
    (void)report_ep;
    if (a.count && !a.iov) return -FI_EINVAL;
    if (a.count > kMaxIov) return -FI_EINVAL;
    // A multi-receive buffer is one iovec; a tagged one needs FI_TAGGED_MULTI_RECV (2.0), and
    // takes the messages its tag and ignore match, each completion naming its own tag.
    if ((a.flags & FI_MULTI_RECV) &&
        (!(caps & (a.tagged ? compat::kTaggedMultiRecv : FI_MULTI_RECV)) || a.count != 1))
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

fi_addr_t Engine::source_of(const Unexpected &ux) {
    if (ux.peer_entry) return PeerRxQueue::of(ux.peer_entry)->source(ux.peer_entry);  // our AV
    if (!ux.conn)  // a node-local message
        return ux.sender.empty() ? ux.src
                                 : ux.ep->av_->addr_of_bytes(ux.sender.data(), ux.sender.size());
    return ux.ep->source_of(ux.conn);
}

// A message a peer provider holds (our offload twin, or another importer of our SRX) is
// delivered by that peer; one that came over a link by the endpoint it arrived on.
void Engine::deliver_unexpected_any(RxOp *rx, Unexpected &ux) {
    if (ux.peer_entry)
        PeerRxQueue::of(ux.peer_entry)->start(ux.peer_entry, rx);
    else
        ux.ep->deliver_unexpected(rx, ux);
}

void Engine::deliver_unexpected(RxOp *rx, Unexpected &ux) {
    fi_addr_t src = source_of(ux);
    if (ux.rendezvous()) {
        if (ux.conn)
            start_rendezvous(rx, ux.conn, ux.hdr, ux.rts, src);
        else
            start_local_rendezvous(rx, ux.hdr, ux.answer_to, ux.local_rts, ux.data.data(), src);
        return;
    }
    int err = deliver_eager(rx, ux.conn, ux.hdr, ux.data.data(), src);
    if (!ux.answer_to.empty())
        answer_local(ux.answer_to, ux.hdr.msg_id, err == FI_ETRUNC ? 0 : err);
}

void Engine::release_discarded(const Unexpected &ux) {
    if (ux.rendezvous() && ux.conn) {
        wire::FinBody fin{ux.hdr.msg_id, uint32_t(wire::FinStatus::Ok), 0};
        send_control(ux.conn, wire::ProtoOp::Fin, &fin, sizeof fin, ux.hdr.msg_id);
    } else if (!ux.answer_to.empty()) {
        answer_local(ux.answer_to, ux.hdr.msg_id, 0);  // the receiver dropped it: done
    }
}

ssize_t Engine::peek_or_claim(const RecvArgs &a) {
    std::lock_guard guard(domain_->lock());
    check_rx_ready(FI_TAGGED);
    progress();
    if (exact_source_ && a.src == FI_ADDR_UNSPEC) return -FI_EINVAL;
    RecvArgs args = a;
    args.src = rx_source(a.src, true);
    return peek_or_claim_on(*rx_, this, args);
}

ssize_t Engine::peek_or_claim_on(RxMatcher &m, Engine *report_ep, const RecvArgs &a) {
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
    probe.src = a.src;  // (the caller's: FI_ADDR_UNSPEC unless its receives are directed)
    auto src_of = [](const Unexpected &u) { return source_of(u); };

    if (a.flags & FI_PEEK) {
        Unexpected *found = m.peek(true, a.tag, a.ignore, probe.src, src_of);
        if (!found) {
            // fi_tagged(3): a peek that finds nothing completes with FI_ENOMSG.
            if (report_ep) report_ep->write_rx_err(&probe, cq_flags, FI_ENOMSG, 0, 0, a.tag, 0);
            return 0;
        }
        Engine *ep = found->ep ? found->ep : report_ep;
        fi_addr_t src = source_of(*found);
        size_t size = found->hdr.size;
        uint64_t tag = found->hdr.tag, data = found->hdr.cq_data;
        if (found->hdr.flags & wire::kProtoCqData) cq_flags |= FI_REMOTE_CQ_DATA;
        if (a.flags & FI_CLAIM) {
            found->claimed = true;
            found->claim_context = a.context;
        } else if (a.flags & FI_DISCARD) {
            if (found->peer_entry)
                PeerRxQueue::of(found->peer_entry)->discard(found->peer_entry);
            else
                ep->release_discarded(*found);
            m.erase_unexpected(found);
        }
        if (ep) ep->write_rx_cq({a.context, cq_flags, size, nullptr, data, tag, src}, src);
        return 0;
    }
    // FI_CLAIM: deliver (or discard) the message claimed by an earlier peek.
    Unexpected ux;
    if (!m.take_claimed(a.context, ux)) return -FI_EINVAL;
    Engine *ep = ux.ep ? ux.ep : report_ep;
    if (a.flags & FI_DISCARD) {
        if (ux.peer_entry)
            PeerRxQueue::of(ux.peer_entry)->discard(ux.peer_entry);
        else
            ep->release_discarded(ux);
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
RxOp *Engine::slice_for(RxMatcher &m, RxOp *rx, size_t len) {
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

fi_addr_t Engine::source_of(LinkConnection *conn) {
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
void Engine::keep_order(RxOp *rx, LinkConnection *conn) {
    auto *peer = conn ? static_cast<Peer *>(conn->context) : nullptr;
    if (!peer) return;
    peer->rx_order.push_back(rx);
    rx->order_queue = &peer->rx_order;
}

void Engine::rx_complete(RxOp *rx, size_t len, uint64_t tag, uint64_t data, uint8_t proto_flags,
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

void Engine::report_rx(RxOp *rx) {
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

void Engine::release_rx(RxOp *rx) {
    RxMatcher &m = matcher_of(rx);
    --m.outstanding;
    if (rx->owned) [[unlikely]]
        owner_done(rx->owner_entry);
    m.free_op(rx);
}

ssize_t Engine::cancel(void *context) {
    std::lock_guard guard(domain_->lock());
    return cancel_locked(context);
}

ssize_t Engine::cancel_locked(void *context) {
    // A triggered operation that has not started is cancelled in off_tandem's queue (its
    // FI_ECANCELED completion written by the discard); one that started is an ordinary
    // operation from then on.
    if (tx_triggered_ + rx_triggered_) {
        OffloadDomain *off = domain_->offload();
        if (off && off->ops() && off->ops()->trigger_cancel(off->domain(), this, context) == 0) {
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

ssize_t Engine::cancel_on(RxMatcher &m, Engine *report_ep, void *context) {
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

}  // namespace tandem
