// off_tandem's fid_cq: only ever the peer of an owner's CQ. Completions go straight to the
// owner through fid_peer_cq's write / writeerr; reading this CQ with a NULL buffer and a
// count of 0 drives the progress of the endpoints bound to it (fi_peer(3)); every other read
// answers -FI_ENOSYS, as fi_peer(3) says. fi_trywait on it (off_tandem's fabric) is how an
// owner about to sleep asks the endpoints bound to it to arm their wake-ups (trywait).
#pragma once

#include "common/fid_adaptor.h"
#include "peer/peer_cq.h"

#include <rdma/fi_eq.h>

#include <vector>

namespace tandem::off {

class Domain;
class Endpoint;

class Cq : public FidObject<Cq, fid_cq> {
  public:
    Cq(Domain *domain, fid_peer_cq *owner);
    ~Cq();

    int close();
    ssize_t read(void *buf, size_t count);
    ssize_t readfrom(void *buf, size_t count, fi_addr_t *src);
    ssize_t readerr(fi_cq_err_entry *buf, uint64_t flags);
    const char *strerror(int prov_errno, const void *err_data, char *buf, size_t len);

    const peer::ImportedCq &owner() const { return owner_; }
    // The Cq behind a fid, or nullptr when the fid is not one of ours.
    static Cq *ours(struct fid *f);
    // fi_trywait(3) for the endpoints bound to it, each armed (Endpoint::arm): -FI_EAGAIN when
    // one of them has work pending (its wake descriptor is then readable already), 0 when the
    // owner may sleep.
    int trywait();
    void attach(Endpoint *ep) { endpoints_.push_back(ep); }
    void detach(Endpoint *ep) { std::erase(endpoints_, ep); }

  private:
    Domain *domain_;
    peer::ImportedCq owner_;
    std::vector<Endpoint *> endpoints_;
};

}  // namespace tandem::off
