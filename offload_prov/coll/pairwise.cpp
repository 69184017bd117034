// Alltoall by pairwise exchange: in round k (1 .. n - 1) a rank sends its block for rank + k
// and receives the block rank - k has for it, so every rank sends and receives one block per
// round and no rank is the target of two at once.
#include "offload_prov/coll/schedule_build.h"

namespace tandem::off::coll {

Schedule alltoall_pairwise(Shape s, const Args &a) {
    Schedule out;
    const uint32_t n = s.size, r = s.rank;
    const size_t bytes = a.bytes();
    auto block = [&](Buf b, uint32_t i) { return span(b, size_t(i) * bytes, bytes); };
    copy_step(out.before, block(Buf::Recv, r), block(Buf::Send, r));
    for (uint32_t k = 1; k < n; ++k) {
        Round &round = round_at(out, k - 1);
        if (!bytes) continue;
        const uint32_t to = mod(int64_t(r) + k, n), from = mod(int64_t(r) - k, n);
        round.recvs.push_back({from, block(Buf::Recv, from)});
        round.sends.push_back({to, block(Buf::Send, to)});
    }
    return out;
}

}  // namespace tandem::off::coll
