// RMA the application posts (the fi_rma calls; their table is in endpoint.cpp), the buffers
// an operation exposes to the peer under internal keys, and the peer's access to ours. RMA
// the target serves is in engine_served_rma.cpp.
#include "main_prov/cntr.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"
#include "main_prov/local_path.h"

namespace tandem {

// Registers an operation's local buffers for the peer's access (a rendezvous source, a served
// RMA's buffers) and names them in op->rts; the keys go with the operation (retire_tx). 0, or
// a negative errno with nothing left registered when the link cannot register one (device
// memory its NIC cannot reach).
int Engine::expose(TxOp *op, const iovec *iov, const hmem::MemRef *mem, size_t count,
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

int Engine::prepare_rma(const RmaArgs &a, RmaRequest &r) const {
    if (int ret = r.local.capture(a.iov, a.desc, a.count)) return ret;
    if (r.local.len > limits_.max[kRmaSize]) return -FI_EMSGSIZE;
    if ((a.flags & FI_INJECT) && r.local.len > limits_.inject[kRmaSize]) return -FI_EMSGSIZE;
    r.peer = a.peer;
    r.addr = a.addr;
    r.key = a.key;
    r.context = a.context;
    r.flags = a.flags;
    r.data = a.data;
    r.write = a.write;
    return 0;
}

ssize_t Engine::post_rma(const RmaArgs &a) {
    RmaRequest r;
    if (int ret = prepare_rma(a, r)) return ret;
    std::lock_guard guard(domain_->lock());
    check_tx_ready(a.write ? (FI_RMA | FI_WRITE) : (FI_RMA | FI_READ));
    if (!(caps_ & FI_RMA)) return -FI_EOPNOTSUPP;
    if (r.flags & FI_TRIGGER) return queue_triggered(TriggeredRequest(std::move(r)));
    if (!make_tx_room()) return -FI_EAGAIN;
    return issue_rma(r);
}

ssize_t Engine::issue_rma(RmaRequest &r) {
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
        int ret = local_->rma(op, twin_iov, twin_desc, twin_count, r.peer, r.addr, r.key, r.flags,
                              r.data, r.write);
        if (ret) {
            --tx_outstanding_;
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

bool Engine::resolve(uint64_t key, uint64_t addr, size_t len, uint64_t access,
                     LocalPieces &out) noexcept {
    return domain_->mr_table().resolve(key, addr, len, access, out);
}

void Engine::remote_access_done(uint64_t key, uint64_t access) noexcept {
    MemoryRegion *mr = domain_->mr_table().find(key);
    if (!mr) return;  // protocol-internal (rendezvous) access: not the application's event
    mr->count_remote_access(access);
    if (access == FI_REMOTE_WRITE && rwrite_cntr_) rwrite_cntr_->inc();
    if (access == FI_REMOTE_READ && rread_cntr_) rread_cntr_->inc();
}

}  // namespace tandem
