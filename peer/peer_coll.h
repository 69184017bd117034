// What tandem's endpoint hands its off_tandem twin of collectives (fi_collective(3)), which
// libfabric 1.17's peer API has no object for (the coll_* entries of peer::OffloadOps,
// peer/offload_ops.h): its groups and their operations, which the twin runs
// (offload_prov/coll/) over peer transfers on tandem's own endpoint, reporting back through
// the callbacks. tandem keeps what the application sees: the fid_mc, the EQ's
// FI_JOIN_COMPLETE, the CQ entries.
//
// Every call is made under tandem's serialisation (its domain lock, or the application's under
// FI_THREAD_DOMAIN), and the callbacks come from the twin's progress, which tandem drives
// under it too.
#pragma once

#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>

#include <cstddef>
#include <cstdint>

namespace tandem::peer {

// Limits of the engine: members of a group (its ring algorithms take 2 (n - 1) rounds of the
// 4096 an operation's tags have room for), and bytes of one buffer of a call.
inline constexpr uint32_t kCollMaxMembers = 2048;
inline constexpr size_t kCollMaxBytes = size_t(1) << 31;

struct CollJoin {
    const fi_addr_t *members = nullptr;  // in the AV set's order, which numbers the ranks
    size_t count = 0;
    uint32_t rank = 0;         // this endpoint's place in members
    uint64_t ordered_key = 0;  // a hash of the members' names in rank order
    uint64_t set_key = 0;      // a hash of the names as a set (the order left out)
    // The members in an order every member agrees on whatever order its set lists them in
    // (by a hash of their names): set_order[i] is an index into members. The join's exchange
    // runs in this order, so members that list the set differently still meet, and learn it.
    const uint32_t *set_order = nullptr;
    // Provider-managed membership: the members exchange their keys before the join completes
    // (a mismatch, members listed in different orders, fails it with FI_EINVAL). Application-
    // managed (false): complete at once.
    bool handshake = true;
    // Whether node-local members may use shared memory (tandem's FI_TANDEM_LOCAL): a group
    // whose members all share this node then runs through one shared segment.
    bool local_path = true;
    void *arg = nullptr;
    void (*joined)(void *arg, int err) = nullptr;  // err: 0 or a positive fabric errno
};

struct CollWork {
    fi_collective_op coll = FI_BARRIER;
    const void *send = nullptr;  // input (broadcast: null, recv holds the root's data)
    void *send_desc = nullptr;   // fi_mr_desc of send (device memory), or null
    void *recv = nullptr;        // result
    void *recv_desc = nullptr;
    size_t count = 0;  // elements, as fi_collective(3) calls count them
    int datatype = FI_VOID;
    int op = FI_NOOP;
    uint32_t root = 0;  // rank of the root
    void *arg = nullptr;
    void (*done)(void *arg, int err) = nullptr;  // err: 0 or a positive fabric errno
};

// What one member's call reads (send) and writes (recv), in bytes, for blocks of `block`
// bytes (count elements) in a group of n: which buffers the call must give, and how much of
// each the engine stages. fi_broadcast's one buffer is recv (the root's input, the others'
// result); the root's alone matter for reduce and gather results and scatter input.
struct CollIo {
    size_t send, recv;
};
inline CollIo coll_io_bytes(int coll, size_t block, uint32_t n, bool root) {
    switch (coll) {
        case FI_BROADCAST:
            return {0, block};
        case FI_ALLREDUCE:
            return {block, block};
        case FI_ALLGATHER:
            return {block, block * n};
        case FI_ALLTOALL:
            return {block * n, block * n};
        case FI_REDUCE_SCATTER:
            return {block * n, block};
        case FI_REDUCE:
            return {block, root ? block : 0};
        case FI_SCATTER:
            return {root ? block * n : 0, block};
        case FI_GATHER:
            return {block, root ? block * n : 0};
        default:  // FI_BARRIER
            return {0, 0};
    }
}

}  // namespace tandem::peer
