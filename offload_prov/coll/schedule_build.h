// Helpers the algorithm files share to write schedules: spans of blocks, and a schedule whose
// rounds every rank numbers alike (a transfer's tag carries its round, so a sender and its
// receiver must put it in the same round).
#pragma once

#include "offload_prov/coll/schedule.h"

#include <algorithm>
#include <bit>

namespace tandem::off::coll {

inline Span span(Buf b, size_t offset, size_t len) {
    return Span{b, offset, len};
}

// ceil(log2 n): rounds of a tree or a doubling over n ranks.
inline uint32_t log2_ceil(uint32_t n) {
    return n <= 1 ? 0 : uint32_t(std::bit_width(n - 1));
}

// A vector of count elements cut into n blocks as evenly as possible (the first count % n
// blocks one element longer): where block b starts and how long it is, in elements.
struct Blocks {
    size_t count;
    uint32_t n;
    size_t start(uint32_t b) const { return b * (count / n) + std::min<size_t>(b, count % n); }
    size_t len(uint32_t b) const { return count / n + (b < count % n ? 1 : 0); }
};

inline uint32_t mod(int64_t v, uint32_t n) {
    int64_t m = v % int64_t(n);
    return uint32_t(m < 0 ? m + n : m);
}

inline Round &round_at(Schedule &s, size_t index) {
    if (s.rounds.size() <= index) s.rounds.resize(index + 1);
    return s.rounds[index];
}

// Where steps that end the operation go: after the last round, or before all when it has none.
inline std::vector<Step> &last_steps(Schedule &s) {
    return s.rounds.empty() ? s.before : s.rounds.back().after;
}

inline void copy_step(std::vector<Step> &steps, Span dst, Span src) {
    if (dst.len) steps.push_back(Step{Step::Kind::Copy, dst, src});
}

}  // namespace tandem::off::coll
