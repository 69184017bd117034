// tandem's endpoint diagnostics (fi_open_ops on an endpoint, for tests and tools such as
// bench/tandem_bench): what path operations to a peer take. A header of its own so that a tool
// needs nothing else of tandem's.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>

#include <cstddef>
#include <cstdint>

namespace tandem::peer {

// fi_open_ops name of tandem's endpoint diagnostics (tests, tools).
inline constexpr const char *kEpDiagOpsName = "tandem_ep_diag_v2";

// The path an RDM endpoint's operations to a peer take (EpDiagOps::peer_path).
enum class PeerPath : int {
    Link = 1,             // the link (TCP)
    LocalStaged = 2,      // node-local, large transfers staged through the shared rings
    LocalSingleCopy = 3,  // node-local, large transfers copied once by cross-memory attach
};

struct EpDiagOps {
    size_t size;
    // The path to the peer at addr (a PeerPath), decided now if no operation decided it yet;
    // or a negative errno (-FI_EINVAL: no such address). An MSG endpoint's is its link.
    int (*peer_path)(fid_ep *ep, fi_addr_t addr);
};

}  // namespace tandem::peer
