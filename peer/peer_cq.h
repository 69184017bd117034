// Peer CQ (fi_peer(3), "PEER CQ"). The owner of a CQ hands an ExportedCq to the peer's
// fi_cq_open(FI_PEER); the peer writes its completions through the owner's callbacks and
// never queues any of its own (its read calls answer -FI_ENOSYS).
#pragma once

#include "common/fid_adaptor.h"
#include "peer/peer_abi.h"

namespace tandem::peer {

// What the owner of a CQ implements. Called by the peer, possibly from the peer's own
// progress: an owner that can be reached outside its own calls locks here.
class CqOwner {
  public:
    virtual ssize_t peer_write(void *context, uint64_t flags, size_t len, void *buf, uint64_t data,
                               uint64_t tag, fi_addr_t src) = 0;
    virtual ssize_t peer_writeerr(const fi_cq_err_entry &err) = 0;

  protected:
    ~CqOwner() = default;
};

// Owner side: the fid_peer_cq. It must stay valid until the peer's CQ is closed, so the
// owner closes its peer's CQ before destroying this.
class ExportedCq : public FidObject<ExportedCq, fid_peer_cq> {
  public:
    explicit ExportedCq(CqOwner &owner);
    fi_peer_cq_context *context() { return &context_; }

  private:
    ssize_t write(void *context, uint64_t flags, size_t len, void *buf, uint64_t data, uint64_t tag,
                  fi_addr_t src) {
        return owner_.peer_write(context, flags, len, buf, data, tag, src);
    }
    ssize_t writeerr(const fi_cq_err_entry *err) {
        if (!err) return -FI_EINVAL;
        return owner_.peer_writeerr(*err);
    }
    friend struct ExportedCqOps;

    CqOwner &owner_;
    fi_peer_cq_context context_;
};

// Importer side: the owner's CQ as the peer sees it.
class ImportedCq {
  public:
    ImportedCq() = default;
    explicit ImportedCq(fid_peer_cq *cq) : cq_(cq) {}
    // The fi_peer_cq_context passed as fi_cq_open's context, checked.
    static fid_peer_cq *from_context(const void *context);

    bool valid() const { return cq_ != nullptr; }
    ssize_t write(void *context, uint64_t flags, size_t len, void *buf, uint64_t data, uint64_t tag,
                  fi_addr_t src) const {
        return cq_->owner_ops->write(cq_, context, flags, len, buf, data, tag, src);
    }
    ssize_t writeerr(const fi_cq_err_entry &err) const {
        return cq_->owner_ops->writeerr(cq_, &err);
    }

  private:
    fid_peer_cq *cq_ = nullptr;
};

}  // namespace tandem::peer
