// Peer AV and AV set (fi_peer(3), "PEER AV", "PEER AV SET"): the owner's addressing, shared
// so that an fi_addr_t means the same peer in both providers.
#pragma once

#include "common/fid_adaptor.h"
#include "peer/peer_abi.h"

#include <rdma/fi_collective.h>

namespace tandem::peer {

// What the owner of an AV implements: fi_ops_av_owner plus tandem's lookups (PeerAvOps).
class AvOwner {
  public:
    virtual int peer_query(fi_av_attr *attr) = 0;
    virtual fi_addr_t peer_ep_addr(fid_ep *ep) = 0;
    virtual int peer_lookup(fi_addr_t fi_addr, void *addr, size_t *addrlen) = 0;
    virtual fi_addr_t peer_addr_of(const void *addr, size_t addrlen) = 0;
    virtual const std::atomic<uint64_t> *peer_version_word() = 0;

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
    int ops_open(const char *name, uint64_t flags, void **ops, void *context);
    friend struct ExportedAvOps;

    AvOwner &owner_;
    fi_peer_av_context context_;
    fi_ops fid_ops_;
};

// Importer side. lookup / addr_of work only with an owner that offers PeerAvOps (tandem).
class ImportedAv {
  public:
    ImportedAv() = default;
    explicit ImportedAv(fid_peer_av *av);
    static fid_peer_av *from_context(const void *context);

    bool valid() const { return av_ != nullptr; }
    bool has_lookup() const { return ext_ != nullptr; }
    int query(fi_av_attr &attr) const { return av_->owner_ops->query(av_, &attr); }
    fi_addr_t ep_addr(fid_ep *ep) const { return av_->owner_ops->ep_addr(av_, ep); }
    int lookup(fi_addr_t fi_addr, void *addr, size_t *addrlen) const {
        return ext_ ? ext_->lookup(av_, fi_addr, addr, addrlen) : -FI_ENOSYS;
    }
    fi_addr_t addr_of(const void *addr, size_t addrlen) const {
        return ext_ ? ext_->addr_of(av_, addr, addrlen) : FI_ADDR_NOTAVAIL;
    }
    // The owner's version word, or nullptr without tandem's extension.
    const std::atomic<uint64_t> *version_word() const { return version_word_; }
    // Without tandem's extension every call is a new version: nothing gets cached.
    uint64_t version() const {
        return version_word_ ? version_word_->load(std::memory_order_acquire) : ++uncached_;
    }

  private:
    fid_peer_av *av_ = nullptr;
    PeerAvOps *ext_ = nullptr;
    const std::atomic<uint64_t> *version_word_ = nullptr;
    mutable uint64_t uncached_ = 0;
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
