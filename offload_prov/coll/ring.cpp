// Ring algorithms, for long vectors: every rank sends to rank + 1 and receives from rank - 1,
// one block per round, so each link carries (n - 1) / n of the vector per phase whatever n is,
// and every rank sends and receives at once.
//
// - allgather: n - 1 rounds; in round k a rank passes on the block it received in round k - 1
//   (its own first).
// - reduce-scatter: n - 1 rounds; in round k a rank sends its partial sum of one block and
//   adds the partial sum it receives of the next into its own; block b is complete at rank b.
// - allreduce: reduce-scatter (block b complete at rank b - 1), then the allgather of the
//   complete blocks. Every rank copies the final blocks from the one that reduced them, so
//   all end with the same bits.
// Blocks of an allreduce are count / n elements (the first count % n one more); empty blocks
// (count < n) are not sent, by both sides alike.
#include "offload_prov/coll/schedule_build.h"

namespace tandem::off::coll {

namespace {

// In round k of a ring pass, rank r sends block send_block(k) to r + 1 and receives block
// send_block(k) - 1 from r - 1.
void ring_transfer(Round &round, Shape s, Span out_span, Span in_span) {
    const uint32_t next = mod(int64_t(s.rank) + 1, s.size), prev = mod(int64_t(s.rank) - 1, s.size);
    if (in_span.len) round.recvs.push_back({prev, in_span});
    if (out_span.len) round.sends.push_back({next, out_span});
}

}  // namespace

Schedule allreduce_ring(Shape s, const Args &a) {
    Schedule out;
    const uint32_t n = s.size, r = s.rank;
    const Blocks blocks{a.count, n};
    auto block = [&](Buf b, uint32_t i) {
        return span(b, blocks.start(i) * a.elem, blocks.len(i) * a.elem);
    };
    copy_step(out.before, span(Buf::Recv, 0, a.bytes()), span(Buf::Send, 0, a.bytes()));
    out.scratch = blocks.len(0) * a.elem;
    for (uint32_t k = 0; k + 1 < n; ++k) {
        Round &round = round_at(out, k);
        const uint32_t in = mod(int64_t(r) - k - 1, n);
        const Span incoming = span(Buf::Scratch, 0, blocks.len(in) * a.elem);
        ring_transfer(round, s, block(Buf::Recv, mod(int64_t(r) - k, n)), incoming);
        if (incoming.len)
            round.after.push_back({Step::Kind::Reduce, block(Buf::Recv, in), incoming});
    }
    for (uint32_t k = 0; k + 1 < n; ++k) {
        Round &round = round_at(out, n - 1 + k);
        ring_transfer(round, s, block(Buf::Recv, mod(int64_t(r) + 1 - k, n)),
                      block(Buf::Recv, mod(int64_t(r) - k, n)));
    }
    return out;
}

// Input: n blocks of count elements; output: block `rank` of the reduction.
Schedule reduce_scatter_ring(Shape s, const Args &a) {
    Schedule out;
    const uint32_t n = s.size, r = s.rank;
    const size_t bytes = a.bytes();
    auto acc = [&](uint32_t b) { return span(Buf::Scratch, size_t(b) * bytes, bytes); };
    const Span incoming = span(Buf::Scratch, size_t(n) * bytes, bytes);
    out.scratch = size_t(n + 1) * bytes;
    copy_step(out.before, span(Buf::Scratch, 0, size_t(n) * bytes),
              span(Buf::Send, 0, size_t(n) * bytes));
    for (uint32_t k = 0; k + 1 < n; ++k) {
        Round &round = round_at(out, k);
        const uint32_t in = mod(int64_t(r) - k - 2, n);
        ring_transfer(round, s, acc(mod(int64_t(r) - k - 1, n)), incoming);
        if (bytes) round.after.push_back({Step::Kind::Reduce, acc(in), incoming});
    }
    std::vector<Step> &last = last_steps(out);
    copy_step(last, span(Buf::Recv, 0, bytes), acc(r));
    return out;
}

// Input: count elements; output: n blocks of count, block b from rank b.
Schedule allgather_ring(Shape s, const Args &a) {
    Schedule out;
    const uint32_t n = s.size, r = s.rank;
    const size_t bytes = a.bytes();
    auto block = [&](uint32_t b) { return span(Buf::Recv, size_t(b) * bytes, bytes); };
    copy_step(out.before, block(r), span(Buf::Send, 0, bytes));
    for (uint32_t k = 0; k + 1 < n; ++k)
        ring_transfer(round_at(out, k), s, block(mod(int64_t(r) - k, n)),
                      block(mod(int64_t(r) - k - 1, n)));
    return out;
}

}  // namespace tandem::off::coll
