// off_tandem's fid_av and fid_av_set: only ever peers of the owner's. Addresses are the
// owner's (the application inserts into the owner's AV), so an fi_addr_t names the same peer
// in both providers; inserting here answers -FI_ENOSYS.
#pragma once

#include "common/fid_adaptor.h"
#include "peer/peer_av.h"

#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>

#include <atomic>
#include <vector>

namespace tandem::off {

class Domain;

class Av : public FidObject<Av, fid_av> {
  public:
    Av(Domain *domain, fid_peer_av *owner);
    ~Av();
    int close();
    int av_set(fi_av_set_attr *attr, fid_av_set **set, void *context);

    const peer::ImportedAv &owner() const { return owner_; }
    void hold() { ++refs_; }
    void release() { --refs_; }

  private:
    Domain *domain_;
    peer::ImportedAv owner_;
    std::atomic<int> refs_{0};
};

class AvSet : public FidObject<AvSet, fid_av_set> {
  public:
    AvSet(Av *av, fid_peer_av_set *owner);
    ~AvSet();
    int close();
    // The set's members as the owner reports them now.
    std::vector<fi_addr_t> members() const;

  private:
    Av *av_;
    peer::ImportedAvSet owner_;
};

}  // namespace tandem::off
