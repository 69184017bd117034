// off_tandem's fid_eq: only ever the peer of an owner's EQ (fi_eq_open with FI_PEER and a
// fi_peer_eq_context). Events the offload provider raises are written to the owner's EQ, so
// the application reads them where it reads everything else; reading this one is -FI_ENOSYS.
#pragma once

#include "common/fid_adaptor.h"

#include <rdma/fi_eq.h>

namespace tandem::off {

class Fabric;

class Eq : public FidObject<Eq, fid_eq> {
  public:
    Eq(Fabric *fabric, fid_eq *owner);
    ~Eq();
    int close();
    ssize_t write(uint32_t event, const void *buf, size_t len, uint64_t flags);

    // An event of the offload provider, reported on the owner's EQ.
    ssize_t report(uint32_t event, const void *buf, size_t len, uint64_t flags) {
        return fi_eq_write(owner_, event, buf, len, flags);
    }

  private:
    Fabric *fabric_;
    fid_eq *owner_;
};

}  // namespace tandem::off
