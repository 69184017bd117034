// off_tandem's side of a peer shared receive context. The owner matches every receive; this
// object holds the owner's fid_peer_srx, installs the peer callbacks (start / discard of a
// message the owner matched later) and is bound to the endpoints whose arrivals it serves.
#pragma once

#include "common/fid_adaptor.h"
#include "peer/peer_srx.h"

#include <rdma/fi_endpoint.h>

namespace tandem::off {

class Domain;
class Endpoint;

// What an endpoint leaves in fi_peer_rx_entry::peer_context for a message it queued with the
// owner: the start / discard callbacks find their endpoint (and its held message) through it.
struct HeldMessage;

class Srx : public FidObject<Srx, fid_ep> {
  public:
    Srx(Domain *domain, fid_peer_srx *owner);
    ~Srx();
    int close();

    const peer::ImportedSrx &owner() const { return owner_; }
    void hold() { ++refs_; }
    void release() { --refs_; }

  private:
    Domain *domain_;
    peer::ImportedSrx owner_;
    int refs_ = 0;
};

}  // namespace tandem::off
