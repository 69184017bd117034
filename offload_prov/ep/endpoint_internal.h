// Private to off_tandem's endpoint (offload_prov/endpoint.cpp and offload_prov/ep/): what
// more than one of its files needs and nobody else should see. The layout every inbox
// segment starts with, the names beside the segment, and try_push, defined here so that the
// owner's inject (ep/send.cpp) inlines it as the cell path (ep/cell_send.cpp) does.
#pragma once

#include "offload_prov/endpoint.h"
#include "common/test_hook.h"
#include "offload_prov/shm/shm_segment.h"

#include <atomic>
#include <cstdint>
#include <string>

namespace tandem::off {

namespace detail {

// The start of every segment's data: who owns it and where a CMA probe may read.
struct SegmentInfo {
    static constexpr uint64_t kMagic = 0x6f66665f746e6432ull;  // "off_tnd2"
    uint64_t magic;
    int32_t pid;
    uint32_t cell_size;
    uint64_t probe_addr;    // an address in the owner's memory a peer may read 8 bytes from
    uint32_t split_claims;  // slots of the split-copy claim table, after the ring
    uint32_t heartbeat;     // the owner's progress passes (low bits): moving while it polls
    uint64_t probe_value;   // what those 8 bytes hold: a CMA probe that reads it reached the owner
    uint64_t net_ns;        // the owner's network namespace (inode of /proc/self/ns/net), 0 unknown
    uint64_t auth;          // the owner's authorization key (common/auth_key.h digest; 0: none)
    uint64_t job;           // the owner's job (Config::job): cross-memory attach only within one
};
static_assert(sizeof(SegmentInfo) == 64);

inline SegmentInfo *info_of(const ShmSegment &segment) {
    return static_cast<SegmentInfo *>(segment.data());
}

// The split-copy claims (ep/split_copy.cpp): a word per slot after the segment's ring,
// generation << 2 | state. A receiver that splits a copy opens a slot and names it in its
// Cts; the sender takes it before it writes its part, or the receiver takes it back to read
// that part itself (the sender had no core in time): whoever takes it copies, the other never.
enum SplitClaim : uint64_t { kClaimFree = 0, kClaimOpen = 1, kClaimSender = 2, kClaimReceiver = 3 };
inline constexpr uint32_t kSplitClaims = 64;
inline size_t split_claims_offset(const ShmRing &ring) {
    return sizeof(SegmentInfo) + ShmRing::bytes_for(ring.cells(), ring.cell_size());
}
inline size_t segment_bytes(uint32_t cells, uint32_t cell_size) {
    return sizeof(SegmentInfo) + ShmRing::bytes_for(cells, cell_size) +
           kSplitClaims * sizeof(uint64_t);
}
// The claim table of the segment whose ring is `ring`, or nullptr when the segment has none.
inline std::atomic<uint64_t> *split_claims_of(const ShmSegment &segment, const ShmRing &ring) {
    auto *info = info_of(segment);
    size_t at = split_claims_offset(ring);
    if (info->split_claims != kSplitClaims ||
        segment.data_size() < at + kSplitClaims * sizeof(uint64_t))
        return nullptr;
    return reinterpret_cast<std::atomic<uint64_t> *>(static_cast<uint8_t *>(segment.data()) + at);
}

// The wake FIFO of the endpoint with that key, beside its segment in /dev/shm.
std::string wake_path(const std::string &key);
// Removes what processes that died without closing left in /dev/shm.
void reap_stale();

}  // namespace detail

// The cell straight into the peer's inbox, if it can go now: nothing waits for room before
// it (order) and the ring has a free cell. False, with nothing written, otherwise.
inline bool Endpoint::try_push(PeerLink &link, const wire::LocalHeader &hdr, const iovec *iov,
                               size_t count, size_t offset, size_t len, const uint8_t *staged) {
    if (!link.backlog.empty()) return false;
    void *cell = link.ring->try_reserve(producer_id_, link.view);
    if (!cell) return false;
    stop_at("local.ring_reserved");
    fill_cell(static_cast<uint8_t *>(cell), hdr, iov, count, offset, len, staged);
    link.ring->publish(cell);
    notify(link);
    return true;
}

}  // namespace tandem::off
