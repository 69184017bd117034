// Split copies: a large Rts message or RMA write read with CMA is copied by both sides at
// once (the receiver reads the first half while the sender writes the second: Cts, then
// WriteDone), and what keeps an initiator's later cells behind its split write (ordering).
#include "offload_prov/endpoint.h"

#include "common/iov.h"
#include "common/test_hook.h"
#include "offload_prov/config.h"
#include "main_prov/shm/cma.h"

#include <cstring>

namespace tandem::off {

using wire::LocalHeader;
using wire::LocalIov;
using wire::LocalOp;

// Asks the sender of msg_id to write bytes [half, n) of its buffers into ours (`dst` holds
// all n): false, with nothing sent, when that part does not fit one Cts or no claim slot is
// free (we copy it all then). *claim: the slot the Cts names, open.
bool Endpoint::send_cts(PeerLink &link, uint64_t msg_id, const iovec *dst, size_t ndst, size_t half,
                        size_t n, uint64_t *claim) {
    iovec mine[wire::kLocalMaxIov];
    size_t nmine = iov_slice(dst, ndst, half, n - half, mine, wire::kLocalMaxIov);
    if (!nmine || iov_length(mine, nmine) != n - half) return false;
    std::optional<shm::ClaimId> opened = channel_->claims().open();
    if (!opened) return false;
    *claim = *opened;
    LocalHeader cts = proto_;
    cts.op = static_cast<uint8_t>(LocalOp::Cts);
    cts.msg_id = msg_id;
    cts.offset = half;
    cts.total = n - half;
    cts.iov_count = static_cast<uint8_t>(nmine);
    cts.rma_key = *claim;
    LocalIov body[wire::kLocalMaxIov];
    for (size_t i = 0; i < nmine; ++i)
        body[i] = {reinterpret_cast<uint64_t>(mine[i].iov_base), mine[i].iov_len};
    link.out.push(*sender_, cts, body, nmine * sizeof(LocalIov));
    return true;
}

// Our part of a split is read: if the sender has not taken its part by now (it had no core
// while we copied ours), we take it back and read it too, rather than wait for the sender to
// be scheduled; otherwise its WriteDone finishes the split.
void Endpoint::split_read(Split split, std::string_view sender) {
    if (!split.err && !test_split_wait() && channel_->claims().take_back(split.claim)) {
        finish_split(split, sender, FI_EAGAIN);
        return;
    }
    splits_.emplace(std::make_pair(std::string(sender), split.hdr.msg_id), split);
}

// Sender side of a split copy: write our part into the receiver's buffer, once the claim is
// ours (the receiver may have taken it back already: then it reads the part itself).
void Endpoint::handle_cts(const LocalHeader &hdr, std::string_view sender, const uint8_t *body) {
    stop_at("local.cts_arrived");
    PeerLink *link = link_to(sender);
    // Taken back (or not a claim of its table): nothing of ours to write, nobody waits for a
    // WriteDone.
    if (hdr.rma_key != wire::kLocalNoClaim &&
        !(link && shm::SplitClaims::take_for_sender(link->split_claims, hdr.rma_key)))
        return;
    stop_at("local.cts_claimed");
    int status = FI_EIO;
    auto it = pending_.find(hdr.msg_id);
    if (it != pending_.end() && !it->second.iov.empty()) {
        Pending &p = it->second;
        iovec local[wire::kLocalMaxIov];
        size_t nlocal =
            iov_slice(p.iov.data(), p.iov.size(), hdr.offset, hdr.total, local, wire::kLocalMaxIov);
        bool whole = iov_length(local, nlocal) == hdr.total;
        auto *dst = reinterpret_cast<const LocalIov *>(body);
        iovec remote[wire::kLocalMaxIov];
        for (size_t i = 0; i < hdr.iov_count; ++i)
            remote[i] = {reinterpret_cast<void *>(dst[i].addr), dst[i].length};
        ssize_t put = whole ? cma_write(hdr.pid, local, nlocal, remote, hdr.iov_count) : -EINVAL;
        status = (put >= 0 && uint64_t(put) == hdr.total) ? 0 : FI_EIO;
    }
    if (!link) return;
    LocalHeader done = proto_;
    done.op = static_cast<uint8_t>(LocalOp::WriteDone);
    done.msg_id = hdr.msg_id;
    done.status = status;
    link->out.push(*sender_, done, nullptr, 0);
}

// Receiver side: the sender wrote its part (or could not: then we read it ourselves).
void Endpoint::handle_write_done(const LocalHeader &hdr, std::string_view sender) {
    auto it = splits_.find(std::make_pair(std::string(sender), hdr.msg_id));
    if (it == splits_.end()) return;
    Split split = it->second;
    splits_.erase(it);
    finish_split(split, sender, hdr.status);
}

// The split's end: `sender_status` is the sender's part's (0 written; otherwise we read it
// here: FI_EAGAIN when we took it back, an error when the sender could not write it).
void Endpoint::finish_split(const Split &split, std::string_view sender, int sender_status) {
    channel_->claims().release(split.claim);
    int err = split.err;
    if (!err && sender_status != 0) {
        // Our buffer and the sender's, both from `half` to `n`.
        iovec local[wire::kLocalMaxIov * 4], rest[wire::kLocalMaxIov];
        size_t nlocal = split.entry ? iov_slice(split.entry->iov, split.entry->count, split.half,
                                                split.n - split.half, local, std::size(local))
                                    : iov_slice(split.target, split.ntarget, split.half,
                                                split.n - split.half, local, std::size(local));
        size_t nrest = iov_slice(split.remote, split.nremote, split.half, split.n - split.half,
                                 rest, wire::kLocalMaxIov);
        ssize_t got = cma_read(split.hdr.pid, local, nlocal, rest, nrest);
        if (got < 0 || size_t(got) != split.n - split.half)
            err = got == -ESRCH ? FI_ECONNRESET : FI_EIO;
    }
    if (!split.entry) {
        finish_rma(split.hdr, sender, err);
        channel_->holds().lift(sender);  // the inbox's reader replays what it kept
        return;
    }
    answer(sender, split.hdr.msg_id, err);
    complete_rx(split.entry, split.hdr, split.n, err, split.src);
}

}  // namespace tandem::off
