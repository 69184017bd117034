// RMA at the initiator (fi_writemsg, fi_readmsg): one Write, WriteFrag or Read cell (or a
// stream of them) to the target, which checks the key and copies (ep/rma_target.cpp); the
// operation ends at the target's Fin, or with the ReadData cells of a staged read.
#include "offload_prov/endpoint.h"

#include "common/iov.h"
#include "offload_prov/config.h"

#include <atomic>

namespace tandem::off {

using wire::LocalHeader;
using wire::LocalIov;
using wire::LocalOp;

ssize_t Endpoint::writemsg(const fi_msg_rma *msg, uint64_t flags) {
    if (!msg || msg->rma_iov_count != 1 || !msg->rma_iov) return -FI_EINVAL;
    LocalRequest r;
    if (int ret = prepare(msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context, flags,
                          msg->data, r))
        return ret;
    r.rma = msg->rma_iov[0];
    r.write = true;
    return issue_rma(r);
}

ssize_t Endpoint::readmsg(const fi_msg_rma *msg, uint64_t flags) {
    if (!msg || msg->rma_iov_count != 1 || !msg->rma_iov) return -FI_EINVAL;
    LocalRequest r;
    if (int ret =
            prepare(msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context, flags, 0, r))
        return ret;
    r.rma = msg->rma_iov[0];
    return issue_rma(r);
}

ssize_t Endpoint::issue_rma(LocalRequest &r) {
    note_work();
    const iovec *const iov = r.iov;
    const size_t count = r.count;
    const size_t len = r.len;
    const uint64_t flags = r.flags, data = r.data;
    void *const context = r.context;
    const bool write = r.write;
    const fi_rma_iov &rma = r.rma;
    PeerLink *link = link_for(r.peer);
    if (!link) return -FI_EHOSTUNREACH;
    uint64_t cq_flags = FI_RMA | (write ? FI_WRITE : FI_READ);
    if (link->dead) {
        complete_tx(context, cq_flags, len, FI_ECONNRESET);
        return 0;
    }
    if (!admits(*link)) return -FI_EAGAIN;
    LocalHeader hdr = proto_;
    hdr.flags = (write && (flags & FI_REMOTE_CQ_DATA)) ? wire::kLocalCqData : 0;
    hdr.cq_data = data;
    hdr.total = len;
    hdr.rma_addr = rma.addr;
    hdr.rma_key = rma.key;
    hdr.msg_id = next_id_++;
    Pending p{.context = context, .flags = cq_flags, .len = len, .link = link};
    // Device memory: a write goes peer to peer (IpcWrite: the target's device copies from
    // our buffers, mapped by IPC) where the policy and the driver allow, as a message does; a
    // read, and what cannot go peer to peer, is staged (the devices copy into and out of
    // cells). FI_HMEM_P2P_REQUIRED refuses what cannot go peer to peer.
    const hmem::MemRef *const mem = r.mem;
    const bool device = r.device;
    if (device) {
        auto &c = hmem::counters();
        hmem::P2pDecision d = p2p_.decide(write, len, Config::get().eager_limit);
        if (d == hmem::P2pDecision::PeerToPeer) {
            Pending ipc = p;
            ipc.iov.assign(iov, iov + count);
            ipc.mem.assign(mem, mem + count);
            ipc.ipc = true;
            ipc.rma_write = true;
            ipc.rma_addr = rma.addr;
            ipc.rma_key = rma.key;
            ipc.data = data;
            ipc.hdr_flags = hdr.flags;
            if (post_ipc(*link, hdr, iov, mem, count, std::move(ipc), LocalOp::IpcWrite)) {
                c.p2p_transfers.fetch_add(1, std::memory_order_relaxed);
                return 0;
            }
            // No IPC handle for this memory: staged, unless that is refused.
            if (p2p_.mode() == FI_HMEM_P2P_REQUIRED) d = hmem::P2pDecision::Fail;
        }
        if (d == hmem::P2pDecision::Fail) {
            c.refused_transfers.fetch_add(1, std::memory_order_relaxed);
            complete_tx(context, cq_flags, len, FI_EOPNOTSUPP);
            return 0;
        }
        c.staged_transfers.fetch_add(1, std::memory_order_relaxed);
        p.mem.assign(mem, mem + count);
    }
    bool cma = link->cma && !device;
    LocalIov body[wire::kLocalMaxIov];
    size_t n = 0;
    for (size_t i = 0; i < count; ++i)
        if (iov[i].iov_len)
            body[n++] = {reinterpret_cast<uint64_t>(iov[i].iov_base), iov[i].iov_len};
    if (!write) {
        // The target writes into our buffers (CMA) or answers with ReadData cells.
        p.iov.assign(iov, iov + count);
        hdr.op = static_cast<uint8_t>(LocalOp::Read);
        hdr.iov_count = static_cast<uint8_t>(cma ? n : 0);
        pending_[hdr.msg_id] = std::move(p);
        push(*link, hdr, body, hdr.iov_count * sizeof(LocalIov));
        return 0;
    }
    // A large write read with CMA: the target may ask us (Cts) to write part of it ourselves.
    if (cma && len >= wire::kLocalSplitMin) p.iov.assign(iov, iov + count);
    pending_[hdr.msg_id] = std::move(p);
    bool sent = true;
    if (len <= Config::get().eager_limit) {
        hdr.op = static_cast<uint8_t>(LocalOp::Write);
        hdr.size = static_cast<uint32_t>(len);
        sent = push_gather(*link, hdr, iov, count, 0, len, device ? mem : nullptr);
    } else if (cma) {
        hdr.op = static_cast<uint8_t>(LocalOp::Write);
        hdr.iov_count = static_cast<uint8_t>(n);
        push(*link, hdr, body, n * sizeof(LocalIov));
    } else {
        hdr.op = static_cast<uint8_t>(LocalOp::WriteFrag);
        // A failed device copy fails the write (a later Fin finds nothing to finish).
        push_staged(*link, hdr, iov, count, len, device ? mem : nullptr,
                    {.kind = StreamEnd::Kind::FailPending});
    }
    if (!sent) finish_pending(hdr.msg_id, FI_EIO);  // (a later Fin finds nothing to finish)
    return 0;
}

}  // namespace tandem::off
