// The node-local channel's meeting place: the inbox segment every RDM endpoint of this user
// keeps in /dev/shm, named after its address, and what it holds (SegmentInfo, the ring of
// cells, the split-copy claim table); the names made from an address; the removal of what
// dead processes left. Functions of an address and the user alone, shared by every endpoint
// (today off_tandem's, which carries the node-local traffic; docs/architecture.md, step 3).
#pragma once

#include "common/shm_ring.h"
#include "main_prov/shm/shm_segment.h"
#include "main_prov/shm/split_claims.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::shm {

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

// What the creator of an inbox says of itself in its SegmentInfo, besides its pid, cell size,
// network namespace and heartbeat, which create() fills.
struct InboxIdentity {
    uint64_t probe_addr = 0;
    uint64_t probe_value = 0;
    uint64_t auth = 0;
    uint64_t job = 0;
};

// An inbox segment, its own or a peer's: the mapping and where its parts lie in it (they
// stay put when the InboxSegment moves: the mapping does not).
struct InboxSegment {
    ShmSegment segment;
    SegmentInfo *info = nullptr;
    ShmRing *ring = nullptr;
    // The split-copy claim table after the ring (split_claims.h); nullptr: the segment has none.
    std::atomic<uint64_t> *split_claims = nullptr;

    // Creates the inbox of `key` with `cells` cells of `cell_size` bytes (ShmSegment::create:
    // a dead owner's leftover goes, a live owner's fails with -EEXIST), with every claim
    // free, and publishes it (SegmentInfo::magic) last: a peer that sees the magic sees an
    // initialised ring.
    static InboxSegment create(const std::string &key, uint32_t cells, uint32_t cell_size,
                               const InboxIdentity &identity);
    // A peer's inbox: nullopt when there is none under `key` (or not ours to open), when it
    // is not of this layout or cell size, is still being created, or its owner is dead.
    static std::optional<InboxSegment> open(const std::string &key, uint32_t cell_size);

    // The bytes an inbox of that shape takes (SegmentInfo, ring, claim table).
    static size_t bytes(uint32_t cells, uint32_t cell_size);
};

// The key naming a node-local endpoint: from its sockaddr (family, address, port), so the
// bytes an application inserted into the AV and those an endpoint reports for itself agree.
std::optional<std::string> local_key(const void *addr, size_t len);
// Whether the sender a cell names (its address bytes) is the endpoint with that key: what a
// peer's death ends of the state kept by sender.
inline bool names_key(std::string_view sender, const std::string &key) {
    std::optional<std::string> of_sender = local_key(sender.data(), sender.size());
    return of_sender && *of_sender == key;
}
// Shared-memory object names of this user's endpoints ("/tandem-<uid>-"), and of the one
// with that key.
std::string segment_prefix();
std::string segment_name(const std::string &key);
// The wake FIFO of the endpoint with that key, beside its segment in /dev/shm.
std::string wake_path(const std::string &key);
// Removes what processes that died without closing left in /dev/shm.
void reap_stale();

}  // namespace tandem::shm
