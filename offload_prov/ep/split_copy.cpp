// Split copies: a large Rts message or RMA write read with CMA is copied by both sides at
// once (the receiver reads the first half while the sender writes the second: Cts, then
// WriteDone; the reader's side is shm::SingleCopy): the sender's side here, and the end of a
// split of ours.
#include "offload_prov/endpoint.h"

namespace tandem::off {

using wire::LocalHeader;

// Sender side of a split copy (shm::SingleCopy::write_part): our part of the Rts or RMA write
// the Cts names, if we still have it.
void Endpoint::handle_cts(const LocalHeader &hdr, std::string_view sender, const uint8_t *body) {
    auto it = answered_by(hdr, sender);
    const bool ours = it != pending_.end() && !it->second.iov.empty();
    shm::SingleCopy::write_part(*channel_, hdr, sender, body,
                                ours ? it->second.iov.data() : nullptr,
                                ours ? it->second.iov.size() : 0);
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
