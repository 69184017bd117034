// fid_ep for FI_EP_MSG and FI_EP_RDM: the adapter between libfabric's endpoint calls and the
// message engine (main_prov/engine.h). It owns what is the application's view of an endpoint:
// the ops tables, the forms of each data call (each mapped onto one of the engine's posts:
// endpoint_data.cpp for fi_msg and fi_tagged, endpoint_calls.cpp for RMA, atomics and
// collectives), the default operation flags and their aliases (fi_ep_alias), options and
// binds (checked here, what they set is the engine's).
#pragma once

#include "common/fid_adaptor.h"
#include "main_prov/engine.h"

#include <rdma/fi_endpoint.h>

namespace tandem {

// Default operation flags of the fid a data call came through: the endpoint's own, or those
// of an alias (fi_ep_alias) of it.
struct OpDefaults {
    uint64_t tx;
    uint64_t rx;
};

class Endpoint : public FidObject<Endpoint, fid_ep> {
  public:
    Endpoint(Domain *domain, fi_info *info, void *context);

    // fi_ops
    int close();
    int bind(struct fid *bfid, uint64_t flags);
    int control(int command, void *arg);
    int ops_open(const char *name, uint64_t flags, void **ops, void *context);
    // fi_ops_ep
    ssize_t cancel(void *context) { return engine_.cancel(context); }
    int getopt(int level, int optname, void *optval, size_t *optlen);
    int setopt(int level, int optname, const void *optval, size_t optlen);
    ssize_t rx_size_left() { return engine_.rx_size_left(); }
    ssize_t tx_size_left() { return engine_.tx_size_left(); }
    // fi_ops_cm
    int setname(void *addr, size_t addrlen) { return engine_.setname(addr, addrlen); }
    int getname(void *addr, size_t *addrlen) { return engine_.getname(addr, addrlen); }
    int getpeer(void *addr, size_t *addrlen) { return engine_.getpeer(addr, addrlen); }
    int connect(const void *addr, const void *param, size_t paramlen) {
        return engine_.connect(addr, param, paramlen);
    }
    int accept(const void *param, size_t paramlen) { return engine_.accept(param, paramlen); }
    int shutdown(uint64_t flags) { return engine_.shutdown(flags); }
    int join(const void *addr, uint64_t flags, fid_mc **mc, void *context) {
        return engine_.join(addr, flags, mc, context);
    }

    Engine &engine() { return engine_; }
    const OpDefaults &defaults() const { return defaults_; }
    void alias_opened() { ++aliases_; }
    void alias_closed() { --aliases_; }

  private:
    ~Endpoint() = default;  // through close()
    int open_alias(struct fi_alias *alias);

    OpDefaults defaults_{};
    int aliases_ = 0;
    Engine engine_;
};

// The engine behind a fid_ep of tandem's (an endpoint or an alias of one), else nullptr.
Engine *engine_of(fid_ep *ep);

}  // namespace tandem
