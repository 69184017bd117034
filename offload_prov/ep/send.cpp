// Messages (fi_sendmsg, fi_tsendmsg, the owner's inject): an Eager cell, an Rts whose buffers
// the receiver reads with CMA, Frag cells, or device memory peer to peer (IpcRts) or staged;
// and the end of an operation waiting for the peer's Fin, where an IpcRts the receiver could
// not map is sent again, staged.
#include "offload_prov/endpoint.h"

#include "common/iov.h"
#include "common/test_hook.h"
#include "offload_prov/config.h"
#include "main_prov/shm/send_choice.h"

#include <atomic>
#include <cstring>

namespace tandem::off {

using wire::LocalHeader;
using wire::LocalIov;
using wire::LocalOp;

ssize_t Endpoint::sendmsg(const fi_msg *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    LocalRequest r;
    if (int ret = prepare(msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context, flags,
                          msg->data, r))
        return ret;
    return issue_send(r);
}

ssize_t Endpoint::tsendmsg(const fi_msg_tagged *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    LocalRequest r;
    if (int ret = prepare(msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context, flags,
                          msg->data, r))
        return ret;
    r.tag = msg->tag;
    r.tagged = true;
    return issue_send(r);
}

// Prepare (sends and RMA): the call checked, its lists and where they live copied.
int Endpoint::prepare(const iovec *iov, void **desc, size_t count, fi_addr_t peer, void *context,
                      uint64_t flags, uint64_t data, LocalRequest &r) const {
    if (!enabled_) return -FI_EOPBADSTATE;
    if ((count && !iov) || count > wire::kLocalMaxIov) return -FI_EINVAL;
    r.count = count;
    r.len = 0;
    for (size_t i = 0; i < count; ++i) {
        r.iov[i] = iov[i];
        r.len += iov[i].iov_len;
    }
    r.device = desc && peer::mems_of(desc, count, r.mem);
    r.peer = peer;
    r.context = context;
    r.flags = flags;
    r.data = data;
    return 0;
}

// Issue: the message goes out as the peer's ring and the memory allow.
ssize_t Endpoint::issue_send(LocalRequest &r) {
    note_work();
    PeerLink *link = link_for(r.peer);
    if (!link) return -FI_EHOSTUNREACH;
    const uint64_t cq_flags = FI_SEND | (r.tagged ? FI_TAGGED : FI_MSG);
    if (link->dead) {
        complete_tx(r.context, cq_flags, r.len, FI_ECONNRESET);
        return 0;
    }
    // Back-pressure: the peer's ring is full, or cells wait for room already.
    if (!link->out.admits()) return -FI_EAGAIN;
    LocalHeader hdr = message_header(r.len, r.tag, r.data, r.flags, r.tagged);
    if (r.device)
        send_device(r, *link, hdr, cq_flags);
    else
        send_host(r, *link, hdr, cq_flags);
    return 0;
}

// FI_DELIVERY_COMPLETE: the send completes when the receiver placed the data (its Fin), not
// when the cells are written; it waits in pending_ until then.
void Endpoint::await_delivery(LocalHeader &hdr, PeerLink &link, const LocalRequest &r,
                              uint64_t cq_flags) {
    hdr.flags |= wire::kLocalAckReq;
    pending_[hdr.msg_id] =
        Pending{.context = r.context, .flags = cq_flags, .len = r.len, .link = &link};
}

// Host memory: an Eager cell, single copy (Rts: the receiver reads our buffers with CMA), or
// staged through the ring a cell at a time (Frag).
void Endpoint::send_host(const LocalRequest &r, PeerLink &link, LocalHeader &hdr,
                         uint64_t cq_flags) {
    const iovec *const iov = r.iov;
    const size_t count = r.count, len = r.len;
    const bool ack = r.flags & FI_DELIVERY_COMPLETE;
    if (ack) await_delivery(hdr, link, r, cq_flags);
    if (len <= Config::get().eager_limit) {
        hdr.op = static_cast<uint8_t>(LocalOp::Eager);
        hdr.size = static_cast<uint32_t>(len);
        link.out.push_gather(*sender_, hdr, iov, count, 0, len);
        if (!ack) complete_tx(r.context, cq_flags, len, 0);
        return;
    }
    double rts_ns = 0;
    if (link.cma && !shm::stages_better(link, len, &rts_ns)) {
        send_rts(link, hdr,
                 Pending{.context = r.context,
                         .flags = cq_flags,
                         .len = len,
                         .link = &link,
                         .iov = {iov, iov + count},
                         .posted_ns = shm::now_ns(),
                         .expected_ns = rts_ns});
        return;
    }
    // No cross-memory attach, or staging is better: through the ring, a cell at a time.
    hdr.op = static_cast<uint8_t>(LocalOp::Frag);
    link.out.push_stream(*sender_, hdr, iov, count, len, nullptr,
                         send_end(ack, r.context, cq_flags));
}

// Device memory: peer to peer through IPC handles where the policy and the driver allow,
// else staged through cells by the device's copies (never by the CPU).
void Endpoint::send_device(const LocalRequest &r, PeerLink &link, LocalHeader &hdr,
                           uint64_t cq_flags) {
    using shm::DeviceSend;
    const iovec *const iov = r.iov;
    const hmem::MemRef *const mem = r.mem;
    const size_t count = r.count, len = r.len, eager = Config::get().eager_limit;
    const DeviceSend how = shm::decide_device_send(
        p2p_, len, eager, link.cma, [&] { return send_peer_to_peer(r, link, hdr, cq_flags); });
    if (how == DeviceSend::PeerToPeer) return;  // (sent)
    if (how == DeviceSend::Refuse) {
        complete_tx(r.context, cq_flags, len, FI_EOPNOTSUPP);
        return;
    }
    const bool ack = r.flags & FI_DELIVERY_COMPLETE;
    if (how == DeviceSend::HostBounce) {
        // Large: our device copies it once into a host bounce that the receiver reads
        // like any host message (single copy by CMA), instead of cell by cell.
        Pending p{.context = r.context, .flags = cq_flags, .len = len, .link = &link};
        p.bounce.resize(len);
        if (hmem::gather(p.bounce.data(), iov, mem, count, 0, len) != ssize_t(len)) {
            complete_tx(r.context, cq_flags, len, FI_EIO);
            return;
        }
        send_rts(link, hdr, std::move(p));
        return;
    }
    if (ack) await_delivery(hdr, link, r, cq_flags);
    if (how == DeviceSend::Frag) {
        hdr.op = static_cast<uint8_t>(LocalOp::Frag);
        link.out.push_stream(*sender_, hdr, iov, count, len, mem,
                             send_end(ack, r.context, cq_flags));
        return;
    }
    hdr.op = static_cast<uint8_t>(LocalOp::Eager);
    hdr.size = static_cast<uint32_t>(len);
    if (!link.out.push_gather(*sender_, hdr, iov, count, 0, len, mem)) {
        // The device could not copy it: an error completion, and nothing delivered.
        pending_.erase(hdr.msg_id);
        complete_tx(r.context, cq_flags, len, FI_EIO);
    } else if (!ack) {
        complete_tx(r.context, cq_flags, len, 0);
    }
}

// Device memory peer to peer: an IpcRts naming the request's buffers; false when one of them
// has no IPC handle (nothing sent: the caller stages it, or refuses it under REQUIRED).
bool Endpoint::send_peer_to_peer(const LocalRequest &r, PeerLink &link, const LocalHeader &hdr,
                                 uint64_t cq_flags) {
    Pending p{.context = r.context,
              .flags = cq_flags,
              .len = r.len,
              .link = &link,
              .iov = {r.iov, r.iov + r.count},
              .mem = {r.mem, r.mem + r.count},
              .ipc = true,
              .ack = (r.flags & FI_DELIVERY_COMPLETE) != 0,
              .tag = r.tag,
              .data = r.data,
              .hdr_flags = hdr.flags};
    return post_ipc(link, hdr, r.iov, r.mem, r.count, std::move(p));
}

// The header of a message's first (or only) cell, with a fresh id; op and size are the
// caller's.
LocalHeader Endpoint::message_header(size_t len, uint64_t tag, uint64_t data, uint64_t flags,
                                     bool tagged) {
    LocalHeader hdr = proto_;
    hdr.flags =
        (tagged ? wire::kLocalTagged : 0) | ((flags & FI_REMOTE_CQ_DATA) ? wire::kLocalCqData : 0);
    hdr.tag = tag;
    hdr.cq_data = data;
    hdr.total = len;
    hdr.msg_id = next_id_++;
    return hdr;
}

// Single copy: the receiver reads the buffers of p.iov (or p.bounce) with CMA; they stay ours
// until its Fin.
void Endpoint::send_rts(PeerLink &link, LocalHeader hdr, Pending p) {
    if (!p.bounce.empty()) p.iov.assign(1, iovec{p.bounce.data(), p.bounce.size()});
    hdr.op = static_cast<uint8_t>(LocalOp::Rts);
    LocalIov body[wire::kLocalMaxIov];
    size_t n = 0;
    for (const iovec &v : p.iov)
        if (v.iov_len) body[n++] = {reinterpret_cast<uint64_t>(v.iov_base), v.iov_len};
    hdr.iov_count = static_cast<uint8_t>(n);
    hdr.size = static_cast<uint32_t>(n * sizeof(LocalIov));  // (the list is the cell's body)
    hdr.flags &= ~uint8_t(wire::kLocalAckReq);               // Fin comes anyway, after delivery
    pending_[hdr.msg_id] = std::move(p);
    link.out.push(*sender_, hdr, body, n * sizeof(LocalIov));
}

// An IpcRts (or, op, an IpcWrite) naming our device buffers; false when some buffer has no IPC
// handle (the driver refuses, or the memory is not device memory), and nothing was sent.
bool Endpoint::post_ipc(PeerLink &link, LocalHeader hdr, const iovec *iov, const hmem::MemRef *mem,
                        size_t count, Pending p, LocalOp op) {
    // The peer maps our handles under our pid (its IPC cache, the driver's own checks): a pid
    // that names another process there rules it out.
    if (!link.same_pid_ns) return false;
    wire::LocalIpc body[wire::kLocalMaxIov];
    const int n = export_ipc(iov, mem, count, body);
    if (n < 0) return false;
    hdr.op = static_cast<uint8_t>(op);
    hdr.iov_count = static_cast<uint8_t>(n);
    hdr.flags &= ~uint8_t(wire::kLocalAckReq);  // Fin comes anyway, after delivery
    pending_[hdr.msg_id] = std::move(p);
    link.out.push(*sender_, hdr, body, n * sizeof(wire::LocalIpc));
    return true;
}

int Endpoint::export_ipc(const iovec *iov, const hmem::MemRef *mem, size_t count,
                         wire::LocalIpc *out) {
    if (count > wire::kLocalMaxIov) return -FI_EINVAL;
    int n = 0;
    for (size_t i = 0; i < count; ++i) {
        if (!iov[i].iov_len) continue;
        hmem::IpcExport ex;
        if (mem[i].on_host() || ipc_export_.get(mem[i], iov[i].iov_base, iov[i].iov_len, &ex))
            return -FI_EOPNOTSUPP;
        wire::LocalIpc &e = out[n++];
        memcpy(e.handle, ex.handle.bytes, sizeof e.handle);
        e.buffer_id = ex.buffer_id;
        e.alloc_len = ex.alloc_len;
        e.offset = ex.offset;
        e.length = iov[i].iov_len;
        e.addr = reinterpret_cast<uint64_t>(iov[i].iov_base);
        e.iface = static_cast<uint32_t>(ex.mem.iface);
        e.device = static_cast<uint32_t>(ex.mem.device);
    }
    return n;
}

void Endpoint::finish_pending(uint64_t msg_id, int status) {
    auto it = pending_.find(msg_id);
    if (it != pending_.end()) finish_pending(it, status);  // (else failed already: a dead peer)
}

void Endpoint::finish_pending(PendingMap::iterator it, int status) {
    const uint64_t msg_id = it->first;
    Pending p = std::move(it->second);
    pending_.erase(it);
    if (p.posted_ns && !status && p.link) shm::learn_lateness(*p.link, p.posted_ns, p.expected_ns);
    if (p.ipc && status == FI_EOPNOTSUPP && p2p_.mode() != FI_HMEM_P2P_REQUIRED && !p.link->dead) {
        // The peer could not map our memory: the same message again, staged by our device's
        // copies into cells, for the receive it is holding (Frag); or the same write again
        // (WriteFrag: the target holds nothing of the refused one).
        auto &c = hmem::counters();
        c.p2p_transfers.fetch_sub(1, std::memory_order_relaxed);
        c.staged_transfers.fetch_add(1, std::memory_order_relaxed);
        LocalHeader hdr = proto_;
        hdr.op = static_cast<uint8_t>(p.rma_write ? LocalOp::WriteFrag : LocalOp::Frag);
        hdr.flags = p.hdr_flags;
        hdr.tag = p.tag;
        hdr.cq_data = p.data;
        hdr.total = p.len;
        hdr.rma_addr = p.rma_addr;
        hdr.rma_key = p.rma_key;
        hdr.msg_id = msg_id;
        // FI_DELIVERY_COMPLETE: complete at the receiver's Fin for the staged copy.
        if (p.ack) hdr.flags |= wire::kLocalAckReq;
        if (!p.rma_write) hdr.flags |= wire::kLocalRestaged;  // for the receive it holds
        PeerLink &link = *p.link;
        std::vector<iovec> iov = p.iov;
        std::vector<hmem::MemRef> mem = p.mem;
        StreamEnd end = p.rma_write ? StreamEnd{.kind = StreamEnd::Kind::FailPending}
                                    : send_end(p.ack, p.context, p.flags);
        if (p.ack || p.rma_write) {  // the write ends at the target's Fin, as any write
            p.ipc = false;
            pending_[msg_id] = std::move(p);
        }
        link.out.push_stream(*sender_, hdr, iov.data(), iov.size(), hdr.total, mem.data(), end);
        return;
    } else if (p.ipc && p.rma_write && status == FI_EOPNOTSUPP) {
        hmem::counters().refused_transfers.fetch_add(1, std::memory_order_relaxed);
    } else if (p.ipc && status == FI_EOPNOTSUPP) {
        // FI_HMEM_P2P_REQUIRED: no staged copy. The receiver is holding its receive for
        // one: an empty last fragment carrying the error releases it.
        hmem::counters().refused_transfers.fetch_add(1, std::memory_order_relaxed);
        if (!p.link->dead) {
            LocalHeader hdr = proto_;
            hdr.op = static_cast<uint8_t>(LocalOp::Frag);
            hdr.flags = p.hdr_flags | wire::kLocalLast | wire::kLocalRestaged;
            hdr.tag = p.tag;
            hdr.total = p.len;
            hdr.msg_id = msg_id;
            hdr.status = FI_EOPNOTSUPP;
            p.link->out.push(*sender_, hdr, nullptr, 0);
        }
    }
    complete_tx(p.context, p.flags, p.len, status);
}

}  // namespace tandem::off
