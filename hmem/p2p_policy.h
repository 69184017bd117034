// FI_OPT_FI_HMEM_P2P of one endpoint, and the decision it makes for each transfer that
// involves device memory. FI_HMEM_DISABLE_P2P in the environment takes precedence over
// anything the application sets (fi_mr(3)).
#pragma once

#include <rdma/fi_endpoint.h>

#include <cstddef>

namespace tandem::hmem {

enum class P2pDecision { PeerToPeer, Stage, Fail };

class P2pPolicy {
  public:
    // The FI_HMEM_DISABLE_P2P environment variable: set to a true value ("1", "yes", "on",
    // "true").
    static bool disabled_by_env();

    P2pPolicy();
    // fi_setopt(FI_OPT_FI_HMEM_P2P). endpoint_can_p2p: some path of the endpoint can move
    // device memory peer to peer. 0, -FI_EINVAL (not a mode), or -FI_EOPNOTSUPP (REQUIRED
    // where nothing can, or anything but DISABLED when the environment disabled P2P).
    int set(int mode, bool endpoint_can_p2p);
    int mode() const { return mode_; }

    // For one transfer of `len` device bytes over a path that can (or cannot) do it peer to
    // peer. ENABLED leaves the choice to tandem: transfers up to `small` bytes are staged,
    // because one handle exchange costs more than two copies of a few bytes; PREFERRED goes
    // peer to peer whenever it can.
    P2pDecision decide(bool path_can_p2p, size_t len, size_t small) const;

  private:
    int mode_;
};

}  // namespace tandem::hmem
