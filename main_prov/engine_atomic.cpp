// Atomic operations of the engine (fi_atomic(3); the adapter's twelve calls and three *valid
// queries are in endpoint_calls.cpp): both ends of an atomic that travels over a link.
//
// The target executes every atomic itself, in its progress engine: the initiator sends an
// AtomicReq (the operation, the target address and key, the operand and compare elements),
// the target checks key, bounds and access as for RMA, executes through the one engine
// (hmem/atomic_target.h, which makes it atomic against every other execution in the process)
// and answers AtomicResp with a status and, for the fetch and compare kinds, the previous
// values. The initiator's operation completes at that answer, for every kind, so an atomic
// completion always means the target was updated. A peer on this node gets the same request
// through the offload twin (LocalPath::atomic), whose twin at the target executes it.
#include "common/iov.h"
#include "common/log.h"
#include "hmem/atomic_target.h"
#include "main_prov/av.h"
#include "main_prov/cntr.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"
#include "main_prov/local_path.h"
#include "peer/peer_abi.h"

#include <cstring>

namespace tandem {

using atomic::byte_ranges;
using atomic::element_count;

// ------------------------------------------------------------------------------------------
// Initiator

int AtomicRequest::capture(const AtomicCall &a) {
    const fi_msg_atomic &m = a.msg;
    if (m.iov_count > kMaxIov || a.compare_count > kMaxIov || a.result_count > kMaxIov ||
        m.rma_iov_count != 1 || !m.rma_iov)
        return -FI_EINVAL;
    kind = a.kind;
    flags = a.flags;
    msg = m;
    rma = m.rma_iov[0];
    has_desc = m.desc != nullptr;
    for (size_t i = 0; i < m.iov_count; ++i) {
        operand[i] = m.msg_iov[i];
        desc[i] = has_desc ? m.desc[i] : nullptr;
    }
    compare_count = a.compare_count;
    has_compare_desc = a.compare_desc != nullptr;
    for (size_t i = 0; i < compare_count; ++i) {
        compare[i] = a.compare[i];
        compare_desc[i] = has_compare_desc ? a.compare_desc[i] : nullptr;
    }
    result_count = a.result_count;
    has_result_desc = a.result_desc != nullptr;
    for (size_t i = 0; i < result_count; ++i) {
        result[i] = a.result[i];
        result_desc[i] = has_result_desc ? a.result_desc[i] : nullptr;
    }
    return 0;
}

AtomicCall AtomicRequest::view() {
    AtomicCall a{msg, kind, flags};
    a.msg.msg_iov = operand;
    a.msg.desc = has_desc ? desc : nullptr;
    a.msg.rma_iov = &rma;
    a.msg.rma_iov_count = 1;
    if (kind == atomic::Kind::Compare)
        a.with_compare(compare, has_compare_desc ? compare_desc : nullptr, compare_count);
    if (kind != atomic::Kind::Base)
        a.with_result(result, has_result_desc ? result_desc : nullptr, result_count);
    return a;
}

// Prepare: the call's shape checked (atomic::check_call) and its lists copied.
int Engine::prepare_atomic(const AtomicCall &a, AtomicRequest &r) const {
    // An endpoint opened without FI_ATOMIC has none, whatever its state.
    if (!(caps_ & FI_ATOMIC)) return -FI_EOPNOTSUPP;
    const fi_msg_atomic &m = a.msg;
    size_t count = 0;
    if (int ret = atomic::check_call(a.kind, m, a.compare, a.compare_count, a.result,
                                     a.result_count, kMaxIov, &count))
        return ret;
    // FI_INJECT frees the constant buffers at once, which every atomic does (the operands are
    // copied into the request); it only limits the size.
    const size_t bytes = count * atomic::datatype_size(m.datatype);
    if (bytes > limits_.max[kAtomicSize] ||
        ((a.flags & FI_INJECT) && bytes > limits_.inject[kAtomicSize]))
        return -FI_EMSGSIZE;
    // With virtual addresses, the initiator sees a misaligned target at once; with offsets the
    // target checks the address the key resolves to (an FI_EINVAL error completion).
    if ((domain_->mr_mode() & FI_MR_VIRT_ADDR) &&
        m.rma_iov[0].addr % atomic::datatype_align(m.datatype))
        return -FI_EINVAL;
    return r.capture(a);
}

ssize_t Engine::post_atomic(const AtomicCall &a) {
    AtomicRequest r;
    if (int ret = prepare_atomic(a, r)) return ret;
    std::lock_guard guard(domain_->lock());
    check_tx_ready(FI_ATOMIC);
    // fi_getinfo(3): an endpoint that named no direction has both.
    const uint64_t directions = caps_ & (FI_READ | FI_WRITE);
    if (directions && !(directions & (a.kind != atomic::Kind::Base ? FI_READ : FI_WRITE)))
        return -FI_EOPNOTSUPP;
    if (r.flags & FI_TRIGGER) return queue_triggered(std::move(r));
    if (!make_tx_room()) return -FI_EAGAIN;
    return issue_atomic(r);
}

// Issue: the request becomes an AtomicReq over a link or a cell through the offload twin.
ssize_t Engine::issue_atomic(AtomicRequest &r) {
    const AtomicCall a = r.view();
    const fi_msg_atomic &m = a.msg;
    AtomicOperands in;
    in.elem = atomic::datatype_size(m.datatype);
    in.count = element_count(m.msg_iov, m.iov_count);
    byte_ranges(m.msg_iov, m.iov_count, in.elem, in.operand);
    in.device = memory_of(in.operand, m.desc, m.iov_count, a.flags, in.operand_mem);
    if (a.kind == atomic::Kind::Compare) {
        byte_ranges(a.compare, a.compare_count, in.elem, in.compare);
        in.device |=
            memory_of(in.compare, a.compare_desc, a.compare_count, a.flags, in.compare_mem);
    }
    // (The result buffers are never an inject's copy: they are looked at below, for a link.)
    if (in.device && (a.flags & FI_INJECT) && p2p_.mode() == FI_HMEM_P2P_REQUIRED)
        return -FI_EOPNOTSUPP;
    Peer *peer = peer_for(m.addr);
    TxOp *op = alloc_tx();
    op->kind = TxOp::Kind::Atomic;
    op->context = m.context;
    op->op_flags = a.flags;
    op->cq_flags = FI_ATOMIC | (a.kind != atomic::Kind::Base ? FI_READ : FI_WRITE);
    op->report = tx_reports(a.flags, r.done);
    op->deferred = r.done.deferred;
    op->work_cntr = r.done.cntr;
    op->len = in.count * in.elem;
    op->peer = peer;
    op->id = next_op_id_++;
    if (goes_local(peer, m.addr)) return atomic_through_twin(op, a, in);
    return atomic_over_link(op, a, in);
}

// The twin copies the operands into its request before this returns (an inject's buffer is
// free at once) and writes the previous values into the result buffers. An inject carries no
// descriptors: what memory_of found out about its operands goes to the twin as descriptors of
// ours, so that it copies device memory with the device.
ssize_t Engine::atomic_through_twin(TxOp *op, const AtomicCall &a, const AtomicOperands &in) {
    const fi_msg_atomic &m = a.msg;
    ++tx_outstanding_;
    int ret;
    if (!m.desc && !hmem::all_host(in.operand_mem, m.iov_count)) {
        AtomicCall call = a;
        peer::MrDesc found[kMaxIov];
        void *found_desc[kMaxIov];
        for (size_t i = 0; i < m.iov_count; ++i) {
            found[i].mem = in.operand_mem[i];
            found_desc[i] = &found[i];
        }
        call.msg.desc = found_desc;
        ret = local_->atomic(op, call);
    } else {
        ret = local_->atomic(op, a);
    }
    if (ret) {
        --tx_outstanding_;
        free_tx(op);
    }
    return ret;
}

// Over a link: an AtomicReq carrying our own copy of the operands (the application's buffers
// are free once this returns; only the result buffers are written later), answered by the
// target's AtomicResp.
ssize_t Engine::atomic_over_link(TxOp *op, const AtomicCall &a, AtomicOperands &in) {
    const fi_msg_atomic &m = a.msg;
    const bool fetches = a.kind != atomic::Kind::Base;
    const uint64_t addr = m.rma_iov[0].addr, key = m.rma_iov[0].key;
    op->remote = {addr, key};
    iovec result[kMaxIov];
    hmem::MemRef result_mem[kMaxIov];
    if (fetches) {
        byte_ranges(a.result, a.result_count, in.elem, result);
        in.device |= memory_of(result, a.result_desc, a.result_count, 0, result_mem);
    }
    if (in.device && link_decision(op->len) == hmem::P2pDecision::Fail) {
        ++tx_outstanding_;
        fail_tx(op, FI_EOPNOTSUPP);  // FI_HMEM_P2P_REQUIRED, and the link can only stage
        return 0;
    }
    op->inject_copy.resize(atomic::request_size(a.kind, m.op, m.datatype, in.count));
    const size_t compares = a.kind == atomic::Kind::Compare ? a.compare_count : 0;
    int ret = atomic::build_request(a.kind, m.op, m.datatype, in.count, addr, key, in.operand,
                                    in.operand_mem, m.iov_count, in.compare, in.compare_mem,
                                    compares, op->inject_copy.data());
    if (ret) {
        free_tx(op);
        return ret;
    }
    if (fetches) {
        for (size_t i = 0; i < a.result_count; ++i) {
            if (!result[i].iov_len) continue;
            op->iov.push_back(result[i]);
            op->mem.push_back(result_mem[i]);
        }
    }
    op->hdr.op = static_cast<uint8_t>(wire::ProtoOp::AtomicReq);
    op->hdr.flags = (a.flags & FI_REMOTE_CQ_DATA) ? wire::kProtoCqData : 0;
    op->hdr.cq_data = m.data;
    op->hdr.size = op->inject_copy.size();
    op->hdr.msg_id = op->id;
    op->await_remote = true;
    ++tx_outstanding_;
    submit(op);
    return 0;
}

// The answer to one of our AtomicReqs: the previous values go into the result buffers, and
// the operation is done. False when the message does not answer an atomic of ours.
bool Engine::finish_atomic(const wire::ProtoHeader &hdr, const uint8_t *body, size_t len) {
    wire::AtomicRespBody resp;
    if (len < sizeof resp) return false;
    memcpy(&resp, body, sizeof resp);
    if (resp.length != len - sizeof resp) return false;
    auto it = await_remote_.find(hdr.msg_id);
    if (it == await_remote_.end() || it->second->kind != TxOp::Kind::Atomic) return false;
    TxOp *op = it->second;
    await_remote_.erase(it);
    op->await_remote = false;
    if (resp.status) {
        op->error = resp.status;
    } else if (!op->iov.empty()) {
        const uint8_t *values = body + sizeof resp;
        if (resp.length != op->len) {
            op->error = FI_EIO;
        } else if (hmem::all_host(op->mem.data(), op->mem.size())) {
            iov_scatter(op->iov.data(), op->iov.size(), 0, values, op->len);
        } else if (hmem::scatter(op->iov.data(), op->mem.data(), op->iov.size(), 0, values,
                                 op->len) != ssize_t(op->len)) {
            op->error = FI_EIO;
        }
    }
    if (op->link_wrs == 0) finish_tx(op);
    return true;
}

// ------------------------------------------------------------------------------------------
// Target

void Engine::serve_atomic(LinkConnection *conn, const wire::ProtoHeader &hdr, const uint8_t *body,
                          size_t len) {
    atomic::Request r;
    wire::AtomicRespBody resp{};
    uint8_t fetched[atomic::kMaxBytes];
    if (!atomic::parse(body, len, r)) {
        TANDEM_WARN(FI_LOG_EP_DATA, "refusing a malformed atomic request (%zu bytes)\n", len);
        resp.status = FI_EINVAL;
    } else {
        LocalPieces pieces;
        if (!resolve(r.key, r.addr, r.bytes(), atomic::access_needed(r.kind, r.op), pieces) ||
            !pieces.application) {
            resp.status = FI_EACCES;
        } else {
            resp.status = atomic::execute(r, pieces.iov, pieces.mem, pieces.count, fetched);
        }
        TANDEM_DEBUG(FI_LOG_EP_DATA, "atomic op %d type %d x%zu at %#lx: status %d\n", r.op,
                     r.datatype, r.count, static_cast<unsigned long>(r.addr), resp.status);
    }
    if (!resp.status) {
        uint64_t event = atomic::access_event(r.kind);
        remote_access_done(r.key, event);
        if ((hdr.flags & wire::kProtoCqData) && rx_cq_) {
            fi_addr_t src = source_of(conn);
            write_rx_cq({nullptr, FI_ATOMIC | event | FI_REMOTE_CQ_DATA, r.bytes(), nullptr,
                         hdr.cq_data, 0, src},
                        src);
        }
        if (r.kind != atomic::Kind::Base) resp.length = r.bytes();
    }
    uint8_t answer[sizeof resp + atomic::kMaxBytes];
    memcpy(answer, &resp, sizeof resp);
    memcpy(answer + sizeof resp, fetched, resp.length);
    send_control(conn, wire::ProtoOp::AtomicResp, answer, sizeof resp + resp.length, hdr.msg_id);
}

}  // namespace tandem
