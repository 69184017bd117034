// Binomial trees rooted at the call's root, for broadcast, reduce, scatter and gather. Ranks
// are numbered relative to the root (v = rank - root mod n); in a tree of ceil(log2 n) levels
// the rank v's parent is v without its lowest set bit, and v's subtree holds the ranks
// v .. v + lowbit(v) - 1 (capped at n), a contiguous run, so scatter and gather move each
// subtree's blocks in one transfer.
//
// - broadcast: level by level from the root down; round j: ranks below 2^j send to v + 2^j.
// - reduce: from the leaves up; round j: a rank with bit j set sends its partial result to
//   v - 2^j and is done, the one receiving it reduces.
// - scatter: from the root down, each rank handing a child the blocks of the child's subtree.
// - gather: from the leaves up, each rank handing its parent the blocks of its own subtree.
#include "offload_prov/coll/schedule_build.h"

namespace tandem::off::coll {

namespace {

struct Tree {
    uint32_t n, root, levels;
    uint32_t v;    // this rank, relative to the root
    size_t bytes;  // of one block
    // Blocks first .. first + blocks - 1 of this rank's scratch (relative order).
    Span held(size_t first, size_t blocks) const {
        return span(Buf::Scratch, first * bytes, blocks * bytes);
    }
    uint32_t real(uint32_t v) const { return (v + root) % n; }
    // Ranks in v's subtree: v and the following ranks up to its lowest set bit.
    uint32_t subtree(uint32_t v) const {
        if (v == 0) return n;
        return std::min<uint32_t>(v & (~v + 1), n - v);
    }
};

Tree tree_of(Shape s, const Args &a) {
    return Tree{s.size, a.root, log2_ceil(s.size), mod(int64_t(s.rank) - a.root, s.size),
                a.bytes()};
}

// The root's n blocks between rank order (in `ranked`, its Send or Recv) and the relative
// order of its scratch (block i: rank root + i), into scratch or back out of it.
void rotate(std::vector<Step> &steps, const Tree &t, Buf ranked, bool into_scratch) {
    const uint32_t tail = t.n - t.root;  // ranks root .. n - 1 come first in relative order
    const Span from_root = span(ranked, size_t(t.root) * t.bytes, size_t(tail) * t.bytes);
    const Span below_root = span(ranked, 0, size_t(t.root) * t.bytes);
    if (into_scratch) {
        copy_step(steps, t.held(0, tail), from_root);
        copy_step(steps, t.held(tail, t.root), below_root);
    } else {
        copy_step(steps, from_root, t.held(0, tail));
        copy_step(steps, below_root, t.held(tail, t.root));
    }
}

}  // namespace

// The one buffer is Recv (the root's data, the others' result).
Schedule broadcast_binomial(Shape s, const Args &a) {
    Schedule out;
    const Tree t = tree_of(s, a);
    const uint32_t v = t.v;
    const Span data = span(Buf::Recv, 0, a.bytes());
    for (uint32_t j = 0; j < t.levels; ++j) {
        Round &round = round_at(out, j);
        const uint32_t bit = 1u << j;
        if (v < bit && v + bit < t.n)
            round.sends.push_back({t.real(v + bit), data});
        else if (v >= bit && v < 2 * bit)
            round.recvs.push_back({t.real(v - bit), data});
    }
    return out;
}

// The root's result in Recv; the others accumulate in scratch.
Schedule reduce_binomial(Shape s, const Args &a) {
    Schedule out;
    const Tree t = tree_of(s, a);
    const uint32_t v = t.v;
    const size_t bytes = t.bytes;
    const Span acc = v == 0 ? span(Buf::Recv, 0, bytes) : span(Buf::Scratch, bytes, bytes);
    const Span incoming = span(Buf::Scratch, 0, bytes);
    out.scratch = 2 * bytes;
    copy_step(out.before, acc, span(Buf::Send, 0, bytes));
    for (uint32_t j = 0; j < t.levels; ++j) {
        Round &round = round_at(out, j);
        const uint32_t bit = 1u << j;
        if (v & (bit - 1)) continue;  // already handed its result up
        if (v & bit) {
            round.sends.push_back({t.real(v - bit), acc});
        } else if (v + bit < t.n) {
            round.recvs.push_back({t.real(v + bit), incoming});
            round.after.push_back({Step::Kind::Reduce, acc, incoming});
        }
    }
    return out;
}

// The root's Send holds n blocks in rank order; every rank's block lands in its Recv.
// Scratch holds a rank's subtree's blocks in relative order (scratch block i: rank v + i).
Schedule scatter_binomial(Shape s, const Args &a) {
    Schedule out;
    const Tree t = tree_of(s, a);
    const uint32_t v = t.v;
    const size_t bytes = t.bytes;
    out.scratch = size_t(t.subtree(v)) * bytes;
    if (v == 0) rotate(out.before, t, Buf::Send, true);
    for (uint32_t level = 0; level < t.levels; ++level) {
        const uint32_t bit = 1u << (t.levels - 1 - level);
        Round &round = round_at(out, level);
        if (v % (2 * bit) == 0 && v + bit < t.n)
            round.sends.push_back({t.real(v + bit), t.held(bit, t.subtree(v + bit))});
        else if (v % (2 * bit) == bit)
            round.recvs.push_back({t.real(v - bit), t.held(0, t.subtree(v))});
    }
    std::vector<Step> &last = last_steps(out);
    copy_step(last, span(Buf::Recv, 0, bytes), t.held(0, 1));
    return out;
}

// Every rank's Send block lands, in rank order, in the root's Recv.
Schedule gather_binomial(Shape s, const Args &a) {
    Schedule out;
    const Tree t = tree_of(s, a);
    const uint32_t v = t.v;
    const size_t bytes = t.bytes;
    out.scratch = size_t(t.subtree(v)) * bytes;
    copy_step(out.before, t.held(0, 1), span(Buf::Send, 0, bytes));
    for (uint32_t j = 0; j < t.levels; ++j) {
        Round &round = round_at(out, j);
        const uint32_t bit = 1u << j;
        if (v & (bit - 1)) continue;
        if (v & bit)
            round.sends.push_back({t.real(v - bit), t.held(0, t.subtree(v))});
        else if (v + bit < t.n)
            round.recvs.push_back({t.real(v + bit), t.held(bit, t.subtree(v + bit))});
    }
    if (v == 0) rotate(last_steps(out), t, Buf::Recv, false);
    return out;
}

}  // namespace tandem::off::coll
