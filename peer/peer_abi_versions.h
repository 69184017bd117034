// fi_peer(3)'s shared receive context as each libfabric release from 1.17 to 2.6 lays it out,
// for the providers tandem shares objects with but did not build (the core's shm, lnx): they
// are built with their core's headers, so tandem answers them in the layout of the core that
// loaded it (fi_version()). Between tandem and off_tandem, built together, the layout is
// always this build's own (<rdma/fi_ext.h> of 1.17), whatever the core.
//
// fi_peer(3) warns that these structures are not stable between versions. What changed
// (include/rdma/providers/fi_peer.h at each release tag of ofiwg/libfabric):
//  - 1.19: fi_peer_rx_entry gained cq_data after tag; fi_ops_srx_owner gained
//    foreach_unspec_addr before free_entry;
//  - 2.0: get_msg and get_tag take a struct fi_peer_match_attr (addr, msg_size, tag) instead
//    of (addr, size) and (addr, tag); the entry's size is named msg_size (same place);
//  - 2.3: fi_peer_rx_entry lost its leading next and prev pointers.
// fi_ops_srx_peer, fid_peer_srx, fi_peer_srx_context, the peer CQ and the peer AV kept their
// layouts over all of these releases.
#pragma once

#include "peer/peer_abi.h"

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace tandem::peer {

// fi_open_ops name, on an SRX tandem exported (fi_export_fid), by which an importer built with
// tandem's own headers (off_tandem) says so: the export then speaks this build's layout to it
// whatever the core, and *ops is that layout's owner ops table. An importer that gets
// -FI_ENOSYS has an owner tandem did not build, which speaks its core's layout.
inline constexpr const char *kSrxBuildLayoutName = "tandem_srx_build_layout_v1";

enum class SrxAbi {
    V1_17,  // 1.17 and 1.18: this build's own
    V1_19,  // 1.19 to 1.22
    V2_0,   // 2.0 to 2.2
    V2_3,   // 2.3 and later
};

// The layout a core of this version gives its providers.
inline constexpr SrxAbi srx_abi_of(uint32_t core_version) {
    if (core_version >= FI_VERSION(2, 3)) return SrxAbi::V2_3;
    if (core_version >= FI_VERSION(2, 0)) return SrxAbi::V2_0;
    if (core_version >= FI_VERSION(1, 19)) return SrxAbi::V1_19;
    return SrxAbi::V1_17;
}

// fi_peer_rx_entry from 1.19 to 2.2.
struct RxEntryLinked {
    void *next;
    void *prev;
    fid_peer_srx *srx;
    fi_addr_t addr;
    size_t size;  // msg_size from 2.0
    uint64_t tag;
    uint64_t cq_data;
    uint64_t flags;
    void *context;
    size_t count;
    void **desc;
    void *peer_context;
    void *owner_context;
    iovec *iov;
};

// fi_peer_rx_entry from 2.3.
struct RxEntryUnlinked {
    fid_peer_srx *srx;
    fi_addr_t addr;
    size_t size;  // msg_size
    uint64_t tag;
    uint64_t cq_data;
    uint64_t flags;
    void *context;
    size_t count;
    void **desc;
    void *peer_context;
    void *owner_context;
    iovec *iov;
};

// struct fi_peer_match_attr (2.0).
struct MatchAttr {
    fi_addr_t addr;
    size_t msg_size;
    uint64_t tag;
};

// The entry a foreign peer sees, as opaque to it as fi_peer_rx_entry: the owner ops of each
// layout take and give pointers to one of the structures above.
using GetAddr = fi_addr_t (*)(void *entry);

// fi_ops_srx_owner from 1.19 to 1.22.
struct SrxOwnerOps1_19 {
    size_t size;
    int (*get_msg)(fid_peer_srx *srx, fi_addr_t addr, size_t size, void **entry);
    int (*get_tag)(fid_peer_srx *srx, fi_addr_t addr, uint64_t tag, void **entry);
    int (*queue_msg)(void *entry);
    int (*queue_tag)(void *entry);
    void (*foreach_unspec_addr)(fid_peer_srx *srx, GetAddr get_addr);
    void (*free_entry)(void *entry);
};

// fi_ops_srx_owner from 2.0.
struct SrxOwnerOps2_0 {
    size_t size;
    int (*get_msg)(fid_peer_srx *srx, MatchAttr *attr, void **entry);
    int (*get_tag)(fid_peer_srx *srx, MatchAttr *attr, void **entry);
    int (*queue_msg)(void *entry);
    int (*queue_tag)(void *entry);
    void (*foreach_unspec_addr)(fid_peer_srx *srx, GetAddr get_addr);
    void (*free_entry)(void *entry);
};

// An entry in a foreign layout, beside the owner's own (OwnerRxEntry::foreign): room for
// either, and the copies both ways at the points the peer API hands an entry over.
union ForeignRxEntry {
    RxEntryLinked linked;
    RxEntryUnlinked unlinked;
};

// (E: this build's fi_peer_rx_entry; a template so that this header also compiles against
// another release's headers, where tests/unit/abi_layouts_2x.cpp checks the layouts.)
template <class E, class F>
void copy_to_foreign(const E &e, uint64_t cq_data, F &f) {
    f.srx = e.srx;
    f.addr = e.addr;
    f.size = e.size;
    f.tag = e.tag;
    f.cq_data = cq_data;
    f.flags = e.flags;
    f.context = e.context;
    f.count = e.count;
    f.desc = e.desc;
    f.peer_context = e.peer_context;
    f.owner_context = e.owner_context;
    f.iov = e.iov;
}

// What a peer writes into an entry it queues (fi_peer(3)): its context, and the message's
// size, flags, source and remote CQ data; the tag it matched with.
template <class F, class E>
void copy_from_foreign(const F &f, E &e, uint64_t &cq_data) {
    e.addr = f.addr;
    e.size = f.size;
    e.tag = f.tag;
    e.flags = f.flags;
    e.peer_context = f.peer_context;
    cq_data = f.cq_data;
}

}  // namespace tandem::peer
