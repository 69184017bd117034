// Compiled (not run) against a libfabric 2.3 or newer's headers by scripts/test-libfabric2.sh
// (g++ -fsyntax-only -I<prefix>/include): the layouts and values tandem keeps for releases
// newer than its own headers (peer/peer_abi_versions.h, common/fabric_compat.h) are those of
// the release's own headers, or the compile fails.
// (The headers' peer API first: tandem's own headers then use it, not 1.17's copy.)
#include <rdma/providers/fi_peer.h>

#include "common/fabric_compat.h"
#include "peer/peer_abi_versions.h"
#include "peer/peer_cntr.h"

#include <cstddef>

#if FI_MAJOR_VERSION < 2 || (FI_MAJOR_VERSION == 2 && FI_MINOR_VERSION < 3)
#error "needs the headers of libfabric 2.3 or newer"
#endif

namespace tandem::peer {

#define SAME_FIELD(ours, theirs, field, their_field) \
    static_assert(offsetof(ours, field) == offsetof(theirs, their_field), #field)

SAME_FIELD(RxEntryUnlinked, fi_peer_rx_entry, srx, srx);
SAME_FIELD(RxEntryUnlinked, fi_peer_rx_entry, addr, addr);
SAME_FIELD(RxEntryUnlinked, fi_peer_rx_entry, size, msg_size);
SAME_FIELD(RxEntryUnlinked, fi_peer_rx_entry, tag, tag);
SAME_FIELD(RxEntryUnlinked, fi_peer_rx_entry, cq_data, cq_data);
SAME_FIELD(RxEntryUnlinked, fi_peer_rx_entry, flags, flags);
SAME_FIELD(RxEntryUnlinked, fi_peer_rx_entry, context, context);
SAME_FIELD(RxEntryUnlinked, fi_peer_rx_entry, count, count);
SAME_FIELD(RxEntryUnlinked, fi_peer_rx_entry, desc, desc);
SAME_FIELD(RxEntryUnlinked, fi_peer_rx_entry, peer_context, peer_context);
SAME_FIELD(RxEntryUnlinked, fi_peer_rx_entry, owner_context, owner_context);
SAME_FIELD(RxEntryUnlinked, fi_peer_rx_entry, iov, iov);
static_assert(sizeof(RxEntryUnlinked) == sizeof(fi_peer_rx_entry));

SAME_FIELD(OwnerCntrOps, fi_ops_cntr_owner, inc, inc);
SAME_FIELD(OwnerCntrOps, fi_ops_cntr_owner, incerr, incerr);
static_assert(sizeof(OwnerCntrOps) == sizeof(fi_ops_cntr_owner));
SAME_FIELD(OwnerCntr, fid_peer_cntr, owner_ops, owner_ops);
static_assert(sizeof(OwnerCntr) == sizeof(fid_peer_cntr));
SAME_FIELD(OwnerCntrContext, fi_peer_cntr_context, cntr, cntr);
static_assert(sizeof(OwnerCntrContext) == sizeof(fi_peer_cntr_context));

SAME_FIELD(MatchAttr, fi_peer_match_attr, addr, addr);
SAME_FIELD(MatchAttr, fi_peer_match_attr, msg_size, msg_size);
SAME_FIELD(MatchAttr, fi_peer_match_attr, tag, tag);
static_assert(sizeof(MatchAttr) == sizeof(fi_peer_match_attr));

SAME_FIELD(SrxOwnerOps2_0, fi_ops_srx_owner, get_msg, get_msg);
SAME_FIELD(SrxOwnerOps2_0, fi_ops_srx_owner, get_tag, get_tag);
SAME_FIELD(SrxOwnerOps2_0, fi_ops_srx_owner, queue_msg, queue_msg);
SAME_FIELD(SrxOwnerOps2_0, fi_ops_srx_owner, queue_tag, queue_tag);
SAME_FIELD(SrxOwnerOps2_0, fi_ops_srx_owner, foreach_unspec_addr, foreach_unspec_addr);
SAME_FIELD(SrxOwnerOps2_0, fi_ops_srx_owner, free_entry, free_entry);
static_assert(sizeof(SrxOwnerOps2_0) == sizeof(fi_ops_srx_owner));

}  // namespace tandem::peer
