// Peer AV and AV set (fi_peer(3), "PEER AV", "PEER AV SET"): the owner's addressing, shared
// so that an fi_addr_t means the same peer in both providers.
#pragma once

#include "common/fid_adaptor.h"
#include "peer/peer_abi.h"

#include <rdma/fi_collective.h>

namespace tandem::peer {

// What the owner of an AV implements: fi_ops_av_owner. (That gives a peer no way to read an
// entry: tandem's twin finds node-local peers through the channel tandem lends it,
// peer::OffloadOps::attach.)
class AvOwner {
  public:
    virtual int peer_query(fi_av_attr *attr) = 0;
    virtual fi_addr_t peer_ep_addr(fid_ep *ep) = 0;

  protected:
    ~AvOwner() = default;
};

class ExportedAv : public FidObject<ExportedAv, fid_peer_av> {
  public:
    explicit ExportedAv(AvOwner &owner);
    fi_peer_av_context *context() { return &context_; }

  private:
    int query(fi_av_attr *attr) { return attr ? owner_.peer_query(attr) : -FI_EINVAL; }
    fi_addr_t ep_addr(fid_ep *ep) { return owner_.peer_ep_addr(ep); }
    friend struct ExportedAvOps;

    AvOwner &owner_;
    fi_peer_av_context context_;
};

// Importer side.
class ImportedAv {
  public:
    ImportedAv() = default;
    explicit ImportedAv(fid_peer_av *av) : av_(av) {}
    static fid_peer_av *from_context(const void *context);

    bool valid() const { return av_ != nullptr; }
    int query(fi_av_attr &attr) const { return av_->owner_ops->query(av_, &attr); }
    fi_addr_t ep_addr(fid_ep *ep) const { return av_->owner_ops->ep_addr(av_, ep); }

  private:
    fid_peer_av *av_ = nullptr;
};

// What the owner of an AV set implements.
class AvSetOwner {
  public:
    // fi_peer(3): -FI_ETOOSMALL with *count set when the array is too small.
    virtual int peer_members(fi_addr_t *addr, size_t *count) = 0;

  protected:
    ~AvSetOwner() = default;
};

class ExportedAvSet : public FidObject<ExportedAvSet, fid_peer_av_set> {
  public:
    explicit ExportedAvSet(AvSetOwner &owner);
    fi_peer_av_set_context *context() { return &context_; }

  private:
    int members(fi_addr_t *addr, size_t *count) {
        return count ? owner_.peer_members(addr, count) : -FI_EINVAL;
    }
    friend struct ExportedAvSetOps;

    AvSetOwner &owner_;
    fi_peer_av_set_context context_;
};

class ImportedAvSet {
  public:
    ImportedAvSet() = default;
    explicit ImportedAvSet(fid_peer_av_set *set) : set_(set) {}
    static fid_peer_av_set *from_context(const void *context);
    bool valid() const { return set_ != nullptr; }
    int members(fi_addr_t *addr, size_t *count) const {
        return set_->owner_ops->members(set_, addr, count);
    }

  private:
    fid_peer_av_set *set_ = nullptr;
};

}  // namespace tandem::peer
