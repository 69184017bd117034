// Allgather by Bruck's algorithm, for short blocks: ceil(log2 n) rounds for any n. A rank keeps
// the blocks it has in scratch in its own order (scratch block i is rank + i's); in the round
// of distance d it sends the first min(d, n - d) blocks it has to rank - d and receives as many
// from rank + d behind them. A last local step puts the blocks in rank order.
#include "offload_prov/coll/schedule_build.h"

namespace tandem::off::coll {

Schedule allgather_bruck(Shape s, const Args &a) {
    Schedule out;
    const uint32_t n = s.size, r = s.rank;
    const size_t bytes = a.bytes();
    auto held = [&](size_t first, size_t blocks) {
        return span(Buf::Scratch, first * bytes, blocks * bytes);
    };
    out.scratch = size_t(n) * bytes;
    copy_step(out.before, held(0, 1), span(Buf::Send, 0, bytes));
    size_t k = 0;
    for (uint32_t dist = 1; dist < n; dist <<= 1, ++k) {
        const uint32_t blocks = std::min(dist, n - dist);
        Round &round = round_at(out, k);
        if (!bytes) continue;
        round.recvs.push_back({mod(int64_t(r) + dist, n), held(dist, blocks)});
        round.sends.push_back({mod(int64_t(r) - dist, n), held(0, blocks)});
    }
    std::vector<Step> &last = last_steps(out);
    for (uint32_t i = 0; i < n; ++i)
        copy_step(last, span(Buf::Recv, size_t(mod(int64_t(r) + i, n)) * bytes, bytes), held(i, 1));
    return out;
}

}  // namespace tandem::off::coll
