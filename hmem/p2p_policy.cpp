#include "hmem/p2p_policy.h"

#include <rdma/fi_errno.h>
#include <strings.h>

#include <cstdlib>

namespace tandem::hmem {

bool P2pPolicy::disabled_by_env() {
    const char *v = getenv("FI_HMEM_DISABLE_P2P");
    if (!v) return false;
    return !strcasecmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "on") ||
           !strcasecmp(v, "true") || !strcasecmp(v, "y");
}

P2pPolicy::P2pPolicy() : mode_(disabled_by_env() ? FI_HMEM_P2P_DISABLED : FI_HMEM_P2P_ENABLED) {}

int P2pPolicy::set(int mode, bool endpoint_can_p2p) {
    switch (mode) {
        case FI_HMEM_P2P_ENABLED:
        case FI_HMEM_P2P_PREFERRED:
        case FI_HMEM_P2P_REQUIRED:
        case FI_HMEM_P2P_DISABLED:
            break;
        default:
            return -FI_EINVAL;
    }
    if (mode == FI_HMEM_P2P_DISABLED) {
        mode_ = mode;
        return 0;
    }
    if (disabled_by_env()) return -FI_EOPNOTSUPP;
    if (mode == FI_HMEM_P2P_REQUIRED && !endpoint_can_p2p) return -FI_EOPNOTSUPP;
    mode_ = mode;
    return 0;
}

P2pDecision P2pPolicy::decide(bool path_can_p2p, size_t len, size_t small) const {
    switch (mode_) {
        case FI_HMEM_P2P_DISABLED:
            return P2pDecision::Stage;
        case FI_HMEM_P2P_REQUIRED:
            return path_can_p2p ? P2pDecision::PeerToPeer : P2pDecision::Fail;
        case FI_HMEM_P2P_PREFERRED:
            return path_can_p2p ? P2pDecision::PeerToPeer : P2pDecision::Stage;
        default:
            return path_can_p2p && len > small ? P2pDecision::PeerToPeer : P2pDecision::Stage;
    }
}

}  // namespace tandem::hmem
