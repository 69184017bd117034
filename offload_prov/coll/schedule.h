// A collective operation as one rank sees it: a list of rounds, each a set of transfers to and
// from other ranks of the group followed by local steps (copies and reductions). The
// algorithms (one a file in this folder) are pure functions from the group's shape and the
// call's arguments to a schedule; the executor (operation.h) runs one over any transport.
// So an algorithm can be read on its own, and tested for every group size in one process.
//
// Buffers are named, not pointed to: the call's input (Send), its output (Recv) and the
// operation's scratch memory; the executor resolves them when it runs. Device buffers are
// staged into host memory before the first round and out of it after the last, so every
// schedule works on host bytes.
#pragma once

#include "peer/peer_coll.h"

#include <rdma/fi_collective.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::off::coll {

enum class Buf : uint8_t { Send, Recv, Scratch };

struct Span {
    Buf buf = Buf::Scratch;
    size_t offset = 0;
    size_t len = 0;  // bytes
};

struct Transfer {
    uint32_t peer = 0;  // rank in the group
    Span span;
};

struct Step {
    enum class Kind : uint8_t {
        Copy,        // dst = src
        Reduce,      // dst = dst op src (dst is the atomic "target")
        ReduceInto,  // dst = src op dst: src is the target; src is clobbered (scratch)
    } kind = Kind::Copy;
    Span dst;
    Span src;
};

struct Round {
    std::vector<Transfer> recvs;
    std::vector<Transfer> sends;
    std::vector<Step> after;  // once every transfer of the round completed
};

struct Schedule {
    std::vector<Step> before;  // before the first round (usually: input into place)
    std::vector<Round> rounds;
    size_t scratch = 0;  // bytes of scratch memory the steps and transfers name
};

// The group as this rank sees it.
struct Shape {
    uint32_t size = 1;
    uint32_t rank = 0;
};

// The call: which collective, element count and size, the reduction, the root's rank.
// count is per rank where a collective moves one block per rank (allgather, alltoall,
// scatter, gather, reduce_scatter: the result block), the whole vector otherwise.
struct Args {
    fi_collective_op coll = FI_BARRIER;
    size_t count = 0;
    size_t elem = 0;  // bytes of one element (0 for a barrier)
    int datatype = FI_VOID;
    int op = FI_NOOP;
    uint32_t root = 0;
    size_t bytes() const { return count * elem; }
};

// Rounds carry their index in the operation's tags; at most this many per operation (the
// last index, wire::kCollNoticeRound, is the group's notice channel).
inline constexpr size_t kMaxRounds = (1u << 12) - 1;
// Groups of at most this many members (ring algorithms take 2 (n - 1) rounds).
inline constexpr uint32_t kMaxMembers = peer::kCollMaxMembers;
static_assert(2 * (size_t(kMaxMembers) - 1) < kMaxRounds, "the ring's rounds must fit the tag");

// ---- the algorithms (one file each) ------------------------------------------------------

// dissemination.cpp: ceil(log2 n) rounds of one empty message; any n.
Schedule barrier_dissemination(Shape s);
// recursive_doubling.cpp: allreduce in log2 rounds of the whole vector, with the ranks beyond
// the largest power of two folded in first and served last. Every rank reduces in rank order,
// so all end with the same bits (FI_MIN/FI_MAX with NaN are not commutative).
Schedule allreduce_recursive_doubling(Shape s, const Args &a);
// ring.cpp: reduce-scatter then allgather around the ring, n - 1 rounds each, a block of
// count / n per round: 2 (n - 1) / n of the vector crosses each link.
Schedule allreduce_ring(Shape s, const Args &a);
Schedule reduce_scatter_ring(Shape s, const Args &a);
Schedule allgather_ring(Shape s, const Args &a);
// bruck.cpp: allgather in ceil(log2 n) rounds, doubling blocks, then one rotation.
Schedule allgather_bruck(Shape s, const Args &a);
// binomial.cpp: trees rooted at a.root, log2 rounds.
Schedule broadcast_binomial(Shape s, const Args &a);
Schedule reduce_binomial(Shape s, const Args &a);
Schedule scatter_binomial(Shape s, const Args &a);
Schedule gather_binomial(Shape s, const Args &a);
// pairwise.cpp: alltoall in n - 1 rounds, round k exchanging with rank +k and -k.
Schedule alltoall_pairwise(Shape s, const Args &a);

// selection.cpp: which algorithm serves a call, by size and group shape.
struct Thresholds {
    size_t allreduce_ring_min = 64u << 10;  // bytes from which allreduce takes the ring
    size_t allgather_ring_min = 32u << 10;  // bytes per rank from which allgather takes the ring
};
Schedule select(Shape s, const Args &a, const Thresholds &t);

}  // namespace tandem::off::coll
