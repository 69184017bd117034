// Private to the verbs link's files (main_prov/link/verbs_*.cpp): what more than one of them
// needs and nobody else should see.
#pragma once

#include "main_prov/link/verbs_link.h"

#include <rdma/fi_errno.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace tandem::verbs_detail {

// rdma_cm private data over IB/RoCE: what a REQ, REP and REJ carry. The peer is handed the
// whole fixed-size field, so the link puts the length of its data in the first byte.
inline constexpr size_t kMaxConnectData = 56 - 1;

inline int fi_errno_of(int err) {
    switch (err) {
        case EADDRINUSE:
            return -FI_EADDRINUSE;
        case EADDRNOTAVAIL:
        case ENODEV:
            return -FI_EADDRNOTAVAIL;
        case ENOMEM:
            return -FI_ENOMEM;
        case EINVAL:
            return -FI_EINVAL;
        default:
            return err > 0 ? -err : -FI_EIO;
    }
}

inline sockaddr_storage copy_addr(const sockaddr *sa) {
    sockaddr_storage ss{};
    if (sa && (sa->sa_family == AF_INET || sa->sa_family == AF_INET6))
        memcpy(&ss, sa, sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
    return ss;
}

// An index of `slots` free for use: one given back earlier, else a new slot at the end. (The
// send-queue records and the posted receives are both found again by index from a CQE.)
template <class T>
inline uint32_t take_index(std::vector<T> &slots, std::vector<uint32_t> &free) {
    if (!free.empty()) {
        uint32_t index = free.back();
        free.pop_back();
        return index;
    }
    slots.emplace_back();
    return static_cast<uint32_t>(slots.size() - 1);
}

}  // namespace tandem::verbs_detail
