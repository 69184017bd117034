// The owner endpoint as its offload twin sees it: the fid_ep tandem hands off_tandem as
// fi_peer_transfer_context.ep (fi_peer(3)). The twin posts its own traffic to remote twins on
// it (fi_tsendmsg / fi_trecvmsg with FI_PEER_TRANSFER), cancels those receives, asks the
// owner's name, and checks remote keys with the owner (owner_ops, handed to the twin with
// peer::OffloadOps::attach). Nothing else: every other call is -FI_ENOSYS.
//
// Why a face of its own rather than the application's fid_ep: the twin runs only inside
// tandem's calls, under the domain lock, and calls back from there. The application's entry
// points take the lock; these check that it is held and call the same bodies, so the domain
// lock is never taken twice by one thread (main_prov/lock_order.h).
#pragma once

#include "common/fid_adaptor.h"
#include "main_prov/engine.h"
#include "peer/offload_ops.h"

#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>

namespace tandem {

class OwnerFace : public FidObject<OwnerFace, fid_ep> {
  public:
    explicit OwnerFace(Engine &ep);
    OwnerFace(const OwnerFace &) = delete;
    OwnerFace &operator=(const OwnerFace &) = delete;
    Engine &endpoint() const { return ep_; }

    // The owner's answers about its memory registrations (peer::OwnerOps), for the twin.
    static const peer::OwnerOps &owner_ops();
    ssize_t cancel(void *context);
    int getname(void *addr, size_t *addrlen);
    ssize_t sendmsg(const fi_msg *msg, uint64_t flags);
    ssize_t recvmsg(const fi_msg *msg, uint64_t flags);
    ssize_t tsendmsg(const fi_msg_tagged *msg, uint64_t flags);
    ssize_t trecvmsg(const fi_msg_tagged *msg, uint64_t flags);

  private:
    ssize_t send(const Engine::SendArgs &a);
    Engine &ep_;
};

}  // namespace tandem
