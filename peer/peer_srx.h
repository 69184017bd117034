// Peer shared receive context (fi_peer(3), "PEER SRX"). The owner matches every receive;
// a peer that gets a message asks the owner for a buffer (get_msg / get_tag). Two flows:
//  - a buffer was posted first: the owner fills an entry and returns 0; the peer copies
//    into entry->iov, writes the completion and calls free_entry;
//  - the message came first: the owner returns -FI_ENOENT with an empty entry, the peer
//    fills peer_context (and size) and calls queue_msg / queue_tag; when the application
//    posts a matching buffer the owner fills the entry and calls the peer's start_msg /
//    start_tag (or discard_msg / discard_tag to drop it).
#pragma once

#include "common/fid_adaptor.h"
#include "peer/peer_abi.h"
#include "peer/peer_abi_versions.h"

#include <sys/uio.h>

#include <functional>

namespace tandem::peer {

// An entry the owner allocates: the libfabric part first (the peer sees only that), then
// room for the receive's scatter list so that no entry needs a second allocation.
inline constexpr size_t kMaxEntryIov = 4;

struct OwnerRxEntry {
    fi_peer_rx_entry entry{};
    iovec iov[kMaxEntryIov]{};
    void *desc[kMaxEntryIov]{};
    void *owner = nullptr;     // the owner object that allocated it
    void *owner_op = nullptr;  // the owner's receive, when one was matched
    // What a peer of another release sees (peer/peer_abi_versions.h), copied from `entry`
    // whenever the entry is handed to it and back when it queues the entry; and the remote
    // CQ data such a peer wrote there (from 1.19).
    ForeignRxEntry foreign{};
    uint64_t cq_data = 0;

    static OwnerRxEntry *of(fi_peer_rx_entry *e) { return reinterpret_cast<OwnerRxEntry *>(e); }
    static OwnerRxEntry *of_foreign(void *f) {
        return reinterpret_cast<OwnerRxEntry *>(static_cast<char *>(f) -
                                                offsetof(OwnerRxEntry, foreign));
    }
};
static_assert(offsetof(OwnerRxEntry, entry) == 0);

// What the owner implements (fi_ops_srx_owner). Called by the peer, possibly from the
// peer's own progress: an owner reachable outside its own calls locks here.
class SrxOwner {
  public:
    virtual int peer_get_msg(fi_addr_t addr, size_t size, fi_peer_rx_entry **entry) = 0;
    virtual int peer_get_tag(fi_addr_t addr, uint64_t tag, fi_peer_rx_entry **entry) = 0;
    virtual int peer_queue_msg(fi_peer_rx_entry *entry) = 0;
    virtual int peer_queue_tag(fi_peer_rx_entry *entry) = 0;
    virtual void peer_free_entry(fi_peer_rx_entry *entry) = 0;
    // fi_ops_srx_owner::foreach_unspec_addr (1.19): each queued message whose source was not
    // yet in the AV (FI_ADDR_UNSPEC), for the peer to name it now.
    virtual void peer_foreach_unspec_addr(const std::function<void(fi_peer_rx_entry *)> &fn) = 0;

  protected:
    ~SrxOwner() = default;
};

// Owner side: the fid_peer_srx handed to the peer's fi_srx_context(FI_PEER). The peer
// installs its fi_ops_srx_peer into it; the owner starts or discards queued entries with them.
// `abi`: the layout the peer was built with (SrxAbi::V1_17, this build's, for our own twin).
class ExportedSrx : public FidObject<ExportedSrx, fid_peer_srx> {
  public:
    explicit ExportedSrx(SrxOwner &owner, SrxAbi abi = SrxAbi::V1_17);
    fi_peer_srx_context *context() { return &context_; }
    bool peer_attached() const;
    // For an entry the peer queued: hand it the buffer now in the entry, or drop it.
    int start(fi_peer_rx_entry *entry, bool tagged);
    int discard(fi_peer_rx_entry *entry, bool tagged);
    // fi_open_ops(kSrxBuildLayoutName): the importer was built with our headers.
    int ops_open(const char *name, uint64_t flags, void **ops, void *context);

  private:
    int get_msg(fi_addr_t addr, size_t size, fi_peer_rx_entry **entry) {
        return owner_.peer_get_msg(addr, size, entry);
    }
    int get_tag(fi_addr_t addr, uint64_t tag, fi_peer_rx_entry **entry) {
        return owner_.peer_get_tag(addr, tag, entry);
    }
    // The entry as the peer sees it: e itself, or its foreign view filled from it now.
    fi_peer_rx_entry *handed(fi_peer_rx_entry *e) const;
    friend struct ExportedSrxOps;
    template <SrxAbi>
    friend struct ForeignSrxOps;

    SrxOwner &owner_;
    SrxAbi abi_;
    fi_peer_srx_context context_;
};

// Importer side: the owner's receive queue as the peer sees it.
class ImportedSrx {
  public:
    ImportedSrx() = default;
    explicit ImportedSrx(fid_peer_srx *srx) : srx_(srx) {}
    // The fi_peer_srx_context passed as fi_srx_context's context, checked.
    // The owner's layout must be this build's: a tandem SRX switched to it (an export of
    // tandem's), or any owner under a core whose layout is this build's. Null, logged, when
    // not (an owner built for another release's peer API).
    static fid_peer_srx *from_context(const void *context);

    bool valid() const { return srx_ != nullptr; }
    fid_peer_srx *fid() const { return srx_; }
    void install(fi_ops_srx_peer *ops) const { srx_->peer_ops = ops; }
    int get_msg(fi_addr_t addr, size_t size, fi_peer_rx_entry **entry) const {
        return srx_->owner_ops->get_msg(srx_, addr, size, entry);
    }
    int get_tag(fi_addr_t addr, uint64_t tag, fi_peer_rx_entry **entry) const {
        return srx_->owner_ops->get_tag(srx_, addr, tag, entry);
    }
    int queue(fi_peer_rx_entry *entry, bool tagged) const {
        return tagged ? srx_->owner_ops->queue_tag(entry) : srx_->owner_ops->queue_msg(entry);
    }
    void free_entry(fi_peer_rx_entry *entry) const { srx_->owner_ops->free_entry(entry); }

  private:
    fid_peer_srx *srx_ = nullptr;
};

}  // namespace tandem::peer
