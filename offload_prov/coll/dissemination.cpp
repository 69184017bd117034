// Barrier by dissemination: in round k every rank tells rank + 2^k that it arrived and hears
// from rank - 2^k. After ceil(log2 n) rounds each rank has heard, directly or through others,
// from every rank; no power of two needed, and no rank waits on a root.
#include "offload_prov/coll/schedule_build.h"

namespace tandem::off::coll {

Schedule barrier_dissemination(Shape s) {
    Schedule out;
    const uint32_t n = s.size;
    for (uint32_t k = 0, dist = 1; dist < n; ++k, dist <<= 1) {
        Round &r = round_at(out, k);
        r.recvs.push_back({mod(int64_t(s.rank) - dist, n), span(Buf::Scratch, 0, 0)});
        r.sends.push_back({mod(int64_t(s.rank) + dist, n), span(Buf::Scratch, 0, 0)});
    }
    return out;
}

}  // namespace tandem::off::coll
