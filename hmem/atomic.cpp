#include "hmem/atomic.h"

#include "hmem/reduce_ops.h"

#include <rdma/fi_errno.h>

namespace tandem::atomic {
namespace {

// fi_atomic(3): which ops each kind of call may carry.
constexpr bool kind_allows(Kind kind, int op) {
    switch (kind) {
        case Kind::Base:
            return (op >= FI_MIN && op <= FI_BXOR) || op == FI_ATOMIC_WRITE;
        case Kind::Fetch:
            return op >= FI_MIN && op <= FI_ATOMIC_WRITE;
        case Kind::Compare:
            return op >= FI_CSWAP && op <= FI_MSWAP;
    }
    return false;
}

static_assert(kDatatypes == reduce::kNumDatatypes && kOps == reduce::kNumOps);

constexpr Tables make_tables() {
    Tables t{};
    for (int d = 0; d < kDatatypes; ++d) {
        t.size[d] = static_cast<uint8_t>(reduce::datatype_size(d));
        t.align[d] = static_cast<uint8_t>(reduce::datatype_align(d));
        for (int op = 0; op < kOps; ++op)
            for (Kind k : {Kind::Base, Kind::Fetch, Kind::Compare})
                t.valid[int(k)][op][d] = kind_allows(k, op) && reduce::valid(op, d);
    }
    return t;
}

}  // namespace

constexpr Tables kTables = make_tables();

int apply(int op, int datatype, void *target, const void *operand, const void *compare,
          void *result, size_t count) noexcept {
    // Valid for some kind: fetch calls take every op but the compare ones, which are compare's.
    if (!valid(Kind::Fetch, op, datatype) && !valid(Kind::Compare, op, datatype)) return -FI_EINVAL;
    if (count == 0) return 0;
    if (!target || (!operand && reduce::reads_operand(op)) ||
        (!compare && reduce::reads_compare(op)))
        return -FI_EINVAL;
    reduce::kDispatchTable.at(op, datatype)(target, operand, compare, result, count);
    return 0;
}

int reduce(int op, int datatype, void *dst, const void *src, size_t count) noexcept {
    if (!valid(Kind::Base, op, datatype)) return -FI_EINVAL;
    return apply(op, datatype, dst, src, nullptr, nullptr, count);
}

}  // namespace tandem::atomic
