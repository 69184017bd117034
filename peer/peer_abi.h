// The peer API's structures, from wherever this libfabric keeps them, and the few values the
// two providers agree on that libfabric does not name publicly.
//
// libfabric 1.17 declares the peer structures in <rdma/fi_ext.h>. Where the header and
// fi_peer(3) differ, the header is the ABI (fi_ops_srx_peer callbacks take a
// fi_peer_rx_entry *, whose field is owner_context). Against the headers of 1.19 or later
// (cmake -DTANDEM_LIBFABRIC_PREFIX) the two providers keep 1.17's structures between them
// (peer/peer_api_1_17.h, in place of <rdma/providers/fi_peer.h>), unless a file that compares
// those headers' layouts with tandem's included theirs first (tests/unit/abi_layouts_2x.cpp).
#pragma once

#include <atomic>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#if FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION) >= FI_VERSION(1, 19)
#ifndef FI_PEER_H
#include "peer/peer_api_1_17.h"
#endif
#elif __has_include(<rdma/providers/fi_peer.h>)
#include <rdma/providers/fi_peer.h>
#endif
#include <rdma/fi_ext.h>

#include <sys/uio.h>

#include <cstdint>

#include "common/short_cell.h"
#include "hmem/hmem.h"
#include "peer/ep_diag.h"

namespace tandem::peer {

// What fi_mr_desc() of a tandem memory region points at: where the registered memory lives,
// in a plain structure both providers read. tandem hands the application's descriptors to
// its offload twin unchanged, so the twin knows a buffer's iface and device without asking.
inline constexpr uint64_t kMrDescMagic = 0x74616e64656d4d52ull;  // "tandemMR"
struct MrDesc {
    uint64_t magic = kMrDescMagic;
    hmem::MemRef mem;
    void *owner = nullptr;  // tandem's memory region
};

// The memory of a descriptor the application passed (null or foreign: host memory).
inline hmem::MemRef mem_of(const void *desc) {
    auto *d = static_cast<const MrDesc *>(desc);
    return d && d->magic == kMrDescMagic ? d->mem : hmem::kHost;
}
// Fills mem[0..count) from descriptors; false when every buffer is host memory.
inline bool mems_of(void *const *desc, size_t count, hmem::MemRef *mem) {
    bool device = false;
    for (size_t i = 0; i < count; ++i) {
        mem[i] = desc ? mem_of(desc[i]) : hmem::kHost;
        device |= !mem[i].on_host();
    }
    return device;
}

// The core hides providers named off_* unless fi_getinfo's flags carry this core-internal
// bit (OFI_OFFLOAD_PROV_ONLY in libfabric's sources; not in any installed header).
inline constexpr uint64_t kOffloadProvOnly = 1ull << 61;
// The core filters fi_getinfo's answers by FI_PROVIDER once the providers answered, which
// drops off_tandem's entries when the user names only tandem; with this core-internal bit
// (OFI_GETINFO_INTERNAL, used by the core's own utility providers) it skips that filter.
inline constexpr uint64_t kGetinfoInternal = 1ull << 58;

// The offload provider's name: the "off_" prefix is what makes the core hide it.
inline constexpr const char *kOffloadProvName = "off_tandem";

// fid ops for the fids an owner exports: the peer uses only their owner ops, so fi_close and
// friends on them answer -FI_ENOSYS (closing an exported object is the owner's business).
fi_ops *exported_fid_ops();

}  // namespace tandem::peer
