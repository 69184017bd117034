#include "offload_prov/srx.h"

#include "common/unsupported_ops.h"
#include "offload_prov/domain.h"
#include "offload_prov/endpoint.h"

namespace tandem::off {

namespace {

fi_ops srx_fi_ops = fid_ops(&Trampoline<&Srx::close>::call<fid>);

// Receives are posted on the owner's context, never here.
fi_ops_ep srx_ep_ops = fid_ep_ops();

// The owner calls these for a message this provider queued (fi_peer_rx_entry::peer_context
// is the endpoint's HeldMessage).
int start_entry(fi_peer_rx_entry *entry) noexcept try {
    return Endpoint::start_held(entry);
} catch (...) {
    return current_exception_errno();
}

int discard_entry(fi_peer_rx_entry *entry) noexcept try {
    return Endpoint::discard_held(entry);
} catch (...) {
    return current_exception_errno();
}

fi_ops_srx_peer srx_peer_ops = {
    .size = sizeof(fi_ops_srx_peer),
    .start_msg = start_entry,
    .start_tag = start_entry,
    .discard_msg = discard_entry,
    .discard_tag = discard_entry,
};

}  // namespace

Srx::Srx(Domain *domain, fid_peer_srx *owner) : domain_(domain), owner_(owner) {
    init_fid(FI_CLASS_SRX_CTX, nullptr, &srx_fi_ops);
    fid()->ops = &srx_ep_ops;
    complete_ep_tables(*fid());
    owner_.install(&srx_peer_ops);
    domain_->hold();
}

Srx::~Srx() {
    // The owner's context outlives us (fi_peer(3)): it must not call into a closed peer.
    owner_.install(nullptr);
    domain_->release();
}

int Srx::close() {
    if (refs_) return -FI_EBUSY;
    delete this;
    return 0;
}

}  // namespace tandem::off
