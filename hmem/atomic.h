// Point-to-point atomics on host memory (fi_atomic(3)), for both providers: which
// (op, datatype) pairs each kind of call accepts, and the operation itself. The arithmetic
// is the shared reduction engine (hmem/reduce_ops.h); this is its host-side front.
#pragma once

#include <rdma/fi_domain.h>

#include <cstddef>
#include <cstdint>

namespace tandem::atomic {

// fi_atomic (Base), fi_fetch_atomic (Fetch), fi_compare_atomic (Compare).
enum class Kind : uint8_t { Base = 0, Fetch = 1, Compare = 2 };

// Operand bytes one operation carries at most (each of operand / compare / result).
inline constexpr size_t kMaxBytes = 2048;

// The answers of the engine's lookups, computed by the compiler in atomic.cpp: the providers
// ask them several times per operation, and an inline table read costs less than a call into
// the engine's folds over its type list (which device code keeps).
inline constexpr int kDatatypes = FI_UINT128 + 1;  // the point-to-point datatypes
inline constexpr int kOps = FI_ATOMIC_OP_LAST;
struct Tables {
    uint8_t size[kDatatypes];
    uint8_t align[kDatatypes];
    bool valid[3][kOps][kDatatypes];  // [Kind][fi_op][fi_datatype]
};
extern const Tables kTables;

inline bool known_datatype(int datatype) noexcept {
    return static_cast<unsigned>(datatype) < static_cast<unsigned>(kDatatypes);
}

// Bytes of one element of a point-to-point atomic datatype; 0 for any other value.
inline size_t datatype_size(int datatype) noexcept {
    return known_datatype(datatype) ? kTables.size[datatype] : 0;
}
// Its natural alignment (alignof); 0 for any other value.
inline size_t datatype_align(int datatype) noexcept {
    return known_datatype(datatype) ? kTables.align[datatype] : 0;
}
// Whether op is valid on datatype for calls of this kind: the pairs libfabric's own atomic
// tables define, restricted to the ops fi_atomic(3) allows for the kind.
inline bool valid(Kind kind, int op, int datatype) noexcept {
    if (static_cast<unsigned>(kind) > static_cast<unsigned>(Kind::Compare)) return false;
    if (static_cast<unsigned>(op) >= static_cast<unsigned>(kOps) || !known_datatype(datatype))
        return false;
    return kTables.valid[static_cast<int>(kind)][op][datatype];
}
// Elements one operation may carry: kMaxBytes / datatype_size, or 0 when the datatype is
// unknown.
inline size_t max_count(int datatype) noexcept {
    const size_t size = datatype_size(datatype);
    return size ? kMaxBytes / size : 0;
}

// Applies op on host memory: for i < count, old = target[i]; if result, result[i] = old;
// target[i] = f(old, operand[i], compare[i]). operand may be null for ATOMIC_READ; compare is
// read only by the compare ops; result may be null. No buffer needs to be aligned.
// Returns 0, or -FI_EINVAL for an op/datatype pair that is not valid for any kind, or when
// count > 0 and target, or a buffer the op reads, is null (nothing is touched then).
// Does not lock: callers serialise operations on the same target.
int apply(int op, int datatype, void *target, const void *operand, const void *compare,
          void *result, size_t count) noexcept;

// For collectives: dst[i] = dst[i] op src[i], for the ops of the base kind. Same returns.
int reduce(int op, int datatype, void *dst, const void *src, size_t count) noexcept;

}  // namespace tandem::atomic
