// The reading side of a node-local single copy by cross-memory attach: a message an Rts names
// read into its receive (tandem's decoder, and off_tandem's for an owner that is not tandem),
// an RMA write that names its initiator's buffers read into the target region (off_tandem's).
//
// From wire::kLocalSplitMin both processes copy at once (two cores, twice the copy rate): the
// reader asks the sender (a Cts naming the reader's buffers from `half`, and a claim in its
// segment's SplitClaims) to write the second half while it reads the first. Whoever takes the
// claim copies that half: the sender when the Cts reaches it, or the reader once its own half
// is read and the sender has not begun (it may have no core now), which then waits for
// nothing. Otherwise the sender's WriteDone ends the copy.
#pragma once

#include "common/wire.h"
#include "hmem/hmem.h"

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tandem::shm {

class Channel;
struct PeerInbox;

// The buffers of another process a cell's body lists (n wire::LocalIov, maybe unaligned), as
// iovecs for cross-memory attach.
void remote_iovecs(const uint8_t *body, size_t n, iovec *out);

class SingleCopy {
  public:
    static constexpr size_t kMaxPieces = 16;  // of the reader's buffer (an RMA region's at most)

    SingleCopy() = default;
    // n bytes of process pid's buffers `remote` into ours, `local` (host memory; the first
    // kMaxPieces of it).
    SingleCopy(pid_t pid, const iovec *local, size_t nlocal, const iovec *remote, size_t nremote,
               size_t n);

    // Copies all of it now (true), or, when `sender` (its peer in the channel; nullptr: gone)
    // allows cross-memory attach, the copy is split-sized and a claim is free, the first half
    // after a Cts under msg_id asks the sender for the rest: true again when the sender had not
    // taken its part by the time ours was read (we read it too), false while its part is under
    // way (finish or abandon ends the copy). The Cts waits in the sender's backlog when its
    // ring is full: the channel's flush sends it.
    bool start(Channel &channel, PeerInbox *sender, uint64_t msg_id);
    // The sender's WriteDone: status 0, its part written; an FI_* code, it could not, and we
    // read that part ourselves.
    void finish(Channel &channel, int sender_status);
    // The sender died before its WriteDone: the copy fails (FI_ECONNRESET).
    void abandon(Channel &channel);

    int status() const { return err_; }  // 0 or a positive FI_* code
    size_t length() const { return n_; }
    pid_t pid() const { return pid_; }
    uint64_t claim() const { return claim_; }
    // Our buffer (what start was given).
    const iovec *local() const { return local_; }
    size_t local_count() const { return nlocal_; }

    // Cross-memory attach into buffers that may be device memory (`mem`: where each of `local`
    // lives): a chunk at a time through a host bounce buffer, then the device's copy. 0 or an
    // FI_* code (FI_ECONNRESET: the process is gone).
    static int read_through_host(pid_t pid, const iovec *local, const hmem::MemRef *mem,
                                 size_t nlocal, const iovec *remote, size_t nremote, size_t n);

    // The sending side of a split: the reader's Cts `cts` (its pid vouched for; body: the
    // reader's buffers from cts.offset, wire::LocalIov) asks for bytes [cts.offset, +cts.total)
    // of our message, whose buffers are `src` (nullptr: no operation of ours has that id any
    // more). Once the claim is ours we write them and answer WriteDone (0, or FI_EIO: the
    // reader then reads that part itself). A claim the reader took back already (it read the
    // part) is not answered: nobody waits for it.
    static void write_part(Channel &channel, const wire::LocalHeader &cts, std::string_view reader,
                           const uint8_t *body, const iovec *src, size_t nsrc);

  private:
    bool send_cts(Channel &channel, PeerInbox &sender, uint64_t msg_id);
    // Reads [from, from + len) of the sender's buffers into the same range of ours.
    void read(size_t from, size_t len);

    pid_t pid_ = 0;
    iovec local_[kMaxPieces]{};
    size_t nlocal_ = 0;
    iovec remote_[wire::kLocalMaxIov]{};
    size_t nremote_ = 0;
    size_t n_ = 0, half_ = 0;
    uint64_t claim_ = wire::kLocalNoClaim;
    int err_ = 0;
};

}  // namespace tandem::shm
