// Allreduce by recursive doubling, for short vectors: log2 rounds, each exchanging the whole
// vector with the rank whose (virtual) number differs in one bit.
//
// With n not a power of two, the first 2 * rem ranks (rem = n - largest power of two) pair
// up first: each odd one hands its vector to the even one below and waits; the even ones take
// part in the doubling with the other ranks, and hand the result back in a last round.
//
// Every combination takes the lower rank's partial result as the target (fi_atomic(3)'s
// "target op operand"): FI_MIN and FI_MAX are not commutative when a NaN is involved, and
// this way every rank computes the very same sequence and ends with the same bits.
#include "offload_prov/coll/schedule_build.h"

namespace tandem::off::coll {

Schedule allreduce_recursive_doubling(Shape s, const Args &a) {
    Schedule out;
    const size_t bytes = a.bytes();
    const Span result = span(Buf::Recv, 0, bytes);
    const Span incoming = span(Buf::Scratch, 0, bytes);
    out.scratch = bytes;
    copy_step(out.before, result, span(Buf::Send, 0, bytes));
    const uint32_t n = s.size, r = s.rank;
    if (n == 1) return out;

    const uint32_t pof2 = std::bit_floor(n);
    const uint32_t rem = n - pof2;
    size_t round = 0;
    bool active = true;
    uint32_t vr = r;  // rank among the pof2 that double
    if (rem) {
        Round &fold = round_at(out, round++);
        if (r < 2 * rem) {
            if (r & 1) {
                fold.sends.push_back({r - 1, result});
                active = false;
            } else {
                fold.recvs.push_back({r + 1, incoming});
                fold.after.push_back({Step::Kind::Reduce, result, incoming});
                vr = r / 2;
            }
        } else {
            vr = r - rem;
        }
    }
    for (uint32_t mask = 1; mask < pof2; mask <<= 1) {
        Round &x = round_at(out, round++);
        if (!active) continue;
        const uint32_t pvr = vr ^ mask;
        const uint32_t partner = pvr < rem ? pvr * 2 : pvr + rem;
        x.recvs.push_back({partner, incoming});
        x.sends.push_back({partner, result});
        x.after.push_back(
            {partner < r ? Step::Kind::ReduceInto : Step::Kind::Reduce, result, incoming});
    }
    if (rem) {
        Round &unfold = round_at(out, round++);
        if (r < 2 * rem) {
            if (r & 1)
                unfold.recvs.push_back({r - 1, result});
            else
                unfold.sends.push_back({r + 1, result});
        }
    }
    return out;
}

}  // namespace tandem::off::coll
