// Which algorithm serves a call. Latency-bound calls (short vectors) take the algorithms with
// the fewest rounds (log2 n: recursive doubling, Bruck, binomial trees); bandwidth-bound ones
// the ring, which sends (n - 1) / n of the vector per rank instead of log2 n vectors. The
// thresholds are fi_param variables (offload_prov/config.cpp, docs/user-guide.md).
#include "offload_prov/coll/schedule_build.h"

namespace tandem::off::coll {

Schedule select(Shape s, const Args &a, const Thresholds &t) {
    switch (a.coll) {
        case FI_BARRIER:
            return barrier_dissemination(s);
        case FI_BROADCAST:
            return broadcast_binomial(s, a);
        case FI_ALLTOALL:
            return alltoall_pairwise(s, a);
        case FI_ALLREDUCE:
            if (a.bytes() >= t.allreduce_ring_min && a.count >= s.size) return allreduce_ring(s, a);
            return allreduce_recursive_doubling(s, a);
        case FI_ALLGATHER:
            if (a.bytes() >= t.allgather_ring_min) return allgather_ring(s, a);
            return allgather_bruck(s, a);
        case FI_REDUCE_SCATTER:
            return reduce_scatter_ring(s, a);
        case FI_REDUCE:
            return reduce_binomial(s, a);
        case FI_SCATTER:
            return scatter_binomial(s, a);
        case FI_GATHER:
            return gather_binomial(s, a);
    }
    return {};
}

}  // namespace tandem::off::coll
