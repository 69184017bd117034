// RMA at the target: the key resolved through the owner, the copy into or out of the region
// (CMA, the cells' bytes, or the device's copies; a large write split with the initiator,
// ep/split_copy.cpp), a read answered in ReadData cells, and the end of the operation.
#include "offload_prov/endpoint.h"

#include "common/iov.h"
#include "common/log.h"
#include "main_prov/shm/cma.h"

#include <algorithm>

namespace tandem::off {

using wire::LocalHeader;
using wire::LocalOp;

int Endpoint::resolve(uint64_t key, uint64_t addr, size_t len, uint64_t access, iovec *iov,
                      hmem::MemRef *mem, size_t *count) {
    if (!owner_ep_ops_) return -FI_ENOSYS;
    return owner_ep_ops_->resolve(owner_ep_, key, addr, len, access, iov, mem, count);
}

namespace {

// What a case of handle_rma returns when the operation does not finish there: a write split
// with the initiator (its WriteDone finishes it), a read answered in ReadData cells, or one whose
// initiator is gone. (Other returns are a status: 0 or a positive fabric errno.)
constexpr int kNotFinished = -1;

}  // namespace

// k bytes into the region from offset at: copied here into host memory, by its device's
// copies into device memory.
int Endpoint::RmaRegion::place(size_t at, const uint8_t *from, size_t k) const {
    if (!device) {
        iov_scatter(pieces, count, at, from, k);
        return 0;
    }
    return hmem::scatter(pieces, mem, count, at, from, k) == ssize_t(k) ? 0 : FI_EIO;
}

// RMA at the target: the key is checked by the owner, the copy is ours.
void Endpoint::handle_rma(const LocalHeader &hdr, std::string_view sender, const uint8_t *body) {
    auto op = static_cast<LocalOp>(hdr.op);
    const bool fragment = op == LocalOp::WriteFrag;
    const bool last = !fragment || (hdr.flags & wire::kLocalLast);
    if (fragment && !failed_writes_.empty() && drop_failed_fragment(hdr, sender, last)) return;
    if (hdr.status) return;  // the initiator could not copy its memory and failed the write
    // The operation failed here: the initiator hears of it once, from the last fragment of a
    // staged write (see drop_failed_fragment), at once otherwise.
    auto fail = [&](int status) {
        if (last)
            answer(sender, hdr.msg_id, status);
        else
            failed_writes_.emplace(std::make_pair(std::string(sender), hdr.msg_id), status);
    };
    bool write = op != LocalOp::Read;
    uint64_t access = write ? FI_REMOTE_WRITE : FI_REMOTE_READ;
    // The key is checked against the whole operation, also for each fragment of a staged
    // write: a write that runs past the region is refused whole, none of its fragments land.
    const size_t len = hdr.total;
    const size_t at = fragment ? hdr.offset : 0;
    if (fragment && (hdr.offset > len || hdr.size > len - hdr.offset)) {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a write fragment outside its write\n");
        fail(FI_EINVAL);
        return;
    }
    RmaRegion region;
    int ret =
        resolve(hdr.rma_key, hdr.rma_addr, len, access, region.pieces, region.mem, &region.count);
    if (ret) {
        fail(ret == -FI_ENOSYS ? FI_EOPNOTSUPP : FI_EACCES);
        return;
    }
    // A target region in device memory: its device copies (CMA cannot reach it).
    region.device = !hmem::all_host(region.mem, region.count);
    int status = 0;
    switch (op) {
        case LocalOp::Write:
            status = rma_write(hdr, sender, body, region);
            break;
        case LocalOp::IpcWrite: {
            // The initiator's device buffers, mapped here; our region's device copies them in.
            wire::LocalIpc ipc[wire::kLocalMaxIov];  // (copied: the cell body is unaligned)
            memcpy(ipc, body, hdr.iov_count * sizeof(wire::LocalIpc));
            status = copy_from_ipc(hdr.pid, ipc, hdr.iov_count, region.pieces, region.mem,
                                   region.count, len);
            break;
        }
        case LocalOp::WriteFrag:
            status = region.place(at, body, hdr.size);
            if (status) {
                fail(status);
                return;
            }
            break;
        case LocalOp::Read:
            status = rma_read(hdr, sender, body, region);
            break;
        default:
            return;
    }
    if (status == kNotFinished || !last) return;
    finish_rma(hdr, sender, status);
}

// A fragment of a staged write whose earlier fragment failed: the rest are not placed, and its
// last fragment reports that first error, once. Nothing of a failed write counts as done.
// True when the fragment was of such a write (it is dropped).
bool Endpoint::drop_failed_fragment(const LocalHeader &hdr, std::string_view sender, bool last) {
    auto failed = failed_writes_.find(std::make_pair(std::string(sender), hdr.msg_id));
    if (failed == failed_writes_.end()) return false;
    if (last || hdr.status) {
        int status = failed->second;
        failed_writes_.erase(failed);
        if (!hdr.status) finish_rma(hdr, sender, status);
    }
    return true;
}

// A Write cell: its data in the cell, or read from the initiator's buffers (into device memory
// staged through the host, into host memory with CMA, by both sides when it is large: what
// the initiator sends meanwhile waits behind the write, the channel's SenderHold kept by the
// inbox's reader, until the split is finished at its WriteDone).
int Endpoint::rma_write(const LocalHeader &hdr, std::string_view sender, const uint8_t *body,
                        const RmaRegion &region) {
    const size_t len = hdr.total;
    if (hdr.iov_count == 0) return region.place(0, body, std::min<size_t>(hdr.size, len));
    iovec remote[wire::kLocalMaxIov];
    shm::remote_iovecs(body, hdr.iov_count, remote);
    if (region.device)
        return shm::SingleCopy::read_through_host(hdr.pid, region.pieces, region.mem, region.count,
                                                  remote, hdr.iov_count, len);
    shm::SingleCopy copy(hdr.pid, region.pieces, region.count, remote, hdr.iov_count, len);
    if (copy.start(*channel_, link_to(sender), hdr.msg_id)) return copy.status();
    channel_->holds().hold(sender);
    splits_.emplace(std::make_pair(std::string(sender), hdr.msg_id),
                    Split{nullptr, hdr, FI_ADDR_NOTAVAIL, copy});
    return kNotFinished;
}

// A Read cell: the region written into the initiator's buffers with CMA or, where CMA cannot
// (not permitted, device memory, no buffers named), sent back in ReadData cells.
int Endpoint::rma_read(const LocalHeader &hdr, std::string_view sender, const uint8_t *body,
                       const RmaRegion &region) {
    const size_t len = hdr.total;
    iovec remote[wire::kLocalMaxIov];
    shm::remote_iovecs(body, hdr.iov_count, remote);
    ssize_t put = -EPERM;
    if (hdr.iov_count && !region.device)
        put = cma_write(hdr.pid, region.pieces, region.count, remote, hdr.iov_count);
    if (put >= 0 && size_t(put) == len) return 0;
    if (put != -EPERM && put != -ENOSYS && hdr.iov_count != 0) return FI_EIO;
    // Staged answer: the data travels back in ReadData cells.
    PeerLink *link = link_to(sender);
    if (!link) return kNotFinished;
    LocalHeader out = proto_;
    out.op = static_cast<uint8_t>(LocalOp::ReadData);
    out.msg_id = hdr.msg_id;
    out.total = len;
    // The access counts once the data is sent, not when a device copy failed.
    link->out.push_stream(*sender_, out, region.pieces, region.count, len,
                          region.device ? region.mem : nullptr,
                          {.kind = StreamEnd::Kind::ReadAccess, .rma_key = hdr.rma_key});
    return kNotFinished;
}

// The target's side of an RMA operation is over: the counters and the remote CQ data of a
// successful one, and the initiator's Fin.
void Endpoint::finish_rma(const LocalHeader &hdr, std::string_view sender, int status) {
    bool write = static_cast<LocalOp>(hdr.op) != LocalOp::Read;
    uint64_t access = write ? FI_REMOTE_WRITE : FI_REMOTE_READ;
    if (!status && owner_ep_ops_) owner_ep_ops_->access_done(owner_ep_, hdr.rma_key, access);
    if (!status && write && (hdr.flags & wire::kLocalCqData)) {
        CqWrite w{.kind = CqWrite::Kind::Entry, .src = source_of(sender)};
        w.e.flags = FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA;
        w.e.len = hdr.total;
        w.e.data = hdr.cq_data;
        write_cq(w);
    }
    answer(sender, hdr.msg_id, status);
}

}  // namespace tandem::off
