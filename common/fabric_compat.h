// What libfabric releases after 1.17 define that tandem, built against 1.17's headers (Debian
// bookworm's), needs in order to serve them: the numbers their headers name and 1.17's lack,
// each with the release and header it comes from, and what the API version an application
// asked for (fi_getinfo's `version`, kept in fabric_attr->api_version) changes in the meaning
// of the numbers both have. This is the one place such numbers are spelled; a build against a
// newer libfabric's headers (-DTANDEM_LIBFABRIC_PREFIX) checks them against its definitions.
//
// The core and the application may each be of any release from 1.17 to 2.6: the application's
// version decides what its fi_info bits mean (fabric.h reassigned some in 1.21 and 2.0), the
// core's (fi_version()) how the structures it shares with other providers are laid out
// (peer/peer_abi_versions.h).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstddef>
#include <cstdint>

namespace tandem::compat {

// The newest API whose rules tandem implements: fi_provider::fi_version. The core lists a
// provider only for applications that ask for this version or an older one; cores from 1.3 on
// load a provider whatever newer version it names (only older than 1.3 is refused).
inline constexpr uint32_t kNewestApi = FI_VERSION(2, 6);

inline constexpr uint32_t kApi1_21 = FI_VERSION(1, 21);
inline constexpr uint32_t kApi2_0 = FI_VERSION(2, 0);

// --- capability bits whose meaning depends on the application's API version (fabric.h) -----
// 1.21 removed FI_XPU_TRIGGER (bit 44, "unimplemented" upstream; tandem implements it, and an
// endpoint of a newer application gets XPU triggers with FI_TRIGGER and FI_HMEM, as
// fi_trigger.h's FI_TRIGGER_XPU and FI_OPT_XPU_TRIGGER remain) and FI_VARIABLE_MSG (bit 48).
// 2.0 gave bits 45 and 46 (1.x: FI_HMEM_HOST_ALLOC, FI_HMEM_DEVICE_ONLY, which stay as
// fi_mr_regattr flags) and 48 new capabilities:
inline constexpr uint64_t kXpuTriggerCap = 1ull << 44;       // FI_XPU_TRIGGER, up to 1.20
inline constexpr uint64_t kTaggedDirectedRecv = 1ull << 45;  // FI_TAGGED_DIRECTED_RECV, 2.0
inline constexpr uint64_t kTaggedMultiRecv = 1ull << 46;     // FI_TAGGED_MULTI_RECV, 2.0
inline constexpr uint64_t kExactDirectedRecv = 1ull << 48;   // FI_EXACT_DIRECTED_RECV, 2.0

// The API version an fi_info was answered for (the core records it in fabric_attr); 1.x's
// meanings where it records none (an fi_info the application filled itself).
inline uint32_t api_version_of(const fi_info *info) {
    return info && info->fabric_attr && info->fabric_attr->api_version
               ? info->fabric_attr->api_version
               : FI_VERSION(1, 17);
}
// What an endpoint's capabilities mean, read once from its fi_info (caps and the API version
// the core recorded in fabric_attr->api_version).
struct CapsMeaning {
    bool xpu_trigger;        // FI_TRIGGER_XPU may be posted
    bool directed_msg;       // fi_recv's src_addr is matched
    bool directed_tagged;    // fi_trecv's src_addr is matched
    bool exact_directed;     // FI_ADDR_UNSPEC refused as a directed receive's source
    bool tagged_multi_recv;  // fi_trecvmsg may take FI_MULTI_RECV (FI_TAGGED_MULTI_RECV)
};
inline constexpr CapsMeaning caps_meaning(uint64_t caps, uint32_t version) {
    const bool v2 = version >= kApi2_0;
    const bool exact = v2 && (caps & kExactDirectedRecv);
    const bool directed = (caps & FI_DIRECTED_RECV) || exact;
    return {
        .xpu_trigger = version >= kApi1_21 ? (caps & FI_TRIGGER) && (caps & FI_HMEM)
                                           : (caps & kXpuTriggerCap) != 0,
        .directed_msg = directed,
        .directed_tagged = directed || (v2 && (caps & kTaggedDirectedRecv)),
        .exact_directed = exact,
        .tagged_multi_recv = v2 && (caps & kTaggedMultiRecv),
    };
}
// caps without the receive bits that mean nothing at this version (bit 46 is
// FI_TAGGED_MULTI_RECV only from 2.0), so that a receive can test caps itself.
inline constexpr uint64_t receive_caps(uint64_t caps, uint32_t version) {
    return caps_meaning(caps, version).tagged_multi_recv ? caps : caps & ~kTaggedMultiRecv;
}

// --- other values 1.17's headers lack -----------------------------------------------------
// fi_endpoint.h: option names after FI_OPT_XPU_TRIGGER (9), in their enum's order.
inline constexpr int kOptCudaApiPermitted = 10;       // 1.18, bool
inline constexpr int kOptSharedMemoryPermitted = 11;  // 1.21, bool
inline constexpr int kOptMaxMsgSize = 12;             // 1.22, size_t
inline constexpr int kOptMaxTaggedSize = 13;          // 1.22
inline constexpr int kOptMaxRmaSize = 14;             // 1.22
inline constexpr int kOptMaxAtomicSize = 15;          // 1.22
inline constexpr int kOptInjectMsgSize = 16;          // 1.22
inline constexpr int kOptInjectTaggedSize = 17;       // 1.22
inline constexpr int kOptInjectRmaSize = 18;          // 1.22
inline constexpr int kOptInjectAtomicSize = 19;       // 1.22

// Values 2.x headers still define but mark deprecated (their macros expand to a warning): the
// old memory-registration modes, which applications of API 1.4 and earlier ask for, and the
// empty order, which tandem offers. The same values in every release.
inline constexpr int kMrBasic = 1;         // FI_MR_BASIC (enum fi_mr_mode)
inline constexpr int kMrScalable = 2;      // FI_MR_SCALABLE
inline constexpr uint64_t kOrderNone = 0;  // FI_ORDER_NONE

// fi_domain.h (1.20): the fi_mr_regattr flag by which attr's first member (a union with
// mr_iov from 1.20) points at a DMA-buf (struct fi_mr_dmabuf) instead of an iovec array.
inline constexpr uint64_t kMrDmabuf = 1ull << 40;  // FI_MR_DMABUF
struct MrDmabuf {
    int fd;
    uint64_t offset;  // into the DMA-buf, where the region starts
    size_t len;
    void *base_addr;  // where offset 0 is in the process, or null where it is not mapped
};

// struct fi_ops_av as 1.20 extended it (fi_av(3)): 1.17's table, then the authorization-key
// inserts and lookups and fi_av_set_user_id, which an application of 1.20 or later calls
// when the table's size says they are there.
struct AvOps1_20 {
    size_t size;
    decltype(fi_ops_av::insert) insert;
    decltype(fi_ops_av::insertsvc) insertsvc;
    decltype(fi_ops_av::insertsym) insertsym;
    decltype(fi_ops_av::remove) remove;
    decltype(fi_ops_av::lookup) lookup;
    decltype(fi_ops_av::straddr) straddr;
    decltype(fi_ops_av::av_set) av_set;
    int (*insert_auth_key)(fid_av *av, const void *auth_key, size_t auth_key_size,
                           fi_addr_t *fi_addr, uint64_t flags);
    int (*lookup_auth_key)(fid_av *av, fi_addr_t fi_addr, void *auth_key, size_t *auth_key_size);
    int (*set_user_id)(fid_av *av, fi_addr_t fi_addr, fi_addr_t user_id, uint64_t flags);
};

// The core's own version (fi_version() of the libfabric that loaded us), read once.
uint32_t core_version();

#if FI_MAJOR_VERSION >= 2
// Built against 2.x headers: the numbers above are theirs.
static_assert(kTaggedDirectedRecv == FI_TAGGED_DIRECTED_RECV);
static_assert(kTaggedMultiRecv == FI_TAGGED_MULTI_RECV);
static_assert(kExactDirectedRecv == FI_EXACT_DIRECTED_RECV);
static_assert(kOptCudaApiPermitted == FI_OPT_CUDA_API_PERMITTED);
static_assert(kOptSharedMemoryPermitted == FI_OPT_SHARED_MEMORY_PERMITTED);
static_assert(kOptMaxMsgSize == FI_OPT_MAX_MSG_SIZE);
static_assert(kOptMaxTaggedSize == FI_OPT_MAX_TAGGED_SIZE);
static_assert(kOptMaxRmaSize == FI_OPT_MAX_RMA_SIZE);
static_assert(kOptMaxAtomicSize == FI_OPT_MAX_ATOMIC_SIZE);
static_assert(kOptInjectMsgSize == FI_OPT_INJECT_MSG_SIZE);
static_assert(kOptInjectTaggedSize == FI_OPT_INJECT_TAGGED_SIZE);
static_assert(kOptInjectRmaSize == FI_OPT_INJECT_RMA_SIZE);
static_assert(kOptInjectAtomicSize == FI_OPT_INJECT_ATOMIC_SIZE);
static_assert(kMrDmabuf == FI_MR_DMABUF);
static_assert(sizeof(MrDmabuf) == sizeof(fi_mr_dmabuf));
static_assert(offsetof(MrDmabuf, fd) == offsetof(fi_mr_dmabuf, fd));
static_assert(offsetof(MrDmabuf, offset) == offsetof(fi_mr_dmabuf, offset));
static_assert(offsetof(MrDmabuf, len) == offsetof(fi_mr_dmabuf, len));
static_assert(offsetof(MrDmabuf, base_addr) == offsetof(fi_mr_dmabuf, base_addr));
static_assert(sizeof(AvOps1_20) == sizeof(fi_ops_av));
static_assert(offsetof(AvOps1_20, av_set) == offsetof(fi_ops_av, av_set));
static_assert(offsetof(AvOps1_20, insert_auth_key) == offsetof(fi_ops_av, insert_auth_key));
static_assert(offsetof(AvOps1_20, lookup_auth_key) == offsetof(fi_ops_av, lookup_auth_key));
static_assert(offsetof(AvOps1_20, set_user_id) == offsetof(fi_ops_av, set_user_id));
#else
// 1.20's entries come right after 1.17's table.
static_assert(offsetof(AvOps1_20, insert_auth_key) == sizeof(fi_ops_av));
#endif

}  // namespace tandem::compat
