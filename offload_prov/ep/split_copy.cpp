// Split copies: a large Rts message or RMA write read with CMA is copied by both sides at
// once (the receiver reads the first half while the sender writes the second: Cts, then
// WriteDone; the reader's side is shm::SingleCopy): the sender's side here, and the end of a
// split of ours.
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
    Split split = std::move(it->second);
    splits_.erase(it);
    split.copy.finish(*channel_, hdr.status);
    end_split(split, sender);
}

// The split's end (its copy finished or abandoned): the write done, or the message delivered.
void Endpoint::end_split(const Split &split, std::string_view sender) {
    const int err = split.copy.status();
    if (!split.entry) {
        finish_rma(split.hdr, sender, err);
        channel_->holds().lift(sender);  // the inbox's reader replays what it kept
        return;
    }
    answer(sender, split.hdr.msg_id, err);
    complete_rx(split.entry, split.hdr, split.copy.length(), err, split.src);
}

}  // namespace tandem::off
