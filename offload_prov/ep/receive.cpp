// Receives, which are the owner's: a whole message asks the owner's SRX for a buffer and is
// delivered into it (its bytes, a CMA read, a mapping of the sender's device memory, or a
// staged read), or is held here until the owner starts or discards it. (An owner that is
// tandem decodes host messages itself, Eager, Frag and Rts cells: they come here only from an
// owner that is not; tandem's messages here are device ones, IpcRts and its restaged Frags.)
#include "offload_prov/endpoint.h"

#include "common/iov.h"
#include "common/log.h"
#include "common/test_hook.h"
#include "main_prov/shm/cma.h"
#include "offload_prov/srx.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace tandem::off {

using wire::LocalHeader;
using wire::LocalIov;
using wire::LocalOp;

// A whole message (inline, assembled from fragments, or an Rts naming the sender's buffers)
// asks the owner for a receive buffer.
void Endpoint::handle_message(const LocalHeader &hdr, std::string_view sender, fi_addr_t src,
                              const uint8_t *data, const LocalIov *rts_iov,
                              std::vector<uint8_t> *owned, const wire::LocalIpc *ipc) {
    bool tagged = hdr.flags & wire::kLocalTagged;
    fi_peer_rx_entry *entry = nullptr;
    const peer::ImportedSrx &srx = srx_->owner();
    int ret = tagged ? srx.get_tag(src, hdr.tag, &entry) : srx.get_msg(src, hdr.total, &entry);
    place_message(ret, entry, hdr, sender, src, data, rts_iov, owned, ipc);
}

void Endpoint::place_message(int ret, fi_peer_rx_entry *entry, const LocalHeader &hdr,
                             std::string_view sender, fi_addr_t src, const uint8_t *data,
                             const LocalIov *rts_iov, std::vector<uint8_t> *owned,
                             const wire::LocalIpc *ipc) {
    if (ret == 0 && entry) {
        deliver(entry, hdr, sender, data, rts_iov, src, ipc);
        return;
    }
    if (ret != -FI_ENOENT || !entry) {
        TANDEM_WARN(FI_LOG_EP_DATA, "owner refused a receive buffer: %s\n", fi_strerror(-ret));
        if (rts_iov || ipc) answer(sender, hdr.msg_id, FI_ENOMEM);
        return;
    }
    // No receive yet: hold the message (its bytes, or only the sender's buffer list of an
    // Rts) and let the owner queue it until one is posted.
    auto *held = new HeldMessage;
    held->ep = this;
    held->hdr = hdr;
    held->sender.assign(sender);
    held->src = src;
    if (rts_iov)
        memcpy(held->iov, rts_iov, hdr.iov_count * sizeof(LocalIov));
    else if (ipc)
        memcpy(held->ipc, ipc, hdr.iov_count * sizeof(wire::LocalIpc));
    else if (owned)
        held->data = std::move(*owned);
    else
        held->data.assign(data, data + hdr.total);
    entry->peer_context = held;
    entry->size = hdr.total;
    entry->tag = hdr.tag;
    entry->addr = src;
    if (hdr.flags & wire::kLocalCqData) entry->flags |= FI_REMOTE_CQ_DATA;
    held_.insert(held);
    srx_->owner().queue(entry, hdr.flags & wire::kLocalTagged);
}

// Copies a message into the receive buffer the owner gave, writes its completion to the
// owner's CQ and hands the entry back.
void Endpoint::deliver(fi_peer_rx_entry *entry, const LocalHeader &hdr, std::string_view sender,
                       const uint8_t *data, const LocalIov *rts_iov, fi_addr_t src,
                       const wire::LocalIpc *ipc) {
    size_t room = iov_length(entry->iov, entry->count);
    size_t n = std::min<size_t>(hdr.total, room);
    int err = 0;
    // Where the receive buffer lives: the owner passes the application's descriptors.
    hmem::MemRef mem[peer::kMaxEntryIov];
    size_t count = std::min(entry->count, peer::kMaxEntryIov);
    bool device = entry->desc && peer::mems_of(entry->desc, count, mem);
    // This endpoint's own policy holds for what it receives: DISABLED opens no handle (the
    // sender stages instead); REQUIRED refuses device memory that arrives staged.
    int mode = p2p_.mode();
    if (ipc) {
        if (mode == FI_HMEM_P2P_DISABLED)
            err = FI_EOPNOTSUPP;
        else if (n)
            err = copy_from_ipc(hdr.pid, ipc, hdr.iov_count, entry->iov, device ? mem : nullptr,
                                count, n);
        if (err == FI_EOPNOTSUPP) {
            // We cannot map the sender's memory (IPC or peer access refused here): the sender
            // sends it again through cells, into this same receive.
            restaging_[std::make_pair(std::string(sender), hdr.msg_id)] = entry;
            answer(sender, hdr.msg_id, FI_EOPNOTSUPP);
            return;
        }
    } else if (device && n && mode == FI_HMEM_P2P_REQUIRED) {
        hmem::counters().refused_transfers.fetch_add(1, std::memory_order_relaxed);
        err = FI_EOPNOTSUPP;
    } else if (data && device) {
        if (hmem::scatter(entry->iov, mem, count, 0, data, n) < 0) err = FI_EIO;
    } else if (data) {
        iov_scatter(entry->iov, entry->count, 0, data, n);
    } else if (n) {
        iovec remote[wire::kLocalMaxIov];
        shm::remote_iovecs(reinterpret_cast<const uint8_t *>(rts_iov), hdr.iov_count, remote);
        if (device) {
            // Cross-memory attach cannot reach device memory: through a host bounce buffer.
            err = shm::SingleCopy::read_through_host(hdr.pid, entry->iov, mem, count, remote,
                                                     hdr.iov_count, n);
        } else {
            stop_at("local.before_cma_read");
            shm::SingleCopy copy(hdr.pid, entry->iov, entry->count, remote, hdr.iov_count, n);
            if (!copy.start(*channel_, link_to(sender), hdr.msg_id)) {
                // Completed by the sender's WriteDone.
                splits_.emplace(std::make_pair(std::string(sender), hdr.msg_id),
                                Split{entry, hdr, src, copy});
                return;
            }
            err = copy.status();
        }
    }
    if (hdr.op == static_cast<uint8_t>(LocalOp::Rts) ||
        hdr.op == static_cast<uint8_t>(LocalOp::IpcRts) || (hdr.flags & wire::kLocalAckReq))
        answer(sender, hdr.msg_id, err);
    complete_rx(entry, hdr, n, err, src);
}

// One copy per overlapping piece of the two lists.
int Endpoint::copy_from_ipc(pid_t pid, const wire::LocalIpc *ipc, size_t count, const iovec *to,
                            const hmem::MemRef *to_mem, size_t nto, size_t len) {
    if (count > wire::kLocalMaxIov) return FI_EINVAL;
    iovec from[wire::kLocalMaxIov];
    hmem::MemRef from_mem[wire::kLocalMaxIov];
    uint64_t device = to_mem && !to_mem[0].on_host() ? to_mem[0].device : UINT64_MAX;
    if (int err = map_ipc(pid, ipc, count, device, from, from_mem)) return err;
    size_t done = iov_walk2(
        to, nto, from, count, len, [&](size_t i, uint8_t *dst, size_t j, uint8_t *src, size_t k) {
            return hmem::copy(to_mem ? to_mem[i] : hmem::kHost, dst, from_mem[j], src, k) == 0;
        });
    return done == len ? 0 : FI_EIO;
}

// A peer's device buffers (`count` LocalIpc entries of process `pid`) mapped here (cached), each
// mapped on `local_device` (the device of our memory the copy goes to or from; UINT64_MAX for host
// memory: the peer's device number, so that engine reads the peer's memory into ours).
// FI_EOPNOTSUPP when a buffer cannot be mapped here, FI_EINVAL for a malformed entry.
int Endpoint::map_ipc(pid_t pid, const wire::LocalIpc *ipc, size_t count, uint64_t local_device,
                      iovec *remote, hmem::MemRef *rmem) {
    for (size_t i = 0; i < count; ++i) {
        const wire::LocalIpc &e = ipc[i];
        if (pid == getpid()) {  // a peer in our own process: its memory is ours
            if (!hmem::ipc_entry_consistent(e)) return FI_EINVAL;
            remote[i] = {reinterpret_cast<void *>(e.addr), e.length};
            rmem[i] = {static_cast<fi_hmem_iface>(e.iface), e.device};
            continue;
        }
        void *addr = nullptr;
        int ret = hmem::import_ipc_entry(ipc_import_, static_cast<uint64_t>(pid), local_device, e,
                                         &addr, &rmem[i]);
        if (ret == -FI_EINVAL) return FI_EINVAL;
        if (ret) return FI_EOPNOTSUPP;
        remote[i] = {addr, e.length};
    }
    return 0;
}

// The receive's completion to the owner's CQ, and its entry back to the owner.
void Endpoint::complete_rx(fi_peer_rx_entry *entry, const LocalHeader &hdr, size_t n, int err,
                           fi_addr_t src) {
    size_t room = iov_length(entry->iov, entry->count);
    if (!err && hdr.total > room) err = FI_ETRUNC;
    uint64_t flags = FI_RECV | ((hdr.flags & wire::kLocalTagged) ? FI_TAGGED : FI_MSG) |
                     ((hdr.flags & wire::kLocalCqData) ? FI_REMOTE_CQ_DATA : 0) |
                     (entry->flags & FI_MULTI_RECV);
    CqWrite w{.kind = err                              ? CqWrite::Kind::Error
                      : (entry->flags & FI_COMPLETION) ? CqWrite::Kind::Entry
                                                       : CqWrite::Kind::None,
              .src = src,
              .entry = entry};
    w.e.op_context = entry->context;
    w.e.flags = flags;
    w.e.len = n;
    w.e.buf = entry->count ? entry->iov[0].iov_base : nullptr;
    w.e.data = hdr.cq_data;
    w.e.tag = hdr.tag;
    if (err) {
        w.e.olen = hdr.total - n;
        w.e.err = err;
        w.e.prov_errno = err;
    }
    write_cq(w);
}

int Endpoint::start_held(fi_peer_rx_entry *entry) {
    auto *held = static_cast<HeldMessage *>(entry->peer_context);
    if (!held) return -FI_EINVAL;
    Endpoint *ep = held->ep;
    ep->note_work();
    ep->held_.erase(held);
    bool rts = held->hdr.op == static_cast<uint8_t>(LocalOp::Rts);
    bool ipc = held->hdr.op == static_cast<uint8_t>(LocalOp::IpcRts);
    ep->deliver(entry, held->hdr, held->sender, rts || ipc ? nullptr : held->data.data(),
                rts ? held->iov : nullptr, held->src, ipc ? held->ipc : nullptr);
    delete held;
    return 0;
}

int Endpoint::discard_held(fi_peer_rx_entry *entry) {
    auto *held = static_cast<HeldMessage *>(entry->peer_context);
    if (!held) return -FI_EINVAL;
    Endpoint *ep = held->ep;
    ep->note_work();
    ep->held_.erase(held);
    // The receiver dropped it: a sender waiting to have its buffers read is done with them.
    if (held->hdr.op == static_cast<uint8_t>(LocalOp::Rts) ||
        held->hdr.op == static_cast<uint8_t>(LocalOp::IpcRts) ||
        (held->hdr.flags & wire::kLocalAckReq))
        ep->answer(held->sender, held->hdr.msg_id, 0);
    delete held;
    ep->srx_->owner().free_entry(entry);
    return 0;
}

}  // namespace tandem::off
