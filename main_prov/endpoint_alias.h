// An endpoint's aliases (fi_ep_alias) and DataCall, the data-path trampoline that serves
// the endpoint and its aliases alike. In a header so that the tables of the calls on the
// small-message path (ep_msg_ops, ep_tagged_ops) can live in endpoint_data.cpp, next to the
// calls, which the compiler then inlines into their trampolines.
#pragma once

#include "common/fabric_error.h"
#include "common/fid_adaptor.h"
#include "main_prov/domain.h"
#include "main_prov/endpoint.h"

#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>

#include <mutex>

namespace tandem {

// An alias (fi_ep_alias): another fid_ep for the same endpoint with its own default
// operation flags for one direction. It shares the endpoint's data-path ops tables; DataCall
// tells the two apart by their fi_ops table.
class EndpointAlias : public FidObject<EndpointAlias, fid_ep> {
  public:
    EndpointAlias(Endpoint *parent, const OpDefaults &defaults)
        : parent(parent), defaults(defaults) {
        parent->alias_opened();
    }
    ~EndpointAlias() { parent->alias_closed(); }
    int close() {
        std::lock_guard guard(parent->engine().domain()->lock());
        delete this;
        return 0;
    }
    Endpoint *parent;
    OpDefaults defaults;
};

// The fi_ops of every alias: DataCall tells an alias from its endpoint by it.
extern fi_ops alias_fi_ops;
// The data-path tables the endpoint and its aliases share (endpoint_data.cpp).
extern fi_ops_msg ep_msg_ops;
extern fi_ops_tagged ep_tagged_ops;
// endpoint_calls.cpp
extern fi_ops_rma ep_rma_ops;
extern fi_ops_atomic ep_atomic_ops;
extern fi_ops_collective ep_coll_ops;

// Data calls: each form F of a call, with the engine behind the fid (an endpoint's or an
// alias's) and the default flags of the fid used.
template <auto F>
struct DataCall;

template <class R, class... A, R (*F)(Engine &, const OpDefaults &, A...)>
struct DataCall<F> {
    static R call(fid_ep *fid, A... args) noexcept {
        try {
            // One call of F, so that it is inlined once.
            Endpoint *ep;
            const OpDefaults *defaults;
            if (fid->fid.ops == &alias_fi_ops) [[unlikely]] {
                EndpointAlias *alias = EndpointAlias::of(fid);
                ep = alias->parent;
                defaults = &alias->defaults;
            } else {
                ep = Endpoint::of(fid);
                defaults = &ep->defaults();
            }
            return F(ep->engine(), *defaults, args...);
        } catch (...) {
            return error_return<R>(current_exception_errno());
        }
    }
};

}  // namespace tandem
