// RMA at the target: the key resolved through the owner, the copy into or out of the region
// (CMA, the cells' bytes, or the device's copies; a large write split with the initiator,
// ep/split_copy.cpp), a read answered in ReadData cells, and the end of the operation.
#include "offload_prov/endpoint.h"

#include "common/iov.h"
#include "common/log.h"
#include "offload_prov/shm/cma.h"

#include <algorithm>

namespace tandem::off {

using wire::LocalHeader;
using wire::LocalIov;
using wire::LocalOp;

int Endpoint::resolve(uint64_t key, uint64_t addr, size_t len, uint64_t access, iovec *iov,
                      hmem::MemRef *mem, size_t *count) {
    if (!owner_ep_ops_) return -FI_ENOSYS;
    return owner_ep_ops_->resolve(owner_ep_, key, addr, len, access, iov, mem, count);
}

// RMA at the target: the key is checked by the owner, the copy is ours.
void Endpoint::handle_rma(const LocalHeader &hdr, std::string_view sender, const uint8_t *body) {
    auto op = static_cast<LocalOp>(hdr.op);
    const bool fragment = op == LocalOp::WriteFrag;
    const bool last = !fragment || (hdr.flags & wire::kLocalLast);
    // A staged write whose earlier fragment failed: the rest are not placed, and its last
    // fragment reports that first error, once. Nothing of a failed write counts as done.
    if (fragment && !failed_writes_.empty()) {
        auto failed = failed_writes_.find(std::make_pair(std::string(sender), hdr.msg_id));
        if (failed != failed_writes_.end()) {
            if (last || hdr.status) {
                int status = failed->second;
                failed_writes_.erase(failed);
                if (!hdr.status) finish_rma(hdr, sender, status);
            }
            return;
        }
    }
    if (hdr.status) return;  // the initiator could not copy its memory and failed the write
    // The operation failed here: the initiator hears of it once, from the last fragment of a
    // staged write (see above), at once otherwise.
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
    iovec pieces[kMaxRmaPieces];
    hmem::MemRef pmem[kMaxRmaPieces];
    size_t npieces = kMaxRmaPieces;
    int ret = resolve(hdr.rma_key, hdr.rma_addr, len, access, pieces, pmem, &npieces);
    if (ret) {
        fail(ret == -FI_ENOSYS ? FI_EOPNOTSUPP : FI_EACCES);
        return;
    }
    int status = 0;
    auto *remote_iov = reinterpret_cast<const LocalIov *>(body);
    iovec remote[wire::kLocalMaxIov];
    if (op != LocalOp::IpcWrite)
        for (size_t i = 0; i < hdr.iov_count; ++i)
            remote[i] = {reinterpret_cast<void *>(remote_iov[i].addr), remote_iov[i].length};
    // A target region in device memory: its device copies (CMA cannot reach it).
    bool device = !hmem::all_host(pmem, npieces);
    auto place = [&](const uint8_t *from, size_t k) {
        if (!device) {
            iov_scatter(pieces, npieces, at, from, k);
            return 0;
        }
        return hmem::scatter(pieces, pmem, npieces, at, from, k) == ssize_t(k) ? 0 : FI_EIO;
    };
    switch (op) {
        case LocalOp::Write:
            if (hdr.iov_count == 0) {
                status = place(body, std::min<size_t>(hdr.size, len));
            } else if (device) {
                status =
                    cma_read_staged(hdr.pid, pieces, pmem, npieces, remote, hdr.iov_count, len);
            } else {
                // A large write is copied by both sides at once, as a large message is (see
                // deliver): the initiator writes the second half while we read the first.
                size_t half = (len / 2) & ~size_t(4095);
                PeerLink *link = len >= wire::kLocalSplitMin ? link_to(sender) : nullptr;
                uint64_t claim = wire::kLocalNoClaim;
                if (link && link->cma &&
                    send_cts(*link, hdr.msg_id, pieces, npieces, half, len, &claim)) {
                    iovec local[kMaxRmaPieces], first[wire::kLocalMaxIov];
                    size_t nlocal = iov_slice(pieces, npieces, 0, half, local, std::size(local));
                    size_t nfirst =
                        iov_slice(remote, hdr.iov_count, 0, half, first, std::size(first));
                    ssize_t got = cma_read(hdr.pid, local, nlocal, first, nfirst);
                    Split split{nullptr,          hdr, len,     half, {}, hdr.iov_count, 0,
                                FI_ADDR_NOTAVAIL, {},  npieces, claim};
                    std::copy(remote, remote + hdr.iov_count, split.remote);
                    std::copy(pieces, pieces + npieces, split.target);
                    if (got < 0 || size_t(got) != half)
                        split.err = got == -ESRCH ? FI_ECONNRESET : FI_EIO;
                    // What the initiator sends meanwhile waits behind the write (deferred_),
                    // until the split is finished: now, or at the initiator's WriteDone.
                    deferred_.try_emplace(std::string(sender));
                    split_read(split, sender);
                    return;
                }
                ssize_t got = cma_read(hdr.pid, pieces, npieces, remote, hdr.iov_count);
                if (got < 0 || size_t(got) != len) status = FI_EIO;
            }
            break;
        case LocalOp::IpcWrite: {
            // The initiator's device buffers, mapped here; our region's device copies them in.
            wire::LocalIpc ipc[wire::kLocalMaxIov];  // (copied: the cell body is unaligned)
            memcpy(ipc, body, hdr.iov_count * sizeof(wire::LocalIpc));
            status = copy_from_ipc(hdr, ipc, pieces, pmem, npieces, len);
            break;
        }
        case LocalOp::WriteFrag:
            status = place(body, hdr.size);
            if (status) {
                fail(status);
                return;
            }
            break;
        case LocalOp::Read: {
            ssize_t put = -EPERM;
            if (hdr.iov_count && !device)
                put = cma_write(hdr.pid, pieces, npieces, remote, hdr.iov_count);
            if (put >= 0 && size_t(put) == len) break;
            if (put == -EPERM || put == -ENOSYS || hdr.iov_count == 0) {
                // Staged answer: the data travels back in ReadData cells.
                PeerLink *link = link_to(sender);
                if (!link) return;
                LocalHeader out = proto_;
                out.op = static_cast<uint8_t>(LocalOp::ReadData);
                out.msg_id = hdr.msg_id;
                out.total = len;
                // The access counts once the data is sent, not when a device copy failed.
                push_staged(*link, out, pieces, npieces, len, device ? pmem : nullptr,
                            {.kind = StreamEnd::Kind::ReadAccess, .rma_key = hdr.rma_key});
                return;
            }
            status = FI_EIO;
            break;
        }
        default:
            return;
    }
    if (!last) return;
    finish_rma(hdr, sender, status);
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
