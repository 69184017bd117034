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

}  // namespace

size_t datatype_size(int datatype) noexcept {
    return reduce::datatype_size(datatype);
}

size_t datatype_align(int datatype) noexcept {
    return reduce::datatype_align(datatype);
}

bool valid(Kind kind, int op, int datatype) noexcept {
    return kind_allows(kind, op) && reduce::valid(op, datatype);
}

size_t max_count(int datatype) noexcept {
    const size_t size = datatype_size(datatype);
    return size ? kMaxBytes / size : 0;
}

int apply(int op, int datatype, void *target, const void *operand, const void *compare,
          void *result, size_t count) noexcept {
    if (!reduce::valid(op, datatype)) return -FI_EINVAL;
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
