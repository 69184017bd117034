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

namespace {

// An RMA cell's header for r: the target region, the size and, for a write, its remote CQ data.
LocalHeader rma_header(LocalHeader hdr, const LocalRequest &r, uint64_t msg_id) {
    hdr.flags = (r.write && (r.flags & FI_REMOTE_CQ_DATA)) ? wire::kLocalCqData : 0;
    hdr.cq_data = r.data;
    hdr.total = r.len;
    hdr.rma_addr = r.rma.addr;
    hdr.rma_key = r.rma.key;
    hdr.msg_id = msg_id;
    return hdr;
}

// The non-empty buffers of r, as a cell names them for the target to copy with CMA.
size_t wire_iovs(const LocalRequest &r, LocalIov *body) {
    size_t n = 0;
    for (size_t i = 0; i < r.count; ++i)
        if (r.iov[i].iov_len)
            body[n++] = {reinterpret_cast<uint64_t>(r.iov[i].iov_base), r.iov[i].iov_len};
    return n;
}

}  // namespace

ssize_t Endpoint::issue_rma(LocalRequest &r) {
    note_work();
    PeerLink *link = link_for(r.peer);
    if (!link) return -FI_EHOSTUNREACH;
    uint64_t cq_flags = FI_RMA | (r.write ? FI_WRITE : FI_READ);
    if (link->dead) {
        complete_tx(r.context, cq_flags, r.len, FI_ECONNRESET);
        return 0;
    }
    if (!link->out.admits()) return -FI_EAGAIN;
    LocalHeader hdr = rma_header(proto_, r, next_id_++);
    Pending p{.context = r.context, .flags = cq_flags, .len = r.len, .link = link};
    if (r.device && !stage_device_rma(*link, r, hdr, p)) return 0;
    bool cma = link->cma && !r.device;
    LocalIov body[wire::kLocalMaxIov];
    size_t n = wire_iovs(r, body);
    if (!r.write) {
        // The target writes into our buffers (CMA) or answers with ReadData cells.
        p.iov.assign(r.iov, r.iov + r.count);
        hdr.op = static_cast<uint8_t>(LocalOp::Read);
        hdr.iov_count = static_cast<uint8_t>(cma ? n : 0);
        pending_[hdr.msg_id] = std::move(p);
        link->out.push(*sender_, hdr, body, hdr.iov_count * sizeof(LocalIov));
        return 0;
    }
    // A large write read with CMA: the target may ask us (Cts) to write part of it ourselves.
    if (cma && r.len >= wire::kLocalSplitMin) p.iov.assign(r.iov, r.iov + r.count);
    pending_[hdr.msg_id] = std::move(p);
    push_rma_write(*link, hdr, r, body, n, cma);
    return 0;
}

// Device memory: a write goes peer to peer (IpcWrite: the target's device copies from our
// buffers, mapped by IPC) where the policy and the driver allow, as a message does; a read,
// and what cannot go peer to peer, is staged (the devices copy into and out of cells).
// FI_HMEM_P2P_REQUIRED refuses what cannot go peer to peer. True when the operation goes on
// staged (p holds where its memory lives); false when it went by IPC or was refused here.
bool Endpoint::stage_device_rma(PeerLink &link, const LocalRequest &r, const LocalHeader &hdr,
                                Pending &p) {
    auto &c = hmem::counters();
    hmem::P2pDecision d = p2p_.decide(r.write, r.len, Config::get().eager_limit);
    if (d == hmem::P2pDecision::PeerToPeer) {
        Pending ipc = p;
        ipc.iov.assign(r.iov, r.iov + r.count);
        ipc.mem.assign(r.mem, r.mem + r.count);
        ipc.ipc = true;
        ipc.rma_write = true;
        ipc.rma_addr = r.rma.addr;
        ipc.rma_key = r.rma.key;
        ipc.data = r.data;
        ipc.hdr_flags = hdr.flags;
        if (post_ipc(link, hdr, r.iov, r.mem, r.count, std::move(ipc), LocalOp::IpcWrite)) {
            c.p2p_transfers.fetch_add(1, std::memory_order_relaxed);
            return false;
        }
        // No IPC handle for this memory: staged, unless that is refused.
        if (p2p_.mode() == FI_HMEM_P2P_REQUIRED) d = hmem::P2pDecision::Fail;
    }
    if (d == hmem::P2pDecision::Fail) {
        c.refused_transfers.fetch_add(1, std::memory_order_relaxed);
        complete_tx(r.context, p.flags, r.len, FI_EOPNOTSUPP);
        return false;
    }
    c.staged_transfers.fetch_add(1, std::memory_order_relaxed);
    p.mem.assign(r.mem, r.mem + r.count);
    return true;
}

// A write's cells, its Pending recorded: one Write cell with the data (up to the eager
// limit), one naming our buffers (n of body) for the target to read with CMA, or a stream of
// WriteFrag cells.
void Endpoint::push_rma_write(PeerLink &link, LocalHeader hdr, const LocalRequest &r,
                              const LocalIov *body, size_t n, bool cma) {
    const hmem::MemRef *const mem = r.device ? r.mem : nullptr;
    bool sent = true;
    if (r.len <= Config::get().eager_limit) {
        hdr.op = static_cast<uint8_t>(LocalOp::Write);
        hdr.size = static_cast<uint32_t>(r.len);
        sent = link.out.push_gather(*sender_, hdr, r.iov, r.count, 0, r.len, mem);
    } else if (cma) {
        hdr.op = static_cast<uint8_t>(LocalOp::Write);
        hdr.iov_count = static_cast<uint8_t>(n);
        link.out.push(*sender_, hdr, body, n * sizeof(LocalIov));
    } else {
        hdr.op = static_cast<uint8_t>(LocalOp::WriteFrag);
        // A failed device copy fails the write (a later Fin finds nothing to finish).
        link.out.push_stream(*sender_, hdr, r.iov, r.count, r.len, mem,
                             {.kind = StreamEnd::Kind::FailPending});
    }
    if (!sent) finish_pending(hdr.msg_id, FI_EIO);  // (a later Fin finds nothing to finish)
}

}  // namespace tandem::off
