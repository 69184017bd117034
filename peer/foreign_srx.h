// tandem as the peer of a shared receive context another provider owns (fi_peer(3), "PEER
// SRX", seen from the peer's side): lnx, which links tandem with shm, opens tandem's SRX with
// fi_srx_context(FI_PEER) and matches every receive itself. tandem then asks that owner for a
// buffer whenever a message arrives (get_msg / get_tag), and queues the message with it when
// there is none yet (queue_msg / queue_tag); the owner hands the entry back through the peer
// ops tandem installs (start_msg / start_tag, discard_msg / discard_tag).
//
// The owner was built with its core's headers, so it speaks the layout of the core that
// loaded tandem (peer/peer_abi_versions.h): get_tag's arguments and fi_peer_rx_entry changed
// in 1.19, 2.0 and 2.3. ForeignOwnerSrx reads and writes entries in that layout and calls the
// owner ops of that release; nothing of it is inline in tandem's hot paths.
#pragma once

#include "peer/peer_abi.h"
#include "peer/peer_abi_versions.h"

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace tandem::peer {

// What tandem reads from an entry the owner filled (a receive it matched, or one it now starts
// for a queued message).
struct OwnedReceive {
    iovec *iov = nullptr;
    void **desc = nullptr;
    size_t count = 0;
    void *context = nullptr;
    uint64_t flags = 0;
    void *peer_context = nullptr;  // what tandem wrote when it queued the entry
};

// What tandem writes into an entry it queues: the message as the owner will report it.
struct QueuedMessage {
    fi_addr_t addr = FI_ADDR_UNSPEC;
    size_t size = 0;
    uint64_t tag = 0;
    uint64_t flags = 0;  // FI_MSG or FI_TAGGED, FI_RECV, FI_REMOTE_CQ_DATA
    uint64_t cq_data = 0;
    void *peer_context = nullptr;
};

class ForeignOwnerSrx {
  public:
    // The fid_peer_srx of fi_srx_context's fi_peer_srx_context, or null (logged) when the
    // context is not one. abi: the layout the owner speaks (srx_abi_of the core's version).
    static fid_peer_srx *from_context(const void *context);
    ForeignOwnerSrx(fid_peer_srx *srx, SrxAbi abi) : srx_(srx), abi_(abi) {}
    // The layout an owner speaks: its core's, the one that loaded tandem (srx_abi_of).
    static SrxAbi core_abi();

    SrxAbi abi() const { return abi_; }
    fid_peer_srx *fid() const { return srx_; }
    // The peer ops table (its layout is the same in every release).
    void install(fi_ops_srx_peer *ops) const { srx_->peer_ops = ops; }

    // A buffer for a message from addr (size bytes, tag when tagged): 0 and a filled entry, or
    // -FI_ENOENT and an empty entry to queue (queue), or another negative error.
    int get(bool tagged, fi_addr_t addr, size_t size, uint64_t tag, void **entry) const;
    int queue(bool tagged, void *entry, const QueuedMessage &m) const;
    void free_entry(void *entry) const;
    // foreach_unspec_addr (1.19): the owner asks get_addr again for the source of each entry it
    // keeps with an unknown one, after tandem's AV learnt new addresses. false: the owner's
    // release has no such call (1.17), or it gave none.
    bool foreach_unspec_addr(GetAddr get_addr) const;
    OwnedReceive read(void *entry) const { return read(abi_, entry); }
    // (The peer ops get an entry alone: the layout is the core's.)
    static OwnedReceive read(SrxAbi abi, void *entry);

  private:
    fid_peer_srx *srx_;
    SrxAbi abi_;
};

}  // namespace tandem::peer
