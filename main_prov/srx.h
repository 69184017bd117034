// fi_srx_context and fi_stx_context: shared receive and transmit contexts.
//
// A shared receive context owns one RxMatcher. Receives posted on it (fi_recv / fi_trecv on
// the context's fid) match messages arriving on every endpoint bound to it; a message is
// reported on the CQ of the endpoint it arrived on. A shared transmit context has nothing
// to share on tandem's links (each endpoint writes its own connections), so it only counts
// the endpoints using it.
//
// Opened with FI_PEER (fi_peer(3)), the context belongs to another provider, lnx for one: that
// owner posts and matches every receive, and the endpoints bound here ask it for a buffer when
// a message arrives (engine_owner_srx.cpp). Receives posted on it directly are refused.
#pragma once

#include "common/fabric_compat.h"
#include "common/fid_adaptor.h"
#include "main_prov/peer_rx_queue.h"
#include "main_prov/rx_matcher.h"
#include "peer/foreign_srx.h"

#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>

#include <memory>
#include <vector>

namespace tandem {

class Domain;
class Engine;

class SharedRxContext : public FidObject<SharedRxContext, fid_ep> {
  public:
    SharedRxContext(Domain *domain, const fi_rx_attr &attr, void *context);
    ~SharedRxContext();

    int close();
    int control(int command, void *arg);
    ssize_t cancel(void *context);
    int getopt(int level, int optname, void *optval, size_t *optlen);
    int setopt(int level, int optname, const void *optval, size_t optlen);
    ssize_t recv(void *buf, size_t len, void *desc, fi_addr_t src, void *context);
    ssize_t recvv(const iovec *iov, void **desc, size_t count, fi_addr_t src, void *context);
    ssize_t recvmsg(const fi_msg *msg, uint64_t flags);
    ssize_t trecv(void *buf, size_t len, void *desc, fi_addr_t src, uint64_t tag, uint64_t ignore,
                  void *context);
    ssize_t trecvv(const iovec *iov, void **desc, size_t count, fi_addr_t src, uint64_t tag,
                   uint64_t ignore, void *context);
    ssize_t trecvmsg(const fi_msg_tagged *msg, uint64_t flags);

    // Inside tandem, with the domain lock held.
    RxMatcher &matcher() { return matcher_; }
    void attach(Engine *ep) { endpoints_.push_back(ep); }
    void detach(Engine *ep) { std::erase(endpoints_, ep); }
    // FI_PEER: the owner's side of the context, or null for one of tandem's own.
    peer::ForeignOwnerSrx *owner() const { return owner_.get(); }

  private:
    ssize_t post(const iovec *iov, void **desc, size_t count, fi_addr_t src, void *context,
                 uint64_t flags, uint64_t tag, uint64_t ignore, bool tagged);
    Engine *report_endpoint() const { return endpoints_.empty() ? nullptr : endpoints_.front(); }

    Domain *domain_;
    uint64_t caps_;
    // What caps_ grants, by the domain's API version (common/fabric_compat.h).
    compat::CapsMeaning meaning_;
    uint64_t op_flags_;
    size_t size_;
    RxMatcher matcher_;
    std::vector<Engine *> endpoints_;
    // FI_EXPORT_FID: an importer (any peer provider) takes messages from this context.
    std::unique_ptr<PeerRxQueue> exported_;
    std::unique_ptr<peer::ForeignOwnerSrx> owner_;
};

class SharedTxContext : public FidObject<SharedTxContext, fid_stx> {
  public:
    SharedTxContext(Domain *domain, const fi_tx_attr &attr, void *context);
    ~SharedTxContext();
    int close();
    void attach() { ++users_; }
    void detach() { --users_; }

  private:
    Domain *domain_;
    int users_ = 0;
};

}  // namespace tandem
