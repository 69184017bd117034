// Point-to-point atomics on host memory (fi_atomic(3)), for both providers: which
// (op, datatype) pairs each kind of call accepts, and the operation itself. The arithmetic
// is the shared reduction engine (hmem/reduce_ops.h); this is its host-side front.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::atomic {

// fi_atomic (Base), fi_fetch_atomic (Fetch), fi_compare_atomic (Compare).
enum class Kind : uint8_t { Base = 0, Fetch = 1, Compare = 2 };

// Bytes of one element of a point-to-point atomic datatype; 0 for any other value.
size_t datatype_size(int datatype) noexcept;
// Its natural alignment (alignof); 0 for any other value.
size_t datatype_align(int datatype) noexcept;
// Whether op is valid on datatype for calls of this kind: the pairs libfabric's own atomic
// tables define, restricted to the ops fi_atomic(3) allows for the kind.
bool valid(Kind kind, int op, int datatype) noexcept;

// Operand bytes one operation carries at most (each of operand / compare / result).
inline constexpr size_t kMaxBytes = 2048;
// Elements one operation may carry: kMaxBytes / datatype_size, or 0 when the datatype is
// unknown.
size_t max_count(int datatype) noexcept;

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
